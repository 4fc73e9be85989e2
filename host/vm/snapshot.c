/* snapshot: create, validate, restore, list and remove pre-booted VM snapshots.
 * Layout: <cache>/snapshots/<key>/{manifest.json, state, mem, disk.qcow2}.
 * The manifest records what was written so a truncated, modified or
 * half-written snapshot is refused instead of producing a half-working VM. */
#include "snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "fsutil.h"
#include "jail.h"
#include "proto.h"

#define SNAP_BOOT_TIMEOUT_MS    120000
#define SNAP_PREPARE_TIMEOUT_MS 120000
#define SNAP_SAVE_TIMEOUT_MS    60000
#define RESTORE_TIMEOUT_MS      20000

extern char **environ;

/* Identity of an input file: resolved path, size and mtime (the kernel and
 * rootfs are large and live in a content-keyed cache; the initramfs is small
 * and hashed outright). */
static void key_add_file(EVP_MD_CTX *md, const char *label, const char *path, int hash)
{
	char real[PATH_MAX], line[PATH_MAX + 256], sha[65] = "";
	struct stat st = { 0 };

	if (!realpath(path, real))
		snprintf(real, sizeof(real), "%s", path);
	stat(real, &st);
	if (hash)
		fs_sha256_file(real, sha);
	snprintf(line, sizeof(line), "%s %s %lld %lld.%09ld %s\n", label, real, (long long)st.st_size,
		 (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec, sha);
	EVP_DigestUpdate(md, line, strlen(line));
}

/* The key over the rootfs, QEMU and the machine line, and with boot also
 * over the kernel and initramfs (snapshot_key) or not (snapshot_resume_key). */
static int key_of(const struct vm_config *base, unsigned memory_mib, unsigned vcpus, int boot, char key[17],
		  struct kiln_err *err)
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	unsigned char d[32];
	unsigned int dl;
	char line[128];

	if (!md)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	EVP_DigestInit_ex(md, EVP_sha256(), NULL);
	if (boot)
		key_add_file(md, "kernel", base->kernel, 0);
	else
		EVP_DigestUpdate(md, "resume\n", 7);
	key_add_file(md, "rootfs", base->disk, 0);
	if (boot)
		key_add_file(md, "initramfs", base->initrd, 1);
	key_add_file(md, "qemu", base->qemu, 0);
	snprintf(line, sizeof(line), "memory %u vcpus %u accel %s cpu %s format 6 volslots %u%s\n", memory_mib, vcpus,
		 vm_accel_name(base->accel), vm_cpu_model(base->accel), VM_VOL_SLOTS, base->net ? " net 1" : "");
	EVP_DigestUpdate(md, line, strlen(line));
	EVP_DigestFinal_ex(md, d, &dl);
	EVP_MD_CTX_free(md);
	for (int i = 0; i < 8; i++)
		snprintf(key + 2 * i, 3, "%02x", d[i]);
	return 0;
}

int snapshot_key(const struct vm_config *base, unsigned memory_mib, unsigned vcpus, char key[17],
		 struct kiln_err *err)
{
	return key_of(base, memory_mib, vcpus, 1, key, err);
}

int snapshot_resume_key(const struct vm_config *base, unsigned memory_mib, unsigned vcpus, char key[17],
			struct kiln_err *err)
{
	return key_of(base, memory_mib, vcpus, 0, key, err);
}

/* The backing file named in a qcow2 header (version 2 or 3), or "" for none. */
int snapshot_qcow2_backing(const char *path, char *out, size_t cap)
{
	unsigned char h[20];
	uint64_t off = 0;
	uint32_t len = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC), r = -EBADMSG;

	out[0] = '\0';
	if (fd < 0)
		return -errno;
	if (pread(fd, h, sizeof(h), 0) != (ssize_t)sizeof(h) || memcmp(h, "QFI\xfb", 4))
		goto out;
	for (int i = 0; i < 8; i++)
		off = off << 8 | h[8 + i];
	for (int i = 0; i < 4; i++)
		len = len << 8 | h[16 + i];
	if (off && (len == 0 || len >= cap || pread(fd, out, len, (off_t)off) != (ssize_t)len))
		goto out;
	out[off ? len : 0] = '\0';
	r = 0;
out:
	close(fd);
	return r;
}

static void snap_paths(struct snapshot *s)
{
	snprintf(s->mem, sizeof(s->mem), "%s/mem", s->dir);
	snprintf(s->disk, sizeof(s->disk), "%s/disk.qcow2", s->dir);
	snprintf(s->state, sizeof(s->state), "%s/state", s->dir);
}

int snapshot_run_cmd(char *const argv[])
{
	pid_t pid;
	int status;

	if (posix_spawn(&pid, argv[0], NULL, NULL, argv, environ) != 0)
		return -1;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* Wait for the MIGRATION event that ends a migration, either way; it may
 * have come already, while the command that started it was answered. */
static int wait_migration(struct vm *vm, int64_t deadline, struct kiln_err *err)
{
	for (;;) {
		json_t *data = NULL;
		const char *st;

		if (!strcmp(vm->migration, "completed") || !strcmp(vm->migration, "failed") ||
		    !strcmp(vm->migration, "cancelled")) {
			data = json_pack("{s:s}", "status", vm->migration);
			vm_qmp_migration_reset(vm);
		} else if (vm_qmp_wait_event(vm, "MIGRATION", deadline, &data, err) < 0) {
			return -1;
		}
		st = json_string_value(json_object_get(data, "status"));
		if (st && !strcmp(st, "completed")) {
			json_decref(data);
			return 0;
		}
		if (st && (!strcmp(st, "failed") || !strcmp(st, "cancelled"))) {
			json_decref(data);
			return kiln_err_set(err, KERR_SNAPSHOT_ERROR, "migration %s", st);
		}
		json_decref(data);
	}
}

static const char *migrate_caps =
	"{\"execute\":\"migrate-set-capabilities\",\"arguments\":{\"capabilities\":["
	"{\"capability\":\"x-ignore-shared\",\"state\":true},{\"capability\":\"events\",\"state\":true}]}}";

static int write_manifest(const struct snapshot *s, const char *path, struct kiln_err *err)
{
	json_t *m = json_pack("{s:s, s:s, s:i, s:i, s:s, s:I, s:I, s:I, s:I, s:I}", "key", s->key, "release",
			      s->release, "memory_mib", (int)s->memory_mib, "vcpus", (int)s->vcpus, "state_sha256",
			      s->state_sha256, "mem_size", (json_int_t)s->mem_size, "mem_ino", (json_int_t)s->mem_ino,
			      "mem_mtime_ns", (json_int_t)s->mem_mtime_ns, "mem_ctime_ns", (json_int_t)s->mem_ctime_ns,
			      "created", (json_int_t)time(NULL));
	int r = m && json_object_set_new(m, "net", json_boolean(s->net)) == 0 ? json_dump_file(m, path, JSON_INDENT(1)) : -1;

	json_decref(m);
	return r ? kiln_err_set(err, KERR_SNAPSHOT_ERROR, "cannot write %s", path) : 0;
}

static void mem_identity(const struct stat *st, struct snapshot *s)
{
	s->mem_size = (uint64_t)st->st_size;
	s->mem_ino = (uint64_t)st->st_ino;
	s->mem_mtime_ns = (uint64_t)st->st_mtim.tv_sec * 1000000000u + (uint64_t)st->st_mtim.tv_nsec;
	s->mem_ctime_ns = (uint64_t)st->st_ctim.tv_sec * 1000000000u + (uint64_t)st->st_ctim.tv_nsec;
}

int snapshot_create(const struct vm_config *base, const char *cache, unsigned memory_mib, unsigned vcpus,
		    int verbose, struct snapshot *out, struct kiln_err *err)
{
	struct vm_config cfg = *base;
	struct snapshot s = { .memory_mib = memory_mib, .vcpus = vcpus, .mem_fd = -1, .net = base->net ? 1 : 0 };
	char root[PATH_MAX], final[PATH_MAX], rootfs[PATH_MAX], backing[PATH_MAX + 16], cmd[256];
	struct vm vm = { .pid = -1, .pidfd = -1, .agent_fd = -1, .qmp_fd = -1, .envd_fd = -1, .lock_fd = -1 };
	struct proto_frame f;
	struct stat st;
	int64_t t0 = proto_now_ms();
	int state_fd = -1, r = -1;

	if (snapshot_key(base, memory_mib, vcpus, s.key, err) < 0)
		return -1;
	snprintf(root, sizeof(root), "%s/snapshots", cache);
	if (fs_mkdir_p(root, 0755) < 0)
		return kiln_err_set(err, KERR_SNAPSHOT_ERROR, "cannot create %s: %s", root, strerror(errno));
	snprintf(s.dir, sizeof(s.dir), "%s/.build-%s-%d", root, s.key, (int)getpid());
	fs_rmtree(s.dir);
	if (mkdir(s.dir, 0755) < 0)
		return kiln_err_set(err, KERR_SNAPSHOT_ERROR, "cannot create %s: %s", s.dir, strerror(errno));
	snap_paths(&s);
	if (verbose)
		fprintf(stderr, "[snapshot] %s: booting the template VM (%u MiB, %u vCPU)\n", s.key, memory_mib, vcpus);

	/* The template writes its own overlay; clones stack theirs on top of it. */
	if (!realpath(base->disk, rootfs)) {
		kiln_err_set(err, KERR_SNAPSHOT_ERROR, "%s: %s", base->disk, strerror(errno));
		goto out;
	}
	snprintf(backing, sizeof(backing), "%s", rootfs);
	{
		char *argv[] = { "/usr/bin/qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", backing,
				 s.disk, NULL };

		if (snapshot_run_cmd(argv) < 0) {
			kiln_err_set(err, KERR_SNAPSHOT_ERROR, "qemu-img create %s failed", s.disk);
			goto out;
		}
	}
	cfg.mem_file = s.mem;
	cfg.mem_share = 1;
	cfg.mem_fd = 0;
	cfg.disk = s.disk;
	cfg.disk_format = "qcow2";
	cfg.disk_writable = 1;
	cfg.disk_backing = backing;
	cfg.net_fd = -1; /* a template with a NIC has it on a hub port leading nowhere */
	cfg.incoming = 0;
	cfg.memory_mib = memory_mib;
	cfg.vcpus = vcpus;
	if (vm_start(&cfg, &vm, err) < 0)
		goto out;
	if (vm_recv(&vm, &f, proto_now_ms() + SNAP_BOOT_TIMEOUT_MS, err) < 0)
		goto out;
	{
		struct proto_hello h;

		if (f.type != PROTO_HELLO || proto_hello_decode(f.payload, f.len, &h) < 0) {
			kiln_err_set(err, KERR_SNAPSHOT_ERROR, "template VM: first frame was not a valid HELLO");
			goto out;
		}
		memcpy(s.release, h.release, sizeof(s.release));
	}
	if (verbose)
		fprintf(stderr, "[snapshot] booted in %lld ms; pre-starting Python\n", (long long)(proto_now_ms() - t0));
	if (vm_send(&vm, PROTO_PREPARE, NULL, 0, proto_now_ms() + 10000, err) < 0 ||
	    vm_recv_ok(&vm, PROTO_PREPARE, proto_now_ms() + SNAP_PREPARE_TIMEOUT_MS, "prepare", err) < 0)
		goto out;
	/* Every clone inherits the guest caches this fills (no disk reads for
	 * the task path after a restore). */
	if (pool_warm_up(&vm, err) < 0)
		goto out;

	if (verbose)
		fprintf(stderr, "[snapshot] saving device state\n");
	state_fd = open(s.state, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (state_fd < 0) {
		kiln_err_set(err, KERR_SNAPSHOT_ERROR, "cannot create %s: %s", s.state, strerror(errno));
		goto out;
	}
	/* RAM stays in the shared file (x-ignore-shared): the stream holds only
	 * device state, a few dozen KiB. */
	if (vm_qmp(&vm, migrate_caps, proto_now_ms() + 10000, NULL, err) < 0 ||
	    vm_qmp(&vm, "{\"execute\":\"migrate-set-parameters\",\"arguments\":{\"max-bandwidth\":107374182400}}",
		   proto_now_ms() + 10000, NULL, err) < 0 ||
	    vm_qmp(&vm, "{\"execute\":\"stop\"}", proto_now_ms() + 10000, NULL, err) < 0 ||
	    vm_qmp_getfd(&vm, "snap", state_fd, proto_now_ms() + 10000, err) < 0)
		goto out;
	vm_qmp_migration_reset(&vm);
	snprintf(cmd, sizeof(cmd), "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"fd:snap\"}}");
	if (vm_qmp(&vm, cmd, proto_now_ms() + 10000, NULL, err) < 0 ||
	    wait_migration(&vm, proto_now_ms() + SNAP_SAVE_TIMEOUT_MS, err) < 0)
		goto out;
	vm_destroy(&vm);
	/* The jailed template wrote its RAM file and overlay as its slot uid:
	 * from now on they are root's, read by every clone (0644 whatever the
	 * umask: qemu-img made the overlay under kiln-host's). */
	if (lchown(s.mem, 0, 0) < 0 || lchown(s.disk, 0, 0) < 0 || chmod(s.mem, 0644) < 0 || chmod(s.disk, 0644) < 0) {
		kiln_err_set(err, KERR_SNAPSHOT_ERROR, "chown %s: %s", s.dir, strerror(errno));
		goto out;
	}
	if (fsync(state_fd) < 0 || close(state_fd) < 0) {
		state_fd = -1;
		kiln_err_set(err, KERR_SNAPSHOT_ERROR, "writing %s: %s", s.state, strerror(errno));
		goto out;
	}
	state_fd = -1;
	if (fs_sha256_file(s.state, s.state_sha256) < 0 || stat(s.mem, &st) < 0) {
		kiln_err_set(err, KERR_SNAPSHOT_ERROR, "cannot read back the snapshot files");
		goto out;
	}
	mem_identity(&st, &s);
	{
		char manifest[PATH_MAX];

		snprintf(manifest, sizeof(manifest), "%s/manifest.json", s.dir);
		if (write_manifest(&s, manifest, err) < 0)
			goto out;
	}
	snprintf(final, sizeof(final), "%s/%s", root, s.key);
	fs_rmtree(final);
	if (rename(s.dir, final) < 0) {
		kiln_err_set(err, KERR_SNAPSHOT_ERROR, "rename to %s: %s", final, strerror(errno));
		goto out;
	}
	/* Renaming the directory keeps the files' identity (inode, times). */
	snprintf(s.dir, sizeof(s.dir), "%s", final);
	snap_paths(&s);
	if (verbose)
		fprintf(stderr, "[snapshot] %s ready in %lld ms: %s\n", s.key, (long long)(proto_now_ms() - t0), s.dir);
	snprintf(s.backing, sizeof(s.backing), "%s", backing);
	if (out) {
		struct stat loaded;

		s.mem_fd = jail_sealed_memfd(s.mem, &loaded, err);
		if (s.mem_fd < 0)
			goto out;
		*out = s;
	}
	r = 0;
out:
	vm_destroy(&vm);
	if (state_fd >= 0)
		close(state_fd);
	if (r < 0)
		fs_rmtree(s.dir);
	return r;
}

/* snapshot_open without loading the RAM (for listing). */
static int snapshot_check(const char *cache, const char *key, struct snapshot *s, struct kiln_err *err)
{
	char manifest[PATH_MAX], sha[65];
	json_error_t je;
	json_t *m;
	struct stat st;
	struct snapshot rec = { 0 };
	const char *state_sha;

	memset(s, 0, sizeof(*s));
	s->mem_fd = -1;
	snprintf(s->key, sizeof(s->key), "%s", key);
	snprintf(s->dir, sizeof(s->dir), "%s/snapshots/%s", cache, key);
	snap_paths(s);
	snprintf(manifest, sizeof(manifest), "%s/manifest.json", s->dir);
	if (access(s->dir, F_OK) < 0) {
		kiln_err_set(err, KERR_SNAPSHOT_MISSING, "no snapshot %s", key);
		return -ENOENT;
	}
	m = json_load_file(manifest, 0, &je);
	if (!m) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "snapshot %s: unreadable manifest: %s", key, je.text);
		return -EBADMSG;
	}
	state_sha = json_string_value(json_object_get(m, "state_sha256"));
	snprintf(s->release, sizeof(s->release), "%s", json_string_value(json_object_get(m, "release")) ?: "");
	s->memory_mib = (unsigned)json_integer_value(json_object_get(m, "memory_mib"));
	s->vcpus = (unsigned)json_integer_value(json_object_get(m, "vcpus"));
	s->net = json_is_true(json_object_get(m, "net"));
	rec.mem_size = (uint64_t)json_integer_value(json_object_get(m, "mem_size"));
	rec.mem_ino = (uint64_t)json_integer_value(json_object_get(m, "mem_ino"));
	rec.mem_mtime_ns = (uint64_t)json_integer_value(json_object_get(m, "mem_mtime_ns"));
	rec.mem_ctime_ns = (uint64_t)json_integer_value(json_object_get(m, "mem_ctime_ns"));
	snprintf(s->state_sha256, sizeof(s->state_sha256), "%s", state_sha ? state_sha : "");
	json_decref(m);
	if (!state_sha || !s->memory_mib || !s->vcpus) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "snapshot %s: manifest is missing fields", key);
		return -EBADMSG;
	}
	/* The device state is small: hash it every time. */
	if (fs_sha256_file(s->state, sha) < 0 || strcmp(sha, s->state_sha256)) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "snapshot %s: device state file is damaged (sha256 mismatch)", key);
		return -EBADMSG;
	}
	/* The RAM file is large: any write to it changes its ctime, which nobody can
	 * set back, and truncation changes its size. */
	if (stat(s->mem, &st) < 0) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "snapshot %s: memory file: %s", key, strerror(errno));
		return -EBADMSG;
	}
	mem_identity(&st, s);
	if (s->mem_size != (uint64_t)s->memory_mib << 20 || s->mem_size != rec.mem_size) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "snapshot %s: memory file is %llu bytes, expected %llu", key,
			     (unsigned long long)s->mem_size, (unsigned long long)rec.mem_size);
		return -EBADMSG;
	}
	if (s->mem_ino != rec.mem_ino || s->mem_mtime_ns != rec.mem_mtime_ns || s->mem_ctime_ns != rec.mem_ctime_ns) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "snapshot %s: memory file was modified after the snapshot was taken", key);
		return -EBADMSG;
	}
	if (access(s->disk, R_OK) < 0) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "snapshot %s: disk overlay: %s", key, strerror(errno));
		return -EBADMSG;
	}
	if (snapshot_qcow2_backing(s->disk, s->backing, sizeof(s->backing)) < 0 || s->backing[0] != '/') {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "snapshot %s: disk overlay has no valid backing file", key);
		return -EBADMSG;
	}
	return 0;
}

int snapshot_open(const char *cache, const char *key, struct snapshot *s, struct kiln_err *err)
{
	struct stat st;
	struct snapshot loaded;
	int r = snapshot_check(cache, key, s, err);

	if (r < 0)
		return r;
	s->mem_fd = jail_sealed_memfd(s->mem, &st, err);
	if (s->mem_fd < 0)
		return -EBADMSG;
	/* What was loaded is what the manifest describes (checked on the file
	 * that was read, not on the path again). */
	mem_identity(&st, &loaded);
	if (loaded.mem_size != s->mem_size || loaded.mem_ino != s->mem_ino || loaded.mem_mtime_ns != s->mem_mtime_ns ||
	    loaded.mem_ctime_ns != s->mem_ctime_ns) {
		snapshot_close(s);
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "snapshot %s: memory file changed while it was loaded", key);
		return -EBADMSG;
	}
	return 0;
}

void snapshot_close(struct snapshot *s)
{
	if (s->mem_fd >= 0)
		close(s->mem_fd);
	s->mem_fd = -1;
}

int snapshot_spawn(const struct snapshot *s, const struct vm_config *base, struct vm *vm, struct kiln_err *err)
{
	struct vm_config cfg = *base;

	if (s->mem_fd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "snapshot %s: its memory was not loaded", s->key);
	cfg.mem_file = s->mem;
	cfg.mem_fd = s->mem_fd; /* a private copy-on-write mapping: the template never changes */
	cfg.mem_share = 0;
	cfg.disk = s->disk;
	cfg.disk_format = "qcow2";
	cfg.disk_writable = 0;
	cfg.disk_backing = s->backing;
	cfg.incoming = 1;
	cfg.memory_mib = s->memory_mib;
	cfg.vcpus = s->vcpus;
	cfg.net = s->net; /* the device set must be the template's; the tap (net_fd) is the caller's */
	return vm_start(&cfg, vm, err);
}

int snapshot_load_fd(struct vm *vm, int state_fd, int timeout_ms, struct kiln_err *err)
{
	int64_t deadline = proto_now_ms() + timeout_ms;

	vm_qmp_migration_reset(vm);
	if (vm_qmp(vm, migrate_caps, deadline, NULL, err) < 0 || vm_qmp_getfd(vm, "snap", state_fd, deadline, err) < 0 ||
	    vm_qmp(vm, "{\"execute\":\"migrate-incoming\",\"arguments\":{\"uri\":\"fd:snap\"}}", deadline, NULL, err) < 0 ||
	    wait_migration(vm, deadline, err) < 0)
		return -1;
	/* The VM was stopped when saved, and QEMU carries that run state
	 * over: resume explicitly. */
	return vm_qmp(vm, "{\"execute\":\"cont\"}", deadline, NULL, err);
}

int snapshot_save_fd(struct vm *vm, int state_fd, int timeout_ms, struct kiln_err *err)
{
	int64_t deadline = proto_now_ms() + timeout_ms;

	/* x-ignore-shared: only RAM shared with a file stays out of the stream;
	 * a clone's private RAM (and a resumed VM's) goes in. When the stream is
	 * complete QEMU has flushed and released its disks. */
	vm_qmp_migration_reset(vm);
	if (vm_qmp(vm, migrate_caps, deadline, NULL, err) < 0 ||
	    vm_qmp(vm, "{\"execute\":\"migrate-set-parameters\",\"arguments\":{\"max-bandwidth\":107374182400}}",
		   deadline, NULL, err) < 0 ||
	    vm_qmp(vm, "{\"execute\":\"stop\"}", deadline, NULL, err) < 0 ||
	    vm_qmp_getfd(vm, "snap", state_fd, deadline, err) < 0 ||
	    vm_qmp(vm, "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"fd:snap\"}}", deadline, NULL, err) < 0)
		return -1;
	return wait_migration(vm, deadline, err);
}

int snapshot_mem_sha256(const struct snapshot *s, char out[65], struct kiln_err *err)
{
	char path[PATH_MAX], tmp[PATH_MAX + 16], line[256], want[192];
	unsigned char d[32];
	unsigned int dl;
	EVP_MD_CTX *md;
	uint8_t *buf;
	FILE *f;
	int ok = 0;

	snprintf(path, sizeof(path), "%s/mem.sha256", s->dir);
	snprintf(want, sizeof(want), "%llu %llu %llu %llu", (unsigned long long)s->mem_size,
		 (unsigned long long)s->mem_ino, (unsigned long long)s->mem_mtime_ns, (unsigned long long)s->mem_ctime_ns);
	f = fopen(path, "re");
	if (f) {
		if (fgets(line, sizeof(line), f) && strlen(line) > 65 && line[64] == ' ') {
			line[strcspn(line, "\n")] = '\0';
			if (!strcmp(line + 65, want)) {
				memcpy(out, line, 64);
				out[64] = '\0';
				ok = 1;
			}
		}
		fclose(f);
	}
	if (ok)
		return 0;
	if (s->mem_fd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "snapshot %s: its memory was not loaded", s->key);
	md = EVP_MD_CTX_new();
	buf = malloc(1 << 20);
	if (!md || !buf) {
		EVP_MD_CTX_free(md);
		free(buf);
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	}
	EVP_DigestInit_ex(md, EVP_sha256(), NULL);
	for (uint64_t off = 0; off < s->mem_size;) {
		ssize_t n = pread(s->mem_fd, buf, 1 << 20, (off_t)off);

		if (n <= 0) {
			EVP_MD_CTX_free(md);
			free(buf);
			return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "snapshot %s: reading its memory failed", s->key);
		}
		EVP_DigestUpdate(md, buf, (size_t)n);
		off += (uint64_t)n;
	}
	EVP_DigestFinal_ex(md, d, &dl);
	EVP_MD_CTX_free(md);
	free(buf);
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", d[i]);
	/* Cache it (write then rename: never half a line). */
	snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)gettid());
	f = fopen(tmp, "we");
	if (f) {
		fprintf(f, "%s %s\n", out, want);
		if (fclose(f) == 0)
			rename(tmp, path);
		else
			unlink(tmp);
	}
	return 0;
}

int snapshot_load(const struct snapshot *s, struct vm *vm, struct kiln_err *err)
{
	int state_fd = open(s->state, O_RDONLY | O_CLOEXEC);
	int r;

	if (state_fd < 0)
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s: %s", s->state, strerror(errno));
	r = snapshot_load_fd(vm, state_fd, RESTORE_TIMEOUT_MS, err);
	close(state_fd);
	return r;
}

int snapshot_restore(const struct snapshot *s, const struct vm_config *base, struct vm *vm, struct kiln_err *err)
{
	if (snapshot_spawn(s, base, vm, err) < 0)
		return -1;
	return snapshot_load(s, vm, err);
}

/* For each snapshot under cache/snapshots (not the dot entries), call fn
 * with its directory, its key (the directory's name) and its manifest
 * (NULL when unreadable; fn does not keep it). Returns how many entries fn
 * counted (returned 1 for). */
static int each_snapshot(const char *cache,
			 int (*fn)(const char *dir, const char *key, json_t *manifest, void *arg), void *arg)
{
	char root[PATH_MAX];
	DIR *d;
	struct dirent *e;
	int n = 0;

	snprintf(root, sizeof(root), "%s/snapshots", cache);
	d = opendir(root);
	if (!d)
		return 0;
	while ((e = readdir(d))) {
		char dir[PATH_MAX], manifest[PATH_MAX];
		json_t *m;

		if (e->d_name[0] == '.')
			continue;
		snprintf(dir, sizeof(dir), "%s/%s", root, e->d_name);
		snprintf(manifest, sizeof(manifest), "%s/manifest.json", dir);
		m = json_load_file(manifest, 0, NULL);
		n += fn(dir, e->d_name, m, arg);
		json_decref(m);
	}
	closedir(d);
	return n;
}

struct snapshot_walk {
	const char *cache;
	const struct vm_config *base;
	FILE *out;
};

/* snapshot_list's line for one snapshot. */
static int list_one(const char *dir, const char *key, json_t *m, void *arg)
{
	struct snapshot_walk *w = arg;
	struct snapshot s;
	struct kiln_err err = { .code = "" };
	char when[32] = "?";
	int r = snapshot_check(w->cache, key, &s, &err);

	if (m) {
		time_t t = (time_t)json_integer_value(json_object_get(m, "created"));
		struct tm tm;

		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", gmtime_r(&t, &tm));
	}
	fprintf(w->out, "%-16s %5u MiB %5u  %-20s %s\n", key, s.memory_mib, s.vcpus, when, r == 0 ? "ok" : err.message);
	return 1;
}

int snapshot_list(const char *cache, FILE *out)
{
	struct snapshot_walk w = { .cache = cache, .out = out };

	fprintf(out, "%-16s %8s %5s  %-20s %s\n", "KEY", "MEMORY", "VCPUS", "CREATED", "STATUS");
	return each_snapshot(cache, list_one, &w);
}

/* snapshot_prune for one snapshot: 1 removed. */
static int prune_one(const char *dir, const char *key, json_t *m, void *arg)
{
	struct snapshot_walk *w = arg;
	char want[17] = "";
	unsigned mem = 0, vcpus = 0;
	struct vm_config nb = *w->base;

	if (m) {
		mem = (unsigned)json_integer_value(json_object_get(m, "memory_mib"));
		vcpus = (unsigned)json_integer_value(json_object_get(m, "vcpus"));
		nb.net = json_is_true(json_object_get(m, "net"));
	}
	/* Keep what the current inputs would select for that size (with or
	 * without a NIC); the rest (older kernels, rootfs, kiln-init, QEMU,
	 * or unreadable) goes. */
	if (mem && vcpus && snapshot_key(&nb, mem, vcpus, want, NULL) == 0 && !strcmp(want, key))
		return 0;
	if (fs_rmtree(dir) < 0)
		return 0;
	fprintf(w->out, "removed %s\n", key);
	return 1;
}

int snapshot_prune(const struct vm_config *base, const char *cache, FILE *out)
{
	struct snapshot_walk w = { .cache = cache, .base = base, .out = out };

	return each_snapshot(cache, prune_one, &w);
}

int snapshot_rm(const char *cache, const char *key, struct kiln_err *err)
{
	char dir[PATH_MAX];

	if (!key[0] || strchr(key, '/') || key[0] == '.')
		return kiln_err_set(err, KERR_USAGE, "invalid snapshot key \"%s\"", key);
	snprintf(dir, sizeof(dir), "%s/snapshots/%s", cache, key);
	if (access(dir, F_OK) < 0)
		return kiln_err_set(err, KERR_SNAPSHOT_MISSING, "no snapshot %s", key);
	if (fs_rmtree(dir) < 0)
		return kiln_err_set(err, KERR_SNAPSHOT_ERROR, "cannot remove %s: %s", dir, strerror(errno));
	return 0;
}
