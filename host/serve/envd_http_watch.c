/* envd_http_watch: filesystem.Filesystem's directory watching over a
 * session's envd channel: the server stream WatchDir (5-byte Connect
 * envelopes: {"start":{}}, then {"filesystem":{name,type}} per event and
 * {"keepalive":{}} after Keepalive-Ping-Interval seconds of silence) and the
 * polling watchers CreateWatcher, GetWatcherEvents, RemoveWatcher. The
 * watches themselves are host/envd/envd_watch.c's. Every field is checked
 * before it reaches the guest. */
#include "envd_http_int.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "buf.h"
#include "connect_call.h"
#include "connectrpc.h"
#include "envd/envd.h"
#include "eproto.h"
#include "reply.h"

/* Events taken per read of the stream before its envelopes go out. */
#define WSTREAM_BATCH 64

/* E2B's filesystem.EventType, by enum eproto_wevent. */
static const char *event_type_name(uint8_t t)
{
	static const char *const names[] = { NULL, "EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE", "EVENT_TYPE_REMOVE",
					     "EVENT_TYPE_RENAME", "EVENT_TYPE_CHMOD" };

	return t < sizeof(names) / sizeof(*names) ? names[t] : NULL;
}

/* {name, type}; NULL for a name that is not UTF-8 (protobuf JSON cannot say
 * it) or an unknown type. */
static json_t *event_json(uint8_t type, const char *name)
{
	const char *t = event_type_name(type);
	json_t *n = t ? json_string(name) : NULL;

	return n ? json_pack("{s:o, s:s}", "name", n, "type", t) : NULL;
}

/* The request's {path, recursive}: 0, or -1 with e set. */
static int watch_args(json_t *req, const char **path, int *recursive, struct envd_err *e)
{
	json_t *rec = json_object_get(req, "recursive");
	int bad = 0;

	*path = envd_http_jstr(req, "path", PROTO_MAX_PATH, &bad);
	if (bad || !*path || !**path || (rec && !json_is_boolean(rec) && !json_is_null(rec))) {
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "expected {\"path\": a directory, \"recursive\": bool}");
		return -1;
	}
	*recursive = json_is_true(rec);
	return 0;
}

/* ---- WatchDir ----------------------------------------------------------------- */

struct wstream {
	struct envd_watch *w;
	int64_t deadline;     /* Connect-Timeout-Ms: the stream ends then (0: none) */
	int64_t keepalive_ms;
	struct buf st;        /* envelopes not yet handed to libmicrohttpd */
	size_t st_off;
	int finished;
	struct envd_wevent ev;
};

static void wstream_msg(struct wstream *s, json_t *j)
{
	if (j)
		connect_env_append_json(&s->st, j);
	json_decref(j);
}

/* The next envelopes into s->st (at least one unless it finished). */
static void wstream_fill(struct wstream *s)
{
	int64_t until = envd_http_now_ms() + s->keepalive_ms;
	struct envd_err e = { 0 };
	int n, taken = 0;

	if (s->deadline && s->deadline < until)
		until = s->deadline;
	if (s->deadline && envd_http_now_ms() >= s->deadline) {
		/* Events that keep coming do not hold the deadline off. */
		connect_end_append(&s->st, CONNECT_DEADLINE_EXCEEDED, "the watch's deadline (Connect-Timeout-Ms) passed");
		s->finished = 1;
		return;
	}
	/* What is queued goes out together; then wait for more. */
	while (taken < WSTREAM_BATCH &&
	       (n = envd_watch_next(s->w, &s->ev, taken ? envd_http_now_ms() : until, &e)) == 1) {
		json_t *ev = event_json(s->ev.type, s->ev.name);

		taken++;
		if (ev)
			wstream_msg(s, json_pack("{s:o}", "filesystem", ev));
	}
	if (taken)
		return;
	if (n < 0) {
		connect_end_append(&s->st, e.code, e.msg);
		s->finished = 1;
		return;
	}
	if (s->deadline && envd_http_now_ms() >= s->deadline)
		return; /* the next fill ends it */
	wstream_msg(s, json_pack("{s:{}}", "keepalive"));
}

static ssize_t wstream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct wstream *s = cls;
	size_t n;

	(void)pos;
	while (s->st.len == s->st_off) {
		if (s->finished)
			return MHD_CONTENT_READER_END_OF_STREAM;
		buf_reset(&s->st);
		s->st_off = 0;
		wstream_fill(s);
	}
	n = s->st.len - s->st_off;
	if (n > max)
		n = max;
	memcpy(buf, s->st.p + s->st_off, n);
	s->st_off += n;
	return (ssize_t)n;
}

/* The client went away (or the stream ended): the guest's watch goes too. */
static void wstream_free(void *cls)
{
	struct wstream *s = cls;

	envd_watch_close(s->w);
	buf_free(&s->st);
	free(s);
}

enum MHD_Result envd_http_watch_stream(struct session_table *ss, struct httpd_req *r)
{
	const char *ka = envd_http_header(r->conn, "Keepalive-Ping-Interval");
	int64_t to = connect_timeout_ms(envd_http_header(r->conn, "Connect-Timeout-Ms"));
	struct envd_err e = { 0 };
	struct MHD_Response *resp;
	struct wstream *s = NULL;
	struct envd *ch = NULL;
	json_t *req, *env = NULL;
	char user[EPROTO_MAX_USER + 1];
	const char *path;
	int recursive;
	enum MHD_Result ret;

	req = envd_http_request_json(r, 1, &e);
	if (!req)
		return envd_http_stream_error(r->conn, &e);
	if (to < 0) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "Connect-Timeout-Ms: expected 1-10 digits");
		goto fail;
	}
	if (envd_http_auth_user(r->conn, user) < 0) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "Authorization: expected Basic base64(user:) with a valid user name");
		goto fail;
	}
	if (watch_args(req, &path, &recursive, &e) < 0)
		goto fail;
	s = calloc(1, sizeof(*s));
	if (!s) {
		envd_http_eset(&e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		goto fail;
	}
	buf_init(&s->st, 0);
	s->keepalive_ms = STREAM_KEEPALIVE_S * 1000;
	if (ka && atoi(ka) > 0 && atoi(ka) <= 3600)
		s->keepalive_ms = (int64_t)atoi(ka) * 1000;
	s->deadline = to ? envd_http_now_ms() + to : 0;
	ch = envd_http_channel(ss, r->param[0], &env, &e);
	if (!ch)
		goto fail;
	s->w = envd_watch_open(ch, user, path, recursive, envd_http_now_ms() + UNARY_DEFAULT_MS, &e);
	envd_unref(ch); /* the watch holds its own reference */
	if (!s->w)
		goto fail;
	json_decref(req);
	json_decref(env);
	wstream_msg(s, json_pack("{s:{}}", "start"));
	resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, wstream_read, s, wstream_free);
	if (!resp) {
		wstream_free(s);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type", "application/connect+json");
	ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
fail:
	if (s)
		buf_free(&s->st);
	free(s);
	json_decref(req);
	json_decref(env);
	return envd_http_stream_error(r->conn, &e);
}

/* ---- polling watchers ------------------------------------------------------------- */

int envd_http_watch_method(const char *method)
{
	return !strcmp(method, "CreateWatcher") || !strcmp(method, "GetWatcherEvents") || !strcmp(method, "RemoveWatcher");
}

static void add_event(void *arg, uint8_t type, const char *name)
{
	json_t *ev = event_json(type, name);

	if (ev)
		json_array_append_new(arg, ev);
}

json_t *envd_http_watch_unary(struct envd *ch, const char *method, const char *user, json_t *req, int64_t deadline,
			      struct envd_err *e)
{
	char id[ENVD_WATCHER_ID];
	const char *wid;
	int bad = 0;

	if (!strcmp(method, "CreateWatcher")) {
		const char *path;
		int recursive;

		if (watch_args(req, &path, &recursive, e) < 0 ||
		    envd_watcher_create(ch, user, path, recursive, deadline, id, e) < 0)
			return NULL;
		return json_pack("{s:s}", "watcherId", id);
	}
	wid = envd_http_jstr(req, "watcherId", ENVD_WATCHER_ID - 1, &bad);
	if (bad || !wid || !*wid) {
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "watcherId: expected a watcher's id");
		return NULL;
	}
	if (!strcmp(method, "GetWatcherEvents")) {
		json_t *a = json_array();

		if (envd_watcher_events(ch, wid, add_event, a, e) < 0) {
			json_decref(a);
			return NULL;
		}
		return json_pack("{s:o}", "events", a);
	}
	return envd_watcher_remove(ch, wid, e) < 0 ? NULL : json_object();
}
