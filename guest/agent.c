/* agent: the guest side of the host-guest protocol: frame dispatch, SETUP,
 * the FILE state machine; EXEC and COLLECT are handed to task.c and
 * collect.c. The channel itself (receive buffer, sending, the host's
 * comings and goings) is agent_chan.c, which task.c and collect.c call too:
 * they and this file sit above it, none below another. Driven only through
 * fds, so a socketpair can stand in for the virtio-serial port. */
#include "agent_int.h"


#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/random.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "collect.h"
#include "io.h"
#include "init.h"
#include "task.h"
#include "zygote.h"

struct agent *agent_create(int chan, const struct agent_config *cfg)
{
	struct agent *a;
	int err;

	a = calloc(1, sizeof(*a));
	if (!a)
		return NULL;
	a->chan = chan;
	a->zygote.ctl = a->zygote.out = a->zygote.err = a->zygote.ready = -1;
	a->oom_baseline = task_oom_kills();
	a->connected = 1;
	a->cfg = *cfg;
	a->file.fd = -1;
	a->file.dirfd = -1;
	sigemptyset(&a->sigio);
	sigaddset(&a->sigio, SIGIO);

	a->sigfd = init_channel_signals(chan);
	if (a->sigfd < 0)
		goto fail;
	return a;

fail:
	err = errno;
	free(a);
	errno = err;
	return NULL;
}

int agent_hello(struct agent *a)
{
	struct proto_hello h = { .version = PROTO_VERSION, .features = 0 };
	struct utsname u;
	ssize_t n;

	if (uname(&u) == 0)
		snprintf(h.release, sizeof(h.release), "%s", u.release);
	n = proto_hello_encode(agent_payload(a), PROTO_MAX_PAYLOAD, &h);
	if (n < 0)
		return (int)n;
	return agent_send(a, PROTO_HELLO, agent_payload(a), (size_t)n);
}

/* ---- FILE --------------------------------------------------------------- */

static int path_under(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	return !strncmp(path, dir, n) && (path[n] == '\0' || path[n] == '/');
}

/* Opens one parent directory below dfd, creating it (0755, owned by the task
 * user) when missing. Symlinks are followed only when root owns them (the
 * image's /bin -> usr/bin and friends): one planted by an earlier task must
 * not redirect a root-written file. */
static int file_enter(struct agent *a, int dfd, const char *name, const char **what)
{
	const int dflags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
	struct stat st;
	int fd;

	fd = openat(dfd, name, dflags | O_NOFOLLOW);
	if (fd >= 0)
		return fd;
	if (errno == ENOENT) {
		*what = "creating a parent directory";
		if (mkdirat(dfd, name, 0755) < 0)
			return -errno;
		if (fchownat(dfd, name, a->cfg.file_uid, a->cfg.file_gid, AT_SYMLINK_NOFOLLOW) < 0)
			return -errno;
		fd = openat(dfd, name, dflags | O_NOFOLLOW);
		return fd >= 0 ? fd : -errno;
	}
	if (errno != ELOOP && errno != ENOTDIR) {
		*what = "opening a parent directory";
		return -errno;
	}
	*what = "a parent is not a directory";
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (!S_ISLNK(st.st_mode))
		return -ENOTDIR;
	if (st.st_uid != 0) {
		*what = "a parent is a symlink not owned by root";
		return -ELOOP;
	}
	fd = openat(dfd, name, dflags);
	return fd >= 0 ? fd : -errno;
}

/* Opens path for writing as a fresh, empty regular file owned by the task
 * user, leaving fd, dirfd and name in f. On failure returns a negative errno
 * and what names the step. A file may be created anywhere (the spec's
 * files, `kiln run --file X:/opt/x`), but an existing file is replaced only
 * when it already belongs to the task user: a FILE must never hand it a
 * file of root's (/etc/shadow), truncated and chowned. */
static int file_open(struct agent *a, struct agent_file *f, uint32_t mode, const char **what)
{
	char buf[PROTO_MAX_PATH + 1];
	char *comp, *slash;
	struct stat st;
	int dfd, fd, created;

	/* proto_abspath_ok() held: absolute, no empty, "." or ".." component. */
	*what = "path";
	if (!f->path[1])
		return -EISDIR;
	memcpy(buf, f->path, sizeof(buf));
	dfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	comp = buf + 1;
	while ((slash = strchr(comp, '/'))) {
		*slash = '\0';
		fd = file_enter(a, dfd, comp, what);
		close(dfd);
		if (fd < 0)
			return fd;
		dfd = fd;
		comp = slash + 1;
	}

	/* proto_abspath_ok() bounds components to NAME_MAX already. */
	*what = "file name";
	if (strlen(comp) > NAME_MAX) {
		errno = ENAMETOOLONG;
		goto fail_errno;
	}
	memcpy(f->name, comp, strlen(comp) + 1);

	/* No O_TRUNC yet: the checks below come first, or a hard link to a
	 * root file would already be truncated. O_NONBLOCK: a FIFO must not
	 * hang PID 1. */
	*what = "open";
	created = 1;
	fd = openat(dfd, comp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0600);
	if (fd < 0 && errno == EEXIST) {
		created = 0;
		fd = openat(dfd, comp, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	}
	if (fd < 0)
		goto fail_errno;
	*what = "fstat";
	if (fstat(fd, &st) < 0)
		goto fail_errno_fd;
	*what = "not a regular file";
	if (!S_ISREG(st.st_mode)) {
		errno = EINVAL;
		goto fail_errno_fd;
	}
	/* Writable by the task user (a 0666 file of root's) is not enough:
	 * truncating and chowning it would take it from its owner. */
	*what = "it belongs to another user";
	if (!created && st.st_uid != a->cfg.file_uid) {
		errno = EPERM;
		goto fail_errno_fd;
	}
	*what = "it has other hard links";
	if (st.st_nlink > 1) {
		errno = EMLINK;
		goto fail_errno_fd;
	}
	*what = "truncate";
	if (ftruncate(fd, 0) < 0)
		goto fail_errno_fd;
	/* chown before chmod: chown clears set-id bits the mode may ask for. */
	*what = "chown";
	if (fchown(fd, a->cfg.file_uid, a->cfg.file_gid) < 0)
		goto fail_errno_fd;
	*what = "chmod";
	if (fchmod(fd, mode) < 0)
		goto fail_errno_fd;
	f->fd = fd;
	f->dirfd = dfd;
	return 0;

fail_errno_fd:
	{
		int err = errno;

		close(fd);
		errno = err;
	}
fail_errno:
	{
		int err = errno;

		close(dfd);
		return -err;
	}
}

static int file_finish(struct agent *a)
{
	struct agent_file *f = &a->file;
	int r = close(f->fd) < 0 ? -errno : 0;

	f->fd = -1;
	if (r < 0) {
		/* Already closed: agent_file_drop() only unlinks what it still holds. */
		unlinkat(f->dirfd, f->name, 0);
		agent_file_reset(f);
		return agent_send_error(a, r, "FILE %s: close: %s", f->path, strerror(-r));
	}
	agent_file_reset(f);
	return agent_send_ok(a, PROTO_FILE);
}

static int file_begin(struct agent *a, const struct proto_frame *fr)
{
	struct agent_file *f = &a->file;
	struct proto_file m;
	const char *what = "";
	int r;

	if (proto_file_decode(fr->payload, fr->len, &m) < 0)
		return agent_send_error(a, -EPROTO, "malformed FILE request");
	memcpy(f->path, m.path, sizeof(f->path));
	f->active = 1;
	f->left = m.size;
	f->fd = -1;
	if (path_under(m.path, "/proc") || path_under(m.path, "/sys") || path_under(m.path, "/dev")) {
		r = agent_send_error(a, -EPERM, "FILE %s: refusing to write under /proc, /sys or /dev", m.path);
		goto skip;
	}
	r = file_open(a, f, m.mode, &what);
	if (r < 0) {
		r = agent_send_error(a, r, "FILE %s: %s: %s", m.path, what, strerror(-r));
		goto skip;
	}
	if (f->left == 0)
		return file_finish(a);
	return 0;

skip:
	/* The host has already sent the data: swallow it quietly. */
	if (f->left == 0)
		agent_file_reset(f);
	return r;
}

static int file_data(struct agent *a, const struct proto_frame *fr)
{
	struct agent_file *f = &a->file;
	const uint8_t *p = fr->payload;
	size_t n = fr->len;
	int r;

	if (!f->active)
		return agent_send_error(a, -EPROTO, "FILE_DATA without a FILE");
	if (n > f->left) {
		int reported = f->fd < 0;

		agent_file_drop(f);
		agent_file_reset(f);
		if (reported)
			return 0;
		return agent_send_error(a, -EPROTO, "FILE %s: more data than announced", f->path);
	}
	f->left -= n;
	if (f->fd >= 0 && (r = io_write_all(f->fd, p, n)) < 0) {
		agent_file_drop(f);
		if (f->left == 0)
			agent_file_reset(f);
		return agent_send_error(a, r, "FILE %s: write: %s", f->path, strerror(-r));
	}
	if (f->left > 0)
		return 0;
	if (f->fd < 0) {
		agent_file_reset(f); /* a failure was already reported */
		return 0;
	}
	return file_finish(a);
}

/* A frame other than FILE_DATA arrived before the file was complete. */
static int file_interrupted(struct agent *a, uint8_t type)
{
	struct agent_file *f = &a->file;
	int reported = f->fd < 0;
	unsigned long long left = f->left;

	agent_file_drop(f);
	agent_file_reset(f);
	if (reported)
		return 0;
	return agent_send_error(a, -EPROTO, "FILE %s: %llu bytes missing (got a frame of type 0x%02x)",
				f->path, left, type);
}

/* ---- SETUP -------------------------------------------------------------- */

static int agent_add_entropy(const uint8_t *bytes, size_t len)
{
	union {
		struct rand_pool_info info;
		uint8_t raw[sizeof(struct rand_pool_info) + PROTO_MAX_ENTROPY];
	} u;
	int fd, r = 0;

	if (len > PROTO_MAX_ENTROPY)
		return -EINVAL;
	/* The host's bytes come from its own CSPRNG: credit them in full, so
	 * that a clone restored from a snapshot stops sharing its parent's
	 * random state right now. */
	u.info.entropy_count = (int)(len * 8);
	u.info.buf_size = (int)len;
	memcpy(u.raw + offsetof(struct rand_pool_info, buf), bytes, len);
	fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ioctl(fd, RNDADDENTROPY, &u.info) < 0) {
		r = -errno;
		goto out;
	}
	/* ENODATA: the CRNG is not initialised yet; it will seed itself from
	 * the pool (which now holds these bytes) once enough is credited. */
	if (ioctl(fd, RNDRESEEDCRNG) < 0 && errno != ENODATA)
		r = -errno;
out:
	close(fd);
	return r;
}

static int agent_setup(struct agent *a, const struct proto_frame *fr)
{
	struct proto_setup s;
	struct timespec ts;
	int r;

	if (proto_setup_decode(fr->payload, fr->len, &s) < 0)
		return agent_send_error(a, -EPROTO, "malformed SETUP request");
	if (s.sec > (uint64_t)INT64_MAX)
		return agent_send_error(a, -EINVAL, "SETUP: time out of range");
	ts.tv_sec = (time_t)s.sec;
	ts.tv_nsec = (long)s.nsec;
	if (clock_settime(CLOCK_REALTIME, &ts) < 0)
		return agent_send_error(a, -errno, "SETUP: clock_settime: %s", strerror(errno));
	if (s.entropy_len > 0) {
		r = agent_add_entropy(s.entropy, s.entropy_len);
		if (r < 0)
			return agent_send_error(a, r, "SETUP: adding entropy: %s", strerror(-r));
		/* The kernel's state is this clone's own now: the interpreter's
		 * contexts take theirs from it before their next cell. */
		interp_reseed(&a->cfg.interp);
	}
	return agent_send_ok(a, PROTO_SETUP);
}

static int agent_exec(struct agent *a, const struct proto_frame *fr)
{
	int refused = a->refused, r;

	/* Whatever this EXEC comes to, the next one counts from here. */
	if (proto_exec_decode(fr->payload, fr->len, &a->exec) < 0)
		r = agent_send_error(a, -EPROTO, "malformed EXEC request");
	else if ((a->exec.flags & PROTO_EXEC_IF_OK) && refused)
		r = agent_send_error(a, -ECANCELED, "EXEC: not run, an earlier request was refused");
	else {
		a->refused = 0;
		return task_run(a, &a->exec);
	}
	a->refused = 0;
	return r;
}

static int agent_collect(struct agent *a, const struct proto_frame *fr)
{
	struct proto_reader r;
	uint64_t budget;

	proto_reader_init(&r, fr->payload, fr->len);
	budget = proto_get_u64(&r);
	if (proto_reader_end(&r) < 0)
		return agent_send_error(a, -EPROTO, "malformed COLLECT request");
	return collect_run(a, a->cfg.output_dir, budget);
}

/* PREPARE: pre-start the interpreter a snapshot will carry, and wait for
 * the template's code interpreter service (started at boot) to be warm.
 * Idempotent. */
static int agent_prepare(struct agent *a, const struct proto_frame *fr)
{
	int64_t deadline = proto_now_ms() + 110000;
	int r;

	if (fr->len)
		return agent_send_error(a, -EPROTO, "malformed PREPARE request");
	if (a->zygote.pid <= 0) {
		r = zygote_start(&a->zygote, deadline);
		if (r < 0)
			return agent_send_error(a, r, "PREPARE: cannot pre-start python3: %s", strerror(-r));
	}
	r = interp_wait_ready(&a->cfg.interp, deadline);
	if (r < 0)
		return agent_send_error(a, r, "PREPARE: the code interpreter did not start: %s (%s)", strerror(-r),
					"/var/log/kiln-interpreter.log in the guest");
	return agent_send_ok(a, PROTO_PREPARE);
}

/* WARM: a pool VM's warm-up, after the host ran a throw-away FILE, EXEC
 * and COLLECT: the interpreter runs a sample in a fork. */
static int agent_warm(struct agent *a, const struct proto_frame *fr)
{
	int r;

	if (fr->len)
		return agent_send_error(a, -EPROTO, "malformed WARM request");
	if (a->zygote.pid > 0) {
		r = zygote_warm(&a->zygote, proto_now_ms() + 60000);
		if (r < 0) {
			zygote_stop(&a->zygote);
			return agent_send_error(a, r, "WARM: the interpreter failed: %s", strerror(-r));
		}
	}
	return agent_send_ok(a, PROTO_WARM);
}

/* One process of /proc/<pid>/stat: its state, parent and flags. The
 * command name is in parentheses and may hold anything, ')' included: the
 * fields that follow start after the last ')'. 0, or -1 when it is gone or
 * does not parse. */
static int proc_stat(const char *pid, char *state, long *ppid, unsigned long *flags)
{
	char path[64], buf[512], *p;

	snprintf(path, sizeof(path), "/proc/%s/stat", pid);
	if (io_read_small(path, buf, sizeof(buf)) < 0)
		return -1;
	p = strrchr(buf, ')');
	/* state ppid pgrp session tty_nr tpgid flags */
	if (!p || sscanf(p + 1, " %c %ld %*d %*d %*d %*d %lu", state, ppid, flags) != 3)
		return -1;
	return 0;
}

#define PF_KTHREAD_FLAG 0x00200000ul

/* PROCS_QUERY: may the host stop this VM's vCPUs? Only when nothing runs
 * that someone expects to keep running: count every process but kernel
 * threads, zombies (they run no code), PID 1, envd's supervisor and envd
 * itself (its children, the supervisor's), and the pre-started
 * interpreter. Everything else (a command's background child, a server
 * started through envd, a daemon that re-parented itself to PID 1) is
 * counted, whoever it runs as. The host asks only while no request of its
 * own is in flight, so kiln-init's short-lived helpers do not exist. */
static int agent_procs(struct agent *a, const struct proto_frame *fr)
{
	uint8_t buf[16];
	uint32_t count = 0, first = 0;
	struct dirent *de;
	ssize_t n;
	DIR *d;

	if (fr->len)
		return agent_send_error(a, -EPROTO, "malformed PROCS_QUERY request");
	d = opendir("/proc");
	if (!d)
		return agent_send_error(a, -errno, "PROCS_QUERY: /proc: %s", strerror(errno));
	while ((de = readdir(d))) {
		char *end, state;
		long pid = strtol(de->d_name, &end, 10), ppid;
		unsigned long flags;

		if (de->d_name[0] < '1' || de->d_name[0] > '9' || *end || pid <= 1)
			continue;
		if (proc_stat(de->d_name, &state, &ppid, &flags) < 0)
			continue; /* gone meanwhile */
		if ((flags & PF_KTHREAD_FLAG) || pid == 2 || ppid == 2 || state == 'Z' || state == 'X')
			continue;
		if (a->cfg.envd_sup > 0 && (pid == a->cfg.envd_sup || ppid == a->cfg.envd_sup))
			continue;
		if (a->zygote.pid > 0 && pid == a->zygote.pid)
			continue;
		if (interp_owns(&a->cfg.interp, pid, ppid))
			continue;
		if (!count++)
			first = (uint32_t)pid;
	}
	closedir(d);
	n = proto_procs_encode(buf, sizeof(buf), count, first);
	if (n < 0)
		return agent_send_error(a, (int)n, "PROCS_QUERY: encoding failed");
	return agent_send(a, PROTO_PROCS, buf, (size_t)n);
}

static int agent_dispatch(struct agent *a, const struct proto_frame *f)
{
	int r;

	if (a->file.active && f->type != PROTO_FILE_DATA) {
		r = file_interrupted(a, f->type);
		if (r < 0)
			return r;
	}
	switch (f->type) {
	case PROTO_SETUP:
		return agent_setup(a, f);
	case PROTO_FILE:
		return file_begin(a, f);
	case PROTO_FILE_DATA:
		return file_data(a, f);
	case PROTO_EXEC:
		return agent_exec(a, f);
	case PROTO_KILL:
	case PROTO_STDIN:
	case PROTO_RESIZE:
	case PROTO_HANGUP:
		/* No task is running: these crossed the task's EXIT on the wire. */
		return 0;
	case PROTO_COLLECT:
		return agent_collect(a, f);
	case PROTO_PREPARE:
		return agent_prepare(a, f);
	case PROTO_WARM:
		return agent_warm(a, f);
	case PROTO_PROCS_QUERY:
		return agent_procs(a, f);
	default:
		return agent_send_error(a, -EINVAL, "unknown request type 0x%02x", f->type);
	}
}

int agent_serve(struct agent *a)
{
	struct proto_frame f;
	int r;

	for (;;) {
		struct pollfd p[2] = {
			{ .fd = a->sigfd, .events = POLLIN },
			{ .fd = agent_chan_pollfd(a), .events = POLLIN },
		};

		r = agent_poll(a, p, 2, -1);
		if (r < 0)
			return r;
		if (r)
			task_reap(0, NULL, NULL);
		if (p[1].revents) {
			r = agent_read(a);
			if (r < 0)
				return r;
		}
		while ((r = agent_next_frame(a, &f)) > 0) {
			r = agent_dispatch(a, &f);
			if (r < 0)
				return r;
		}
		if (r < 0)
			return r;
	}
}

void agent_destroy(struct agent *a)
{
	if (!a)
		return;
	agent_file_drop(&a->file);
	agent_file_reset(&a->file);
	close(a->sigfd);
	close(a->chan);
	free(a);
}
