/* templates: kiln-api's templates (docs/templates.md, docs/api.md
 * "Templates"): the /v1/templates endpoints (a JSON recipe, or an OCI
 * archive streamed to a spool file under the customer's byte cap and
 * uploaded to S3), the build events stream, the builder thread that places
 * queued builds on hosts (POST /v1/builds), follows them and records their
 * TREF or error (re-queuing a build whose host is lost or forgot it, at most
 * TEMPLATES_MAX_ATTEMPTS times), the clean-up of what deleted templates and
 * ended builds leave in S3 and on hosts, and the resolution of a task's or
 * session's "template" into the TREF sent to hosts. Implemented in
 * templates.c (endpoints, uploads, events), template_build.c (the builder,
 * the clean-up, the module's lifetime), template_use.c (resolution, merges,
 * heartbeats); templates_int.h is their private interface.
 *
 * Room: the templates room's door (api/templates/). It may call the
 * scheduler, base, hostcall and store rooms and lib/; templates_int.h is
 * the room's own. */
#ifndef KILN_API_TEMPLATES_H
#define KILN_API_TEMPLATES_H

#include <stddef.h>

#include <jansson.h>
#include <microhttpd.h>

#include "base/base.h"
#include "clock.h"
#include "err.h"
#include "hostcall/host_ops.h"
#include "scheduler/scheduler.h"
#include "store/store.h"

#define TEMPLATES_MAX_ATTEMPTS 3

struct templates;

/* Set up (no thread): cfg, st, sched, host and clock stay the caller's and
 * must outlive it; host NULL: &host_ops_hostclient. NULL with err set. */
struct templates *templates_create(const struct api_config *cfg, struct store *st, struct sched *sched,
				   const struct host_ops *host, const struct kiln_clock *clock, struct kiln_err *err);
/* Start the builder thread (templates_create, then this). 0 or -1. */
int templates_start(struct templates *t);
/* One pass of the builder on the caller's thread (unit tests): place
 * queued builds, requeue those of lost hosts, clean up. */
void templates_tick(struct templates *t);
/* Stop the builder and its followers and wake every events stream (HTTP
 * threads may still call in: free with templates_free once they are gone). */
void templates_stop(struct templates *t);
void templates_free(struct templates *t);

/* One authenticated request under /v1/templates with its whole body (not
 * an OCI upload: see templates_upload_*). customer "" for an admin key. An
 * events stream counts against the customer's max_streams in lim (may be
 * NULL: not counted). */
struct quota_limiter;
enum MHD_Result templates_handle(struct templates *t, struct MHD_Connection *conn, const char *method,
				 const char *url, const char *body, size_t len, const char *customer, int admin,
				 struct quota_limiter *lim);

/* ---- OCI uploads: POST /v1/templates?name=NAME with a non-JSON body ---- */
struct templates_upload;

/* Whether this request is an OCI upload (POST /v1/templates, a
 * Content-Type other than application/json). */
int templates_is_upload(struct MHD_Connection *conn, const char *method, const char *url);

/* Begin an upload for customer on the request's first call: *up is set
 * (MHD_YES: go on reading the body), or a reply is queued (413 when the
 * declared Content-Length is over the customer's max_template_mib, 400 for
 * a bad name, ...) and *up is NULL. */
enum MHD_Result templates_upload_begin(struct templates *t, struct MHD_Connection *conn, const char *customer,
				       int admin, struct templates_upload **up);
/* One part of the body, written to the spool file; past the cap it is
 * dropped (and the connection closed once another cap's worth has come). */
enum MHD_Result templates_upload_feed(struct templates_upload *up, const char *data, size_t *len);
/* The body is complete: upload it to S3, store the queued template, answer
 * 202 (or the error). */
enum MHD_Result templates_upload_finish(struct templates_upload *up, struct MHD_Connection *conn);
/* Release (the spool file is removed); NULL is fine. */
void templates_upload_free(struct templates_upload *up);

/* ---- heartbeats ---- */

/* A host's capacity.templates: built-in entries become public ready rows. */
void templates_heartbeat(struct store *st, json_t *capacity);

/* ---- tasks and sessions ---- */

/* What a task or session uses. */
struct template_use {
	struct store_template row;
	char *template_ref;          /* the TREF text sent to hosts (owned) */
	struct store_template_use use; /* points into row and template_ref */
};

/* Resolve "template":name for customer (docs/templates.md, lookup): 0 the
 * default template (name NULL or "default": no TREF, *u zeroed); 1 *u
 * filled (free with template_use_free); -1 err set: "not_found" ("no
 * template named X"), "template_not_ready" (queued, building or failed). */
int template_resolve(struct store *st, const char *customer, const char *name, struct template_use *u,
		     struct kiln_err *err);
void template_use_free(struct template_use *u);

/* The spec JSON with the template's env (the spec's own entries win) and
 * workdir (as "cwd" unless cwd_set) merged in, re-validated with
 * spec_parse: a new string (caller frees), or NULL with err set. */
char *template_merge_spec(const char *spec_json, size_t len, int cwd_set, const char *template_ref_json,
			  struct kiln_err *err);

/* A session's exec body (api_exec_request_parse's) with its template's
 * env (the exec's own entries win) and workdir (as "cwd" unless given)
 * merged in; template_ref_json NULL: unchanged. */
void template_merge_exec(json_t *body, const char *template_ref_json);

#endif
