/* pool: warm, paused VMs restored from one snapshot, refilled by one thread.
 * Every VM operation goes through the vm_ops the pool was started with, and
 * every back-off is measured on its clock (tests/unit/test_pool.c). */
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "clock.h"
#include "condwait.h"
#include "proto.h"
#include "vm_ops.h"

#define POOL_MAX 256
#define POOL_REFILLERS_MAX 4

/* The adaptive target (pool_set_max): recent takes per second, over a short
 * window (grows fast) and a long one (shrinks only after a quiet spell),
 * times how long a refill takes, twice over: enough ready VMs that takes
 * arriving at that rate find one while refills catch up. And one more
 * ready VM for every miss that follows another take within the long
 * window, kept until takes stop for that long: a
 * client that submits back to back slows down once the pool is empty
 * (each of its tasks then restores), so its rate understates what it
 * asks for; its misses do not. */
#define POOL_RATE_SHORT_MS 5000
#define POOL_RATE_LONG_MS  30000
#define POOL_TAKES         64     /* take times kept (a power of two) */
#define POOL_REFILL_MIN_MS 250    /* a refill is never assumed faster (TCG: ~250 ms of CPU) */
#define POOL_SHRINK_MS     1000   /* how often a full pool re-checks its target */

struct pool {
	struct snapshot snap;
	struct vm_config base;
	unsigned size;     /* the minimum: ready VMs kept whatever the demand */
	unsigned max;      /* the adaptive ceiling (== size: a fixed pool) */
	int64_t takes[POOL_TAKES]; /* times of the last takes (p->clk), a ring */
	unsigned ntakes;   /* takes so far (ring index) */
	int64_t refill_ms; /* moving average of restore + warm-up, 0 before the first */
	uint64_t misses;   /* takes that found no ready VM */
	unsigned boost;    /* ready VMs the misses add to the target (up to max - size) */
	struct capacity *cap;
	const struct vm_ops *ops;
	const struct kiln_clock *clk;

	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct vm *ready[POOL_MAX];
	unsigned nready;
	/* Second tier: QEMU processes already started in -incoming, waiting for a
	 * snapshot load (process start-up is most of a restore's cost). */
	struct vm *spawned[POOL_MAX];
	unsigned nspawned, spawn_target;
	int stop;
	pthread_t threads[POOL_REFILLERS_MAX]; /* refill threads: [0] from pool_start, more from pool_set_refills */
	unsigned nthreads;
	unsigned inflight; /* refills (restore + warm-up) under way */
	unsigned spawning; /* pre-starts under way */
	unsigned failures; /* consecutive refill failures: back off */
	unsigned kicks;    /* takes so far: they end a back-off early */
	int renice;        /* refills run at REFILL_NICE; hand-outs go back to 0 (__atomic: set by
			    * any refill thread, read by takes) */
};

/* The refill threads and the QEMUs they start (they inherit its nice value,
 * and their jails get the matching CPU weight: background()) run at
 * REFILL_NICE: a restore and warm-up is ~250 ms of CPU under TCG, and on a
 * small host it would otherwise take a core from the task that has just
 * taken a pool VM, and from its upload. Only if this process may raise a nice
 * value again (CAP_SYS_NICE): a VM handed out goes back to 0. */
#define REFILL_NICE 19

/* A VM the pool made: in the background until it is handed out. Its
 * threads inherited REFILL_NICE from the refill thread; this also lowers its
 * jail's CPU weight, without which the nice value counts for nothing against
 * a task's VM in a cgroup of its own (vm_set_nice). */
static void background(struct pool *p, struct vm *vm)
{
	int r;

	if (__atomic_load_n(&p->renice, __ATOMIC_RELAXED) && (r = p->ops->set_nice(p->ops->ctx, vm, REFILL_NICE)) < 0)
		fprintf(stderr, "kiln-host: pool: cannot lower the priority of a VM: %s\n", strerror(-r));
}

static int warm_and_pause(struct pool *p, struct vm *vm, struct kiln_err *err)
{
	background(p, vm);
	if (p->ops->warm_up(p->ops->ctx, vm, err) < 0)
		return -1;
	return p->ops->pause(p->ops->ctx, vm, err);
}

int capacity_reserve(struct capacity *c, unsigned mib)
{
	int ok;

	pthread_mutex_lock(&c->lock);
	ok = c->used_mib + mib <= c->total_mib;
	if (ok)
		c->used_mib += mib;
	pthread_mutex_unlock(&c->lock);
	return ok;
}

void capacity_release(struct capacity *c, unsigned mib)
{
	pthread_mutex_lock(&c->lock);
	c->used_mib -= mib;
	pthread_mutex_unlock(&c->lock);
}

/* Destroy a VM the pool allocated; returns NULL for `vm = discard(p, vm)`. */
static struct vm *discard(struct pool *p, struct vm *vm)
{
	if (vm) {
		p->ops->destroy(p->ops->ctx, vm);
		free(vm);
	}
	return NULL;
}

static void refill_lower_priority(struct pool *p)
{
	id_t self = (id_t)syscall(SYS_gettid);

	if (setpriority(PRIO_PROCESS, self, 1) < 0)
		return;
	if (setpriority(PRIO_PROCESS, self, 0) < 0)
		return; /* stays at 1: not worth a VM that cannot be raised again */
	if (setpriority(PRIO_PROCESS, self, REFILL_NICE) == 0)
		__atomic_store_n(&p->renice, 1, __ATOMIC_RELAXED);
}

/* A VM leaves the pool for a task: it gets the CPU share of any task. */
static void hand_out_priority(struct pool *p, struct vm *vm)
{
	int r;

	if (__atomic_load_n(&p->renice, __ATOMIC_RELAXED) && (r = p->ops->set_nice(p->ops->ctx, vm, 0)) < 0)
		fprintf(stderr, "kiln-host: pool: cannot restore the priority of a VM handed out: %s\n", strerror(-r));
}

/* With p->mu held: wait until a take or pool_stop, or ms of the pool's
 * clock. */
static void wait_kick(struct pool *p, int64_t ms)
{
	int64_t until = kclock_mono_ms(p->clk) + ms;
	unsigned kicks = p->kicks;

	while (!p->stop && p->kicks == kicks && condwait_until(&p->cv, &p->mu, p->clk, until) == 0)
		;
}

/* With p->mu held: takes per second over the last window_ms. */
static double take_rate(struct pool *p, int64_t now, int64_t window_ms)
{
	unsigned n = 0, have = p->ntakes < POOL_TAKES ? p->ntakes : POOL_TAKES;

	for (unsigned i = 0; i < have; i++)
		if (now - p->takes[(p->ntakes - 1 - i) % POOL_TAKES] <= window_ms)
			n++;
	return n * 1000.0 / (double)window_ms;
}

/* With p->mu held: whether the last take is within the long window. */
static int takes_recent(struct pool *p, int64_t now)
{
	return p->ntakes && now - p->takes[(p->ntakes - 1) % POOL_TAKES] <= POOL_RATE_LONG_MS;
}

/* With p->mu held: how many ready VMs to keep now. */
static unsigned target_locked(struct pool *p)
{
	int64_t now = kclock_mono_ms(p->clk);
	double rate, want, refill_s;
	unsigned t;

	if (p->max <= p->size)
		return p->size;
	rate = take_rate(p, now, POOL_RATE_SHORT_MS);
	if (take_rate(p, now, POOL_RATE_LONG_MS) > rate)
		rate = take_rate(p, now, POOL_RATE_LONG_MS);
	refill_s = (double)(p->refill_ms > POOL_REFILL_MIN_MS ? p->refill_ms : POOL_REFILL_MIN_MS) / 1000.0;
	want = 2.0 * rate * refill_s;
	if (p->boost && takes_recent(p, now) && (double)(p->size + p->boost) > want)
		want = (double)(p->size + p->boost);
	t = want >= (double)p->max ? p->max : (unsigned)want + (want > (unsigned)want);
	return t < p->size ? p->size : t;
}

static void *refill(void *arg)
{
	struct pool *p = arg;

	refill_lower_priority(p);
	pthread_mutex_lock(&p->mu);
	while (!p->stop) {
		struct kiln_err err = { .code = "" };
		struct vm *vm;
		unsigned target = target_locked(p);
		int64_t t0;

		if (p->nready > target) {
			/* Demand fell: give one VM's memory back, then look again. */
			vm = p->ready[--p->nready];
			pthread_mutex_unlock(&p->mu);
			discard(p, vm);
			capacity_release(p->cap, p->snap.memory_mib);
			pthread_mutex_lock(&p->mu);
			continue;
		}
		/* Ready VMs plus the refills under way (other threads'). A
		 * pre-start waits for them: QEMU's start-up beside a refill is
		 * more CPU taken from the task that caused both. */
		if (p->nready + p->inflight >= target &&
		    (p->nspawned + p->spawning >= p->spawn_target || p->inflight)) {
			if (p->max > p->size)
				wait_kick(p, POOL_SHRINK_MS); /* the target moves with time */
			else
				pthread_cond_wait(&p->cv, &p->mu);
			continue;
		}
		if (p->failures) {
			/* Back off after failures (bounded, and woken early by a take
			 * or pool_stop). */
			unsigned s = p->failures > 5 ? 30 : 1u << p->failures;

			wait_kick(p, (int64_t)s * 1000);
			if (p->stop)
				break;
		}
		if (p->nready + p->inflight >= target) {
			/* Ready tier full: top up the pre-started tier (no guest memory yet). */
			p->spawning++;
			pthread_mutex_unlock(&p->mu);
			vm = calloc(1, sizeof(*vm));
			if (vm && p->ops->spawn(p->ops->ctx, &p->snap, &p->base, vm, &err) < 0) {
				fprintf(stderr, "kiln-host: pool pre-start failed: %s\n", err.message);
				vm = discard(p, vm);
			}
			if (vm)
				background(p, vm);
			pthread_mutex_lock(&p->mu);
			p->spawning--;
			if (!vm) {
				p->failures++;
				continue;
			}
			p->failures = 0;
			if (p->stop) {
				discard(p, vm);
				break;
			}
			p->spawned[p->nspawned++] = vm;
			pthread_cond_broadcast(&p->cv);
			continue;
		}
		/* A pre-started QEMU makes this refill faster too. */
		vm = p->nspawned ? p->spawned[--p->nspawned] : NULL;
		p->inflight++;
		pthread_mutex_unlock(&p->mu);
		if (!capacity_reserve(p->cap, p->snap.memory_mib)) {
			pthread_mutex_lock(&p->mu);
			p->inflight--;
			pthread_cond_broadcast(&p->cv); /* a pre-start may wait for it */
			if (vm)
				p->spawned[p->nspawned++] = vm;
			/* No room now: wait until a task ends (pool_take / capacity release signal us). */
			wait_kick(p, 1000);
			continue;
		}
		t0 = kclock_mono_ms(p->clk);
		if (vm) {
			if (p->ops->load(p->ops->ctx, &p->snap, vm, &err) < 0 || warm_and_pause(p, vm, &err) < 0) {
				fprintf(stderr, "kiln-host: pool refill failed: %s\n", err.message);
				vm = discard(p, vm);
			}
		} else if ((vm = calloc(1, sizeof(*vm))) &&
			   (p->ops->restore(p->ops->ctx, &p->snap, &p->base, vm, &err) < 0 ||
			    warm_and_pause(p, vm, &err) < 0)) {
			fprintf(stderr, "kiln-host: pool refill failed: %s\n", err.message);
			vm = discard(p, vm);
		}
		pthread_mutex_lock(&p->mu);
		p->inflight--;
		pthread_cond_broadcast(&p->cv); /* a pre-start may wait for it */
		if (!vm) {
			capacity_release(p->cap, p->snap.memory_mib);
			p->failures++;
			continue;
		}
		p->failures = 0;
		{
			int64_t ms = kclock_mono_ms(p->clk) - t0;

			p->refill_ms = p->refill_ms ? (p->refill_ms * 7 + ms * 3) / 10 : ms;
		}
		if (p->stop) {
			discard(p, vm);
			capacity_release(p->cap, p->snap.memory_mib);
			break;
		}
		p->ready[p->nready++] = vm;
		pthread_cond_broadcast(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

struct pool *pool_start(const struct snapshot *s, const struct vm_config *base, unsigned size, unsigned prestart,
			struct capacity *cap, const struct vm_ops *ops, const struct kiln_clock *clk)
{
	struct pool *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->snap = *s;
	p->base = *base;
	p->size = p->max = size > POOL_MAX ? POOL_MAX : size;
	p->spawn_target = prestart > POOL_MAX ? POOL_MAX : prestart;
	p->cap = cap;
	p->ops = ops;
	p->clk = clk;
	pthread_mutex_init(&p->mu, NULL);
	condwait_init(&p->cv);
	/* QEMU processes get PR_SET_PDEATHSIG from the thread that forks them:
	 * this thread lives as long as the pool, and pool_stop destroys its VMs. */
	if (pthread_create(&p->threads[0], NULL, refill, p) != 0) {
		pthread_mutex_destroy(&p->mu);
		pthread_cond_destroy(&p->cv);
		free(p);
		return NULL;
	}
	p->nthreads = 1;
	return p;
}

/* Move the last VM of a tier into out (the tier's slot is freed) and wake
 * the refill thread. Returns 0 or -EAGAIN when the tier is empty. */
static int pop(struct pool *p, struct vm **tier, unsigned *n, struct vm *out)
{
	struct vm *v = NULL;

	pthread_mutex_lock(&p->mu);
	if (*n)
		v = tier[--*n];
	p->kicks++;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	if (!v)
		return -EAGAIN;
	*out = *v;
	free(v);
	return 0;
}

static unsigned count(struct pool *p, const unsigned *n)
{
	unsigned v;

	pthread_mutex_lock(&p->mu);
	v = *n;
	pthread_mutex_unlock(&p->mu);
	return v;
}

int pool_take(struct pool *p, struct vm *vm, struct kiln_err *err)
{
	int64_t now = kclock_mono_ms(p->clk);
	int r, recent;

	/* Every take counts towards the rate, a miss too (demand the pool did
	 * not meet). */
	pthread_mutex_lock(&p->mu);
	recent = takes_recent(p, now);
	if (!recent)
		p->boost = 0; /* a quiet spell ended what the last misses asked for */
	p->takes[p->ntakes++ % POOL_TAKES] = now;
	if (!p->nready) {
		p->misses++;
		/* Only a miss in a run of takes asks for more: the first take
		 * after a quiet spell (or of a pool still starting) says nothing
		 * about a client outrunning the refills. */
		if (recent && p->max > p->size && p->boost < p->max - p->size)
			p->boost++;
	}
	pthread_mutex_unlock(&p->mu);
	r = pop(p, p->ready, &p->nready, vm);

	if (r < 0)
		return r;
	hand_out_priority(p, vm);
	return p->ops->resume(p->ops->ctx, vm, err) < 0 ? -1 : 0;
}

int pool_take_prestarted(struct pool *p, struct vm *vm)
{
	int r = pop(p, p->spawned, &p->nspawned, vm);

	if (r == 0)
		hand_out_priority(p, vm);
	return r;
}

unsigned pool_prestarted(struct pool *p)
{
	return count(p, &p->nspawned);
}

unsigned pool_memory_mib(const struct pool *p)
{
	return p->snap.memory_mib;
}

const char *pool_release(const struct pool *p)
{
	return p->snap.release;
}

unsigned pool_vcpus(const struct pool *p)
{
	return p->snap.vcpus;
}

unsigned pool_ready(struct pool *p)
{
	return count(p, &p->nready);
}

void pool_set_max(struct pool *p, unsigned max)
{
	pthread_mutex_lock(&p->mu);
	p->max = max < p->size ? p->size : max > POOL_MAX ? POOL_MAX : max;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

void pool_set_refills(struct pool *p, unsigned n)
{
	pthread_mutex_lock(&p->mu);
	if (n > POOL_REFILLERS_MAX)
		n = POOL_REFILLERS_MAX;
	/* Threads are only added: each lives until pool_stop (the QEMUs it
	 * starts die with it, PR_SET_PDEATHSIG). */
	while (p->nthreads < n && !p->stop && pthread_create(&p->threads[p->nthreads], NULL, refill, p) == 0)
		p->nthreads++;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

void pool_stats(struct pool *p, struct pool_stats *st)
{
	pthread_mutex_lock(&p->mu);
	st->ready = p->nready;
	st->prestarted = p->nspawned;
	st->min = p->size;
	st->max = p->max;
	st->target = target_locked(p);
	st->misses = p->misses;
	st->takes = p->ntakes;
	st->refill_ms = p->refill_ms;
	st->refills = p->nthreads;
	pthread_mutex_unlock(&p->mu);
}

void pool_stop(struct pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (unsigned i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	for (unsigned i = 0; i < p->nready; i++) {
		discard(p, p->ready[i]);
		capacity_release(p->cap, p->snap.memory_mib);
	}
	for (unsigned i = 0; i < p->nspawned; i++)
		discard(p, p->spawned[i]);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p);
}
