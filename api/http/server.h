/* server: kiln-api's HTTP layer (libmicrohttpd, one thread per connection,
 * so that long-polls and event streams may block): authentication (API keys,
 * the configured admin key, the cluster token for hosts), admission
 * (validation, quotas, submit rate, queue depth, host fit), the public,
 * admin and host endpoints (docs/api.md, "kiln-api"), and the per-task event
 * lists that GET /v1/tasks/{id}/events replays and follows.
 *
 * Room: the http room's door (api/http/: the routes and their dispatch,
 * the event hub events.c, inline artifacts artifacts.c, the web console
 * ui.c). It may call every other room of api/LAYERS and lib/; only
 * api/main.c includes it. */
#ifndef KILN_API_SERVER_H
#define KILN_API_SERVER_H

#include <jansson.h>

#include "base/base.h"
#include "err.h"
#include "store/store.h"

struct server;

/* What the server tells the scheduler. Every hook may be NULL; they are
 * called from HTTP threads after the store has committed the change. */
struct server_hooks {
	/* A task was queued (POST /v1/tasks answered 202): look again now. */
	void (*submitted)(void *ctx);
	/* A starting/running task got a cancel request (recorded in the store
	 * with cancel_requested; store_tasks_cancel_pending lists it until
	 * store_task_cancel_sent): forward it to its host. */
	void (*cancel_requested)(void *ctx, const char *task_id);
	/* The customer's S3 destination got new credentials for the same place:
	 * hand them to the hosts of its tasks not yet final. May be NULL. */
	void (*destination_changed)(void *ctx, const char *customer);
	void *ctx;
};

/* Listen on cfg->listen and serve until server_stop. cfg and st stay owned
 * by the caller and must outlive the server. hooks may be NULL (and set
 * later with server_set_hooks). Registers the server as the store's
 * listener, so every committed state change becomes a "state" event.
 * Returns NULL with err set. */
struct server *server_start(const struct api_config *cfg, struct store *st, const struct server_hooks *hooks,
			    struct kiln_err *err);
void server_set_hooks(struct server *s, const struct server_hooks *hooks);

/* `kiln-api check-config` (check_config.c): check what cfg (loaded from
 * path) would use without serving: the listen addresses, the store (the
 * SQLite file's directory, or a connection to PostgreSQL), the TLS
 * certificate and key (a matching PEM pair), S3 (one request on the bucket),
 * the web console's files. Prints the settings to stdout and one line per
 * problem to stderr. Returns the number of errors (0: fine). */
int server_check_config(const struct api_config *cfg, const char *path);

/* SIGHUP: read the TLS certificate and key again (tls.c); connections open
 * now keep the old one until they end. 0, or -1 with err (the running
 * certificate stays). Any thread. */
int server_reload(struct server *s, struct kiln_err *err);

/* Serve /v1/sessions with ss (sessions.h); until it is set (or after it is
 * set to NULL) those paths answer 503. */
struct sessions;
void server_set_sessions(struct server *s, struct sessions *ss);

/* Serve /v1/templates with t (templates.h); until it is set (or after it
 * is set to NULL) those paths answer 503. t must outlive server_stop. */
struct templates;
void server_set_templates(struct server *s, struct templates *t);

/* Stop: long-polls and event streams end, then the HTTP threads, then
 * everything is freed. */
void server_stop(struct server *s);

/* Append an event to the task's in-memory event list, which
 * GET /v1/tasks/{id}/events replays from its start and then follows; the
 * stream ends once the task's final "state" event has been sent.
 *   - event: a name ("stdout", "stderr", "upload_error", ...), data: any JSON
 *     (borrowed; copied as compact text). Sent as "event: NAME\ndata: JSON".
 *   - "state" events are NOT taken from here: the store produces them itself
 *     for every committed change (insert, store_task_transition,
 *     store_task_schedule, store_task_finish, store_task_cancel), so the
 *     scheduler records states only in the store and the streams follow.
 *     A "state" event passed here is ignored.
 *   - Bounds: 1 MiB of non-state events per task, 256 MiB in all, 4096
 *     tasks (the oldest finished ones with no reader are dropped first).
 *     Past a bound, a "truncated" event is added once and later output is
 *     only in the task's logs in S3; state events are always kept.
 *   - A task's list is made on its first event or first reader, starting
 *     with its current state; lists live in memory only (after a restart
 *     a stream starts from the current state).
 * Thread-safe; never blocks on I/O. Unknown task ids are ignored. */
void server_task_event(struct server *s, const char *task_id, const char *event, json_t *data);

/* The same with the signature of sched_config.relay (ctx is the server). */
void server_relay_event(void *server, const char *task_id, const char *event, json_t *data);

#endif
