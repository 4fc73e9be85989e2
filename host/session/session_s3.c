/* session_s3: what a session's pause and resume keep in S3 besides the
 * chunks themselves (session_pause.c has the whole story): reading small
 * objects and manifests, the base RAM that many sessions share (uploaded
 * once, fetched and verified once per host), and deleting a previous
 * generation or a whole session's objects. */
#include "session_int.h"
#include "vm/vm.h"


#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "fsutil.h"
#include "io.h"
#include "pause_chunks.h"
#include "pause_manifest.h"
#include "proto.h"
#include "task/task.h"

void session_s3_key(char *out, size_t cap, const char *customer, const char *id, const char *name)
{
	snprintf(out, cap, "%s/sessions/%s/%s", customer, id, name);
}

/* A manifest (at most 4 MiB) from S3 into a malloc'd buffer, through a
 * memfd (no temporary file, no fsync); its length, or -1 with err set. */
ssize_t session_get_small(const struct s3_config *c, const char *key, char **out, struct kiln_err *err)
{
	int fd = memfd_create("kiln-manifest", MFD_CLOEXEC);
	struct stat st;
	ssize_t n = -1;

	*out = NULL;
	if (fd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "memfd: %s", strerror(errno));
	if (s3_get_fd(c, key, fd, err) < 0)
		goto out;
	if (fstat(fd, &st) < 0 || st.st_size > (4 << 20)) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's manifest is larger than 4 MiB");
		goto out;
	}
	*out = malloc((size_t)st.st_size + 1);
	if (!*out) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	n = pread(fd, *out, (size_t)st.st_size, 0);
	if (n != st.st_size) {
		kiln_err_set(err, KERR_HOST_ERROR, "reading the manifest: short read");
		free(*out);
		*out = NULL;
		n = -1;
	}
out:
	close(fd);
	return n;
}

/* The manifest in S3 now (NULL: none, or unreadable), to delete what it
 * names once a newer one replaces it. */
struct pmanifest *session_get_manifest(const struct s3_config *c, const char *customer, const char *id,
				      struct kiln_err *err)
{
	struct pmanifest *pm = calloc(1, sizeof(*pm));
	char key[512], *text = NULL;
	ssize_t len = -1;
	int r = -1;

	session_s3_key(key, sizeof(key), customer, id, "manifest.json");
	if (pm)
		len = session_get_small(c, key, &text, err);
	if (len >= 0)
		r = pmanifest_parse(text, (size_t)len, customer, id, pm, err);
	free(text);
	if (r < 0 && pm) {
		pmanifest_free(pm);
		free(pm);
		pm = NULL;
	}
	return pm;
}

int session_pause_manifest_host(const struct s3_config *c, const char *customer, const char *id, char host[65])
{
	struct kiln_err e = { .code = "" };
	char key[512], *text = NULL;
	json_t *m;
	ssize_t len;

	host[0] = '\0';
	session_s3_key(key, sizeof(key), customer, id, "manifest.json");
	len = session_get_small(c, key, &text, &e);
	if (len < 0)
		return e.errc == KERR_S3_NOT_FOUND ? 0 : -1;
	m = json_loadb(text, (size_t)len, 0, NULL);
	free(text);
	if (!json_is_object(m)) {
		json_decref(m);
		return -1; /* unreadable: not proof of anything */
	}
	snprintf(host, 65, "%s", json_string_value(json_object_get(m, "host_id")) ?: "");
	json_decref(m);
	return 1;
}
/* ---- the base RAM in S3 ------------------------------------------------- */

/* Bases fetched from S3 that sessions on this host map now, shared: one
 * sealed memfd per base, closed with the last session on it. */
struct fetched_base {
	char sha[65];
	int fd, refs;
	struct fetched_base *next;
};
static pthread_mutex_t bases_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fetched_base *bases;

void session_base_release(struct session *s)
{
	struct fetched_base **p, *b;

	if (s->base_fd < 0)
		return;
	pthread_mutex_lock(&bases_lock);
	for (p = &bases; (b = *p); p = &b->next)
		if (b->fd == s->base_fd) {
			if (--b->refs == 0) {
				*p = b->next;
				close(b->fd);
				free(b);
			}
			break;
		}
	pthread_mutex_unlock(&bases_lock);
	s->base_fd = -1;
}

/* The fetched base with this sha in use here: its fd (one more reference), or -1. */
static int base_find(const char *sha)
{
	int fd = -1;

	pthread_mutex_lock(&bases_lock);
	for (struct fetched_base *b = bases; b; b = b->next)
		if (!strcmp(b->sha, sha)) {
			b->refs++;
			fd = b->fd;
			break;
		}
	pthread_mutex_unlock(&bases_lock);
	return fd;
}

/* Add fd (a base just fetched) to the table; if another thread added the
 * same base meanwhile, fd is closed and that one is used. The fd to use. */
static int base_add(const char *sha, int fd)
{
	int have = base_find(sha);
	struct fetched_base *b;

	if (have >= 0) {
		close(fd);
		return have;
	}
	if (!(b = calloc(1, sizeof(*b)))) {
		close(fd);
		return -1;
	}
	snprintf(b->sha, sizeof(b->sha), "%s", sha);
	b->fd = fd;
	b->refs = 1;
	pthread_mutex_lock(&bases_lock);
	b->next = bases;
	bases = b;
	pthread_mutex_unlock(&bases_lock);
	return fd;
}

/* Upload the base RAM (fd, size, sha) under prefix: its chunks (zstd),
 * then its manifest (key), written last. Ahead of a pause (ahead), it
 * gives up between chunks once the book is stopping. *bytes: compressed
 * bytes sent. 0, or -1 with err. */
static int base_upload(struct base_book *bk, const struct s3_config *c, int fd, uint64_t size, const char *sha,
		       const char *template_key, int ahead, const char *prefix, const char *key, uint64_t *bytes,
		       struct kiln_err *err)
{
	struct pchunk_list l = { 0 }, none = { 0 };
	struct pchunk_up *up;
	char *text;
	json_t *m;
	int r;

	if (s3_ensure_bucket(c, err) < 0)
		return -1;
	if (!(up = pchunk_up_start(c, prefix, PAUSE_WORKERS)))
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot start the uploader");
	for (uint64_t off = 0; off < size;) {
		size_t n = size - off < PCHUNK_RAW_MAX ? (size_t)(size - off) : PCHUNK_RAW_MAX;
		uint8_t *b;

		if (ahead && base_book_stopping(bk)) {
			pchunk_up_finish(up, &l, &none, bytes, &(struct kiln_err){ .code = "" });
			free(l.c);
			free(none.c);
			return kiln_err_set(err, KERR_HOST_ERROR, "kiln-host is shutting down");
		}
		b = pchunk_buf_alloc();
		if (!b || pread(fd, b, n, (off_t)off) != (ssize_t)n) {
			pchunk_buf_free(b);
			pchunk_up_finish(up, &l, &none, bytes, &(struct kiln_err){ .code = "" });
			free(l.c);
			free(none.c);
			return kiln_err_set(err, KERR_HOST_ERROR, "reading the base RAM: %s", strerror(errno));
		}
		if (pchunk_up_add(up, 0, b, n) < 0)
			break; /* the reason comes from pchunk_up_finish */
		off += n;
	}
	if (pchunk_up_finish(up, &l, &none, bytes, err) < 0) {
		free(l.c);
		free(none.c);
		return -1;
	}
	free(none.c);
	m = json_pack("{s:i, s:s, s:I, s:s, s:o}", "version", PBASE_V, "sha256", sha, "size", (json_int_t)size,
		      "template", template_key, "mem", pchunk_list_json(&l));
	free(l.c);
	text = m ? json_dumps(m, JSON_COMPACT) : NULL;
	json_decref(m);
	if (!text)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	r = s3_put_buffer(c, key, text, strlen(text), "application/json", err);
	free(text);
	return r < 0 ? -1 : 0;
}

int session_base_ensure(struct base_book *bk, const struct s3_config *c, int fd, uint64_t size, const char *sha,
			const char *template_key, int ahead, uint64_t *uploaded, struct kiln_err *err)
{
	char prefix[128], key[192];
	uint64_t zbytes = 0;
	int64_t t0 = proto_now_ms();
	int r;

	pbase_prefix(prefix, sizeof(prefix), sha);
	snprintf(key, sizeof(key), "%smanifest.json", prefix);
	/* Its manifest there also says the bucket is: otherwise it is made
	 * first (one round trip per pause, not two). */
	r = s3_head(c, key, NULL, err);
	if (r != 0)
		return r < 0 ? -1 : 0;
	/* Missing: one thread of this process uploads it at a time (a pause
	 * and the preparation ahead of it, or two pauses); whoever waited
	 * looks again, and finds it there unless that upload failed. */
	base_book_enter(bk, sha);
	r = s3_head(c, key, NULL, err);
	if (r == 0)
		r = base_upload(bk, c, fd, size, sha, template_key, ahead, prefix, key, &zbytes, err) < 0 ? -1 : 1;
	else if (r > 0)
		r = 0; /* the upload we waited for put it there */
	base_book_leave(bk, sha);
	if (r <= 0)
		return r;
	*uploaded += zbytes;
	if (!ahead)
		fprintf(stderr, "kiln-host: base RAM %.16s: %llu bytes compressed into S3 in %lld ms\n", sha,
			(unsigned long long)zbytes, (long long)(proto_now_ms() - t0));
	return 1;
}

/* A paused session's base RAM from S3 (manifest, then every chunk checked
 * by its SHA-256, then the whole by the base's), in a sealed memfd shared
 * with the other sessions on it here. The fd (the caller holds one
 * reference, see session_base_release), or -1 with err. */
int session_base_fetch(const struct s3_config *c, const char *sha, uint64_t size, struct kiln_err *err)
{
	char prefix[128], key[192], *text = NULL, got[65];
	struct pchunk_list l = { 0 };
	unsigned char d[32];
	unsigned int dl;
	EVP_MD_CTX *md = NULL;
	uint8_t *buf = NULL;
	ssize_t len;
	int fd;

	int64_t t0 = proto_now_ms();

	if ((fd = base_find(sha)) >= 0)
		return fd;
	pbase_prefix(prefix, sizeof(prefix), sha);
	snprintf(key, sizeof(key), "%smanifest.json", prefix);
	len = session_get_small(c, key, &text, err);
	if (len < 0) {
		if (err->errc == KERR_S3_NOT_FOUND)
			kiln_err_set(err, KERR_INCOMPATIBLE_SNAPSHOT,
				     "the session was paused as a diff against base RAM %.16s, which is neither this host's "
				     "snapshot RAM nor in S3 (%s is missing): it resumes only on a host with that base",
				     sha, key);
		return -1;
	}
	if (pbase_parse(text, (size_t)len, sha, size, &l, err) < 0) {
		free(text);
		return -1;
	}
	free(text);
	fd = memfd_create("kiln-base", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	/* Every page allocated here (as jail_sealed_memfd does for a snapshot):
	 * a hole would be filled on a clone's first touch, charged to it. */
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0 || fallocate(fd, 0, 0, (off_t)size) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "memfd for the base RAM: %s", strerror(errno));
		goto fail;
	}
	if (pchunk_get_all(c, &l, fd, PAUSE_WORKERS, NULL, NULL, err) < 0)
		goto fail;
	/* Each chunk matched its manifest; the whole must match its name. */
	md = EVP_MD_CTX_new();
	buf = malloc(1 << 20);
	if (!md || !buf) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto fail;
	}
	EVP_DigestInit_ex(md, EVP_sha256(), NULL);
	for (uint64_t off = 0; off < size;) {
		ssize_t n = pread(fd, buf, 1 << 20, (off_t)off);

		if (n <= 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "reading the base RAM back");
			goto fail;
		}
		EVP_DigestUpdate(md, buf, (size_t)n);
		off += (uint64_t)n;
	}
	EVP_DigestFinal_ex(md, d, &dl);
	for (int i = 0; i < 32; i++)
		snprintf(got + 2 * i, 3, "%02x", d[i]);
	if (strcmp(got, sha)) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the base RAM %.16s from S3 has SHA-256 %.16s (S3 copy damaged)", sha,
			     got);
		goto fail;
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "sealing the base RAM: %s", strerror(errno));
		goto fail;
	}
	EVP_MD_CTX_free(md);
	free(buf);
	free(l.c);
	if ((fd = base_add(sha, fd)) < 0)
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	else
		fprintf(stderr, "kiln-host: base RAM %.16s: fetched from S3 and checked in %lld ms\n", sha,
			(long long)(proto_now_ms() - t0));
	return fd;
fail:
	EVP_MD_CTX_free(md);
	free(buf);
	free(l.c);
	if (fd >= 0)
		close(fd);
	return -1;
}

/* Deleting the previous pause's chunks happens after the new manifest is
 * in and need not delay the answer: a detached thread with its own copy of
 * the S3 settings and of the keys. A failure leaves objects that the
 * session's DELETE removes (it lists the whole prefix). */
struct deleter {
	struct hostd_s3 s3;
	struct pmanifest *old;
};

static void *delete_thread(void *arg)
{
	struct deleter *d = arg;
	const struct pchunk_list *ls[2] = { &d->old->state, &d->old->disk };

	for (int j = 0; j < 2; j++)
		for (size_t i = 0; i < ls[j]->n; i++) {
			struct kiln_err e = { .code = "" };

			if (s3_delete(&d->s3.c, ls[j]->c[i].key, &e) < 0)
				fprintf(stderr, "kiln-host: deleting %s: %s\n", ls[j]->c[i].key, e.message);
		}
	hostd_s3_free(&d->s3);
	pmanifest_free(d->old);
	free(d->old);
	free(d);
	return NULL;
}

/* Hand old (owned from now on) to a deleter thread; without one, delete here. */
void session_delete_old(struct session_table *ss, struct pmanifest *old)
{
	struct deleter *d = calloc(1, sizeof(*d));
	pthread_attr_t a;
	pthread_t th;

	if (!d || hostd_s3_take(ss->d, &d->s3) < 0) {
		free(d);
		pmanifest_free(old);
		free(old);
		return;
	}
	d->old = old;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&th, &a, delete_thread, d) != 0)
		delete_thread(d);
	pthread_attr_destroy(&a);
}

struct key_list {
	char **k;
	size_t n, cap;
};

static int collect_key(void *ctx, const char *key)
{
	struct key_list *l = ctx;

	if (l->n == l->cap) {
		size_t nc = l->cap ? 2 * l->cap : 64;
		char **p = realloc(l->k, nc * sizeof(*p));

		if (!p)
			return -1;
		l->k = p;
		l->cap = nc;
	}
	if (!(l->k[l->n] = strdup(key)))
		return -1;
	l->n++;
	return 0;
}

/* Delete everything under prefix, the manifest mkey first: from then on
 * nothing names missing chunks. The number of objects deleted. */
int session_s3_delete_prefix(const struct s3_config *c, const char *prefix, const char *mkey, const char *what)
{
	struct kiln_err e = { .code = "" };
	struct key_list l = { 0 };
	int n = 0;

	if (s3_list(c, prefix, collect_key, &l, &e) < 0)
		fprintf(stderr, "kiln-host: %s: listing %s: %s\n", what, prefix, e.message);
	if (s3_delete(c, mkey, &e) < 0)
		fprintf(stderr, "kiln-host: %s: deleting %s: %s\n", what, mkey, e.message);
	for (size_t i = 0; i < l.n; i++) {
		if (!strcmp(l.k[i], mkey))
			n++;
		else if (s3_delete(c, l.k[i], &e) < 0)
			fprintf(stderr, "kiln-host: %s: deleting %s: %s\n", what, l.k[i], e.message);
		else
			n++;
		free(l.k[i]);
	}
	free(l.k);
	return n;
}

void session_pause_delete_s3(const struct s3_config *c, const char *dir, const char *customer, const char *id)
{
	char prefix[512], mkey[512], what[96];

	(void)dir;
	/* Everything under the session's prefix: the manifest's chunks, the
	 * older layout's files, and chunks a pause cut short left unnamed
	 * (never a snapshot's, which its manifest may name too). */
	snprintf(prefix, sizeof(prefix), "%s/sessions/%s/", customer, id);
	session_s3_key(mkey, sizeof(mkey), customer, id, "manifest.json");
	snprintf(what, sizeof(what), "session %s", id);
	session_s3_delete_prefix(c, prefix, mkey, what);
}

void session_snapshot_cache_id(char *out, size_t cap, const char *snapshot_id)
{
	snprintf(out, cap, "snapshot.%s", snapshot_id);
}

int sessions_snapshot_delete(struct session_table *ss, const char *customer, const char *snapshot_id,
			     struct kiln_err *err)
{
	struct hostd_s3 s3;
	char prefix[512], mkey[512], what[96];
	int n;

	if (!spool_id_ok(customer) || !spool_id_ok(snapshot_id))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "customer and snapshot: expected 1-64 characters of [A-Za-z0-9_.-], not starting "
				    "with '.'");
	if (hostd_s3_take(ss->d, &s3) < 0)
		return kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
	/* A fork's upload still going here: its last objects land first. */
	{
		struct fork_base *fb = fork_base_find(customer, snapshot_id);

		if (fb) {
			fork_base_wait(fb, SESSION_SNAPSHOT_WAIT_MAX_MS);
			fork_base_put(fb);
		}
	}
	snprintf(prefix, sizeof(prefix), "%s/" PMANIFEST_SNAPSHOTS "/%s/", customer, snapshot_id);
	snprintf(mkey, sizeof(mkey), "%smanifest.json", prefix);
	snprintf(what, sizeof(what), "snapshot %s", snapshot_id);
	n = session_s3_delete_prefix(&s3.c, prefix, mkey, what);
	hostd_s3_free(&s3);
	session_snapshot_cache_id(what, sizeof(what), snapshot_id);
	pcache_drop(&ss->pcache, customer, what);
	fork_base_drop(customer, snapshot_id);
	return n;
}
