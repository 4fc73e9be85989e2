/* test_api_e2b: kiln-api's E2B-compatible API (api/sessions/e2b.c, api/sessions/e2b_relay.c)
 * over real HTTP on loopback without VMs: kiln-api's server on a real store
 * and scheduler, hosts answered by fake_host_ops.h's rules (create, pause,
 * resume, destroy, metrics), and, for the envd relay, a small HTTP server
 * standing in for the session's kiln-host that answers with what it got
 * (method, path, query, headers, body) or with a Connect stream sent in
 * pieces. Checks E2B's field names and statuses, the stored token hash,
 * env and autoPause, the list filters, another customer's 404s, the quota's
 * 429 with Retry-After, the relay's single 401, 502 for a paused sandbox,
 * what reaches the host, and the reaper's per-session autoPause. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <microhttpd.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <time.h>

#include "fake_host_ops.h"
#include "api_config.h"
#include "e2b.h"
#include "httpc.h"
#include "quota.h"
#include "scheduler.h"
#include "server.h"
#include "sessions_int.h"
#include "store.h"

static char dir[] = "/tmp/kiln-test-api-e2b.XXXXXX";
static char path[256], listen_addr[64], base[64], host_url[64];
static int seq;
static struct store *st;
static struct sched *sc;
static struct sessions *ss;
static struct server *srv;
static struct api_config cfg;
static struct host_ops ops;
static struct MHD_Daemon *echo;
static char key_a[128], key_b[128];

/* ---- the stand-in kiln-host of the relay ---- */

struct echo_req {
	struct buf body;
};

/* A Connect stream in three pieces: start, data, end-of-stream. */
struct echo_stream {
	int step;
	int slow;                    /* ?slow=1: 300 ms between pieces */
};

static const char *const echo_pieces[] = {
	"\x00\x00\x00\x00\x1d{\"event\":{\"start\":{\"pid\":7}}}",
	"\x00\x00\x00\x00\x26{\"event\":{\"data\":{\"stdout\":\"aGk=\"}}}  ",
	"\x02\x00\x00\x00\x02{}",
};
static const size_t echo_piece_len[] = { 5 + 0x1d, 5 + 0x26, 5 + 2 }; /* 0x1d = 29, 0x26 = 38 */

static ssize_t echo_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct echo_stream *s = cls;

	if (s->step >= 3)
		return MHD_CONTENT_READER_END_OF_STREAM;
	if (s->step)
		usleep(s->slow ? 300000 : 20000); /* pieces apart: the relay sends each as it comes */
	assert_true(echo_piece_len[s->step] <= max);
	memcpy(buf, echo_pieces[s->step], echo_piece_len[s->step]);
	return (ssize_t)echo_piece_len[s->step++];
}

static int echo_calls; /* calls that reached the stand-in host */

static enum MHD_Result hdr(json_t *j, struct MHD_Connection *c, const char *name)
{
	const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);

	json_object_set_new(j, name, v ? json_string(v) : json_null());
	return MHD_YES;
}

static enum MHD_Result echo_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
				    const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct echo_req *r = *con_cls;
	struct MHD_Response *resp;
	enum MHD_Result ret;

	if (!r) {
		r = calloc(1, sizeof(*r));
		buf_init(&r->body, 64u << 20);
		*con_cls = r;
		return MHD_YES;
	}
	if (*upload_size) {
		buf_add(&r->body, upload, *upload_size);
		*upload_size = 0;
		return MHD_YES;
	}
	__atomic_add_fetch(&echo_calls, 1, __ATOMIC_SEQ_CST);
	if (strstr(url, "/envd/process.Process/Start")) {
		struct echo_stream *s = calloc(1, sizeof(*s));

		s->slow = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "slow") != NULL;
		resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, echo_read, s, free);
		MHD_add_response_header(resp, "Content-Type", "application/connect+json");
		ret = MHD_queue_response(conn, 200, resp);
	} else {
		json_t *j = json_pack("{s:s, s:s, s:I}", "method", method, "url", url, "len", (json_int_t)r->body.len);
		const char *p = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "path");
		const char *u = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "username");
		unsigned char h[SHA256_DIGEST_LENGTH];
		char hex[65], *text;

		SHA256((const unsigned char *)(r->body.p ? r->body.p : ""), r->body.len, h);
		for (int i = 0; i < 32; i++)
			sprintf(hex + 2 * i, "%02x", h[i]);
		json_object_set_new(j, "sha", json_string(hex));
		json_object_set_new(j, "path", p ? json_string(p) : json_null());
		json_object_set_new(j, "username", u ? json_string(u) : json_null());
		hdr(j, conn, "Authorization");
		hdr(j, conn, "E2b-Authorization");
		hdr(j, conn, "Content-Type");
		hdr(j, conn, "Connect-Protocol-Version");
		hdr(j, conn, "Connect-Timeout-Ms");
		hdr(j, conn, "X-Access-Token");
		hdr(j, conn, "Content-Encoding");
		hdr(j, conn, "Accept-Encoding");
		hdr(j, conn, "Kiln-Max-Body-Bytes");
		hdr(j, conn, "X-Metadata-Author");
		text = json_dumps(j, JSON_COMPACT);
		json_decref(j);
		resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
		MHD_add_response_header(resp, "Content-Type", "application/json");
		/* As kiln-host answers a download asked for in gzip (the body is
		 * not: only the header's relaying is looked at). */
		if (MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Accept-Encoding"))
			MHD_add_response_header(resp, "Content-Encoding", "gzip");
		ret = MHD_queue_response(conn, strstr(url, "/health") ? 204 : 200, resp);
	}
	MHD_destroy_response(resp);
	return ret;
}

static void echo_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t)
{
	struct echo_req *r = *con_cls;

	if (r) {
		buf_free(&r->body);
		free(r);
	}
	*con_cls = NULL;
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

static void customer(const char *id, unsigned max_running, int auto_pause, char *key)
{
	struct kiln_err err = { .code = "" };
	char key_id[32], *k = NULL;
	struct quota q;

	quota_defaults(&q);
	q.max_running = max_running;
	q.session_auto_pause = auto_pause;
	q.submit_rate = 1000;
	q.submit_burst = 1000;
	assert_int_equal(store_customer_create(st, id, id, &q, &err), 0);
	assert_int_equal(store_key_create(st, id, 0, &k, key_id, &err), 0);
	snprintf(key, 128, "%s", k);
	free(k);
}

static int setup(void **state)
{
	struct kiln_err err = { .code = "" };
	struct sched_config sconf = {
		.cluster_token = "tok", .host_lost_after_ms = 10000, .host = &fake_ops, .clock = &fake_clock,
	};
	int eport = 0;

	snprintf(path, sizeof(path), "%s/api-%d.db", dir, ++seq);
	st = store_open(path, &err);
	if (!st)
		fail_msg("store_open: %s", err.message);
	fake_reset();
	clock_reset();
	fake_rule("GET", NULL, "/v1/sessions", 200, "{\"sessions\":[]}");
	fake_rule("POST", NULL, "/v1/sessions", 201, "{}");
	fake_rule("DELETE", NULL, "/v1/sessions/", 200, "{}");
	/* The relay's stream calls go to the stand-in host over real HTTP. */
	ops = fake_ops;
	ops.stream_open_raw = host_ops_hostclient.stream_open_raw;
	ops.stream_content_type = host_ops_hostclient.stream_content_type;
	ops.stream_header = host_ops_hostclient.stream_header;
	ops.stream_status = host_ops_hostclient.stream_status;
	ops.stream_read = host_ops_hostclient.stream_read;
	ops.stream_close = host_ops_hostclient.stream_close;
	for (int i = 0; i < 20 && !echo; i++) {
		eport = 30000 + (int)((getpid() * 7 + seq * 131 + i * 17) % 20000);
		echo = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, (uint16_t)eport,
					NULL, NULL, echo_handler, NULL, MHD_OPTION_NOTIFY_COMPLETED, echo_done, NULL,
					MHD_OPTION_END);
	}
	assert_non_null(echo);
	snprintf(host_url, sizeof(host_url), "http://127.0.0.1:%d", eport);
	api_config_defaults(&cfg);
	cfg.cluster_token = "tok";
	cfg.max_body_mib = 16;
	for (int i = 0; i < 20 && !srv; i++) {
		int port = 30000 + (int)((getpid() * 13 + seq * 71 + i * 29 + 7) % 20000);

		snprintf(listen_addr, sizeof(listen_addr), "127.0.0.1:%d", port);
		snprintf(base, sizeof(base), "http://%s", listen_addr);
		cfg.listen = listen_addr;
		srv = server_start(&cfg, st, NULL, &err);
	}
	assert_non_null(srv);
	sc = sched_create(st, &sconf, &err);
	assert_non_null(sc);
	ss = sessions_create(&cfg, st, sc, &ops, &fake_clock, &err);
	assert_non_null(ss);
	server_set_sessions(srv, ss);
	heartbeat("h1", host_url);
	sched_tick(sc);
	assert_int_equal(sched_host_state(sc, "h1", NULL), 1);
	customer("acme", 1, 0, key_a);
	customer("beta", 4, 0, key_b);
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
	MHD_stop_daemon(echo);
	echo = NULL;
	return 0;
}

/* ---- requests ---- */

struct answer {
	long status;
	json_t *j;                   /* the body as JSON (NULL if not) */
	char retry_after[32];
	char next_token[160];
	char content_type[128];
	char content_encoding[32];
	struct buf raw;
};

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
	struct answer *a = arg;
	size_t len = size * n;
	char line[256];

	snprintf(line, sizeof(line), "%.*s", (int)(len < 255 ? len : 255), p);
	line[strcspn(line, "\r\n")] = '\0';
	if (!strncasecmp(line, "Retry-After: ", 13))
		snprintf(a->retry_after, sizeof(a->retry_after), "%s", line + 13);
	if (!strncasecmp(line, "x-next-token: ", 14))
		snprintf(a->next_token, sizeof(a->next_token), "%s", line + 14);
	if (!strncasecmp(line, "Content-Type: ", 14))
		snprintf(a->content_type, sizeof(a->content_type), "%s", line + 14);
	if (!strncasecmp(line, "Content-Encoding: ", 18))
		snprintf(a->content_encoding, sizeof(a->content_encoding), "%s", line + 18);
	return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
	struct answer *a = arg;

	return buf_add(&a->raw, p, size * n) < 0 ? 0 : size * n;
}

/* One request with curl: extra header lines (NULL-terminated), a body. */
static void call(struct answer *a, const char *method, const char *url_path, const char *const *headers,
		 const void *body, size_t len)
{
	CURL *h = curl_easy_init();
	struct curl_slist *l = NULL;
	char url[512];

	memset(a, 0, sizeof(*a));
	buf_init(&a->raw, 64u << 20);
	snprintf(url, sizeof(url), "%s%s", base, url_path);
	for (const char *const *x = headers; x && *x; x++)
		l = curl_slist_append(l, *x);
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
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
	}
	assert_int_equal(curl_easy_perform(h), CURLE_OK);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a->status);
	a->j = a->raw.len ? json_loadb(a->raw.p, a->raw.len, 0, NULL) : NULL;
	curl_slist_free_all(l);
	curl_easy_cleanup(h);
}

static void answer_free(struct answer *a)
{
	json_decref(a->j);
	buf_free(&a->raw);
}

/* The control API with key. */
static void api(struct answer *a, const char *key, const char *method, const char *p, const char *body)
{
	char k[200];
	const char *hs[] = { k, "Content-Type: application/json", NULL };

	snprintf(k, sizeof(k), "X-API-KEY: %s", key);
	call(a, method, p, hs, body, body ? strlen(body) : 0);
}

static const char *str(json_t *j, const char *k)
{
	return json_string_value(json_object_get(j, k)) ?: "";
}

/* A sandbox id as stored ("s_" + 32 hex digits). */
static const char *canon(const char *sandbox_id)
{
	static char out[4][40];
	static int k;

	k = (k + 1) % 4;
	return store_session_id_canon(sandbox_id, out[k]);
}

/* Create a sandbox of key's customer: its id and token. */
static void create(const char *key, const char *body, char id[40], char tok[65])
{
	struct answer a;

	api(&a, key, "POST", "/e2b/v2/sandboxes", body);
	if (a.status != 201)
		fail_msg("create: %ld %.*s", a.status, (int)a.raw.len, a.raw.p ? a.raw.p : "");
	/* E2B's spelling (a DNS label: no underscore); the tests hold the
	 * stored id, which E2B's API takes too. */
	assert_int_equal(strlen(str(a.j, "sandboxID")), 33);
	assert_null(strchr(str(a.j, "sandboxID"), '_'));
	snprintf(id, 40, "%s", canon(str(a.j, "sandboxID")));
	snprintf(tok, 65, "%s", str(a.j, "envdAccessToken"));
	answer_free(&a);
}

/* ---- the control API ---- */

static void test_create_fields(void **state)
{
	struct store_session c;
	struct answer a;
	unsigned char h[32];
	char *spec;
	json_t *sj;

	api(&a, key_a, "POST", "/e2b/v2/sandboxes",
	    "{\"templateID\":\"base\",\"timeout\":120,\"autoPause\":true,\"envVars\":{\"FOO\":\"bar\"},"
	    "\"metadata\":{\"app\":\"t\"},\"secure\":true,\"allow_internet_access\":false,\"autoPauseMemory\":true}");
	assert_int_equal(a.status, 201);
	assert_string_equal(str(a.j, "templateID"), "base");
	assert_string_equal(str(a.j, "envdVersion"), E2B_ENVD_VERSION);
	assert_int_equal(strlen(str(a.j, "envdAccessToken")), 64);
	assert_true(json_is_null(json_object_get(a.j, "domain")));
	assert_int_equal(store_session_get(st, str(a.j, "sandboxID"), "acme", &c), 0);
	assert_int_equal(c.state, SESSION_RUNNING);
	/* Only the token's SHA-256 is stored; the limits are the timeout. */
	SHA256((const unsigned char *)str(a.j, "envdAccessToken"), 64, h);
	assert_true(c.has_e2b_token);
	assert_memory_equal(h, c.e2b_token_sha, 32);
	assert_int_equal(c.auto_pause, 1);
	assert_string_equal(c.e2b_template, "base");
	assert_int_equal(c.max_lifetime_s, 120);
	assert_int_equal(c.idle_timeout_s, 120);
	/* The env goes to hosts in the spec. */
	spec = store_session_spec(st, c.id);
	sj = json_loads(spec, 0, NULL);
	assert_string_equal(json_string_value(json_object_get(json_object_get(sj, "env"), "FOO")), "bar");
	json_decref(sj);
	free(spec);
	answer_free(&a);
}

/* The Code Interpreter SDK's default template is the built-in code-interpreter;
 * the sandbox reports the name it was asked for. */
static void test_create_code_interpreter(void **state)
{
	static const char body[] = "{\"templateID\":\"code-interpreter-v1\"}";
	struct e2b_create c;
	char msg[256];

	assert_int_equal(e2b_create_parse(body, sizeof(body) - 1, 0, &c, msg, sizeof(msg)), 0);
	assert_string_equal(c.template, "code-interpreter-v1");
	assert_string_equal(json_string_value(json_object_get(c.native, "template")), "code-interpreter");
	e2b_create_free(&c);
}

static void test_create_refused(void **state)
{
	static const char *const bad[] = {
		"{\"envVars\":{\"A\":1}}", "{\"envVars\":{\"1A\":\"x\"}}", "{\"timeout\":-1}",
		"{\"timeout\":999999}", "{\"autoPause\":\"yes\"}", "{\"mcp\":[1]}", "{\"metadata\":[1]}",
		"{\"templateID\":5}", "[1]", "{",
	};
	struct answer a;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		api(&a, key_a, "POST", "/e2b/v2/sandboxes", bad[i]);
		if (a.status != 400 || json_integer_value(json_object_get(a.j, "code")) != 400 ||
		    !str(a.j, "message")[0])
			fail_msg("%s: %ld %.*s", bad[i], a.status, (int)a.raw.len, a.raw.p ? a.raw.p : "");
		answer_free(&a);
	}
	/* Internet access the account does not allow. */
	api(&a, key_a, "POST", "/e2b/v2/sandboxes", "{\"allow_internet_access\":true}");
	assert_int_equal(a.status, 400);
	answer_free(&a);
	/* A template that does not exist: not a 2xx, E2B's shape. */
	api(&a, key_a, "POST", "/e2b/v2/sandboxes", "{\"templateID\":\"nosuch\"}");
	assert_true(a.status >= 400 && a.status < 500);
	assert_int_equal(json_integer_value(json_object_get(a.j, "code")), a.status);
	answer_free(&a);
	assert_int_equal(fake_count("POST", NULL, "/v1/sessions"), 0);
}

static void test_keys(void **state)
{
	const char *hs[] = { "Authorization: Bearer nope", NULL };
	struct answer a;

	api(&a, "kiln_x_y", "GET", "/e2b/v2/sandboxes", NULL);
	assert_int_equal(a.status, 401);
	assert_int_equal(json_integer_value(json_object_get(a.j, "code")), 401);
	answer_free(&a);
	call(&a, "GET", "/e2b/v2/sandboxes", hs, NULL, 0);
	assert_int_equal(a.status, 401);
	answer_free(&a);
	/* kiln's own API is unchanged: Bearer, not X-API-KEY. */
	api(&a, key_a, "GET", "/v1/sessions", NULL);
	assert_int_equal(a.status, 401);
	answer_free(&a);
}

static void test_get_list_isolation(void **state)
{
	char id[40], tok[65], idb[40], tokb[65], p[128];
	struct answer a;

	create(key_a, "{\"metadata\":{\"app\":\"x y\",\"n\":\"1\"}}", id, tok);
	create(key_b, "{}", idb, tokb);
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s", id);
	api(&a, key_a, "GET", p, NULL);
	assert_int_equal(a.status, 200);
	assert_string_equal(str(a.j, "state"), "running");
	assert_string_equal(str(a.j, "envdAccessToken"), tok);
	assert_string_equal(str(json_object_get(a.j, "metadata"), "app"), "x y");
	assert_int_equal(json_integer_value(json_object_get(a.j, "cpuCount")), 1);
	answer_free(&a);
	/* Another customer: 404, whatever the call. */
	api(&a, key_b, "GET", p, NULL);
	assert_int_equal(a.status, 404);
	assert_int_equal(json_integer_value(json_object_get(a.j, "code")), 404);
	answer_free(&a);
	api(&a, key_b, "DELETE", p, NULL);
	assert_int_equal(a.status, 404);
	answer_free(&a);
	api(&a, key_a, "GET", "/e2b/v2/sandboxes", NULL);
	assert_int_equal(a.status, 200);
	assert_int_equal(json_array_size(a.j), 1);
	assert_string_equal(canon(str(json_array_get(a.j, 0), "sandboxID")), id);
	assert_null(json_object_get(json_array_get(a.j, 0), "envdAccessToken"));
	answer_free(&a);
	/* The SDK's metadata filter: encodeURIComponent, form-encoded, then the query. */
	api(&a, key_a, "GET", "/e2b/v2/sandboxes?metadata=app%3Dx%252520y%26n%3D1&state=running%2Cpaused", NULL);
	assert_int_equal(a.status, 200);
	assert_int_equal(json_array_size(a.j), 1);
	answer_free(&a);
	api(&a, key_a, "GET", "/e2b/v2/sandboxes?metadata=app%3Dz", NULL);
	assert_int_equal(json_array_size(a.j), 0);
	answer_free(&a);
	api(&a, key_a, "GET", "/e2b/v2/sandboxes?state=paused", NULL);
	assert_int_equal(json_array_size(a.j), 0);
	answer_free(&a);
	api(&a, key_a, "GET", "/e2b/v2/sandboxes?state=sleeping", NULL);
	assert_int_equal(a.status, 400);
	answer_free(&a);
	/* template and startedAfter (the SDK's toISOString) */
	api(&a, key_a, "GET", "/e2b/v2/sandboxes?template=base", NULL);
	assert_int_equal(json_array_size(a.j), 1);
	answer_free(&a);
	api(&a, key_a, "GET", "/e2b/v2/sandboxes?template=other", NULL);
	assert_int_equal(json_array_size(a.j), 0);
	answer_free(&a);
	api(&a, key_a, "GET", "/e2b/v2/sandboxes?startedAfter=2000-01-01T00%3A00%3A00.000Z", NULL);
	assert_int_equal(a.status, 200);
	assert_int_equal(json_array_size(a.j), 1);
	answer_free(&a);
	api(&a, key_a, "GET", "/e2b/v2/sandboxes?startedAfter=2999-01-01T00%3A00%3A00Z", NULL);
	assert_int_equal(json_array_size(a.j), 0);
	answer_free(&a);
	api(&a, key_a, "GET", "/e2b/v2/sandboxes?startedAfter=yesterday", NULL);
	assert_int_equal(a.status, 400);
	answer_free(&a);
	api(&a, key_b, "GET", "/e2b/sandboxes", NULL);
	assert_int_equal(json_array_size(a.j), 1);
	assert_string_equal(canon(str(json_array_get(a.j, 0), "sandboxID")), idb);
	answer_free(&a);
}

static void test_pagination(void **state)
{
	char id[40], tok[65], ids[3][40];
	struct answer a;
	char p[300];
	int seen = 0;

	for (int i = 0; i < 3; i++) {
		create(key_b, i == 1 ? "{}" : "{\"metadata\":{\"g\":\"y\"}}", id, tok);
		store_session_id_e2b(id, ids[i]);
	}
	/* A full page after which nothing passes the filter has no token (E2B's
	 * SDK reads a token as "there is more"); the filter skips the middle one. */
	api(&a, key_b, "GET", "/e2b/v2/sandboxes?metadata=g%3Dy&limit=2", NULL);
	assert_int_equal(json_array_size(a.j), 2);
	assert_false(a.next_token[0]);
	answer_free(&a);
	api(&a, key_b, "GET", "/e2b/v2/sandboxes?metadata=g%3Dy&limit=1", NULL);
	assert_int_equal(json_array_size(a.j), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(a.j, 0), "sandboxID")), ids[2]);
	assert_true(a.next_token[0]);
	snprintf(p, sizeof(p), "/e2b/v2/sandboxes?metadata=g%%3Dy&limit=1&nextToken=%s", a.next_token);
	answer_free(&a);
	api(&a, key_b, "GET", p, NULL);
	assert_int_equal(json_array_size(a.j), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(a.j, 0), "sandboxID")), ids[0]);
	assert_false(a.next_token[0]);
	answer_free(&a);
	api(&a, key_b, "GET", "/e2b/v2/sandboxes?limit=3", NULL);
	assert_int_equal(json_array_size(a.j), 3);
	assert_false(a.next_token[0]);
	answer_free(&a);
	/* order=asc: oldest first, across pages; desc (the default) newest first. */
	api(&a, key_b, "GET", "/e2b/v2/sandboxes?order=asc&limit=2", NULL);
	assert_int_equal(json_array_size(a.j), 2);
	assert_string_equal(json_string_value(json_object_get(json_array_get(a.j, 0), "sandboxID")), ids[0]);
	assert_string_equal(json_string_value(json_object_get(json_array_get(a.j, 1), "sandboxID")), ids[1]);
	snprintf(p, sizeof(p), "/e2b/v2/sandboxes?order=asc&limit=2&nextToken=%s", a.next_token);
	answer_free(&a);
	api(&a, key_b, "GET", p, NULL);
	assert_int_equal(json_array_size(a.j), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(a.j, 0), "sandboxID")), ids[2]);
	assert_false(a.next_token[0]);
	answer_free(&a);
	api(&a, key_b, "GET", "/e2b/v2/sandboxes?order=desc&limit=1", NULL);
	assert_string_equal(json_string_value(json_object_get(json_array_get(a.j, 0), "sandboxID")), ids[2]);
	answer_free(&a);
	api(&a, key_b, "GET", "/e2b/v2/sandboxes?order=sideways", NULL);
	assert_int_equal(a.status, 400);
	answer_free(&a);
	api(&a, key_b, "GET", "/e2b/v2/sandboxes?limit=2", NULL);
	assert_int_equal(json_array_size(a.j), 2);
	assert_true(a.next_token[0]);
	seen += (int)json_array_size(a.j);
	snprintf(p, sizeof(p), "/e2b/v2/sandboxes?limit=2&nextToken=%s", a.next_token);
	answer_free(&a);
	api(&a, key_b, "GET", p, NULL);
	seen += (int)json_array_size(a.j);
	assert_int_equal(seen, 3);
	answer_free(&a);
}

static void test_quota_429(void **state)
{
	char id[40], tok[65];
	struct answer a;

	create(key_a, "{}", id, tok);
	api(&a, key_a, "POST", "/e2b/v2/sandboxes", "{}");
	assert_int_equal(a.status, 429);
	assert_int_equal(json_integer_value(json_object_get(a.j, "code")), 429);
	assert_true(atoi(a.retry_after) >= 1);
	answer_free(&a);
}

/* The submit rate, as the native API counts it: 429 with Retry-After. */
static void test_rate_429(void **state)
{
	struct kiln_err err = { .code = "" };
	char id[40], tok[65];
	struct answer a;
	struct quota q;

	assert_int_equal(store_customer_quota(st, "beta", &q), 0);
	q.submit_rate = 0.001;
	q.submit_burst = 1;
	assert_int_equal(store_customer_set_quota(st, "beta", &q, &err), 0);
	create(key_b, "{}", id, tok);
	api(&a, key_b, "POST", "/e2b/v2/sandboxes", "{}");
	assert_int_equal(a.status, 429);
	assert_int_equal(json_integer_value(json_object_get(a.j, "code")), 429);
	assert_true(atoi(a.retry_after) >= 1);
	answer_free(&a);
}

static void test_timeout_pause_connect_kill(void **state)
{
	char id[40], tok[65], p[128], pp[128];
	struct store_session c;
	struct answer a;

	create(key_a, "{\"timeout\":60}", id, tok);
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s/timeout", id);
	api(&a, key_a, "POST", p, "{\"timeout\":900}");
	assert_int_equal(a.status, 204);
	answer_free(&a);
	assert_int_equal(store_session_get(st, id, NULL, &c), 0);
	assert_true(c.max_lifetime_s >= 900 && c.max_lifetime_s <= 902);
	assert_int_equal(c.idle_timeout_s, c.max_lifetime_s);
	api(&a, key_a, "POST", p, "{}");
	assert_int_equal(a.status, 400);
	answer_free(&a);
	/* pause */
	snprintf(pp, sizeof(pp), "/v1/sessions/%s/pause", id);
	fake_rule("POST", NULL, pp, 200, "{\"snapshot\":{\"key\":\"k\",\"bytes\":1}}");
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s/pause", id);
	api(&a, key_a, "POST", p, NULL);
	assert_int_equal(a.status, 204);
	answer_free(&a);
	api(&a, key_a, "POST", p, NULL);
	assert_int_equal(a.status, 409);
	answer_free(&a);
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s", id);
	api(&a, key_a, "GET", p, NULL);
	assert_string_equal(str(a.j, "state"), "paused");
	answer_free(&a);
	/* connect resumes it, 201, its timeout from now */
	snprintf(pp, sizeof(pp), "/v1/sessions/%s/resume", id);
	fake_rule("POST", NULL, pp, 200, "{}");
	snprintf(p, sizeof(p), "/e2b/v2/sandboxes/%s/connect", id);
	api(&a, key_a, "POST", p, "{\"timeout\":30}");
	assert_int_equal(a.status, 201);
	assert_string_equal(str(a.j, "envdAccessToken"), tok);
	answer_free(&a);
	assert_int_equal(store_session_get(st, id, NULL, &c), 0);
	assert_int_equal(c.state, SESSION_RUNNING);
	assert_int_equal(c.max_lifetime_s, 30);
	/* running: 200; a shorter timeout does not shorten it (also by the
	 * older SDKs' path, without v2) */
	api(&a, key_a, "POST", p, "{\"timeout\":5}");
	assert_int_equal(a.status, 200);
	answer_free(&a);
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s/connect", id);
	api(&a, key_a, "POST", p, "{\"timeout\":5}");
	assert_int_equal(a.status, 200);
	answer_free(&a);
	assert_int_equal(store_session_get(st, id, NULL, &c), 0);
	assert_int_equal(c.max_lifetime_s, 30);
	/* metrics from the host */
	snprintf(pp, sizeof(pp), "/v1/sessions/%s/metrics", id);
	/* a series: the host's samples in the range asked (the sandbox's start by default) */
	fake_rule("GET", NULL, pp, 200,
		  "{\"samples\":[{\"cpu_count\":1,\"cpu_used_pct\":3,\"mem_used\":90,\"mem_total\":200,\"disk_used\":3,"
		  "\"disk_total\":9,\"t_ms\":1700000000000},{\"cpu_count\":1,\"cpu_used_pct\":12.5,\"mem_used\":100,"
		  "\"mem_total\":200,\"disk_used\":3,\"disk_total\":9,\"t_ms\":1700000005000}]}");
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s/metrics", id);
	api(&a, key_a, "GET", p, NULL);
	assert_int_equal(a.status, 200);
	assert_int_equal(json_array_size(a.j), 2);
	assert_int_equal(json_integer_value(json_object_get(json_array_get(a.j, 1), "memTotal")), 200);
	assert_true(json_number_value(json_object_get(json_array_get(a.j, 1), "cpuUsedPct")) == 12.5);
	assert_int_equal(json_integer_value(json_object_get(json_array_get(a.j, 0), "timestampUnix")), 1700000000);
	answer_free(&a);
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s/metrics?start=1700000000&end=1700000100", id);
	api(&a, key_a, "GET", p, NULL);
	assert_int_equal(a.status, 200);
	answer_free(&a);
	snprintf(pp, sizeof(pp), "/v1/sessions/%s/metrics?start=1700000000&end=1700000100", id);
	assert_int_equal(fake_count("GET", NULL, pp), 1); /* the range reaches the host */
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s/metrics?start=soon", id);
	api(&a, key_a, "GET", p, NULL);
	assert_int_equal(a.status, 400);
	answer_free(&a);
	/* kill */
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s", id);
	api(&a, key_a, "DELETE", p, NULL);
	assert_int_equal(a.status, 204);
	answer_free(&a);
	api(&a, key_a, "GET", p, NULL);
	assert_int_equal(a.status, 404);
	answer_free(&a);
	api(&a, key_a, "DELETE", p, NULL);
	assert_int_equal(a.status, 404);
	answer_free(&a);
}

/* ---- the relay ---- */

static void relay(struct answer *a, const char *id, const char *tok, const char *method, const char *p,
		  const char *ctype, const void *body, size_t len)
{
	char hid[100], htok[120], hct[120];
	const char *hs[8];
	int n = 0;

	if (id) {
		snprintf(hid, sizeof(hid), "E2b-Sandbox-Id: %s", id);
		hs[n++] = hid;
	}
	if (tok) {
		snprintf(htok, sizeof(htok), "X-Access-Token: %s", tok);
		hs[n++] = htok;
	}
	if (ctype) { /* "": none at all (curl's "Name:" removes its own) */
		snprintf(hct, sizeof(hct), "Content-Type:%s%s", *ctype ? " " : "", ctype);
		hs[n++] = hct;
	}
	hs[n++] = "Connect-Protocol-Version: 1";
	hs[n++] = "Authorization: Basic cm9vdDo=";
	hs[n] = NULL;
	call(a, method, p, hs, body, len);
}

static void test_relay_auth(void **state)
{
	char id[40], tok[65], idb[40], tokb[65];
	struct answer a;
	const char *why[][2] = { { id, NULL }, { id, "x" }, { id, tokb }, { "s_nosuch", tok }, { NULL, tok } };

	create(key_a, "{}", id, tok);
	create(key_b, "{}", idb, tokb);
	for (size_t i = 0; i < sizeof(why) / sizeof(why[0]); i++) {
		relay(&a, why[i][0], why[i][1], "POST", "/process.Process/List", "application/json", "{}", 2);
		assert_int_equal(a.status, 401);
		assert_string_equal(str(a.j, "code"), "unauthenticated");
		answer_free(&a);
		relay(&a, why[i][0], why[i][1], "GET", "/files?path=/x", NULL, NULL, 0);
		assert_int_equal(a.status, 401);
		assert_int_equal(json_integer_value(json_object_get(a.j, "code")), 401);
		answer_free(&a);
	}
	/* A refused upload is answered once its body is in (dropped, not kept):
	 * the client reads the 401 instead of a connection cut under it. */
	{
		size_t big = 5u << 20;
		char *blob = calloc(1, big);

		relay(&a, id, "wrong", "POST", "/files?path=/tmp/x", "application/octet-stream", blob, big);
		assert_int_equal(a.status, 401);
		assert_int_equal(json_integer_value(json_object_get(a.j, "code")), 401);
		answer_free(&a);
		free(blob);
	}
	/* A native session has no token: the same 401. */
	assert_int_equal(fake_count("POST", NULL, "/v1/sessions/"), 0);
}

/* E2B's file URL signature (the SDK's getSignature), made here the way the
 * SDK makes it, for the relay to check. */
static void sign(char *out, size_t cap, const char *fpath, const char *op, const char *user, const char *tok,
		 const char *exp)
{
	char raw[600];
	unsigned char h[32], b64[48];
	int n;

	snprintf(raw, sizeof(raw), "%s:%s:%s:%s%s%s", fpath, op, user, tok, exp ? ":" : "", exp ? exp : "");
	SHA256((const unsigned char *)raw, strlen(raw), h);
	n = EVP_EncodeBlock(b64, h, 32);
	while (n && b64[n - 1] == '=')
		n--;
	snprintf(out, cap, "v1_%.*s", n, (const char *)b64);
}

/* curl's escaping of a query value (the signature's '+', '/' and '='). */
static void q_esc(char *out, size_t cap, const char *v)
{
	char *e = curl_easy_escape(NULL, v, 0);

	snprintf(out, cap, "%s", e);
	curl_free(e);
}

static void test_relay_signed(void **state)
{
	char id[40], tok[65], idb[40], tokb[65], sig[80], esig[160], p[512], later[24], past[24];
	struct answer a;

	create(key_a, "{}", id, tok);
	create(key_b, "{}", idb, tokb);
	snprintf(later, sizeof(later), "%lld", (long long)time(NULL) + 600);
	snprintf(past, sizeof(past), "%lld", (long long)time(NULL) - 5);
	/* A read signature, no token: the call reaches the host. */
	sign(sig, sizeof(sig), "/home/user/f", "read", "user", tok, NULL);
	q_esc(esig, sizeof(esig), sig);
	snprintf(p, sizeof(p), "/files?path=/home/user/f&username=user&signature=%s", esig);
	relay(&a, id, NULL, "GET", p, NULL, NULL, 0);
	assert_int_equal(a.status, 200);
	assert_string_equal(str(a.j, "path"), "/home/user/f");
	answer_free(&a);
	/* The same URL as a write, for another sandbox, or another path: 401. */
	relay(&a, id, NULL, "POST", p, "application/octet-stream", "x", 1);
	assert_int_equal(a.status, 401);
	answer_free(&a);
	relay(&a, idb, NULL, "GET", p, NULL, NULL, 0);
	assert_int_equal(a.status, 401);
	answer_free(&a);
	snprintf(p, sizeof(p), "/files?path=/home/user/g&username=user&signature=%s", esig);
	relay(&a, id, NULL, "GET", p, NULL, NULL, 0);
	assert_int_equal(a.status, 401);
	answer_free(&a);
	/* Another user, or none: 401. */
	snprintf(p, sizeof(p), "/files?path=/home/user/f&username=root&signature=%s", esig);
	relay(&a, id, NULL, "GET", p, NULL, NULL, 0);
	assert_int_equal(a.status, 401);
	answer_free(&a);
	/* An RPC path takes no signature. */
	snprintf(p, sizeof(p), "/filesystem.Filesystem/Stat?signature=%s", esig);
	relay(&a, id, NULL, "POST", p, "application/json", "{}", 2);
	assert_int_equal(a.status, 401);
	answer_free(&a);
	/* A write signature with an expiry: good until then. */
	sign(sig, sizeof(sig), "/tmp/up", "write", "", tok, later);
	q_esc(esig, sizeof(esig), sig);
	snprintf(p, sizeof(p), "/files?path=/tmp/up&signature=%s&signature_expiration=%s", esig, later);
	relay(&a, id, NULL, "POST", p, "application/octet-stream", "abc", 3);
	assert_int_equal(a.status, 200);
	answer_free(&a);
	/* The expiry changed: a wrong signature. */
	snprintf(p, sizeof(p), "/files?path=/tmp/up&signature=%s&signature_expiration=%s9", esig, later);
	relay(&a, id, NULL, "POST", p, "application/octet-stream", "abc", 3);
	assert_int_equal(a.status, 401);
	answer_free(&a);
	/* Past its expiry: 401 saying so. */
	sign(sig, sizeof(sig), "/tmp/up", "write", "", tok, past);
	q_esc(esig, sizeof(esig), sig);
	snprintf(p, sizeof(p), "/files?path=/tmp/up&signature=%s&signature_expiration=%s", esig, past);
	relay(&a, id, NULL, "POST", p, "application/octet-stream", "abc", 3);
	assert_int_equal(a.status, 401);
	assert_non_null(strstr(str(a.j, "message"), "expired"));
	answer_free(&a);
	/* A wrong X-Access-Token is not saved by a good signature. */
	sign(sig, sizeof(sig), "/home/user/f", "read", "", tok, NULL);
	q_esc(esig, sizeof(esig), sig);
	snprintf(p, sizeof(p), "/files?path=/home/user/f&signature=%s", esig);
	relay(&a, id, "wrong", "GET", p, NULL, NULL, 0);
	assert_int_equal(a.status, 401);
	answer_free(&a);
	relay(&a, id, NULL, "GET", p, NULL, NULL, 0);
	assert_int_equal(a.status, 200);
	answer_free(&a);
}

static void test_relay_passes(void **state)
{
	char id[40], tok[65], want[200];
	struct store_session before, after;
	struct answer a;
	size_t big = 5u << 20;
	char *blob = malloc(big);
	unsigned char h[32];
	char hex[65];

	create(key_a, "{}", id, tok);
	assert_int_equal(store_session_get(st, id, NULL, &before), 0);
	usleep(5000);
	/* A unary call: path, query, headers, body reach the host's envd path. */
	relay(&a, id, tok, "POST", "/filesystem.Filesystem/Stat?x=a%20b", "application/json", "{\"path\":\"/\"}", 12);
	assert_int_equal(a.status, 200);
	snprintf(want, sizeof(want), "/v1/sessions/%s/envd/filesystem.Filesystem/Stat", id);
	assert_string_equal(str(a.j, "url"), want);
	assert_string_equal(str(a.j, "Authorization"), "Bearer tok");
	assert_string_equal(str(a.j, "E2b-Authorization"), "Basic cm9vdDo=");
	assert_string_equal(str(a.j, "Content-Type"), "application/json");
	assert_string_equal(str(a.j, "Connect-Protocol-Version"), "1");
	assert_true(json_is_null(json_object_get(a.j, "X-Access-Token"))); /* not passed on */
	assert_int_equal(json_integer_value(json_object_get(a.j, "len")), 12);
	answer_free(&a);
	/* The query arrives decoded as sent. */
	relay(&a, id, tok, "GET", "/files?path=/home/user/a%20b.txt&username=root", NULL, NULL, 0);
	assert_string_equal(str(a.j, "path"), "/home/user/a b.txt");
	assert_string_equal(str(a.j, "username"), "root");
	assert_string_equal(str(a.j, "method"), "GET");
	answer_free(&a);
	/* A 5 MiB upload passes whole. */
	for (size_t i = 0; i < big; i++)
		blob[i] = (char)(i * 131 + (i >> 9));
	SHA256((unsigned char *)blob, big, h);
	for (int i = 0; i < 32; i++)
		sprintf(hex + 2 * i, "%02x", h[i]);
	relay(&a, id, tok, "POST", "/files?path=/tmp/b", "application/octet-stream", blob, big);
	assert_int_equal(a.status, 200);
	assert_int_equal(json_integer_value(json_object_get(a.j, "len")), (json_int_t)big);
	assert_string_equal(str(a.j, "sha"), hex);
	answer_free(&a);
	free(blob);
	/* A compressed body goes as it came, with its Content-Encoding and the
	 * bound on its inflated size (kiln-host inflates it); metadata headers
	 * go too; Accept-Encoding goes and the answer's Content-Encoding comes
	 * back; metadata that cannot go is a 400, never dropped. */
	{
		static char huge[5100];
		const char *hs[] = { "Content-Type: application/octet-stream", "Content-Encoding: gzip",
				     "X-Metadata-Author: mish", NULL };
		char hid[100], htok[120];
		const char *all[6] = { hid, htok, hs[0], hs[1], hs[2], NULL };
		const char *get[4] = { hid, htok, "Accept-Encoding: gzip", NULL };
		const char *bigmeta[4] = { hid, htok, huge, NULL };
		int calls0;

		snprintf(hid, sizeof(hid), "E2b-Sandbox-Id: %s", id);
		snprintf(htok, sizeof(htok), "X-Access-Token: %s", tok);
		call(&a, "POST", "/files?path=/tmp/z", all, "\x1f\x8b\x08", 3);
		assert_int_equal(a.status, 200);
		assert_string_equal(str(a.j, "Content-Encoding"), "gzip");
		assert_string_equal(str(a.j, "X-Metadata-Author"), "mish");
		assert_string_equal(str(a.j, "Kiln-Max-Body-Bytes"), "16777216"); /* the test API's max_body_mib, 16 */
		assert_int_equal(json_integer_value(json_object_get(a.j, "len")), 3);
		answer_free(&a);
		call(&a, "GET", "/files?path=/tmp/z", get, NULL, 0);
		assert_int_equal(a.status, 200);
		assert_string_equal(str(a.j, "Accept-Encoding"), "gzip");
		assert_string_equal(a.content_encoding, "gzip");
		answer_free(&a);
		{
			const char *rpcz[5] = { hid, htok, "Content-Type: application/json", "Content-Encoding: gzip", NULL };

			/* Connect's own compression is not served: 415, not relayed. */
			calls0 = __atomic_load_n(&echo_calls, __ATOMIC_SEQ_CST);
			call(&a, "POST", "/filesystem.Filesystem/Stat", rpcz, "\x1f\x8b\x08", 3);
			assert_int_equal(a.status, 415);
			assert_string_equal(str(a.j, "code"), "unimplemented");
			assert_int_equal(__atomic_load_n(&echo_calls, __ATOMIC_SEQ_CST), calls0);
			answer_free(&a);
		}
		memset(huge, 'v', sizeof(huge) - 1);
		memcpy(huge, "X-Metadata-Big: ", 16);
		calls0 = __atomic_load_n(&echo_calls, __ATOMIC_SEQ_CST);
		call(&a, "POST", "/files?path=/tmp/z", bigmeta, "x", 1);
		assert_int_equal(a.status, 400);
		assert_int_equal(json_integer_value(json_object_get(a.j, "code")), 400);
		assert_int_equal(__atomic_load_n(&echo_calls, __ATOMIC_SEQ_CST), calls0);
		answer_free(&a);
	}
	/* A method that is no name does not reach the host. */
	relay(&a, id, tok, "POST", "/process.Process/Li%20st", "application/json", "{}", 2);
	assert_int_equal(a.status, 404);
	assert_string_equal(str(a.j, "code"), "unimplemented");
	answer_free(&a);
	/* /health's 204 */
	relay(&a, id, tok, "GET", "/health", NULL, NULL, 0);
	assert_int_equal(a.status, 204);
	answer_free(&a);
	/* A stream: every piece, in order, with its content type. */
	relay(&a, id, tok, "POST", "/process.Process/Start", "application/connect+json", "\0\0\0\0\2{}", 7);
	assert_int_equal(a.status, 200);
	assert_string_equal(a.content_type, "application/connect+json");
	assert_int_equal(a.raw.len, echo_piece_len[0] + echo_piece_len[1] + echo_piece_len[2]);
	assert_memory_equal(a.raw.p, echo_pieces[0], echo_piece_len[0]);
	assert_memory_equal(a.raw.p + a.raw.len - echo_piece_len[2], echo_pieces[2], echo_piece_len[2]);
	answer_free(&a);
	/* Activity, and nothing left in flight once the server has freed the
	 * last answer (just after the client has it all). */
	for (int i = 0; i < 1000 && sessions_op_busy(ss, id); i++)
		real_nap();
	assert_false(sessions_op_busy(ss, id));
	assert_int_equal(store_session_get(st, id, NULL, &after), 0);
	assert_true(after.last_active_ms > before.last_active_ms);
}

struct bg_relay {
	char id[40], tok[65];
	struct answer a;
};

static void *bg_start(void *arg)
{
	struct bg_relay *b = arg;

	relay(&b->a, b->id, b->tok, "POST", "/process.Process/Start?slow=1", "application/connect+json",
	      "\0\0\0\0\2{}", 7);
	return NULL;
}

/* An open stream keeps the session busy (the reaper does not idle it out). */
static void test_relay_stream_busy(void **state)
{
	struct bg_relay b;
	pthread_t th;
	int busy = 0;

	create(key_a, "{}", b.id, b.tok);
	assert_int_equal(pthread_create(&th, NULL, bg_start, &b), 0);
	for (int i = 0; i < 400 && !busy; i++) {
		busy = sessions_op_busy(ss, b.id);
		real_nap();
	}
	assert_true(busy);
	pthread_join(th, NULL);
	assert_int_equal(b.a.status, 200);
	assert_int_equal(b.a.raw.len, echo_piece_len[0] + echo_piece_len[1] + echo_piece_len[2]);
	answer_free(&b.a);
	for (int i = 0; i < 1000 && sessions_op_busy(ss, b.id); i++)
		real_nap();
	assert_false(sessions_op_busy(ss, b.id));
}

/* Whether a call streams is its method's kind, never its Content-Type's
 * spelling: an odd-case Start is still a stream, counted against
 * max_streams; a Content-Type that is not Connect's JSON for the method's
 * kind is refused (415) before the host. */
static void test_relay_stream_kind(void **state)
{
	static const char *const refused[][3] = {
		{ "/process.Process/Start", "application/json", "is for unary calls" },
		{ "/process.Process/Start", "application/connect+proto", "JSON codec only" },
		{ "/process.Process/Start", "text/plain", "is not Connect's" },
		{ "/process.Process/Start", "", "no Content-Type" },
		{ "/process.Process/List", "application/connect+json", "is for streaming calls" },
		{ "/process.Process/List", "Application/Connect+JSON", "is for streaming calls" },
		{ "/filesystem.Filesystem/Stat", "application/json, text/plain", "not a media type" },
		{ "/filesystem.Filesystem/WatchDir", "application/json", "is for unary calls" },
	};
	struct kiln_err err = { .code = "" };
	struct bg_relay b;
	struct answer a;
	struct quota q;
	pthread_t th;
	int busy = 0, calls;

	assert_int_equal(store_customer_quota(st, "acme", &q), 0);
	q.max_streams = 1;
	assert_int_equal(store_customer_set_quota(st, "acme", &q, &err), 0);
	create(key_a, "{}", b.id, b.tok);
	calls = __atomic_load_n(&echo_calls, __ATOMIC_SEQ_CST);
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		relay(&a, b.id, b.tok, "POST", refused[i][0], refused[i][1], "\0\0\0\0\2{}", 7);
		if (a.status != 415 || !a.j || strcmp(str(a.j, "code"), "unimplemented") ||
		    !strstr(str(a.j, "message"), refused[i][2]))
			fail_msg("%s with %s: %ld %s, want 415 unimplemented \"...%s...\"", refused[i][0],
				 *refused[i][1] ? refused[i][1] : "no Content-Type", a.status,
				 a.raw.p ? a.raw.p : "", refused[i][2]);
		answer_free(&a);
	}
	relay(&a, b.id, b.tok, "GET", "/process.Process/List", "application/json", NULL, 0);
	assert_int_equal(a.status, 405);
	answer_free(&a);
	relay(&a, b.id, b.tok, "POST", "/process.Process/Nope", "application/json", "{}", 2);
	assert_int_equal(a.status, 404);
	assert_string_equal(str(a.j, "code"), "unimplemented");
	answer_free(&a);
	assert_int_equal(__atomic_load_n(&echo_calls, __ATOMIC_SEQ_CST), calls); /* none reached the host */

	/* One stream open (max_streams 1): an odd-case Start is a second. */
	assert_int_equal(pthread_create(&th, NULL, bg_start, &b), 0);
	for (int i = 0; i < 400 && !busy; i++) {
		busy = sessions_op_busy(ss, b.id);
		real_nap();
	}
	assert_true(busy);
	{
		struct answer unary;
		long odd;

		relay(&a, b.id, b.tok, "POST", "/process.Process/Start", "Application/Connect+JSON", "\0\0\0\0\2{}",
		      7);
		odd = a.status;
		/* A unary call is no stream: it passes while the stream is open. */
		relay(&unary, b.id, b.tok, "POST", "/process.Process/List", "Application/JSON; charset=UTF-8", "{}", 2);
		pthread_join(th, NULL); /* before any assert: a failure must not leave it running */
		if (odd != 429)
			fail_msg("an odd-case Start while max_streams (1) is taken: %ld %s, want 429", odd,
				 a.raw.p ? a.raw.p : "");
		assert_string_equal(str(a.j, "code"), "resource_exhausted");
		assert_int_equal(unary.status, 200);
		assert_string_equal(str(unary.j, "Content-Type"), "Application/JSON; charset=UTF-8");
		answer_free(&a);
		answer_free(&unary);
	}
	assert_int_equal(b.a.status, 200);
	answer_free(&b.a);
	/* Once it is closed, the odd-case one is served (and counted). */
	for (int i = 0; i < 1000 && sessions_op_busy(ss, b.id); i++)
		real_nap();
	relay(&a, b.id, b.tok, "POST", "/process.Process/Start", "APPLICATION/connect+json ; charset=utf-8",
	      "\0\0\0\0\2{}", 7);
	assert_int_equal(a.status, 200);
	assert_int_equal(a.raw.len, echo_piece_len[0] + echo_piece_len[1] + echo_piece_len[2]);
	answer_free(&a);
}

static void test_relay_paused_502(void **state)
{
	char id[40], tok[65];
	struct answer a;

	create(key_a, "{}", id, tok);
	assert_int_equal(store_session_transition(st, id, SESSION_RUNNING, SESSION_PAUSED, "", "paused", NULL), 1);
	relay(&a, id, tok, "POST", "/process.Process/List", "application/json", "{}", 2);
	assert_int_equal(a.status, 502);
	assert_string_equal(str(a.j, "code"), "unavailable");
	answer_free(&a);
	relay(&a, id, tok, "GET", "/health", NULL, NULL, 0);
	assert_int_equal(a.status, 502);
	answer_free(&a);
}

/* ---- the reaper: the session's autoPause before the customer's ---- */

static void test_reaper_auto_pause_per_session(void **state)
{
	char p1[40], t1[65], p2[40], t2[65], pp[128];

	/* beta's quota says destroy; p1 asked for autoPause. */
	create(key_b, "{\"timeout\":10,\"autoPause\":true}", p1, t1);
	create(key_b, "{\"timeout\":10}", p2, t2);
	snprintf(pp, sizeof(pp), "/v1/sessions/%s/pause", p1);
	fake_rule("POST", NULL, pp, 200, "{\"snapshot\":{\"key\":\"k\",\"bytes\":1}}");
	clock_advance(11000);
	sessions_reap_once(ss, 0);
	for (int i = 0; i < 1000; i++) {
		struct store_session a, b;

		store_session_get(st, p1, NULL, &a);
		store_session_get(st, p2, NULL, &b);
		if (a.state == SESSION_PAUSED && b.state == SESSION_DESTROYED)
			return;
		real_nap();
	}
	fail_msg("p1 not paused or p2 not destroyed");
}

/* E2B's timeout tests: a sandbox whose timeout ran out answers /health
 * 502 (isRunning() false), before the reaper and after it; a killed one is
 * gone (401, isRunning() raises), as is one asked about with a wrong token. */
static void test_relay_end_of_life(void **state)
{
	char id[40], tok[65], idk[40], tokk[65], p[128];
	struct answer a;

	create(key_a, "{\"timeout\":10}", id, tok);
	create(key_b, "{\"timeout\":10}", idk, tokk);
	relay(&a, id, tok, "GET", "/health", NULL, NULL, 0);
	assert_int_equal(a.status, 204);
	answer_free(&a);
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s", idk);
	api(&a, key_b, "DELETE", p, NULL);
	assert_int_equal(a.status, 204);
	answer_free(&a);
	relay(&a, idk, tokk, "GET", "/health", NULL, NULL, 0);
	assert_int_equal(a.status, 401);
	answer_free(&a);
	clock_advance(11000);
	/* Past its end, the reaper not there yet. */
	relay(&a, id, tok, "GET", "/health", NULL, NULL, 0);
	assert_int_equal(a.status, 502);
	answer_free(&a);
	relay(&a, id, tok, "POST", "/process.Process/List", "application/json", "{}", 2);
	assert_int_equal(a.status, 502);
	assert_string_equal(str(a.j, "code"), "unavailable");
	assert_non_null(strstr(str(a.j, "message"), "end of life"));
	answer_free(&a);
	relay(&a, id, tokk, "GET", "/health", NULL, NULL, 0);
	assert_int_equal(a.status, 401);
	answer_free(&a);
	/* Ended by the reaper: still 502 for its token. */
	sessions_reap_once(ss, 0);
	for (int i = 0; i < 1000; i++) {
		struct store_session c;

		if (store_session_get(st, id, NULL, &c) == 0 && c.state == SESSION_DESTROYED)
			break;
		real_nap();
	}
	relay(&a, id, tok, "GET", "/health", NULL, NULL, 0);
	assert_int_equal(a.status, 502);
	answer_free(&a);
}

/* ---- network: updateNetwork and create's egress fields ---- */

/* e2b_network_map on (allow_internet_access, allowOut, denyOut) as JSON
 * texts ("" absent): the allow list it makes, or an error containing err. */
static void map_case(const char *internet, const char *ao, const char *dn, const char *want, const char *err)
{
	json_t *i = internet[0] ? json_loads(internet, JSON_DECODE_ANY, NULL) : NULL;
	json_t *a = ao[0] ? json_loads(ao, JSON_DECODE_ANY, NULL) : NULL;
	json_t *d = dn[0] ? json_loads(dn, JSON_DECODE_ANY, NULL) : NULL, *out = NULL;
	char msg[600] = "";
	int r = e2b_network_map(i, a, d, &out, msg, sizeof(msg));

	if (err) {
		if (r != -1 || out || !strstr(msg, err))
			fail_msg("%s %s %s: wanted an error with \"%s\", got %d \"%s\"", internet, ao, dn, err, r, msg);
	} else {
		json_t *w = json_loads(want, 0, NULL);

		if (r != 0 || !json_equal(json_object_get(out, "allow"), w) ||
		    strcmp(json_string_value(json_object_get(out, "egress")) ?: "", "allow"))
			fail_msg("%s %s %s: wanted %s, got %d %s", internet, ao, dn, want, r, msg);
		json_decref(w);
	}
	json_decref(out);
	json_decref(i);
	json_decref(a);
	json_decref(d);
}

static int upd(const char *body, json_t **out, char *msg, size_t cap)
{
	return e2b_network_update_parse(body, strlen(body), out, msg, cap);
}

static void test_network_mapping(void **state)
{
	char msg[600];
	json_t *out, *info;

	/* Nothing denied: every public address, allowOut adding nothing. */
	map_case("", "", "", "[\"0.0.0.0/0:1-65535\"]", NULL);
	map_case("true", "", "", "[\"0.0.0.0/0:1-65535\"]", NULL);
	map_case("", "[\"example.com\"]", "[]", "[\"0.0.0.0/0:1-65535\"]", NULL);
	map_case("", "[\"0.0.0.0/0\"]", "", "[\"0.0.0.0/0:1-65535\"]", NULL);
	/* All denied: allowOut only, on every port (allowOut beats denyOut). */
	map_case("", "[\"example.com\",\"*.pypi.org\",\"1.2.3.4\",\"8.8.8.0/24\"]", "[\"0.0.0.0/0\"]",
		 "[\"example.com:1-65535\",\"*.pypi.org:1-65535\",\"1.2.3.4:1-65535\",\"8.8.8.0/24:1-65535\"]", NULL);
	map_case("false", "[\"Example.COM\",\"example.com\",\"1.2.3.4/32\"]", "",
		 "[\"example.com:1-65535\",\"1.2.3.4:1-65535\"]", NULL);
	map_case("false", "", "", "[]", NULL);
	map_case("true", "", "[\"0.0.0.0/0\"]", "[]", NULL);
	/* A partial deny list with everything else denied anyway adds nothing. */
	map_case("", "[\"1.1.1.1\"]", "[\"0.0.0.0/0\",\"8.8.8.8\"]", "[\"1.1.1.1:1-65535\"]", NULL);
	/* Refused, naming the field. */
	map_case("", "", "[\"8.8.8.8\"]", NULL, "denyOut[0]: \"8.8.8.8\": kiln's egress policy is an allowlist");
	map_case("true", "[\"1.1.1.1\"]", "[\"8.8.8.0/24\"]", NULL, "denyOut[0]");
	map_case("", "", "[\"0.0.0.0/0\",\"example.com\"]", NULL, "denyOut[1]: \"example.com\": a CIDR block");
	map_case("", "[\"example.com:443\"]", "[\"0.0.0.0/0\"]", NULL, "allowOut[0]: \"example.com:443\": IPv6 and ports");
	map_case("", "[\"::1\"]", "[\"0.0.0.0/0\"]", NULL, "allowOut[0]");
	map_case("", "[\"ok.org\",\"exa mple.org\"]", "[\"0.0.0.0/0\"]", NULL, "allowOut[1]: \"exa mple.org\": ");
	map_case("", "[\"1.2.3.4/8\"]", "[\"0.0.0.0/0\"]", NULL, "allowOut[0]: \"1.2.3.4/8\": the host bits are set");
	map_case("", "[5]", "", NULL, "allowOut[0]: must be a string");
	map_case("", "\"x\"", "", NULL, "allowOut: an array");
	map_case("", "", "{}", NULL, "denyOut: an array");
	map_case("\"yes\"", "", "", NULL, "allow_internet_access: must be a boolean");
	map_case("", "[\"\"]", "[\"0.0.0.0/0\"]", NULL, "allowOut[0]: must be 1 to");
	{
		char big[200] = "[";

		for (int k = 0; k < 65; k++)
			snprintf(big + strlen(big), sizeof(big) - strlen(big), "%s1", k ? "," : "");
		strcat(big, "]");
		/* 65 entries (of anything) are refused before each is read. */
		json_t *a = json_loads(big, 0, NULL);

		assert_non_null(a);
		assert_int_equal(e2b_network_map(NULL, a, NULL, &out, msg, sizeof(msg)), -1);
		assert_non_null(strstr(msg, "at most 64"));
		json_decref(a);
	}
	/* The update body: transforms and a proxy refused; {} is all public. */
	assert_int_equal(upd("{}", &out, msg, sizeof(msg)), 0);
	assert_string_equal(json_string_value(json_array_get(json_object_get(out, "allow"), 0)), "0.0.0.0/0:1-65535");
	json_decref(out);
	assert_int_equal(e2b_network_update_parse(NULL, 0, &out, msg, sizeof(msg)), 0);
	json_decref(out);
	assert_int_equal(upd("{\"rules\":{}}", &out, msg, sizeof(msg)), 0);
	json_decref(out);
	assert_int_equal(upd("{\"egressProxy\":{\"address\":\"p:1080\"}}", &out, msg, sizeof(msg)), -1);
	assert_non_null(strstr(msg, "egressProxy: an egress proxy is not supported"));
	assert_null(out);
	assert_int_equal(upd("{\"rules\":{\"a.com\":[{}]}}", &out, msg, sizeof(msg)), -1);
	assert_non_null(strstr(msg, "rules: per-domain transform rules are not supported"));
	assert_int_equal(upd("[1]", &out, msg, sizeof(msg)), -1);
	assert_int_equal(upd("{\"allowOut\":[\"a.b\"],\"denyOut\":[\"0.0.0.0/0\"]}", &out, msg, sizeof(msg)), 0);
	/* getInfo's view of it. */
	info = e2b_network_info(out);
	assert_string_equal(json_string_value(json_array_get(json_object_get(info, "allowOut"), 0)), "a.b");
	assert_int_equal(json_array_size(json_object_get(info, "allowOut")), 1);
	assert_string_equal(json_string_value(json_array_get(json_object_get(info, "denyOut"), 0)), "0.0.0.0/0");
	json_decref(info);
	json_decref(out);
	out = json_pack("{s:s, s:[s, s]}", "egress", "allow", "allow", "0.0.0.0/0:1-65535", "example.org:443");
	info = e2b_network_info(out);
	assert_string_equal(json_string_value(json_array_get(json_object_get(info, "allowOut"), 0)), "0.0.0.0/0");
	assert_string_equal(json_string_value(json_array_get(json_object_get(info, "allowOut"), 1)), "example.org:443");
	json_decref(info);
	json_decref(out);
	info = e2b_network_info(NULL);
	assert_int_equal(json_array_size(json_object_get(info, "allowOut")), 0);
	json_decref(info);
}

/* The customer gamma, which may have egress, and h1 offering it. */
static void egress_customer(char *key)
{
	struct kiln_err err = { .code = "" };
	char key_id[32], *k = NULL;
	json_t *cap = json_pack("{s:{s:i, s:i}, s:{s:i, s:i}, s:b}", "vcpus", "total", 8, "used", 0, "memory_mib",
				"total", 8192, "used", 0, "egress", 1);
	struct quota q;

	assert_int_equal(store_host_heartbeat(st, "h1", host_url, cap, &err), 0);
	json_decref(cap);
	sched_tick(sc);
	quota_defaults(&q);
	q.max_running = 8;
	q.allow_egress = 1;
	q.submit_rate = 1000;
	q.submit_burst = 1000;
	assert_int_equal(store_customer_create(st, "gamma", "gamma", &q, &err), 0);
	assert_int_equal(store_key_create(st, "gamma", 0, &k, key_id, &err), 0);
	snprintf(key, 128, "%s", k);
	free(k);
}

/* The network object stored in session id's spec, as compact JSON. */
static char *stored_network(const char *id)
{
	char *spec = store_session_spec(st, id), *out;
	json_t *j = spec ? json_loads(spec, 0, NULL) : NULL;

	out = json_dumps(json_object_get(j, "network"), JSON_COMPACT | JSON_ENCODE_ANY);
	json_decref(j);
	free(spec);
	return out;
}

static void test_network_update(void **state)
{
	char key_g[128], id[40], id2[40], tok[65], p[128], hp[128], *n;
	const char *hs[3];
	char auth[200];
	struct answer a;
	int puts;

	egress_customer(key_g);
	/* allow_internet_access: true is the all-public rule (lib/spec.c
	 * refused the bare {"egress":"allow"} create used to send). */
	create(key_g, "{\"allow_internet_access\":true}", id, tok);
	n = stored_network(id);
	assert_string_equal(n, "{\"egress\":\"allow\",\"allow\":[\"0.0.0.0/0:1-65535\"]}");
	free(n);
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s", id);
	api(&a, key_g, "GET", p, NULL);
	assert_int_equal(a.status, 200);
	assert_string_equal(json_string_value(json_array_get(json_object_get(json_object_get(a.j, "network"),
									      "allowOut"), 0)), "0.0.0.0/0");
	assert_true(json_is_true(json_object_get(json_object_get(a.j, "network"), "allowPublicTraffic")));
	answer_free(&a);
	/* create's network.allowOut / denyOut */
	create(key_g, "{\"network\":{\"allowOut\":[\"pypi.org\"],\"denyOut\":[\"0.0.0.0/0\"]}}", id2, tok);
	n = stored_network(id2);
	assert_string_equal(n, "{\"egress\":\"allow\",\"allow\":[\"pypi.org:1-65535\"]}");
	free(n);
	api(&a, key_g, "POST", "/e2b/v2/sandboxes", "{\"network\":{\"denyOut\":[\"8.8.8.8\"]},\"allow_internet_access\":true}");
	assert_int_equal(a.status, 400);
	assert_non_null(strstr(str(a.j, "message"), "network.denyOut[0]"));
	answer_free(&a);
	api(&a, key_a, "POST", "/e2b/v2/sandboxes", "{\"network\":{\"allowOut\":[\"pypi.org\"]}}");
	assert_int_equal(a.status, 400); /* acme may not have egress */
	assert_non_null(strstr(str(a.j, "message"), "not allowed for your account"));
	answer_free(&a);

	/* updateNetwork: mapped, sent to the host, stored. */
	snprintf(hp, sizeof(hp), "/v1/sessions/%s/network", id);
	fake_rule("PUT", NULL, "/v1/sessions/", 200, "{}");
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s/network", id);
	api(&a, key_g, "PUT", p, "{\"allowOut\":[\"example.com\",\"1.2.3.4\"],\"denyOut\":[\"0.0.0.0/0\"]}");
	assert_int_equal(a.status, 204);
	answer_free(&a);
	assert_int_equal(fake_count("PUT", host_url, hp), 1);
	n = stored_network(id);
	assert_string_equal(n, "{\"egress\":\"allow\",\"allow\":[\"example.com:1-65535\",\"1.2.3.4:1-65535\"]}");
	free(n);
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s", id);
	api(&a, key_g, "GET", p, NULL);
	assert_string_equal(json_string_value(json_array_get(json_object_get(json_object_get(a.j, "network"),
									      "allowOut"), 1)), "1.2.3.4");
	answer_free(&a);
	/* Refused before the host hears of it. */
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s/network", id);
	{
		static const char *const bad[] = {
			"{\"denyOut\":[\"8.8.8.8\"]}", "{\"egressProxy\":{\"address\":\"x:1\"}}",
			"{\"rules\":{\"a.com\":[{}]}}", "{\"allowOut\":[\"a b\"],\"allow_internet_access\":false}", "{",
		};

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			api(&a, key_g, "PUT", p, bad[i]);
			if (a.status != 400 || json_integer_value(json_object_get(a.j, "code")) != 400)
				fail_msg("%s: %ld", bad[i], a.status);
			answer_free(&a);
		}
	}
	assert_int_equal(fake_count("PUT", host_url, hp), 1);
	/* Another customer's: 404, as E2B's SDK maps to SandboxNotFoundError. */
	api(&a, key_b, "PUT", p, "{}");
	assert_int_equal(a.status, 404);
	answer_free(&a);
	/* The host's refusal comes through with its status. */
	fake_rule("PUT", NULL, hp, 409, "{\"error\":{\"code\":\"no_network\",\"message\":\"no device\"}}");
	api(&a, key_g, "PUT", p, "{}");
	assert_int_equal(a.status, 409);
	assert_string_equal(str(a.j, "message"), "no device");
	answer_free(&a);
	n = stored_network(id);
	assert_non_null(strstr(n, "example.com:1-65535")); /* unchanged */
	free(n);
	fake_rule("PUT", NULL, hp, 200, "{}");

	/* The native endpoint, with the customer's key. */
	snprintf(auth, sizeof(auth), "Authorization: Bearer %s", key_g);
	hs[0] = auth;
	hs[1] = "Content-Type: application/json";
	hs[2] = NULL;
	snprintf(p, sizeof(p), "/v1/sessions/%s/network", id);
	call(&a, "PUT", p, hs, "{\"allow\":[\"203.0.113.0/24:443\"]}", 32);
	assert_int_equal(a.status, 200);
	assert_string_equal(json_string_value(json_array_get(json_object_get(json_object_get(a.j, "network"), "allow"),
							     0)), "203.0.113.0/24:443");
	assert_string_equal(json_string_value(json_object_get(json_object_get(a.j, "network"), "egress")), "allow");
	answer_free(&a);
	call(&a, "PUT", p, hs, "{\"allow\":[\"203.0.113.0/24\"]}", 28);
	assert_int_equal(a.status, 400);
	assert_string_equal(json_string_value(json_object_get(json_object_get(a.j, "error"), "code")), "invalid_spec");
	answer_free(&a);
	call(&a, "PUT", p, hs, "{\"egress\":\"none\"}", 17);
	assert_int_equal(a.status, 400);
	answer_free(&a);
	puts = fake_count("PUT", host_url, "/v1/sessions/");
	/* A sandbox created without egress has no device: 409 no_network. */
	create(key_g, "{}", id2, tok);
	snprintf(p, sizeof(p), "/v1/sessions/%s/network", id2);
	call(&a, "PUT", p, hs, "{\"allow\":[]}", 12);
	assert_int_equal(a.status, 409);
	assert_string_equal(json_string_value(json_object_get(json_object_get(a.j, "error"), "code")), "no_network");
	answer_free(&a);
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s/network", id2);
	api(&a, key_g, "PUT", p, "{}");
	assert_int_equal(a.status, 409);
	answer_free(&a);
	/* Paused: 409 not_running. */
	assert_int_equal(store_session_transition(st, id, SESSION_RUNNING, SESSION_PAUSED, "", NULL, NULL), 1);
	snprintf(p, sizeof(p), "/v1/sessions/%s/network", id);
	call(&a, "PUT", p, hs, "{\"allow\":[]}", 12);
	assert_int_equal(a.status, 409);
	assert_string_equal(json_string_value(json_object_get(json_object_get(a.j, "error"), "code")), "not_running");
	answer_free(&a);
	assert_int_equal(fake_count("PUT", host_url, "/v1/sessions/"), puts);
	/* An account without egress: a session without a device hears that
	 * first; one with a device (the quota taken away since) hears of the
	 * quota, and nothing reaches the host. */
	snprintf(auth, sizeof(auth), "Authorization: Bearer %s", key_a);
	create(key_a, "{}", id2, tok);
	snprintf(p, sizeof(p), "/v1/sessions/%s/network", id2);
	call(&a, "PUT", p, hs, "{\"allow\":[]}", 12);
	assert_int_equal(a.status, 409);
	assert_string_equal(json_string_value(json_object_get(json_object_get(a.j, "error"), "code")), "no_network");
	answer_free(&a);
	{
		struct kiln_err qerr = { .code = "" };
		struct quota q;

		assert_int_equal(store_customer_quota(st, "gamma", &q), 0);
		q.allow_egress = 0;
		assert_int_equal(store_customer_set_quota(st, "gamma", &q, &qerr), 0);
	}
	assert_int_equal(store_session_transition(st, id, SESSION_PAUSED, SESSION_RUNNING, NULL, NULL, NULL), 1);
	snprintf(auth, sizeof(auth), "Authorization: Bearer %s", key_g);
	snprintf(p, sizeof(p), "/v1/sessions/%s/network", id);
	call(&a, "PUT", p, hs, "{\"allow\":[]}", 12);
	assert_int_equal(a.status, 400);
	assert_string_equal(json_string_value(json_object_get(json_object_get(a.j, "error"), "code")),
			    "egress_not_allowed");
	answer_free(&a);
	assert_int_equal(fake_count("PUT", host_url, "/v1/sessions/"), puts);
}

static void test_url_decode(void **state)
{
	char out[16];

	assert_int_equal(e2b_url_decode("a%20b+c", 7, 1, out, sizeof(out)), 0);
	assert_string_equal(out, "a b c");
	assert_int_equal(e2b_url_decode("a+c", 3, 0, out, sizeof(out)), 0);
	assert_string_equal(out, "a+c");
	assert_int_equal(e2b_url_decode("%2", 2, 0, out, sizeof(out)), -1);
	assert_int_equal(e2b_url_decode("%zz", 3, 0, out, sizeof(out)), -1);
	assert_int_equal(e2b_url_decode("0123456789abcdef", 16, 0, out, sizeof(out)), -1);
}

static void test_token_derivation(void **state)
{
	char a[65], b[65], c[65];

	sessions_e2b_token(ss, "s_1", a);
	sessions_e2b_token(ss, "s_1", b);
	sessions_e2b_token(ss, "s_2", c);
	assert_string_equal(a, b);
	assert_string_not_equal(a, c);
	assert_int_equal(strspn(a, "0123456789abcdef"), 64);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_create_fields, setup, teardown),
		cmocka_unit_test(test_create_code_interpreter),
		cmocka_unit_test_setup_teardown(test_create_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_keys, setup, teardown),
		cmocka_unit_test_setup_teardown(test_get_list_isolation, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pagination, setup, teardown),
		cmocka_unit_test_setup_teardown(test_quota_429, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rate_429, setup, teardown),
		cmocka_unit_test_setup_teardown(test_timeout_pause_connect_kill, setup, teardown),
		cmocka_unit_test_setup_teardown(test_relay_auth, setup, teardown),
		cmocka_unit_test_setup_teardown(test_relay_signed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_relay_end_of_life, setup, teardown),
		cmocka_unit_test_setup_teardown(test_relay_passes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_relay_stream_busy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_relay_stream_kind, setup, teardown),
		cmocka_unit_test_setup_teardown(test_relay_paused_502, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reaper_auto_pause_per_session, setup, teardown),
		cmocka_unit_test(test_network_mapping),
		cmocka_unit_test_setup_teardown(test_network_update, setup, teardown),
		cmocka_unit_test(test_url_decode),
		cmocka_unit_test_setup_teardown(test_token_derivation, setup, teardown),
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
