/* server: kiln-api's HTTP API over the store (see server.h, docs/api.md).
 *
 * Threads: libmicrohttpd runs one thread per connection, so a long-poll
 * (GET /v1/tasks/{id}?wait=S) simply blocks in its handler on the store's
 * change counter (store_wait_change) and an event stream blocks in its
 * reader on the event hub's condition variable. Every handler answers on the
 * second call of the access handler (answering on the first makes
 * libmicrohttpd close the connection), except for 413: a body whose
 * Content-Length is over the limit is refused before any of it is read (and
 * the connection closes). A chunked body that grows past the limit is
 * dropped as it arrives and refused at its end, or the connection is closed
 * once it passes twice the limit (libmicrohttpd accepts no reply while a
 * body is arriving).
 *
 * The event hub (per-task event lists, fed by the store's listener and by
 * server_task_event) is in events.c. */
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "artifacts.h"
#include "base/base.h"
#include "clock.h"
#include "events.h"
#include "httpd.h"
#include "metrics.h"
#include "reply.h"
#include "s3.h"
#include "sessions/sessions.h"
#include "spec.h"
#include "store/store.h"
#include "templates/templates.h"
#include "ui.h"

#define KEEPALIVE_MS 15000
#define WAIT_MAX_S 60
#define QUEUE_FULL_RETRY_S 5
#define ADMIN_BODY_MAX (64u << 10)


struct server {
	const struct api_config *cfg;
	struct store *st;
	struct quota_limiter *lim;
	struct MHD_Daemon *d;
	size_t max_body;
	unsigned char admin_hash[SHA256_DIGEST_LENGTH], token_hash[SHA256_DIGEST_LENGTH];
	int have_admin, have_token;
	pthread_mutex_t hooks_lock;
	struct server_hooks hooks;
	struct sessions *sessions;   /* under hooks_lock */
	struct templates *templates; /* under hooks_lock */
	struct events *ev;           /* the event hub (events.h) */
	unsigned char art_key[32];   /* signs inline artifacts' URLs (artifacts.h) */
	int have_art_key;
	const char *ui_dir;          /* the web console's files (ui.h); NULL: none */
	char ui_dir_buf[4200];
	char base_url[300];          /* the links kiln-api signs start here (base_url_set) */
};

struct caller {
	char customer[65]; /* "" for the admin */
	int admin;
};

/* ---- authentication ---- */

static const char *bearer(struct MHD_Connection *conn)
{
	const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);

	if (!h || strncmp(h, "Bearer ", 7))
		return NULL;
	return h + 7;
}

/* Hash both sides so that the comparison takes the same time whatever the
 * presented secret's length or content. */
static int secret_matches(const char *got, const unsigned char want[SHA256_DIGEST_LENGTH])
{
	unsigned char h[SHA256_DIGEST_LENGTH];

	SHA256((const unsigned char *)got, strlen(got), h);
	return CRYPTO_memcmp(h, want, sizeof(h)) == 0;
}

/* The E2B API (/e2b/...) takes the key in X-API-KEY, as E2B's SDK sends it. */
static int is_e2b(const char *url)
{
	return !strncmp(url, "/e2b/", 5);
}

static const char *api_key(struct MHD_Connection *conn, const char *url)
{
	const char *k = is_e2b(url) ? MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-API-KEY") : NULL;

	return k ? k : bearer(conn);
}

static int authenticate(struct server *s, struct MHD_Connection *conn, const char *url, struct caller *c)
{
	const char *key = api_key(conn, url);

	memset(c, 0, sizeof(*c));
	if (!key)
		return 0;
	if (s->have_admin && secret_matches(key, s->admin_hash)) {
		c->admin = 1;
		return 1;
	}
	if (!store_key_check(s->st, key, c->customer, &c->admin))
		return 0;
	if (c->admin)
		c->customer[0] = '\0';
	return 1;
}

/* ---- events ---- */

void server_task_event(struct server *s, const char *task_id, const char *event, json_t *data)
{
	events_task_event(s->ev, task_id, event, data);
}

void server_relay_event(void *server, const char *task_id, const char *event, json_t *data)
{
	server_task_event(server, task_id, event, data);
}


/* ---- presigned URLs ---- */

/* outputs[] and artifacts{} of a task get a presigned GET "url" each, for
 * keys under the task's own prefix only (presign.h). A task whose outputs
 * went to its customer's own destination is signed with that destination's
 * credentials, while it is still the one the outputs went to. */
static json_t *with_s3_urls(struct server *s, json_t *task);

/* Where clients reach kiln-api, for the links it signs itself: public_url,
 * else http:// and the address it listens on (the port it was given, or the
 * one it got for port 0), 127.0.0.1 for the wildcard 0.0.0.0. From the
 * configuration only, never from a request: a Host header is the client's to
 * write, and a link built from it would send the next reader (and the link's
 * signature) wherever that client said. Set once at start. */
static void base_url_set(struct server *s, const struct sockaddr_in *sa)
{
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
	unsigned port = info && info->port ? info->port : ntohs(sa->sin_port);
	char addr[INET_ADDRSTRLEN] = "127.0.0.1";

	if (s->cfg->public_url) {
		snprintf(s->base_url, sizeof(s->base_url), "%s", s->cfg->public_url);
		return;
	}
	if (sa->sin_addr.s_addr != htonl(INADDR_ANY))
		inet_ntop(AF_INET, &sa->sin_addr, addr, sizeof(addr));
	snprintf(s->base_url, sizeof(s->base_url), "http://%s:%u", addr, port);
}

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

/* ---- the customer's own S3 destination (destination.h) ---- */

static void dest_changed_hook(void *ctx, const char *customer)
{
	struct server *s = ctx;

	pthread_mutex_lock(&s->hooks_lock);
	if (s->hooks.destination_changed)
		s->hooks.destination_changed(s->hooks.ctx, customer);
	pthread_mutex_unlock(&s->hooks_lock);
}

static enum MHD_Result dest_route(struct server *s, struct httpd_req *r, const char *customer, int test)
{
	struct destination_hooks h = { dest_changed_hook, s };

	return destination_handle(s->st, s->cfg->have_dest_key ? s->cfg->dest_key : NULL, &s->cfg->dest_allow, &h,
				  r->conn, r->method, customer, test, httpd_body_data(r->body),
				  httpd_body_len(r->body));
}

static enum MHD_Result rt_dest(void *ctx, struct httpd_req *r)
{
	const struct caller *c = r->app;

	if (c->admin)
		return reply_error(r->conn, KERR_FORBIDDEN,
				   "an admin key has no destination: use /v1/admin/customers/{id}/destination");
	return dest_route(ctx, r, c->customer, 0);
}

static enum MHD_Result rt_dest_test(void *ctx, struct httpd_req *r)
{
	const struct caller *c = r->app;

	if (c->admin)
		return reply_error(r->conn, KERR_FORBIDDEN,
				   "an admin key has no destination: use /v1/admin/customers/{id}/destination/test");
	return dest_route(ctx, r, c->customer, 1);
}

static enum MHD_Result admin_dest(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct quota q;

	if (strlen(r->param[0]) >= 65 || store_customer_quota(s->st, r->param[0], &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	return dest_route(s, r, r->param[0], 0);
}

static enum MHD_Result admin_dest_test(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct quota q;

	if (strlen(r->param[0]) >= 65 || store_customer_quota(s->st, r->param[0], &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	return dest_route(s, r, r->param[0], 1);
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
 * live (the task waits for one). */
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

		if (strcmp(json_string_value(json_object_get(h, "state")) ?: "", "live") ||
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
		return reply_internal(conn, "cannot read the usage");
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
		json_t *tj = json_loads(tu.tref, 0, NULL);
		int merge = json_object_get(tj, "env") || json_object_get(tj, "workdir");

		json_decref(tj);
		if (merge && !(merged = template_merge_spec(tr.spec_json, tr.spec_len, cwd_set, tu.tref, &err))) {
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
			.idem_key = idem, .body_hash = hash_hex, .tuse = r == 1 ? &tu.use : NULL,
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

	if (c->admin)
		return reply_error(conn, KERR_FORBIDDEN, "an admin key has no usage: use a customer key");
	if (store_customer_quota(s->st, c->customer, &q) < 0 || store_customer_usage(s->st, c->customer, &u) < 0)
		return reply_internal(conn, "cannot read the usage");
	return reply_json(conn, MHD_HTTP_OK,
			  json_pack("{s:s, s:o, s:{s:i, s:i, s:I, s:i, s:i, s:i}, s:{s:f, s:i, s:f}}", "customer",
				    c->customer, "quotas", quota_to_json(&q), "usage", "running", (int)u.running, "vcpus",
				    (int)u.vcpus, "memory_mib", (json_int_t)u.memory_mib, "queued", (int)u.queued,
				    "sessions", (int)u.sessions, "paused_sessions", (int)u.paused_sessions, "submit", "rate",
				    q.submit_rate, "burst", (int)q.submit_burst, "tokens",
				    quota_limiter_peek(s->lim, c->customer, q.submit_rate, q.submit_burst, clock_mono_ms())));
}

/* ---- admin ---- */

/* POST /v1/admin/customers */
static enum MHD_Result admin_customer_create(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct kiln_err err = { .code = "" };
	char id[65], name[API_NAME_MAX + 1];
	struct quota q = s->cfg->quotas;

	if (api_customer_request_parse(httpd_body_data(r->body), httpd_body_len(r->body), id, name, &q, &err) < 0)
		return reply_err_status(r->conn, MHD_HTTP_BAD_REQUEST, &err);
	if (store_customer_create(s->st, id, name, &q, &err) < 0)
		return reply_err(r->conn, &err);
	return reply_json(r->conn, MHD_HTTP_CREATED, store_customer_json(s->st, id));
}

/* The customer named by the path (r->param[0]) into id, with its quota:
 * 0, or -1 when there is no such customer. */
static int admin_customer(struct server *s, struct httpd_req *r, char id[65], struct quota *q)
{
	if (strlen(r->param[0]) >= 65)
		return -1;
	snprintf(id, 65, "%s", r->param[0]);
	return store_customer_quota(s->st, id, q) < 0 ? -1 : 0;
}

/* GET /v1/admin/customers/{id} */
static enum MHD_Result admin_customer_get(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct quota q;
	struct usage u;
	char id[65];
	json_t *j;

	if (admin_customer(s, r, id, &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	j = store_customer_json(s->st, id);
	if (j && store_customer_usage(s->st, id, &u) == 0)
		json_object_set_new(j, "usage",
				    json_pack("{s:i, s:i, s:I, s:i, s:i, s:i}", "running", (int)u.running, "vcpus",
					      (int)u.vcpus, "memory_mib", (json_int_t)u.memory_mib, "queued", (int)u.queued,
					      "sessions", (int)u.sessions, "paused_sessions", (int)u.paused_sessions));
	return j ? reply_json(r->conn, MHD_HTTP_OK, j) : reply_internal(r->conn, "cannot read the customer");
}

/* GET /v1/admin/customers?limit=&cursor=: customers by id, with their quotas */
static enum MHD_Result admin_customer_list(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	const char *lim = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "limit");
	const char *cur = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "cursor");
	long limit = 100;
	char *end;
	json_t *list, *last;

	if (lim) {
		limit = strtol(lim, &end, 10);
		if (!*lim || *end || limit < 1 || limit > 1000)
			return reply_error(r->conn, KERR_INVALID_REQUEST, "limit: must be an integer from 1 to 1000");
	}
	if (cur && strlen(cur) > 64)
		return reply_error(r->conn, KERR_INVALID_REQUEST, "cursor: not one this server gave");
	list = store_customer_list(s->st, cur, (unsigned)limit);
	last = json_array_size(list) == (size_t)limit ? json_array_get(list, json_array_size(list) - 1) : NULL;
	return reply_json(r->conn, MHD_HTTP_OK,
			  json_pack("{s:o, s:O}", "customers", list, "next_cursor",
				    last ? json_object_get(last, "id") : json_null()));
}

/* GET /v1/admin/customers/{id}/keys: its keys' ids and dates, never a secret */
static enum MHD_Result admin_customer_keys(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct quota q;
	char id[65];

	if (admin_customer(s, r, id, &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	return reply_json(r->conn, MHD_HTTP_OK,
			  json_pack("{s:s, s:o}", "customer", id, "keys", store_key_list(s->st, id)));
}

/* PUT /v1/admin/customers/{id}/quotas */
static enum MHD_Result admin_customer_quotas(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct kiln_err err = { .code = "" };
	struct quota q;
	char id[65];

	if (admin_customer(s, r, id, &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	if (api_quota_request_parse(httpd_body_data(r->body), httpd_body_len(r->body), &q, &err) < 0)
		return reply_err_status(r->conn, MHD_HTTP_BAD_REQUEST, &err);
	if (store_customer_set_quota(s->st, id, &q, &err) < 0)
		return reply_err_status(r->conn, MHD_HTTP_INTERNAL_SERVER_ERROR, &err);
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:s, s:o}", "id", id, "quotas", quota_to_json(&q)));
}

/* POST /v1/admin/customers/{id}/keys */
static enum MHD_Result admin_customer_key(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct kiln_err err = { .code = "" };
	char *key = NULL, key_id[32], id[65];
	struct quota q;
	json_t *j;

	if (admin_customer(s, r, id, &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	if (store_key_create(s->st, id, 0, &key, key_id, &err) < 0)
		return reply_err_status(r->conn, MHD_HTTP_INTERNAL_SERVER_ERROR, &err);
	j = json_pack("{s:s, s:s, s:s}", "key", key, "key_id", key_id, "customer", id);
	OPENSSL_cleanse(key, strlen(key));
	free(key);
	return reply_json(r->conn, MHD_HTTP_CREATED, j);
}

/* DELETE /v1/admin/keys/{id} */
static enum MHD_Result admin_key_revoke(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	const char *kid = r->param[0];
	int rc;

	if (strlen(kid) >= 32)
		return reply_not_found(r->conn, "no such key");
	rc = store_key_revoke(s->st, kid);
	if (rc == -ENOENT)
		return reply_not_found(r->conn, "no such key");
	if (rc < 0)
		return reply_internal(r->conn, "cannot revoke the key");
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:s, s:b}", "key_id", kid, "revoked", 1));
}

/* GET /v1/admin/hosts */
static enum MHD_Result admin_hosts(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	int64_t cutoff = clock_wall_ms() - (int64_t)s->cfg->host_lost_after_s * 1000;
	json_t *hosts = store_host_list(s->st), *h;
	size_t i;

	/* A host the scheduler has not yet marked shows as lost once its
	 * heartbeat is older than host_lost_after_s. */
	json_array_foreach(hosts, i, h)
		if (json_integer_value(json_object_get(h, "last_heartbeat_ms")) < cutoff)
			json_object_set_new(h, "state", json_string("lost"));
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:o}", "hosts", hosts));
}

/* POST /v1/hosts/{id}/heartbeat (the cluster token was checked before) */
static enum MHD_Result host_heartbeat(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *id = r->param[0];
	char url[API_URL_MAX + 1];
	json_t *cap;

	if (strlen(id) >= 65)
		return reply_not_found(r->conn, "no such endpoint");
	if (!api_id_ok(id))
		return reply_error(r->conn, KERR_INVALID_REQUEST,
				   "host id: 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
	if (httpd_body_len(r->body) > ADMIN_BODY_MAX)
		return reply_error(r->conn, KERR_TOO_LARGE, "heartbeats are at most 64 KiB");
	if (api_heartbeat_parse(httpd_body_data(r->body), httpd_body_len(r->body), url, &cap, &err) < 0)
		return reply_err_status(r->conn, MHD_HTTP_BAD_REQUEST, &err);
	if (store_host_heartbeat(s->st, id, url, cap, &err) < 0) {
		json_decref(cap);
		return reply_err_status(r->conn, MHD_HTTP_INTERNAL_SERVER_ERROR, &err);
	}
	templates_heartbeat(s->st, cap);
	json_decref(cap);
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:b}", "ok", 1));
}

/* ---- dispatch ---- */

/* The task named by the path, or NULL (answer 404 no such task) when it is
 * too long to be a task id. */
static const char *task_id(struct httpd_req *r)
{
	return strlen(r->param[0]) < 40 ? r->param[0] : NULL;
}

/* The routes that need no key: health and metrics. */
static int keyless(const char *url)
{
	return !strcmp(url, "/healthz") || !strcmp(url, "/metrics");
}

/* 503 when the store's database does not answer (PostgreSQL down or out
 * of reach): a load balancer then sends requests to another replica. */
static enum MHD_Result rt_healthz(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;

	if (store_ping(s->st) < 0)
		return reply_json(r->conn, MHD_HTTP_SERVICE_UNAVAILABLE,
				  json_pack("{s:s, s:s}", "status", "unavailable", "reason", "the database is unreachable"));
	/* leader: this replica runs the scheduler now (always, on SQLite). */
	return reply_json(r->conn, MHD_HTTP_OK,
			  json_pack("{s:s, s:b}", "status", "ok", "leader", store_is_leader(s->st)));
}

/* GET /metrics (no key, like /healthz): this replica's view, Prometheus
 * text. Each replica answers for itself: scrape them all; exactly one says
 * kiln_api_leader 1. */
static const struct metric m_leader = {
	.name = "kiln_api_leader", .type = METRIC_GAUGE,
	.help = "1 when this kiln-api runs the scheduler (one replica at a time)",
};
static const struct metric m_store_up = {
	.name = "kiln_api_store_up", .type = METRIC_GAUGE,
	.help = "1 when the store's database answers",
};
static const struct metric m_store_info = {
	.name = "kiln_api_store_info", .type = METRIC_GAUGE, .labels = { "backend" },
	.help = "the store's backend",
};

static enum MHD_Result rt_metrics(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct MHD_Response *resp;
	struct buf b = BUF_INIT;
	enum MHD_Result ret;
	const char *backend = store_is_pg(s->st) ? "postgresql" : "sqlite";
	size_t n;
	char *text;
	int e;

	e = metric_write(&b, &m_leader, store_is_leader(s->st) != 0);
	if (!e)
		e = metric_write(&b, &m_store_up, store_ping(s->st) == 0);
	if (!e)
		e = metric_write_by(&b, &m_store_info, &backend, (uint64_t[]){ 1 }, 1);
	if (e || !(text = buf_steal(&b, &n))) {
		buf_free(&b);
		return reply_internal(r->conn, "out of memory");
	}
	resp = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
	MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
	ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

static enum MHD_Result rt_list(void *ctx, struct httpd_req *r)
{
	return handle_list(ctx, r->conn, r->app);
}

static enum MHD_Result rt_submit(void *ctx, struct httpd_req *r)
{
	return handle_submit(ctx, r->conn, r->body, r->app);
}

static enum MHD_Result rt_task_get(void *ctx, struct httpd_req *r)
{
	const char *id = task_id(r);

	return id ? handle_get(ctx, r->conn, id, r->app) : reply_not_found(r->conn, "no such task");
}

static enum MHD_Result rt_task_events(void *ctx, struct httpd_req *r)
{
	const char *id = task_id(r);

	return id ? handle_events(ctx, r->conn, id, r->app) : reply_not_found(r->conn, "no such task");
}

static enum MHD_Result rt_task_cancel(void *ctx, struct httpd_req *r)
{
	const char *id = task_id(r);

	return id ? handle_cancel(ctx, r->conn, id, r->app) : reply_not_found(r->conn, "no such task");
}

/* GET /v1/tasks/{id}/artifacts/{name}: a log carried inline (artifacts.h),
 * for a caller with a key (its own tasks; the admin's: any). */
static enum MHD_Result rt_task_artifact(void *ctx, struct httpd_req *r)
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

/* A signed link to an inline artifact (?expires=&sig=, artifacts.h): 1 and
 * the task's id and the artifact's name when url is one and its signature
 * holds, 0 when url is no such link (no sig: a key is needed as usual), -1
 * when it is one whose signature is wrong or expired. */
static int artifact_link(struct server *s, struct MHD_Connection *conn, const char *url, char *id, size_t id_size,
			 char name[ARTIFACT_NAME_MAX])
{
	const char *sig = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "sig");

	if (!sig || !artifacts_path(url, id, id_size, name))
		return 0;
	if (!s->have_art_key ||
	    !artifacts_sig_ok(s->art_key, id, name, MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "expires"),
			      sig, time(NULL)))
		return -1;
	return 1;
}

static enum MHD_Result reply_bad_link(struct MHD_Connection *conn)
{
	return reply_error(conn, KERR_FORBIDDEN,
			   "this artifact link has expired or its signature is wrong: get a fresh url from "
			   "GET /v1/tasks/{id}");
}

static enum MHD_Result rt_usage(void *ctx, struct httpd_req *r)
{
	return handle_usage(ctx, r->conn, r->app);
}

/* Every endpoint but /v1/sessions/..., which sessions.c routes. Customer
 * and admin routes are authenticated, admin routes checked for an admin
 * key and /v1/hosts/ routes for the cluster token before the table. */
static const struct httpd_route api_routes[] = {
	{ "GET", "/healthz", rt_healthz },
	{ "GET", "/metrics", rt_metrics },
	{ "GET", "/v1/tasks", rt_list },
	{ "POST", "/v1/tasks", rt_submit },
	{ "GET", "/v1/tasks/{id}", rt_task_get },
	{ "GET", "/v1/tasks/{id}/events", rt_task_events },
	{ "POST", "/v1/tasks/{id}/cancel", rt_task_cancel },
	{ "GET", "/v1/tasks/{id}/artifacts/{name}", rt_task_artifact },
	{ "GET", "/v1/usage", rt_usage },
	{ "GET", "/v1/destination", rt_dest },
	{ "PUT", "/v1/destination", rt_dest },
	{ "DELETE", "/v1/destination", rt_dest },
	{ "POST", "/v1/destination/test", rt_dest_test },
	{ "GET", "/v1/admin/customers/{id}/destination", admin_dest },
	{ "PUT", "/v1/admin/customers/{id}/destination", admin_dest },
	{ "DELETE", "/v1/admin/customers/{id}/destination", admin_dest },
	{ "POST", "/v1/admin/customers/{id}/destination/test", admin_dest_test },
	{ "POST", "/v1/admin/customers", admin_customer_create },
	{ "GET", "/v1/admin/customers", admin_customer_list },
	{ "GET", "/v1/admin/customers/{id}", admin_customer_get },
	{ "GET", "/v1/admin/customers/{id}/keys", admin_customer_keys },
	{ "PUT", "/v1/admin/customers/{id}/quotas", admin_customer_quotas },
	{ "POST", "/v1/admin/customers/{id}/keys", admin_customer_key },
	{ "DELETE", "/v1/admin/keys/{id}", admin_key_revoke },
	{ "GET", "/v1/admin/hosts", admin_hosts },
	{ "POST", "/v1/hosts/{id}/heartbeat", host_heartbeat },
};

static const struct httpd_routes api_table = {
	api_routes, sizeof(api_routes) / sizeof(api_routes[0]), "no such endpoint", ", ",
};

static enum MHD_Result reply_too_large(struct server *s, struct MHD_Connection *conn)
{
	char msg[96];

	snprintf(msg, sizeof(msg), "the request body is larger than %zu MiB", s->max_body >> 20);
	return reply_error(conn, KERR_TOO_LARGE, msg);
}

static enum MHD_Result reply_no_key(struct MHD_Connection *conn, const char *url)
{
	if (is_e2b(url))
		return reply_e2b_error(conn, MHD_HTTP_UNAUTHORIZED,
				       api_key(conn, url) ? "unknown or revoked API key"
							  : "missing API key (X-API-KEY: kiln_...)",
				       "WWW-Authenticate", "Bearer");
	return reply_unauthorized(conn, bearer(conn) ? "unknown or revoked API key"
						     : "missing API key (Authorization: Bearer kiln_...)");
}

/* The sessions, held for one request; NULL when they are not served. */
static struct sessions *hold_sessions(struct server *s)
{
	struct sessions *ss;

	pthread_mutex_lock(&s->hooks_lock);
	ss = s->sessions;
	if (ss)
		sessions_hold(ss);
	pthread_mutex_unlock(&s->hooks_lock);
	return ss;
}

/* /e2b/...: E2B's control API (e2b.c). */
static enum MHD_Result handle_e2b(struct server *s, struct MHD_Connection *conn, const char *method,
				  const char *url, const struct httpd_body *body, const struct caller *c)
{
	struct sessions_request sr = {
		.conn = conn, .method = method, .path = url + 4, .body = httpd_body_data(body),
		.len = httpd_body_len(body), .customer = c->customer, .admin = c->admin, .lim = s->lim, .e2b = 1,
	};
	struct sessions *ss = hold_sessions(s);

	if (!ss)
		return reply_e2b_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "sandboxes are not served now", NULL, NULL);
	return e2b_handle(ss, &sr);
}

/* The envd relay's root paths (e2b_relay.c): the sandbox's token, not a key. */
static enum MHD_Result handle_relay(struct server *s, struct MHD_Connection *conn, const char *method,
				    const char *url, const struct httpd_body *body)
{
	struct e2b_relay_request rr = {
		.conn = conn, .method = method, .url = url, .body = httpd_body_data(body), .len = httpd_body_len(body),
		.lim = s->lim,
	};
	struct sessions *ss = hold_sessions(s);

	if (!ss)
		return reply_e2b_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "sandboxes are not served now", NULL, NULL);
	return e2b_relay_handle(ss, &rr);
}

static enum MHD_Result handle_sessions(struct server *s, struct MHD_Connection *conn, const char *method,
				       const char *url, const struct httpd_body *body, const struct caller *c)
{
	struct sessions_request sr = {
		.conn = conn, .method = method, .path = url + 12, .body = httpd_body_data(body),
		.len = httpd_body_len(body), .customer = c->customer, .admin = c->admin, .lim = s->lim,
	};
	struct sessions *ss;

	pthread_mutex_lock(&s->hooks_lock);
	ss = s->sessions;
	if (ss)
		sessions_hold(ss);
	pthread_mutex_unlock(&s->hooks_lock);
	if (!ss)
		return reply_error(conn, KERR_UNAVAILABLE, "sessions are not served now");
	return sessions_handle(ss, &sr);
}

static enum MHD_Result handle_templates(struct server *s, struct MHD_Connection *conn, const char *method,
					const char *url, const struct httpd_body *body, const struct caller *c)
{
	struct templates *t;

	pthread_mutex_lock(&s->hooks_lock);
	t = s->templates;
	pthread_mutex_unlock(&s->hooks_lock);
	if (!t)
		return reply_error(conn, KERR_UNAVAILABLE, "templates are not served now");
	return templates_handle(t, conn, method, url, httpd_body_data(body), httpd_body_len(body), c->customer,
				c->admin, s->lim);
}

/* One request's state across the access handler's calls: its body, or, for
 * an OCI template upload, the spool it is streamed into. */
struct conn_state {
	struct httpd_body body;      /* first: completed() frees both */
	struct templates_upload *up;
	int relay_refused;           /* an envd call refused before its body: the body is dropped */
};

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
			       const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct server *s = cls;
	struct conn_state *cs = *con_cls;
	struct httpd_body *body = cs ? &cs->body : NULL;
	struct httpd_req r;
	struct caller c;

	if (!cs) {
		cs = calloc(1, sizeof(*cs));
		if (!cs)
			return MHD_NO;
		body = &cs->body;
		/* Past the cap a chunked body is dropped, and the connection
		 * closed once it goes on past twice the cap. */
		httpd_body_init(body, s->max_body, s->max_body);
		*con_cls = cs;
		/* An OCI archive is streamed to a spool file under the
		 * customer's own cap (max_template_mib), not collected. */
		if (templates_is_upload(conn, method, url)) {
			struct templates *t;

			if (!authenticate(s, conn, url, &c))
				return reply_no_key(conn, url);
			pthread_mutex_lock(&s->hooks_lock);
			t = s->templates;
			pthread_mutex_unlock(&s->hooks_lock);
			if (!t)
				return reply_error(conn, KERR_UNAVAILABLE, "templates are not served now");
			return templates_upload_begin(t, conn, c.customer, c.admin, &cs->up);
		}
		if (httpd_body_declared_too_big(body, conn))
			return reply_too_large(s, conn);
		/* The web console's static files need no key (ui.c). */
		if (ui_is_path(url))
			return MHD_YES;
		/* Customer routes need a key: check it before reading any body,
		 * so an unauthenticated upload costs neither memory nor time
		 * (the host routes check the cluster token below). */
		/* The relay's token too, before the body (up to max_body_mib) is
		 * read: a refused call's body is dropped as it comes (answered
		 * at its end), at most max_body_mib of it. */
		if (e2b_relay_path(url)) {
			struct sessions *ss = hold_sessions(s);

			if (ss && !e2b_relay_allowed(ss, conn)) {
				cs->relay_refused = 1;
				body->too_big = 1;
				body->drop_max = s->max_body;
			}
			return MHD_YES;
		}
		if (!keyless(url) && strncmp(url, "/v1/hosts/", 10)) {
			char id[80], name[ARTIFACT_NAME_MAX];
			int link = artifact_link(s, conn, url, id, sizeof(id), name);

			if (link < 0)
				return reply_bad_link(conn);
			if (!link && !authenticate(s, conn, url, &c))
				return reply_no_key(conn, url);
		}
		return MHD_YES;
	}
	if (cs->up) {
		if (*upload_size)
			return templates_upload_feed(cs->up, upload, upload_size);
		return templates_upload_finish(cs->up, conn);
	}
	if (*upload_size)
		return httpd_body_feed(body, upload, upload_size);
	if (cs->relay_refused) {
		struct sessions *ss = hold_sessions(s);

		if (!ss)
			return reply_e2b_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "sandboxes are not served now", NULL,
					       NULL);
		return e2b_relay_refuse(ss, conn, url);
	}
	if (body->too_big)
		return reply_too_large(s, conn);
	if (ui_is_path(url))
		return ui_serve(s->ui_dir, conn, method, url);
	memset(&c, 0, sizeof(c));
	/* The database is out of reach (PostgreSQL): 503 at once rather than
	 * a store error from deep inside; store_down reconnects by itself. */
	if (!keyless(url) && store_down(s->st))
		return reply_error(conn, KERR_UNAVAILABLE, "the database is unreachable; retry");
	if (!strncmp(url, "/v1/hosts/", 10)) {
		const char *tok = bearer(conn);

		if (!s->have_token || !tok || !secret_matches(tok, s->token_hash))
			return reply_unauthorized(conn, "missing or wrong cluster token (Authorization: Bearer ...)");
	} else if (e2b_relay_path(url)) {
		return handle_relay(s, conn, method, url, body);
	} else if (!keyless(url)) {
		char id[80], name[ARTIFACT_NAME_MAX];
		int link = artifact_link(s, conn, url, id, sizeof(id), name);

		if (link < 0)
			return reply_bad_link(conn);
		if (link > 0 && strcmp(method, "GET"))
			return reply_error_h(conn, KERR_METHOD_NOT_ALLOWED, "use GET", "Allow", "GET");
		if (link > 0) {
			/* The signature names the task: any customer's. */
			json_t *j = store_task_json(s->st, id, NULL);
			enum MHD_Result ret;

			if (!j)
				return reply_not_found(conn, "no such task");
			ret = artifacts_reply(conn, j, name);
			json_decref(j);
			return ret;
		}
		if (!authenticate(s, conn, url, &c))
			return reply_no_key(conn, url);
		if (is_e2b(url))
			return handle_e2b(s, conn, method, url, body, &c);
		if (!strcmp(url, "/v1/sessions") || !strncmp(url, "/v1/sessions/", 13))
			return handle_sessions(s, conn, method, url, body, &c);
		if (!strcmp(url, "/v1/templates") || !strncmp(url, "/v1/templates/", 14))
			return handle_templates(s, conn, method, url, body, &c);
		if (!strncmp(url, "/v1/admin/", 10)) {
			if (!c.admin)
				return reply_error(conn, KERR_FORBIDDEN, "admin endpoints need an admin key");
			if (httpd_body_len(body) > ADMIN_BODY_MAX)
				return reply_error(conn, KERR_TOO_LARGE,
						   "admin bodies are at most 64 KiB");
		}
	}
	r = (struct httpd_req){ .conn = conn, .method = method, .url = url, .body = body, .app = &c };
	return httpd_dispatch(&api_table, s, &r);
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct conn_state *cs = *con_cls;

	if (cs) {
		httpd_body_free(&cs->body);
		templates_upload_free(cs->up);
		free(cs);
	}
	*con_cls = NULL;
}

/* "ADDR:PORT" (IPv4) into sa. */
static int parse_listen(const char *arg, struct sockaddr_in *sa)
{
	const char *colon = strrchr(arg, ':');
	char host[64];
	char *end;
	long port;

	if (!colon || (size_t)(colon - arg) >= sizeof(host))
		return -1;
	memcpy(host, arg, (size_t)(colon - arg));
	host[colon - arg] = '\0';
	port = strtol(colon + 1, &end, 10);
	if (!colon[1] || *end || port < 0 || port > 65535)
		return -1;
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

struct server *server_start(const struct api_config *cfg, struct store *st, const struct server_hooks *hooks,
			    struct kiln_err *err)
{
	struct server *s = calloc(1, sizeof(*s));
	struct sockaddr_in sa;

	if (!s) {
		kiln_err_set(err, KERR_INTERNAL, "out of memory");
		return NULL;
	}
	if (parse_listen(cfg->listen, &sa) < 0) {
		free(s);
		kiln_err_set(err, KERR_CONFIG, "listen: expected IPv4-ADDRESS:PORT (got \"%s\")", cfg->listen);
		return NULL;
	}
	s->cfg = cfg;
	s->st = st;
	s->max_body = (size_t)(cfg->max_body_mib ? cfg->max_body_mib : 64) << 20;
	if (cfg->admin_key) {
		SHA256((const unsigned char *)cfg->admin_key, strlen(cfg->admin_key), s->admin_hash);
		s->have_admin = 1;
	}
	if (cfg->cluster_token) {
		SHA256((const unsigned char *)cfg->cluster_token, strlen(cfg->cluster_token), s->token_hash);
		s->have_token = 1;
	}
	if (cfg->s3.secret_key) {
		artifacts_key(cfg->s3.secret_key, s->art_key);
		s->have_art_key = 1;
	}
	if (hooks)
		s->hooks = *hooks;
	if (cfg->ui_dir)
		s->ui_dir = cfg->ui_dir;
	else
		s->ui_dir = ui_default_dir(s->ui_dir_buf, sizeof(s->ui_dir_buf));
	pthread_mutex_init(&s->hooks_lock, NULL);
	s->ev = events_new(st);
	s->lim = quota_limiter_new();
	if (!s->ev || !s->lim) {
		kiln_err_set(err, KERR_INTERNAL, "out of memory");
		goto fail;
	}
	store_set_listener(st, events_store_listener, s->ev);
	/* poll(), not select(): with max_connections past ~1000 a connection's
	 * fd can pass FD_SETSIZE (1024), which select() refuses. */
	s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
					MHD_USE_ERROR_LOG,
				ntohs(sa.sin_port), NULL, NULL, handler, s, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
				MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_CONNECTION_TIMEOUT, cfg->connection_timeout_s,
				MHD_OPTION_CONNECTION_LIMIT, cfg->max_connections,
				MHD_OPTION_PER_IP_CONNECTION_LIMIT, cfg->max_connections_per_address,
				MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
	if (!s->d) {
		kiln_err_set(err, KERR_LISTEN, "cannot listen on %s", cfg->listen);
		store_set_listener(st, NULL, NULL);
		goto fail;
	}
	base_url_set(s, &sa);
	return s;
fail:
	quota_limiter_free(s->lim);
	events_free(s->ev);
	pthread_mutex_destroy(&s->hooks_lock);
	free(s);
	return NULL;
}

void server_set_hooks(struct server *s, const struct server_hooks *hooks)
{
	pthread_mutex_lock(&s->hooks_lock);
	if (hooks)
		s->hooks = *hooks;
	else
		memset(&s->hooks, 0, sizeof(s->hooks));
	pthread_mutex_unlock(&s->hooks_lock);
}

void server_set_sessions(struct server *s, struct sessions *ss)
{
	pthread_mutex_lock(&s->hooks_lock);
	s->sessions = ss;
	pthread_mutex_unlock(&s->hooks_lock);
}

void server_set_templates(struct server *s, struct templates *t)
{
	pthread_mutex_lock(&s->hooks_lock);
	s->templates = t;
	pthread_mutex_unlock(&s->hooks_lock);
}

void server_stop(struct server *s)
{
	if (!s)
		return;
	events_stop(s->ev);
	store_wake_all(s->st);
	MHD_stop_daemon(s->d);
	store_set_listener(s->st, NULL, NULL);
	events_free(s->ev);
	quota_limiter_free(s->lim);
	pthread_mutex_destroy(&s->hooks_lock);
	free(s);
}
