/* Unit tests for the warm pool (host/run/pool.c) over fake VM operations and a
 * hand-moved clock (fake_vm_ops.h): filling to the target, take preferring
 * a ready VM, refilling after a take, a VM that died in the pool, the
 * pre-started tier, the capacity limit, back-off after failures on the
 * pool's clock, the adaptive target (growing with takes, shrinking when they
 * stop, misses counted), and shutdown destroying every VM it made (fake VMs created
 * = destroyed). No QEMU, no root. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "condwait.h"
#include "fake_vm_ops.h"
#include "pool.h"
#include "vm_ops.h"

#define MEM_MIB 256
#define WAIT_MS 5000 /* real-time bound for another thread to get somewhere */

struct fixture {
	struct fake_ops f;
	struct fake_clock clk;
	struct capacity cap;
	struct snapshot snap;
	struct vm_config base;
	struct pool *p;
};

static int setup(void **state)
{
	struct fixture *x = calloc(1, sizeof(*x));

	if (!x)
		return -1;
	fake_ops_init(&x->f);
	fake_clock_init(&x->clk);
	pthread_mutex_init(&x->cap.lock, NULL);
	x->cap.total_mib = 64 * MEM_MIB;
	x->snap.memory_mib = MEM_MIB;
	x->snap.vcpus = 1;
	snprintf(x->snap.release, sizeof(x->snap.release), "6.1.0-fake");
	*state = x;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *x = *state;

	pool_stop(x->p);
	fake_ops_free(&x->f);
	pthread_mutex_destroy(&x->cap.lock);
	free(x);
	return 0;
}

static void start(struct fixture *x, unsigned size, unsigned prestart)
{
	x->p = pool_start(&x->snap, &x->base, size, prestart, &x->cap, &x->f.ops, &x->clk.c);
	assert_non_null(x->p);
}

static uint64_t used_mib(struct fixture *x)
{
	uint64_t v;

	pthread_mutex_lock(&x->cap.lock);
	v = x->cap.used_mib;
	pthread_mutex_unlock(&x->cap.lock);
	return v;
}

/* Predicates for wait_for. */
struct want {
	struct fixture *x;
	unsigned n;
};

static int ready_is(void *arg)
{
	struct want *w = arg;

	return pool_ready(w->x->p) == w->n;
}

static int ready_and_prestarted_are(void *arg)
{
	struct want *w = arg;

	return pool_ready(w->x->p) == w->n && pool_prestarted(w->x->p) == w->n;
}

static int restores_are(void *arg)
{
	struct want *w = arg;

	return fake_count(&w->x->f, &w->x->f.restores) >= w->n;
}

/* Move the clock on in steps of 100 ms (a real millisecond apart) until
 * pred holds; returns how far it moved (fails past a minute). The pool's
 * waits end by its clock, so this bounds from below how long it waited. */
static int64_t advance_until(struct fixture *x, int (*pred)(void *), void *arg)
{
	int64_t moved = 0;

	while (!pred(arg)) {
		struct timespec ts = { 0, 1000000 };

		if (moved >= 60000)
			fail_msg("still waiting after a minute of the pool's clock");
		fake_clock_advance(&x->clk, 100);
		moved += 100;
		nanosleep(&ts, NULL);
	}
	return moved;
}

static void wait_ready(struct fixture *x, unsigned n)
{
	struct want w = { x, n };

	if (!wait_for(ready_is, &w, WAIT_MS))
		fail_msg("pool has %u ready VMs, not %u", pool_ready(x->p), n);
}

/* Stop the pool and check that it destroyed what it made and gave back its
 * memory; taken is what the test itself holds (and destroys first). */
static void stop_and_count(struct fixture *x)
{
	pool_stop(x->p);
	x->p = NULL;
	assert_int_equal(x->f.destroyed, x->f.created);
	assert_int_equal(used_mib(x), 0);
	for (int i = 1; i <= x->f.nvms; i++)
		assert_int_equal(x->f.state[i], FVM_DESTROYED);
}

/* Close (1) or open (0) the fake restore's gate: a closed one blocks every
 * refill in its restore until it opens. */
static void restore_gate(struct fixture *x, int closed)
{
	pthread_mutex_lock(&x->f.mu);
	x->f.restore_gate_closed = closed;
	pthread_cond_broadcast(&x->f.cv);
	pthread_mutex_unlock(&x->f.mu);
}

/* What run.c does with a VM it took: use it, destroy it, release its memory. */
static void give_back(struct fixture *x, struct vm *vm)
{
	x->f.ops.destroy(x->f.ops.ctx, vm);
	capacity_release(&x->cap, MEM_MIB);
}

static void fills_to_target(void **state)
{
	struct fixture *x = *state;

	start(x, 3, 0);
	wait_ready(x, 3);
	assert_int_equal(pool_prestarted(x->p), 0);
	/* Each one restored, warmed up, paused; its memory reserved. */
	assert_int_equal(fake_count(&x->f, &x->f.created), 3);
	assert_int_equal(fake_count(&x->f, &x->f.warmups), 3);
	assert_int_equal(fake_count(&x->f, &x->f.pauses), 3);
	assert_int_equal(used_mib(x), 3 * MEM_MIB);
	for (int i = 1; i <= 3; i++)
		assert_int_equal(x->f.state[i], FVM_PAUSED);
	assert_int_equal(pool_memory_mib(x->p), MEM_MIB);
	assert_int_equal(pool_vcpus(x->p), 1);
	assert_string_equal(pool_release(x->p), "6.1.0-fake");
	stop_and_count(x);
}

static void take_prefers_ready_vm_and_refills(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct vm vm;

	start(x, 2, 0);
	wait_ready(x, 2);
	assert_int_equal(pool_take(x->p, &vm, &err), 0);
	/* A VM the pool had warmed (no restore for the taker), now running. */
	assert_true(vm.pid >= 1 && vm.pid <= 2);
	assert_int_equal(x->f.state[vm.pid], FVM_RUNNING);
	assert_int_equal(fake_count(&x->f, &x->f.resumes), 1);
	/* Its memory stays reserved until the taker releases it. */
	wait_ready(x, 2);
	assert_int_equal(fake_count(&x->f, &x->f.created), 3);
	assert_int_equal(used_mib(x), 3 * MEM_MIB);
	give_back(x, &vm);
	stop_and_count(x);
}

static void take_from_empty_pool(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct vm vm;

	/* Room for no pool VM at all: nothing is ever ready. */
	x->cap.total_mib = MEM_MIB - 1;
	start(x, 2, 0);
	assert_int_equal(pool_take(x->p, &vm, &err), -EAGAIN);
	assert_int_equal(pool_take_prestarted(x->p, &vm), -EAGAIN);
	assert_int_equal(fake_count(&x->f, &x->f.created), 0);
	stop_and_count(x);
}

static void dead_vm_is_replaced(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct vm vm;

	start(x, 1, 0);
	wait_ready(x, 1);
	fake_kill(&x->f, 1);
	/* The taker learns at resume; the VM is its to destroy all the same. */
	assert_int_equal(pool_take(x->p, &vm, &err), -1);
	assert_string_equal(err.code, "vm_error");
	assert_int_equal(vm.pid, 1);
	give_back(x, &vm);
	/* The slot is refilled with a new VM. */
	wait_ready(x, 1);
	assert_int_equal(fake_count(&x->f, &x->f.created), 2);
	assert_int_equal(x->f.state[2], FVM_PAUSED);
	assert_int_equal(pool_take(x->p, &vm, &err), 0);
	assert_int_equal(vm.pid, 2);
	give_back(x, &vm);
	wait_ready(x, 1);
	stop_and_count(x);
}

static void prestarted_tier(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct want w = { x, 2 };
	struct vm vm;

	start(x, 2, 2);
	assert_true(wait_for(ready_and_prestarted_are, &w, WAIT_MS));
	/* Ready VMs first, from restores; then QEMUs in -incoming, no memory. */
	assert_int_equal(fake_count(&x->f, &x->f.restores), 2);
	assert_int_equal(fake_count(&x->f, &x->f.spawns), 2);
	assert_int_equal(used_mib(x), 2 * MEM_MIB);
	assert_int_equal(pool_take_prestarted(x->p, &vm), 0);
	assert_int_equal(x->f.state[vm.pid], FVM_SPAWNED);
	assert_int_equal(x->f.ops.load(x->f.ops.ctx, &x->snap, &vm, &err), 0);
	x->f.ops.destroy(x->f.ops.ctx, &vm);
	assert_true(wait_for(ready_and_prestarted_are, &w, WAIT_MS));
	/* A ready VM taken is refilled from a pre-started QEMU (a load, not a
	 * restore), and the pre-started tier tops up again. */
	assert_int_equal(pool_take(x->p, &vm, &err), 0);
	give_back(x, &vm);
	assert_true(wait_for(ready_and_prestarted_are, &w, WAIT_MS));
	assert_int_equal(fake_count(&x->f, &x->f.restores), 2);
	assert_int_equal(fake_count(&x->f, &x->f.loads), 2);
	stop_and_count(x);
}

static void capacity_bounds_the_pool(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct vm vm;

	struct want w = { x, 3 };
	struct timespec ts = { 0, 50000000 };

	x->cap.total_mib = 2 * MEM_MIB;
	start(x, 3, 0);
	wait_ready(x, 2);
	nanosleep(&ts, NULL);
	assert_int_equal(pool_ready(x->p), 2); /* and no more */
	assert_int_equal(fake_count(&x->f, &x->f.created), 2);
	/* A task takes one and ends: its slot is filled again. */
	assert_int_equal(pool_take(x->p, &vm, &err), 0);
	give_back(x, &vm);
	wait_ready(x, 2);
	assert_int_equal(fake_count(&x->f, &x->f.created), 3);
	/* More room (nobody signals the pool): it looks again every second of
	 * its clock. */
	pthread_mutex_lock(&x->cap.lock);
	x->cap.total_mib = 3 * MEM_MIB;
	pthread_mutex_unlock(&x->cap.lock);
	assert_true(advance_until(x, ready_is, &w) <= 1000 + 5000);
	assert_int_equal(used_mib(x), 3 * MEM_MIB);
	stop_and_count(x);
}

static void failures_back_off_on_the_clock(void **state)
{
	struct fixture *x = *state;
	struct want w1 = { x, 1 }, w2 = { x, 2 };
	int64_t moved;

	x->f.fail_restores = 1;
	start(x, 1, 0);
	assert_true(wait_for(restores_are, &w1, WAIT_MS));
	/* Real time passing does not end the back-off... */
	assert_false(wait_for(restores_are, &w2, 200));
	assert_int_equal(pool_ready(x->p), 0);
	assert_int_equal(used_mib(x), 0); /* the failed VM's reservation is back */
	/* ...2 s of the pool's clock after one failure does. */
	moved = advance_until(x, ready_is, &w1);
	assert_true(moved >= 2000);
	assert_true(moved < 30000);
	assert_int_equal(fake_count(&x->f, &x->f.restores), 2);
	stop_and_count(x);
}

static void failed_spawn_is_retried(void **state)
{
	struct fixture *x = *state;
	struct want w = { x, 1 };

	x->f.fail_spawns = 2;
	start(x, 1, 1);
	wait_ready(x, 1);
	/* 2 s, then 4 s of back-off, each failed QEMU destroyed. */
	assert_true(advance_until(x, ready_and_prestarted_are, &w) >= 6000);
	assert_int_equal(fake_count(&x->f, &x->f.spawns), 3);
	stop_and_count(x);
}

struct stopper {
	struct pool *p;
};

static void *stop_thread(void *arg)
{
	pool_stop(((struct stopper *)arg)->p);
	return NULL;
}

static int in_restore(void *arg)
{
	struct fixture *x = arg;
	int v;

	pthread_mutex_lock(&x->f.mu);
	v = x->f.in_restore;
	pthread_mutex_unlock(&x->f.mu);
	return v;
}

static void stop_during_refill_destroys_everything(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct timespec ts = { 0, 20000000 };
	struct stopper s;
	struct vm vm;
	pthread_t th;

	start(x, 3, 0);
	wait_ready(x, 3);
	/* The refill after this take blocks in its restore: pool_stop must wait
	 * for it and destroy the VM it brings back, as well as the ready ones. */
	restore_gate(x, 1);
	assert_int_equal(pool_take(x->p, &vm, &err), 0);
	give_back(x, &vm);
	assert_true(wait_for(in_restore, x, WAIT_MS));
	s.p = x->p;
	x->p = NULL;
	assert_int_equal(pthread_create(&th, NULL, stop_thread, &s), 0);
	nanosleep(&ts, NULL);
	restore_gate(x, 0);
	pthread_join(th, NULL);
	assert_int_equal(x->f.created, 4);
	assert_int_equal(x->f.destroyed, x->f.created);
	assert_int_equal(used_mib(x), 0);
}

struct waiter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	const struct kiln_clock *clk;
	int64_t until;
	int signalled;          /* the condition the waiter waits for */
	_Atomic int done, result;
};

/* A waiter as the pool and hostd write one: loop until the condition or the
 * deadline. */
static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	int r = 0;

	pthread_mutex_lock(&w->mu);
	while (!w->signalled && (r = condwait_until(&w->cv, &w->mu, w->clk, w->until)) == 0)
		;
	pthread_mutex_unlock(&w->mu);
	atomic_store(&w->result, r);
	atomic_store(&w->done, 1);
	return NULL;
}

static int waiter_done(void *arg)
{
	return atomic_load(&((struct waiter *)arg)->done);
}

static void condwait_follows_the_clock(void **state)
{
	struct fixture *x = *state;
	pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t cv;
	int64_t t0 = clock_mono_ms();

	assert_int_equal(condwait_init(&cv), 0);
	pthread_mutex_lock(&mu);
	/* A deadline passed already. */
	assert_int_equal(condwait_until(&cv, &mu, &x->clk.c, fake_mono(&x->clk)), ETIMEDOUT);
	/* The system clock: one real wait. */
	assert_int_equal(condwait_until(&cv, &mu, NULL, clock_mono_ms() + 20), ETIMEDOUT);
	assert_true(clock_mono_ms() - t0 >= 20);
	pthread_mutex_unlock(&mu);
	pthread_cond_destroy(&cv);

	/* A hand-moved clock: the wait ends when the clock gets to the deadline,
	 * however much real time passes... */
	{
		struct waiter w = { .mu = PTHREAD_MUTEX_INITIALIZER, .clk = &x->clk.c };
		pthread_t th;

		w.until = fake_mono(&x->clk) + 1000;
		condwait_init(&w.cv);
		assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
		assert_false(wait_for(waiter_done, &w, 100));
		fake_clock_advance(&x->clk, 999);
		assert_false(wait_for(waiter_done, &w, 50));
		fake_clock_advance(&x->clk, 1);
		assert_true(wait_for(waiter_done, &w, WAIT_MS));
		assert_int_equal(atomic_load(&w.result), ETIMEDOUT);
		pthread_join(th, NULL);
		pthread_cond_destroy(&w.cv);
	}
	/* ...or when its condition is signalled. */
	{
		struct waiter w = { .mu = PTHREAD_MUTEX_INITIALIZER, .clk = &x->clk.c };
		pthread_t th;

		w.until = fake_mono(&x->clk) + 1000;
		condwait_init(&w.cv);
		assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
		assert_false(wait_for(waiter_done, &w, 20));
		pthread_mutex_lock(&w.mu);
		w.signalled = 1;
		pthread_cond_broadcast(&w.cv);
		pthread_mutex_unlock(&w.mu);
		assert_true(wait_for(waiter_done, &w, WAIT_MS));
		assert_int_equal(atomic_load(&w.result), 0);
		pthread_join(th, NULL);
		pthread_cond_destroy(&w.cv);
	}
}

static int target_is(void *arg)
{
	struct want *w = arg;
	struct pool_stats st;

	pool_stats(w->x->p, &st);
	return st.target == w->n && st.ready == w->n;
}

/* A pool of size 1 that may grow to max, its one VM ready. */
static void start_adaptive(struct fixture *x, unsigned max)
{
	start(x, 1, 0);
	pool_set_max(x->p, max);
	wait_ready(x, 1);
}

/* Takes at 10 a second for 6 s: the adaptive pool grows to its max (2 x
 * 10/s x 250 ms = 5, capped at 4) and refills to it; 30 s of the pool's clock
 * without takes bring it back to its size, its VMs destroyed and their
 * memory given back. A take that found no ready VM counts as a miss. */
static void adapts_to_demand(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct pool_stats st;
	struct want w = { x, 4 };
	struct vm vm;

	start_adaptive(x, 4);
	pool_stats(x->p, &st);
	assert_int_equal(st.target, 1);
	assert_int_equal(st.min, 1);
	assert_int_equal(st.max, 4);
	for (int i = 0; i < 60; i++) {
		int r = pool_take(x->p, &vm, &err);

		assert_true(r == 0 || r == -EAGAIN);
		if (r == 0)
			give_back(x, &vm);
		fake_clock_advance(&x->clk, 100);
	}
	pool_stats(x->p, &st);
	assert_int_equal(st.takes, 60);
	assert_int_equal(st.target, 4);
	if (!wait_for(target_is, &w, WAIT_MS))
		fail_msg("pool did not grow to 4 ready VMs");
	assert_int_equal(used_mib(x), 4 * MEM_MIB);
	/* Quiet: after the long window the target is the size again. */
	w.n = 1;
	advance_until(x, target_is, &w);
	assert_int_equal(used_mib(x), MEM_MIB);
	assert_int_equal(fake_count(&x->f, &x->f.destroyed), fake_count(&x->f, &x->f.created) - 1);
	stop_and_count(x);
}

/* A take that finds the pool empty, in a run of takes, adds one ready VM
 * to the target (up to the maximum) for as long as takes go on: a client submitting back to back
 * slows down once it misses (its tasks then restore), so its rate alone
 * understates what it asks for. 30 s of the pool's clock without a take
 * end it, and the next take starts from the rate alone. */
static void misses_grow_the_target(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct pool_stats st;
	struct want w = { x, 4 };
	struct vm vm;

	start_adaptive(x, 8);
	/* Refills block in their restore: every take after the first misses. */
	restore_gate(x, 1);
	assert_int_equal(pool_take(x->p, &vm, &err), 0);
	give_back(x, &vm);
	for (int i = 0; i < 3; i++)
		assert_int_equal(pool_take(x->p, &vm, &err), -EAGAIN);
	pool_stats(x->p, &st);
	assert_int_equal(st.misses, 3);
	/* The rate alone asks for 4 takes / 5 s x 250 ms x 2 = 0.4 (the size,
	 * 1); the three misses add three. */
	assert_int_equal(st.target, 4);
	restore_gate(x, 0);
	if (!wait_for(target_is, &w, WAIT_MS))
		fail_msg("pool did not grow to 4 ready VMs");
	assert_int_equal(used_mib(x), 4 * MEM_MIB);
	/* 20 s on, a take that finds a VM keeps the target where it is. */
	fake_clock_advance(&x->clk, 20000);
	assert_int_equal(pool_take(x->p, &vm, &err), 0);
	give_back(x, &vm);
	pool_stats(x->p, &st);
	assert_int_equal(st.target, 4);
	if (!wait_for(target_is, &w, WAIT_MS))
		fail_msg("pool did not refill to 4 ready VMs");
	/* Quiet for the long window: back to its size, the VMs given back. */
	w.n = 1;
	advance_until(x, target_is, &w);
	assert_int_equal(used_mib(x), MEM_MIB);
	/* The next take starts from the rate alone. */
	assert_int_equal(pool_take(x->p, &vm, &err), 0);
	give_back(x, &vm);
	pool_stats(x->p, &st);
	assert_int_equal(st.target, 1);
	wait_ready(x, 1);
	stop_and_count(x);
}

/* The first take of a pool still starting (or after a quiet spell) that
 * misses does not grow the target: one task on a template whose pool has
 * just started is no client outrunning the refills. A second miss soon
 * after is. */
static void first_miss_does_not_grow_the_target(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct pool_stats st;
	struct vm vm;

	restore_gate(x, 1); /* the pool's first VM is not ready yet */
	start(x, 1, 0);
	pool_set_max(x->p, 8);
	assert_int_equal(pool_take(x->p, &vm, &err), -EAGAIN);
	pool_stats(x->p, &st);
	assert_int_equal(st.misses, 1);
	assert_int_equal(st.target, 1);
	assert_int_equal(pool_take(x->p, &vm, &err), -EAGAIN);
	pool_stats(x->p, &st);
	assert_int_equal(st.misses, 2);
	assert_int_equal(st.target, 2);
	restore_gate(x, 0);
	wait_ready(x, 2);
	stop_and_count(x);
}

static int restores_under_way(void *arg)
{
	struct want *w = arg;
	int v;

	pthread_mutex_lock(&w->x->f.mu);
	v = w->x->f.in_restore;
	pthread_mutex_unlock(&w->x->f.mu);
	return v == (int)w->n;
}

/* pool_set_refills(n): up to n refills at once while the pool is below its
 * target, never more, and never more than the target asks for; a pool
 * stopped with all of them blocked destroys what each brings back. */
static void refills_run_side_by_side(void **state)
{
	struct fixture *x = *state;
	struct want w = { x, 3 };
	struct pool_stats st;
	struct timespec ts = { 0, 20000000 };

	/* Every restore waits at the gate: the pool (size 4) asks for 4 VMs,
	 * 3 threads may restore at once. */
	restore_gate(x, 1);
	start(x, 4, 0);
	pool_set_refills(x->p, 3);
	if (!wait_for(restores_under_way, &w, WAIT_MS))
		fail_msg("%d restores under way, not 3", x->f.in_restore);
	nanosleep(&ts, NULL);
	pthread_mutex_lock(&x->f.mu);
	assert_int_equal(x->f.in_restore, 3);
	assert_int_equal(x->f.max_in_restore, 3);
	x->f.restore_gate_closed = 0;
	pthread_cond_broadcast(&x->f.cv);
	pthread_mutex_unlock(&x->f.mu);
	wait_ready(x, 4);
	pool_stats(x->p, &st);
	assert_int_equal(st.refills, 3);
	assert_int_equal(x->f.max_in_restore, 3);
	assert_int_equal(fake_count(&x->f, &x->f.restores), 4);
	/* More than the maximum is the maximum; fewer than there are: no change. */
	pool_set_refills(x->p, 99);
	pool_set_refills(x->p, 1);
	pool_stats(x->p, &st);
	assert_int_equal(st.refills, 4);
	stop_and_count(x);
}

/* With one refill thread (the default) and a target of 1, two refill
 * threads still restore one VM at a time: the target, not the threads,
 * decides how many are under way. */
static void refills_follow_the_target(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct vm vm;
	struct pool_stats st;

	start(x, 1, 0);
	pool_stats(x->p, &st);
	assert_int_equal(st.refills, 1);
	pool_set_refills(x->p, 2);
	wait_ready(x, 1);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(pool_take(x->p, &vm, &err), 0);
		give_back(x, &vm);
		wait_ready(x, 1);
	}
	assert_int_equal(x->f.max_in_restore, 1);
	assert_int_equal(fake_count(&x->f, &x->f.restores), 6);
	stop_and_count(x);
}

/* Without pool_set_max the pool keeps its size whatever the demand, and a
 * take from an empty pool is counted as a miss. */
static void fixed_pool_keeps_its_size(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct pool_stats st;
	struct vm vm;

	start(x, 1, 0);
	wait_ready(x, 1);
	for (int i = 0; i < 20; i++) {
		if (pool_take(x->p, &vm, &err) == 0)
			give_back(x, &vm);
		fake_clock_advance(&x->clk, 100);
	}
	wait_ready(x, 1);
	pool_stats(x->p, &st);
	assert_int_equal(st.target, 1);
	assert_int_equal(st.max, 1);
	assert_int_equal(st.takes, 20);
	assert_int_equal(used_mib(x), MEM_MIB);
	stop_and_count(x);
	/* A pool that can hold nothing: every take is a miss. */
	x->cap.total_mib = MEM_MIB - 1;
	start(x, 1, 0);
	assert_int_equal(pool_take(x->p, &vm, &err), -EAGAIN);
	assert_int_equal(pool_take(x->p, &vm, &err), -EAGAIN);
	pool_stats(x->p, &st);
	assert_int_equal(st.misses, 2);
	assert_int_equal(st.ready, 0);
	stop_and_count(x);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(fills_to_target, setup, teardown),
		cmocka_unit_test_setup_teardown(take_prefers_ready_vm_and_refills, setup, teardown),
		cmocka_unit_test_setup_teardown(take_from_empty_pool, setup, teardown),
		cmocka_unit_test_setup_teardown(dead_vm_is_replaced, setup, teardown),
		cmocka_unit_test_setup_teardown(prestarted_tier, setup, teardown),
		cmocka_unit_test_setup_teardown(capacity_bounds_the_pool, setup, teardown),
		cmocka_unit_test_setup_teardown(failures_back_off_on_the_clock, setup, teardown),
		cmocka_unit_test_setup_teardown(failed_spawn_is_retried, setup, teardown),
		cmocka_unit_test_setup_teardown(stop_during_refill_destroys_everything, setup, teardown),
		cmocka_unit_test_setup_teardown(condwait_follows_the_clock, setup, teardown),
		cmocka_unit_test_setup_teardown(adapts_to_demand, setup, teardown),
		cmocka_unit_test_setup_teardown(fixed_pool_keeps_its_size, setup, teardown),
		cmocka_unit_test_setup_teardown(refills_run_side_by_side, setup, teardown),
		cmocka_unit_test_setup_teardown(refills_follow_the_target, setup, teardown),
		cmocka_unit_test_setup_teardown(misses_grow_the_target, setup, teardown),
		cmocka_unit_test_setup_teardown(first_miss_does_not_grow_the_target, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
