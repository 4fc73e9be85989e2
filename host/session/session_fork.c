/* session_fork: a fork's copy of its parent's RAM, kept on the parent's
 * host so that the children started there share the parent's pages
 * copy-on-write instead of each loading its own copy from the chunks.
 *
 * A checkpoint asked for a fork ({"fork":true}) writes, while the parent
 * stands still, every page the parent holds apart from its template's RAM
 * into a memfd that already holds the template's (or the parent's own
 * fork base's) pages: the fork base. It also keeps the state stream without
 * the RAM block's pages (header, firmware, devices) and the disk layer. A
 * child started here from that snapshot (same generation) maps the fork
 * base privately, as sessions map their template's RAM, and QEMU loads only
 * that small stream: no page is read from S3 or written into the child.
 *
 * The child's pauses name the same template base as every manifest: the
 * pages it shares with the fork base are read too (vmmem_save.also), and a
 * delta over the snapshot's chunks leaves them out by their hash.
 *
 * The fork bases are kept for FORK_KEEP_MS after their last use, at most
 * FORK_MAX of them (the oldest goes first, but never while its upload
 * goes on); a child holds its own reference,
 * and QEMU's mapping keeps the pages while any child runs. */
#include "session_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io.h"
#include "s3.h"
#include "vm/vm.h"
#include "proto.h"

#define FORK_KEEP_MS 120000
#define FORK_MAX     4

static pthread_mutex_t fork_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fork_cond = PTHREAD_COND_INITIALIZER;
static struct fork_base *forks;  /* published, newest first */

static int memfd(const char *name, struct kiln_err *err)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0)
		kiln_err_set(err, KERR_HOST_ERROR, "memfd: %s", strerror(errno));
	return fd;
}

/* Copy src's data extents (holes stay holes: the RAM's unused pages) into
 * dst, size bytes. */
static int copy_extents(int src, int dst, uint64_t size, struct kiln_err *err)
{
	off_t at = 0;

	for (;;) {
		off_t data = lseek(src, at, SEEK_DATA), hole;
		int rc;

		if (data < 0 || (uint64_t)data >= size)
			break;
		hole = lseek(src, data, SEEK_HOLE);
		if (hole < 0 || (uint64_t)hole > size)
			hole = (off_t)size;
		if ((rc = io_copy_at(src, dst, (uint64_t)data, (uint64_t)(hole - data))) < 0)
			return kiln_err_set(err, KERR_HOST_ERROR, "copying the RAM for a fork: %s", strerror(-rc));
		at = hole;
	}
	return 0;
}

struct fork_base *fork_base_new(int ram_fd, uint64_t size, const char *tpl_key, struct kiln_err *err)
{
	struct fork_base *fb = calloc(1, sizeof(*fb));

	if (!fb) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		return NULL;
	}
	fb->refs = 1;
	fb->size = size;
	fb->stream_fd = fb->disk_fd = -1;
	snprintf(fb->tpl_key, sizeof(fb->tpl_key), "%s", tpl_key);
	if ((fb->mem_fd = memfd("kiln-fork", err)) < 0)
		goto fail;
	if (ftruncate(fb->mem_fd, (off_t)size) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "sizing a fork's RAM: %s", strerror(errno));
		goto fail;
	}
	if (copy_extents(ram_fd, fb->mem_fd, size, err) < 0)
		goto fail;
	if ((fb->stream_fd = memfd("kiln-fork-state", err)) < 0 || (fb->disk_fd = memfd("kiln-fork-disk", err)) < 0)
		goto fail;
	return fb;
fail:
	fork_base_put(fb);
	return NULL;
}

int fork_base_seal(struct fork_base *fb, const char *disk, struct kiln_err *err)
{
	int fd = open(disk, O_RDONLY | O_CLOEXEC), rc;
	struct stat st;

	if (fd < 0 || fstat(fd, &st) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", disk, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	rc = io_copy_at(fd, fb->disk_fd, 0, (uint64_t)st.st_size);
	close(fd);
	if (rc < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "copying a fork's disk layer: %s", strerror(-rc));
	fb->disk_size = (uint64_t)st.st_size;
	if (phash_finish(&fb->pages) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	/* QEMU maps it privately: nothing may change it under the children. */
	if (fcntl(fb->mem_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "sealing a fork's RAM: %s", strerror(errno));
	return 0;
}

static void fork_base_free(struct fork_base *fb)
{
	if (fb->mem_fd >= 0)
		close(fb->mem_fd);
	if (fb->stream_fd >= 0)
		close(fb->stream_fd);
	if (fb->disk_fd >= 0)
		close(fb->disk_fd);
	phash_free(&fb->pages);
	json_decref(fb->manifest);
	free(fb);
}

static int alloc_run(void *ctx, uint64_t off, uint64_t len)
{
	return fallocate(*(int *)ctx, 0, (off_t)off, (off_t)len);
}

int fork_base_prepare(struct fork_base *fb, struct vmmem_save *sv, struct kiln_err *err)
{
	return vmmem_private_runs(sv, alloc_run, &fb->mem_fd, err);
}

void fork_base_put(struct fork_base *fb)
{
	int last;

	if (!fb)
		return;
	pthread_mutex_lock(&fork_lock);
	last = --fb->refs == 0;
	pthread_mutex_unlock(&fork_lock);
	if (last)
		fork_base_free(fb);
}

/* Unlink the published bases that are too old, or past FORK_MAX, or
 * matching (customer, snap_id) when given; their references go onto *out.
 * A base whose upload is still going stays whatever its age or rank: the
 * snapshot's DELETE finds it to wait for the upload (else the upload's
 * chunks and manifest would land after the DELETE listed the prefix). */
static void take_stale_locked(const char *customer, const char *snap_id, int64_t now, struct fork_base **out)
{
	int kept = 0;

	for (struct fork_base **p = &forks, *fb; (fb = *p);) {
		int drop = (fb->upload != FORK_UPLOADING && (now - fb->used_ms > FORK_KEEP_MS || kept >= FORK_MAX)) ||
			   (customer && !strcmp(fb->customer, customer) && !strcmp(fb->snap_id, snap_id));

		if (drop) {
			*p = fb->next;
			fb->next = *out;
			*out = fb;
		} else {
			kept++;
			p = &fb->next;
		}
	}
}

static void put_list(struct fork_base *l)
{
	while (l) {
		struct fork_base *n = l->next;

		fork_base_put(l);
		l = n;
	}
}

void fork_base_publish(struct fork_base *fb, const char *customer, const char *snap_id, const char *gen)
{
	struct fork_base *stale = NULL;

	snprintf(fb->customer, sizeof(fb->customer), "%s", customer);
	snprintf(fb->snap_id, sizeof(fb->snap_id), "%s", snap_id);
	snprintf(fb->gen, sizeof(fb->gen), "%s", gen);
	pthread_mutex_lock(&fork_lock);
	fb->used_ms = proto_now_ms();
	take_stale_locked(customer, snap_id, fb->used_ms, &stale);
	fb->refs++;
	fb->next = forks;
	forks = fb;
	pthread_mutex_unlock(&fork_lock);
	put_list(stale);
}

struct fork_base *fork_base_find(const char *customer, const char *snap_id)
{
	struct fork_base *found = NULL, *stale = NULL;
	int64_t now = proto_now_ms();

	pthread_mutex_lock(&fork_lock);
	take_stale_locked(NULL, NULL, now, &stale);
	for (struct fork_base *fb = forks; fb && !found; fb = fb->next)
		if (!strcmp(fb->customer, customer) && !strcmp(fb->snap_id, snap_id) && fb->upload != FORK_FAILED) {
			fb->refs++;
			fb->used_ms = now;
			found = fb;
		}
	pthread_mutex_unlock(&fork_lock);
	put_list(stale);
	return found;
}

json_t *fork_base_claim(struct fork_base *fb, struct session *s, int *uploaded)
{
	json_t *m;

	pthread_mutex_lock(&fork_lock);
	*uploaded = fb->upload == FORK_UPLOADED;
	m = json_incref(fb->manifest);
	s->fork = fb;
	s->adopt_pending = !*uploaded;
	pthread_mutex_unlock(&fork_lock);
	return m;
}

int fork_pending_manifest(const struct fork_base *fb, json_t *m, struct pmanifest *pm, struct kiln_err *err)
{
	const char *sha = json_string_value(json_object_get(json_object_get(m, "base"), "sha256"));
	json_t *tail = json_object_get(m, "tail");

	if (!sha || strlen(sha) != 64 || !json_is_integer(tail) || json_integer_value(tail) < 1)
		return kiln_err_set(err, KERR_HOST_ERROR, "a fork's manifest here is incomplete");
	memset(pm, 0, sizeof(*pm));
	pm->root = json_incref(m);
	pm->version = PMANIFEST_V3;
	snprintf(pm->base_sha256, sizeof(pm->base_sha256), "%s", sha);
	pm->base_size = fb->size;
	pm->tail = (size_t)json_integer_value(tail);
	snprintf(pm->generation, sizeof(pm->generation), "%s", fb->gen);
	return 0;
}

void fork_base_finish(struct fork_base *fb, int state, json_t *manifest)
{
	json_t *old;

	pthread_mutex_lock(&fork_lock);
	old = fb->manifest;
	fb->manifest = manifest;
	fb->upload = state;
	pthread_cond_broadcast(&fork_cond);
	pthread_mutex_unlock(&fork_lock);
	json_decref(old);
}

int fork_base_wait(struct fork_base *fb, int timeout_ms)
{
	struct timespec until;
	int state;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&fork_lock);
	while (fb->upload == FORK_UPLOADING && pthread_cond_timedwait(&fork_cond, &fork_lock, &until) == 0)
		;
	state = fb->upload;
	pthread_mutex_unlock(&fork_lock);
	return state;
}

int session_adopt_manifest(const struct s3_config *c, const struct session *s, json_t *root, const char *from_snapshot)
{
	json_t *m = json_deep_copy(root);
	struct kiln_err e = { .code = "" };
	char key[512], *text;
	int r = -1;

	if (m) {
		json_object_set_new(m, "id", json_string(s->id));
		json_object_set_new(m, "from_snapshot", json_string(from_snapshot));
		json_object_del(m, "cache_key");
		json_object_del(m, "session");
	}
	text = m ? json_dumps(m, JSON_COMPACT) : NULL;
	json_decref(m);
	session_s3_key(key, sizeof(key), s->customer, s->id, "manifest.json");
	if (!text || (r = s3_put_buffer(c, key, text, strlen(text), "application/json", &e)) < 0)
		fprintf(stderr, "kiln-host: session %s: keeping snapshot %s's manifest as its own: %s\n", s->id,
			from_snapshot, text ? e.message : "out of memory");
	free(text);
	return r < 0 ? -1 : 0;
}

/* A fork's child started during the upload, once it ended: the snapshot's
 * manifest as its own, or (no snapshot in S3) a whole next pause. Under
 * s->adopt_mu. */
static void adopt(struct session *s, const struct s3_config *c)
{
	json_t *m;

	pthread_mutex_lock(&fork_lock);
	m = s->fork->upload == FORK_UPLOADED ? json_incref(s->fork->manifest) : NULL;
	pthread_mutex_unlock(&fork_lock);
	s->adopt_pending = 0;
	if (!m || session_adopt_manifest(c, s, m, s->fork->snap_id) < 0) {
		phash_free(&s->layers);
		s->layers_ok = 0;
	}
	json_decref(m);
}

void fork_child_settle(struct session *s, const struct s3_config *c)
{
	if (!s->fork)
		return;
	pthread_mutex_lock(&s->adopt_mu);
	if (s->adopt_pending) {
		pthread_mutex_unlock(&s->adopt_mu);
		fork_base_wait(s->fork, SESSION_SNAPSHOT_WAIT_MAX_MS);
		pthread_mutex_lock(&s->adopt_mu);
		if (s->adopt_pending)
			adopt(s, c);
	}
	pthread_mutex_unlock(&s->adopt_mu);
}

void fork_child_cancel(struct session *s)
{
	pthread_mutex_lock(&s->adopt_mu);
	s->adopt_pending = 0;
	pthread_mutex_unlock(&s->adopt_mu);
}

void fork_children_adopt(struct session_table *ss, struct fork_base *fb, const struct s3_config *c)
{
	struct session **kids = NULL;
	size_t n = 0, cap = 0;

	pthread_mutex_lock(&ss->lock);
	for (struct session *s = ss->list; s; s = s->next)
		if (s->fork == fb && s->adopt_pending) {
			if (n == cap) {
				struct session **k = realloc(kids, (cap = cap ? 2 * cap : 16) * sizeof(*k));

				if (!k)
					break;
				kids = k;
			}
			s->refs++;
			kids[n++] = s;
		}
	pthread_mutex_unlock(&ss->lock);
	for (size_t i = 0; i < n; i++) {
		struct session *s = kids[i];

		/* Not its op lock: its client's requests go on meanwhile. A
		 * pause adopts first, a teardown cancels (fork_child_cancel). */
		pthread_mutex_lock(&s->adopt_mu);
		if (s->adopt_pending)
			adopt(s, c);
		pthread_mutex_unlock(&s->adopt_mu);
		session_unref(ss, s);
	}
	free(kids);
}

void fork_base_drop(const char *customer, const char *snap_id)
{
	struct fork_base *stale = NULL;

	pthread_mutex_lock(&fork_lock);
	take_stale_locked(customer && snap_id ? customer : NULL, snap_id, proto_now_ms(), &stale);
	pthread_mutex_unlock(&fork_lock);
	put_list(stale);
}

void fork_base_drop_all(void)
{
	struct fork_base *all;

	pthread_mutex_lock(&fork_lock);
	all = forks;
	forks = NULL;
	pthread_mutex_unlock(&fork_lock);
	put_list(all);
}

int fork_base_count(void)
{
	int n = 0;

	pthread_mutex_lock(&fork_lock);
	for (struct fork_base *fb = forks; fb; fb = fb->next)
		n++;
	pthread_mutex_unlock(&fork_lock);
	return n;
}

int fork_base_copy_pages(const struct fork_base *fb, struct phash *out)
{
	memset(out, 0, sizeof(*out));
	out->finished = 1;
	if (!fb->pages.n)
		return 0;
	out->e = malloc(fb->pages.n * sizeof(*out->e));
	if (!out->e)
		return -1;
	memcpy(out->e, fb->pages.e, fb->pages.n * sizeof(*out->e));
	out->n = out->cap = fb->pages.n;
	out->finished = 1;
	return 0;
}

int fork_base_open(const struct fork_base *fb)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fb->stream_fd);
	return open(path, O_RDONLY | O_CLOEXEC);
}
