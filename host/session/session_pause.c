/* session_pause: pause a session to S3 and resume it on any host with the
 * same image (see session.h, docs/architecture.md
 * "Sessions").
 *
 * Pause (manifest version 2): QEMU migrates the stopped VM into a pipe; a
 * thread filters the stream (migfilter) so that it keeps only the RAM pages
 * that differ from the template snapshot's RAM (the session's base: its
 * RAM is that file mapped copy-on-write), cuts it into chunks that a few
 * threads compress (zstd), hash and upload while the migration still runs,
 * and keeps a local copy for a retry. The disk layer follows as chunks too,
 * then a manifest naming the base by its SHA-256 and every chunk with its
 * SHA-256 (written last: a snapshot without one does not exist). Chunks go
 * under a fresh generation prefix per pause, so an interrupted pause never
 * touches what the previous manifest names; the previous generation is
 * deleted once the new manifest is in.
 *
 * The base itself goes to S3 once (PBASE_DIR "<sha256>/", chunks then
 * its own manifest) before the first manifest that names it, so that any
 * host can resume the session.
 *
 * Resume: the manifest, then every chunk in parallel, each checked before
 * use; the base is this host's snapshot RAM when its SHA-256 matches, else
 * its copy from S3 (every chunk checked, then the whole), shared by the
 * sessions on it here; QEMU starts on the base mapped copy-on-write and
 * loads the filtered stream over it. Manifest version 1 (whole files) still resumes.
 * Clock and entropy are set anew afterwards, as after any restore. */
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

#define SESSION_SAVE_MS    300000 /* pausing a VM into its file */
#define SESSION_MANIFEST_V 1
#define PAUSE_WORKERS      4  /* parallel chunk uploads and downloads */

/* ---- pause and resume --------------------------------------------------- */

static const char *const snap_files[] = { "state", "disk.qcow2" };

void session_s3_key(char *out, size_t cap, const char *customer, const char *id, const char *name)
{
	snprintf(out, cap, "%s/sessions/%s/%s", customer, id, name);
}

/* ---- pause: the filtered stream and the disk layer as chunks ------------- */

/* The filter thread's end of the pipe from QEMU, and the chunker after it. */
struct pause_stream {
	int rfd;                 /* the pipe QEMU writes the stream into */
	int local_fd;            /* the filtered stream's local copy (for a retry) */
	struct pchunk_up *up;    /* NULL or failed: local copy only */
	int up_ok;
	struct migfilter_base base;
	uint8_t *cur;
	size_t len;
	int rc;
	struct kiln_err err;
	struct migfilter_stats st;
};

static ssize_t ps_read(void *ctx, void *buf, size_t len)
{
	struct pause_stream *p = ctx;
	ssize_t n;

	while ((n = read(p->rfd, buf, len)) < 0 && errno == EINTR)
		;
	return n;
}

/* Hand the current chunk to the uploader (and the local copy). */
static int ps_flush(struct pause_stream *p)
{
	if (!p->len)
		return 0;
	if (io_write_all(p->local_fd, p->cur, p->len) < 0)
		return -1;
	if (p->up_ok && pchunk_up_add(p->up, 0, p->cur, p->len) < 0)
		p->up_ok = 0; /* the failure is reported by pchunk_up_finish */
	else if (!p->up_ok)
		pchunk_buf_free(p->cur);
	p->cur = NULL;
	p->len = 0;
	return 0;
}

static int ps_write(void *ctx, const void *buf, size_t len)
{
	struct pause_stream *p = ctx;
	const uint8_t *b = buf;

	while (len) {
		size_t n;

		if (!p->cur && !(p->cur = pchunk_buf_alloc()))
			return -1;
		n = PCHUNK_RAW_MAX - p->len < len ? PCHUNK_RAW_MAX - p->len : len;
		memcpy(p->cur + p->len, b, n);
		p->len += n;
		b += n;
		len -= n;
		if (p->len == PCHUNK_RAW_MAX && ps_flush(p) < 0)
			return -1;
	}
	return 0;
}

static void *ps_thread(void *arg)
{
	struct pause_stream *p = arg;
	char sink[65536];

	p->rc = migfilter_run(ps_read, p, ps_write, p, &p->base, &p->st, &p->err);
	if (p->rc == 0 && ps_flush(p) < 0)
		p->rc = kiln_err_set(&p->err, KERR_HOST_ERROR, "writing the session's state: %s", strerror(errno));
	pchunk_buf_free(p->cur);
	p->cur = NULL;
	/* Whatever happened, QEMU must be able to finish writing. */
	while (ps_read(p, sink, sizeof(sink)) > 0)
		;
	return NULL;
}

/* Queue a local file (the disk layer; or the state on a retry) as chunks.
 * 0; -1 with err set (the file); -2 when an upload failed (the reason comes
 * from pchunk_up_finish). */
static int queue_file(struct pchunk_up *up, int stream, const char *path, struct kiln_err *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
	for (;;) {
		uint8_t *b = pchunk_buf_alloc();
		ssize_t n = b ? io_read_all(fd, b, PCHUNK_RAW_MAX) : -1;

		if (n <= 0) {
			pchunk_buf_free(b);
			close(fd);
			if (n < 0)
				return kiln_err_set(err, KERR_HOST_ERROR, "reading %s: %s", path, strerror(errno));
			return 0;
		}
		if (pchunk_up_add(up, stream, b, (size_t)n) < 0) {
			close(fd);
			return -2;
		}
	}
}

/* Write the version 2 manifest naming the chunks (the last PUT of a pause). */
static int put_manifest_v2(struct session_table *ss, struct session *s, const struct s3_config *c, const char *gen,
			   const char *base_sha, const struct pchunk_list *state, const struct pchunk_list *disk,
			   const struct migfilter_stats *fst, const struct pcache_seal *seal, struct kiln_err *err)
{
	json_t *m;
	char key[512], *text;
	int r;

	m = json_pack("{s:i, s:s, s:s, s:s, s:b, s:i, s:i, s:O, s:s, s:I, s:s, s:s, s:{s:s, s:s, s:I}, s:o, s:o, s:{s:I, s:I}}",
		      "version", PMANIFEST_V2, "id", s->id, "customer", s->customer, "template", s->snap->key, "net",
		      s->snap->net, "memory_mib", (int)s->memory_mib, "vcpus", (int)s->vcpus, "spec", s->spec,
		      "guest_kernel", s->release, "paused_ms", (json_int_t)clock_wall_ms(), "host_id", ss->host_id,
		      "generation", gen, "base", "sha256", base_sha, "block", "mem", "size", (json_int_t)s->snap->mem_size,
		      "state", pchunk_list_json(state), "disk", pchunk_list_json(disk), "pages", "seen",
		      (json_int_t)fst->pages, "kept", (json_int_t)fst->pages_kept);
	if (m && seal) {
		/* The pause cache's key: only here, in S3, never on this host's
		 * disk (pause_cache.h). */
		char hex[2 * PCACHE_KEY_LEN + 1];

		pcache_key_hex(seal->key, hex);
		json_object_set_new(m, "cache_key", json_string(hex));
		OPENSSL_cleanse(hex, sizeof(hex));
	}
	text = m ? json_dumps(m, JSON_COMPACT) : NULL;
	json_decref(m);
	if (!text)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	session_s3_key(key, sizeof(key), s->customer, s->id, "manifest.json");
	r = s3_put_buffer(c, key, text, strlen(text), "application/json", err);
	free(text);
	return r;
}

/* A manifest (at most 4 MiB) from S3 into a malloc'd buffer, through a
 * memfd (no temporary file, no fsync); its length, or -1 with err set. */
static ssize_t get_small(const struct s3_config *c, const char *key, char **out, struct kiln_err *err)
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
static struct pmanifest *get_manifest(const struct s3_config *c, const char *customer, const char *id,
				      struct kiln_err *err)
{
	struct pmanifest *pm = calloc(1, sizeof(*pm));
	char key[512], *text = NULL;
	ssize_t len = -1;
	int r = -1;

	session_s3_key(key, sizeof(key), customer, id, "manifest.json");
	if (pm)
		len = get_small(c, key, &text, err);
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
	len = get_small(c, key, &text, &e);
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

/* The previous generation's manifest, fetched on a thread of its own while
 * the pause checks the bucket and the base and saves the VM: one round trip
 * off the pause's path. */
struct old_fetch {
	const struct s3_config *c;
	const char *customer, *id;
	struct pmanifest *pm;
	pthread_t th;
	int started;
};

static void *old_fetch_thread(void *arg)
{
	struct old_fetch *o = arg;

	o->pm = get_manifest(o->c, o->customer, o->id, &(struct kiln_err){ .code = "" });
	return NULL;
}

/* The manifest (NULL: none, unreadable, or already taken), the caller's
 * once the fetch is done. */
static struct pmanifest *old_fetch_join(struct old_fetch *o)
{
	struct pmanifest *pm;

	if (o->started) {
		pthread_join(o->th, NULL);
		o->started = 0;
	}
	pm = o->pm;
	o->pm = NULL;
	return pm;
}

/* A saved VM and its network, destroyed (pause_v2, on a thread while the
 * uploads finish; nothing else touches s->vm or s->net meanwhile: the pause
 * holds s->op and the session is SS_PAUSING). */
static void *vm_down_thread(void *arg)
{
	struct session *s = arg;

	vm_destroy(&s->vm);
	if (s->net) {
		net_sandbox_stop(s->net, NULL);
		s->net = NULL;
	}
	return NULL;
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

/* Make sure the session's base RAM (fd, size, sha) is in S3 under
 * PBASE_DIR "<sha>/" before a manifest names it: a HEAD of the base's
 * manifest (one round trip per pause: unlike a local marker it stays true
 * when someone empties the bucket); when missing, its chunks (zstd) then its
 * manifest. *uploaded: compressed bytes sent. */
static int base_ensure(struct session *s, const struct s3_config *c, int fd, uint64_t size, const char *sha,
		       uint64_t *uploaded, struct kiln_err *err)
{
	char prefix[128], key[192], *text;
	struct pchunk_list l = { 0 }, none = { 0 };
	struct pchunk_up *up;
	uint64_t zbytes = 0;
	json_t *m;
	int r;

	pbase_prefix(prefix, sizeof(prefix), sha);
	snprintf(key, sizeof(key), "%smanifest.json", prefix);
	/* Its manifest there also says the bucket is: otherwise it is made
	 * first (one round trip per pause, not two). */
	r = s3_head(c, key, NULL, err);
	if (r < 0)
		return -1;
	if (r == 0) {
		int64_t t0 = proto_now_ms();

		if (s3_ensure_bucket(c, err) < 0)
			return -1;

		if (!(up = pchunk_up_start(c, prefix, PAUSE_WORKERS)))
			return kiln_err_set(err, KERR_HOST_ERROR, "cannot start the uploader");
		for (uint64_t off = 0; off < size;) {
			size_t n = size - off < PCHUNK_RAW_MAX ? (size_t)(size - off) : PCHUNK_RAW_MAX;
			uint8_t *b = pchunk_buf_alloc();

			if (!b || pread(fd, b, n, (off_t)off) != (ssize_t)n) {
				pchunk_buf_free(b);
				pchunk_up_finish(up, &l, &none, &zbytes, &(struct kiln_err){ .code = "" });
				free(l.c);
				free(none.c);
				return kiln_err_set(err, KERR_HOST_ERROR, "reading the base RAM: %s", strerror(errno));
			}
			if (pchunk_up_add(up, 0, b, n) < 0)
				break; /* the reason comes from pchunk_up_finish */
			off += n;
		}
		if (pchunk_up_finish(up, &l, &none, &zbytes, err) < 0)
			return -1;
		free(none.c);
		m = json_pack("{s:i, s:s, s:I, s:s, s:o}", "version", PBASE_V, "sha256", sha, "size", (json_int_t)size,
			      "template", s->snap->key, "mem", pchunk_list_json(&l));
		free(l.c);
		text = m ? json_dumps(m, JSON_COMPACT) : NULL;
		json_decref(m);
		if (!text)
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		r = s3_put_buffer(c, key, text, strlen(text), "application/json", err);
		free(text);
		if (r < 0)
			return -1;
		*uploaded += zbytes;
		fprintf(stderr, "kiln-host: base RAM %.16s: %llu bytes compressed into S3 in %lld ms\n", sha,
			(unsigned long long)zbytes, (long long)(proto_now_ms() - t0));
	}
	return 0;
}

/* A paused session's base RAM from S3 (manifest, then every chunk checked
 * by its SHA-256, then the whole by the base's), in a sealed memfd shared
 * with the other sessions on it here. The fd (the caller holds one
 * reference, see session_base_release), or -1 with err. */
static int base_fetch(const struct s3_config *c, const char *sha, uint64_t size, struct kiln_err *err)
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
	len = get_small(c, key, &text, err);
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
static void delete_old(struct session_table *ss, struct pmanifest *old)
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

void session_pause_delete_s3(const struct s3_config *c, const char *dir, const char *customer, const char *id)
{
	struct kiln_err e = { .code = "" };
	struct key_list l = { 0 };
	char prefix[512], mkey[512];

	(void)dir;
	/* Everything under the session's prefix: the manifest's chunks, the
	 * older layout's files, and chunks a pause cut short left unnamed.
	 * The manifest goes first: from then on there is no paused session,
	 * never one that names missing chunks. */
	snprintf(prefix, sizeof(prefix), "%s/sessions/%s/", customer, id);
	session_s3_key(mkey, sizeof(mkey), customer, id, "manifest.json");
	if (s3_list(c, prefix, collect_key, &l, &e) < 0)
		fprintf(stderr, "kiln-host: session %s: listing %s: %s\n", id, prefix, e.message);
	if (s3_delete(c, mkey, &e) < 0)
		fprintf(stderr, "kiln-host: session %s: deleting %s: %s\n", id, mkey, e.message);
	for (size_t i = 0; i < l.n; i++) {
		if (strcmp(l.k[i], mkey) && s3_delete(c, l.k[i], &e) < 0)
			fprintf(stderr, "kiln-host: session %s: deleting %s: %s\n", id, l.k[i], e.message);
		free(l.k[i]);
	}
	free(l.k);
}

/* sessions.save_pages 2: the stream just composed checked page by page
 * against QEMU's own save of the same stopped VM (vmmem_verify). A
 * mismatch, or a check that cannot run, fails the pause (ps->rc): the VM,
 * whole and stopped, then goes on as after any stream failure. */
static void verify_pause(struct session *s, int base_fd, struct pause_stream *ps)
{
	struct vmmem_cmp cr;
	int64_t t0 = proto_now_ms();

	if (vmmem_verify(&s->vm, s->state_path, base_fd, s->snap->mem_size, s->dir, SESSION_SAVE_MS, &cr, &ps->err) <
	    0) {
		fprintf(stderr, "kiln-host: session %s: pause check failed: %s\n", s->id, ps->err.message);
		ps->rc = -1;
		return;
	}
	fprintf(stderr,
		"kiln-host: session %s: pause checked: all %llu pages match QEMU's own save (%llu carried by the "
		"stream, the rest the base's) in %lld ms\n",
		s->id, (unsigned long long)cr.pages, (unsigned long long)cr.in_stream, (long long)(proto_now_ms() - t0));
}

/* Stop the VM into the filter (running) or take the local copy (a retry),
 * upload the chunks, then the manifest. On success *bytes holds the
 * compressed bytes sent. */
static int pause_v2(struct session_table *ss, struct session *s, const struct s3_config *c, uint64_t *bytes,
		    uint64_t *base_bytes, struct migfilter_stats *fst, struct kiln_err *err)
{
	struct pause_stream ps = { .rfd = -1, .local_fd = -1 };
	struct pchunk_list state = { 0 }, disk = { 0 };
	struct pmanifest *old = NULL;
	char prefix[512], gen[48], base_sha[65];
	void *map = MAP_FAILED;
	pthread_t th;
	int pfd[2] = { -1, -1 }, started = 0, r = -1, fail_vm = 0, base_fd;
	/* Where a pause's time goes (logged): the bucket, the base and the
	 * previous manifest checked; QEMU's stream through the filter (chunks
	 * upload meanwhile); the VM torn down; the last uploads; the manifest. */
	int64_t t0 = proto_now_ms(), t_prep = 0, t_saved = 0, t_down = 0, t_up = 0;
	unsigned rnd = 0;
	struct old_fetch of = { .c = c, .customer = s->customer, .id = s->id };
	pthread_t down_tid;
	int down = 0, down_th = 0; /* the VM saved and going; on vm_down_thread */
	struct vmmem_save sv = { .pm_fd = -1, .tpl_fd = -1 };
	int fast = 0;
	struct pcache_seal seal = { .dir = "" };

	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd = (unsigned)getpid() ^ (unsigned)proto_now_ms();
	snprintf(gen, sizeof(gen), "%lld-%08x", (long long)clock_wall_ms(), rnd);
	snprintf(prefix, sizeof(prefix), "%s/sessions/%s/%s/", s->customer, s->id, gen);
	of.started = pthread_create(&of.th, NULL, old_fetch_thread, &of) == 0;
	if (!of.started)
		of.pm = get_manifest(c, s->customer, s->id, &(struct kiln_err){ .code = "" });
	/* The base: the snapshot's RAM (its hash cached after the first pause
	 * of this snapshot), or the base this session was resumed on. */
	if (s->base_fd >= 0)
		snprintf(base_sha, sizeof(base_sha), "%s", s->base_sha);
	else if (snapshot_mem_sha256(s->snap, base_sha, err) < 0)
		goto out;
	base_fd = s->base_fd >= 0 ? s->base_fd : s->snap->mem_fd;
	/* In S3 before any manifest names it (while the VM still runs: a
	 * failure here leaves it running). */
	if (base_ensure(s, c, base_fd, s->snap->mem_size, base_sha, base_bytes, err) < 0)
		goto out;
	t_prep = proto_now_ms();
	ps.up = pchunk_up_start(c, prefix, PAUSE_WORKERS);
	if (!ps.up) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot start the uploader");
		goto out;
	}
	ps.up_ok = 1;
	/* This pause's chunks are kept here too (an older pause's go), for a
	 * resume on this host, sealed with a key of this pause's own that only
	 * its manifest will hold. */
	if (pcache_dir(&ss->pcache, s->customer, s->id, 1, seal.dir, sizeof(seal.dir)) == 0) {
		if (pcache_key_new(seal.key) == 0) {
			pchunk_up_cache(ps.up, &seal);
		} else {
			pcache_drop(&ss->pcache, s->customer, s->id); /* no key: nothing kept */
			seal.dir[0] = '\0';
		}
	}
	if (s->state == SS_RUNNING) {
		ps.local_fd = open(s->state_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (ps.local_fd < 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", s->state_path, strerror(errno));
			goto out;
		}
		/* The changed pages read out of QEMU (vmmem.c), not QEMU's walk
		 * of every page. On a base fetched from S3 the template is the
		 * stream the session was resumed from (its firmware pages are
		 * those of the template the session began on, not this host's):
		 * without it, QEMU saves. */
		sv = (struct vmmem_save){ .vm = &s->vm,
					  .tpl_path = s->base_fd >= 0 ? s->resumed_tpl : s->snap->state,
					  .base_fd = base_fd,
					  .size = s->snap->mem_size, .disks_stay = ss->save_pages == 2, .pm_fd = -1,
					  .tpl_fd = -1 };
		if (ss->save_pages && (s->base_fd < 0 || s->resumed_tpl[0])) {
			struct kiln_err fe;

			fast = vmmem_save_open(&sv, &fe) == 0;
			if (!fast)
				fprintf(stderr, "kiln-host: session %s: saved through QEMU: %s\n", s->id, fe.message);
		}
		/* envd's streams end now (unavailable); its processes are saved
		 * with the VM and a resumed session's new channel lists them. */
		session_envd_close(ss, s, "the sandbox is being paused");
		if (fast) {
			int qemu_failed = 0;

			r = vmmem_save_fast(&sv, proto_now_ms() + SESSION_SAVE_MS, ps_write, &ps, &ps.st, &qemu_failed,
					    &ps.err);
			vmmem_save_close(&sv);
			if (r < 0 && qemu_failed) {
				/* Nothing written yet: QEMU saves it whole instead
				 * (a stopped VM migrates as a running one does). */
				fprintf(stderr, "kiln-host: session %s: QEMU did not save its devices (%s): saving it whole\n",
					s->id, ps.err.message);
				fast = 0;
			} else {
				ps.rc = r;
				if (r == 0 && ps_flush(&ps) < 0)
					ps.rc = kiln_err_set(&ps.err, KERR_HOST_ERROR, "writing the session's state: %s",
							     strerror(errno));
				pchunk_buf_free(ps.cur);
				ps.cur = NULL;
				r = 0;
			}
		}
		if (!fast) {
			/* Populated in the kernel: the filter compares every page the
			 * stream carries, and a user-mode fault per 64 KiB costs more. */
			map = mmap(NULL, s->snap->mem_size, PROT_READ, MAP_SHARED | MAP_POPULATE, base_fd, 0);
			if (map == MAP_FAILED) {
				kiln_err_set(err, KERR_HOST_ERROR, "mapping the base RAM: %s", strerror(errno));
				goto keep_running;
			}
			ps.base = (struct migfilter_base){ .block = "mem", .data = map, .size = s->snap->mem_size };
			if (pipe2(pfd, O_CLOEXEC) < 0) {
				kiln_err_set(err, KERR_HOST_ERROR, "pipe: %s", strerror(errno));
				goto keep_running;
			}
			/* A large pipe: QEMU writes in bursts while the filter compares. */
			fcntl(pfd[1], F_SETPIPE_SZ, 1 << 20);
			ps.rfd = pfd[0];
			if (pthread_create(&th, NULL, ps_thread, &ps) != 0) {
				kiln_err_set(err, KERR_HOST_ERROR, "cannot start the stream filter");
				goto keep_running;
			}
			started = 1;
			r = snapshot_save_fd(&s->vm, pfd[1], SESSION_SAVE_MS, err);
			close(pfd[1]);
			pfd[1] = -1;
			if (r < 0) {
				/* QEMU may have stopped the guest: it cannot be trusted to go
				 * on. Its end of the pipe closes with it. */
				fail_vm = 1;
				vm_destroy(&s->vm);
			}
			pthread_join(th, NULL);
			started = 0;
		}
		t_saved = proto_now_ms();
		*fst = ps.st;
		if (close(ps.local_fd) < 0 && r == 0 && ps.rc == 0)
			ps.rc = kiln_err_set(&ps.err, KERR_HOST_ERROR, "writing %s: %s", s->state_path, strerror(errno));
		ps.local_fd = -1;
		if (fast && r == 0 && ps.rc == 0 && ss->save_pages == 2)
			verify_pause(s, base_fd, &ps);
		if (r == 0 && ps.rc < 0) {
			/* QEMU saved the VM but the stream could not be kept (a
			 * format the filter does not know, a full disk): the VM is
			 * whole and stopped, so it goes on instead of being lost. */
			*err = ps.err;
			r = -1;
			if (vm_qmp(&s->vm, "{\"execute\":\"cont\"}", proto_now_ms() + 10000, NULL,
				   &(struct kiln_err){ .code = "" }) == 0) {
				session_envd_enable(ss, s);
				goto out;
			}
		}
		if (r < 0) {
			fail_vm = 1;
			goto out;
		}
		r = -1;
		/* Saved: the VM and its network go now, on a thread of their own
		 * while the uploads finish (joined below, before its capacity is
		 * given back); the files stay until S3 has them. */
		down = 1;
		down_th = pthread_create(&down_tid, NULL, vm_down_thread, s) == 0;
		if (!down_th)
			vm_down_thread(s);
		s->state = SS_PAUSING;
		t_down = proto_now_ms();
	} else if ((r = queue_file(ps.up, 0, s->state_path, err)) == -1) {
		goto out; /* a retry without the local copy of the stream */
	}
	/* -2: an upload failed; pchunk_up_finish says which. */
	if (r != -2 && (r = queue_file(ps.up, 1, s->disk, err)) == -1)
		goto out;
	r = pchunk_up_finish(ps.up, &state, &disk, bytes, err);
	ps.up = NULL;
	if (r < 0)
		goto out;
	if (down_th) {
		pthread_join(down_tid, NULL);
		down_th = 0;
	}
	t_up = proto_now_ms();
	/* Read before the new manifest replaces it. */
	old = old_fetch_join(&of);
	r = put_manifest_v2(ss, s, c, gen, base_sha, &state, &disk, fst, seal.dir[0] ? &seal : NULL, err);
	if (r == 0 && t_saved && fast)
		fprintf(stderr,
			"kiln-host: session %s saved from its pages: QEMU stopped and saved its devices in %lld ms; "
			"%llu private pages read and composed with them in %lld ms\n",
			s->id, (long long)sv.ms_devices, (unsigned long long)sv.private_pages, (long long)sv.ms_pages);
	if (r == 0 && t_saved)
		fprintf(stderr,
			"kiln-host: session %s paused in %lld ms: prepare %lld (bucket, base, previous manifest), "
			"save %lld (QEMU's stream through the filter, chunks uploading meanwhile), then %lld, "
			"uploads and VM teardown finish %lld, manifest %lld\n",
			s->id, (long long)(proto_now_ms() - t0), (long long)(t_prep - t0), (long long)(t_saved - t_prep),
			(long long)(t_down - t_saved), (long long)(t_up - t_down), (long long)(proto_now_ms() - t_up));
	if (r == 0 && old) {
		/* The new manifest is in: the previous generation can go. */
		delete_old(ss, old);
		old = NULL;
	}
	if (r == 0)
		pcache_prune(&ss->pcache, s->customer, s->id);
	goto out;
keep_running:
	/* Nothing saved, the VM whole (stopped if the save that reads pages
	 * stopped it before QEMU refused its part): it goes on. */
	if (vm_qmp(&s->vm, "{\"execute\":\"cont\"}", proto_now_ms() + 10000, NULL, &(struct kiln_err){ .code = "" }) == 0)
		session_envd_enable(ss, s);
	else
		fail_vm = 1;
out:
	if (started) {
		if (pfd[1] >= 0)
			close(pfd[1]);
		pfd[1] = -1;
		pthread_join(th, NULL);
	}
	if (down_th)
		pthread_join(down_tid, NULL);
	if (down) {
		hostd_release(ss->d, s->vcpus, s->memory_mib);
		s->vcpus = 0;
		if (s->has_tu) {
			/* Paused: the template is no longer in use here. */
			template_release(hostd_templates(ss->d), &s->tu);
			s->has_tu = 0;
		}
	}
	if (ps.up) {
		struct kiln_err e2;

		pchunk_up_finish(ps.up, &state, &disk, bytes, &e2);
	}
	if (pfd[0] >= 0)
		close(pfd[0]);
	if (pfd[1] >= 0)
		close(pfd[1]);
	if (ps.local_fd >= 0)
		close(ps.local_fd);
	if (map != MAP_FAILED)
		munmap(map, s->snap->mem_size);
	free(state.c);
	free(disk.c);
	if (!old)
		old = old_fetch_join(&of);
	if (old) {
		pmanifest_free(old);
		free(old);
	}
	/* No new manifest: what this pause kept names nothing (the older
	 * pause's files went when it started; its resume fetches from S3). */
	if (r < 0 && seal.dir[0])
		pcache_drop(&ss->pcache, s->customer, s->id);
	OPENSSL_cleanse(&seal, sizeof(seal));
	return fail_vm ? -2 : r;
}

void sessions_set_save_pages(struct session_table *ss, int mode)
{
	ss->save_pages = mode;
}

json_t *session_pause(struct session_table *ss, const char *id, struct kiln_err *err)
{
	struct session *s = session_take(ss, id, err);
	int64_t t0 = proto_now_ms();
	struct migfilter_stats fst = { 0 };
	uint64_t bytes = 0, base_bytes = 0, disk_size = 0;
	struct hostd_s3 s3;
	struct stat st;
	char prefix[512];
	json_t *out;
	int r;

	if (!s)
		return NULL;
	if (hostd_s3_take(ss->d, &s3) < 0) {
		kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
		session_put(ss, s, 0);
		return NULL;
	}
	r = pause_v2(ss, s, &s3.c, &bytes, &base_bytes, &fst, err);
	if (r == -2) {
		fprintf(stderr, "kiln-host: session %s: pause failed (%s); the session ends\n", id, err->message);
		hostd_s3_free(&s3);
		session_teardown(ss, s);
		session_put(ss, s, 1);
		return NULL;
	}
	if (r < 0) {
		char m[sizeof(err->message)];

		snprintf(m, sizeof(m), "%s", err->message);
		kiln_err_set(err, kiln_err_is_s3(err->errc) ? KERR_S3_UNAVAILABLE : err->errc,
			     s->state == SS_PAUSING ? "the session is saved on this host but not yet in S3 (pause again to retry): %s"
						    : "the session could not be paused and still runs: %s",
			     m);
		hostd_s3_free(&s3);
		session_put(ss, s, 0);
		return NULL;
	}
	if (stat(s->disk, &st) == 0)
		disk_size = (uint64_t)st.st_size;
	snprintf(prefix, sizeof(prefix), "%s/sessions/%s/", s->customer, s->id);
	out = json_pack("{s:s, s:s, s:{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I}}", "id", s->id, "state", "paused",
			"snapshot", "bucket", s3.c.bucket, "prefix", prefix, "bytes", (json_int_t)bytes, "pause_ms",
			(json_int_t)(proto_now_ms() - t0), "pages_changed", (json_int_t)fst.pages_kept, "pages_total",
			(json_int_t)fst.pages, "disk_bytes", (json_int_t)disk_size, "base_bytes", (json_int_t)base_bytes);
	hostd_s3_free(&s3);
	session_teardown(ss, s);
	session_put(ss, s, 1);
	return out;
}

/* Check a downloaded file against the manifest's size and sha256. */
static int check_file(const char *path, json_t *want, const char *name, struct kiln_err *err)
{
	char sha[65];
	struct stat st;
	const char *ws = json_string_value(json_object_get(want, "sha256"));

	if (!ws || !json_is_integer(json_object_get(want, "size")))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's manifest does not describe %s", name);
	if (stat(path, &st) < 0 || (json_int_t)st.st_size != json_integer_value(json_object_get(want, "size")))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s: size differs from the manifest (S3 copy damaged)", name);
	if (fs_sha256_file(path, sha) < 0 || strcmp(sha, ws))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s: sha256 differs from the manifest (S3 copy damaged)", name);
	return 0;
}

struct disk_fetch {
	const struct s3_config *c;
	const struct pchunk_list *l;
	const struct pcache_seal *cache;
	size_t hits;
	int fd, rc;
	struct kiln_err err;
};

static void *disk_fetch_thread(void *arg)
{
	struct disk_fetch *df = arg;

	df->rc = pchunk_get_all(df->c, df->l, df->fd, PAUSE_WORKERS / 2, df->cache, &df->hits, &df->err);
	return NULL;
}

/* The changed pages are written straight into the VM's RAM in QEMU's
 * address space (pageload.c) instead of through QEMU's own load; QEMU then
 * loads a stream without them: the configuration, the RAM section's block
 * list and the device state. The filter hands the pages over in stream
 * order, after the chunk they came in passed its SHA-256 check; the loader
 * batches them where they are in the chunk (the filter flushes before it
 * lets the chunk go) and waits for the VM to be there. */

/* Where the chunks' side hands the stream to the filter: the chunk being
 * handed over, parsed where it is (a pipe between them cost a copy in and
 * a copy out per byte and, on this 2-core VM, a thread wake-up per pipe's
 * worth: the filter waited on it for ~70-85 ms of a ~120 ms load). */
struct feed_slot {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	const uint8_t *p; /* the chunk being handed over (NULL: none) */
	size_t len, pos;  /* pos: len once the filter is done with it */
	int viewed;       /* the filter holds a view of it */
	int end;         /* the chunks' side is done: the stream is whole, or cut short */
	int reader_gone; /* the filter stopped: the chunks' side stops too */
};

/* Version 2's state stream, fed to QEMU as it arrives rather than
 * downloaded whole first: one thread fetches, checks and decompresses the
 * chunks in order and hands each over (pchunk_stream_all, the slot);
 * another reads the stream from it, writes the changed pages into the VM
 * (the page loader) and the rest into QEMU's socket. */
struct state_feed {
	const struct s3_config *c;
	const struct pchunk_list *l;
	const struct pcache_seal *cache; /* this host's pause cache for the session, or NULL */
	size_t hits;       /* chunks read from it */
	struct feed_slot slot;
	int rc; /* the chunks' side */
	struct kiln_err err;
	pthread_t th;
	int started;
	int fd, frc; /* the filter's: to QEMU's socket */
	struct kiln_err ferr;
	pthread_t fth;
	int fstarted;
	struct pageload *pl; /* NULL: no loader (the stream goes to QEMU whole) */
	uint64_t pl_size;    /* the RAM block's */
	struct migfilter_stats st;
	/* A copy of what QEMU is fed (-1: none): the resumed template of a
	 * session on a fetched base. A failure to write it only drops it. */
	int tee_fd, tee_failed;
	int64_t chunks_done_ms; /* when the last chunk was fetched, checked and streamed */
	int locks;              /* the slot's mutex and condition are set up */
};

/* The chunks' side: hand buf over and wait until the filter is done with
 * it, or has stopped (-1). */
static int slot_sink(void *ctx, const void *buf, size_t len)
{
	struct feed_slot *sl = ctx;
	int r;

	pthread_mutex_lock(&sl->mu);
	sl->p = buf;
	sl->len = len;
	sl->pos = 0;
	sl->viewed = 0;
	pthread_cond_broadcast(&sl->cv);
	while (sl->pos < sl->len && !sl->reader_gone)
		pthread_cond_wait(&sl->cv, &sl->mu);
	sl->p = NULL;
	r = sl->reader_gone && sl->pos < sl->len ? -1 : 0;
	pthread_mutex_unlock(&sl->mu);
	return r;
}

/* End of stream (from the chunks' side) or of reading (the filter's). */
static void slot_close(struct feed_slot *sl, int reader)
{
	pthread_mutex_lock(&sl->mu);
	if (reader)
		sl->reader_gone = 1;
	else
		sl->end = 1;
	pthread_cond_broadcast(&sl->cv);
	pthread_mutex_unlock(&sl->mu);
}

static void *state_feed_thread(void *arg)
{
	struct state_feed *f = arg;

	f->rc = pchunk_stream_all(f->c, f->l, slot_sink, &f->slot, PAUSE_WORKERS, f->cache, &f->hits, &f->err);
	f->chunks_done_ms = proto_now_ms();
	slot_close(&f->slot, 0); /* end of stream: the filter sees it whole, or cut short */
	return NULL;
}

/* The filter's view: the chunk it held goes back (the filter has written
 * out every page it handed over from it), and it gets the next one, whole;
 * 0 at the end of the stream. */
static ssize_t feed_view(void *ctx, const uint8_t **p)
{
	struct feed_slot *sl = ctx;
	size_t n = 0;

	pthread_mutex_lock(&sl->mu);
	if (sl->p && sl->viewed) {
		sl->pos = sl->len;
		pthread_cond_broadcast(&sl->cv);
	}
	while (!(sl->p && sl->pos < sl->len) && !sl->end)
		pthread_cond_wait(&sl->cv, &sl->mu);
	if (sl->p && sl->pos < sl->len) {
		*p = sl->p + sl->pos;
		n = sl->len - sl->pos;
		sl->viewed = 1;
	}
	pthread_mutex_unlock(&sl->mu);
	return (ssize_t)n;
}

static int feed_write(void *ctx, const void *buf, size_t len)
{
	struct state_feed *f = ctx;

	if (io_write_all(f->fd, buf, len) < 0)
		return -1;
	if (f->tee_fd >= 0 && !f->tee_failed && io_write_all(f->tee_fd, buf, len) < 0)
		f->tee_failed = 1;
	return 0;
}

static void *state_filter_thread(void *arg)
{
	struct state_feed *f = arg;
	struct migfilter_base mb = { .block = "mem", .size = f->pl_size, .page = pageload_page, .flush = pageload_flush,
				     .ctx = f->pl };

	/* Without the loader the stream passes through whole. */
	f->frc = migfilter_run_view(feed_view, &f->slot, feed_write, f, f->pl ? &mb : NULL, &f->st, &f->ferr);
	close(f->fd);            /* end of stream: QEMU sees it whole, or cut short */
	slot_close(&f->slot, 1); /* the chunks' side stops at once if this stopped early */
	return NULL;
}

/* The VM will not come: a loader waiting for it gives up. */
static void state_feed_cancel(struct state_feed *f)
{
	if (f->pl)
		pageload_target(f->pl, 0, 0);
}

/* Wait for the feed (its reader must be gone or reading: close the read
 * end first on a failure). 0, or -1 with err its failure: a chunk's first
 * (a damaged chunk cuts the stream, which the filter then finds short). */
static int state_feed_join(struct state_feed *f, struct kiln_err *err)
{
	int r = 0;

	if (f->fstarted) {
		pthread_join(f->fth, NULL);
		f->fstarted = 0;
	}
	if (f->started) {
		pthread_join(f->th, NULL);
		f->started = 0;
		if (f->rc < 0) {
			*err = f->err;
			r = -1;
		} else if (f->frc < 0) {
			*err = f->ferr;
			r = -1;
		}
	}
	if (f->pl) { /* both threads joined */
		pageload_free(f->pl);
		f->pl = NULL;
	}
	if (f->locks) {
		pthread_mutex_destroy(&f->slot.mu);
		pthread_cond_destroy(&f->slot.cv);
		f->locks = 0;
	}
	if (f->tee_fd >= 0) {
		if (close(f->tee_fd) < 0)
			f->tee_failed = 1;
		f->tee_fd = -1;
		if (r < 0)
			f->tee_failed = 1; /* the caller drops the file (state_feed_keep_tpl) */
	}
	return r;
}

/* After a resume that loaded: the resumed template is kept only if it was
 * written whole; else the session's pauses go through QEMU. */
static void state_feed_keep_tpl(struct state_feed *f, struct session *s)
{
	if (!s->resumed_tpl[0])
		return;
	if (f->tee_failed) {
		fprintf(stderr, "kiln-host: session %s: its resumed template could not be kept (its pauses go through "
				"QEMU)\n", s->id);
		unlink(s->resumed_tpl);
		s->resumed_tpl[0] = '\0';
	}
}

/* session_boot's hook once the VM's QEMU is there: the loader's target. */
static void feed_booted(void *ctx, struct session *s)
{
	struct state_feed *f = ctx;
	int fd = s->base_fd >= 0 ? s->base_fd : s->snap->mem_fd;
	uintptr_t ram = vmmem_find_ram(s->vm.pid, fd, s->snap->mem_size);

	if (!ram)
		fprintf(stderr, "kiln-host: session %s: the VM's RAM is not in QEMU %d's address space\n", s->id,
			(int)s->vm.pid);
	pageload_target(f->pl, ram ? s->vm.pid : 0, ram);
}

/* Version 2: the disk layer (into s->disk, whole, checked: QEMU opens it
 * at start) and the state stream (*state_fd: a socket that f feeds, chunk by
 * chunk, each checked before it is written), fetched in parallel. On
 * success the caller hands *state_fd to QEMU, closes it, then
 * state_feed_join(f). */
static int fetch_v2(const struct s3_config *c, struct session *s, const struct pmanifest *pm,
		    const struct pcache_seal *cache,
		    size_t *disk_hits, int *state_fd, struct state_feed *f, struct kiln_err *err)
{
	struct disk_fetch df = { .c = c, .l = &pm->disk, .cache = cache, .fd = -1, .rc = -1 };
	pthread_t th;
	int p[2];

	df.fd = open(s->disk, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (df.fd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", s->disk, strerror(errno));
	/* A socket pair, not a pipe: QEMU (7.2) waits for its incoming stream
	 * to be readable, and a pipe whose writer closed while QEMU waited is
	 * only POLLHUP, never readable: QEMU would spin on it forever instead of
	 * failing. A socket whose peer closed reads as end of stream at once. */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) < 0) {
		close(df.fd);
		return kiln_err_set(err, KERR_HOST_ERROR, "socketpair: %s", strerror(errno));
	}
	{
		int sz = 1 << 20; /* fewer wake-ups; the default works too */

		(void)setsockopt(p[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
		shutdown(p[0], SHUT_WR); /* one way: kiln-host to QEMU */
	}
	*f = (struct state_feed){ .c = c, .l = &pm->state, .cache = cache, .rc = -1, .fd = p[1], .frc = -1, .tee_fd = -1 };
	f->locks = 1;
	pthread_mutex_init(&f->slot.mu, NULL);
	pthread_cond_init(&f->slot.cv, NULL);
	f->pl_size = pm->base_size;
	if (vmmem_usable() && !(f->pl = pageload_new(pm->base_size, err))) {
		close(p[0]);
		close(p[1]);
		close(df.fd);
		return -1; /* the caller's state_feed_join releases the slot's locks */
	}
	/* On a fetched base, with the loader (the RAM block's pages leave the
	 * stream): what QEMU is fed is kept as the next fast pause's template. */
	if (s->base_fd >= 0 && f->pl) {
		snprintf(s->resumed_tpl, sizeof(s->resumed_tpl), "%s/resumed-template", s->dir);
		f->tee_fd = open(s->resumed_tpl, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (f->tee_fd < 0) {
			fprintf(stderr, "kiln-host: session %s: %s: %s (its pauses go through QEMU)\n", s->id,
				s->resumed_tpl, strerror(errno));
			s->resumed_tpl[0] = '\0';
		}
	}
	if (pthread_create(&th, NULL, disk_fetch_thread, &df) != 0) {
		close(p[0]);
		close(p[1]);
		close(df.fd);
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot start a download thread");
	}
	if (pthread_create(&f->fth, NULL, state_filter_thread, f) != 0) {
		close(p[1]);
		kiln_err_set(err, KERR_HOST_ERROR, "cannot start the stream filter");
	} else if (f->fstarted = 1, pthread_create(&f->th, NULL, state_feed_thread, f) != 0) {
		slot_close(&f->slot, 0); /* the filter sees a short stream and ends */
		kiln_err_set(err, KERR_HOST_ERROR, "cannot start a download thread");
	} else {
		f->started = 1;
	}
	pthread_join(th, NULL);
	*disk_hits = df.hits;
	if (close(df.fd) < 0 && df.rc == 0)
		df.rc = kiln_err_set(&df.err, KERR_HOST_ERROR, "writing %s: %s", s->disk, strerror(errno));
	if (!f->started || df.rc < 0) {
		struct kiln_err ferr = { .code = "" };

		close(p[0]); /* a feed blocked on the socket ends (EPIPE) */
		state_feed_cancel(f);
		if (state_feed_join(f, &ferr) < 0 && ferr.errc == KERR_SNAPSHOT_CORRUPT)
			*err = ferr;
		else if (df.rc < 0)
			*err = df.err;
		return -1;
	}
	*state_fd = p[0];
	return 0;
}

/* Bytes of l's chunks in S3 (compressed). */
static uint64_t zbytes(const struct pchunk_list *l)
{
	uint64_t n = 0;

	for (size_t i = 0; i < l->n; i++)
		n += l->c[i].zsize;
	return n;
}

int session_resume(struct session_table *ss, const char *id, const char *customer, const struct tref *tref, json_t **out,
		   struct kiln_err *err)
{
	struct hostd_s3 s3;
	struct task_spec ts = { 0 };
	const struct snapshot *snap;
	struct session *s = NULL;
	json_t *m = NULL, *files;
	struct pmanifest pm = { 0 };
	char key[512], path[PATH_MAX + 32];
	int fd = -1, r = -1, have_ts = 0, reserved = 0, boot_failed = 0;
	/* Where a resume's time goes (logged): the manifest, the base when it
	 * comes from S3, the disk layer, the disk's rebase, QEMU starting and
	 * loading the state while it streams in. */
	int64_t t0 = proto_now_ms(), t_manifest = 0, t_base = 0, t_fetch = 0, t_disk = 0;
	struct state_feed feed = { .started = 0, .tee_fd = -1 };
	struct pcache_seal seal = { .dir = "" };
	size_t disk_hits = 0;

	*out = NULL;
	if (!spool_id_ok(id) || !spool_id_ok(customer))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "id and customer: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
	if (hostd_s3_take(ss->d, &s3) < 0)
		return kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
	s = session_new(ss, id, customer, NULL, &(struct task_spec){ .memory_mib = 0 }, &(struct snapshot){ .mem_fd = -1 },
			err);
	if (!s)
		goto out_s3;
	pthread_mutex_lock(&s->op);
	s->refs = 1;
	if (session_insert(ss, s, err) < 0) {
		pthread_mutex_unlock(&s->op);
		session_free(s);
		s = NULL;
		goto out_s3;
	}
	if (mkdir(s->dir, 0700) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", s->dir, strerror(errno));
		goto fail;
	}
	/* The manifest first: without it there is no paused session. */
	session_s3_key(key, sizeof(key), customer, id, "manifest.json");
	{
		char *text = NULL;
		ssize_t len = get_small(&s3.c, key, &text, err);

		if (len < 0) {
			if (err->errc == KERR_S3_NOT_FOUND)
				kiln_err_set(err, KERR_NO_SNAPSHOT, "no paused session %s", id);
			goto fail;
		}
		r = pmanifest_parse(text, (size_t)len, customer, id, &pm, err);
		free(text);
		if (r < 0)
			goto fail;
		r = -1;
		m = json_incref(pm.root);
	}
	t_manifest = proto_now_ms();
	if (session_parse_spec(json_object_get(m, "spec"), &ts, err) < 0) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's spec is invalid");
		goto fail;
	}
	have_ts = 1;
	snap = session_template_take(ss, tref, &ts, &s->tu, &s->has_tu, err);
	if (!snap)
		goto fail;
	if (strcmp(json_string_value(json_object_get(m, "template")) ?: "", snap->key)) {
		kiln_err_set(err, KERR_INCOMPATIBLE_SNAPSHOT,
			     "the session was paused on a host with another image (template %.20s, this host's %s)",
			     json_string_value(json_object_get(m, "template")) ?: "?", snap->key);
		goto fail;
	}
	if (pm.version == PMANIFEST_V2) {
		char base_sha[65];

		if (snapshot_mem_sha256(snap, base_sha, err) < 0)
			goto fail;
		if (pm.base_size != snap->mem_size) {
			kiln_err_set(err, KERR_INCOMPATIBLE_SNAPSHOT,
				     "the session was paused with %llu bytes of RAM, and this host's snapshot %s has %llu",
				     (unsigned long long)pm.base_size, snap->key, (unsigned long long)snap->mem_size);
			goto fail;
		}
		/* Another host's snapshot RAM: its copy in S3 becomes this VM's base. */
		if (strcmp(base_sha, pm.base_sha256)) {
			if ((s->base_fd = base_fetch(&s3.c, pm.base_sha256, pm.base_size, err)) < 0)
				goto fail;
			snprintf(s->base_sha, sizeof(s->base_sha), "%s", pm.base_sha256);
		}
	}
	t_base = proto_now_ms();
	if (hostd_reserve(ss->d, ts.vcpus, ts.memory_mib, err) < 0)
		goto fail;
	reserved = 1;
	/* The real values, now that they are known. */
	json_decref(s->spec);
	s->spec = json_deep_copy(json_object_get(m, "spec"));
	s->snap = snap;
	s->vcpus = ts.vcpus;
	s->memory_mib = ts.memory_mib;
	s->output_mib = ts.output_mib;
	snprintf(s->release, sizeof(s->release), "%s", snap->release);
	if (pm.version == PMANIFEST_V2) {
		/* Its chunks from this host's pause cache where they are there,
		 * opened with the key its manifest holds. */
		if (pm.has_cache_key && pcache_dir(&ss->pcache, customer, id, 0, seal.dir, sizeof(seal.dir)) == 0)
			memcpy(seal.key, pm.cache_key, sizeof(seal.key));
		if (fetch_v2(&s3.c, s, &pm, seal.dir[0] ? &seal : NULL, &disk_hits, &fd, &feed, err) < 0)
			goto fail;
	} else {
		files = json_object_get(m, "files");
		for (size_t i = 0; i < sizeof(snap_files) / sizeof(*snap_files); i++) {
			snprintf(path, sizeof(path), "%s/%s", s->dir, snap_files[i]);
			session_s3_key(key, sizeof(key), customer, id, snap_files[i]);
			if (s3_get_file(&s3.c, key, path, err) < 0) {
				if (err->errc == KERR_S3_NOT_FOUND)
					kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s is missing from the paused session in S3",
						     snap_files[i]);
				goto fail;
			}
			if (check_file(path, json_object_get(files, snap_files[i]), snap_files[i], err) < 0)
				goto fail;
		}
	}
	t_fetch = proto_now_ms();
	/* Point the overlay at this host's copy of the template (same key: the
	 * same bytes); -u: only the header changes. qemu-img runs as root and
	 * the header came from S3 (written by a jailed QEMU): it must be a plain
	 * overlay of this template first, nothing that makes qemu-img open
	 * another host file (an external data file) or parse more than that. */
	if (qcow2_file_check(s->disk, snap->disk, err) < 0)
		goto fail;
	{
		char *argv[] = { "/usr/bin/qemu-img", "rebase", "-q", "-u", "-f", "qcow2", "-F", "qcow2", "-b",
				 (char *)snap->disk, s->disk, NULL };
		char cur[PATH_MAX];

		/* Already this host's path (the same snapshot cache): nothing to do. */
		if (snapshot_qcow2_backing(s->disk, cur, sizeof(cur)) == 0 && !strcmp(cur, snap->disk))
			;
		else if (snapshot_run_cmd(argv) < 0) {
			kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's disk layer is not a usable qcow2 image");
			goto fail;
		}
	}
	t_disk = proto_now_ms();
	if (pm.version != PMANIFEST_V2)
		fd = open(s->state_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", s->state_path, strerror(errno));
		goto fail;
	}
	/* Version 2: the base mapped copy-on-write, the changed pages over it,
	 * written in as they arrive once QEMU is there. */
	if (pm.version == PMANIFEST_V2 && feed.pl) {
		s->booted = feed_booted;
		s->booted_ctx = &feed;
	}
	r = session_boot(ss, s, &ts, fd, pm.version != PMANIFEST_V2, err);
	s->booted = NULL;
	if (r < 0) {
		r = -1;
		boot_failed = 1;
		goto fail;
	}
	r = -1;
	close(fd);
	fd = -1;
	/* QEMU loaded a whole stream; the feed must agree that it was all checked. */
	if (state_feed_join(&feed, err) < 0)
		goto fail;
	state_feed_keep_tpl(&feed, s);
	unlink(s->state_path); /* the RAM is in the VM now */
	{
		int64_t now = proto_now_ms();

		fprintf(stderr,
			"kiln-host: session %s resumed in %lld ms: manifest %lld, base %lld, disk layer %lld "
			"(state %llu + disk %llu bytes in S3), disk rebase %lld, QEMU load %lld (the state streamed in meanwhile; %s: QEMU %lld, load %lld, setup %lld); state chunks all in at %lld; %zu of %zu chunks from this host's pause cache\n",
			id, (long long)(now - t0), (long long)(t_manifest - t0), (long long)(t_base - t_manifest),
			(long long)(t_fetch - t_base), (unsigned long long)zbytes(&pm.state),
			(unsigned long long)zbytes(&pm.disk), (long long)(t_disk - t_fetch),
			(long long)(now - t_disk), s->prestarted ? "QEMU started ahead" : "QEMU started now",
			(long long)s->boot_ms[0], (long long)s->boot_ms[1], (long long)s->boot_ms[2],
			(long long)(feed.chunks_done_ms ? feed.chunks_done_ms - t0 : 0), feed.hits + disk_hits,
			pm.state.n + pm.disk.n);
	}
	/* Its memory is in the VM now: the kept chunks go (its next pause
	 * keeps its own). */
	pcache_drop(&ss->pcache, customer, id);
	*out = session_json(ss, s);
	session_put(ss, s, 0);
	r = 0;
	goto out;
fail:
	if (fd >= 0)
		close(fd);
	if (!reserved)
		s->vcpus = 0; /* nothing to give back */
	/* Teardown first: QEMU's copy of the state socket goes, so the feed
	 * ends (it uses pm: joined before pm is freed). */
	session_teardown(ss, s);
	state_feed_cancel(&feed);
	{
		struct kiln_err ferr = { .code = "" };

		/* A chunk that failed its check cut the stream: that is why. */
		if (state_feed_join(&feed, &ferr) < 0 && boot_failed && ferr.errc == KERR_SNAPSHOT_CORRUPT)
			*err = ferr;
		else if (boot_failed && pm.version == PMANIFEST_V2 && err->errc != KERR_SNAPSHOT_CORRUPT)
			kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's state does not load: %s", err->message);
	}
	session_put(ss, s, 1);
out:
	OPENSSL_cleanse(&seal, sizeof(seal));
	if (have_ts)
		spec_free(&ts);
	json_decref(m);
	pmanifest_free(&pm);
out_s3:
	hostd_s3_free(&s3);
	return r;
}
