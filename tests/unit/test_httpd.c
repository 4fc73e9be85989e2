/* test_httpd: the HTTP layer both servers share (lib/httpd.c, lib/reply.c):
 * route matching (path parameters, no trailing-slash folding, 404 versus
 * 405 with Allow), the body collector's cap (a declared Content-Length over
 * it refused before the body, a chunked one at its end, a flood closed),
 * and the server-sent event reply's framing, over a real libmicrohttpd
 * daemon on 127.0.0.1 (an ephemeral port) talked to with libcurl. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>
#include <microhttpd.h>

#include "buf.h"
#include "httpd.h"
#include "reply.h"

/* ---- the table, matched without a server ---- */

static enum MHD_Result h_none(void *ctx, struct httpd_req *r)
{
	return MHD_NO;
}

static enum MHD_Result h_other(void *ctx, struct httpd_req *r)
{
	return MHD_NO;
}

static const struct httpd_route rows[] = {
	{ "GET", "/v1/tasks", h_none },
	{ "POST", "/v1/tasks", h_none },
	{ "GET", "/v1/tasks/{id}", h_none },
	{ "DELETE", "/v1/tasks/{id}", h_other },
	{ "GET", "/v1/tasks/{id}/events", h_none },
	{ "PUT", "/v1/admin/customers/{id}/quotas", h_none },
	{ "GET", "/v1/a/{x}/b/{y}", h_none },
	{ NULL, "/any", h_other },
	{ "POST", "/dup", h_none },
	{ "POST", "/dup", h_other },
};

static const struct httpd_routes table = { rows, sizeof(rows) / sizeof(rows[0]), "no such endpoint", " or " };

static enum httpd_match_result match(const char *method, const char *path, struct httpd_req *r,
				     const struct httpd_route **row, char *allow)
{
	memset(r, 0, sizeof(*r));
	*row = NULL;
	return httpd_route_match(&table, method, path, r, row, allow, 128);
}

static void test_route_params(void **state)
{
	const struct httpd_route *row;
	struct httpd_req r;
	char allow[128];

	assert_int_equal(match("GET", "/v1/tasks/t_123/events", &r, &row, allow), HTTPD_MATCH);
	assert_ptr_equal(row, &rows[4]);
	assert_int_equal(r.nparam, 1);
	assert_string_equal(r.param[0], "t_123");

	assert_int_equal(match("DELETE", "/v1/tasks/t_9", &r, &row, allow), HTTPD_MATCH);
	assert_ptr_equal(row, &rows[3]);
	assert_string_equal(r.param[0], "t_9");

	assert_int_equal(match("GET", "/v1/a/one/b/two", &r, &row, allow), HTTPD_MATCH);
	assert_int_equal(r.nparam, 2);
	assert_string_equal(r.param[0], "one");
	assert_string_equal(r.param[1], "two");

	assert_int_equal(match("PUT", "/v1/admin/customers/acme/quotas", &r, &row, allow), HTTPD_MATCH);
	assert_string_equal(r.param[0], "acme");

	/* A row without a method takes every method, HEAD included. */
	assert_int_equal(match("HEAD", "/any", &r, &row, allow), HTTPD_MATCH);
	assert_ptr_equal(row, &rows[7]);

	/* The first matching row wins. */
	assert_int_equal(match("POST", "/dup", &r, &row, allow), HTTPD_MATCH);
	assert_ptr_equal(row, &rows[8]);
}

static void test_route_not_found(void **state)
{
	const struct httpd_route *row;
	struct httpd_req r;
	char allow[128], longpath[700];

	/* No trailing-slash folding, no empty parameter, no extra segment. */
	assert_int_equal(match("GET", "/v1/tasks/", &r, &row, allow), HTTPD_NOT_FOUND);
	assert_int_equal(match("GET", "/v1/tasks//events", &r, &row, allow), HTTPD_NOT_FOUND);
	assert_int_equal(match("GET", "/v1/tasks/x/events/", &r, &row, allow), HTTPD_NOT_FOUND);
	assert_int_equal(match("GET", "/v1/tasks/x/nope", &r, &row, allow), HTTPD_NOT_FOUND);
	assert_int_equal(match("GET", "/v1/task", &r, &row, allow), HTTPD_NOT_FOUND);
	assert_int_equal(match("GET", "/v1/tasksX", &r, &row, allow), HTTPD_NOT_FOUND);
	assert_int_equal(match("GET", "", &r, &row, allow), HTTPD_NOT_FOUND);
	assert_int_equal(match("GET", "v1/tasks", &r, &row, allow), HTTPD_NOT_FOUND);
	assert_null(row);
	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[sizeof(longpath) - 1] = '\0';
	assert_int_equal(match("GET", longpath, &r, &row, allow), HTTPD_NOT_FOUND);
}

static void test_route_not_allowed(void **state)
{
	const struct httpd_route *row;
	struct httpd_req r;
	char allow[128];

	assert_int_equal(match("DELETE", "/v1/tasks", &r, &row, allow), HTTPD_NOT_ALLOWED);
	assert_string_equal(allow, "GET, POST");
	assert_int_equal(match("POST", "/v1/tasks/x", &r, &row, allow), HTTPD_NOT_ALLOWED);
	assert_string_equal(allow, "GET, DELETE");
	/* HEAD is not GET: only what a row says. */
	assert_int_equal(match("HEAD", "/v1/tasks/x/events", &r, &row, allow), HTTPD_NOT_ALLOWED);
	assert_string_equal(allow, "GET");
	/* Methods are listed once. */
	assert_int_equal(match("GET", "/dup", &r, &row, allow), HTTPD_NOT_ALLOWED);
	assert_string_equal(allow, "POST");
}

/* ---- a real daemon ---- */

#define CAP 64

struct srv {
	struct MHD_Daemon *d;
	unsigned short port;
	size_t drop_max;
	const struct httpd_routes *table;
};

static enum MHD_Result h_echo(void *ctx, struct httpd_req *r)
{
	return reply_json(r->conn, MHD_HTTP_OK,
			  json_pack("{s:s, s:I}", "id", r->param[0], "len", (json_int_t)httpd_body_len(r->body)));
}

/* Two events, a keepalive, the end. */
struct sse_state {
	int step;
};

static ssize_t sse_read(void *cls, uint64_t pos, char *out, size_t max)
{
	struct sse_state *st = cls;
	struct buf b = BUF_INIT;
	ssize_t n;

	switch (st->step++) {
	case 0:
		assert_int_equal(reply_sse_event(&b, "state", "{\"state\":\"running\"}"), 0);
		assert_int_equal(reply_sse_event(&b, "stdout", "{\"data\":\"hi\"}"), 0);
		break;
	case 1:
		return reply_sse_keepalive(out, max);
	default:
		return MHD_CONTENT_READER_END_OF_STREAM;
	}
	assert_true(b.len <= max);
	memcpy(out, b.p, b.len);
	n = (ssize_t)b.len;
	buf_free(&b);
	return n;
}

static void sse_fini(void *cls)
{
	free(cls);
}

static enum MHD_Result h_sse(void *ctx, struct httpd_req *r)
{
	struct sse_state *st = calloc(1, sizeof(*st));

	if (!st)
		return MHD_NO;
	return reply_sse(r->conn, 4096, sse_read, st, sse_fini);
}

static const struct httpd_route srv_rows[] = {
	{ "POST", "/v1/echo/{id}", h_echo },
	{ "GET", "/v1/echo/{id}", h_echo },
	{ "GET", "/v1/tasks/{id}/events", h_sse },
};

static const struct httpd_routes srv_table = { srv_rows, 3, "no such endpoint", ", " };
/* kiln-host's wording of the 405 message, and its own 404 message. */
static const struct httpd_routes srv_table_or = { srv_rows, 3, "nothing here", " or " };

static enum MHD_Result srv_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
				   const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct srv *s = cls;
	struct httpd_body *body = *con_cls;
	struct httpd_req r;

	if (!body) {
		body = malloc(sizeof(*body));
		if (!body)
			return MHD_NO;
		httpd_body_init(body, CAP, s->drop_max);
		*con_cls = body;
		if (httpd_body_declared_too_big(body, conn))
			return reply_error(conn, KERR_TOO_LARGE, "declared");
		return MHD_YES;
	}
	if (*upload_size)
		return httpd_body_feed(body, upload, upload_size);
	if (body->too_big)
		return reply_error(conn, KERR_TOO_LARGE, "at the end");
	r = (struct httpd_req){ .conn = conn, .method = method, .url = url, .body = body };
	return httpd_dispatch(s->table, s, &r);
}

static void srv_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
			  enum MHD_RequestTerminationCode toe)
{
	struct httpd_body *body = *con_cls;

	if (body) {
		httpd_body_free(body);
		free(body);
	}
	*con_cls = NULL;
}

static int srv_start(void **state, const struct httpd_routes *routes)
{
	struct srv *s = calloc(1, sizeof(*s));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = 0 };
	const union MHD_DaemonInfo *info;

	assert_non_null(s);
	s->drop_max = CAP * 4;
	s->table = routes;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL, NULL,
				srv_handler, s, MHD_OPTION_NOTIFY_COMPLETED, srv_completed, NULL, MHD_OPTION_SOCK_ADDR,
				&sa, MHD_OPTION_END);
	if (!s->d) {
		free(s);
		fprintf(stderr, "cannot start a libmicrohttpd daemon on 127.0.0.1\n");
		return -1;
	}
	info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
	assert_non_null(info);
	s->port = info->port;
	assert_true(s->port > 0);
	*state = s;
	return 0;
}

static int srv_setup(void **state)
{
	return srv_start(state, &srv_table);
}

static int srv_setup_or(void **state)
{
	return srv_start(state, &srv_table_or);
}

static int srv_teardown(void **state)
{
	struct srv *s = *state;

	MHD_stop_daemon(s->d);
	free(s);
	return 0;
}

struct resp {
	long status;
	CURLcode rc;
	struct buf body, headers;
};

static size_t on_data(char *p, size_t sz, size_t n, void *ud)
{
	return buf_add(ud, p, sz * n) == 0 ? sz * n : 0;
}

/* A chunked upload: `left` bytes of 'x' in 16-byte parts, no length up front. */
static size_t on_read(char *p, size_t sz, size_t n, void *ud)
{
	size_t *left = ud, k = sz * n < 16 ? sz * n : 16;

	if (k > *left)
		k = *left;
	memset(p, 'x', k);
	*left -= k;
	return k;
}

/* method path; body: NULL none, else len bytes (chunked: -1 length). */
static void do_req(struct srv *s, const char *method, const char *path, const char *body, long len, size_t chunked,
		   struct resp *out)
{
	CURL *c = curl_easy_init();
	struct curl_slist *h = NULL;
	char url[256];
	size_t left = chunked;

	assert_non_null(c);
	memset(out, 0, sizeof(*out));
	buf_init(&out->body, 1 << 20);
	buf_init(&out->headers, 1 << 20);
	snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", s->port, path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &out->body);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, &out->headers);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
	/* No "Expect: 100-continue" wait. */
	h = curl_slist_append(h, "Expect:");
	if (body) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, len);
	} else if (chunked) {
		h = curl_slist_append(h, "Transfer-Encoding: chunked");
		curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(c, CURLOPT_READDATA, &left);
	}
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	out->rc = curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
}

static void resp_free(struct resp *r)
{
	buf_free(&r->body);
	buf_free(&r->headers);
}

static void expect_error(struct resp *r, long status, const char *code)
{
	json_t *j;

	assert_int_equal(r->rc, CURLE_OK);
	assert_int_equal(r->status, status);
	j = json_loads(r->body.p ? r->body.p : "", 0, NULL);
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")), code);
	json_decref(j);
}

static void test_dispatch_over_http(void **state)
{
	struct srv *s = *state;
	struct resp r;

	do_req(s, "GET", "/v1/echo/abc", NULL, 0, 0, &r);
	assert_int_equal(r.rc, CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.body.p, "{\"id\":\"abc\",\"len\":0}");
	assert_non_null(strcasestr(r.headers.p, "Content-Type: application/json"));
	resp_free(&r);

	do_req(s, "DELETE", "/v1/echo/abc", NULL, 0, 0, &r);
	expect_error(&r, 405, "method_not_allowed");
	assert_non_null(strcasestr(r.headers.p, "\r\nAllow: POST, GET\r\n"));
	assert_non_null(strstr(r.body.p, "\"message\":\"use POST, GET\""));
	resp_free(&r);

	do_req(s, "GET", "/v1/echo/", NULL, 0, 0, &r);
	expect_error(&r, 404, "not_found");
	assert_non_null(strstr(r.body.p, "no such endpoint"));
	assert_null(strcasestr(r.headers.p, "Allow:"));
	resp_free(&r);
}

static void test_dispatch_wording(void **state)
{
	struct srv *s = *state;
	struct resp r;

	/* The message uses the table's wording; Allow stays an HTTP list. */
	do_req(s, "PUT", "/v1/echo/abc", NULL, 0, 0, &r);
	expect_error(&r, 405, "method_not_allowed");
	assert_non_null(strcasestr(r.headers.p, "\r\nAllow: POST, GET\r\n"));
	assert_non_null(strstr(r.body.p, "\"message\":\"use POST or GET\""));
	resp_free(&r);

	do_req(s, "GET", "/nope", NULL, 0, 0, &r);
	expect_error(&r, 404, "not_found");
	assert_non_null(strstr(r.body.p, "\"message\":\"nothing here\""));
	resp_free(&r);
}

static void test_body_limits(void **state)
{
	struct srv *s = *state;
	char big[CAP + 1];
	struct resp r;

	memset(big, 'b', sizeof(big));
	/* At the cap: taken whole. */
	do_req(s, "POST", "/v1/echo/x", big, CAP, 0, &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.body.p, "{\"id\":\"x\",\"len\":64}");
	resp_free(&r);

	/* One byte over, declared: refused before the body. */
	do_req(s, "POST", "/v1/echo/x", big, CAP + 1, 0, &r);
	expect_error(&r, 413, "too_large");
	assert_non_null(strstr(r.body.p, "declared"));
	resp_free(&r);

	/* Chunked, within the cap: taken. */
	do_req(s, "POST", "/v1/echo/x", NULL, 0, 40, &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.body.p, "{\"id\":\"x\",\"len\":40}");
	resp_free(&r);

	/* Chunked past the cap (no length up front): dropped, 413 at its end. */
	do_req(s, "POST", "/v1/echo/x", NULL, 0, CAP * 2, &r);
	expect_error(&r, 413, "too_large");
	assert_non_null(strstr(r.body.p, "at the end"));
	resp_free(&r);

	/* Chunked far past cap + drop_max: the connection is closed, no answer. */
	do_req(s, "POST", "/v1/echo/x", NULL, 0, CAP * 64, &r);
	assert_true(r.rc != CURLE_OK || r.status == 0);
	resp_free(&r);
}

static void test_body_feed_direct(void **state)
{
	struct httpd_body b;
	size_t n;

	httpd_body_init(&b, 8, 0);
	assert_null(httpd_body_data(&b));
	n = 5;
	assert_int_equal(httpd_body_feed(&b, "hello", &n), MHD_YES);
	assert_int_equal(n, 0);
	n = 3;
	assert_int_equal(httpd_body_feed(&b, "abc", &n), MHD_YES);
	assert_int_equal(httpd_body_len(&b), 8);
	assert_memory_equal(httpd_body_data(&b), "helloabc", 8);
	assert_false(b.too_big);
	n = 1;
	assert_int_equal(httpd_body_feed(&b, "!", &n), MHD_YES);
	assert_true(b.too_big);
	assert_int_equal(httpd_body_len(&b), 8); /* nothing past the cap kept */
	/* drop_max 0: never closes. */
	for (int i = 0; i < 1000; i++) {
		n = 100;
		assert_int_equal(httpd_body_feed(&b, (const char *)&b, &n), MHD_YES);
	}
	httpd_body_free(&b);

	httpd_body_init(&b, 8, 10);
	n = 9;
	assert_int_equal(httpd_body_feed(&b, "123456789", &n), MHD_YES);
	assert_true(b.too_big);
	n = 2;
	assert_int_equal(httpd_body_feed(&b, "12", &n), MHD_NO); /* 11 dropped > 10 */
	httpd_body_free(&b);
}

static void test_sse_framing(void **state)
{
	struct srv *s = *state;
	struct resp r;

	do_req(s, "GET", "/v1/tasks/t1/events", NULL, 0, 0, &r);
	assert_int_equal(r.rc, CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_non_null(strcasestr(r.headers.p, "\r\nContent-Type: text/event-stream\r\n"));
	assert_non_null(strcasestr(r.headers.p, "\r\nCache-Control: no-cache\r\n"));
	assert_string_equal(r.body.p, "event: state\ndata: {\"state\":\"running\"}\n\n"
				      "event: stdout\ndata: {\"data\":\"hi\"}\n\n"
				      ": keepalive\n\n");
	resp_free(&r);
}

static void test_sse_helpers(void **state)
{
	struct buf b;
	char small[4];

	/* A capped buffer: an event that does not fit leaves it as it was. */
	buf_init(&b, 20);
	assert_int_equal(reply_sse_event(&b, "a", "1"), 0);
	assert_string_equal(b.p, "event: a\ndata: 1\n\n");
	assert_true(reply_sse_event(&b, "b", "2") < 0);
	assert_string_equal(b.p, "event: a\ndata: 1\n\n");
	buf_free(&b);
	/* A keepalive never goes out cut. */
	assert_int_equal(reply_sse_keepalive(small, sizeof(small)), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_route_params),
		cmocka_unit_test(test_route_not_found),
		cmocka_unit_test(test_route_not_allowed),
		cmocka_unit_test(test_body_feed_direct),
		cmocka_unit_test(test_sse_helpers),
		cmocka_unit_test_setup_teardown(test_dispatch_over_http, srv_setup, srv_teardown),
		cmocka_unit_test_setup_teardown(test_dispatch_wording, srv_setup_or, srv_teardown),
		cmocka_unit_test_setup_teardown(test_body_limits, srv_setup, srv_teardown),
		cmocka_unit_test_setup_teardown(test_sse_framing, srv_setup, srv_teardown),
	};

	curl_global_init(CURL_GLOBAL_DEFAULT);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
