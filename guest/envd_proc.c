/* envd's processes (docs/e2b.md "Guest: envd"): START forks the child as
 * its user (a pipe or a terminal for its stdio), stdin is queued for it
 * (guest/inq.c), its output is read under the per-process window into OUT
 * frames, END follows its exit and the drain of its pipes, and LIST walks
 * them. The channel and the loop that calls these are envd.c's. */
#include "envd_int.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "init.h"
#include "execpath.h"

#define ENVD_DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
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
	int fd;

	init_child_signals();
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


void envd_proc_free(struct envd *e, int slot)
{
	struct envd_proc *p = e->procs[slot];

	inq_close(&p->inq);
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
void envd_start(struct envd *e, const uint8_t *raw, size_t len)
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
	p->out = p->err = -1;
	inq_init(&p->inq, -1, ENVD_STDIN_MAX);
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
		    (p->inq.fd = fcntl(master, F_DUPFD_CLOEXEC, 3)) < 0)
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
		inq_close(&p->inq);
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
		p->inq.fd = inp[1];
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
	inq_close(&p->inq);
	free(p->start);
	free(p);
	envd_send_error(e, s->req, r, "START: %s", strerror(-r));
}

/* Input held for all processes: bounded as a whole too, so that a thousand
 * processes that do not read cannot grow envd by a gigabyte. */
static size_t envd_pending_total(struct envd *e)
{
	size_t total = 0;
	int i;

	for (i = 0; i < ENVD_MAX_PROCS; i++)
		if (e->procs[i])
			total += e->procs[i]->inq.len;
	return total;
}

void envd_input(struct envd *e, struct envd_proc *p, const uint8_t *data, size_t n)
{
	size_t total = envd_pending_total(e);
	size_t room = ENVD_STDIN_TOTAL > total ? ENVD_STDIN_TOTAL - total : 0;
	size_t dropped = inq_put(&p->inq, data, n, room);

	if (dropped) {
		int64_t now = proto_now_ms();

		if (now - e->input_drop_log_ms > 1000) {
			init_log("envd: pid %d does not read its input: %zu bytes dropped", (int)p->pid, dropped);
			e->input_drop_log_ms = now;
		}
	}
}

void envd_close_stdin(struct envd_proc *p)
{
	static const uint8_t veof = 0x04;

	if (p->flags & EP_START_PTY) {
		/* A terminal has no end of input but its EOF character, what a
		 * user would type; the master stays (it carries the output). */
		inq_put(&p->inq, &veof, 1, inq_room(&p->inq));
		return;
	}
	inq_end(&p->inq);
}

/* Reads one pipe into an OUT frame, within the window. */
void envd_pump(struct envd *e, struct envd_proc *p, int *fd, uint8_t stream, size_t *drain)
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
int envd_proc_tick(struct envd *e, struct envd_proc *p, int64_t now)
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

void envd_reap(struct envd *e)
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
				inq_close(&p->inq);
				break;
			}
		}
	}
}

/* ---- LIST ---------------------------------------------------------------- */

void envd_list_step(struct envd *e, struct envd_job *j)
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

