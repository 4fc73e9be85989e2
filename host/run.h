/* run: execute one task spec in a fresh VM and build its result. */
#ifndef KILN_RUN_H
#define KILN_RUN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "err.h"
#include "spec.h"
#include "net.h"
#include "pool.h"
#include "snapshot.h"
#include "vm.h"

struct run_opts {
	struct vm_config vm;       /* image paths, accel, run dir (vcpus/memory come from the spec) */
	const struct snapshot *snap; /* restore from it when its memory/vCPUs match the spec (NULL: cold) */
	const struct snapshot *net_snap; /* the same with a NIC, for tasks with egress (NULL: cold) */
	struct net_host *net;      /* egress set-up (NULL or disabled: tasks asking for egress fail) */
	struct pool *pool;         /* take a warm VM from it first when it matches (NULL: none) */
	struct capacity *cap;      /* reserve the task's memory here unless a pool VM brings its
				    * own reservation (NULL: no accounting); released at the end */
	const char *output_dir;    /* write /output files here (NULL: hash only) */
	FILE *stream;              /* NULL, or write stdout/stderr events here as JSON lines */
	int boot_timeout_s;        /* cold boot to kiln-init ready */
	int prereserved;           /* the caller already reserved the task's memory in cap (and
				    * releases it): a pool VM's own reservation is dropped */
	/* NULL, or called on the running thread as the task progresses: RUN_EV_RUNNING
	 * when the code has started, RUN_EV_STDOUT/STDERR with the raw bytes as they
	 * arrive (already bounded by the output limit), RUN_EV_EXITED when it ended;
	 * RUN_EV_BLOCKED (struct run_blocked) on another thread. */
	void (*on_event)(void *ctx, int event, const void *data, size_t len);
	void *event_ctx;
};

enum run_event { RUN_EV_RUNNING, RUN_EV_STDOUT, RUN_EV_STDERR, RUN_EV_EXITED, RUN_EV_BLOCKED };
/* RUN_EV_BLOCKED's data: a destination the sandbox's network dropped. It
 * comes from the network's own thread, not the task's. */
struct run_blocked {
	const char *destination; /* dotted quad */
	unsigned port;           /* 0 for ICMP and others */
	const char *protocol;    /* "tcp", "udp", "icmp" or "other" */
};

/* Run spec to completion and return the result object (see docs/api.md,
 * "Task result"): never NULL, also for infrastructure errors, which yield
 * state "error". The caller owns the returned reference. */
json_t *run_task(const struct task_spec *spec, const struct run_opts *opts);

/* A host-side view of a finished task, shared with the result encoder. */
enum run_state { RUN_SUCCEEDED, RUN_FAILED, RUN_TIMED_OUT, RUN_ERROR };

#endif
