/* server_tasks: kiln-api's task routes (docs/api.md, "kiln-api"): POST
 * /v1/tasks (admission: validation, quotas, submit rate, queue depth, host
 * fit, idempotency keys), the list, GET with its long-poll, cancel, the
 * event stream (SSE over the event hub, events.c), an inline artifact, and
 * GET /v1/usage; every task answered carries its outputs' presigned URLs.
 * server.c's comment has the threads and the body rules. */
#include "server_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "artifacts.h"
#include "base/base.h"
#include "clock.h"
#include "events.h"
#include "reply.h"
#include "s3.h"
#include "spec.h"
#include "store/store.h"
#include "templates/templates.h"

#define KEEPALIVE_MS 15000
#define WAIT_MAX_S 60
#define QUEUE_FULL_RETRY_S 5

/* ---- presigned URLs ---- */

/* outputs[] and artifacts{} of a task get a presigned GET "url" each, for
 * keys under the task's own prefix only (presign.h). A task whose outputs
 * went to its customer's own destination is signed with that destination's
 * credentials, while it is still the one the outputs went to. */
static json_t *with_s3_urls(struct server *s, json_t *task);

/* Every output and artifact of the task gets its url: S3's presigned ones,
 * and kiln-api's own signed ones for logs carried inline (artifacts.h). */
static json_t *with_urls(struct server *s, json_t *task)
{
	with_s3_urls(s, task);
	return artifacts_sign(task, s->base_url, s->have_art_key ? s->art_key : NULL,
			      s->cfg->presign_expiry_s, time(NULL));
}

static json_t *with_s3_urls(struct server *s, json_t *task)
{
	const char *dest_id = json_string_value(json_object_get(task, "destination"));
	const char *customer = json_string_value(json_object_get(task, "customer"));
	struct kiln_err err = { .code = "" };
	struct s3_config c;
	struct dest d;
	char id[40];
	int r;

	if (!dest_id || !customer)
		return presign_task(&s->cfg->s3, s->cfg->presign_expiry_s, task, "", time(NULL));
	r = destination_load(s->st, s->cfg->have_dest_key ? s->cfg->dest_key : NULL, customer, &d, id, &err);
	if (r == 1 && !strcmp(id, dest_id)) {
		dest_s3_config(&d, NULL, &c); /* signed here, nothing sent */
		presign_task(&c, s->cfg->presign_expiry_s, task, d.prefix, time(NULL));
		dest_wipe(&d);
		return task;
	}
	if (r == 1)
		dest_wipe(&d);
	return presign_task_unavailable(task, r < 0 ? err.message
						    : "the destination this task's outputs went to was changed or deleted: "
						      "no URL can be signed for it");
}

/* ---- tasks ---- */

static int idem_key_ok(const char *k)
{
	size_t n = strlen(k);

	if (n < 1 || n > 128)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)k[i] < 0x20 || (unsigned char)k[i] > 0x7e)
			return 0;
	return 1;
}

/* Whether host capacity cap lists the built-in template name. */
static int host_has_builtin(json_t *cap, const char *name)
{
	json_t *e;
	size_t i;

	json_array_foreach(json_object_get(cap, "templates"), i, e)
		if (json_is_true(json_object_get(e, "builtin")) &&
		    !strcmp(json_string_value(json_object_get(e, "name")) ?: "", name))
			return 1;
	return 0;
}

/* Whether some live host is big enough (by its reported totals) and, for
 * a built-in template (builtin not NULL), has it; 1 also when no host is
 * live (the task waits for one). A draining host counts: the task waits
 * for its undrain as for a host to come. */
static int some_host_fits(struct server *s, unsigned vcpus, unsigned memory_mib, int egress, const char *builtin)
{
	json_t *hosts = store_host_list(s->st), *h;
	int64_t cutoff = clock_wall_ms() - (int64_t)s->cfg->host_lost_after_s * 1000;
	int live = 0, fits = 0;
	size_t i;

	json_array_foreach(hosts, i, h) {
		json_t *cap = json_object_get(h, "capacity");
		json_int_t v = json_integer_value(json_object_get(json_object_get(cap, "vcpus"), "total"));
		json_int_t m = json_integer_value(json_object_get(json_object_get(cap, "memory_mib"), "total"));

		const char *state = json_string_value(json_object_get(h, "state")) ?: "";

		if ((strcmp(state, "live") && strcmp(state, "draining")) ||
		    json_integer_value(json_object_get(h, "last_heartbeat_ms")) < cutoff)
			continue;
		live++;
		if (v >= vcpus && m >= memory_mib && (!egress || json_is_true(json_object_get(cap, "egress"))) &&
		    (!builtin || host_has_builtin(cap, builtin)))
			fits = 1;
	}
	json_decref(hosts);
	return !live || fits;
}

static enum MHD_Result reply_task(struct server *s, struct MHD_Connection *conn, unsigned status, const char *id,
				  const char *customer)
{
	json_t *j = store_task_json(s->st, id, customer);

	if (!j)
		return reply_internal(conn, "the task was stored but cannot be read back");
	return reply_json(conn, status, with_urls(s, j));
}

/* A store error while the database is out of reach (PostgreSQL went away
 * after the check at the door) is the door's 503, not a 500: the client
 * retries, safely with its Idempotency-Key. */
static enum MHD_Result reply_store_err(struct server *s, struct MHD_Connection *conn, const struct kiln_err *e)
{
	if (e->errc == KERR_STORE_ERROR && store_down(s->st))
		return reply_error(conn, KERR_UNAVAILABLE, "the database is unreachable; retry");
	return reply_err(conn, e);
}

static enum MHD_Result handle_submit(struct server *s, struct MHD_Connection *conn, const struct httpd_body *req,
				     const struct caller *c)
{
	const char *idem = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Idempotency-Key");
	struct kiln_err err = { .code = "" };
	struct api_task_request tr;
	struct task_spec spec;
	struct quota q;
	struct usage u;
	unsigned char h[SHA256_DIGEST_LENGTH];
	char hash_hex[2 * SHA256_DIGEST_LENGTH + 1], id[40], msg[160];
	char *md = NULL, *merged = NULL, tname[SPEC_MAX_TEMPLATE_NAME + 1];
	struct template_use tu;
	unsigned vcpus, memory_mib, timeout_s, output_mib;
	int egress, cwd_set;
	int64_t retry_ms = 0;
	int r, shared;

	if (c->admin)
		return reply_error(conn, KERR_FORBIDDEN, "an admin key cannot submit tasks: use a customer key");
	if (idem && !idem_key_ok(idem))
		return reply_error(conn, KERR_INVALID_REQUEST,
				   "Idempotency-Key: 1-128 printable ASCII characters");
	SHA256((const unsigned char *)(httpd_body_data(req) ? httpd_body_data(req) : ""), httpd_body_len(req), h);
	for (size_t i = 0; i < sizeof(h); i++)
		sprintf(hash_hex + 2 * i, "%02x", h[i]);
	/* A retry is answered before admission: it must not be refused for
	 * a rate or queue its first attempt already counted against. */
	if (idem) {
		r = store_task_idem_find(s->st, c->customer, idem, hash_hex, id, &err);
		if (r == 1)
			return reply_task(s, conn, MHD_HTTP_OK, id, c->customer);
		if (r < 0)
			return reply_store_err(s, conn, &err);
	}
	if (api_task_request_parse(httpd_body_data(req), httpd_body_len(req), &tr, &err) < 0)
		return reply_err(conn, &err);
	r = store_customer_quota(s->st, c->customer, &q);
	if (r < 0) {
		api_task_request_free(&tr);
		if (r != -ENOENT) /* the database went away after the check at the door */
			return reply_error(conn, KERR_UNAVAILABLE, "the store is unavailable: retry");
		return reply_error(conn, KERR_FORBIDDEN, "this key's customer no longer exists");
	}
	if (tr.egress && strcmp(tr.egress, "none") && !q.allow_egress) {
		api_task_request_free(&tr);
		return reply_error(conn, KERR_EGRESS_NOT_ALLOWED,
				   "network.egress: network egress is not allowed for your account");
	}
	if (spec_parse(tr.spec_json, tr.spec_len, &spec, &err) < 0) {
		api_task_request_free(&tr);
		return reply_err_status(conn, MHD_HTTP_BAD_REQUEST, &err);
	}
	/* Only its limits are needed below (spec_free zeroes them). */
	vcpus = spec.vcpus;
	memory_mib = spec.memory_mib;
	egress = spec.egress;
	timeout_s = spec.timeout_s;
	output_mib = spec.output_mib;
	snprintf(tname, sizeof(tname), "%s", spec.template_name ? spec.template_name : "");
	cwd_set = spec.cwd_set;
	spec_free(&spec);
	if (quota_check_task(&q, vcpus, memory_mib, timeout_s, output_mib, &err) < 0)
		goto bad_request;
	/* Replicas on PostgreSQL: the rate and the queue are checked in the
	 * submission's transaction against rows they all share (below). */
	shared = store_is_pg(s->st);
	if (!shared && !quota_limiter_take(s->lim, c->customer, q.submit_rate, q.submit_burst, clock_mono_ms(), &retry_ms)) {
		char ra[24];

		api_task_request_free(&tr);
		snprintf(ra, sizeof(ra), "%lld", (long long)(retry_ms > 1000 ? (retry_ms + 999) / 1000 : 1));
		snprintf(msg, sizeof(msg), "more than %g submissions per second (burst %u): retry in %s s", q.submit_rate,
			 q.submit_burst, ra);
		return reply_error_h(conn, KERR_RATE_LIMITED, msg, "Retry-After", ra);
	}
	/* Counting the queue costs a scan of it: only when a limit needs it. */
	if (!shared && q.max_queued && store_customer_usage(s->st, c->customer, &u) < 0) {
		api_task_request_free(&tr);
		/* The database went away after the check at the door: a retry's
		 * matter (503), as for the quota read above, not kiln-api's fault. */
		return reply_error(conn, KERR_UNAVAILABLE, "the store is unavailable: retry");
	}
	if (!shared && q.max_queued && u.queued >= q.max_queued) {
		char ra[24];

		api_task_request_free(&tr);
		snprintf(ra, sizeof(ra), "%d", QUEUE_FULL_RETRY_S);
		snprintf(msg, sizeof(msg), "%u tasks are queued, your quota's max_queued", u.queued);
		return reply_error_h(conn, KERR_QUEUE_FULL, msg, "Retry-After", ra);
	}
	if (!some_host_fits(s, vcpus, memory_mib, egress, NULL)) {
		api_task_request_free(&tr);
		snprintf(msg, sizeof(msg), "no registered host has %u vCPUs and %u MiB of memory%s", vcpus, memory_mib,
			 egress ? " and offers network egress" : "");
		return reply_error(conn, KERR_NO_HOST_FITS, msg);
	}
	/* The template is resolved now: a task names one that exists and is
	 * ready, and keeps it (its TREF is stored with it) even if it is
	 * deleted before the task runs. Its env and workdir go into the spec. */
	r = template_resolve(s->st, c->customer, tname[0] ? tname : NULL, &tu, &err);
	if (r < 0) {
		api_task_request_free(&tr);
		return reply_store_err(s, conn, &err);
	}
	if (r == 1 && tu.use.builtin && !some_host_fits(s, vcpus, memory_mib, egress, tu.row.name)) {
		snprintf(msg, sizeof(msg), "no registered host that fits the task has the built-in template %s", tu.row.name);
		template_use_free(&tu);
		api_task_request_free(&tr);
		return reply_error(conn, KERR_NO_HOST_FITS, msg);
	}
	if (r == 1) {
		json_t *tj = json_loads(tu.template_ref, 0, NULL);
		int merge = json_object_get(tj, "env") || json_object_get(tj, "workdir");

		json_decref(tj);
		if (merge && !(merged = template_merge_spec(tr.spec_json, tr.spec_len, cwd_set, tu.template_ref, &err))) {
			template_use_free(&tu);
			api_task_request_free(&tr);
			return reply_err_status(conn, MHD_HTTP_BAD_REQUEST, &err);
		}
	}
	if (tr.metadata && !(md = json_dumps(tr.metadata, JSON_COMPACT))) {
		free(merged);
		template_use_free(&tu);
		api_task_request_free(&tr);
		return reply_internal(conn, "out of memory");
	}
	{
		struct store_submit sub = {
			.customer = c->customer, .spec_json = merged ? merged : tr.spec_json, .metadata_json = md,
			.vcpus = vcpus, .memory_mib = memory_mib, .timeout_s = timeout_s, .output_mib = output_mib,
			.idem_key = idem, .body_hash = hash_hex, .template_use = r == 1 ? &tu.use : NULL,
			.shared = shared, .submit_rate = q.submit_rate, .submit_burst = q.submit_burst,
			.max_queued = q.max_queued, .retry_ms = &retry_ms,
		};

		r = store_task_submit(s->st, &sub, id, &err);
	}
	free(md);
	free(merged);
	template_use_free(&tu);
	api_task_request_free(&tr);
	if (r < 0 && (!strcmp(err.code, "rate_limited") || !strcmp(err.code, "queue_full"))) {
		char ra[24];

		if (!strcmp(err.code, "rate_limited"))
			snprintf(ra, sizeof(ra), "%lld", (long long)(retry_ms > 1000 ? (retry_ms + 999) / 1000 : 1));
		else
			snprintf(ra, sizeof(ra), "%d", QUEUE_FULL_RETRY_S);
		return reply_error_h(conn, !strcmp(err.code, "rate_limited") ? KERR_RATE_LIMITED : KERR_QUEUE_FULL,
				     err.message, "Retry-After", ra);
	}
	if (r < 0)
		return reply_store_err(s, conn, &err);
	if (r == 1) /* the same retry raced us past the lookup above */
		return reply_task(s, conn, MHD_HTTP_OK, id, c->customer);
	pthread_mutex_lock(&s->hooks_lock);
	if (s->hooks.submitted)
		s->hooks.submitted(s->hooks.ctx);
	pthread_mutex_unlock(&s->hooks_lock);
	return reply_task(s, conn, MHD_HTTP_ACCEPTED, id, c->customer);
bad_request:
	api_task_request_free(&tr);
	return reply_err_status(conn, MHD_HTTP_BAD_REQUEST, &err);
}

/* Parse an integer query argument in [min, max]; def when absent. -1 when bad. */
static long query_int(struct MHD_Connection *conn, const char *name, long min, long max, long def)
{
	const char *v = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, name);
	char *end;
	long x;

	if (!v)
		return def;
	errno = 0;
	x = strtol(v, &end, 10);
	if (!*v || *end || errno || x < min || x > max || v[0] == '+' || v[0] == ' ')
		return -1;
	return x;
}

static enum MHD_Result handle_list(struct server *s, struct MHD_Connection *conn, const struct caller *c)
{
	const char *state = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "state");
	const char *cursor = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "cursor");
	long limit = query_int(conn, "limit", 1, 100, 20);
	struct kiln_err err = { .code = "" };
	char *next = NULL;
	json_t *arr;

	if (limit < 0)
		return reply_error(conn, KERR_INVALID_REQUEST, "limit: an integer from 1 to 100");
	if (state && task_state_parse(state) == TASK_STATE_COUNT)
		return reply_error(conn, KERR_INVALID_REQUEST,
				   "state: one of queued, scheduled, starting, running, uploading, succeeded, failed, "
				   "timed_out, cancelled, error");
	arr = store_task_list(s->st, c->admin ? NULL : c->customer, state, (unsigned)limit, cursor, &next, &err);
	if (!arr)
		return reply_err(conn, &err);
	{
		json_t *j = json_pack("{s:o, s:s?}", "tasks", arr, "next_cursor", next);

		free(next); /* json_pack copied it */
		return reply_json(conn, MHD_HTTP_OK, j);
	}
}

/* Count one long-lived request of the caller's customer against its quota's
 * max_streams (an admin key is not counted). 1 counted (pair it with
 * quota_limiter_stream_close), 0 not counted, -1 refused with *max set. */
static int stream_open(struct server *s, const struct caller *c, unsigned *max)
{
	struct quota q;

	if (c->admin)
		return 0;
	if (store_customer_quota(s->st, c->customer, &q) < 0)
		quota_defaults(&q);
	*max = q.max_streams;
	return quota_limiter_stream_open(s->lim, c->customer, q.max_streams) ? 1 : -1;
}

/* GET /v1/tasks/{id}[?wait=S]: the task, once final or after S seconds. */
static enum MHD_Result wait_task(struct server *s, struct MHD_Connection *conn, const char *id,
				 const struct caller *c, int64_t deadline)
{
	for (;;) {
		/* Read the change counter before the task: a change committed
		 * after the read below bumps it, so the wait cannot miss it. */
		uint64_t seen = store_changes(s->st);
		json_t *j = store_task_json(s->st, id, c->admin ? NULL : c->customer);
		enum task_state st;
		int stopping;

		if (!j)
			return reply_not_found(conn, "no such task");
		st = task_state_parse(json_string_value(json_object_get(j, "state")));
		stopping = events_stopping(s->ev);
		if (task_state_final(st) || clock_mono_ms() >= deadline || stopping)
			return reply_json(conn, MHD_HTTP_OK, with_urls(s, j));
		json_decref(j);
		store_wait_change(s->st, seen, deadline);
	}
}

static enum MHD_Result handle_get(struct server *s, struct MHD_Connection *conn, const char *id,
				  const struct caller *c)
{
	long wait = query_int(conn, "wait", 0, WAIT_MAX_S, 0);
	enum MHD_Result ret;
	unsigned max = 0;
	int counted;

	if (wait < 0)
		return reply_error(conn, KERR_INVALID_REQUEST, "wait: an integer from 0 to 60 (seconds)");
	if (wait == 0)
		return wait_task(s, conn, id, c, clock_mono_ms());
	/* A long-poll holds a connection (and a thread) like a stream. */
	counted = stream_open(s, c, &max);
	if (counted < 0)
		return reply_too_many_streams(conn, max);
	ret = wait_task(s, conn, id, c, clock_mono_ms() + wait * 1000);
	if (counted)
		quota_limiter_stream_close(s->lim, c->customer);
	return ret;
}

static enum MHD_Result handle_cancel(struct server *s, struct MHD_Connection *conn, const char *id,
				     const struct caller *c)
{
	enum task_state st;
	enum store_cancel r = store_task_cancel(s->st, id, c->admin ? NULL : c->customer, &st);
	char msg[128];

	switch (r) {
	case STORE_CANCEL_NOT_FOUND:
		return reply_not_found(conn, "no such task");
	case STORE_CANCEL_DONE:
		return reply_task(s, conn, MHD_HTTP_OK, id, NULL);
	case STORE_CANCEL_REQUESTED:
		pthread_mutex_lock(&s->hooks_lock);
		if (s->hooks.cancel_requested)
			s->hooks.cancel_requested(s->hooks.ctx, id);
		pthread_mutex_unlock(&s->hooks_lock);
		return reply_task(s, conn, MHD_HTTP_ACCEPTED, id, NULL);
	case STORE_CANCEL_TOO_LATE:
		snprintf(msg, sizeof(msg), "the task is %s: its code has already ended", task_state_name(st));
		return reply_error(conn, KERR_NOT_CANCELLABLE, msg);
	default:
		return reply_internal(conn, "cannot cancel the task");
	}
}

/* GET /v1/tasks/{id}/events */
struct sse {
	struct server *s;
	struct ev_task *t;
	char customer[65];   /* counted in the limiter's streams ("": not counted) */
	struct evlog_cursor cur;
};

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct sse *e = cls;
	long n = events_read(e->t, &e->cur, buf, max, clock_mono_ms() + KEEPALIVE_MS);

	if (n == EVLOG_END)
		return MHD_CONTENT_READER_END_OF_STREAM;
	if (n == 0)
		return reply_sse_keepalive(buf, max);
	return (ssize_t)n;
}

static void sse_free(void *cls)
{
	struct sse *e = cls;

	/* libmicrohttpd calls this however the stream ends (its end, the
	 * client gone, a timeout, the daemon stopping): the count goes back. */
	if (e->customer[0])
		quota_limiter_stream_close(e->s->lim, e->customer);
	events_put(e->s->ev, e->t);
	free(e);
}

static enum MHD_Result handle_events(struct server *s, struct MHD_Connection *conn, const char *id,
				     const struct caller *c)
{
	json_t *j = store_task_json(s->st, id, c->admin ? NULL : c->customer);
	struct sse *e;
	unsigned max = 0;
	int counted;

	if (!j)
		return reply_not_found(conn, "no such task");
	json_decref(j);
	e = calloc(1, sizeof(*e));
	if (!e)
		return MHD_NO;
	e->s = s;
	e->t = events_get(s->ev, id);
	if (!e->t) {
		free(e);
		return reply_not_found(conn, "no such task");
	}
	counted = stream_open(s, c, &max);
	if (counted < 0) {
		events_put(s->ev, e->t);
		free(e);
		return reply_too_many_streams(conn, max);
	}
	if (counted)
		snprintf(e->customer, sizeof(e->customer), "%s", c->customer);
	return reply_sse(conn, 64 << 10, sse_read, e, sse_free);
}

static enum MHD_Result handle_usage(struct server *s, struct MHD_Connection *conn, const struct caller *c)
{
	struct quota q;
	struct usage u;
	unsigned snaps, vols;
	uint64_t snap_bytes;

	if (c->admin)
		return reply_error(conn, KERR_FORBIDDEN, "an admin key has no usage: use a customer key");
	if (store_customer_quota(s->st, c->customer, &q) < 0 || store_customer_usage(s->st, c->customer, &u) < 0 ||
	    store_snapshot_usage(s->st, c->customer, &snaps, &snap_bytes) < 0 ||
	    store_volume_count(s->st, c->customer, &vols) < 0)
		return reply_internal(conn, "cannot read the usage");
	return reply_json(conn, MHD_HTTP_OK,
			  json_pack("{s:s, s:o, s:{s:i, s:i, s:I, s:i, s:i, s:i, s:i, s:I, s:i}, s:{s:f, s:i, s:f}}", "customer",
				    c->customer, "quotas", quota_to_json(&q), "usage", "running", (int)u.running, "vcpus",
				    (int)u.vcpus, "memory_mib", (json_int_t)u.memory_mib, "queued", (int)u.queued,
				    "sessions", (int)u.sessions, "paused_sessions", (int)u.paused_sessions, "snapshots",
				    (int)snaps, "snapshot_bytes", (json_int_t)snap_bytes, "volumes", (int)vols, "submit", "rate",
				    q.submit_rate, "burst", (int)q.submit_burst, "tokens",
				    quota_limiter_peek(s->lim, c->customer, q.submit_rate, q.submit_burst, clock_mono_ms())));
}

/* ---- the routes ---- */

/* The task named by the path, or NULL (answer 404 no such task) when it is
 * too long to be a task id. */
static const char *task_id(struct httpd_req *r)
{
	return strlen(r->param[0]) < 40 ? r->param[0] : NULL;
}

enum MHD_Result server_rt_list(void *ctx, struct httpd_req *r)
{
	return handle_list(ctx, r->conn, r->app);
}

enum MHD_Result server_rt_submit(void *ctx, struct httpd_req *r)
{
	return handle_submit(ctx, r->conn, r->body, r->app);
}

enum MHD_Result server_rt_task_get(void *ctx, struct httpd_req *r)
{
	const char *id = task_id(r);

	return id ? handle_get(ctx, r->conn, id, r->app) : reply_not_found(r->conn, "no such task");
}

enum MHD_Result server_rt_task_events(void *ctx, struct httpd_req *r)
{
	const char *id = task_id(r);

	return id ? handle_events(ctx, r->conn, id, r->app) : reply_not_found(r->conn, "no such task");
}

enum MHD_Result server_rt_task_cancel(void *ctx, struct httpd_req *r)
{
	const char *id = task_id(r);

	return id ? handle_cancel(ctx, r->conn, id, r->app) : reply_not_found(r->conn, "no such task");
}

/* GET /v1/tasks/{id}/artifacts/{name}: a log carried inline (artifacts.h),
 * for a caller with a key (its own tasks; the admin's: any). */
enum MHD_Result server_rt_task_artifact(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	const struct caller *c = r->app;
	json_t *j = store_task_json(s->st, r->param[0], c->admin ? NULL : c->customer);
	enum MHD_Result ret;

	if (!j)
		return reply_not_found(r->conn, "no such task");
	ret = artifacts_reply(r->conn, j, r->param[1]);
	json_decref(j);
	return ret;
}

/* GET /v1/tasks/{id}/outputs/{n}: output n's bytes (its index in the
 * task's outputs), fetched from S3 by kiln-api for a caller with a key: the
 * web console shows image outputs inline, and its CSP lets it reach no
 * origin but kiln-api's. At most OUTPUT_FETCH_MAX bytes. Served as an
 * attachment of type application/octet-stream with nosniff and a sandbox
 * CSP, so that nothing a task wrote is ever rendered in kiln-api's origin. */
#define OUTPUT_FETCH_MAX (16u << 20)

enum MHD_Result server_rt_task_output(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	const struct caller *c = r->app;
	struct kiln_err err = { .code = "" };
	json_t *j = store_task_json(s->st, r->param[0], c->admin ? NULL : c->customer), *o;
	const char *key, *n = r->param[1];
	struct MHD_Response *resp;
	enum MHD_Result ret;
	struct stat sb;
	char *body = NULL;
	json_int_t size;
	int fd;

	if (!j)
		return reply_not_found(r->conn, "no such task");
	if (!n[0] || strlen(n) > 6 || strspn(n, "0123456789") != strlen(n) ||
	    !(o = json_array_get(json_object_get(j, "outputs"), (size_t)strtoul(n, NULL, 10)))) {
		json_decref(j);
		return reply_not_found(r->conn, "no such output (outputs are numbered from 0 in the task's outputs)");
	}
	if (json_object_get(j, "destination")) {
		json_decref(j);
		return reply_not_found(r->conn, "this task's outputs went to your destination: fetch them through their url");
	}
	/* Only a key under the task's own prefix (as presign_task signs). */
	presign_task(&s->cfg->s3, 60, j, "", time(NULL));
	key = json_string_value(json_object_get(o, "s3_key"));
	size = json_integer_value(json_object_get(o, "size"));
	if (!key || !json_is_string(json_object_get(o, "url"))) {
		json_decref(j);
		return reply_not_found(r->conn, "this output cannot be fetched (no S3 object under the task's prefix)");
	}
	if (size < 0 || size > (json_int_t)OUTPUT_FETCH_MAX) {
		json_decref(j);
		return reply_error(r->conn, KERR_TOO_LARGE, "outputs over 16 MiB are fetched through their url");
	}
	fd = memfd_create("kiln-output", MFD_CLOEXEC);
	if (fd < 0 || s3_get_fd(&s->cfg->s3, key, fd, &err) < 0 || fstat(fd, &sb) < 0 ||
	    (uint64_t)sb.st_size > OUTPUT_FETCH_MAX || !(body = malloc((size_t)sb.st_size + 1)) ||
	    pread(fd, body, (size_t)sb.st_size, 0) != sb.st_size) {
		if (fd >= 0)
			close(fd);
		free(body);
		json_decref(j);
		return reply_error(r->conn, err.code[0] ? KERR_S3_ERROR : KERR_INTERNAL,
				   err.code[0] ? err.message : "the output could not be read");
	}
	close(fd);
	json_decref(j);
	resp = MHD_create_response_from_buffer((size_t)sb.st_size, body, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
	MHD_add_response_header(resp, "Content-Disposition", "attachment");
	MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
	MHD_add_response_header(resp, "Content-Security-Policy", "sandbox; default-src 'none'");
	MHD_add_response_header(resp, "Cache-Control", "private, no-store");
	ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

enum MHD_Result server_rt_usage(void *ctx, struct httpd_req *r)
{
	return handle_usage(ctx, r->conn, r->app);
}
