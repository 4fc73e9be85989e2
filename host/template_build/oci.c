/* oci: template_build_oci, an uploaded image archive (docker-archive or OCI image
 * layout tar) made into a template root file system.
 *
 * The archive is the customer's and so are the tools' inputs: GNU tar (an
 * OCI layout tar into a directory), skopeo (the image into an OCI layout,
 * digests verified, local transports only: never a registry) and umoci (the
 * layers unpacked in order, whiteouts honoured, every path joined under the
 * root with securejoin) each run in a kiln jail (jail/): their own
 * mount, PID, network (no interface: no network at all), IPC and UTS
 * namespaces, a tmpfs root holding only their programs and libraries, one
 * writable directory (<work_dir>/w, nosuid/nodev/noexec), a slot uid with no
 * capabilities, no_new_privs, seccomp, and cgroup memory/CPU/pids limits;
 * this thread watches time, cancellation and the bytes written. umoci runs
 * --rootless (as the slot uid, it cannot chown): it records each entry's
 * owner in an xattr, which the walk over the finished tree (oci_tree.c, as
 * root, never following a link) applies while it removes device nodes and
 * set-uid bits. Then mkfs.ext4 -d makes the image from the tree. */
#include "template_build.h"
#include "oci_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/openat2.h>

#include "clock.h"
#include "fsutil.h"
#include "io.h"
#include "jail.h"

#define OCI_UMOCI            "/usr/bin/umoci"
#define OCI_SKOPEO           "/usr/bin/skopeo"
#define OCI_TAR              "/bin/tar"
#define OCI_MKFS             "/sbin/mkfs.ext4"
#define OCI_JAIL_MEMORY      (1024ull << 20) /* Go tools streaming layers */
#define OCI_JAIL_PIDS        512             /* Go runtime threads count as tasks */
#define OCI_JAIL_NOFILE      4096
#define OCI_FREE_BYTES       (256ull << 20)  /* room the image leaves for what tasks write to / */
#define OCI_WATCH_MS         500
#define OCI_LOG_LINES        40              /* of a tool's output forwarded to the build log */

extern char **environ;

struct oci_run {
	const struct template_build_oci_req *req;
	template_build_log_fn log;
	void *ctx;
	struct kiln_err *err;
	int64_t deadline;
	uint64_t archive_size;
	char work[PATH_MAX - 64];  /* req->work_dir, absolute */
	char w[PATH_MAX];          /* the jail's writable directory */
	char jroot[PATH_MAX];      /* the jail's (empty) root mount point */
	char rundir[PATH_MAX];     /* <run_dir>/vm-oci-<pid>-<n>: lock + jail record ("": none) */
	char record[PATH_MAX + 8];
	int lock_fd;
	struct jail_config jc;
	int jc_ready;
};

static void oci_logf(void *ctx, const char *fmt, ...)
{
	struct oci_run *r = ctx;
	char line[2048];
	va_list ap;

	if (!r->log)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	r->log(r->ctx, line);
}

/* Cancelled (cancel_fd readable) or past the deadline: err set, -1. */
static int oci_check_time(struct oci_run *r)
{
	struct pollfd pfd = { .fd = r->req->cancel_fd, .events = POLLIN };

	if (r->req->cancel_fd >= 0 && poll(&pfd, 1, 0) > 0)
		return kiln_err_set(r->err, KERR_CANCELLED, "the import was cancelled");
	if (clock_mono_ms() >= r->deadline)
		return kiln_err_set(r->err, KERR_BUILD_TIMEOUT, "the import took longer than %u s", r->req->timeout_s);
	return 0;
}

/* Forward a tool's output (the tail of the file) to the build log; the
 * last non-empty line into last (for the error message). */
static void forward_output(struct oci_run *r, int fd, char *last, size_t cap)
{
	char buf[16384], *p, *nl;
	off_t size = lseek(fd, 0, SEEK_END), from = size > (off_t)sizeof(buf) - 1 ? size - (off_t)sizeof(buf) + 1 : 0;
	ssize_t n = size > 0 ? pread(fd, buf, sizeof(buf) - 1, from) : 0;
	int lines = 0;

	if (last && cap)
		last[0] = '\0';
	if (n <= 0)
		return;
	buf[n] = '\0';
	for (p = buf; *p; p = nl ? nl + 1 : p + strlen(p)) {
		nl = strchr(p, '\n');
		if (nl)
			*nl = '\0';
		/* Printable ASCII only: umoci decorates with colours and bullets. */
		for (char *c = p; *c; c++)
			if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
				*c = ' ';
		while (*p == ' ')
			p++;
		if (!*p)
			continue;
		if (lines++ < OCI_LOG_LINES)
			oci_logf(r, "  %s", p);
		if (last)
			snprintf(last, cap, "%s", p);
	}
}

/* Run argv in a jail and wait for it, watching the deadline, cancel_fd and
 * the bytes under w. work is the jail's one writable directory (chowned to
 * its uid), ro a file it may read (NULL: none). 0 when it exited 0; -1 with
 * err otherwise. */
static int jail_run(struct oci_run *r, char *const argv[], const char *what, const char *work, const char *ro)
{
	static atomic_uint seq;
	char name[64], home[PATH_MAX + 8], tmp[PATH_MAX + 8], logpath[PATH_MAX + 16], last[512];
	char env_home[PATH_MAX + 16], env_tmp[PATH_MAX + 16];
	char *envp[] = { "PATH=/usr/bin:/bin", env_home, env_tmp, "LANG=C", NULL };
	struct jail_spec spec = { 0 };
	struct jail j = { 0 };
	uint64_t limit = r->req->max_bytes + 3 * r->archive_size;
	int pidfd = -1, logfd, wfd = -1, status = 0, rc = -1;
	int64_t next_watch = 0, t0;
	int exited = 0, stopped = 0; /* stopped: err set while it ran */
	pid_t pid;

	snprintf(name, sizeof(name), "kiln-oci-%d-%u", (int)getpid(), atomic_fetch_add(&seq, 1));
	snprintf(home, sizeof(home), "%s/home", r->w);
	snprintf(tmp, sizeof(tmp), "%s/tmp", r->w);
	snprintf(env_home, sizeof(env_home), "HOME=%s", home);
	snprintf(env_tmp, sizeof(env_tmp), "TMPDIR=%s", tmp);
	snprintf(logpath, sizeof(logpath), "%s/step.log", r->work);
	logfd = open(logpath, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (logfd < 0)
		return kiln_err_set(r->err, KERR_HOST_ERROR, "%s: %s", logpath, strerror(errno));
	spec.name = name;
	spec.root = r->jroot;
	spec.record = r->record[0] ? r->record : NULL;
	spec.work = work;
	spec.ro[0] = ro;
	spec.exe = argv[0];
	spec.proc = 1;
	spec.stdout_fd = logfd;
	spec.stderr_fd = logfd;
	spec.memory_bytes = OCI_JAIL_MEMORY;
	spec.cpus = 2;
	spec.pids = OCI_JAIL_PIDS;
	spec.nofile = OCI_JAIL_NOFILE;
	spec.fsize_bytes = limit;
	spec.envp = envp;
	oci_logf(r, "%s", what);
	t0 = clock_mono_ms();
	pid = jail_spawn(&r->jc, &spec, argv, &j, &pidfd, r->err);
	if (pid < 0)
		goto out;
	wfd = open(r->w, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	for (;;) {
		struct pollfd pfd[2] = { { .fd = pidfd, .events = POLLIN }, { .fd = r->req->cancel_fd, .events = POLLIN } };
		int64_t now = clock_mono_ms(), wait = r->deadline - now;
		uint64_t bytes = 0, inodes = 0;

		if (wait > OCI_WATCH_MS)
			wait = OCI_WATCH_MS;
		if (wait < 0)
			wait = 0;
		if (poll(pfd, r->req->cancel_fd >= 0 ? 2 : 1, (int)wait) < 0 && errno != EINTR) {
			stopped = kiln_err_set(r->err, KERR_HOST_ERROR, "poll: %s", strerror(errno));
			break;
		}
		if (pfd[0].revents) {
			exited = 1;
			break;
		}
		if ((stopped = oci_check_time(r)) < 0)
			break;
		if (wfd >= 0 && clock_mono_ms() >= next_watch) {
			/* The tree under w is what the tools wrote: a layer that
			 * inflates past the cap stops the import here, not the disk. */
			oci_tree_usage(wfd, limit, &bytes, &inodes);
			if (bytes > limit || inodes > OCI_MAX_INODES) {
				stopped = kiln_err_set(r->err, bytes > limit ? KERR_TOO_LARGE : KERR_INVALID_IMAGE,
					     bytes > limit ? "the unpacked image is larger than %llu MiB" :
						     "the image has more than %llu files",
					     bytes > limit ? (unsigned long long)(r->req->max_bytes >> 20) :
						     (unsigned long long)OCI_MAX_INODES);
				break;
			}
			next_watch = clock_mono_ms() + 1000;
		}
	}
	if (!exited)
		kill(pid, SIGKILL); /* the jail's init: every process in it goes too */
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	jail_release(&j);
	forward_output(r, logfd, last, sizeof(last));
	if (stopped)
		goto out;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		oci_logf(r, "%s: done in %lld ms", what, (long long)(clock_mono_ms() - t0));
		rc = 0;
	} else if (WIFEXITED(status) && strstr(last, "file too large"))
		/* RLIMIT_FSIZE: one file of the image past the cap. */
		kiln_err_set(r->err, KERR_TOO_LARGE, "the unpacked image is larger than %llu MiB (%s: %s)",
			     (unsigned long long)(r->req->max_bytes >> 20), what, last);
	else if (WIFEXITED(status))
		kiln_err_set(r->err, KERR_INVALID_IMAGE, "%s failed (exit status %d): %s", what, WEXITSTATUS(status),
			     last[0] ? last : "no message");
	else
		kiln_err_set(r->err, KERR_INVALID_IMAGE, "%s was killed by signal %d (memory limit %llu MiB?)", what,
			     WTERMSIG(status), (unsigned long long)(OCI_JAIL_MEMORY >> 20));
out:
	if (wfd >= 0)
		close(wfd);
	if (pidfd >= 0)
		close(pidfd);
	close(logfd);
	return rc;
}

/* Copy the archive into w, readable by the jail's slot uid (the upload is
 * root's, and a copy cannot change under the tools). */
static int copy_archive(struct oci_run *r, int in, const char *dst)
{
	int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644), rc = 0;
	loff_t done = 0;

	if (out < 0)
		return kiln_err_set(r->err, KERR_HOST_ERROR, "%s: %s", dst, strerror(errno));
	while ((uint64_t)done < r->archive_size) {
		size_t chunk = r->archive_size - (uint64_t)done > (64u << 20) ? (64u << 20) : r->archive_size - (uint64_t)done;
		loff_t off_in = done;
		ssize_t n = copy_file_range(in, &off_in, out, NULL, chunk, 0);

		if (n <= 0) {
			rc = kiln_err_set(r->err, KERR_HOST_ERROR, "copying the archive: %s", n < 0 ? strerror(errno) : "short");
			break;
		}
		done += n;
		if ((rc = oci_check_time(r)) < 0)
			break;
	}
	close(out);
	return rc;
}

/* Open path under dirfd with openat2's resolve flags and read it whole (a
 * regular file of at most max bytes). The text (NUL-terminated, the caller
 * frees) or NULL: *missing = 1 when it does not exist, else err set. */
static char *read_under(struct oci_run *r, int dirfd, const char *path, uint64_t resolve, size_t max, size_t *len,
			int *missing)
{
	struct open_how how = { .flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, .resolve = resolve };
	struct stat st;
	char *text = NULL;
	int fd;

	*missing = 0;
	fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	if (fd < 0) {
		if (errno == ENOENT)
			*missing = 1;
		else
			kiln_err_set(r->err, KERR_INVALID_IMAGE, "%s: %s", path, strerror(errno));
		return NULL;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
		kiln_err_set(r->err, KERR_INVALID_IMAGE, "%s: not a regular file of at most %zu KiB", path, max >> 10);
		goto out;
	}
	if (!(text = malloc((size_t)st.st_size + 1))) {
		kiln_err_set(r->err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	if (io_read_all(fd, text, (size_t)st.st_size) != st.st_size) {
		kiln_err_set(r->err, KERR_INVALID_IMAGE, "%s: short read", path);
		free(text);
		text = NULL;
		goto out;
	}
	text[st.st_size] = '\0';
	*len = (size_t)st.st_size;
out:
	close(fd);
	return text;
}

/* The image config of the layout skopeo wrote, tag "kiln". */
static int read_config(struct oci_run *r, struct oci_config *cfg)
{
	const uint64_t beneath = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
	char path[PATH_MAX + 16], digest[72], blob[128];
	char *text;
	size_t len = 0;
	int dfd, missing, step, rc = -1;

	snprintf(path, sizeof(path), "%s/layout", r->w);
	if ((dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		return kiln_err_set(r->err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
	/* index.json names the manifest, the manifest names the config: each
	 * read from the layout (bounded, beneath it) and parsed in turn. */
	snprintf(blob, sizeof(blob), "index.json");
	for (step = 0; step < 3; step++) {
		if (step)
			snprintf(blob, sizeof(blob), "blobs/sha256/%s", digest + 7);
		if (!(text = read_under(r, dfd, blob, beneath, OCI_MAX_JSON, &len, &missing)))
			goto missing;
		if (step == 0)
			rc = oci_index_manifest(text, len, "kiln", digest, r->err);
		else if (step == 1)
			rc = oci_manifest_config(text, len, digest, r->err);
		else
			rc = oci_config_parse(text, len, cfg, r->err);
		free(text);
		if (rc < 0)
			goto out;
	}
	goto out;
missing:
	if (missing)
		kiln_err_set(r->err, KERR_INVALID_IMAGE, "the image layout lacks %s", blob);
out:
	close(dfd);
	return rc;
}

/* The image's User as numbers, names looked up in the image's own files
 * (symbolic links resolved inside the tree, as the guest would). */
static int resolve_user(struct oci_run *r, int root_fd, const char *user, uint32_t *uid, uint32_t *gid)
{
	const uint64_t in_root = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
	char *passwd = NULL, *group = NULL;
	size_t plen = 0, glen = 0;
	int missing, rc;

	if (!user[0]) {
		*uid = *gid = 0;
		return 0;
	}
	passwd = read_under(r, root_fd, "etc/passwd", in_root, OCI_MAX_ETC_FILE, &plen, &missing);
	if (!passwd && !missing)
		return -1;
	group = read_under(r, root_fd, "etc/group", in_root, OCI_MAX_ETC_FILE, &glen, &missing);
	if (!group && !missing) {
		free(passwd);
		return -1;
	}
	rc = oci_user_resolve(user, passwd, plen, group, glen, uid, gid, r->err);
	free(passwd);
	free(group);
	return rc;
}

/* mkfs.ext4 -d tree into out, waiting with the deadline and cancel_fd. */
static int make_ext4(struct oci_run *r, const char *tree, const char *out, uint64_t size, uint64_t inodes)
{
	char ksize[32], ninodes[32], logpath[PATH_MAX + 16], last[512];
	char *argv[] = { OCI_MKFS, "-q", "-F", "-L", "kiln-root", "-O", "^has_journal", "-E", "root_owner=0:0",
			 "-m", "0", "-N", ninodes, "-d", (char *)tree, (char *)out, ksize, NULL };
	posix_spawn_file_actions_t fa;
	int logfd, pidfd = -1, status = 0, rc = -1, e, fd, stopped = 0;
	int64_t t0;
	pid_t pid;

	snprintf(ksize, sizeof(ksize), "%lluk", (unsigned long long)(size >> 10));
	snprintf(ninodes, sizeof(ninodes), "%llu", (unsigned long long)inodes);
	snprintf(logpath, sizeof(logpath), "%s/mkfs.log", r->work);
	if ((logfd = open(logpath, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
		return kiln_err_set(r->err, KERR_HOST_ERROR, "%s: %s", logpath, strerror(errno));
	/* mkfs.ext4 makes a regular file of that size; start from an empty one. */
	if ((fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0) {
		kiln_err_set(r->err, KERR_HOST_ERROR, "%s: %s", out, strerror(errno));
		close(logfd);
		return -1;
	}
	close(fd);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, logfd, 1);
	posix_spawn_file_actions_adddup2(&fa, logfd, 2);
	e = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (e) {
		kiln_err_set(r->err, KERR_HOST_ERROR, "%s: %s", argv[0], strerror(e));
		goto out;
	}
	oci_logf(r, "mkfs.ext4: %llu MiB, %llu inodes", (unsigned long long)(size >> 20), (unsigned long long)inodes);
	t0 = clock_mono_ms();
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	for (;;) {
		struct pollfd pfd[2] = { { .fd = pidfd, .events = POLLIN }, { .fd = r->req->cancel_fd, .events = POLLIN } };
		int64_t wait = r->deadline - clock_mono_ms();

		if (pidfd < 0) /* no pidfd: wait, the deadline unwatched (mkfs is bounded by size) */
			break;
		if (poll(pfd, r->req->cancel_fd >= 0 ? 2 : 1, (int)(wait < 0 ? 0 : wait > 1000 ? 1000 : wait)) > 0 &&
		    pfd[0].revents)
			break;
		if ((stopped = oci_check_time(r)) < 0) {
			kill(pid, SIGKILL);
			break;
		}
	}
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	forward_output(r, logfd, last, sizeof(last));
	if (stopped)
		goto out;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		oci_logf(r, "mkfs.ext4: done in %lld ms", (long long)(clock_mono_ms() - t0));
		rc = 0;
	} else {
		kiln_err_set(r->err, KERR_HOST_ERROR, "mkfs.ext4 failed: %s", last[0] ? last : "no message");
	}
out:
	if (pidfd >= 0)
		close(pidfd);
	close(logfd);
	return rc;
}

static int setup_work(struct oci_run *r)
{
	char path[PATH_MAX + 16];

	char real[PATH_MAX];

	/* New, never an existing directory: all of it is removed at the end. */
	if (mkdir(r->req->work_dir, 0700) < 0)
		return kiln_err_set(r->err, KERR_HOST_ERROR, "%s: %s (the work directory must not exist)",
				    r->req->work_dir, strerror(errno));
	if (!realpath(r->req->work_dir, real) || strlen(real) + 16 > sizeof(r->work)) {
		kiln_err_set(r->err, KERR_HOST_ERROR, "%s: %s", r->req->work_dir, strerror(errno ? errno : ENAMETOOLONG));
		rmdir(r->req->work_dir);
		return -1;
	}
	snprintf(r->work, sizeof(r->work), "%s", real);
	snprintf(r->w, sizeof(r->w), "%s/w", r->work);
	snprintf(r->jroot, sizeof(r->jroot), "%s/jail-root", r->work);
	if (mkdir(r->w, 0700) < 0 || mkdir(r->jroot, 0755) < 0)
		return kiln_err_set(r->err, KERR_HOST_ERROR, "%s: %s", r->work, strerror(errno));
	/* The slot uid is known only once the jail starts: world-writable, in
	 * a 0700 directory that only root and that uid can enter. */
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/%s", r->w, i ? "tmp" : "home");
		if (mkdir(path, 0700) < 0 || chmod(path, 01777) < 0)
			return kiln_err_set(r->err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
	}
	/* A crashed kiln-host leaves the jails' cgroups: vm_reap_stale (kiln-host
	 * reap, serve's start) removes them through this directory, shaped like a
	 * VM's (a "vm-" name, a lock flocked while we live, the jail record). */
	if (r->req->run_dir && r->req->run_dir[0]) {
		static atomic_uint seq;
		int e;

		snprintf(r->rundir, sizeof(r->rundir), "%s/vm-oci-%d-%u", r->req->run_dir, (int)getpid(),
			 atomic_fetch_add(&seq, 1));
		if ((e = fs_mkdir_p(r->rundir, 0700)) < 0) {
			kiln_err_set(r->err, KERR_HOST_ERROR, "%s: %s", r->rundir, strerror(-e));
			r->rundir[0] = '\0';
			return -1;
		}
		snprintf(path, sizeof(path), "%s/lock", r->rundir);
		r->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (r->lock_fd < 0 || flock(r->lock_fd, LOCK_EX) < 0)
			return kiln_err_set(r->err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
		snprintf(r->record, sizeof(r->record), "%s/jail", r->rundir);
	}
	if (jail_config_init(&r->jc, r->err) < 0)
		return -1;
	r->jc_ready = 1;
	if (jail_config_add_program(&r->jc, OCI_SKOPEO, r->err) < 0 || jail_config_add_program(&r->jc, OCI_TAR, r->err) < 0 ||
	    jail_config_add_program(&r->jc, OCI_UMOCI, r->err) < 0)
		return -1;
	return 0;
}

static void oci_log_tree(void *ctx, const char *fmt, ...)
{
	struct oci_run *r = ctx;
	char line[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	oci_logf(r, "%s", line);
}

int template_build_oci(const struct template_build_oci_req *req, const char *out_ext4, struct template_build_meta *meta,
	       template_build_log_fn log, void *ctx, struct kiln_err *err)
{
	struct oci_run *r = calloc(1, sizeof(*r));
	struct oci_config cfg = { 0 };
	struct oci_tree_stats ts;
	struct stat st;
	char archive[PATH_MAX + 16], layout[PATH_MAX + 32], rootfs[PATH_MAX + 16];
	uint32_t uid = 0, gid = 0;
	uint64_t size;
	int64_t t_start = clock_mono_ms(), t_walk;
	int afd = -1, root_fd = -1, kind, rc = -1, made_out = 0, e = 0;

	memset(meta, 0, sizeof(*meta));
	if (!r)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	r->req = req;
	r->lock_fd = -1;
	r->log = log;
	r->ctx = ctx;
	r->err = err;
	r->deadline = clock_mono_ms() + (int64_t)(req->timeout_s ? req->timeout_s : 1800) * 1000;

	afd = open(req->archive, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (afd < 0 || fstat(afd, &st) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", req->archive, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		kiln_err_set(err, KERR_INVALID_IMAGE, "the archive is not a regular file");
		goto out;
	}
	r->archive_size = (uint64_t)st.st_size;
	if (r->archive_size > req->max_bytes) {
		kiln_err_set(err, KERR_TOO_LARGE, "the archive (%llu MiB) is larger than the cap of %llu MiB",
			     (unsigned long long)(r->archive_size >> 20), (unsigned long long)(req->max_bytes >> 20));
		goto out;
	}
	if ((kind = oci_tar_kind(afd, r->archive_size, err)) < 0)
		goto out;
	oci_logf(r, "archive: %s, %llu bytes", kind == OCI_KIND_OCI ? "OCI image layout" : "docker-archive",
		 (unsigned long long)r->archive_size);
	if (setup_work(r) < 0)
		goto out;
	snprintf(archive, sizeof(archive), "%s/image.tar", r->w);
	if (copy_archive(r, afd, archive) < 0)
		goto out;
	close(afd);
	afd = -1;

	/* An OCI layout tar is unpacked by tar in the jail first: skopeo's own
	 * oci-archive untar chowns what it makes (to the headers' owners, or
	 * root for directories the tar does not list), which an unprivileged
	 * uid cannot do. GNU tar as non-root keeps no owner, strips leading
	 * '/' and refuses '..' members; the jail bounds the rest. */
	if (kind == OCI_KIND_OCI) {
		char dir[PATH_MAX + 8];
		char *argv[] = { OCI_TAR, "-x", "--no-same-owner", "--no-same-permissions", "-m", "-f", archive, "-C", dir, NULL };

		/* Its own work directory (the jail chowns it: tar sets "."'s mode),
		 * the archive beside it read-only. */
		snprintf(dir, sizeof(dir), "%s/in", r->w);
		if (mkdir(dir, 0700) < 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", dir, strerror(errno));
			goto out;
		}
		if (jail_run(r, argv, "tar -x (OCI layout)", dir, archive) < 0)
			goto out;
		/* tar ran as one slot uid, skopeo runs as another. */
		if ((afd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
		    (e = oci_tree_open_up(afd)) < 0) {
			kiln_err_set(err, e == -ELOOP || e == -EMLINK ? KERR_INVALID_IMAGE : KERR_HOST_ERROR,
				     "the unpacked OCI layout: %s", strerror(afd < 0 ? errno : -e));
			goto out;
		}
		close(afd);
		afd = -1;
		unlink(archive);
	}
	/* skopeo: the image into an OCI layout tagged "kiln", every blob's
	 * digest verified. Both source transports read files only (oci: a
	 * directory, docker-archive: the tar in place); the jail has no network. */
	{
		char src[PATH_MAX + 32];
		char *argv[] = { OCI_SKOPEO, "--insecure-policy", "--tmpdir", NULL, "copy", "--quiet",
				 "--remove-signatures", "--format", "oci",
				 src, layout, NULL };
		char tmp[PATH_MAX + 8];

		snprintf(tmp, sizeof(tmp), "%s/tmp", r->w);
		argv[3] = tmp;
		if (kind == OCI_KIND_OCI)
			snprintf(src, sizeof(src), "oci:%s/in", r->w);
		else
			snprintf(src, sizeof(src), "docker-archive:%s", archive);
		snprintf(layout, sizeof(layout), "oci:%s/layout:kiln", r->w);
		if (jail_run(r, argv, "skopeo copy", r->w, NULL) < 0)
			goto out;
		/* The layout holds every blob now. */
		if (kind == OCI_KIND_OCI) {
			char dir[PATH_MAX + 8];

			snprintf(dir, sizeof(dir), "%s/in", r->w);
			fs_rmtree(dir);
		} else {
			unlink(archive);
		}
	}
	if (oci_check_time(r) < 0 || read_config(r, &cfg) < 0)
		goto out;
	/* umoci: the layers in order into rootfs, --rootless as the slot uid. */
	{
		char *argv[] = { OCI_UMOCI, "raw", "unpack", "--rootless", "--image", NULL, rootfs, NULL };
		char image[PATH_MAX + 16];

		snprintf(image, sizeof(image), "%s/layout:kiln", r->w);
		argv[5] = image;
		snprintf(rootfs, sizeof(rootfs), "%s/rootfs", r->w);
		if (jail_run(r, argv, "umoci unpack", r->w, NULL) < 0)
			goto out;
	}
	if (oci_check_time(r) < 0)
		goto out;
	if ((root_fd = open(rootfs, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", rootfs, strerror(errno));
		goto out;
	}
	if (resolve_user(r, root_fd, cfg.user, &uid, &gid) < 0)
		goto out;
	t_walk = clock_mono_ms();
	if (oci_tree_prepare(root_fd, uid, gid, req->max_bytes, &ts, oci_log_tree, r, err) < 0)
		goto out;
	oci_logf(r, "tree walk: done in %lld ms", (long long)(clock_mono_ms() - t_walk));
	oci_logf(r, "tree: %llu MiB in %llu entries; %u device nodes/FIFOs/sockets removed, %u set-uid/set-gid "
		    "files cleared, %u entries had extended attributes",
		 (unsigned long long)(ts.bytes >> 20), (unsigned long long)ts.inodes, ts.removed_nodes, ts.cleared_suid,
		 ts.cleared_xattrs);
	close(root_fd);
	root_fd = -1;
	if (oci_check_time(r) < 0)
		goto out;
	/* Room for ext4's own metadata (+20%) and for what tasks write. */
	size = ts.bytes + ts.bytes / 5 + OCI_FREE_BYTES;
	size = (size + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
	if (size > req->max_bytes) {
		kiln_err_set(err, KERR_TOO_LARGE, "the image would be %llu MiB, more than the cap of %llu MiB",
			     (unsigned long long)(size >> 20), (unsigned long long)(req->max_bytes >> 20));
		goto out;
	}
	made_out = 1;
	if (make_ext4(r, rootfs, out_ext4, size, ts.inodes + ts.inodes / 5 + 16384) < 0)
		goto out;
	if (chmod(out_ext4, 0444) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", out_ext4, strerror(errno));
		goto out;
	}
	if (json_array_size(cfg.env) > 0)
		meta->env = json_incref(cfg.env);
	snprintf(meta->workdir, sizeof(meta->workdir), "%s", cfg.workdir);
	meta->uid = uid;
	meta->gid = gid;
	oci_logf(r, "image ready: %llu MiB, user %u:%u, %lld ms in all", (unsigned long long)(size >> 20), uid, gid,
		 (long long)(clock_mono_ms() - t_start));
	rc = 0;
out:
	if (rc < 0 && made_out)
		unlink(out_ext4);
	if (afd >= 0)
		close(afd);
	if (root_fd >= 0)
		close(root_fd);
	oci_config_free(&cfg);
	if (r->jc_ready)
		jail_config_free(&r->jc);
	if (r->lock_fd >= 0)
		close(r->lock_fd);
	if (r->rundir[0])
		fs_rmtree(r->rundir);
	if (r->work[0]) {
		int re = fs_rmtree(r->work);

		if (re < 0)
			oci_logf(r, "removing %s: %s", r->work, strerror(-re));
	}
	free(r);
	return rc;
}
