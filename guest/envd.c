/* envd: the event loop of the guest's E2B-style daemon (lib/eproto.h,
 * docs/e2b.md "Guest: envd"): the channel (receive buffer, a bounded send
 * buffer that is never waited on), the host's (re)connections, dispatch of
 * requests, and the loop that polls the channel and the processes' pipes.
 * The processes START runs (fork as the user, OUT under a per-process
 * window, END, stdin, LIST) are envd_proc.c's, file requests envd_fs.c's.
 * Nothing here blocks on the channel: when it takes no more, the pipes are
 * simply not read (their processes block as on a full pipe). Sending (the
 * send buffer and its frames) is envd_tx.c, which envd_fs.c calls too. */
#include "envd_int.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "init.h"
#include "execpath.h"

/* Descriptors envd may hold: 3 per process, 16 per LISTDIR, and spare. */
#define ENVD_NOFILE 8192
/* While the host is away, how often the port is looked at again besides
 * SIGIO (a safety net, as in agent.c). */
#define ENVD_RECHECK_MS 1000

const struct envd_config envd_guest_config = {
	.passwd = "/etc/passwd",
	.group = "/etc/group",
	.shadow = "/etc/shadow",
	.home_dir = "/home",
};

/* ---- connection --------------------------------------------------------- */

static void envd_hello(struct envd *e)
{
	uint32_t v[2] = { EPROTO_VERSION, EPROTO_FEAT_PORTS | EPROTO_FEAT_WATCH };

	envd_send_u32s(e, EP_HELLO, v, 2);
}

/* A new host: what the old one was owed is forgotten (a frame half sent to
 * it would garble the new stream), windows open, requests in progress are
 * abandoned; processes keep running and an END not yet sent is sent again. */
static void envd_new_connection(struct envd *e, int keep_rx)
{
	int i;

	/* A slot whose END got out is done with; the others send it again. */
	for (i = 0; i < ENVD_MAX_PROCS; i++)
		if (e->procs[i] && e->procs[i]->ended && e->tx_sent >= e->procs[i]->end_off)
			envd_proc_free(e, i);
	e->tx_head = e->tx_tail = 0;
	e->tx_sent = e->tx_appended;
	/* The host's own HELLO: what follows it is the new connection's. */
	if (!keep_rx)
		e->rx_start = e->rx_end = 0;
	for (i = 0; i < ENVD_MAX_JOBS; i++)
		if (e->jobs[i])
			envd_job_free(e, i);
	e->dead_next = 0;
	memset(e->dead_writes, 0, sizeof(e->dead_writes));
	envd_conns_drop(e); /* the old host's clients are gone with it */
	envd_watches_drop(e); /* ... and its watchers */
	for (i = 0; i < ENVD_MAX_PROCS; i++) {
		struct envd_proc *p = e->procs[i];

		if (!p)
			continue;
		p->unacked = 0;
		p->ended = 0;
	}
	e->connected = 1;
	envd_hello(e);
}

/* Is the host end of the port open? A closed one polls POLLHUP. */
static int envd_host_there(struct envd *e)
{
	struct pollfd p = { .fd = e->chan, .events = POLLIN };

	return poll(&p, 1, 0) >= 0 && !(p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

static void envd_hangup(struct envd *e)
{
	e->connected = 0;
	e->rx_start = e->rx_end = 0;
}

/* SIGIO: the port raises it on every change of the host's connection (and
 * on data). */
static void envd_check_connection(struct envd *e)
{
	if (!e->connected && envd_host_there(e))
		envd_new_connection(e, 0);
	else if (e->connected && !envd_host_there(e))
		envd_hangup(e);
}

/* ---- dispatch ------------------------------------------------------------ */

static void envd_malformed(struct envd *e, uint8_t type)
{
	/* Nothing after it can be trusted to be aligned on a frame. */
	e->rx_start = e->rx_end = 0;
	envd_send_error(e, 0, -EPROTO, "malformed frame of type 0x%02x: receive buffer dropped", type);
}

static void envd_dispatch(struct envd *e, const struct proto_frame *f)
{
	struct envd_proc *p;
	const uint8_t *raw;
	uint32_t v[3];
	size_t n;
	int slot;

	switch (f->type) {
	case EP_START:
		if (eproto_start_decode(f->payload, f->len, &e->start) < 0)
			return envd_malformed(e, f->type);
		return envd_start(e, f->payload, f->len);
	case EP_INPUT:
		if (eproto_idraw_decode(f->payload, f->len, &v[0], &raw, &n) < 0)
			return envd_malformed(e, f->type);
		if ((p = envd_proc_find(e, v[0])))
			envd_input(e, p, raw, n);
		return;
	case EP_CLOSE_STDIN:
		if (eproto_u32s_decode(f->payload, f->len, v, 1) < 0)
			return envd_malformed(e, f->type);
		if ((p = envd_proc_find(e, v[0])))
			envd_close_stdin(p);
		return;
	case EP_SIGNAL:
		if (eproto_u32s_decode(f->payload, f->len, v, 2) < 0 || v[1] < 1 || v[1] > 64)
			return envd_malformed(e, f->type);
		if ((p = envd_proc_find(e, v[0]))) {
			/* The group; the pid itself too, for a child that has
			 * not reached setsid() yet. */
			kill(-p->pid, (int)v[1]);
			if (!p->exited)
				kill(p->pid, (int)v[1]);
		}
		return;
	case EP_RESIZE:
		if (eproto_u32s_decode(f->payload, f->len, v, 3) < 0 || v[1] < 1 || v[1] > PROTO_MAX_TTY_DIM ||
		    v[2] < 1 || v[2] > PROTO_MAX_TTY_DIM)
			return envd_malformed(e, f->type);
		if ((p = envd_proc_find(e, v[0])) && (p->flags & EP_START_PTY) && p->out >= 0) {
			struct winsize ws = { .ws_row = (unsigned short)v[1], .ws_col = (unsigned short)v[2] };

			/* The kernel sends SIGWINCH to the foreground group. */
			ioctl(p->out, TIOCSWINSZ, &ws);
		}
		return;
	case EP_ACK:
		if (eproto_u32s_decode(f->payload, f->len, v, 2) < 0)
			return envd_malformed(e, f->type);
		/* A READ's req first: the host keeps its reqs apart from pids. */
		if (envd_fs_ack(e, v[0], v[1]))
			return;
		if ((p = envd_proc_find(e, v[0])))
			p->unacked -= v[1] < p->unacked ? v[1] : p->unacked;
		return;
	case EP_LIST:
		if (eproto_u32s_decode(f->payload, f->len, v, 1) < 0)
			return envd_malformed(e, f->type);
		slot = envd_job_slot(e);
		if (slot < 0)
			return envd_send_error(e, v[0], -EAGAIN, "LIST: %d requests in progress", ENVD_MAX_JOBS);
		e->jobs[slot] = calloc(1, sizeof(struct envd_job));
		if (!e->jobs[slot])
			return envd_send_error(e, v[0], -ENOMEM, "LIST: out of memory");
		e->jobs[slot]->kind = ENVD_JOB_LIST;
		e->jobs[slot]->req = v[0];
		e->jobs[slot]->fd = e->jobs[slot]->dirfd = -1;
		return;
	case EP_HELLO:
		/* From the host: u32 version, u32 req. A restored VM's port
		 * sees no new connection (the migrated state says the host was
		 * there already), so the host asks: envd acts as on a new
		 * connection (HELLO), then DONE{req} marks where the new
		 * connection's frames begin. */
		if (eproto_u32s_decode(f->payload, f->len, v, 2) < 0)
			return envd_malformed(e, f->type);
		envd_new_connection(e, 1);
		envd_send_done(e, v[1]);
		return;
	case EP_PORT_OPEN:
		if (eproto_u32s_decode(f->payload, f->len, v, 2) < 0 || v[1] < 1 || v[1] > 65535)
			return envd_malformed(e, f->type);
		return envd_port_open(e, v[0], v[1]);
	case EP_PORT_DATA:
		if (eproto_idraw_decode(f->payload, f->len, &v[0], &raw, &n) < 0)
			return envd_malformed(e, f->type);
		return envd_port_data(e, v[0], raw, n);
	case EP_PORT_ACK:
		if (eproto_u32s_decode(f->payload, f->len, v, 2) < 0)
			return envd_malformed(e, f->type);
		return envd_port_ack(e, v[0], v[1]);
	case EP_PORT_SHUT:
	case EP_PORT_CLOSE:
	case EP_PORTS:
		if (eproto_u32s_decode(f->payload, f->len, v, 1) < 0)
			return envd_malformed(e, f->type);
		if (f->type == EP_PORT_SHUT)
			return envd_port_shut(e, v[0]);
		if (f->type == EP_PORT_CLOSE)
			return envd_port_close(e, v[0]);
		return envd_ports(e, v[0]);
	case EP_WATCH: {
		struct eproto_watch m;

		if (eproto_watch_decode(f->payload, f->len, &m) < 0)
			return envd_malformed(e, f->type);
		return envd_watch_start(e, &m);
	}
	case EP_UNWATCH:
		if (eproto_u32s_decode(f->payload, f->len, v, 1) < 0)
			return envd_malformed(e, f->type);
		return envd_unwatch(e, v[0]);
	default:
		/* STAT to CANCEL: the file-system requests (envd_fs.c). */
		if (eproto_fs_kind_of(f->type) != EPROTO_FS_NONE)
			return envd_fs_request(e, f->type, f->payload, f->len);
		return envd_malformed(e, f->type);
	}
}

/* Takes what the channel holds and serves the complete frames, each only
 * when its reply fits in the send buffer. Returns 0 or a negative errno. */
static int envd_read(struct envd *e)
{
	ssize_t n;

	if (e->rx_start > 0) {
		memmove(e->rx, e->rx + e->rx_start, e->rx_end - e->rx_start);
		e->rx_end -= e->rx_start;
		e->rx_start = 0;
	}
	if (e->rx_end < sizeof(e->rx)) {
		n = read(e->chan, e->rx + e->rx_end, sizeof(e->rx) - e->rx_end);
		if (n > 0)
			e->rx_end += (size_t)n;
		else if (n == 0)
			envd_hangup(e);
		else if (errno != EAGAIN && errno != EINTR)
			return -errno;
	}
	return 0;
}

static void envd_serve_frames(struct envd *e)
{
	struct proto_frame f;
	ssize_t n;

	while (e->connected && envd_tx_ok(e) && e->rx_end > e->rx_start) {
		n = proto_frame_parse(e->rx + e->rx_start, e->rx_end - e->rx_start, &f);
		if (n == 0)
			return;
		if (n < 0) {
			e->rx_start = e->rx_end = 0;
			envd_send_error(e, 0, -EPROTO, "bad frame header: receive buffer dropped");
			return;
		}
		e->rx_start += (size_t)n;
		envd_dispatch(e, &f);
	}
}

/* ---- the loop ------------------------------------------------------------ */

struct envd *envd_create(int chan, const struct envd_config *cfg)
{
	struct envd *e;
	struct rlimit more;
	int err;

	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->chan = chan;
	e->cfg = cfg;
	e->sigfd = -1;
	if (getrlimit(RLIMIT_NOFILE, &e->nofile) < 0)
		goto fail;
	more = e->nofile;
	if (more.rlim_cur < ENVD_NOFILE) {
		more.rlim_cur = ENVD_NOFILE;
		if (more.rlim_max < ENVD_NOFILE && geteuid() == 0)
			more.rlim_max = ENVD_NOFILE;
		if (more.rlim_cur > more.rlim_max)
			more.rlim_cur = more.rlim_max;
		setrlimit(RLIMIT_NOFILE, &more);
	}
	/* Orphans of the processes started here are reaped here. */
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
		goto fail;
	e->sigfd = init_channel_signals(chan);
	if (e->sigfd < 0)
		goto fail;
	fcntl(chan, F_SETFD, FD_CLOEXEC);
	return e;

fail:
	err = errno;
	if (e->sigfd >= 0)
		close(e->sigfd);
	free(e);
	errno = err;
	return NULL;
}

static void envd_signals(struct envd *e)
{
	struct signalfd_siginfo si[8];

	for (;;) {
		ssize_t n = read(e->sigfd, si, sizeof(si));

		if (n > 0 || (n < 0 && errno == EINTR))
			continue;
		break;
	}
	envd_check_connection(e);
	envd_reap(e);
}

int envd_serve(struct envd *e)
{
	struct pollfd *pfd = e->pfd;
	struct envd_proc **pproc = e->pproc;
	struct envd_conn **pconn = e->pconn;
	struct envd_watch **pwatch = e->pwatch;
	uint8_t *pkind = e->pkind;
	int r, i;

	e->connected = 0;
	if (envd_host_there(e))
		envd_new_connection(e, 0);
	for (;;) {
		int64_t now = proto_now_ms();
		int timeout = -1, busy, np = 0;

		/* Free the slots whose END the host has by now. */
		for (i = 0; i < ENVD_MAX_PROCS; i++)
			if (e->procs[i] && e->procs[i]->ended && e->tx_sent >= e->procs[i]->end_off)
				envd_proc_free(e, i);
		envd_serve_frames(e);
		busy = envd_fs_jobs_run(e);
		busy |= envd_conns_tick(e);
		busy |= envd_watches_run(e);
		for (i = 0; i < ENVD_MAX_JOBS; i++)
			if (e->jobs[i] && e->jobs[i]->kind == ENVD_JOB_LIST)
				envd_list_step(e, e->jobs[i]);
		for (i = 0; i < ENVD_MAX_PROCS; i++) {
			int t = e->procs[i] ? envd_proc_tick(e, e->procs[i], now) : -1;

			if (t >= 0 && (timeout < 0 || t < timeout))
				timeout = t;
		}
		r = envd_flush(e);
		if (r < 0)
			return r;

		pfd[np] = (struct pollfd){ .fd = e->sigfd, .events = POLLIN };
		pkind[np++] = 0;
		if (e->connected) {
			short ev = 0;

			if (e->rx_end - e->rx_start < sizeof(e->rx))
				ev |= POLLIN;
			if (e->tx_tail > e->tx_head)
				ev |= POLLOUT;
			pfd[np] = (struct pollfd){ .fd = e->chan, .events = ev };
			pkind[np++] = 1;
		} else if (timeout < 0 || timeout > ENVD_RECHECK_MS) {
			timeout = ENVD_RECHECK_MS;
		}
		for (i = 0; i < ENVD_MAX_PROCS; i++) {
			struct envd_proc *p = e->procs[i];
			int readable = envd_tx_ok(e) && p && p->unacked < EPROTO_WINDOW;

			if (!p)
				continue;
			if (readable && p->out >= 0) {
				pfd[np] = (struct pollfd){ .fd = p->out, .events = POLLIN };
				pproc[np] = p;
				pkind[np++] = 2;
			}
			if (readable && p->err >= 0) {
				pfd[np] = (struct pollfd){ .fd = p->err, .events = POLLIN };
				pproc[np] = p;
				pkind[np++] = 3;
			}
			if (p->inq.fd >= 0 && p->inq.len) {
				pfd[np] = (struct pollfd){ .fd = p->inq.fd, .events = POLLOUT };
				pproc[np] = p;
				pkind[np++] = 4;
			}
		}
		for (i = 0; i < ENVD_MAX_CONNS; i++) {
			struct envd_conn *c = e->conns[i];
			short ev = 0;

			if (!c)
				continue;
			if (c->connecting)
				ev = POLLOUT;
			else {
				if (envd_tx_ok(e) && !c->srv_eof && c->unacked < EPROTO_WINDOW)
					ev |= POLLIN;
				if (c->in.fd >= 0 && c->in.len)
					ev |= POLLOUT;
			}
			if (!ev)
				continue;
			pfd[np] = (struct pollfd){ .fd = c->fd, .events = ev };
			pconn[np] = c;
			pkind[np++] = 5;
		}
		for (i = 0; i < ENVD_MAX_WATCHES; i++) {
			struct envd_watch *w = e->watches[i];

			if (!w || !envd_tx_ok(e) || w->off < w->len || w->ending)
				continue;
			pfd[np] = (struct pollfd){ .fd = w->fd, .events = POLLIN };
			pwatch[np] = w;
			pkind[np++] = 6;
		}
		if (busy || (e->connected && envd_tx_ok(e) && e->rx_end > e->rx_start &&
			     proto_frame_parse(e->rx + e->rx_start, e->rx_end - e->rx_start,
					       &(struct proto_frame){ 0 }) != 0))
			timeout = 0;
		if (poll(pfd, (nfds_t)np, timeout) < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		for (i = 0; i < np; i++) {
			if (!pfd[i].revents)
				continue;
			switch (pkind[i]) {
			case 0:
				envd_signals(e);
				break;
			case 1:
				if (pfd[i].revents & POLLIN) {
					r = envd_read(e);
					if (r < 0)
						return r;
				} else if (pfd[i].revents & (POLLHUP | POLLERR)) {
					envd_hangup(e);
				}
				break;
			case 2:
				envd_pump(e, pproc[i], &pproc[i]->out, (pproc[i]->flags & EP_START_PTY) ? EP_PTY : EP_STDOUT,
					  &pproc[i]->drain_out);
				break;
			case 3:
				envd_pump(e, pproc[i], &pproc[i]->err, EP_STDERR, &pproc[i]->drain_err);
				break;
			case 4:
				inq_flush(&pproc[i]->inq);
				break;
			case 5:
				envd_conn_event(e, pconn[i], pfd[i].revents);
				break;
			case 6:
				envd_watch_read(e, pwatch[i]);
				break;
			}
		}
		if (!e->connected)
			envd_check_connection(e);
	}
}

void envd_destroy(struct envd *e)
{
	int i;

	if (!e)
		return;
	for (i = 0; i < ENVD_MAX_JOBS; i++)
		if (e->jobs[i])
			envd_job_free(e, i);
	envd_conns_drop(e);
	envd_watches_drop(e);
	for (i = 0; i < ENVD_MAX_PROCS; i++) {
		struct envd_proc *p = e->procs[i];

		if (!p)
			continue;
		if (!p->exited) {
			kill(-p->pid, SIGKILL);
			kill(p->pid, SIGKILL);
			while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR)
				;
		}
		envd_proc_free(e, i);
	}
	close(e->sigfd);
	close(e->chan);
	free(e);
}

/* ---- kiln-init's side ---------------------------------------------------- */

/* How long envd waits for its port at boot: the names of virtio ports come
 * in control messages after the devices, a little after the agent's. */
#define ENVD_PORT_WAIT_MS 10000
#define ENVD_PORT_RETRY_NS (20 * 1000 * 1000)
#define ENVD_PORT_SETTLE_MS 500
#define ENVD_EXIT_NOPORT 3
#define ENVD_RESTART_S 1
#define ENVD_RESTART_MAX_S 32
#define ENVD_STABLE_MS 60000

static void __attribute__((noreturn)) envd_main(void)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = ENVD_PORT_RETRY_NS };
	int64_t deadline = proto_now_ms() + ENVD_PORT_WAIT_MS, settled = 0;
	struct envd *e;
	int fd, r;

	for (;;) {
		int64_t now = proto_now_ms();

		fd = init_find_port(ENVD_PORT_NAME);
		if (fd >= 0)
			break;
		/* Every port there is named and none is ours, and it stays so
		 * for a moment: this VM has no envd port (an older host), so
		 * stop looking well before the deadline. */
		if (fd == -ENOENT && init_ports_named()) {
			if (!settled)
				settled = now;
			if (now - settled >= ENVD_PORT_SETTLE_MS)
				_exit(ENVD_EXIT_NOPORT);
		} else {
			settled = 0;
		}
		if (fd != -ENOENT || now >= deadline) {
			if (fd != -ENOENT)
				init_log("envd: opening port %s: %s", ENVD_PORT_NAME, strerror(-fd));
			_exit(ENVD_EXIT_NOPORT);
		}
		nanosleep(&ts, NULL);
	}
	r = envd_ensure_user(&envd_guest_config);
	if (r < 0)
		init_log("envd: making user %s: %s", ENVD_DEFAULT_USER, strerror(-r));
	e = envd_create(fd, &envd_guest_config);
	if (!e) {
		init_log("envd: %s", strerror(errno));
		_exit(1);
	}
	r = envd_serve(e);
	init_log("envd: channel: %s", strerror(-r));
	_exit(1);
}

pid_t envd_spawn(void)
{
	int delay = ENVD_RESTART_S;
	pid_t sup = fork();

	if (sup != 0)
		return sup < 0 ? -errno : sup;
	prctl(PR_SET_NAME, "kiln-envd-sup");
	for (;;) {
		struct timespec ts = { .tv_sec = delay };
		int64_t began = proto_now_ms();
		int st;
		pid_t pid = fork();

		if (pid == 0) {
			prctl(PR_SET_NAME, "kiln-envd");
			envd_main();
		}
		if (pid < 0) {
			init_log("envd: fork: %s", strerror(errno));
		} else {
			while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
				;
			if (WIFEXITED(st) && WEXITSTATUS(st) == ENVD_EXIT_NOPORT)
				_exit(0); /* no port: this VM has no envd */
			if (WIFSIGNALED(st))
				init_log("envd: killed by signal %d; starting it again", WTERMSIG(st));
			else
				init_log("envd: exited with status %d; starting it again", WEXITSTATUS(st));
		}
		/* An envd that dies at once again and again must not flood the
		 * (slow) console: wait longer each time, up to a limit. */
		if (pid > 0 && proto_now_ms() - began > ENVD_STABLE_MS)
			delay = ENVD_RESTART_S;
		ts.tv_sec = delay;
		nanosleep(&ts, NULL);
		if (delay < ENVD_RESTART_MAX_S)
			delay *= 2;
	}
}
