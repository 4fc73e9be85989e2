/* api_http_env.h: what test_api_snapshots and test_api_volumes share: a
 * kiln-api HTTP server on loopback over a real store and scheduler, hosts
 * answered by fake_host_ops.h, two customers with keys, and calls that
 * return the answer parsed. The including test defines API_ENV_DIR (a
 * mkdtemp template) first. Static: one test program includes it once. */
#ifndef KILN_TEST_API_HTTP_ENV_H
#define KILN_TEST_API_HTTP_ENV_H

#include "fake_host_ops.h"
#include "api_config.h"
#include "buf.h"
#include "quota.h"
#include "scheduler.h"
#include "server.h"
#include "sessions_int.h"
#include "store.h"

static char dir[] = API_ENV_DIR;
static char path[256], listen_addr[64], base[64];
static int seq;
static struct store *st;
static struct sched *sc;
static struct sessions *ss;
static struct server *srv;
static struct api_config cfg;
static char key_a[128], key_b[128];

#define CHECKPOINT_OK                                                                                           \
	"{\"snapshot\":{\"bucket\":\"b\",\"prefix\":\"acme/snapshots/k/\",\"bytes\":1048576,\"stop_ms\":7,"   \
	"\"ms\":30,\"template\":\"\",\"spec\":{}}}"

static void heartbeat(const char *id)
{
	struct kiln_err err = { .code = "" };
	char url[64];
	json_t *cap = json_pack("{s:{s:i, s:i}, s:{s:i, s:i}, s:b}", "vcpus", "total", 16, "used", 0, "memory_mib",
				"total", 16384, "used", 0, "egress", 0);

	snprintf(url, sizeof(url), "http://%s", id);
	assert_int_equal(store_host_heartbeat(st, id, url, cap, &err), 0);
	json_decref(cap);
}

static void customer(const char *id, const struct quota *qin, char *key)
{
	struct kiln_err err = { .code = "" };
	char key_id[32], *k = NULL;
	struct quota q;

	if (qin) {
		q = *qin;
	} else {
		quota_defaults(&q);
		q.max_running = 10;
		q.max_vcpus = 16;
		q.max_memory_mib = 16384;
	}
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

	snprintf(path, sizeof(path), "%s/api-%d.db", dir, ++seq);
	st = store_open(path, &err);
	if (!st)
		fail_msg("store_open: %s", err.message);
	fake_reset();
	clock_reset();
	fake_rule("GET", NULL, "/v1/sessions", 200, "{\"sessions\":[]}");
	fake_rule("POST", NULL, "/v1/sessions", 201, "{}");
	fake_rule("DELETE", NULL, "/v1/sessions/", 200, "{}");
	fake_rule("DELETE", NULL, "/v1/snapshots/", 200, "{\"deleted\":3}");
	api_config_defaults(&cfg);
	cfg.cluster_token = "tok";
	for (int i = 0; i < 20 && !srv; i++) {
		int port = 30000 + (int)((getpid() * 11 + seq * 97 + i * 31 + 3) % 20000);

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
	heartbeat("h1");
	heartbeat("h2");
	sched_tick(sc);
	assert_int_equal(sched_host_state(sc, "h1", NULL), 1);
	customer("acme", NULL, key_a);
	customer("beta", NULL, key_b);
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
	return 0;
}

/* ---- requests ---- */

struct answer {
	long status;
	json_t *j;
	char next_token[160];
	struct buf raw;
};

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
	struct answer *a = arg;
	size_t len = size * n;
	char line[256];

	snprintf(line, sizeof(line), "%.*s", (int)(len < 255 ? len : 255), p);
	line[strcspn(line, "\r\n")] = '\0';
	if (!strncasecmp(line, "x-next-token: ", 14))
		snprintf(a->next_token, sizeof(a->next_token), "%s", line + 14);
	return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
	struct answer *a = arg;

	return buf_add(&a->raw, p, size * n) < 0 ? 0 : size * n;
}

/* One request: e2b picks the key's header (X-API-KEY, else a bearer). */
static void call(struct answer *a, const char *key, int e2b, const char *method, const char *p, const char *body)
{
	CURL *h = curl_easy_init();
	struct curl_slist *l = NULL;
	char url[512], k[200];

	memset(a, 0, sizeof(*a));
	buf_init(&a->raw, 16u << 20);
	snprintf(url, sizeof(url), "%s%s", base, p);
	snprintf(k, sizeof(k), e2b ? "X-API-KEY: %s" : "Authorization: Bearer %s", key);
	l = curl_slist_append(l, k);
	l = curl_slist_append(l, "Content-Type: application/json");
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

static const char *str(json_t *j, const char *k)
{
	return json_string_value(json_object_get(j, k)) ?: "";
}

static const char *err_code(const struct answer *a)
{
	return str(json_object_get(a->j, "error"), "code");
}

/* Expect status; the answer is freed. */
static void expect(const char *key, const char *method, const char *p, const char *body, long status,
		   const char *code)
{
	struct answer a;

	call(&a, key, 0, method, p, body);
	if (a.status != status || (code && strcmp(err_code(&a), code)))
		fail_msg("%s %s %s: want %ld %s, got %ld %.*s", method, p, body ? body : "", status, code ? code : "",
			 a.status, (int)a.raw.len, a.raw.p ? a.raw.p : "");
	answer_free(&a);
}

/* A running session of key's customer (on h1 unless busy). */
static void session(const char *key, const char *body, char id[40])
{
	struct answer a;

	call(&a, key, 0, "POST", "/v1/sessions", body ? body : "{}");
	if (a.status != 201)
		fail_msg("create: %ld %.*s", a.status, (int)a.raw.len, a.raw.p ? a.raw.p : "");
	snprintf(id, 40, "%s", str(a.j, "id"));
	answer_free(&a);
}

static void checkpoint_rule(const char *id, int status, const char *body)
{
	char p[96];

	snprintf(p, sizeof(p), "/v1/sessions/%s/checkpoint", id);
	fake_rule("POST", NULL, p, status, body);
}

#endif
