/* jail_int: what the pieces of the jail share and nothing outside jail/
 * (and its unit tests) may use. jail.h is the public interface.
 *
 *   plan.c     the mount-point layout every jail replays (struct jail_plan)
 *   jail_config.c jail_config_*: programs and their libraries into the base plan
 *   seccomp.c  the seccomp filter loaded before the exec
 *   cgroup.c   cgroup v1 directories: find, create with limits, kill, remove;
 *              the crash record and jail_reap
 *   slot.c     slot locks: one uid/gid per live jail
 *   spawn.c    jail_spawn (clone, namespaces, mounts, credentials, exec) and
 *              jail_release
 *   memfd.c    jail_sealed_memfd */
#ifndef KILN_JAIL_PRIV_H
#define KILN_JAIL_PRIV_H

#include <errno.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/wait.h>

#include "buf.h"
#include "jail.h"

/* ---- plan.c --------------------------------------------------------------- */

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

/* The ops in order: the child creates and mounts them in that order. */
struct jail_plan {
	struct op *ops;
	size_t n, cap;
	struct buf ld_path; /* directories of the resolved libraries, for LD_LIBRARY_PATH ("" when none) */
};

/* Free what p owns (strings of ops it copied from a base stay); p is then
 * empty. NULL is fine. */
void plan_free(struct jail_plan *p);

/* Make `path` (absolute) resolve inside the jail to the same file as on the
 * host, and bind it there with kind (OP_BIND_*). Returns 0 (also when it is
 * visible already), or -EINVAL (relative, "/", wrong file type for kind),
 * -EEXIST (conflicts with an earlier op), -ENOTDIR, -ELOOP, -ENAMETOOLONG,
 * -ENOMEM or the host's lstat/readlink error. Reads the host file system. */
int plan_path(struct jail_plan *p, const char *path, enum op_kind kind);

/* The error for plan_path's r on path; returns -1. */
int plan_err(struct kiln_err *err, const char *path, int r);

/* One jail's plan: base's ops (sharing their strings: base must outlive p),
 * then spec's rw, work, ro and dev paths and /proc. Returns 0 or -1 with
 * err set; p may then hold part of the plan (plan_free it either way). */
int plan_build(struct jail_plan *p, const struct jail_plan *base, const struct jail_spec *spec,
	       struct kiln_err *err);

/* ---- jail_config.c ------------------------------------------------------------- */

/* The ELF interpreter (PT_INTERP) of path into out; "" for a static program.
 * 0, -ENOEXEC (not a 64-bit ELF we can read) or -errno from open. */
int config_elf_interp(const char *path, char *out, size_t cap);

/* Append dir to the colon-separated list in b unless it is there already.
 * 0 or -ENOMEM. */
int config_dir_list_add(struct buf *b, const char *dir);

/* ---- seccomp.c ------------------------------------------------------------ */

/* Build the jail's seccomp filter as classic BPF: *out (malloc'd, the
 * caller frees) with *len instructions. 0 or -errno. Any thread. */
int seccomp_filter_build(struct sock_filter **out, unsigned *len);

/* ---- cgroup.c ------------------------------------------------------------- */

#define CG_MEMORY 0
#define CG_CPU    1
#define CG_PIDS   2
#define CG_N      3
extern const char *const cg_names[CG_N];

/* c's directory for controller i (CG_*): jails are created in it. */
static inline const char *cg_base(const struct jail_config *c, int i)
{
	return i == CG_MEMORY ? c->cg_memory : i == CG_CPU ? c->cg_cpu : c->cg_pids;
}

/* One value to write into a jail's cgroup. */
struct cg_value {
	int ctrl;          /* CG_* */
	const char *file;  /* e.g. "memory.limit_in_bytes" */
	char val[32];
	int optional;      /* a failed write is ignored (memsw without swap accounting) */
};

/* In the text of a /proc/PID/cgroup file, the path of the v1 hierarchy
 * holding controller ctrl into out ("/" as is). 0, -ENOENT or
 * -ENAMETOOLONG. */
int cg_parse_proc(const char *text, const char *ctrl, char *out, size_t cap);

/* base + "/" + name into out: 0 or -ENAMETOOLONG (out then holds ""). */
int cg_path(char *out, size_t cap, const char *base, const char *name);

/* The values spec asks for, in the order they are written; cpu_period is
 * cpu.cfs_period_us (<= 0: unknown, 100000 assumed). Returns how many (at
 * most 4) are in v. */
int cg_values(const struct jail_spec *spec, long long cpu_period, struct cg_value v[4]);

/* Fill c->cg_memory/cg_cpu/cg_pids: <mount>/<our own cgroup>/kiln. */
int cg_config_init(struct jail_config *c, struct kiln_err *err);

/* Create j->cg[] (already named, below c's directories), apply spec's
 * limits, and open each one's cgroup.procs for writing into procs_fd
 * (close-on-exec). 0 or -1 with err set; what was created is left for
 * jail_release. */
int cg_create(const struct jail_config *c, const struct jail_spec *spec, struct jail *j, int procs_fd[CG_N],
	      struct kiln_err *err);

/* Remove one jail cgroup, killing what is still in it. 0 or -errno. */
int cg_remove(const char *dir, const char *ctrl);

/* Remove the "kiln" parent of dir when it is empty. */
void cg_remove_parent(const char *dir);

/* 1 when the cgroup directory still holds processes. */
int cg_populated(const char *dir);

/* Write j's record (slot and cgroups) to path for jail_reap. 0 or -errno. */
int cg_record_write(const struct jail *j, const char *path);

/* ---- slot.c --------------------------------------------------------------- */

/* Take a free slot for a jail whose memory cgroup will be memcg: sets
 * j->slot, slot_fd, uid and gid. 0 or -1 with err set ("no_capacity" when
 * every slot is busy). Closing j->slot_fd frees it. */
int slot_take(const struct jail_config *c, struct jail *j, const char *memcg, struct kiln_err *err);

/* ---- shared helpers --------------------------------------------------------- */

/* Reap pid, retrying on EINTR; *status may be NULL. */
static inline void jail_waitpid(pid_t pid, int *status)
{
	while (waitpid(pid, status, 0) < 0 && errno == EINTR)
		;
}

#endif
