/* volume: a customer's named ext4 file system kept in S3 under
 * "<customer>/volumes/<id>/" (zstd chunks with a SHA-256 each, then
 * manifest.json, written last), mounted into sessions through the VM's
 * volume slots (vm.h VM_VOL_SLOTS; docs/architecture.md "Volumes"). This
 * header: the session spec's "volumes" and the volume manifest, both
 * parsed here with every field bounded (pure, any thread); and the I/O
 * that fills a slot from S3 and keeps a slot in S3 (session_volume.c). */
#ifndef KILN_VOLUME_H
#define KILN_VOLUME_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "err.h"
#include "pause_manifest.h"
#include "s3.h"
#include "spec.h"
#include "vm/vm.h"

#define VOL_SLOTS          VM_VOL_SLOTS
#define VOL_PATH_MAX       SPEC_VOLUME_PATH_MAX
#define VOL_SIZE_MIB_MIN   16                        /* ext4 with a journal */
#define VOL_SIZE_MIB_MAX   (VM_VOL_SLOT_BYTES >> 20) /* the slot's fixed size */
#define VOL_MANIFEST_V     1
#define PMANIFEST_VOLUMES  "volumes"

/* One entry of a session spec's "volumes". */
struct vol_mount {
	char id[65];
	char path[VOL_PATH_MAX + 1];
	int read_only;
	unsigned size_mib;
};

/* Check a spec's "volumes" (NULL: none) and fill out[0..*n): an array of at
 * most VOL_SLOTS {"id","path","read_only"?,"size_mib"} with ids of
 * [A-Za-z0-9_.-] (1-64, not starting with '.'), each id once, absolute
 * normalised paths (no "//", ".", "..", trailing '/', control characters;
 * not "/", not /proc, /sys, /dev or under them; none under another), and
 * size_mib from VOL_SIZE_MIB_MIN to VOL_SIZE_MIB_MAX. 0, or -1 with err
 * (invalid_spec, naming the field). Pure. */
int vol_spec_parse(json_t *volumes, struct vol_mount out[VOL_SLOTS], size_t *n, struct kiln_err *err);

/* 1 when path is a mount point vol_spec_parse accepts. */
int vol_path_ok(const char *path);

/* A volume's manifest: its size, the generation that wrote it, and its
 * chunks, each at an explicit offset (the slot's data extents only: holes
 * are not stored). */
struct vmanifest {
	json_t *root;            /* owned: the whole document */
	unsigned size_mib;
	char generation[48];
	struct pchunk_list chunks; /* total: the bytes stored, not the size */
};

/* Parse and check customer's volume id's manifest: version VOL_MANIFEST_V,
 * this customer and id, size_mib within bounds, chunk keys under
 * "<customer>/volumes/<id>/" (no ".."), sizes within PCHUNK_RAW_MAX,
 * offsets 4 KiB aligned, increasing, not overlapping, inside size_mib. 0,
 * or -1 with err (snapshot_corrupt). Free with vmanifest_free (also after
 * a failure). Pure. */
int vmanifest_parse(const char *text, size_t len, const char *customer, const char *id, struct vmanifest *out,
		    struct kiln_err *err);
void vmanifest_free(struct vmanifest *m);

/* The manifest document for these chunks (NULL: out of memory). */
json_t *vmanifest_json(const char *customer, const char *id, unsigned size_mib, const char *generation,
		       const char *host_id, const struct pchunk_list *chunks);

/* S3 keys: the volume's prefix "<customer>/volumes/<id>/", its manifest. */
void vol_prefix(char *out, size_t cap, const char *customer, const char *id);
void vol_manifest_key(char *out, size_t cap, const char *customer, const char *id);

/* ---- I/O (session_volume.c): blocking, any thread ---------------------- */

/* The volume's manifest from S3 into *out: 1; 0 when it has none (a new
 * volume); -1 with err. */
int vol_get_manifest(const struct s3_config *c, const char *customer, const char *id, struct vmanifest *out,
		     struct kiln_err *err);

/* Fill the slot file at path (the one a VM holds open; its contents are
 * replaced in place, its size kept) with customer's volume v: its data
 * from S3 (only the stored extents are written: the rest stays holes), or,
 * when it has no manifest, a new ext4 of v->size_mib whose root directory
 * uid:gid own. *generation: the manifest's generation ("" for a new
 * volume), *fresh: 1 for a new one, *bytes: the bytes fetched; an
 * existing volume's own size replaces v->size_mib (the spec's is only for
 * a new one; uploads then cover the whole of it). 0, or -1
 * with err (snapshot_corrupt naming the volume, s3_*, host_error). */
int vol_fill(const struct s3_config *c, const char *customer, struct vol_mount *v, const char *path,
	     unsigned uid, unsigned gid, char generation[48], int *fresh, uint64_t *bytes, struct kiln_err *err);

/* Keep the slot file at path in S3 as customer's volume id's new version:
 * its data extents within size_mib (4 KiB-aligned windows of
 * PCHUNK_RAW_MAX; all-zero windows are holes), chunks whose hash the
 * current manifest has are not sent again; then the manifest; then the
 * current manifest's chunks the new one does not name go. With
 * expect_gen (NULL: any), the volume's current generation must be that
 * one ("" : none yet), else nothing is written (err busy: another writer
 * moved it on). When every window is a chunk the current manifest names
 * at the same offset, nothing is written and the current generation stays.
 * *generation: the new one (or that one); *bytes: compressed bytes sent.
 * 0, or -1 with err. */
int vol_upload(const struct s3_config *c, const char *customer, const char *id, unsigned size_mib,
	       const char *path, const char *host_id, const char *expect_gen, char generation[48], uint64_t *bytes,
	       struct kiln_err *err);

/* Delete every object of customer's volume id (its manifest first). The
 * number deleted, or -1 with err. */
int vol_delete(const struct s3_config *c, const char *customer, const char *id, struct kiln_err *err);

#endif
