/* pause_chunks: parallel compressed chunk upload and download (see
 * pause_chunks.h). One mutex guards the queue and the results; the workers
 * compress, hash and send outside it. */
#include "pause_chunks.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <zstd.h>

#include "io.h"

#define PCHUNK_WORKERS_MAX 16
#define PCHUNK_ZLEVEL      1

struct job {
	int stream;
	size_t index;
	void *buf;
	size_t len;
	struct job *next;
};

struct pchunk_up {
	const struct s3_config *c;
	char prefix[400];
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct job *head, *tail;
	int queued, workers, stopping, failed;
	int held;                 /* pchunk_up_hold: the workers wait, the queue is not bounded */
	int nice;                 /* pchunk_up_background: the workers' niceness from their next chunk */
	struct kiln_err err;
	struct pchunk_list out[2];
	size_t cap[2];
	uint64_t bytes;
	struct pcache_seal cache; /* where each chunk is kept too, sealed (dir "": nowhere) */
	struct pchunk *known;     /* already in S3 (pchunk_up_known) */
	size_t nknown;
	uint64_t reused;          /* chunks not sent: known */
	pthread_t th[PCHUNK_WORKERS_MAX];
};

static void sha_hex(const void *p, size_t n, char out[65])
{
	unsigned char d[32];
	unsigned int dl;

	EVP_Digest(p, n, d, &dl, EVP_sha256(), NULL);
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* Read the chunk p from this host's pause cache into z and check it as a
 * chunk from S3 is checked (its hash): 0, or -1 (the caller fetches). */
static int cache_read(const struct pcache_seal *cache, const struct pchunk *p, void *z, char sha[65])
{
	if (pcache_get(cache, p->sha256, z, p->zsize) < 0)
		return -1;
	sha_hex(z, p->zsize, sha);
	return strcmp(sha, p->sha256) ? -1 : 0;
}

/* A chunk already in S3 with these compressed bytes (its hash and size). */
static const struct pchunk *find_known(const struct pchunk_up *u, const struct pchunk *pc)
{
	for (size_t i = 0; i < u->nknown; i++)
		if (u->known[i].zsize == pc->zsize && u->known[i].size == pc->size &&
		    !strcmp(u->known[i].sha256, pc->sha256))
			return &u->known[i];
	return NULL;
}

int pchunk_up_known(struct pchunk_up *u, const struct pchunk_list *a, const struct pchunk_list *b)
{
	size_t n = (a ? a->n : 0) + (b ? b->n : 0);
	struct pchunk *k = n ? malloc(n * sizeof(*k)) : NULL;

	if (n && !k)
		return -1;
	if (a && a->n)
		memcpy(k, a->c, a->n * sizeof(*k));
	if (b && b->n)
		memcpy(k + (a ? a->n : 0), b->c, b->n * sizeof(*k));
	free(u->known);
	u->known = k;
	u->nknown = n;
	return 0;
}

void pchunk_up_background(struct pchunk_up *u, int nice)
{
	pthread_mutex_lock(&u->lock);
	u->nice = nice;
	pthread_mutex_unlock(&u->lock);
}

#define PCHUNK_HOLD_MAX 16

void pchunk_up_hold(struct pchunk_up *u, int on)
{
	pthread_mutex_lock(&u->lock);
	u->held = on;
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->lock);
}

size_t pchunk_up_count(struct pchunk_up *u, int stream)
{
	size_t n;

	pthread_mutex_lock(&u->lock);
	n = u->out[stream].n;
	pthread_mutex_unlock(&u->lock);
	return n;
}

static void *up_worker(void *arg)
{
	struct pchunk_up *u = arg;
	int niced = 0;

	pthread_mutex_lock(&u->lock);
	for (;;) {
		struct job *j;
		struct kiln_err e = { .code = "" };
		struct pchunk pc = { 0 };
		size_t cap;
		void *z;
		int r = -1;

		while ((!u->head || u->held) && !u->stopping)
			pthread_cond_wait(&u->cond, &u->lock);
		/* This thread only (Linux: a thread's own niceness). */
		if (u->nice != niced && setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), u->nice) == 0)
			niced = u->nice;
		if (!u->head)
			break;
		j = u->head;
		u->head = j->next;
		if (!u->head)
			u->tail = NULL;
		pthread_mutex_unlock(&u->lock);

		snprintf(pc.key, sizeof(pc.key), "%s%c%zu", u->prefix, j->stream ? 'd' : 's', j->index);
		pc.size = j->len;
		cap = ZSTD_compressBound(j->len);
		z = malloc(cap);
		if (!z) {
			kiln_err_set(&e, KERR_HOST_ERROR, "out of memory");
		} else {
			size_t zn = ZSTD_compress(z, cap, j->buf, j->len, PCHUNK_ZLEVEL);

			if (ZSTD_isError(zn)) {
				kiln_err_set(&e, KERR_HOST_ERROR, "zstd: %s", ZSTD_getErrorName(zn));
			} else {
				const struct pchunk *k;

				pc.zsize = zn;
				sha_hex(z, zn, pc.sha256);
				if ((k = find_known(u, &pc)) != NULL) {
					/* In S3 already (an unchanged disk, the same
					 * bytes as a kept layer): named, not sent. */
					snprintf(pc.key, sizeof(pc.key), "%s", k->key);
					r = 0;
				} else {
					r = s3_put_buffer(u->c, pc.key, z, zn, "application/zstd", &e);
				}
				if (r == 0 && u->cache.dir[0])
					(void)pcache_put(&u->cache, pc.sha256, z, zn);
			}
		}
		free(z);
		pchunk_buf_free(j->buf);

		pthread_mutex_lock(&u->lock);
		u->queued--;
		if (r < 0) {
			if (!u->failed)
				u->err = e;
			u->failed = 1;
		} else {
			int sent = strncmp(pc.key, u->prefix, strlen(u->prefix)) == 0;

			u->out[j->stream].c[j->index] = pc;
			if (sent)
				u->bytes += pc.zsize;
			else
				u->reused++;
		}
		free(j);
		pthread_cond_broadcast(&u->cond);
	}
	pthread_mutex_unlock(&u->lock);
	return NULL;
}

struct pchunk_up *pchunk_up_start(const struct s3_config *c, const char *prefix, int workers)
{
	struct pchunk_up *u = calloc(1, sizeof(*u));

	if (!u)
		return NULL;
	if (workers < 1)
		workers = 1;
	if (workers > PCHUNK_WORKERS_MAX)
		workers = PCHUNK_WORKERS_MAX;
	u->c = c;
	snprintf(u->prefix, sizeof(u->prefix), "%s", prefix);
	pthread_mutex_init(&u->lock, NULL);
	pthread_cond_init(&u->cond, NULL);
	for (; u->workers < workers; u->workers++)
		if (pthread_create(&u->th[u->workers], NULL, up_worker, u) != 0)
			break;
	if (!u->workers) {
		free(u);
		return NULL;
	}
	return u;
}

void pchunk_up_cache(struct pchunk_up *u, const struct pcache_seal *cache)
{
	if (cache)
		u->cache = *cache;
	else
		u->cache.dir[0] = '\0';
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels refuse it, harmlessly */
#endif

/* Fault in buf's bytes [from, to) in the kernel, in whole huge pages. */
static void buf_populate(void *buf, size_t from, size_t to)
{
	const size_t huge = 2u << 20;

	from = from / huge * huge;
	to = (to + huge - 1) / huge * huge;
	if (to > PCHUNK_RAW_MAX)
		to = PCHUNK_RAW_MAX;
	if (to > from)
		(void)madvise((char *)buf + from, to - from, MADV_POPULATE_WRITE);
}

/* A buffer with its first `need` bytes faulted in (the kernel zeroes each
 * page it gives: a small chunk need not pay for 16 MiB of them). */
static void *buf_alloc(size_t need)
{
	void *p = mmap(NULL, PCHUNK_RAW_MAX, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	(void)madvise(p, PCHUNK_RAW_MAX, MADV_HUGEPAGE);
	buf_populate(p, 0, need);
	return p;
}

void *pchunk_buf_alloc(void)
{
	return buf_alloc(PCHUNK_RAW_MAX);
}

void pchunk_buf_free(void *buf)
{
	if (buf)
		munmap(buf, PCHUNK_RAW_MAX);
}

int pchunk_up_add(struct pchunk_up *u, int stream, void *buf, size_t len)
{
	struct job *j = calloc(1, sizeof(*j));
	int r = -1;

	pthread_mutex_lock(&u->lock);
	/* One chunk waiting per worker busy, and two more: 16 MiB each. */
	/* Held: up to PCHUNK_HOLD_MAX chunks more (256 MiB), then the
	 * workers go on after all (a large RAM is not kept twice). */
	if (u->held && u->queued >= u->workers + 2 + PCHUNK_HOLD_MAX) {
		u->held = 0;
		pthread_cond_broadcast(&u->cond);
	}
	while (!u->failed && !u->held && u->queued >= u->workers + 2)
		pthread_cond_wait(&u->cond, &u->lock);
	if (!j || u->failed || u->out[stream].n >= PCHUNK_MAX) {
		if (!u->failed) {
			kiln_err_set(&u->err, KERR_HOST_ERROR, j ? "too many chunks" : "out of memory");
			u->failed = 1;
		}
		goto out;
	}
	if (u->out[stream].n == u->cap[stream]) {
		size_t nc = u->cap[stream] ? 2 * u->cap[stream] : 64;
		struct pchunk *p = realloc(u->out[stream].c, nc * sizeof(*p));

		if (!p) {
			kiln_err_set(&u->err, KERR_HOST_ERROR, "out of memory");
			u->failed = 1;
			goto out;
		}
		u->out[stream].c = p;
		u->cap[stream] = nc;
	}
	*j = (struct job){ .stream = stream, .index = u->out[stream].n, .buf = buf, .len = len };
	u->out[stream].c[j->index] = (struct pchunk){ .offset = u->out[stream].total };
	u->out[stream].n++;
	u->out[stream].total += len;
	if (u->tail)
		u->tail->next = j;
	else
		u->head = j;
	u->tail = j;
	u->queued++;
	j = NULL;
	buf = NULL;
	r = 0;
	pthread_cond_broadcast(&u->cond);
out:
	pthread_mutex_unlock(&u->lock);
	free(j);
	pchunk_buf_free(buf);
	return r;
}

int pchunk_up_finish(struct pchunk_up *u, struct pchunk_list *state, struct pchunk_list *disk, uint64_t *bytes,
		     struct kiln_err *err)
{
	int r;

	pthread_mutex_lock(&u->lock);
	u->stopping = 1;
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->lock);
	for (int i = 0; i < u->workers; i++)
		pthread_join(u->th[i], NULL);
	r = u->failed ? -1 : 0;
	if (r < 0) {
		*err = u->err;
		free(u->out[0].c);
		free(u->out[1].c);
	} else {
		*state = u->out[0];
		*disk = u->out[1];
		for (int s = 0; s < 2; s++) {
			struct pchunk_list *l = s ? disk : state;

			for (size_t i = 0; i < l->n; i++)
				l->c[i].offset = i ? l->c[i - 1].offset + l->c[i - 1].size : 0;
		}
		*bytes += u->bytes;
	}
	pthread_mutex_destroy(&u->lock);
	pthread_cond_destroy(&u->cond);
	OPENSSL_cleanse(&u->cache, sizeof(u->cache)); /* the key lives on only in the manifest */
	free(u->known);
	free(u);
	return r;
}

/* ---- download ------------------------------------------------------------ */

struct getter {
	const struct s3_config *c;
	const struct pchunk_list *l;
	int out_fd;           /* not stream: the file the chunks are written into */
	int stream;           /* chunks handed to sink in order */
	pchunk_sink_fn sink;
	void *sink_ctx;
	const struct pcache_seal *cache; /* read chunks from here first (NULL: S3 only) */
	size_t hits;          /* chunks read from the cache (under lock) */
	pthread_mutex_t lock;
	pthread_cond_t turn;  /* stream: `written` moved, or a failure */
	size_t next, written; /* chunks handed out; stream: chunks written */
	int failed;
	struct kiln_err err;
};

/* Stream mode: wait for chunk i's turn (every chunk before it written),
 * write it whole, pass the turn on. Chunks are handed out in order, so the
 * lowest unwritten one is always being fetched, never waiting: no deadlock.
 * 0, or -1 (e set) on a failed write or when another chunk failed. */
static int stream_write(struct getter *g, size_t i, const void *raw, size_t n, const char *key, struct kiln_err *e)
{
	int r;

	pthread_mutex_lock(&g->lock);
	while (g->written != i && !g->failed)
		pthread_cond_wait(&g->turn, &g->lock);
	if (g->failed) {
		pthread_mutex_unlock(&g->lock);
		return kiln_err_set(e, KERR_HOST_ERROR, "another chunk failed");
	}
	pthread_mutex_unlock(&g->lock);
	/* Only this thread hands over now: the reader (QEMU) may take its time. */
	r = g->sink(g->sink_ctx, raw, n);
	pthread_mutex_lock(&g->lock);
	if (r == 0)
		g->written++;
	pthread_cond_broadcast(&g->turn);
	pthread_mutex_unlock(&g->lock);
	return r < 0 ? kiln_err_set(e, KERR_HOST_ERROR, "feeding chunk %s to QEMU: the stream's reader stopped", key)
		     : 0;
}

/* A worker's decompression buffer, kept from one chunk to its next: a
 * fresh one is 16 MiB of pages the kernel zeroes first. */
struct rawbuf {
	void *p;
	size_t ready; /* bytes faulted in */
};

static int get_one(struct getter *g, size_t i, const struct pchunk *p, struct rawbuf *rb, struct kiln_err *e)
{
	char sha[65];
	struct stat st;
	void *z = NULL, *raw = NULL;
	int fd = -1, r = -1;
	size_t n;

	z = malloc(p->zsize ? p->zsize : 1);
	if (!z) {
		kiln_err_set(e, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	if (g->cache && cache_read(g->cache, p, z, sha) == 0) {
		pthread_mutex_lock(&g->lock);
		g->hits++;
		pthread_mutex_unlock(&g->lock);
	} else {
		if ((fd = memfd_create("kiln-chunk", MFD_CLOEXEC)) < 0) {
			kiln_err_set(e, KERR_HOST_ERROR, "memfd: %s", strerror(errno));
			goto out;
		}
		if (s3_get_fd(g->c, p->key, fd, e) < 0) {
			if (e->errc == KERR_S3_NOT_FOUND)
				kiln_err_set(e, KERR_SNAPSHOT_CORRUPT, "chunk %s is missing from the paused session in S3",
					     p->key);
			goto out;
		}
		if (fstat(fd, &st) < 0) {
			kiln_err_set(e, KERR_HOST_ERROR, "chunk %s: %s", p->key, strerror(errno));
			goto out;
		}
		if ((uint64_t)st.st_size != p->zsize) {
			kiln_err_set(e, KERR_SNAPSHOT_CORRUPT, "chunk %s: size differs from the manifest (S3 copy damaged)",
				     p->key);
			goto out;
		}
		if (pread(fd, z, p->zsize, 0) != (ssize_t)p->zsize) {
			kiln_err_set(e, KERR_HOST_ERROR, "chunk %s: short read", p->key);
			goto out;
		}
		/* The hash first: nothing from S3 reaches the decompressor unchecked. */
		sha_hex(z, p->zsize, sha);
		if (strcmp(sha, p->sha256)) {
			kiln_err_set(e, KERR_SNAPSHOT_CORRUPT, "chunk %s: sha256 differs from the manifest (S3 copy damaged)",
				     p->key);
			goto out;
		}
		if (g->cache && g->cache->keep && g->cache->dir[0]) {
			(void)pcache_put(g->cache, p->sha256, z, p->zsize); /* best effort */
		}
	}
	if (p->size <= PCHUNK_RAW_MAX) {
		if (!rb->p && (rb->p = buf_alloc(p->size)))
			rb->ready = p->size;
		else if (rb->p && rb->ready < p->size) {
			buf_populate(rb->p, rb->ready, p->size);
			rb->ready = p->size;
		}
		raw = rb->p;
	}
	if (!raw) {
		kiln_err_set(e, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	if (ZSTD_getFrameContentSize(z, p->zsize) != p->size ||
	    ZSTD_isError(n = ZSTD_decompress(raw, p->size, z, p->zsize)) || n != p->size) {
		kiln_err_set(e, KERR_SNAPSHOT_CORRUPT, "chunk %s does not decompress to its size", p->key);
		goto out;
	}
	if (g->stream) {
		if (stream_write(g, i, raw, p->size, p->key, e) < 0)
			goto out;
	} else if (pwrite(g->out_fd, raw, p->size, (off_t)p->offset) != (ssize_t)p->size) {
		kiln_err_set(e, KERR_HOST_ERROR, "writing chunk %s: %s", p->key, strerror(errno));
		goto out;
	}
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	free(z);
	return r;
}

static void *get_worker(void *arg)
{
	struct getter *g = arg;
	struct rawbuf rb = { 0 };

	for (;;) {
		struct kiln_err e = { .code = "" };
		size_t i;

		pthread_mutex_lock(&g->lock);
		if (g->failed || g->next >= g->l->n) {
			pthread_mutex_unlock(&g->lock);
			pchunk_buf_free(rb.p);
			return NULL;
		}
		i = g->next++;
		pthread_mutex_unlock(&g->lock);
		if (get_one(g, i, &g->l->c[i], &rb, &e) < 0) {
			pthread_mutex_lock(&g->lock);
			if (!g->failed)
				g->err = e;
			g->failed = 1;
			pthread_cond_broadcast(&g->turn);
			pthread_mutex_unlock(&g->lock);
		}
	}
}

static int get_all(const struct s3_config *c, const struct pchunk_list *l, int out_fd, pchunk_sink_fn sink,
		   void *sink_ctx, int workers, const struct pcache_seal *cache, size_t *hits, struct kiln_err *err)
{
	struct getter g = { .c = c, .l = l, .out_fd = out_fd, .stream = sink != NULL, .sink = sink, .sink_ctx = sink_ctx,
			    .cache = cache && cache->dir[0] ? cache : NULL };
	pthread_t th[PCHUNK_WORKERS_MAX];
	int n = 0;

	if (workers > PCHUNK_WORKERS_MAX)
		workers = PCHUNK_WORKERS_MAX;
	pthread_mutex_init(&g.lock, NULL);
	pthread_cond_init(&g.turn, NULL);
	if (!sink && ftruncate(out_fd, (off_t)l->total) < 0) {
		pthread_mutex_destroy(&g.lock);
		pthread_cond_destroy(&g.turn);
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot size the stream: %s", strerror(errno));
	}
	for (; n < workers - 1; n++)
		if (pthread_create(&th[n], NULL, get_worker, &g) != 0)
			break;
	get_worker(&g);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&g.lock);
	pthread_cond_destroy(&g.turn);
	if (hits)
		*hits = g.hits;
	if (g.failed) {
		*err = g.err;
		return -1;
	}
	return 0;
}

int pchunk_get_all(const struct s3_config *c, const struct pchunk_list *l, int out_fd, int workers,
		   const struct pcache_seal *cache, size_t *hits, struct kiln_err *err)
{
	return get_all(c, l, out_fd, NULL, NULL, workers, cache, hits, err);
}

int pchunk_stream_all(const struct s3_config *c, const struct pchunk_list *l, pchunk_sink_fn sink, void *ctx,
		      int workers, const struct pcache_seal *cache, size_t *hits, struct kiln_err *err)
{
	return get_all(c, l, -1, sink, ctx, workers, cache, hits, err);
}
