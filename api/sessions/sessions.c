/* sessions: the /v1/sessions endpoints (see sessions.h, docs/api.md
 * "Sessions"): quotas checked, the session placed (session_place.c), its row
 * kept in the store, and exec, files, input, pause, resume and outputs
 * proxied to its host. What they share with the reaper (requests in flight,
 * pause, destroy) is in session_core.c, the rules of state changes there
 * too. Create and resume (admission, template, placement: shared with
 * e2b.c) are in session_run.c, the answers in session_reply.c. */
#include "sessions_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/crypto.h>

#include "base/base.h"
#include "buf.h"
#include "httpd.h"
#include "reply.h"
#include "s3.h"
#include "templates/templates.h"

/* ---- endpoints ---- */

/* One request being routed: every handler's ctx. */
struct call {
	struct sessions *ss;
	const struct sessions_request *r;
	struct store_session cur;    /* the session the path names (under /v1/sessions/{id}) */
};

/* An operation on a session other than reading or deleting it. */
static enum MHD_Result admin_refused(struct MHD_Connection *conn)
{
	return reply_error(conn, KERR_FORBIDDEN, "an admin key may only list, read and delete sessions");
}

static enum MHD_Result reply_session(struct sessions *ss, struct MHD_Connection *conn, unsigned status,
				     const char *id)
{
	json_t *j = store_session_json(ss->st, id, NULL);

	return j ? reply_json(conn, status, j) : reply_internal(conn, "the session cannot be read back");
}

static enum MHD_Result reply_outcome(struct sessions *ss, struct MHD_Connection *conn, const char *id,
				     const struct sessions_outcome *o)
{
	if (o->status == 200)
		return reply_session(ss, conn, MHD_HTTP_OK, id);
	if (o->status == 503)
		return reply_err_status_h(conn, o->status, &o->err, "Retry-After", RETRY_AFTER_S);
	return reply_err_status(conn, o->status, &o->err);
}

/* POST /v1/sessions */
static enum MHD_Result handle_create(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct sessions *ss = c->ss;
	const struct sessions_request *r = c->r;
	struct kiln_err err = { .code = "" };
	struct api_session_request sr;
	struct quota q;
	char id[40];
	enum MHD_Result ret;

	if (r->admin)
		return reply_error(r->conn, KERR_FORBIDDEN,
				   "an admin key cannot create sessions: use a customer key");
	if (store_customer_quota(ss->st, r->customer, &q) < 0)
		return reply_error(r->conn, KERR_FORBIDDEN, "this key's customer no longer exists");
	if (api_session_request_parse(r->body, r->len, q.allow_egress, &sr, &err) < 0)
		return reply_err(r->conn, &err);
	if (sessions_create_run(ss, r, &q, &sr, NULL, id, &ret))
		ret = reply_session(ss, r->conn, MHD_HTTP_CREATED, id);
	api_session_request_free(&sr);
	return ret;
}

/* GET /v1/sessions */
static enum MHD_Result handle_list(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct sessions *ss = c->ss;
	const struct sessions_request *r = c->r;
	const char *state = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "state");
	const char *cursor = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "cursor");
	const char *lim = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "limit");
	struct kiln_err err = { .code = "" };
	long limit = 20;
	char *next = NULL;
	json_t *arr, *j;

	if (lim) {
		char *end;

		limit = strtol(lim, &end, 10);
		if (!*lim || *end || limit < 1 || limit > 100 || lim[0] == '+' || lim[0] == ' ')
			return reply_error(r->conn, KERR_INVALID_REQUEST, "limit: an integer from 1 to 100");
	}
	if (state && strcmp(state, "all") && session_state_parse(state) == SESSION_STATE_COUNT)
		return reply_error(r->conn, KERR_INVALID_REQUEST,
				   "state: one of starting, running, pausing, paused, resuming, destroyed, error, all");
	arr = store_session_list(ss->st, r->admin ? NULL : r->customer, state, (unsigned)limit, cursor, &next, &err);
	if (!arr)
		return reply_err(r->conn, &err);
	j = json_pack("{s:o, s:s?}", "sessions", arr, "next_cursor", next);
	free(next);
	return reply_json(r->conn, MHD_HTTP_OK, j);
}

/* The session must be running on a live host: its URL, else an answer. */
static int need_running(struct sessions *ss, const struct sessions_request *r, const struct store_session *cur,
			char url[256], enum MHD_Result *ret)
{
	char msg[200];
	int hs;

	if (cur->state != SESSION_RUNNING) {
		if (cur->state == SESSION_PAUSED)
			snprintf(msg, sizeof(msg), "the session is paused: resume it first (POST /v1/sessions/%s/resume)",
				 cur->id);
		else
			snprintf(msg, sizeof(msg), "the session is %s", session_state_name(cur->state));
		*ret = reply_error(r->conn, KERR_NOT_RUNNING, msg);
		return 0;
	}
	hs = sched_host_state(ss->sched, cur->host_id, url);
	if (hs != 1) {
		*ret = sessions_host_unavailable(r->conn, hs == 0 ? "it is lost" : "it has not been heard from yet");
		return 0;
	}
	return 1;
}

/* A 404 from the host for a session we think runs there: if the host
 * confirms it has none, the VM is lost (error/vm_lost) and the client is
 * told; otherwise the 404 was about something else (a file) and is relayed. */
static enum MHD_Result relay_or_lost(struct sessions *ss, const struct sessions_request *r, const char *url,
				     const char *id, struct hostclient_reply *hr)
{
	if (hr->status == 404 && sessions_host_lacks(ss, url, id)) {
		sessions_vm_lost(ss, id, SESSION_RUNNING);
		return reply_error(r->conn, KERR_NOT_RUNNING,
				   "the session's VM is gone from its host (it restarted?): the session is error/vm_lost");
	}
	return sessions_relay(r->conn, hr);
}

/* The host's answer to a call relayed for session id, to the client: 503
 * when none came (hr->status < 0, why in err), else relay_or_lost(). Frees
 * hr's body. */
static enum MHD_Result relay_answer(struct sessions *ss, const struct sessions_request *r, const char *url,
				    const char *id, struct hostclient_reply *hr, const struct kiln_err *err)
{
	enum MHD_Result ret = hr->status < 0 ? sessions_host_unavailable(r->conn, err->message)
					     : relay_or_lost(ss, r, url, id, hr);

	hostclient_reply_free(hr);
	return ret;
}

/* ---- exec with ?stream=1: the host's event stream relayed as it comes ---- */

struct stream_relay {
	struct sessions *ss;
	char id[40];
	struct quota_limiter *lim;
	char customer[65];           /* counted in lim's streams ("": not counted) */
	struct hostclient_stream *hs;
	int64_t deadline_ms;         /* monotonic: the exec's timeout and a margin */
	char tail[2];                /* the last two bytes relayed: at an event boundary after "\n\n" */
	char extra[600];             /* a keep-alive or the final error event, being sent */
	size_t extra_len, extra_off;
	int ending;                  /* after extra: the end */
};

static void relay_note(struct stream_relay *sr, const char *buf, size_t n)
{
	if (n >= 2) {
		sr->tail[0] = buf[n - 2];
		sr->tail[1] = buf[n - 1];
	} else if (n == 1) {
		sr->tail[0] = sr->tail[1];
		sr->tail[1] = buf[0];
	}
}

static int relay_at_boundary(const struct stream_relay *sr)
{
	return (sr->tail[0] == '\0' && sr->tail[1] == '\0') || (sr->tail[0] == '\n' && sr->tail[1] == '\n');
}

static void relay_fail(struct stream_relay *sr, const char *msg)
{
	json_t *d = json_pack("{s:s, s:s}", "code", "host_unavailable", "message", msg);
	char *js = d ? json_dumps(d, JSON_COMPACT) : NULL;

	/* An event cut in the middle is ended first, so that the error parses. */
	snprintf(sr->extra, sizeof(sr->extra), "%sevent: error\ndata: %s\n\n", relay_at_boundary(sr) ? "" : "\n\n",
		 js ? js : "{}");
	sr->extra_len = strlen(sr->extra);
	sr->extra_off = 0;
	sr->ending = 1;
	free(js);
	json_decref(d);
}

static ssize_t relay_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct stream_relay *sr = cls;
	struct kiln_err err = { .code = "" };

	for (;;) {
		long n;

		if (sr->extra_off < sr->extra_len) {
			size_t k = sr->extra_len - sr->extra_off;

			if (k > max)
				k = max;
			memcpy(buf, sr->extra + sr->extra_off, k);
			sr->extra_off += k;
			relay_note(sr, buf, k);
			return (ssize_t)k;
		}
		if (sr->ending)
			return MHD_CONTENT_READER_END_OF_STREAM;
		n = sr->ss->host->stream_read(sr->ss->host->ctx, sr->hs, buf, max, KEEPALIVE_MS, &err);
		if (n > 0) {
			relay_note(sr, buf, (size_t)n);
			return n;
		}
		if (n == -1)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (n == -2) {
			relay_fail(sr, err.message);
			continue;
		}
		if (kclock_mono_ms(sr->ss->clock) > sr->deadline_ms) {
			relay_fail(sr, "the host sent no result in time");
			continue;
		}
		/* Silence: a keep-alive, between events only. */
		if (relay_at_boundary(sr)) {
			sr->extra_len = (size_t)reply_sse_keepalive(sr->extra, sizeof(sr->extra));
			sr->extra_off = 0;
		}
	}
}

static void relay_free(void *cls)
{
	struct stream_relay *sr = cls;

	/* Called however the relay ends (its end, an error, the client gone). */
	if (sr->customer[0])
		quota_limiter_stream_close(sr->lim, sr->customer);
	if (sr->hs)
		sr->ss->host->stream_close(sr->ss->host->ctx, sr->hs);
	sessions_op_leave_touch(sr->ss, sr->id);
	sessions_release(sr->ss);
	free(sr);
}

static enum MHD_Result exec_stream(struct sessions *ss, const struct sessions_request *r, const char *url,
				   const char *id, const char *customer, unsigned max_streams, json_t *body,
				   unsigned timeout_s)
{
	struct kiln_err err = { .code = "" };
	struct stream_relay *sr;
	char path[96];
	int st;

	/* A stream holds a connection and a thread: counted per customer (an
	 * admin key is not). */
	if (!r->admin && !quota_limiter_stream_open(r->lim, customer, max_streams))
		return reply_too_many_streams(r->conn, max_streams);
	sr = calloc(1, sizeof(*sr));
	if (!sr) {
		if (!r->admin)
			quota_limiter_stream_close(r->lim, customer);
		return reply_internal(r->conn, "out of memory");
	}
	sr->lim = r->lim;
	if (!r->admin)
		snprintf(sr->customer, sizeof(sr->customer), "%s", customer);
	sr->ss = ss;
	sessions_hold(ss); /* the response outlives the request's handler */
	snprintf(sr->id, sizeof(sr->id), "%s", id);
	sr->deadline_ms = kclock_mono_ms(ss->clock) + (int64_t)timeout_s * 1000 + EXEC_MARGIN_MS;
	snprintf(path, sizeof(path), "/v1/sessions/%s/exec?stream=1", id);
	sessions_op_enter_touch(ss, id);
	sr->hs = ss->host->stream_open(ss->host->ctx, url, ss->token, "POST", path, body, &err);
	st = sr->hs ? ss->host->stream_status(ss->host->ctx, sr->hs, 30000, &err) : -1;
	if (st != 200) {
		/* An error (busy, invalid, gone): its JSON body, whole. */
		struct hostclient_reply hr = { .status = st };
		struct buf b;
		char chunk[4096];
		long n;

		/* Up to 1 MiB read, and the last chunk whole. */
		buf_init(&b, (1u << 20) + sizeof(chunk));
		while (st > 0 && b.len < (1u << 20) &&
		       (n = ss->host->stream_read(ss->host->ctx, sr->hs, chunk, sizeof(chunk), 30000, &err)) > 0)
			if (buf_add(&b, chunk, (size_t)n) < 0)
				break;
		hr.body = b.p; /* NULL when nothing came, as sessions_relay() wants; freed with hr */
		hr.len = b.len;
		relay_free(sr);
		return relay_answer(ss, r, url, id, &hr, &err);
	}
	return reply_sse(r->conn, 64 << 10, relay_read, sr, relay_free);
}

/* POST body (JSON, consumed) to the session id's host at url, as
 * /v1/sessions/{id}/what, into *hr: 0, or -1 when out of memory (nothing
 * sent). */
static int host_post_json(struct sessions *ss, const char *url, const char *id, const char *what, json_t *body,
			  long timeout_ms, struct hostclient_reply *hr, struct kiln_err *err)
{
	char path[96], *text = json_dumps(body, JSON_COMPACT);

	json_decref(body);
	if (!text)
		return -1;
	snprintf(path, sizeof(path), "/v1/sessions/%s/%s", id, what);
	sessions_host_raw(ss, url, "POST", path, text, strlen(text), "application/json", timeout_ms, HOST_REPLY_MAX, hr,
			  err);
	free(text);
	return 0;
}

/* POST /v1/sessions/{id}/exec */
static enum MHD_Result handle_exec(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct sessions *ss = c->ss;
	const struct sessions_request *r = c->r;
	const struct store_session *cur = &c->cur;
	const char *stream = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "stream");
	struct kiln_err err = { .code = "" };
	struct hostclient_reply hr;
	struct quota q;
	enum MHD_Result ret;
	char url[256];
	json_t *body;
	unsigned timeout_s;

	if (r->admin)
		return admin_refused(r->conn);
	if (!need_running(ss, r, cur, url, &ret))
		return ret;
	if (store_customer_quota(ss->st, cur->customer, &q) < 0)
		quota_defaults(&q);
	if (api_exec_request_parse(r->body, r->len, q.max_task_timeout_s, &body, &err) < 0)
		return reply_err(r->conn, &err);
	{
		/* The session's template: its env and workdir, as tasks get them. */
		char *ref = store_template_use_ref(ss->st, cur->id);

		template_merge_exec(body, ref);
		free(ref);
	}
	timeout_s = (unsigned)json_integer_value(json_object_get(body, "timeout_s"));
	if (stream && (!strcmp(stream, "1") || !strcmp(stream, "true"))) {
		ret = exec_stream(ss, r, url, cur->id, cur->customer, q.max_streams, body, timeout_s);
		json_decref(body);
		return ret;
	}
	sessions_op_enter_touch(ss, cur->id);
	if (host_post_json(ss, url, cur->id, "exec", body, (long)timeout_s * 1000 + EXEC_MARGIN_MS, &hr, &err) < 0) {
		sessions_op_leave_touch(ss, cur->id);
		return reply_internal(r->conn, "out of memory");
	}
	if (hr.status == 200) {
		/* A command that broke the VM, or a VM the host's memory budget
		 * had killed (host_memory), ended the session on the host. */
		json_t *res = json_loadb(hr.body ? hr.body : "", hr.len, 0, NULL);
		const char *why = json_string_value(json_object_get(res, "end_reason")) ?: "";

		if (strcmp(why, "host_memory"))
			why = "vm_error";
		if (!strcmp(json_string_value(json_object_get(res, "state")) ?: "", "error") &&
		    !strcmp(json_string_value(json_object_get(res, "end_reason")) ?: "", why) &&
		    store_session_transition(ss->st, cur->id, SESSION_RUNNING, SESSION_ERROR, NULL, why, NULL) == 1)
			fprintf(stderr, "kiln-api: session %s: its VM failed during an exec: error/%s\n", cur->id, why);
		json_decref(res);
	}
	sessions_op_leave_touch(ss, cur->id);
	return relay_answer(ss, r, url, cur->id, &hr, &err);
}

/* POST /v1/sessions/{id}/input: input for the session's running interactive
 * command, relayed to its host (which answers at once: it queues it). Not
 * an operation of its own: the command it feeds is one already. */
static enum MHD_Result handle_input(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct sessions *ss = c->ss;
	const struct sessions_request *r = c->r;
	const struct store_session *cur = &c->cur;
	struct kiln_err err = { .code = "" };
	struct hostclient_reply hr;
	enum MHD_Result ret;
	char url[256];
	json_t *body;

	if (r->admin)
		return admin_refused(r->conn);
	if (api_input_request_parse(r->body, r->len, &body, &err) < 0)
		return reply_err_status(r->conn, MHD_HTTP_BAD_REQUEST, &err);
	if (!need_running(ss, r, cur, url, &ret)) {
		json_decref(body);
		return ret;
	}
	if (host_post_json(ss, url, cur->id, "input", body, INPUT_TIMEOUT_MS, &hr, &err) < 0)
		return reply_internal(r->conn, "out of memory");
	return relay_answer(ss, r, url, cur->id, &hr, &err);
}

/* GET and PUT /v1/sessions/{id}/files */
static enum MHD_Result handle_files(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct sessions *ss = c->ss;
	const struct sessions_request *r = c->r;
	const struct store_session *cur = &c->cur;
	const char *p = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "path");
	const char *d = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "dir");
	const char *fmt = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "format");
	int put = !strcmp(req->method, "PUT"), tar = fmt && !strcmp(fmt, "tar");
	struct kiln_err err = { .code = "" };
	struct hostclient_reply hr;
	enum MHD_Result ret;
	char url[256], path[8400], *enc;

	if (r->admin)
		return admin_refused(r->conn);
	if (fmt && (!tar || !d || p))
		return reply_error(r->conn, KERR_INVALID_REQUEST,
				   "format: only \"tar\", with dir (a whole directory as a tar archive)");
	if ((p && d) || (!p && !d) || (put && d && !tar))
		return reply_error(r->conn, KERR_INVALID_REQUEST,
				   put ? "path (a file) or dir with format=tar (a tar archive to unpack) is required"
				       : "one of path (a file) and dir (a directory listing) is required");
	if (!api_guest_path_ok(p ? p : d))
		return reply_error(r->conn, KERR_INVALID_REQUEST,
				   p ? "path: an absolute path of at most 4096 bytes, no control characters"
				     : "dir: an absolute path of at most 4096 bytes, no control characters");
	if (!need_running(ss, r, cur, url, &ret))
		return ret;
	enc = curl_easy_escape(NULL, p ? p : d, 0);
	if (!enc)
		return reply_internal(r->conn, "out of memory");
	snprintf(path, sizeof(path), "/v1/sessions/%s/files?%s=%s%s", cur->id, p ? "path" : "dir", enc,
		 tar ? "&format=tar" : "");
	curl_free(enc);
	sessions_op_enter_touch(ss, cur->id);
	sessions_host_raw(ss, url, req->method, path, put ? (r->body ? r->body : "") : NULL, put ? r->len : 0,
		       put ? "application/octet-stream" : NULL, FILES_TIMEOUT_MS, HOST_REPLY_MAX, &hr, &err);
	sessions_op_leave_touch(ss, cur->id);
	if (!(put && hr.status >= 200 && hr.status < 300))
		return relay_answer(ss, r, url, cur->id, &hr, &err);
	hostclient_reply_free(&hr);
	return reply_json(r->conn, MHD_HTTP_OK,
			  json_pack("{s:s, s:I}", p ? "path" : "dir", p ? p : d, "size", (json_int_t)r->len));
}

/* POST /v1/sessions/{id}/outputs */
static enum MHD_Result handle_outputs(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct sessions *ss = c->ss;
	const struct sessions_request *r = c->r;
	const struct store_session *cur = &c->cur;
	struct kiln_err err = { .code = "" };
	struct hostclient_reply hr;
	enum MHD_Result ret;
	char url[256], path[96], dest_id[40], *body = NULL;
	struct dest dest = { .endpoint = "" };
	int dr;
	json_t *j;

	if (r->admin)
		return admin_refused(r->conn);
	if (!need_running(ss, r, cur, url, &ret))
		return ret;
	snprintf(path, sizeof(path), "/v1/sessions/%s/outputs", cur->id);
	/* The customer's own S3 destination, if it has one (never kiln's
	 * bucket instead of one that cannot be opened). */
	dr = destination_load(ss->st, ss->cfg->have_dest_key ? ss->cfg->dest_key : NULL, cur->customer, &dest, dest_id,
			      &err);
	if (dr < 0)
		return reply_err(r->conn, &err);
	if (dr == 1) {
		json_t *b = json_pack("{s:o}", "destination", dest_to_json(&dest, 1));

		body = b ? json_dumps(b, JSON_COMPACT) : NULL;
		json_decref(b);
		if (!body) {
			dest_wipe(&dest);
			return reply_internal(r->conn, "out of memory");
		}
	}
	sessions_op_enter_touch(ss, cur->id);
	sessions_host_raw(ss, url, "POST", path, body, body ? strlen(body) : 0, body ? "application/json" : NULL,
			  SNAPSHOT_TIMEOUT_MS, 16u << 20, &hr, &err);
	if (body) {
		OPENSSL_cleanse(body, strlen(body));
		free(body);
	}
	sessions_op_leave_touch(ss, cur->id);
	if (hr.status != 200) {
		dest_wipe(&dest);
		return relay_answer(ss, r, url, cur->id, &hr, &err);
	}
	j = json_loadb(hr.body ? hr.body : "", hr.len, 0, NULL);
	hostclient_reply_free(&hr);
	if (!json_is_object(j)) {
		dest_wipe(&dest);
		json_decref(j);
		return reply_error_status(r->conn, MHD_HTTP_BAD_GATEWAY, KERR_HOST_ERROR, "the host's answer is not JSON");
	}
	/* Every output gets a presigned GET url, as a task's do, for keys
	 * under the session's own outputs/ only (in the customer's own bucket,
	 * signed with its credentials, when it has a destination). */
	if (dr == 1) {
		struct s3_config dc;

		dest_s3_config(&dest, NULL, &dc); /* signed here, nothing sent */
		presign_session_outputs(&dc, ss->cfg->presign_expiry_s, j, dest.prefix, cur->customer, cur->id,
					time(NULL));
		json_object_set_new(j, "destination", json_string(dest_id));
		dest_wipe(&dest);
	} else {
		presign_session_outputs(&ss->cfg->s3, ss->cfg->presign_expiry_s, j, "", cur->customer, cur->id,
					time(NULL));
	}
	json_object_set_new(j, "id", json_string(cur->id));
	return reply_json(r->conn, MHD_HTTP_OK, j);
}

/* POST /v1/sessions/{id}/resume: with the template it was created with */
static enum MHD_Result handle_resume(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	enum MHD_Result ret;

	if (c->r->admin)
		return admin_refused(c->r->conn);
	if (sessions_resume_run(c->ss, c->r, &c->cur, &ret))
		ret = reply_session(c->ss, c->r->conn, MHD_HTTP_OK, c->cur.id);
	return ret;
}

/* GET /v1/sessions/{id}: the record, and for a running session the ports
 * listened on in it, when its host lists them within PORTS_IN_GET_MS (else
 * the record comes without "ports": GET /v1/sessions/{id}/ports says why). */
#define PORTS_IN_GET_MS 2000
static json_t *port_list(struct sessions *ss, const struct store_session *cur, const char *url, int64_t timeout_ms,
			 int *st, json_t **m);
static enum MHD_Result handle_get(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	json_t *j = store_session_json(c->ss->st, req->param[0], NULL), *m = NULL, *ports;
	char url[256];
	int st;

	if (!j)
		return reply_internal(req->conn, "the session cannot be read back");
	if (c->cur.state == SESSION_RUNNING && sched_host_state(c->ss->sched, c->cur.host_id, url) == 1) {
		ports = port_list(c->ss, &c->cur, url, PORTS_IN_GET_MS, &st, &m);
		if (ports)
			json_object_set_new(j, "ports", ports);
		json_decref(m);
	}
	return reply_json(req->conn, MHD_HTTP_OK, j);
}

/* DELETE /v1/sessions/{id} */
static enum MHD_Result handle_delete(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct sessions_outcome o = { 0 };
	const char *id = req->param[0];

	sessions_op_enter(c->ss, id);
	sessions_destroy(c->ss, id, "deleted", &o);
	sessions_op_leave(c->ss, id);
	return reply_outcome(c->ss, req->conn, id, &o);
}

/* POST /v1/sessions/{id}/pause */
static enum MHD_Result handle_pause(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct sessions_outcome o = { 0 };
	const char *id = req->param[0];

	if (c->r->admin)
		return admin_refused(req->conn);
	if (c->cur.state == SESSION_PAUSED)
		return reply_error(req->conn, KERR_NOT_RUNNING, "the session is paused already");
	sessions_op_enter(c->ss, id);
	sessions_pause(c->ss, id, "paused", &o);
	sessions_op_leave(c->ss, id);
	return reply_outcome(c->ss, req->conn, id, &o);
}

/* PUT /v1/sessions/{id}/network {"egress":"allow","allow":[...]}: the
 * running session's egress rules replaced (docs/api.md). */
static enum MHD_Result handle_network(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct sessions *ss = c->ss;
	const struct sessions_request *r = c->r;
	struct kiln_err err = { .code = "" };
	enum MHD_Result ret;
	json_error_t je;
	json_t *net;

	if (r->admin)
		return admin_refused(req->conn);
	if (r->len > API_SESSION_BODY_MAX)
		return reply_error(req->conn, KERR_TOO_LARGE, "the body is too large");
	net = json_loadb(r->body ? r->body : "", r->len, JSON_REJECT_DUPLICATES, &je);
	if (!net)
		return reply_error(req->conn, KERR_INVALID_JSON, je.text);
	if (sessions_network_check(net, &err) < 0) {
		json_decref(net);
		return reply_err(req->conn, &err);
	}
	if (sessions_network_run(ss, r, &c->cur, net, &ret))
		ret = reply_session(ss, req->conn, MHD_HTTP_OK, c->cur.id);
	json_decref(net);
	return ret;
}

/* Any other method on files: an admin key is refused before the method is
 * (for the POST operations it is the other way round: kept as it was). */
static enum MHD_Result files_other(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;

	if (c->r->admin)
		return admin_refused(req->conn);
	return reply_method_not_allowed(req->conn, "GET, PUT");
}

/* The TCP ports listened on inside the running session cur on the host at
 * url, each with the path that reaches it through kiln-api and, for a
 * sandbox made through /e2b when kiln-api has a sandbox domain, its
 * https URL (E2B's getHost): a new array, or NULL with *m the host's
 * answer when it refused (owned by the caller) or NULL. */
static json_t *port_list(struct sessions *ss, const struct store_session *cur, const char *url, int64_t timeout_ms,
			 int *st, json_t **m)
{
	struct kiln_err err = { .code = "" };
	char path[96], e2b_id[40];
	json_t *out, *ports;
	size_t i;

	*m = NULL;
	snprintf(path, sizeof(path), "/v1/sessions/%s/ports", cur->id);
	*st = sessions_host_call(ss, url, "GET", path, NULL, timeout_ms, m, &err);
	if (*st != 200 || !json_is_array(json_object_get(*m, "ports")))
		return NULL;
	out = json_array();
	store_session_id_e2b(cur->id, e2b_id);
	json_array_foreach(json_object_get(*m, "ports"), i, ports) {
		char p[128], u[256];
		json_int_t n = json_integer_value(ports);
		json_t *e;

		if (n < 1 || n > 65535)
			continue;
		snprintf(p, sizeof(p), "/v1/sessions/%s/ports/%d/", cur->id, (int)n);
		e = json_pack("{s:I, s:s}", "port", n, "path", p);
		if (e && cur->has_e2b_token && ss->cfg->sandbox_domain) {
			snprintf(u, sizeof(u), "https://%d-%s.%s/", (int)n, e2b_id, ss->cfg->sandbox_domain);
			json_object_set_new(e, "url", json_string(u));
		}
		json_array_append_new(out, e);
	}
	json_decref(*m);
	*m = NULL;
	return out;
}

/* GET /v1/sessions/{id}/ports: the TCP ports listened on inside the VM,
 * each with the path that reaches it (docs/api.md "Ports"). */
static enum MHD_Result handle_ports(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	const struct sessions_request *r = c->r;
	enum MHD_Result ret;
	char url[256];
	json_t *m, *out;
	int st;

	(void)req;
	if (!need_running(c->ss, r, &c->cur, url, &ret))
		return ret;
	out = port_list(c->ss, &c->cur, url, SHORT_TIMEOUT_MS, &st, &m);
	if (!out) {
		if (st > 0 && json_is_object(json_object_get(m, "error")))
			return reply_json(r->conn, (unsigned)st, m); /* the host's refusal (ports_unsupported, ...) */
		json_decref(m);
		return reply_error(r->conn, KERR_HOST_UNAVAILABLE, "the session's host could not list its ports");
	}
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:o}", "ports", out));
}

/* POST /v1/sessions/{id}/snapshots, /fork (session_snapshots.c) */
static enum MHD_Result handle_snapshot(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;

	return sessions_rt_snapshot(c->ss, c->r, &c->cur);
}

static enum MHD_Result handle_fork(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;

	return sessions_rt_fork(c->ss, c->r, &c->cur);
}

static const struct httpd_route session_routes[] = {
	{ "GET", "/v1/sessions", handle_list },
	{ "POST", "/v1/sessions", handle_create },
	{ "GET", "/v1/sessions/{id}", handle_get },
	{ "DELETE", "/v1/sessions/{id}", handle_delete },
	{ "POST", "/v1/sessions/{id}/exec", handle_exec },
	{ "POST", "/v1/sessions/{id}/input", handle_input },
	{ "GET", "/v1/sessions/{id}/files", handle_files },
	{ "PUT", "/v1/sessions/{id}/files", handle_files },
	{ NULL, "/v1/sessions/{id}/files", files_other },
	{ "POST", "/v1/sessions/{id}/outputs", handle_outputs },
	{ "POST", "/v1/sessions/{id}/pause", handle_pause },
	{ "POST", "/v1/sessions/{id}/resume", handle_resume },
	{ "PUT", "/v1/sessions/{id}/network", handle_network },
	{ "GET", "/v1/sessions/{id}/ports", handle_ports },
	{ "POST", "/v1/sessions/{id}/snapshots", handle_snapshot },
	{ "POST", "/v1/sessions/{id}/fork", handle_fork },
};

static const struct httpd_routes session_table = {
	session_routes, sizeof(session_routes) / sizeof(session_routes[0]), "no such endpoint", ", ",
};

static enum MHD_Result route(struct sessions *ss, const struct sessions_request *r)
{
	struct call c = { .ss = ss, .r = r };
	struct httpd_req req = { .conn = r->conn, .method = r->method };
	char url[sizeof(req.path_)];

	/* Another customer's session does not exist, whatever the path under
	 * it and the method: looked up before the table answers 404 or 405. */
	if (r->path[0] == '/') {
		size_t n = strcspn(r->path + 1, "/");
		char id[40];

		if (n == 0 || n >= sizeof(id))
			return reply_not_found(r->conn, "no such session");
		memcpy(id, r->path + 1, n);
		id[n] = '\0';
		if (store_session_get(ss->st, id, r->admin ? NULL : r->customer, &c.cur) < 0)
			return reply_not_found(r->conn, "no such session");
		/* The routes below see the id as stored (an E2B sandbox id is
		 * the same session spelt without its underscore). */
		if (strcmp(id, c.cur.id)) {
			if ((size_t)snprintf(url, sizeof(url), "/v1/sessions/%s%s", c.cur.id, r->path + 1 + n) >=
			    sizeof(url))
				return reply_not_found(r->conn, "no such endpoint");
			req.url = url;
			return httpd_dispatch(&session_table, &c, &req);
		}
		/* A destroyed session is gone for good: only its record (GET)
		 * and DELETE (again is fine) answer, nothing under it. */
		if (c.cur.state == SESSION_DESTROYED && r->path[1 + n] == '/')
			return reply_not_found(r->conn, "the session is destroyed");
	}
	/* Too long for the table is no endpoint of it either. */
	if ((size_t)snprintf(url, sizeof(url), "/v1/sessions%s", r->path) >= sizeof(url))
		return reply_not_found(r->conn, "no such endpoint");
	req.url = url;
	return httpd_dispatch(&session_table, &c, &req);
}

enum MHD_Result sessions_handle(struct sessions *ss, const struct sessions_request *r)
{
	enum MHD_Result ret = route(ss, r);

	sessions_release(ss);
	return ret;
}
