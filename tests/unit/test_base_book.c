/* test_base_book: the bookkeeping behind bases put in S3 ahead of the
 * first pause (host/session/base_book.c): a snapshot is prepared once, a
 * failed one is retried only after BASE_BOOK_RETRY_MS; one worker at a time
 * takes the queue in order; stopping refuses new work, makes the worker's
 * next pop its last, waits for it only up to its deadline, and drops what
 * was never run; the lock of a base holds a second uploader of the same
 * base (and only of that one) until the first leaves. No I/O. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "base_book.h"
#include "clock.h"

static int dropped;

struct job {
	struct base_book_job j;
	int n;
};

static void job_drop(struct base_book_job *j)
{
	dropped++;
	free(j);
}

static struct base_book_job *job_new(int n)
{
	struct job *p = calloc(1, sizeof(*p));

	assert_non_null(p);
	p->j.drop = job_drop;
	p->n = n;
	return &p->j;
}

static void test_claim(void **state)
{
	struct base_book *b = base_book_new();

	(void)state;
	assert_non_null(b);
	assert_int_equal(base_book_claim(b, "snap-a", 0, BASE_BOOK_RETRY_MS), 1);
	/* Under way: nobody else starts it. */
	assert_int_equal(base_book_claim(b, "snap-a", 10, BASE_BOOK_RETRY_MS), 0);
	assert_int_equal(base_book_claim(b, "snap-b", 10, BASE_BOOK_RETRY_MS), 1);
	/* Done: never again in this process. */
	base_book_done(b, "snap-a", 1, 100);
	assert_int_equal(base_book_claim(b, "snap-a", 100 + 10 * BASE_BOOK_RETRY_MS, BASE_BOOK_RETRY_MS), 0);
	/* Failed: again once the retry delay has passed, not before. */
	base_book_done(b, "snap-b", 0, 1000);
	assert_int_equal(base_book_claim(b, "snap-b", 1000 + BASE_BOOK_RETRY_MS - 1, BASE_BOOK_RETRY_MS), 0);
	assert_int_equal(base_book_claim(b, "snap-b", 1000 + BASE_BOOK_RETRY_MS, BASE_BOOK_RETRY_MS), 1);
	assert_int_equal(base_book_claim(b, "snap-b", 1000 + BASE_BOOK_RETRY_MS, BASE_BOOK_RETRY_MS), 0);
	base_book_unref(b);
}

static void test_queue(void **state)
{
	struct base_book *b = base_book_new();
	struct base_book_job *j;

	(void)state;
	dropped = 0;
	/* The first job asks for a worker, the next ones go to it. */
	assert_int_equal(base_book_push(b, job_new(1)), 1);
	assert_int_equal(base_book_push(b, job_new(2)), 0);
	assert_int_equal(base_book_push(b, job_new(3)), 0);
	for (int n = 1; n <= 3; n++) {
		j = base_book_pop(b);
		assert_non_null(j);
		assert_int_equal(((struct job *)j)->n, n);
		j->drop(j);
	}
	/* Empty: the worker is gone, the next job asks for a new one. */
	assert_null(base_book_pop(b));
	assert_int_equal(base_book_push(b, job_new(4)), 1);
	assert_int_equal(base_book_stop(b, 0), 1); /* it has not popped: still counted */
	/* Stopping: nothing more is taken or queued, claims are refused. */
	assert_null(base_book_pop(b));
	assert_int_equal(base_book_stop(b, 0), 0);
	assert_int_equal(base_book_stopping(b), 1);
	j = job_new(5);
	assert_int_equal(base_book_push(b, j), -1);
	j->drop(j);
	assert_int_equal(base_book_claim(b, "snap-c", 0, BASE_BOOK_RETRY_MS), 0);
	assert_int_equal(dropped, 4);
	/* Job 4, never run, goes with the last reference. */
	base_book_ref(b);
	base_book_unref(b);
	assert_int_equal(dropped, 4);
	base_book_unref(b);
	assert_int_equal(dropped, 5);
}

/* A worker that pops after delay_ms (or after the book stopped). */
struct slow_worker {
	struct base_book *b;
	int delay_ms;
};

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static void *slow_worker_main(void *arg)
{
	struct slow_worker *w = arg;
	struct base_book_job *j;

	sleep_ms(w->delay_ms);
	while ((j = base_book_pop(w->b)))
		j->drop(j);
	base_book_unref(w->b);
	return NULL;
}

static void test_stop_waits(void **state)
{
	struct base_book *b = base_book_new();
	struct slow_worker w = { b, 100 };
	pthread_t th;
	int64_t t0;

	(void)state;
	dropped = 0;
	/* A worker that ends within the deadline is waited for. */
	assert_int_equal(base_book_push(b, job_new(1)), 1);
	base_book_ref(b);
	assert_int_equal(pthread_create(&th, NULL, slow_worker_main, &w), 0);
	t0 = kclock_mono_ms(NULL);
	assert_int_equal(base_book_stop(b, 5000), 0);
	assert_true(kclock_mono_ms(NULL) - t0 < 4000);
	pthread_join(th, NULL);
	assert_int_equal(dropped, 0);
	base_book_unref(b);
	assert_int_equal(dropped, 1); /* stopped before it was taken */

	/* One that does not is left behind after the deadline, its
	 * reference keeping the book alive until it ends. */
	b = base_book_new();
	w = (struct slow_worker){ b, 600 };
	assert_int_equal(base_book_push(b, job_new(2)), 1);
	base_book_ref(b);
	assert_int_equal(pthread_create(&th, NULL, slow_worker_main, &w), 0);
	t0 = kclock_mono_ms(NULL);
	assert_int_equal(base_book_stop(b, 150), 1);
	assert_true(kclock_mono_ms(NULL) - t0 >= 150);
	base_book_unref(b); /* the table's reference; the worker's remains */
	pthread_join(th, NULL);
	assert_int_equal(dropped, 2);
}

/* An uploader of sha: enters, records its order, leaves. */
struct uploader {
	struct base_book *b;
	const char *sha;
	int entered;              /* set once inside */
	pthread_mutex_t *mu;
};

static void *uploader_main(void *arg)
{
	struct uploader *u = arg;

	base_book_enter(u->b, u->sha);
	pthread_mutex_lock(u->mu);
	u->entered = 1;
	pthread_mutex_unlock(u->mu);
	base_book_leave(u->b, u->sha);
	return NULL;
}

static int entered(struct uploader *u)
{
	int v;

	pthread_mutex_lock(u->mu);
	v = u->entered;
	pthread_mutex_unlock(u->mu);
	return v;
}

static void test_base_lock(void **state)
{
	struct base_book *b = base_book_new();
	pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	struct uploader same = { b, "aaaa", 0, &mu }, other = { b, "bbbb", 0, &mu };
	pthread_t t1, t2;

	(void)state;
	base_book_enter(b, "aaaa");
	assert_int_equal(pthread_create(&t1, NULL, uploader_main, &same), 0);
	assert_int_equal(pthread_create(&t2, NULL, uploader_main, &other), 0);
	/* Another base is not held up. */
	pthread_join(t2, NULL);
	assert_int_equal(entered(&other), 1);
	/* The same one waits while it is held... */
	sleep_ms(100);
	assert_int_equal(entered(&same), 0);
	/* ...and goes in once it is left. */
	base_book_leave(b, "aaaa");
	pthread_join(t1, NULL);
	assert_int_equal(entered(&same), 1);
	/* Free again. */
	base_book_enter(b, "aaaa");
	base_book_leave(b, "aaaa");
	base_book_unref(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_claim),
		cmocka_unit_test(test_queue),
		cmocka_unit_test(test_stop_waits),
		cmocka_unit_test(test_base_lock),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
