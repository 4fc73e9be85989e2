/* jail: run one program (QEMU) confined. New mount, PID, IPC, UTS, network and
 * cgroup namespaces; a read-only tmpfs root holding only the files it needs
 * (bound read-only at their host paths) plus its own work directory; cgroup v1
 * limits (memory, CPU, pids); rlimits; a per-slot unprivileged uid/gid; no
 * capabilities and no_new_privs. kiln-host calls it in-process from vm.c;
 * kiln-jail (jail/main.c) is a thin command-line launcher over the same code. */
#ifndef KILN_JAIL_H
#define KILN_JAIL_H

#include <stdint.h>
#include <sys/types.h>

#include "err.h"

#define JAIL_MAX_PATHS 16
#define JAIL_MAX_FDS   8

struct jail_plan; /* mount-point layout; private to jail/ (jail_int.h) */
struct sock_filter;

/* Host-wide settings, shared by every jail a process starts. Fill with
 * jail_config_init, add the programs and read-only paths every jail needs,
 * then treat as read-only (any thread may use it). */
struct jail_config {
	unsigned uid_base;         /* slot n runs as uid and gid uid_base + n (64000) */
	unsigned slots;            /* slots 0 .. slots-1 (1000) */
	char slot_dir[256];        /* <slot_dir>/<n>.lock, flocked while slot n is used (/run/kiln/slots) */
	/* Cgroup v1 directories that jails are created in, one per controller:
	 * <mount>/<this process's own cgroup>/kiln (jail_config_init finds them). */
	char cg_memory[512], cg_cpu[512], cg_pids[512];
	/* memory.limit_in_bytes of cg_memory itself, the parent of every jail's
	 * memory cgroup (0: none): when the jails together reach it, the kernel
	 * OOM-kills inside that subtree, never the owner or other processes. */
	uint64_t memory_budget_bytes;
	struct jail_plan *base;    /* what every jail sees (programs, libraries, firmware) */
	struct sock_filter *filter;/* seccomp filter loaded before the exec (see seccomp.c) */
	unsigned filter_len;
};

/* Per-jail request. Paths are absolute host paths; inside the jail every one
 * of them appears at the same path (symbolic links on the way are recreated),
 * so command lines and qcow2 backing-file names need no rewriting. */
struct jail_spec {
	const char *name;          /* unique among live jails: cgroup directory name, hostname */
	const char *root;          /* an empty directory: the jail's root tmpfs is mounted on it */
	const char *work;          /* a directory bound read-write, owned by the slot uid (NULL: none) */
	const char *exe;           /* the program (it and its libraries must be in the config's base) */
	const char *record;        /* written before any cgroup exists: what jail_reap removes
				    * after a crash of the owner (NULL: not written) */
	const char *ro[JAIL_MAX_PATHS];  /* more files or directories bound read-only (NULL-terminated) */
	const char *rw[JAIL_MAX_PATHS];  /* files bound read-write and chowned to the slot uid */
	const char *dev[4];        /* device nodes bound at the same path (/dev/null is always there) */
	int proc;                  /* mount /proc with subset=pid: only the jail's own processes */
	int keep_fds[JAIL_MAX_FDS];/* keep_fds[i] is fd 3 + i in the program; every other fd is closed */
	int nkeep;
	int stdout_fd, stderr_fd;  /* -1: /dev/null; stdin is always /dev/null */
	uint64_t memory_bytes;     /* memory.limit_in_bytes (and memsw when present) */
	int oom_score_adj;         /* written to /proc/self/oom_score_adj first (0: left as is) */
	unsigned cpus;             /* cpu.cfs_quota_us = cpus * cpu.cfs_period_us */
	unsigned pids;             /* pids.max and RLIMIT_NPROC (the uid is the slot's own) */
	unsigned nofile;           /* RLIMIT_NOFILE */
	uint64_t fsize_bytes;      /* RLIMIT_FSIZE: the largest file the program may write */
	unsigned extra_gid;        /* one supplementary group (e.g. /dev/kvm's), 0: none */
	char *const *envp;         /* the program's whole environment */
};

/* What a started jail holds until jail_release. All zero: holds nothing. */
struct jail {
	int active;
	int slot;
	int slot_fd;               /* flock on <slot_dir>/<slot>.lock */
	uid_t uid;
	gid_t gid;
	char cg[3][600];           /* memory, cpu, pids cgroup directories ("" once removed) */
};

/* Defaults, and the cgroup directories of this process. Returns 0, or -1
 * with err set (no cgroup v1 memory/cpu/pids hierarchy, ...). */
int jail_config_init(struct jail_config *c, struct kiln_err *err);

/* Make `program` available in every jail: the file itself, its ELF
 * interpreter and the shared libraries the dynamic loader resolves for it
 * (asked once, here: `<interpreter> --list program`). Also for shared objects
 * the program dlopens (e.g. a QEMU accelerator module). */
int jail_config_add_program(struct jail_config *c, const char *program, struct kiln_err *err);

/* Make a file or directory available read-only in every jail. */
int jail_config_add_ro(struct jail_config *c, const char *path, struct kiln_err *err);

void jail_config_free(struct jail_config *c);

/* Load the regular file at path into a new memfd and seal it (write, grow,
 * shrink, seal): a program given the fd can map it privately, copy-on-write,
 * but cannot change it. *st describes the file that was read. Returns the fd
 * (close-on-exec) or -1 with err set. */
struct stat;
int jail_sealed_memfd(const char *path, struct stat *st, struct kiln_err *err);

/* Start spec->exe with argv in a new jail: take a free slot, create its
 * cgroups, clone into new namespaces and exec. Returns the program's pid (in
 * this process's PID namespace: it is the jail's init, and killing it ends
 * every process in the jail) and a pidfd in *pidfd; or -1 with err set, in
 * which case nothing is left held. The child gets PR_SET_PDEATHSIG(SIGKILL)
 * for the calling thread. The caller reaps the pid, then calls jail_release.
 * Thread-safe for distinct j. */
pid_t jail_spawn(const struct jail_config *c, const struct jail_spec *spec, char *const argv[], struct jail *j,
		 int *pidfd, struct kiln_err *err);

/* How many of the jail's processes the kernel's OOM killer ended (the
 * memory cgroup's memory.oom_control "oom_kill"), whether its own limit or
 * the config's memory budget ran out: 0 or more, or -errno. Call before
 * jail_release. */
int jail_oom_kills(const struct jail *j);

/* The jail's CPU weight against other jails (cgroup v1 cpu.shares, 2 to
 * 262144; the kernel's default is 1024). Every jail is a cgroup of its own,
 * so the nice value of its processes only orders them among themselves:
 * this is what makes one jail yield to another under contention. 0, or
 * -errno (-ENOENT: no cpu cgroup). */
int jail_set_cpu_shares(const struct jail *j, unsigned shares);

/* After the jail's init was reaped: remove its cgroups (killing anything
 * still in them) and free its slot. Safe on a zeroed jail; idempotent. */
void jail_release(struct jail *j);

/* Remove what a jail's record (spec->record) names: kill whatever is still
 * in its cgroups and remove them. Returns 0 when nothing is left, -errno
 * otherwise. */
int jail_reap(const char *record_path);


#endif
