/* test_httpc: unit tests for lib/httpc.c, the HTTP client, against a tiny
 * HTTP server on 127.0.0.1 (a thread with a raw socket, port 0) that plays
 * back a scripted reply in pieces: status and body, one connection shared
 * by one-shot requests (keep-alive), the reply cap, a
 * timeout, JSON both ways, server-sent events cut anywhere (split reads,
 * multi-line data, comments, CRLF), the error body of a non-200 answer, a
 * stopped follow reading its stream's end to keep the connection (bounded
 * when the end never comes), a reply read piece by piece, and the SSE
 * parser on its own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "httpc.h"

/* ---- the server ---------------------------------------------------------- */

#define MAX_PIECES 8

struct server {
	int lfd;
	int port;
	pthread_t thread;
	const char *pieces[MAX_PIECES]; /* the reply, written one piece at a time */
	int gap_ms;                     /* pause between pieces (forces split reads) */
	int hang;                       /* answer nothing; wait for the client to leave */
	char req[16384];                /* the request as received (head and body) */
	size_t req_len;
	char url[64];
	/* The body as a whole, also past what req holds: its length and a
	 * checksum (sum of (offset+1)*byte mod 2^32), for large uploads. */
	size_t body_len;
	uint32_t body_sum;
};

/* Account n body bytes that start at body offset off. */
static void body_account(struct server *s, const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		s->body_sum += (uint32_t)(s->body_len + i + 1) * (unsigned char)p[i];
	s->body_len += n;
}

/* Read the request head, then Content-Length bytes of body (what does not
 * fit in req is only counted and summed). */
static void read_request(struct server *s, int fd)
{
	size_t want = 0, head = 0;
	char *end = NULL, scratch[65536];

	for (;;) {
		ssize_t n;

		if (end && s->body_len >= want)
			return;
		if (s->req_len < sizeof(s->req) - 1) {
			n = read(fd, s->req + s->req_len, sizeof(s->req) - 1 - s->req_len);
			if (n <= 0)
				return;
			s->req_len += (size_t)n;
			s->req[s->req_len] = '\0';
		} else {
			n = read(fd, scratch, sizeof(scratch));
			if (n <= 0)
				return;
			body_account(s, scratch, (size_t)n);
			continue;
		}
		if (!end && (end = strstr(s->req, "\r\n\r\n"))) {
			const char *cl = strcasestr(s->req, "\r\nContent-Length:");

			if (cl && cl < end)
				want = strtoul(cl + 17, NULL, 10);
			head = (size_t)(end - s->req) + 4;
			body_account(s, s->req + head, s->req_len - head);
		} else if (end) {
			body_account(s, s->req + s->req_len - (size_t)n, (size_t)n);
		}
	}
}

static void *server_main(void *arg)
{
	struct server *s = arg;
	int fd = accept(s->lfd, NULL, NULL), one = 1;

	if (fd < 0)
		return NULL;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	read_request(s, fd);
	if (s->hang) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		char c;

		/* Until the client gives up and closes (bounded, should it not). */
		if (poll(&p, 1, 10000) > 0)
			(void)read(fd, &c, 1);
	}
	for (int i = 0; !s->hang && i < MAX_PIECES && s->pieces[i]; i++) {
		if (i && s->gap_ms)
			usleep((useconds_t)s->gap_ms * 1000);
		if (send(fd, s->pieces[i], strlen(s->pieces[i]), MSG_NOSIGNAL) < 0)
			break;
	}
	close(fd);
	return NULL;
}

/* Listen on 127.0.0.1 (port 0), the URL ending in path, and serve with fn
 * on a thread. */
static void server_start_with(struct server *s, void *(*fn)(void *), const char *path)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);

	s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(s->lfd >= 0);
	assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(s->lfd, 4), 0);
	assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&a, &len), 0);
	s->port = ntohs(a.sin_port);
	snprintf(s->url, sizeof(s->url), "http://127.0.0.1:%d%s", s->port, path);
	assert_int_equal(pthread_create(&s->thread, NULL, fn, s), 0);
}

static void server_start(struct server *s)
{
	server_start_with(s, server_main, "/x");
}

static void server_join(struct server *s)
{
	pthread_join(s->thread, NULL);
	close(s->lfd);
}

/* ---- requests ------------------------------------------------------------- */

static void test_status_and_body(void **state)
{
	struct server s = { .pieces = { "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\n"
					"Content-Length: 5\r\nConnection: close\r\n\r\nhello" } };
	struct httpc_req q = { .method = "PUT", .bearer = "tok3n", .content_type = "application/octet-stream",
			       .body = "abc", .body_len = 3, .lim = { .timeout_ms = 5000 } };
	struct httpc_reply r;

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_request(NULL, &q, &r), 0);
	server_join(&s);
	assert_int_equal(r.status, 201);
	assert_int_equal(r.body.len, 5);
	assert_string_equal(r.body.p, "hello");
	assert_string_equal(r.content_type, "text/plain");
	assert_non_null(strstr(s.req, "PUT /x HTTP/1.1\r\n"));
	assert_non_null(strstr(s.req, "\r\nAuthorization: Bearer tok3n\r\n"));
	assert_non_null(strstr(s.req, "\r\nContent-Type: application/octet-stream\r\n"));
	assert_null(strcasestr(s.req, "Expect:"));
	assert_string_equal(s.req + s.req_len - 7, "\r\n\r\nabc");
	httpc_reply_free(&r);
}

/* A body read piece by piece: a pseudo-random byte sequence produced on
 * demand, never held whole. */
struct gen {
	size_t total, off;
	size_t calls, max_piece;
	uint32_t sum;     /* as the server sums it */
	size_t fail_at;   /* refuse once off reaches this (0: never) */
};

static long gen_read(void *arg, char *p, size_t n)
{
	struct gen *g = arg;
	size_t k = g->total - g->off < n ? g->total - g->off : n;

	if (g->fail_at && g->off >= g->fail_at)
		return -1;
	for (size_t i = 0; i < k; i++) {
		p[i] = (char)((g->off + i) * 2654435761u >> 13);
		g->sum += (uint32_t)(g->off + i + 1) * (unsigned char)p[i];
	}
	g->off += k;
	g->calls++;
	if (k > g->max_piece)
		g->max_piece = k;
	return (long)k;
}

/* 8 MiB streamed through body_read: Content-Length, the method, every byte
 * in order, in many small pieces; the reply is read as usual. */
static void test_body_read_streams(void **state)
{
	struct server s = { .pieces = { "HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\n"
					"Content-Length: 11\r\nConnection: close\r\n\r\n{\"ok\":true}" } };
	struct gen g = { .total = 8u << 20 };
	struct httpc_req q = { .method = "POST", .bearer = "k", .content_type = "application/x-tar",
			       .body_read = gen_read, .body_ctx = &g, .body_len = 8u << 20,
			       .lim = { .timeout_ms = 20000 } };
	struct httpc_reply r;
	json_t *reply = NULL;

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_json(NULL, &q, NULL, &reply, &r), 0);
	server_join(&s);
	assert_int_equal(r.status, 202);
	assert_true(json_is_true(json_object_get(reply, "ok")));
	assert_non_null(strstr(s.req, "POST /x HTTP/1.1\r\n"));
	assert_non_null(strstr(s.req, "\r\nContent-Length: 8388608\r\n"));
	assert_non_null(strstr(s.req, "\r\nContent-Type: application/x-tar\r\n"));
	assert_null(strcasestr(s.req, "Expect:"));
	assert_null(strcasestr(s.req, "Transfer-Encoding"));
	assert_int_equal(g.off, g.total);
	assert_int_equal(s.body_len, g.total);
	assert_int_equal(s.body_sum, g.sum);
	/* Streamed: many reads, each at most curl's upload buffer. */
	assert_true(g.calls >= 8);
	assert_true(g.max_piece <= (1u << 20));
	json_decref(reply);
	httpc_reply_free(&r);
}

/* A body_read that fails midway aborts the request: -EIO, saying so. */
static void test_body_read_fails(void **state)
{
	struct server s = { .pieces = { "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n" } };
	struct gen g = { .total = 4u << 20, .fail_at = 1u << 20 };
	struct httpc_req q = { .method = "PUT", .body_read = gen_read, .body_ctx = &g, .body_len = 4u << 20,
			       .lim = { .timeout_ms = 20000 } };
	struct httpc_reply r;

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_request(NULL, &q, &r), -EIO);
	server_join(&s);
	assert_string_equal(r.error, "reading the request body failed");
	assert_true(s.body_len < g.total);
	assert_non_null(strstr(s.req, "PUT /x HTTP/1.1\r\n"));
	httpc_reply_free(&r);
}

/* A reused handle keeps working across requests (the heartbeat's). */
static void test_handle_reused(void **state)
{
	struct httpc *c = httpc_new();

	assert_non_null(c);
	for (int i = 0; i < 2; i++) {
		struct server s = { .pieces = { "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok" } };
		struct httpc_req q = { .lim = { .timeout_ms = 5000 } };
		struct httpc_reply r;

		server_start(&s);
		q.url = s.url;
		assert_int_equal(httpc_request(c, &q, &r), 0);
		server_join(&s);
		assert_int_equal(r.status, 200);
		assert_string_equal(r.body.p, "ok");
		assert_non_null(strstr(s.req, "GET /x HTTP/1.1\r\n"));
		assert_null(strstr(s.req, "Authorization"));
		httpc_reply_free(&r);
	}
	httpc_free(c);
}

/* One request's head (no body) into s->req: 0, or -1 when the client left. */
static int read_head(struct server *s, int fd)
{
	s->req_len = 0;
	s->req[0] = '\0';
	while (!strstr(s->req, "\r\n\r\n") && s->req_len < sizeof(s->req) - 1) {
		ssize_t n = read(fd, s->req + s->req_len, sizeof(s->req) - 1 - s->req_len);

		if (n <= 0)
			return -1;
		s->req_len += (size_t)n;
		s->req[s->req_len] = '\0';
	}
	return 0;
}

/* A server that accepts one connection only and answers two requests on
 * it (HTTP/1.1 keep-alive). */
static void *keepalive_main(void *arg)
{
	struct server *s = arg;
	int fd = accept(s->lfd, NULL, NULL);
	static const char reply[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

	if (fd < 0)
		return NULL;
	for (int i = 0; i < 2; i++) {
		if (read_head(s, fd) < 0)
			goto out;
		if (send(fd, reply, sizeof(reply) - 1, MSG_NOSIGNAL) < 0)
			break;
		s->body_len++; /* requests answered */
	}
out:
	close(fd);
	return NULL;
}

/* Two one-shot requests (no struct httpc: a handle each) to the same server
 * go over one kept-alive connection: the process shares one connection
 * cache. The server accepts a single connection, so a second connection
 * would never be answered and the second request would time out. */
static void test_connection_shared(void **state)
{
	struct server s = { 0 };

	server_start_with(&s, keepalive_main, "/k");
	for (int i = 0; i < 2; i++) {
		struct httpc_req q = { .url = s.url, .lim = { .timeout_ms = 3000 } };
		struct httpc_reply r;

		assert_int_equal(httpc_request(NULL, &q, &r), 0);
		assert_int_equal(r.status, 200);
		assert_string_equal(r.body.p, "ok");
		httpc_reply_free(&r);
	}
	server_join(&s);
	assert_int_equal(s.body_len, 2);
}

static void test_size_cap(void **state)
{
	static const char reply[] = "HTTP/1.1 200 OK\r\nContent-Length: 20\r\nConnection: close\r\n\r\n"
				    "0123456789abcdefghij";

	for (size_t cap = 19; cap <= 20; cap++) {
		struct server s = { .pieces = { reply } };
		struct httpc_req q = { .max_reply = cap, .lim = { .timeout_ms = 5000 } };
		struct httpc_reply r;
		int rc;

		server_start(&s);
		q.url = s.url;
		rc = httpc_request(NULL, &q, &r);
		server_join(&s);
		if (cap == 19) {
			assert_int_equal(rc, -E2BIG);
			assert_true(r.body.len <= 19);
			assert_true(r.error[0] != '\0');
		} else {
			assert_int_equal(rc, 0);
			assert_int_equal(r.body.len, 20);
		}
		httpc_reply_free(&r);
	}
}

static void test_timeout(void **state)
{
	struct server s = { .hang = 1 };
	struct httpc_req q = { .lim = { .timeout_ms = 300, .connect_timeout_ms = 300 } };
	struct httpc_reply r;

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_request(NULL, &q, &r), -ETIMEDOUT);
	server_join(&s);
	assert_int_equal(r.status, 0);
	assert_true(strstr(r.error, "imeout") != NULL || strstr(r.error, "timed out") != NULL);
	httpc_reply_free(&r);
}

static void test_unreachable(void **state)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	char url[64];
	struct httpc_req q = { .url = url, .lim = { .timeout_ms = 2000 } };
	struct httpc_reply r;

	/* A port that was just free: nobody listens there. */
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d/", ntohs(a.sin_port));
	close(fd);
	assert_int_equal(httpc_request(NULL, &q, &r), -EIO);
	assert_int_equal(r.status, 0);
	assert_true(r.error[0] != '\0');
	httpc_reply_free(&r);
}

static void test_json(void **state)
{
	struct server s = { .pieces = { "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
					"Connection: close\r\n\r\n{\"a\":", "1}" },
			    .gap_ms = 20 };
	struct httpc_req q = { .method = "POST", .lim = { .timeout_ms = 5000 } };
	struct httpc_reply r;
	json_t *body = json_pack("{s:s}", "x", "y"), *reply = NULL;

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_json(NULL, &q, body, &reply, &r), 0);
	server_join(&s);
	assert_int_equal(r.status, 200);
	assert_non_null(reply);
	assert_int_equal(json_integer_value(json_object_get(reply, "a")), 1);
	assert_non_null(strstr(s.req, "\r\nContent-Type: application/json\r\n"));
	assert_string_equal(s.req + s.req_len - 13, "\r\n\r\n{\"x\":\"y\"}");
	json_decref(reply);
	json_decref(body);
	httpc_reply_free(&r);
}

static void test_json_not_json(void **state)
{
	struct server s = { .pieces = { "HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n<html>" } };
	struct httpc_req q = { .lim = { .timeout_ms = 5000 } };
	struct httpc_reply r;
	json_t *reply = (json_t *)1;

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_json(NULL, &q, NULL, &reply, &r), 0);
	server_join(&s);
	assert_int_equal(r.status, 502);
	assert_null(reply);
	assert_string_equal(r.body.p, "<html>");
	httpc_reply_free(&r);
}

/* ---- server-sent events ----------------------------------------------------- */

struct seen {
	char names[8][32];
	char data[8][64];
	int n;
	int stop_after; /* 0: never */
};

static int on_json(void *ctx, const char *name, json_t *data)
{
	struct seen *v = ctx;
	char *d = json_dumps(data, JSON_COMPACT | JSON_SORT_KEYS);

	assert_true(v->n < 8);
	snprintf(v->names[v->n], sizeof(v->names[0]), "%s", name);
	snprintf(v->data[v->n], sizeof(v->data[0]), "%s", d);
	free(d);
	v->n++;
	return v->stop_after && v->n >= v->stop_after;
}

#define SSE_HEAD "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"

static void test_follow_split_multiline(void **state)
{
	struct server s = {
		.pieces = { SSE_HEAD "event: st", "ate\ndata: {\"a\":", "1}\n", "\n: keepalive\n\n",
			    "event: multi\r\ndata: {\"b\":\r\ndata: 2}\r\n\r\nevent: bad\ndata: not json\n\n",
			    "data: {\"nameless\":1}\n\nevent:tight\ndata:{\"c\":3}\n\n" },
		.gap_ms = 30,
	};
	struct httpc_req q = { .lim = { .stall_s = 5 } };
	struct httpc_reply r;
	struct seen v = { 0 };

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_follow(NULL, &q, on_json, &v, &r), 0);
	server_join(&s);
	assert_int_equal(r.status, 200);
	assert_int_equal(r.body.len, 0);
	assert_int_equal(v.n, 3);
	assert_string_equal(v.names[0], "state");
	assert_string_equal(v.data[0], "{\"a\":1}");
	assert_string_equal(v.names[1], "multi");
	assert_string_equal(v.data[1], "{\"b\":2}");
	assert_string_equal(v.names[2], "tight");
	assert_string_equal(v.data[2], "{\"c\":3}");
	httpc_reply_free(&r);
}

static void test_follow_stop(void **state)
{
	struct server s = { .pieces = { SSE_HEAD "event: a\ndata: {}\n\nevent: b\ndata: {}\n\n", "event: c\ndata: {}\n\n" },
			    .gap_ms = 20 };
	struct httpc_req q = { .lim = { .stall_s = 5 } };
	struct httpc_reply r;
	struct seen v = { .stop_after = 1 };

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_follow(NULL, &q, on_json, &v, &r), 1);
	server_join(&s);
	assert_int_equal(v.n, 1);
	assert_string_equal(v.names[0], "a");
	httpc_reply_free(&r);
}

static void test_follow_error_body(void **state)
{
	struct server s = { .pieces = { "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
					"Connection: close\r\n\r\n{\"error\":{\"code\":\"not_found\",",
					"\"message\":\"no task t-1\"}}\n\nevent: x\ndata: {}\n\n" },
			    .gap_ms = 20 };
	struct httpc_req q = { .lim = { .stall_s = 5 } };
	struct httpc_reply r;
	struct seen v = { 0 };
	json_t *e;

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_follow(NULL, &q, on_json, &v, &r), 0);
	server_join(&s);
	assert_int_equal(r.status, 404);
	assert_int_equal(v.n, 0); /* an error body is not an event stream */
	e = json_loadb(r.body.p, r.body.len, JSON_DISABLE_EOF_CHECK, NULL);
	assert_non_null(e);
	assert_string_equal(json_string_value(json_object_get(json_object_get(e, "error"), "message")), "no task t-1");
	json_decref(e);
	httpc_reply_free(&r);
}

static void test_follow_line_too_long(void **state)
{
	struct server s = { .pieces = { SSE_HEAD "event: a\ndata: {\"x\":\"0123456789012345678901234567890\"}\n\n" } };
	struct httpc_req q = { .max_reply = 32, .lim = { .stall_s = 5 } };
	struct httpc_reply r;
	struct seen v = { 0 };

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_follow(NULL, &q, on_json, &v, &r), -E2BIG);
	server_join(&s);
	assert_int_equal(v.n, 0);
	assert_true(r.error[0] != '\0');
	httpc_reply_free(&r);
}

static int tick_stop(void *ctx)
{
	return ++*(int *)ctx >= 3;
}

static void test_follow_tick_stops(void **state)
{
	struct server s = { .hang = 1 };
	int ticks = 0;
	struct httpc_req q = { .lim = { .stall_s = 5 }, .tick = tick_stop, .ctx = &ticks };
	struct httpc_reply r;
	struct seen v = { 0 };

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_follow(NULL, &q, on_json, &v, &r), 1);
	server_join(&s);
	assert_int_equal(ticks, 3);
	httpc_reply_free(&r);
}

/* The parser alone: one feed and a byte at a time agree. */
struct raw_seen {
	char log[512];
};

static int on_raw(void *ctx, const char *name, const char *data, size_t len)
{
	struct raw_seen *v = ctx;
	size_t at = strlen(v->log);

	snprintf(v->log + at, sizeof(v->log) - at, "[%s|%.*s]", name, (int)len, data);
	return 0;
}

static void test_sse_parser(void **state)
{
	static const char in[] = ": hi\nevent: one\ndata: a\ndata:\ndata:  b\n\n"
				 "data: only\r\n\r\nevent: empty\ndata:\n\nevent: none\n\nid: 7\nretry: 1\n\n"
				 "event: last\ndata: unterminated";
	static const char want[] = "[one|a\n\n b][|only][empty|]";
	struct raw_seen whole = { "" }, bytes = { "" };
	struct httpc_sse s;

	httpc_sse_init(&s, 0, on_raw, NULL, &whole);
	assert_int_equal(httpc_sse_feed(&s, in, sizeof(in) - 1), 0);
	httpc_sse_free(&s);
	assert_string_equal(whole.log, want);

	httpc_sse_init(&s, 0, on_raw, NULL, &bytes);
	for (size_t i = 0; i < sizeof(in) - 1; i++)
		assert_int_equal(httpc_sse_feed(&s, in + i, 1), 0);
	httpc_sse_free(&s);
	assert_string_equal(bytes.log, want);

	httpc_sse_init(&s, 8, on_raw, NULL, &bytes);
	assert_int_equal(httpc_sse_feed(&s, "data: 0123456789", 16), -E2BIG);
	httpc_sse_free(&s);
}

/* With `complete`, a data line that completes the data dispatches at once;
 * the name holds until the blank line. */
static int ends_in_brace(void *ctx, const char *data, size_t len)
{
	return len && data[len - 1] == '}';
}

static void test_sse_parser_complete(void **state)
{
	static const char in[] = "event: a\ndata: {1}\nevent: b\ndata: {2\ndata: 3}\ndata: {4}\n\ndata: {5}\n";
	struct raw_seen v = { "" };
	struct httpc_sse s;

	httpc_sse_init(&s, 0, on_raw, ends_in_brace, &v);
	assert_int_equal(httpc_sse_feed(&s, in, sizeof(in) - 1), 0);
	httpc_sse_free(&s);
	assert_string_equal(v.log, "[a|{1}][b|{2\n3}][b|{4}][|{5}]");
}

/* kiln-host's task events end with a single "\n" (no blank line): each goes
 * out as soon as its data line is in, as before the shared client. */
static void test_follow_host_framing(void **state)
{
	struct server s = { .pieces = { SSE_HEAD "event: state\ndata: {\"state\":\"running\"}\n",
					"event: stdout\ndata: {\"data\":\"hi\\n\"}\n: keepalive\n\n",
					"event: state\ndata: {\"state\":\"succeeded\"}\n" },
			    .gap_ms = 20 };
	struct httpc_req q = { .lim = { .stall_s = 5 } };
	struct httpc_reply r;
	struct seen v = { .stop_after = 2 };

	server_start(&s);
	q.url = s.url;
	/* Stopping after the second event proves it came before the stream's end. */
	assert_int_equal(httpc_follow(NULL, &q, on_json, &v, &r), 1);
	server_join(&s);
	assert_int_equal(v.n, 2);
	assert_string_equal(v.names[0], "state");
	assert_string_equal(v.data[0], "{\"state\":\"running\"}");
	assert_string_equal(v.names[1], "stdout");
	assert_string_equal(v.data[1], "{\"data\":\"hi\\n\"}");
	httpc_reply_free(&r);
}

/* ---- a stopped follow drains the stream's end (drain_ms) ------------------ */

/* A server that accepts one connection only: it answers the first request
 * with a chunked event stream (two events, the second after the one the
 * client stops on, then, gap_ms later, the last chunk unless hang), and a
 * second request on the same connection with "ok". */
static void *drain_main(void *arg)
{
	struct server *s = arg;
	int fd = accept(s->lfd, NULL, NULL), one = 1;
	static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
				   "Transfer-Encoding: chunked\r\n\r\n";
	static const char events[] = "event: final\ndata: {\"state\":\"succeeded\"}\n"
				     "event: after\ndata: {}\n";
	static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
	char chunk[256];

	if (fd < 0)
		return NULL;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	for (int i = 0; i < 2; i++) {
		if (read_head(s, fd) < 0)
			goto out;
		if (i == 1) {
			if (send(fd, ok, sizeof(ok) - 1, MSG_NOSIGNAL) > 0)
				s->body_len++; /* second request answered */
			break;
		}
		snprintf(chunk, sizeof(chunk), "%s%zx\r\n%s\r\n", head, sizeof(events) - 1, events);
		if (send(fd, chunk, strlen(chunk), MSG_NOSIGNAL) < 0)
			break;
		if (s->hang) {
			struct pollfd p = { .fd = fd, .events = POLLIN };
			char c;

			/* Never ends the stream: until the client leaves (bounded). */
			if (poll(&p, 1, 10000) > 0)
				(void)read(fd, &c, 1);
			break;
		}
		usleep((useconds_t)s->gap_ms * 1000);
		if (send(fd, "0\r\n\r\n", 5, MSG_NOSIGNAL) < 0)
			break;
	}
out:
	close(fd);
	return NULL;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* on_event stops at the first event; the stream ends 50 ms later. With
 * drain_ms the follow reads that end (the event after the stop is not
 * delivered) and returns 1, and the next request goes over the same
 * connection: the server accepts only one, so a new connection would never
 * be answered. */
static void test_follow_drain_keeps_connection(void **state)
{
	struct server s = { .gap_ms = 50 };
	struct httpc_req q = { .lim = { .stall_s = 5 }, .drain_ms = 2000 };
	struct httpc_req q2 = { .lim = { .timeout_ms = 3000 } };
	struct httpc_reply r;
	struct seen v = { .stop_after = 1 };

	server_start_with(&s, drain_main, "/e");
	q.url = q2.url = s.url;
	assert_int_equal(httpc_follow(NULL, &q, on_json, &v, &r), 1);
	assert_int_equal(v.n, 1);
	assert_string_equal(v.names[0], "final");
	httpc_reply_free(&r);
	assert_int_equal(httpc_request(NULL, &q2, &r), 0);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.body.p, "ok");
	httpc_reply_free(&r);
	server_join(&s);
	assert_int_equal(s.body_len, 1);
}

/* A stream that does not end after the stop: the drain gives up (within
 * about a second, curl's progress calls, not the 5 s stall) and the call
 * still returns 1, the event after the stop undelivered. */
static void test_follow_drain_bounded(void **state)
{
	struct server s = { .hang = 1 };
	struct httpc_req q = { .lim = { .stall_s = 5 }, .drain_ms = 100 };
	struct httpc_reply r;
	struct seen v = { .stop_after = 1 };
	int64_t t0;

	server_start_with(&s, drain_main, "/e");
	q.url = s.url;
	t0 = now_ms();
	assert_int_equal(httpc_follow(NULL, &q, on_json, &v, &r), 1);
	assert_true(now_ms() - t0 < 2500);
	assert_int_equal(v.n, 1);
	httpc_reply_free(&r);
	server_join(&s);
}

/* ---- a reply read piece by piece ---------------------------------------------- */

static void test_stream(void **state)
{
	struct server s = { .pieces = { "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nfirst", "second" }, .gap_ms = 50 };
	struct httpc_req q = { .method = "POST", .content_type = "application/json", .body = "{}", .body_len = 2,
			       .lim = { .connect_timeout_ms = 2000 } };
	struct httpc_stream *st;
	char got[64] = "", piece[4];
	size_t len = 0;
	long n;

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_stream_open(&q, &st), 0);
	assert_int_equal(httpc_stream_status(st, 5000), 200);
	while ((n = httpc_stream_read(st, piece, sizeof(piece), 5000)) > 0) {
		assert_true(n <= (long)sizeof(piece));
		memcpy(got + len, piece, (size_t)n);
		len += (size_t)n;
	}
	assert_int_equal(n, -ENODATA);
	got[len] = '\0';
	assert_string_equal(got, "firstsecond");
	httpc_stream_close(st);
	server_join(&s);
	assert_non_null(strstr(s.req, "POST /x HTTP/1.1\r\n"));
	assert_string_equal(s.req + s.req_len - 2, "{}");
}

static void test_stream_no_answer(void **state)
{
	struct server s = { .hang = 1 };
	struct httpc_req q = { 0 };
	struct httpc_stream *st;

	server_start(&s);
	q.url = s.url;
	assert_int_equal(httpc_stream_open(&q, &st), 0);
	assert_int_equal(httpc_stream_status(st, 200), -ETIMEDOUT);
	httpc_stream_close(st);
	server_join(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_status_and_body),
		cmocka_unit_test(test_handle_reused),
		cmocka_unit_test(test_connection_shared),
		cmocka_unit_test(test_body_read_streams),
		cmocka_unit_test(test_body_read_fails),
		cmocka_unit_test(test_size_cap),
		cmocka_unit_test(test_timeout),
		cmocka_unit_test(test_unreachable),
		cmocka_unit_test(test_json),
		cmocka_unit_test(test_json_not_json),
		cmocka_unit_test(test_follow_split_multiline),
		cmocka_unit_test(test_follow_stop),
		cmocka_unit_test(test_follow_error_body),
		cmocka_unit_test(test_follow_line_too_long),
		cmocka_unit_test(test_follow_tick_stops),
		cmocka_unit_test(test_sse_parser),
		cmocka_unit_test(test_sse_parser_complete),
		cmocka_unit_test(test_follow_host_framing),
		cmocka_unit_test(test_follow_drain_keeps_connection),
		cmocka_unit_test(test_follow_drain_bounded),
		cmocka_unit_test(test_stream),
		cmocka_unit_test(test_stream_no_answer),
	};

	curl_global_init(CURL_GLOBAL_DEFAULT);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
