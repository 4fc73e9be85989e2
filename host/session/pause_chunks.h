/* pause_chunks: a paused session's streams as zstd-compressed chunk objects
 * in S3, each with its SHA-256, uploaded and downloaded by a few threads in
 * parallel (see pause_manifest.h for the list that names them). */
#ifndef KILN_PAUSE_CHUNKS_H
#define KILN_PAUSE_CHUNKS_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "pause_cache.h"
#include "pause_manifest.h"
#include "s3.h"

struct pchunk_up;

/* Start an uploader of chunks named "<prefix><stream letter><index>" with
 * `workers` threads. c must outlive it. NULL if out of resources. */
struct pchunk_up *pchunk_up_start(const struct s3_config *c, const char *prefix, int workers);

/* A chunk's buffer (PCHUNK_RAW_MAX bytes), its pages faulted in up front,
 * in huge pages where the kernel gives them: on the virtualised hosts
 * measured, a user-mode page fault costs ~15 us, and an 8 MiB buffer
 * touched page by page (2,048 faults) ~30 ms; populated in the kernel it
 * is ~1 ms. NULL when out of memory. pchunk_buf_free(NULL) does nothing. */
void *pchunk_buf_alloc(void);
void pchunk_buf_free(void *buf);

/* Keep each chunk, once in S3, in cache->dir too, sealed with cache->key
 * (the session's pause cache, pcache_put; NULL or dir "": nowhere). The
 * uploader keeps a copy of the key until pchunk_up_finish wipes it. Call
 * before the first pchunk_up_add. */
void pchunk_up_cache(struct pchunk_up *u, const struct pcache_seal *cache);

/* Chunks already in S3 (a copy is taken; call before the first
 * pchunk_up_add): a chunk whose compressed bytes hash to one of theirs
 * (and have its size) is not sent again; the list names the known key. */
int pchunk_up_known(struct pchunk_up *u, const struct pchunk_list *a, const struct pchunk_list *b);

/* Queue buf (len <= PCHUNK_RAW_MAX bytes, from pchunk_buf_alloc; the uploader frees it)
 * as the next chunk of stream 0 (state) or 1 (disk). Blocks while too many
 * chunks wait (bounded memory). 0, or -1 once an upload failed. */
int pchunk_up_add(struct pchunk_up *u, int stream, void *buf, size_t len);

/* Wait for every queued chunk, stop the threads, fill the two lists (owned
 * by the caller: free(list.c)), add the compressed bytes sent to *bytes.
 * 0, or -1 with err set to the first failure. Frees u either way. */
int pchunk_up_finish(struct pchunk_up *u, struct pchunk_list *state, struct pchunk_list *disk, uint64_t *bytes,
		     struct kiln_err *err);

/* on: the workers leave the queue alone and pchunk_up_add does not wait
 * for room (the chunks stay in memory: a checkpoint's stand-still, whose
 * CPU the compression would take), up to 16 chunks more, past which they
 * go on anyway; off: they go on. */
void pchunk_up_hold(struct pchunk_up *u, int on);

/* The workers compress and send at this niceness from their next chunk
 * on (a fork's upload, behind the children starting on the same cores). */
void pchunk_up_background(struct pchunk_up *u, int nice);

/* Chunks queued so far on stream (0 or 1). */
size_t pchunk_up_count(struct pchunk_up *u, int stream);

/* Download every chunk of l with `workers` threads into out_fd at its
 * offset, each checked against its size and SHA-256 before it is
 * decompressed (a mismatch: snapshot_corrupt naming the chunk); a chunk is
 * held in memory meanwhile. With cache (NULL or dir "": none), a chunk is
 * read from this host's pause cache instead when it is there, opens with
 * cache->key and checks (pcache_get); *hits (may be NULL) counts those. 0,
 * or -1 with err set. */
int pchunk_get_all(const struct s3_config *c, const struct pchunk_list *l, int out_fd, int workers,
		   const struct pcache_seal *cache, size_t *hits, struct kiln_err *err);

/* The stream's consumer: takes len bytes of the stream (the next in
 * order) and returns once it is done with buf (0), or -1 when it stopped
 * taking (the stream ends there, e.g. its reader failed). */
typedef int (*pchunk_sink_fn)(void *ctx, const void *buf, size_t len);

/* The same, handed in order to sink (QEMU's state stream, through the
 * filter that loads its pages): chunks are fetched and checked `workers`
 * at a time, and each is handed over whole, straight from its buffer, once
 * every chunk before it is, so that the reader starts on the first chunk
 * while the rest arrive. At most `workers` decompressed chunks in memory. A
 * chunk that fails to check is never handed over; nothing after it is
 * either. cache and hits as for pchunk_get_all. 0, or -1 with err set (the
 * first failure). */
int pchunk_stream_all(const struct s3_config *c, const struct pchunk_list *l, pchunk_sink_fn sink, void *ctx,
		      int workers, const struct pcache_seal *cache, size_t *hits, struct kiln_err *err);

#endif
