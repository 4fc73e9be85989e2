/* pool: a warm pool of VMs restored from one snapshot, run once (so TCG has
 * translated the agent's hot path), then paused. A task takes a VM, resumes
 * it, and the pool refills in the background. A pool VM serves exactly one
 * task and is destroyed after it. */
#ifndef KILN_POOL_H
#define KILN_POOL_H

#include <pthread.h>
#include <stdint.h>

#include "err.h"
#include "vm/vm.h"

struct pool;
struct vm_ops;
struct kiln_clock;

/* Memory accounting shared by the pool and running tasks: the pool only
 * refills while reserving another VM's memory keeps the host within its
 * capacity. */
struct capacity {
	pthread_mutex_t lock;
	uint64_t total_mib;  /* nominal guest memory admitted: budget_mib x memory overcommit */
	uint64_t used_mib;   /* running VMs + pool VMs */
	uint64_t budget_mib; /* real memory all VMs may use together (0: not set, as in tests) */
	const char *memcg;   /* the memory cgroup holding every VM's (limit budget_mib), NULL: none */
};

/* Reserve mib of guest memory if it fits (returns 1) or not at all (0). */
int capacity_reserve(struct capacity *c, unsigned mib);
void capacity_release(struct capacity *c, unsigned mib);

/* Start a pool of `size` ready VMs of snapshot s (copied), plus `prestart`
 * QEMU processes started ahead in -incoming (no guest memory touched yet)
 * for restores when no ready VM is left. Refilling starts at once on a
 * background thread, ready VMs first. cap and its lock are shared with the
 * caller. Every VM operation goes through ops (kiln-host: vm_ops_real) and
 * the back-offs after failures are measured on clk (NULL: the system
 * clock); both must outlive the pool. */
struct pool *pool_start(const struct snapshot *s, const struct vm_config *base, unsigned size, unsigned prestart,
			struct capacity *cap, const struct vm_ops *ops, const struct kiln_clock *clk);

/* Take a pre-started QEMU for snapshot_load(). Returns 0 or -EAGAIN. */
int pool_take_prestarted(struct pool *p, struct vm *vm);
unsigned pool_prestarted(struct pool *p);

/* Take a ready VM: resume it (QMP cont) and return it in vm, running. The
 * VM's memory stays reserved in the capacity: the caller releases it
 * (capacity_release) when the VM is destroyed.
 * Returns 0, or -EAGAIN when no VM is ready (the caller restores or cold
 * boots instead), or -1 with err set: the VM could not be resumed (it died
 * while paused); it is the caller's all the same, to destroy and release.
 * Either way the refill thread is woken to fill the slot. Thread-safe. */
int pool_take(struct pool *p, struct vm *vm, struct kiln_err *err);

/* Memory of one pool VM (its snapshot's). */
unsigned pool_memory_mib(const struct pool *p);
unsigned pool_vcpus(const struct pool *p);
const char *pool_release(const struct pool *p); /* guest kernel release */
unsigned pool_ready(struct pool *p);

/* Let the pool grow past its size (the minimum) up to max ready VMs as
 * demand asks: the target is twice the takes expected while one refill
 * runs (recent takes per second, over 5 s and over 30 s, whichever is
 * higher, times the refill's moving average, at least 250 ms), so it shrinks
 * back 30 s after takes stop. Refills keep their low priority (nice 19 and
 * their jail's CPU weight, through vm_ops set_nice) and their
 * warm-up (measured: boosting them, or handing out VMs not warmed up to
 * keep up, made back-to-back tasks slower, not faster; docs/performance.md).
 * Every VM still reserves its memory in the capacity: the pool never grows
 * past it. max <= size: a fixed pool (the default). */
void pool_set_max(struct pool *p, unsigned max);

/* Refill with up to n threads at once (1-4; 1, the default, after
 * pool_start): while the pool is below its target, each restores and warms
 * up a VM of its own, at the same low priority. More than one only pays
 * where cores are left over while tasks run: every refill is CPU under TCG.
 * Threads are added, never removed (n below the current count: no change). */
void pool_set_refills(struct pool *p, unsigned n);

struct pool_stats {
	unsigned ready, prestarted, min, max, target;
	unsigned refills;       /* refill threads */
	uint64_t misses, takes; /* takes that found no ready VM; all takes */
	int64_t refill_ms;      /* moving average of a refill (restore + warm-up) */
};
void pool_stats(struct pool *p, struct pool_stats *st);

/* Stop refilling, destroy every ready and pre-started VM (through the
 * pool's vm_ops), give their memory back to the capacity, free the pool. */
void pool_stop(struct pool *p);

#endif
