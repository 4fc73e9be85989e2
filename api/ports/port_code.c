/* port_code: kiln's native code API (docs/api.md "Code"): POST
 * /v1/sessions/{id}/code runs a cell in the session's code interpreter
 * (guest/interpreter.py on port 49999, the template code-interpreter) and
 * answers with kiln's result model, streamed as server-sent events or
 * returned whole; /v1/sessions/{id}/code/contexts[/{cid}[/restart]] manage
 * its contexts. kiln-api reaches the interpreter as any port of a session
 * (the caller's key, a running session, kiln-host's tunnel), writes the
 * interpreter's request itself from a checked body, and reads its answer
 * with port_resp (bounded) and port_code_ev (the event lines). A whole
 * answer is held up to CODE_WHOLE_MAX bytes (413 past it: ask for the
 * stream); a stream holds one event line at most. A cell past its
 * timeout_ms is interrupted (the tunnel closes: the interpreter interrupts
 * a cell whose client left) and reported as a TimeoutError. */
#include "ports_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "reply.h"
#include "store/store.h" /* quota_limiter_stream_open */

#define CODE_PORT 49999
#define CODE_OPEN_MS 15000
#define CODE_SEND_MS 60000
#define CODE_SMALL_MS 60000              /* a contexts call (a context's start included) */
#define CODE_WHOLE_MAX (32u << 20)       /* event bytes held for a whole answer */
#define CODE_LINE_MAX (64u << 20)        /* one event line of a stream (a representation is <= 32 MiB) */
#define CODE_SMALL_MAX (1u << 20)        /* a contexts answer, an error body */
#define CODE_KEEPALIVE_MS 15000          /* a quiet stream's comment line */
#define CODE_READ 65536

struct code_call {
	struct sessions *ss;
	char id[40];
	struct quota_limiter *lim;   /* non-NULL: a stream of customer's was counted there */
	char customer[65];
	int fd;                      /* the tunnel to port 49999 (-1: none) */
	int client_fd;               /* the client's socket, polled for its hang-up */
	int entered;                 /* sessions_port_enter done */
	int eof;
	int64_t deadline_ms;         /* the cell's timeout */
	unsigned timeout_ms;
	struct port_resp *r;
	struct buf body;             /* the answer's decoded body, not yet read */
	struct code_exec x;
	struct buf out;              /* a stream's bytes not yet handed out */
	size_t out_off;
	int finished;                /* a stream's last event is in out */
	char raw[CODE_READ];
	size_t raw_len, raw_off;
};

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void call_free(struct code_call *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	if (c->entered)
		sessions_port_leave(c->ss, c->id);
	if (c->lim)
		quota_limiter_stream_close(c->lim, c->customer);
	sessions_release(c->ss);
	buf_free(&c->body);
	buf_free(&c->out);
	code_exec_free(&c->x);
	free(c->r);
	free(c);
}

/* ---- the path ---- */

enum code_route { CODE_NONE, CODE_RUN, CODE_CONTEXTS, CODE_CONTEXT, CODE_RESTART };

/* Which code route url is: id and cid filled (cid "" when none). CODE_NONE
 * when it is not one; -1 when it is one but malformed. */
static int code_route(const char *url, char id[40], char cid[CODE_ID_MAX + 1])
{
	const char *p, *rest;
	size_t n;

	if (strncmp(url, "/v1/sessions/", 13))
		return CODE_NONE;
	p = url + 13;
	n = strcspn(p, "/");
	rest = p + n;
	if (strncmp(rest, "/code", 5) || (rest[5] && rest[5] != '/'))
		return CODE_NONE;
	if (!n || n >= 40)
		return -1;
	memcpy(id, p, n);
	id[n] = 0;
	cid[0] = 0;
	rest += 5;
	if (!*rest)
		return CODE_RUN;
	if (strncmp(rest, "/contexts", 9) || (rest[9] && rest[9] != '/'))
		return -1;
	rest += 9;
	if (!*rest || !strcmp(rest, "/"))
		return CODE_CONTEXTS;
	rest++;
	n = strcspn(rest, "/");
	if (!code_cid_ok(rest, n))
		return -1;
	memcpy(cid, rest, n);
	cid[n] = 0;
	rest += n;
	if (!*rest)
		return CODE_CONTEXT;
	if (!strcmp(rest, "/restart"))
		return CODE_RESTART;
	return -1;
}

int ports_code_path(const char *url)
{
	char id[40], cid[CODE_ID_MAX + 1];

	return code_route(url, id, cid) != CODE_NONE;
}

/* ---- the interpreter's answer ---- */

/* Read more of the answer into the parser: 1 progress, 0 the answer ended,
 * -1 a failure (r->why, or the client hung up: *hung), -2 deadline_ms
 * passed. */
static int pump(struct code_call *c, int64_t deadline_ms, int *hung)
{
	while (c->raw_off == c->raw_len) {
		struct pollfd pf[2] = { { .fd = c->fd, .events = POLLIN },
					{ .fd = c->client_fd, .events = POLLRDHUP } };
		int64_t left = deadline_ms - now_ms();
		ssize_t k;
		int rc;

		if (c->eof)
			return 0;
		k = recv(c->fd, c->raw, sizeof(c->raw), MSG_DONTWAIT);
		if (k > 0) {
			c->raw_len = (size_t)k;
			c->raw_off = 0;
			break;
		}
		if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
			c->eof = 1;
			return port_resp_eof(c->r) == 0 ? 0 : -1;
		}
		if (left <= 0)
			return -2;
		rc = poll(pf, c->client_fd >= 0 ? 2 : 1, left > 30000 ? 30000 : (int)left);
		if (rc > 0 && c->client_fd >= 0 && (pf[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
			snprintf(c->r->why, sizeof(c->r->why), "%s", "the client hung up");
			if (hung)
				*hung = 1;
			return -1;
		}
	}
	{
		long k = port_resp_feed(c->r, c->raw + c->raw_off, c->raw_len - c->raw_off);

		if (k < 0)
			return -1;
		c->raw_off += (size_t)k;
		if (c->r->done)
			c->raw_off = c->raw_len;
	}
	return 1;
}

/* Open the tunnel to the session's interpreter and send one request: 0,
 * or -1 with err (no_interpreter when nothing listens on its port). */
static int code_send(struct code_call *c, const char *customer, const char *method, const char *target,
		     const char *body, struct kiln_err *err)
{
	struct sessions_port_target t;
	struct port_tunnel_fail f;
	struct buf head;
	size_t blen = body ? strlen(body) : 0;
	int rc;

	if (sessions_port_target(c->ss, c->id, customer, 0, NULL, &t, err) < 0)
		return -1;
	c->fd = port_tunnel_open(t.host_url, t.token, t.row.id, CODE_PORT, now_ms() + CODE_OPEN_MS, &f);
	if (c->fd < 0) {
		port_tunnel_error(&f, err);
		if (err->errc == KERR_PORT_CLOSED)
			kiln_err_set(err, KERR_NO_INTERPRETER,
				     "session %s has no code interpreter (nothing listens on port %u in it): create the "
				     "session with the template code-interpreter",
				     c->id, CODE_PORT);
		return -1;
	}
	sessions_port_enter(c->ss, c->id);
	c->entered = 1;
	buf_init(&head, 0);
	rc = buf_printf(&head,
			"%s %s HTTP/1.1\r\nHost: localhost:%u\r\nConnection: close\r\n"
			"Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
			method, target, CODE_PORT, blen);
	if (!rc && blen)
		rc = buf_add(&head, body, blen);
	if (!rc)
		rc = port_send_all(c->fd, head.p, head.len, now_ms() + CODE_SEND_MS);
	buf_free(&head);
	if (rc < 0)
		return kiln_err_set(err, KERR_PORT_CLOSED, "the code interpreter closed the connection");
	return 0;
}

/* The interpreter's error answer (its body {"error","message"} read) as
 * kiln's. */
static void code_refused(struct code_call *c, struct kiln_err *err)
{
	json_t *j = json_loadb(c->body.p ? c->body.p : "", c->body.len, 0, NULL);
	const char *msg = json_string_value(json_object_get(j, "message"));
	unsigned st = (unsigned)c->r->status;
	char m[256];

	snprintf(m, sizeof(m), "%s", msg ? msg : "");
	json_decref(j);
	if (st == 404)
		kiln_err_set(err, KERR_NOT_FOUND, "%s", m[0] ? m : "not found in the code interpreter");
	else if (st == 400 || st == 413)
		kiln_err_set(err, KERR_INVALID_REQUEST, "the code interpreter refused the request: %s", m);
	else
		kiln_err_set(err, KERR_PORT_CLOSED, "the code interpreter answered %u%s%s", st, m[0] ? ": " : "", m);
}

/* Read the answer's head (and, for an error, its body) until deadline_ms:
 * 0 with a 2xx head read, -1 with err. */
static int code_head(struct code_call *c, int64_t deadline_ms, struct kiln_err *err)
{
	while (!c->r->head_done) {
		int rc = pump(c, deadline_ms, NULL);

		if (rc == 1)
			continue;
		if (rc == -2)
			return kiln_err_set(err, KERR_TIMEOUT, "the code interpreter did not answer in time");
		return kiln_err_set(err, KERR_PORT_CLOSED, "the code interpreter gave no valid answer: %s",
				    c->r->why[0] ? c->r->why : "it closed the connection");
	}
	if (c->r->status >= 200 && c->r->status < 300)
		return 0;
	while (!c->r->done && pump(c, now_ms() + 5000, NULL) == 1)
		;
	code_refused(c, err);
	return -1;
}

/* ---- contexts ---- */

static enum MHD_Result reply_code_err(struct MHD_Connection *conn, const struct kiln_err *err)
{
	/* No answer in time from the interpreter (a contexts call): as a cut
	 * one (kiln's timeout code is not an HTTP answer's). */
	if (err->errc == KERR_TIMEOUT)
		return reply_error(conn, KERR_PORT_CLOSED, err->message);
	return reply_err(conn, err);
}

static enum MHD_Result contexts_call(struct code_call *c, struct MHD_Connection *conn, const char *customer,
				     enum code_route route, const char *method, const char *cid, const char *body,
				     size_t len)
{
	struct kiln_err err = { .code = "" };
	char target[64 + CODE_ID_MAX];
	char *send = NULL;
	json_t *j;
	enum MHD_Result ret;

	if (route == CODE_CONTEXTS && !strcmp(method, "POST")) {
		/* {language?, cwd?}: checked here, written again. */
		json_t *in = len ? json_loadb(body, len, 0, NULL) : json_object();
		json_t *lang = json_object_get(in, "language"), *cwd = json_object_get(in, "cwd");
		json_t *o = json_object();

		if (!json_is_object(in)) {
			json_decref(in);
			json_decref(o);
			return reply_error(conn, KERR_INVALID_JSON, "the body is not a JSON object");
		}
		if ((lang && !json_is_null(lang) && (!json_is_string(lang) || json_string_length(lang) > 32)) ||
		    (cwd && !json_is_null(cwd) &&
		     (!json_is_string(cwd) || json_string_length(cwd) > 4096 || json_string_value(cwd)[0] != '/'))) {
			json_decref(in);
			json_decref(o);
			return reply_error(conn, KERR_INVALID_REQUEST,
					   "language: a string (python, bash); cwd: an absolute path");
		}
		if (json_is_string(lang))
			json_object_set(o, "language", lang);
		if (json_is_string(cwd))
			json_object_set(o, "cwd", cwd);
		send = json_dumps(o, JSON_COMPACT);
		json_decref(in);
		json_decref(o);
		if (!send)
			return reply_internal(conn, "out of memory");
		snprintf(target, sizeof(target), "/contexts");
	} else if (route == CODE_CONTEXTS && !strcmp(method, "GET")) {
		snprintf(target, sizeof(target), "/contexts");
	} else if (route == CODE_CONTEXT && !strcmp(method, "DELETE")) {
		snprintf(target, sizeof(target), "/contexts/%s", cid);
	} else if (route == CODE_RESTART && !strcmp(method, "POST")) {
		snprintf(target, sizeof(target), "/contexts/%s/restart", cid);
		send = strdup("{}");
	} else {
		return reply_method_not_allowed(conn, route == CODE_CONTEXTS ? "GET, POST"
						      : route == CODE_CONTEXT ? "DELETE"
									      : "POST");
	}
	if (code_send(c, customer, method, target, send, &err) < 0 ||
	    code_head(c, now_ms() + CODE_SMALL_MS, &err) < 0) {
		free(send);
		return reply_code_err(conn, &err);
	}
	free(send);
	while (!c->r->done) {
		int rc = pump(c, now_ms() + CODE_SMALL_MS, NULL);

		if (rc == 1)
			continue;
		if (rc == 0 && c->r->done)
			break;
		return reply_error(conn, rc == -2 ? KERR_HOST_UNAVAILABLE : KERR_PORT_CLOSED,
				   "the code interpreter's answer was cut or too large");
	}
	if (route == CODE_CONTEXT)
		return reply_bytes(conn, 204, NULL, 0, NULL);
	j = json_loadb(c->body.p ? c->body.p : "", c->body.len, 0, NULL);
	if (route == CODE_CONTEXTS && !strcmp(method, "GET")) {
		json_t *v;
		size_t i;

		if (!json_is_array(j)) {
			json_decref(j);
			return reply_error(conn, KERR_PORT_CLOSED, "the code interpreter's context list is not a list");
		}
		json_array_foreach(j, i, v)
			if (!json_is_object(v)) {
				json_decref(j);
				return reply_error(conn, KERR_PORT_CLOSED, "the code interpreter's context list is not a list");
			}
		ret = reply_json(conn, 200, json_pack("{s:o}", "contexts", j));
		return ret;
	}
	if (!json_is_object(j) || !json_is_string(json_object_get(j, "id"))) {
		json_decref(j);
		return reply_error(conn, KERR_PORT_CLOSED, "the code interpreter's context is not an object with an id");
	}
	return reply_json(conn, route == CODE_CONTEXTS ? 201 : 200, j);
}

/* ---- running a cell ---- */

/* Drain the decoded body into the event reader. */
static int code_drain(struct code_call *c, code_ev_fn fn)
{
	int rc = 0;

	if (c->body.len)
		rc = code_exec_feed(&c->x, c->body.p, c->body.len, fn, c);
	buf_reset(&c->body);
	return rc;
}

/* A stream's event as SSE into c->out. */
static int sse_event(void *cls, const char *name, json_t *ev)
{
	struct code_call *c = cls;
	char *s;
	int rc;

	if (!strcmp(name, "end"))
		json_object_set_new(ev, "execution_count", c->x.count >= 0 ? json_integer(c->x.count) : json_null());
	s = json_dumps(ev, JSON_COMPACT);
	if (!s)
		return -ENOMEM;
	rc = reply_sse_event(&c->out, name, s);
	free(s);
	if (!strcmp(name, "end"))
		c->finished = 1;
	return rc;
}

/* A stream's ending of kiln's own: an error event, then end. */
static void sse_fail(struct code_call *c, const char *name, const char *value)
{
	json_t *e = json_pack("{s:s, s:s, s:s}", "name", name, "value", value, "traceback", "");

	if (e)
		sse_event(c, "error", e);
	json_decref(e);
	e = json_object();
	if (e)
		sse_event(c, "end", e);
	json_decref(e);
	c->finished = 1;
	if (c->fd >= 0) {
		/* The interpreter interrupts a cell whose client left. */
		close(c->fd);
		c->fd = -1;
	}
}

static char *timeout_msg(const struct code_call *c, char *m, size_t cap)
{
	snprintf(m, cap, "the cell ran past its timeout_ms (%u ms) and was interrupted", c->timeout_ms);
	return m;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *out, size_t max)
{
	struct code_call *c = cls;
	char m[160];

	(void)pos;
	for (;;) {
		int rc, hung = 0;
		int64_t now;

		if (c->out.len > c->out_off) {
			size_t n = c->out.len - c->out_off;

			if (n > max)
				n = max;
			memcpy(out, c->out.p + c->out_off, n);
			c->out_off += n;
			if (c->out_off == c->out.len) {
				buf_reset(&c->out);
				c->out_off = 0;
			}
			return (ssize_t)n;
		}
		if (c->finished)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (c->body.len) {
			/* Read already (with the head, or with the answer's end). */
			rc = code_drain(c, sse_event);
			if (rc == -E2BIG)
				sse_fail(c, "OutputTooLarge", "an event of the cell is larger than kiln-api passes on (64 MiB)");
			else if (rc < 0)
				return MHD_CONTENT_READER_END_WITH_ERROR;
			continue;
		}
		if (c->r->done || c->eof) {
			sse_fail(c, "InterpreterError", "the code interpreter's answer ended before the cell did");
			continue;
		}
		now = now_ms();
		if (now >= c->deadline_ms) {
			sse_fail(c, "TimeoutError", timeout_msg(c, m, sizeof(m)));
			continue;
		}
		rc = pump(c, c->deadline_ms < now + CODE_KEEPALIVE_MS ? c->deadline_ms : now + CODE_KEEPALIVE_MS, &hung);
		if (rc == -2) {
			if (now_ms() < c->deadline_ms)
				return reply_sse_keepalive(out, max) ?: MHD_CONTENT_READER_END_WITH_ERROR;
			continue;
		}
		if (rc == -1 && hung)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (rc == -1) {
			snprintf(m, sizeof(m), "the code interpreter's answer was not valid: %s", c->r->why);
			sse_fail(c, "InterpreterError", m);
			continue;
		}
		rc = code_drain(c, sse_event);
		if (rc == -E2BIG)
			sse_fail(c, "OutputTooLarge", "an event of the cell is larger than kiln-api passes on (64 MiB)");
		else if (rc < 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
	}
}

static void sse_free(void *cls)
{
	call_free(cls);
}

/* Whether the client asked for a stream. */
static int wants_sse(struct MHD_Connection *conn)
{
	const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Accept");

	return a && strcasestr(a, "text/event-stream");
}

static enum MHD_Result run_whole(struct code_call *c, struct MHD_Connection *conn)
{
	char m[160];

	for (;;) {
		int rc = code_drain(c, NULL);

		if (rc == -E2BIG) {
			snprintf(m, sizeof(m),
				 "the cell's output passed %u MiB, what kiln-api holds for a whole answer: ask for it as "
				 "a stream (Accept: text/event-stream)",
				 CODE_WHOLE_MAX >> 20);
			return reply_error(conn, KERR_TOO_LARGE, m);
		}
		if (c->x.ended)
			break;
		if (c->r->done || c->eof)
			return reply_error(conn, KERR_PORT_CLOSED,
					   "the code interpreter's answer ended before the cell did");
		rc = pump(c, c->deadline_ms, NULL);
		if (rc == -2) {
			json_t *e = json_pack("{s:s, s:s, s:s}", "name", "TimeoutError", "value",
					      timeout_msg(c, m, sizeof(m)), "traceback", "");

			/* What the cell did until then, and why it stopped. */
			json_decref(c->x.error);
			c->x.error = e;
			break;
		}
		if (rc == -1)
			return reply_error(conn, KERR_PORT_CLOSED, "the code interpreter's answer was cut or not valid");
	}
	return reply_json(conn, 200, code_exec_result(&c->x));
}

enum MHD_Result ports_code_handle(struct sessions *ss, struct MHD_Connection *conn, const char *method,
				  const char *url, const char *body, size_t len, const char *customer,
				  struct quota_limiter *lim, unsigned max_streams, int admin)
{
	struct code_call *c = calloc(1, sizeof(*c));
	char cid[CODE_ID_MAX + 1];
	struct kiln_err err = { .code = "" };
	const union MHD_ConnectionInfo *ci;
	enum MHD_Result ret;
	int route;
	char *send;

	if (!c) {
		sessions_release(ss);
		return MHD_NO;
	}
	c->ss = ss;
	c->fd = -1;
	c->client_fd = -1;
	buf_init(&c->body, CODE_SMALL_MAX);
	buf_init(&c->out, 0);
	c->r = malloc(sizeof(*c->r));
	if (!c->r) {
		call_free(c);
		return MHD_NO;
	}
	port_resp_init(c->r, 0, &c->body);
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (ci)
		c->client_fd = ci->connect_fd;
	route = code_route(url, c->id, cid);
	if (route < 0 || route == CODE_NONE) {
		call_free(c);
		return reply_error(conn, KERR_NOT_FOUND, "no such code endpoint (/code, /code/contexts[/{id}[/restart]])");
	}
	if (route != CODE_RUN) {
		ret = contexts_call(c, conn, customer, (enum code_route)route, method, cid, body, len);
		call_free(c);
		return ret;
	}
	if (strcmp(method, "POST")) {
		call_free(c);
		return reply_method_not_allowed(conn, "POST");
	}
	send = ports_code_request(body, len, &c->timeout_ms, &err);
	if (!send) {
		call_free(c);
		return reply_err(conn, &err);
	}
	/* A cell holds a connection and a thread as long as it runs. */
	if (!admin && lim) {
		if (!quota_limiter_stream_open(lim, customer, max_streams)) {
			free(send);
			call_free(c);
			return reply_too_many_streams(conn, max_streams);
		}
		c->lim = lim;
		snprintf(c->customer, sizeof(c->customer), "%s", customer);
	}
	c->deadline_ms = now_ms() + c->timeout_ms;
	if (code_send(c, customer, "POST", "/execute", send, &err) < 0) {
		free(send);
		call_free(c);
		return reply_code_err(conn, &err);
	}
	free(send);
	if (code_head(c, c->deadline_ms, &err) < 0 && err.errc != KERR_TIMEOUT) {
		call_free(c);
		return reply_code_err(conn, &err);
	}
	if (wants_sse(conn)) {
		code_exec_init(&c->x, 0, CODE_LINE_MAX);
		if (err.errc == KERR_TIMEOUT) {
			/* Its context ran another cell all along: it never began. */
			char m[160];

			snprintf(m, sizeof(m), "the cell did not start within its timeout_ms (%u ms): its context was busy",
				 c->timeout_ms);
			sse_fail(c, "TimeoutError", m);
		}
		return reply_sse(conn, CODE_READ, sse_read, c, sse_free);
	}
	code_exec_init(&c->x, CODE_WHOLE_MAX, CODE_WHOLE_MAX + 1);
	if (err.errc == KERR_TIMEOUT) {
		char m[160];

		snprintf(m, sizeof(m), "the cell did not start within its timeout_ms (%u ms): its context was busy",
			 c->timeout_ms);
		c->x.error = json_pack("{s:s, s:s, s:s}", "name", "TimeoutError", "value", m, "traceback", "");
		ret = reply_json(conn, 200, code_exec_result(&c->x));
	} else {
		ret = run_whole(c, conn);
	}
	call_free(c);
	return ret;
}
