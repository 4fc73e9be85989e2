/* test_api_sessions: kiln-api's sessions without HTTP or VMs, over a real
 * store on a temporary SQLite file, a real scheduler driven by hand and a
 * fake host_ops with a hand-moved clock (fake_host_ops.h): the reaper's
 * decisions as a pure function (idle timeout, max lifetime, busy sessions,
 * leftovers, lost hosts), the reaper acting on them (destroy, auto-pause,
 * pause failing, paused sessions left alone, leftovers settled, host lost,
 * a draining host's sessions paused),
 * two replicas on one store (one's lease keeps a session from the other's
 * reaper, a lapsed one does not; renewal), and the one placement retry
 * loop create and resume share (which host errors go on to the next host,
 * which end it, the attempt limit); a paused session's destroy goes to the
 * host that paused it, and a resume on another host asks that one to drop
 * its pause-cache copies.
 * (tests/unit/test_sessions.c tests kiln-host's sessions.) */
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
#include "sessions_int.h"
#include "store.h"

static char dir[] = "/tmp/kiln-test-api-sessions.XXXXXX";
static char path[256];
static int seq;
static struct store *st;
static struct sched *sc;
static struct sessions *ss;
static struct api_config cfg;

static void heartbeat(const char *id, unsigned used)
{
	struct kiln_err err = { .code = "" };
	char url[64];
	json_t *cap = json_pack("{s:{s:i, s:i}, s:{s:i, s:i}, s:b}", "vcpus", "total", 8, "used", used, "memory_mib",
				"total", 8192, "used", 0, "egress", 0);

	snprintf(url, sizeof(url), "http://%s", id);
	assert_int_equal(store_host_heartbeat(st, id, url, cap, &err), 0);
	json_decref(cap);
}

static void customer(int auto_pause)
{
	struct kiln_err err = { .code = "" };
	struct quota q;

	quota_defaults(&q);
	q.session_auto_pause = auto_pause;
	if (store_customer_create(st, "acme", "acme", &q, &err) != 0)
		fail_msg("customer: %s", err.message);
}

/* A session of acme in state starting on host, or (running) moved on to
 * running there. idle 60 s, lifetime 3600 s. */
static void session(const char *host, int running, char id[40])
{
	struct kiln_err err = { .code = "" };
	struct store_session_new n = {
		.customer = "acme", .spec_json = "{}", .vcpus = 1, .memory_mib = 256, .idle_timeout_s = 60,
		.max_lifetime_s = 3600, .host_id = host,
	};

	if (store_session_create(st, &n, id, &err) != 0)
		fail_msg("session: %s", err.message);
	if (running)
		assert_int_equal(store_session_transition(st, id, SESSION_STARTING, SESSION_RUNNING, host, "", NULL), 1);
}

static enum session_state state_of(const char *id)
{
	struct store_session s;

	return store_session_get(st, id, NULL, &s) == 0 ? s.state : SESSION_STATE_COUNT;
}

static const char *reason_of(const char *id, char buf[64])
{
	json_t *j = store_session_json(st, id, NULL);

	snprintf(buf, 64, "%s", json_string_value(json_object_get(j, "end_reason")) ?: "");
	json_decref(j);
	return buf;
}

/* Wait (real time, 5 s at most) for an ender thread. */
static int wait_state(const char *id, enum session_state want)
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
	fake_rule("GET", NULL, "/v1/sessions", 200, "{\"sessions\":[]}");
	fake_rule("DELETE", NULL, "/v1/sessions/", 200, "{}");
	api_config_defaults(&cfg);
	cfg.cluster_token = "tok";
	sc = sched_create(st, &sconf, &err);
	assert_non_null(sc);
	ss = sessions_create(&cfg, st, sc, &fake_ops, &fake_clock, &err);
	assert_non_null(ss);
	return 0;
}

static int teardown(void **state)
{
	assert_int_equal(sessions_stop(ss), 0);
	sched_stop(sc);
	store_close(st);
	return 0;
}

/* ---- the decision, pure ---- */

static void test_reap_decide(void **state)
{
	const int64_t t0 = 1700000000000;
	struct store_session c = {
		.state = SESSION_RUNNING, .idle_timeout_s = 60, .max_lifetime_s = 3600, .started_ms = t0,
		.last_active_ms = t0,
	};

	/* Running, its host live. */
	assert_int_equal(sessions_reap_decide(&c, 1, 0, t0 + 60000), REAP_KEEP);
	assert_int_equal(sessions_reap_decide(&c, 1, 0, t0 + 60001), REAP_IDLE_TIMEOUT);
	c.last_active_ms = t0 + 3590000;
	assert_int_equal(sessions_reap_decide(&c, 1, 0, t0 + 3600000), REAP_KEEP);
	assert_int_equal(sessions_reap_decide(&c, 1, 0, t0 + 3600001), REAP_MAX_LIFETIME);
	/* A request in flight is activity; a lifetime still ends. */
	c.last_active_ms = t0;
	assert_int_equal(sessions_reap_decide(&c, 1, 1, t0 + 600000), REAP_KEEP);
	assert_int_equal(sessions_reap_decide(&c, 1, 1, t0 + 3600001), REAP_MAX_LIFETIME);
	/* Its host lost: host_lost (not when a request is in flight); unknown: wait. */
	assert_int_equal(sessions_reap_decide(&c, 0, 0, t0), REAP_HOST_LOST);
	assert_int_equal(sessions_reap_decide(&c, 0, 1, t0), REAP_KEEP);
	assert_int_equal(sessions_reap_decide(&c, -1, 0, t0 + 3600001), REAP_KEEP);
	assert_int_equal(sessions_reap_decide(&c, 0, 0, t0 + 3600001), REAP_HOST_LOST);
	/* A transient state: settled when nothing here is behind it. */
	for (enum session_state s = SESSION_STARTING; s < SESSION_STATE_COUNT; s++) {
		if (!session_state_holds(s) || s == SESSION_RUNNING)
			continue;
		c.state = s;
		assert_int_equal(sessions_reap_decide(&c, 1, 0, t0), REAP_SETTLE);
		assert_int_equal(sessions_reap_decide(&c, -1, 0, t0 + 9999999), REAP_SETTLE);
		assert_int_equal(sessions_reap_decide(&c, 1, 1, t0 + 9999999), REAP_KEEP);
	}
}

static void test_reap_destroy_after_pause(void **state)
{
	struct sessions_outcome o = { .status = 200 };

	assert_false(sessions_reap_destroy_after_pause(&o));
	o.status = 502;
	kiln_err_set(&o.err, KERR_HOST_ERROR, "x");
	assert_true(sessions_reap_destroy_after_pause(&o));
	o.status = 409;
	kiln_err_set(&o.err, KERR_BUSY, "x");
	assert_false(sessions_reap_destroy_after_pause(&o));
	kiln_err_set(&o.err, KERR_NOT_RUNNING, "x");
	assert_false(sessions_reap_destroy_after_pause(&o));
	kiln_err_relay(&o.err, "exec_running", KERR_HOST_ERROR, "x"); /* the host's own 409 codes */
	assert_true(sessions_reap_destroy_after_pause(&o));
	o.status = 503;
	kiln_err_set(&o.err, KERR_HOST_UNAVAILABLE, "x");
	assert_false(sessions_reap_destroy_after_pause(&o));
	o.status = 404;
	kiln_err_set(&o.err, KERR_NOT_FOUND, "x");
	assert_false(sessions_reap_destroy_after_pause(&o));
}

static void test_reap_stale(void **state)
{
	struct store_session c = { .state = SESSION_RUNNING, .host_id = "h1" };
	int keep = -1;

	assert_false(sessions_reap_stale(1, &c, "h1", &keep));      /* it runs there */
	assert_true(sessions_reap_stale(1, &c, "h2", &keep));       /* it runs elsewhere */
	assert_true(keep);
	assert_true(sessions_reap_stale(0, &c, "h1", &keep));       /* unknown here */
	assert_false(keep);
	c.state = SESSION_PAUSED;
	c.has_snapshot = 1;
	assert_true(sessions_reap_stale(1, &c, "h1", &keep));
	assert_true(keep);
	c.state = SESSION_DESTROYED;
	assert_true(sessions_reap_stale(1, &c, "h1", &keep));
	assert_false(keep);
	c.state = SESSION_ERROR;
	c.has_snapshot = 0;
	assert_true(sessions_reap_stale(1, &c, "h1", &keep));
	assert_false(keep);
}

/* ---- the reaper acting ---- */

static void ready_h1(void)
{
	heartbeat("h1", 0);
	sched_tick(sc);
	assert_int_equal(sched_host_state(sc, "h1", NULL), 1);
}

static void test_reaper_idle_destroys(void **state)
{
	char id[40], r[64];

	customer(0);
	ready_h1();
	session("h1", 1, id);
	sessions_reap_once(ss, 0);
	assert_int_equal(state_of(id), SESSION_RUNNING);
	clock_advance(59000);
	sessions_reap_once(ss, 0);
	assert_int_equal(state_of(id), SESSION_RUNNING);
	clock_advance(2000);
	sessions_reap_once(ss, 0);
	assert_true(wait_state(id, SESSION_DESTROYED));
	assert_string_equal(reason_of(id, r), "idle_timeout");
	assert_true(fake_count("DELETE", "http://h1", "/v1/sessions/") >= 1);
}

/* A request in flight keeps an idle session; its lifetime ends it anyway. */
static void test_reaper_busy(void **state)
{
	char id[40], r[64];

	customer(0);
	ready_h1();
	session("h1", 1, id);
	sessions_op_enter(ss, id);
	clock_advance(600000);
	sessions_reap_once(ss, 0);
	assert_int_equal(state_of(id), SESSION_RUNNING);
	clock_advance(3600000);
	sessions_reap_once(ss, 0);
	assert_true(wait_state(id, SESSION_DESTROYED));
	assert_string_equal(reason_of(id, r), "max_lifetime");
	sessions_op_leave(ss, id);
}

/* session_auto_pause: paused (snapshot kept) instead; a paused session is
 * left alone afterwards, however long it stays. */
static void test_reaper_auto_pause(void **state)
{
	char id[40], p[96], r[64];
	int calls;

	customer(1);
	ready_h1();
	session("h1", 1, id);
	snprintf(p, sizeof(p), "/v1/sessions/%s/pause", id);
	fake_rule("POST", "http://h1", p, 200, "{\"snapshot\":{\"key\":\"k\",\"bytes\":1}}");
	clock_advance(3600001);
	sessions_reap_once(ss, 0);
	assert_true(wait_state(id, SESSION_PAUSED));
	assert_string_equal(reason_of(id, r), "max_lifetime");
	assert_int_equal(fake_count("POST", "http://h1", p), 1);
	{
		/* The snapshot says which host paused it (a resume goes back there). */
		json_t *sj = store_session_json(st, id, NULL);

		assert_string_equal(json_string_value(json_object_get(json_object_get(sj, "snapshot"), "host_id")) ?: "",
				    "h1");
		json_decref(sj);
	}
	calls = fake_count("DELETE", NULL, "/");
	clock_advance(100LL * 24 * 3600 * 1000);
	sessions_reap_once(ss, 0);
	real_nap();
	assert_int_equal(state_of(id), SESSION_PAUSED);
	assert_int_equal(fake_count("DELETE", NULL, "/"), calls);
}

/* A pause the host fails would leave it running past its limit: destroyed. */
static void test_reaper_pause_fails_destroys(void **state)
{
	char id[40], p[96], r[64];

	customer(1);
	ready_h1();
	session("h1", 1, id);
	snprintf(p, sizeof(p), "/v1/sessions/%s/pause", id);
	fake_rule("POST", "http://h1", p, 500, "{\"error\":{\"code\":\"snapshot_failed\",\"message\":\"s3\"}}");
	clock_advance(61000);
	sessions_reap_once(ss, 0);
	assert_true(wait_state(id, SESSION_DESTROYED));
	assert_string_equal(reason_of(id, r), "idle_timeout");
}

static void test_reaper_host_lost(void **state)
{
	char id[40], r[64];

	customer(0);
	ready_h1();
	session("h1", 1, id);
	clock_advance(10001);
	sched_tick(sc);
	assert_int_equal(sched_host_state(sc, "h1", NULL), 0);
	sessions_reap_once(ss, 0);
	assert_int_equal(state_of(id), SESSION_ERROR);
	assert_string_equal(reason_of(id, r), "host_lost");
}

/* A draining host's running sessions are paused (whatever the customer's
 * auto-pause says), not while a request runs in them, and a pause that
 * fails is tried again rather than the session destroyed. */
static void test_reaper_drain_pauses(void **state)
{
	char a[40], b[40], pa[96], pb[96], r[64];

	customer(0);
	ready_h1();
	session("h1", 1, a);
	session("h1", 1, b);
	snprintf(pa, sizeof(pa), "/v1/sessions/%s/pause", a);
	snprintf(pb, sizeof(pb), "/v1/sessions/%s/pause", b);
	fake_rule("POST", "http://h1", pa, 200, "{\"snapshot\":{\"key\":\"k\",\"bytes\":1}}");
	fake_rule("POST", "http://h1", pb, 500, "{\"error\":{\"code\":\"snapshot_failed\",\"message\":\"s3\"}}");
	sessions_reap_once(ss, 0);
	real_nap();
	assert_int_equal(fake_count("POST", "http://h1", pa), 0); /* not draining yet */
	assert_int_equal(store_host_set_drain(st, "h1", 1, 0), 0);
	sched_tick(sc);
	sessions_op_enter(ss, a);
	sessions_reap_once(ss, 0);
	real_nap();
	assert_int_equal(state_of(a), SESSION_RUNNING); /* a request runs in it */
	sessions_op_leave(ss, a);
	assert_true(wait_state(b, SESSION_RUNNING));
	assert_true(fake_count("POST", "http://h1", pb) >= 1);
	sessions_reap_once(ss, 0);
	assert_true(wait_state(a, SESSION_PAUSED));
	assert_string_equal(reason_of(a, r), "drain");
	/* b's pause failed: still running (not destroyed), tried again. */
	for (int i = 0; i < 100 && fake_count("POST", "http://h1", pb) < 2; i++) {
		sessions_reap_once(ss, 0);
		real_nap();
	}
	assert_true(fake_count("POST", "http://h1", pb) >= 2);
	assert_true(wait_state(b, SESSION_RUNNING));
	assert_int_equal(fake_count("DELETE", "http://h1", "/v1/sessions/"), 0);
}

/* Transient states no request is behind (a killed kiln-api's): the host
 * says how they ended. */
static void test_reaper_settles_leftovers(void **state)
{
	char a[40], b[40], c[40], p[96], r[64];
	enum session_state prev;
	json_t *snap;
	struct kiln_err err = { .code = "" };

	customer(0);
	ready_h1();
	session("h1", 0, a); /* starting; the host has it */
	session("h1", 0, b); /* starting; the host has not */
	session("h1", 1, c); /* resuming; the host has not */
	snprintf(p, sizeof(p), "/v1/sessions/%s", a);
	fake_rule("GET", "http://h1", p, 200, "{\"state\":\"running\"}");
	snprintf(p, sizeof(p), "/v1/sessions/%s", b);
	fake_rule("GET", "http://h1", p, 404, NULL);
	snprintf(p, sizeof(p), "/v1/sessions/%s", c);
	fake_rule("GET", "http://h1", p, 404, NULL);
	fake_rule("POST", "http://h1", p, 200, "{\"snapshot\":{\"key\":\"k\"}}"); /* its pause */
	assert_int_equal(store_session_transition(st, c, SESSION_RUNNING, SESSION_PAUSING, NULL, NULL, NULL), 1);
	snap = json_pack("{s:s}", "key", "k");
	assert_int_equal(store_session_transition(st, c, SESSION_PAUSING, SESSION_PAUSED, "", "paused", snap), 1);
	json_decref(snap);
	assert_int_equal(store_session_resume_begin(st, c, "acme", "h1", &prev, &err), 1);
	sessions_reap_once(ss, 0);
	assert_int_equal(state_of(a), SESSION_RUNNING);
	assert_int_equal(state_of(b), SESSION_ERROR);
	assert_string_equal(reason_of(b, r), "api_restart");
	assert_int_equal(state_of(c), SESSION_PAUSED);
	/* With a request in flight here it is no leftover. */
	session("h1", 0, a);
	sessions_op_enter(ss, a);
	sessions_reap_once(ss, 0);
	assert_int_equal(state_of(a), SESSION_STARTING);
	sessions_op_leave(ss, a);
}

/* Two replicas on one store (ss and rb, each with its lease owner): a
 * request in flight on one keeps the session from the other's reaper (an
 * exec past the idle limit; a pause under way in pausing); a killed
 * replica's lapsed lease does not, and its leftover is settled; renewal
 * keeps a lease alive and rewrites one that went missing. */
static void test_reaper_other_replica(void **state)
{
	struct kiln_err err = { .code = "" };
	struct sessions *rb = sessions_create(&cfg, st, sc, &fake_ops, &fake_clock, &err);
	struct store_session cur;
	char id[40], p[96];

	assert_non_null(rb);
	assert_string_not_equal(rb->owner, ss->owner);
	customer(0);
	ready_h1();
	session("h1", 1, id);
	/* An exec on ss, past the idle limit: rb's reaper keeps it. */
	sessions_op_enter_touch(ss, id);
	assert_int_equal(sessions_op_busy(rb, id), 0);
	clock_advance(600000);
	sessions_reap_once(rb, 0);
	real_nap();
	assert_int_equal(state_of(id), SESSION_RUNNING);
	/* A pause under way on ss: rb does not take pausing for a leftover. */
	assert_int_equal(store_session_transition(st, id, SESSION_RUNNING, SESSION_PAUSING, NULL, NULL, NULL), 1);
	snprintf(p, sizeof(p), "/v1/sessions/%s", id);
	fake_rule("GET", "http://h1", p, 404, NULL);
	sessions_reap_once(rb, 0);
	assert_int_equal(state_of(id), SESSION_PAUSING);
	assert_int_equal(fake_count("GET", "http://h1", p), 0);
	/* The lease lapses unrenewed (ss "killed": its ttl shortened to 1 ms
	 * and its last write made with it): rb settles the leftover. Renewed
	 * first, it lives. */
	ss->lease_ttl_ms = 1;
	sessions_leases_renew(ss);
	real_nap();
	assert_int_equal(store_session_get(st, id, NULL, &cur), 0);
	assert_int_equal(cur.leased, 0);
	ss->lease_ttl_ms = LEASE_TTL_MS;
	sessions_leases_renew(ss);
	assert_int_equal(store_session_get(st, id, NULL, &cur), 0);
	assert_int_equal(cur.leased, 1);
	/* A row gone behind its back (another replica's clean-up after an
	 * outage): the next renewal writes it again. */
	assert_int_equal(store_session_leases_gc(st, -3600000), 1);
	assert_int_equal(store_session_get(st, id, NULL, &cur), 0);
	assert_int_equal(cur.leased, 0);
	sessions_leases_renew(ss);
	assert_int_equal(store_session_get(st, id, NULL, &cur), 0);
	assert_int_equal(cur.leased, 1);
	sessions_reap_once(rb, 0);
	assert_int_equal(state_of(id), SESSION_PAUSING);
	ss->lease_ttl_ms = 1;
	sessions_leases_renew(ss);
	real_nap();
	sessions_reap_once(rb, 0);
	assert_int_equal(state_of(id), SESSION_PAUSED);
	assert_int_equal(fake_count("GET", "http://h1", p), 1);
	/* Its request ends: nothing of ss's is left in the store. */
	ss->lease_ttl_ms = LEASE_TTL_MS;
	sessions_op_leave_touch(ss, id);
	assert_int_equal(sessions_op_busy(ss, id), 0);
	assert_int_equal(store_session_leases_gc(st, -3600000), 0);
	assert_int_equal(sessions_stop(rb), 0);
}

/* ---- placement with retries (create and resume) ---- */

static void hosts(int n)
{
	char id[8];

	for (int i = 1; i <= n; i++) {
		snprintf(id, sizeof(id), "h%d", i);
		heartbeat(id, (unsigned)i - 1); /* h1 the emptiest, then h2, ... */
	}
	sched_tick(sc);
}

static int place(const char *p_, struct sessions_placement *p)
{
	struct sched_need need = { .vcpus = 1, .memory_mib = 256 };

	assert_int_equal(sched_place(sc, &need, NULL, 0, p->host, p->url), 0);
	return sessions_place_run(ss, &need, p_, "{\"customer\":\"acme\"}", 1000, p);
}

/* Full (503), unreachable, or already there (409): the next host. */
static void test_place_retries_next_host(void **state)
{
	struct sessions_placement p;

	hosts(3);
	fake_rule("POST", "http://h1", "/v1/sessions", 503, "{\"error\":{\"code\":\"no_capacity\",\"message\":\"full\"}}");
	fake_rule("POST", "http://h2", "/v1/sessions", -1, NULL);
	fake_rule("POST", "http://h3", "/v1/sessions", 201, "{\"id\":\"s\"}");
	assert_int_equal(place("/v1/sessions", &p), 1);
	assert_string_equal(p.host, "h3");
	assert_string_equal(p.url, "http://h3");
	assert_string_equal(fake_nth_url("POST", "/v1/sessions", 0), "http://h1");
	assert_string_equal(fake_nth_url("POST", "/v1/sessions", 1), "http://h2");
	assert_string_equal(fake_nth_url("POST", "/v1/sessions", 2), "http://h3");
	assert_null(fake_nth_url("POST", "/v1/sessions", 3));
}

/* Any other answer is the host refusing it outright: no other host. */
static void test_place_refused_outright(void **state)
{
	struct sessions_placement p;

	hosts(2);
	fake_rule("POST", "http://h1", "/v1/sessions", 400, "{\"error\":{\"code\":\"invalid_request\",\"message\":\"no\"}}");
	assert_int_equal(place("/v1/sessions", &p), 0);
	assert_string_equal(p.host, "h1");
	assert_int_equal(p.hr.status, 400);
	assert_non_null(strstr(p.hr.body, "invalid_request"));
	hostclient_reply_free(&p.hr);
	assert_int_equal(fake_count("POST", "http://h2", "/v1/sessions"), 0);
}

/* At most MAX_ATTEMPTS hosts; fewer when no other host has room. */
static void test_place_limit(void **state)
{
	struct sessions_placement p;

	hosts(6);
	fake_rule("POST", NULL, "/v1/sessions", 503, "{\"error\":{\"code\":\"no_capacity\",\"message\":\"full\"}}");
	assert_int_equal(place("/v1/sessions", &p), -1);
	assert_int_equal(fake_count("POST", NULL, "/v1/sessions"), MAX_ATTEMPTS);
	assert_non_null(strstr(p.last, "HTTP 503 no_capacity: full"));
	fake_reset();
	clock_advance(1000); /* the full hosts' moment of rest */
	fake_rule("POST", NULL, "/v1/sessions", -1, NULL);
	/* Only h1 and h2 have room now. */
	sched_host_full(sc, "h3");
	sched_host_full(sc, "h4");
	sched_host_full(sc, "h5");
	sched_host_full(sc, "h6");
	assert_int_equal(place("/v1/sessions", &p), -1);
	assert_int_equal(fake_count("POST", NULL, "/v1/sessions"), 2);
	assert_non_null(strstr(p.last, "cannot be reached"));
}

/* Resume goes through the same loop: 409 on to the next host; a 404 (its
 * snapshot is missing) ends it there. */
static void test_place_resume(void **state)
{
	struct sessions_placement p;

	hosts(2);
	fake_rule("POST", "http://h1", "/v1/sessions/s_1/resume", 409, "{\"error\":{\"code\":\"busy\",\"message\":\"x\"}}");
	fake_rule("POST", "http://h2", "/v1/sessions/s_1/resume", 200, "{}");
	assert_int_equal(place("/v1/sessions/s_1/resume", &p), 1);
	assert_string_equal(p.host, "h2");
	fake_rule("POST", NULL, "/v1/sessions/s_2/resume", 404, "{\"error\":{\"code\":\"no_snapshot\",\"message\":\"x\"}}");
	clock_advance(1000);
	assert_int_equal(place("/v1/sessions/s_2/resume", &p), 0);
	assert_int_equal(p.hr.status, 404);
	hostclient_reply_free(&p.hr);
	assert_int_equal(fake_count("POST", NULL, "/v1/sessions/s_2/resume"), 1);
}

/* Pause id on host (http://host answers 200). */
static void pause_on(const char *host, const char *id)
{
	struct sessions_outcome o = { .status = 0 };
	char url[32], p[96];

	snprintf(url, sizeof(url), "http://%s", host);
	snprintf(p, sizeof(p), "/v1/sessions/%s/pause", id);
	fake_rule("POST", url, p, 200, "{\"snapshot\":{\"key\":\"k\",\"bytes\":1}}");
	sessions_pause(ss, id, "paused", &o);
	assert_int_equal(o.status, 200);
	assert_int_equal(state_of(id), SESSION_PAUSED);
}

/* A paused session's destroy goes to the host that paused it (its pause
 * cache holds copies of the session's memory), whichever host comes first
 * otherwise. */
static void test_destroy_goes_to_pauser(void **state)
{
	struct sessions_outcome o = { .status = 0 };
	char id[40], del[128], host[8], url[32];

	customer(0);
	hosts(2);
	for (int i = 1; i <= 2; i++) {
		snprintf(host, sizeof(host), "h%d", i);
		snprintf(url, sizeof(url), "http://h%d", i);
		session(host, 1, id);
		pause_on(host, id);
		sessions_destroy(ss, id, "deleted", &o);
		assert_int_equal(o.status, 200);
		assert_int_equal(state_of(id), SESSION_DESTROYED);
		snprintf(del, sizeof(del), "/v1/sessions/%s?customer=acme", id);
		assert_int_equal(fake_count("DELETE", url, del), 1);
		assert_int_equal(fake_count("DELETE", NULL, del), 1);
	}
}

/* Resumed where it paused: nothing to clean. Resumed on another host (the
 * pausing one full): the pausing host is asked to drop its copies. */
static void test_resume_elsewhere_cleans(void **state)
{
	struct quota_limiter *lim = quota_limiter_new();
	struct sessions_request r = { .method = "POST", .customer = "acme", .lim = lim };
	struct store_session cur;
	enum MHD_Result ret;
	char id[40], res[96], pc[128];

	assert_non_null(lim);
	customer(0);
	hosts(2);
	session("h1", 1, id);
	snprintf(res, sizeof(res), "/v1/sessions/%s/resume", id);
	snprintf(pc, sizeof(pc), "/v1/sessions/%s/pause-cache", id);
	fake_rule("POST", NULL, res, 200, "{}");
	pause_on("h1", id);
	assert_int_equal(store_session_get(st, id, NULL, &cur), 0);
	assert_int_equal(sessions_resume_run(ss, &r, &cur, &ret), 1);
	assert_string_equal(fake_nth_url("POST", res, 0), "http://h1");
	assert_int_equal(fake_count("DELETE", NULL, pc), 0);

	pause_on("h1", id);
	sched_host_full(sc, "h1");
	assert_int_equal(store_session_get(st, id, NULL, &cur), 0);
	assert_int_equal(sessions_resume_run(ss, &r, &cur, &ret), 1);
	assert_string_equal(fake_nth_url("POST", res, 1), "http://h2");
	snprintf(pc, sizeof(pc), "/v1/sessions/%s/pause-cache?customer=acme", id);
	assert_int_equal(fake_count("DELETE", "http://h1", pc), 1);
	assert_int_equal(fake_count("DELETE", "http://h2", "/"), 0);
	quota_limiter_free(lim);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reap_decide),
		cmocka_unit_test(test_reap_destroy_after_pause),
		cmocka_unit_test(test_reap_stale),
		cmocka_unit_test_setup_teardown(test_reaper_idle_destroys, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reaper_busy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reaper_auto_pause, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reaper_pause_fails_destroys, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reaper_host_lost, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reaper_drain_pauses, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reaper_settles_leftovers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reaper_other_replica, setup, teardown),
		cmocka_unit_test_setup_teardown(test_place_retries_next_host, setup, teardown),
		cmocka_unit_test_setup_teardown(test_place_refused_outright, setup, teardown),
		cmocka_unit_test_setup_teardown(test_place_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_place_resume, setup, teardown),
		cmocka_unit_test_setup_teardown(test_destroy_goes_to_pauser, setup, teardown),
		cmocka_unit_test_setup_teardown(test_resume_elsewhere_cleans, setup, teardown),
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
