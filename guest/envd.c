/* envd: the event loop of the guest's E2B-style daemon (lib/eproto.h,
 * docs/e2b.md "Guest: envd"): the channel (receive buffer, a bounded send
 * buffer that is never waited on), the host's (re)connections, and the
 * processes START runs: fork as the user, OUT under a per-process window,
 * END, stdin, signals, terminal size, LIST. File requests are envd_fs.c's.
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

#define ENVD_DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
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

static void envd_proc_free(struct envd *e, int slot);

static void envd_hello(struct envd *e)
{
	uint32_t v[2] = { EPROTO_VERSION, 0 };

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

/* ---- processes: the child ----------------------------------------------- */

struct envd_child {
	const struct envd_user *u;
	const char *cwd;
	char *const *argv;
	char *const *envp;
	const char *path; /* PATH to search argv[0] in */
	int in, out, err, tty; /* tty >= 0: the terminal for all three */
	int errpipe;           /* write end: why the child failed before exec */
	struct rlimit nofile;
};

/* Tells the parent why, then exits. */
static void __attribute__((noreturn)) envd_child_fail(const struct envd_child *c, int err, const char *what)
{
	char buf[PROTO_MAX_MSG];
	int32_t code = -err;
	size_t n;

	memcpy(buf, &code, sizeof(code));
	n = sizeof(code) + (size_t)snprintf(buf + sizeof(code), sizeof(buf) - sizeof(code), "%s: %s", what,
					    strerror(err));
	if (n > sizeof(buf))
		n = sizeof(buf);
	if (write(c->errpipe, buf, n) < 0)
		_exit(127);
	_exit(127);
}

static void __attribute__((noreturn)) envd_child_exec(const struct envd_child *c)
{
	char failed[PATH_MAX], what[PATH_MAX + 32];
	int err = exec_in_path(c->argv[0], c->argv, c->envp, c->path, failed, sizeof(failed));

	snprintf(what, sizeof(what), "cannot execute %s", failed);
	envd_child_fail(c, err, what);
}

static void __attribute__((noreturn)) envd_child(struct envd_child *c)
{
	struct sigaction dfl = { .sa_handler = SIG_DFL };
	sigset_t none;
	int sig, fd;

	/* envd blocks SIGCHLD and SIGIO and ignores SIGPIPE; both survive exec. */
	for (sig = 1; sig < NSIG; sig++)
		sigaction(sig, &dfl, NULL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	if (setsid() < 0)
		envd_child_fail(c, errno, "setsid");
	if (c->tty >= 0) {
		if (ioctl(c->tty, TIOCSCTTY, 0) < 0)
			envd_child_fail(c, errno, "cannot take the terminal");
		if (dup2(c->tty, 0) < 0 || dup2(c->tty, 1) < 0 || dup2(c->tty, 2) < 0)
			envd_child_fail(c, errno, "dup2");
		if (fchown(0, c->u->uid, c->u->gid) < 0 && geteuid() == 0)
			envd_child_fail(c, errno, "cannot hand over the terminal");
	} else {
		fd = c->in >= 0 ? c->in : open("/dev/null", O_RDONLY);
		if (fd < 0)
			envd_child_fail(c, errno, "cannot open /dev/null");
		if (dup2(c->out, 1) < 0 || dup2(c->err, 2) < 0 || dup2(fd, 0) < 0)
			envd_child_fail(c, errno, "dup2");
	}
	/* Everything of envd's is O_CLOEXEC but the error pipe must stay; the
	 * channel must never reach a process. */
	if (c->errpipe != 3) {
		if (dup3(c->errpipe, 3, O_CLOEXEC) < 0)
			envd_child_fail(c, errno, "dup3");
		c->errpipe = 3;
	}
	close_range(4, ~0U, 0);
	/* kiln-init's OOM immunity, priority and descriptor limit are envd's,
	 * not the user's. */
	fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (write(fd, "0", 1) != 1 && geteuid() == 0)
			envd_child_fail(c, errno, "cannot reset oom_score_adj");
		close(fd);
	}
	if (setpriority(PRIO_PROCESS, 0, 0) < 0 && geteuid() == 0)
		envd_child_fail(c, errno, "cannot reset the priority");
	setrlimit(RLIMIT_NOFILE, &c->nofile);
	if (geteuid() == 0) {
		if (setgroups((size_t)c->u->ngroups, c->u->groups) < 0)
			envd_child_fail(c, errno, "setgroups");
		if (setgid(c->u->gid) < 0)
			envd_child_fail(c, errno, "setgid");
		if (setuid(c->u->uid) < 0)
			envd_child_fail(c, errno, "setuid");
	} else if (c->u->uid != geteuid()) {
		envd_child_fail(c, EPERM, "cannot change user (envd does not run as root)");
	}
	umask(022);
	if (chdir(c->cwd) < 0) {
		char what[PROTO_MAX_PATH + 32];

		snprintf(what, sizeof(what), "cannot change directory to %s", c->cwd);
		envd_child_fail(c, errno, what);
	}
	envd_child_exec(c);
}

/* ---- processes: the parent ---------------------------------------------- */

struct envd_proc *envd_proc_find(struct envd *e, uint32_t pid)
{
	int i;

	if (pid == 0)
		return NULL;
	for (i = 0; i < ENVD_MAX_PROCS; i++)
		if (e->procs[i] && !e->procs[i]->ended && (uint32_t)e->procs[i]->pid == pid)
			return e->procs[i];
	return NULL;
}

static void envd_close(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

static void envd_close_in(struct envd_proc *p)
{
	envd_close(&p->in);
	free(p->pending);
	p->pending = NULL;
	p->pending_len = 0;
}

static void envd_proc_free(struct envd *e, int slot)
{
	struct envd_proc *p = e->procs[slot];

	envd_close_in(p);
	envd_close(&p->out);
	envd_close(&p->err);
	free(p->start);
	free(p);
	e->procs[slot] = NULL;
}

/* The env a process gets: the login defaults, each unless START sets it,
 * then START's. envp has room for 6 + PROTO_MAX_ENV + 1 entries; defs holds
 * the default strings. Returns the PATH to search. */
static const char *envd_env(const struct eproto_start *s, const struct envd_user *u, char defs[6][PROTO_MAX_PATH + 16],
			    char **envp)
{
	const char *path = ENVD_DEFAULT_PATH;
	size_t n = 0, d, i;

	snprintf(defs[0], sizeof(defs[0]), "HOME=%s", u->home);
	snprintf(defs[1], sizeof(defs[1]), "USER=%s", u->name);
	snprintf(defs[2], sizeof(defs[2]), "LOGNAME=%s", u->name);
	snprintf(defs[3], sizeof(defs[3]), "SHELL=%s", u->shell[0] ? u->shell : "/bin/sh");
	snprintf(defs[4], sizeof(defs[4]), "PATH=%s", ENVD_DEFAULT_PATH);
	snprintf(defs[5], sizeof(defs[5]), "%s", (s->flags & EP_START_PTY) ? "TERM=xterm-256color" : "");
	for (d = 0; d < 6; d++) {
		size_t klen = strcspn(defs[d], "=") + 1;
		int overridden = !defs[d][0];

		for (i = 0; !overridden && i < s->envc; i++)
			overridden = !strncmp(s->env[i], defs[d], klen);
		if (!overridden)
			envp[n++] = defs[d];
	}
	for (i = 0; i < s->envc; i++) {
		envp[n++] = (char *)s->env[i];
		if (!strncmp(s->env[i], "PATH=", 5))
			path = s->env[i] + 5;
	}
	envp[n] = NULL;
	return path;
}

/* Reads the child's report: nothing (EOF) when exec succeeded, else the
 * negative errno and the message. */
static int envd_child_report(int fd, char *msg, size_t cap)
{
	char buf[PROTO_MAX_MSG];
	size_t len = 0;
	int32_t code;

	for (;;) {
		ssize_t n = read(fd, buf + len, sizeof(buf) - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
		if (len == sizeof(buf))
			break;
	}
	if (len < sizeof(code))
		return 0;
	memcpy(&code, buf, sizeof(code));
	snprintf(msg, cap, "%.*s", (int)(len - sizeof(code)), buf + sizeof(code));
	return code < 0 && code >= -4095 ? code : -EIO;
}

static int envd_free_slot(struct envd *e)
{
	int i;

	for (i = 0; i < ENVD_MAX_PROCS; i++)
		if (!e->procs[i])
			return i;
	return -1;
}

/* START: the frame is in e->start (decoded) and p/len (raw). */
static void envd_start(struct envd *e, const uint8_t *raw, size_t len)
{
	const struct eproto_start *s = &e->start;
	struct envd_user *u = &e->user;
	char cwd[PROTO_MAX_PATH + 1], msg[PROTO_MAX_MSG];
	struct envd_child c = { .in = -1, .out = -1, .err = -1, .tty = -1, .errpipe = -1 };
	int outp[2] = { -1, -1 }, errp[2] = { -1, -1 }, inp[2] = { -1, -1 }, rep[2] = { -1, -1 };
	int master = -1, slot, r, unlock = 0;
	struct envd_proc *p;
	uint32_t v[2];
	pid_t pid;

	slot = envd_free_slot(e);
	if (slot < 0) {
		envd_send_error(e, s->req, -EAGAIN, "START: %d processes already", ENVD_MAX_PROCS);
		return;
	}
	r = envd_user_lookup(e->cfg, s->user, u);
	if (r < 0) {
		envd_send_error(e, s->req, r, "START: user %s: %s", s->user[0] ? s->user : ENVD_DEFAULT_USER,
				r == -ENOENT ? "no such user" : strerror(-r));
		return;
	}
	r = envd_resolve(u, s->cwd[0] ? s->cwd : u->home, cwd);
	if (r < 0) {
		envd_send_error(e, s->req, r, "START: cwd %s: %s", s->cwd, strerror(-r));
		return;
	}
	p = calloc(1, sizeof(*p));
	if (p)
		p->start = malloc(len);
	if (!p || !p->start) {
		free(p);
		envd_send_error(e, s->req, -ENOMEM, "START: out of memory");
		return;
	}
	memcpy(p->start, raw, len);
	p->start_len = len;
	p->out = p->err = p->in = -1;
	p->flags = s->flags;

	c.u = u;
	c.cwd = cwd;
	c.argv = (char *const *)s->argv;
	c.path = envd_env(s, u, e->env_defs, e->envp);
	c.envp = e->envp;
	c.nofile = e->nofile;
	if (pipe2(rep, O_CLOEXEC) < 0)
		goto fail_errno;
	c.errpipe = rep[1];
	if (s->flags & EP_START_PTY) {
		struct winsize ws = { .ws_row = (unsigned short)s->rows, .ws_col = (unsigned short)s->cols };

		master = open("/dev/pts/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
		if (master < 0) /* a devpts without ptmxmode (tests): the classic node */
			master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
		if (master < 0 || ioctl(master, TIOCSPTLCK, &unlock) < 0 || ioctl(master, TIOCSWINSZ, &ws) < 0 ||
		    (c.tty = ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0 ||
		    (p->in = fcntl(master, F_DUPFD_CLOEXEC, 3)) < 0)
			goto fail_errno;
	} else {
		if (pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0)
			goto fail_errno;
		if ((s->flags & EP_START_STDIN) && pipe2(inp, O_CLOEXEC) < 0)
			goto fail_errno;
		/* Only our ends: the process gets ordinary blocking pipes. */
		if (fcntl(outp[0], F_SETFL, O_NONBLOCK) < 0 || fcntl(errp[0], F_SETFL, O_NONBLOCK) < 0 ||
		    (inp[1] >= 0 && fcntl(inp[1], F_SETFL, O_NONBLOCK) < 0))
			goto fail_errno;
		c.in = inp[0];
		c.out = outp[1];
		c.err = errp[1];
	}
	pid = fork();
	if (pid < 0)
		goto fail_errno;
	if (pid == 0)
		envd_child(&c);
	envd_close(&rep[1]);
	envd_close(&c.tty);
	envd_close(&outp[1]);
	envd_close(&errp[1]);
	envd_close(&inp[0]);
	r = envd_child_report(rep[0], msg, sizeof(msg));
	envd_close(&rep[0]);
	if (r < 0) {
		/* It _exit()ed right after telling: reap it here, not as a
		 * process of the table. */
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		envd_close(&outp[0]);
		envd_close(&errp[0]);
		envd_close(&inp[1]);
		envd_close(&p->in);
		envd_close(&master);
		free(p->start);
		free(p);
		envd_send_error(e, s->req, r, "START: %s", msg);
		return;
	}
	p->pid = pid;
	if (s->flags & EP_START_PTY) {
		p->out = master;
	} else {
		p->out = outp[0];
		p->err = errp[0];
		p->in = inp[1];
	}
	e->procs[slot] = p;
	v[0] = s->req;
	v[1] = (uint32_t)pid;
	envd_send_u32s(e, EP_STARTED, v, 2);
	return;

fail_errno:
	r = -errno;
	envd_close(&rep[0]);
	envd_close(&rep[1]);
	envd_close(&c.tty);
	envd_close(&master);
	envd_close(&outp[0]);
	envd_close(&outp[1]);
	envd_close(&errp[0]);
	envd_close(&errp[1]);
	envd_close(&inp[0]);
	envd_close(&inp[1]);
	envd_close(&p->in);
	free(p->start);
	free(p);
	envd_send_error(e, s->req, r, "START: %s", strerror(-r));
}

/* Writes what input is pending, as far as the process takes it now. */
static void envd_flush_in(struct envd_proc *p)
{
	size_t off = 0;

	while (p->in >= 0 && off < p->pending_len) {
		ssize_t n = write(p->in, p->pending + off, p->pending_len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		if (n <= 0) {
			envd_close_in(p); /* EPIPE, EIO: nobody reads any more */
			return;
		}
		off += (size_t)n;
	}
	if (p->in < 0)
		return;
	memmove(p->pending, p->pending + off, p->pending_len - off);
	p->pending_len -= off;
	if (!p->pending_len && p->in_eof) {
		envd_close_in(p);
	} else if (!p->pending_len) {
		/* Most input is taken at once: hold no buffer while idle. */
		free(p->pending);
		p->pending = NULL;
	}
}

/* Input held for all processes: bounded as a whole too, so that a thousand
 * processes that do not read cannot grow envd by a gigabyte. */
static size_t envd_pending_total(struct envd *e)
{
	size_t total = 0;
	int i;

	for (i = 0; i < ENVD_MAX_PROCS; i++)
		if (e->procs[i])
			total += e->procs[i]->pending_len;
	return total;
}

static void envd_input(struct envd *e, struct envd_proc *p, const uint8_t *data, size_t n)
{
	size_t room;

	if (p->in < 0 || p->in_eof || n == 0)
		return; /* no stdin, or closed: crossed on the wire */
	/* Straight into the pipe when nothing waits before it. */
	while (!p->pending_len && n > 0) {
		ssize_t w = write(p->in, data, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN)
			break;
		if (w <= 0) {
			envd_close_in(p);
			return;
		}
		data += w;
		n -= (size_t)w;
	}
	if (n == 0)
		return;
	if (!p->pending) {
		p->pending = malloc(ENVD_STDIN_MAX);
		if (!p->pending)
			return;
	}
	room = ENVD_STDIN_MAX - p->pending_len;
	if (envd_pending_total(e) + room > ENVD_STDIN_TOTAL)
		room = ENVD_STDIN_TOTAL > envd_pending_total(e) ? ENVD_STDIN_TOTAL - envd_pending_total(e) : 0;
	if (n > room) {
		int64_t now = proto_now_ms();

		if (now - e->input_drop_log_ms > 1000) {
			init_log("envd: pid %d does not read its input: %zu bytes dropped", (int)p->pid, n - room);
			e->input_drop_log_ms = now;
		}
		n = room;
	}
	memcpy(p->pending + p->pending_len, data, n);
	p->pending_len += n;
	envd_flush_in(p);
}

static void envd_close_stdin(struct envd_proc *p)
{
	static const uint8_t veof = 0x04;

	if (p->in < 0 || p->in_eof)
		return;
	if (p->flags & EP_START_PTY) {
		/* A terminal has no end of input but its EOF character, what a
		 * user would type; the master stays (it carries the output). */
		if (!p->pending)
			p->pending = malloc(ENVD_STDIN_MAX);
		if (p->pending && p->pending_len < ENVD_STDIN_MAX)
			p->pending[p->pending_len++] = veof;
		envd_flush_in(p);
		return;
	}
	p->in_eof = 1;
	envd_flush_in(p);
}

/* Reads one pipe into an OUT frame, within the window. */
static void envd_pump(struct envd *e, struct envd_proc *p, int *fd, uint8_t stream, size_t *drain)
{
	uint8_t *buf;
	size_t want = EPROTO_MAX_CHUNK;
	ssize_t n;

	if (!envd_tx_ok(e) || p->unacked >= EPROTO_WINDOW)
		return;
	if (EPROTO_WINDOW - p->unacked < want)
		want = (size_t)(EPROTO_WINDOW - p->unacked);
	if (p->draining && *drain < want)
		want = *drain;
	buf = envd_tx_payload(e);
	if (want == 0) {
		envd_close(fd);
		return;
	}
	n = read(*fd, buf + 5, want);
	if (n < 0 && errno == EINTR)
		return;
	if (n < 0 && errno == EAGAIN) {
		if (p->draining)
			envd_close(fd); /* all that was buffered at the linger's end is out */
		return;
	}
	/* A terminal's master reads EIO once no process holds the other side. */
	if (n <= 0) {
		envd_close(fd);
		return;
	}
	if (p->draining)
		*drain -= (size_t)n;
	buf[0] = (uint8_t)p->pid;
	buf[1] = (uint8_t)((uint32_t)p->pid >> 8);
	buf[2] = (uint8_t)((uint32_t)p->pid >> 16);
	buf[3] = (uint8_t)((uint32_t)p->pid >> 24);
	buf[4] = stream;
	p->unacked += (uint64_t)n;
	envd_tx_commit(e, EP_OUT, 5 + (size_t)n);
	/* What was buffered at the linger's end is out: the pipe may never
	 * poll readable again (its writer is silent), so close it now. */
	if (p->draining && *drain == 0)
		envd_close(fd);
}

static size_t envd_buffered(int fd)
{
	int n = 0;

	if (fd < 0 || ioctl(fd, FIONREAD, &n) < 0 || n < 0)
		return 0;
	return (size_t)n;
}

/* After exit: start the drain once the linger is over, and send END once
 * the pipes are closed. Returns the ms until this process needs a look
 * again, or -1. */
static int envd_proc_tick(struct envd *e, struct envd_proc *p, int64_t now)
{
	ssize_t n;
	uint8_t how;
	uint32_t status;

	if (!p->exited || p->ended)
		return -1;
	if (!p->draining && (p->out >= 0 || p->err >= 0)) {
		if (now < p->exit_ms + ENVD_LINGER_MS)
			return (int)(p->exit_ms + ENVD_LINGER_MS - now);
		/* A background child holds the pipe: deliver what is buffered
		 * now, nothing written after. */
		p->draining = 1;
		p->drain_out = envd_buffered(p->out);
		p->drain_err = envd_buffered(p->err);
		if (!p->drain_out)
			envd_close(&p->out);
		if (!p->drain_err)
			envd_close(&p->err);
	}
	if (p->out >= 0 || p->err >= 0 || !envd_tx_ok(e))
		return -1;
	if (WIFSIGNALED(p->wstatus)) {
		how = PROTO_SIGNALED;
		status = (uint32_t)WTERMSIG(p->wstatus);
	} else {
		how = PROTO_EXITED;
		status = (uint32_t)WEXITSTATUS(p->wstatus);
	}
	n = eproto_end_encode(envd_tx_payload(e), PROTO_MAX_PAYLOAD, (uint32_t)p->pid, how, status);
	if (n < 0)
		return -1;
	envd_tx_commit(e, EP_END, (size_t)n);
	p->ended = 1;
	p->end_off = e->tx_appended;
	return -1;
}

static void envd_reap(struct envd *e)
{
	for (;;) {
		int st, i;
		pid_t pid = waitpid(-1, &st, WNOHANG);

		if (pid < 0 && errno == EINTR)
			continue;
		if (pid <= 0)
			return;
		/* Orphans of our processes come here too (subreaper): nothing
		 * to do for them. */
		for (i = 0; i < ENVD_MAX_PROCS; i++) {
			struct envd_proc *p = e->procs[i];

			if (p && !p->exited && p->pid == pid) {
				p->exited = 1;
				p->wstatus = st;
				p->exit_ms = proto_now_ms();
				/* Input after the end goes nowhere; a pty's
				 * master (out) stays for its last output. */
				envd_close_in(p);
				break;
			}
		}
	}
}

/* ---- LIST ---------------------------------------------------------------- */

static void envd_list_step(struct envd *e, struct envd_job *j)
{
	while (envd_tx_ok(e)) {
		struct envd_proc *p;
		ssize_t n;
		uint32_t i;

		while (j->next < ENVD_MAX_PROCS && (!e->procs[j->next] || e->procs[j->next]->ended))
			j->next++;
		if (j->next >= ENVD_MAX_PROCS) {
			int slot;

			envd_send_done(e, j->req);
			for (slot = 0; slot < ENVD_MAX_JOBS; slot++)
				if (e->jobs[slot] == j)
					envd_job_free(e, slot);
			return;
		}
		p = e->procs[j->next++];
		if (eproto_start_decode(p->start, p->start_len, &e->start) < 0)
			continue; /* cannot happen: it was decoded once */
		e->proc.req = j->req;
		e->proc.pid = (uint32_t)p->pid;
		e->proc.flags = p->flags;
		e->proc.tag = e->start.tag;
		e->proc.cwd = e->start.cwd;
		e->proc.argc = e->start.argc;
		e->proc.envc = e->start.envc;
		for (i = 0; i <= e->start.argc; i++)
			e->proc.argv[i] = e->start.argv[i];
		for (i = 0; i <= e->start.envc; i++)
			e->proc.env[i] = e->start.env[i];
		n = eproto_proc_encode(envd_tx_payload(e), PROTO_MAX_PAYLOAD, &e->proc);
		if (n >= 0)
			envd_tx_commit(e, EP_PROC, (size_t)n);
	}
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
	case EP_STAT:
	case EP_LISTDIR:
	case EP_MKDIR:
	case EP_MOVE:
	case EP_REMOVE:
	case EP_READ:
	case EP_WRITE:
	case EP_WDATA:
	case EP_WEND:
	case EP_CANCEL:
		return envd_fs_request(e, f->type, f->payload, f->len);
	default:
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
			if (p->in >= 0 && p->pending_len) {
				pfd[np] = (struct pollfd){ .fd = p->in, .events = POLLOUT };
				pproc[np] = p;
				pkind[np++] = 4;
			}
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
				envd_flush_in(pproc[i]);
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
