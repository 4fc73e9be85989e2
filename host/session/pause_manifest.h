/* pause_manifest: the manifest of a paused session (version 2: the
 * migration stream filtered against a base snapshot's RAM, and the disk
 * layer, each as zstd-compressed chunks with a SHA-256 per chunk). The
 * manifest comes back from S3: pmanifest_parse bounds and checks every
 * field before resume uses any of it. */
#ifndef KILN_PAUSE_MANIFEST_H
#define KILN_PAUSE_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "err.h"
#include "pause_cache.h"

#define PMANIFEST_V1         1        /* whole state + disk.qcow2 objects (still resumed) */
#define PMANIFEST_V2         2
/* Version 3 (2026-12-07): version 2 plus "tail", the number of the state's
 * last chunks that hold the devices (after the RAM's pages: the stream is
 * cut there), and "depth", how many delta pauses are layered since the
 * last full one. The state's chunks before the tail are the layers a later
 * pause may reuse, appending only the pages changed since (a delta); they
 * may sit under older generations of the same session. Hosts before it
 * refuse it ("reads versions 1 and 2"): a delta over chunks they would not
 * know is a layer. */
#define PMANIFEST_V3         3
#define PMANIFEST_DEPTH_MAX  64       /* deltas a manifest may layer (pauses compact before) */
/* A chunk's uncompressed size: the most a pause cuts and a resume accepts.
 * 16 MiB since 2026-12-06 (8 before; those still resume, but a pause cut at
 * 16 does not resume on a host from before): on the local S3 each GET costs
 * more CPU than the bytes it brings (docs/performance.md). */
#define PCHUNK_RAW_MAX       (16u << 20)
#define PCHUNK_MAX           4096       /* chunks per stream (32 GiB) */

struct pchunk {
	char key[512];      /* full object key */
	uint64_t size;      /* uncompressed bytes */
	uint64_t zsize;     /* bytes in S3 (zstd frame) */
	uint64_t offset;    /* where its bytes go in the stream (sum of the sizes before) */
	char sha256[65];    /* of the object's bytes, lower-case hex */
};

struct pchunk_list {
	struct pchunk *c;
	size_t n;
	uint64_t total;     /* sum of sizes */
};

struct pmanifest {
	int version;
	json_t *root;       /* owned: the whole document (spec, template, ...) */
	char base_sha256[65];
	uint64_t base_size;
	struct pchunk_list state, disk;
	/* "cache_key": the key the pausing host sealed its pause-cache copies
	 * with (pause_cache.h); only here, in S3. Absent or malformed: the
	 * cache is not read. */
	unsigned char cache_key[PCACHE_KEY_LEN];
	int has_cache_key;
	/* Version 3: the state's last `tail` chunks are the devices (1 or
	 * more; 0 before version 3: the layers are not known), `depth` deltas
	 * are layered, and the pause that wrote it was `generation`. */
	size_t tail;
	int depth;
	char generation[48];
	/* "from_snapshot": the snapshot the session was started from (a
	 * fork's or a named one), whose chunks its manifest may name too. */
	char from_snapshot[65];
};

/* Parse and check a manifest for the session customer/id: version 1 (only
 * its identity is checked here; the caller knows the v1 layout) or 2 (base
 * hash, chunk lists: keys under "<customer>/sessions/<id>/" or, with
 * "from_snapshot", "<customer>/snapshots/<that id>/", sizes within
 * bounds, hex hashes) or 3 (also tail, depth and generation). 0, or -1 with err set (snapshot_corrupt). Free with
 * pmanifest_free (also after a failure). Pure; any thread. */
int pmanifest_parse(const char *text, size_t len, const char *customer, const char *id, struct pmanifest *out,
		    struct kiln_err *err);
void pmanifest_free(struct pmanifest *m);

/* Where manifests live under "<customer>/": a session's, a snapshot's. */
#define PMANIFEST_SESSIONS   "sessions"
#define PMANIFEST_SNAPSHOTS  "snapshots"

/* pmanifest_parse for the manifest under "<customer>/<where>/<id>/" (where:
 * PMANIFEST_SESSIONS or PMANIFEST_SNAPSHOTS): its chunk keys under that
 * prefix, or under the snapshot "from_snapshot" names. */
int pmanifest_parse_at(const char *text, size_t len, const char *customer, const char *where, const char *id,
		       struct pmanifest *out, struct kiln_err *err);

/* A base RAM in S3 (shared by every session paused against it, on any
 * host): its chunks under PBASE_DIR "<sha256>/", then a manifest
 * PBASE_DIR "<sha256>/manifest.json" (written last) with
 * {"version": PBASE_V, "sha256", "size", "mem": {"chunks": [...]}}.
 * Never deleted by kiln (see README Operations). */
#define PBASE_DIR            ".bases/"
#define PBASE_V              1

/* The base's key prefix, PBASE_DIR "<sha>/" (sha: 64 hex digits). */
void pbase_prefix(char *out, size_t cap, const char *sha);

/* Parse a base's manifest: it must name this sha and size, and chunks
 * under its prefix adding up to size. 0, or -1 with err (snapshot_corrupt). */
int pbase_parse(const char *text, size_t len, const char *sha, uint64_t size, struct pchunk_list *out,
		struct kiln_err *err);

/* The JSON array of a chunk list (for writing a manifest); NULL if out of memory. */
json_t *pchunk_list_json(const struct pchunk_list *l);

#endif
