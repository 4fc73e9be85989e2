/* spool: the host's on-disk task store. Each accepted task has a directory
 * SPOOL/tasks/ID holding record.json (its durable state, replaced atomically),
 * its stdout/stderr logs, its /output files and its manifest until S3 has
 * confirmed them. */
#ifndef KILN_SPOOL_H
#define KILN_SPOOL_H

#include <jansson.h>

#include "err.h"

/* Make SPOOL and SPOOL/tasks. Returns 0 or -1 with err set. */
int spool_init(const char *spool, struct kiln_err *err);

/* Write j to dir/name atomically and durably: a temporary file, fsync, rename,
 * fsync of the directory. After a crash the file holds either the old or the
 * new document, never a mix. Returns 0 or -1 with err set. */
int spool_write_json(const char *dir, const char *name, json_t *j, struct kiln_err *err);

/* Remove path and everything under it, never following symlinks. Returns 0 or
 * a negative errno (a missing path is not an error). */
int spool_rm_tree(const char *path);

/* 1 when s is a valid task or customer id: 1..64 of [A-Za-z0-9_.-], not
 * starting with '.' (ids become S3 key and directory name components). */
int spool_id_ok(const char *s);

#endif
