/* test_api_templates: kiln-api's templates without HTTP or VMs, over a real
 * store on a temporary SQLite file, a scheduler driven by hand and a fake
 * host_ops (fake_host_ops.h): the store (create, name rules, isolation,
 * public built-ins from heartbeats, the capped build log, delete while a
 * session uses it, what the clean-up keeps while a task needs the image),
 * quotas, the resolution of a task's "template" and the merge of its env and
 * workdir, and the builder (placed on a host, followed to ready with its
 * TREF checked, to failed with the host's error, re-queued when the host
 * forgets it, given up after three attempts). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_host_ops.h"
#include "api_config.h"
#include "quota.h"
#include "scheduler.h"
#include "store.h"
#include "templates.h"

#define SHA "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static char dir[] = "/tmp/kiln-test-api-templates.XXXXXX";
static char path[256];
static int seq;
static struct store *st;
static struct sched *sc;
static struct templates *tp;
static struct api_config cfg;

static void customer(const char *id, unsigned max_templates)
{
	struct kiln_err err = { .code = "" };
	struct quota q;

	quota_defaults(&q);
	q.max_templates = max_templates;
	if (store_customer_create(st, id, id, &q, &err) != 0)
		fail_msg("customer: %s", err.message);
}

static void heartbeat(const char *id, const char *templates_json)
{
	struct kiln_err err = { .code = "" };
	char url[64];
	json_t *cap = json_pack("{s:{s:i, s:i}, s:{s:i, s:i}, s:b, s:o}", "vcpus", "total", 8, "used", 0, "memory_mib",
				"total", 8192, "used", 0, "egress", 1, "templates", json_loads(templates_json, 0, NULL));

	snprintf(url, sizeof(url), "http://%s", id);
	assert_int_equal(store_host_heartbeat(st, id, url, cap, &err), 0);
	templates_heartbeat(st, cap);
	json_decref(cap);
}

/* A queued recipe template of customer; its id in id. 0 or -1 (err). */
static int create(const char *customer_id, const char *name, unsigned max, char id[40], struct kiln_err *err)
{
	char recipe[128];
	struct store_template_new n = {
		.customer = customer_id, .name = name, .kind = "recipe", .recipe_json = recipe, .max_templates = max,
	};

	snprintf(recipe, sizeof(recipe), "{\"name\":\"%s\",\"packages\":[\"jq\"]}", name);
	assert_int_equal(store_template_new_id(id), 0);
	return store_template_create(st, id, &n, err);
}

static json_t *template_ref_json(const char *name)
{
	return json_pack("{s:s, s:s, s:i, s:s, s:[s], s:s, s:i, s:i}", "name", name, "sha256", SHA, "size", 4096,
			 "s3_key", "_templates/" SHA ".ext4", "env", "LANG=C.UTF-8", "workdir", "/srv", "uid", 0, "gid", 0);
}

/* A ready template of customer named name. */
static void ready(const char *customer_id, const char *name, char id[40])
{
	struct kiln_err err = { .code = "" };
	json_t *t = template_ref_json(name);

	assert_int_equal(create(customer_id, name, 0, id, &err), 0);
	assert_int_equal(store_template_finish(st, id, t, NULL, NULL), 1);
	json_decref(t);
}

static enum template_state state_of(const char *id)
{
	struct store_template r;

	return store_template_get(st, id, &r) == 0 ? r.state : TEMPLATE_STATE_COUNT;
}

static int wait_state(const char *id, enum template_state want)
{
	for (int i = 0; i < 1000; i++) {
		if (state_of(id) == want)
			return 1;
		real_nap();
	}
	return 0;
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
	fake_rule("POST", NULL, "/v1/builds", 202, "{\"state\":\"building\"}");
	fake_rule("GET", NULL, "/v1/builds/", 200, "{\"state\":\"building\"}");
	fake_rule("DELETE", NULL, "/v1/builds/", 202, "{}");
	api_config_defaults(&cfg);
	cfg.cluster_token = "tok";
	sc = sched_create(st, &sconf, &err);
	assert_non_null(sc);
	tp = templates_create(&cfg, st, sc, &fake_ops, &fake_clock, &err);
	assert_non_null(tp);
	return 0;
}

static int teardown(void **state)
{
	templates_stop(tp);
	templates_free(tp);
	sched_stop(sc);
	store_close(st);
	return 0;
}

/* ---- the store ---- */

/* Names are unique per customer; another customer may use the same name
 * and never sees the first one's; a public built-in's name is taken for
 * everybody; the list shows one's own and the public ones. */
static void test_names_and_isolation(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store_template r;
	char a[40], b[40], c[40];
	json_t *list;

	customer("acme", 10);
	customer("bob", 10);
	heartbeat("h1", "[{\"name\":\"default\",\"sha256\":null,\"builtin\":true,\"ready\":1},"
			"{\"name\":\"python-data\",\"sha256\":null,\"builtin\":true,\"ready\":0}]");
	heartbeat("h1", "[{\"name\":\"python-data\",\"sha256\":null,\"builtin\":true,\"ready\":0}]"); /* made once */
	assert_int_equal(create("acme", "data", 0, a, &err), 0);
	assert_int_equal(create("acme", "data", 0, c, &err), -1);
	assert_string_equal(err.code, "duplicate");
	assert_int_equal(create("bob", "data", 0, b, &err), 0);
	assert_int_equal(create("bob", "default", 0, c, &err), -1); /* public before any host says so */
	assert_string_equal(err.code, "duplicate");
	assert_int_equal(create("bob", "python-data", 0, c, &err), -1);
	assert_string_equal(err.code, "duplicate");
	assert_non_null(strstr(err.message, "public"));
	/* Lookup: own first; another customer's is not there at all. */
	assert_int_equal(store_template_find(st, "acme", "data", &r), 0);
	assert_string_equal(r.id, a);
	assert_int_equal(store_template_find(st, "bob", "data", &r), 0);
	assert_string_equal(r.id, b);
	assert_int_equal(store_template_find(st, "carol", "data", &r), -ENOENT);
	assert_int_equal(store_template_find(st, "carol", "python-data", &r), 0);
	assert_string_equal(r.customer, "");
	assert_int_equal(r.state, TEMPLATE_READY);
	list = store_template_list(st, "acme");
	assert_int_equal(json_array_size(list), 3); /* data, default, python-data */
	{
		json_t *e;
		size_t i;
		int pub = 0;

		json_array_foreach(list, i, e) {
			pub += json_is_true(json_object_get(e, "public"));
			assert_false(!strcmp(json_string_value(json_object_get(e, "id")), b));
		}
		assert_int_equal(pub, 2);
	}
	json_decref(list);
}

/* max_templates and build minutes refuse with quota_exceeded. */
static void test_quotas(void **state)
{
	struct kiln_err err = { .code = "" };
	struct quota q;
	char a[40], b[40];
	unsigned n = 0;
	double s = 0;

	customer("acme", 1);
	assert_int_equal(create("acme", "one", 1, a, &err), 0);
	assert_int_equal(create("acme", "two", 1, b, &err), -1);
	assert_string_equal(err.code, "quota_exceeded");
	assert_non_null(strstr(err.message, "max_templates"));
	assert_int_equal(store_template_usage(st, "acme", &n, &s), 0);
	assert_int_equal(n, 1);
	quota_defaults(&q);
	assert_int_equal(q.max_templates, 10);
	assert_int_equal(q.max_template_mib, 4096);
	assert_int_equal(q.build_minutes_per_day, 120);
	assert_int_equal(q.build_timeout_s, 1800);
	assert_int_equal(quota_check_build(&q, 9, 7199, &err), 0);
	assert_int_equal(quota_check_build(&q, 10, 0, &err), -1);
	assert_string_equal(err.code, "quota_exceeded");
	assert_int_equal(quota_check_build(&q, 0, 7200, &err), -1);
	assert_non_null(strstr(err.message, "build_minutes_per_day"));
	/* The new quotas are part of the quota object (admin API, config). */
	{
		json_t *j = quota_to_json(&q), *u = json_pack("{s:i}", "max_template_mib", 10);

		assert_int_equal(json_integer_value(json_object_get(j, "build_timeout_s")), 1800);
		assert_int_equal(quota_from_json(u, "quotas", &q, &err), 0);
		assert_int_equal(q.max_template_mib, 10);
		json_decref(j);
		json_decref(u);
	}
}

/* The build log keeps its last 64 KiB and counts every byte. */
static void test_log_capped(void **state)
{
	struct kiln_err err = { .code = "" };
	enum template_state s;
	uint64_t total;
	char id[40], line[1024], *log;
	json_t *e;

	customer("acme", 10);
	assert_int_equal(create("acme", "data", 0, id, &err), 0);
	memset(line, 'x', sizeof(line) - 1);
	line[sizeof(line) - 2] = '\n';
	line[sizeof(line) - 1] = '\0';
	for (int i = 0; i < 100; i++)
		assert_int_equal(store_template_log(st, id, line, strlen(line)), 0);
	assert_int_equal(store_template_progress(st, id, &s, &total, &log, &e), 0);
	assert_int_equal(total, 100 * strlen(line));
	assert_int_equal(strlen(log), STORE_TEMPLATE_LOG_MAX);
	assert_int_equal(s, TEMPLATE_QUEUED);
	free(log);
	json_decref(e);
}

/* ---- resolution ---- */

#define S1 "{\"argv\":[\"env\"],\"env\":{\"LANG\":\"fr\"}}"
#define S2 "{\"argv\":[\"env\"],\"cwd\":\"/tmp\"}"
static void test_resolve(void **state)
{
	struct kiln_err err = { .code = "" };
	struct template_use u;
	char a[40], q[40];
	char *merged;

	customer("acme", 10);
	heartbeat("h1", "[{\"name\":\"python-data\",\"sha256\":null,\"builtin\":true,\"ready\":0}]");
	assert_int_equal(template_resolve(st, "acme", NULL, &u, &err), 0);
	assert_int_equal(template_resolve(st, "acme", "default", &u, &err), 0);
	assert_int_equal(template_resolve(st, "acme", "nope", &u, &err), -1);
	assert_string_equal(err.code, "not_found");
	assert_string_equal(err.message, "no template named nope");
	assert_int_equal(create("acme", "later", 0, q, &err), 0);
	assert_int_equal(template_resolve(st, "acme", "later", &u, &err), -1);
	assert_string_equal(err.code, "template_not_ready");
	assert_int_equal(template_resolve(st, "bob", "later", &u, &err), -1);
	assert_string_equal(err.code, "not_found"); /* another customer's: as missing */
	ready("acme", "data", a);
	assert_int_equal(template_resolve(st, "acme", "data", &u, &err), 1);
	assert_non_null(strstr(u.template_ref, SHA));
	assert_string_equal(u.use.sha256, SHA);
	assert_false(u.use.builtin);
	/* env merged (the task's own wins), workdir as cwd unless given. */
	merged = template_merge_spec(S1, strlen(S1), 0, u.template_ref, &err);
	assert_non_null(merged);
	assert_non_null(strstr(merged, "\"LANG\":\"fr\""));
	assert_non_null(strstr(merged, "\"cwd\":\"/srv\""));
	free(merged);
	merged = template_merge_spec(S2, strlen(S2), 1, u.template_ref, &err);
	assert_non_null(merged);
	assert_non_null(strstr(merged, "\"LANG\":\"C.UTF-8\""));
	assert_non_null(strstr(merged, "\"cwd\":\"/tmp\""));
	free(merged);
	/* A session's exec gets them the same way. */
	{
		json_t *b = json_pack("{s:[s], s:{s:s}}", "argv", "env", "env", "LANG", "fr");

		template_merge_exec(b, u.template_ref);
		assert_string_equal(json_string_value(json_object_get(json_object_get(b, "env"), "LANG")), "fr");
		assert_string_equal(json_string_value(json_object_get(b, "cwd")), "/srv");
		json_decref(b);
		b = json_pack("{s:[s], s:s}", "argv", "env", "cwd", "/tmp");
		template_merge_exec(b, u.template_ref);
		assert_string_equal(json_string_value(json_object_get(json_object_get(b, "env"), "LANG")), "C.UTF-8");
		assert_string_equal(json_string_value(json_object_get(b, "cwd")), "/tmp");
		json_decref(b);
	}
	template_use_free(&u);
	assert_int_equal(template_resolve(st, "acme", "python-data", &u, &err), 1);
	assert_string_equal(u.template_ref, "{\"name\":\"python-data\",\"builtin\":true}");
	assert_true(u.use.builtin);
	template_use_free(&u);
}

/* A session using a template blocks its delete; a queued task does not,
 * and keeps the image referenced until it ends. */
static void test_delete_in_use(void **state)
{
	struct kiln_err err = { .code = "" };
	struct template_use u;
	struct store_template_gc g[4];
	char a[40], sid[40], tid[40];

	customer("acme", 10);
	ready("acme", "data", a);
	assert_int_equal(template_resolve(st, "acme", "data", &u, &err), 1);
	{
		struct store_session_new n = {
			.customer = "acme", .spec_json = "{}", .vcpus = 1, .memory_mib = 256, .idle_timeout_s = 60,
			.max_lifetime_s = 600, .host_id = "h1", .template_use = &u.use,
		};

		assert_int_equal(store_session_create(st, &n, sid, &err), 0);
	}
	{
		struct store_submit t = {
			.customer = "acme", .spec_json = "{\"argv\":[\"true\"]}", .vcpus = 1, .memory_mib = 256,
			.body_hash = "h", .template_use = &u.use,
		};

		assert_int_equal(store_task_submit(st, &t, tid, &err), 0);
	}
	template_use_free(&u);
	assert_int_equal(store_template_delete(st, a, &err), -EBUSY);
	assert_string_equal(err.code, "template_in_use");
	assert_int_equal(store_session_transition(st, sid, SESSION_STARTING, SESSION_DESTROYED, NULL, "destroyed", NULL),
			 1);
	assert_int_equal(store_template_delete(st, a, &err), 0);
	assert_int_equal(state_of(a), TEMPLATE_STATE_COUNT);
	/* The queued task still has its TREF, and the image stays while it may run. */
	{
		char *t = store_template_use_ref(st, tid);

		assert_non_null(t);
		assert_non_null(strstr(t, SHA));
		free(t);
	}
	assert_int_equal(store_template_gc_list(st, g, 4), 1);
	assert_string_equal(g[0].sha256, SHA);
	assert_int_equal(store_template_sha_referenced(st, SHA), 1);
	assert_int_equal(store_task_cancel(st, tid, "acme", NULL), STORE_CANCEL_DONE);
	assert_int_equal(store_template_sha_referenced(st, SHA), 0);
	/* The clean-up (no S3 configured here: nothing to delete remotely) drops the entry. */
	templates_tick(tp);
	assert_int_equal(store_template_gc_list(st, g, 4), 0);
}

/* ---- the builder ---- */

/* A queued build goes to a live host (POST /v1/builds), is followed to
 * ready, and its TREF (checked) is stored with our name. */
static void test_build_ready(void **state)
{
	struct kiln_err err = { .code = "" };
	char id[40], body[400], p[64];
	char *t;

	customer("acme", 10);
	heartbeat("h1", "[]");
	sched_tick(sc);
	assert_int_equal(create("acme", "data", 0, id, &err), 0);
	snprintf(p, sizeof(p), "/v1/builds/%s", id);
	snprintf(body, sizeof(body),
		 "{\"state\":\"ready\",\"template\":{\"name\":\"x\",\"sha256\":\"%s\",\"size\":4096,"
		 "\"s3_key\":\"_templates/%s.ext4\",\"env\":[],\"workdir\":\"/work\",\"uid\":1000,\"gid\":1000}}",
		 SHA, SHA);
	fake_rule("GET", NULL, p, 200, body);
	templates_tick(tp);
	assert_true(wait_state(id, TEMPLATE_READY));
	assert_int_equal(fake_count("POST", "http://h1", "/v1/builds"), 1);
	t = store_template_ref(st, id);
	assert_non_null(t);
	assert_non_null(strstr(t, "\"name\":\"data\""));
	free(t);
	{
		struct store_template r;

		assert_int_equal(store_template_get(st, id, &r), 0);
		assert_string_equal(r.sha256, SHA);
		assert_int_equal(r.attempts, 1);
	}
}

/* A host's failure is recorded with its code; a TREF that names another
 * object than its sha256 fails the build. */
static void test_build_failed(void **state)
{
	struct kiln_err err = { .code = "" };
	char a[40], b[40], p[64], body[400];
	json_t *j;

	customer("acme", 10);
	heartbeat("h1", "[]");
	sched_tick(sc);
	assert_int_equal(create("acme", "bad", 0, a, &err), 0);
	snprintf(p, sizeof(p), "/v1/builds/%s", a);
	fake_rule("GET", NULL, p, 200,
		  "{\"state\":\"failed\",\"error\":{\"code\":\"build_failed\",\"message\":\"run[0] exited 2\"}}");
	assert_int_equal(create("acme", "liar", 0, b, &err), 0);
	snprintf(p, sizeof(p), "/v1/builds/%s", b);
	snprintf(body, sizeof(body),
		 "{\"state\":\"ready\",\"template\":{\"sha256\":\"%s\",\"size\":1,\"s3_key\":\"customer/x.ext4\"}}", SHA);
	fake_rule("GET", NULL, p, 200, body);
	templates_tick(tp);
	assert_true(wait_state(a, TEMPLATE_FAILED));
	assert_true(wait_state(b, TEMPLATE_FAILED));
	j = store_template_json(st, a, 1);
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "build_failed");
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "message")), "run[0] exited 2");
	json_decref(j);
	j = store_template_json(st, b, 0);
	assert_non_null(strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")), "s3_key"));
	json_decref(j);
}

/* A host that answers 404 (it restarted) gets the build again, at most
 * three times; then it fails. */
static void test_build_requeued_then_gives_up(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store_template r;
	char id[40], p[64];

	customer("acme", 10);
	heartbeat("h1", "[]");
	sched_tick(sc);
	assert_int_equal(create("acme", "data", 0, id, &err), 0);
	snprintf(p, sizeof(p), "/v1/builds/%s", id);
	fake_rule("GET", NULL, p, 404, "{}");
	for (int i = 0; i < 200 && state_of(id) != TEMPLATE_FAILED; i++) {
		templates_tick(tp);
		sched_tick(sc); /* placements counted in flight are forgotten at each heartbeat */
		heartbeat("h1", "[]");
		real_nap();
	}
	assert_int_equal(state_of(id), TEMPLATE_FAILED);
	assert_int_equal(store_template_get(st, id, &r), 0);
	assert_int_equal(r.attempts, TEMPLATES_MAX_ATTEMPTS);
	assert_int_equal(fake_count("POST", "http://h1", "/v1/builds"), TEMPLATES_MAX_ATTEMPTS);
}

/* An image past max_template_mib fails the build with too_large. */
static void test_build_too_large(void **state)
{
	struct kiln_err err = { .code = "" };
	struct quota q;
	char id[40], p[64], body[400];
	json_t *j;

	customer("acme", 10);
	assert_int_equal(store_customer_quota(st, "acme", &q), 0);
	q.max_template_mib = 1;
	assert_int_equal(store_customer_set_quota(st, "acme", &q, &err), 0);
	heartbeat("h1", "[]");
	sched_tick(sc);
	assert_int_equal(create("acme", "huge", 0, id, &err), 0);
	snprintf(p, sizeof(p), "/v1/builds/%s", id);
	snprintf(body, sizeof(body),
		 "{\"state\":\"ready\",\"template\":{\"sha256\":\"%s\",\"size\":2097152,\"s3_key\":\"_templates/%s.ext4\"}}",
		 SHA, SHA);
	fake_rule("GET", NULL, p, 200, body);
	templates_tick(tp);
	assert_true(wait_state(id, TEMPLATE_FAILED));
	j = store_template_json(st, id, 0);
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "too_large");
	json_decref(j);
}

/* A host that answers 503 (no egress, full) gets the build again later; after
 * three such answers it fails, saying why. */
static void test_build_refused_by_hosts(void **state)
{
	struct kiln_err err = { .code = "" };
	char id[40];
	json_t *j;

	customer("acme", 10);
	heartbeat("h1", "[]");
	sched_tick(sc);
	fake_rule("POST", NULL, "/v1/builds", 503, "{\"error\":{\"code\":\"no_egress\",\"message\":\"no egress here\"}}");
	assert_int_equal(create("acme", "data", 0, id, &err), 0);
	for (int i = 0; i < 400 && state_of(id) != TEMPLATE_FAILED; i++) {
		templates_tick(tp);
		heartbeat("h1", "[]");
		clock_advance(1500); /* past the host's back-off */
		sched_tick(sc);
		real_nap();
	}
	assert_int_equal(state_of(id), TEMPLATE_FAILED);
	j = store_template_json(st, id, 0);
	assert_non_null(strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")), "no_egress"));
	json_decref(j);
	assert_int_equal(fake_count("POST", "http://h1", "/v1/builds"), TEMPLATES_MAX_ATTEMPTS);
}

/* No live host: the build stays queued. */
static void test_build_waits_for_host(void **state)
{
	struct kiln_err err = { .code = "" };
	char id[40];

	customer("acme", 10);
	assert_int_equal(create("acme", "data", 0, id, &err), 0);
	templates_tick(tp);
	assert_int_equal(state_of(id), TEMPLATE_QUEUED);
	assert_int_equal(fake_count("POST", NULL, "/v1/builds"), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_names_and_isolation, setup, teardown),
		cmocka_unit_test_setup_teardown(test_quotas, setup, teardown),
		cmocka_unit_test_setup_teardown(test_log_capped, setup, teardown),
		cmocka_unit_test_setup_teardown(test_resolve, setup, teardown),
		cmocka_unit_test_setup_teardown(test_delete_in_use, setup, teardown),
		cmocka_unit_test_setup_teardown(test_build_ready, setup, teardown),
		cmocka_unit_test_setup_teardown(test_build_failed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_build_requeued_then_gives_up, setup, teardown),
		cmocka_unit_test_setup_teardown(test_build_waits_for_host, setup, teardown),
		cmocka_unit_test_setup_teardown(test_build_refused_by_hosts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_build_too_large, setup, teardown),
	};
	char cmd[300];
	int r;

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	r = cmocka_run_group_tests(tests, NULL, NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
	return r;
}
