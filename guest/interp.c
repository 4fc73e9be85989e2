/* interp: start and supervise the template's code interpreter service
 * (interp.h). Its program is guest code shipped in the image; kiln-init only
 * starts it, waits for its ready byte and passes on restores. */
#include "interp.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "init.h"
#include "io.h"
#include "proto.h"

#define INTERP_RESTART_S     1
#define INTERP_RESTART_MAX_S 30
#define INTERP_STABLE_MS     60000
#define INTERP_LOG           "/var/log/kiln-interpreter.log"

/* The program INTERP_CONF names: an absolute path to a regular file, read
 * bounded. The image's builder wrote it, but a broken line must not start
 * something odd: anything else is no interpreter. */
static int interp_program(char *out, size_t cap)
{
	char buf[256];
	struct stat st;
	char *nl;

	if (io_read_small(INTERP_CONF, buf, sizeof(buf)) < 0)
		return -ENOENT;
	nl = strchr(buf, '\n');
	if (nl)
		*nl = 0;
	if (buf[0] != '/' || strlen(buf) >= cap || stat(buf, &st) < 0 || !S_ISREG(st.st_mode))
		return -EINVAL;
	snprintf(out, cap, "%s", buf);
	return 0;
}

/* One instance: python3 PROGRAM, stdin the reseed pipe, fd 3 the ready
 * pipe, stdout/stderr the log. It drops to E2B's user by itself. */
static void __attribute__((noreturn)) interp_exec(const char *prog, int reseed, int ready)
{
	static char *const env[] = { "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				     "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1", "MPLBACKEND=Agg",
				     /* A fixed threshold: glibc's moving one would keep a
				      * relayed 20 MiB result's memory in the heap. */
				     "MALLOC_MMAP_THRESHOLD_=131072", NULL };
	int log = open(INTERP_LOG, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);

	/* PID 1 may have had no 0, 1 or 2 open when it made the pipes: move
	 * every descriptor above 3 before placing them, so that no dup2
	 * overwrites another one's source. */
	if (log < 0)
		log = open("/dev/null", O_WRONLY | O_CLOEXEC);
	reseed = fcntl(reseed, F_DUPFD_CLOEXEC, 10);
	ready = fcntl(ready, F_DUPFD_CLOEXEC, 10);
	log = fcntl(log, F_DUPFD_CLOEXEC, 10);
	if (reseed < 0 || ready < 0 || log < 0 || dup2(reseed, 0) < 0 || dup2(ready, 3) < 0 || dup2(log, 1) < 0 ||
	    dup2(log, 2) < 0)
		_exit(127);
	/* kiln-init's -1000 must not reach the interpreter: a cell that eats
	 * the guest's memory would leave the OOM killer nothing to kill but
	 * the kernel itself (a panic: the sandbox gone). The service gets 0;
	 * it raises its contexts' processes to INTERP_OOM_CONTEXT, so they go
	 * first (the context restarts, the sandbox lives). kiln-init's priority
	 * is not the cells' either. RLIMIT_RTPRIO 1: the service's threads run
	 * round-robin (interpreter.py's _realtime), its contexts drop it. */
	if (init_write_file("/proc/self/oom_score_adj", "0") < 0 || setpriority(PRIO_PROCESS, 0, 0) < 0 ||
	    setrlimit(RLIMIT_RTPRIO, &(struct rlimit){ 1, 1 }) < 0)
		_exit(127);
	execve("/usr/bin/python3", (char *const[]){ "python3", "-u", (char *)prog, NULL }, env);
	_exit(127);
}

int interp_spawn(struct interp *i)
{
	int rp[2], sp[2], delay = INTERP_RESTART_S;
	char prog[256];
	pid_t sup;

	i->sup = 0;
	i->ready = i->reseed = -1;
	i->is_ready = 0;
	if (interp_program(prog, sizeof(prog)) < 0)
		return 0;
	if (pipe2(rp, O_CLOEXEC) < 0)
		return -errno;
	if (pipe2(sp, O_CLOEXEC) < 0) {
		close(rp[0]);
		close(rp[1]);
		return -errno;
	}
	sup = fork();
	if (sup < 0) {
		int r = -errno;

		close(rp[0]);
		close(rp[1]);
		close(sp[0]);
		close(sp[1]);
		return r;
	}
	if (sup > 0) {
		close(rp[1]);
		close(sp[0]);
		fcntl(sp[1], F_SETFL, O_NONBLOCK);
		i->sup = sup;
		i->ready = rp[0];
		i->reseed = sp[1];
		return 0;
	}
	prctl(PR_SET_NAME, "kiln-interp-sup");
	close(rp[0]);
	close(sp[1]);
	for (;;) {
		int64_t began = proto_now_ms();
		struct timespec ts;
		pid_t pid = fork();
		int st;

		if (pid == 0)
			interp_exec(prog, sp[0], rp[1]);
		if (pid < 0) {
			init_log("interpreter: fork: %s", strerror(errno));
		} else {
			while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
				;
			/* Its fork server and contexts outlive it: end them too. */
			kill(-pid, SIGKILL);
			if (WIFSIGNALED(st))
				init_log("interpreter: killed by signal %d; starting it again", WTERMSIG(st));
			else
				init_log("interpreter: exited with status %d; starting it again (%s)", WEXITSTATUS(st),
					 INTERP_LOG);
		}
		if (pid > 0 && proto_now_ms() - began > INTERP_STABLE_MS)
			delay = INTERP_RESTART_S;
		ts.tv_sec = delay;
		ts.tv_nsec = 0;
		nanosleep(&ts, NULL);
		if (delay < INTERP_RESTART_MAX_S)
			delay *= 2;
	}
}

int interp_wait_ready(struct interp *i, int64_t deadline_ms)
{
	if (i->sup <= 0 || i->is_ready)
		return 0;
	for (;;) {
		struct pollfd p = { .fd = i->ready, .events = POLLIN };
		int64_t left = deadline_ms - proto_now_ms();
		char c;
		ssize_t n;

		if (left <= 0)
			return -ETIMEDOUT;
		if (poll(&p, 1, left > 60000 ? 60000 : (int)left) < 0 && errno != EINTR)
			return -errno;
		if (!p.revents)
			continue;
		n = read(i->ready, &c, 1);
		if (n == 1) {
			i->is_ready = 1;
			return 0;
		}
		if (n < 0 && errno == EINTR)
			continue;
		return n == 0 ? -EPIPE : -errno;
	}
}

void interp_reseed(struct interp *i)
{
	if (i->sup > 0 && i->reseed >= 0 && write(i->reseed, "S", 1) < 0 && errno != EAGAIN)
		init_log("interpreter: reseed: %s", strerror(errno));
}

/* The parent of a process, or -1. */
static long interp_parent(long pid)
{
	char path[64], buf[512], *p;
	long ppid;

	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	if (io_read_small(path, buf, sizeof(buf)) < 0)
		return -1;
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %*c %ld", &ppid) != 1)
		return -1;
	return ppid;
}

int interp_owns(const struct interp *i, long pid, long ppid)
{
	long p = ppid;

	if (i->sup <= 0)
		return 0;
	if (pid == i->sup || ppid == i->sup)
		return 1;
	/* supervisor -> service -> fork server -> a context's interpreter. */
	for (int depth = 0; depth < 2 && p > 1; depth++) {
		p = interp_parent(p);
		if (p == i->sup)
			return 1;
	}
	return 0;
}
