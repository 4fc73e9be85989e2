/* serve: kiln-host as a long-running daemon: the HTTP API (libmicrohttpd,
 * one thread per connection, so that event streams may block) over hostd,
 * which owns the tasks. Start-up reaps what a crashed predecessor left,
 * prepares the default snapshot and the warm pool, and recovers the spool. */
#include "serve.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include "clock.h"
#include "config.h"
#include "heartbeat.h"
#include "hostd.h"
#include "proto.h"
#include "run.h"
#include "session.h"
#include "spec.h"
#include "textbuf.h"
#include "vm_ops.h"

/* A request body (a task spec, a session call) is at most this long. */
#define BODY_MAX (SPEC_MAX_JSON + 4096)

struct server {
	const struct serve_opts *o;
	struct run_opts ro;
	struct capacity cap;
	struct pool *pool;
	struct snapshot snap, net_snap;
	int have_snap, have_net_snap;
	struct net_host net;
	struct hostd *hostd;
	struct sessions *sessions;
	struct heartbeat *heartbeat;
	unsigned char token_hash[SHA256_DIGEST_LENGTH];
};

struct request {
	char *body;
	size_t len, cap;
	int too_big;
};

static int reply_json(struct MHD_Connection *conn, unsigned status, json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);
	struct MHD_Response *r;
	int ret;

	json_decref(j);
	if (!s)
		return MHD_NO;
	r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
	MHD_add_response_header(r, "Content-Type", "application/json");
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

static int reply_error(struct MHD_Connection *conn, unsigned status, const char *code, const char *msg)
{
	return reply_json(conn, status, json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", msg));
}

/* 401 unless the request carries "Authorization: Bearer <cluster token>".
 * Both sides are hashed first so that the comparison takes the same time
 * whatever the token's length or content. */
static int authorized(struct server *s, struct MHD_Connection *conn)
{
	const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	unsigned char got[SHA256_DIGEST_LENGTH];

	if (!h || strncmp(h, "Bearer ", 7))
		return 0;
	SHA256((const unsigned char *)h + 7, strlen(h + 7), got);
	return CRYPTO_memcmp(got, s->token_hash, sizeof(got)) == 0;
}

static int reply_unauthorized(struct MHD_Connection *conn)
{
	json_t *j = json_pack("{s:{s:s, s:s}}", "error", "code", "unauthorized", "message",
			      "missing or wrong cluster token (Authorization: Bearer ...)");
	char *body = json_dumps(j, JSON_COMPACT);
	struct MHD_Response *r;
	int ret;

	json_decref(j);
	if (!body)
		return MHD_NO;
	r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	MHD_add_response_header(r, "Content-Type", "application/json");
	MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
	ret = MHD_queue_response(conn, MHD_HTTP_UNAUTHORIZED, r);
	MHD_destroy_response(r);
	return ret;
}

static unsigned status_for(const char *code)
{
	if (!strcmp(code, "invalid_request") || !strcmp(code, "invalid_spec") || !strcmp(code, "invalid_json"))
		return MHD_HTTP_BAD_REQUEST;
	if (!strcmp(code, "duplicate"))
		return MHD_HTTP_CONFLICT;
	if (!strcmp(code, "no_capacity") || !strcmp(code, "no_s3") || !strcmp(code, "egress_unavailable"))
		return MHD_HTTP_SERVICE_UNAVAILABLE;
	return MHD_HTTP_INTERNAL_SERVER_ERROR;
}

/* POST /v1/run: run synchronously and answer with the result (no spool, no
 * S3): for debugging a host and for benchmarks of the VM path alone. */
static int handle_run(struct server *s, struct MHD_Connection *conn, struct request *req)
{
	struct task_spec spec;
	struct kiln_err err = { .code = "" };
	json_t *result, *e;

	if (spec_parse(req->body ? req->body : "", req->len, &spec, &err) < 0)
		return reply_error(conn, MHD_HTTP_BAD_REQUEST, err.code, err.message);
	result = run_task(&spec, &s->ro);
	spec_free(&spec);
	/* Refused before anything started: say so with 503, not as a task result. */
	e = json_object_get(result, "error");
	if (e && !strcmp(json_string_value(json_object_get(e, "code")) ?: "", "no_capacity")) {
		int r = reply_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "no_capacity",
				    json_string_value(json_object_get(e, "message")));

		json_decref(result);
		return r;
	}
	return reply_json(conn, MHD_HTTP_OK, result);
}

/* POST /v1/tasks {"id","customer","spec"} */
static int handle_submit(struct server *s, struct MHD_Connection *conn, struct request *req)
{
	struct kiln_err err = { .code = "" };
	const char *id, *customer;
	json_t *body, *spec, *v;

	body = hostd_request_parse(req->body ? req->body : "", req->len, &id, &customer, &spec, &err);
	if (!body)
		return reply_error(conn, MHD_HTTP_BAD_REQUEST, err.code, err.message);
	if (hostd_submit(s->hostd, id, customer, spec, &err) < 0) {
		json_decref(body);
		return reply_error(conn, status_for(err.code), err.code, err.message);
	}
	v = hostd_task_json(s->hostd, id);
	json_decref(body);
	return reply_json(conn, MHD_HTTP_ACCEPTED, v ? v : json_object());
}

/* GET /v1/tasks/{id}/events: server-sent events, from the task's first one. */
struct sse {
	struct server *s;
	struct hostd_task *t;
	size_t cursor;
};

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct sse *e = cls;
	long n = hostd_events_read(e->s->hostd, e->t, &e->cursor, buf, max, proto_now_ms() + 15000);
	static const char keepalive[] = ": keepalive\n\n";

	if (n < 0)
		return MHD_CONTENT_READER_END_OF_STREAM;
	if (n == 0) {
		memcpy(buf, keepalive, sizeof(keepalive) - 1);
		return (ssize_t)sizeof(keepalive) - 1;
	}
	return n;
}

static void sse_free(void *cls)
{
	struct sse *e = cls;

	hostd_task_put(e->s->hostd, e->t);
	free(e);
}

static int handle_events(struct server *s, struct MHD_Connection *conn, const char *id)
{
	struct sse *e = calloc(1, sizeof(*e));
	struct MHD_Response *r;
	int ret;

	if (!e)
		return MHD_NO;
	e->s = s;
	e->t = hostd_task_get(s->hostd, id);
	if (!e->t) {
		free(e);
		return reply_error(conn, MHD_HTTP_NOT_FOUND, "not_found", "no such task on this host");
	}
	/* Events carry output chunks of up to 128 KiB, JSON-escaped: room for one. */
	r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1 << 20, sse_read, e, sse_free);
	if (!r) {
		sse_free(e);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "text/event-stream");
	MHD_add_response_header(r, "Cache-Control", "no-cache");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

static int handle_metrics(struct server *s, struct MHD_Connection *conn)
{
	char *m = hostd_metrics(s->hostd);
	struct MHD_Response *r;
	int ret;

	if (!m)
		return MHD_NO;
	r = MHD_create_response_from_buffer(strlen(m), m, MHD_RESPMEM_MUST_FREE);
	MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

static int method_not_allowed(struct MHD_Connection *conn, const char *allowed)
{
	char msg[64];

	snprintf(msg, sizeof(msg), "use %s", allowed);
	return reply_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", msg);
}

/* Route /v1/tasks/{id}[/events]. */
static int handle_task(struct server *s, struct MHD_Connection *conn, const char *method, const char *rest)
{
	char id[80];
	const char *slash = strchr(rest, '/');
	size_t n = slash ? (size_t)(slash - rest) : strlen(rest);

	if (n == 0 || n >= sizeof(id))
		return reply_error(conn, MHD_HTTP_NOT_FOUND, "not_found", "no such task on this host");
	memcpy(id, rest, n);
	id[n] = '\0';
	if (slash) {
		if (strcmp(slash, "/events"))
			return reply_error(conn, MHD_HTTP_NOT_FOUND, "not_found", "no such endpoint");
		if (strcmp(method, "GET"))
			return method_not_allowed(conn, "GET");
		return handle_events(s, conn, id);
	}
	if (!strcmp(method, "GET")) {
		json_t *j = hostd_task_json(s->hostd, id);

		return j ? reply_json(conn, MHD_HTTP_OK, j)
			 : reply_error(conn, MHD_HTTP_NOT_FOUND, "not_found", "no such task on this host");
	}
	if (!strcmp(method, "DELETE")) {
		int r = hostd_cancel(s->hostd, id);
		json_t *j;

		if (r == -ENOENT)
			return reply_error(conn, MHD_HTTP_NOT_FOUND, "not_found", "no such task on this host");
		if (r == -EALREADY)
			return reply_error(conn, MHD_HTTP_CONFLICT, "not_cancellable", "the task's code has already ended");
		j = hostd_task_json(s->hostd, id);
		return reply_json(conn, MHD_HTTP_ACCEPTED, j ? j : json_object());
	}
	return method_not_allowed(conn, "GET or DELETE");
}

/* ---- sessions ---- */

static unsigned session_status(const char *code)
{
	static const struct {
		const char *code;
		unsigned status;
	} map[] = {
		{ "not_found", 404 }, { "no_snapshot", 404 }, { "busy", 409 }, { "duplicate", 409 },
		{ "incompatible_snapshot", 409 }, { "invalid_request", 400 }, { "invalid_spec", 400 },
		{ "invalid_json", 400 }, { "too_large", 413 }, { "snapshot_corrupt", 422 }, { "no_capacity", 503 },
		{ "no_s3", 503 }, { "egress_unavailable", 503 }, { "s3_unavailable", 503 }, { "no_exec", 409 },
		{ "input_full", 503 },
	};

	for (size_t i = 0; i < sizeof(map) / sizeof(*map); i++)
		if (!strcmp(code, map[i].code))
			return map[i].status;
	return !strncmp(code, "s3", 2) ? 502 : 500;
}

static int session_error(struct MHD_Connection *conn, const struct kiln_err *err)
{
	return reply_error(conn, session_status(err->code), err->code, err->message);
}

static json_t *body_json(struct request *req, struct kiln_err *err)
{
	json_error_t je;
	json_t *j = json_loadb(req->body ? req->body : "", req->len, JSON_REJECT_DUPLICATES, &je);

	if (!j)
		kiln_err_set(err, "invalid_json", "line %d, column %d: %s", je.line, je.column, je.text);
	else if (!json_is_object(j)) {
		json_decref(j);
		j = NULL;
		kiln_err_set(err, "invalid_request", "expected a JSON object");
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
	struct server *s;
	char id[80];
	json_t *req;
	int raw;               /* an interactive command: output also as data_b64 (a
				* terminal's bytes need not end on a character) */
	pthread_t th;
	pthread_mutex_t lock;  /* everything below */
	pthread_cond_t cond;   /* the queue changed, or the reader went away */
	struct textbuf q;      /* whole events; q.p[q_off..q.len) not read yet */
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
		if (x->deadline_ms <= 0 || proto_now_ms() >= x->deadline_ms)
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
	if (x->q_off == x->q.len) {
		x->q_off = x->q.len = 0;
	} else if (x->q_off > x->q.len / 2) {
		memmove(x->q.p, x->q.p + x->q_off, x->q.len - x->q_off);
		x->q.len -= x->q_off;
		x->q_off = 0;
	}
	if (textbuf_append(&x->q, note, strlen(note)) < 0 || textbuf_append(&x->q, "event: ", 7) < 0 ||
	    textbuf_append(&x->q, event, strlen(event)) < 0 || textbuf_append(&x->q, "\ndata: ", 7) < 0 ||
	    textbuf_append(&x->q, d, strlen(d)) < 0 || textbuf_append(&x->q, "\n\n", 2) < 0)
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
	static const char keepalive[] = ": keepalive\n\n";
	struct exec_stream *x = cls;
	size_t n;

	(void)pos;
	pthread_mutex_lock(&x->lock);
	for (;;) {
		int64_t until = proto_now_ms() + STREAM_KEEPALIVE_MS;

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
		if (max >= sizeof(keepalive) - 1) {
			pthread_mutex_unlock(&x->lock);
			memcpy(buf, keepalive, sizeof(keepalive) - 1);
			return (ssize_t)(sizeof(keepalive) - 1);
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
	textbuf_free(&x->q);
	json_decref(x->req);
	free(x);
}

static int handle_exec_stream(struct server *s, struct MHD_Connection *conn, const char *id, json_t *req)
{
	struct exec_stream *x = calloc(1, sizeof(*x));
	struct MHD_Response *r;
	pthread_condattr_t ca;
	int ret;

	if (!x) {
		json_decref(req);
		return MHD_NO;
	}
	x->s = s;
	snprintf(x->id, sizeof(x->id), "%s", id);
	x->req = req;
	x->raw = json_is_true(json_object_get(req, "interactive")) || json_is_object(json_object_get(req, "tty"));
	pthread_mutex_init(&x->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&x->cond, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&x->th, NULL, exec_stream_main, x) != 0) {
		pthread_cond_destroy(&x->cond);
		pthread_mutex_destroy(&x->lock);
		json_decref(req);
		free(x);
		return MHD_NO;
	}
	r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1 << 20, exec_stream_read, x, exec_stream_free);
	if (!r) {
		exec_stream_free(x);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "text/event-stream");
	MHD_add_response_header(r, "Cache-Control", "no-cache");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

/* Route /v1/sessions[/{id}[/exec|/input|/files|/pause|/resume|/outputs]]. */
static int handle_sessions(struct server *s, struct MHD_Connection *conn, const char *method, const char *rest,
			   struct request *req)
{
	struct kiln_err err = { .code = "" };
	char id[80];
	const char *slash, *op;
	size_t n;
	json_t *j, *out = NULL;

	if (!*rest) {
		if (!strcmp(method, "GET"))
			return reply_json(conn, MHD_HTTP_OK, sessions_list(s->sessions));
		if (strcmp(method, "POST"))
			return method_not_allowed(conn, "GET or POST");
		if (!(j = body_json(req, &err)))
			return session_error(conn, &err);
		if (!json_is_string(json_object_get(j, "id")) || !json_is_string(json_object_get(j, "customer"))) {
			json_decref(j);
			return reply_error(conn, MHD_HTTP_BAD_REQUEST, "invalid_request", "id and customer: expected strings");
		}
		if (session_create(s->sessions, json_string_value(json_object_get(j, "id")),
				   json_string_value(json_object_get(j, "customer")),
				   json_object_get(j, "spec") ? json_object_get(j, "spec") : json_object(), &out, &err) < 0) {
			json_decref(j);
			return session_error(conn, &err);
		}
		json_decref(j);
		return reply_json(conn, MHD_HTTP_CREATED, out);
	}
	slash = strchr(rest, '/');
	n = slash ? (size_t)(slash - rest) : strlen(rest);
	if (n == 0 || n >= sizeof(id))
		return reply_error(conn, MHD_HTTP_NOT_FOUND, "not_found", "no such session on this host");
	memcpy(id, rest, n);
	id[n] = '\0';
	op = slash ? slash + 1 : "";
	if (!*op) {
		if (!strcmp(method, "GET")) {
			j = session_get(s->sessions, id);
			return j ? reply_json(conn, MHD_HTTP_OK, j)
				 : reply_error(conn, MHD_HTTP_NOT_FOUND, "not_found", "no such session on this host");
		}
		if (strcmp(method, "DELETE"))
			return method_not_allowed(conn, "GET or DELETE");
		const char *keep = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "keep_snapshot");

		if (session_delete(s->sessions, id, MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "customer"),
				   keep && !strcmp(keep, "1"), &err) < 0)
			return session_error(conn, &err);
		return reply_json(conn, MHD_HTTP_OK, json_pack("{s:s, s:s}", "id", id, "state", "destroyed"));
	}
	if (!strcmp(op, "files")) {
		const char *path = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "path");
		const char *dir = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "dir");

		const char *format = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "format");
		int tar = format && !strcmp(format, "tar");

		if (format && !tar)
			return reply_error(conn, MHD_HTTP_BAD_REQUEST, "invalid_request", "format: only \"tar\" (with dir)");
		if (tar && (!dir || path))
			return reply_error(conn, MHD_HTTP_BAD_REQUEST, "invalid_request", "format=tar goes with dir= only");
		if (!strcmp(method, "PUT") && tar) {
			if (session_put_tar(s->sessions, id, dir, req->body ? req->body : "", req->len, &err) < 0)
				return session_error(conn, &err);
			return reply_json(conn, MHD_HTTP_OK, json_pack("{s:s, s:I}", "dir", dir, "size", (json_int_t)req->len));
		}
		if (!strcmp(method, "PUT")) {
			if (session_put_file(s->sessions, id, path, req->body ? req->body : "", req->len, &err) < 0)
				return session_error(conn, &err);
			return reply_json(conn, MHD_HTTP_OK, json_pack("{s:s, s:I}", "path", path, "size", (json_int_t)req->len));
		}
		if (strcmp(method, "GET"))
			return method_not_allowed(conn, "GET or PUT");
		if (dir && !tar) {
			out = session_list_dir(s->sessions, id, dir, &err);
			return out ? reply_json(conn, MHD_HTTP_OK, out) : session_error(conn, &err);
		} else {
			unsigned char *data = NULL;
			size_t len = 0;
			struct MHD_Response *r;
			int ret;

			if ((tar ? session_get_tar(s->sessions, id, dir, &data, &len, &err)
				 : session_get_file(s->sessions, id, path, &data, &len, &err)) < 0)
				return session_error(conn, &err);
			r = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
			if (!r) {
				free(data);
				return MHD_NO;
			}
			MHD_add_response_header(r, "Content-Type", tar ? "application/x-tar" : "application/octet-stream");
			ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
			MHD_destroy_response(r);
			return ret;
		}
	}
	if (strcmp(method, "POST"))
		return method_not_allowed(conn, "POST");
	if (!strcmp(op, "exec")) {
		const char *stream = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "stream");

		if (!(j = body_json(req, &err)))
			return session_error(conn, &err);
		if (stream && !strcmp(stream, "1"))
			return handle_exec_stream(s, conn, id, j);
		out = session_exec(s->sessions, id, j, NULL, NULL, &err);
		json_decref(j);
		return out ? reply_json(conn, MHD_HTTP_OK, out) : session_error(conn, &err);
	}
	if (!strcmp(op, "input")) {
		if (!(j = body_json(req, &err)))
			return session_error(conn, &err);
		out = session_input(s->sessions, id, j, &err);
		json_decref(j);
		return out ? reply_json(conn, MHD_HTTP_OK, out) : session_error(conn, &err);
	}
	if (!strcmp(op, "pause")) {
		out = session_pause(s->sessions, id, &err);
		return out ? reply_json(conn, MHD_HTTP_OK, out) : session_error(conn, &err);
	}
	if (!strcmp(op, "resume")) {
		if (!(j = body_json(req, &err)))
			return session_error(conn, &err);
		if (!json_is_string(json_object_get(j, "customer"))) {
			json_decref(j);
			return reply_error(conn, MHD_HTTP_BAD_REQUEST, "invalid_request", "customer: expected a string");
		}
		if (session_resume(s->sessions, id, json_string_value(json_object_get(j, "customer")), &out, &err) < 0) {
			json_decref(j);
			return session_error(conn, &err);
		}
		json_decref(j);
		return reply_json(conn, MHD_HTTP_OK, out);
	}
	if (!strcmp(op, "outputs")) {
		out = session_outputs(s->sessions, id, &err);
		return out ? reply_json(conn, MHD_HTTP_OK, out) : session_error(conn, &err);
	}
	return reply_error(conn, MHD_HTTP_NOT_FOUND, "not_found", "no such endpoint");
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
			       const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct server *s = cls;
	struct request *req = *con_cls;

	if (!req) {
		const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);

		req = calloc(1, sizeof(*req));
		if (!req)
			return MHD_NO;
		*con_cls = req;
		/* Refuse before reading any body: a caller without the token,
		 * and a declared body over the cap (then the connection closes). */
		if (strcmp(url, "/healthz") && !authorized(s, conn))
			return reply_unauthorized(conn);
		if (cl && strtoull(cl, NULL, 10) > BODY_MAX)
			return reply_error(conn, MHD_HTTP_CONTENT_TOO_LARGE, "too_large", "the request body is too large");
		return MHD_YES;
	}
	if (*upload_size) {
		if (req->len + *upload_size > BODY_MAX) {
			req->too_big = 1;
		} else if (!req->too_big) {
			if (req->cap - req->len < *upload_size + 1) {
				size_t cap = (req->len + *upload_size + 1) * 2;
				char *b = realloc(req->body, cap);

				if (!b)
					return MHD_NO;
				req->body = b;
				req->cap = cap;
			}
			memcpy(req->body + req->len, upload, *upload_size);
			req->len += *upload_size;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	if (!strcmp(url, "/healthz")) {
		return reply_json(conn, MHD_HTTP_OK, json_pack("{s:s, s:s}", "status", "ok", "host_id", s->o->host_id));
	}
	if (!authorized(s, conn))
		return reply_unauthorized(conn);
	if (req->too_big)
		return reply_error(conn, MHD_HTTP_CONTENT_TOO_LARGE, "too_large", "the request body is too large");
	if (!strcmp(url, "/v1/tasks")) {
		if (!strcmp(method, "GET")) {
			const char *all = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "all");

			return reply_json(conn, MHD_HTTP_OK,
					  json_pack("{s:o}", "tasks", hostd_task_list(s->hostd, !all || strcmp(all, "1"))));
		}
		if (strcmp(method, "POST"))
			return method_not_allowed(conn, "GET or POST");
		return handle_submit(s, conn, req);
	}
	if (!strncmp(url, "/v1/tasks/", 10))
		return handle_task(s, conn, method, url + 10);
	if (!strcmp(url, "/v1/sessions"))
		return handle_sessions(s, conn, method, "", req);
	if (!strncmp(url, "/v1/sessions/", 13))
		return handle_sessions(s, conn, method, url + 13, req);
	if (!strcmp(url, "/v1/capacity")) {
		if (strcmp(method, "GET"))
			return method_not_allowed(conn, "GET");
		return reply_json(conn, MHD_HTTP_OK, hostd_capacity_json(s->hostd));
	}
	if (!strcmp(url, "/metrics")) {
		if (strcmp(method, "GET"))
			return method_not_allowed(conn, "GET");
		return handle_metrics(s, conn);
	}
	if (!strcmp(url, "/v1/run")) {
		if (strcmp(method, "POST"))
			return method_not_allowed(conn, "POST");
		return handle_run(s, conn, req);
	}
	return reply_error(conn, MHD_HTTP_NOT_FOUND, "not_found", "no such endpoint");
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct request *req = *con_cls;

	if (req) {
		free(req->body);
		free(req);
	}
	*con_cls = NULL;
}

static uint64_t mem_total_mib(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);

	return pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize >> 20 : 1024;
}

/* SIGHUP: reread the configuration file's S3 settings (a fixed secret takes
 * effect without a restart; everything else needs one). */
static void reload_s3(struct server *s)
{
	struct host_config c;
	struct kiln_err err = { .code = "" };

	if (!s->o->config_path) {
		fprintf(stderr, "kiln-host: SIGHUP: no configuration file to reread\n");
		return;
	}
	if (config_load(s->o->config_path, &c, &err) < 0) {
		fprintf(stderr, "kiln-host: SIGHUP: %s (keeping the current settings)\n", err.message);
		return;
	}
	if (!c.s3.endpoint) {
		fprintf(stderr, "kiln-host: SIGHUP: %s has no s3 section (keeping the current settings)\n",
			s->o->config_path);
	} else {
		hostd_set_s3(s->hostd, &c.s3);
		fprintf(stderr, "kiln-host: SIGHUP: S3 settings reloaded from %s\n", s->o->config_path);
	}
	config_free(&c);
}

int serve_main(const struct serve_opts *o, const struct run_opts *ro)
{
	struct server s = { .o = o, .ro = *ro };
	struct MHD_Daemon *d = NULL;
	struct kiln_err err = { .code = "" };
	struct hostd_config hc;
	sigset_t set;
	int sig;
	char key[17];
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

	if (!o->token || !o->token[0]) {
		fprintf(stderr, "kiln-host: serve needs a cluster token (--token, or token/token_file in the config)\n");
		return 2;
	}
	SHA256((const unsigned char *)o->token, strlen(o->token), s.token_hash);
	pthread_mutex_init(&s.cap.lock, NULL);
	s.ro.cap = &s.cap;
	s.cap.total_mib = o->memory_capacity_mib ? o->memory_capacity_mib : mem_total_mib() * 8 / 10;
	/* Signals are taken synchronously below; every thread inherits the mask. */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (o->s3 || o->api)
		s3_global_init();

	vm_reap_stale(ro->vm.run_dir);
	if (net_host_init(&s.net, o->network, &err) < 0)
		goto fail;
	if (s.net.enabled) {
		s.ro.net = &s.net;
		if (!o->cold) {
			/* Tasks with egress start from their own template, one with a NIC. */
			struct vm_config nb = ro->vm;
			int r;

			nb.net = 1;
			if (snapshot_key(&nb, o->snap_memory_mib, o->snap_vcpus, key, &err) < 0)
				goto fail;
			r = snapshot_open(o->cache, key, &s.net_snap, &err);
			if (r < 0) {
				fprintf(stderr, "kiln-host: %s; creating it (the template with a NIC, for egress)\n", err.message);
				if (snapshot_create(&nb, o->cache, o->snap_memory_mib, o->snap_vcpus, 1, &s.net_snap, &err) < 0)
					goto fail;
			}
			s.have_net_snap = 1;
			s.ro.net_snap = &s.net_snap;
		}
	}
	if (!o->cold) {
		int r;

		if (snapshot_key(&ro->vm, o->snap_memory_mib, o->snap_vcpus, key, &err) < 0)
			goto fail;
		r = snapshot_open(o->cache, key, &s.snap, &err);
		if (r < 0) {
			fprintf(stderr, "kiln-host: %s; creating it\n", err.message);
			if (snapshot_create(&ro->vm, o->cache, o->snap_memory_mib, o->snap_vcpus, 1, &s.snap, &err) < 0)
				goto fail;
		}
		s.have_snap = 1;
		s.ro.snap = &s.snap;
		if (o->pool_size || o->prestart) {
			s.pool = pool_start(&s.snap, &ro->vm, o->pool_size, o->prestart, &s.cap, &vm_ops_real,
					    &clock_system);
			if (!s.pool) {
				kiln_err_set(&err, "host_error", "cannot start the pool");
				goto fail;
			}
			s.ro.pool = s.pool;
		}
	}
	hc = (struct hostd_config){
		.host_id = o->host_id,
		.spool_dir = o->spool_dir,
		.vcpus_total = (unsigned)((o->vcpus_capacity ? o->vcpus_capacity : (unsigned)(ncpu > 0 ? ncpu : 1)) *
					  (o->cpu_overcommit > 0 ? o->cpu_overcommit : 4.0)),
		.s3 = o->s3,
		.upload_workers = o->upload_workers,
		.max_backoff_s = o->max_backoff_s,
		.retention_s = o->retention_s ? o->retention_s : 86400,
		.accel = vm_accel_name(ro->vm.accel),
	};
	s.hostd = hostd_open(&hc, &s.ro, &s.cap, s.pool, &vm_ops_real, &clock_system, &err);
	if (!s.hostd)
		goto fail;
	s.sessions = sessions_open(s.hostd, o->host_id, o->spool_dir, &err);
	if (!s.sessions)
		goto fail;
	/* The idle timeout does not cut kiln-api's long requests: its event
	 * and exec streams get a keepalive every 10-15 s, its other calls give
	 * up after at most 60 s. */
	d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG,
			     (uint16_t)o->port, NULL, NULL, handler, &s, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
			     MHD_OPTION_SOCK_ADDR, o->addr,
			     MHD_OPTION_CONNECTION_TIMEOUT, o->connection_timeout_s ? o->connection_timeout_s : 300u,
			     MHD_OPTION_CONNECTION_LIMIT, o->max_connections ? o->max_connections : 1024u,
			     MHD_OPTION_PER_IP_CONNECTION_LIMIT,
			     o->max_connections_per_address ? o->max_connections_per_address : 512u, MHD_OPTION_END);
	if (!d) {
		kiln_err_set(&err, "host_error", "cannot listen on %s:%d", o->listen_host, o->port);
		goto fail;
	}
	if (o->api) {
		char adv[128];

		snprintf(adv, sizeof(adv), "http://%s:%d", o->listen_host, o->port);
		s.heartbeat = heartbeat_start(s.hostd, o->api, o->host_id, o->advertise ? o->advertise : adv, o->token,
					      o->heartbeat_ms, &err);
		if (!s.heartbeat)
			goto fail;
	}
	fprintf(stderr,
		"kiln-host: %s serving on http://%s:%d (pool %u, pre-started %u, capacity %u vCPUs, %llu MiB, spool %s, S3 %s, egress %s)\n",
		o->host_id, o->listen_host, o->port, o->pool_size, o->prestart, hc.vcpus_total,
		(unsigned long long)s.cap.total_mib, o->spool_dir, o->s3 ? o->s3->endpoint : "none",
		s.net.enabled ? "on" : "off");
	for (;;) {
		if (sigwait(&set, &sig) != 0)
			continue;
		if (sig != SIGHUP)
			break;
		reload_s3(&s);
	}
	fprintf(stderr, "kiln-host: %s: shutting down\n", strsignal(sig));
	/* Streams and running tasks end first, then the HTTP threads, then the rest. */
	heartbeat_stop(s.heartbeat);
	hostd_stop(s.hostd);
	MHD_stop_daemon(d);
	sessions_close(s.sessions);
	hostd_close(s.hostd);
	pool_stop(s.pool);
	if (s.have_snap)
		snapshot_close(&s.snap);
	if (s.have_net_snap)
		snapshot_close(&s.net_snap);
	net_host_fini(&s.net);
	return 0;
fail:
	heartbeat_stop(s.heartbeat);
	if (d)
		MHD_stop_daemon(d);
	sessions_close(s.sessions);
	hostd_close(s.hostd);
	pool_stop(s.pool);
	if (s.have_snap)
		snapshot_close(&s.snap);
	if (s.have_net_snap)
		snapshot_close(&s.net_snap);
	net_host_fini(&s.net);
	fprintf(stderr, "kiln-host: %s\n", err.message);
	return 3;
}
