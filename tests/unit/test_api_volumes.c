/* test_api_volumes: volumes through kiln-api's HTTP server on loopback,
 * without VMs: a real store and scheduler, hosts answered by
 * fake_host_ops.h's rules with what they were sent recorded. Checks
 * POST/GET/DELETE /v1/volumes (fields, defaults, every bad input's 400,
 * names unique per customer, max_volumes and max_volume_mib, another
 * customer's 404s, the bytes a host reads, deletion refused while mounted,
 * asked of a live host first and undone when it fails, 503 with no live
 * host), sessions with volumes (what the host's spec gets, the session
 * JSON, the one-writer rule: a second read-write mount 409 volume_busy
 * before any host is asked, read-only ones beside it, a paused writer
 * still holding it, a refused create freeing it), snapshot and fork
 * refused with a read-write volume before the host is asked, a snapshot's
 * children mounting its read-only volumes, a destroy the host answers 503
 * s3_unavailable keeping the session, and E2B's mapping (POST/GET/DELETE
 * /volumes, volumeMounts, /volumecontent's 404). */
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

#define API_ENV_DIR "/tmp/kiln-test-api-volumes.XXXXXX"
#include "api_http_env.h"

/* ---- the tests ---- */

/* A volume of key's customer: its id. */
static void volume(const char *key, const char *body, char id[40])
{
	struct answer a;

	call(&a, key, 0, "POST", "/v1/volumes", body);
	if (a.status != 201)
		fail_msg("volume: %ld %.*s", a.status, (int)a.raw.len, a.raw.p ? a.raw.p : "");
	snprintf(id, 40, "%s", str(a.j, "id"));
	answer_free(&a);
}

static void test_volume_crud(void **state)
{
	struct answer a;
	struct quota q;
	char v1[40], v2[40], p[200], key_c[128];

	call(&a, key_a, 0, "POST", "/v1/volumes", "{\"name\":\"data\"}");
	assert_int_equal(a.status, 201);
	snprintf(v1, sizeof(v1), "%s", str(a.j, "id"));
	assert_true(store_volume_id_valid(v1));
	assert_string_equal(str(a.j, "name"), "data");
	assert_int_equal(json_integer_value(json_object_get(a.j, "size_mib")), 1024);
	assert_true(json_integer_value(json_object_get(a.j, "created_ms")) > 0);
	assert_int_equal(json_array_size(json_object_get(a.j, "mounted_by")), 0);
	answer_free(&a);
	volume(key_a, "{\"name\":\"cache.v2\",\"size_mib\":16}", v2);
	/* Names are the customer's own: taken here, free for another. */
	expect(key_a, "POST", "/v1/volumes", "{\"name\":\"data\"}", 409, "conflict");
	expect(key_b, "POST", "/v1/volumes", "{\"name\":\"data\"}", 201, NULL);
	/* Bad input: a clear 400 each. */
	expect(key_a, "POST", "/v1/volumes", "{}", 400, "invalid_request");
	expect(key_a, "POST", "/v1/volumes", "{\"name\":\"a b\"}", 400, "invalid_request");
	expect(key_a, "POST", "/v1/volumes", "{\"name\":\"\"}", 400, "invalid_request");
	expect(key_a, "POST", "/v1/volumes", "{\"name\":7}", 400, "invalid_request");
	expect(key_a, "POST", "/v1/volumes", "{\"name\":\"x\",\"size_mib\":15}", 400, "invalid_request");
	expect(key_a, "POST", "/v1/volumes", "{\"name\":\"x\",\"size_mib\":65537}", 400, "invalid_request");
	expect(key_a, "POST", "/v1/volumes", "{\"name\":\"x\",\"size_mib\":\"1\"}", 400, "invalid_request");
	expect(key_a, "POST", "/v1/volumes", "{\"name\":\"x\",\"size\":1}", 400, "invalid_request");
	expect(key_a, "POST", "/v1/volumes", "[1]", 400, "invalid_request");
	expect(key_a, "POST", "/v1/volumes", "{", 400, "invalid_json");
	/* Over max_volume_mib (default 10240): 400 over_quota. */
	expect(key_a, "POST", "/v1/volumes", "{\"name\":\"x\",\"size_mib\":20000}", 400, "over_quota");
	expect(key_a, "PUT", "/v1/volumes", NULL, 405, "method_not_allowed");
	/* The list: newest first; by name. */
	call(&a, key_a, 0, "GET", "/v1/volumes", NULL);
	assert_int_equal(a.status, 200);
	assert_int_equal(json_array_size(json_object_get(a.j, "volumes")), 2);
	assert_string_equal(str(json_array_get(json_object_get(a.j, "volumes"), 0), "id"), v2);
	answer_free(&a);
	call(&a, key_a, 0, "GET", "/v1/volumes?name=data", NULL);
	assert_int_equal(json_array_size(json_object_get(a.j, "volumes")), 1);
	assert_string_equal(str(json_array_get(json_object_get(a.j, "volumes"), 0), "id"), v1);
	answer_free(&a);
	expect(key_a, "GET", "/v1/volumes?name=a%20b", NULL, 400, "invalid_request");
	/* One, by id or name, with the bytes a host reads (null: never written). */
	snprintf(p, sizeof(p), "/v1/volumes/%s?customer=acme", v1);
	fake_rule("GET", NULL, p, 200, "{\"id\":\"x\",\"exists\":true,\"bytes\":4096,\"stored_bytes\":100}");
	snprintf(p, sizeof(p), "/v1/volumes/%s", v1);
	call(&a, key_a, 0, "GET", p, NULL);
	assert_int_equal(a.status, 200);
	assert_string_equal(str(a.j, "name"), "data");
	assert_int_equal(json_integer_value(json_object_get(a.j, "bytes")), 4096);
	answer_free(&a);
	call(&a, key_a, 0, "GET", "/v1/volumes/cache.v2", NULL);
	assert_int_equal(a.status, 200);
	assert_string_equal(str(a.j, "id"), v2);
	assert_true(json_is_null(json_object_get(a.j, "bytes")));
	answer_free(&a);
	/* Another customer's: 404 on every path. */
	expect(key_b, "GET", p, NULL, 404, "not_found");
	expect(key_b, "DELETE", p, NULL, 404, "not_found");
	expect(key_a, "GET", "/v1/volumes/nope", NULL, 404, "not_found");
	/* Delete: the host deletes its objects, then it is gone. */
	fake_rule("DELETE", NULL, "/v1/volumes/", 200, "{\"deleted\":3}");
	call(&a, key_a, 0, "DELETE", p, NULL);
	assert_int_equal(a.status, 200);
	assert_string_equal(str(a.j, "id"), v1);
	assert_true(json_is_true(json_object_get(a.j, "deleted")));
	answer_free(&a);
	snprintf(p, sizeof(p), "/v1/volumes/%s?customer=acme", v1);
	assert_int_equal(fake_count("DELETE", NULL, p), 1);
	snprintf(p, sizeof(p), "/v1/volumes/%s", v1);
	expect(key_a, "GET", p, NULL, 404, "not_found");
	expect(key_a, "DELETE", p, NULL, 404, "not_found");
	/* Its name is free again. */
	expect(key_a, "POST", "/v1/volumes", "{\"name\":\"data\"}", 201, NULL);
	/* max_volumes: 429; shown and set like the other quotas. */
	quota_defaults(&q);
	q.max_volumes = 1;
	q.max_volume_mib = 100;
	customer("cee", &q, key_c);
	volume(key_c, "{\"name\":\"one\",\"size_mib\":100}", v1);
	call(&a, key_c, 0, "POST", "/v1/volumes", "{\"name\":\"two\",\"size_mib\":16}");
	assert_int_equal(a.status, 429);
	assert_string_equal(err_code(&a), "quota_exceeded");
	assert_non_null(strstr(str(json_object_get(a.j, "error"), "message"), "max_volumes"));
	answer_free(&a);
	call(&a, key_c, 0, "GET", "/v1/usage", NULL);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(a.j, "quotas"), "max_volumes")), 1);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(a.j, "quotas"), "max_volume_mib")), 100);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(a.j, "usage"), "volumes")), 1);
	answer_free(&a);
}

/* Deleting asks a live host first: none live, or its failure, and
 * nothing changes. */
static void test_volume_delete_hosts(void **state)
{
	char v1[40], p[200];
	struct answer a;

	volume(key_a, "{\"name\":\"data\"}", v1);
	snprintf(p, sizeof(p), "/v1/volumes/%s", v1);
	fake_rule("DELETE", NULL, "/v1/volumes/", -1, NULL);
	expect(key_a, "DELETE", p, NULL, 503, "host_unavailable");
	expect(key_a, "GET", p, NULL, 200, NULL);
	fake_rule("DELETE", NULL, "/v1/volumes/", 500, "{\"error\":{\"code\":\"s3_error\",\"message\":\"no\"}}");
	expect(key_a, "DELETE", p, NULL, 503, "host_unavailable");
	call(&a, key_a, 0, "GET", "/v1/volumes", NULL);
	assert_int_equal(json_array_size(json_object_get(a.j, "volumes")), 1);
	answer_free(&a);
	/* No host live: 503 before anything is marked, no host asked. */
	clock_advance(20000);
	sched_tick(sc);
	assert_int_equal(sched_host_state(sc, "h1", NULL), 0);
	{
		int before = fake_count("DELETE", NULL, "/v1/volumes/");

		expect(key_a, "DELETE", p, NULL, 503, "host_unavailable");
		assert_int_equal(fake_count("DELETE", NULL, "/v1/volumes/"), before);
	}
	expect(key_a, "GET", p, NULL, 200, NULL);
}

static void test_volume_mounts(void **state)
{
	struct sessions_outcome o = { 0 };
	struct answer a;
	char v1[40], v2[40], sa[40], sc_[40], sd[40], k[40], p[300], body[300];
	json_t *b, *vols;
	int creates;

	volume(key_a, "{\"name\":\"data\",\"size_mib\":2048}", v1);
	volume(key_a, "{\"name\":\"ref\"}", v2);
	/* Session A writes data and reads ref. */
	call(&a, key_a, 0, "POST", "/v1/sessions",
	     "{\"volumes\":[{\"name\":\"data\",\"path\":\"/data\"},{\"name\":\"ref\",\"path\":\"/mnt/ref\",\"read_only\":true}]}");
	assert_int_equal(a.status, 201);
	snprintf(sa, sizeof(sa), "%s", str(a.j, "id"));
	vols = json_object_get(a.j, "volumes");
	assert_int_equal(json_array_size(vols), 2);
	assert_string_equal(str(json_array_get(vols, 0), "name"), "data");
	assert_string_equal(str(json_array_get(vols, 0), "id"), v1);
	assert_string_equal(str(json_array_get(vols, 0), "path"), "/data");
	assert_true(json_is_false(json_object_get(json_array_get(vols, 0), "read_only")));
	assert_true(json_is_true(json_object_get(json_array_get(vols, 1), "read_only")));
	answer_free(&a);
	/* What its host got: ids, paths, modes and sizes. */
	b = json_loads(fake_nth_body("POST", "/v1/sessions", 0), 0, NULL);
	vols = json_object_get(json_object_get(b, "spec"), "volumes");
	assert_int_equal(json_array_size(vols), 2);
	assert_string_equal(str(json_array_get(vols, 0), "id"), v1);
	assert_string_equal(str(json_array_get(vols, 0), "path"), "/data");
	assert_true(json_is_false(json_object_get(json_array_get(vols, 0), "read_only")));
	assert_int_equal(json_integer_value(json_object_get(json_array_get(vols, 0), "size_mib")), 2048);
	assert_null(json_object_get(json_array_get(vols, 0), "name"));
	assert_string_equal(str(json_array_get(vols, 1), "id"), v2);
	assert_int_equal(json_integer_value(json_object_get(json_array_get(vols, 1), "size_mib")), 1024);
	json_decref(b);
	/* A second writer: 409 volume_busy, no host asked, nothing left. */
	creates = fake_count("POST", NULL, "/v1/sessions");
	call(&a, key_a, 0, "POST", "/v1/sessions", "{\"volumes\":[{\"name\":\"data\",\"path\":\"/w\"}]}");
	assert_int_equal(a.status, 409);
	assert_string_equal(err_code(&a), "volume_busy");
	assert_non_null(strstr(str(json_object_get(a.j, "error"), "message"), sa));
	answer_free(&a);
	assert_int_equal(fake_count("POST", NULL, "/v1/sessions"), creates);
	/* Readers beside it. */
	session(key_a, "{\"volumes\":[{\"name\":\"data\",\"path\":\"/data\",\"read_only\":true}]}", sc_);
	/* Bad mounts: 400 each, before any host. */
	expect(key_a, "POST", "/v1/sessions", "{\"volumes\":[{\"name\":\"nope\",\"path\":\"/x\"}]}", 400,
	       "invalid_request");
	expect(key_b, "POST", "/v1/sessions", "{\"volumes\":[{\"name\":\"data\",\"path\":\"/x\",\"read_only\":true}]}",
	       400, "invalid_request");
	expect(key_a, "POST", "/v1/sessions", "{\"volumes\":[{\"name\":\"ref\",\"path\":\"/proc/x\"}]}", 400,
	       "invalid_request");
	expect(key_a, "POST", "/v1/sessions", "{\"volumes\":[{\"name\":\"ref\",\"path\":\"/\"}]}", 400, "invalid_request");
	expect(key_a, "POST", "/v1/sessions", "{\"volumes\":[{\"name\":\"ref\",\"path\":\"/a/../b\"}]}", 400,
	       "invalid_request");
	expect(key_a, "POST", "/v1/sessions",
	       "{\"volumes\":[{\"name\":\"ref\",\"path\":\"/a\",\"read_only\":true},{\"name\":\"ref\",\"path\":\"/b\"}]}",
	       400, "invalid_request");
	expect(key_a, "POST", "/v1/sessions",
	       "{\"volumes\":[{\"name\":\"ref\",\"path\":\"/a\",\"read_only\":true},{\"name\":\"data\",\"path\":\"/a/b\","
	       "\"read_only\":true}]}",
	       400, "invalid_request");
	expect(key_a, "POST", "/v1/sessions",
	       "{\"volumes\":[{\"name\":\"a\",\"path\":\"/a\"},{\"name\":\"b\",\"path\":\"/b\"},{\"name\":\"c\",\"path\":\"/c\"}]}",
	       400, "invalid_request");
	expect(key_a, "POST", "/v1/sessions", "{\"volumes\":[{\"name\":\"ref\",\"path\":\"/a\",\"read_only\":1}]}", 400,
	       "invalid_request");
	expect(key_a, "POST", "/v1/sessions", "{\"volumes\":[{\"name\":\"ref\",\"path\":\"/a\",\"size_mib\":1}]}", 400,
	       "invalid_request");
	expect(key_a, "POST", "/v1/sessions", "{\"volumes\":{}}", 400, "invalid_request");
	/* The volume shows its mounts; it cannot be deleted while they last. */
	snprintf(p, sizeof(p), "/v1/volumes/%s", v1);
	call(&a, key_a, 0, "GET", p, NULL);
	assert_int_equal(json_array_size(json_object_get(a.j, "mounted_by")), 2);
	assert_string_equal(str(json_array_get(json_object_get(a.j, "mounted_by"), 0), "session_id"), sa);
	assert_true(json_is_false(json_object_get(json_array_get(json_object_get(a.j, "mounted_by"), 0), "read_only")));
	answer_free(&a);
	fake_rule("DELETE", NULL, "/v1/volumes/", 200, "{\"deleted\":0}");
	expect(key_a, "DELETE", p, NULL, 409, "volume_busy");
	assert_int_equal(fake_count("DELETE", NULL, "/v1/volumes/"), 0);
	/* Snapshot and fork of the writer: refused before its host is asked. */
	checkpoint_rule(sa, 200, CHECKPOINT_OK);
	snprintf(p, sizeof(p), "/v1/sessions/%s/snapshots", sa);
	expect(key_a, "POST", p, "{}", 409, "volume_attached");
	snprintf(p, sizeof(p), "/v1/sessions/%s/fork", sa);
	expect(key_a, "POST", p, "{\"count\":2}", 409, "volume_attached");
	snprintf(p, sizeof(p), "/v1/sessions/%s/checkpoint", sa);
	assert_int_equal(fake_count("POST", NULL, p), 0);
	/* A reader's snapshot: its children mount the volume read-only too. */
	checkpoint_rule(sc_, 200, CHECKPOINT_OK);
	snprintf(p, sizeof(p), "/v1/sessions/%s/snapshots", sc_);
	call(&a, key_a, 0, "POST", p, "{}");
	assert_int_equal(a.status, 201);
	snprintf(k, sizeof(k), "%s", str(a.j, "id"));
	answer_free(&a);
	snprintf(body, sizeof(body), "{\"snapshot\":\"%s\"}", k);
	call(&a, key_a, 0, "POST", "/v1/sessions", body);
	assert_int_equal(a.status, 201);
	vols = json_object_get(a.j, "volumes");
	assert_int_equal(json_array_size(vols), 1);
	assert_string_equal(str(json_array_get(vols, 0), "name"), "data");
	assert_true(json_is_true(json_object_get(json_array_get(vols, 0), "read_only")));
	snprintf(sd, sizeof(sd), "%s", str(a.j, "id"));
	answer_free(&a);
	snprintf(body, sizeof(body), "{\"snapshot\":\"%s\",\"volumes\":[]}", k);
	expect(key_a, "POST", "/v1/sessions", body, 400, "invalid_request");
	snprintf(p, sizeof(p), "/v1/volumes/%s", v1);
	call(&a, key_a, 0, "GET", p, NULL);
	assert_int_equal(json_array_size(json_object_get(a.j, "mounted_by")), 3);
	answer_free(&a);
	/* A destroy whose upload S3 refuses: the session keeps running. */
	snprintf(p, sizeof(p), "/v1/sessions/%s", sa);
	fake_rule("DELETE", NULL, p, 503, "{\"error\":{\"code\":\"s3_unavailable\",\"message\":\"S3 is down\"}}");
	call(&a, key_a, 0, "DELETE", p, NULL);
	assert_int_equal(a.status, 503);
	assert_string_equal(err_code(&a), "s3_unavailable");
	answer_free(&a);
	call(&a, key_a, 0, "GET", p, NULL);
	assert_string_equal(str(a.j, "state"), "running");
	answer_free(&a);
	/* Paused, the writer still holds it. */
	snprintf(p, sizeof(p), "/v1/sessions/%s/pause", sa);
	fake_rule("POST", NULL, p, 200, "{\"snapshot\":{\"bytes\":1}}");
	sessions_pause(ss, sa, "paused", &o);
	assert_int_equal(o.status, 200);
	expect(key_a, "POST", "/v1/sessions", "{\"volumes\":[{\"name\":\"data\",\"path\":\"/w\"}]}", 409, "volume_busy");
	/* Destroyed: another may write; a create its host refuses frees it. */
	snprintf(p, sizeof(p), "/v1/sessions/%s", sa);
	fake_rule("DELETE", NULL, p, 200, "{}");
	expect(key_a, "DELETE", p, NULL, 200, NULL);
	fake_rule("POST", NULL, "/v1/sessions", 500, "{\"error\":{\"code\":\"vm_error\",\"message\":\"cannot mount\"}}");
	expect(key_a, "POST", "/v1/sessions", "{\"volumes\":[{\"name\":\"data\",\"path\":\"/w\"}]}", 500, "vm_error");
	fake_rule("POST", NULL, "/v1/sessions", 201, "{}");
	session(key_a, "{\"volumes\":[{\"name\":\"data\",\"path\":\"/w\"}]}", sa);
	/* Every mount gone (destroyed): the volume can be deleted. */
	{
		const char *ids[] = { sa, sc_, sd };

		for (int i = 0; i < 3; i++) {
			snprintf(p, sizeof(p), "/v1/sessions/%s", ids[i]);
			expect(key_a, "DELETE", p, NULL, 200, NULL);
		}
	}
	snprintf(p, sizeof(p), "/v1/volumes/%s", v1);
	expect(key_a, "DELETE", p, NULL, 200, NULL);
	/* The destroyed sessions still name it. */
	snprintf(p, sizeof(p), "/v1/sessions/%s", sd);
	call(&a, key_a, 0, "GET", p, NULL);
	assert_int_equal(json_array_size(json_object_get(a.j, "volumes")), 1);
	answer_free(&a);
	/* A snapshot whose read-only volume is deleted since: no more children. */
	expect(key_a, "POST", "/v1/sessions", body, 400, "invalid_request");
}

/* ---- E2B ---- */

static void test_e2b_volumes(void **state)
{
	struct answer a;
	char vid[40], sid[40], e2b_id[40], canon[40], p[200];

	call(&a, key_a, 1, "POST", "/e2b/volumes", "{\"name\":\"work\"}");
	assert_int_equal(a.status, 201);
	snprintf(vid, sizeof(vid), "%s", str(a.j, "volumeID"));
	assert_true(store_volume_id_valid(vid));
	assert_string_equal(str(a.j, "name"), "work");
	assert_true(json_is_null(json_object_get(a.j, "token")));
	assert_true(json_is_null(json_object_get(a.j, "domain")));
	answer_free(&a);
	call(&a, key_a, 1, "POST", "/e2b/volumes", "{\"name\":\"work\"}");
	assert_int_equal(a.status, 409);
	assert_int_equal(json_integer_value(json_object_get(a.j, "code")), 409);
	answer_free(&a);
	call(&a, key_a, 1, "POST", "/e2b/volumes", "{\"name\":\"bad name\"}");
	assert_int_equal(a.status, 400);
	answer_free(&a);
	call(&a, key_a, 1, "GET", "/e2b/volumes", NULL);
	assert_int_equal(a.status, 200);
	assert_int_equal(json_array_size(a.j), 1);
	assert_string_equal(str(json_array_get(a.j, 0), "volumeID"), vid);
	assert_string_equal(str(json_array_get(a.j, 0), "name"), "work");
	answer_free(&a);
	snprintf(p, sizeof(p), "/e2b/volumes/%s", vid);
	call(&a, key_a, 1, "GET", p, NULL);
	assert_int_equal(a.status, 200);
	assert_string_equal(str(a.j, "volumeID"), vid);
	answer_free(&a);
	call(&a, key_b, 1, "GET", p, NULL);
	assert_int_equal(a.status, 404);
	answer_free(&a);
	/* volumeMounts: read-write mounts by name. */
	call(&a, key_a, 1, "POST", "/e2b/v2/sandboxes",
	     "{\"templateID\":\"base\",\"volumeMounts\":[{\"name\":\"work\",\"path\":\"/home/user/work\"}]}");
	assert_int_equal(a.status, 201);
	snprintf(e2b_id, sizeof(e2b_id), "%s", str(a.j, "sandboxID"));
	snprintf(sid, sizeof(sid), "%s", store_session_id_canon(e2b_id, canon));
	answer_free(&a);
	{
		json_t *j = store_session_json(st, sid, NULL), *v = json_array_get(json_object_get(j, "volumes"), 0);

		assert_string_equal(str(v, "id"), vid);
		assert_string_equal(str(v, "path"), "/home/user/work");
		assert_true(json_is_false(json_object_get(v, "read_only")));
		json_decref(j);
	}
	/* getInfo's volumeMounts. */
	snprintf(p, sizeof(p), "/e2b/sandboxes/%s", e2b_id);
	call(&a, key_a, 1, "GET", p, NULL);
	assert_int_equal(a.status, 200);
	assert_int_equal(json_array_size(json_object_get(a.j, "volumeMounts")), 1);
	assert_string_equal(str(json_array_get(json_object_get(a.j, "volumeMounts"), 0), "name"), "work");
	assert_string_equal(str(json_array_get(json_object_get(a.j, "volumeMounts"), 0), "path"), "/home/user/work");
	answer_free(&a);
	snprintf(p, sizeof(p), "/e2b/volumes/%s", vid);
	call(&a, key_a, 1, "POST", "/e2b/v2/sandboxes", "{\"volumeMounts\":[{\"name\":\"work\",\"path\":\"/w\"}]}");
	assert_int_equal(a.status, 409);
	answer_free(&a);
	call(&a, key_a, 1, "POST", "/e2b/v2/sandboxes", "{\"volumeMounts\":[{\"name\":\"nope\",\"path\":\"/w\"}]}");
	assert_int_equal(a.status, 400);
	answer_free(&a);
	call(&a, key_a, 1, "POST", "/e2b/v2/sandboxes", "{\"volumeMounts\":[{\"name\":\"work\"}]}");
	assert_int_equal(a.status, 400);
	answer_free(&a);
	/* Busy while the sandbox lives; 204 once killed; then 404. */
	call(&a, key_a, 1, "DELETE", p, NULL);
	assert_int_equal(a.status, 409);
	answer_free(&a);
	{
		char kp[200];

		snprintf(kp, sizeof(kp), "/e2b/sandboxes/%s", e2b_id);
		call(&a, key_a, 1, "DELETE", kp, NULL);
		assert_int_equal(a.status, 204);
		answer_free(&a);
	}
	fake_rule("DELETE", NULL, "/v1/volumes/", 200, "{\"deleted\":2}");
	call(&a, key_a, 1, "DELETE", p, NULL);
	assert_int_equal(a.status, 204);
	answer_free(&a);
	call(&a, key_a, 1, "DELETE", p, NULL);
	assert_int_equal(a.status, 404);
	answer_free(&a);
	/* The volume file API is not kiln's: a 404 that says so. */
	snprintf(p, sizeof(p), "/e2b/volumecontent/%s/file?path=/a", vid);
	call(&a, key_a, 1, "GET", p, NULL);
	assert_int_equal(a.status, 404);
	assert_non_null(strstr(str(a.j, "message"), "volumecontent"));
	answer_free(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_volume_crud, setup, teardown),
		cmocka_unit_test_setup_teardown(test_volume_delete_hosts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_volume_mounts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_e2b_volumes, setup, teardown),
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
