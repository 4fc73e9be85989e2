/* Unit tests for the parts of the jail that need no root: the sealed memfd a
 * snapshot's RAM is handed to clones in, removing a directory an untrusted
 * program wrote without following its links, the layout plan (links, binds,
 * conflicts), cgroup names, values and /proc/PID/cgroup parsing, the crash
 * record, slot locks, the library list, and the seccomp filter loaded into a
 * forked child. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/filter.h>
#include <linux/seccomp.h>

#include <cmocka.h>

#include "fsutil.h"
#include "jail.h"
#include "jail_int.h"

static char dir[64];

static int dir_setup(void **state)
{
	char real[PATH_MAX];

	snprintf(dir, sizeof(dir), "/tmp/kiln-unit-jail.XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	/* The plan works on canonical paths: the test's own must be one. */
	if (!realpath(dir, real) || strlen(real) >= sizeof(dir))
		return -1;
	strcpy(dir, real);
	return 0;
}

static int dir_teardown(void **state)
{
	return fs_rmtree(dir);
}

/* A sparse file: 64 KiB of data at 1 MiB, holes elsewhere, 4 MiB long. */
static void make_sparse(const char *path)
{
	unsigned char data[65536];
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	assert_true(fd >= 0);
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (unsigned char)(i * 7 + 1);
	assert_int_equal(ftruncate(fd, 4 << 20), 0);
	assert_int_equal(pwrite(fd, data, sizeof(data), 1 << 20), (ssize_t)sizeof(data));
	close(fd);
}

static void memfd_same_contents_and_sealed(void **state)
{
	char path[128];
	struct stat st;
	struct kiln_err err = { .code = "" };
	unsigned char a[4096], b[4096], *p;
	int fd, in;

	snprintf(path, sizeof(path), "%s/mem", dir);
	make_sparse(path);
	fd = jail_sealed_memfd(path, &st, &err);
	assert_true(fd >= 0);
	assert_int_equal(st.st_size, 4 << 20);
	in = open(path, O_RDONLY);
	for (off_t off = 0; off < (4 << 20); off += sizeof(a)) {
		assert_int_equal(pread(in, a, sizeof(a), off), (ssize_t)sizeof(a));
		assert_int_equal(pread(fd, b, sizeof(b), off), (ssize_t)sizeof(b));
		assert_memory_equal(a, b, sizeof(a));
	}
	close(in);
	assert_int_equal(fcntl(fd, F_GET_SEALS) & 0xf, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);
	/* Nobody changes it: not by write, truncation, hole punching or a shared mapping. */
	assert_int_equal(pwrite(fd, "x", 1, 0), -1);
	assert_int_equal(errno, EPERM);
	assert_int_equal(ftruncate(fd, 0), -1);
	assert_int_equal(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1 << 20, 4096), -1);
	assert_true(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, 0), -1);
	/* A private mapping is writable, and its writes stay private. */
	p = mmap(NULL, 4 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	assert_true(p != MAP_FAILED);
	p[(1 << 20) + 5] ^= 0xff;
	p[3 << 20] = 0x42;
	assert_int_equal(pread(fd, b, 1, (1 << 20) + 5), 1);
	assert_int_equal(b[0], (unsigned char)(5 * 7 + 1));
	assert_int_equal(pread(fd, b, 1, 3 << 20), 1);
	assert_int_equal(b[0], 0);
	munmap(p, 4 << 20);
	/* Close-on-exec: only the jail passes it on, on purpose. */
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	close(fd);
}

static void memfd_refuses_non_regular(void **state)
{
	struct stat st;
	struct kiln_err err = { .code = "" };
	char path[128];

	assert_int_equal(jail_sealed_memfd(dir, &st, &err), -1);
	assert_non_null(strstr(err.message, "not a regular file"));
	snprintf(path, sizeof(path), "%s/missing", dir);
	assert_int_equal(jail_sealed_memfd(path, &st, &err), -1);
	/* A symbolic link is not followed (the path is the caller's own). */
	snprintf(path, sizeof(path), "%s/link", dir);
	assert_int_equal(symlink("/etc/hostname", path), 0);
	assert_int_equal(jail_sealed_memfd(path, &st, &err), -1);
}

static void rmtree_does_not_follow_links(void **state)
{
	char victim[128], tree[128], p[256];
	int fd;

	snprintf(victim, sizeof(victim), "%s/victim", dir);
	assert_int_equal(mkdir(victim, 0700), 0);
	snprintf(p, sizeof(p), "%s/keep", victim);
	fd = open(p, O_WRONLY | O_CREAT, 0600);
	assert_true(fd >= 0);
	close(fd);
	/* What an untrusted program could leave in its directory. */
	snprintf(tree, sizeof(tree), "%s/work", dir);
	assert_int_equal(mkdir(tree, 0700), 0);
	snprintf(p, sizeof(p), "%s/a", tree);
	assert_int_equal(mkdir(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/a/to-victim", tree);
	assert_int_equal(symlink(victim, p), 0);
	snprintf(p, sizeof(p), "%s/to-keep", tree);
	snprintf(victim + strlen(victim), sizeof(victim) - strlen(victim), "/keep");
	assert_int_equal(symlink(victim, p), 0);
	snprintf(p, sizeof(p), "%s/fifo", tree);
	assert_int_equal(mkfifo(p, 0600), 0);
	assert_int_equal(fs_rmtree(tree), 0);
	assert_int_equal(access(tree, F_OK), -1);
	assert_int_equal(access(victim, F_OK), 0); /* .../victim/keep is still there */
	assert_int_equal(fs_rmtree(tree), 0);    /* gone already: fine */
}

/* ---- helpers for the tests below ------------------------------------------ */

/* dir + "/" + rel into a static buffer (one of four, rotating). */
static const char *at(const char *rel)
{
	static char bufs[4][PATH_MAX];
	static int next;
	char *b = bufs[next++ % 4];

	snprintf(b, PATH_MAX, "%s/%s", dir, rel);
	return b;
}

static void touch(const char *path, const char *content)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	assert_true(fd >= 0);
	if (content)
		assert_int_equal(write(fd, content, strlen(content)), (ssize_t)strlen(content));
	close(fd);
}

static const struct op *find_op(const struct jail_plan *p, enum op_kind kind, const char *path)
{
	for (size_t i = 0; i < p->n; i++)
		if (p->ops[i].kind == kind && !strcmp(p->ops[i].path, path))
			return &p->ops[i];
	return NULL;
}

/* ---- the layout plan ------------------------------------------------------ */

/* A path through a relative symbolic link: the link is recreated, the
 * directories of the real path made, the file bound at its real path. */
static void plan_follows_links(void **state)
{
	struct jail_plan p = { 0 };
	const struct op *o;
	size_t n;

	assert_int_equal(mkdir(at("real"), 0755), 0);
	assert_int_equal(mkdir(at("real/sub"), 0755), 0);
	touch(at("real/sub/file"), "x");
	assert_int_equal(symlink("real", at("link")), 0);
	assert_int_equal(plan_path(&p, at("link/sub/file"), OP_BIND_RO), 0);
	o = find_op(&p, OP_LINK, at("link"));
	assert_non_null(o);
	assert_string_equal(o->arg, "real");
	assert_non_null(find_op(&p, OP_DIR, dir));
	assert_non_null(find_op(&p, OP_DIR, at("real/sub")));
	assert_non_null(find_op(&p, OP_FILE, at("real/sub/file")));
	o = find_op(&p, OP_BIND_RO, at("real/sub/file"));
	assert_non_null(o);
	assert_string_equal(o->arg, at("real/sub/file"));
	assert_int_equal(o->dir, 0);
	/* The mount point comes before its bind, parents before children. */
	assert_true(find_op(&p, OP_FILE, at("real/sub/file")) < o);
	assert_true(find_op(&p, OP_DIR, at("real")) < find_op(&p, OP_DIR, at("real/sub")));
	/* The same bind again adds nothing; so does a path below a directory bind. */
	n = p.n;
	assert_int_equal(plan_path(&p, at("real/sub/file"), OP_BIND_RO), 0);
	assert_int_equal(p.n, n);
	assert_int_equal(plan_path(&p, at("real/sub"), OP_BIND_RO), 0);
	n = p.n;
	touch(at("real/sub/other"), NULL);
	assert_int_equal(plan_path(&p, at("real/sub/other"), OP_BIND_RO), 0);
	assert_int_equal(p.n, n);
	/* "." and ".." are resolved as the kernel would. */
	assert_int_equal(plan_path(&p, at("real/./sub/../sub/file"), OP_BIND_RO), 0);
	assert_int_equal(p.n, n);
	plan_free(&p);
	assert_int_equal(p.n, 0);
	assert_null(p.ops);
}

static void plan_rejects(void **state)
{
	struct jail_plan p = { 0 };
	struct kiln_err err = { .code = "" };

	touch(at("file"), NULL);
	assert_int_equal(mkfifo(at("fifo"), 0600), 0);
	assert_int_equal(symlink("b", at("a")), 0);
	assert_int_equal(symlink("a", at("b")), 0);
	assert_int_equal(plan_path(&p, "relative/path", OP_BIND_RO), -EINVAL);
	assert_int_equal(plan_path(&p, "/", OP_BIND_RO), -EINVAL);
	assert_int_equal(plan_path(&p, at("missing"), OP_BIND_RO), -ENOENT);
	assert_int_equal(plan_path(&p, at("file/below"), OP_BIND_RO), -ENOTDIR);
	assert_int_equal(plan_path(&p, at("a"), OP_BIND_RO), -ELOOP);
	assert_int_equal(plan_path(&p, at("fifo"), OP_BIND_RO), -EINVAL);
	/* A device bind needs a character device, a file bind anything but. */
	assert_int_equal(plan_path(&p, at("file"), OP_BIND_DEV), -EINVAL);
	assert_int_equal(plan_path(&p, "/dev/null", OP_BIND_RO), -EINVAL);
	assert_int_equal(plan_path(&p, "/dev/null", OP_BIND_DEV), 0);
	/* One path, one kind of bind. */
	assert_int_equal(plan_path(&p, at("file"), OP_BIND_RO), 0);
	assert_int_equal(plan_path(&p, at("file"), OP_BIND_RW), -EEXIST);
	/* The errors, worded for the operator. */
	assert_int_equal(plan_err(&err, "relative/path", -EINVAL), -1);
	assert_string_equal(err.code, "host_error");
	assert_string_equal(err.message, "jail: relative/path: not an absolute path");
	plan_err(&err, at("missing"), -ENOENT);
	assert_non_null(strstr(err.message, "No such file or directory"));
	plan_free(&p);
}

/* A jail's plan: the base's ops first (shared, not copied), then rw, work,
 * ro, dev and /proc. */
static void plan_build_order(void **state)
{
	struct jail_plan base = { 0 }, p = { 0 };
	struct jail_spec spec = { .proc = 1, .work = NULL };
	struct kiln_err err = { .code = "" };
	const struct op *rw, *work, *ro, *proc;
	char workdir[PATH_MAX];

	assert_int_equal(plan_path(&base, "/dev/null", OP_BIND_DEV), 0);
	touch(at("rw"), NULL);
	assert_int_equal(mkdir(at("ro"), 0755), 0);
	snprintf(workdir, sizeof(workdir), "%s", at("work"));
	assert_int_equal(mkdir(workdir, 0700), 0);
	spec.rw[0] = at("rw");
	spec.ro[0] = at("ro");
	spec.work = workdir;
	assert_int_equal(plan_build(&p, &base, &spec, &err), 0);
	assert_true(p.n > base.n);
	for (size_t i = 0; i < base.n; i++) {
		assert_ptr_equal(p.ops[i].path, base.ops[i].path);
		assert_int_equal(p.ops[i].owned, 0);
	}
	rw = find_op(&p, OP_BIND_RW, at("rw"));
	work = find_op(&p, OP_BIND_RW, workdir);
	ro = find_op(&p, OP_BIND_RO, at("ro"));
	proc = find_op(&p, OP_PROC, "/proc");
	assert_non_null(rw);
	assert_non_null(work);
	assert_non_null(ro);
	assert_non_null(proc);
	assert_true(rw < work && work < ro && ro < proc);
	assert_int_equal(work->dir, 1);
	assert_ptr_equal(proc, &p.ops[p.n - 1]);
	assert_non_null(find_op(&p, OP_DIR, "/proc"));
	plan_free(&p);
	/* A bad path fails the whole plan and names the path. */
	memset(&spec, 0, sizeof(spec));
	spec.ro[0] = "etc/passwd";
	assert_int_equal(plan_build(&p, &base, &spec, &err), -1);
	assert_string_equal(err.message, "jail: etc/passwd: not an absolute path");
	plan_free(&p);
	spec.ro[0] = NULL;
	spec.dev[0] = at("rw");
	assert_int_equal(plan_build(&p, &base, &spec, &err), -1);
	assert_non_null(strstr(err.message, "Invalid argument"));
	plan_free(&p);
	plan_free(&base);
}

/* jail_spawn refuses a bad request before it takes anything. */
static void spawn_rejects_bad_specs(void **state)
{
	struct jail_config c = { .uid_base = 64000, .slots = 4 };
	struct jail_spec spec = { .root = "/nonexistent", .exe = "/bin/true" };
	static const char *const bad[] = { "", "a/b", "..", ".hidden" };
	char *argv[] = { "true", NULL };
	struct kiln_err err = { .code = "" };
	struct jail j;
	char name[700];
	int pidfd = 5;
	struct stat st;

	snprintf(c.slot_dir, sizeof(c.slot_dir), "%s", at("slots"));
	snprintf(c.cg_memory, sizeof(c.cg_memory), "/sys/fs/cgroup/memory/kiln-unit/kiln");
	snprintf(c.cg_cpu, sizeof(c.cg_cpu), "/sys/fs/cgroup/cpu/kiln-unit/kiln");
	snprintf(c.cg_pids, sizeof(c.cg_pids), "/sys/fs/cgroup/pids/kiln-unit/kiln");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		spec.name = bad[i];
		assert_int_equal(jail_spawn(&c, &spec, argv, &j, &pidfd, &err), -1);
		assert_string_equal(err.message, "jail: name, root and exe are required");
		assert_int_equal(pidfd, -1);
		assert_int_equal(j.active, 0);
	}
	spec.name = "ok";
	spec.root = NULL;
	assert_int_equal(jail_spawn(&c, &spec, argv, &j, &pidfd, &err), -1);
	assert_string_equal(err.message, "jail: name, root and exe are required");
	/* A name whose cgroup path would not fit is refused, not truncated. */
	memset(name, 'n', sizeof(name) - 1);
	name[sizeof(name) - 1] = '\0';
	spec.name = name;
	spec.root = "/nonexistent";
	assert_int_equal(jail_spawn(&c, &spec, argv, &j, &pidfd, &err), -1);
	assert_non_null(strstr(err.message, "name too long"));
	assert_int_equal(j.active, 0);
	/* No slot was taken: the slot directory was not even made. */
	assert_int_equal(stat(c.slot_dir, &st), -1);
}

/* ---- cgroups -------------------------------------------------------------- */

static void cgroup_parse_proc(void **state)
{
	static const char text[] = "12:cpu,cpuacct:/a/b\n"
				   "11:cpuset:/set\n"
				   "10:memory:/\n"
				   "3:pids:/x/y\n"
				   "1:name=systemd:/init.scope\n"
				   "0::/v2";
	char out[64];

	assert_int_equal(cg_parse_proc(text, "cpu", out, sizeof(out)), 0);
	assert_string_equal(out, "/a/b");
	assert_int_equal(cg_parse_proc(text, "cpuacct", out, sizeof(out)), 0);
	assert_string_equal(out, "/a/b");
	assert_int_equal(cg_parse_proc(text, "cpuset", out, sizeof(out)), 0);
	assert_string_equal(out, "/set");
	assert_int_equal(cg_parse_proc(text, "memory", out, sizeof(out)), 0);
	assert_string_equal(out, "/");
	assert_int_equal(cg_parse_proc(text, "pids", out, sizeof(out)), 0);
	assert_string_equal(out, "/x/y");
	assert_int_equal(cg_parse_proc(text, "blkio", out, sizeof(out)), -ENOENT);
	/* No prefix matches, and the v2 line's empty list matches nothing. */
	assert_int_equal(cg_parse_proc(text, "cpus", out, sizeof(out)), -ENOENT);
	assert_int_equal(cg_parse_proc(text, "", out, sizeof(out)), -ENOENT);
	assert_int_equal(cg_parse_proc("3:pids:/x/y", "pids", out, 4), -ENAMETOOLONG);
	assert_int_equal(cg_parse_proc("garbage\n::\n", "pids", out, sizeof(out)), -ENOENT);
	assert_int_equal(cg_parse_proc("", "pids", out, sizeof(out)), -ENOENT);
}

static void cgroup_paths_and_values(void **state)
{
	struct jail_spec spec = { .memory_bytes = 256ull << 20, .cpus = 2, .pids = 64 };
	struct jail_config c = { 0 };
	struct cg_value v[4];
	char out[16];

	assert_int_equal(cg_path(out, sizeof(out), "/cg/kiln", "vm-1"), 0);
	assert_string_equal(out, "/cg/kiln/vm-1");
	assert_int_equal(cg_path(out, sizeof(out), "/cg/kiln", "vm-12345"), -ENAMETOOLONG);
	assert_string_equal(out, "");
	snprintf(c.cg_memory, sizeof(c.cg_memory), "m");
	snprintf(c.cg_cpu, sizeof(c.cg_cpu), "c");
	snprintf(c.cg_pids, sizeof(c.cg_pids), "p");
	assert_string_equal(cg_base(&c, CG_MEMORY), "m");
	assert_string_equal(cg_base(&c, CG_CPU), "c");
	assert_string_equal(cg_base(&c, CG_PIDS), "p");
	assert_string_equal(cg_names[CG_MEMORY], "memory");
	assert_string_equal(cg_names[CG_CPU], "cpu");
	assert_string_equal(cg_names[CG_PIDS], "pids");

	assert_int_equal(cg_values(&spec, 50000, v), 4);
	assert_int_equal(v[0].ctrl, CG_MEMORY);
	assert_string_equal(v[0].file, "memory.limit_in_bytes");
	assert_string_equal(v[0].val, "268435456");
	assert_int_equal(v[0].optional, 0);
	assert_int_equal(v[1].ctrl, CG_MEMORY);
	assert_string_equal(v[1].file, "memory.memsw.limit_in_bytes");
	assert_string_equal(v[1].val, "268435456");
	assert_int_equal(v[1].optional, 1);
	assert_int_equal(v[2].ctrl, CG_CPU);
	assert_string_equal(v[2].file, "cpu.cfs_quota_us");
	assert_string_equal(v[2].val, "100000");
	assert_int_equal(v[3].ctrl, CG_PIDS);
	assert_string_equal(v[3].file, "pids.max");
	assert_string_equal(v[3].val, "64");
	/* The period unknown: the kernel's default, 100 ms. */
	assert_int_equal(cg_values(&spec, -1, v), 4);
	assert_string_equal(v[2].val, "200000");
	/* Unset limits are not written at all. */
	memset(&spec, 0, sizeof(spec));
	assert_int_equal(cg_values(&spec, 100000, v), 0);
	spec.pids = 1;
	assert_int_equal(cg_values(&spec, 100000, v), 1);
	assert_string_equal(v[0].file, "pids.max");
	spec.memory_bytes = UINT64_MAX;
	assert_int_equal(cg_values(&spec, 100000, v), 3);
	assert_string_equal(v[0].val, "18446744073709551615");
}

/* The crash record, and jail_reap removing only what is a cgroup v1 directory. */
static void cgroup_record_and_reap(void **state)
{
	struct jail j = { .active = 1, .slot = 7 };
	char text[512], victim[PATH_MAX];
	FILE *f;
	size_t n;

	snprintf(j.cg[CG_MEMORY], sizeof(j.cg[0]), "/sys/fs/cgroup/memory/k/kiln/vm-1");
	snprintf(j.cg[CG_PIDS], sizeof(j.cg[0]), "/sys/fs/cgroup/pids/k/kiln/vm-1");
	assert_int_equal(cg_record_write(&j, at("record")), 0);
	f = fopen(at("record"), "r");
	assert_non_null(f);
	n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	text[n] = '\0';
	assert_string_equal(text, "slot 7\n"
				  "cgroup memory /sys/fs/cgroup/memory/k/kiln/vm-1\n"
				  "cgroup pids /sys/fs/cgroup/pids/k/kiln/vm-1\n");
	assert_int_equal(cg_record_write(&j, at("missing/record")), -ENOENT);

	assert_int_equal(jail_reap(at("no-record")), 0);
	/* Directories outside /sys/fs/cgroup, or climbing out of it, stay. */
	snprintf(victim, sizeof(victim), "%s", at("victim"));
	assert_int_equal(mkdir(victim, 0700), 0);
	f = fopen(at("bad"), "w");
	assert_non_null(f);
	fprintf(f, "slot 1\ncgroup memory %s\ncgroup memory /sys/fs/cgroup/memory/../../..%s\n"
		   "cgroup pids /sys/fs/cgroup/./pids/../../..%s\n", victim, victim, victim);
	/* A cgroup already gone is fine. */
	fprintf(f, "cgroup pids /sys/fs/cgroup/pids/kiln-unit-none/x\nnonsense\n");
	fclose(f);
	assert_int_equal(jail_reap(at("bad")), 0);
	assert_int_equal(access(victim, F_OK), 0);
}

/* ---- slots ---------------------------------------------------------------- */

static void slot_locks(void **state)
{
	struct jail_config c = { .uid_base = 5000, .slots = 2 };
	struct kiln_err err = { .code = "" };
	struct jail a = { .slot_fd = -1 }, b = { .slot_fd = -1 }, x = { .slot_fd = -1 };
	char path[PATH_MAX], text[64];
	ssize_t n;
	int fd, taken;

	snprintf(c.slot_dir, sizeof(c.slot_dir), "%s", at("slots/nested"));
	assert_int_equal(slot_take(&c, &a, "/cg/a", &err), 0);
	assert_int_equal(slot_take(&c, &b, "/cg/b", &err), 0);
	assert_true(a.slot != b.slot);
	assert_true(a.slot >= 0 && a.slot < 2 && b.slot >= 0 && b.slot < 2);
	assert_int_equal(a.uid, 5000 + a.slot);
	assert_int_equal(a.gid, 5000 + a.slot);
	/* The lock file names the holder's memory cgroup. */
	snprintf(path, sizeof(path), "%s/%d.lock", c.slot_dir, a.slot);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	n = read(fd, text, sizeof(text) - 1);
	close(fd);
	assert_int_equal(n, 5);
	text[n] = '\0';
	assert_string_equal(text, "/cg/a");
	/* All taken. */
	assert_int_equal(slot_take(&c, &x, "/cg/x", &err), -1);
	assert_string_equal(err.code, "no_capacity");
	/* Closing the lock frees the slot. */
	taken = a.slot;
	close(a.slot_fd);
	assert_int_equal(slot_take(&c, &x, "/cg/x", &err), 0);
	assert_int_equal(x.slot, taken);
	close(x.slot_fd);
	close(b.slot_fd);
}

/* A slot whose last jail still has processes in its cgroup is skipped. */
static void slot_skips_populated(void **state)
{
	struct jail_config c = { .uid_base = 5000, .slots = 1 };
	struct kiln_err err = { .code = "" };
	struct jail j = { .slot_fd = -1 };
	char lock[PATH_MAX], procs[PATH_MAX];

	snprintf(c.slot_dir, sizeof(c.slot_dir), "%s", at("slots"));
	assert_int_equal(mkdir(c.slot_dir, 0700), 0);
	assert_int_equal(mkdir(at("oldcg"), 0700), 0);
	snprintf(lock, sizeof(lock), "%s/0.lock", c.slot_dir);
	snprintf(procs, sizeof(procs), "%s/cgroup.procs", at("oldcg"));
	touch(lock, at("oldcg"));
	touch(procs, "4242\n");
	assert_int_equal(cg_populated(at("oldcg")), 1);
	assert_int_equal(slot_take(&c, &j, "/cg/new", &err), -1);
	assert_string_equal(err.code, "no_capacity");
	touch(procs, NULL);
	assert_int_equal(cg_populated(at("oldcg")), 0);
	assert_int_equal(cg_populated(at("nothing")), 0);
	assert_int_equal(slot_take(&c, &j, "/cg/new", &err), 0);
	assert_int_equal(j.slot, 0);
	close(j.slot_fd);
}

/* ---- configuration -------------------------------------------------------- */

static void config_dir_list(void **state)
{
	struct buf b = BUF_INIT;

	assert_int_equal(config_dir_list_add(&b, "/lib"), 0);
	assert_int_equal(config_dir_list_add(&b, "/usr/lib"), 0);
	assert_int_equal(config_dir_list_add(&b, "/lib"), 0);
	assert_int_equal(config_dir_list_add(&b, "/usr/lib"), 0);
	assert_int_equal(config_dir_list_add(&b, "/li"), 0);
	assert_int_equal(config_dir_list_add(&b, "/"), 0);
	assert_string_equal(b.p, "/lib:/usr/lib:/li:/");
	buf_free(&b);
}

static void config_elf(void **state)
{
	char interp[PATH_MAX];

	/* This test program is dynamically linked. */
	assert_int_equal(config_elf_interp("/proc/self/exe", interp, sizeof(interp)), 0);
	assert_int_equal(interp[0], '/');
	assert_int_equal(access(interp, X_OK), 0);
	assert_int_equal(config_elf_interp("/proc/self/exe", interp, 4), -ENOEXEC);
	touch(at("script"), "#!/bin/sh\necho not an ELF program, but long enough to read a header from\n"
			    "................................................................\n");
	assert_int_equal(config_elf_interp(at("script"), interp, sizeof(interp)), -ENOEXEC);
	assert_int_equal(config_elf_interp(at("missing"), interp, sizeof(interp)), -ENOENT);
}

/* A program and what its loader says it loads go into the base plan. */
static void config_add_program(void **state)
{
	struct jail_config c = { 0 };
	struct kiln_err err = { .code = "" };
	char real[PATH_MAX], interp[PATH_MAX];
	int libc = 0;

	c.base = calloc(1, sizeof(*c.base));
	assert_non_null(c.base);
	assert_non_null(realpath("/bin/true", real));
	assert_int_equal(config_elf_interp(real, interp, sizeof(interp)), 0);
	if (!interp[0]) {
		jail_config_free(&c);
		skip(); /* a static /bin/true has no libraries to find */
	}
	assert_int_equal(jail_config_add_program(&c, "/bin/true", &err), 0);
	assert_non_null(find_op(c.base, OP_BIND_RO, real));
	assert_non_null(realpath(interp, real));
	assert_non_null(find_op(c.base, OP_BIND_RO, real));
	for (size_t i = 0; i < c.base->n; i++)
		if (c.base->ops[i].kind == OP_BIND_RO && strstr(c.base->ops[i].path, "/libc.so"))
			libc = 1;
	assert_true(libc);
	assert_true(c.base->ld_path.len > 0);
	assert_int_equal(c.base->ld_path.p[0], '/');
	/* Something that is not a program. */
	touch(at("notelf"), "just text, and enough of it to fill an ELF header's worth of bytes.....");
	assert_int_equal(jail_config_add_program(&c, at("notelf"), &err), -1);
	assert_non_null(strstr(err.message, "not an ELF program we can read"));
	jail_config_free(&c);
	assert_null(c.base);
	assert_null(c.filter);
}

/* ---- seccomp -------------------------------------------------------------- */

/* Load the filter in a forked child and try what it must refuse and what it
 * must let through; the child reports the first failed check as its exit
 * status. No root needed: no_new_privs allows an unprivileged filter. */
static void seccomp_filter_denies(void **state)
{
	struct sock_filter *f;
	unsigned len;
	int status;
	pid_t pid;

	assert_int_equal(seccomp_filter_build(&f, &len), 0);
	assert_non_null(f);
	assert_true(len > 10);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct sock_fprog prog = { .len = (unsigned short)len, .filter = f };
		pid_t inner;
		int st;

		if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0)
			_exit(1);
		if (syscall(SYS_unshare, CLONE_NEWUSER) != -1 || errno != EPERM)
			_exit(2);
		if (syscall(SYS_setns, -1, 0) != -1 || errno != EPERM)
			_exit(3);
		if (syscall(SYS_clone, CLONE_NEWNET | SIGCHLD, NULL, NULL, NULL, 0) != -1 || errno != EPERM)
			_exit(4);
		if (syscall(SYS_clone, CLONE_NEWUSER | CLONE_NEWPID | SIGCHLD, NULL, NULL, NULL, 0) != -1 || errno != EPERM)
			_exit(5);
		if (syscall(__NR_clone3, NULL, 0) != -1 || errno != ENOSYS)
			_exit(6);
		if (syscall(__NR_io_uring_setup, 1, NULL) != -1 || errno != ENOSYS)
			_exit(7);
		if (syscall(SYS_ptrace, 0x7fffffff, 0, 0, 0) != -1 || errno != EPERM)
			_exit(8);
		if (syscall(SYS_bpf, 0, NULL, 0) != -1 || errno != EPERM)
			_exit(9);
		if (syscall(SYS_mount, "none", "/nonexistent-kiln-unit", "tmpfs", 0, NULL) != -1 || errno != EPERM)
			_exit(10);
		if (syscall(SYS_personality, 0xffffffff) != -1 || errno != EPERM)
			_exit(11);
		/* What a program needs still works: a plain clone (fork) and reaping it. */
		inner = fork();
		if (inner == 0)
			_exit(0);
		if (inner < 0 || waitpid(inner, &st, 0) != inner || !WIFEXITED(st) || WEXITSTATUS(st))
			_exit(12);
		if (getpid() <= 0)
			_exit(13);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	free(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(memfd_same_contents_and_sealed, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(memfd_refuses_non_regular, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(rmtree_does_not_follow_links, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(plan_follows_links, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(plan_rejects, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(plan_build_order, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(spawn_rejects_bad_specs, dir_setup, dir_teardown),
		cmocka_unit_test(cgroup_parse_proc),
		cmocka_unit_test(cgroup_paths_and_values),
		cmocka_unit_test_setup_teardown(cgroup_record_and_reap, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(slot_locks, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(slot_skips_populated, dir_setup, dir_teardown),
		cmocka_unit_test(config_dir_list),
		cmocka_unit_test_setup_teardown(config_elf, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(config_add_program, dir_setup, dir_teardown),
		cmocka_unit_test(seccomp_filter_denies),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
