/* test_evlog: the shared event log (lib/evlog.h): the bytes of each block,
 * readers at their own cursors, a waiting reader woken by an append and by
 * close, the deadline, dropping output events, and the bounds (per log and
 * pooled, "state" never refused, one "truncated" note). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "clock.h"
#include "evlog.h"

struct fixture {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int stopping;
};

static void fixture_init(struct fixture *f)
{
	pthread_condattr_t ca;

	memset(f, 0, sizeof(*f));
	pthread_mutex_init(&f->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&f->cond, &ca);
	pthread_condattr_destroy(&ca);
}

static void fixture_fini(struct fixture *f)
{
	pthread_mutex_destroy(&f->lock);
	pthread_cond_destroy(&f->cond);
}

static void log_init(struct evlog *l, struct fixture *f, size_t max)
{
	evlog_init(l, &(struct evlog_opts){ .lock = &f->lock, .cond = &f->cond, .stopping = &f->stopping,
					    .max_bytes = max, .truncated_data = "{}" });
}

static int append(struct evlog *l, struct fixture *f, const char *name, const char *json)
{
	json_t *d = json_loads(json, JSON_DECODE_ANY, NULL);
	int r;

	assert_non_null(d);
	pthread_mutex_lock(&f->lock);
	r = evlog_append_locked(l, name, d);
	pthread_mutex_unlock(&f->lock);
	json_decref(d);
	return r;
}

/* Everything readable now, as one string (deadline already past). */
static char *read_now(struct evlog *l, struct evlog_cursor *c, size_t cap, int whole, long *ret)
{
	static char buf[4096];

	assert_true(cap < sizeof(buf));
	*ret = evlog_read(l, c, buf, cap, 0, whole);
	buf[*ret > 0 ? *ret : 0] = '\0';
	return buf;
}

static void test_blocks_and_cursors(void **state)
{
	struct fixture f;
	struct evlog l;
	struct evlog_cursor a = { 0 }, b = { 0 };
	long n;

	fixture_init(&f);
	log_init(&l, &f, 1 << 20);
	assert_int_equal(append(&l, &f, "state", "{\"state\":\"running\"}"), 0);
	assert_string_equal(read_now(&l, &a, 1000, 0, &n), "event: state\ndata: {\"state\":\"running\"}\n\n");
	assert_int_equal(append(&l, &f, "stdout", "{\"data\":\"hi\"}"), 0);
	/* a goes on from where it was; b, late, sees both from the first. */
	assert_string_equal(read_now(&l, &a, 1000, 0, &n), "event: stdout\ndata: {\"data\":\"hi\"}\n\n");
	assert_string_equal(read_now(&l, &b, 1000, 0, &n),
			    "event: state\ndata: {\"state\":\"running\"}\n\nevent: stdout\ndata: {\"data\":\"hi\"}\n\n");
	/* Nothing new, deadline past: 0 (a keep-alive for the caller). */
	read_now(&l, &a, 1000, 0, &n);
	assert_int_equal(n, 0);
	/* The counted bytes are the blocks' lengths. */
	assert_int_equal(l.bytes, strlen("event: state\ndata: {\"state\":\"running\"}\n\n") +
					  strlen("event: stdout\ndata: {\"data\":\"hi\"}\n\n"));
	evlog_free(&l);
	fixture_fini(&f);
}

/* Split reads (kiln-api) resume mid-block; whole reads (kiln-host) copy
 * whole blocks only, cutting one that is larger than the buffer. */
static void test_split_and_whole(void **state)
{
	struct fixture f;
	struct evlog l;
	struct evlog_cursor c = { 0 };
	const char *b1 = "event: a\ndata: [1]\n\n", *b2 = "event: b\ndata: [22]\n\n";
	char all[64];
	long n;

	fixture_init(&f);
	log_init(&l, &f, 1 << 20);
	append(&l, &f, "a", "[1]");
	append(&l, &f, "b", "[22]");
	snprintf(all, sizeof(all), "%s%s", b1, b2);
	for (size_t got = 0; got < strlen(all); got += (size_t)n) {
		const char *p = read_now(&l, &c, 5, 0, &n);

		assert_true(n > 0 && n <= 5);
		assert_memory_equal(p, all + got, (size_t)n);
	}
	c = (struct evlog_cursor){ 0 };
	assert_string_equal(read_now(&l, &c, strlen(b1) + 3, 1, &n), b1); /* b2 does not fit after b1 */
	assert_string_equal(read_now(&l, &c, 100, 1, &n), b2);
	c = (struct evlog_cursor){ 0 };
	read_now(&l, &c, 4, 1, &n); /* larger than the buffer: cut, and passed */
	assert_int_equal(n, 4);
	assert_int_equal(c.next, 1);
	evlog_free(&l);
	fixture_fini(&f);
}

struct reader {
	struct evlog *l;
	int64_t deadline;
	long ret;
	int started;
	char buf[256];
};

static void *reader_main(void *arg)
{
	struct reader *r = arg;
	struct evlog_cursor c = { 0 };

	__atomic_store_n(&r->started, 1, __ATOMIC_SEQ_CST);
	r->ret = evlog_read(r->l, &c, r->buf, sizeof(r->buf) - 1, r->deadline, 0);
	return NULL;
}

/* Start a reader and let it get as far as the log (most often into its
 * wait; when not, the result it must give is the same). */
static void reader_start(pthread_t *th, struct reader *r)
{
	assert_int_equal(pthread_create(th, NULL, reader_main, r), 0);
	while (!__atomic_load_n(&r->started, __ATOMIC_SEQ_CST))
		sched_yield();
	sched_yield();
}

/* A reader with nothing to read waits; an append wakes it with the event,
 * close (and the owner's stopping flag) with the end. Long deadlines: a
 * wake-up that did not happen fails by the reader still waiting, not by
 * timing. */
static void test_wakeups(void **state)
{
	struct fixture f;
	struct evlog l;
	struct reader r = { .l = &l };
	pthread_t th;

	fixture_init(&f);
	log_init(&l, &f, 1 << 20);
	r.deadline = clock_mono_ms() + 60000;
	reader_start(&th, &r);
	append(&l, &f, "stdout", "[1]");
	pthread_join(th, NULL);
	assert_int_equal(r.ret, (long)strlen("event: stdout\ndata: [1]\n\n"));
	{
		struct reader r3 = { .l = &l, .deadline = clock_mono_ms() + 60000 };
		struct evlog l2;

		log_init(&l2, &f, 1 << 20);
		r3.l = &l2;
		reader_start(&th, &r3);
		pthread_mutex_lock(&f.lock);
		evlog_close_locked(&l2);
		pthread_mutex_unlock(&f.lock);
		pthread_join(th, NULL);
		assert_int_equal(r3.ret, EVLOG_END);
		evlog_free(&l2);
	}
	{
		struct reader r4 = { .deadline = clock_mono_ms() + 60000 };
		struct evlog l3;

		log_init(&l3, &f, 1 << 20);
		r4.l = &l3;
		reader_start(&th, &r4);
		pthread_mutex_lock(&f.lock);
		f.stopping = 1;
		pthread_cond_broadcast(&f.cond);
		pthread_mutex_unlock(&f.lock);
		pthread_join(th, NULL);
		assert_int_equal(r4.ret, EVLOG_END);
		evlog_free(&l3);
		f.stopping = 0;
	}
	evlog_free(&l);
	fixture_fini(&f);
}

/* Closed: what is left is still read, then the end; appends still land. */
static void test_close_and_deadline(void **state)
{
	struct fixture f;
	struct evlog l;
	struct evlog_cursor c = { 0 };
	char buf[64];
	int64_t t0;
	long n;

	fixture_init(&f);
	log_init(&l, &f, 1 << 20);
	/* Nothing, a deadline 50 ms ahead: 0, and not before it. */
	t0 = clock_mono_ms();
	assert_int_equal(evlog_read(&l, &c, buf, sizeof(buf), t0 + 50, 0), 0);
	assert_true(clock_mono_ms() >= t0 + 50);
	append(&l, &f, "state", "[1]");
	pthread_mutex_lock(&f.lock);
	evlog_close_locked(&l);
	pthread_mutex_unlock(&f.lock);
	read_now(&l, &c, 100, 0, &n);
	assert_true(n > 0);
	read_now(&l, &c, 100, 0, &n);
	assert_int_equal(n, EVLOG_END);
	append(&l, &f, "stdout", "[2]");
	assert_string_equal(read_now(&l, &c, 100, 0, &n), "event: stdout\ndata: [2]\n\n");
	read_now(&l, &c, 100, 0, &n);
	assert_int_equal(n, EVLOG_END);
	evlog_free(&l);
	fixture_fini(&f);
}

static void test_drop(void **state)
{
	static const char *const output[] = { "stdout", "stderr", NULL };
	static const char note[] = "event: truncated\ndata: {}\n\n";
	struct fixture f;
	struct evlog l;
	struct evlog_cursor early = { 0 }, mid = { 0 }, late = { 0 };
	size_t before;
	long n;

	fixture_init(&f);
	log_init(&l, &f, 1 << 20);
	append(&l, &f, "state", "[1]");
	append(&l, &f, "stdout", "[2]");
	read_now(&l, &mid, 100, 1, &n); /* mid has read "state" only */
	append(&l, &f, "stderr", "[3]");
	append(&l, &f, "stdoutx", "[4]"); /* a name that merely starts like one */
	append(&l, &f, "stdout", "[5]");
	append(&l, &f, "state", "[6]");
	before = l.bytes;
	pthread_mutex_lock(&f.lock);
	assert_int_equal(evlog_drop_locked(&l, output, note), 3);
	pthread_mutex_unlock(&f.lock);
	assert_int_equal(l.bytes, before - 3 * strlen("event: stdout\ndata: [2]\n\n") + strlen(note));
	assert_string_equal(read_now(&l, &early, 1000, 1, &n),
			    "event: state\ndata: [1]\n\nevent: stdoutx\ndata: [4]\n\n"
			    "event: truncated\ndata: {}\n\nevent: state\ndata: [6]\n\n");
	assert_string_equal(read_now(&l, &mid, 1000, 1, &n),
			    "event: stdoutx\ndata: [4]\n\nevent: truncated\ndata: {}\n\nevent: state\ndata: [6]\n\n");
	late.next = l.n;
	read_now(&l, &late, 1000, 1, &n);
	assert_int_equal(n, 0);
	/* Nothing left to drop: no second note. */
	pthread_mutex_lock(&f.lock);
	assert_int_equal(evlog_drop_locked(&l, output, note), 0);
	pthread_mutex_unlock(&f.lock);
	evlog_free(&l);
	fixture_fini(&f);
}

static int reclaims;
static struct evlog *reclaim_victim;

static void reclaim(void *ctx)
{
	reclaims++;
	if (reclaim_victim) {
		evlog_free(reclaim_victim);
		reclaim_victim = NULL;
	}
}

static void test_bounds(void **state)
{
	struct fixture f;
	struct evlog l, other;
	struct evlog_pool pool = { .max = 200 };
	struct evlog_cursor c = { 0 };
	size_t one = strlen("event: stdout\ndata: [\"xxxxxxxxx\"]\n\n"); /* 35 */
	long n;

	fixture_init(&f);
	/* Per log: 100 bytes take two 35-byte events; the third becomes the
	 * one note, the fourth is dropped; "state" still goes in. */
	log_init(&l, &f, 100);
	assert_int_equal(append(&l, &f, "stdout", "[\"xxxxxxxxx\"]"), 0);
	assert_int_equal(append(&l, &f, "stdout", "[\"xxxxxxxxx\"]"), 0);
	assert_int_equal(l.bytes, 2 * one);
	assert_int_equal(append(&l, &f, "stdout", "[\"xxxxxxxxx\"]"), 1);
	assert_int_equal(append(&l, &f, "stdout", "[\"xxxxxxxxx\"]"), -ENOSPC);
	assert_int_equal(append(&l, &f, "state", "{\"state\":\"succeeded\",\"padding\":\"yyyyyyyyyyyyyyyyyyyy\"}"), 0);
	assert_non_null(strstr(read_now(&l, &c, 1000, 0, &n),
			       "event: truncated\ndata: {}\n\nevent: state\n"));
	assert_int_equal(l.n, 4);
	evlog_free(&l);

	/* Pooled: the pool's bound applies across logs, and reclaim gets one
	 * chance to make room before an event is refused. */
	evlog_init(&l, &(struct evlog_opts){ .lock = &f.lock, .cond = &f.cond, .max_bytes = 1000, .pool = &pool,
					     .reclaim = reclaim, .truncated_data = "{}" });
	evlog_init(&other, &(struct evlog_opts){ .lock = &f.lock, .cond = &f.cond, .max_bytes = 1000, .pool = &pool,
						 .reclaim = reclaim, .truncated_data = "{}" });
	for (int i = 0; i < 3; i++)
		assert_int_equal(append(&other, &f, "stdout", "[\"xxxxxxxxx\"]"), 0);
	assert_int_equal(pool.bytes, 3 * one);
	assert_int_equal(append(&l, &f, "stdout", "[\"xxxxxxxxx\"]"), 0);
	assert_int_equal(reclaims, 0);
	assert_int_equal(pool.bytes, 4 * one); /* 140 of 200 */
	assert_int_equal(append(&l, &f, "stdout", "[\"xxxxxxxxx\"]"), 0);
	reclaim_victim = &other; /* next time: frees other, room is made */
	assert_int_equal(append(&l, &f, "stdout", "[\"xxxxxxxxx\"]"), 0);
	assert_int_equal(reclaims, 1);
	assert_int_equal(pool.bytes, 3 * one);
	assert_int_equal(append(&l, &f, "stdout", "[\"xxxxxxxxx\"]"), 0);
	assert_int_equal(append(&l, &f, "stdout", "[\"xxxxxxxxx\"]"), 0);
	/* 175 + 35 > 200 and nothing to reclaim: the note. */
	assert_int_equal(append(&l, &f, "stdout", "[\"xxxxxxxxx\"]"), 1);
	assert_int_equal(reclaims, 2);
	evlog_free(&l);
	evlog_free(&other);
	assert_int_equal(pool.bytes, 0);
	fixture_fini(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_blocks_and_cursors), cmocka_unit_test(test_split_and_whole),
		cmocka_unit_test(test_wakeups),
		cmocka_unit_test(test_close_and_deadline), cmocka_unit_test(test_drop),
		cmocka_unit_test(test_bounds),
	};

	return cmocka_run_group_tests_name("evlog", tests, NULL, NULL);
}
