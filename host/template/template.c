/* template: kiln-host's template store (see template.h and
 * docs/templates.md). One mutex guards the list of templates and every
 * entry's fields; the slow work (an S3 download, a SHA-256 pass, a snapshot
 * boot) runs with it released while the entry is marked busy (fetching,
 * snapping), and other acquirers of that template wait on `changed`.
 *
 * Invariants: an entry with users > 0 is never evicted or freed; a customer
 * template's rootfs.ext4 exists only once verified (it is renamed there
 * after its SHA-256 matched); a snapshot or template this process uses holds
 * a shared flock on its last_used file, so that another kiln-host sharing
 * the cache never removes it (removal takes the exclusive lock first). */
#include "template.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "clock.h"
#include "fsutil.h"
#include "io.h"
#include "run/run.h"
#include "proto.h"
#include "spec.h"

/* ---- files ---- */

/* Not fs_sha256_file: the size returned is that of exactly the bytes hashed
 * (no stat racing a writer), links are not followed, and images of hundreds
 * of MiB are read 1 MiB at a time. */
int template_file_sha256(const char *path, char hex[65], uint64_t *size)
{
	static const char digits[] = "0123456789abcdef";
	unsigned char d[32], *buf;
	unsigned int dl = 0;
	EVP_MD_CTX *md;
	uint64_t total = 0;
	ssize_t n;
	int fd, r = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	md = EVP_MD_CTX_new();
	buf = malloc(1 << 20);
	if (!md || !buf) {
		r = -ENOMEM;
		goto out;
	}
	EVP_DigestInit_ex(md, EVP_sha256(), NULL);
	while ((n = read(fd, buf, 1 << 20)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			goto out;
		}
		EVP_DigestUpdate(md, buf, (size_t)n);
		total += (uint64_t)n;
	}
	EVP_DigestFinal_ex(md, d, &dl);
	for (unsigned i = 0; i < 32; i++) {
		hex[2 * i] = digits[d[i] >> 4];
		hex[2 * i + 1] = digits[d[i] & 15];
	}
	hex[64] = '\0';
	if (size)
		*size = total;
out:
	free(buf);
	EVP_MD_CTX_free(md);
	close(fd);
	return r;
}

int template_verify_file(const char *path, const struct tref *tref, struct kiln_err *err)
{
	char hex[65];
	uint64_t size = 0;
	int r = template_file_sha256(path, hex, &size);

	if (r < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(-r));
	if (size != tref->size)
		return kiln_err_set(err, KERR_INVALID_IMAGE,
				    "template %s: the image is %llu bytes, the reference says %llu (refused, not used)",
				    tref->name, (unsigned long long)size, (unsigned long long)tref->size);
	if (strcmp(hex, tref->sha256))
		return kiln_err_set(err, KERR_INVALID_IMAGE,
				    "template %s: sha256 mismatch: the image hashes to %s, the reference says %s (refused, not used)",
				    tref->name, hex, tref->sha256);
	return 0;
}

/* Bytes a directory tree occupies (allocated blocks), not following links. */
static uint64_t du_at(int at, const char *name, int depth)
{
	struct stat st;
	uint64_t total = 0;
	DIR *d;
	struct dirent *e;
	int fd;

	if (fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	total = (uint64_t)st.st_blocks * 512;
	if (!S_ISDIR(st.st_mode) || depth > 4)
		return total;
	fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return total;
	}
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			total += du_at(dirfd(d), e->d_name, depth + 1);
	closedir(d);
	return total;
}

/* Open (creating it) dir/last_used, whose mtime is dir's last use and
 * whose flock marks it in use. -1 on failure. */
static int open_last_used(const char *dir, int flags)
{
	char p[PATH_MAX + 16];

	snprintf(p, sizeof(p), "%s/last_used", dir);
	return open(p, flags | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
}

/* Open dir/last_used and take a shared lock on it: the mark of "in use"
 * that another process's eviction respects. -1 on failure. */
static int lock_shared(const char *dir)
{
	int fd = open_last_used(dir, O_RDWR);

	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_SH | LOCK_NB) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Mark dir used now (its last_used file's mtime). */
static void touch_used(const char *dir)
{
	int fd = open_last_used(dir, O_WRONLY);

	if (fd >= 0) {
		futimens(fd, NULL);
		close(fd);
	}
}

/* dir's last use (ms since the epoch); a directory without a last_used
 * file gets one now (its clock starts at first sight: an older kiln-host
 * that does not touch would otherwise lose a snapshot it uses). */
static int64_t last_used_ms(const char *dir)
{
	char p[PATH_MAX + 16];
	struct stat st;

	snprintf(p, sizeof(p), "%s/last_used", dir);
	if (stat(p, &st) < 0) {
		touch_used(dir);
		return clock_wall_ms();
	}
	return (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
}

/* Remove dir if no process holds its last_used lock: 1 removed, 0 in use. */
static int remove_unlocked(const char *dir)
{
	int fd = open_last_used(dir, O_RDWR), r;

	if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0) {
		close(fd);
		return 0;
	}
	r = fs_rmtree(dir);
	if (fd >= 0)
		close(fd);
	return r == 0;
}

size_t template_lru_choose(const struct template_lru *e, size_t n, uint64_t total, uint64_t budget, size_t *idx)
{
	size_t count = 0;
	char *taken = calloc(n ? n : 1, 1);

	if (!taken)
		return 0;
	while (total > budget) {
		size_t best = n;

		for (size_t i = 0; i < n; i++)
			if (!taken[i] && !e[i].in_use && e[i].evictable &&
			    (best == n || e[i].last_used_ms < e[best].last_used_ms))
				best = i;
		if (best == n)
			break;
		taken[best] = 1;
		idx[count++] = best;
		total = e[best].bytes >= total ? 0 : total - e[best].bytes;
	}
	free(taken);
	return count;
}

/* ---- the store ---- */

struct template {
	char name[64];
	int builtin;
	char sha256[65];
	char dir[PATH_MAX];        /* customer: <cache>/templates/<sha256> */
	char rootfs[PATH_MAX];
	struct tref tref;          /* the customer template's meta.json (env decref'd with it) */
	struct vm_config vmc;      /* base with this rootfs (pools keep pointers into it) */
	int local;                 /* the image is on disk, verified */
	int fetching, snapping;    /* slow work under way, the lock released */
	unsigned fetch_gen;        /* fetches finished */
	int fetch_rc;
	struct kiln_err fetch_err;
	struct snapshot snap, net_snap;
	int have_snap, have_net_snap;
	int64_t snap_retry_ms;     /* a snapshot failed: no new attempt before (monotonic) */
	int snap_lock, net_snap_lock; /* shared flocks on the snapshots' last_used (-1) */
	struct pool *pool;
	unsigned pool_size, pool_max, prestart;
	unsigned users;
	int lock_fd;               /* shared flock on dir/last_used while used (-1) */
	struct template *next;
};

struct template_store {
	struct template_store_config cfg;
	struct vm_config base;
	char image_dir[PATH_MAX], tdir[PATH_MAX], sdir[PATH_MAX];
	json_t *pools;
	pthread_mutex_t lock;
	pthread_cond_t changed;
	struct template *list;
	struct template *def;
	uint64_t fetches, fetch_failures, fetch_bytes, verify_failures, evictions, snapshots_expired;
	int64_t next_gc_ms;
};

/* A template's pool: templates.pools {"NAME": N} or {"NAME": {"size": N,
 * "max": M}} (M defaults to 4 x N), else the default template's --pool and
 * --pool-max, else none. */
static unsigned pool_size_for(const struct template_store *ts, const char *name, unsigned *max)
{
	json_t *v = ts->pools ? json_object_get(ts->pools, name) : NULL, *m = NULL;
	unsigned n;

	if (json_is_object(v)) {
		m = json_object_get(v, "max");
		v = json_object_get(v, "size");
	}
	if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 256) {
		n = (unsigned)json_integer_value(v);
		*max = json_is_integer(m) && json_integer_value(m) >= 0 && json_integer_value(m) <= 256
			       ? (unsigned)json_integer_value(m)
			       : n * 4;
		return n;
	}
	if (!strcmp(name, "default")) {
		*max = ts->cfg.default_pool_max;
		return ts->cfg.default_pool;
	}
	*max = 0;
	return 0;
}

static struct template *entry_new(struct template_store *ts, const char *name, int builtin, const char *sha256)
{
	struct template *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->builtin = builtin;
	if (sha256) {
		snprintf(t->sha256, sizeof(t->sha256), "%s", sha256);
		snprintf(t->dir, sizeof(t->dir), "%s/%s", ts->tdir, sha256);
		snprintf(t->rootfs, sizeof(t->rootfs), "%s/rootfs.ext4", t->dir);
	}
	t->snap.mem_fd = t->net_snap.mem_fd = -1;
	t->snap_lock = t->net_snap_lock = t->lock_fd = -1;
	t->pool_size = pool_size_for(ts, name, &t->pool_max);
	t->prestart = !strcmp(name, "default") && builtin ? ts->cfg.prestart : 0;
	t->vmc = ts->base;
	t->vmc.disk = t->rootfs;
	t->vmc.disk_format = "raw";
	t->next = ts->list;
	ts->list = t;
	return t;
}

static void entry_unload_locked(struct template *t)
{
	if (t->pool) {
		pool_stop(t->pool);
		t->pool = NULL;
	}
	if (t->have_snap)
		snapshot_close(&t->snap);
	if (t->have_net_snap)
		snapshot_close(&t->net_snap);
	t->have_snap = t->have_net_snap = 0;
	if (t->snap_lock >= 0)
		close(t->snap_lock);
	if (t->net_snap_lock >= 0)
		close(t->net_snap_lock);
	t->snap_lock = t->net_snap_lock = -1;
	if (t->lock_fd >= 0)
		close(t->lock_fd);
	t->lock_fd = -1;
}

static void entry_free(struct template *t)
{
	tref_free(&t->tref);
	free(t);
}

static struct template *find_locked(struct template_store *ts, const struct tref *r)
{
	for (struct template *t = ts->list; t; t = t->next) {
		if (r->builtin ? t->builtin && !strcmp(t->name, r->name) : !t->builtin && !strcmp(t->sha256, r->sha256))
			return t;
	}
	return NULL;
}

/* Load meta.json of a customer template directory found in the cache. */
static void scan_customer(struct template_store *ts)
{
	DIR *d = opendir(ts->tdir);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		char meta[PATH_MAX + 80], rootfs[PATH_MAX + 80];
		struct kiln_err err = { .code = "" };
		struct tref r;
		struct stat st;
		size_t len;
		char *text;
		struct template *t;

		if (!tref_hex64_ok(e->d_name))
			continue;
		snprintf(meta, sizeof(meta), "%s/%s/meta.json", ts->tdir, e->d_name);
		snprintf(rootfs, sizeof(rootfs), "%s/%s/rootfs.ext4", ts->tdir, e->d_name);
		if (stat(rootfs, &st) < 0 || !(text = io_read_file(meta, TREF_MAX_JSON, &len)))
			continue;
		if (tref_parse(text, len, &r, &err) == 0 && !r.builtin && !strcmp(r.sha256, e->d_name) &&
		    (uint64_t)st.st_size == r.size && !find_locked(ts, &r) && (t = entry_new(ts, r.name, 0, r.sha256))) {
			t->tref = r;
			t->local = 1;
		} else {
			tref_free(&r);
		}
		free(text);
	}
	closedir(d);
}

/* Open the snapshot for vmc (net: with a NIC), or make it. Lock released. */
static int snapshot_get(struct template_store *ts, struct vm_config *vmc, int net, struct snapshot *out, int *lock,
			const char *name, struct kiln_err *err)
{
	struct vm_config c = *vmc;
	char key[17], dir[PATH_MAX + 32];
	int r;

	c.net = net;
	if (snapshot_key(&c, ts->cfg.snap_memory_mib, ts->cfg.snap_vcpus, key, err) < 0)
		return -1;
	r = snapshot_open(ts->cfg.cache, key, out, err);
	if (r < 0) {
		fprintf(stderr, "kiln-host: template %s: %s; creating its snapshot%s\n", name, err->message,
			net ? " with a NIC (for egress)" : "");
		if (snapshot_create(&c, ts->cfg.cache, ts->cfg.snap_memory_mib, ts->cfg.snap_vcpus, ts->cfg.verbose, out,
				    err) < 0)
			return -1;
	}
	snprintf(dir, sizeof(dir), "%s/%s", ts->sdir, out->key);
	touch_used(dir);
	*lock = lock_shared(dir);
	return 0;
}

/* Note in a customer template's directory which snapshots belong to it, so
 * that evicting it removes them too. */
static void note_snapshot(const struct template *t, const char *key)
{
	char p[PATH_MAX + 32];
	int fd;

	if (t->builtin)
		return;
	snprintf(p, sizeof(p), "%s/snap-%s", t->dir, key);
	fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd >= 0)
		close(fd);
}

/* Make t's snapshots (the plain one, and with want_net the NIC one) and its
 * pool. Called with the lock held and t->snapping set by the caller;
 * releases the lock around the slow parts. -1 with err when a snapshot
 * could not be made (what was made is kept). */
static int prepare_locked(struct template_store *ts, struct template *t, int want_net, struct kiln_err *err)
{
	struct snapshot s, ns;
	int lk = -1, nlk = -1, need = !t->have_snap, need_net = want_net && !t->have_net_snap;
	int ok = 0, ok_net = 0;

	memset(&s, 0, sizeof(s));
	memset(&ns, 0, sizeof(ns));
	s.mem_fd = ns.mem_fd = -1;
	pthread_mutex_unlock(&ts->lock);
	if (need)
		ok = snapshot_get(ts, &t->vmc, 0, &s, &lk, t->name, err) == 0;
	if (need_net && (!need || ok))
		ok_net = snapshot_get(ts, &t->vmc, 1, &ns, &nlk, t->name, err) == 0;
	pthread_mutex_lock(&ts->lock);
	if (need && ok) {
		t->snap = s;
		t->snap_lock = lk;
		t->have_snap = 1;
		note_snapshot(t, s.key);
	}
	if (need_net && ok_net) {
		t->net_snap = ns;
		t->net_snap_lock = nlk;
		t->have_net_snap = 1;
		note_snapshot(t, ns.key);
	}
	if (t->have_snap && (t->pool_size || t->prestart) && !t->pool) {
		t->pool = pool_start(&t->snap, &t->vmc, t->pool_size, t->prestart, ts->cfg.cap, ts->cfg.ops, ts->cfg.clk);
		if (!t->pool)
			fprintf(stderr, "kiln-host: template %s: cannot start its pool\n", t->name);
		else {
			pool_set_max(t->pool, t->pool_max);
			pool_set_refills(t->pool, ts->cfg.pool_refills);
		}
	}
	return (need && !ok) || (need_net && !ok_net) ? -1 : 0;
}

const char *template_default_rootfs(const struct template_store *ts)
{
	return ts->def->rootfs;
}

struct template_store *template_store_open(const struct template_store_config *cfg, struct kiln_err *err)
{
	struct template_store *ts = calloc(1, sizeof(*ts));
	DIR *d;
	struct dirent *e;

	if (!ts) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		return NULL;
	}
	ts->cfg = *cfg;
	ts->base = *cfg->base;
	ts->pools = cfg->pools ? json_incref(cfg->pools) : NULL;
	snprintf(ts->image_dir, sizeof(ts->image_dir), "%s", cfg->image_dir);
	snprintf(ts->tdir, sizeof(ts->tdir), "%s/templates", cfg->cache);
	snprintf(ts->sdir, sizeof(ts->sdir), "%s/snapshots", cfg->cache);
	pthread_mutex_init(&ts->lock, NULL);
	pthread_cond_init(&ts->changed, NULL);
	if (fs_mkdir_p(ts->tdir, 0755) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", ts->tdir, strerror(errno));
		goto fail;
	}
	/* Built-ins: rootfs.ext4 is default, rootfs-NAME.ext4 is NAME. */
	d = opendir(ts->image_dir);
	if (!d) {
		kiln_err_set(err, KERR_IMAGE_MISSING, "%s: %s", ts->image_dir, strerror(errno));
		goto fail;
	}
	while ((e = readdir(d))) {
		char name[64];
		size_t n = strlen(e->d_name);
		struct template *t;

		if (!strcmp(e->d_name, "rootfs.ext4"))
			snprintf(name, sizeof(name), "default");
		else if (n > 12 && n - 12 < sizeof(name) && !strncmp(e->d_name, "rootfs-", 7) &&
			 !strcmp(e->d_name + n - 5, ".ext4"))
			snprintf(name, sizeof(name), "%.*s", (int)(n - 12), e->d_name + 7);
		else
			continue;
		if (spec_template_name_check(name, "image", NULL) < 0)
			continue;
		t = entry_new(ts, name, 1, NULL);
		if (!t) {
			closedir(d);
			kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
			goto fail;
		}
		snprintf(t->rootfs, sizeof(t->rootfs), "%s/%s", ts->image_dir, e->d_name);
		tref_builtin(&t->tref, name);
		t->local = 1;
		if (!strcmp(name, "default"))
			ts->def = t;
	}
	closedir(d);
	if (!ts->def) {
		kiln_err_set(err, KERR_IMAGE_MISSING, "%s/rootfs.ext4: missing (build it with `make image`)", ts->image_dir);
		goto fail;
	}
	scan_customer(ts);
	if (!cfg->cold) {
		pthread_mutex_lock(&ts->lock);
		for (struct template *t = ts->list; t; t = t->next) {
			/* The default template is ready at once, as are built-ins with a pool. */
			if (!t->builtin || (t != ts->def && !t->pool_size))
				continue;
			t->snapping = 1;
			if (prepare_locked(ts, t, t == ts->def && cfg->net, err) < 0) {
				t->snapping = 0;
				pthread_mutex_unlock(&ts->lock);
				goto fail;
			}
			t->snapping = 0;
		}
		pthread_mutex_unlock(&ts->lock);
	}
	return ts;
fail:
	template_store_close(ts);
	return NULL;
}

void template_store_close(struct template_store *ts)
{
	if (!ts)
		return;
	while (ts->list) {
		struct template *t = ts->list;

		ts->list = t->next;
		entry_unload_locked(t);
		entry_free(t);
	}
	json_decref(ts->pools);
	pthread_mutex_destroy(&ts->lock);
	pthread_cond_destroy(&ts->changed);
	free(ts);
}

int template_check(struct template_store *ts, const struct tref *tref, int have_s3, struct kiln_err *err)
{
	struct template *t;
	int local;

	if (!tref)
		return 0;
	pthread_mutex_lock(&ts->lock);
	t = find_locked(ts, tref);
	local = t && t->local;
	pthread_mutex_unlock(&ts->lock);
	if (tref->builtin && !t)
		return kiln_err_set(err, KERR_NO_TEMPLATE, "template %s: this host has no such built-in image", tref->name);
	if (!tref->builtin && !local && !have_s3) {
		char p[PATH_MAX + 80];

		snprintf(p, sizeof(p), "%s/%s/rootfs.ext4", ts->tdir, tref->sha256);
		if (access(p, R_OK) < 0)
			return kiln_err_set(err, KERR_NO_S3, "template %s: not on this host, and no S3 to fetch it from",
					    tref->name);
	}
	return 0;
}

/* Write meta.json (the TREF) into dir, durably enough (temp + rename). */
static int write_meta(const char *dir, const struct tref *r, struct kiln_err *err)
{
	char tmp[PATH_MAX + 32], fin[PATH_MAX + 32];
	json_t *j = tref_json(r);
	int rc;

	snprintf(tmp, sizeof(tmp), "%s/meta.json.tmp", dir);
	snprintf(fin, sizeof(fin), "%s/meta.json", dir);
	rc = j ? json_dump_file(j, tmp, JSON_COMPACT) : -1;
	json_decref(j);
	if (rc < 0 || rename(tmp, fin) < 0) {
		unlink(tmp);
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot write %s", fin);
	}
	return 0;
}

/* Download t's image from S3 into a temporary file beside its final name,
 * verify size and SHA-256, then rename it into place (lock released). */
static int fetch(struct template_store *ts, struct template *t, const struct tref *r, const struct s3_config *s3,
		 struct kiln_err *err)
{
	char tmp[PATH_MAX + 48];
	struct stat st;

	if (stat(t->rootfs, &st) == 0 && (uint64_t)st.st_size == r->size) {
		/* Another kiln-host sharing the cache fetched (and verified) it. */
		return write_meta(t->dir, r, err) < 0 ? -1 : 0;
	}
	if (!s3)
		return kiln_err_set(err, KERR_NO_S3, "template %s: not on this host, and no S3 to fetch it from", r->name);
	if (fs_mkdir_p(t->dir, 0755) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", t->dir, strerror(errno));
	snprintf(tmp, sizeof(tmp), "%s/.fetch-%d-%lx", t->dir, (int)getpid(), (unsigned long)pthread_self());
	{
		/* The object's size first: nothing larger (or smaller) than the
		 * reference says is downloaded at all. */
		uint64_t osize = 0;
		int h = s3_head(s3, r->s3_key, &osize, err);

		if (h == 0)
			kiln_err_set(err, KERR_S3_NOT_FOUND, "template %s: %s is not in S3", r->name, r->s3_key);
		else if (h > 0 && osize != r->size) {
			kiln_err_set(err, KERR_INVALID_IMAGE,
				     "template %s: %s is %llu bytes, the reference says %llu (refused, not fetched)", r->name,
				     r->s3_key, (unsigned long long)osize, (unsigned long long)r->size);
			fprintf(stderr, "kiln-host: REFUSED %s: %s\n", r->s3_key, err->message);
			pthread_mutex_lock(&ts->lock);
			ts->verify_failures++;
			pthread_mutex_unlock(&ts->lock);
		}
		if (h <= 0 || osize != r->size)
			goto fail;
	}
	if (s3_get_file(s3, r->s3_key, tmp, err) < 0) {
		unlink(tmp);
		goto fail;
	}
	if (template_verify_file(tmp, r, err) < 0) {
		fprintf(stderr, "kiln-host: REFUSED %s: %s\n", r->s3_key, err->message);
		pthread_mutex_lock(&ts->lock);
		ts->verify_failures++;
		pthread_mutex_unlock(&ts->lock);
		unlink(tmp);
		goto fail;
	}
	if (chmod(tmp, 0444) < 0 || write_meta(t->dir, r, err) < 0 || rename(tmp, t->rootfs) < 0) {
		if (!err->code[0] || err->errc != KERR_HOST_ERROR)
			kiln_err_set(err, KERR_HOST_ERROR, "cannot install %s: %s", t->rootfs, strerror(errno));
		unlink(tmp);
		goto fail;
	}
	touch_used(t->dir);
	pthread_mutex_lock(&ts->lock);
	ts->fetches++;
	ts->fetch_bytes += r->size;
	pthread_mutex_unlock(&ts->lock);
	return 0;
fail:
	/* A directory holding nothing verified goes (it may hold another
	 * process's fetch in progress: rmdir fails then, which is fine). */
	{
		char p[PATH_MAX + 16];

		snprintf(p, sizeof(p), "%s/meta.json", t->dir);
		if (access(t->rootfs, F_OK) < 0) {
			unlink(p);
			snprintf(p, sizeof(p), "%s/last_used", t->dir);
			unlink(p);
			rmdir(t->dir);
		}
	}
	pthread_mutex_lock(&ts->lock);
	ts->fetch_failures++;
	pthread_mutex_unlock(&ts->lock);
	return -1;
}

static void use_fill(struct template *t, const struct tref *r, int need_net, struct template_use *out)
{
	memset(out, 0, sizeof(*out));
	out->t = t;
	snprintf(out->name, sizeof(out->name), "%s", t->name);
	out->rootfs = t->rootfs;
	out->snap = t->have_snap ? &t->snap : NULL;
	out->net_snap = need_net && t->have_net_snap ? &t->net_snap : NULL;
	out->pool = t->pool;
	if (r && r->user_set) {
		out->user_set = 1;
		out->uid = r->uid;
		out->gid = r->gid;
	}
}

int template_acquire(struct template_store *ts, const struct tref *tref, int need_net, const struct s3_config *s3,
		     struct template_use *out, struct kiln_err *err)
{
	struct tref def;
	const struct tref *r = tref;
	struct template *t;
	int tried_snap = 0, rc = 0, fetched = 0;

	memset(out, 0, sizeof(*out));
	if (!r) {
		tref_builtin(&def, "default");
		r = &def;
	}
	need_net = need_net && ts->cfg.net;
	pthread_mutex_lock(&ts->lock);
	t = find_locked(ts, r);
	if (!t && r->builtin) {
		pthread_mutex_unlock(&ts->lock);
		return kiln_err_set(err, KERR_NO_TEMPLATE, "template %s: this host has no such built-in image", r->name);
	}
	if (!t && !(t = entry_new(ts, r->name, 0, r->sha256))) {
		pthread_mutex_unlock(&ts->lock);
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	}
	t->users++; /* pinned: never evicted while we prepare it */
	if (!t->builtin && t->local && t->lock_fd < 0) {
		/* Held from now on; then make sure another kiln-host sharing the
		 * cache did not evict it before (fetch it again if so). */
		t->lock_fd = lock_shared(t->dir);
		if (t->lock_fd < 0 || access(t->rootfs, R_OK) < 0) {
			entry_unload_locked(t);
			t->local = 0;
		}
	}
	for (;;) {
		if (t->fetching || t->snapping) {
			unsigned gen = t->fetch_gen;
			int was_fetching = t->fetching;

			while (t->fetching || t->snapping)
				pthread_cond_wait(&ts->changed, &ts->lock);
			if (was_fetching && t->fetch_gen != gen && t->fetch_rc < 0) {
				/* The fetch we waited for failed: its error is ours. */
				*err = t->fetch_err;
				rc = -1;
				break;
			}
			continue;
		}
		if (!t->local) {
			struct kiln_err ferr = { .code = "" };
			int fr;

			t->fetching = 1;
			pthread_mutex_unlock(&ts->lock);
			fr = fetch(ts, t, r, s3, &ferr);
			pthread_mutex_lock(&ts->lock);
			t->fetching = 0;
			t->fetch_gen++;
			t->fetch_rc = fr;
			t->fetch_err = ferr;
			if (fr == 0) {
				fetched = 1;
				t->local = 1;
				tref_free(&t->tref);
				t->tref = *r;
				if (r->env)
					json_incref(r->env);
				if (t->lock_fd < 0)
					t->lock_fd = lock_shared(t->dir);
			}
			pthread_cond_broadcast(&ts->changed);
			if (fr < 0) {
				*err = ferr;
				rc = -1;
				break;
			}
			continue;
		}
		if (!ts->cfg.cold && !tried_snap && (!t->have_snap || (need_net && !t->have_net_snap)) &&
		    kclock_mono_ms(ts->cfg.clk) >= t->snap_retry_ms) {
			struct kiln_err serr = { .code = "" };

			tried_snap = 1;
			t->snapping = 1;
			if (prepare_locked(ts, t, need_net, &serr) < 0) {
				/* An image that does not boot would cost every task a
				 * snapshot attempt: cold boots for a while instead. */
				t->snap_retry_ms = kclock_mono_ms(ts->cfg.clk) + TEMPLATE_SNAP_RETRY_MS;
				fprintf(stderr, "kiln-host: template %s: no snapshot (%s); its VMs boot cold for %d s\n",
					t->name, serr.message, TEMPLATE_SNAP_RETRY_MS / 1000);
			}
			t->snapping = 0;
			pthread_cond_broadcast(&ts->changed);
			continue;
		}
		break;
	}
	if (rc < 0) {
		t->users--;
		if (!t->users && !t->local && !t->fetching) {
			/* Nothing on disk: forget the entry. */
			struct template **pp = &ts->list;

			while (*pp && *pp != t)
				pp = &(*pp)->next;
			if (*pp)
				*pp = t->next;
			entry_unload_locked(t);
			entry_free(t);
		}
		pthread_mutex_unlock(&ts->lock);
		return -1;
	}
	use_fill(t, tref ? tref : (t->builtin ? NULL : &t->tref), need_net, out);
	if (!t->builtin)
		touch_used(t->dir);
	pthread_mutex_unlock(&ts->lock);
	if (fetched)
		template_store_gc(ts, 1); /* the store grew: keep to the budget (this one is in use) */
	return 0;
}

void template_release(struct template_store *ts, struct template_use *u)
{
	struct template *t = u->t;

	if (!t)
		return;
	pthread_mutex_lock(&ts->lock);
	if (!t->builtin)
		touch_used(t->dir);
	if (t->users)
		t->users--;
	pthread_mutex_unlock(&ts->lock);
	u->t = NULL;
}

/* rename(from, to), or, across file systems (a spool and a cache on two),
 * a copy to a temporary name beside to, renamed over it, and from removed.
 * 0 or -1 with errno. */
static int move_file(const char *from, const char *to)
{
	char tmp[PATH_MAX + 32], *buf = NULL;
	int in, out, e;
	struct stat st;
	off_t left;

	if (rename(from, to) == 0)
		return 0;
	if (errno != EXDEV)
		return -1;
	snprintf(tmp, sizeof(tmp), "%s.copy-%d", to, (int)getpid());
	in = open(from, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return -1;
	out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
	if (out < 0 || fstat(in, &st) < 0)
		goto fail;
	/* read/write: copy_file_range refuses (EXDEV) between file systems of
	 * different types, which is the case here. */
	buf = malloc(1 << 20);
	if (!buf)
		goto fail;
	for (left = st.st_size; left > 0;) {
		ssize_t n = read(in, buf, 1 << 20);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || io_write_all(out, buf, (size_t)n) < 0)
			goto fail;
		left -= n;
	}
	free(buf);
	buf = NULL;
	if (fsync(out) < 0 || close(out) < 0) {
		out = -1;
		goto fail;
	}
	close(in);
	if (rename(tmp, to) < 0) {
		e = errno;
		unlink(tmp);
		errno = e;
		return -1;
	}
	unlink(from);
	return 0;
fail:
	e = errno ? errno : EIO;
	free(buf);
	if (out >= 0)
		close(out);
	close(in);
	unlink(tmp);
	errno = e;
	return -1;
}

int template_install(struct template_store *ts, const char *path, const struct tref *tref, struct kiln_err *err)
{
	char dir[PATH_MAX + 80], fin[PATH_MAX + 96];
	struct template *t;

	if (tref->builtin)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot install a built-in");
	if (template_verify_file(path, tref, err) < 0)
		return -1;
	snprintf(dir, sizeof(dir), "%s/%s", ts->tdir, tref->sha256);
	snprintf(fin, sizeof(fin), "%s/rootfs.ext4", dir);
	if (fs_mkdir_p(dir, 0755) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", dir, strerror(errno));
	{
		struct stat st;

		if (stat(fin, &st) == 0 && (uint64_t)st.st_size == tref->size) {
			/* The same image is here already (its name is its hash): the
			 * file in place, perhaps backing running VMs, stays. */
			unlink(path);
		} else if (chmod(path, 0444) < 0 || write_meta(dir, tref, err) < 0 || move_file(path, fin) < 0) {
			return kiln_err_set(err, KERR_HOST_ERROR, "cannot install %s: %s", fin, strerror(errno));
		}
	}
	touch_used(dir);
	pthread_mutex_lock(&ts->lock);
	t = find_locked(ts, tref);
	if (!t)
		t = entry_new(ts, tref->name, 0, tref->sha256);
	if (t && !t->local) {
		t->local = 1;
		tref_free(&t->tref);
		t->tref = *tref;
		if (tref->env)
			json_incref(tref->env);
	}
	pthread_mutex_unlock(&ts->lock);
	return 0;
}

json_t *template_store_json(struct template_store *ts)
{
	json_t *a = json_array();

	pthread_mutex_lock(&ts->lock);
	for (struct template *t = ts->list; t && a; t = t->next) {
		if (!t->local)
			continue;
		json_array_append_new(a, json_pack("{s:s, s:o, s:b, s:i, s:b}", "name", t->name, "sha256",
						   t->builtin ? json_null() : json_string(t->sha256), "builtin", t->builtin,
						   "ready", t->pool ? (int)pool_ready(t->pool) : 0, "snapshot", t->have_snap));
	}
	pthread_mutex_unlock(&ts->lock);
	return a;
}

struct pool *template_store_default_pool(struct template_store *ts)
{
	struct pool *p;

	pthread_mutex_lock(&ts->lock);
	p = ts->def->pool;
	pthread_mutex_unlock(&ts->lock);
	return p;
}

void template_store_metrics(struct template_store *ts, struct buf *b)
{
	pthread_mutex_lock(&ts->lock);
	buf_adds(b, "# HELP kiln_host_template_pool_ready Warm pool VMs ready, by template.\n"
		 "# TYPE kiln_host_template_pool_ready gauge\n");
	for (struct template *t = ts->list; t; t = t->next)
		if (t->local)
			buf_printf(b, "kiln_host_template_pool_ready{template=\"%s\",sha256=\"%s\"} %u\n", t->name,
				   t->builtin ? "" : t->sha256, t->pool ? pool_ready(t->pool) : 0);
	buf_adds(b, "# HELP kiln_host_template_users Tasks, sessions and builds using a template now.\n"
		 "# TYPE kiln_host_template_users gauge\n");
	for (struct template *t = ts->list; t; t = t->next)
		if (t->local)
			buf_printf(b, "kiln_host_template_users{template=\"%s\",sha256=\"%s\"} %u\n", t->name,
				   t->builtin ? "" : t->sha256, t->users);
	buf_adds(b, "# HELP kiln_host_template_fetches_total Template images fetched from S3 and verified.\n"
		 "# TYPE kiln_host_template_fetches_total counter\n");
	buf_printf(b, "kiln_host_template_fetches_total %llu\n", (unsigned long long)ts->fetches);
	buf_adds(b, "# HELP kiln_host_template_fetch_bytes_total Bytes of template images fetched.\n"
		 "# TYPE kiln_host_template_fetch_bytes_total counter\n");
	buf_printf(b, "kiln_host_template_fetch_bytes_total %llu\n", (unsigned long long)ts->fetch_bytes);
	buf_adds(b, "# HELP kiln_host_template_fetch_failures_total Template fetches that failed (S3 or verification).\n"
		 "# TYPE kiln_host_template_fetch_failures_total counter\n");
	buf_printf(b, "kiln_host_template_fetch_failures_total %llu\n", (unsigned long long)ts->fetch_failures);
	buf_adds(b, "# HELP kiln_host_template_verify_failures_total Fetched images refused: SHA-256 or size mismatch.\n"
		 "# TYPE kiln_host_template_verify_failures_total counter\n");
	buf_printf(b, "kiln_host_template_verify_failures_total %llu\n", (unsigned long long)ts->verify_failures);
	buf_adds(b, "# HELP kiln_host_template_evictions_total Templates evicted for the disk budget.\n"
		 "# TYPE kiln_host_template_evictions_total counter\n");
	buf_printf(b, "kiln_host_template_evictions_total %llu\n", (unsigned long long)ts->evictions);
	buf_adds(b, "# HELP kiln_host_snapshots_expired_total Snapshots removed after their TTL unused.\n"
		 "# TYPE kiln_host_snapshots_expired_total counter\n");
	buf_printf(b, "kiln_host_snapshots_expired_total %llu\n", (unsigned long long)ts->snapshots_expired);
	pthread_mutex_unlock(&ts->lock);
}

/* Whether a snapshot key is one this process has loaded (lock held). */
static int snapshot_ours_locked(struct template_store *ts, const char *key)
{
	for (struct template *t = ts->list; t; t = t->next)
		if ((t->have_snap && !strcmp(t->snap.key, key)) || (t->have_net_snap && !strcmp(t->net_snap.key, key)))
			return 1;
	return 0;
}

/* Remove the snapshots a customer template's directory notes (snap-KEY). */
static void remove_template_snapshots(struct template_store *ts, const char *tdir)
{
	DIR *d = opendir(tdir);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		char sd[PATH_MAX + 64];

		if (strncmp(e->d_name, "snap-", 5) || strlen(e->d_name) != 21 || strchr(e->d_name, '/'))
			continue;
		snprintf(sd, sizeof(sd), "%s/%s", ts->sdir, e->d_name + 5);
		remove_unlocked(sd);
	}
	closedir(d);
}

int template_store_gc(struct template_store *ts, int force)
{
	struct template_lru *lru = NULL;
	char (*names)[72] = NULL;
	size_t n = 0, cap = 0, *idx = NULL, nidx;
	uint64_t total;
	int64_t now = clock_wall_ms();
	int evicted = 0;
	DIR *d;
	struct dirent *e;

	pthread_mutex_lock(&ts->lock);
	if (!force && kclock_mono_ms(ts->cfg.clk) < ts->next_gc_ms) {
		pthread_mutex_unlock(&ts->lock);
		return 0;
	}
	ts->next_gc_ms = kclock_mono_ms(ts->cfg.clk) + TEMPLATE_GC_PERIOD_MS;
	/* What we use is used now (pools restore from their snapshot all the time). */
	for (struct template *t = ts->list; t; t = t->next) {
		char sd[PATH_MAX + 32];

		if (t->users && !t->builtin)
			touch_used(t->dir);
		if (t->have_snap) {
			snprintf(sd, sizeof(sd), "%s/%s", ts->sdir, t->snap.key);
			touch_used(sd);
		}
		if (t->have_net_snap) {
			snprintf(sd, sizeof(sd), "%s/%s", ts->sdir, t->net_snap.key);
			touch_used(sd);
		}
	}
	/* Snapshots unused for the TTL, whoever made them (one another process
	 * uses holds its lock and stays). */
	if (ts->cfg.snapshot_ttl_s && (d = opendir(ts->sdir))) {
		while ((e = readdir(d))) {
			char sd[PATH_MAX + 32];

			if (e->d_name[0] == '.' || strlen(e->d_name) != 16 || snapshot_ours_locked(ts, e->d_name))
				continue;
			snprintf(sd, sizeof(sd), "%s/%s", ts->sdir, e->d_name);
			if (now - last_used_ms(sd) > (int64_t)ts->cfg.snapshot_ttl_s * 1000 && remove_unlocked(sd)) {
				fprintf(stderr, "kiln-host: snapshot %s unused for %u s: removed\n", e->d_name,
					ts->cfg.snapshot_ttl_s);
				ts->snapshots_expired++;
			}
		}
		closedir(d);
	}
	if (!ts->cfg.disk_budget_mib)
		goto out;
	/* The budget: customer templates (all of the cache's) plus every snapshot. */
	total = du_at(AT_FDCWD, ts->sdir, 0) + du_at(AT_FDCWD, ts->tdir, 0);
	if (total <= ts->cfg.disk_budget_mib << 20)
		goto out;
	if (!(d = opendir(ts->tdir)))
		goto out;
	while ((e = readdir(d))) {
		char td[PATH_MAX + 80];
		struct tref r;
		struct template *t;

		if (!tref_hex64_ok(e->d_name))
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			void *a = realloc(lru, nc * sizeof(*lru)), *b;

			if (!a)
				break;
			lru = a;
			b = realloc(names, nc * sizeof(*names));
			if (!b)
				break;
			names = b;
			cap = nc;
		}
		snprintf(td, sizeof(td), "%s/%s", ts->tdir, e->d_name);
		snprintf(names[n], sizeof(names[n]), "%s", e->d_name);
		memset(&r, 0, sizeof(r));
		snprintf(r.sha256, sizeof(r.sha256), "%s", e->d_name);
		t = find_locked(ts, &r);
		lru[n] = (struct template_lru){
			.last_used_ms = last_used_ms(td),
			.bytes = du_at(AT_FDCWD, td, 0),
			.in_use = t && (t->users || t->fetching || t->snapping),
			.evictable = 1,
		};
		{
			/* The snapshots it noted count as its own. */
			DIR *sdn = opendir(td);
			struct dirent *se;

			while (sdn && (se = readdir(sdn))) {
				char sd[PATH_MAX + 64];

				if (strncmp(se->d_name, "snap-", 5) || strlen(se->d_name) != 21)
					continue;
				snprintf(sd, sizeof(sd), "%s/%s", ts->sdir, se->d_name + 5);
				lru[n].bytes += du_at(AT_FDCWD, sd, 0);
			}
			if (sdn)
				closedir(sdn);
		}
		n++;
	}
	closedir(d);
	idx = calloc(n ? n : 1, sizeof(*idx));
	if (!idx)
		goto out;
	for (size_t i = 0; i < n; i++)
		lru[i].id = names[i];
	nidx = template_lru_choose(lru, n, total, ts->cfg.disk_budget_mib << 20, idx);
	for (size_t i = 0; i < nidx; i++) {
		char td[PATH_MAX + 80];
		struct tref r;
		struct template *t, **pp;

		memset(&r, 0, sizeof(r));
		snprintf(r.sha256, sizeof(r.sha256), "%s", names[idx[i]]);
		snprintf(td, sizeof(td), "%s/%s", ts->tdir, names[idx[i]]);
		t = find_locked(ts, &r);
		if (t)
			entry_unload_locked(t); /* our own locks go first */
		remove_template_snapshots(ts, td);
		if (!remove_unlocked(td))
			continue; /* another process uses it: it stays */
		fprintf(stderr, "kiln-host: template %s evicted (unused since %lld s, disk budget %llu MiB)\n",
			names[idx[i]], (long long)((now - lru[idx[i]].last_used_ms) / 1000),
			(unsigned long long)ts->cfg.disk_budget_mib);
		ts->evictions++;
		evicted++;
		if (t) {
			for (pp = &ts->list; *pp && *pp != t; pp = &(*pp)->next)
				;
			if (*pp)
				*pp = t->next;
			entry_free(t);
		}
	}
out:
	pthread_mutex_unlock(&ts->lock);
	free(idx);
	free(lru);
	free(names);
	return evicted;
}
