/* test_scheduler: kiln-api's scheduler (api/scheduler/scheduler.c) driven by hand
 * (sched_create, sched_tick) over a real store on a temporary SQLite file,
 * with a fake host_ops and a hand-moved clock (fake_host_ops.h): placement
 * fairness across customers, pool preference, the push's retry rules (full:
 * back to the queue and the host left alone for a moment; refused: error;
 * unreachable: pushed again), host loss and return, placement outside
 * the queue (sched_place, as sessions use it), templates' preference
 * (a warm VM of the template, then a host holding it, then any; built-ins
 * only where listed), and drain (a draining host takes nothing new, not
 * even a resume that prefers it; past its deadline its tasks are requeued). */
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

#include "destination.h"
#include "fake_host_ops.h"
#include "quota.h"
#include "scheduler.h"
#include "store.h"

#define H1 "http://h1"
#define H2 "http://h2"
#define H3 "http://h3"
#define SHA_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

static char dir[] = "/tmp/kiln-test-sched.XXXXXX";
static char path[256];
static int seq;
static struct store *st;
static struct sched *sc;

static void customer(const char *id, unsigned max_running)
{
	struct kiln_err err = { .code = "" };
	struct quota q;

	quota_defaults(&q);
	q.max_running = max_running;
	q.max_vcpus = 64;
	q.max_memory_mib = 65536;
	if (store_customer_create(st, id, id, &q, &err) != 0)
		fail_msg("customer %s: %s", id, err.message);
}

/* A heartbeat: vcpus_total/used, and a pool of `ready` warm VMs of
 * pool_mem MiB and one vCPU. */
static void heartbeat(const char *id, const char *url, unsigned vt, unsigned vu, unsigned ready, unsigned pool_mem)
{
	struct kiln_err err = { .code = "" };
	json_t *cap = json_pack("{s:{s:i, s:i}, s:{s:i, s:i}, s:{s:i, s:i, s:i}, s:b}", "vcpus", "total", vt, "used",
				vu, "memory_mib", "total", 4096, "used", 0, "pool", "ready", ready, "memory_mib",
				pool_mem, "vcpus", 1, "egress", 0);

	assert_int_equal(store_host_heartbeat(st, id, url, cap, &err), 0);
	json_decref(cap);
}

/* A heartbeat of an idle 8-vCPU host whose capacity.templates is tjson. */
static void heartbeat_templates(const char *id, const char *url, unsigned vu, const char *tjson)
{
	struct kiln_err err = { .code = "" };
	json_t *cap = json_pack("{s:{s:i, s:i}, s:{s:i, s:i}, s:{s:i, s:i, s:i}, s:b, s:o}", "vcpus", "total", 8,
				"used", vu, "memory_mib", "total", 8192, "used", 0, "pool", "ready", 0, "memory_mib", 256,
				"vcpus", 1, "egress", 0, "templates", json_loads(tjson, 0, NULL));

	assert_int_equal(store_host_heartbeat(st, id, url, cap, &err), 0);
	json_decref(cap);
}

/* A task of template name (sha NULL: a built-in). */
static void submit_template(const char *cust, const char *name, const char *sha, char id[40])
{
	struct kiln_err err = { .code = "" };
	struct store_template_use u = { .template_id = "b_x", .name = name, .sha256 = sha, .builtin = !sha,
					  .template_ref_json = "{}" };
	struct store_submit t = {
		.customer = cust, .spec_json = "{\"argv\":[\"true\"]}", .vcpus = 1, .memory_mib = 256, .body_hash = "h",
		.template_use = &u,
	};

	if (store_task_submit(st, &t, id, &err) != 0)
		fail_msg("submit: %s", err.message);
}

static void submit(const char *cust, unsigned memory_mib, char id[40])
{
	struct kiln_err err = { .code = "" };

	if (store_task_insert(st, cust, "{\"argv\":[\"true\"]}", NULL, 1, memory_mib, NULL, "h", id, &err) != 0)
		fail_msg("insert: %s", err.message);
}

static enum task_state state_of(const char *id)
{
	enum task_state s = TASK_STATE_COUNT;

	store_task_state(st, id, &s);
	return s;
}

/* The task's host ("" when none), into buf. */
static const char *host_of(const char *id, char buf[65])
{
	json_t *j = store_task_json(st, id, NULL);

	snprintf(buf, 65, "%s", json_string_value(json_object_get(j, "host")) ?: "");
	json_decref(j);
	return buf;
}

/* Wait (real time, 5 s at most) for a watcher thread to move the task. */
static int wait_state(const char *id, enum task_state want)
{
	for (int i = 0; i < 1000; i++) {
		if (state_of(id) == want)
			return 1;
		real_nap();
	}
	return 0;
}

static int wait_count(const char *method, const char *url, const char *p, int want)
{
	for (int i = 0; i < 1000; i++) {
		if (fake_count(method, url, p) >= want)
			return 1;
		real_nap();
	}
	return 0;
}

static unsigned lost_after_ms = 10000;
static const unsigned char dest_key[DESTINATION_KEY_LEN] = { 7, 7, 7, 7, 7, 7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8,
							     9, 9, 9, 9, 9, 9, 9, 9, 4, 3, 2, 1, 0, 0, 0, 1 };
static const unsigned char *sched_dest_key; /* what setup gives the scheduler */

static int setup(void **state)
{
	struct kiln_err err = { .code = "" };
	struct sched_config cfg = {
		.cluster_token = "tok", .host_lost_after_ms = lost_after_ms, .host = &fake_ops, .clock = &fake_clock,
		.dest_key = sched_dest_key,
	};

	snprintf(path, sizeof(path), "%s/api-%d.db", dir, ++seq);
	st = store_open(path, &err);
	if (!st)
		fail_msg("store_open: %s", err.message);
	fake_reset();
	clock_reset();
	/* A host accepts pushes and reports the task running until told otherwise. */
	fake_rule("POST", NULL, "/v1/tasks", 202, "{}");
	fake_rule("GET", NULL, "/v1/tasks", 200, "{\"tasks\":[]}");
	fake_rule("GET", NULL, "/v1/tasks/", 200, "{\"state\":\"running\"}");
	fake_rule("DELETE", NULL, "/v1/tasks/", 202, "{}");
	sc = sched_create(st, &cfg, &err);
	assert_non_null(sc);
	return 0;
}

static int teardown(void **state)
{
	sched_stop(sc);
	store_close(st);
	lost_after_ms = 10000;
	sched_dest_key = NULL;
	return 0;
}

static int setup_dest_key(void **state)
{
	sched_dest_key = dest_key;
	return setup(state);
}

/* Give customer cust an S3 destination sealed under dest_key; its id in id. */
static void set_dest(const char *cust, char id[40])
{
	static const char body[] = "{\"endpoint\":\"http://127.0.0.1:9\",\"bucket\":\"cust-out\",\"prefix\":\"p/\","
				   "\"access_key\":\"AK\",\"secret_key\":\"SK\"}";
	struct kiln_err err = { .code = "" };
	unsigned char sealed[DESTINATION_SEALED_MAX];
	size_t n = 0;
	struct dest d;

	assert_int_equal(dest_parse(body, strlen(body), DEST_SECRET_REQUIRED, &d, &err), 0);
	assert_int_equal(destination_seal(dest_key, cust, d.secret_key, sealed, &n, &err), 0);
	assert_int_equal(store_dest_put(st, cust, &d, sealed, n, id, NULL, &err), 0);
}

/* A host is lost 300 ms after its last heartbeat: heartbeats carry the
 * store's real time, so a test keeps one host live by sleeping for real. */
static int setup_quick_loss(void **state)
{
	lost_after_ms = 300;
	return setup(state);
}

/* One customer's backlog does not starve another: the queue is read
 * round-robin over customers, FIFO within each. */
static void test_fair_across_customers(void **state)
{
	char a[10][40], b[2][40], h[65];
	int na = 0, nb = 0;

	customer("a", 20);
	customer("b", 20);
	heartbeat("h1", H1, 4, 0, 0, 0); /* room for four 1-vCPU tasks */
	for (int i = 0; i < 10; i++)
		submit("a", 256, a[i]);
	for (int i = 0; i < 2; i++)
		submit("b", 256, b[i]);
	sched_tick(sc);
	for (int i = 0; i < 10; i++)
		na += state_of(a[i]) == TASK_SCHEDULED;
	for (int i = 0; i < 2; i++)
		nb += state_of(b[i]) == TASK_SCHEDULED;
	assert_int_equal(na, 2);
	assert_int_equal(nb, 2);
	/* FIFO within a customer: a's first two. */
	assert_int_equal(state_of(a[0]), TASK_SCHEDULED);
	assert_int_equal(state_of(a[1]), TASK_SCHEDULED);
	assert_int_equal(state_of(a[2]), TASK_QUEUED);
	assert_string_equal(host_of(b[1], h), "h1");
	/* No room left (placed since the last report count): nothing more. */
	sched_tick(sc);
	assert_int_equal(state_of(a[2]), TASK_QUEUED);
	assert_true(wait_count("POST", H1, "/v1/tasks", 4));
}

/* A customer at its running quota waits; the others are placed. */
static void test_quota_cap_skips_customer(void **state)
{
	char a[3][40], b[40];

	customer("a", 1);
	customer("b", 4);
	heartbeat("h1", H1, 8, 0, 0, 0);
	for (int i = 0; i < 3; i++)
		submit("a", 256, a[i]);
	submit("b", 256, b);
	sched_tick(sc);
	assert_int_equal(state_of(a[0]), TASK_SCHEDULED);
	assert_int_equal(state_of(a[1]), TASK_QUEUED);
	assert_int_equal(state_of(a[2]), TASK_QUEUED);
	assert_int_equal(state_of(b), TASK_SCHEDULED);
}

/* A host with a warm pool VM of the task's size is preferred over an
 * emptier one; once that VM is taken, the emptiest host again. */
static void test_pool_preference(void **state)
{
	char t1[40], t2[40], t3[40], h[65];

	customer("a", 20);
	heartbeat("h1", H1, 8, 0, 0, 0);   /* emptiest */
	heartbeat("h2", H2, 8, 4, 1, 256); /* one warm 256 MiB VM */
	submit("a", 256, t1);
	submit("a", 512, t2);
	submit("a", 256, t3);
	sched_tick(sc);
	assert_string_equal(host_of(t1, h), "h2");
	assert_string_equal(host_of(t2, h), "h1"); /* no pool VM of its size */
	assert_string_equal(host_of(t3, h), "h1"); /* the pool VM is taken */
}

/* A host that answers full (503): the task goes back to the queue and
 * the host gets nothing for HOST_FULL_BACKOFF_MS (1 s of the scheduler's
 * monotonic clock); another host takes it meanwhile. */
static void test_retry_full_host(void **state)
{
	char t[40], h[65];

	customer("a", 20);
	heartbeat("h1", H1, 8, 0, 0, 0);
	heartbeat("h2", H2, 8, 2, 0, 0);
	fake_rule("POST", H1, "/v1/tasks", 503, "{\"error\":{\"code\":\"no_capacity\",\"message\":\"full\"}}");
	submit("a", 256, t);
	sched_tick(sc);
	/* The push runs on a watcher thread: by now the task may already be
	 * back in the queue, so the first host is read from the calls made. */
	assert_true(wait_state(t, TASK_QUEUED));
	assert_int_equal(fake_count("POST", H1, "/v1/tasks"), 1);
	sched_tick(sc);
	assert_int_equal(state_of(t), TASK_SCHEDULED);
	assert_string_equal(host_of(t, h), "h2");
}

static void test_retry_full_backoff_clock(void **state)
{
	char t[40], h[65];

	customer("a", 20);
	heartbeat("h1", H1, 8, 0, 0, 0);
	fake_rule("POST", H1, "/v1/tasks", 503, "{}");
	submit("a", 256, t);
	sched_tick(sc);
	assert_true(wait_state(t, TASK_QUEUED));
	fake_rule("POST", H1, "/v1/tasks", 202, "{}");
	sched_tick(sc);
	assert_int_equal(state_of(t), TASK_QUEUED); /* left alone for a moment */
	clock_advance(999);
	sched_tick(sc);
	assert_int_equal(state_of(t), TASK_QUEUED);
	clock_advance(2);
	sched_tick(sc);
	assert_int_equal(state_of(t), TASK_SCHEDULED);
	assert_string_equal(host_of(t, h), "h1");
}

/* Refused outright (a 4xx other than 409): the task ends as
 * error/host_refused, not tried elsewhere. 409 means a previous kiln-api
 * pushed it already: fine. */
static void test_retry_refused_fails(void **state)
{
	char t[40], t2[40];
	json_t *j;

	customer("a", 20);
	heartbeat("h1", H1, 8, 0, 0, 0);
	heartbeat("h2", H2, 8, 2, 0, 0);
	fake_rule("POST", H1, "/v1/tasks", 400, "{\"error\":{\"code\":\"invalid_request\",\"message\":\"no\"}}");
	submit("a", 256, t);
	sched_tick(sc);
	assert_true(wait_state(t, TASK_ERROR));
	j = store_task_json(st, t, NULL);
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "result"), "end_reason")) ?:
				    json_string_value(json_object_get(j, "end_reason")) ?: "",
			    "host_refused");
	json_decref(j);
	assert_int_equal(fake_count("POST", H2, "/v1/tasks"), 0);

	fake_rule("POST", H1, "/v1/tasks", 409, "{}");
	clock_advance(1001); /* past h1's moment of rest after the refusal */
	submit("a", 256, t2);
	sched_tick(sc);
	assert_true(wait_count("GET", H1, "/v1/tasks/", 1)); /* followed, as pushed */
	assert_int_equal(state_of(t2), TASK_SCHEDULED);
}

/* The host's final state event carries the task: it is stored from there,
 * without a GET of the task after the stream. */
static void test_final_event_carries_task(void **state)
{
	char t[40];

	customer("a", 20);
	heartbeat("h1", H1, 8, 0, 0, 0);
	fake_rule("POST", H1, "/v1/tasks", 202, "{}");
	pthread_mutex_lock(&fake.lock);
	fake.final_event = 1;
	pthread_mutex_unlock(&fake.lock);
	submit("a", 256, t);
	sched_tick(sc);
	assert_true(wait_state(t, TASK_SUCCEEDED));
	assert_int_equal(fake_count("GET", H1, "/v1/tasks/"), 0);
}

/* A host that cannot be reached: the task stays scheduled there and the
 * push is tried again (with a growing wait) until it answers. */
static void test_retry_unreachable_pushes_again(void **state)
{
	char t[40];

	customer("a", 20);
	heartbeat("h1", H1, 8, 0, 0, 0);
	fake_rule("POST", H1, "/v1/tasks", -1, NULL);
	submit("a", 256, t);
	sched_tick(sc);
	assert_true(wait_count("POST", H1, "/v1/tasks", 2));
	assert_int_equal(state_of(t), TASK_SCHEDULED);
	fake_rule("POST", H1, "/v1/tasks", 202, "{}");
	assert_true(wait_count("GET", H1, "/v1/tasks/", 1));
	assert_int_equal(state_of(t), TASK_SCHEDULED);
}

/* A task whose push to h1 fails (h1 just died) is requeued when h1 is lost
 * and placed on h2 while h1's watcher still waits to retry: a watcher for
 * h2 pushes it there (the old one stands down, and never pushes a task the
 * store has placed elsewhere). It used to stay "scheduled" on h2 forever. */
static void test_replaced_while_old_watcher_waits(void **state)
{
	char t[40], h[65];

	customer("a", 20);
	heartbeat("h1", H1, 8, 0, 0, 0);
	fake_rule("POST", H1, "/v1/tasks", -1, NULL);
	submit("a", 256, t);
	sched_tick(sc);
	assert_true(wait_count("POST", H1, "/v1/tasks", 1));
	assert_string_equal(host_of(t, h), "h1");
	usleep(400 * 1000); /* the wall clock (fake_wall_ms) follows real time */
	heartbeat("h2", H2, 8, 0, 0, 0);
	sched_tick(sc); /* h1 lost: t back to the queue */
	sched_tick(sc); /* t placed on h2 */
	assert_string_equal(host_of(t, h), "h2");
	assert_true(wait_count("POST", H2, "/v1/tasks", 1));
	assert_true(wait_count("GET", H2, "/v1/tasks/", 1)); /* followed there */
	assert_int_equal(state_of(t), TASK_SCHEDULED);
	assert_string_equal(host_of(t, h), "h2");
}

/* A host that stops heartbeating is lost: a task it never started goes
 * back to the queue, a started one ends as error/host_lost. When it
 * heartbeats again it is used again, and what it still runs that the store
 * has settled is cancelled there. */
static void test_host_lost_and_back(void **state)
{
	char t1[40], t2[40], list[256], del[80], h[65], *text;
	json_t *hosts, *j;

	customer("a", 20);
	heartbeat("h1", H1, 8, 0, 0, 0);
	submit("a", 256, t1);
	submit("a", 256, t2);
	sched_tick(sc);
	assert_true(wait_count("POST", H1, "/v1/tasks", 2));
	assert_int_equal(store_task_transition(st, t2, TASK_SCHEDULED, TASK_RUNNING, NULL), 1);

	clock_advance(9000);
	sched_tick(sc);
	assert_int_equal(state_of(t1), TASK_SCHEDULED); /* not yet */
	clock_advance(1001);
	sched_tick(sc);
	assert_int_equal(state_of(t1), TASK_QUEUED);
	assert_int_equal(state_of(t2), TASK_ERROR);
	j = store_task_json(st, t2, NULL);
	text = json_dumps(j, 0);
	assert_non_null(strstr(text ? text : "", "host_lost"));
	free(text);
	json_decref(j);
	hosts = store_host_list(st);
	assert_string_equal(json_string_value(json_object_get(json_array_get(hosts, 0), "state")), "lost");
	json_decref(hosts);
	assert_int_equal(sched_host_state(sc, "h1", NULL), 0);
	sched_tick(sc);
	assert_int_equal(state_of(t1), TASK_QUEUED); /* nowhere to go */

	/* Back: it still runs t2 (ended here as host_lost): cancelled there. */
	snprintf(list, sizeof(list), "{\"tasks\":[{\"id\":\"%s\",\"state\":\"running\"}]}", t2);
	fake_rule("GET", H1, "/v1/tasks", 200, list);
	fake_rule("GET", H1, "/v1/tasks/", 200, "{\"state\":\"running\"}");
	clock_reset();
	heartbeat("h1", H1, 8, 0, 0, 0);
	sched_tick(sc);
	assert_int_equal(sched_host_state(sc, "h1", NULL), 1);
	hosts = store_host_list(st);
	assert_string_equal(json_string_value(json_object_get(json_array_get(hosts, 0), "state")), "live");
	json_decref(hosts);
	snprintf(del, sizeof(del), "/v1/tasks/%s", t2);
	assert_int_equal(fake_count("DELETE", H1, del), 1);
	assert_int_equal(state_of(t1), TASK_SCHEDULED);
	assert_string_equal(host_of(t1, h), "h1");
}

/* Placement outside the queue (sessions): the same rules, the reasons when
 * none fits, exclusion, and the accounting undone by sched_unplace. */
static void test_place_outside_queue(void **state)
{
	struct sched_need small = { .vcpus = 2, .memory_mib = 256 }, big = { .vcpus = 16, .memory_mib = 256 };
	struct sched_need eg = { .vcpus = 1, .memory_mib = 256, .egress = 1 };
	char id[65], url[256], ex[1][65] = { "h1" };

	assert_int_equal(sched_place(sc, &small, NULL, 0, id, url), -ENOENT);
	heartbeat("h1", H1, 4, 0, 0, 0);
	heartbeat("h2", H2, 4, 2, 0, 0);
	sched_tick(sc);
	assert_int_equal(sched_place(sc, &big, NULL, 0, id, url), -E2BIG);
	assert_int_equal(sched_place(sc, &eg, NULL, 0, id, url), -E2BIG);
	assert_int_equal(sched_place(sc, &small, NULL, 0, id, url), 0);
	assert_string_equal(id, "h1");
	assert_string_equal(url, H1);
	assert_int_equal(sched_place(sc, &small, ex, 1, id, url), 0);
	assert_string_equal(id, "h2");
	assert_int_equal(sched_place(sc, &small, NULL, 0, id, url), 0); /* h1's last 2 */
	assert_string_equal(id, "h1");
	assert_int_equal(sched_place(sc, &small, NULL, 0, id, url), -EBUSY);
	sched_unplace(sc, "h2", &small);
	assert_int_equal(sched_place(sc, &small, NULL, 0, id, url), 0);
	assert_string_equal(id, "h2");
	/* A host that said it is full is skipped for a moment. */
	sched_unplace(sc, "h2", &small);
	sched_host_full(sc, "h2");
	assert_int_equal(sched_place(sc, &small, NULL, 0, id, url), -EBUSY);
	clock_advance(1000);
	assert_int_equal(sched_place(sc, &small, NULL, 0, id, url), 0);
	assert_string_equal(id, "h2");
}

/* A heartbeat with idle sessions: vcpus {total, used, idle, idle_max}. */
static void heartbeat_idle(const char *id, const char *url, unsigned vt, unsigned vu, unsigned vi, unsigned vmax)
{
	struct kiln_err err = { .code = "" };
	json_t *cap = json_pack("{s:{s:i, s:i, s:i, s:i}, s:{s:i, s:i}, s:{s:i, s:i, s:i}, s:b}", "vcpus", "total", vt,
				"used", vu, "idle", vi, "idle_max", vmax, "memory_mib", "total", 65536, "used", 0, "pool",
				"ready", 0, "memory_mib", 256, "vcpus", 1, "egress", 0);

	/* The store stamps a heartbeat with the wall clock's millisecond, and
	 * the scheduler keeps its placements in flight until a heartbeat with
	 * a new stamp: two in one millisecond would look like one. */
	usleep(2000);
	assert_int_equal(store_host_heartbeat(st, id, url, cap, &err), 0);
	json_decref(cap);
}

/* Placement by kiln-host's rule: idle sessions' vCPUs do not fill a host,
 * only the bound on all does; a session that left (sched_release) comes off
 * the idle ones first. */
static void test_place_idle(void **state)
{
	struct sched_need n = { .vcpus = 1, .memory_mib = 256 };
	char id[65], url[256];

	heartbeat_idle("h1", H1, 2, 1, 40, 48); /* 1 active free, 7 in all */
	sched_tick(sc);
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), 0);
	assert_string_equal(id, "h1");
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), -EBUSY); /* 2 of 2 active */
	/* The bound on all: 3 active free, 1 in all. */
	heartbeat_idle("h1", H1, 4, 1, 46, 48);
	clock_advance(1000);
	sched_tick(sc);
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), 0);
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), -EBUSY);
	sched_unplace(sc, "h1", &n);
	heartbeat_idle("h1", H1, 2, 2, 46, 48);
	clock_advance(1000);
	sched_tick(sc);
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), -EBUSY); /* active full */
	/* An idle one destroyed: it was counted idle, so active stays full. */
	sched_release(sc, "h1", 1, 256);
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), -EBUSY);
	/* A host that does not report idle_max: the active bound only. */
	heartbeat("h2", H2, 2, 0, 0, 0);
	clock_advance(1000);
	sched_tick(sc);
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), 0);
	assert_string_equal(id, "h2");
}

/* need->prefer (a session's resume: the host that paused it) comes first
 * when it has room, even over an emptier host; when it is full, lost, or
 * unknown, the usual rules pick. */
static void test_place_prefer(void **state)
{
	struct sched_need n = { .vcpus = 2, .memory_mib = 256 };
	char id[65], url[256];

	heartbeat("h1", H1, 4, 0, 0, 0);
	heartbeat("h2", H2, 4, 2, 0, 0);
	sched_tick(sc);
	n.prefer = "h2";
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), 0);
	assert_string_equal(id, "h2");
	assert_string_equal(url, H2);
	/* h2 is full now (2 used, 2 placed): h1. */
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), 0);
	assert_string_equal(id, "h1");
	n.prefer = "nohost";
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), 0);
	assert_string_equal(id, "h1");
	n.prefer = "";
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), -EBUSY);
	sched_unplace(sc, "h2", &n);
	sched_unplace(sc, "h1", &n);
	/* No preference: the emptiest (h1). */
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), 0);
	assert_string_equal(id, "h1");
}

/* A task of a template goes to a host with a warm VM of it, else one that
 * holds it, else the emptiest (which fetches it); a built-in one only to
 * hosts that list it; a default task still prefers the emptiest. */
static void test_template_preference(void **state)
{
	char t1[40], t2[40], t3[40], t4[40], d[40], h[65];
	char warm[200], held[200];

	customer("a", 20);
	snprintf(warm, sizeof(warm), "[{\"name\":\"data\",\"sha256\":\"%s\",\"builtin\":false,\"ready\":1}]", SHA_A);
	snprintf(held, sizeof(held), "[{\"name\":\"data\",\"sha256\":\"%s\",\"builtin\":false,\"ready\":0}]", SHA_A);
	heartbeat_templates("h1", H1, 0, "[]");   /* emptiest, has nothing */
	heartbeat_templates("h2", H2, 4, held);   /* holds it */
	heartbeat_templates("h3", H3, 6, warm);   /* a warm VM of it, fullest */
	submit_template("a", "data", SHA_A, t1);
	sched_tick(sc);
	assert_string_equal(host_of(t1, h), "h3");
	/* The warm VM is taken: the host that holds it next. */
	submit_template("a", "data", SHA_A, t2);
	sched_tick(sc);
	assert_string_equal(host_of(t2, h), "h2");
	/* A default task: the emptiest. */
	submit("a", 256, d);
	sched_tick(sc);
	assert_string_equal(host_of(d, h), "h1");
	/* A built-in nobody lists stays queued; once h2 lists it, it goes there. */
	submit_template("a", "python-data", NULL, t3);
	sched_tick(sc);
	assert_int_equal(state_of(t3), TASK_QUEUED);
	heartbeat_templates("h2", H2, 4, "[{\"name\":\"python-data\",\"sha256\":null,\"builtin\":true,\"ready\":0}]");
	sched_tick(sc);
	assert_string_equal(host_of(t3, h), "h2");
	/* A template no host holds: anywhere (the emptiest). */
	submit_template("a", "other", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", t4);
	sched_tick(sc);
	assert_string_equal(host_of(t4, h), "h1");
}

/* sched_place for a session of a built-in: only a host that lists it;
 * none does: -E2BIG. */
static void test_place_builtin(void **state)
{
	struct sched_need need = { .vcpus = 1, .memory_mib = 256, .tkey = "@python-data" };
	char host[65], url[256];

	heartbeat_templates("h1", H1, 0, "[]");
	sched_tick(sc);
	assert_int_equal(sched_place(sc, &need, NULL, 0, host, url), -E2BIG);
	heartbeat_templates("h2", H2, 6, "[{\"name\":\"python-data\",\"sha256\":null,\"builtin\":true,\"ready\":2}]");
	sched_tick(sc);
	assert_int_equal(sched_place(sc, &need, NULL, 0, host, url), 0);
	assert_string_equal(host, "h2");

	/* A host whose list starts with many customer templates: its built-in,
	 * listed last, still counts (it used to fall past the 16 kept). */
	{
		char list[4096];
		size_t o = 0;

		o += (size_t)snprintf(list + o, sizeof(list) - o, "[");
		for (int i = 0; i < 20; i++)
			o += (size_t)snprintf(list + o, sizeof(list) - o,
					      "{\"name\":\"c%d\",\"sha256\":\"%064x\",\"builtin\":false,\"ready\":0},", i, i + 1);
		snprintf(list + o, sizeof(list) - o, "{\"name\":\"python-data\",\"sha256\":null,\"builtin\":true,\"ready\":0}]");
		heartbeat_templates("h2", H2, 8, "[]");
		heartbeat_templates("h3", H3, 0, list);
		sched_tick(sc);
		assert_int_equal(sched_place(sc, &need, NULL, 0, host, url), 0);
		assert_string_equal(host, "h3");
	}
}

/* A customer with its own destination: the task goes to its host with it,
 * records which destination it went to, and new credentials for the same
 * place are handed to that host (PUT /v1/tasks/{id}/destination). */
static void test_destination_pushed(void **state)
{
	char t[40], did[40];
	json_t *j;

	customer("a", 20);
	heartbeat("h1", H1, 8, 0, 0, 0);
	set_dest("a", did);
	fake_rule("PUT", NULL, "/v1/tasks/", 200, "{\"ok\":true}");
	submit("a", 256, t);
	sched_tick(sc);
	assert_true(wait_count("POST", H1, "/v1/tasks", 1));
	assert_true(wait_count("GET", H1, "/v1/tasks/", 1));
	j = store_task_json(st, t, NULL);
	assert_string_equal(json_string_value(json_object_get(j, "destination")) ?: "", did);
	json_decref(j);
	sched_destination_changed(sc, "a");
	{
		char p[80];

		snprintf(p, sizeof(p), "/v1/tasks/%s/destination", t);
		assert_int_equal(fake_count("PUT", H1, p), 1);
	}
	/* Another customer's change reaches nobody. */
	sched_destination_changed(sc, "b");
	assert_int_equal(fake_count("PUT", NULL, "/v1/tasks/"), 1);
}

/* A destination whose secret cannot be opened (no key here) fails the
 * task with destination_unavailable; it never goes to a host (which would
 * upload to kiln's own bucket). */
static void test_destination_unavailable(void **state)
{
	char t[40], did[40];
	json_t *j;

	customer("a", 20);
	heartbeat("h1", H1, 8, 0, 0, 0);
	set_dest("a", did);
	submit("a", 256, t);
	sched_tick(sc);
	assert_true(wait_state(t, TASK_ERROR));
	j = store_task_json(st, t, NULL);
	assert_string_equal(json_string_value(json_object_get(j, "end_reason")) ?: "", "destination_unavailable");
	json_decref(j);
	assert_int_equal(fake_count("POST", H1, "/v1/tasks"), 0);
}

/* A draining host (an admin's, in the store; or its own heartbeat's, kiln-host
 * drain) takes no queued task, no session, not even the resume that
 * prefers it or a warm pool VM of the task's size; its tasks keep running
 * until a deadline passes, then go back to the queue (cancelled there) and
 * on to another host. Undrained, it takes work again. */
static void test_drain(void **state)
{
	struct sched_need n = { .vcpus = 1, .memory_mib = 256, .prefer = "h1" };
	char t0[40], t1[40], t2[40], t3[40], id[65], url[256], h[65], del[80];
	unsigned tasks, sessions;
	json_t *hosts, *cap;
	struct kiln_err err = { .code = "" };

	customer("a", 20);
	/* h1: empty, with warm pool VMs of the tasks' size: it wins every pick. */
	heartbeat("h1", H1, 8, 0, 2, 256);
	heartbeat("h2", H2, 8, 4, 0, 0);
	sched_tick(sc);
	submit("a", 256, t0);
	sched_tick(sc);
	assert_string_equal(host_of(t0, h), "h1");
	assert_true(wait_count("POST", H1, "/v1/tasks", 1));
	assert_int_equal(store_task_transition(st, t0, TASK_SCHEDULED, TASK_RUNNING, NULL), 1);

	assert_int_equal(store_host_set_drain(st, "nohost", 1, 0), -ENOENT);
	assert_int_equal(store_host_set_drain(st, "h1", 1, 0), 0);
	sched_tick(sc);
	assert_int_equal(sched_host_draining(sc, "h1"), 1);
	assert_int_equal(sched_host_draining(sc, "h2"), 0);
	assert_int_equal(sched_host_state(sc, "h1", NULL), 1); /* still live: its work goes on */
	hosts = store_host_list(st);
	assert_string_equal(json_string_value(json_object_get(json_array_get(hosts, 0), "state")), "draining");
	assert_true(json_is_true(json_object_get(json_array_get(hosts, 0), "draining")));
	assert_null(json_object_get(json_array_get(hosts, 0), "drain_deadline_ms"));
	assert_string_equal(json_string_value(json_object_get(json_array_get(hosts, 1), "state")), "live");
	json_decref(hosts);
	assert_int_equal(store_host_load(st, "h1", &tasks, &sessions), 0);
	assert_int_equal(tasks, 1);
	assert_int_equal(sessions, 0);

	/* New work goes to h2; a resume that prefers h1 too. */
	submit("a", 256, t1);
	sched_tick(sc);
	assert_string_equal(host_of(t1, h), "h2");
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), 0);
	assert_string_equal(id, "h2");
	sched_unplace(sc, "h2", &n);
	/* Without a deadline its running task is left alone. */
	heartbeat("h1", H1, 8, 1, 2, 256);
	heartbeat("h2", H2, 8, 5, 0, 0);
	sched_tick(sc);
	assert_int_equal(state_of(t0), TASK_RUNNING);
	assert_string_equal(host_of(t0, h), "h1");

	/* Past a deadline: requeued, cancelled on h1, placed on h2. */
	assert_int_equal(store_host_set_drain(st, "h1", 1, 1), 0);
	sched_tick(sc);
	snprintf(del, sizeof(del), "/v1/tasks/%s", t0);
	assert_int_equal(fake_count("DELETE", H1, del), 1);
	assert_string_equal(host_of(t0, h), "h2");
	assert_int_equal(state_of(t0), TASK_SCHEDULED);
	assert_int_equal(store_host_load(st, "h1", &tasks, &sessions), 0);
	assert_int_equal(tasks, 0);

	/* Undrained: h1 (the emptiest, warm VMs) takes work again. */
	assert_int_equal(store_host_set_drain(st, "h1", 0, 0), 0);
	sched_tick(sc);
	assert_int_equal(sched_host_draining(sc, "h1"), 0);
	submit("a", 256, t2);
	sched_tick(sc);
	assert_string_equal(host_of(t2, h), "h1");

	/* The host's own word (kiln-host drain, in its heartbeat) counts the same. */
	cap = json_pack("{s:{s:i, s:i}, s:{s:i, s:i}, s:b, s:I}", "vcpus", "total", 8, "used", 0, "memory_mib", "total",
			4096, "used", 0, "draining", 1, "drain_deadline_ms", (json_int_t)4102444800000);
	assert_int_equal(store_host_heartbeat(st, "h1", H1, cap, &err), 0);
	json_decref(cap);
	sched_tick(sc);
	assert_int_equal(sched_host_draining(sc, "h1"), 1);
	hosts = store_host_list(st);
	assert_string_equal(json_string_value(json_object_get(json_array_get(hosts, 0), "state")), "draining");
	assert_int_equal(json_integer_value(json_object_get(json_array_get(hosts, 0), "drain_deadline_ms")),
			 4102444800000);
	json_decref(hosts);
	submit("a", 256, t3);
	sched_tick(sc);
	assert_string_equal(host_of(t3, h), "h2");
	n.prefer = "";
	heartbeat("h2", H2, 8, 8, 0, 0);
	sched_tick(sc);
	/* Only a draining host has room: none to place on. */
	assert_int_equal(sched_place(sc, &n, NULL, 0, id, url), -EBUSY);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_fair_across_customers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_quota_cap_skips_customer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pool_preference, setup, teardown),
		cmocka_unit_test_setup_teardown(test_retry_full_host, setup, teardown),
		cmocka_unit_test_setup_teardown(test_final_event_carries_task, setup, teardown),
		cmocka_unit_test_setup_teardown(test_retry_full_backoff_clock, setup, teardown),
		cmocka_unit_test_setup_teardown(test_retry_refused_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_retry_unreachable_pushes_again, setup, teardown),
		cmocka_unit_test_setup_teardown(test_replaced_while_old_watcher_waits, setup_quick_loss, teardown),
		cmocka_unit_test_setup_teardown(test_host_lost_and_back, setup, teardown),
		cmocka_unit_test_setup_teardown(test_place_prefer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_place_outside_queue, setup, teardown),
		cmocka_unit_test_setup_teardown(test_template_preference, setup, teardown),
		cmocka_unit_test_setup_teardown(test_place_builtin, setup, teardown),
		cmocka_unit_test_setup_teardown(test_destination_pushed, setup_dest_key, teardown),
		cmocka_unit_test_setup_teardown(test_destination_unavailable, setup, teardown),
		cmocka_unit_test_setup_teardown(test_drain, setup, teardown),
		cmocka_unit_test_setup_teardown(test_place_idle, setup, teardown),
	};
	char cmd[300];
	int r;

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	r = cmocka_run_group_tests(tests, NULL, NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
	return r;
}
