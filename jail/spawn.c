/* spawn: start a jail and release it. The parent side plans everything
 * (slot, cgroups, layout, environment); the cloned child only replays the
 * plan with system calls (new namespaces, tmpfs root, binds, rlimits,
 * credentials, seccomp, exec), so it is safe to start from a multi-threaded
 * process without an exec in between. */
#include "jail_int.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#ifndef MOUNT_ATTR_RDONLY
#define MOUNT_ATTR_RDONLY 0x00000001
#define MOUNT_ATTR_NOSUID 0x00000002
#define MOUNT_ATTR_NODEV  0x00000004
struct mount_attr {
	uint64_t attr_set, attr_clr, propagation, userns_fd;
};
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC 4
#endif

/* ---- the child ------------------------------------------------------------ */

struct child {
	const struct jail_plan *plan;
	const struct jail_spec *spec;
	const char *root;
	char *const *argv;
	char *const *envp;
	int procs_fd[CG_N];
	int status_fd;    /* write end of the status pipe (close-on-exec) */
	int parent_pidfd; /* readable once the parent process is gone */
	uid_t uid;
	gid_t gid;
	struct sock_filter *filter;
	unsigned filter_len;
};

struct child_status {
	int err;
	char what[PATH_MAX + 64];
};

/* Report the failed step and leave. Only async-signal-safe calls from here on:
 * the child of a multi-threaded parent must not take libc locks. */
static __attribute__((noreturn)) void child_fail(const struct child *a, const char *what, const char *path)
{
	struct child_status st = { .err = errno };
	size_t wl = strlen(what), pl = path ? strlen(path) : 0;

	if (wl > 60)
		wl = 60;
	if (pl > PATH_MAX - 1)
		pl = PATH_MAX - 1;
	memcpy(st.what, what, wl);
	if (pl) {
		st.what[wl] = ' ';
		memcpy(st.what + wl + 1, path, pl);
	}
	if (write(a->status_fd, &st, sizeof(st)) < 0)
		_exit(127);
	_exit(126);
}

/* root + path into buf, or NULL when it does not fit. */
static const char *under(char *buf, size_t cap, const char *root, const char *path)
{
	size_t rl = strlen(root), pl = strlen(path);

	if (rl + pl + 1 > cap)
		return NULL;
	memcpy(buf, root, rl);
	memcpy(buf + rl, path, pl + 1);
	return buf;
}

static void child_mounts(const struct child *a)
{
	const struct jail_plan *p = a->plan;
	char buf[PATH_MAX];
	const char *dst;
	struct mount_attr ro = { .attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV };

	/* The root's directories and mount points get exactly the modes below
	 * (0755, 0644), whatever umask the owner runs under: under a umask of
	 * 0077 (kiln-host.service once had it) they were root's 0700 and every
	 * execve by the slot uid EACCES. The program gets the owner's umask back at the end. */
	mode_t old_umask = umask(022);

	/* Nothing mounted here propagates back to the host, and host mount
	 * events do not reach in. */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		child_fail(a, "make / private", NULL);
	if (mount("tmpfs", a->root, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=1m,nr_inodes=4096") < 0)
		child_fail(a, "mount tmpfs on", a->root);
	/* 1: mount points and links in the tmpfs. */
	for (size_t i = 0; i < p->n; i++) {
		const struct op *o = &p->ops[i];

		if (!(dst = under(buf, sizeof(buf), a->root, o->path)))
			child_fail(a, "path too long:", o->path);
		if (o->kind == OP_DIR && mkdir(dst, 0755) < 0 && errno != EEXIST)
			child_fail(a, "mkdir", o->path);
		if (o->kind == OP_FILE && mknod(dst, S_IFREG | 0644, 0) < 0 && errno != EEXIST)
			child_fail(a, "create", o->path);
		if (o->kind == OP_LINK && symlink(o->arg, dst) < 0 && errno != EEXIST)
			child_fail(a, "symlink", o->path);
	}
	/* 2: read-only binds. */
	for (size_t i = 0; i < p->n; i++) {
		const struct op *o = &p->ops[i];

		if (o->kind != OP_BIND_RO)
			continue;
		dst = under(buf, sizeof(buf), a->root, o->path);
		if (mount(o->arg, dst, NULL, MS_BIND, NULL) < 0)
			child_fail(a, "bind", o->path);
	}
	/* 3: the tmpfs and every bind so far read-only, nosuid, nodev: one call. */
	if (syscall(SYS_mount_setattr, AT_FDCWD, a->root, AT_RECURSIVE, &ro, sizeof(ro)) < 0) {
		if (errno != ENOSYS)
			child_fail(a, "mount_setattr read-only", a->root);
		/* Older kernels: one remount per mount. */
		if (mount(NULL, a->root, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
			child_fail(a, "remount read-only", a->root);
		for (size_t i = 0; i < p->n; i++) {
			const struct op *o = &p->ops[i];

			if (o->kind != OP_BIND_RO)
				continue;
			dst = under(buf, sizeof(buf), a->root, o->path);
			if (mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
				child_fail(a, "remount read-only", o->path);
		}
	}
	/* 4: what stays writable, the devices, /proc. */
	for (size_t i = 0; i < p->n; i++) {
		const struct op *o = &p->ops[i];
		unsigned long flags;

		if (o->kind == OP_BIND_RW)
			flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
		else if (o->kind == OP_BIND_DEV)
			flags = MS_RDONLY | MS_NOSUID | MS_NOEXEC;
		else if (o->kind == OP_PROC)
			flags = 0;
		else
			continue;
		dst = under(buf, sizeof(buf), a->root, o->path);
		if (o->kind == OP_PROC) {
			/* Only this PID namespace's processes, and none of the host-wide
			 * files (/proc/sys, /proc/kcore, ...): QEMU needs /proc/self. */
			if (mount("proc", dst, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "subset=pid,hidepid=invisible") < 0)
				child_fail(a, "mount proc on", o->path);
			continue;
		}
		if (mount(o->arg, dst, NULL, MS_BIND, NULL) < 0)
			child_fail(a, "bind", o->path);
		if (mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | flags, NULL) < 0)
			child_fail(a, "remount", o->path);
	}
	if (chdir(a->root) < 0)
		child_fail(a, "chdir", a->root);
	if (syscall(SYS_pivot_root, ".", ".") < 0)
		child_fail(a, "pivot_root", a->root);
	/* The old root sits on top of the new one: detach it, and with it every
	 * host mount. */
	if (umount2(".", MNT_DETACH) < 0)
		child_fail(a, "detach the old root", NULL);
	if (chdir("/") < 0)
		child_fail(a, "chdir /", NULL);
	umask(old_umask);
}

static void child_limits(const struct child *a)
{
	const struct jail_spec *s = a->spec;
	struct {
		int res;
		rlim_t val;
	} lim[] = {
		{ RLIMIT_CORE, 0 },
		{ RLIMIT_NOFILE, s->nofile ? s->nofile : 256 },
		{ RLIMIT_NPROC, s->pids ? s->pids : 128 },
		{ RLIMIT_FSIZE, s->fsize_bytes ? s->fsize_bytes : RLIM_INFINITY },
		{ RLIMIT_MSGQUEUE, 0 },
		{ RLIMIT_NICE, 0 },
		{ RLIMIT_RTPRIO, 0 },
		{ RLIMIT_MEMLOCK, 8u << 20 },
	};

	for (size_t i = 0; i < sizeof(lim) / sizeof(lim[0]); i++) {
		struct rlimit rl = { lim[i].val, lim[i].val };

		if (setrlimit(lim[i].res, &rl) < 0)
			child_fail(a, "setrlimit", NULL);
	}
}

static void child_creds(const struct child *a)
{
	struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct none[2];
	gid_t groups[1] = { a->spec->extra_gid };

	/* The bounding set can only shrink while we still hold CAP_SETPCAP. */
	for (int cap = 0; cap < 64; cap++)
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
			child_fail(a, "drop capability from the bounding set", NULL);
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
		child_fail(a, "clear ambient capabilities", NULL);
	/* Raw system calls: glibc's wrappers would try to change every thread of
	 * the parent, which this child does not have. */
	if (syscall(SYS_setgroups, a->spec->extra_gid ? 1 : 0, groups) < 0)
		child_fail(a, "setgroups", NULL);
	if (syscall(SYS_setresgid, a->gid, a->gid, a->gid) < 0)
		child_fail(a, "setresgid", NULL);
	/* All three uids non-zero: the kernel clears the permitted, effective and
	 * ambient sets; the inheritable set goes explicitly. */
	if (syscall(SYS_setresuid, a->uid, a->uid, a->uid) < 0)
		child_fail(a, "setresuid", NULL);
	memset(none, 0, sizeof(none));
	if (syscall(SYS_capset, &hdr, none) < 0)
		child_fail(a, "capset", NULL);
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		child_fail(a, "no_new_privs", NULL);
}

/* Move keep_fds[i] to 3 + i, everything else close-on-exec. The status pipe
 * and the parent's pidfd are moved above that range first. */
static void child_fds(struct child *a)
{
	const struct jail_spec *s = a->spec;
	int top = 3 + s->nkeep, tmp[JAIL_MAX_FDS];

	if ((a->status_fd = fcntl(a->status_fd, F_DUPFD_CLOEXEC, top)) < 0)
		_exit(127);
	if ((a->parent_pidfd = fcntl(a->parent_pidfd, F_DUPFD_CLOEXEC, top)) < 0)
		child_fail(a, "dup", NULL);
	for (int i = 0; i < s->nkeep; i++)
		if ((tmp[i] = fcntl(s->keep_fds[i], F_DUPFD_CLOEXEC, top)) < 0)
			child_fail(a, "dup", NULL);
	for (int i = 0; i < s->nkeep; i++)
		if (dup2(tmp[i], 3 + i) < 0) /* dup2 clears close-on-exec */
			child_fail(a, "dup2", NULL);
	if (syscall(SYS_close_range, top, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
		child_fail(a, "close_range", NULL);
}

static __attribute__((noreturn)) void child_main(struct child *a)
{
	static const char zero[] = "0\n";
	sigset_t none;
	struct pollfd pp;
	int fd;

	/* The OOM killer's choice, before anything else: raised, it makes the
	 * jailed program the victim rather than its owner (raising needs no
	 * privilege). /proc is still the host's here. */
	if (a->spec->oom_score_adj) {
		char adj[16];
		int n = snprintf(adj, sizeof(adj), "%d", a->spec->oom_score_adj);

		fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, adj, (size_t)n) != n)
			child_fail(a, "oom_score_adj", NULL);
		close(fd);
	}
	/* Join the cgroups first: everything below is charged to the jail. Then
	 * a cgroup namespace rooted there: /proc/self/cgroup shows "/", not the
	 * host's layout. */
	for (int i = 0; i < CG_N; i++)
		if (write(a->procs_fd[i], zero, 2) != 2)
			child_fail(a, "join cgroup", cg_names[i]);
	if (unshare(CLONE_NEWCGROUP) < 0)
		child_fail(a, "unshare cgroup namespace", NULL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	setsid();
	if (sethostname("kiln", 4) < 0)
		child_fail(a, "sethostname", NULL);
	child_mounts(a);
	/* stdin /dev/null (the jail's own); stdout and stderr where asked. */
	fd = open("/dev/null", O_RDWR);
	if (fd < 0)
		child_fail(a, "open /dev/null", NULL);
	if (dup2(fd, 0) < 0 || dup2(a->spec->stdout_fd >= 0 ? a->spec->stdout_fd : fd, 1) < 0 ||
	    dup2(a->spec->stderr_fd >= 0 ? a->spec->stderr_fd : fd, 2) < 0)
		child_fail(a, "dup2", NULL);
	if (fd > 2)
		close(fd);
	child_fds(a);
	child_limits(a);
	child_creds(a);
	/* Changing credentials cleared the parent-death signal: set it now, then
	 * make sure the parent did not die before it was set. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
		child_fail(a, "PR_SET_PDEATHSIG", NULL);
	pp.fd = a->parent_pidfd;
	pp.events = POLLIN;
	if (poll(&pp, 1, 0) != 0)
		_exit(127);
	if (a->filter) {
		struct sock_fprog prog = { .len = (unsigned short)a->filter_len, .filter = a->filter };

		if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0)
			child_fail(a, "seccomp", NULL);
	}
	execve(a->spec->exe, a->argv, a->envp);
	child_fail(a, "execve", a->spec->exe);
}

/* ---- spawn and release ---------------------------------------------------- */

static int chown_path(const char *path, uid_t uid, gid_t gid, struct kiln_err *err)
{
	if (fchownat(AT_FDCWD, path, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "jail: chown %s: %s", path, strerror(errno));
	return 0;
}

pid_t jail_spawn(const struct jail_config *c, const struct jail_spec *spec, char *const argv[], struct jail *j,
		 int *pidfd, struct kiln_err *err)
{
	struct jail_plan plan = { 0 };
	struct child a = { .plan = &plan, .spec = spec, .root = spec->root, .argv = argv,
			   .procs_fd = { -1, -1, -1 }, .status_fd = -1, .parent_pidfd = -1 };
	int status[2] = { -1, -1 };
	char **envp = NULL, *ldenv = NULL;
	size_t nenv = 0;
	struct child_status st;
	char cg[CG_N][sizeof(j->cg[0])];
	pid_t pid = -1;
	ssize_t n;
	int r;

	memset(j, 0, sizeof(*j));
	j->slot_fd = -1;
	*pidfd = -1;
	if (!spec->name || !spec->name[0] || strchr(spec->name, '/') || spec->name[0] == '.' || !spec->root || !spec->exe)
		return kiln_err_set(err, KERR_HOST_ERROR, "jail: name, root and exe are required");
	for (int i = 0; i < CG_N; i++)
		if (cg_path(cg[i], sizeof(cg[i]), cg_base(c, i), spec->name) < 0)
			return kiln_err_set(err, KERR_HOST_ERROR, "jail: name too long for a cgroup directory: %.80s...", spec->name);
	j->active = 1;
	if (slot_take(c, j, cg[CG_MEMORY], err) < 0)
		goto fail;
	memcpy(j->cg, cg, sizeof(j->cg));
	if (spec->record && (r = cg_record_write(j, spec->record)) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "jail: %s: %s", spec->record, strerror(-r));
		goto fail;
	}
	/* What the program may write belongs to the slot's uid. */
	if (spec->work && chown_path(spec->work, j->uid, j->gid, err) < 0)
		goto fail;
	for (int i = 0; i < JAIL_MAX_PATHS && spec->rw[i]; i++)
		if (chown_path(spec->rw[i], j->uid, j->gid, err) < 0)
			goto fail;
	if (cg_create(c, spec, j, a.procs_fd, err) < 0)
		goto fail;
	if (plan_build(&plan, c->base, spec, err) < 0)
		goto fail;

	/* The environment: the caller's, plus where the libraries are (the jail
	 * has no /etc/ld.so.cache). */
	while (spec->envp && spec->envp[nenv])
		nenv++;
	envp = calloc(nenv + 2, sizeof(*envp));
	if (!envp)
		goto oom;
	memcpy(envp, spec->envp, nenv * sizeof(*envp));
	if (c->base->ld_path.len) {
		if (asprintf(&ldenv, "LD_LIBRARY_PATH=%s", c->base->ld_path.p) < 0) {
			ldenv = NULL;
			goto oom;
		}
		envp[nenv++] = ldenv;
	}
	a.envp = envp;
	a.filter = c->filter;
	a.filter_len = c->filter_len;
	a.uid = j->uid;
	a.gid = j->gid;

	if (pipe2(status, O_CLOEXEC) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "pipe: %s", strerror(errno));
		goto fail;
	}
	a.status_fd = status[1];
	a.parent_pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
	if (a.parent_pidfd < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "pidfd_open: %s", strerror(errno));
		goto fail;
	}
	fcntl(a.parent_pidfd, F_SETFD, FD_CLOEXEC);
	/* Like fork, with new namespaces: the child is PID 1 of its own PID
	 * namespace, and everything in it dies with it. */
	pid = (pid_t)syscall(SYS_clone, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET | SIGCHLD,
			     NULL, NULL, NULL, 0);
	if (pid == 0) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
			_exit(127);
		child_main(&a);
	}
	if (pid < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "jail: clone: %s", strerror(errno));
		goto fail;
	}
	close(status[1]);
	status[1] = -1;
	/* EOF: the exec happened (the pipe is close-on-exec). */
	do
		n = read(status[0], &st, sizeof(st));
	while (n < 0 && errno == EINTR);
	if (n > 0) {
		st.what[sizeof(st.what) - 1] = '\0';
		kiln_err_set(err, KERR_HOST_ERROR, "jail: %s: %s", st.what, strerror(st.err));
		goto fail;
	}
	*pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (*pidfd < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "pidfd_open: %s", strerror(errno));
		goto fail;
	}
	goto out;
oom:
	kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
fail:
	if (pid > 0) {
		kill(pid, SIGKILL);
		jail_waitpid(pid, NULL);
		pid = -1;
	}
	jail_release(j);
	pid = -1;
out:
	for (int i = 0; i < CG_N; i++)
		if (a.procs_fd[i] >= 0)
			close(a.procs_fd[i]);
	if (status[0] >= 0)
		close(status[0]);
	if (status[1] >= 0)
		close(status[1]);
	if (a.parent_pidfd >= 0)
		close(a.parent_pidfd);
	free(ldenv);
	free(envp);
	plan_free(&plan);
	return pid;
}

void jail_release(struct jail *j)
{
	if (!j->active)
		return;
	for (int i = 0; i < CG_N; i++) {
		if (!j->cg[i][0])
			continue;
		if (cg_remove(j->cg[i], cg_names[i]) == 0) {
			cg_remove_parent(j->cg[i]);
			j->cg[i][0] = '\0';
		}
	}
	/* The slot goes last: its uid is free only when nothing runs as it. */
	if (j->slot_fd >= 0)
		close(j->slot_fd);
	j->slot_fd = -1;
	j->active = 0;
}
