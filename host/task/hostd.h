/* hostd: the task engine of the kiln-host daemon. Accepts tasks (durable in
 * the spool before the caller hears "accepted"), runs each on its own thread
 * in a fresh VM, streams its progress as events, spools its outputs and logs,
 * uploads them to S3 with retries until S3 confirms them, and recovers after a
 * crash. The HTTP layer (serve.c) is a thin shell over these calls. */
#ifndef KILN_HOSTD_H
#define KILN_HOSTD_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "dest.h"
#include "err.h"
#include "evlog.h"
#include "run/run.h"
#include "s3.h"

#define HOSTD_INLINE_MAX_DEFAULT 4096 /* kiln-api's result holds up to 4 KiB of each log whole */
#define HOSTD_INLINE_MAX_LIMIT 65536

struct hostd_config {
	const char *host_id;
	const char *spool_dir;
	unsigned vcpus_total;        /* vCPUs that may run work at once (overcommit applied) */
	/* vCPUs admitted in all, idle-stopped sessions' included
	 * (capacity.idle_vcpus; 0: 64 x vcpus_total; at least vcpus_total). */
	unsigned vcpus_idle_max;
	const struct s3_config *s3;  /* NULL: no S3 (POST /v1/tasks is refused) */
	/* The operator's exceptions for customers' destinations
	 * (destinations.allow_addresses; NULL: none). Every connection to a
	 * destination is checked against lib/netaddr.h's rule and these, at
	 * the address it goes to. Owned by the caller; must outlive the hostd. */
	const struct netaddr_allow *dest_allow;
	unsigned upload_workers;     /* threads uploading to S3 */
	unsigned max_backoff_s;      /* cap of the retry back-off */
	/* stdout.log / stderr.log of at most this many bytes are not uploaded
	 * as objects of their own: manifest.json carries them ("inline",
	 * base64), and the task's artifacts say so (0: every log is an object). */
	unsigned inline_log_max;
	unsigned retention_s;        /* finished task records are kept this long */
	const char *accel;           /* for reports: "kvm" or "tcg" */
	/* The template store (NULL: every task runs on ro as given, the
	 * default template). Owned by the caller; must outlive the hostd. */
	struct template_store *templates;
};

struct hostd;
struct hostd_task;
struct template_store;
struct template_ref;
struct vm_ops;
struct kiln_clock;

/* Open the spool, recover what a previous process left (tasks that were
 * running end as error/host_restart; pending uploads resume), start the upload
 * threads. Tasks run and their outputs go to S3 through ops (kiln-host:
 * vm_ops_real); timestamps, upload back-offs and the retention follow clk
 * (NULL: the system clock). ro, cap, pool, ops and clk stay owned by the
 * caller and must outlive the hostd. Returns NULL with err set. */
struct hostd *hostd_open(const struct hostd_config *cfg, const struct run_opts *ro, struct capacity *cap,
			 struct pool *pool, const struct vm_ops *ops, const struct kiln_clock *clk, struct kiln_err *err);

/* Begin shutting down: refuse new tasks, end event streams, cancel running
 * tasks (they end as error/host_shutdown). Idempotent; hostd_close follows. */
void hostd_stop(struct hostd *d);

/* hostd_stop, then wait for the workers, stop the upload threads,
 * free everything. Tasks waiting for upload stay in the spool for the next
 * start. */
void hostd_close(struct hostd *d);

/* Parse a POST /v1/tasks body {"id","customer","spec","template"?,
 * "destination"?} ("destination" is left in the document for the caller's
 * dest_from_json): unknown
 * keys and duplicate keys are refused. Returns the parsed document (the
 * caller decrefs it; *id, *customer, *spec and *template point into it; *template
 * is NULL when there is no "template", and is parsed with template_ref_parse_json),
 * or NULL with err set ("invalid_json" or "invalid_request", naming the
 * field). Reentrant. */
json_t *hostd_request_parse(const char *body, size_t len, const char **id, const char **customer, json_t **spec,
			    json_t **template, struct kiln_err *err);

/* A task to accept (POST /v1/tasks). Nothing in it is kept: what the task
 * needs is copied. */
struct hostd_submission {
	const char *id, *customer;
	json_t *spec;                /* the spec object: parsed here, once; the worker gets the struct */
	/* The task's template (NULL: default): a built-in this host lacks is
	 * refused with "no_template" (503), one that must be fetched without S3
	 * with "no_s3". The template is fetched, verified and snapshotted on the
	 * task's own thread; a failure there ends the task as error with the
	 * template's error (no_template, invalid_image for a SHA-256 mismatch,
	 * s3_*). */
	const struct template_ref *ref;
	/* The customer's own S3 destination (NULL: the host's S3): the task's
	 * outputs, logs and manifest go there, under its prefix
	 * (PREFIX + CUSTOMER/ID/...); kept in the task's spool record (mode
	 * 0600: the secret is at rest there until the task is uploaded). */
	const struct dest *dest;
};

/* Accept a task: validate (id, customer, spec), reserve vCPUs and memory,
 * write its record durably, start it. Returns 0, or -1 with err->code one of
 * "invalid_request"/"invalid_spec" (400), "duplicate" (409), "no_capacity" and
 * "no_s3" (503), "no_template" (503), "host_error" (500). Thread-safe. */
int hostd_submit(struct hostd *d, const struct hostd_submission *sub, struct kiln_err *err);

/* Replace the credentials of task id's destination (PUT
 * /v1/tasks/{id}/destination): dest must name the same place as the one
 * the task has (dest_same_place); its record is rewritten and a waiting
 * upload retried now. 0; -1 with err: "not_found" (no such task),
 * "invalid_request" (the task has no destination, or another place),
 * "host_error". Thread-safe. */
int hostd_set_dest(struct hostd *d, const char *id, const struct dest *dest, struct kiln_err *err);

/* The task's public JSON (docs/api.md), or NULL when there is no such task. */
json_t *hostd_task_json(struct hostd *d, const char *id);

/* [{"id","customer","state"}] of the host's tasks, newest first; with
 * unfinished_only, only those not final yet (for kiln-api's reconciliation
 * when a host it thought lost comes back). */
json_t *hostd_task_list(struct hostd *d, int unfinished_only);

/* Cancel: a task not started yet ends at once, a starting or running one has
 * its VM destroyed. Returns 0; -ENOENT for no such task; -EALREADY when its
 * code already ended (uploading or final). */
int hostd_cancel(struct hostd *d, const char *id);

/* Events (server-sent-event text blocks) of one task, for GET .../events.
 * hostd_task_get takes a reference (NULL: no such task); hostd_events_read
 * copies the stream's bytes from *cursor on into buf (at most cap bytes; an
 * event larger than cap goes out over several calls, never cut: libmicrohttpd
 * offers as little as its 32 KiB connection buffer, less than one stdout
 * chunk's JSON), waiting until deadline_ms (clock_mono_ms) for new ones when
 * every event was read. Returns bytes copied, 0 on timeout (between events:
 * send a keep-alive), or -1 when the stream is over (the task is final and
 * every event was read, or the daemon stops). A cursor starts zeroed. */
struct hostd_task *hostd_task_get(struct hostd *d, const char *id);
void hostd_task_put(struct hostd *d, struct hostd_task *t);
long hostd_events_read(struct hostd *d, struct hostd_task *t, struct evlog_cursor *cursor, char *buf, size_t cap,
		       int64_t deadline_ms);

/* GET /v1/capacity and GET /metrics bodies (caller frees / decrefs). */
json_t *hostd_capacity_json(struct hostd *d);

/* kiln-host drain / undrain: the capacity (and so the heartbeat) says
 * "draining" (with "drain_deadline_ms", wall ms, when deadline_ms > 0), and
 * kiln-api sends no new work here (docs/api.md "Drain"). Any thread. */
void hostd_set_drain(struct hostd *d, int draining, int64_t deadline_ms);

/* Capacity for work that is not a task (sessions, builds): reserve vCPUs
 * and guest memory, or refuse with err "no_capacity" naming which; and give
 * it back. The vCPUs are admitted as active (running work): the active ones
 * may not pass vcpus_total, active and idle ones together not
 * vcpus_idle_max (tasks are admitted by the same rule). Thread-safe. */
int hostd_reserve(struct hostd *d, unsigned vcpus, unsigned memory_mib, struct kiln_err *err);
/* hostd_reserve, but when only the active vCPUs are full, wait up to wait_ms
 * for some to go idle or be released before refusing (a session created
 * right after others finds them active until the idler has stopped them:
 * a short wait, not a refusal). Blocks the caller: not on an event loop. */
int hostd_reserve_wait(struct hostd *d, unsigned vcpus, unsigned memory_mib, unsigned wait_ms, struct kiln_err *err);
/* hostd_release gives back active vCPUs: a caller that moved its vCPUs to
 * idle moves them back (hostd_vcpus_wake) first. */
void hostd_release(struct hostd *d, unsigned vcpus, unsigned memory_mib);
/* A session's vCPUs were stopped while it is idle: n reserved vCPUs move from
 * active to idle, so they no longer count against vcpus_total. And back:
 * hostd_vcpus_wake never refuses, even when the active ones then pass
 * vcpus_total (a woken sandbox still runs; the VMs' equal CPU shares decide
 * who gets the cores, so a burst of wake-ups slows down rather than fails).
 * The session room calls these under its table's lock: hostd takes no
 * session lock, so that order is the only one. Thread-safe. */
void hostd_vcpus_idle(struct hostd *d, unsigned n);
void hostd_vcpus_wake(struct hostd *d, unsigned n);
/* The template store (NULL: none). */
struct template_store *hostd_templates(const struct hostd *d);
/* The run options tasks use (image, snapshots, network, jail). */
const struct run_opts *hostd_run_opts(const struct hostd *d);
/* A private copy of the current S3 settings (SIGHUP may replace them):
 * 0, or -1 when there are none. Free with hostd_s3_free. */
struct hostd_s3 {
	struct s3_config c;
	char *s[5];
};
int hostd_s3_take(struct hostd *d, struct hostd_s3 *out);
/* The operator's exceptions for customers' destinations (hostd_config's
 * dest_allow; NULL: none). Fixed for the hostd's life. */
const struct netaddr_allow *hostd_dest_allow(const struct hostd *d);
void hostd_s3_free(struct hostd_s3 *s);
char *hostd_metrics(struct hostd *d);

/* Replace the S3 settings (SIGHUP after a config fix); pending uploads retry
 * at once with the new ones. The strings are copied. */
void hostd_set_s3(struct hostd *d, const struct s3_config *s3);

/* Run fn(ctx) on the janitor's timer: every period_ms (the first a period
 * from now), on an upload thread, without the table's lock (fn may block on
 * disk or S3; one call at a time). The sessions' pause-cache sweep. fn NULL
 * removes it: returns once a call in flight has ended, so ctx may go then.
 * Any thread but fn's own. */
void hostd_set_janitor_hook(struct hostd *d, void (*fn)(void *ctx), void *ctx, unsigned period_ms);

#endif
