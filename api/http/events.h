/* events: kiln-api's event hub, the per-task event lists that
 * GET /v1/tasks/{id}/events replays and follows (see server_task_event in
 * server.h for what they hold and their bounds). Each list is a lib/evlog.h
 * log; all share one lock, one condition variable and one memory pool. */
#ifndef KILN_API_EVENTS_H
#define KILN_API_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "evlog.h"
#include "store/store.h"

struct events;
struct ev_task;

/* An empty hub whose lists start from the task states in st. NULL when out
 * of memory. Feed it committed changes with
 * store_set_listener(st, events_store_listener, hub). */
struct events *events_new(struct store *st);
/* Free every list (after events_stop, once no reader is left). */
void events_free(struct events *h);

/* Wake every reader: streams end once they have sent what their list holds,
 * and events_stopping answers 1 from now on. Thread-safe. */
void events_stop(struct events *h);
int events_stopping(struct events *h);

/* The store's listener (a store_listener_fn; arg is the hub): committed
 * changes reach lists that exist. */
void events_store_listener(void *arg, const char *task_id, const char *event, json_t *data);

/* server_task_event on the hub h (see server.h). Thread-safe. */
void events_task_event(struct events *h, const char *task_id, const char *event, json_t *data);

/* The task's list with a reference taken, made (starting with the task's
 * current state) if there is none. NULL when the store has no such task.
 * Give it back with events_put. Thread-safe. */
struct ev_task *events_get(struct events *h, const char *id);
void events_put(struct events *h, struct ev_task *t);

/* Read the next bytes of t's stream at cur into buf (evlog_read): bytes,
 * 0 when nothing came by deadline_ms (monotonic), or EVLOG_END once the
 * list is closed and all of it was read, or the hub stops. Blocks. */
long events_read(struct ev_task *t, struct evlog_cursor *cur, char *buf, size_t max, int64_t deadline_ms);

#endif
