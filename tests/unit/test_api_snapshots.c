/* test_api_snapshots: named snapshots and fork through kiln-api's HTTP
 * server on loopback, without VMs: a real store and scheduler, hosts
 * answered by fake_host_ops.h's rules (checkpoint, resume, the deletion
 * of a snapshot's objects) with what they were sent recorded. Checks what
 * reaches the host (the checkpoint's customer and id, a create from a
 * snapshot as a resume of it with the snapshot's spec and template, the
 * placement on the host it was taken on), the answers' fields, another
 * customer's 404s, every bad input's 400, the quotas (max_snapshots before
 * the host is asked, max_snapshot_mib after, with the objects deleted),
 * a failed checkpoint leaving nothing, deletion (objects kept while a
 * session from the snapshot lives, deleted at its destroy, retried by the
 * reaper's pass when the host was away), fork (children admitted one by
 * one, refusals listed, the fork's snapshot gone), and E2B's mapping
 * (createSnapshot, listSnapshots with x-next-token, deleteSnapshot's
 * DELETE /templates/{id}, Sandbox.create(snapshotId), fork's array). */
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

#include <curl/curl.h>

#define API_ENV_DIR "/tmp/kiln-test-api-snapshots.XXXXXX"
#include "api_http_env.h"

/* A snapshot of session sid (name may be NULL): its id. */
static void snapshot(const char *key, const char *sid, const char *name, char k[40])
{
	struct answer a;
	char p[96], body[128];

	snprintf(p, sizeof(p), "/v1/sessions/%s/snapshots", sid);
	snprintf(body, sizeof(body), name ? "{\"name\":\"%s\"}" : "{}", name);
	call(&a, key, 0, "POST", p, body);
	if (a.status != 201)
		fail_msg("snapshot: %ld %.*s", a.status, (int)a.raw.len, a.raw.p ? a.raw.p : "");
	snprintf(k, 40, "%s", str(a.j, "id"));
	answer_free(&a);
}

/* ---- the tests ---- */

static void test_snapshot_take_get_list(void **state)
{
	struct answer a;
	char s1[40], s2[40], k1[40], k2[40], k3[40], p[200];
	json_t *b;

	session(key_a, "{\"limits\":{\"vcpus\":2,\"memory_mib\":512}}", s1);
	session(key_a, NULL, s2);
	checkpoint_rule(s1, 200, CHECKPOINT_OK);
	checkpoint_rule(s2, 200, CHECKPOINT_OK);
	snprintf(p, sizeof(p), "/v1/sessions/%s/snapshots", s1);
	call(&a, key_a, 0, "POST", p, "{\"name\":\"base-1\"}");
	assert_int_equal(a.status, 201);
	snprintf(k1, sizeof(k1), "%s", str(a.j, "id"));
	assert_true(store_snapshot_id_valid(k1));
	assert_string_equal(str(a.j, "name"), "base-1");
	assert_string_equal(str(a.j, "session_id"), s1);
	assert_string_equal(str(a.j, "template"), "default");
	assert_int_equal(json_integer_value(json_object_get(a.j, "vcpus")), 2);
	assert_int_equal(json_integer_value(json_object_get(a.j, "memory_mib")), 512);
	assert_int_equal(json_integer_value(json_object_get(a.j, "bytes")), 1048576);
	assert_int_equal(json_integer_value(json_object_get(a.j, "stop_ms")), 7);
	assert_true(json_integer_value(json_object_get(a.j, "created_ms")) > 0);
	answer_free(&a);
	/* What its host was asked: the customer and the id, on the session's host. */
	snprintf(p, sizeof(p), "/v1/sessions/%s/checkpoint", s1);
	b = json_loads(fake_nth_body("POST", p, 0), 0, NULL);
	assert_string_equal(str(b, "customer"), "acme");
	assert_string_equal(str(b, "snapshot"), k1);
	json_decref(b);
	snapshot(key_a, s1, NULL, k2);
	snapshot(key_a, s2, "other", k3);
	/* Get: the customer's only. */
	snprintf(p, sizeof(p), "/v1/snapshots/%s", k2);
	call(&a, key_a, 0, "GET", p, NULL);
	assert_int_equal(a.status, 200);
	assert_true(json_is_null(json_object_get(a.j, "name")));
	answer_free(&a);
	expect(key_b, "GET", p, NULL, 404, "not_found");
	expect(key_b, "DELETE", p, NULL, 404, "not_found");
	expect(key_a, "GET", "/v1/snapshots/snap_nope", NULL, 404, "not_found");
	/* Another customer's session: 404 before anything is asked of a host. */
	snprintf(p, sizeof(p), "/v1/sessions/%s/snapshots", s1);
	expect(key_b, "POST", p, "{}", 404, "not_found");
	/* The list: newest first, paged, filtered; another customer sees none. */
	call(&a, key_a, 0, "GET", "/v1/snapshots?limit=2", NULL);
	assert_int_equal(a.status, 200);
	assert_int_equal(json_array_size(json_object_get(a.j, "snapshots")), 2);
	assert_string_equal(str(json_array_get(json_object_get(a.j, "snapshots"), 0), "id"), k3);
	snprintf(p, sizeof(p), "/v1/snapshots?limit=2&after=%s", str(a.j, "next"));
	answer_free(&a);
	call(&a, key_a, 0, "GET", p, NULL);
	assert_int_equal(json_array_size(json_object_get(a.j, "snapshots")), 1);
	assert_string_equal(str(json_array_get(json_object_get(a.j, "snapshots"), 0), "id"), k1);
	assert_true(json_is_null(json_object_get(a.j, "next")));
	answer_free(&a);
	call(&a, key_a, 0, "GET", "/v1/snapshots?name=other", NULL);
	assert_int_equal(json_array_size(json_object_get(a.j, "snapshots")), 1);
	answer_free(&a);
	snprintf(p, sizeof(p), "/v1/snapshots?session_id=%s", s1);
	call(&a, key_a, 0, "GET", p, NULL);
	assert_int_equal(json_array_size(json_object_get(a.j, "snapshots")), 2);
	answer_free(&a);
	call(&a, key_b, 0, "GET", "/v1/snapshots", NULL);
	assert_int_equal(json_array_size(json_object_get(a.j, "snapshots")), 0);
	answer_free(&a);
	/* Bad input: a clear 400 each. */
	snprintf(p, sizeof(p), "/v1/sessions/%s/snapshots", s1);
	expect(key_a, "POST", p, "{\"name\":\"\"}", 400, "invalid_request");
	expect(key_a, "POST", p, "{\"name\":\"a b\"}", 400, "invalid_request");
	expect(key_a, "POST", p, "{\"name\":7}", 400, "invalid_request");
	expect(key_a, "POST", p, "{\"nom\":\"x\"}", 400, "invalid_request");
	expect(key_a, "POST", p, "[1]", 400, "invalid_request");
	expect(key_a, "POST", p, "{", 400, "invalid_json");
	expect(key_a, "GET", "/v1/snapshots?limit=0", NULL, 400, "invalid_request");
	expect(key_a, "GET", "/v1/snapshots?limit=x", NULL, 400, "invalid_request");
	expect(key_a, "GET", "/v1/snapshots?after=x", NULL, 400, "invalid_request");
	expect(key_a, "GET", "/v1/snapshots?name=a%20b", NULL, 400, "invalid_request");
	expect(key_a, "PUT", "/v1/snapshots", NULL, 405, "method_not_allowed");
}

static void test_start_from_snapshot(void **state)
{
	struct answer a;
	char s1[40], k[40], p[200], res[96];
	struct store_session c;
	json_t *b;

	session(key_a, "{\"limits\":{\"vcpus\":2,\"memory_mib\":512},\"idle_timeout_s\":77}", s1);
	checkpoint_rule(s1, 200, CHECKPOINT_OK);
	snapshot(key_a, s1, "x", k);
	/* On the host it was taken on (its chunks may be cached there),
	 * though the other one is as free. */
	snprintf(p, sizeof(p), "{\"snapshot\":\"%s\",\"metadata\":{\"n\":\"1\"},\"max_lifetime_s\":99}", k);
	call(&a, key_a, 0, "POST", "/v1/sessions", p);
	assert_int_equal(a.status, 201);
	assert_string_equal(str(a.j, "snapshot_id"), k);
	assert_string_equal(str(a.j, "state"), "running");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(a.j, "limits"), "vcpus")), 2);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(a.j, "limits"), "memory_mib")), 512);
	assert_int_equal(json_integer_value(json_object_get(a.j, "max_lifetime_s")), 99);
	assert_string_equal(str(json_object_get(a.j, "metadata"), "n"), "1");
	assert_int_equal(store_session_get(st, str(a.j, "id"), "acme", &c), 0);
	assert_string_equal(c.from_snapshot, k);
	assert_string_equal(c.host_id, "h1");
	/* The host was asked to resume the snapshot under the new id. */
	snprintf(res, sizeof(res), "/v1/sessions/%s/resume", c.id);
	assert_int_equal(fake_count("POST", "http://h1", res), 1);
	b = json_loads(fake_nth_body("POST", res, 0), 0, NULL);
	assert_string_equal(str(b, "customer"), "acme");
	assert_string_equal(str(b, "snapshot"), k);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(json_object_get(b, "spec"), "limits"), "vcpus")),
			 2);
	json_decref(b);
	answer_free(&a);
	/* Five more from it: any number. */
	for (int i = 0; i < 5; i++) {
		call(&a, key_a, 0, "POST", "/v1/sessions", p);
		assert_int_equal(a.status, 201);
		answer_free(&a);
	}
	/* What the snapshot decides cannot be asked for. */
	snprintf(p, sizeof(p), "{\"snapshot\":\"%s\",\"limits\":{\"vcpus\":1}}", k);
	expect(key_a, "POST", "/v1/sessions", p, 400, "invalid_request");
	snprintf(p, sizeof(p), "{\"snapshot\":\"%s\",\"template\":\"py\"}", k);
	expect(key_a, "POST", "/v1/sessions", p, 400, "invalid_request");
	snprintf(p, sizeof(p), "{\"snapshot\":\"%s\",\"network\":{\"egress\":\"none\"}}", k);
	expect(key_a, "POST", "/v1/sessions", p, 400, "invalid_request");
	expect(key_a, "POST", "/v1/sessions", "{\"snapshot\":\"snap_x\"}", 400, "invalid_request");
	expect(key_a, "POST", "/v1/sessions", "{\"snapshot\":7}", 400, "invalid_request");
	/* Unknown, or another customer's: 404, no host asked. */
	expect(key_a, "POST", "/v1/sessions", "{\"snapshot\":\"snap_000000000000000000000001\"}", 404, "not_found");
	snprintf(p, sizeof(p), "{\"snapshot\":\"%s\"}", k);
	expect(key_b, "POST", "/v1/sessions", p, 404, "not_found");
	/* The host refuses (the snapshot's manifest gone): its answer, no session left. */
	fake_rule("POST", NULL, "/v1/sessions/s_", 404, "{\"error\":{\"code\":\"no_snapshot\",\"message\":\"gone\"}}");
	expect(key_a, "POST", "/v1/sessions", p, 404, "no_snapshot");
	call(&a, key_a, 0, "GET", "/v1/sessions?limit=100", NULL);
	assert_int_equal(json_array_size(json_object_get(a.j, "sessions")), 7);
	answer_free(&a);
}

static void test_snapshot_quotas(void **state)
{
	struct answer a;
	char s1[40], k[40], p[200], key_c[128];
	struct quota q;

	quota_defaults(&q);
	q.max_running = 10;
	q.max_snapshots = 1;
	customer("cee", &q, key_c);
	session(key_c, NULL, s1);
	checkpoint_rule(s1, 200, CHECKPOINT_OK);
	snapshot(key_c, s1, NULL, k);
	/* The second: 429 before its host is asked. */
	snprintf(p, sizeof(p), "/v1/sessions/%s/snapshots", s1);
	expect(key_c, "POST", p, "{}", 429, "quota_exceeded");
	snprintf(p, sizeof(p), "/v1/sessions/%s/checkpoint", s1);
	assert_int_equal(fake_count("POST", NULL, p), 1);
	/* Deleted, it frees its place. */
	snprintf(p, sizeof(p), "/v1/snapshots/%s", k);
	call(&a, key_c, 0, "DELETE", p, NULL);
	assert_int_equal(a.status, 200);
	assert_true(json_is_true(json_object_get(a.j, "deleted")));
	answer_free(&a);
	expect(key_c, "GET", p, NULL, 404, "not_found");
	expect(key_c, "DELETE", p, NULL, 404, "not_found");
	snapshot(key_c, s1, NULL, k);
	/* Bytes: known after the checkpoint; over max_snapshot_mib the
	 * objects are deleted and nothing is kept. */
	q.max_snapshots = 5;
	q.max_snapshot_mib = 1;
	assert_int_equal(store_customer_set_quota(st, "cee", &q, NULL), 0);
	snprintf(p, sizeof(p), "/v1/sessions/%s/snapshots", s1);
	{
		int before = fake_count("DELETE", NULL, "/v1/snapshots/");

		call(&a, key_c, 0, "POST", p, "{}");
		assert_int_equal(a.status, 429);
		assert_string_equal(err_code(&a), "quota_exceeded");
		assert_non_null(strstr(str(json_object_get(a.j, "error"), "message"), "max_snapshot_mib"));
		answer_free(&a);
		assert_int_equal(fake_count("DELETE", NULL, "/v1/snapshots/"), before + 1);
	}
	call(&a, key_c, 0, "GET", "/v1/snapshots", NULL);
	assert_int_equal(json_array_size(json_object_get(a.j, "snapshots")), 1);
	answer_free(&a);
	/* Quotas are shown and set like the others. */
	call(&a, key_c, 0, "GET", "/v1/usage", NULL);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(a.j, "quotas"), "max_snapshots")), 5);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(a.j, "quotas"), "max_snapshot_mib")), 1);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(a.j, "usage"), "snapshots")), 1);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(a.j, "usage"), "snapshot_bytes")), 1048576);
	answer_free(&a);
}

static void test_snapshot_failures(void **state)
{
	struct answer a;
	struct sessions_outcome o = { 0 };
	char s1[40], p[200];
	unsigned count;
	uint64_t bytes;

	session(key_a, NULL, s1);
	snprintf(p, sizeof(p), "/v1/sessions/%s/snapshots", s1);
	/* The host fails: its answer, nothing recorded, its leftovers deleted. */
	checkpoint_rule(s1, 503, "{\"error\":{\"code\":\"s3_unavailable\",\"message\":\"S3 is down\"}}");
	expect(key_a, "POST", p, "{}", 503, "s3_unavailable");
	assert_int_equal(fake_count("DELETE", NULL, "/v1/snapshots/snap_"), 1);
	assert_int_equal(store_snapshot_usage(st, "acme", &count, &bytes), 0);
	assert_int_equal(count, 0);
	/* Unreachable, and its leftovers cannot be deleted now: nothing for the
	 * customer, a hidden deleted row for the reaper's retry. */
	checkpoint_rule(s1, -1, NULL);
	fake_rule("DELETE", NULL, "/v1/snapshots/", -1, NULL);
	expect(key_a, "POST", p, "{}", 503, "host_unavailable");
	{
		struct store_snapshot del[4];

		assert_int_equal(store_snapshots_deleted(st, del, 4), 1);
		fake_rule("DELETE", NULL, "/v1/snapshots/", 200, "{}");
		sessions_snapshots_gc(ss);
		assert_int_equal(store_snapshots_deleted(st, del, 4), 0);
		assert_int_equal(store_snapshot_get(st, del[0].id, NULL, 1, &del[1]), -ENOENT);
	}
	/* Busy: the host's 409 as it came. */
	checkpoint_rule(s1, 409, "{\"error\":{\"code\":\"busy\",\"message\":\"pausing\"}}");
	expect(key_a, "POST", p, "{}", 409, "busy");
	/* Paused: resume it first. */
	snprintf(p, sizeof(p), "/v1/sessions/%s/pause", s1);
	fake_rule("POST", NULL, p, 200, "{\"snapshot\":{\"bytes\":1}}");
	sessions_pause(ss, s1, "paused", &o);
	assert_int_equal(o.status, 200);
	snprintf(p, sizeof(p), "/v1/sessions/%s/snapshots", s1);
	call(&a, key_a, 0, "POST", p, "{}");
	assert_int_equal(a.status, 409);
	assert_string_equal(err_code(&a), "not_running");
	assert_non_null(strstr(str(json_object_get(a.j, "error"), "message"), "resume it first"));
	answer_free(&a);
	snprintf(p, sizeof(p), "/v1/sessions/%s/fork", s1);
	expect(key_a, "POST", p, "{}", 409, "not_running");
}

/* Deleting a snapshot that a running session was started from: its
 * objects stay until that session is destroyed; a paused one keeps them
 * too. A host away at that moment: the reaper's pass. */
static void test_delete_while_used(void **state)
{
	struct sessions_outcome o = { 0 };
	struct store_snapshot k;
	struct answer a;
	char s1[40], s2[40], s3[40], kid[40], p[200], del[200];

	session(key_a, NULL, s1);
	checkpoint_rule(s1, 200, CHECKPOINT_OK);
	snapshot(key_a, s1, NULL, kid);
	snprintf(p, sizeof(p), "{\"snapshot\":\"%s\"}", kid);
	session(key_a, p, s2);
	session(key_a, p, s3);
	snprintf(del, sizeof(del), "/v1/snapshots/%s?customer=acme", kid);
	snprintf(p, sizeof(p), "/v1/snapshots/%s", kid);
	call(&a, key_a, 0, "DELETE", p, NULL);
	assert_int_equal(a.status, 200);
	answer_free(&a);
	expect(key_a, "GET", p, NULL, 404, "not_found");
	assert_int_equal(fake_count("DELETE", NULL, "/v1/snapshots/"), 0);
	/* The sessions from it still pause and resume. */
	snprintf(p, sizeof(p), "/v1/sessions/%s/pause", s2);
	fake_rule("POST", NULL, p, 200, "{\"snapshot\":{\"bytes\":1}}");
	expect(key_a, "POST", p, NULL, 200, NULL);
	snprintf(p, sizeof(p), "/v1/sessions/%s/resume", s2);
	expect(key_a, "POST", p, NULL, 200, NULL);
	/* One destroyed: the other still uses it. */
	snprintf(p, sizeof(p), "/v1/sessions/%s", s2);
	expect(key_a, "DELETE", p, NULL, 200, NULL);
	assert_int_equal(fake_count("DELETE", NULL, "/v1/snapshots/"), 0);
	/* The last one paused still uses it; destroyed, its objects go, on the
	 * host it was taken on; then its row. The host away: later. */
	snprintf(p, sizeof(p), "/v1/sessions/%s/pause", s3);
	fake_rule("POST", NULL, p, 200, "{\"snapshot\":{\"bytes\":1}}");
	sessions_pause(ss, s3, "paused", &o);
	assert_int_equal(o.status, 200);
	fake_rule("DELETE", NULL, "/v1/snapshots/", -1, NULL);
	snprintf(p, sizeof(p), "/v1/sessions/%s", s3);
	expect(key_a, "DELETE", p, NULL, 200, NULL);
	assert_int_equal(fake_count("DELETE", "http://h1", del), 1);
	assert_int_equal(store_snapshot_get(st, kid, NULL, 1, &k), 0);
	fake_rule("DELETE", NULL, "/v1/snapshots/", 200, "{}");
	sessions_snapshots_gc(ss);
	assert_int_equal(fake_count("DELETE", "http://h1", del), 2);
	assert_int_equal(store_snapshot_get(st, kid, NULL, 1, &k), -ENOENT);
	/* A snapshot nothing uses: its objects at once. */
	snapshot(key_a, s1, NULL, kid);
	snprintf(p, sizeof(p), "/v1/snapshots/%s", kid);
	expect(key_a, "DELETE", p, NULL, 200, NULL);
	snprintf(del, sizeof(del), "/v1/snapshots/%s?customer=acme", kid);
	assert_int_equal(fake_count("DELETE", NULL, del), 1);
	assert_int_equal(store_snapshot_get(st, kid, NULL, 1, &k), -ENOENT);
}

static void test_fork(void **state)
{
	struct answer a;
	struct quota q;
	char s1[40], p[200], key_c[128];
	json_t *arr, *c;
	size_t i;

	/* Room for the parent and two children. */
	quota_defaults(&q);
	q.max_running = 3;
	customer("cee", &q, key_c);
	session(key_c, "{\"idle_timeout_s\":120}", s1);
	checkpoint_rule(s1, 200, CHECKPOINT_OK);
	snprintf(p, sizeof(p), "/v1/sessions/%s/fork", s1);
	call(&a, key_c, 0, "POST", p, "{\"count\":3}");
	assert_int_equal(a.status, 200);
	assert_string_equal(str(a.j, "parent"), s1);
	assert_int_equal(json_integer_value(json_object_get(a.j, "stop_ms")), 7);
	arr = json_object_get(a.j, "sessions");
	assert_int_equal(json_array_size(arr), 2);
	json_array_foreach(arr, i, c) {
		assert_string_equal(str(c, "state"), "running");
		assert_true(store_snapshot_id_valid(str(c, "snapshot_id")));
		/* The parent's limits unless given. */
		assert_int_equal(json_integer_value(json_object_get(c, "idle_timeout_s")), 120);
	}
	assert_string_not_equal(str(json_array_get(arr, 0), "id"), str(json_array_get(arr, 1), "id"));
	assert_int_equal(json_array_size(json_object_get(a.j, "errors")), 1);
	assert_string_equal(str(json_array_get(json_object_get(a.j, "errors"), 0), "code"), "quota_exceeded");
	assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(a.j, "errors"), 0), "status")),
			 429);
	/* The fork's snapshot: never listed, deleted, its objects kept for the children. */
	{
		struct store_snapshot k;

		assert_int_equal(store_snapshot_get(st, str(json_array_get(arr, 0), "snapshot_id"), NULL, 1, &k), 0);
		assert_true(k.deleted_ms > 0);
		assert_string_equal(k.kind, "fork");
		assert_int_equal(fake_count("DELETE", NULL, "/v1/snapshots/"), 0);
	}
	answer_free(&a);
	call(&a, key_c, 0, "GET", "/v1/snapshots", NULL);
	assert_int_equal(json_array_size(json_object_get(a.j, "snapshots")), 0);
	answer_free(&a);
	/* Bad input. */
	expect(key_c, "POST", p, "{\"count\":0}", 400, "invalid_request");
	expect(key_c, "POST", p, "{\"count\":21}", 400, "invalid_request");
	expect(key_c, "POST", p, "{\"count\":\"2\"}", 400, "invalid_request");
	expect(key_c, "POST", p, "{\"count\":1,\"limits\":{}}", 400, "invalid_request");
	expect(key_c, "POST", p, "{\"idle_timeout_s\":0}", 400, NULL);
	/* None fits: every child an error; the snapshot's objects go at once. */
	call(&a, key_c, 0, "POST", p, "{\"count\":2}");
	assert_int_equal(a.status, 200);
	assert_int_equal(json_array_size(json_object_get(a.j, "sessions")), 0);
	assert_int_equal(json_array_size(json_object_get(a.j, "errors")), 2);
	answer_free(&a);
	assert_int_equal(fake_count("DELETE", NULL, "/v1/snapshots/"), 1);
	/* Another customer's: 404. */
	expect(key_a, "POST", p, "{}", 404, "not_found");
}

/* ---- E2B ---- */

static void e2b_create(const char *body, char id[40])
{
	struct answer a;
	char canon[40];

	call(&a, key_a, 1, "POST", "/e2b/v2/sandboxes", body);
	if (a.status != 201)
		fail_msg("create: %ld %.*s", a.status, (int)a.raw.len, a.raw.p ? a.raw.p : "");
	snprintf(id, 40, "%s", store_session_id_canon(str(a.j, "sandboxID"), canon));
	answer_free(&a);
}

static void test_e2b(void **state)
{
	struct answer a;
	struct store_session c;
	char s1[40], e2b_id[40], p[200], k1[40], k2[40];
	json_t *x;
	size_t i;

	e2b_create("{\"templateID\":\"base\",\"timeout\":60,\"autoPause\":true}", s1);
	store_session_id_e2b(s1, e2b_id);
	checkpoint_rule(s1, 200, CHECKPOINT_OK);
	/* createSnapshot */
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s/snapshots", e2b_id);
	call(&a, key_a, 1, "POST", p, "{\"name\":\"my-snapshot\"}");
	assert_int_equal(a.status, 201);
	snprintf(k1, sizeof(k1), "%s", str(a.j, "snapshotID"));
	assert_true(store_snapshot_id_valid(k1));
	assert_int_equal(json_array_size(json_object_get(a.j, "names")), 1);
	assert_string_equal(json_string_value(json_array_get(json_object_get(a.j, "names"), 0)), "my-snapshot");
	answer_free(&a);
	call(&a, key_a, 1, "POST", p, "{}");
	assert_int_equal(a.status, 201);
	snprintf(k2, sizeof(k2), "%s", str(a.j, "snapshotID"));
	assert_int_equal(json_array_size(json_object_get(a.j, "names")), 0);
	answer_free(&a);
	call(&a, key_a, 1, "POST", p, "{\"name\":\"bad name\"}");
	assert_int_equal(a.status, 400);
	assert_int_equal(json_integer_value(json_object_get(a.j, "code")), 400);
	answer_free(&a);
	call(&a, key_a, 1, "POST", "/e2b/sandboxes/snope/snapshots", "{}");
	assert_int_equal(a.status, 404);
	answer_free(&a);
	/* listSnapshots: pages with x-next-token, filters. */
	snprintf(p, sizeof(p), "/e2b/snapshots?sandboxID=%s&limit=1", e2b_id);
	call(&a, key_a, 1, "GET", p, NULL);
	assert_int_equal(a.status, 200);
	assert_int_equal(json_array_size(a.j), 1);
	assert_string_equal(str(json_array_get(a.j, 0), "snapshotID"), k2);
	assert_true(a.next_token[0]);
	snprintf(p, sizeof(p), "/e2b/snapshots?sandboxID=%s&limit=1&nextToken=%s", e2b_id, a.next_token);
	answer_free(&a);
	call(&a, key_a, 1, "GET", p, NULL);
	assert_int_equal(json_array_size(a.j), 1);
	assert_string_equal(str(json_array_get(a.j, 0), "snapshotID"), k1);
	assert_false(a.next_token[0]);
	answer_free(&a);
	call(&a, key_a, 1, "GET", "/e2b/snapshots?name=my-snapshot", NULL);
	assert_int_equal(json_array_size(a.j), 1);
	answer_free(&a);
	snprintf(p, sizeof(p), "/e2b/snapshots?name=%s", k2);
	call(&a, key_a, 1, "GET", p, NULL);
	assert_int_equal(json_array_size(a.j), 1);
	answer_free(&a);
	call(&a, key_b, 1, "GET", p, NULL);
	assert_int_equal(json_array_size(a.j), 0);
	answer_free(&a);
	/* Sandbox.create(snapshotId): the templateID is the snapshot's id. */
	snprintf(p, sizeof(p), "{\"templateID\":\"%s\",\"timeout\":30}", k1);
	call(&a, key_a, 1, "POST", "/e2b/v2/sandboxes", p);
	assert_int_equal(a.status, 201);
	assert_string_equal(str(a.j, "templateID"), k1);
	assert_int_equal(strlen(str(a.j, "envdAccessToken")), 64);
	assert_int_equal(store_session_get(st, str(a.j, "sandboxID"), "acme", &c), 0);
	assert_string_equal(c.from_snapshot, k1);
	assert_int_equal(c.max_lifetime_s, 30);
	answer_free(&a);
	snprintf(p, sizeof(p), "{\"templateID\":\"%s\",\"envVars\":{\"A\":\"b\"}}", k1);
	call(&a, key_a, 1, "POST", "/e2b/v2/sandboxes", p);
	assert_int_equal(a.status, 400);
	answer_free(&a);
	snprintf(p, sizeof(p), "{\"templateID\":\"%s\"}", k1);
	call(&a, key_b, 1, "POST", "/e2b/v2/sandboxes", p);
	assert_int_equal(a.status, 404);
	answer_free(&a);
	/* fork: 201, one entry per child. */
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s/fork", e2b_id);
	call(&a, key_a, 1, "POST", p, "{\"count\":2,\"timeout\":45}");
	assert_int_equal(a.status, 201);
	assert_int_equal(json_array_size(a.j), 2);
	json_array_foreach(a.j, i, x) {
		json_t *sb = json_object_get(x, "sandbox");

		assert_non_null(sb);
		assert_int_equal(strlen(str(sb, "sandboxID")), 33);
		assert_int_equal(strlen(str(sb, "envdAccessToken")), 64);
		assert_string_equal(str(sb, "envdVersion"), E2B_ENVD_VERSION);
		assert_int_equal(store_session_get(st, str(sb, "sandboxID"), "acme", &c), 0);
		assert_int_equal(c.max_lifetime_s, 45);
		assert_int_equal(c.auto_pause, 1);
		assert_true(c.has_e2b_token);
	}
	answer_free(&a);
	call(&a, key_a, 1, "POST", p, "{\"count\":0}");
	assert_int_equal(a.status, 400);
	answer_free(&a);
	call(&a, key_b, 1, "POST", p, "{}");
	assert_int_equal(a.status, 404);
	answer_free(&a);
	/* A refused child: an error entry with its HTTP status as the code. */
	{
		struct quota q;

		assert_int_equal(store_customer_quota(st, "acme", &q), 0);
		q.max_running = 5; /* the parent, one from k1, two forks: room for one */
		assert_int_equal(store_customer_set_quota(st, "acme", &q, NULL), 0);
	}
	call(&a, key_a, 1, "POST", p, "{\"count\":2}");
	assert_int_equal(a.status, 201);
	assert_int_equal(json_array_size(a.j), 2);
	assert_non_null(json_object_get(json_array_get(a.j, 0), "sandbox"));
	assert_int_equal(json_integer_value(json_object_get(json_object_get(json_array_get(a.j, 1), "error"), "code")),
			 429);
	answer_free(&a);
	/* deleteSnapshot: DELETE /templates/{id}; again is not found. */
	snprintf(p, sizeof(p), "/e2b/templates/%s", k2);
	call(&a, key_b, 1, "DELETE", p, NULL);
	assert_int_equal(a.status, 404);
	answer_free(&a);
	call(&a, key_a, 1, "DELETE", p, NULL);
	assert_int_equal(a.status, 204);
	answer_free(&a);
	call(&a, key_a, 1, "DELETE", p, NULL);
	assert_int_equal(a.status, 404);
	answer_free(&a);
	snprintf(p, sizeof(p), "/e2b/snapshots/%s", k1);
	call(&a, key_a, 1, "DELETE", p, NULL);
	assert_int_equal(a.status, 204);
	answer_free(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_snapshot_take_get_list, setup, teardown),
		cmocka_unit_test_setup_teardown(test_start_from_snapshot, setup, teardown),
		cmocka_unit_test_setup_teardown(test_snapshot_quotas, setup, teardown),
		cmocka_unit_test_setup_teardown(test_snapshot_failures, setup, teardown),
		cmocka_unit_test_setup_teardown(test_delete_while_used, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fork, setup, teardown),
		cmocka_unit_test_setup_teardown(test_e2b, setup, teardown),
	};
	char cmd[300];
	int r;

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	curl_global_init(CURL_GLOBAL_DEFAULT);
	r = cmocka_run_group_tests(tests, NULL, NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
	return r;
}
