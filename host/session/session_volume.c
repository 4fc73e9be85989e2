/* session_volume: volumes in S3 and in a session's slots (volume.h,
 * docs/architecture.md "Volumes"). A volume's slot is a sparse file of
 * VM_VOL_SLOT_BYTES in the session's directory (<dir>/vol<N>.img, the
 * inode QEMU holds open), filled before the guest runs (create, resume:
 * session_boot) and mounted by the guest's root at create; its data
 * extents go to S3 as the volume's new version when the session pauses or
 * is destroyed, and, after a kiln-host that was killed, when the next one
 * starts (sessions_open: what the guest synced is kept). Next to each slot,
 * vol<N>.json says whose volume it holds. Read-only volumes are never
 * uploaded: whatever the guest does to its copy stays on this host. */
#include "session_int.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "io.h"
#include "pause_chunks.h"
#include "proto.h"
#include "run/run.h"
#include "task/task.h"
#include "volume.h"

#define VOL_MKFS          "/sbin/mkfs.ext4"
#define VOL_MOUNT_MS      60000
#define VOL_SYNC_MS       60000
#define VOL_BLOCK         4096u

static int pwrite_all(int fd, const void *buf, size_t n, off_t off)
{
	const uint8_t *p = buf;

	while (n) {
		ssize_t w = pwrite(fd, p, n, off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
		off += w;
	}
	return 0;
}

static ssize_t pread_all(int fd, void *buf, size_t n, off_t off)
{
	uint8_t *p = buf;
	size_t got = 0;

	while (got < n) {
		ssize_t r = pread(fd, p + got, n - got, off + (off_t)got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

/* ---- S3 ------------------------------------------------------------------ */

int vol_get_manifest(const struct s3_config *c, const char *customer, const char *id, struct vmanifest *out,
		     struct kiln_err *err)
{
	char key[512], *text = NULL;
	ssize_t len;
	int r;

	memset(out, 0, sizeof(*out));
	vol_manifest_key(key, sizeof(key), customer, id);
	len = session_get_small(c, key, &text, err);
	if (len < 0)
		return err->errc == KERR_S3_NOT_FOUND ? 0 : -1;
	r = vmanifest_parse(text, (size_t)len, customer, id, out, err);
	free(text);
	return r < 0 ? -1 : 1;
}

/* What a volume's chunks are written into: the slot, at each chunk's
 * offset, its all-zero blocks left as holes (the slot was emptied). */
struct fill_sink {
	int fd;
	const struct pchunk_list *l;
	size_t next;
};

static int zero_block(const uint8_t *p, size_t n)
{
	const uint64_t *w = (const uint64_t *)p;

	for (size_t i = 0; i < n / 8; i++)
		if (w[i])
			return 0;
	for (size_t i = n & ~(size_t)7; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

static int fill_write(void *ctx, const void *buf, size_t len)
{
	struct fill_sink *f = ctx;
	const uint8_t *b = buf;
	uint64_t off;
	size_t i = 0;

	if (f->next >= f->l->n || f->l->c[f->next].size != len)
		return -1;
	off = f->l->c[f->next++].offset;
	while (i < len) {
		size_t run, n = len - i < VOL_BLOCK ? len - i : VOL_BLOCK;

		if (zero_block(b + i, n)) {
			i += n;
			continue;
		}
		/* A run of blocks with data, written at once. */
		for (run = n; i + run < len;) {
			size_t m = len - i - run < VOL_BLOCK ? len - i - run : VOL_BLOCK;

			if (zero_block(b + i + run, m))
				break;
			run += m;
		}
		if (pwrite_all(f->fd, b + i, run, (off_t)(off + i)) < 0)
			return -1;
		i += run;
	}
	return 0;
}

/* A new volume: ext4 of size_mib in the emptied slot, its root directory
 * owned by uid:gid (the user the session's commands run as); inode tables
 * and journal made now (as holes where they are zero), not by the guest. */
static int vol_mkfs(const char *path, unsigned size_mib, unsigned uid, unsigned gid, struct kiln_err *err)
{
	char opts[96], size[32];
	char *argv[] = { VOL_MKFS, "-F", "-q", "-t", "ext4", "-E", opts, (char *)path, size, NULL };

	snprintf(opts, sizeof(opts), "root_owner=%u:%u,lazy_itable_init=0,lazy_journal_init=0", uid, gid);
	snprintf(size, sizeof(size), "%uM", size_mib);
	if (snapshot_run_cmd(argv) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "%s %s failed (is e2fsprogs installed?)", VOL_MKFS, path);
	return 0;
}

int vol_fill(const struct s3_config *c, const char *customer, struct vol_mount *v, const char *path,
	     unsigned uid, unsigned gid, char generation[48], int *fresh, uint64_t *bytes, struct kiln_err *err)
{
	struct vmanifest m;
	struct fill_sink f = { .fd = -1 };
	int have, r = -1;

	generation[0] = '\0';
	*fresh = 0;
	*bytes = 0;
	have = vol_get_manifest(c, customer, v->id, &m, err);
	if (have < 0) {
		if (err->errc == KERR_SNAPSHOT_CORRUPT)
			kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "volume %s is damaged in S3: %s", v->id, err->message);
		goto out;
	}
	/* Emptied in place: QEMU holds this inode open (its size, the guest's
	 * view, stays). */
	f.fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (f.fd < 0 || fallocate(f.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)VM_VOL_SLOT_BYTES) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
		goto out;
	}
	if (!have) {
		if (vol_mkfs(path, v->size_mib, uid, gid, err) < 0)
			goto out;
		*fresh = 1;
		r = 0;
		goto out;
	}
	if (m.size_mib != v->size_mib) {
		/* Its ext4 is that size: what is uploaded later too. */
		fprintf(stderr, "kiln-host: volume %s: %u MiB in S3 (the spec says %u): its own size is kept\n", v->id,
			m.size_mib, v->size_mib);
		v->size_mib = m.size_mib;
	}
	f.l = &m.chunks;
	if (pchunk_stream_all(c, &m.chunks, fill_write, &f, PAUSE_WORKERS, NULL, NULL, err) < 0) {
		if (err->errc == KERR_SNAPSHOT_CORRUPT)
			kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "volume %s is damaged in S3: %s", v->id, err->message);
		goto out;
	}
	if (f.next != m.chunks.n) {
		kiln_err_set(err, KERR_HOST_ERROR, "volume %s: writing %s: %s", v->id, path, strerror(errno));
		goto out;
	}
	snprintf(generation, 48, "%s", m.generation);
	*bytes = session_zbytes(&m.chunks);
	r = 0;
out:
	if (f.fd >= 0)
		close(f.fd);
	vmanifest_free(&m);
	return r;
}

static int named(const struct pchunk_list *l, const char *key)
{
	for (size_t i = 0; i < l->n; i++)
		if (!strcmp(l->c[i].key, key))
			return 1;
	return 0;
}

static int same_chunks(const struct pchunk_list *a, const struct pchunk_list *b)
{
	if (a->n != b->n)
		return 0;
	for (size_t i = 0; i < a->n; i++)
		if (a->c[i].offset != b->c[i].offset || strcmp(a->c[i].key, b->c[i].key))
			return 0;
	return 1;
}

int vol_upload(const struct s3_config *c, const char *customer, const char *id, unsigned size_mib,
	       const char *path, const char *host_id, const char *expect_gen, char generation[48], uint64_t *bytes,
	       struct kiln_err *err)
{
	struct vmanifest old = { 0 };
	struct pchunk_list st = { 0 }, l = { 0 };
	struct pchunk_up *up = NULL;
	uint64_t end = (uint64_t)size_mib << 20, *offs = NULL, w;
	size_t n = 0;
	char prefix[512], key[512], *text = NULL;
	unsigned rnd = 0;
	int have, fd = -1, r = -1;
	json_t *m;

	*bytes = 0;
	have = vol_get_manifest(c, customer, id, &old, err);
	if (have < 0)
		return -1;
	if (expect_gen && strcmp(expect_gen, have ? old.generation : "")) {
		kiln_err_set(err, KERR_BUSY, "volume %s was written by another session since this one mounted it (now %s)", id,
			     have ? old.generation : "gone");
		goto out;
	}
	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd = (unsigned)getpid() ^ (unsigned)proto_now_ms();
	snprintf(generation, 48, "%lld-%08x", (long long)clock_wall_ms(), rnd);
	vol_prefix(prefix, sizeof(prefix), customer, id);
	snprintf(prefix + strlen(prefix), sizeof(prefix) - strlen(prefix), "%s/", generation);
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	offs = malloc((end / PCHUNK_RAW_MAX + 1) * sizeof(*offs));
	if (fd < 0 || !offs) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, fd < 0 ? strerror(errno) : "out of memory");
		goto out;
	}
	if (!(up = pchunk_up_start(c, prefix, PAUSE_WORKERS)) || (have && pchunk_up_known(up, NULL, &old.chunks) < 0)) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot start the uploader");
		goto out;
	}
	/* Windows of PCHUNK_RAW_MAX at fixed offsets (so that an unchanged one
	 * hashes as before and is not sent again), those with data only. */
	for (w = 0; w < end; w += PCHUNK_RAW_MAX) {
		off_t d = lseek(fd, (off_t)w, SEEK_DATA);
		size_t len = end - w < PCHUNK_RAW_MAX ? (size_t)(end - w) : PCHUNK_RAW_MAX;
		uint8_t *b;

		if (d < 0 && errno == ENXIO)
			break; /* no data after w */
		if (d < 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
			goto out;
		}
		if ((uint64_t)d >= w + len)
			continue; /* a hole; the next window with data is further on */
		if (!(b = pchunk_buf_alloc())) {
			kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
			goto out;
		}
		if (pread_all(fd, b, len, (off_t)w) != (ssize_t)len) {
			pchunk_buf_free(b);
			kiln_err_set(err, KERR_HOST_ERROR, "reading %s: %s", path, strerror(errno));
			goto out;
		}
		if (zero_block(b, len)) {
			pchunk_buf_free(b);
			continue;
		}
		offs[n++] = w;
		if (pchunk_up_add(up, 1, b, len) < 0)
			break; /* pchunk_up_finish says why */
	}
	r = pchunk_up_finish(up, &st, &l, bytes, err);
	up = NULL;
	if (r < 0)
		goto out;
	r = -1;
	for (size_t i = 0; i < l.n && i < n; i++)
		l.c[i].offset = offs[i];
	/* Nothing changed (every chunk known, at the same place): the current
	 * version stays, generation and all, so that a manifest naming it
	 * (a paused session's) still matches. */
	if (have && same_chunks(&l, &old.chunks)) {
		snprintf(generation, 48, "%s", old.generation);
		r = 0;
		goto out;
	}
	m = vmanifest_json(customer, id, size_mib, generation, host_id, &l);
	text = m ? json_dumps(m, JSON_COMPACT) : NULL;
	json_decref(m);
	if (!text) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	vol_manifest_key(key, sizeof(key), customer, id);
	if (s3_put_buffer(c, key, text, strlen(text), "application/json", err) < 0)
		goto out;
	r = 0;
	/* The new version is in: the old one's chunks it does not name go. */
	for (size_t i = 0; have && i < old.chunks.n; i++)
		if (!named(&l, old.chunks.c[i].key) && s3_delete(c, old.chunks.c[i].key, &(struct kiln_err){ .code = "" }) < 0)
			fprintf(stderr, "kiln-host: volume %s: could not delete %s (left in S3)\n", id, old.chunks.c[i].key);
out:
	if (up) {
		struct kiln_err e2;
		uint64_t b2 = 0;

		pchunk_up_finish(up, &st, &l, &b2, &e2); /* its lists, if any, are freed below */
	}
	if (fd >= 0)
		close(fd);
	free(offs);
	free(text);
	free(st.c);
	free(l.c);
	vmanifest_free(&old);
	return r;
}

int vol_delete(const struct s3_config *c, const char *customer, const char *id, struct kiln_err *err)
{
	char prefix[512], mkey[512], what[96];

	if (!spool_id_ok(customer) || !spool_id_ok(id))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "customer and volume: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
	vol_prefix(prefix, sizeof(prefix), customer, id);
	vol_manifest_key(mkey, sizeof(mkey), customer, id);
	snprintf(what, sizeof(what), "volume %s", id);
	return session_s3_delete_prefix(c, prefix, mkey, what);
}

/* ---- a session's slots --------------------------------------------------- */

static void slot_paths(const struct session *s, unsigned i, char *img, size_t icap, char *meta, size_t mcap)
{
	if (img)
		snprintf(img, icap, "%s/vol%u.img", s->dir, i);
	if (meta)
		snprintf(meta, mcap, "%s/vol%u.json", s->dir, i);
}

/* vol<N>.json: whose volume slot N holds, and the generation it came from
 * (what a later upload expects to replace). Written after the fill: a
 * slot without it is not uploaded after a crash. */
static int slot_meta_write(const struct session *s, unsigned i, struct kiln_err *err)
{
	const struct vol_mount *v = &s->vols[i];
	char meta[PATH_MAX + 32], tmp[PATH_MAX + 40];
	json_t *j = json_pack("{s:s, s:s, s:s, s:b, s:i, s:s}", "customer", s->customer, "session", s->id, "id", v->id,
			      "read_only", v->read_only, "size_mib", (int)v->size_mib, "generation", s->vol_gen[i]);
	int r;

	slot_paths(s, i, NULL, 0, meta, sizeof(meta));
	snprintf(tmp, sizeof(tmp), "%s.tmp", meta);
	r = j ? json_dump_file(j, tmp, JSON_COMPACT) : -1;
	json_decref(j);
	if (r < 0 || rename(tmp, meta) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot write %s", meta);
	return 0;
}

int session_vols_parse(struct session *s, struct kiln_err *err)
{
	return vol_spec_parse(json_object_get(s->spec, "volumes"), s->vols, &s->nvols, err);
}

int session_vols_rw(const struct session *s)
{
	for (size_t i = 0; i < s->nvols; i++)
		if (!s->vols[i].read_only)
			return 1;
	return 0;
}

/* A resumed guest has volume i mounted as it was at the pause (its page
 * cache, its ext4's in-memory state): the slot must hold that version. A
 * read-write volume another session wrote since is refused (the guest
 * would write over it from stale metadata); a read-only one is mounted as
 * it is now, logged (kiln-api keeps writers away from paused readers). */
static int vol_expected(const struct session *s, unsigned i, struct kiln_err *err)
{
	const char *want = json_string_value(json_object_get(s->vol_expect, s->vols[i].id));

	if (!want || !strcmp(want, s->vol_gen[i]))
		return 0;
	if (s->vols[i].read_only) {
		fprintf(stderr,
			"kiln-host: session %s: read-only volume %s changed since the guest mounted it (%s, now %s)\n",
			s->id, s->vols[i].id, want[0] ? want : "new", s->vol_gen[i][0] ? s->vol_gen[i] : "none");
		return 0;
	}
	return kiln_err_set(err, KERR_INCOMPATIBLE_SNAPSHOT,
			    "volume %s was written by another session since this one paused (version %s, now %s): it "
			    "cannot be mounted under this session's memory again", s->vols[i].id, want[0] ? want : "new",
			    s->vol_gen[i][0] ? s->vol_gen[i] : "none");
}

int session_vols_fill(struct session_table *ss, struct session *s, struct kiln_err *err)
{
	struct hostd_s3 s3;
	unsigned uid = 1000, gid = 1000; /* the guest's `sandbox` user (run.h) */
	int r = 0;

	if (!s->nvols)
		return 0;
	if (hostd_s3_take(ss->d, &s3) < 0)
		return kiln_err_set(err, KERR_NO_S3, "volumes need S3, and this host has none configured");
	if (s->has_tu && s->tu.user_set) {
		uid = s->tu.uid;
		gid = s->tu.gid;
	}
	for (unsigned i = 0; r == 0 && i < s->nvols; i++) {
		char img[PATH_MAX + 32];
		int64_t t0 = proto_now_ms();
		uint64_t bytes = 0;

		slot_paths(s, i, img, sizeof(img), NULL, 0);
		r = vol_fill(&s3.c, s->customer, &s->vols[i], img, uid, gid, s->vol_gen[i], &s->vol_fresh[i], &bytes, err);
		if (r == 0)
			r = vol_expected(s, i, err);
		if (r == 0)
			r = slot_meta_write(s, i, err);
		if (r == 0 && i + 1 == s->nvols)
			s->vols_filled = 1;
		if (r == 0)
			fprintf(stderr, "kiln-host: session %s: volume %s in slot %u (%s, %s) in %lld ms, %llu bytes from S3\n",
				s->id, s->vols[i].id, i, s->vols[i].read_only ? "read-only" : "read-write",
				s->vol_fresh[i] ? "new" : "from S3", (long long)(proto_now_ms() - t0),
				(unsigned long long)bytes);
	}
	hostd_s3_free(&s3);
	return r;
}

/* Output of a command the host runs in the guest (its last bytes kept for
 * an error message). */
struct guest_out {
	char text[512];
	size_t len;
};

static void guest_out_event(void *ctx, int event, const void *data, size_t len)
{
	struct guest_out *o = ctx;

	if (event != RUN_EV_STDOUT && event != RUN_EV_STDERR)
		return;
	for (size_t i = 0; i < len; i++) {
		if (o->len == sizeof(o->text) - 1) {
			memmove(o->text, o->text + 1, o->len - 1);
			o->len--;
		}
		o->text[o->len++] = ((const char *)data)[i] >= 0x20 ? ((const char *)data)[i] : ' ';
	}
	o->text[o->len] = '\0';
}

/* Run argv as the guest's root (as a template build does); 0 when it
 * exited 0, else -1 with err (vm_error, naming what, with its output). */
static int guest_root(struct session_table *ss, struct session *s, const char *what, char **argv, size_t argc,
		      unsigned timeout_s, struct kiln_err *err)
{
	char *env[] = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL };
	struct task_spec spec = { .argv = argv, .argc = argc, .env = env, .nenv = 1, .cwd = "/",
				  .vcpus = s->vcpus, .memory_mib = s->memory_mib, .timeout_s = timeout_s,
				  .output_mib = 1 };
	struct run_opts ro = *hostd_run_opts(ss->d);
	struct guest_out o = { .len = 0 };
	json_t *res;
	int rc = -1;

	ro.user_set = 1;
	ro.uid = 0;
	ro.gid = 0;
	ro.vm.cancel_fd = -1;
	ro.stream = NULL;
	ro.on_event = guest_out_event;
	ro.event_ctx = &o;
	ro.extra_flags = 0;
	ro.input_fd = -1;
	ro.exec_id = NULL;
	res = run_session_exec(&s->vm, &spec, &ro);
	if (res && !strcmp(json_string_value(json_object_get(res, "state")) ?: "", "succeeded"))
		rc = 0;
	else if (res && json_integer_value(json_object_get(res, "exit_code")))
		kiln_err_set(err, KERR_VM_ERROR, "%s exited with status %d: %s", what,
			     (int)json_integer_value(json_object_get(res, "exit_code")), o.text);
	else
		kiln_err_set(err, KERR_VM_ERROR, "%s failed (%s)", what,
			     json_string_value(json_object_get(res, "end_reason")) ?: "the VM did not answer");
	json_decref(res);
	return rc;
}

/* The guest finds the slot by its drive's serial (it has no udev), drops
 * what its kernel cached of the device while it was empty (the partition
 * scan at the template's boot read its first blocks), and mounts it. */
static const char vol_mount_sh[] =
	"dev=; for b in /sys/block/vd*; do "
	"[ \"$(cat \"$b/serial\" 2>/dev/null)\" = \"$1\" ] && dev=/dev/${b##*/}; done; "
	"[ -n \"$dev\" ] || { echo \"no disk with serial $1\" >&2; exit 1; }; "
	"blockdev --flushbufs \"$dev\" 2>/dev/null || echo 3 > /proc/sys/vm/drop_caches; "
	"mkdir -p -- \"$2\" && mount -t ext4 -o \"$3\" \"$dev\" \"$2\" && "
	/* A new volume's root: every user of the guest may make files there
	 * (sticky, as /tmp): kiln's commands run as `sandbox`, E2B's as
	 * `user`, and either may be the first to use it. */
	"{ [ \"$4\" != new ] || chmod 1777 \"$2\"; }";

int session_vols_mount(struct session_table *ss, struct session *s, struct kiln_err *err)
{
	for (unsigned i = 0; i < s->nvols; i++) {
		char serial[32], what[128];
		char *argv[] = { "/bin/sh", "-c", (char *)vol_mount_sh, "kiln-volume", serial, s->vols[i].path,
				 s->vols[i].read_only ? "ro,noatime" : "rw,noatime",
				 s->vol_fresh[i] && !s->vols[i].read_only ? "new" : "old", NULL };
		int64_t t0 = proto_now_ms();

		snprintf(serial, sizeof(serial), VM_VOL_SERIAL "%u", i);
		snprintf(what, sizeof(what), "mounting volume %s at %s", s->vols[i].id, s->vols[i].path);
		if (guest_root(ss, s, what, argv, 8, VOL_MOUNT_MS / 1000, err) < 0)
			return -1;
		fprintf(stderr, "kiln-host: session %s: volume %s mounted at %s in %lld ms\n", s->id, s->vols[i].id,
			s->vols[i].path, (long long)(proto_now_ms() - t0));
	}
	return 0;
}

int session_vols_sync_guest(struct session_table *ss, struct session *s, struct kiln_err *err)
{
	char *argv[] = { "/bin/sync", NULL };

	return guest_root(ss, s, "sync", argv, 1, VOL_SYNC_MS / 1000, err);
}

int session_vols_save(struct session_table *ss, struct session *s, const struct s3_config *c, const char *why,
		      uint64_t *bytes, struct kiln_err *err)
{
	for (unsigned i = 0; i < s->nvols; i++) {
		char img[PATH_MAX + 32], gen[48];
		int64_t t0 = proto_now_ms();
		uint64_t b = 0;

		if (s->vols[i].read_only)
			continue;
		slot_paths(s, i, img, sizeof(img), NULL, 0);
		if (vol_upload(c, s->customer, s->vols[i].id, s->vols[i].size_mib, img, ss->host_id, s->vol_gen[i], gen,
			       &b, err) < 0) {
			char m[sizeof(err->message)];

			snprintf(m, sizeof(m), "%s", err->message);
			kiln_err_set(err, err->errc, "volume %s: %s", s->vols[i].id, m);
			return -1;
		}
		snprintf(s->vol_gen[i], sizeof(s->vol_gen[i]), "%s", gen);
		if (slot_meta_write(s, i, &(struct kiln_err){ .code = "" }) < 0)
			fprintf(stderr, "kiln-host: session %s: volume %s: its slot's record is stale\n", s->id,
				s->vols[i].id);
		if (bytes)
			*bytes += b;
		fprintf(stderr, "kiln-host: session %s: volume %s kept in S3 (%s) in %lld ms, %llu bytes sent\n", s->id,
			s->vols[i].id, why, (long long)(proto_now_ms() - t0), (unsigned long long)b);
	}
	s->vols_done = 1;
	return 0;
}

void session_vols_teardown(struct session_table *ss, struct session *s)
{
	struct hostd_s3 s3;
	struct kiln_err e = { .code = "" };

	/* A create or resume that failed leaves the volume as it was in S3
	 * (its generation is what the session's manifest names). */
	if (!s->vols_filled || !s->vols_live || s->vols_done || !session_vols_rw(s))
		return;
	s->vols_done = 1;
	if (hostd_s3_take(ss->d, &s3) < 0)
		return;
	if (session_vols_save(ss, s, &s3.c, "its VM ended", NULL, &e) < 0)
		fprintf(stderr, "kiln-host: session %s: %s (NOT kept in S3)\n", s->id, e.message);
	hostd_s3_free(&s3);
}

/* One slot an earlier kiln-host left in dir: uploaded when it was a
 * read-write volume's (its record says whose). */
static void recover_slot(struct session_table *ss, const struct s3_config *c, const char *dir, unsigned i)
{
	char img[PATH_MAX + 32], meta[PATH_MAX + 32], gen[48];
	json_error_t je;
	json_t *j;
	const char *cust, *id, *sid, *from;
	json_int_t size;
	uint64_t bytes = 0;
	int64_t t0 = proto_now_ms();
	struct kiln_err e = { .code = "" };

	snprintf(img, sizeof(img), "%s/vol%u.img", dir, i);
	snprintf(meta, sizeof(meta), "%s/vol%u.json", dir, i);
	j = json_load_file(meta, JSON_REJECT_DUPLICATES, &je);
	if (!j)
		return;
	cust = json_string_value(json_object_get(j, "customer"));
	id = json_string_value(json_object_get(j, "id"));
	sid = json_string_value(json_object_get(j, "session"));
	from = json_string_value(json_object_get(j, "generation"));
	size = json_integer_value(json_object_get(j, "size_mib"));
	if (!cust || !spool_id_ok(cust) || !id || !spool_id_ok(id) || !from || strlen(from) >= 48 ||
	    size < VOL_SIZE_MIB_MIN || size > (json_int_t)VOL_SIZE_MIB_MAX ||
	    !json_is_boolean(json_object_get(j, "read_only"))) {
		fprintf(stderr, "kiln-host: %s: not a volume slot's record; left alone\n", meta);
	} else if (!json_is_true(json_object_get(j, "read_only"))) {
		if (vol_upload(c, cust, id, (unsigned)size, img, ss->host_id, from, gen, &bytes, &e) < 0)
			fprintf(stderr, "kiln-host: session %s (of the process before): volume %s NOT kept in S3: %s\n",
				sid ?: "?", id, e.message);
		else
			fprintf(stderr,
				"kiln-host: session %s (of the process before): volume %s kept in S3 in %lld ms, %llu "
				"bytes sent\n",
				sid ?: "?", id, (long long)(proto_now_ms() - t0), (unsigned long long)bytes);
	}
	json_decref(j);
}

void sessions_vols_recover(struct session_table *ss)
{
	DIR *d = opendir(ss->root);
	struct hostd_s3 s3;
	struct dirent *e;
	int have_s3;

	if (!d)
		return;
	have_s3 = hostd_s3_take(ss->d, &s3) == 0;
	while ((e = readdir(d))) {
		char dir[PATH_MAX];

		if (e->d_name[0] == '.' || !spool_id_ok(e->d_name))
			continue;
		snprintf(dir, sizeof(dir), "%s/%s", ss->root, e->d_name);
		for (unsigned i = 0; i < VOL_SLOTS; i++) {
			char meta[PATH_MAX + 32];

			snprintf(meta, sizeof(meta), "%s/vol%u.json", dir, i);
			if (access(meta, F_OK) < 0)
				continue;
			if (!have_s3)
				fprintf(stderr, "kiln-host: %s: a volume slot, and no S3 to keep it in (removed)\n", meta);
			else
				recover_slot(ss, &s3.c, dir, i);
		}
	}
	closedir(d);
	if (have_s3)
		hostd_s3_free(&s3);
}

/* ---- the host's volume endpoints --------------------------------------- */

json_t *sessions_volume_get(struct session_table *ss, const char *customer, const char *id, struct kiln_err *err)
{
	struct hostd_s3 s3;
	struct vmanifest m;
	json_t *out = NULL;
	int have;

	if (!spool_id_ok(customer) || !spool_id_ok(id)) {
		kiln_err_set(err, KERR_INVALID_REQUEST,
			     "customer and volume: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
		return NULL;
	}
	if (hostd_s3_take(ss->d, &s3) < 0) {
		kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
		return NULL;
	}
	have = vol_get_manifest(&s3.c, customer, id, &m, err);
	if (have == 0)
		kiln_err_set(err, KERR_NOT_FOUND, "volume %s has no data in S3 (never mounted read-write, or deleted)", id);
	if (have > 0)
		out = json_pack("{s:s, s:b, s:I, s:I, s:i, s:s, s:i}", "id", id, "exists", 1, "bytes",
				(json_int_t)m.chunks.total, "stored_bytes", (json_int_t)session_zbytes(&m.chunks),
				"size_mib", (int)m.size_mib, "generation", m.generation, "chunks", (int)m.chunks.n);
	vmanifest_free(&m);
	hostd_s3_free(&s3);
	return out;
}

int sessions_volume_delete(struct session_table *ss, const char *customer, const char *id, struct kiln_err *err)
{
	struct hostd_s3 s3;
	int n;

	if (hostd_s3_take(ss->d, &s3) < 0)
		return kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
	n = vol_delete(&s3.c, customer, id, err);
	hostd_s3_free(&s3);
	return n;
}

int session_vols_keep(struct session_table *ss, struct session *s, struct kiln_err *err)
{
	struct hostd_s3 s3;
	struct kiln_err e = { .code = "" };
	int stopped = 0, r;

	if (!session_vols_rw(s) || !s->vols_filled || s->vols_done)
		return 0;
	if (hostd_s3_take(ss->d, &s3) < 0)
		return kiln_err_set(err, KERR_NO_S3, "this host has no S3 to keep the session's volumes in");
	if (s->state == SS_RUNNING && s->vm.pid > 0) {
		/* What the guest has written but not synced is in its page
		 * cache: sync first, while it runs. Then stop it (QEMU drains
		 * and flushes its drives), so that nothing changes the slots
		 * while they upload. */
		if (!s->stopped && session_vols_sync_guest(ss, s, &e) < 0)
			fprintf(stderr, "kiln-host: session %s: %s (its volumes are kept as they are)\n", s->id, e.message);
		if (vm_qmp(&s->vm, "{\"execute\":\"stop\"}", proto_now_ms() + 10000, NULL, &e) == 0)
			stopped = 1;
		else
			fprintf(stderr, "kiln-host: session %s: cannot stop its VM: %s\n", s->id, e.message);
	}
	r = session_vols_save(ss, s, &s3.c, "destroy", NULL, err);
	if (r < 0) {
		char m[sizeof(err->message)];

		snprintf(m, sizeof(m), "%s", err->message);
		kiln_err_set(err, kiln_err_is_s3(err->errc) ? KERR_S3_UNAVAILABLE : err->errc,
			     "the session's volume could not be kept in S3, so the session was not destroyed "
			     "(destroy it again to retry): %s", m);
		if (stopped && vm_qmp(&s->vm, "{\"execute\":\"cont\"}", proto_now_ms() + 10000, NULL, &e) < 0)
			fprintf(stderr, "kiln-host: session %s: its VM does not go on: %s\n", s->id, e.message);
	}
	hostd_s3_free(&s3);
	return r;
}
