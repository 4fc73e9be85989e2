/* scheduler_int.h: what the scheduler's files share: scheduler.c (the
 * scheduler thread: hosts, placement, lost hosts, cancels; the module's
 * lifetime and placement for sessions) and scheduler_watch.c (a placed
 * task's watcher: the push to its host and following it there). Not for
 * other rooms; unit tests reach the scheduler through scheduler.h. */
#ifndef KILN_API_SCHEDULER_INT_H
#define KILN_API_SCHEDULER_INT_H

#include <pthread.h>
#include <stdint.h>

#include "scheduler.h"

#define MAX_HOSTS 256
#define MAX_BATCH 256
#define TICK_MS 100
#define HOST_FULL_BACKOFF_MS 1000
#define WATCH_BACKOFF_MIN_MS 200   /* a watcher's first wait after a failed round */
#define WATCH_BACKOFF_MAX_MS 10000 /* doubling up to this */
#define REATTACH_MS 5000          /* PostgreSQL: the leader reattaches this often */
#define DRAIN_CHECK_MS 1000         /* past a drain's deadline, its host's tasks are looked for this often */
#define HOST_TEMPLATES 16           /* templates per host the scheduler keeps from its heartbeat */

/* One template a host holds (capacity.templates): key as store_task.tkey. */
struct host_template {
	char key[72];
	unsigned ready;              /* warm pool VMs of it */
};

struct host_view {
	char id[65];
	char url[256];
	int64_t last_hb_ms;
	int lost;                    /* as the store says (a heartbeat clears it) */
	int was_lost;                /* lost at the previous refresh: a heartbeat means it is back */
	/* vCPUs: used runs work and counts against total; idle is held by
	 * idle-stopped sessions, which count only against idle_max, the bound
	 * on used + idle (0: a host that does not report it). */
	unsigned vcpus_total, vcpus_used, vcpus_idle, vcpus_idle_max;
	uint64_t mem_total, mem_used;
	unsigned pool_ready, pool_mem, pool_vcpus;
	int egress;                  /* offers network egress */
	int draining;                /* drained (by an admin or kiln-host drain): no new work */
	int64_t drain_deadline_ms;   /* wall ms its tasks go back to the queue (0: none) */
	struct host_template templates[HOST_TEMPLATES];
	int ntemplates;
	/* Placed by us after the host's last heartbeat: not in its report yet. */
	unsigned inflight_vcpus;
	uint64_t inflight_mem;
	/* Left it (destroyed, paused) after its last heartbeat: still in its
	 * report, taken off used until the next one. */
	unsigned released_vcpus;
	uint64_t released_mem;
	int64_t full_until_ms;
};

struct watch {
	struct sched *s;
	char task[40], customer[65], host[65], url[256];
	enum task_state state;       /* as last recorded by this watcher */
	int push;                    /* push before following */
	int superseded;              /* the task was placed again elsewhere: a newer watcher has it */
	struct watch *next;
};

struct sched {
	struct store *st;
	struct sched_config cfg;
	char *token;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	pthread_cond_t hosts_read;   /* broadcast after each read of the hosts (sched_place_wait) */
	int stopping, woken;
	int want_full; /* the next tick reads the hosts and forwards cancels (sched_wake_full) */
	struct host_view hosts[MAX_HOSTS];
	int nhosts;
	struct watch *watches;       /* placed tasks being followed */
	int64_t started_ms;          /* hosts get a full timeout after our own start */
	unsigned nwatchers;
	const struct host_ops *ops;  /* how hosts are called (cfg.host or the real one) */
	const struct kiln_clock *clock;
	int threaded;                /* sched_start ran sched_main on s->thread */
	int reattached;
	int64_t last_reattach;       /* wall ms of the last forced reattach (PostgreSQL) */
	int64_t last_stored_sample;  /* wall ms of the last stored-levels sample (metering) */
	int64_t last_full;
	int64_t last_drain_check;    /* wall ms draining hosts' deadlines were last acted on */
};

/* A host call through s->ops with the cluster token (hostclient.h's
 * arguments and results). Any thread. */
int sched_host_call(struct sched *s, const char *url, const char *method, const char *path, json_t *body,
		    long timeout_ms, json_t **reply, struct kiln_err *err);

/* The host with this id in s->hosts, or NULL. Lock held. */
struct host_view *sched_host_find_locked(struct sched *s, const char *id);

/* Whether sched_stop has begun. Takes s->lock. */
int sched_stopping(struct sched *s);

/* Start a watcher thread for task t placed on h (pushing it first when
 * do_push): 0, or -1 (no thread; the task stays as the store has it).
 * Lock held. (scheduler_watch.c) */
int sched_watch_start_locked(struct sched *s, const struct store_task *t, const struct host_view *h, int do_push);

#endif
