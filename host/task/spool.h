/* spool: the host's on-disk task store. Each accepted task has a directory
 * SPOOL/tasks/ID holding record.json (its durable state, replaced atomically),
 * its stdout/stderr logs, its /output files and its manifest until S3 has
 * confirmed them. */
#ifndef KILN_SPOOL_H
#define KILN_SPOOL_H

#include <jansson.h>

#include "err.h"

/* record.json's "version". A record without one is the first release's (1);
 * a newer one (a later kiln-host's, before a downgrade) is left where it is,
 * untouched, and not taken as a task (hostd_recover says so). */
#define SPOOL_RECORD_V 1

/* Make SPOOL and SPOOL/tasks. Returns 0 or -1 with err set. */
int spool_init(const char *spool, struct kiln_err *err);

/* Write j to dir/name atomically: a temporary file, then a rename. Durable
 * (SPOOL_DURABLE): the file is fsync'd before the rename and the directory
 * after it, so after a crash the file holds either the old or the new
 * document, never a mix. Without it (0: a file made again from the record
 * whenever it is needed, such as the manifest) nothing waits for the disk.
 * Returns 0 or -1 with err set. */
#define SPOOL_DURABLE 1
int spool_write_json(const char *dir, const char *name, json_t *j, int flags, struct kiln_err *err);

/* Remove path and everything under it, never following symlinks. Returns 0 or
 * a negative errno (a missing path is not an error). */
int spool_rm_tree(const char *path);

/* 1 when s is a valid task or customer id: 1..64 of [A-Za-z0-9_.-], not
 * starting with '.' (ids become S3 key and directory name components). */
int spool_id_ok(const char *s);

#endif
