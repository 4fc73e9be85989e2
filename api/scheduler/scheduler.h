/* scheduler: kiln-api's scheduler. Places queued tasks on live hosts with room
 * (fair across customers, FIFO within one, within each customer's running
 * quota), pushes them to their host, follows each placed task's event stream
 * to record its progress and relay its output, forwards cancels, and handles
 * hosts that stop heartbeating (never-started tasks go back to the queue;
 * started ones end as error/host_lost) and draining hosts (no new work; past
 * a drain's deadline their running tasks go back to the queue). All state that matters is in the
 * store, so a restarted kiln-api picks up where the last one stopped.
 *
 * Room: the scheduler room's door (api/scheduler/). It may call the base,
 * hostcall and store rooms and lib/. */
#ifndef KILN_SCHEDULER_H
#define KILN_SCHEDULER_H

#include <jansson.h>

#include "clock.h"
#include "err.h"
#include "hostcall/host_ops.h"
#include "store/store.h"

struct sched;

struct sched_config {
	const char *cluster_token;     /* Bearer for kiln-host */
	unsigned host_lost_after_ms;   /* no heartbeat for this long: the host is lost */
	/* Called for every event of a placed task (state changes, stdout/stderr
	 * chunks), from scheduler threads; data is borrowed. May be NULL. */
	void (*relay)(void *ctx, const char *task_id, const char *event, json_t *data);
	void *relay_ctx;
	/* How hosts are called and what time it is (the seams for tests):
	 * production passes &host_ops_hostclient and &clock_system; NULL means
	 * those too. Both must outlive the scheduler. */
	const struct host_ops *host;
	const struct kiln_clock *clock;
	/* The key that opens customers' destination secrets (32 bytes; NULL:
	 * none configured, so tasks of customers with a destination fail with
	 * destination_unavailable rather than go to kiln's bucket). */
	const unsigned char *dest_key;
};

/* Start the scheduler thread (and reattach to tasks a previous kiln-api
 * left placed). Returns NULL with err set. */
struct sched *sched_start(struct store *st, const struct sched_config *cfg, struct kiln_err *err);

/* A task was queued: place now, with the hosts as last read (they are read
 * again once per tick). */
void sched_wake(struct sched *s);
/* Capacity may have freed or a cancel waits: read the hosts, forward
 * cancels and place, now. */
void sched_wake_full(struct sched *s);

/* Forward a cancel of a placed (scheduled/starting/running) task to its
 * host. Returns 0 when forwarded, -1 when its host cannot be reached (the
 * task ends when the host is lost or answers later). */
int sched_cancel(struct sched *s, const char *task_id);

/* The customer's destination got new credentials for the same place: send
 * them to the hosts of its tasks that are placed and not final (PUT
 * /v1/tasks/{id}/destination), so that an upload refused for credentials is
 * retried with the new ones. Best effort (a host that cannot be reached is
 * logged); blocks for those calls. Thread-safe. */
void sched_destination_changed(struct sched *s, const char *customer);

/* Stop the thread (sched_start) and the watchers, then free. */
void sched_stop(struct sched *s);

/* ---- driving it by hand (unit tests) ----
 * sched_create sets a scheduler up without its thread: nothing happens
 * until sched_tick, which runs one full tick on the caller's thread (read
 * the hosts, judge lost and returned ones, reattach once, place, forward
 * cancels). Watchers of placed tasks still run on threads of their own.
 * sched_wake and sched_wake_full only flag it. sched_stop frees it. */
struct sched *sched_create(struct store *st, const struct sched_config *cfg, struct kiln_err *err);
void sched_tick(struct sched *s);

/* ---- placement outside the queue (sessions) ----
 * Sessions are not queued: a request to create or resume one is answered at
 * once, so it picks a host itself, by the same rules as queued tasks. */

struct sched_need {
	unsigned vcpus, memory_mib;
	int egress;                    /* only hosts that offer network egress */
	const char *tkey;              /* its template as store_task.tkey (NULL or "": default) */
	const char *prefer;            /* a host id to take when it has room (NULL or "": none): a
					* session's resume goes back to the host that paused it,
					* which reads the chunks from its own pause cache */
};

/* Pick a live host with room for need (as queued tasks are placed: from its
 * last report minus what was placed since, a warm pool VM of its size
 * preferred, else the emptiest), skipping the nexclude ids in exclude, and
 * count need as placed there until its next heartbeat reports it (a
 * template's host preferred as for tasks; a built-in only where listed;
 * need->prefer before any other when it has room and qualifies). Returns 0
 * with host_id and url filled; -ENOENT when no host is live; -E2BIG when no
 * live host is big enough (by its totals) or offers egress when asked;
 * -EBUSY when some are, but none has room now. Thread-safe. */
int sched_place(struct sched *s, const struct sched_need *need, char (*exclude)[65], int nexclude,
		char host_id[65], char url[256]);

/* sched_place, but while the answer is -EBUSY wait up to wait_ms for the
 * hosts' next heartbeats and try again (a session's create: its host's
 * sessions that go idle free their vCPUs within a few seconds, and the
 * heartbeat says so). Only with the scheduler's thread (sched_start); blocks
 * the caller. */
int sched_place_wait(struct sched *s, const struct sched_need *need, char (*exclude)[65], int nexclude,
		     char host_id[65], char url[256], unsigned wait_ms);

/* Undo sched_place's accounting (the host or the quota refused). */
void sched_unplace(struct sched *s, const char *host_id, const struct sched_need *need);

/* A session of vcpus and memory_mib left host_id (destroyed or paused
 * there): its room counts as free at once, not from the host's next
 * heartbeat (a create right after a destroy finds it). Thread-safe. */
void sched_release(struct sched *s, const char *host_id, unsigned vcpus, unsigned memory_mib);

/* The host answered that it is full: place nothing there for a moment. */
void sched_host_full(struct sched *s, const char *host_id);

/* 1 the host is live (url filled when not NULL, 256 bytes), 0 it is lost,
 * -1 unknown (not seen yet since this kiln-api started: do not judge). */
int sched_host_state(struct sched *s, const char *host_id, char url[256]);

/* 1 the host is live and draining (docs/api.md "Drain": it takes no new
 * work, its sessions are paused off it), else 0. Thread-safe. */
int sched_host_draining(struct sched *s, const char *host_id);

/* The live hosts (ids and URLs), at most max. Returns how many. */
int sched_live_hosts(struct sched *s, char (*ids)[65], char (*urls)[256], int max);

#endif
