/* e2b: the E2B-compatible control API under /e2b (docs/e2b.md, "kiln-api:
 * control API"). An E2B sandbox is a kiln session: create and connect go
 * through the sessions' own create and resume (sessions_create_run,
 * sessions_resume_run: the same quotas, submit rate, placement and retries),
 * kill and pause through sessions_destroy and sessions_pause. E2B's timeout
 * (the sandbox ends `timeout` s after create, connect or setTimeout,
 * whatever its activity) is the session's max_lifetime_s, with an idle
 * timeout as long, which therefore never ends it first. */
#include "e2b.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "httpd.h"
#include "reply.h"
#include "sessions_int.h"
#include "spec.h"

#define E2B_LIST_MAX 100

static enum MHD_Result not_found(struct MHD_Connection *conn, const char *id)
{
	char msg[128];

	snprintf(msg, sizeof(msg), "sandbox %.40s not found", id);
	return reply_e2b_error(conn, MHD_HTTP_NOT_FOUND, msg, NULL, NULL);
}

static enum MHD_Result bad_request(struct MHD_Connection *conn, const char *msg)
{
	return reply_e2b_error(conn, MHD_HTTP_BAD_REQUEST, msg, NULL, NULL);
}

/* An outcome of sessions_pause / sessions_destroy as E2B's error. */
static enum MHD_Result reply_outcome_error(struct MHD_Connection *conn, const struct sessions_outcome *o)
{
	return reply_e2b_error(conn, o->status, o->err.message, o->status == 503 ? "Retry-After" : NULL,
			       RETRY_AFTER_S);
}

/* ---- the sandbox object ---- */

/* E2B's state of a session: "running", "paused", or NULL when E2B would
 * not know it any more (destroyed, or failed without a snapshot). */
static const char *e2b_state(const struct store_session *c)
{
	switch (c->state) {
	case SESSION_STARTING:
	case SESSION_RUNNING:
	case SESSION_RESUMING:
		return "running";
	case SESSION_PAUSING:
	case SESSION_PAUSED:
		return "paused";
	case SESSION_ERROR:
		return c->has_snapshot ? "paused" : NULL;
	default:
		return NULL;
	}
}

static json_t *rfc3339(int64_t ms)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;
	char b[48], out[64];

	gmtime_r(&t, &tm);
	strftime(b, sizeof(b), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out, sizeof(out), "%s.%03dZ", b, (int)(ms % 1000));
	return json_string(out);
}

/* The templateID a session reports: E2B's as given, else kiln's template
 * name, else "base". */
static const char *template_of(const struct store_session *c, json_t *native)
{
	if (c->e2b_template[0])
		return c->e2b_template;
	return json_string_value(json_object_get(native, "template")) ?: "base";
}

/* The sandbox object of GET (token: with its envdAccessToken) from the
 * session's row and its public JSON. NULL when E2B does not know it. */
static json_t *sandbox_json(struct sessions *ss, const struct store_session *c, int token)
{
	json_t *native = store_session_json(ss->st, c->id, NULL), *j, *md;
	const char *state = e2b_state(c), *tpl;
	char e2b_id[40];
	json_t *limits;

	if (!native || !state) {
		json_decref(native);
		return NULL;
	}
	tpl = template_of(c, native);
	limits = json_object_get(native, "limits");
	md = json_object_get(native, "metadata");
	j = json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:i, s:i, s:I, s:o, s:s, s:s, s:n}", "sandboxID",
		      store_session_id_e2b(c->id, e2b_id),
		      "templateID", tpl, "alias", tpl, "clientID", "kiln", "startedAt", rfc3339(c->created_ms), "endAt",
		      rfc3339(c->started_ms + (int64_t)c->max_lifetime_s * 1000), "cpuCount", (int)c->vcpus, "memoryMB",
		      (int)c->memory_mib, "diskSizeMB",
		      (json_int_t)json_integer_value(json_object_get(limits, "output_mib")), "metadata",
		      json_is_object(md) ? json_incref(md) : json_object(), "state", state, "envdVersion",
		      E2B_ENVD_VERSION, "domain");
	if (j && ss->cfg->sandbox_domain)
		json_object_set_new(j, "domain", json_string(ss->cfg->sandbox_domain));
	if (j) {
		json_t *net = e2b_network_info(json_object_get(native, "network"));

		json_object_set_new(net, "allowPublicTraffic", json_boolean(!c->private_traffic));
		json_object_set_new(j, "network", net);
		json_object_set_new(j, "lifecycle", json_pack("{s:s, s:b}", "onTimeout",
							      c->auto_pause == 1 ? "pause" : "kill", "autoResume",
							      c->auto_resume));
		/* volumeMounts [{name, path}] (getInfo's), from the session's volumes. */
		{
			json_t *vm = json_array(), *v;
			size_t i;

			json_array_foreach(json_object_get(native, "volumes"), i, v)
				json_array_append_new(vm, json_pack("{s:O, s:O}", "name", json_object_get(v, "name"), "path",
								    json_object_get(v, "path")));
			json_object_set_new(j, "volumeMounts", vm);
		}
	}
	if (j && token && c->private_traffic) {
		char tt[65];

		sessions_traffic_token(ss, c->id, tt);
		json_object_set_new(j, "trafficAccessToken", json_string(tt));
	}
	if (j && token) {
		char tok[65];

		sessions_e2b_token(ss, c->id, tok);
		json_object_set_new(j, "envdAccessToken", json_string(tok));
	}
	json_decref(native);
	return j;
}

/* The answer of create and connect. */
static json_t *created_json(struct sessions *ss, const char *id)
{
	struct store_session c;
	json_t *full, *j;

	if (store_session_get(ss->st, id, NULL, &c) < 0 || !(full = sandbox_json(ss, &c, 1)))
		return NULL;
	j = json_pack("{s:O, s:O, s:O, s:O, s:O, s:O, s:n, s:n}", "sandboxID", json_object_get(full, "sandboxID"),
		      "templateID", json_object_get(full, "templateID"), "alias", json_object_get(full, "alias"),
		      "clientID", json_object_get(full, "clientID"), "envdVersion", json_object_get(full, "envdVersion"),
		      "envdAccessToken", json_object_get(full, "envdAccessToken"), "domain", "trafficAccessToken");
	if (j && ss->cfg->sandbox_domain)
		json_object_set(j, "domain", json_object_get(full, "domain"));
	if (j && json_object_get(full, "trafficAccessToken"))
		json_object_set(j, "trafficAccessToken", json_object_get(full, "trafficAccessToken"));
	json_decref(full);
	return j;
}

/* ---- requests ---- */

struct e2b_call {
	struct sessions *ss;
	const struct sessions_request *r;
	struct store_session cur;
};

/* The {id} of the path, the caller's and known to E2B: 1, else 404 answered. */
static int find(struct e2b_call *c, struct httpd_req *req, enum MHD_Result *ret)
{
	const char *id = req->param[0];

	if (strlen(id) >= sizeof(c->cur.id) || store_session_get(c->ss->st, id, c->r->customer, &c->cur) < 0 ||
	    !e2b_state(&c->cur)) {
		*ret = not_found(req->conn, id);
		return 0;
	}
	return 1;
}

/* The JSON object body (an empty body is {}): NULL with 400 answered. */
static json_t *body_object(const struct sessions_request *r, enum MHD_Result *ret)
{
	json_error_t je;
	json_t *j;

	if (!r->body || !r->len)
		return json_object();
	if (r->len > API_SESSION_BODY_MAX) {
		*ret = bad_request(r->conn, "the body is too large");
		return NULL;
	}
	j = json_loadb(r->body, r->len, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(j)) {
		char msg[256];

		snprintf(msg, sizeof(msg), "the body is not a JSON object%s%.160s", j ? "" : ": ", j ? "" : je.text);
		json_decref(j);
		*ret = bad_request(r->conn, msg);
		return NULL;
	}
	return j;
}

/* The session now ends timeout_s from now: its lifetime counts from
 * started_ms (create or latest resume); idle as long, so it never fires
 * first. extend_only: never sooner than it ends now (connect). */
static int set_timeout(struct sessions *ss, const struct store_session *c, long timeout_s, int extend_only)
{
	int64_t now = kclock_wall_ms(ss->clock), elapsed_s;
	long life;

	elapsed_s = now > c->started_ms ? (now - c->started_ms + 999) / 1000 : 0;
	life = (long)elapsed_s + timeout_s;
	if (extend_only && life < (long)c->max_lifetime_s)
		return 1;
	if (life > (long)API_SESSION_MAX_LIFETIME_S)
		life = API_SESSION_MAX_LIFETIME_S;
	return store_session_set_limits(ss->st, c->id, c->customer, (unsigned)life, (unsigned)life);
}

/* POST /e2b/v2/sandboxes, POST /e2b/sandboxes */
static enum MHD_Result h_create(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	struct sessions *ss = c->ss;
	const struct sessions_request *r = c->r;
	struct kiln_err err = { .code = "" };
	struct api_session_request sr;
	struct e2b_create ec;
	struct quota q;
	enum MHD_Result ret = MHD_NO;
	char msg[600], id[40], *ntext;
	json_t *j;

	if (store_customer_quota(ss->st, r->customer, &q) < 0)
		return reply_e2b_error(req->conn, MHD_HTTP_FORBIDDEN, "this key's customer no longer exists", NULL,
				       NULL);
	if (e2b_create_parse(r->body, r->len, q.allow_egress, &ec, msg, sizeof(msg)) < 0)
		return bad_request(req->conn, msg);
	ntext = json_dumps(ec.native, JSON_COMPACT);
	if (!ntext)
		kiln_err_set(&err, KERR_INTERNAL, "out of memory");
	if (!ntext || api_session_request_parse(ntext, strlen(ntext), q.allow_egress, &sr, &err) < 0) {
		free(ntext);
		e2b_create_free(&ec);
		return reply_e2b_error(req->conn, kiln_err_status(err.errc), err.message, NULL, NULL);
	}
	free(ntext);
	if (ec.env_json && sr.snapshot[0]) {
		api_session_request_free(&sr);
		e2b_create_free(&ec);
		return bad_request(req->conn, "envVars: a sandbox started from a snapshot has the snapshot's environment");
	}
	/* The envVars go to hosts in the session's spec, as its "env". */
	if (ec.env_json) {
		json_t *sp = json_loads(sr.spec_json, 0, NULL);
		char *spec;

		json_object_set_new(sp, "env", json_loads(ec.env_json, 0, NULL));
		spec = sp ? json_dumps(sp, JSON_COMPACT) : NULL;
		json_decref(sp);
		if (!spec) {
			api_session_request_free(&sr);
			e2b_create_free(&ec);
			return reply_e2b_error(req->conn, 500, "out of memory", NULL, NULL);
		}
		free(sr.spec_json);
		sr.spec_json = spec;
	}
	{
		struct sessions_e2b_new e = { .template = ec.template, .env_json = ec.env_json, .auto_pause = ec.auto_pause,
					      .flags = (ec.private_traffic ? STORE_E2B_PRIVATE : 0) |
						       (ec.auto_resume ? STORE_E2B_AUTO_RESUME : 0) };

		if (sessions_create_run(ss, r, &q, &sr, &e, id, &ret)) {
			j = created_json(ss, id);
			ret = j ? reply_json(req->conn, MHD_HTTP_CREATED, j)
				: reply_e2b_error(req->conn, 500, "the sandbox cannot be read back", NULL, NULL);
		}
	}
	api_session_request_free(&sr);
	e2b_create_free(&ec);
	return ret;
}

/* GET /e2b/sandboxes/{id} */
static enum MHD_Result h_get(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	enum MHD_Result ret;
	json_t *j;

	if (!find(c, req, &ret))
		return ret;
	j = sandbox_json(c->ss, &c->cur, 1);
	return j ? reply_json(req->conn, MHD_HTTP_OK, j) : not_found(req->conn, c->cur.id);
}

/* The v2 list's filters. */
struct list_filter {
	int running, paused;
	json_t *metadata;            /* {k: v} all of which must match; NULL none */
	const char *template;        /* its templateID as given at create (NULL: any) */
	int64_t started_after_ms;    /* created after (0: any) */
	int oldest_first;            /* E2B's order=asc (default desc: newest first) */
};

/* E2B's startedAfter (toISOString: 2026-12-07T03:50:00.000Z, or without
 * the fraction): wall ms, or -1. */
static int64_t iso_ms(const char *s)
{
	struct tm tm = { 0 };
	const char *p = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
	long ms = 0;

	if (!p)
		return -1;
	if (*p == '.') {
		int digits = 0;

		for (p++; *p >= '0' && *p <= '9'; p++, digits++)
			if (digits < 3)
				ms = ms * 10 + (*p - '0');
		for (; digits > 0 && digits < 3; digits++)
			ms *= 10;
	}
	if (strcmp(p, "Z") && strcmp(p, "+00:00"))
		return -1;
	return (int64_t)timegm(&tm) * 1000 + ms;
}

static enum MHD_Result collect_state(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	struct list_filter *f = cls;
	const char *p = value ? value : "";

	if (strcmp(key, "state"))
		return MHD_YES;
	/* Repeated (state=a&state=b) or comma-separated (the SDK's form style). */
	while (*p) {
		size_t k = strcspn(p, ",");

		if (k == 7 && !strncmp(p, "running", 7))
			f->running = 1;
		else if (k == 6 && !strncmp(p, "paused", 6))
			f->paused = 1;
		else
			f->running = f->paused = -1000; /* marks it bad */
		p += k;
		if (*p == ',')
			p++;
	}
	return MHD_YES;
}

static int filter_match(const struct list_filter *f, const struct store_session *c, json_t *native)
{
	const char *st = e2b_state(c), *k;
	json_t *md = json_object_get(native, "metadata"), *v;

	if (!st || (!strcmp(st, "running") ? !f->running : !f->paused))
		return 0;
	json_object_foreach(f->metadata, k, v)
		if (!json_equal(json_object_get(md, k), v))
			return 0;
	if (f->template && strcmp(f->template, c->e2b_template[0] ? c->e2b_template : "base"))
		return 0;
	return c->created_ms >= f->started_after_ms; /* E2B's startedAfter includes the instant */
}

/* Whether a row of the store's listing is a sandbox that passes f (*c
 * then holds it). */
static int row_match(struct sessions *ss, const char *customer, const struct list_filter *f, json_t *row,
		     struct store_session *c)
{
	return store_session_get(ss->st, json_string_value(json_object_get(row, "id")) ?: "", customer, c) == 0 &&
	       filter_match(f, c, row);
}

/* Rows looked at past a full page for whether another sandbox passes the
 * filter: past that, the next page's token is given anyway. */
#define LIST_PEEK_MAX 5000

/* One page of the caller's sandboxes that pass f (newest first, or oldest
 * with order=asc), at most limit, into arr; the next page's cursor (caller
 * frees), or NULL when no sandbox after this page passes f (E2B's SDK takes
 * a token for "there is more"). The store is read in batches of exactly
 * what the page still misses, so a full page ends where a batch ends and
 * that batch's cursor is the next page's. */
static int list_page(struct sessions *ss, const char *customer, const struct list_filter *f, unsigned limit,
		     const char *cursor, json_t *arr, char **next, struct kiln_err *err)
{
	char *cur = cursor ? strdup(cursor) : NULL, *after = NULL;
	unsigned have = 0, peeked = 0;
	struct store_session c;
	json_t *page, *row;
	int more = 0;
	size_t i;

	*next = NULL;
	if (cursor && !cur)
		return kiln_err_set(err, KERR_INTERNAL, "out of memory");
	do {
		page = store_session_list_order(ss->st, customer, NULL, limit - have, cur, f->oldest_first, &after, err);
		if (!page) {
			free(cur);
			return -1;
		}
		json_array_foreach(page, i, row) {
			json_t *j;

			if (row_match(ss, customer, f, row, &c) && (j = sandbox_json(ss, &c, 0))) {
				json_array_append_new(arr, j);
				have++;
			}
		}
		json_decref(page);
		free(cur);
		cur = after;
		after = NULL;
	} while (cur && have < limit);
	/* A full page: is there a sandbox after it that passes f? */
	if (cur) {
		char *p = strdup(cur);

		while (p && !more && peeked < LIST_PEEK_MAX) {
			page = store_session_list_order(ss->st, customer, NULL, 100, p, f->oldest_first, &after, err);
			free(p);
			p = after;
			after = NULL;
			if (!page) {
				free(p);
				free(cur);
				return -1;
			}
			json_array_foreach(page, i, row) {
				peeked++;
				if (row_match(ss, customer, f, row, &c)) {
					more = 1;
					break;
				}
			}
			json_decref(page);
		}
		if (p && !more)
			more = 1; /* looked far enough: say there may be more */
		free(p);
	}
	if (more)
		*next = cur;
	else
		free(cur);
	return 0;
}

/* GET /e2b/v2/sandboxes */
static enum MHD_Result h_list_v2(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	const char *lim = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "limit");
	const char *tok = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "nextToken");
	const char *md = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "metadata");
	struct kiln_err err = { .code = "" };
	struct list_filter f = { 0 };
	enum MHD_Result ret;
	long limit = E2B_LIST_MAX;
	char *next = NULL;
	json_t *arr;

	if (lim) {
		char *end;

		limit = strtol(lim, &end, 10);
		if (!*lim || *end || limit < 1 || limit > E2B_LIST_MAX)
			return bad_request(req->conn, "limit: an integer from 1 to 100");
	}
	MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, collect_state, &f);
	if (f.running < 0)
		return bad_request(req->conn, "state: running or paused");
	if (!f.running && !f.paused)
		f.running = f.paused = 1;
	if (md && md[0] && !(f.metadata = e2b_metadata_filter(md)))
		return bad_request(req->conn, "metadata: key=value pairs joined by &");
	f.template = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "template");
	if (f.template && !f.template[0])
		f.template = NULL;
	{
		const char *o = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "order");

		if (o && o[0] && strcmp(o, "asc") && strcmp(o, "desc")) {
			json_decref(f.metadata);
			return bad_request(req->conn, "order: asc or desc (by start time)");
		}
		f.oldest_first = o && !strcmp(o, "asc");
	}
	{
		const char *sa = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "startedAfter");

		if (sa && sa[0] && (f.started_after_ms = iso_ms(sa)) < 0) {
			json_decref(f.metadata);
			return bad_request(req->conn, "startedAfter: an RFC 3339 time (2026-12-07T03:50:00.000Z)");
		}
	}
	arr = json_array();
	if (list_page(c->ss, c->r->customer, &f, (unsigned)limit, tok && tok[0] ? tok : NULL, arr, &next, &err) < 0) {
		json_decref(arr);
		json_decref(f.metadata);
		return reply_e2b_error(req->conn, err.errc == KERR_INVALID_REQUEST ? 400 : 500, err.message, NULL, NULL);
	}
	json_decref(f.metadata);
	ret = reply_json_h(req->conn, MHD_HTTP_OK, arr, next ? "x-next-token" : NULL, next);
	free(next);
	return ret;
}

/* GET /e2b/sandboxes: the running ones, all (old SDKs). */
static enum MHD_Result h_list(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	struct kiln_err err = { .code = "" };
	struct list_filter f = { .running = 1 };
	char *cursor = NULL, *next = NULL;
	json_t *arr = json_array();

	for (int pages = 0; pages < 50; pages++) {
		if (list_page(c->ss, c->r->customer, &f, E2B_LIST_MAX, cursor, arr, &next, &err) < 0) {
			free(cursor);
			json_decref(arr);
			return reply_e2b_error(req->conn, 500, err.message, NULL, NULL);
		}
		free(cursor);
		cursor = next;
		next = NULL;
		if (!cursor)
			break;
	}
	free(cursor);
	return reply_json(req->conn, MHD_HTTP_OK, arr);
}

/* Run a session operation (destroy, pause) under the session's operation
 * lock: 204, or the sandbox's 404, or the operation's error. */
static enum MHD_Result run_op(struct e2b_call *c, struct httpd_req *req,
			      void (*op)(struct sessions *, const char *, const char *, struct sessions_outcome *),
			      const char *reason)
{
	struct sessions_outcome o = { 0 };

	sessions_op_enter(c->ss, c->cur.id);
	op(c->ss, c->cur.id, reason, &o);
	sessions_op_leave(c->ss, c->cur.id);
	if (o.status == 404)
		return not_found(req->conn, c->cur.id);
	if (o.status != 200)
		return reply_outcome_error(req->conn, &o);
	return reply_bytes(req->conn, MHD_HTTP_NO_CONTENT, NULL, 0, NULL);
}

/* DELETE /e2b/sandboxes/{id} */
static enum MHD_Result h_kill(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	enum MHD_Result ret;

	if (!find(c, req, &ret))
		return ret;
	return run_op(c, req, sessions_destroy, "deleted");
}

/* POST /e2b/sandboxes/{id}/timeout {timeout} */
static enum MHD_Result h_timeout(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	enum MHD_Result ret;
	json_t *b;
	long t;

	if (!find(c, req, &ret))
		return ret;
	if (!(b = body_object(c->r, &ret)))
		return ret;
	t = json_object_get(b, "timeout") ? e2b_timeout_of(b, -1) : -1;
	json_decref(b);
	if (t < 0)
		return bad_request(req->conn, "timeout: an integer from 0 to 86400 (seconds) is required");
	if (set_timeout(c->ss, &c->cur, t, 0) < 0)
		return reply_e2b_error(req->conn, 500, "cannot store the timeout", NULL, NULL);
	return reply_bytes(req->conn, MHD_HTTP_NO_CONTENT, NULL, 0, NULL);
}

/* POST /e2b/sandboxes/{id}/pause */
static enum MHD_Result h_pause(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	enum MHD_Result ret;

	if (!find(c, req, &ret))
		return ret;
	if (!strcmp(e2b_state(&c->cur), "paused"))
		return reply_e2b_error(req->conn, MHD_HTTP_CONFLICT, "the sandbox is paused already", NULL, NULL);
	return run_op(c, req, sessions_pause, "paused");
}

/* POST /e2b/v2/sandboxes/{id}/connect {timeout}: resumes a paused one */
static enum MHD_Result h_connect(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	struct sessions *ss = c->ss;
	enum MHD_Result ret;
	unsigned status = MHD_HTTP_OK;
	json_t *b, *j;
	long t;

	if (!find(c, req, &ret))
		return ret;
	if (!(b = body_object(c->r, &ret)))
		return ret;
	t = e2b_timeout_of(b, 0);
	json_decref(b);
	if (t < 0)
		return bad_request(req->conn, "timeout: an integer from 0 to 86400 (seconds)");
	switch (c->cur.state) {
	case SESSION_RUNNING:
		if (t > 0 && set_timeout(ss, &c->cur, t, 1) < 0)
			return reply_e2b_error(req->conn, 500, "cannot store the timeout", NULL, NULL);
		break;
	case SESSION_PAUSED:
	case SESSION_ERROR:
		/* It runs `timeout` s (E2B's default when absent) from its resume. */
		if (!t)
			t = E2B_DEFAULT_TIMEOUT_S;
		if (store_session_set_limits(ss->st, c->cur.id, c->cur.customer, (unsigned)t, (unsigned)t) < 0)
			return reply_e2b_error(req->conn, 500, "cannot store the timeout", NULL, NULL);
		if (!sessions_resume_run(ss, c->r, &c->cur, &ret))
			return ret;
		status = MHD_HTTP_CREATED;
		break;
	default: {
		char msg[128];

		snprintf(msg, sizeof(msg), "the sandbox is %s: retry in a moment", session_state_name(c->cur.state));
		return reply_e2b_error(req->conn, MHD_HTTP_CONFLICT, msg, NULL, NULL);
	}
	}
	j = created_json(ss, c->cur.id);
	return j ? reply_json(req->conn, status, j)
		 : reply_e2b_error(req->conn, 500, "the sandbox cannot be read back", NULL, NULL);
}

/* PUT /e2b/sandboxes/{id}/network: updateNetwork, the running sandbox's
 * egress rules replaced (e2b_network_update_parse's mapping, then the
 * sessions' own PUT .../network): 204. */
static enum MHD_Result h_network(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	struct sessions *ss = c->ss;
	struct kiln_err err = { .code = "" };
	enum MHD_Result ret;
	char msg[600];
	json_t *net;

	if (!find(c, req, &ret))
		return ret;
	if (e2b_network_update_parse(c->r->body, c->r->len, &net, msg, sizeof(msg)) < 0)
		return bad_request(req->conn, msg);
	if (sessions_network_check(net, &err) < 0) {
		json_decref(net);
		return reply_e2b_error(req->conn, kiln_err_status(err.errc), err.message, NULL, NULL);
	}
	if (sessions_network_run(ss, c->r, &c->cur, net, &ret))
		ret = reply_bytes(req->conn, MHD_HTTP_NO_CONTENT, NULL, 0, NULL);
	json_decref(net);
	return ret;
}

/* GET /e2b/sandboxes/{id}/metrics: measured by its host now */
static enum MHD_Result h_metrics(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	struct sessions *ss = c->ss;
	struct kiln_err err = { .code = "" };
	enum MHD_Result ret;
	char url[256], path[96];
	json_t *m = NULL, *j;
	int st;

	if (!find(c, req, &ret))
		return ret;
	if (c->cur.state != SESSION_RUNNING)
		return reply_json(req->conn, MHD_HTTP_OK, json_array());
	if (sched_host_state(ss->sched, c->cur.host_id, url) != 1)
		return reply_e2b_error(req->conn, MHD_HTTP_SERVICE_UNAVAILABLE, "the sandbox's host cannot be reached",
				       "Retry-After", RETRY_AFTER_S);
	/* A series: the host's samples in [start, end] (unix seconds; start
	 * defaults to the sandbox's own start), the last one measured now. */
	{
		const char *qs = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "start");
		const char *qe = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "end");
		char q[64];
		int n;

		if ((qs && (!qs[0] || strlen(qs) > 12 || strspn(qs, "0123456789") != strlen(qs))) ||
		    (qe && (!qe[0] || strlen(qe) > 12 || strspn(qe, "0123456789") != strlen(qe))))
			return bad_request(req->conn, "start, end: unix seconds");
		n = snprintf(q, sizeof(q), "?start=%s", qs ? qs : "");
		if (!qs)
			snprintf(q + n, sizeof(q) - (size_t)n, "%lld", (long long)(c->cur.started_ms / 1000));
		if (qe) {
			size_t k = strlen(q);

			snprintf(q + k, sizeof(q) - k, "&end=%s", qe);
		}
		snprintf(path, sizeof(path), "/v1/sessions/%s/metrics%s", c->cur.id, q);
	}
	st = sessions_host_call(ss, url, "GET", path, NULL, SHORT_TIMEOUT_MS, &m, &err);
	if (st != 200 || !json_is_array(json_object_get(m, "samples"))) {
		char msg[600];

		json_decref(m);
		snprintf(msg, sizeof(msg), "the sandbox's host could not measure it: %s",
			 st < 0 ? err.message : "it did not answer with metrics");
		return reply_e2b_error(req->conn, MHD_HTTP_BAD_GATEWAY, msg, NULL, NULL);
	}
	j = json_array();
	{
		json_t *x;
		size_t i;

		json_array_foreach(json_object_get(m, "samples"), i, x) {
			int64_t t = (int64_t)json_integer_value(json_object_get(x, "t_ms"));

#define NUM(k) json_integer_value(json_object_get(x, k))
			json_array_append_new(
				j, json_pack("{s:o, s:I, s:I, s:f, s:I, s:I, s:I, s:I}", "timestamp", rfc3339(t),
					     "timestampUnix", (json_int_t)(t / 1000), "cpuCount", (json_int_t)NUM("cpu_count"),
					     "cpuUsedPct", json_number_value(json_object_get(x, "cpu_used_pct")), "memUsed",
					     (json_int_t)NUM("mem_used"), "memTotal", (json_int_t)NUM("mem_total"), "diskUsed",
					     (json_int_t)NUM("disk_used"), "diskTotal", (json_int_t)NUM("disk_total")));
#undef NUM
		}
	}
	json_decref(m);
	return reply_json(req->conn, MHD_HTTP_OK, j);
}

/* ---- fork and snapshots (docs/e2b.md "Fork and snapshots") ---- */

/* POST /e2b/sandboxes/{id}/fork {timeout, count}: 201 with one entry per
 * child, {"sandbox": create's answer} or {"error": {"code": status,
 * "message"}}. */
static enum MHD_Result h_fork(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	struct sessions *ss = c->ss;
	struct kiln_err err = { .code = "" };
	struct api_session_request child;
	enum MHD_Result ret;
	json_t *b, *v, *ids, *errors, *out, *x;
	long count = 1, t;
	int64_t stop_ms;
	struct quota q;
	char body[160];
	size_t i;

	if (!find(c, req, &ret))
		return ret;
	if (!(b = body_object(c->r, &ret)))
		return ret;
	v = json_object_get(b, "count");
	if (v && !json_is_null(v)) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > SESSIONS_FORK_MAX) {
			json_decref(b);
			return bad_request(req->conn, "count: an integer from 1 to 20");
		}
		count = (long)json_integer_value(v);
	}
	/* E2B's default lifetime of a fork (its API's SandboxForkRequest). */
	t = e2b_timeout_of(b, E2B_FORK_DEFAULT_TIMEOUT_S);
	json_decref(b);
	if (t < 0)
		return bad_request(req->conn, "timeout: an integer from 0 to 86400 (seconds)");
	if (store_customer_quota(ss->st, c->cur.customer, &q) < 0)
		quota_defaults(&q);
	snprintf(body, sizeof(body), "{\"snapshot\":\"snap_000000000000000000000000\",\"idle_timeout_s\":%ld,"
		 "\"max_lifetime_s\":%ld}", t, t);
	if (api_session_request_parse(body, strlen(body), q.allow_egress, &child, &err) < 0)
		return reply_e2b_error(req->conn, kiln_err_status(err.errc), err.message, NULL, NULL);
	ids = json_array();
	errors = json_array();
	{
		/* The children are E2B sandboxes as their parent is: its template
		 * name, autoPause and flags (its envVars are in the spec). */
		struct sessions_e2b_new e = {
			.template = c->cur.e2b_template[0] ? c->cur.e2b_template : "base", .auto_pause = c->cur.auto_pause,
			.flags = (c->cur.private_traffic ? STORE_E2B_PRIVATE : 0) | (c->cur.auto_resume ? STORE_E2B_AUTO_RESUME : 0),
		};

		if (!sessions_fork_run(ss, c->r, &c->cur, (unsigned)count, &child, &e, ids, errors, &stop_ms, &ret)) {
			api_session_request_free(&child);
			json_decref(ids);
			json_decref(errors);
			return ret;
		}
	}
	api_session_request_free(&child);
	out = json_array();
	json_array_foreach(ids, i, x) {
		json_t *j = created_json(ss, json_string_value(x));

		if (j)
			json_array_append_new(out, json_pack("{s:o}", "sandbox", j));
	}
	json_array_foreach(errors, i, x)
		json_array_append_new(out, json_pack("{s:{s:O, s:O}}", "error", "code", json_object_get(x, "status"),
						     "message", json_object_get(x, "message")));
	json_decref(ids);
	json_decref(errors);
	return reply_json(req->conn, MHD_HTTP_CREATED, out);
}

/* E2B's SnapshotInfo of a snapshot's public JSON. */
static json_t *snapshot_info(json_t *k)
{
	json_t *names = json_array();
	const char *name = json_string_value(json_object_get(k, "name"));

	if (name)
		json_array_append_new(names, json_string(name));
	return json_pack("{s:O, s:o}", "snapshotID", json_object_get(k, "id"), "names", names);
}

/* POST /e2b/sandboxes/{id}/snapshots {name?}: 201 {snapshotID, names} */
static enum MHD_Result h_snapshot(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	enum MHD_Result ret;
	char id[40], name[STORE_SNAPSHOT_NAME_MAX + 1] = "";
	int64_t stop_ms;
	json_t *b, *v, *k;

	if (!find(c, req, &ret))
		return ret;
	if (!(b = body_object(c->r, &ret)))
		return ret;
	v = json_object_get(b, "name");
	if (v && !json_is_null(v)) {
		if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v) ||
		    !sessions_snapshot_name_ok(json_string_value(v))) {
			json_decref(b);
			return bad_request(req->conn, "name: 1-63 characters of A-Z, a-z, 0-9, '.', '_', '-', ':' and '/',"
						      " starting with a letter or digit");
		}
		snprintf(name, sizeof(name), "%s", json_string_value(v));
	}
	json_decref(b);
	if (!sessions_snapshot_take(c->ss, c->r, &c->cur, name[0] ? name : NULL, 0, id, &stop_ms, &ret))
		return ret;
	k = store_snapshot_json(c->ss->st, id, c->cur.customer);
	if (!k)
		return reply_e2b_error(req->conn, 500, "the snapshot cannot be read back", NULL, NULL);
	ret = reply_json(req->conn, MHD_HTTP_CREATED, snapshot_info(k));
	json_decref(k);
	return ret;
}

/* GET /e2b/snapshots?sandboxID=&name=&limit=&nextToken=: [SnapshotInfo],
 * the next page's token in x-next-token. name may be a snapshot's id. */
static enum MHD_Result h_snapshot_list(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	const char *lim = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "limit");
	const char *tok = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "nextToken");
	const char *sid = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "sandboxID");
	const char *name = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "name");
	struct kiln_err err = { .code = "" };
	long limit = E2B_LIST_MAX;
	char *next = NULL, canon[40];
	enum MHD_Result ret;
	json_t *arr, *out, *k;
	size_t i;

	if (lim) {
		char *end;

		limit = strtol(lim, &end, 10);
		if (!*lim || *end || limit < 1 || limit > E2B_LIST_MAX)
			return bad_request(req->conn, "limit: an integer from 1 to 100");
	}
	if (sid && !sid[0])
		sid = NULL;
	if (sid && strlen(sid) >= 40)
		return bad_request(req->conn, "sandboxID: a sandbox id");
	if (name && !name[0])
		name = NULL;
	out = json_array();
	if (name && store_snapshot_id_valid(name)) {
		/* By its id: that one, if it is the caller's (and the sandbox's). */
		k = store_snapshot_json(c->ss->st, name, c->r->customer);
		if (k && (!sid || !strcmp(store_session_id_canon(sid, canon), json_string_value(json_object_get(k, "session_id")) ?: "")))
			json_array_append_new(out, snapshot_info(k));
		json_decref(k);
		return reply_json(req->conn, MHD_HTTP_OK, out);
	}
	if (name && !sessions_snapshot_name_ok(name)) {
		json_decref(out);
		return bad_request(req->conn, "name: a snapshot's name or id");
	}
	arr = store_snapshot_list(c->ss->st, c->r->customer, name, sid ? store_session_id_canon(sid, canon) : NULL,
				  (unsigned)limit, tok && tok[0] ? tok : NULL, &next, &err);
	if (!arr) {
		json_decref(out);
		return reply_e2b_error(req->conn, err.errc == KERR_INVALID_REQUEST ? 400 : 500, err.message, NULL, NULL);
	}
	json_array_foreach(arr, i, k)
		json_array_append_new(out, snapshot_info(k));
	json_decref(arr);
	ret = reply_json_h(req->conn, MHD_HTTP_OK, out, next ? "x-next-token" : NULL, next);
	free(next);
	return ret;
}

/* DELETE /e2b/snapshots/{id}, and DELETE /e2b/templates/{id} (the SDK's
 * deleteSnapshot: E2B's snapshots are templates) for a snapshot's id:
 * 204, or 404 (the SDK's false). */
static enum MHD_Result h_snapshot_delete(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	char msg[128];
	int m = sessions_snapshot_delete(c->ss, req->param[0], c->r->customer);

	if (m < 0)
		return reply_e2b_error(req->conn, 500, "cannot delete the snapshot", NULL, NULL);
	if (m == 0) {
		snprintf(msg, sizeof(msg), "snapshot %.40s not found", req->param[0]);
		return reply_e2b_error(req->conn, MHD_HTTP_NOT_FOUND, msg, NULL, NULL);
	}
	return reply_bytes(req->conn, MHD_HTTP_NO_CONTENT, NULL, 0, NULL);
}

/* ---- volumes (docs/e2b.md "Volumes") ---- */

/* E2B's VolumeAndToken of a volume: the SDK takes a null token and domain
 * as "use your own configuration" (the /volumecontent file API is not
 * kiln's: mount the volume in a sandbox instead). */
static json_t *volume_info(const struct store_volume *v, int with_token)
{
	json_t *j = json_pack("{s:s, s:s}", "volumeID", v->id, "name", v->name);

	if (j && with_token) {
		json_object_set_new(j, "token", json_null());
		json_object_set_new(j, "domain", json_null());
	}
	return j;
}

/* POST /e2b/volumes {name}: 201 {volumeID, name, token, domain} */
static enum MHD_Result h_volume_create(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	struct store_volume v;
	enum MHD_Result ret;
	char name[STORE_VOLUME_NAME_MAX + 1];
	json_t *b, *n;

	if (!(b = body_object(c->r, &ret)))
		return ret;
	n = json_object_get(b, "name");
	if (!json_is_string(n) || strlen(json_string_value(n)) != json_string_length(n) ||
	    json_string_length(n) > STORE_VOLUME_NAME_MAX) {
		json_decref(b);
		return bad_request(req->conn, "name: 1-63 characters of A-Z, a-z, 0-9, '.', '_' and '-' (required)");
	}
	snprintf(name, sizeof(name), "%s", json_string_value(n));
	json_decref(b);
	if (!sessions_volume_create(c->ss, c->r, name, SESSIONS_VOLUME_MIB_DEFAULT, &v, &ret))
		return ret;
	return reply_json(req->conn, MHD_HTTP_CREATED, volume_info(&v, 1));
}

/* GET /e2b/volumes: [{volumeID, name}] */
static enum MHD_Result h_volume_list(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	json_t *arr = store_volume_list(c->ss->st, c->r->customer, NULL), *out, *x;
	size_t i;

	if (!arr)
		return reply_e2b_error(req->conn, 500, "cannot list the volumes", NULL, NULL);
	out = json_array();
	json_array_foreach(arr, i, x)
		json_array_append_new(out, json_pack("{s:O, s:O}", "volumeID", json_object_get(x, "id"), "name",
						     json_object_get(x, "name")));
	json_decref(arr);
	return reply_json(req->conn, MHD_HTTP_OK, out);
}

/* The caller's volume {id} (its id, or else its name): 1, or 0 with 404. */
static int volume_find(struct e2b_call *c, struct httpd_req *req, struct store_volume *v, enum MHD_Result *ret)
{
	char msg[128];

	if (store_volume_get(c->ss->st, req->param[0], c->r->customer, v) == 0)
		return 1;
	snprintf(msg, sizeof(msg), "volume %.64s not found", req->param[0]);
	*ret = reply_e2b_error(req->conn, MHD_HTTP_NOT_FOUND, msg, NULL, NULL);
	return 0;
}

/* GET /e2b/volumes/{volumeID}: {volumeID, name, token, domain} */
static enum MHD_Result h_volume_get(void *ctx, struct httpd_req *req)
{
	struct store_volume v;
	enum MHD_Result ret;

	if (!volume_find(ctx, req, &v, &ret))
		return ret;
	return reply_json(req->conn, MHD_HTTP_OK, volume_info(&v, 1));
}

/* DELETE /e2b/volumes/{volumeID}: 204; 404; 409 while a sandbox mounts it */
static enum MHD_Result h_volume_delete(void *ctx, struct httpd_req *req)
{
	struct e2b_call *c = ctx;
	struct store_volume v;
	enum MHD_Result ret;

	if (!volume_find(c, req, &v, &ret))
		return ret;
	if (!sessions_volume_delete(c->ss, c->r, &v, &ret))
		return ret;
	return reply_bytes(req->conn, MHD_HTTP_NO_CONTENT, NULL, 0, NULL);
}

static const struct httpd_route e2b_routes[] = {
	{ "POST", "/e2b/v2/sandboxes", h_create },
	{ "GET", "/e2b/v2/sandboxes", h_list_v2 },
	{ "POST", "/e2b/sandboxes", h_create },
	{ "GET", "/e2b/sandboxes", h_list },
	{ "GET", "/e2b/sandboxes/{id}", h_get },
	{ "DELETE", "/e2b/sandboxes/{id}", h_kill },
	{ "POST", "/e2b/sandboxes/{id}/timeout", h_timeout },
	{ "POST", "/e2b/sandboxes/{id}/pause", h_pause },
	{ "POST", "/e2b/v2/sandboxes/{id}/connect", h_connect },
	{ "POST", "/e2b/sandboxes/{id}/connect", h_connect }, /* older SDKs' path */
	{ "GET", "/e2b/sandboxes/{id}/metrics", h_metrics },
	{ "PUT", "/e2b/sandboxes/{id}/network", h_network },
	{ "POST", "/e2b/sandboxes/{id}/fork", h_fork },
	{ "POST", "/e2b/sandboxes/{id}/snapshots", h_snapshot },
	{ "GET", "/e2b/snapshots", h_snapshot_list },
	{ "DELETE", "/e2b/snapshots/{id}", h_snapshot_delete },
	{ "DELETE", "/e2b/templates/{id}", h_snapshot_delete },
	{ "POST", "/e2b/volumes", h_volume_create },
	{ "GET", "/e2b/volumes", h_volume_list },
	{ "GET", "/e2b/volumes/{id}", h_volume_get },
	{ "DELETE", "/e2b/volumes/{id}", h_volume_delete },
};

static const struct httpd_routes e2b_table = {
	e2b_routes, sizeof(e2b_routes) / sizeof(e2b_routes[0]), "no such endpoint", ", ",
};

enum MHD_Result e2b_handle(struct sessions *ss, const struct sessions_request *r)
{
	struct e2b_call c = { .ss = ss, .r = r };
	struct httpd_req req = { .conn = r->conn, .method = r->method };
	char url[sizeof(req.path_)];
	enum MHD_Result ret;

	if (r->admin)
		ret = reply_e2b_error(r->conn, MHD_HTTP_FORBIDDEN,
				      "an admin key cannot use the E2B API: use a customer key", NULL, NULL);
	else if ((size_t)snprintf(url, sizeof(url), "/e2b%s", r->path) >= sizeof(url))
		ret = reply_e2b_error(r->conn, MHD_HTTP_NOT_FOUND, "no such endpoint", NULL, NULL);
	else {
		const struct httpd_route *row;
		char allow[64];

		req.url = url;
		switch (httpd_route_match(&e2b_table, r->method, url, &req, &row, allow, sizeof(allow))) {
		case HTTPD_MATCH:
			ret = row->handler(&c, &req);
			break;
		case HTTPD_NOT_ALLOWED:
			ret = reply_e2b_error(r->conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed", "Allow", allow);
			break;
		default:
			/* E2B's volume file API (the SDK's Volume.readFile, writeFile, …). */
			if (!strncmp(url, "/e2b/volumecontent/", 19) || !strcmp(url, "/e2b/volumecontent"))
				ret = reply_e2b_error(r->conn, MHD_HTTP_NOT_FOUND,
						      "kiln has no volume content API (/volumecontent): mount the volume"
						      " in a sandbox (volumeMounts) and use the sandbox's files API",
						      NULL, NULL);
			else
				ret = reply_e2b_error(r->conn, MHD_HTTP_NOT_FOUND, "no such endpoint", NULL, NULL);
		}
	}
	sessions_release(ss);
	return ret;
}
