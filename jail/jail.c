/* jail: confine one program (QEMU) in new namespaces, a minimal read-only
 * root, cgroup v1 limits, rlimits and an unprivileged per-slot uid. The
 * parent side plans everything (paths, limits, slot, cgroups); the cloned
 * child only replays the plan with system calls, so it is safe to start from
 * a multi-threaded process without an exec in between. */
#include "jail.h"

#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <seccomp.h>

#include "fsutil.h"

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

#define CG_MEMORY 0
#define CG_CPU    1
#define CG_PIDS   2
static const char *const cg_names[3] = { "memory", "cpu", "pids" };

/* ---- the layout plan ------------------------------------------------------ */

enum op_kind {
	OP_DIR,     /* mkdir: a directory of the tmpfs root */
	OP_FILE,    /* an empty file: mount point for a file bind */
	OP_LINK,    /* a symbolic link, as on the host */
	OP_BIND_RO, /* bind arg (host) on path, read-only, nosuid, nodev */
	OP_BIND_RW, /* bind read-write, nosuid, nodev, noexec */
	OP_BIND_DEV,/* a device node: read-only, nosuid, noexec */
	OP_PROC,    /* procfs, subset=pid */
};

struct op {
	enum op_kind kind;
	int dir;    /* binds: the source is a directory */
	int owned;  /* path/arg were allocated for this plan */
	char *path; /* inside the jail (the host path, canonical except for links) */
	char *arg;  /* bind source or link target */
};

struct jail_plan {
	struct op *ops;
	size_t n, cap;
	char *ld_path; /* directories of the resolved libraries, for LD_LIBRARY_PATH */
};

static int is_bind(enum op_kind k)
{
	return k == OP_BIND_RO || k == OP_BIND_RW || k == OP_BIND_DEV;
}

static int plan_push(struct jail_plan *p, enum op_kind kind, int dir, const char *path, const char *arg)
{
	struct op *o;

	if (p->n == p->cap) {
		size_t cap = p->cap ? p->cap * 2 : 64;
		struct op *ops = realloc(p->ops, cap * sizeof(*ops));

		if (!ops)
			return -ENOMEM;
		p->ops = ops;
		p->cap = cap;
	}
	o = &p->ops[p->n];
	o->kind = kind;
	o->dir = dir;
	o->owned = 1;
	o->path = strdup(path);
	o->arg = arg ? strdup(arg) : NULL;
	if (!o->path || (arg && !o->arg)) {
		free(o->path);
		free(o->arg);
		return -ENOMEM;
	}
	p->n++;
	return 0;
}

static void plan_free(struct jail_plan *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n; i++)
		if (p->ops[i].owned) {
			free(p->ops[i].path);
			free(p->ops[i].arg);
		}
	free(p->ops);
	free(p->ld_path);
	memset(p, 0, sizeof(*p));
}

/* Copy base's ops into p without copying their strings (base outlives p). */
static int plan_extend(struct jail_plan *p, const struct jail_plan *base)
{
	for (size_t i = 0; base && i < base->n; i++) {
		if (p->n == p->cap) {
			size_t cap = p->cap ? p->cap * 2 : 128;
			struct op *ops = realloc(p->ops, cap * sizeof(*ops));

			if (!ops)
				return -ENOMEM;
			p->ops = ops;
			p->cap = cap;
		}
		p->ops[p->n] = base->ops[i];
		p->ops[p->n++].owned = 0;
	}
	return 0;
}

/* The op that creates something at path (a directory, file, link or mount), or NULL. */
static const struct op *plan_find(const struct jail_plan *p, const char *path)
{
	for (size_t i = 0; i < p->n; i++)
		if (!strcmp(p->ops[i].path, path))
			return &p->ops[i];
	return NULL;
}

/* 1 when path is below a directory bind of the plan: it is visible already. */
static int plan_covered(const struct jail_plan *p, const char *path)
{
	for (size_t i = 0; i < p->n; i++) {
		const struct op *o = &p->ops[i];
		size_t l = strlen(o->path);

		if (is_bind(o->kind) && o->dir && !strncmp(path, o->path, l) && path[l] == '/')
			return 1;
	}
	return 0;
}

/* Directories of the tmpfs root down to (and including) dir, a canonical
 * path that exists on the host. */
static int plan_dirs(struct jail_plan *p, const char *dir)
{
	char tmp[PATH_MAX];

	if (strlen(dir) >= sizeof(tmp))
		return -ENAMETOOLONG;
	strcpy(tmp, dir);
	for (char *s = tmp + 1;; s++) {
		if (*s == '/' || *s == '\0') {
			char c = *s;
			const struct op *o;
			int r;

			*s = '\0';
			if (tmp[1] && !plan_covered(p, tmp)) {
				o = plan_find(p, tmp);
				if (!o) {
					if ((r = plan_push(p, OP_DIR, 1, tmp, NULL)) < 0)
						return r;
				} else if (!(o->kind == OP_DIR || (is_bind(o->kind) && o->dir))) {
					return -ENOTDIR;
				}
			}
			*s = c;
			if (!c)
				break;
		}
	}
	return 0;
}

/* Make `path` (absolute) resolve inside the jail to the same file as on the
 * host, and bind that file there with `kind`. Follows the host's symbolic
 * links one component at a time, recreating each link in the jail, the way
 * the kernel will resolve the path inside it. */
static int plan_path(struct jail_plan *p, const char *path, enum op_kind kind)
{
	char cur[PATH_MAX] = "", rest[PATH_MAX], next[PATH_MAX], target[PATH_MAX];
	struct stat st;
	int links = 0, r;

	if (path[0] != '/')
		return -EINVAL; /* callers say "needs an absolute path" */
	if (strlen(path) >= sizeof(rest))
		return -ENAMETOOLONG;
	strcpy(rest, path);
	for (;;) {
		char *comp = rest, *slash;

		while (*comp == '/')
			comp++;
		if (!*comp)
			break;
		slash = strchr(comp, '/');
		if (slash)
			*slash++ = '\0';
		if (!strcmp(comp, ".")) {
			memmove(rest, slash ? slash : "", strlen(slash ? slash : "") + 1);
			continue;
		}
		if (!strcmp(comp, "..")) {
			char *last = strrchr(cur, '/');

			if (last)
				*last = '\0';
			memmove(rest, slash ? slash : "", strlen(slash ? slash : "") + 1);
			continue;
		}
		if ((size_t)snprintf(next, sizeof(next), "%s/%s", cur, comp) >= sizeof(next))
			return -ENAMETOOLONG;
		if (lstat(next, &st) < 0)
			return -errno;
		{
			/* What is left after this component. */
			char after[PATH_MAX];

			snprintf(after, sizeof(after), "%s", slash ? slash : "");
			if (S_ISLNK(st.st_mode)) {
				ssize_t n = readlink(next, target, sizeof(target) - 1);

				if (n < 0)
					return -errno;
				target[n] = '\0';
				if (++links > 40)
					return -ELOOP;
				if (!plan_covered(p, next)) {
					const struct op *o = plan_find(p, next);

					if ((r = plan_dirs(p, cur[0] ? cur : "/")) < 0)
						return r;
					if (!o) {
						if ((r = plan_push(p, OP_LINK, 0, next, target)) < 0)
							return r;
					} else if (o->kind != OP_LINK || strcmp(o->arg, target)) {
						return -EEXIST;
					}
				}
				if ((size_t)snprintf(rest, sizeof(rest), "%s/%s", target, after) >= sizeof(rest))
					return -ENAMETOOLONG;
				if (target[0] == '/')
					cur[0] = '\0';
				continue;
			}
			strcpy(cur, next);
			strcpy(rest, after);
			if (after[0] && !S_ISDIR(st.st_mode))
				return -ENOTDIR;
		}
	}
	if (!cur[0])
		return -EINVAL; /* "/" itself */
	if (stat(cur, &st) < 0)
		return -errno;
	if (plan_covered(p, cur))
		return 0;
	{
		const struct op *o = plan_find(p, cur);
		char parent[PATH_MAX];
		int isdir = S_ISDIR(st.st_mode);

		for (size_t i = 0; i < p->n; i++)
			if (is_bind(p->ops[i].kind) && !strcmp(p->ops[i].path, cur))
				return p->ops[i].kind == kind ? 0 : -EEXIST;
		if (kind == OP_BIND_DEV ? !S_ISCHR(st.st_mode) : !(isdir || S_ISREG(st.st_mode)))
			return -EINVAL;
		strcpy(parent, cur);
		*strrchr(parent, '/') = '\0';
		if (parent[0] && (r = plan_dirs(p, parent)) < 0)
			return r;
		if (!o) {
			if ((r = plan_push(p, isdir ? OP_DIR : OP_FILE, isdir, cur, NULL)) < 0)
				return r;
		} else if (o->kind != (isdir ? OP_DIR : OP_FILE)) {
			return -EEXIST;
		}
		return plan_push(p, kind, isdir, cur, cur);
	}
}

/* ---- the seccomp filter ---------------------------------------------------- */

/* QEMU's own -sandbox is a short denylist: it leaves clone() with namespace
 * flags, unshare, setns, execveat, ptrace, bpf, keyctl and the new mount API
 * open. These are the ways out of (or around) the jail and the kernel's
 * largest attack surface for an unprivileged process, so the jail denies them
 * before the exec; QEMU's filter then stacks on top. Built once per process
 * (libseccomp allocates) and only loaded by the child. */
static const int denied[] = {
	SCMP_SYS(unshare), SCMP_SYS(setns), SCMP_SYS(execveat),
	SCMP_SYS(mount), SCMP_SYS(umount2), SCMP_SYS(pivot_root), SCMP_SYS(chroot),
	SCMP_SYS(open_tree), SCMP_SYS(move_mount), SCMP_SYS(fsopen), SCMP_SYS(fsconfig),
	SCMP_SYS(fsmount), SCMP_SYS(fspick), SCMP_SYS(mount_setattr),
	SCMP_SYS(ptrace), SCMP_SYS(process_vm_readv), SCMP_SYS(process_vm_writev),
	SCMP_SYS(bpf), SCMP_SYS(perf_event_open), SCMP_SYS(userfaultfd),
	SCMP_SYS(keyctl), SCMP_SYS(add_key), SCMP_SYS(request_key),
	SCMP_SYS(kexec_load), SCMP_SYS(kexec_file_load), SCMP_SYS(init_module),
	SCMP_SYS(finit_module), SCMP_SYS(delete_module), SCMP_SYS(reboot),
	SCMP_SYS(swapon), SCMP_SYS(swapoff), SCMP_SYS(acct), SCMP_SYS(quotactl),
	SCMP_SYS(syslog), SCMP_SYS(iopl), SCMP_SYS(ioperm), SCMP_SYS(personality),
};

/* io_uring: a large, often-patched kernel surface that also does I/O out of
 * the reach of seccomp's per-syscall view. QEMU falls back to its other
 * event loops when it is missing, so it gets ENOSYS, as on a kernel without. */
static const int denied_enosys[] = {
	SCMP_SYS(io_uring_setup), SCMP_SYS(io_uring_enter), SCMP_SYS(io_uring_register),
};

static int build_filter(struct jail_config *c, struct kiln_err *err)
{
	static const unsigned long ns_flags[] = { CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER,
						  CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP };
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
	int r = 0, mfd = -1;
	off_t len;

	if (!ctx)
		return kiln_err_set(err, "host_error", "jail: seccomp_init failed");
	for (size_t i = 0; i < sizeof(denied) / sizeof(denied[0]) && r == 0; i++)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), denied[i], 0);
	for (size_t i = 0; i < sizeof(denied_enosys) / sizeof(denied_enosys[0]) && r == 0; i++)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), denied_enosys[i], 0);
	/* Threads yes, new namespaces no. clone3 takes its flags in memory, out
	 * of a filter's reach: ENOSYS makes glibc fall back to clone. */
	for (size_t i = 0; i < sizeof(ns_flags) / sizeof(ns_flags[0]) && r == 0; i++)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
				     SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
	if (r == 0)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
	if (r == 0 && (mfd = memfd_create("kiln-seccomp", MFD_CLOEXEC)) < 0)
		r = -errno;
	if (r == 0)
		r = seccomp_export_bpf(ctx, mfd);
	if (r == 0 && ((len = lseek(mfd, 0, SEEK_END)) <= 0 || len % sizeof(struct sock_filter)))
		r = -EINVAL;
	if (r == 0 && !(c->filter = malloc((size_t)len)))
		r = -ENOMEM;
	if (r == 0 && pread(mfd, c->filter, (size_t)len, 0) != len)
		r = -EIO;
	if (r == 0)
		c->filter_len = (unsigned)(len / sizeof(struct sock_filter));
	if (mfd >= 0)
		close(mfd);
	seccomp_release(ctx);
	return r < 0 ? kiln_err_set(err, "host_error", "jail: building the seccomp filter: %s", strerror(-r)) : 0;
}

/* ---- configuration -------------------------------------------------------- */

/* The error for plan_path's r on path. */
static int plan_err(struct kiln_err *err, const char *path, int r)
{
	return kiln_err_set(err, "host_error", "jail: %s: %s", path,
			    path[0] != '/' ? "not an absolute path" : strerror(-r));
}

/* This process's cgroup in the v1 hierarchy that holds controller name. */
static int own_cgroup(const char *name, char *out, size_t cap)
{
	FILE *f = fopen("/proc/self/cgroup", "re");
	char line[1024];
	int r = -ENOENT;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char *ctrls = strchr(line, ':'), *path;

		if (!ctrls)
			continue;
		path = strchr(++ctrls, ':');
		if (!path)
			continue;
		*path++ = '\0';
		path[strcspn(path, "\n")] = '\0';
		for (char *tok = strtok(ctrls, ","); tok; tok = strtok(NULL, ","))
			if (!strcmp(tok, name)) {
				snprintf(out, cap, "%s", strcmp(path, "/") ? path : "");
				r = 0;
			}
		if (!r)
			break;
	}
	fclose(f);
	return r;
}

int jail_config_init(struct jail_config *c, struct kiln_err *err)
{
	char *dirs[3];
	int r;

	memset(c, 0, sizeof(*c));
	c->uid_base = 64000;
	c->slots = 1000;
	snprintf(c->slot_dir, sizeof(c->slot_dir), "/run/kiln/slots");
	dirs[CG_MEMORY] = c->cg_memory;
	dirs[CG_CPU] = c->cg_cpu;
	dirs[CG_PIDS] = c->cg_pids;
	for (int i = 0; i < 3; i++) {
		char own[400], probe[600];

		/* Nest under our own cgroup: a kiln-host run by a service manager
		 * keeps its VMs inside its own limits and accounting. */
		if (own_cgroup(cg_names[i], own, sizeof(own)) < 0)
			return kiln_err_set(err, "host_error", "jail: no cgroup v1 \"%s\" controller in /proc/self/cgroup",
					    cg_names[i]);
		snprintf(probe, sizeof(probe), "/sys/fs/cgroup/%s%s/cgroup.procs", cg_names[i], own);
		if (access(probe, W_OK) < 0)
			return kiln_err_set(err, "host_error", "jail: %s: %s (cgroup v1 \"%s\" hierarchy expected)", probe,
					    strerror(errno), cg_names[i]);
		snprintf(dirs[i], sizeof(c->cg_memory), "/sys/fs/cgroup/%s%s/kiln", cg_names[i], own);
	}
	c->base = calloc(1, sizeof(*c->base));
	if (!c->base)
		return kiln_err_set(err, "host_error", "out of memory");
	if (build_filter(c, err) < 0)
		return -1;
	/* Always there: QEMU and most programs open /dev/null. */
	if ((r = plan_path(c->base, "/dev/null", OP_BIND_DEV)) < 0)
		return kiln_err_set(err, "host_error", "jail: /dev/null: %s", strerror(-r));
	return 0;
}

void jail_config_free(struct jail_config *c)
{
	free(c->filter);
	c->filter = NULL;
	if (c->base) {
		plan_free(c->base);
		free(c->base);
	}
	c->base = NULL;
}

int jail_config_add_ro(struct jail_config *c, const char *path, struct kiln_err *err)
{
	int r = plan_path(c->base, path, OP_BIND_RO);

	return r < 0 ? plan_err(err, path, r) : 0;
}

/* The ELF interpreter (PT_INTERP) of path into out; "" for a static program. */
static int elf_interp(const char *path, char *out, size_t cap)
{
	Elf64_Ehdr eh;
	int fd = open(path, O_RDONLY | O_CLOEXEC), r = -ENOEXEC;

	out[0] = '\0';
	if (fd < 0)
		return -errno;
	if (pread(fd, &eh, sizeof(eh), 0) != sizeof(eh) || memcmp(eh.e_ident, ELFMAG, SELFMAG) ||
	    eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > 256)
		goto out;
	for (unsigned i = 0; i < eh.e_phnum; i++) {
		Elf64_Phdr ph;

		if (pread(fd, &ph, sizeof(ph), (off_t)(eh.e_phoff + i * sizeof(ph))) != sizeof(ph))
			goto out;
		if (ph.p_type != PT_INTERP)
			continue;
		if (ph.p_filesz < 2 || ph.p_filesz > cap || pread(fd, out, ph.p_filesz, (off_t)ph.p_offset) != (ssize_t)ph.p_filesz)
			goto out;
		out[ph.p_filesz - 1] = '\0';
		if (out[0] != '/')
			goto out;
		break;
	}
	r = 0;
out:
	close(fd);
	return r;
}

/* Append dir to the colon-separated list *list unless it is there already. */
static int add_dir(char **list, const char *dir)
{
	size_t l = *list ? strlen(*list) : 0, dl = strlen(dir);
	char *n;

	for (const char *s = *list; s && *s;) {
		const char *e = strchr(s, ':');
		size_t sl = e ? (size_t)(e - s) : strlen(s);

		if (sl == dl && !strncmp(s, dir, dl))
			return 0;
		s = e ? e + 1 : s + sl;
	}
	n = realloc(*list, l + dl + 2);
	if (!n)
		return -ENOMEM;
	if (l)
		n[l++] = ':';
	memcpy(n + l, dir, dl + 1);
	*list = n;
	return 0;
}

int jail_config_add_program(struct jail_config *c, const char *program, struct kiln_err *err)
{
	char interp[PATH_MAX], line[PATH_MAX + 128];
	char *argv[4];
	char *envp[] = { NULL };
	posix_spawn_file_actions_t fa;
	int pipefd[2], r, status;
	pid_t pid;
	FILE *f;

	if ((r = elf_interp(program, interp, sizeof(interp))) < 0)
		return kiln_err_set(err, "host_error", "jail: %s: not an ELF program we can read (%s)", program, strerror(-r));
	if ((r = plan_path(c->base, program, OP_BIND_RO)) < 0)
		return kiln_err_set(err, "host_error", "jail: %s: %s", program, strerror(-r));
	if (!interp[0]) /* static: nothing else to load */
		return 0;
	/* The loader itself says what it would load, so the jail gets exactly
	 * that (its search rules, hwcaps subdirectories, RUNPATHs included). The
	 * environment is empty: no LD_* variable from ours changes the answer. */
	if (pipe2(pipefd, O_CLOEXEC) < 0)
		return kiln_err_set(err, "host_error", "pipe: %s", strerror(errno));
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	argv[0] = interp;
	argv[1] = "--list";
	argv[2] = (char *)program;
	argv[3] = NULL;
	r = posix_spawn(&pid, interp, &fa, NULL, argv, envp);
	posix_spawn_file_actions_destroy(&fa);
	close(pipefd[1]);
	if (r) {
		close(pipefd[0]);
		return kiln_err_set(err, "host_error", "jail: cannot run %s --list: %s", interp, strerror(r));
	}
	f = fdopen(pipefd[0], "r");
	r = 0;
	while (f && fgets(line, sizeof(line), f)) {
		char *arrow = strstr(line, "=> "), *path = arrow ? arrow + 3 : line, *end;

		while (*path == ' ' || *path == '\t')
			path++;
		if (strstr(line, "not found")) {
			line[strcspn(line, "\n")] = '\0';
			kiln_err_set(err, "host_error", "jail: %s needs a library the loader cannot find: %s", program, line);
			r = -1;
			continue;
		}
		if (path[0] != '/') /* linux-vdso.so.1 and the like */
			continue;
		end = strstr(path, " (");
		if (end)
			*end = '\0';
		path[strcspn(path, "\n")] = '\0';
		if (r == 0 && (r = plan_path(c->base, path, OP_BIND_RO)) < 0) {
			kiln_err_set(err, "host_error", "jail: %s: %s", path, strerror(-r));
			r = -1;
		}
		if (r == 0) {
			char *slash = strrchr(path, '/');

			*slash = '\0';
			if (add_dir(&c->base->ld_path, slash == path ? "/" : path) < 0)
				r = kiln_err_set(err, "host_error", "out of memory");
		}
	}
	if (f)
		fclose(f);
	else
		close(pipefd[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (r == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
		return kiln_err_set(err, "host_error", "jail: %s --list %s failed", interp, program);
	if (r == 0 && (r = plan_path(c->base, interp, OP_BIND_RO)) < 0)
		return kiln_err_set(err, "host_error", "jail: %s: %s", interp, strerror(-r));
	return r;
}

int jail_sealed_memfd(const char *path, struct stat *st, struct kiln_err *err)
{
	int in = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW), fd = -1;
	off_t pos = 0;

	if (in < 0) {
		kiln_err_set(err, "host_error", "%s: %s", path, strerror(errno));
		return -1;
	}
	if (fstat(in, st) < 0 || !S_ISREG(st->st_mode)) {
		kiln_err_set(err, "host_error", "%s: not a regular file", path);
		goto fail;
	}
	/* MFD_NOEXEC_SEAL (Linux 6.3+) where the kernel has it. */
	fd = memfd_create("kiln-snapshot-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING | 0x0008U);
	if (fd < 0 && errno == EINVAL)
		fd = memfd_create("kiln-snapshot-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, st->st_size) < 0) {
		kiln_err_set(err, "host_error", "memfd for %s: %s", path, strerror(errno));
		goto fail;
	}
	/* Every page is allocated here, holes too (zeroed), and so charged to
	 * the caller: a hole left in a shmem file would get a page allocated on
	 * a clone's first touch, charged to that clone's memory cgroup on top of
	 * its own copy-on-write page, and left in the memfd after it. Then only
	 * the data is copied (guest RAM never touched is a hole in the file). */
	if (fallocate(fd, 0, 0, st->st_size) < 0) {
		kiln_err_set(err, "host_error", "memfd for %s: %s", path, strerror(errno));
		goto fail;
	}
	for (;;) {
		off_t data = lseek(in, pos, SEEK_DATA), hole;

		if (data < 0)
			break; /* ENXIO: no data after pos */
		hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0)
			hole = st->st_size;
		for (off_t off = data; off < hole;) {
			off_t src = off;
			ssize_t n;

			if (lseek(fd, off, SEEK_SET) < 0 || (n = sendfile(fd, in, &src, (size_t)(hole - off))) <= 0) {
				kiln_err_set(err, "host_error", "loading %s: %s", path, n == 0 ? "short read" : strerror(errno));
				goto fail;
			}
			off += n;
		}
		pos = hole;
	}
	/* From here nobody can change the contents, size or seals: write(),
	 * ftruncate, hole punching and shared writable mappings all fail with
	 * EPERM, whoever opens it (also through /proc/PID/fd). Private mappings
	 * stay writable: each clone's writes are copy-on-write in its own memory. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
		kiln_err_set(err, "host_error", "sealing the memfd for %s: %s", path, strerror(errno));
		goto fail;
	}
	close(in);
	return fd;
fail:
	if (fd >= 0)
		close(fd);
	close(in);
	return -1;
}

/* ---- cgroups -------------------------------------------------------------- */

static int write_str(const char *dir, const char *file, const char *val)
{
	char path[700];
	int fd, r = 0;
	size_t len = strlen(val);

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (write(fd, val, len) != (ssize_t)len)
		r = -errno;
	close(fd);
	return r;
}

static long long read_ll(const char *dir, const char *file)
{
	char path[700], buf[64];
	int fd;
	ssize_t n;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	return strtoll(buf, NULL, 10);
}

/* 1 when the comma-separated list has the token. */
static int has_token(const char *list, const char *tok)
{
	size_t tl = strlen(tok);

	for (const char *s = list; *s;) {
		size_t l = strcspn(s, ",");

		if (l == tl && !strncmp(s, tok, tl))
			return 1;
		s += l + (s[l] == ',');
	}
	return 0;
}

/* 1 when /proc/<pid>/cgroup places pid in cgroup rel of controller ctrl. */
static int pid_in_cgroup(pid_t pid, const char *ctrl, const char *rel)
{
	char path[64], line[1024];
	FILE *f;
	int in = 0;

	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		char *c = strchr(line, ':'), *p;

		if (!c || !(p = strchr(c + 1, ':')))
			continue;
		*p++ = '\0';
		p[strcspn(p, "\n")] = '\0';
		if (has_token(c + 1, ctrl) && !strcmp(p, rel))
			in = 1;
	}
	fclose(f);
	return in;
}

/* Kill every process in the cgroup at dir (it belongs to one jail only). */
static int cg_kill_all(const char *dir, const char *ctrl)
{
	char path[700], prefix[64];
	const char *rel;
	FILE *f;
	int pid, n = 0;

	/* dir is /sys/fs/cgroup/<ctrl>/<rel>: /proc/<pid>/cgroup shows /<rel>. */
	snprintf(prefix, sizeof(prefix), "/sys/fs/cgroup/%s/", ctrl);
	if (strncmp(dir, prefix, strlen(prefix)))
		return 0;
	rel = dir + strlen(prefix) - 1;
	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fscanf(f, "%d", &pid) == 1) {
		int pfd = (int)syscall(SYS_pidfd_open, pid, 0);

		/* The pidfd pins the process; check it is still the one in the cgroup. */
		if (pfd >= 0 && pid_in_cgroup(pid, ctrl, rel)) {
			syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0);
			n++;
		}
		if (pfd >= 0)
			close(pfd);
	}
	fclose(f);
	return n;
}

/* Remove one jail cgroup: rmdir, killing stragglers first if it is busy. */
static int cg_remove(const char *dir, const char *ctrl)
{
	for (int i = 0; i < 400; i++) {
		struct timespec ts = { 0, 5 * 1000 * 1000 };

		if (rmdir(dir) == 0 || errno == ENOENT)
			return 0;
		if (errno != EBUSY)
			return -errno;
		/* A just-reaped process may still be leaving its cgroup: only kill
		 * what is really listed, and give exits a moment. */
		cg_kill_all(dir, ctrl);
		nanosleep(&ts, NULL);
	}
	return -EBUSY;
}

/* Remove the "kiln" parent when it is empty (another jail may use it: fine). */
static void cg_remove_parent(const char *dir)
{
	char parent[600];
	char *slash;

	snprintf(parent, sizeof(parent), "%s", dir);
	slash = strrchr(parent, '/');
	if (slash) {
		*slash = '\0';
		rmdir(parent);
	}
}

static int cg_create(const struct jail_config *c, const struct jail_spec *spec, struct jail *j, int procs_fd[3],
		     struct kiln_err *err)
{
	const char *base[3] = { c->cg_memory, c->cg_cpu, c->cg_pids };
	char val[64];
	long long period;
	int r;

	for (int i = 0; i < 3; i++) {
		snprintf(j->cg[i], sizeof(j->cg[i]), "%s/%s", base[i], spec->name);
		for (int tries = 0;; tries++) {
			if (mkdir(base[i], 0755) < 0 && errno != EEXIST)
				return kiln_err_set(err, "host_error", "jail: mkdir %s: %s", base[i], strerror(errno));
			if (mkdir(j->cg[i], 0755) == 0)
				break;
			r = errno;
			if (tries > 5 || (r != ENOENT && r != EEXIST))
				return kiln_err_set(err, "host_error", "jail: mkdir %s: %s", j->cg[i], strerror(r));
			/* ENOENT: a releasing jail removed the empty parent; EEXIST:
			 * names are unique among live jails, so this one is stale. */
			if (r == EEXIST)
				cg_remove(j->cg[i], cg_names[i]);
		}
	}
	snprintf(val, sizeof(val), "%llu", (unsigned long long)spec->memory_bytes);
	if (spec->memory_bytes && (r = write_str(j->cg[CG_MEMORY], "memory.limit_in_bytes", val)) < 0)
		return kiln_err_set(err, "host_error", "jail: %s/memory.limit_in_bytes: %s", j->cg[CG_MEMORY], strerror(-r));
	/* With swap accounting, memory+swap gets the same limit: no swapping past it. */
	if (spec->memory_bytes)
		write_str(j->cg[CG_MEMORY], "memory.memsw.limit_in_bytes", val);
	period = read_ll(j->cg[CG_CPU], "cpu.cfs_period_us");
	if (spec->cpus) {
		snprintf(val, sizeof(val), "%lld", (period > 0 ? period : 100000) * spec->cpus);
		if ((r = write_str(j->cg[CG_CPU], "cpu.cfs_quota_us", val)) < 0)
			return kiln_err_set(err, "host_error", "jail: %s/cpu.cfs_quota_us: %s", j->cg[CG_CPU], strerror(-r));
	}
	if (spec->pids) {
		snprintf(val, sizeof(val), "%u", spec->pids);
		if ((r = write_str(j->cg[CG_PIDS], "pids.max", val)) < 0)
			return kiln_err_set(err, "host_error", "jail: %s/pids.max: %s", j->cg[CG_PIDS], strerror(-r));
	}
	for (int i = 0; i < 3; i++) {
		char path[700];

		snprintf(path, sizeof(path), "%s/cgroup.procs", j->cg[i]);
		procs_fd[i] = open(path, O_WRONLY | O_CLOEXEC);
		if (procs_fd[i] < 0)
			return kiln_err_set(err, "host_error", "jail: %s: %s", path, strerror(errno));
	}
	return 0;
}

/* ---- slots ---------------------------------------------------------------- */

/* 1 when the cgroup directory still holds processes. */
static int cg_populated(const char *dir)
{
	char path[700], buf[16];
	int fd;
	ssize_t n;

	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf));
	close(fd);
	return n > 0;
}

/* Take a free slot: its lock file is flocked for the jail's lifetime (the
 * kernel drops the lock when the owner dies, whatever kills it). The file
 * names its holder's memory cgroup: a slot whose previous jail still has
 * processes (its owner was killed a moment ago and the jail is still dying)
 * is skipped, so two live jails never share a uid. */
static int slot_take(const struct jail_config *c, struct jail *j, const char *memcg, struct kiln_err *err)
{
	unsigned start;
	int r;

	if ((r = fs_mkdir_p(c->slot_dir, 0700)) < 0)
		return kiln_err_set(err, "host_error", "jail: cannot create %s: %s", c->slot_dir, strerror(-r));
	/* A random start spreads concurrent hosts over the range. */
	if (getrandom(&start, sizeof(start), 0) != sizeof(start))
		start = (unsigned)getpid();
	for (unsigned i = 0; i < c->slots; i++) {
		unsigned n = (start + i) % c->slots;
		char path[400], prev[700];
		ssize_t len;
		int fd;

		snprintf(path, sizeof(path), "%s/%u.lock", c->slot_dir, n);
		fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0)
			return kiln_err_set(err, "host_error", "jail: %s: %s", path, strerror(errno));
		if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
			close(fd);
			continue;
		}
		len = pread(fd, prev, sizeof(prev) - 1, 0);
		prev[len > 0 ? len : 0] = '\0';
		prev[strcspn(prev, "\n")] = '\0';
		if (prev[0] == '/' && cg_populated(prev)) {
			close(fd);
			continue;
		}
		if (ftruncate(fd, 0) < 0 || pwrite(fd, memcg, strlen(memcg), 0) < 0) {
			r = errno;
			close(fd);
			return kiln_err_set(err, "host_error", "jail: %s: %s", path, strerror(r));
		}
		j->slot = (int)n;
		j->slot_fd = fd;
		j->uid = c->uid_base + n;
		j->gid = c->uid_base + n;
		return 0;
	}
	return kiln_err_set(err, "no_capacity", "jail: all %u slots in %s are in use", c->slots, c->slot_dir);
}

/* ---- the child ------------------------------------------------------------ */

struct child {
	const struct jail_plan *plan;
	const struct jail_spec *spec;
	const char *root;
	char *const *argv;
	char *const *envp;
	int procs_fd[3];
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

	/* Join the cgroups first: everything below is charged to the jail. Then
	 * a cgroup namespace rooted there: /proc/self/cgroup shows "/", not the
	 * host's layout. */
	for (int i = 0; i < 3; i++)
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

static int jail_record(const struct jail *j, const char *path);

static int chown_path(const char *path, uid_t uid, gid_t gid, struct kiln_err *err)
{
	if (fchownat(AT_FDCWD, path, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
		return kiln_err_set(err, "host_error", "jail: chown %s: %s", path, strerror(errno));
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
	pid_t pid = -1;
	ssize_t n;
	int r;

	memset(j, 0, sizeof(*j));
	j->slot_fd = -1;
	*pidfd = -1;
	if (!spec->name || !spec->name[0] || strchr(spec->name, '/') || spec->name[0] == '.' || !spec->root || !spec->exe)
		return kiln_err_set(err, "host_error", "jail: name, root and exe are required");
	j->active = 1;
	{
		char memcg[700];

		snprintf(memcg, sizeof(memcg), "%s/%s", c->cg_memory, spec->name);
		if (slot_take(c, j, memcg, err) < 0)
			goto fail;
	}
	for (int i = 0; i < 3; i++)
		snprintf(j->cg[i], sizeof(j->cg[i]), "%s/%s", i == CG_MEMORY ? c->cg_memory : i == CG_CPU ? c->cg_cpu : c->cg_pids,
			 spec->name);
	if (spec->record && (r = jail_record(j, spec->record)) < 0) {
		kiln_err_set(err, "host_error", "jail: %s: %s", spec->record, strerror(-r));
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

	/* The layout: everything every jail sees, then this jail's own paths. */
	if (plan_extend(&plan, c->base) < 0)
		goto oom;
	for (int i = 0; i < JAIL_MAX_PATHS && spec->rw[i]; i++)
		if ((r = plan_path(&plan, spec->rw[i], OP_BIND_RW)) < 0) {
			plan_err(err, spec->rw[i], r);
			goto fail;
		}
	if (spec->work && (r = plan_path(&plan, spec->work, OP_BIND_RW)) < 0) {
		plan_err(err, spec->work, r);
		goto fail;
	}
	for (int i = 0; i < JAIL_MAX_PATHS && spec->ro[i]; i++)
		if ((r = plan_path(&plan, spec->ro[i], OP_BIND_RO)) < 0) {
			plan_err(err, spec->ro[i], r);
			goto fail;
		}
	for (int i = 0; i < 4 && spec->dev[i]; i++)
		if ((r = plan_path(&plan, spec->dev[i], OP_BIND_DEV)) < 0) {
			plan_err(err, spec->dev[i], r);
			goto fail;
		}
	if (spec->proc && (plan_dirs(&plan, "/proc") < 0 || plan_push(&plan, OP_PROC, 1, "/proc", NULL) < 0))
		goto oom;

	/* The environment: the caller's, plus where the libraries are (the jail
	 * has no /etc/ld.so.cache). */
	while (spec->envp && spec->envp[nenv])
		nenv++;
	envp = calloc(nenv + 2, sizeof(*envp));
	if (!envp)
		goto oom;
	memcpy(envp, spec->envp, nenv * sizeof(*envp));
	if (c->base->ld_path) {
		if (asprintf(&ldenv, "LD_LIBRARY_PATH=%s", c->base->ld_path) < 0) {
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
		kiln_err_set(err, "host_error", "pipe: %s", strerror(errno));
		goto fail;
	}
	a.status_fd = status[1];
	a.parent_pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
	if (a.parent_pidfd < 0) {
		kiln_err_set(err, "host_error", "pidfd_open: %s", strerror(errno));
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
		kiln_err_set(err, "host_error", "jail: clone: %s", strerror(errno));
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
		kiln_err_set(err, "host_error", "jail: %s: %s", st.what, strerror(st.err));
		goto fail;
	}
	*pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (*pidfd < 0) {
		kiln_err_set(err, "host_error", "pidfd_open: %s", strerror(errno));
		goto fail;
	}
	goto out;
oom:
	kiln_err_set(err, "host_error", "out of memory");
fail:
	if (pid > 0) {
		kill(pid, SIGKILL);
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		pid = -1;
	}
	jail_release(j);
	pid = -1;
out:
	for (int i = 0; i < 3; i++)
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
	for (int i = 0; i < 3; i++) {
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

static int jail_record(const struct jail *j, const char *path)
{
	FILE *f = fopen(path, "we");
	int r = 0;

	if (!f)
		return -errno;
	fprintf(f, "slot %d\n", j->slot);
	for (int i = 0; i < 3; i++)
		if (j->cg[i][0])
			fprintf(f, "cgroup %s %s\n", cg_names[i], j->cg[i]);
	if (fflush(f) != 0)
		r = -errno;
	if (fclose(f) != 0 && !r)
		r = -errno;
	return r;
}

int jail_reap(const char *record_path)
{
	FILE *f = fopen(record_path, "re");
	char line[800];
	int r = 0;

	if (!f)
		return errno == ENOENT ? 0 : -errno;
	while (fgets(line, sizeof(line), f)) {
		char ctrl[16], dir[700];

		if (sscanf(line, "cgroup %15s %699s", ctrl, dir) != 2)
			continue;
		/* Written by kiln-host into its own directory, but checked anyway:
		 * only a directory in a cgroup v1 hierarchy is removed. */
		if (strncmp(dir, "/sys/fs/cgroup/", 15) || strstr(dir, "/../") || strstr(dir, "/./"))
			continue;
		if (cg_remove(dir, ctrl) < 0)
			r = -EBUSY;
		else
			cg_remove_parent(dir);
	}
	fclose(f);
	return r;
}
