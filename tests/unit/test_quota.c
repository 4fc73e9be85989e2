/* test_quota: the submit-rate token bucket against an injected clock, the
 * per-customer limiter, quota JSON (partial updates, refusals naming the
 * key), the per-task and start checks, and kiln-api's request parsers
 * (metadata stripped before the spec, admin bodies, heartbeats). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quota.h"
#include "request.h"
#include "spec.h"

static void test_bucket(void **state)
{
	struct quota_bucket b = { 0 };
	int64_t t = 1000000, retry = -1;

	/* 2 per second, burst 3: starts full. */
	for (int i = 0; i < 3; i++)
		assert_int_equal(quota_bucket_take(&b, 2, 3, t, &retry), 1);
	assert_int_equal(quota_bucket_take(&b, 2, 3, t, &retry), 0);
	assert_int_equal(retry, 500);
	/* A token takes 500 ms to come back. */
	assert_int_equal(quota_bucket_take(&b, 2, 3, t + 499, &retry), 0);
	assert_int_equal(retry, 1);
	assert_int_equal(quota_bucket_take(&b, 2, 3, t + 500, &retry), 1);
	assert_int_equal(quota_bucket_take(&b, 2, 3, t + 500, &retry), 0);
	/* Long idle refills to the burst, never beyond. */
	t += 3600 * 1000;
	assert_true(quota_bucket_peek(&b, 2, 3, t) == 3.0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(quota_bucket_take(&b, 2, 3, t, NULL), 1);
	assert_int_equal(quota_bucket_take(&b, 2, 3, t, NULL), 0);
	/* A clock stepping back gives nothing, and takes nothing. */
	assert_int_equal(quota_bucket_take(&b, 2, 3, t - 10000, &retry), 0);
	assert_int_equal(quota_bucket_take(&b, 2, 3, t + 500, NULL), 1);
	/* A lowered burst caps what is saved up at once. */
	t += 3600 * 1000;
	assert_true(quota_bucket_peek(&b, 2, 1, t) == 1.0);
	assert_int_equal(quota_bucket_take(&b, 2, 1, t, NULL), 1);
	assert_int_equal(quota_bucket_take(&b, 2, 1, t, NULL), 0);
	/* Fractional rates: 0.5/s means a token every 2 s. */
	{
		struct quota_bucket c = { 0 };

		assert_int_equal(quota_bucket_take(&c, 0.5, 1, 0, NULL), 1);
		assert_int_equal(quota_bucket_take(&c, 0.5, 1, 1999, &retry), 0);
		assert_int_equal(retry, 1);
		assert_int_equal(quota_bucket_take(&c, 0.5, 1, 2000, NULL), 1);
	}
	/* Rate 0: no limit. */
	{
		struct quota_bucket c = { 0 };

		for (int i = 0; i < 1000; i++)
			assert_int_equal(quota_bucket_take(&c, 0, 1, 0, NULL), 1);
	}
}

static void test_limiter(void **state)
{
	struct quota_limiter *l = quota_limiter_new();
	int64_t retry;

	assert_non_null(l);
	assert_int_equal(quota_limiter_take(l, "a", 1, 2, 0, &retry), 1);
	assert_int_equal(quota_limiter_take(l, "a", 1, 2, 0, &retry), 1);
	assert_int_equal(quota_limiter_take(l, "a", 1, 2, 0, &retry), 0);
	assert_int_equal(retry, 1000);
	/* Customers do not share a bucket. */
	assert_int_equal(quota_limiter_take(l, "b", 1, 2, 0, &retry), 1);
	assert_true(quota_limiter_peek(l, "b", 1, 2, 0) == 1.0);
	assert_true(quota_limiter_peek(l, "a", 1, 2, 250) == 0.25);
	quota_limiter_free(l);
}

static void test_quota_json(void **state)
{
	struct kiln_err err = { .code = "" };
	struct quota q, r;
	json_t *j;

	quota_defaults(&q);
	r = q;
	/* Partial: only the keys given change. */
	j = json_pack("{s:i, s:f, s:b}", "max_running", 7, "submit_rate", 0.5, "allow_egress", 1);
	assert_int_equal(quota_from_json(j, "quotas", &r, &err), 0);
	json_decref(j);
	assert_int_equal(r.max_running, 7);
	assert_true(r.submit_rate == 0.5);
	assert_int_equal(r.allow_egress, 1);
	assert_int_equal(r.max_queued, q.max_queued);
	/* Round trip. */
	j = quota_to_json(&r);
	quota_defaults(&q);
	assert_int_equal(quota_from_json(j, "", &q, &err), 0);
	json_decref(j);
	assert_memory_equal(&q, &r, sizeof(q));
	/* Refusals name the key and leave *q as it was. */
	j = json_pack("{s:i, s:i}", "max_running", 1, "max_runnig", 2);
	assert_int_equal(quota_from_json(j, "quotas", &r, &err), -1);
	json_decref(j);
	assert_non_null(strstr(err.message, "quotas.max_runnig: unknown quota"));
	assert_int_equal(r.max_running, 7);
	j = json_pack("{s:i}", "max_task_memory_mib", SPEC_MAX_MEMORY_MIB + 1);
	assert_int_equal(quota_from_json(j, "quotas", &r, &err), -1);
	assert_non_null(strstr(err.message, "quotas.max_task_memory_mib"));
	json_decref(j);
	j = json_pack("{s:i}", "max_queued", -1);
	assert_int_equal(quota_from_json(j, "", &r, &err), -1);
	json_decref(j);
	j = json_pack("{s:f}", "max_queued", 1.5);
	assert_int_equal(quota_from_json(j, "", &r, &err), -1);
	json_decref(j);
	j = json_pack("{s:s}", "allow_egress", "yes");
	assert_int_equal(quota_from_json(j, "", &r, &err), -1);
	json_decref(j);
	/* session_auto_pause: a boolean, false by default. */
	quota_defaults(&q);
	assert_int_equal(q.session_auto_pause, 0);
	j = json_pack("{s:b}", "session_auto_pause", 1);
	assert_int_equal(quota_from_json(j, "", &q, &err), 0);
	json_decref(j);
	assert_int_equal(q.session_auto_pause, 1);
	j = quota_to_json(&q);
	assert_true(json_is_true(json_object_get(j, "session_auto_pause")));
	json_decref(j);
	j = json_pack("{s:i}", "session_auto_pause", 1);
	assert_int_equal(quota_from_json(j, "quotas", &q, &err), -1);
	assert_non_null(strstr(err.message, "quotas.session_auto_pause: must be true or false"));
	json_decref(j);
}

/* Long-lived requests: counted per customer up to max, released by close;
 * 0 means no limit; a close never takes the count below zero. */
static void test_streams(void **state)
{
	struct quota_limiter *l = quota_limiter_new();
	struct quota q;

	(void)state;
	quota_defaults(&q);
	assert_int_equal(q.max_streams, 16);
	for (int i = 0; i < 3; i++)
		assert_int_equal(quota_limiter_stream_open(l, "a", 3), 1);
	assert_int_equal(quota_limiter_stream_open(l, "a", 3), 0);
	assert_int_equal(quota_limiter_stream_open(l, "b", 3), 1); /* another customer is not affected */
	quota_limiter_stream_close(l, "a");
	assert_int_equal(quota_limiter_stream_open(l, "a", 3), 1);
	assert_int_equal(quota_limiter_stream_open(l, "a", 3), 0);
	assert_int_equal(quota_limiter_stream_open(l, "a", 0), 1); /* no limit */
	for (int i = 0; i < 10; i++)
		quota_limiter_stream_close(l, "b");
	for (int i = 0; i < 3; i++)
		assert_int_equal(quota_limiter_stream_open(l, "b", 3), 1);
	assert_int_equal(quota_limiter_stream_open(l, "b", 3), 0);
	quota_limiter_free(l);
}

static void test_checks(void **state)
{
	struct kiln_err err = { .code = "" };
	struct quota q;
	struct usage u = { 0 };

	quota_defaults(&q);
	q.max_task_memory_mib = 2048;
	assert_int_equal(quota_check_task(&q, 1, 2048, 30, 64, &err), 0);
	assert_int_equal(quota_check_task(&q, 1, 4096, 30, 64, &err), -1);
	assert_string_equal(err.code, "over_quota");
	assert_string_equal(err.message, "limits.memory_mib: 4096 exceeds your quota of 2048");
	assert_int_equal(quota_check_task(&q, 9, 256, 30, 64, &err), -1);
	assert_non_null(strstr(err.message, "limits.vcpus: 9"));
	assert_int_equal(quota_check_task(&q, 1, 256, 7200, 64, &err), -1);
	assert_non_null(strstr(err.message, "limits.timeout_s"));
	q.max_task_vcpus = 0; /* 0: no per-task limit */
	assert_int_equal(quota_check_task(&q, 16, 256, 30, 64, &err), 0);

	quota_defaults(&q);
	q.max_running = 2;
	q.max_vcpus = 4;
	q.max_memory_mib = 1024;
	assert_int_equal(quota_allows_start(&q, &u, 4, 1024), 1);
	u.running = 1, u.vcpus = 2, u.memory_mib = 512;
	assert_int_equal(quota_allows_start(&q, &u, 2, 512), 1);
	assert_int_equal(quota_allows_start(&q, &u, 3, 512), 0);
	assert_int_equal(quota_allows_start(&q, &u, 2, 513), 0);
	u.running = 2;
	assert_int_equal(quota_allows_start(&q, &u, 1, 128), 0);

	/* The same checks with the limit named (sessions are refused, not queued). */
	u.running = 1;
	assert_int_equal(quota_check_start(&q, &u, 2, 512, &err), 0);
	assert_int_equal(quota_check_start(&q, &u, 3, 512, &err), -1);
	assert_string_equal(err.code, "quota_exceeded");
	assert_string_equal(err.message, "max_vcpus: 2 vCPUs are in use, 3 more would exceed your quota of 4");
	assert_int_equal(quota_check_start(&q, &u, 2, 513, &err), -1);
	assert_non_null(strstr(err.message, "max_memory_mib: 512 MiB are in use, 513 more"));
	u.running = 2;
	assert_int_equal(quota_check_start(&q, &u, 1, 128, &err), -1);
	assert_string_equal(err.message, "max_running: 2 tasks and sessions are running, your quota's limit is 2");
	q.max_running = 0, q.max_vcpus = 0, q.max_memory_mib = 0; /* 0: no limit */
	assert_int_equal(quota_check_start(&q, &u, 16, 16384, &err), 0);
}

static void test_task_request(void **state)
{
	struct kiln_err err = { .code = "" };
	struct api_task_request r;
	struct task_spec spec;
	const char *body = "{\"language\":\"python\",\"code\":\"print(1)\",\"metadata\":{\"run\":7},"
			   "\"network\":{\"egress\":\"internet\"}}";

	assert_int_equal(api_task_request_parse(body, strlen(body), &r, &err), 0);
	assert_non_null(r.metadata);
	assert_int_equal(json_integer_value(json_object_get(r.metadata, "run")), 7);
	assert_null(strstr(r.spec_json, "metadata"));
	assert_string_equal(r.egress, "internet");
	/* The spec parser then sees no metadata (and refuses the egress). */
	assert_int_equal(spec_parse(r.spec_json, r.spec_len, &spec, &err), -1);
	assert_non_null(strstr(err.message, "network.egress"));
	api_task_request_free(&r);

	/* Without metadata the body is the spec as sent. */
	body = "{\"argv\":[\"true\"]}";
	assert_int_equal(api_task_request_parse(body, strlen(body), &r, &err), 0);
	assert_string_equal(r.spec_json, body);
	assert_null(r.metadata);
	assert_null(r.egress);
	assert_int_equal(spec_parse(r.spec_json, r.spec_len, &spec, &err), 0);
	spec_free(&spec);
	api_task_request_free(&r);

	/* Malformed JSON: line and column. */
	body = "{\"argv\":\n [\"true\"";
	assert_int_equal(api_task_request_parse(body, strlen(body), &r, &err), -1);
	assert_string_equal(err.code, "invalid_json");
	assert_non_null(strstr(err.message, "line 2, column"));
	/* metadata must be a small object. */
	body = "{\"argv\":[\"true\"],\"metadata\":[1]}";
	assert_int_equal(api_task_request_parse(body, strlen(body), &r, &err), -1);
	assert_non_null(strstr(err.message, "metadata: must be an object"));
	{
		size_t n = API_METADATA_MAX + 100;
		char *big = malloc(n + 64);

		assert_non_null(big);
		size_t pre;

		strcpy(big, "{\"argv\":[\"true\"],\"metadata\":{\"x\":\"");
		pre = strlen(big);
		memset(big + pre, 'a', n);
		strcpy(big + pre + n, "\"}}");
		assert_int_equal(api_task_request_parse(big, strlen(big), &r, &err), -1);
		assert_non_null(strstr(err.message, "metadata: must be at most"));
		free(big);
	}
	/* Duplicate keys and non-objects are refused. */
	body = "{\"argv\":[\"true\"],\"argv\":[\"false\"]}";
	assert_int_equal(api_task_request_parse(body, strlen(body), &r, &err), -1);
	body = "[1]";
	assert_int_equal(api_task_request_parse(body, strlen(body), &r, &err), -1);
	assert_string_equal(err.code, "invalid_spec");
}

static void test_admin_bodies(void **state)
{
	struct kiln_err err = { .code = "" };
	char id[65], name[API_NAME_MAX + 1], url[API_URL_MAX + 1];
	struct quota q, d;
	json_t *cap;
	const char *b;

	quota_defaults(&d);
	q = d;
	b = "{\"id\":\"acme\",\"name\":\"Acme Inc\",\"quotas\":{\"max_queued\":5}}";
	assert_int_equal(api_customer_request_parse(b, strlen(b), id, name, &q, &err), 0);
	assert_string_equal(id, "acme");
	assert_string_equal(name, "Acme Inc");
	assert_int_equal(q.max_queued, 5);
	assert_int_equal(q.max_running, d.max_running);
	b = "{\"id\":\"acme\"}";
	assert_int_equal(api_customer_request_parse(b, strlen(b), id, name, &q, &err), 0);
	assert_string_equal(name, "acme");
	b = "{\"id\":\"../x\"}";
	assert_int_equal(api_customer_request_parse(b, strlen(b), id, name, &q, &err), -1);
	assert_non_null(strstr(err.message, "id:"));
	b = "{\"id\":\"a\",\"quota\":{}}";
	assert_int_equal(api_customer_request_parse(b, strlen(b), id, name, &q, &err), -1);
	assert_non_null(strstr(err.message, "quota: unknown field"));
	b = "{\"id\":\"a\",\"quotas\":{\"max_queued\":\"5\"}}";
	assert_int_equal(api_customer_request_parse(b, strlen(b), id, name, &q, &err), -1);
	assert_non_null(strstr(err.message, "quotas.max_queued"));
	b = "{\"max_running\":1}";
	assert_int_equal(api_quota_request_parse(b, strlen(b), &q, &err), 0);
	assert_int_equal(q.max_running, 1);
	b = "{\"max_running\":1";
	assert_int_equal(api_quota_request_parse(b, strlen(b), &q, &err), -1);
	assert_string_equal(err.code, "invalid_json");

	b = "{\"url\":\"http://10.0.0.2:7070\",\"capacity\":{\"vcpus\":{\"total\":8}}}";
	assert_int_equal(api_heartbeat_parse(b, strlen(b), url, &cap, &err), 0);
	assert_string_equal(url, "http://10.0.0.2:7070");
	assert_non_null(json_object_get(cap, "vcpus"));
	json_decref(cap);
	b = "{\"url\":\"ftp://x\",\"capacity\":{}}";
	assert_int_equal(api_heartbeat_parse(b, strlen(b), url, &cap, &err), -1);
	assert_null(cap);
	b = "{\"url\":\"http://x y\",\"capacity\":{}}";
	assert_int_equal(api_heartbeat_parse(b, strlen(b), url, &cap, &err), -1);
	b = "{\"url\":\"http://host-1:7070\"}";
	assert_int_equal(api_heartbeat_parse(b, strlen(b), url, &cap, &err), -1);
	assert_non_null(strstr(err.message, "capacity"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bucket),	       cmocka_unit_test(test_limiter),
		cmocka_unit_test(test_quota_json),     cmocka_unit_test(test_checks),
		cmocka_unit_test(test_task_request),   cmocka_unit_test(test_admin_bodies),
		cmocka_unit_test(test_streams),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
