/* serve_sessions: kiln-host's session routes (/v1/sessions/...: create,
 * list, get, delete, files, exec and its event stream, input, pause, resume,
 * outputs, the pause cache) and the E2B envd routes that hand over to
 * envd_http.c. serve.c's route table points here. */
#include "serve_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include "buf.h"
#include "clock.h"
#include "condwait.h"
#include "envd_http.h"
#include "httpd.h"
#include "reply.h"
#include "run/run.h"
#include "session/session.h"
#include "spec.h"
#include "task/task.h"
#include "template/template.h"
#include "template_build/template_build.h"

/* ---- sessions ---- */

/* Failures are answered with reply_err: the code's status in lib/err.h's
 * table is the one docs/api.md gives kiln-host's session endpoints. */

static json_t *body_json(const struct httpd_body *req, struct kiln_err *err)
{
	json_error_t je;
	json_t *j = json_loadb(httpd_body_data(req) ? httpd_body_data(req) : "", httpd_body_len(req), JSON_REJECT_DUPLICATES, &je);

	if (!j)
		kiln_err_set(err, KERR_INVALID_JSON, "line %d, column %d: %s", je.line, je.column, je.text);
	else if (!json_is_object(j)) {
		json_decref(j);
		j = NULL;
		kiln_err_set(err, KERR_INVALID_REQUEST, "expected a JSON object");
	}
	return j;
}

/* POST /v1/sessions/{id}/exec?stream=1: the command runs on a thread of its
 * own (the producer) that queues server-sent events; the response's reader
 * (the consumer, on the connection's thread) takes them out as the client
 * reads. The queue is bounded (STREAM_QUEUE_MAX). When it is full the
 * producer waits for room, so that a slow client slows the command down as
 * a pipe would and loses nothing; but never past the command's deadline:
 * the producer is the loop that enforces the timeout, and a client that
 * stops reading must not hold the command, and with it the session, past
 * its timeout_s. Output events that find no room after the deadline are
 * dropped (the result event holds the output) and a `truncated` event says
 * so. The last event (result or error) waits for room as long as the reader
 * is there: the session is free by then, only this stream waits. */
struct exec_stream {
	struct serve_http *s;
	char id[80];
	json_t *req;
	int raw;               /* an interactive command: output also as data_b64 (a
				* terminal's bytes need not end on a character) */
	pthread_t th;
	pthread_mutex_t lock;  /* everything below */
	pthread_cond_t cond;   /* the queue changed, or the reader went away */
	struct buf q;          /* whole events; q.p[q_off..q.len) not read yet */
	size_t q_off;
	int64_t deadline_ms;   /* the command's (RUN_EV_RUNNING); 0 until it runs */
	uint64_t dropped;      /* bytes of events dropped, not yet reported */
	int done;              /* the last event is queued */
	int reader_gone;       /* exec_stream_free: nobody reads any more */
	char exec_id[40];      /* its id, once started (interactive commands) */
};

#define STREAM_QUEUE_MAX    (1u << 20) /* events queued for a slow client */
#define STREAM_KEEPALIVE_MS 10000      /* a quiet command's stream still shows it is alive */

/* pthread_cond_timedwait until deadline_ms (proto_now_ms clock; the
 * condition variable uses CLOCK_MONOTONIC). */
static int stream_wait_until(struct exec_stream *x, int64_t deadline_ms)
{
	struct timespec ts = { .tv_sec = deadline_ms / 1000, .tv_nsec = (deadline_ms % 1000) * 1000000 };

	return pthread_cond_timedwait(&x->cond, &x->lock, &ts);
}

/* Queue one event (takes data). last: the final one, after which the
 * stream ends. See struct exec_stream for when it waits and when it drops. */
static void stream_put(struct exec_stream *x, const char *event, json_t *data, int last)
{
	char *d = json_dumps(data, JSON_COMPACT);
	char note[200] = "";
	size_t need;

	json_decref(data);
	pthread_mutex_lock(&x->lock);
	if (!d)
		goto out;
	need = strlen(event) + strlen(d) + 16 + sizeof(note);
	for (;;) {
		size_t queued = x->q.len - x->q_off;

		if (x->reader_gone)
			goto drop;
		/* An event larger than the queue still goes, into an empty one. */
		if (queued == 0 || queued + need <= STREAM_QUEUE_MAX)
			break;
		if (last) {
			pthread_cond_wait(&x->cond, &x->lock);
			continue;
		}
		if (x->deadline_ms <= 0 || clock_mono_ms() >= x->deadline_ms)
			goto drop;
		stream_wait_until(x, x->deadline_ms);
	}
	/* Room again: first say what was lost. */
	if (x->dropped)
		snprintf(note, sizeof(note),
			 "event: truncated\ndata: {\"dropped_bytes\":%llu,\"message\":\"the client read too slowly: "
			 "output events were dropped after the command's timeout; the result has its output\"}\n\n",
			 (unsigned long long)x->dropped);
	x->dropped = 0;
	if (x->q_off == x->q.len || x->q_off > x->q.len / 2) {
		buf_consume(&x->q, x->q_off);
		x->q_off = 0;
	}
	if (buf_adds(&x->q, note) < 0 || reply_sse_event(&x->q, event, d) < 0)
		fprintf(stderr, "kiln-host: session %s: out of memory queueing a stream event\n", x->id);
	goto out;
drop:
	x->dropped += strlen(event) + strlen(d) + 16;
out:
	if (last)
		x->done = 1;
	pthread_cond_broadcast(&x->cond);
	pthread_mutex_unlock(&x->lock);
	free(d);
}

static void exec_stream_event(void *ctx, int ev, const void *data, size_t len)
{
	struct exec_stream *x = ctx;
	json_t *d;
	char *s;

	if (ev == RUN_EV_RUNNING) {
		const struct run_started *st = data;

		/* The exec id is what input requests name; the deadline bounds
		 * how long a slow reader may hold the command back. */
		pthread_mutex_lock(&x->lock);
		x->deadline_ms = st->deadline_ms;
		if (st->exec_id)
			snprintf(x->exec_id, sizeof(x->exec_id), "%s", st->exec_id);
		pthread_mutex_unlock(&x->lock);
		stream_put(x, "started", st->exec_id ? json_pack("{s:s}", "exec_id", st->exec_id) : json_object(), 0);
		return;
	}
	if (ev != RUN_EV_STDOUT && ev != RUN_EV_STDERR)
		return;
	s = textbuf_to_utf8(data, len);
	d = json_pack("{s:s}", "data", s ? s : "");
	free(s);
	if (x->raw) {
		char *b64 = malloc(4 * ((len + 2) / 3) + 1);

		if (b64) {
			EVP_EncodeBlock((unsigned char *)b64, data, (int)len);
			json_object_set_new(d, "data_b64", json_string(b64));
			free(b64);
		}
	}
	stream_put(x, ev == RUN_EV_STDOUT ? "stdout" : "stderr", d, 0);
}

static void *exec_stream_main(void *arg)
{
	struct exec_stream *x = arg;
	struct kiln_err err = { .code = "" };
	json_t *res = session_exec(x->s->sessions, x->id, x->req, exec_stream_event, x, &err);

	if (res)
		stream_put(x, "result", res, 1);
	else
		stream_put(x, "error", json_pack("{s:s, s:s}", "code", err.code, "message", err.message), 1);
	return NULL;
}

static ssize_t exec_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct exec_stream *x = cls;
	size_t n;

	(void)pos;
	pthread_mutex_lock(&x->lock);
	for (;;) {
		int64_t until = clock_mono_ms() + STREAM_KEEPALIVE_MS;

		while (x->q.len == x->q_off && !x->done)
			if (stream_wait_until(x, until) == ETIMEDOUT)
				break;
		n = x->q.len - x->q_off;
		if (n)
			break;
		if (x->done) {
			pthread_mutex_unlock(&x->lock);
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		/* Silence: events are queued whole, so an empty queue is
		 * between events, where a comment line may go. A client that
		 * went away is noticed when it cannot be written (exec_stream_free). */
		if ((n = (size_t)reply_sse_keepalive(buf, max))) {
			pthread_mutex_unlock(&x->lock);
			return (ssize_t)n;
		}
	}
	if (n > max)
		n = max;
	memcpy(buf, x->q.p + x->q_off, n);
	x->q_off += n;
	pthread_cond_broadcast(&x->cond); /* room for the producer */
	pthread_mutex_unlock(&x->lock);
	return (ssize_t)n;
}

static void exec_stream_free(void *cls)
{
	struct exec_stream *x = cls;
	char exec_id[40];

	/* A reader that went away: the producer waits for room no more. An
	 * interactive command has nobody to talk to, so it is hung up; any
	 * other still ends on its own (its timeout bounds it), its events
	 * going nowhere. After a whole stream the command is over and this
	 * finds nothing. */
	pthread_mutex_lock(&x->lock);
	x->reader_gone = 1;
	memcpy(exec_id, x->exec_id, sizeof(exec_id));
	pthread_cond_broadcast(&x->cond);
	pthread_mutex_unlock(&x->lock);
	if (x->raw && exec_id[0])
		session_interrupt(x->s->sessions, x->id, exec_id);
	pthread_join(x->th, NULL);
	pthread_cond_destroy(&x->cond);
	pthread_mutex_destroy(&x->lock);
	buf_free(&x->q);
	json_decref(x->req);
	free(x);
}

static enum MHD_Result handle_exec_stream(struct serve_http *s, struct MHD_Connection *conn, const char *id, json_t *req)
{
	struct exec_stream *x = calloc(1, sizeof(*x));

	if (!x) {
		json_decref(req);
		return MHD_NO;
	}
	x->s = s;
	snprintf(x->id, sizeof(x->id), "%s", id);
	x->req = req;
	x->raw = json_is_true(json_object_get(req, "interactive")) || json_is_object(json_object_get(req, "tty"));
	pthread_mutex_init(&x->lock, NULL);
	condwait_init(&x->cond);
	if (pthread_create(&x->th, NULL, exec_stream_main, x) != 0) {
		pthread_cond_destroy(&x->cond);
		pthread_mutex_destroy(&x->lock);
		json_decref(req);
		free(x);
		return MHD_NO;
	}
	return reply_sse(conn, 1 << 20, exec_stream_read, x, exec_stream_free);
}

/* The session named by the path, or NULL (answer 404) when it cannot be one. */
static const char *session_id(struct httpd_req *r)
{
	return strlen(r->param[0]) < 80 ? r->param[0] : NULL;
}

static enum MHD_Result no_session(struct MHD_Connection *conn)
{
	return reply_error(conn, KERR_NOT_FOUND, "no such session on this host");
}

/* GET /v1/sessions */
enum MHD_Result serve_sessions_get_list(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;

	return reply_json(r->conn, MHD_HTTP_OK, sessions_list(s->sessions));
}

/* The top-level "template" member of a session request (absent: *has 0). */
static int body_template_ref(json_t *j, struct template_ref *out, int *has, struct kiln_err *err)
{
	json_t *v = json_object_get(j, "template");

	*has = 0;
	if (!v)
		return 0;
	if (template_ref_parse_json(v, out, err) < 0)
		return -1;
	*has = 1;
	return 0;
}

/* The end of a session create or resume: the template reference (NULL:
 * none) and the request body j go, then the answer: status with out, or
 * err when rc < 0. */
static enum MHD_Result session_answer(struct httpd_req *r, json_t *j, struct template_ref *ref, int rc,
				      unsigned status, json_t *out, struct kiln_err *err)
{
	if (ref)
		template_ref_free(ref);
	json_decref(j);
	return rc < 0 ? reply_err(r->conn, err) : reply_json(r->conn, status, out);
}

/* POST /v1/sessions {"id","customer","spec","template"?} */
enum MHD_Result serve_sessions_post(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	json_t *j, *out = NULL;
	struct template_ref ref;
	int has_ref, rc;

	if (!(j = body_json(r->body, &err)))
		return reply_err(r->conn, &err);
	if (!json_is_string(json_object_get(j, "id")) || !json_is_string(json_object_get(j, "customer"))) {
		json_decref(j);
		return reply_error(r->conn, KERR_INVALID_REQUEST, "id and customer: expected strings");
	}
	if (body_template_ref(j, &ref, &has_ref, &err) < 0) {
		json_decref(j);
		return reply_err(r->conn, &err);
	}
	rc = session_create(s->sessions, json_string_value(json_object_get(j, "id")),
			    json_string_value(json_object_get(j, "customer")),
			    json_object_get(j, "spec") ? json_object_get(j, "spec") : json_object(), has_ref ? &ref : NULL,
			    &out, &err);
	return session_answer(r, j, has_ref ? &ref : NULL, rc, MHD_HTTP_CREATED, out, &err);
}

/* GET /v1/sessions/{id} */
enum MHD_Result serve_session_get_one(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	const char *id = session_id(r);
	json_t *j = id ? session_get(s->sessions, id) : NULL;

	return j ? reply_json(r->conn, MHD_HTTP_OK, j) : no_session(r->conn);
}

/* DELETE /v1/sessions/{id}[?keep_snapshot=1][&customer=C] */
enum MHD_Result serve_session_del(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *id = session_id(r);
	const char *keep = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "keep_snapshot");

	if (!id)
		return no_session(r->conn);
	if (session_delete(s->sessions, id, MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "customer"),
			   keep && !strcmp(keep, "1"), &err) < 0)
		return reply_err(r->conn, &err);
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:s, s:s}", "id", id, "state", "destroyed"));
}

/* DELETE /v1/sessions/{id}/pause-cache?customer=C: this host's pause-cache
 * copies of a session that resumed on another host (kiln-api's clean-up);
 * nothing else of it. */
enum MHD_Result serve_session_pcache_del(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *id = session_id(r);
	int n;

	n = sessions_pcache_drop(s->sessions, id,
				 MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "customer"), &err);
	if (n < 0)
		return reply_err(r->conn, &err);
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:s, s:b}", "id", id, "dropped", n));
}

/* GET and PUT /v1/sessions/{id}/files?path=P | ?dir=D[&format=tar] */
enum MHD_Result serve_session_files(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct MHD_Connection *conn = r->conn;
	struct kiln_err err = { .code = "" };
	const char *id = session_id(r);
	const char *path = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "path");
	const char *dir = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "dir");
	const char *format = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "format");
	const char *data = httpd_body_data(r->body) ? httpd_body_data(r->body) : "";
	size_t len = httpd_body_len(r->body);
	int tar = format && !strcmp(format, "tar");
	json_t *out;

	if (!id)
		return no_session(conn);
	if (format && !tar)
		return reply_error(conn, KERR_INVALID_REQUEST, "format: only \"tar\" (with dir)");
	if (tar && (!dir || path))
		return reply_error(conn, KERR_INVALID_REQUEST, "format=tar goes with dir= only");
	if (!strcmp(r->method, "PUT") && tar) {
		if (session_put_tar(s->sessions, id, dir, data, len, &err) < 0)
			return reply_err(conn, &err);
		return reply_json(conn, MHD_HTTP_OK, json_pack("{s:s, s:I}", "dir", dir, "size", (json_int_t)len));
	}
	if (!strcmp(r->method, "PUT")) {
		if (session_put_file(s->sessions, id, path, data, len, &err) < 0)
			return reply_err(conn, &err);
		return reply_json(conn, MHD_HTTP_OK, json_pack("{s:s, s:I}", "path", path, "size", (json_int_t)len));
	}
	if (dir && !tar) {
		out = session_list_dir(s->sessions, id, dir, &err);
		return out ? reply_json(conn, MHD_HTTP_OK, out) : reply_err(conn, &err);
	} else {
		unsigned char *bytes = NULL;
		size_t n = 0;

		if ((tar ? session_get_tar(s->sessions, id, dir, &bytes, &n, &err)
			 : session_get_file(s->sessions, id, path, &bytes, &n, &err)) < 0)
			return reply_err(conn, &err);
		return reply_bytes(conn, MHD_HTTP_OK, (char *)bytes, n,
				   tar ? "application/x-tar" : "application/octet-stream");
	}
}

/* POST /v1/sessions/{id}/exec[?stream=1] */
enum MHD_Result serve_session_exec_post(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *id = session_id(r);
	const char *stream = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "stream");
	json_t *j, *out;

	if (!id)
		return no_session(r->conn);
	if (!(j = body_json(r->body, &err)))
		return reply_err(r->conn, &err);
	if (stream && !strcmp(stream, "1"))
		return handle_exec_stream(s, r->conn, id, j);
	out = session_exec(s->sessions, id, j, NULL, NULL, &err);
	json_decref(j);
	return out ? reply_json(r->conn, MHD_HTTP_OK, out) : reply_err(r->conn, &err);
}

/* POST /v1/sessions/{id}/input */
enum MHD_Result serve_session_input_post(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *id = session_id(r);
	json_t *j, *out;

	if (!id)
		return no_session(r->conn);
	if (!(j = body_json(r->body, &err)))
		return reply_err(r->conn, &err);
	out = session_input(s->sessions, id, j, &err);
	json_decref(j);
	return out ? reply_json(r->conn, MHD_HTTP_OK, out) : reply_err(r->conn, &err);
}

/* PUT /v1/sessions/{id}/network {"egress":"allow","allow":[...]}: the
 * session's egress rules replaced while it runs ("egress" may be left out:
 * a session with a network device keeps "allow"). */
enum MHD_Result serve_session_network_put(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *id = session_id(r);
	json_t *j, *out;

	if (!id)
		return no_session(r->conn);
	if (!(j = body_json(r->body, &err)))
		return reply_err(r->conn, &err);
	if (!json_object_get(j, "egress"))
		json_object_set_new(j, "egress", json_string("allow"));
	out = session_network(s->sessions, id, j, &err);
	json_decref(j);
	return out ? reply_json(r->conn, MHD_HTTP_OK, out) : reply_err(r->conn, &err);
}

/* POST /v1/sessions/{id}/pause */
enum MHD_Result serve_session_pause_post(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *id = session_id(r);
	json_t *out;

	if (!id)
		return no_session(r->conn);
	out = session_pause(s->sessions, id, &err);
	return out ? reply_json(r->conn, MHD_HTTP_OK, out) : reply_err(r->conn, &err);
}

/* POST /v1/sessions/{id}/resume {"customer","template"?,"snapshot"?}: a
 * paused session back, or (with "snapshot") a new session id started from
 * that snapshot. */
enum MHD_Result serve_session_resume_post(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *id = session_id(r);
	json_t *j, *out = NULL, *snap, *wait;
	struct template_ref ref;
	int has_ref, rc;

	if (!id)
		return no_session(r->conn);
	if (!(j = body_json(r->body, &err)))
		return reply_err(r->conn, &err);
	if (!json_is_string(json_object_get(j, "customer"))) {
		json_decref(j);
		return reply_error(r->conn, KERR_INVALID_REQUEST, "customer: expected a string");
	}
	if (body_template_ref(j, &ref, &has_ref, &err) < 0) {
		json_decref(j);
		return reply_err(r->conn, &err);
	}
	snap = json_object_get(j, "snapshot");
	wait = json_object_get(j, "wait_ms");
	if ((snap && !json_is_string(snap)) ||
	    (wait && (!snap || !json_is_integer(wait) || json_integer_value(wait) < 0 ||
		      json_integer_value(wait) > SESSION_SNAPSHOT_WAIT_MAX_MS))) {
		json_decref(j);
		if (has_ref)
			template_ref_free(&ref);
		return reply_error(r->conn, KERR_INVALID_REQUEST,
				   "snapshot: expected a string; wait_ms (with a snapshot): expected 0 to 300000");
	}
	rc = session_resume(s->sessions, id, json_string_value(json_object_get(j, "customer")),
			    json_string_value(snap), wait ? (unsigned)json_integer_value(wait) : 0,
			    has_ref ? &ref : NULL, &out, &err);
	return session_answer(r, j, has_ref ? &ref : NULL, rc, MHD_HTTP_OK, out, &err);
}

/* POST /v1/sessions/{id}/checkpoint {"customer"?,"snapshot"}: the running
 * session's state kept as that snapshot in S3; the session goes on. */
enum MHD_Result serve_session_checkpoint_post(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *id = session_id(r);
	json_t *j, *out, *cust, *fork;

	if (!id)
		return no_session(r->conn);
	if (!(j = body_json(r->body, &err)))
		return reply_err(r->conn, &err);
	cust = json_object_get(j, "customer");
	fork = json_object_get(j, "fork");
	if (!json_is_string(json_object_get(j, "snapshot")) || (cust && !json_is_string(cust)) ||
	    (fork && !json_is_boolean(fork))) {
		json_decref(j);
		return reply_error(r->conn, KERR_INVALID_REQUEST,
				   "snapshot (and customer): expected strings; fork: expected a boolean");
	}
	out = session_checkpoint(s->sessions, id, json_string_value(cust),
				 json_string_value(json_object_get(j, "snapshot")), json_is_true(fork), &err);
	json_decref(j);
	return out ? reply_json(r->conn, MHD_HTTP_OK, out) : reply_err(r->conn, &err);
}

/* DELETE /v1/snapshots/{id}?customer=C: every object of the snapshot in S3
 * (kiln-api asks once no session started from it is left). */
enum MHD_Result serve_snapshot_del(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *customer = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "customer");
	int n;

	if (!customer)
		return reply_error(r->conn, KERR_INVALID_REQUEST, "customer: expected ?customer=");
	n = sessions_snapshot_delete(s->sessions, customer, r->param[0], &err);
	if (n < 0)
		return reply_err(r->conn, &err);
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:s, s:i}", "id", r->param[0], "deleted", n));
}

/* GET /v1/volumes/{id}?customer=C: the volume's manifest in S3, summed up
 * (404 not_found: it has none). */
enum MHD_Result serve_volume_get(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *customer = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "customer");
	json_t *out;

	if (!customer)
		return reply_error(r->conn, KERR_INVALID_REQUEST, "customer: expected ?customer=");
	out = sessions_volume_get(s->sessions, customer, r->param[0], &err);
	return out ? reply_json(r->conn, MHD_HTTP_OK, out) : reply_err(r->conn, &err);
}

/* DELETE /v1/volumes/{id}?customer=C: every object of the volume in S3
 * (kiln-api asks when the customer deletes it, none mounting it). */
enum MHD_Result serve_volume_del(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *customer = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "customer");
	int n;

	if (!customer)
		return reply_error(r->conn, KERR_INVALID_REQUEST, "customer: expected ?customer=");
	n = sessions_volume_delete(s->sessions, customer, r->param[0], &err);
	if (n < 0)
		return reply_err(r->conn, &err);
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:s, s:i}", "id", r->param[0], "deleted", n));
}

/* POST /v1/sessions/{id}/outputs */
enum MHD_Result serve_session_outputs_post(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *id = session_id(r);
	struct dest dest;
	int have_dest = 0;
	json_t *out;

	if (!id)
		return no_session(r->conn);
	/* An optional {"destination":{...}}: the customer's own bucket. */
	if (httpd_body_len(r->body)) {
		json_error_t je;
		json_t *j = json_loadb(httpd_body_data(r->body), httpd_body_len(r->body), JSON_REJECT_DUPLICATES, &je);

		if (!j || json_object_size(j) != 1 || !json_object_get(j, "destination")) {
			json_decref(j);
			return reply_error(r->conn, KERR_INVALID_REQUEST, "expected no body or {\"destination\":{...}}");
		}
		if (dest_from_json(json_object_get(j, "destination"), DEST_SECRET_REQUIRED, NULL, &dest, &err) < 0) {
			json_decref(j);
			return reply_err(r->conn, &err);
		}
		json_decref(j);
		have_dest = 1;
	}
	out = session_outputs_to(s->sessions, id, have_dest ? &dest : NULL, &err);
	if (have_dest)
		dest_wipe(&dest);
	return out ? reply_json(r->conn, MHD_HTTP_OK, out) : reply_err(r->conn, &err);
}

/* ---- E2B envd (envd_http.c) ---- */

/* POST /v1/sessions/{id}/envd/{service}/{method} */
enum MHD_Result serve_envd_rpc_post(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;

	return envd_http_rpc(s->sessions, r);
}

/* GET /v1/sessions/{id}/envd/files (POST is streamed: handler) */
enum MHD_Result serve_envd_files_get(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;

	return envd_http_files_get(s->sessions, r);
}

/* GET /v1/sessions/{id}/envd/health */
enum MHD_Result serve_envd_health_get(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;

	return envd_http_health(s->sessions, r);
}

/* GET /v1/sessions/{id}/metrics */
enum MHD_Result serve_session_metrics_get(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;

	return envd_http_metrics(s->sessions, r);
}
