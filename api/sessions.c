/* sessions: the /v1/sessions endpoints and the session reaper (see
 * sessions.h, docs/api.md "Sessions").
 *
 * State lives in the store; every change is a compare-and-set, so that an
 * HTTP request and the reaper racing on one session cannot both win: the
 * transient states starting, pausing and resuming are taken before the
 * host is asked and left once it has answered. A session that holds a VM
 * (starting, running, pausing, resuming) counts against the customer's
 * running quota, checked in the same transaction that takes the state.
 *
 * In memory only: which sessions have a request in flight in this process
 * (ss->ops). The reaper leaves those alone: an exec that runs is activity,
 * and a transient state with a request behind it is not a leftover. After a
 * restart nothing is in flight, so a transient state in the store is what a
 * killed kiln-api left, and the reaper settles it by asking the host. */
#include "sessions.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "hostclient.h"
#include "presign.h"
#include "reply.h"
#include "request.h"
#include "s3.h"

#define REAP_TICK_MS 500
#define RECONCILE_EVERY_MS 10000
#define KEEPALIVE_MS 15000
#define MAX_ATTEMPTS 4              /* hosts tried for one create or resume */
#define CREATE_TIMEOUT_MS 120000
#define SNAPSHOT_TIMEOUT_MS 900000  /* pause and resume move the VM's memory and disk through S3 */
#define FILES_TIMEOUT_MS 300000
#define INPUT_TIMEOUT_MS 10000 /* the host only queues input */
#define SHORT_TIMEOUT_MS 10000
#define EXEC_MARGIN_MS 60000        /* beyond the exec's own timeout */
#define HOST_REPLY_MAX (128u << 20) /* a file or an exec result with its output */
#define RETRY_AFTER_S "5"
#define MAX_HOLDING 4096
#define MAX_ENDERS 16               /* reaper threads pausing/destroying at once */

struct op {
	char id[40];
	unsigned n;                  /* requests (and reaper actions) in flight */
	int ending;                  /* one of them is the reaper ending it */
	struct op *next;
};

struct sessions {
	const struct api_config *cfg;
	struct store *st;
	struct sched *sched;
	char *token;
	pthread_t reaper;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int stopping;
	unsigned enders;             /* detached threads ending sessions */
	unsigned users;              /* HTTP requests and event-stream relays using ss */
	struct op *ops;              /* sessions with a request in flight here */
};

static int64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- requests in flight ---- */

static void ops_enter(struct sessions *ss, const char *id)
{
	struct op *o;

	pthread_mutex_lock(&ss->lock);
	for (o = ss->ops; o; o = o->next)
		if (!strcmp(o->id, id))
			break;
	if (!o && (o = calloc(1, sizeof(*o)))) {
		snprintf(o->id, sizeof(o->id), "%s", id);
		o->next = ss->ops;
		ss->ops = o;
	}
	if (o)
		o->n++;
	pthread_mutex_unlock(&ss->lock);
}

static void ops_leave(struct sessions *ss, const char *id)
{
	pthread_mutex_lock(&ss->lock);
	for (struct op **p = &ss->ops; *p; p = &(*p)->next)
		if (!strcmp((*p)->id, id)) {
			struct op *o = *p;

			if (--o->n == 0) {
				*p = o->next;
				free(o);
			}
			break;
		}
	pthread_mutex_unlock(&ss->lock);
}

/* ops_enter for the reaper's end of a session: 0 (and nothing entered) when
 * one is already under way. */
static int ops_enter_ending(struct sessions *ss, const char *id)
{
	struct op *o;
	int r = 0;

	pthread_mutex_lock(&ss->lock);
	for (o = ss->ops; o; o = o->next)
		if (!strcmp(o->id, id))
			break;
	if (!o && (o = calloc(1, sizeof(*o)))) {
		snprintf(o->id, sizeof(o->id), "%s", id);
		o->next = ss->ops;
		ss->ops = o;
	}
	if (o && !o->ending) {
		o->n++;
		o->ending = 1;
		r = 1;
	}
	pthread_mutex_unlock(&ss->lock);
	return r;
}

static void ops_leave_ending(struct sessions *ss, const char *id)
{
	pthread_mutex_lock(&ss->lock);
	for (struct op *o = ss->ops; o; o = o->next)
		if (!strcmp(o->id, id))
			o->ending = 0;
	pthread_mutex_unlock(&ss->lock);
	ops_leave(ss, id);
}

static int ops_busy(struct sessions *ss, const char *id)
{
	int busy = 0;

	pthread_mutex_lock(&ss->lock);
	for (struct op *o = ss->ops; o && !busy; o = o->next)
		busy = !strcmp(o->id, id);
	pthread_mutex_unlock(&ss->lock);
	return busy;
}

void sessions_hold(struct sessions *ss)
{
	pthread_mutex_lock(&ss->lock);
	ss->users++;
	pthread_mutex_unlock(&ss->lock);
}

static void sessions_release(struct sessions *ss)
{
	pthread_mutex_lock(&ss->lock);
	ss->users--;
	pthread_cond_broadcast(&ss->cond);
	pthread_mutex_unlock(&ss->lock);
}

/* ---- talking to hosts ---- */

static const char *host_error_code(const struct hostclient_reply *r, char *buf, size_t cap)
{
	json_t *j = r->body ? json_loadb(r->body, r->len, 0, NULL) : NULL;
	const char *c = json_string_value(json_object_get(json_object_get(j, "error"), "code"));

	snprintf(buf, cap, "%s", c ? c : "");
	json_decref(j);
	return buf;
}

static const char *host_error_message(const struct hostclient_reply *r, char *buf, size_t cap)
{
	json_t *j = r->body ? json_loadb(r->body, r->len, 0, NULL) : NULL;
	const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));

	snprintf(buf, cap, "%s", m ? m : "");
	json_decref(j);
	return buf;
}

/* Pass a host's answer on as it is: its status, bytes and content type.
 * An error that is not kiln-host's JSON error gets one. */
static enum MHD_Result relay(struct MHD_Connection *conn, struct hostclient_reply *r)
{
	char *body = r->body;

	if (r->status >= 400) {
		json_t *j = body ? json_loadb(body, r->len, 0, NULL) : NULL;
		int ok = json_is_object(json_object_get(j, "error"));

		json_decref(j);
		if (!ok) {
			char msg[96];

			snprintf(msg, sizeof(msg), "the session's host answered HTTP %d", r->status);
			return reply_error(conn, r->status >= 500 ? MHD_HTTP_BAD_GATEWAY : (unsigned)r->status,
					   "host_error", msg);
		}
	}
	r->body = NULL;
	return reply_bytes(conn, (unsigned)r->status, body, r->len,
			   r->content_type[0] ? r->content_type : (body ? "application/json" : NULL));
}

static enum MHD_Result host_unavailable(struct MHD_Connection *conn, const char *why)
{
	char msg[600];

	snprintf(msg, sizeof(msg), "the session's host cannot be reached: %s", why);
	return reply_error_h(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "host_unavailable", msg, "Retry-After",
			     RETRY_AFTER_S);
}

/* Whether the host confirms it has no such session (GET answered 404). */
static int host_lacks(struct sessions *ss, const char *url, const char *id)
{
	struct kiln_err err = { .code = "" };
	char path[96];
	int st;

	snprintf(path, sizeof(path), "/v1/sessions/%s", id);
	st = hostclient_call(url, ss->token, "GET", path, NULL, SHORT_TIMEOUT_MS, NULL, &err);
	return st == 404;
}

/* The session's VM is gone from its host (kiln-host restarted, or the VM
 * died): from `from` to error/vm_lost. */
static void vm_lost(struct sessions *ss, const char *id, enum session_state from)
{
	if (store_session_transition(ss->st, id, from, SESSION_ERROR, NULL, "vm_lost", NULL) == 1)
		fprintf(stderr, "kiln-api: session %s: its VM is gone from its host: error/vm_lost\n", id);
}

/* ---- the actions shared by the endpoints and the reaper ---- */

/* Outcome of pausing or destroying, as an HTTP answer would say it. */
struct outcome {
	unsigned status;
	struct kiln_err err;
};

/* Pause a running session: running -> pausing -> paused (snapshot in S3,
 * VM gone, quota freed) with end_reason `reason`. */
static void do_pause(struct sessions *ss, const char *id, const char *reason, struct outcome *o)
{
	struct store_session cur;
	struct hostclient_reply r;
	struct kiln_err err = { .code = "" };
	char url[256], path[96], code[64], msg[256];
	json_t *j, *snap;
	int hs;

	o->status = 200;
	if (store_session_get(ss->st, id, NULL, &cur) < 0) {
		o->status = 404;
		kiln_err_set(&o->err, "not_found", "no such session");
		return;
	}
	if (cur.state != SESSION_RUNNING) {
		o->status = 409;
		kiln_err_set(&o->err, cur.state == SESSION_PAUSED ? "not_running" : "busy", "the session is %s",
			     session_state_name(cur.state));
		return;
	}
	hs = sched_host_state(ss->sched, cur.host_id, url);
	if (hs != 1) {
		o->status = 503;
		kiln_err_set(&o->err, "host_unavailable", "the session's host %s is %s", cur.host_id,
			     hs == 0 ? "lost" : "not known yet");
		return;
	}
	if (store_session_transition(ss->st, id, SESSION_RUNNING, SESSION_PAUSING, NULL, NULL, NULL) != 1) {
		o->status = 409;
		kiln_err_set(&o->err, "busy", "the session changed state meanwhile: try again");
		return;
	}
	snprintf(path, sizeof(path), "/v1/sessions/%s/pause", id);
	hostclient_raw(url, ss->token, "POST", path, NULL, 0, NULL, SNAPSHOT_TIMEOUT_MS, 1u << 20, &r, &err);
	if (r.status == 200) {
		j = json_loadb(r.body ? r.body : "", r.len, 0, NULL);
		snap = json_object_get(j, "snapshot");
		store_session_transition(ss->st, id, SESSION_PAUSING, SESSION_PAUSED, "", reason,
					 json_is_object(snap) ? snap : NULL);
		json_decref(j);
	} else if (r.status == 404 && host_lacks(ss, url, id)) {
		vm_lost(ss, id, SESSION_PAUSING);
		o->status = 409;
		kiln_err_set(&o->err, "not_running", "the session's VM is gone from its host: it is error/vm_lost");
	} else {
		/* Still there (busy with an exec, or the host failed): running again. */
		store_session_transition(ss->st, id, SESSION_PAUSING, SESSION_RUNNING, NULL, NULL, NULL);
		if (r.status < 0) {
			o->status = 503;
			kiln_err_set(&o->err, "host_unavailable", "%s", err.message);
		} else {
			host_error_code(&r, code, sizeof(code));
			host_error_message(&r, msg, sizeof(msg));
			o->status = r.status == 409 ? 409 : 502;
			kiln_err_set(&o->err, code[0] ? code : "host_error", "the host could not pause it: HTTP %d %s",
				     r.status, msg);
		}
	}
	hostclient_reply_free(&r);
}

static int any_live_host(struct sessions *ss, char url[256])
{
	char ids[1][65], urls[1][256];

	if (sched_live_hosts(ss->sched, ids, urls, 1) < 1)
		return 0;
	snprintf(url, 256, "%s", urls[0]);
	return 1;
}

/* Destroy a session in any state but a transient one: its VM (if it has
 * one) is destroyed on its host, the row becomes destroyed with `reason`.
 * A host that cannot be reached is reconciled later (reaper). */
static void do_destroy(struct sessions *ss, const char *id, const char *reason, struct outcome *o)
{
	for (int attempt = 0; attempt < 3; attempt++) {
		struct store_session cur;
		struct kiln_err err = { .code = "" };
		char url[256], path[96];
		int st;

		o->status = 200;
		if (store_session_get(ss->st, id, NULL, &cur) < 0) {
			o->status = 404;
			kiln_err_set(&o->err, "not_found", "no such session");
			return;
		}
		switch (cur.state) {
		case SESSION_DESTROYED:
			return;
		case SESSION_RUNNING:
		case SESSION_PAUSED:
		case SESSION_ERROR:
			/* kiln-host's DELETE destroys the VM if it runs there and deletes
			 * the snapshot in S3 (found by ?customer= when it does not run
			 * there): a destroyed session leaves nothing. Any live host can
			 * do the latter for a paused one. */
			if (cur.state == SESSION_RUNNING ? sched_host_state(ss->sched, cur.host_id, url) == 1
							 : cur.has_snapshot && any_live_host(ss, url)) {
				snprintf(path, sizeof(path), "/v1/sessions/%s?customer=%s", id, cur.customer);
				st = hostclient_call(url, ss->token, "DELETE", path, NULL, 60000, NULL, &err);
				if (st != 200 && st != 404)
					fprintf(stderr, "kiln-api: session %s: destroying it on %s: %s\n", id, url,
						st < 0 ? err.message : "unexpected status");
			}
			if (store_session_transition(ss->st, id, cur.state, SESSION_DESTROYED, "", reason, NULL) == 1)
				return;
			break; /* changed meanwhile: look again */
		default:
			o->status = 409;
			kiln_err_set(&o->err, "busy", "the session is %s: try again once that is done",
				     session_state_name(cur.state));
			return;
		}
	}
	o->status = 409;
	kiln_err_set(&o->err, "busy", "the session keeps changing state: try again");
}

/* ---- endpoints ---- */

static enum MHD_Result reply_session(struct sessions *ss, struct MHD_Connection *conn, unsigned status,
				     const char *id)
{
	json_t *j = store_session_json(ss->st, id, NULL);

	return j ? reply_json(conn, status, j) : reply_internal(conn, "the session cannot be read back");
}

static enum MHD_Result reply_outcome(struct sessions *ss, struct MHD_Connection *conn, const char *id,
				     const struct outcome *o)
{
	if (o->status == 200)
		return reply_session(ss, conn, MHD_HTTP_OK, id);
	if (o->status == 503)
		return reply_error_h(conn, o->status, o->err.code, o->err.message, "Retry-After", RETRY_AFTER_S);
	return reply_err(conn, o->status, &o->err);
}

static enum MHD_Result no_room(struct MHD_Connection *conn, int r, const struct sched_need *need)
{
	char msg[200];

	if (r == -EBUSY) {
		snprintf(msg, sizeof(msg), "no host has room for %u vCPUs and %u MiB now: retry later", need->vcpus,
			 need->memory_mib);
		return reply_error_h(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "no_capacity", msg, "Retry-After", RETRY_AFTER_S);
	}
	if (r == -ENOENT)
		return reply_error_h(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "no_host", "no host is live", "Retry-After",
				     RETRY_AFTER_S);
	snprintf(msg, sizeof(msg), "no registered host has %u vCPUs and %u MiB of memory%s", need->vcpus,
		 need->memory_mib, need->egress ? " and offers network egress" : "");
	return reply_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "no_host_fits", msg);
}

/* Submit rate and the running quota, checked before a host is picked (the
 * store checks the quota again, in the transaction that takes it). */
static enum MHD_Result admit(struct sessions *ss, const struct sessions_request *r, const struct quota *q,
			     unsigned vcpus, unsigned memory_mib, int *refused)
{
	struct kiln_err err = { .code = "" };
	struct usage u;
	int64_t retry_ms;

	*refused = 1;
	if (!quota_limiter_take(r->lim, r->customer, q->submit_rate, q->submit_burst, mono_ms(), &retry_ms)) {
		char ra[24], msg[160];

		snprintf(ra, sizeof(ra), "%lld", (long long)(retry_ms > 1000 ? (retry_ms + 999) / 1000 : 1));
		snprintf(msg, sizeof(msg), "more than %g submissions per second (burst %u): retry in %s s", q->submit_rate,
			 q->submit_burst, ra);
		return reply_error_h(r->conn, MHD_HTTP_TOO_MANY_REQUESTS, "rate_limited", msg, "Retry-After", ra);
	}
	if (store_customer_usage(ss->st, r->customer, &u) < 0)
		return reply_internal(r->conn, "cannot read the usage");
	if (quota_check_start(q, &u, vcpus, memory_mib, &err) < 0)
		return reply_err(r->conn, MHD_HTTP_TOO_MANY_REQUESTS, &err);
	*refused = 0;
	return MHD_YES;
}

static enum MHD_Result handle_create(struct sessions *ss, const struct sessions_request *r)
{
	struct kiln_err err = { .code = "" };
	struct api_session_request sr;
	struct sched_need need;
	struct quota q;
	char id[40] = "", host[65], url[256], exclude[MAX_ATTEMPTS][65], last[300] = "";
	enum MHD_Result ret;
	int refused, nex = 0, pr;

	if (store_customer_quota(ss->st, r->customer, &q) < 0)
		return reply_error(r->conn, MHD_HTTP_FORBIDDEN, "forbidden", "this key's customer no longer exists");
	if (api_session_request_parse(r->body, r->len, q.allow_egress, &sr, &err) < 0)
		return reply_err(r->conn, strcmp(err.code, "internal") ? MHD_HTTP_BAD_REQUEST
								       : MHD_HTTP_INTERNAL_SERVER_ERROR,
				 &err);
	if (quota_check_task(&q, sr.vcpus, sr.memory_mib, 0, sr.output_mib, &err) < 0) {
		api_session_request_free(&sr);
		return reply_err(r->conn, MHD_HTTP_BAD_REQUEST, &err);
	}
	ret = admit(ss, r, &q, sr.vcpus, sr.memory_mib, &refused);
	if (refused) {
		api_session_request_free(&sr);
		return ret;
	}
	need = (struct sched_need){ .vcpus = sr.vcpus, .memory_mib = sr.memory_mib, .egress = sr.egress };
	pr = sched_place(ss->sched, &need, NULL, 0, host, url);
	if (pr < 0) {
		api_session_request_free(&sr);
		return no_room(r->conn, pr, &need);
	}
	{
		struct store_session_new n = {
			.customer = r->customer, .spec_json = sr.spec_json, .metadata_json = sr.metadata_json,
			.vcpus = sr.vcpus, .memory_mib = sr.memory_mib, .idle_timeout_s = sr.idle_timeout_s,
			.max_lifetime_s = sr.max_lifetime_s, .egress = sr.egress,
		};
		int cr = store_session_create(ss->st, &n, id, &err);

		if (cr < 0) {
			sched_unplace(ss->sched, host, &need);
			api_session_request_free(&sr);
			return reply_err(r->conn, cr == -EDQUOT ? MHD_HTTP_TOO_MANY_REQUESTS : MHD_HTTP_INTERNAL_SERVER_ERROR,
					 &err);
		}
	}
	ops_enter(ss, id);
	for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
		struct hostclient_reply hr;
		json_t *body, *spec = json_loads(sr.spec_json, 0, NULL);
		char code[64], msg[256];
		int st;

		if (attempt) {
			pr = sched_place(ss->sched, &need, exclude, nex, host, url);
			if (pr < 0)
				break;
		}
		body = json_pack("{s:s, s:s, s:o}", "id", id, "customer", r->customer, "spec", spec ? spec : json_object());
		{
			char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;

			st = hostclient_raw(url, ss->token, "POST", "/v1/sessions", text, text ? strlen(text) : 0,
					    "application/json", CREATE_TIMEOUT_MS, 1u << 20, &hr, &err);
			free(text);
		}
		json_decref(body);
		if (st == 201 || st == 200) {
			hostclient_reply_free(&hr);
			store_session_transition(ss->st, id, SESSION_STARTING, SESSION_RUNNING, host, "", NULL);
			ops_leave(ss, id);
			api_session_request_free(&sr);
			fprintf(stderr, "kiln-api: session %s of %s running on %s\n", id, r->customer, host);
			return reply_session(ss, r->conn, MHD_HTTP_CREATED, id);
		}
		sched_unplace(ss->sched, host, &need);
		snprintf(exclude[nex++], sizeof(exclude[0]), "%s", host);
		if (st < 0) {
			/* It may have been created there all the same: the reaper's
			 * reconciliation destroys it, since the store never says so. */
			snprintf(last, sizeof(last), "%s", err.message);
			continue;
		}
		host_error_code(&hr, code, sizeof(code));
		host_error_message(&hr, msg, sizeof(msg));
		if (st == 503 || st == 409) {
			/* Full (or an id it already has, from a request it answered
			 * too late): the next host. */
			if (st == 503)
				sched_host_full(ss->sched, host);
			snprintf(last, sizeof(last), "host %s: HTTP %d %s: %s", host, st, code, msg);
			hostclient_reply_free(&hr);
			continue;
		}
		/* Refused outright (a spec the host rejects): not worth another host. */
		store_session_discard(ss->st, id);
		ops_leave(ss, id);
		api_session_request_free(&sr);
		fprintf(stderr, "kiln-api: session %s: host %s refused it: HTTP %d %s: %s\n", id, host, st, code, msg);
		ret = relay(r->conn, &hr);
		hostclient_reply_free(&hr);
		return ret;
	}
	store_session_discard(ss->st, id);
	ops_leave(ss, id);
	api_session_request_free(&sr);
	fprintf(stderr, "kiln-api: session %s: no host took it (%s)\n", id, last[0] ? last : "none with room");
	{
		char msg[400];

		snprintf(msg, sizeof(msg), "no host could take the session now%s%s", last[0] ? ": " : "", last);
		return reply_error_h(r->conn, MHD_HTTP_SERVICE_UNAVAILABLE, "no_capacity", msg, "Retry-After",
				     RETRY_AFTER_S);
	}
}

static enum MHD_Result handle_list(struct sessions *ss, const struct sessions_request *r)
{
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
			return reply_error(r->conn, MHD_HTTP_BAD_REQUEST, "invalid_request", "limit: an integer from 1 to 100");
	}
	if (state && strcmp(state, "all") && session_state_parse(state) == SESSION_STATE_COUNT)
		return reply_error(r->conn, MHD_HTTP_BAD_REQUEST, "invalid_request",
				   "state: one of starting, running, pausing, paused, resuming, destroyed, error, all");
	arr = store_session_list(ss->st, r->admin ? NULL : r->customer, state, (unsigned)limit, cursor, &next, &err);
	if (!arr)
		return reply_err(r->conn, strcmp(err.code, "invalid_request") ? MHD_HTTP_INTERNAL_SERVER_ERROR
									       : MHD_HTTP_BAD_REQUEST,
				 &err);
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
		*ret = reply_error(r->conn, MHD_HTTP_CONFLICT, "not_running", msg);
		return 0;
	}
	hs = sched_host_state(ss->sched, cur->host_id, url);
	if (hs != 1) {
		*ret = host_unavailable(r->conn, hs == 0 ? "it is lost" : "it has not been heard from yet");
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
	if (hr->status == 404 && host_lacks(ss, url, id)) {
		vm_lost(ss, id, SESSION_RUNNING);
		return reply_error(r->conn, MHD_HTTP_CONFLICT, "not_running",
				   "the session's VM is gone from its host (it restarted?): the session is error/vm_lost");
	}
	return relay(r->conn, hr);
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
		n = hostclient_stream_read(sr->hs, buf, max, KEEPALIVE_MS, &err);
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
		if (mono_ms() > sr->deadline_ms) {
			relay_fail(sr, "the host sent no result in time");
			continue;
		}
		/* Silence: a keep-alive, between events only. */
		if (relay_at_boundary(sr)) {
			snprintf(sr->extra, sizeof(sr->extra), ": keepalive\n\n");
			sr->extra_len = strlen(sr->extra);
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
	hostclient_stream_close(sr->hs);
	store_session_touch(sr->ss->st, sr->id);
	ops_leave(sr->ss, sr->id);
	sessions_release(sr->ss);
	free(sr);
}

static enum MHD_Result exec_stream(struct sessions *ss, const struct sessions_request *r, const char *url,
				   const char *id, const char *customer, unsigned max_streams, json_t *body,
				   unsigned timeout_s)
{
	struct kiln_err err = { .code = "" };
	struct stream_relay *sr;
	struct MHD_Response *resp;
	char path[96];
	enum MHD_Result ret;
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
	sr->deadline_ms = mono_ms() + (int64_t)timeout_s * 1000 + EXEC_MARGIN_MS;
	snprintf(path, sizeof(path), "/v1/sessions/%s/exec?stream=1", id);
	ops_enter(ss, id);
	store_session_touch(ss->st, id);
	sr->hs = hostclient_stream_open(url, ss->token, "POST", path, body, &err);
	st = sr->hs ? hostclient_stream_status(sr->hs, 30000, &err) : -1;
	if (st != 200) {
		/* An error (busy, invalid, gone): its JSON body, whole. */
		struct hostclient_reply hr = { .status = st };
		char chunk[4096];
		long n;

		while (st > 0 && hr.len < (1u << 20) &&
		       (n = hostclient_stream_read(sr->hs, chunk, sizeof(chunk), 30000, &err)) > 0) {
			char *b = realloc(hr.body, hr.len + (size_t)n + 1);

			if (!b)
				break;
			hr.body = b;
			memcpy(hr.body + hr.len, chunk, (size_t)n);
			hr.len += (size_t)n;
			hr.body[hr.len] = '\0';
		}
		relay_free(sr);
		if (st < 0)
			return host_unavailable(r->conn, err.message);
		ret = relay_or_lost(ss, r, url, id, &hr);
		hostclient_reply_free(&hr);
		return ret;
	}
	resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 << 10, relay_read, sr, relay_free);
	if (!resp) {
		relay_free(sr);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type", "text/event-stream");
	MHD_add_response_header(resp, "Cache-Control", "no-cache");
	ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

static enum MHD_Result handle_exec(struct sessions *ss, const struct sessions_request *r,
				   const struct store_session *cur)
{
	const char *stream = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "stream");
	struct kiln_err err = { .code = "" };
	struct hostclient_reply hr;
	struct quota q;
	enum MHD_Result ret;
	char url[256], path[96], *text;
	json_t *body;
	unsigned timeout_s;

	if (!need_running(ss, r, cur, url, &ret))
		return ret;
	if (store_customer_quota(ss->st, cur->customer, &q) < 0)
		quota_defaults(&q);
	if (api_exec_request_parse(r->body, r->len, q.max_task_timeout_s, &body, &err) < 0)
		return reply_err(r->conn, strcmp(err.code, "internal") ? MHD_HTTP_BAD_REQUEST
								       : MHD_HTTP_INTERNAL_SERVER_ERROR,
				 &err);
	timeout_s = (unsigned)json_integer_value(json_object_get(body, "timeout_s"));
	if (stream && (!strcmp(stream, "1") || !strcmp(stream, "true"))) {
		ret = exec_stream(ss, r, url, cur->id, cur->customer, q.max_streams, body, timeout_s);
		json_decref(body);
		return ret;
	}
	text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	if (!text)
		return reply_internal(r->conn, "out of memory");
	snprintf(path, sizeof(path), "/v1/sessions/%s/exec", cur->id);
	ops_enter(ss, cur->id);
	store_session_touch(ss->st, cur->id);
	hostclient_raw(url, ss->token, "POST", path, text, strlen(text), "application/json",
		       (long)timeout_s * 1000 + EXEC_MARGIN_MS, HOST_REPLY_MAX, &hr, &err);
	free(text);
	store_session_touch(ss->st, cur->id);
	if (hr.status == 200) {
		/* A command that broke the VM ended the session on the host. */
		json_t *res = json_loadb(hr.body ? hr.body : "", hr.len, 0, NULL);

		if (!strcmp(json_string_value(json_object_get(res, "state")) ?: "", "error") &&
		    !strcmp(json_string_value(json_object_get(res, "end_reason")) ?: "", "vm_error") &&
		    store_session_transition(ss->st, cur->id, SESSION_RUNNING, SESSION_ERROR, NULL, "vm_error", NULL) == 1)
			fprintf(stderr, "kiln-api: session %s: its VM failed during an exec: error/vm_error\n", cur->id);
		json_decref(res);
	}
	ops_leave(ss, cur->id);
	ret = hr.status < 0 ? host_unavailable(r->conn, err.message) : relay_or_lost(ss, r, url, cur->id, &hr);
	hostclient_reply_free(&hr);
	return ret;
}

/* POST /v1/sessions/{id}/input: input for the session's running interactive
 * command, relayed to its host (which answers at once: it queues it). Not
 * an operation of its own: the command it feeds is one already. */
static enum MHD_Result handle_input(struct sessions *ss, const struct sessions_request *r,
				    const struct store_session *cur)
{
	struct kiln_err err = { .code = "" };
	struct hostclient_reply hr;
	enum MHD_Result ret;
	char url[256], path[96], *text;
	json_t *body;

	if (api_input_request_parse(r->body, r->len, &body, &err) < 0)
		return reply_err(r->conn, MHD_HTTP_BAD_REQUEST, &err);
	if (!need_running(ss, r, cur, url, &ret)) {
		json_decref(body);
		return ret;
	}
	text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	if (!text)
		return reply_internal(r->conn, "out of memory");
	snprintf(path, sizeof(path), "/v1/sessions/%s/input", cur->id);
	hostclient_raw(url, ss->token, "POST", path, text, strlen(text), "application/json", INPUT_TIMEOUT_MS,
		       HOST_REPLY_MAX, &hr, &err);
	free(text);
	ret = hr.status < 0 ? host_unavailable(r->conn, err.message) : relay_or_lost(ss, r, url, cur->id, &hr);
	hostclient_reply_free(&hr);
	return ret;
}

static enum MHD_Result handle_files(struct sessions *ss, const struct sessions_request *r,
				    const struct store_session *cur)
{
	const char *p = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "path");
	const char *d = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "dir");
	const char *fmt = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "format");
	int put = !strcmp(r->method, "PUT"), tar = fmt && !strcmp(fmt, "tar");
	struct kiln_err err = { .code = "" };
	struct hostclient_reply hr;
	enum MHD_Result ret;
	char url[256], path[8400], *enc;

	if (!put && strcmp(r->method, "GET"))
		return reply_method_not_allowed(r->conn, "GET, PUT");
	if (fmt && (!tar || !d || p))
		return reply_error(r->conn, MHD_HTTP_BAD_REQUEST, "invalid_request",
				   "format: only \"tar\", with dir (a whole directory as a tar archive)");
	if ((p && d) || (!p && !d) || (put && d && !tar))
		return reply_error(r->conn, MHD_HTTP_BAD_REQUEST, "invalid_request",
				   put ? "path (a file) or dir with format=tar (a tar archive to unpack) is required"
				       : "one of path (a file) and dir (a directory listing) is required");
	if (!api_guest_path_ok(p ? p : d))
		return reply_error(r->conn, MHD_HTTP_BAD_REQUEST, "invalid_request",
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
	ops_enter(ss, cur->id);
	store_session_touch(ss->st, cur->id);
	hostclient_raw(url, ss->token, r->method, path, put ? (r->body ? r->body : "") : NULL, put ? r->len : 0,
		       put ? "application/octet-stream" : NULL, FILES_TIMEOUT_MS, HOST_REPLY_MAX, &hr, &err);
	store_session_touch(ss->st, cur->id);
	ops_leave(ss, cur->id);
	if (put && hr.status >= 200 && hr.status < 300)
		ret = reply_json(r->conn, MHD_HTTP_OK,
				 json_pack("{s:s, s:I}", p ? "path" : "dir", p ? p : d, "size", (json_int_t)r->len));
	else
		ret = hr.status < 0 ? host_unavailable(r->conn, err.message) : relay_or_lost(ss, r, url, cur->id, &hr);
	hostclient_reply_free(&hr);
	return ret;
}

static enum MHD_Result handle_outputs(struct sessions *ss, const struct sessions_request *r,
				      const struct store_session *cur)
{
	struct kiln_err err = { .code = "" };
	struct hostclient_reply hr;
	enum MHD_Result ret;
	char url[256], path[96];
	json_t *j;

	if (!need_running(ss, r, cur, url, &ret))
		return ret;
	snprintf(path, sizeof(path), "/v1/sessions/%s/outputs", cur->id);
	ops_enter(ss, cur->id);
	store_session_touch(ss->st, cur->id);
	hostclient_raw(url, ss->token, "POST", path, NULL, 0, NULL, SNAPSHOT_TIMEOUT_MS, 16u << 20, &hr, &err);
	store_session_touch(ss->st, cur->id);
	ops_leave(ss, cur->id);
	if (hr.status < 0)
		return host_unavailable(r->conn, err.message);
	if (hr.status != 200) {
		ret = relay_or_lost(ss, r, url, cur->id, &hr);
		hostclient_reply_free(&hr);
		return ret;
	}
	j = json_loadb(hr.body ? hr.body : "", hr.len, 0, NULL);
	hostclient_reply_free(&hr);
	if (!json_is_object(j)) {
		json_decref(j);
		return reply_error(r->conn, MHD_HTTP_BAD_GATEWAY, "host_error", "the host's answer is not JSON");
	}
	/* Every output gets a presigned GET url, as a task's do, for keys
	 * under the session's own outputs/ only. */
	presign_session_outputs(&ss->cfg->s3, ss->cfg->presign_expiry_s, j, cur->customer, cur->id, time(NULL));
	json_object_set_new(j, "id", json_string(cur->id));
	return reply_json(r->conn, MHD_HTTP_OK, j);
}

static enum MHD_Result handle_resume(struct sessions *ss, const struct sessions_request *r,
				     const struct store_session *cur)
{
	struct kiln_err err = { .code = "" };
	struct sched_need need = { .vcpus = cur->vcpus, .memory_mib = cur->memory_mib, .egress = cur->egress };
	enum session_state prev;
	struct quota q;
	char host[65], url[256], exclude[MAX_ATTEMPTS][65], last[300] = "", *spec_text;
	enum MHD_Result ret;
	int refused, nex = 0, pr, br;

	if (!(cur->state == SESSION_PAUSED || (cur->state == SESSION_ERROR && cur->has_snapshot))) {
		char msg[160];

		snprintf(msg, sizeof(msg), "the session is %s%s: only a paused session can be resumed",
			 session_state_name(cur->state),
			 cur->state == SESSION_ERROR ? " and was never paused (no snapshot)" : "");
		return reply_error(r->conn, MHD_HTTP_CONFLICT, "not_paused", msg);
	}
	if (store_customer_quota(ss->st, cur->customer, &q) < 0)
		return reply_error(r->conn, MHD_HTTP_FORBIDDEN, "forbidden", "this key's customer no longer exists");
	ret = admit(ss, r, &q, cur->vcpus, cur->memory_mib, &refused);
	if (refused)
		return ret;
	pr = sched_place(ss->sched, &need, NULL, 0, host, url);
	if (pr < 0)
		return no_room(r->conn, pr, &need);
	/* The host is recorded only once one has it: a failed attempt leaves nothing to undo there. */
	br = store_session_resume_begin(ss->st, cur->id, cur->customer, "", &prev, &err);
	if (br != 1) {
		sched_unplace(ss->sched, host, &need);
		if (br == -EDQUOT)
			return reply_err(r->conn, MHD_HTTP_TOO_MANY_REQUESTS, &err);
		if (br == 0)
			return reply_error(r->conn, MHD_HTTP_CONFLICT, "not_paused", "the session changed state meanwhile");
		return reply_err(r->conn, MHD_HTTP_INTERNAL_SERVER_ERROR, &err);
	}
	spec_text = store_session_spec(ss->st, cur->id);
	ops_enter(ss, cur->id);
	for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
		struct hostclient_reply hr;
		json_t *spec = spec_text ? json_loads(spec_text, 0, NULL) : NULL, *body;
		char path[96], code[64], msg[256], *text;
		int st;

		if (attempt && sched_place(ss->sched, &need, exclude, nex, host, url) < 0) {
			json_decref(spec);
			break;
		}
		body = json_pack("{s:s, s:o}", "customer", cur->customer, "spec", spec ? spec : json_object());
		text = body ? json_dumps(body, JSON_COMPACT) : NULL;
		json_decref(body);
		snprintf(path, sizeof(path), "/v1/sessions/%s/resume", cur->id);
		st = hostclient_raw(url, ss->token, "POST", path, text, text ? strlen(text) : 0, "application/json",
				    SNAPSHOT_TIMEOUT_MS, 1u << 20, &hr, &err);
		free(text);
		if (st == 200 || st == 201) {
			hostclient_reply_free(&hr);
			store_session_transition(ss->st, cur->id, SESSION_RESUMING, SESSION_RUNNING, host, "", NULL);
			ops_leave(ss, cur->id);
			free(spec_text);
			fprintf(stderr, "kiln-api: session %s resumed on %s\n", cur->id, host);
			return reply_session(ss, r->conn, MHD_HTTP_OK, cur->id);
		}
		sched_unplace(ss->sched, host, &need);
		snprintf(exclude[nex++], sizeof(exclude[0]), "%s", host);
		if (st < 0) {
			snprintf(last, sizeof(last), "%s", err.message);
			continue;
		}
		host_error_code(&hr, code, sizeof(code));
		host_error_message(&hr, msg, sizeof(msg));
		if (st == 503 || st == 409) {
			if (st == 503)
				sched_host_full(ss->sched, host);
			snprintf(last, sizeof(last), "host %s: HTTP %d %s: %s", host, st, code, msg);
			hostclient_reply_free(&hr);
			continue;
		}
		ops_leave(ss, cur->id);
		free(spec_text);
		if (st == 404 || st == 422) {
			/* Its snapshot is missing or damaged: nothing to resume, ever. */
			const char *reason = st == 404 ? "snapshot_missing" : "snapshot_corrupt";

			store_session_transition(ss->st, cur->id, SESSION_RESUMING, SESSION_ERROR, "", reason, NULL);
			fprintf(stderr, "kiln-api: session %s: cannot resume: %s: %s\n", cur->id, reason, msg);
			snprintf(last, sizeof(last), "the session's snapshot is %s (%s): the session is error/%s",
				 st == 404 ? "missing" : "damaged", msg, reason);
			hostclient_reply_free(&hr);
			return reply_error(r->conn, st == 404 ? MHD_HTTP_CONFLICT : 422,
					   st == 404 ? "no_snapshot" : "snapshot_corrupt", last);
		}
		store_session_transition(ss->st, cur->id, SESSION_RESUMING, prev, "", NULL, NULL);
		ret = relay(r->conn, &hr);
		hostclient_reply_free(&hr);
		return ret;
	}
	/* Nobody took it: as it was. */
	store_session_transition(ss->st, cur->id, SESSION_RESUMING, prev, "", NULL, NULL);
	ops_leave(ss, cur->id);
	free(spec_text);
	{
		char msg[400];

		snprintf(msg, sizeof(msg), "no host could resume the session now%s%s", last[0] ? ": " : "", last);
		return reply_error_h(r->conn, MHD_HTTP_SERVICE_UNAVAILABLE, "no_capacity", msg, "Retry-After",
				     RETRY_AFTER_S);
	}
}

static enum MHD_Result route(struct sessions *ss, const struct sessions_request *r);

enum MHD_Result sessions_handle(struct sessions *ss, const struct sessions_request *r)
{
	enum MHD_Result ret = route(ss, r);

	sessions_release(ss);
	return ret;
}

static enum MHD_Result route(struct sessions *ss, const struct sessions_request *r)
{
	const char *p = r->path, *slash;
	struct store_session cur;
	struct outcome o = { 0 };
	char id[40];
	size_t n;

	if (!*p) {
		if (!strcmp(r->method, "GET"))
			return handle_list(ss, r);
		if (strcmp(r->method, "POST"))
			return reply_method_not_allowed(r->conn, "GET, POST");
		if (r->admin)
			return reply_error(r->conn, MHD_HTTP_FORBIDDEN, "forbidden",
					   "an admin key cannot create sessions: use a customer key");
		return handle_create(ss, r);
	}
	if (*p != '/')
		return reply_not_found(r->conn, "no such endpoint");
	p++;
	slash = strchr(p, '/');
	n = slash ? (size_t)(slash - p) : strlen(p);
	if (n == 0 || n >= sizeof(id))
		return reply_not_found(r->conn, "no such session");
	memcpy(id, p, n);
	id[n] = '\0';
	/* Another customer's session does not exist, whatever the path. */
	if (store_session_get(ss->st, id, r->admin ? NULL : r->customer, &cur) < 0)
		return reply_not_found(r->conn, "no such session");
	if (!slash) {
		if (!strcmp(r->method, "GET"))
			return reply_session(ss, r->conn, MHD_HTTP_OK, id);
		if (strcmp(r->method, "DELETE"))
			return reply_method_not_allowed(r->conn, "GET, DELETE");
		ops_enter(ss, id);
		do_destroy(ss, id, "deleted", &o);
		ops_leave(ss, id);
		return reply_outcome(ss, r->conn, id, &o);
	}
	if (!strcmp(slash, "/exec") || !strcmp(slash, "/pause") || !strcmp(slash, "/resume") ||
	    !strcmp(slash, "/outputs") || !strcmp(slash, "/input")) {
		if (strcmp(r->method, "POST"))
			return reply_method_not_allowed(r->conn, "POST");
	} else if (strcmp(slash, "/files")) {
		return reply_not_found(r->conn, "no such endpoint");
	}
	if (r->admin)
		return reply_error(r->conn, MHD_HTTP_FORBIDDEN, "forbidden",
				   "an admin key may only list, read and delete sessions");
	if (!strcmp(slash, "/exec"))
		return handle_exec(ss, r, &cur);
	if (!strcmp(slash, "/input"))
		return handle_input(ss, r, &cur);
	if (!strcmp(slash, "/files"))
		return handle_files(ss, r, &cur);
	if (!strcmp(slash, "/outputs"))
		return handle_outputs(ss, r, &cur);
	if (!strcmp(slash, "/resume"))
		return handle_resume(ss, r, &cur);
	if (cur.state == SESSION_PAUSED)
		return reply_error(r->conn, MHD_HTTP_CONFLICT, "not_running", "the session is paused already");
	ops_enter(ss, id);
	do_pause(ss, id, "paused", &o);
	ops_leave(ss, id);
	return reply_outcome(ss, r->conn, id, &o);
}

/* ---- the reaper ---- */

struct ender {
	struct sessions *ss;
	char id[40];
	char reason[32];
	int pause;
};

static void *ender_main(void *arg)
{
	struct ender *e = arg;
	struct outcome o = { 0 };

	if (e->pause) {
		do_pause(e->ss, e->id, e->reason, &o);
		/* A pause that cannot be done (the host failed) would leave the
		 * session running past its limit: it is destroyed instead. A busy
		 * one (an exec runs, only at the end of its lifetime) is tried
		 * again at the next tick. */
		if (o.status != 200 && strcmp(o.err.code, "busy") && o.status != 503 && o.status != 404 &&
		    strcmp(o.err.code, "not_running"))
			do_destroy(e->ss, e->id, e->reason, &o);
	} else {
		do_destroy(e->ss, e->id, e->reason, &o);
	}
	fprintf(stderr, "kiln-api: session %s: %s: %s%s%s\n", e->id, e->reason,
		o.status == 200 ? (e->pause ? "paused" : "destroyed") : "not ended now", o.status == 200 ? "" : ": ",
		o.status == 200 ? "" : o.err.message);
	ops_leave_ending(e->ss, e->id);
	pthread_mutex_lock(&e->ss->lock);
	e->ss->enders--;
	pthread_cond_broadcast(&e->ss->cond);
	pthread_mutex_unlock(&e->ss->lock);
	free(e);
	return NULL;
}

/* End a session past a limit on a thread of its own (a pause moves its
 * memory to S3: seconds), marked busy meanwhile so the next tick skips it. */
static void end_later(struct sessions *ss, const struct store_session *cur, const char *reason)
{
	struct ender *e = calloc(1, sizeof(*e));
	struct quota q;
	pthread_attr_t attr;
	pthread_t th;

	if (!e)
		return;
	if (!ops_enter_ending(ss, cur->id)) {
		free(e);
		return; /* under way */
	}
	pthread_mutex_lock(&ss->lock);
	if (ss->enders >= MAX_ENDERS) {
		pthread_mutex_unlock(&ss->lock);
		ops_leave_ending(ss, cur->id);
		free(e);
		return; /* the next tick */
	}
	ss->enders++;
	pthread_mutex_unlock(&ss->lock);
	e->ss = ss;
	snprintf(e->id, sizeof(e->id), "%s", cur->id);
	snprintf(e->reason, sizeof(e->reason), "%s", reason);
	e->pause = store_customer_quota(ss->st, cur->customer, &q) == 0 && q.session_auto_pause;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&th, &attr, ender_main, e) != 0) {
		ops_leave_ending(ss, cur->id);
		pthread_mutex_lock(&ss->lock);
		ss->enders--;
		pthread_mutex_unlock(&ss->lock);
		free(e);
	}
	pthread_attr_destroy(&attr);
}

/* A transient state with no request behind it: what a killed kiln-api
 * left. The host says how it ended. */
static void settle_leftover(struct sessions *ss, const struct store_session *cur)
{
	struct kiln_err err = { .code = "" };
	char url[256], path[96];
	json_t *reply = NULL;
	int st = 404, hs = cur->host_id[0] ? sched_host_state(ss->sched, cur->host_id, url) : 0;

	if (hs < 0)
		return; /* not heard of yet: later */
	if (hs == 1) {
		snprintf(path, sizeof(path), "/v1/sessions/%s", cur->id);
		st = hostclient_call(url, ss->token, "GET", path, NULL, SHORT_TIMEOUT_MS, &reply, &err);
		json_decref(reply);
		if (st != 200 && st != 404)
			return; /* no clear answer: later */
	}
	if (st == 200) {
		/* It runs there: a create or resume that completed, or a pause that did not. */
		store_session_transition(ss->st, cur->id, cur->state, SESSION_RUNNING, NULL, "", NULL);
		fprintf(stderr, "kiln-api: session %s was %s when kiln-api stopped; it runs on %s\n", cur->id,
			session_state_name(cur->state), cur->host_id);
		return;
	}
	switch (cur->state) {
	case SESSION_STARTING:
		store_session_transition(ss->st, cur->id, cur->state, SESSION_ERROR, "", "api_restart", NULL);
		break;
	case SESSION_PAUSING:
	case SESSION_RESUMING:
		/* A pause that finished, or a resume that never did: the snapshot
		 * in S3 is the session. */
		store_session_transition(ss->st, cur->id, cur->state, SESSION_PAUSED, "", "api_restart", NULL);
		break;
	default:
		return;
	}
	fprintf(stderr, "kiln-api: session %s was %s when kiln-api stopped; its host has no such session now\n",
		cur->id, session_state_name(cur->state));
}

/* Compare one live host's sessions with the store: a session the host runs
 * that the store has settled otherwise (destroyed, paused, error, elsewhere,
 * unknown) is destroyed there; one the store had running there since before
 * the host's list was taken, that the host no longer has, is lost. */
static void reconcile_host(struct sessions *ss, const char *host, const char *url, const struct store_session *held,
			   int nheld, int64_t listed_ms)
{
	struct kiln_err err = { .code = "" };
	json_t *reply = NULL, *s;
	size_t i;
	int st = hostclient_call(url, ss->token, "GET", "/v1/sessions", NULL, SHORT_TIMEOUT_MS, &reply, &err);
	json_t *list = json_object_get(reply, "sessions");

	if (st != 200 || !json_is_array(list)) {
		json_decref(reply);
		return; /* an older kiln-host without sessions, or no answer: nothing to compare */
	}
	json_array_foreach(list, i, s) {
		const char *id = json_string_value(json_object_get(s, "id"));
		struct store_session cur;
		char path[96];

		int known;

		if (!id || strlen(id) >= sizeof(cur.id) || ops_busy(ss, id))
			continue;
		known = store_session_get(ss->st, id, NULL, &cur) == 0;
		if (known && session_state_holds(cur.state) && !strcmp(cur.host_id, host))
			continue;
		/* A stale copy of a session that is paused, resumable or running
		 * elsewhere goes without its snapshot in S3 (keep_snapshot=1);
		 * one nothing needs (destroyed, unknown, never paused) with it. */
		if (known && cur.state != SESSION_DESTROYED && (cur.has_snapshot || session_state_holds(cur.state)))
			snprintf(path, sizeof(path), "/v1/sessions/%s?keep_snapshot=1", id);
		else
			snprintf(path, sizeof(path), "/v1/sessions/%s", id);
		st = hostclient_call(url, ss->token, "DELETE", path, NULL, 30000, NULL, &err);
		fprintf(stderr, "kiln-api: host %s still had session %s (%s here): destroyed there (HTTP %d)\n", host, id,
			known ? session_state_name(cur.state) : "unknown", st);
	}
	for (int k = 0; k < nheld; k++) {
		struct store_session now;
		int found = 0;

		if (held[k].state != SESSION_RUNNING || strcmp(held[k].host_id, host) || held[k].started_ms >= listed_ms)
			continue;
		json_array_foreach(list, i, s)
			found |= !strcmp(json_string_value(json_object_get(s, "id")) ?: "", held[k].id);
		/* Still the same run on this host (not paused and resumed meanwhile)? */
		if (!found && !ops_busy(ss, held[k].id) && store_session_get(ss->st, held[k].id, NULL, &now) == 0 &&
		    now.state == SESSION_RUNNING && !strcmp(now.host_id, host) && now.started_ms == held[k].started_ms)
			vm_lost(ss, held[k].id, SESSION_RUNNING);
	}
	json_decref(reply);
}

static void reap_once(struct sessions *ss, int reconcile)
{
	struct store_session *held = calloc(MAX_HOLDING, sizeof(*held));
	int n;
	int64_t now = wall_ms();

	if (!held)
		return;
	n = store_sessions_holding(ss->st, held, MAX_HOLDING);
	for (int i = 0; i < n; i++) {
		struct store_session *c = &held[i];
		int hs = c->host_id[0] ? sched_host_state(ss->sched, c->host_id, NULL) : -1;

		if (ops_busy(ss, c->id)) {
			/* An exec running is activity; a lifetime still ends (below, unless paused meanwhile). */
			if (c->state != SESSION_RUNNING || now - c->started_ms <= (int64_t)c->max_lifetime_s * 1000 ||
			    hs != 1)
				continue;
		}
		if (c->state != SESSION_RUNNING) {
			if (!ops_busy(ss, c->id))
				settle_leftover(ss, c);
			continue;
		}
		if (hs == 0) {
			if (store_session_transition(ss->st, c->id, SESSION_RUNNING, SESSION_ERROR, NULL, "host_lost", NULL) ==
			    1)
				fprintf(stderr, "kiln-api: session %s: its host %s is lost: error/host_lost\n", c->id,
					c->host_id);
			continue;
		}
		if (hs != 1)
			continue;
		if (now - c->started_ms > (int64_t)c->max_lifetime_s * 1000)
			end_later(ss, c, "max_lifetime");
		else if (!ops_busy(ss, c->id) && now - c->last_active_ms > (int64_t)c->idle_timeout_s * 1000)
			end_later(ss, c, "idle_timeout");
	}
	if (reconcile) {
		char ids[64][65], urls[64][256];
		int nh = sched_live_hosts(ss->sched, ids, urls, 64);

		for (int h = 0; h < nh; h++)
			reconcile_host(ss, ids[h], urls[h], held, n, wall_ms());
	}
	free(held);
}

static void *reaper_main(void *arg)
{
	struct sessions *ss = arg;
	int64_t last_reconcile = mono_ms();

	pthread_mutex_lock(&ss->lock);
	while (!ss->stopping) {
		struct timespec ts;
		int reconcile = mono_ms() - last_reconcile >= RECONCILE_EVERY_MS;

		pthread_mutex_unlock(&ss->lock);
		if (reconcile)
			last_reconcile = mono_ms();
		reap_once(ss, reconcile);
		pthread_mutex_lock(&ss->lock);
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += REAP_TICK_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		if (!ss->stopping)
			pthread_cond_timedwait(&ss->cond, &ss->lock, &ts);
	}
	pthread_mutex_unlock(&ss->lock);
	return NULL;
}

struct sessions *sessions_start(const struct api_config *cfg, struct store *st, struct sched *sched,
				struct kiln_err *err)
{
	struct sessions *ss = calloc(1, sizeof(*ss));
	pthread_condattr_t ca;

	if (!ss || !(ss->token = strdup(cfg->cluster_token ? cfg->cluster_token : ""))) {
		free(ss);
		kiln_err_set(err, "internal", "out of memory");
		return NULL;
	}
	ss->cfg = cfg;
	ss->st = st;
	ss->sched = sched;
	pthread_mutex_init(&ss->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&ss->cond, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&ss->reaper, NULL, reaper_main, ss) != 0) {
		pthread_mutex_destroy(&ss->lock);
		pthread_cond_destroy(&ss->cond);
		free(ss->token);
		free(ss);
		kiln_err_set(err, "internal", "cannot start the session reaper");
		return NULL;
	}
	return ss;
}

int sessions_stop(struct sessions *ss)
{
	int64_t deadline;

	if (!ss)
		return 0;
	pthread_mutex_lock(&ss->lock);
	ss->stopping = 1;
	pthread_cond_broadcast(&ss->cond);
	pthread_mutex_unlock(&ss->lock);
	pthread_join(ss->reaper, NULL);
	/* Ends in progress finish their host call, or the process exit cuts them. */
	deadline = mono_ms() + 2000;
	pthread_mutex_lock(&ss->lock);
	while ((ss->enders || ss->users) && mono_ms() < deadline) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 100 * 1000000L;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&ss->cond, &ss->lock, &ts);
	}
	if (ss->enders || ss->users) {
		pthread_mutex_unlock(&ss->lock);
		return -1; /* an ender or a request (a long exec) still holds ss */
	}
	pthread_mutex_unlock(&ss->lock);
	for (struct op *o = ss->ops, *nx; o; o = nx) {
		nx = o->next;
		free(o);
	}
	pthread_mutex_destroy(&ss->lock);
	pthread_cond_destroy(&ss->cond);
	free(ss->token);
	free(ss);
	return 0;
}
