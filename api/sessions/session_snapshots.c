/* session_snapshots: named snapshots and forks of running sessions
 * (docs/api.md "Snapshots" and "Fork"), for kiln's endpoints and E2B's
 * (e2b.c) alike. A snapshot is taken by the session's host (POST
 * /v1/sessions/{id}/checkpoint: the VM stops only while its pages are
 * read) into S3 under CUSTOMER/snapshots/ID/, then recorded in the store
 * under the customer's snapshot quotas; nothing is recorded when the host
 * fails, and what it may have written is deleted. New sessions start from
 * one through sessions_create_run (session_run.c). A fork is a hidden
 * snapshot, `count` sessions started from it together, a thread each (each admitted as
 * any create is), then the snapshot deleted: its objects go once the last
 * of those sessions is destroyed (sessions_snapshot_release,
 * session_core.c; the reaper retries what a host could not delete). */
#include "sessions_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "httpd.h"
#include "reply.h"

/* ---- taking one ---- */

/* Delete what a snapshot that is not recorded may have left in S3 (its
 * host failed or the quota refused it). When the host cannot do it now,
 * a hidden row marked deleted is left for the reaper to retry. */
static void discard_objects(struct sessions *ss, const char *url, const char *id, const struct store_session *cur)
{
	struct kiln_err err = { .code = "" };
	char path[200];
	int st;

	snprintf(path, sizeof(path), "/v1/snapshots/%s?customer=%s", id, cur->customer);
	st = sessions_host_call(ss, url, "DELETE", path, NULL, 60000, NULL, &err);
	if (st == 200)
		return;
	{
		struct store_snapshot_new n = {
			.id = id, .customer = cur->customer, .session_id = cur->id, .kind = "fork",
			.host_id = cur->host_id, .spec_json = "{}", .vcpus = cur->vcpus, .memory_mib = cur->memory_mib,
		};

		if (store_snapshot_create(ss->st, &n, &err) < 0 || store_snapshot_mark_deleted(ss->st, id, NULL) != 1)
			fprintf(stderr, "kiln-api: snapshot %s: its objects may be left in S3: %s\n", id, err.message);
	}
}

int sessions_snapshot_take(struct sessions *ss, const struct sessions_request *r, const struct store_session *cur,
			   const char *name, int fork, char id[40], int64_t *stop_ms, enum MHD_Result *ret)
{
	struct kiln_err err = { .code = "" };
	struct hostclient_reply hr;
	struct quota q;
	char url[256], path[96], msg[200], *text, *spec;
	json_t *body, *reply, *snap;
	int hs, cr;

	id[0] = '\0';
	*stop_ms = 0;
	if (cur->state != SESSION_RUNNING) {
		if (cur->state == SESSION_PAUSED)
			snprintf(msg, sizeof(msg), "the session is paused: resume it first (POST /v1/sessions/%s/resume)",
				 cur->id);
		else
			snprintf(msg, sizeof(msg), "the session is %s: only a running session can be %s",
				 session_state_name(cur->state), fork ? "forked" : "snapshotted");
		*ret = sessions_answer(r, 0, KERR_NOT_RUNNING, msg, NULL, NULL);
		return 0;
	}
	{
		/* A read-write volume: its copies would be a second writer
		 * (kiln-host refuses too; this spares the host the request). */
		struct store_volume_mount m[STORE_SESSION_VOLUMES_MAX];
		int n = store_session_volumes(ss->st, cur->id, m, STORE_SESSION_VOLUMES_MAX);

		for (int i = 0; i < n; i++)
			if (!m[i].read_only) {
				snprintf(msg, sizeof(msg),
					 "the session mounts volume %s read-write at %s: a %s would be a second writer"
					 " (mount it read-only to %s)",
					 m[i].name[0] ? m[i].name : m[i].volume_id, m[i].path, fork ? "fork" : "snapshot",
					 fork ? "fork" : "snapshot");
				*ret = sessions_answer(r, 0, KERR_VOLUME_ATTACHED, msg, NULL, NULL);
				return 0;
			}
	}
	hs = sched_host_state(ss->sched, cur->host_id, url);
	if (hs != 1) {
		snprintf(msg, sizeof(msg), "the session's host cannot be reached: %s",
			 hs == 0 ? "it is lost" : "it has not been heard from yet");
		*ret = sessions_answer(r, 0, KERR_HOST_UNAVAILABLE, msg, "Retry-After", RETRY_AFTER_S);
		return 0;
	}
	if (store_customer_quota(ss->st, cur->customer, &q) < 0)
		quota_defaults(&q);
	if (!fork && q.max_snapshots) {
		/* The count before the host works for nothing (checked again,
		 * with the bytes, when the row goes in). */
		unsigned count;
		uint64_t bytes;

		if (store_snapshot_usage(ss->st, cur->customer, &count, &bytes) < 0) {
			*ret = sessions_answer(r, 0, KERR_STORE_ERROR, "cannot read the snapshots' usage", NULL, NULL);
			return 0;
		}
		if (count >= q.max_snapshots) {
			snprintf(msg, sizeof(msg),
				 "max_snapshots: you have %u snapshots, your quota's limit is %u (DELETE one first)", count,
				 q.max_snapshots);
			*ret = sessions_answer(r, 0, KERR_QUOTA_EXCEEDED, msg, NULL, NULL);
			return 0;
		}
	}
	if (store_snapshot_new_id(id) < 0) {
		*ret = sessions_answer(r, 0, KERR_INTERNAL, "no randomness", NULL, NULL);
		return 0;
	}
	/* A fork's: its host keeps a copy of the RAM that the children it
	 * starts share copy-on-write. */
	body = json_pack("{s:s, s:s, s:b}", "customer", cur->customer, "snapshot", id, "fork", fork);
	text = body ? json_dumps(body, JSON_COMPACT) : NULL;
	json_decref(body);
	if (!text) {
		*ret = sessions_answer(r, 0, KERR_INTERNAL, "out of memory", NULL, NULL);
		return 0;
	}
	snprintf(path, sizeof(path), "/v1/sessions/%s/checkpoint", cur->id);
	/* A request in flight: the reaper leaves the session alone meanwhile. */
	sessions_op_enter_touch(ss, cur->id);
	sessions_host_raw(ss, url, "POST", path, text, strlen(text), "application/json", SNAPSHOT_TIMEOUT_MS, 1u << 20,
			  &hr, &err);
	sessions_op_leave_touch(ss, cur->id);
	free(text);
	if (hr.status != 200) {
		if (hr.status < 0) {
			discard_objects(ss, url, id, cur);
			*ret = sessions_answer(r, MHD_HTTP_SERVICE_UNAVAILABLE, KERR_HOST_UNAVAILABLE, err.message,
					       "Retry-After", RETRY_AFTER_S);
		} else if (hr.status == 404 && sessions_host_lacks(ss, url, cur->id)) {
			sessions_vm_lost(ss, cur->id, SESSION_RUNNING);
			*ret = sessions_answer(r, 0, KERR_NOT_RUNNING,
					       "the session's VM is gone from its host: the session is error/vm_lost", NULL,
					       NULL);
		} else {
			char code[64], m[256];

			discard_objects(ss, url, id, cur);
			fprintf(stderr, "kiln-api: session %s: its host could not take snapshot %s: HTTP %d %s: %s\n",
				cur->id, id, hr.status, sessions_host_error_code(&hr, code, sizeof(code)),
				sessions_host_error_message(&hr, m, sizeof(m)));
			*ret = sessions_relay_to(r, r->conn, &hr);
		}
		hostclient_reply_free(&hr);
		id[0] = '\0';
		return 0;
	}
	reply = json_loadb(hr.body ? hr.body : "", hr.len, 0, NULL);
	hostclient_reply_free(&hr);
	snap = json_object_get(reply, "snapshot");
	*stop_ms = json_integer_value(json_object_get(snap, "stop_ms"));
	/* Sessions started from it get the spec kiln-api holds (egress rules
	 * changed since its create are in it), else the one its host ran. */
	spec = store_session_spec(ss->st, cur->id);
	if (!spec && json_is_object(json_object_get(snap, "spec")))
		spec = json_dumps(json_object_get(snap, "spec"), JSON_COMPACT);
	{
		json_int_t b = json_integer_value(json_object_get(snap, "bytes"));
		struct store_snapshot_new n = {
			.id = id, .customer = cur->customer, .name = name, .session_id = cur->id,
			.kind = fork ? "fork" : "named", .host_id = cur->host_id, .spec_json = spec ? spec : "{}",
			.vcpus = cur->vcpus, .memory_mib = cur->memory_mib, .egress = cur->egress,
			.bytes = b > 0 ? (uint64_t)b : 0, .stop_ms = *stop_ms, .max_snapshots = q.max_snapshots,
			.max_snapshot_mib = q.max_snapshot_mib,
		};

		cr = store_snapshot_create(ss->st, &n, &err);
	}
	free(spec);
	json_decref(reply);
	if (cr < 0) {
		discard_objects(ss, url, id, cur);
		id[0] = '\0';
		*ret = sessions_answer_err(r, cr == -EDQUOT ? MHD_HTTP_TOO_MANY_REQUESTS : MHD_HTTP_INTERNAL_SERVER_ERROR,
					   &err, NULL, NULL);
		return 0;
	}
	fprintf(stderr, "kiln-api: session %s of %s: %s %s taken on %s (stopped %lld ms)\n", cur->id, cur->customer,
		fork ? "fork snapshot" : "snapshot", id, cur->host_id, (long long)*stop_ms);
	return 1;
}

/* ---- fork ---- */

#define FORK_SNAPSHOT_WAIT_MS 120000

/* One child of a fork, started on a thread of its own: the children of a
 * fork start together (their hosts load them in parallel). */
struct fork_child {
	struct sessions *ss;
	struct sessions_request rc;
	struct sessions_capture cap;
	const struct store_session *cur;
	const struct api_session_request *child;
	const struct sessions_e2b_new *e2b;
	char id[40];
	int ok;
	pthread_t th;
	int started;
};

static void *fork_child_run(void *arg)
{
	struct fork_child *c = arg;
	enum MHD_Result ignored;
	struct quota q;

	c->rc.capture = &c->cap;
	/* Each child is admitted as any create is (rate, running quota):
	 * the store checks the quota again in the insert's transaction, so
	 * children starting together cannot pass it. */
	if (store_customer_quota(c->ss->st, c->cur->customer, &q) < 0)
		quota_defaults(&q);
	c->ok = sessions_create_run(c->ss, &c->rc, &q, c->child, c->e2b, c->id, &ignored);
	return NULL;
}

int sessions_fork_run(struct sessions *ss, const struct sessions_request *r, const struct store_session *cur,
		      unsigned count, struct api_session_request *child, const struct sessions_e2b_new *e2b,
		      json_t *ids, json_t *errors, int64_t *stop_ms, enum MHD_Result *ret)
{
	struct fork_child *kids;
	char snap[40];

	if (!(kids = calloc(count ? count : 1, sizeof(*kids)))) {
		*ret = sessions_answer(r, 0, KERR_INTERNAL, "out of memory", NULL, NULL);
		return 0;
	}
	if (!sessions_snapshot_take(ss, r, cur, NULL, 1, snap, stop_ms, ret)) {
		free(kids);
		return 0;
	}
	snprintf(child->snapshot, sizeof(child->snapshot), "%s", snap);
	/* Its host answers once the children there can start; the chunks
	 * reach S3 after, and a child on another host waits for them. */
	child->snapshot_wait_ms = FORK_SNAPSHOT_WAIT_MS;
	for (unsigned i = 0; i < count; i++) {
		kids[i] = (struct fork_child){ .ss = ss, .rc = *r, .cur = cur, .child = child, .e2b = e2b };
		kids[i].started = pthread_create(&kids[i].th, NULL, fork_child_run, &kids[i]) == 0;
		if (!kids[i].started)
			fork_child_run(&kids[i]);
	}
	for (unsigned i = 0; i < count; i++) {
		struct fork_child *c = &kids[i];

		if (c->started)
			pthread_join(c->th, NULL);
		if (c->ok)
			json_array_append_new(ids, json_string(c->id));
		else
			json_array_append_new(errors, json_pack("{s:i, s:s, s:s}", "status", (int)c->cap.status, "code",
								c->cap.err.code[0] ? c->cap.err.code : "internal",
								"message", c->cap.err.message));
	}
	free(kids);
	/* The fork's snapshot is its children's only: gone for everyone now,
	 * its objects once the last child is destroyed (at once if none started). */
	store_snapshot_mark_deleted(ss->st, snap, NULL);
	sessions_snapshot_release(ss, snap);
	return 1;
}

/* ---- kiln's endpoints ---- */

/* The body as a JSON object (empty: {}), with only the keys allowed: NULL
 * with 400 answered. */
static json_t *body_object(const struct sessions_request *r, const char *const *keys, enum MHD_Result *ret)
{
	json_error_t je;
	const char *k;
	json_t *j, *v;

	if (!r->body || !r->len)
		return json_object();
	if (r->len > API_SESSION_BODY_MAX) {
		*ret = sessions_answer(r, 0, KERR_TOO_LARGE, "the body is too large", NULL, NULL);
		return NULL;
	}
	j = json_loadb(r->body, r->len, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(j)) {
		char msg[256];

		snprintf(msg, sizeof(msg), "the body is not a JSON object%s%.160s", j ? "" : ": ", j ? "" : je.text);
		json_decref(j);
		*ret = sessions_answer(r, 0, j ? KERR_INVALID_REQUEST : KERR_INVALID_JSON, msg, NULL, NULL);
		return NULL;
	}
	json_object_foreach(j, k, v) {
		const char *const *a = keys;
		char msg[128];

		while (*a && strcmp(*a, k))
			a++;
		if (*a)
			continue;
		snprintf(msg, sizeof(msg), "%.64s: unknown field", k);
		for (char *p = msg; *p; p++)
			if ((unsigned char)*p < 0x20 || *p == 0x7f)
				*p = '?';
		json_decref(j);
		*ret = sessions_answer(r, 0, KERR_INVALID_REQUEST, msg, NULL, NULL);
		return NULL;
	}
	return j;
}

int sessions_snapshot_name_ok(const char *name)
{
	size_t n = name ? strlen(name) : 0;

	if (n < 1 || n > STORE_SNAPSHOT_NAME_MAX)
		return 0;
	if (!((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= 'A' && name[0] <= 'Z') || (name[0] >= '0' && name[0] <= '9')))
		return 0;
	return strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:/") == n;
}

#define NAME_RULE "1-63 characters of A-Z, a-z, 0-9, '.', '_', '-', ':' and '/', starting with a letter or digit"

enum MHD_Result sessions_rt_snapshot(struct sessions *ss, const struct sessions_request *r,
				     const struct store_session *cur)
{
	static const char *const keys[] = { "name", NULL };
	enum MHD_Result ret;
	char id[40], name[STORE_SNAPSHOT_NAME_MAX + 1] = "";
	int64_t stop_ms;
	json_t *b, *v, *j;

	if (r->admin)
		return reply_error(r->conn, KERR_FORBIDDEN, "an admin key cannot take snapshots: use a customer key");
	if (!(b = body_object(r, keys, &ret)))
		return ret;
	v = json_object_get(b, "name");
	if (v && !json_is_null(v)) {
		if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v) ||
		    !sessions_snapshot_name_ok(json_string_value(v))) {
			json_decref(b);
			return reply_error(r->conn, KERR_INVALID_REQUEST, "name: " NAME_RULE);
		}
		snprintf(name, sizeof(name), "%s", json_string_value(v));
	}
	json_decref(b);
	if (!sessions_snapshot_take(ss, r, cur, name[0] ? name : NULL, 0, id, &stop_ms, &ret))
		return ret;
	j = store_snapshot_json(ss->st, id, cur->customer);
	return j ? reply_json(r->conn, MHD_HTTP_CREATED, j) : reply_internal(r->conn, "the snapshot cannot be read back");
}

enum MHD_Result sessions_rt_fork(struct sessions *ss, const struct sessions_request *r, const struct store_session *cur)
{
	static const char *const keys[] = { "count", "idle_timeout_s", "max_lifetime_s", "metadata", NULL };
	struct kiln_err err = { .code = "" };
	struct api_session_request child;
	enum MHD_Result ret;
	json_t *b, *v, *ids, *errors, *sessions, *id;
	json_int_t count = 1;
	int64_t stop_ms;
	struct quota q;
	char *text;
	size_t i;
	int pr;

	if (r->admin)
		return reply_error(r->conn, KERR_FORBIDDEN, "an admin key cannot fork sessions: use a customer key");
	if (!(b = body_object(r, keys, &ret)))
		return ret;
	v = json_object_get(b, "count");
	if (v) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > SESSIONS_FORK_MAX) {
			json_decref(b);
			return reply_error(r->conn, KERR_INVALID_REQUEST, "count: an integer from 1 to 20");
		}
		count = json_integer_value(v);
		json_object_del(b, "count");
	}
	/* The children's request, checked as a create from a snapshot is
	 * (the snapshot's id is the fork's, known once it is taken); their
	 * limits are the parent's unless given. */
	if (!json_object_get(b, "idle_timeout_s"))
		json_object_set_new(b, "idle_timeout_s", json_integer(cur->idle_timeout_s));
	if (!json_object_get(b, "max_lifetime_s"))
		json_object_set_new(b, "max_lifetime_s", json_integer(cur->max_lifetime_s));
	json_object_set_new(b, "snapshot", json_string("snap_000000000000000000000000"));
	text = json_dumps(b, JSON_COMPACT);
	json_decref(b);
	if (store_customer_quota(ss->st, cur->customer, &q) < 0)
		quota_defaults(&q);
	pr = text ? api_session_request_parse(text, strlen(text), q.allow_egress, &child, &err)
		  : kiln_err_set(&err, KERR_INTERNAL, "out of memory");
	free(text);
	if (pr < 0)
		return reply_err(r->conn, &err);
	ids = json_array();
	errors = json_array();
	if (!sessions_fork_run(ss, r, cur, (unsigned)count, &child, NULL, ids, errors, &stop_ms, &ret)) {
		api_session_request_free(&child);
		json_decref(ids);
		json_decref(errors);
		return ret;
	}
	api_session_request_free(&child);
	sessions = json_array();
	json_array_foreach(ids, i, id) {
		json_t *sj = store_session_json(ss->st, json_string_value(id), NULL);

		if (sj)
			json_array_append_new(sessions, sj);
	}
	json_decref(ids);
	/* Refusals in kiln's error shape ({"code","message"}) with their status. */
	return reply_json(r->conn, MHD_HTTP_OK,
			  json_pack("{s:s, s:I, s:o, s:o}", "parent", cur->id, "stop_ms", (json_int_t)stop_ms, "sessions",
				    sessions, "errors", errors));
}

/* ---- /v1/snapshots ---- */

struct snap_call {
	struct sessions *ss;
	const struct sessions_request *r;
};

/* GET /v1/snapshots?name=&session_id=&limit=&after= */
static enum MHD_Result snap_list(void *ctx, struct httpd_req *req)
{
	struct snap_call *c = ctx;
	const char *name = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "name");
	const char *sid = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "session_id");
	const char *lim = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "limit");
	const char *after = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "after");
	struct kiln_err err = { .code = "" };
	long limit = 20;
	char *next = NULL, canon[40];
	json_t *arr;

	if (lim) {
		char *end;

		limit = strtol(lim, &end, 10);
		if (!*lim || *end || limit < 1 || limit > 100 || lim[0] == '+' || lim[0] == ' ')
			return reply_error(req->conn, KERR_INVALID_REQUEST, "limit: an integer from 1 to 100");
	}
	if (name && !sessions_snapshot_name_ok(name))
		return reply_error(req->conn, KERR_INVALID_REQUEST, "name: " NAME_RULE);
	if (sid && (!sid[0] || strlen(sid) >= 40))
		return reply_error(req->conn, KERR_INVALID_REQUEST, "session_id: a session id");
	if (after && !after[0])
		after = NULL;
	arr = store_snapshot_list(c->ss->st, c->r->customer, name, sid ? store_session_id_canon(sid, canon) : NULL,
				  (unsigned)limit, after, &next, &err);
	if (!arr)
		return reply_err(req->conn, &err);
	{
		json_t *j = json_pack("{s:o, s:s?}", "snapshots", arr, "next", next);

		free(next);
		return reply_json(req->conn, MHD_HTTP_OK, j);
	}
}

/* GET /v1/snapshots/{id} */
static enum MHD_Result snap_get(void *ctx, struct httpd_req *req)
{
	struct snap_call *c = ctx;
	json_t *j = store_snapshot_json(c->ss->st, req->param[0], c->r->customer);

	return j ? reply_json(req->conn, MHD_HTTP_OK, j) : reply_not_found(req->conn, "no such snapshot");
}

int sessions_snapshot_delete(struct sessions *ss, const char *id, const char *customer)
{
	int m;

	if (!store_snapshot_id_valid(id))
		return 0;
	m = store_snapshot_mark_deleted(ss->st, id, customer);
	if (m == 1)
		/* Its objects now if no session started from it is left; else
		 * once the last one is destroyed (or the reaper's retry). */
		sessions_snapshot_release(ss, id);
	return m;
}

/* DELETE /v1/snapshots/{id} */
static enum MHD_Result snap_delete(void *ctx, struct httpd_req *req)
{
	struct snap_call *c = ctx;
	int m = sessions_snapshot_delete(c->ss, req->param[0], c->r->customer);

	if (m < 0)
		return reply_error(req->conn, KERR_STORE_ERROR, "cannot delete the snapshot");
	if (m == 0)
		return reply_not_found(req->conn, "no such snapshot");
	return reply_json(req->conn, MHD_HTTP_OK, json_pack("{s:s, s:b}", "id", req->param[0], "deleted", 1));
}

static const struct httpd_route snapshot_routes[] = {
	{ "GET", "/v1/snapshots", snap_list },
	{ "GET", "/v1/snapshots/{id}", snap_get },
	{ "DELETE", "/v1/snapshots/{id}", snap_delete },
};

static const struct httpd_routes snapshot_table = {
	snapshot_routes, sizeof(snapshot_routes) / sizeof(snapshot_routes[0]), "no such endpoint", ", ",
};

enum MHD_Result sessions_snapshots_handle(struct sessions *ss, const struct sessions_request *r)
{
	struct snap_call c = { .ss = ss, .r = r };
	struct httpd_req req = { .conn = r->conn, .method = r->method };
	char url[sizeof(req.path_)];
	enum MHD_Result ret;

	if (r->admin)
		ret = reply_error(r->conn, KERR_FORBIDDEN, "snapshots are a customer's: use a customer key");
	else if ((size_t)snprintf(url, sizeof(url), "/v1/snapshots%s", r->path) >= sizeof(url))
		ret = reply_not_found(r->conn, "no such endpoint");
	else {
		req.url = url;
		ret = httpd_dispatch(&snapshot_table, &c, &req);
	}
	sessions_release(ss);
	return ret;
}

/* ---- the reaper's retry ---- */

void sessions_snapshots_gc(struct sessions *ss)
{
	struct store_snapshot del[64];
	int n = store_snapshots_deleted(ss->st, del, 64);

	for (int i = 0; i < n; i++) {
		int stopping;

		/* Each may wait for a host: a stop does not wait for them all. */
		pthread_mutex_lock(&ss->lock);
		stopping = ss->stopping;
		pthread_mutex_unlock(&ss->lock);
		if (stopping)
			break;
		sessions_snapshot_release(ss, del[i].id);
	}
}
