/* oci_int: the pieces of the OCI import (template_build_oci, host/template_build/oci.c) that tests
 * and fuzzers reach directly. Everything here reads image data, which the
 * customer wrote: every length is bounded and every failure is an
 * invalid_image error saying what was wrong.
 *
 *   oci_parse.c  pure parsers: the archive's tar headers (which kind of
 *                archive), index.json / manifest / image config, the image's
 *                /etc/passwd and /etc/group, umoci's rootless owner xattr
 *   oci_tree.c   the walk over the unpacked tree: sizes, ownership, device
 *                nodes, set-uid bits, the directories kiln-init needs */
#ifndef KILN_OCI_INT_H
#define KILN_OCI_INT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "err.h"

#define OCI_MAX_JSON        (4u << 20)  /* index.json, a manifest, the image config */
#define OCI_MAX_ETC_FILE    (1u << 20)  /* the image's /etc/passwd, /etc/group */
#define OCI_MAX_USER        256         /* bytes of the image's User */
#define OCI_MAX_TAR_ENTRIES 100000      /* top-level headers scanned to tell the kind */
#define OCI_MAX_DEPTH       256         /* directory depth of an unpacked tree */
#define OCI_MAX_INODES      1000000     /* entries of an unpacked tree */

enum oci_kind { OCI_KIND_OCI = 1, OCI_KIND_DOCKER = 2 };

/* Which archive the tar in fd (size bytes) is: an OCI image layout
 * (oci-layout and index.json at its top) or a docker-archive
 * (manifest.json). Reads only headers (and GNU long names); the layers are
 * left to skopeo. OCI_KIND_*, or -1 with err invalid_image ("not a tar
 * archive", "an empty tar archive", "compressed archive", "neither ..."). */
int oci_tar_kind(int fd, uint64_t size, struct kiln_err *err);

/* In an OCI index (index.json), the manifest digest ("sha256:<64 hex>")
 * tagged ref (org.opencontainers.image.ref.name), or the only manifest when
 * ref is NULL. 0 or -1 with err invalid_image. */
int oci_index_manifest(const char *json, size_t len, const char *ref, char digest[72], struct kiln_err *err);

/* In an image manifest, the config blob's digest. 0 or -1 (invalid_image). */
int oci_manifest_config(const char *json, size_t len, char digest[72], struct kiln_err *err);

/* 0 when d is "sha256:" + 64 lowercase hex digits, else -1. */
int oci_digest_ok(const char *d);

/* What the image config asks of tasks. */
struct oci_config {
	json_t *env;            /* array of "K=V" (never NULL once parsed); owned */
	char workdir[4097];     /* "" when none */
	char user[OCI_MAX_USER + 1];
};

/* Parse an image config blob: config.Env (each "K=V" with a name of
 * [A-Za-z_][A-Za-z0-9_]*, at most 1024 of them, 64 KiB in all),
 * config.WorkingDir (absolute, no "..", at most 4096 bytes) and config.User.
 * 0 with *out filled (free with oci_config_free), or -1 with err
 * invalid_image and *out empty. */
int oci_config_parse(const char *json, size_t len, struct oci_config *out, struct kiln_err *err);
void oci_config_free(struct oci_config *c);

/* Resolve an image's User ("", "uid", "uid:gid", "name", "name:group", any
 * mix) to numbers with the image's own passwd and group files (either may
 * be NULL: absent). A name is looked up in passwd (its gid is the primary
 * group when no group is given), a group name in group; a numeric uid found
 * in passwd takes that entry's gid, otherwise gid 0 (as Docker does).
 * 0, or -1 with err invalid_image ("user \"x\" is not in the image's
 * /etc/passwd", malformed numbers, 4294967295). */
int oci_user_resolve(const char *user, const char *passwd, size_t plen, const char *group, size_t glen,
		     uint32_t *uid, uint32_t *gid, struct kiln_err *err);

/* umoci --rootless keeps an entry's owner in the image, when it is not
 * 0:0, in the xattr "user.rootlesscontainers": a protobuf message
 * {uint32 uid = 1; uint32 gid = 2;} (absent fields are 0, 0xffffffff means
 * "unchanged", here 0). 0 with *uid and *gid set, or -1 when p[0..n) is not
 * such a message. */
int oci_rootless_owner(const uint8_t *p, size_t n, uint32_t *uid, uint32_t *gid);

#define OCI_ROOTLESS_XATTR "user.rootlesscontainers"

/* What the walk found and changed. */
struct oci_tree_stats {
	uint64_t bytes;          /* allocated bytes (st_blocks) of every entry */
	uint64_t inodes;         /* entries, the root included */
	unsigned removed_nodes;  /* device nodes, FIFOs and sockets removed */
	unsigned cleared_suid;   /* regular files that lost set-uid/set-gid bits */
	unsigned cleared_xattrs; /* entries whose extended attributes were removed */
};

typedef void (*oci_log_fn)(void *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Total allocated bytes and entries under the directory fd (never following
 * a symbolic link, never leaving its file system), stopping early once
 * bytes passes max_bytes or entries OCI_MAX_INODES. For the watch over a
 * tree that a jailed unpacker is writing: the numbers are a snapshot. 0 or
 * -errno. */
int oci_tree_usage(int dirfd, uint64_t max_bytes, uint64_t *bytes, uint64_t *inodes);

/* Make the unpacked tree at root_fd (the jail is gone: nothing else writes
 * to it) fit to be a kiln root: every entry's owner from umoci's rootless
 * xattr, every extended attribute removed, device nodes/FIFOs/sockets
 * removed, set-uid and set-gid bits cleared on non-directories; then the
 * directories kiln-init mounts on, /work and /output (owned by uid:gid) and
 * /etc/hostname. Symbolic links are never followed. 0, or -1 with err
 * (invalid_image for a tree too deep or with too many entries, too_large
 * past max_bytes, host_error). */
int oci_tree_prepare(int root_fd, uint32_t uid, uint32_t gid, uint64_t max_bytes, struct oci_tree_stats *st,
		     oci_log_fn log, void *ctx, struct kiln_err *err);

/* Make the tree at dirfd (written by one jail's uid) readable by any uid:
 * directories 0755, regular files 0644, anything but those and symbolic
 * links removed; links never followed. For an OCI layout that tar
 * unpacked and skopeo (another jail, another uid) reads next. 0 or -errno
 * (-ELOOP too deep, -EMLINK too many entries). */
int oci_tree_open_up(int dirfd);

#endif
