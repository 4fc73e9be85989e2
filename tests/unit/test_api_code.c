/* test_api_code: kiln-api's native code API (api/ports/port_code.c,
 * docs/api.md "Code") over real HTTP on loopback without VMs: kiln-api's
 * server on a real store and scheduler, and a stand-in kiln-host whose port
 * tunnel (GET /v1/sessions/{id}/ports/{port}/connect, Upgrade: kiln-tunnel)
 * leads to a stand-in code interpreter speaking guest/interpreter.py's
 * NDJSON (or to nothing: port_closed). Checks the request the interpreter
 * gets, the whole answer's model, the SSE events in order, a plot's PNG
 * passed byte for byte, a timeout that closes the tunnel (the interpreter's
 * interrupt) and reports TimeoutError, the whole answer's cap (413) and a
 * stream that passes it, lines that are no events skipped, a cut answer,
 * no_interpreter, contexts and their errors, the refusals (body, key,
 * another customer's session, a paused one), max_streams; and GET
 * /v1/tasks/{id}/outputs/{n} over a stand-in S3. The event reader
 * (port_code_ev.c) and the body check are tested on their own too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <microhttpd.h>

#include "fake_host_ops.h"
#include "api_config.h"
#include "ports_int.h"
#include "quota.h"
#include "scheduler.h"
#include "server.h"
#include "sessions_int.h"
#include "store.h"

static char dir[] = "/tmp/kiln-test-api-code.XXXXXX";
static char path[256], listen_addr[64], base[64], host_url[64];
static int seq;
static struct store *st;
static struct sched *sc;
static struct sessions *ss;
static struct server *srv;
static struct api_config cfg;
static struct MHD_Daemon *host;
static char key_a[128], key_b[128], key_c[128];
static char noint_id[40];            /* the session whose port 49999 has nothing */

/* What the stand-in interpreter saw last (under lock). */
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;
static char seen_method[16], seen_path[256], seen_body[4096];
static int seen_tunnel_port, seen_interrupted;

/* A PNG's bytes in base64 (a 1x1 image): what a plot result carries. */
#define PNG_B64 "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="

/* ---- the stand-in interpreter, on the tunnel's socket ---- */

static int send_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);

		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

static int chunk(int fd, const char *line)
{
	char h[32];
	size_t n = strlen(line);

	snprintf(h, sizeof(h), "%zx\r\n", n + 1);
	return send_all(fd, h, strlen(h)) || send_all(fd, line, n) || send_all(fd, "\n\r\n", 3) ? -1 : 0;
}

/* data as one chunk as it is (lines and their ends its own). */
static int raw_chunk(int fd, const char *data)
{
	char h[32];

	snprintf(h, sizeof(h), "%zx\r\n", strlen(data));
	return send_all(fd, h, strlen(h)) || send_all(fd, data, strlen(data)) || send_all(fd, "\r\n", 2) ? -1 : 0;
}

static void reply(int fd, int status, const char *body)
{
	char h[256];

	snprintf(h, sizeof(h), "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n", status,
		 strlen(body));
	send_all(fd, h, strlen(h));
	send_all(fd, body, strlen(body));
}

static const char ndjson_head[] =
	"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n";

static void execute(int fd, const char *code)
{
	send_all(fd, ndjson_head, sizeof(ndjson_head) - 1);
	if (!strcmp(code, "1+1")) {
		chunk(fd, "{\"type\": \"result\", \"text\": \"2\", \"is_main_result\": true}");
	} else if (!strcmp(code, "out")) {
		/* Two events in one chunk, one line in two chunks. */
		raw_chunk(fd, "{\"type\": \"stdout\", \"text\": \"a\\n\"}\n{\"type\": \"stderr\", \"text\": \"b\\n\"}\n");
		raw_chunk(fd, "{\"type\": \"stdout");
		raw_chunk(fd, "\", \"text\": \"c\\n\"}\n");
		chunk(fd, "{\"type\": \"error\", \"name\": \"ValueError\", \"value\": \"boom\", \"traceback\": \"Traceback...\\nValueError: boom\\n\"}");
	} else if (!strcmp(code, "plot")) {
		chunk(fd, "{\"type\": \"result\", \"text\": \"<Figure>\", \"png\": \"" PNG_B64 "\", \"chart\": {\"type\": \"line\", "
			  "\"title\": \"t\", \"elements\": []}, \"is_main_result\": false}");
		chunk(fd, "{\"type\": \"result\", \"text\": \"df\", \"html\": \"<table></table>\", \"data\": {\"a\": [1, 2]}, "
			  "\"is_main_result\": true}");
	} else if (!strcmp(code, "garbage")) {
		chunk(fd, "not json");
		chunk(fd, "[1, 2]");
		chunk(fd, "{\"type\": \"mystery\", \"x\": 1}");
		chunk(fd, "{\"type\": \"stdout\"}");
		chunk(fd, "{\"type\": \"result\", \"text\": \"ok\", \"is_main_result\": \"yes\"}");
	} else if (!strcmp(code, "big")) {
		/* 40 MiB of stdout, in 1 MiB events. */
		char *line = malloc((1u << 20) + 64);
		int n;

		if (!line)
			return;
		n = sprintf(line, "{\"type\": \"stdout\", \"text\": \"");

		memset(line + n, 'x', 1u << 20);
		strcpy(line + n + (1u << 20), "\"}");
		for (int i = 0; i < 40; i++)
			if (chunk(fd, line) < 0)
				break;
		free(line);
	} else if (!strcmp(code, "slow")) {
		char b;

		chunk(fd, "{\"type\": \"stdout\", \"text\": \"started\\n\"}");
		/* Until the client leaves (kiln-api's timeout): the interrupt. */
		struct pollfd pf = { .fd = fd, .events = POLLIN };

		if (poll(&pf, 1, 10000) == 1 && recv(fd, &b, 1, 0) == 0) {
			pthread_mutex_lock(&seen_lock);
			seen_interrupted = 1;
			pthread_mutex_unlock(&seen_lock);
		}
		return;
	} else if (!strcmp(code, "cut")) {
		chunk(fd, "{\"type\": \"stdout\", \"text\": \"a\\n\"}");
		return; /* no end: the connection closes */
	}
	chunk(fd, "{\"type\": \"number_of_executions\", \"execution_count\": 7}");
	chunk(fd, "{\"type\": \"end_of_execution\"}");
	chunk(fd, "{\"type\": \"stdout\", \"text\": \"after the end\"}");
	send_all(fd, "0\r\n\r\n", 5);
}

/* One request on the tunnel: read it (small), record it, answer it. */
static void interpreter(int fd, const char *extra, size_t extra_size)
{
	char in[8192] = "";
	size_t n = 0;

	/* What libmicrohttpd read past the tunnel's head is the request's. */
	if (extra_size < sizeof(in)) {
		memcpy(in, extra, extra_size);
		n = extra_size;
		in[n] = 0;
	}
	char *end = NULL, *cl;
	size_t body_len = 0;
	json_t *j;

	while (n < sizeof(in) - 1 && !(end = strstr(in, "\r\n\r\n"))) {
		ssize_t k = recv(fd, in + n, sizeof(in) - 1 - n, 0);

		if (k <= 0)
			return;
		n += (size_t)k;
		in[n] = 0;
	}
	if (!end)
		return;
	cl = strcasestr(in, "Content-Length: ");
	if (cl && cl < end)
		body_len = strtoul(cl + 16, NULL, 10);
	while (n < (size_t)(end + 4 - in) + body_len && n < sizeof(in) - 1) {
		ssize_t k = recv(fd, in + n, sizeof(in) - 1 - n, 0);

		if (k <= 0)
			return;
		n += (size_t)k;
		in[n] = 0;
	}
	pthread_mutex_lock(&seen_lock);
	sscanf(in, "%15s %255s", seen_method, seen_path);
	snprintf(seen_body, sizeof(seen_body), "%.*s", (int)body_len, end + 4);
	pthread_mutex_unlock(&seen_lock);
	j = json_loadb(end + 4, body_len, 0, NULL);
	if (!strcmp(seen_method, "POST") && !strcmp(seen_path, "/execute"))
		execute(fd, json_string_value(json_object_get(j, "code")) ?: "");
	else if (!strcmp(seen_method, "GET") && !strcmp(seen_path, "/contexts"))
		reply(fd, 200, "[{\"id\": \"c1\", \"language\": \"python\", \"cwd\": \"/home/user\"}]");
	else if (!strcmp(seen_method, "POST") && !strcmp(seen_path, "/contexts"))
		reply(fd, 200, "{\"id\": \"c2\", \"language\": \"bash\", \"cwd\": \"/tmp\"}");
	else if (!strcmp(seen_method, "POST") && !strcmp(seen_path, "/contexts/c1/restart"))
		reply(fd, 200, "{\"id\": \"c1\", \"language\": \"python\", \"cwd\": \"/home/user\"}");
	else if (!strcmp(seen_method, "DELETE") && !strcmp(seen_path, "/contexts/c1"))
		reply(fd, 204, "");
	else
		reply(fd, 404, "{\"error\": \"context zz not found\", \"message\": \"context zz not found\"}");
	json_decref(j);
}

static void on_upgraded(void *cls, struct MHD_Connection *c, void *req_cls, const char *extra, size_t extra_size,
			MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
	(void)cls;
	(void)c;
	(void)req_cls;
	fcntl(sock, F_SETFL, fcntl(sock, F_GETFL) & ~O_NONBLOCK);
	interpreter(sock, extra, extra_size);
	MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
}

static enum MHD_Result host_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
				    const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct MHD_Response *resp;
	enum MHD_Result ret;
	char id[64];
	unsigned port = 0;

	if (!*con_cls) {
		*con_cls = (void *)1;
		return MHD_YES;
	}
	if (sscanf(url, "/v1/sessions/%63[^/]/ports/%u/connect", id, &port) != 2) {
		static const char nf[] = "{\"error\":{\"code\":\"not_found\",\"message\":\"no route\"}}";

		resp = MHD_create_response_from_buffer(sizeof(nf) - 1, (void *)nf, MHD_RESPMEM_PERSISTENT);
		ret = MHD_queue_response(conn, 404, resp);
		MHD_destroy_response(resp);
		return ret;
	}
	pthread_mutex_lock(&seen_lock);
	seen_tunnel_port = (int)port;
	pthread_mutex_unlock(&seen_lock);
	if (port != 49999 || !strcmp(id, noint_id)) {
		static const char pc[] = "{\"error\":{\"code\":\"port_closed\",\"message\":\"nothing listens on port 49999\"}}";

		resp = MHD_create_response_from_buffer(sizeof(pc) - 1, (void *)pc, MHD_RESPMEM_PERSISTENT);
		ret = MHD_queue_response(conn, 502, resp);
		MHD_destroy_response(resp);
		return ret;
	}
	resp = MHD_create_response_for_upgrade(on_upgraded, NULL);
	MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, "kiln-tunnel");
	ret = MHD_queue_response(conn, MHD_HTTP_SWITCHING_PROTOCOLS, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* ---- the stand-in S3 (GET of one object) ---- */

static struct MHD_Daemon *s3;
static char s3_url[64], s3_object[256];  /* the path it has: /bucket/key */

static enum MHD_Result s3_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
				  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	static const char bytes[] = "\x89PNG-not-really";
	struct MHD_Response *resp;
	enum MHD_Result ret;
	int have = !strcmp(method, "GET") && !strcmp(url, s3_object);

	if (!*con_cls) {
		*con_cls = (void *)1;
		return MHD_YES;
	}
	resp = have ? MHD_create_response_from_buffer(sizeof(bytes) - 1, (void *)bytes, MHD_RESPMEM_PERSISTENT)
		    : MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	ret = MHD_queue_response(conn, have ? 200 : 404, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* ---- setup ---- */

static void heartbeat(const char *id, const char *url)
{
	struct kiln_err err = { .code = "" };
	json_t *cap = json_pack("{s:{s:i, s:i}, s:{s:i, s:i}, s:b}", "vcpus", "total", 8, "used", 0, "memory_mib",
				"total", 8192, "used", 0, "egress", 0);

	assert_int_equal(store_host_heartbeat(st, id, url, cap, &err), 0);
	json_decref(cap);
}

static void customer(const char *id, char *key, unsigned max_streams)
{
	struct kiln_err err = { .code = "" };
	char key_id[32], *k = NULL;
	struct quota q;

	quota_defaults(&q);
	q.max_running = 8;
	if (max_streams)
		q.max_streams = max_streams;
	assert_int_equal(store_customer_create(st, id, id, &q, &err), 0);
	assert_int_equal(store_key_create(st, id, 0, &k, key_id, &err), 0);
	snprintf(key, 128, "%s", k);
	free(k);
}

/* A running session of cust on h1. */
static void session(const char *cust, char id[40])
{
	struct kiln_err err = { .code = "" };
	struct store_session_new n = {
		.customer = cust, .spec_json = "{}", .vcpus = 1, .memory_mib = 256, .idle_timeout_s = 600,
		.max_lifetime_s = 3600, .host_id = "h1",
	};

	if (store_session_create(st, &n, id, &err) != 0)
		fail_msg("session: %s", err.message);
	assert_int_equal(store_session_transition(st, id, SESSION_STARTING, SESSION_RUNNING, "h1", "", NULL), 1);
}

static int setup(void **state)
{
	struct kiln_err err = { .code = "" };
	struct sched_config sconf = {
		.cluster_token = "tok", .host_lost_after_ms = 10000, .host = &fake_ops, .clock = &fake_clock,
	};
	int hport = 0;

	snprintf(path, sizeof(path), "%s/api-%d.db", dir, ++seq);
	st = store_open(path, &err);
	if (!st)
		fail_msg("store_open: %s", err.message);
	fake_reset();
	clock_reset();
	fake_rule("GET", NULL, "/v1/sessions", 200, "{\"sessions\":[]}");
	for (int i = 0; i < 20 && !host; i++) {
		hport = 30000 + (int)((getpid() * 7 + seq * 131 + i * 17 + 3) % 20000);
		host = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_ALLOW_UPGRADE,
					(uint16_t)hport, NULL, NULL, host_handler, NULL, MHD_OPTION_END);
	}
	assert_non_null(host);
	snprintf(host_url, sizeof(host_url), "http://127.0.0.1:%d", hport);
	for (int i = 0; i < 20 && !s3; i++) {
		int p = 30000 + (int)((getpid() * 11 + seq * 37 + i * 13 + 5) % 20000);

		s3 = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, (uint16_t)p, NULL,
				      NULL, s3_handler, NULL, MHD_OPTION_END);
		snprintf(s3_url, sizeof(s3_url), "http://127.0.0.1:%d", p);
	}
	assert_non_null(s3);
	api_config_defaults(&cfg);
	cfg.cluster_token = "tok";
	cfg.max_body_mib = 16;
	cfg.s3.endpoint = s3_url;
	cfg.s3.region = "us-east-1";
	cfg.s3.bucket = "kbucket";
	cfg.s3.access_key = "ak";
	cfg.s3.secret_key = "sk";
	cfg.s3.attempts = 1;
	for (int i = 0; i < 20 && !srv; i++) {
		int port = 30000 + (int)((getpid() * 13 + seq * 71 + i * 29 + 11) % 20000);

		snprintf(listen_addr, sizeof(listen_addr), "127.0.0.1:%d", port);
		snprintf(base, sizeof(base), "http://%s", listen_addr);
		cfg.listen = listen_addr;
		srv = server_start(&cfg, st, NULL, &err);
	}
	assert_non_null(srv);
	sc = sched_create(st, &sconf, &err);
	assert_non_null(sc);
	ss = sessions_create(&cfg, st, sc, &fake_ops, &fake_clock, &err);
	assert_non_null(ss);
	server_set_sessions(srv, ss);
	heartbeat("h1", host_url);
	sched_tick(sc);
	assert_int_equal(sched_host_state(sc, "h1", NULL), 1);
	customer("acme", key_a, 0);
	customer("beta", key_b, 0);
	customer("gamma", key_c, 1);
	noint_id[0] = 0;
	pthread_mutex_lock(&seen_lock);
	seen_path[0] = 0;
	pthread_mutex_unlock(&seen_lock);
	return 0;
}

static int teardown(void **state)
{
	server_set_sessions(srv, NULL);
	server_stop(srv);
	srv = NULL;
	assert_int_equal(sessions_stop(ss), 0);
	sched_stop(sc);
	store_close(st);
	MHD_stop_daemon(host);
	host = NULL;
	MHD_stop_daemon(s3);
	s3 = NULL;
	return 0;
}

/* ---- requests ---- */

struct answer {
	long status;
	json_t *j;
	char content_type[128];
	char disposition[64], csp[128], nosniff[32];
	struct buf raw;
	double secs;
};

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
	struct answer *a = arg;
	size_t len = size * n;
	char line[256];

	snprintf(line, sizeof(line), "%.*s", (int)(len < 255 ? len : 255), p);
	line[strcspn(line, "\r\n")] = '\0';
	if (!strncasecmp(line, "Content-Type: ", 14))
		snprintf(a->content_type, sizeof(a->content_type), "%s", line + 14);
	if (!strncasecmp(line, "Content-Disposition: ", 21))
		snprintf(a->disposition, sizeof(a->disposition), "%s", line + 21);
	if (!strncasecmp(line, "Content-Security-Policy: ", 25))
		snprintf(a->csp, sizeof(a->csp), "%s", line + 25);
	if (!strncasecmp(line, "X-Content-Type-Options: ", 24))
		snprintf(a->nosniff, sizeof(a->nosniff), "%s", line + 24);
	return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
	struct answer *a = arg;

	return buf_add(&a->raw, p, size * n) < 0 ? 0 : size * n;
}

/* One request: key (NULL: none), sse: Accept: text/event-stream. */
static void call(struct answer *a, const char *key, const char *method, const char *url_path, const char *body,
		 int sse)
{
	CURL *h = curl_easy_init();
	struct curl_slist *l = NULL;
	char url[512], k[200];
	struct timespec t0, t1;

	memset(a, 0, sizeof(*a));
	buf_init(&a->raw, 128u << 20);
	snprintf(url, sizeof(url), "%s%s", base, url_path);
	if (key) {
		snprintf(k, sizeof(k), "Authorization: Bearer %s", key);
		l = curl_slist_append(l, k);
	}
	l = curl_slist_append(l, "Content-Type: application/json");
	if (sse)
		l = curl_slist_append(l, "Accept: text/event-stream");
	l = curl_slist_append(l, "Expect:");
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, l);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, a);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, a);
	curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
	if (body) {
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	{
		CURLcode cr = curl_easy_perform(h);

		if (cr != CURLE_OK)
			fprintf(stderr, "test_api_code: %s %s: curl %d after %zu bytes\n", method, url_path, (int)cr, a->raw.len);
		assert_int_equal(cr, CURLE_OK);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	a->secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a->status);
	if (a->status >= 500)
		fprintf(stderr, "test_api_code: %s %s: %ld %.300s\n", method, url_path, a->status, a->raw.p ? a->raw.p : "");
	a->j = a->raw.len && !strncmp(a->content_type, "application/json", 16) ? json_loadb(a->raw.p, a->raw.len, 0, NULL) : NULL;
	curl_slist_free_all(l);
	curl_easy_cleanup(h);
}

static void answer_free(struct answer *a)
{
	json_decref(a->j);
	buf_free(&a->raw);
}

static void code(struct answer *a, const char *key, const char *id, const char *body, int sse)
{
	char p[128];

	snprintf(p, sizeof(p), "/v1/sessions/%s/code", id);
	call(a, key, "POST", p, body, sse);
}

static const char *err_code(const struct answer *a)
{
	return json_string_value(json_object_get(json_object_get(a->j, "error"), "code")) ?: "";
}

/* The SSE events' names in order, space-separated. */
static void sse_names(const struct answer *a, char *out, size_t cap)
{
	const char *p = a->raw.p ? a->raw.p : "";
	size_t n = 0;

	out[0] = 0;
	while ((p = strstr(p, "event: "))) {
		size_t k = strcspn(p + 7, "\n");

		n += (size_t)snprintf(out + n, cap - n, "%s%.*s", n ? " " : "", (int)k, p + 7);
		if (n >= cap)
			break;
		p += 7 + k;
	}
}

/* The data of the i-th event named name, parsed. */
static json_t *sse_data(const struct answer *a, const char *name, int i)
{
	char pat[64];
	const char *p = a->raw.p ? a->raw.p : "";

	snprintf(pat, sizeof(pat), "event: %s\ndata: ", name);
	while ((p = strstr(p, pat))) {
		p += strlen(pat);
		if (i-- == 0)
			return json_loadb(p, strcspn(p, "\n"), 0, NULL);
	}
	return NULL;
}

/* ---- the tests ---- */

static void test_run_whole(void **state)
{
	char id[40];
	struct answer a;
	json_t *r0;

	session("acme", id);
	code(&a, key_a, id, "{\"code\":\"1+1\",\"env_vars\":{\"K\":\"v\"},\"timeout_ms\":5000}", 0);
	assert_int_equal(a.status, 200);
	assert_string_equal(a.content_type, "application/json");
	r0 = json_array_get(json_object_get(a.j, "results"), 0);
	assert_string_equal(json_string_value(json_object_get(r0, "text")), "2");
	assert_true(json_is_true(json_object_get(r0, "is_main_result")));
	assert_null(json_object_get(r0, "type"));
	assert_int_equal(json_integer_value(json_object_get(a.j, "execution_count")), 7);
	assert_true(json_is_null(json_object_get(a.j, "error")));
	/* Nothing after end_of_execution counts. */
	assert_int_equal(json_array_size(json_object_get(json_object_get(a.j, "logs"), "stdout")), 0);
	/* The interpreter got the request kiln wrote: no timeout_ms, nothing else. */
	assert_int_equal(seen_tunnel_port, 49999);
	assert_string_equal(seen_method, "POST");
	assert_string_equal(seen_path, "/execute");
	assert_string_equal(seen_body, "{\"code\":\"1+1\",\"env_vars\":{\"K\":\"v\"}}");
	answer_free(&a);

	code(&a, key_a, id, "{\"code\":\"x\",\"context_id\":\"c1\"}", 0);
	assert_string_equal(seen_body, "{\"code\":\"x\",\"context_id\":\"c1\"}");
	answer_free(&a);
	code(&a, key_a, id, "{\"code\":\"x\",\"language\":\"bash\"}", 0);
	assert_string_equal(seen_body, "{\"code\":\"x\",\"language\":\"bash\"}");
	answer_free(&a);
}

static void test_logs_error(void **state)
{
	char id[40];
	struct answer a;
	json_t *logs, *e;

	session("acme", id);
	code(&a, key_a, id, "{\"code\":\"out\"}", 0);
	assert_int_equal(a.status, 200);
	logs = json_object_get(a.j, "logs");
	assert_int_equal(json_array_size(json_object_get(logs, "stdout")), 2);
	assert_string_equal(json_string_value(json_array_get(json_object_get(logs, "stdout"), 0)), "a\n");
	assert_string_equal(json_string_value(json_array_get(json_object_get(logs, "stdout"), 1)), "c\n");
	assert_string_equal(json_string_value(json_array_get(json_object_get(logs, "stderr"), 0)), "b\n");
	e = json_object_get(a.j, "error");
	assert_string_equal(json_string_value(json_object_get(e, "name")), "ValueError");
	assert_string_equal(json_string_value(json_object_get(e, "value")), "boom");
	assert_non_null(strstr(json_string_value(json_object_get(e, "traceback")), "ValueError: boom"));
	answer_free(&a);
}

static void test_sse(void **state)
{
	char id[40], names[512];
	struct answer a;
	json_t *d;

	session("acme", id);
	code(&a, key_a, id, "{\"code\":\"out\"}", 1);
	assert_int_equal(a.status, 200);
	assert_string_equal(a.content_type, "text/event-stream");
	sse_names(&a, names, sizeof(names));
	assert_string_equal(names, "stdout stderr stdout error execution_count end");
	d = sse_data(&a, "stdout", 1);
	assert_string_equal(json_string_value(json_object_get(d, "text")), "c\n");
	json_decref(d);
	d = sse_data(&a, "end", 0);
	assert_int_equal(json_integer_value(json_object_get(d, "execution_count")), 7);
	json_decref(d);
	answer_free(&a);
}

static void test_rich_results(void **state)
{
	char id[40], names[256];
	struct answer a;
	json_t *r0, *r1, *d;

	session("acme", id);
	code(&a, key_a, id, "{\"code\":\"plot\"}", 0);
	assert_int_equal(a.status, 200);
	r0 = json_array_get(json_object_get(a.j, "results"), 0);
	r1 = json_array_get(json_object_get(a.j, "results"), 1);
	assert_string_equal(json_string_value(json_object_get(r0, "png")), PNG_B64);
	assert_string_equal(json_string_value(json_object_get(json_object_get(r0, "chart"), "type")), "line");
	assert_true(json_is_false(json_object_get(r0, "is_main_result")));
	assert_string_equal(json_string_value(json_object_get(r1, "html")), "<table></table>");
	assert_int_equal(json_integer_value(json_array_get(json_object_get(json_object_get(r1, "data"), "a"), 1)), 2);
	answer_free(&a);

	code(&a, key_a, id, "{\"code\":\"plot\"}", 1);
	sse_names(&a, names, sizeof(names));
	assert_string_equal(names, "result result execution_count end");
	d = sse_data(&a, "result", 0);
	assert_string_equal(json_string_value(json_object_get(d, "png")), PNG_B64);
	json_decref(d);
	answer_free(&a);
}

static void test_not_events(void **state)
{
	char id[40], names[256];
	struct answer a;
	json_t *r0;

	session("acme", id);
	code(&a, key_a, id, "{\"code\":\"garbage\"}", 0);
	assert_int_equal(a.status, 200);
	assert_int_equal(json_array_size(json_object_get(a.j, "results")), 1);
	r0 = json_array_get(json_object_get(a.j, "results"), 0);
	assert_string_equal(json_string_value(json_object_get(r0, "text")), "ok");
	assert_true(json_is_false(json_object_get(r0, "is_main_result")));
	answer_free(&a);

	/* Cut before its end: whole, 502; streamed, an error and end. */
	code(&a, key_a, id, "{\"code\":\"cut\"}", 0);
	assert_int_equal(a.status, 502);
	assert_string_equal(err_code(&a), "port_closed");
	answer_free(&a);
	code(&a, key_a, id, "{\"code\":\"cut\"}", 1);
	sse_names(&a, names, sizeof(names));
	assert_string_equal(names, "stdout error end");
	{
		json_t *d = sse_data(&a, "error", 0);

		assert_string_equal(json_string_value(json_object_get(d, "name")), "InterpreterError");
		json_decref(d);
	}
	answer_free(&a);
}

static int interrupted(void)
{
	int v;

	for (int i = 0; i < 200; i++) {
		pthread_mutex_lock(&seen_lock);
		v = seen_interrupted;
		pthread_mutex_unlock(&seen_lock);
		if (v)
			return 1;
		usleep(10000);
	}
	return 0;
}

static void test_timeout(void **state)
{
	char id[40], names[256];
	struct answer a;
	json_t *e, *d;

	session("acme", id);
	seen_interrupted = 0;
	code(&a, key_a, id, "{\"code\":\"slow\",\"timeout_ms\":300}", 0);
	assert_int_equal(a.status, 200);
	assert_true(a.secs < 5);
	e = json_object_get(a.j, "error");
	assert_string_equal(json_string_value(json_object_get(e, "name")), "TimeoutError");
	/* What the cell wrote before it. */
	assert_string_equal(json_string_value(json_array_get(json_object_get(json_object_get(a.j, "logs"), "stdout"), 0)),
			    "started\n");
	assert_true(interrupted());
	answer_free(&a);

	seen_interrupted = 0;
	code(&a, key_a, id, "{\"code\":\"slow\",\"timeout_ms\":300}", 1);
	sse_names(&a, names, sizeof(names));
	assert_string_equal(names, "stdout error end");
	d = sse_data(&a, "error", 0);
	assert_string_equal(json_string_value(json_object_get(d, "name")), "TimeoutError");
	json_decref(d);
	assert_true(interrupted());
	answer_free(&a);
}

static void test_caps(void **state)
{
	char id[40];
	struct answer a;
	size_t events = 0;

	session("acme", id);
	code(&a, key_a, id, "{\"code\":\"big\"}", 0);
	assert_int_equal(a.status, 413);
	assert_string_equal(err_code(&a), "too_large");
	assert_non_null(strstr(json_string_value(json_object_get(json_object_get(a.j, "error"), "message")),
			       "text/event-stream"));
	answer_free(&a);
	/* A stream passes all 40 MiB. */
	code(&a, key_a, id, "{\"code\":\"big\"}", 1);
	assert_int_equal(a.status, 200);
	for (const char *p = a.raw.p; (p = strstr(p, "event: stdout\n")); p++)
		events++;
	assert_int_equal(events, 40);
	assert_non_null(strstr(a.raw.p, "event: end\n"));
	answer_free(&a);
}

static void test_refusals(void **state)
{
	char id[40], other[40], paused[40];
	struct answer a;
	static const struct {
		const char *body, *code;
	} bad[] = {
		{ "not json", "invalid_json" },
		{ "[1]", "invalid_json" },
		{ "{\"language\":\"python\"}", "invalid_request" },
		{ "{\"code\":1}", "invalid_request" },
		{ "{\"code\":\"1\",\"language\":\"python\",\"context_id\":\"c1\"}", "invalid_request" },
		{ "{\"code\":\"1\",\"context_id\":\"../x\"}", "invalid_request" },
		{ "{\"code\":\"1\",\"env_vars\":{\"1A\":\"v\"}}", "invalid_request" },
		{ "{\"code\":\"1\",\"env_vars\":{\"A\":1}}", "invalid_request" },
		{ "{\"code\":\"1\",\"env_vars\":[]}", "invalid_request" },
		{ "{\"code\":\"1\",\"timeout_ms\":0}", "invalid_request" },
		{ "{\"code\":\"1\",\"timeout_ms\":3600001}", "invalid_request" },
		{ "{\"code\":\"1\",\"timeout_ms\":\"5\"}", "invalid_request" },
	};

	session("acme", id);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		code(&a, key_a, id, bad[i].body, 0);
		if (a.status != 400 || strcmp(err_code(&a), bad[i].code))
			fail_msg("%s: %ld %s", bad[i].body, a.status, err_code(&a));
		answer_free(&a);
	}
	code(&a, NULL, id, "{\"code\":\"1+1\"}", 0);
	assert_int_equal(a.status, 401);
	answer_free(&a);
	/* Another customer's session, and none: the same 404. */
	session("beta", other);
	code(&a, key_a, other, "{\"code\":\"1+1\"}", 0);
	assert_int_equal(a.status, 404);
	assert_string_equal(err_code(&a), "not_found");
	answer_free(&a);
	code(&a, key_a, "s_00000000000000000000000000000000", "{\"code\":\"1+1\"}", 0);
	assert_int_equal(a.status, 404);
	answer_free(&a);
	session("acme", paused);
	assert_int_equal(store_session_transition(st, paused, SESSION_RUNNING, SESSION_PAUSED, NULL, NULL, NULL), 1);
	code(&a, key_a, paused, "{\"code\":\"1+1\"}", 0);
	assert_int_equal(a.status, 409);
	assert_string_equal(err_code(&a), "not_running");
	answer_free(&a);
	/* No interpreter in it. */
	session("acme", noint_id);
	code(&a, key_a, noint_id, "{\"code\":\"1+1\"}", 1);
	assert_int_equal(a.status, 409);
	assert_string_equal(err_code(&a), "no_interpreter");
	answer_free(&a);
	/* Methods and paths. */
	call(&a, key_a, "GET", "/v1/sessions/x/code", NULL, 0);
	assert_int_equal(a.status, 405);
	answer_free(&a);
	{
		char p[128];

		snprintf(p, sizeof(p), "/v1/sessions/%s/code", id);
		call(&a, key_a, "GET", p, NULL, 0);
		assert_int_equal(a.status, 405);
		answer_free(&a);
		snprintf(p, sizeof(p), "/v1/sessions/%s/code/nope", id);
		call(&a, key_a, "POST", p, "{}", 0);
		assert_int_equal(a.status, 404);
		answer_free(&a);
		snprintf(p, sizeof(p), "/v1/sessions/%s/code/contexts/c1/x", id);
		call(&a, key_a, "POST", p, "{}", 0);
		assert_int_equal(a.status, 404);
		answer_free(&a);
	}
	/* Other session routes are not the code API's. */
	assert_int_equal(ports_code_path("/v1/sessions/abc/codex"), 0);
	assert_int_equal(ports_code_path("/v1/sessions/abc/exec"), 0);
	assert_int_equal(ports_code_path("/v1/sessions/abc/code"), 1);
	assert_int_equal(ports_code_path("/v1/sessions/abc/code/contexts/c1/restart"), 1);
}

static void test_contexts(void **state)
{
	char id[40], p[160];
	struct answer a;

	session("acme", id);
	snprintf(p, sizeof(p), "/v1/sessions/%s/code/contexts", id);
	call(&a, key_a, "GET", p, NULL, 0);
	assert_int_equal(a.status, 200);
	assert_string_equal(seen_path, "/contexts");
	assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(a.j, "contexts"), 0), "id")),
			    "c1");
	answer_free(&a);
	call(&a, key_a, "POST", p, "{\"language\":\"bash\",\"cwd\":\"/tmp\",\"other\":1}", 0);
	assert_int_equal(a.status, 201);
	assert_string_equal(json_string_value(json_object_get(a.j, "id")), "c2");
	assert_string_equal(seen_body, "{\"language\":\"bash\",\"cwd\":\"/tmp\"}");
	answer_free(&a);
	call(&a, key_a, "POST", p, "", 0);
	assert_int_equal(a.status, 201);
	assert_string_equal(seen_body, "{}");
	answer_free(&a);
	call(&a, key_a, "POST", p, "{\"cwd\":\"relative\"}", 0);
	assert_int_equal(a.status, 400);
	answer_free(&a);
	snprintf(p, sizeof(p), "/v1/sessions/%s/code/contexts/c1/restart", id);
	call(&a, key_a, "POST", p, NULL, 0);
	assert_int_equal(a.status, 200);
	assert_string_equal(seen_path, "/contexts/c1/restart");
	answer_free(&a);
	snprintf(p, sizeof(p), "/v1/sessions/%s/code/contexts/c1", id);
	call(&a, key_a, "DELETE", p, NULL, 0);
	assert_int_equal(a.status, 204);
	assert_string_equal(seen_method, "DELETE");
	answer_free(&a);
	snprintf(p, sizeof(p), "/v1/sessions/%s/code/contexts/zz", id);
	call(&a, key_a, "DELETE", p, NULL, 0);
	assert_int_equal(a.status, 404);
	assert_string_equal(err_code(&a), "not_found");
	assert_string_equal(json_string_value(json_object_get(json_object_get(a.j, "error"), "message")),
			    "context zz not found");
	answer_free(&a);
	call(&a, key_a, "GET", p, NULL, 0);
	assert_int_equal(a.status, 405);
	answer_free(&a);
	/* Another customer's session. */
	snprintf(p, sizeof(p), "/v1/sessions/%s/code/contexts", id);
	call(&a, key_b, "GET", p, NULL, 0);
	assert_int_equal(a.status, 404);
	answer_free(&a);
}

struct bg_cell {
	char id[40];
	struct answer a;
};

static void *bg_slow(void *arg)
{
	struct bg_cell *b = arg;

	code(&b->a, key_c, b->id, "{\"code\":\"slow\",\"timeout_ms\":1500}", 1);
	return NULL;
}

/* A cell is a long-lived request: counted against max_streams while it runs,
 * and given back when it ends. */
static void test_streams_counted(void **state)
{
	struct bg_cell b;
	struct answer a;
	pthread_t th;

	session("gamma", b.id);
	seen_interrupted = 0;
	assert_int_equal(pthread_create(&th, NULL, bg_slow, &b), 0);
	for (int i = 0; i < 200 && !seen_path[0]; i++)
		usleep(10000);
	usleep(200000); /* the first cell is running (the stand-in got it) */
	code(&a, key_c, b.id, "{\"code\":\"1+1\"}", 0);
	assert_int_equal(a.status, 429);
	assert_string_equal(err_code(&a), "too_many_streams");
	answer_free(&a);
	pthread_join(th, NULL);
	assert_int_equal(b.a.status, 200);
	answer_free(&b.a);
	code(&a, key_c, b.id, "{\"code\":\"1+1\"}", 0);
	assert_int_equal(a.status, 200);
	answer_free(&a);
}

/* GET /v1/tasks/{id}/outputs/{n}: an output's bytes from S3, as an
 * attachment that is never rendered; only keys under the task's prefix,
 * 16 MiB at most, the customer's own tasks, with a key. */
static void test_task_output(void **state)
{
	struct kiln_err err = { .code = "" };
	char id[40], key[128], p[128];
	struct answer a;
	json_t *ht;

	assert_int_equal(store_task_insert(st, "acme", "{}", NULL, 1, 256, NULL, "h", id, &err), 0);
	snprintf(key, sizeof(key), "acme/%s/outputs/plot.png", id);
	snprintf(s3_object, sizeof(s3_object), "/kbucket/%s", key);
	ht = json_pack("{s:{s:i}, s:[{s:s, s:i, s:s}, {s:s, s:i, s:s}, {s:s, s:I, s:s}]}", "result", "exit_code", 0,
		       "outputs", "path", "plot.png", "size", 15, "s3_key", key, "path", "evil.png", "size", 3, "s3_key",
		       "beta/t_x/outputs/evil.png", "path", "big.bin", "size", (json_int_t)17000000, "s3_key", key);
	assert_int_equal(store_task_finish(st, id, TASK_SUCCEEDED, "exited", ht), 1);
	json_decref(ht);

	snprintf(p, sizeof(p), "/v1/tasks/%s/outputs/0", id);
	call(&a, key_a, "GET", p, NULL, 0);
	if (a.status != 200) {
		struct answer t;
		char tp[80];

		snprintf(tp, sizeof(tp), "/v1/tasks/%s", id);
		call(&t, key_a, "GET", tp, NULL, 0);
		fail_msg("%ld %.*s / %.*s", a.status, (int)a.raw.len, a.raw.p ? a.raw.p : "", (int)t.raw.len, t.raw.p);
	}
	assert_int_equal(a.raw.len, 15);
	assert_memory_equal(a.raw.p, "\x89PNG-not-really", 15);
	assert_string_equal(a.content_type, "application/octet-stream");
	assert_string_equal(a.disposition, "attachment");
	assert_string_equal(a.nosniff, "nosniff");
	assert_non_null(strstr(a.csp, "sandbox"));
	answer_free(&a);
	/* Another customer's task, no key. */
	call(&a, key_b, "GET", p, NULL, 0);
	assert_int_equal(a.status, 404);
	answer_free(&a);
	call(&a, NULL, "GET", p, NULL, 0);
	assert_int_equal(a.status, 401);
	answer_free(&a);
	/* A key outside the task's prefix is not fetched; past 16 MiB; no such output. */
	snprintf(p, sizeof(p), "/v1/tasks/%s/outputs/1", id);
	call(&a, key_a, "GET", p, NULL, 0);
	assert_int_equal(a.status, 404);
	answer_free(&a);
	snprintf(p, sizeof(p), "/v1/tasks/%s/outputs/2", id);
	call(&a, key_a, "GET", p, NULL, 0);
	assert_int_equal(a.status, 413);
	answer_free(&a);
	for (int i = 0; i < 3; i++) {
		static const char *const bad[] = { "3", "x", "-1" };

		snprintf(p, sizeof(p), "/v1/tasks/%s/outputs/%s", id, bad[i]);
		call(&a, key_a, "GET", p, NULL, 0);
		assert_int_equal(a.status, 404);
		answer_free(&a);
	}
	/* The object gone from S3: an S3 error, not bytes. */
	s3_object[0] = 0;
	snprintf(p, sizeof(p), "/v1/tasks/%s/outputs/0", id);
	call(&a, key_a, "GET", p, NULL, 0);
	assert_true(a.status >= 500);
	answer_free(&a);
}

/* ---- the pure parts ---- */

static int collect(void *cls, const char *name, json_t *ev)
{
	struct buf *b = cls;

	(void)ev;
	return buf_printf(b, "%s%s", b->len ? " " : "", name);
}

static void test_event_reader(void **state)
{
	static const char in[] = "{\"type\": \"stdout\", \"text\": \"a\"}\n\n  \n{\"type\": \"res"
				 "ult\", \"text\": \"1\"}\r\n{\"type\": \"number_of_executions\", \"execution_count\": -1}\n"
				 "{\"type\": \"number_of_executions\", \"execution_count\": 3}\n{\"type\": \"end_of_execution\"}\n"
				 "{\"type\": \"stdout\", \"text\": \"late\"}\n";
	static const char line[] = "{\"type\": \"stdout\", \"text\": \"0123456789\"}\n";
	struct code_exec x;
	struct buf names = BUF_INIT;
	json_t *r;

	/* Byte by byte: the same as whole. */
	code_exec_init(&x, 1 << 20, 1 << 20);
	for (size_t i = 0; i < sizeof(in) - 1; i++)
		assert_int_equal(code_exec_feed(&x, in + i, 1, collect, &names), 0);
	assert_string_equal(names.p, "stdout result execution_count end");
	assert_int_equal(x.skipped, 1);
	r = code_exec_result(&x);
	assert_int_equal(json_integer_value(json_object_get(r, "execution_count")), 3);
	assert_int_equal(json_array_size(json_object_get(json_object_get(r, "logs"), "stdout")), 1);
	json_decref(r);
	code_exec_free(&x);
	buf_free(&names);

	/* A line past line_max; a model past held_max. */
	code_exec_init(&x, 0, 16);
	assert_int_equal(code_exec_feed(&x, line, strlen(line), NULL, NULL), -E2BIG);
	code_exec_free(&x);
	code_exec_init(&x, 16, 0);
	assert_int_equal(code_exec_feed(&x, line, strlen(line), NULL, NULL), -E2BIG);
	assert_true(x.too_big);
	code_exec_free(&x);
	/* Nothing fed: an empty model. */
	code_exec_init(&x, 16, 0);
	r = code_exec_result(&x);
	assert_true(json_is_null(json_object_get(r, "error")));
	assert_true(json_is_null(json_object_get(r, "execution_count")));
	json_decref(r);
	code_exec_free(&x);
}

#define B1 "{\"code\":\"1\",\"timeout_ms\":null,\"language\":null,\"x\":1}"
#define B2 "{\"code\":\"1\",\"timeout_ms\":1500}"
#define B3 "{\"code\":\"1\",\"context_id\":\"\"}"

static void test_request_body(void **state)
{
	struct kiln_err err = { .code = "" };
	unsigned t = 0;
	char *s;

	s = ports_code_request(B1, strlen(B1), &t, &err);
	assert_non_null(s);
	assert_string_equal(s, "{\"code\":\"1\"}");
	assert_int_equal(t, 300000);
	free(s);
	s = ports_code_request(B2, strlen(B2), &t, &err);
	assert_non_null(s);
	assert_int_equal(t, 1500);
	free(s);
	assert_null(ports_code_request("", 0, &t, &err));
	assert_string_equal(err.code, "invalid_json");
	assert_null(ports_code_request(B3, strlen(B3), &t, &err));
	assert_string_equal(err.code, "invalid_request");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_run_whole, setup, teardown),
		cmocka_unit_test_setup_teardown(test_logs_error, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sse, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rich_results, setup, teardown),
		cmocka_unit_test_setup_teardown(test_not_events, setup, teardown),
		cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_caps, setup, teardown),
		cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
		cmocka_unit_test_setup_teardown(test_contexts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_streams_counted, setup, teardown),
		cmocka_unit_test_setup_teardown(test_task_output, setup, teardown),
		cmocka_unit_test(test_event_reader),
		cmocka_unit_test(test_request_body),
	};
	int r;

	if (!mkdtemp(dir))
		return 1;
	curl_global_init(CURL_GLOBAL_DEFAULT);
	r = cmocka_run_group_tests(tests, NULL, NULL);
	{
		char cmd[300];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		if (system(cmd) != 0)
			r = r ? r : 1;
	}
	return r;
}
