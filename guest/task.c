/* task: one EXEC at a time: fork, drop to the task's uid, exec; forward its
 * stdout/stderr as they are read, cap them, kill the whole uid on KILL, on
 * the cap and at the end; feed STDIN frames to an interactive task (a pipe
 * or a pseudo-terminal); report EXIT with rusage and the OOM verdict. */
#include "task.h"
#include "execpath.h"
#include "io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "init.h"
#include "inq.h"
#include "zygote.h"

#define TASK_CHUNK    (64 * 1024) /* most bytes per STDOUT/STDERR frame */
/* Output batching (a batch task: neither a terminal nor interactive). Each
 * frame is a write on the virtio port, a VM exit that costs far more under
 * TCG than the task's own write(): once a pipe becomes readable it is left
 * to fill for TASK_BATCH_MS (not polled), then drained in TASK_CHUNK frames.
 * The pipes are enlarged to TASK_PIPE_SIZE so that a fast writer rarely
 * blocks within the delay. At most TASK_DRAIN_MAX bytes of one pipe per
 * round, so that the channel (KILL) is still served under a flood. */
#define TASK_BATCH_MS 3
#define TASK_PIPE_SIZE (1024 * 1024)
#define TASK_DRAIN_MAX (1024 * 1024)
/* Once the task's processes are killed the pipes reach EOF within
 * milliseconds; only a process outside the task's uid still holding them
 * (a set-uid helper) could keep them open, and EXIT must not wait on it. */
#define TASK_DRAIN_MS 5000
#define TASK_KEEP_DRAIN_MS 300
/* Input the task has not read yet, held in PID 1: beyond this it is dropped
 * (and EXIT says so) rather than let a task that never reads grow PID 1. */
#define TASK_STDIN_MAX (1u << 20)
/* After HANGUP, a task still running this long gets SIGKILL (its group). */
#define TASK_HANGUP_MS 3000

static const char task_default_path_env[] = "PATH=" TASK_DEFAULT_PATH;

struct task {
	const struct proto_exec *e;
	pid_t pid;
	int out, err; /* our read ends, -1 once at EOF (a terminal: out is its master, err -1) */
	struct inq inq; /* the task's stdin (our end of a pipe or the terminal's master), at most TASK_STDIN_MAX waiting */
	uint64_t sent; /* stdout + stderr bytes forwarded to the host */
	int64_t start_us, end_us, drain_deadline_ms;
	int64_t hangup_deadline_ms; /* after HANGUP: SIGKILL to the task's group then (0: none) */
	int batch;                  /* output is batched (not a terminal, not interactive, running) */
	int64_t batch_deadline_ms;  /* pipes left to fill until then, unpolled (0: polled) */
	int flowing;                /* the last round read a full frame: read at once, no delay */
	int done;   /* the pre-started interpreter's word that it is done (zygote_hand_off), or -1 */
	int exited; /* the main process exited (reaped, or said so on `done`) */
	int killed; /* we sent SIGKILL while the main process was alive */
	int wstatus;
	struct rusage ru;
	int64_t oom_before;
	struct proto_exit exit;
};

int task_reap(pid_t watch, int *status, struct rusage *ru)
{
	int found = 0;

	for (;;) {
		struct rusage r;
		int st;
		pid_t pid = wait4(-1, &st, WNOHANG, &r);

		if (pid < 0 && errno == EINTR)
			continue;
		if (pid <= 0)
			return found; /* 0: none exited yet; ECHILD: no children */
		if (watch > 0 && pid == watch) {
			*status = st;
			*ru = r;
			found = 1;
		}
	}
}

/* The kernel's count of OOM kills so far, or -1 when it cannot be read. */
int64_t task_oom_kills(void)
{
	char buf[32768];
	size_t len = 0;
	const char *p;
	int fd;

	fd = open("/proc/vmstat", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	while (len < sizeof(buf) - 1) {
		ssize_t n = read(fd, buf + len, sizeof(buf) - 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	for (p = buf; p;) {
		if (!strncmp(p, "oom_kill ", 9))
			return strtoll(p + 9, NULL, 10);
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return -1;
}

/* Does /proc/<pid>/status show uid as a real, effective or saved uid? */
static int task_pid_has_uid(const char *pid, uid_t uid)
{
	char path[64], buf[4096];
	unsigned long ids[3];
	const char *p;
	int i;

	snprintf(path, sizeof(path), "/proc/%s/status", pid);
	if (io_read_small(path, buf, sizeof(buf)) < 0)
		return 0;
	p = strstr(buf, "\nUid:");
	if (!p || sscanf(p + 5, "%lu %lu %lu", &ids[0], &ids[1], &ids[2]) != 3)
		return 0;
	for (i = 0; i < 3; i++)
		if (ids[i] == uid)
			return 1;
	return 0;
}

/* The fallback when PID 1 cannot fork: kill what /proc lists for uid. */
static void task_kill_uid_scan(uid_t uid)
{
	struct dirent *de;
	DIR *d;

	d = opendir("/proc");
	if (!d)
		return;
	while ((de = readdir(d))) {
		long pid = strtol(de->d_name, NULL, 10);

		if (pid > 1 && task_pid_has_uid(de->d_name, uid))
			kill((pid_t)pid, SIGKILL);
	}
	closedir(d);
}

/* Kills every process running as uid, wherever it went (setsid, double
 * fork, re-parented to PID 1). An unprivileged sender may signal exactly the
 * processes of its own uid, so a child that becomes uid and calls kill(-1)
 * reaches all of them and nothing else (kill(-1) spares PID 1 and the
 * caller). One pass is enough even against a fork bomb: fork() fails for a
 * parent with SIGKILL pending. Synchronous: a killer still running after
 * EXIT would kill the next task. The child is a vfork: it shares PID 1's
 * memory (no page tables copied, none torn down, and PID 1's pages are not
 * left copy-on-write: ~1 ms under TCG) and makes raw system calls only. Its
 * setresuid makes that shared memory non-dumpable, before the new uid takes
 * effect, so no process of the task's uid can ptrace or read it meanwhile. */
static pid_t __attribute__((noinline)) kill_uid_child(uid_t uid)
{
	pid_t pid = vfork();

	if (pid == 0) {
		if (syscall(SYS_setresuid, uid, uid, uid) < 0)
			_exit(1);
		syscall(SYS_kill, -1, SIGKILL);
		_exit(0);
	}
	return pid;
}

static void task_kill_uid(uid_t uid)
{
	int attempt, st, err = 0;
	pid_t pid;

	for (attempt = 0; attempt < 3; attempt++) {
		pid = kill_uid_child(uid);
		if (pid > 0) {
			while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
				;
			return;
		}
		/* Out of processes (threads-max binds root too), most likely
		 * because of this very task: free some the slow way. */
		err = errno;
		task_kill_uid_scan(uid);
	}
	init_log("task: cannot fork to kill uid %u: %s", (unsigned)uid, strerror(err));
}

static void task_kill(struct task *t)
{
	if (!t->exited) {
		t->killed = 1;
		/* The process group as well: it may hold processes that changed
		 * uid (set-uid helpers). The pid itself, for a child that has
		 * not reached setsid() or setuid() yet. */
		kill(-t->pid, SIGKILL);
		kill(t->pid, SIGKILL);
	}
	task_kill_uid(t->e->uid);
}

/* ---- the child ---------------------------------------------------------- */

static void __attribute__((noreturn)) task_child_fail(const char *what, const char *arg, int err)
{
	/* fd 2 is the task's stderr by now: the host sees this as output. */
	init_log("%s %s: %s", what, arg, strerror(err));
	_exit(127);
}

/* execvpe() with the task's PATH; never returns. */
static void __attribute__((noreturn)) task_child_exec(const char *file, char *const argv[],
						      char *const envp[], const char *path)
{
	char failed[PATH_MAX];
	int err = exec_in_path(file, argv, envp, path, failed, sizeof(failed));

	task_child_fail("cannot execute", failed, err);
}

/* The child's standard streams: stdin (-1: /dev/null), stdout and stderr;
 * or, when tty >= 0, that terminal for all three. */
struct task_stdio {
	int in, out, err, tty;
};

static void __attribute__((noreturn)) task_child(const struct proto_exec *e, char *const envp[],
						 const char *path, const struct task_stdio *io)
{
	int fd;

	init_child_signals();
	setsid();
	if (io->tty >= 0) {
		/* A new session's first terminal becomes its controlling one;
		 * the task's user owns it, as login(1) would arrange. */
		if (ioctl(io->tty, TIOCSCTTY, 0) < 0 || dup2(io->tty, 0) < 0 || dup2(io->tty, 1) < 0 ||
		    dup2(io->tty, 2) < 0)
			_exit(127);
		if (fchown(0, e->uid, e->gid) < 0)
			task_child_fail("cannot hand over", "the terminal", errno);
	} else {
		if (dup2(io->out, 1) < 0 || dup2(io->err, 2) < 0)
			_exit(127);
		fd = io->in >= 0 ? io->in : open("/dev/null", O_RDONLY);
		if (fd < 0 || dup2(fd, 0) < 0)
			task_child_fail("cannot open", "/dev/null", errno);
	}
	/* Everything of PID 1's is O_CLOEXEC already; this makes sure above
	 * all that the channel never reaches the task, which could then speak
	 * the protocol to the host. */
	close_range(3, ~0U, 0);
	/* PID 1's -1000 (and its nice value) are inherited: the task must be the OOM killer's first
	 * choice, not immune to it (which would end in a kernel panic). */
	fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "0", 1) != 1)
		task_child_fail("cannot reset", "/proc/self/oom_score_adj", errno);
	close(fd);
	if (setpriority(PRIO_PROCESS, 0, 0) < 0)
		task_child_fail("cannot reset", "the scheduling priority", errno);
	/* No set-uid or file-capability binary may lift the task out of its uid
	 * (where the uid-wide kill could no longer reach it). */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		task_child_fail("cannot set", "no_new_privs", errno);
	if (setgroups(0, NULL) < 0)
		task_child_fail("cannot drop", "supplementary groups", errno);
	if (setgid(e->gid) < 0)
		task_child_fail("cannot change group to", "the task's gid", errno);
	if (setuid(e->uid) < 0)
		task_child_fail("cannot change user to", "the task's uid", errno);
	/* After setuid(): the directory must be reachable by the task itself. */
	if (chdir(e->cwd) < 0)
		task_child_fail("cannot change directory to", e->cwd, errno);
	task_child_exec(e->argv[0], e->argv, envp, path);
}

/* ---- the parent ---------------------------------------------------------- */

/* Reads what one pipe (or terminal) holds and forwards it, up to the output
 * cap: as few frames as possible, each up to TASK_CHUNK bytes, read until
 * EAGAIN (at most TASK_DRAIN_MAX bytes a call). *total: the bytes read. */
static int task_pump(struct agent *a, struct task *t, int *fd, uint8_t type, uint64_t *count, size_t *total)
{
	uint8_t *buf = agent_payload(a);

	for (;;) {
		uint64_t room = t->e->output_cap - t->sent;
		size_t len = 0, fwd;
		int eof = 0, r;

		while (len < TASK_CHUNK) {
			ssize_t n = read(*fd, buf + len, TASK_CHUNK - len);

			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && errno == EAGAIN)
				break;
			/* A terminal's master reads EIO once no process holds the other side. */
			if (n < 0 && !((t->e->flags & PROTO_EXEC_TTY) && errno == EIO))
				init_log("task: reading output: %s", strerror(errno));
			if (n <= 0) {
				eof = 1;
				break;
			}
			len += (size_t)n;
		}
		*count += (uint64_t)len;
		fwd = (uint64_t)len < room ? len : (size_t)room;
		if (fwd > 0) {
			t->sent += fwd;
			r = agent_send(a, type, buf, fwd);
			if (r < 0)
				return r;
		}
		/* Keep reading past the cap (and drop it) so that the task never
		 * blocks on a full pipe before it is dead. */
		if (t->exit.stdout_bytes + t->exit.stderr_bytes > t->e->output_cap &&
		    !(t->exit.flags & PROTO_EXIT_OUTPUT_LIMIT)) {
			t->exit.flags |= PROTO_EXIT_OUTPUT_LIMIT;
			if (!t->exited)
				task_kill(t);
		}
		if (eof) {
			close(*fd);
			*fd = -1;
			return 0;
		}
		*total += len;
		if (len < TASK_CHUNK || *total >= TASK_DRAIN_MAX)
			return 0;
	}
}

/* The batch delay is over (or output is flowing): both pipes drained. A
 * writer that filled a whole frame is fast: its next output is read at once
 * (it fills the pipe while we send), until a round reads less. */
static int task_flush_out(struct agent *a, struct task *t)
{
	size_t out = 0, err = 0;
	int r;

	t->batch_deadline_ms = 0;
	if (t->out >= 0 && (r = task_pump(a, t, &t->out, PROTO_STDOUT, &t->exit.stdout_bytes, &out)) < 0)
		return r;
	if (t->err >= 0 && (r = task_pump(a, t, &t->err, PROTO_STDERR, &t->exit.stderr_bytes, &err)) < 0)
		return r;
	t->flowing = out >= TASK_CHUNK || err >= TASK_CHUNK;
	return 0;
}

/* STDIN: bytes for the task, or (empty) the end of its input. A terminal has
 * no end of input but its EOF character, which is what a user would type. */
static void task_stdin(struct task *t, const uint8_t *p, size_t n)
{
	static const uint8_t veof = 0x04;

	if (n == 0 && !(t->e->flags & PROTO_EXEC_TTY)) {
		inq_end(&t->inq);
		return;
	}
	if (n == 0) {
		p = &veof;
		n = 1;
	}
	if (inq_put(&t->inq, p, n, inq_room(&t->inq)))
		t->exit.flags |= PROTO_EXIT_STDIN_LOST;
}

static void task_resize(struct task *t, uint32_t rows, uint32_t cols)
{
	struct winsize ws = { .ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols };

	/* The kernel sends SIGWINCH to the terminal's foreground group. */
	if ((t->e->flags & PROTO_EXEC_TTY) && t->out >= 0 && ioctl(t->out, TIOCSWINSZ, &ws) < 0)
		init_log("task: resizing the terminal: %s", strerror(errno));
}

/* HANGUP: the client of an interactive task is gone. As when a terminal
 * closes: the task's group is sent SIGHUP, then its terminal's master (the
 * kernel hangs the terminal up) or its stdin pipe is closed; if it
 * still runs TASK_HANGUP_MS later, its group gets SIGKILL. The session's
 * other processes (its daemons) are left alone, unlike KILL. */
static void task_hangup(struct task *t)
{
	if (t->exited || !(t->e->flags & (PROTO_EXEC_STDIN | PROTO_EXEC_TTY)) || t->hangup_deadline_ms)
		return;
	/* The signal first: a reader must not see EOF, finish and exit 0
	 * before it is told the client is gone (the kernel's own SIGHUP on a
	 * closed master comes after it wakes the terminal's readers). The
	 * child itself too: until its setsid() it has no group of its own. */
	kill(-t->pid, SIGHUP);
	kill(t->pid, SIGHUP);
	if ((t->e->flags & PROTO_EXEC_TTY) && t->out >= 0) {
		close(t->out);
		t->out = -1;
	}
	inq_close(&t->inq);
	t->hangup_deadline_ms = proto_now_ms() + TASK_HANGUP_MS;
}

/* Requests that arrive while the task runs: KILL, STDIN, RESIZE and HANGUP
 * are served, anything else is refused. */
static int task_channel(struct agent *a, struct task *t)
{
	struct proto_frame f;
	int r;

	r = agent_read(a);
	if (r < 0)
		return r;
	while ((r = agent_next_frame(a, &f)) > 0) {
		uint32_t rows, cols;

		if (f.type == PROTO_KILL) {
			/* After the exit it is moot: the host's timer crossed EXIT. */
			if (!t->exited) {
				t->exit.flags |= PROTO_EXIT_KILLED;
				task_kill(t);
			}
			continue;
		}
		if (f.type == PROTO_STDIN) {
			task_stdin(t, f.payload, f.len);
			continue;
		}
		if (f.type == PROTO_HANGUP) {
			task_hangup(t);
			continue;
		}
		if (f.type == PROTO_RESIZE) {
			if (proto_resize_decode(f.payload, f.len, &rows, &cols) == 0)
				task_resize(t, rows, cols);
			else if ((r = agent_send_error(a, -EPROTO, "malformed RESIZE request")) < 0)
				return r;
			continue;
		}
		r = agent_send_error(a, -EBUSY, "a task is running: request type 0x%02x refused", f.type);
		if (r < 0)
			return r;
	}
	return r;
}

static void task_close_done(struct task *t)
{
	if (t->done >= 0)
		close(t->done);
	t->done = -1;
}

/* The interpreter's last words (struct proto_zdone): 1 when they say the
 * task is over, with its status and usage now in t (`done` stays open: the
 * interpreter waits for it to close, task_ended). Anything else (EOF: it
 * died without a word; a line the task's own code wrote that does not
 * parse) closes `done` for good, and the task ends when it is reaped. */
static int task_read_done(struct task *t)
{
	char buf[PROTO_ZDONE_MAX + 1];
	struct proto_zdone d;
	ssize_t n = read(t->done, buf, sizeof(buf));

	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return 0;
	if (n <= 0 || proto_zdone_decode(buf, (size_t)n, &d) < 0) {
		task_close_done(t);
		return 0;
	}
	t->wstatus = (int)(d.status << 8); /* as wait() gives an exit(status) */
	memset(&t->ru, 0, sizeof(t->ru));
	t->ru.ru_utime.tv_sec = (time_t)(d.user_us / 1000000);
	t->ru.ru_utime.tv_usec = (suseconds_t)(d.user_us % 1000000);
	t->ru.ru_stime.tv_sec = (time_t)(d.sys_us / 1000000);
	t->ru.ru_stime.tv_usec = (suseconds_t)(d.sys_us % 1000000);
	t->ru.ru_maxrss = (long)d.maxrss_kib;
	return 1;
}

/* The main process is over: reaped, or (the interpreter) said so. */
static void task_ended(struct task *t)
{
	t->end_us = proto_now_us();
	t->exited = 1;
	/* What is left is read as it comes, EXIT right after it. */
	t->batch = 0;
	t->batch_deadline_ms = 0;
	/* Input after the end goes nowhere. */
	inq_close(&t->inq);
	/* Daemons and stray children of the task die with it, unless it is a
	 * session's command (they stay). An interpreter that said it is done
	 * waits to exit: this SIGKILL ends it. */
	if (!(t->e->flags & PROTO_EXEC_KEEP))
		task_kill_uid(t->e->uid);
	/* An interpreter that said it is done waits for this (or the SIGKILL
	 * above) before it exits: only now may it take the vCPU. */
	task_close_done(t);
	/* A session's background job that kept the pipes open would hold every
	 * command up: a short grace. */
	t->drain_deadline_ms = proto_now_ms() + ((t->e->flags & PROTO_EXEC_KEEP) ? TASK_KEEP_DRAIN_MS : TASK_DRAIN_MS);
}

static void task_close_pipes(struct task *t)
{
	task_close_done(t);
	inq_close(&t->inq);
	if (t->out >= 0)
		close(t->out);
	if (t->err >= 0)
		close(t->err);
	t->out = -1;
	t->err = -1;
}

static int task_loop(struct agent *a, struct task *t)
{
	int r;

	for (;;) {
		struct pollfd p[6] = {
			{ .fd = agent_sigfd(a), .events = POLLIN },
			{ .fd = agent_chan_pollfd(a), .events = POLLIN },
			{ .fd = t->batch_deadline_ms ? -1 : t->out, .events = POLLIN },
			{ .fd = t->batch_deadline_ms ? -1 : t->err, .events = POLLIN },
			{ .fd = t->inq.len ? t->inq.fd : -1, .events = POLLOUT },
			{ .fd = t->exited ? -1 : t->done, .events = POLLIN },
		};
		int timeout = -1;

		if (!t->exited && t->hangup_deadline_ms) {
			int64_t left = t->hangup_deadline_ms - proto_now_ms();

			if (left <= 0) {
				t->killed = 1;
				kill(-t->pid, SIGKILL);
				kill(t->pid, SIGKILL);
				t->hangup_deadline_ms = 0;
			} else {
				timeout = (int)left;
			}
		}
		if (t->exited) {
			int64_t left = t->drain_deadline_ms - proto_now_ms();

			if (t->out < 0 && t->err < 0)
				return 0;
			if (left <= 0) {
				init_log("task: output still open %d ms after the task ended; not waiting for it",
					 TASK_DRAIN_MS);
				task_close_pipes(t);
				return 0;
			}
			timeout = (int)left;
		}
		if (t->batch_deadline_ms) {
			int64_t left = t->batch_deadline_ms - proto_now_ms();

			if (left <= 0) {
				r = task_flush_out(a, t);
				if (r < 0)
					return r;
				continue;
			}
			if (timeout < 0 || left < timeout)
				timeout = (int)left;
		}
		r = agent_poll(a, p, 6, timeout);
		if (r < 0)
			return r;
		if (r && task_reap(t->exited ? 0 : t->pid, &t->wstatus, &t->ru) > 0)
			task_ended(t);
		if (p[5].revents && !t->exited && task_read_done(t) > 0)
			task_ended(t);
		if (t->batch && t->flowing && (p[2].revents || p[3].revents)) {
			r = task_flush_out(a, t);
			if (r < 0)
				return r;
		} else if (t->batch && (p[2].revents || p[3].revents)) {
			/* Let the pipes fill; the output is read in one go later. */
			if (!t->batch_deadline_ms)
				t->batch_deadline_ms = proto_now_ms() + TASK_BATCH_MS;
		} else {
			size_t n = 0;

			if (p[2].revents && (r = task_pump(a, t, &t->out, PROTO_STDOUT, &t->exit.stdout_bytes, &n)) < 0)
				return r;
			if (p[3].revents && (r = task_pump(a, t, &t->err, PROTO_STDERR, &t->exit.stderr_bytes, &n)) < 0)
				return r;
		}
		if (p[4].revents)
			inq_flush(&t->inq);
		if (p[1].revents) {
			r = task_channel(a, t);
			if (r < 0)
				return r;
		}
	}
}

static uint64_t task_tv_us(const struct timeval *tv)
{
	return (uint64_t)tv->tv_sec * 1000000u + (uint64_t)tv->tv_usec;
}

static int task_send_exit(struct agent *a, struct task *t)
{
	struct proto_exit *x = &t->exit;
	int64_t oom_after;
	ssize_t n;

	if (WIFSIGNALED(t->wstatus)) {
		x->how = PROTO_SIGNALED;
		x->status = (uint32_t)WTERMSIG(t->wstatus);
	} else {
		x->how = PROTO_EXITED;
		x->status = (uint32_t)WEXITSTATUS(t->wstatus);
	}
	x->run_us = (uint64_t)(t->end_us - t->start_us);
	x->user_us = task_tv_us(&t->ru.ru_utime);
	x->sys_us = task_tv_us(&t->ru.ru_stime);
	x->maxrss_kib = t->ru.ru_maxrss > 0 ? (uint64_t)t->ru.ru_maxrss : 0;
	/* SIGKILL we did not send plus a new OOM kill in the guest: the OOM
	 * killer took the task. Only this task runs, so the count is ours. */
	if (x->how == PROTO_SIGNALED && x->status == SIGKILL && !t->killed && t->oom_before >= 0) {
		oom_after = task_oom_kills();
		if (oom_after > t->oom_before)
			x->flags |= PROTO_EXIT_OOM;
		/* The next task (a pool VM's real one after its warm-up) compares
		 * against this. */
		if (oom_after >= 0)
			*agent_oom_baseline(a) = oom_after;
	}
	n = proto_exit_encode(agent_payload(a), PROTO_MAX_PAYLOAD, x);
	if (n < 0)
		return (int)n;
	return agent_send(a, PROTO_EXIT, agent_payload(a), (size_t)n);
}

/* The task's environment into envp (PROTO_MAX_ENV + 2 entries): its own,
 * plus the default PATH when it has none. Returns the PATH to search. */
static const char *task_env(const struct proto_exec *e, char **envp)
{
	const char *path = NULL;
	uint32_t i, n = 0;

	for (i = 0; i < e->envc; i++) {
		envp[n++] = e->env[i];
		if (!path && !strncmp(e->env[i], "PATH=", 5))
			path = e->env[i] + 5;
	}
	if (!path) {
		/* execve() does not modify its environment strings. */
		envp[n++] = (char *)task_default_path_env;
		path = TASK_DEFAULT_PATH;
	}
	envp[n] = NULL;
	return path;
}

/* From STARTED to EXIT: the task `t` has been forked. */
static int task_follow(struct agent *a, struct task *t)
{
	int r;

	/* A terminal or an interactive command is forwarded as it writes. */
	t->batch = !(t->e->flags & (PROTO_EXEC_TTY | PROTO_EXEC_STDIN));
	if (t->batch) {
		/* Room for TASK_BATCH_MS of a fast writer (best effort: the
		 * default 64 KiB only costs throughput). */
		if (t->out >= 0)
			(void)fcntl(t->out, F_SETPIPE_SZ, TASK_PIPE_SIZE);
		if (t->err >= 0)
			(void)fcntl(t->err, F_SETPIPE_SZ, TASK_PIPE_SIZE);
	}
	r = agent_send(a, PROTO_STARTED, NULL, 0);

	if (r == 0)
		r = task_loop(a, t);
	if (r < 0) {
		/* The channel is gone: leave nothing running behind. */
		task_kill(t);
		task_close_pipes(t);
		return r;
	}
	task_close_pipes(t);
	return task_send_exit(a, t);
}

/* PROTO_EXEC_TTY: the task on a new pseudo-terminal of e->rows x e->cols.
 * We keep the master (output and input); the child gets the other side
 * (from TIOCGPTPEER, so no path under /dev/pts is looked up) as its
 * controlling terminal. */
static int task_run_tty(struct agent *a, const struct proto_exec *e, struct task *t)
{
	char *envp[PROTO_MAX_ENV + 2];
	const char *path = NULL;
	struct winsize ws = { .ws_row = (unsigned short)e->rows, .ws_col = (unsigned short)e->cols };
	struct task_stdio io = { .in = -1, .out = -1, .err = -1, .tty = -1 };
	int master, unlock = 0, r;

	path = task_env(e, envp);
	t->oom_before = *agent_oom_baseline(a);

	master = open("/dev/pts/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
	if (master < 0)
		return agent_send_error(a, -errno, "EXEC: cannot open a terminal: %s", strerror(errno));
	if (ioctl(master, TIOCSPTLCK, &unlock) < 0 || ioctl(master, TIOCSWINSZ, &ws) < 0 ||
	    (io.tty = ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0 ||
	    (t->inq.fd = fcntl(master, F_DUPFD_CLOEXEC, 3)) < 0) {
		r = -errno;
		goto fail;
	}
	t->start_us = proto_now_us();
	t->pid = fork();
	if (t->pid < 0) {
		r = -errno;
		goto fail;
	}
	if (t->pid == 0)
		task_child(e, envp, path, &io);
	close(io.tty);
	t->out = master;
	return task_follow(a, t);

fail:
	if (io.tty >= 0)
		close(io.tty);
	inq_close(&t->inq);
	close(master);
	return agent_send_error(a, r, "EXEC: terminal: %s", strerror(-r));
}

int task_run(struct agent *a, const struct proto_exec *e)
{
	char *envp[PROTO_MAX_ENV + 2];
	const char *path = NULL;
	struct task t = { .e = e, .out = -1, .err = -1, .inq = { .fd = -1, .cap = TASK_STDIN_MAX }, .done = -1 };
	struct task_stdio io = { .in = -1, .tty = -1 };
	int out[2], err[2], in[2] = { -1, -1 };
	int r;

	if (e->flags & PROTO_EXEC_TTY)
		return task_run_tty(a, e, &t);

	/* PROTO_EXEC_ZYGOTE without a pre-started interpreter (or one that
	 * cannot honour this environment): argv is an ordinary command line
	 * (python3 SCRIPT ...), so exec it (proto.h). */

	path = task_env(e, envp);

	/* The guest's OOM-kill count before the task. Read once when the agent
	 * started (in a snapshot's template, so a clone does not pay for the
	 * /proc/vmstat read on its start-up path) and after any SIGKILLed task:
	 * nothing but the task runs in between. */
	t.oom_before = *agent_oom_baseline(a);
	if ((e->flags & PROTO_EXEC_ZYGOTE) && zygote_can_run(agent_zygote(a), e)) {
		t.start_us = proto_now_us();
		if (zygote_hand_off(agent_zygote(a), e, envp, &t.pid, &t.out, &t.err, &t.done) == 0)
			goto started;
		/* The interpreter is gone: run the command line instead. */
	}

	if (pipe2(out, O_CLOEXEC) < 0)
		return agent_send_error(a, -errno, "EXEC: pipe: %s", strerror(errno));
	if (pipe2(err, O_CLOEXEC) < 0) {
		r = -errno;
		goto fail_out;
	}
	if ((e->flags & PROTO_EXEC_STDIN) && pipe2(in, O_CLOEXEC) < 0) {
		r = -errno;
		goto fail_err;
	}
	/* Only our ends: the task gets ordinary blocking pipes. */
	if (fcntl(out[0], F_SETFL, O_NONBLOCK) < 0 || fcntl(err[0], F_SETFL, O_NONBLOCK) < 0 ||
	    (in[1] >= 0 && fcntl(in[1], F_SETFL, O_NONBLOCK) < 0)) {
		r = -errno;
		goto fail_in;
	}

	io.in = in[0];
	io.out = out[1];
	io.err = err[1];
	t.start_us = proto_now_us();
	t.pid = fork();
	if (t.pid < 0) {
		r = -errno;
		goto fail_in;
	}
	if (t.pid == 0)
		task_child(e, envp, path, &io);
	close(out[1]);
	close(err[1]);
	if (in[0] >= 0)
		close(in[0]);
	t.out = out[0];
	t.err = err[0];
	t.inq.fd = in[1];

started:
	return task_follow(a, &t);

fail_in:
	if (in[0] >= 0) {
		close(in[0]);
		close(in[1]);
	}
fail_err:
	close(err[0]);
	close(err[1]);
fail_out:
	close(out[0]);
	close(out[1]);
	return agent_send_error(a, r, "EXEC: %s", strerror(-r));
}
