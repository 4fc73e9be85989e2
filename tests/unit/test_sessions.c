/* test_sessions: kiln-api's session rows in a temporary SQLite store: ids,
 * the running quota shared with tasks (checked in the same transaction as
 * the insert or the resume, refused naming the limit), compare-and-set
 * transitions and their timestamps, pause freeing the quota, resume from
 * paused and from error with a snapshot only, discard, touch, the reaper's
 * list, listing with filters and pages, customer isolation, the public
 * JSON, and that a reopen keeps everything; the create and exec body
 * parsers. */
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

#include "quota.h"
#include "request.h"
#include "store.h"

static char dir[] = "/tmp/kiln-test-sessions.XXXXXX";
static char path[256];
static int seq;

static int setup(void **state)
{
	snprintf(path, sizeof(path), "%s/api-%d.db", dir, ++seq);
	return 0;
}

static struct store *open_ok(void)
{
	struct kiln_err err = { .code = "" };
	struct store *s = store_open(path, &err);

	if (!s)
		fail_msg("store_open(%s): %s", path, err.message);
	return s;
}

static void customer(struct store *s, const char *id, const struct quota *q)
{
	struct kiln_err err = { .code = "" };
	struct quota d;

	quota_defaults(&d);
	if (store_customer_create(s, id, id, q ? q : &d, &err) != 0)
		fail_msg("customer %s: %s", id, err.message);
}

#define SPEC "{\"limits\":{\"vcpus\":1,\"memory_mib\":256,\"output_mib\":64},\"network\":{\"egress\":\"none\"}}"

/* A session of cust on host h1; the return value of store_session_create. */
static int create(struct store *s, const char *cust, unsigned vcpus, unsigned mem, char id[40], struct kiln_err *err)
{
	struct store_session_new n = {
		.customer = cust, .spec_json = SPEC, .metadata_json = "{\"who\":\"test\"}", .vcpus = vcpus,
		.memory_mib = mem, .idle_timeout_s = 60, .max_lifetime_s = 600, .host_id = "h1",
	};

	return store_session_create(s, &n, id, err);
}

static void create_ok(struct store *s, const char *cust, char id[40])
{
	struct kiln_err err = { .code = "" };

	if (create(s, cust, 1, 256, id, &err) != 0)
		fail_msg("session create: %s", err.message);
}

static const char *jstr(json_t *j, const char *k)
{
	return json_string_value(json_object_get(j, k));
}

static void test_create_and_quota(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *s = open_ok();
	struct store_session ss;
	struct quota q;
	struct usage u;
	char a[40], b[40], c[40], t[40];
	json_t *j;

	quota_defaults(&q);
	q.max_running = 2;
	q.max_memory_mib = 1024;
	customer(s, "acme", &q);
	create_ok(s, "acme", a);
	assert_int_equal(strlen(a), 34);
	assert_memory_equal(a, "s_", 2);
	assert_int_equal(strspn(a + 2, "0123456789abcdef"), 32);
	assert_int_equal(store_session_get(s, a, "acme", &ss), 0);
	assert_int_equal(ss.state, SESSION_STARTING);
	assert_string_equal(ss.host_id, "h1");
	assert_int_equal(ss.idle_timeout_s, 60);
	assert_int_equal(ss.has_snapshot, 0);
	/* A starting session holds its VM: counted like a running task. */
	assert_int_equal(store_customer_usage(s, "acme", &u), 0);
	assert_int_equal(u.running, 1);
	assert_int_equal(u.sessions, 1);
	assert_int_equal(u.memory_mib, 256);
	/* A task and a session together reach max_running 2. */
	assert_int_equal(store_task_insert(s, "acme", "{\"argv\":[\"true\"]}", NULL, 1, 256, NULL, "h", t, &err), 0);
	assert_int_equal(store_task_schedule(s, t, "h1"), 1);
	assert_int_equal(create(s, "acme", 1, 256, b, &err), -EDQUOT);
	assert_string_equal(err.code, "quota_exceeded");
	assert_non_null(strstr(err.message, "max_running: 2 tasks and sessions are running"));
	/* ... and the task waits for the session too: the quota is full. */
	assert_int_equal(store_task_insert(s, "acme", "{\"argv\":[\"true\"]}", NULL, 1, 256, NULL, "h", b, &err), 0);
	assert_int_equal(store_task_schedule(s, b, "h1"), -EDQUOT);
	assert_int_equal(store_task_finish(s, t, TASK_SUCCEEDED, "exited", NULL), 1);
	/* Memory: 256 in use + 1024 > 1024. */
	assert_int_equal(create(s, "acme", 1, 1024, c, &err), -EDQUOT);
	assert_non_null(strstr(err.message, "max_memory_mib"));
	create_ok(s, "acme", c);
	assert_string_not_equal(a, c);
	/* Another customer sees none of it. */
	customer(s, "beta", NULL);
	assert_int_equal(store_session_get(s, a, "beta", &ss), -ENOENT);
	assert_null(store_session_json(s, a, "beta"));
	assert_int_equal(store_customer_usage(s, "beta", &u), 0);
	assert_int_equal(u.running + u.sessions, 0);
	j = store_session_json(s, a, NULL);
	assert_non_null(j);
	assert_string_equal(jstr(j, "state"), "starting");
	assert_string_equal(jstr(j, "customer"), "acme");
	assert_string_equal(jstr(j, "host"), "h1");
	assert_string_equal(jstr(j, "image"), "default");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "limits"), "memory_mib")), 256);
	assert_string_equal(jstr(json_object_get(j, "network"), "egress"), "none");
	assert_string_equal(jstr(json_object_get(j, "metadata"), "who"), "test");
	assert_true(json_is_null(json_object_get(j, "snapshot")));
	/* Holding a VM: it expires at the earlier of idle (60 s) and lifetime (600 s). */
	assert_int_equal(json_integer_value(json_object_get(j, "expires_at")),
			 json_integer_value(json_object_get(j, "last_active_at")) + 60000);
	json_decref(j);
	store_close(s);
}

static void test_lifecycle(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *s = open_ok();
	struct store_session ss, held[8];
	enum session_state prev;
	struct quota q;
	struct usage u;
	char a[40], b[40];
	json_t *snap, *j;

	quota_defaults(&q);
	q.max_running = 1;
	customer(s, "acme", &q);
	create_ok(s, "acme", a);
	/* Compare-and-set: from a state it is not in, nothing moves. */
	assert_int_equal(store_session_transition(s, a, SESSION_RUNNING, SESSION_PAUSING, NULL, NULL, NULL), 0);
	assert_int_equal(store_session_transition(s, a, SESSION_STARTING, SESSION_RUNNING, NULL, NULL, NULL), 1);
	assert_int_equal(store_session_get(s, a, NULL, &ss), 0);
	assert_int_equal(ss.state, SESSION_RUNNING);
	assert_true(ss.started_ms > 0 && ss.last_active_ms == ss.started_ms);
	/* Only one may hold a VM now. */
	assert_int_equal(create(s, "acme", 1, 256, b, &err), -EDQUOT);
	/* Touch moves last_active forward. */
	usleep(5000);
	assert_int_equal(store_session_touch(s, a), 0);
	{
		struct store_session t2;

		assert_int_equal(store_session_get(s, a, NULL, &t2), 0);
		assert_true(t2.last_active_ms > ss.last_active_ms);
		assert_int_equal(t2.started_ms, ss.started_ms);
	}
	assert_int_equal(store_sessions_holding(s, held, 8), 1);
	assert_string_equal(held[0].id, a);
	/* Not resumable while running. */
	assert_int_equal(store_session_resume_begin(s, a, "acme", "h2", &prev, &err), 0);
	assert_int_equal(prev, SESSION_RUNNING);
	/* Pause: pausing still holds the VM; paused does not, keeps the snapshot. */
	assert_int_equal(store_session_transition(s, a, SESSION_RUNNING, SESSION_PAUSING, NULL, NULL, NULL), 1);
	assert_int_equal(store_customer_usage(s, "acme", &u), 0);
	assert_int_equal(u.running, 1);
	snap = json_pack("{s:s, s:s, s:i}", "bucket", "kiln", "prefix", "acme/sessions/x/", "bytes", 1234);
	assert_int_equal(store_session_transition(s, a, SESSION_PAUSING, SESSION_PAUSED, "", "paused", snap), 1);
	json_decref(snap);
	assert_int_equal(store_customer_usage(s, "acme", &u), 0);
	assert_int_equal(u.running, 0);
	assert_int_equal(u.sessions, 0);
	assert_int_equal(u.paused_sessions, 1);
	assert_int_equal(store_sessions_holding(s, held, 8), 0);
	j = store_session_json(s, a, "acme");
	assert_string_equal(jstr(j, "state"), "paused");
	assert_true(json_is_null(json_object_get(j, "host")));
	assert_true(json_is_null(json_object_get(j, "expires_at")));
	assert_true(json_is_integer(json_object_get(j, "paused_at")));
	assert_string_equal(jstr(j, "end_reason"), "paused");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "snapshot"), "bytes")), 1234);
	json_decref(j);
	/* The freed quota lets another session start; then a resume is refused. */
	create_ok(s, "acme", b);
	assert_int_equal(store_session_resume_begin(s, a, "acme", "h2", &prev, &err), -EDQUOT);
	assert_string_equal(err.code, "quota_exceeded");
	assert_int_equal(store_session_get(s, a, NULL, &ss), 0);
	assert_int_equal(ss.state, SESSION_PAUSED);
	/* b never reached running (its host refused it): discarded. */
	assert_int_equal(store_session_discard(s, b), 1);
	assert_int_equal(store_session_get(s, b, NULL, &ss), -ENOENT);
	assert_int_equal(store_session_discard(s, a), 0); /* only while starting */
	/* Another customer cannot resume it; the owner can, on another host. */
	assert_int_equal(store_session_resume_begin(s, a, "beta", "h2", &prev, &err), 0);
	assert_int_equal(prev, SESSION_STATE_COUNT);
	assert_int_equal(store_session_resume_begin(s, a, "acme", "h2", &prev, &err), 1);
	assert_int_equal(prev, SESSION_PAUSED);
	assert_int_equal(store_session_get(s, a, NULL, &ss), 0);
	assert_int_equal(ss.state, SESSION_RESUMING);
	assert_string_equal(ss.host_id, "h2");
	assert_int_equal(ss.has_snapshot, 1);
	usleep(5000);
	j = store_session_json(s, a, NULL);
	assert_string_equal(jstr(j, "end_reason"), "paused"); /* kept while resuming: a failure goes back */
	json_decref(j);
	assert_int_equal(store_session_transition(s, a, SESSION_RESUMING, SESSION_RUNNING, NULL, "", NULL), 1);
	{
		struct store_session t2;

		assert_int_equal(store_session_get(s, a, NULL, &t2), 0);
		assert_true(t2.started_ms > ss.started_ms); /* the lifetime counts from the resume */
	}
	j = store_session_json(s, a, NULL);
	assert_true(json_is_null(json_object_get(j, "end_reason")));
	assert_true(json_is_null(json_object_get(j, "ended_at")));
	json_decref(j);
	/* Its host is lost: error, but the snapshot of its last pause stays resumable. */
	assert_int_equal(store_session_transition(s, a, SESSION_RUNNING, SESSION_ERROR, NULL, "host_lost", NULL), 1);
	j = store_session_json(s, a, NULL);
	assert_string_equal(jstr(j, "end_reason"), "host_lost");
	assert_true(json_is_integer(json_object_get(j, "ended_at")));
	assert_string_equal(jstr(json_object_get(j, "snapshot"), "prefix"), "acme/sessions/x/");
	json_decref(j);
	assert_int_equal(store_session_resume_begin(s, a, NULL, "h1", &prev, &err), 1);
	assert_int_equal(prev, SESSION_ERROR);
	assert_int_equal(store_session_transition(s, a, SESSION_RESUMING, SESSION_RUNNING, NULL, NULL, NULL), 1);
	assert_int_equal(store_session_transition(s, a, SESSION_RUNNING, SESSION_DESTROYED, "", "deleted", NULL), 1);
	assert_int_equal(store_session_resume_begin(s, a, NULL, "h1", &prev, &err), 0);
	assert_int_equal(prev, SESSION_DESTROYED);
	/* An error without any snapshot is not resumable. */
	create_ok(s, "acme", b);
	assert_int_equal(store_session_transition(s, b, SESSION_STARTING, SESSION_RUNNING, NULL, NULL, NULL), 1);
	assert_int_equal(store_session_transition(s, b, SESSION_RUNNING, SESSION_ERROR, NULL, "host_lost", NULL), 1);
	assert_int_equal(store_session_resume_begin(s, b, NULL, "h1", &prev, &err), 0);
	assert_int_equal(prev, SESSION_ERROR);
	/* Nonsense transitions are refused. */
	assert_int_equal(store_session_transition(s, b, SESSION_ERROR, SESSION_ERROR, NULL, NULL, NULL), -1);
	assert_int_equal(store_session_transition(s, b, SESSION_STATE_COUNT, SESSION_ERROR, NULL, NULL, NULL), -1);
	store_close(s);
}

static void test_list_and_reopen(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *s = open_ok();
	char ids[5][40], *next = NULL, *spec;
	struct quota q;
	json_t *arr;

	quota_defaults(&q);
	q.max_running = 0; /* no limit */
	customer(s, "acme", &q);
	customer(s, "beta", NULL);
	for (int i = 0; i < 5; i++) {
		create_ok(s, "acme", ids[i]);
		assert_int_equal(store_session_transition(s, ids[i], SESSION_STARTING, SESSION_RUNNING, NULL, NULL, NULL),
				 1);
	}
	assert_int_equal(store_session_transition(s, ids[0], SESSION_RUNNING, SESSION_DESTROYED, "", "deleted", NULL),
			 1);
	/* Newest first, destroyed ones left out unless asked for. */
	arr = store_session_list(s, "acme", NULL, 10, NULL, &next, &err);
	assert_non_null(arr);
	assert_int_equal(json_array_size(arr), 4);
	assert_string_equal(jstr(json_array_get(arr, 0), "id"), ids[4]);
	assert_null(next);
	json_decref(arr);
	arr = store_session_list(s, "acme", "all", 10, NULL, &next, &err);
	assert_int_equal(json_array_size(arr), 5);
	json_decref(arr);
	arr = store_session_list(s, "acme", "destroyed", 10, NULL, &next, &err);
	assert_int_equal(json_array_size(arr), 1);
	assert_string_equal(jstr(json_array_get(arr, 0), "id"), ids[0]);
	json_decref(arr);
	/* Pages of two. */
	arr = store_session_list(s, "acme", NULL, 2, NULL, &next, &err);
	assert_int_equal(json_array_size(arr), 2);
	assert_non_null(next);
	json_decref(arr);
	{
		char *cur = next;

		arr = store_session_list(s, "acme", NULL, 2, cur, &next, &err);
		free(cur);
	}
	assert_int_equal(json_array_size(arr), 2);
	assert_string_equal(jstr(json_array_get(arr, 1), "id"), ids[1]);
	assert_null(next);
	json_decref(arr);
	/* Another customer's list is empty; an admin (NULL) sees all. */
	arr = store_session_list(s, "beta", "all", 10, NULL, &next, &err);
	assert_int_equal(json_array_size(arr), 0);
	json_decref(arr);
	arr = store_session_list(s, NULL, "all", 10, NULL, &next, &err);
	assert_int_equal(json_array_size(arr), 5);
	json_decref(arr);
	assert_null(store_session_list(s, "acme", "bogus", 10, NULL, &next, &err));
	assert_string_equal(err.code, "invalid_request");
	assert_null(store_session_list(s, "acme", NULL, 10, "x", &next, &err));
	spec = store_session_spec(s, ids[2]);
	assert_string_equal(spec, SPEC);
	free(spec);
	assert_null(store_session_spec(s, "s_nope"));
	store_close(s);
	/* Everything is on disk. */
	s = open_ok();
	{
		struct store_session ss;
		struct usage u;

		assert_int_equal(store_session_get(s, ids[0], "acme", &ss), 0);
		assert_int_equal(ss.state, SESSION_DESTROYED);
		assert_int_equal(store_customer_usage(s, "acme", &u), 0);
		assert_int_equal(u.sessions, 4);
		assert_int_equal(u.running, 4);
	}
	store_close(s);
}

static void test_request_parsers(void **state)
{
	struct kiln_err err = { .code = "" };
	struct api_session_request r;
	json_t *j;
	const char *b;

	/* Defaults: the task spec's limits, 600 s idle, 3600 s lifetime. */
	assert_int_equal(api_session_request_parse("{}", 2, 0, &r, &err), 0);
	assert_int_equal(r.vcpus, 1);
	assert_int_equal(r.memory_mib, 256);
	assert_int_equal(r.output_mib, 64);
	assert_int_equal(r.idle_timeout_s, 600);
	assert_int_equal(r.max_lifetime_s, 3600);
	assert_null(r.metadata_json);
	assert_string_equal(r.spec_json,
			    "{\"limits\":{\"vcpus\":1,\"memory_mib\":256,\"output_mib\":64},\"network\":{\"egress\":\"none\"}}");
	api_session_request_free(&r);
	b = "{\"image\":\"default\",\"limits\":{\"memory_mib\":1024},\"network\":{\"egress\":\"allow\","
	    "\"allow\":[\"example.org:443\"]},\"idle_timeout_s\":5,\"metadata\":{\"k\":1}}";
	assert_int_equal(api_session_request_parse(b, strlen(b), 1, &r, &err), 0);
	assert_int_equal(r.memory_mib, 1024);
	assert_int_equal(r.egress, 1);
	assert_int_equal(r.idle_timeout_s, 5);
	assert_string_equal(r.metadata_json, "{\"k\":1}");
	assert_non_null(strstr(r.spec_json, "example.org:443"));
	api_session_request_free(&r);
	/* Egress without the quota is refused before the rules are looked at. */
	assert_int_equal(api_session_request_parse(b, strlen(b), 0, &r, &err), -1);
	assert_string_equal(err.code, "egress_not_allowed");
	b = "{\"network\":{\"egress\":\"allow\",\"allow\":[\"exa mple.org:443\"]}}";
	assert_int_equal(api_session_request_parse(b, strlen(b), 1, &r, &err), -1);
	assert_string_equal(err.code, "invalid_spec");
	assert_non_null(strstr(err.message, "network.allow[0]"));
	{
		static const char *const bad[][2] = {
			{ "{\"limits\":{\"timeout_s\":5}}", "limits.timeout_s:" },
			{ "{\"limits\":{\"vcpus\":99}}", "limits.vcpus:" },
			{ "{\"image\":\"alpine\"}", "image:" },
			{ "{\"idle_timeout_s\":0}", "idle_timeout_s:" },
			{ "{\"max_lifetime_s\":\"1\"}", "max_lifetime_s:" },
			{ "{\"metadata\":3}", "metadata:" },
			{ "{\"x\":1}", "x: unknown field" },
			{ "[]", "body:" },
			{ "{", "invalid JSON" },
		};

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			assert_int_equal(api_session_request_parse(bad[i][0], strlen(bad[i][0]), 1, &r, &err), -1);
			if (!strstr(err.message, bad[i][1]))
				fail_msg("%s: \"%s\" does not name %s", bad[i][0], err.message, bad[i][1]);
			assert_null(r.spec_json);
		}
	}

	/* exec: timeout_s filled in, checked against the quota; the rest by the task spec's rules. */
	b = "{\"argv\":[\"ls\"],\"cwd\":\"/tmp\"}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 3600, &j, &err), 0);
	assert_int_equal(json_integer_value(json_object_get(j, "timeout_s")), 30);
	assert_string_equal(json_string_value(json_object_get(j, "cwd")), "/tmp");
	json_decref(j);
	b = "{\"language\":\"python\",\"code\":\"print(1)\",\"timeout_s\":7200}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 3600, &j, &err), -1);
	assert_string_equal(err.code, "over_quota");
	assert_string_equal(err.message, "timeout_s: 7200 exceeds your quota of 3600");
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), 0);
	json_decref(j);
	b = "{\"argv\":[\"ls\"],\"language\":\"python\"}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), -1);
	assert_string_equal(err.code, "invalid_spec");
	b = "{\"argv\":[\"ls\"],\"files\":[]}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), -1);
	assert_non_null(strstr(err.message, "files"));
	b = "{\"argv\":[\"cat\"],\"stdin_b64\":\"aGk=\"}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), 0);
	assert_string_equal(json_string_value(json_object_get(j, "stdin_b64")), "aGk="); /* passed on as is */
	json_decref(j);
	b = "{\"argv\":[\"cat\"],\"stdin_b64\":\"aGk\"}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), -1);
	assert_non_null(strstr(err.message, "stdin_b64"));
	b = "{\"argv\":[\"cat\"],\"stdin_b64\":7}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), -1);
	b = "{\"argv\":[\"ls\"],\"timeout_s\":0}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), -1);
	assert_null(j);

	/* Interactive commands: a terminal's size, interactive, not with stdin_b64. */
	b = "{\"argv\":[\"bash\"],\"tty\":{\"rows\":24,\"cols\":80}}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), 0);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "tty"), "cols")), 80);
	json_decref(j);
	b = "{\"argv\":[\"cat\"],\"interactive\":true}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), 0);
	json_decref(j);
	b = "{\"argv\":[\"cat\"],\"interactive\":1}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), -1);
	assert_string_equal(err.message, "interactive: must be true or false");
	b = "{\"argv\":[\"bash\"],\"tty\":{\"rows\":24}}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), -1);
	assert_non_null(strstr(err.message, "tty: expected"));
	b = "{\"argv\":[\"bash\"],\"tty\":{\"rows\":24,\"cols\":4097}}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), -1);
	b = "{\"argv\":[\"bash\"],\"tty\":{\"rows\":24,\"cols\":80},\"stdin_b64\":\"aGk=\"}";
	assert_int_equal(api_exec_request_parse(b, strlen(b), 0, &j, &err), -1);
	assert_non_null(strstr(err.message, "stdin_b64: not with an interactive command"));

	/* Input: exec_id required (hex), data_b64 bounded, eof a boolean, resize a size. */
	b = "{\"exec_id\":\"00ff\",\"data_b64\":\"bHMK\",\"eof\":true,\"resize\":{\"rows\":5,\"cols\":9}}";
	assert_int_equal(api_input_request_parse(b, strlen(b), &j, &err), 0);
	assert_string_equal(json_string_value(json_object_get(j, "data_b64")), "bHMK");
	json_decref(j);
	b = "{\"data_b64\":\"bHMK\"}";
	assert_int_equal(api_input_request_parse(b, strlen(b), &j, &err), -1);
	assert_non_null(strstr(err.message, "exec_id"));
	b = "{\"exec_id\":\"../x\"}";
	assert_int_equal(api_input_request_parse(b, strlen(b), &j, &err), -1);
	b = "{\"exec_id\":\"ab\",\"data_b64\":\"bHM\"}";
	assert_int_equal(api_input_request_parse(b, strlen(b), &j, &err), -1);
	assert_non_null(strstr(err.message, "data_b64"));
	b = "{\"exec_id\":\"ab\",\"eof\":\"yes\"}";
	assert_int_equal(api_input_request_parse(b, strlen(b), &j, &err), -1);
	b = "{\"exec_id\":\"ab\",\"resize\":{\"rows\":0,\"cols\":80}}";
	assert_int_equal(api_input_request_parse(b, strlen(b), &j, &err), -1);
	assert_string_equal(err.code, "invalid_request");
	b = "{\"exec_id\":\"ab\",\"kill\":true}";
	assert_int_equal(api_input_request_parse(b, strlen(b), &j, &err), -1);
	assert_non_null(strstr(err.message, "kill: unknown field"));
	assert_null(j);

	assert_true(api_guest_path_ok("/work/a b.txt"));
	assert_false(api_guest_path_ok("work/a"));
	assert_false(api_guest_path_ok(""));
	assert_false(api_guest_path_ok(NULL));
	assert_false(api_guest_path_ok("/work/a\nb"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_request_parsers),
		cmocka_unit_test_setup(test_create_and_quota, setup),
		cmocka_unit_test_setup(test_lifecycle, setup),
		cmocka_unit_test_setup(test_list_and_reopen, setup),
	};
	char cmd[128];
	int r;

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	r = cmocka_run_group_tests(tests, NULL, NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return r;
}
