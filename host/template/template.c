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
 * the cache never removes it (removal takes the exclusive lock first).
 *
 * This file is the store and its entries (open, check, acquire, release,
 * install, JSON, metrics); template_disk.c the on-disk pieces (hashes,
 * disk usage, last_used locks, the LRU choice); template_gc.c eviction and
 * snapshot expiry. */
#include "template_int.h"


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
#include "metrics.h"
#include "proto.h"
#include "run/run.h"
#include "spec.h"

/* ---- the store ---- */

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
		struct template_ref ref;
		struct stat st;
		size_t len;
		char *text;
		struct template *t;

		if (!template_ref_hex64_ok(e->d_name))
			continue;
		snprintf(meta, sizeof(meta), "%s/%s/meta.json", ts->tdir, e->d_name);
		snprintf(rootfs, sizeof(rootfs), "%s/%s/rootfs.ext4", ts->tdir, e->d_name);
		if (stat(rootfs, &st) < 0 || !(text = io_read_file(meta, TEMPLATE_REF_MAX_JSON, &len)))
			continue;
		if (template_ref_parse(text, len, &ref, &err) == 0 && !ref.builtin && !strcmp(ref.sha256, e->d_name) &&
		    (uint64_t)st.st_size == ref.size && !template_find_locked(ts, &ref) &&
		    (t = entry_new(ts, ref.name, 0, ref.sha256))) {
			t->ref = ref;
			t->local = 1;
		} else {
			template_ref_free(&ref);
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
	if (snapshot_resume_key(&c, ts->cfg.snap_memory_mib, ts->cfg.snap_vcpus, out->rkey, NULL) < 0)
		out->rkey[0] = '\0';
	snprintf(dir, sizeof(dir), "%s/%s", ts->sdir, out->key);
	template_touch_used(dir);
	*lock = template_lock_shared(dir);
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
		template_ref_builtin(&t->ref, name);
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
		template_entry_unload_locked(t);
		template_entry_free(t);
	}
	json_decref(ts->pools);
	pthread_mutex_destroy(&ts->lock);
	pthread_cond_destroy(&ts->changed);
	free(ts);
}

int template_check(struct template_store *ts, const struct template_ref *ref, int have_s3, struct kiln_err *err)
{
	struct template *t;
	int local;

	if (!ref)
		return 0;
	pthread_mutex_lock(&ts->lock);
	t = template_find_locked(ts, ref);
	local = t && t->local;
	pthread_mutex_unlock(&ts->lock);
	if (ref->builtin && !t)
		return kiln_err_set(err, KERR_NO_TEMPLATE, "template %s: this host has no such built-in image", ref->name);
	if (!ref->builtin && !local && !have_s3) {
		char p[PATH_MAX + 80];

		snprintf(p, sizeof(p), "%s/%s/rootfs.ext4", ts->tdir, ref->sha256);
		if (access(p, R_OK) < 0)
			return kiln_err_set(err, KERR_NO_S3, "template %s: not on this host, and no S3 to fetch it from",
					    ref->name);
	}
	return 0;
}

/* Write meta.json (the TREF) into dir, durably enough (temp + rename). */
static int write_meta(const char *dir, const struct template_ref *ref, struct kiln_err *err)
{
	char tmp[PATH_MAX + 32], fin[PATH_MAX + 32];
	json_t *j = template_ref_json(ref);
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
static int fetch(struct template_store *ts, struct template *t, const struct template_ref *ref,
		 const struct s3_config *s3, struct kiln_err *err)
{
	char tmp[PATH_MAX + 48];
	struct stat st;

	if (stat(t->rootfs, &st) == 0 && (uint64_t)st.st_size == ref->size) {
		/* Another kiln-host sharing the cache fetched (and verified) it. */
		return write_meta(t->dir, ref, err) < 0 ? -1 : 0;
	}
	if (!s3)
		return kiln_err_set(err, KERR_NO_S3, "template %s: not on this host, and no S3 to fetch it from", ref->name);
	if (fs_mkdir_p(t->dir, 0755) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", t->dir, strerror(errno));
	snprintf(tmp, sizeof(tmp), "%s/.fetch-%d-%lx", t->dir, (int)getpid(), (unsigned long)pthread_self());
	{
		/* The object's size first: nothing larger (or smaller) than the
		 * reference says is downloaded at all. */
		uint64_t osize = 0;
		int h = s3_head(s3, ref->s3_key, &osize, err);

		if (h == 0)
			kiln_err_set(err, KERR_S3_NOT_FOUND, "template %s: %s is not in S3", ref->name, ref->s3_key);
		else if (h > 0 && osize != ref->size) {
			kiln_err_set(err, KERR_INVALID_IMAGE,
				     "template %s: %s is %llu bytes, the reference says %llu (refused, not fetched)", ref->name,
				     ref->s3_key, (unsigned long long)osize, (unsigned long long)ref->size);
			fprintf(stderr, "kiln-host: REFUSED %s: %s\n", ref->s3_key, err->message);
			pthread_mutex_lock(&ts->lock);
			ts->verify_failures++;
			pthread_mutex_unlock(&ts->lock);
		}
		if (h <= 0 || osize != ref->size)
			goto fail;
	}
	if (s3_get_file(s3, ref->s3_key, tmp, err) < 0) {
		unlink(tmp);
		goto fail;
	}
	if (template_verify_file(tmp, ref, err) < 0) {
		fprintf(stderr, "kiln-host: REFUSED %s: %s\n", ref->s3_key, err->message);
		pthread_mutex_lock(&ts->lock);
		ts->verify_failures++;
		pthread_mutex_unlock(&ts->lock);
		unlink(tmp);
		goto fail;
	}
	if (chmod(tmp, 0444) < 0 || write_meta(t->dir, ref, err) < 0 || rename(tmp, t->rootfs) < 0) {
		if (!err->code[0] || err->errc != KERR_HOST_ERROR)
			kiln_err_set(err, KERR_HOST_ERROR, "cannot install %s: %s", t->rootfs, strerror(errno));
		unlink(tmp);
		goto fail;
	}
	template_touch_used(t->dir);
	pthread_mutex_lock(&ts->lock);
	ts->fetches++;
	ts->fetch_bytes += ref->size;
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

static void use_fill(struct template *t, const struct template_ref *ref, int need_net, struct template_use *out)
{
	memset(out, 0, sizeof(*out));
	out->t = t;
	snprintf(out->name, sizeof(out->name), "%s", t->name);
	out->rootfs = t->rootfs;
	out->snap = t->have_snap ? &t->snap : NULL;
	out->net_snap = need_net && t->have_net_snap ? &t->net_snap : NULL;
	out->pool = t->pool;
	if (ref && ref->user_set) {
		out->user_set = 1;
		out->uid = ref->uid;
		out->gid = ref->gid;
	}
}

int template_acquire(struct template_store *ts, const struct template_ref *want, int need_net,
		     const struct s3_config *s3, struct template_use *out, struct kiln_err *err)
{
	struct template_ref def;
	const struct template_ref *ref = want; /* or the default */
	struct template *t;
	int tried_snap = 0, rc = 0, fetched = 0;

	memset(out, 0, sizeof(*out));
	if (!ref) {
		template_ref_builtin(&def, "default");
		ref = &def;
	}
	need_net = need_net && ts->cfg.net;
	pthread_mutex_lock(&ts->lock);
	t = template_find_locked(ts, ref);
	if (!t && ref->builtin) {
		pthread_mutex_unlock(&ts->lock);
		return kiln_err_set(err, KERR_NO_TEMPLATE, "template %s: this host has no such built-in image", ref->name);
	}
	if (!t && !(t = entry_new(ts, ref->name, 0, ref->sha256))) {
		pthread_mutex_unlock(&ts->lock);
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	}
	t->users++; /* pinned: never evicted while we prepare it */
	if (!t->builtin && t->local && t->lock_fd < 0) {
		/* Held from now on; then make sure another kiln-host sharing the
		 * cache did not evict it before (fetch it again if so). */
		t->lock_fd = template_lock_shared(t->dir);
		if (t->lock_fd < 0 || access(t->rootfs, R_OK) < 0) {
			template_entry_unload_locked(t);
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
			fr = fetch(ts, t, ref, s3, &ferr);
			pthread_mutex_lock(&ts->lock);
			t->fetching = 0;
			t->fetch_gen++;
			t->fetch_rc = fr;
			t->fetch_err = ferr;
			if (fr == 0) {
				fetched = 1;
				t->local = 1;
				template_ref_free(&t->ref);
				t->ref = *ref;
				if (ref->env)
					json_incref(ref->env);
				if (t->lock_fd < 0)
					t->lock_fd = template_lock_shared(t->dir);
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
			template_entry_unload_locked(t);
			template_entry_free(t);
		}
		pthread_mutex_unlock(&ts->lock);
		return -1;
	}
	use_fill(t, ref ? ref : (t->builtin ? NULL : &t->ref), need_net, out);
	if (!t->builtin)
		template_touch_used(t->dir);
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
		template_touch_used(t->dir);
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

int template_install(struct template_store *ts, const char *path, const struct template_ref *ref, struct kiln_err *err)
{
	char dir[PATH_MAX + 80], fin[PATH_MAX + 96];
	struct template *t;

	if (ref->builtin)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot install a built-in");
	if (template_verify_file(path, ref, err) < 0)
		return -1;
	snprintf(dir, sizeof(dir), "%s/%s", ts->tdir, ref->sha256);
	snprintf(fin, sizeof(fin), "%s/rootfs.ext4", dir);
	if (fs_mkdir_p(dir, 0755) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", dir, strerror(errno));
	{
		struct stat st;

		if (stat(fin, &st) == 0 && (uint64_t)st.st_size == ref->size) {
			/* The same image is here already (its name is its hash): the
			 * file in place, perhaps backing running VMs, stays. */
			unlink(path);
		} else if (chmod(path, 0444) < 0 || write_meta(dir, ref, err) < 0 || move_file(path, fin) < 0) {
			return kiln_err_set(err, KERR_HOST_ERROR, "cannot install %s: %s", fin, strerror(errno));
		}
	}
	template_touch_used(dir);
	pthread_mutex_lock(&ts->lock);
	t = template_find_locked(ts, ref);
	if (!t)
		t = entry_new(ts, ref->name, 0, ref->sha256);
	if (t && !t->local) {
		t->local = 1;
		template_ref_free(&t->ref);
		t->ref = *ref;
		if (ref->env)
			json_incref(ref->env);
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

/* kiln_host_template_* and kiln_host_snapshots_expired_total, declared once. */
enum {
	TM_POOL_READY, TM_USERS, TM_FETCHES, TM_FETCH_BYTES, TM_FETCH_FAIL, TM_VERIFY_FAIL, TM_EVICTIONS,
	TM_SNAP_EXPIRED, TM_COUNT
};
static const struct metric template_metrics[TM_COUNT] = {
	[TM_POOL_READY] = {
		.name = "kiln_host_template_pool_ready", .type = METRIC_GAUGE, .labels = { "template", "sha256" },
		.help = "Warm pool VMs ready, by template.",
	},
	[TM_USERS] = {
		.name = "kiln_host_template_users", .type = METRIC_GAUGE, .labels = { "template", "sha256" },
		.help = "Tasks, sessions and builds using a template now.",
	},
	[TM_FETCHES] = {
		.name = "kiln_host_template_fetches_total", .type = METRIC_COUNTER,
		.help = "Template images fetched from S3 and verified.",
	},
	[TM_FETCH_BYTES] = {
		.name = "kiln_host_template_fetch_bytes_total", .type = METRIC_COUNTER,
		.help = "Bytes of template images fetched.",
	},
	[TM_FETCH_FAIL] = {
		.name = "kiln_host_template_fetch_failures_total", .type = METRIC_COUNTER,
		.help = "Template fetches that failed (S3 or verification).",
	},
	[TM_VERIFY_FAIL] = {
		.name = "kiln_host_template_verify_failures_total", .type = METRIC_COUNTER,
		.help = "Fetched images refused: SHA-256 or size mismatch.",
	},
	[TM_EVICTIONS] = {
		.name = "kiln_host_template_evictions_total", .type = METRIC_COUNTER,
		.help = "Templates evicted for the disk budget.",
	},
	[TM_SNAP_EXPIRED] = {
		.name = "kiln_host_snapshots_expired_total", .type = METRIC_COUNTER,
		.help = "Snapshots removed after their TTL unused.",
	},
};

void template_store_metrics(struct template_store *ts, struct buf *b)
{
	pthread_mutex_lock(&ts->lock);
	metric_head(b, &template_metrics[TM_POOL_READY]);
	for (struct template *t = ts->list; t; t = t->next)
		if (t->local)
			metric_sample(b, &template_metrics[TM_POOL_READY],
				      (const char *[]){ t->name, t->builtin ? "" : t->sha256 },
				      t->pool ? pool_ready(t->pool) : 0);
	metric_head(b, &template_metrics[TM_USERS]);
	for (struct template *t = ts->list; t; t = t->next)
		if (t->local)
			metric_sample(b, &template_metrics[TM_USERS], (const char *[]){ t->name, t->builtin ? "" : t->sha256 },
				      t->users);
	metric_write(b, &template_metrics[TM_FETCHES], ts->fetches);
	metric_write(b, &template_metrics[TM_FETCH_BYTES], ts->fetch_bytes);
	metric_write(b, &template_metrics[TM_FETCH_FAIL], ts->fetch_failures);
	metric_write(b, &template_metrics[TM_VERIFY_FAIL], ts->verify_failures);
	metric_write(b, &template_metrics[TM_EVICTIONS], ts->evictions);
	metric_write(b, &template_metrics[TM_SNAP_EXPIRED], ts->snapshots_expired);
	pthread_mutex_unlock(&ts->lock);
}
