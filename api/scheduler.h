/* scheduler: kiln-api's scheduler. Places queued tasks on live hosts with room
 * (fair across customers, FIFO within one, within each customer's running
 * quota), pushes them to their host, follows each placed task's event stream
 * to record its progress and relay its output, forwards cancels, and handles
 * hosts that stop heartbeating (never-started tasks go back to the queue;
 * started ones end as error/host_lost). All state that matters is in the
 * store, so a restarted kiln-api picks up where the last one stopped. */
#ifndef KILN_SCHEDULER_H
#define KILN_SCHEDULER_H

#include <jansson.h>

#include "err.h"
#include "store.h"

struct sched;

struct sched_config {
	const char *cluster_token;     /* Bearer for kiln-host */
	unsigned host_lost_after_ms;   /* no heartbeat for this long: the host is lost */
	/* Called for every event of a placed task (state changes, stdout/stderr
	 * chunks), from scheduler threads; data is borrowed. May be NULL. */
	void (*relay)(void *ctx, const char *task_id, const char *event, json_t *data);
	void *relay_ctx;
};

/* Start the scheduler thread (and reattach to tasks a previous kiln-api
 * left placed). Returns NULL with err set. */
struct sched *sched_start(struct store *st, const struct sched_config *cfg, struct kiln_err *err);

/* A task was queued or capacity may have freed: look again now. */
void sched_wake(struct sched *s);

/* Forward a cancel of a placed (scheduled/starting/running) task to its
 * host. Returns 0 when forwarded, -1 when its host cannot be reached (the
 * task ends when the host is lost or answers later). */
int sched_cancel(struct sched *s, const char *task_id);

void sched_stop(struct sched *s);

#endif
