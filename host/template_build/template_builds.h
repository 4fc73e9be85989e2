/* template_builds: kiln-host's template builds (docs/templates.md, "Builds, on
 * kiln-host"): POST /v1/builds starts one on its own thread (a recipe in a
 * build VM through template_build_recipe, or an OCI archive fetched from S3 through
 * template_build_oci), GET reports it, GET .../events streams its log lines and its
 * end, DELETE cancels it. A finished image is hashed (SHA-256), uploaded to
 * S3 as _templates/<sha256>.ext4 and installed into the local template
 * store; the build is then ready with its TREF. Builds live in memory only:
 * a restarted host answers 404 and kiln-api queues the build again. */
#ifndef KILN_TEMPLATE_BUILDS_H
#define KILN_TEMPLATE_BUILDS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "err.h"
#include "evlog.h"

struct hostd;
struct template_store;
struct template_builds;
struct template_build_job;

struct template_builds_config {
	struct hostd *d;                  /* capacity, S3 settings, run options (egress, jail, run dir) */
	struct template_store *templates; /* base image; where a finished image is installed */
	const char *mirror;               /* Debian mirror (NULL: the host's apt sources, else deb.debian.org) */
	const char *work_dir;             /* scratch: <work_dir>/<id>/ per build (created) */
	unsigned vcpus, memory_mib;       /* of a build VM (0: 1 and 1024) */
};

/* NULL with err set. cfg's pointers must outlive the table. */
struct template_builds *template_builds_open(const struct template_builds_config *cfg, struct kiln_err *err);
/* Begin shutting down: refuse new builds, cancel running ones, end event
 * streams. Idempotent; NULL is fine; template_builds_close follows. */
void template_builds_stop(struct template_builds *b);
/* template_builds_stop, wait for the build threads, free everything. */
void template_builds_close(struct template_builds *b);

/* POST /v1/builds body: {"id","customer","recipe":{...}} or
 * {"id","customer","name","oci":{"s3_key","size"}}, plus optional
 * "timeout_s" and "max_bytes". Unknown keys, nulls and duplicates are
 * refused (invalid_request, or invalid_recipe naming the recipe's field).
 * Starts the build: *out is {"id","state":"building"}. -1 with err:
 * invalid_json/invalid_request/invalid_recipe (400), duplicate (409),
 * no_capacity, no_s3, egress_unavailable (503: a recipe with packages needs
 * egress to the mirror), host_error. Thread-safe. */
int template_builds_submit(struct template_builds *b, const char *body, size_t len, json_t **out, struct kiln_err *err);

/* {"id","state","template"?,"error"?,"log_tail"}, or NULL (unknown id). */
json_t *template_builds_get(struct template_builds *b, const char *id);

/* Cancel: 0 (it ends as failed/cancelled; a finished one is left as it
 * is), -ENOENT for an unknown id. */
int template_builds_cancel(struct template_builds *b, const char *id);

/* Events of one build (as hostd_events_read for tasks): a reference from
 * template_builds_ref (NULL: unknown), events copied from *cursor, waiting until
 * deadline_ms; bytes, 0 on timeout, -1 once the stream is over. */
struct template_build_job *template_builds_ref(struct template_builds *b, const char *id);
void template_builds_unref(struct template_builds *b, struct template_build_job *x);
long template_builds_events_read(struct template_builds *b, struct template_build_job *x, struct evlog_cursor *cursor,
				 char *buf, size_t cap, int64_t deadline_ms);

/* The Debian mirror of the host's apt sources (as image/build-rootfs.sh's
 * mirror()): deb822 "URIs:" first, then sources.list; out gets
 * http://deb.debian.org/debian when neither names one. root: "" (or a test
 * directory standing for /). */
void template_builds_host_mirror(const char *root, char *out, size_t cap);

#endif
