/* store: kiln-api's durable state in SQLite (WAL, synchronous=FULL) or
 * PostgreSQL (sdb.h; schema migrations for both): customers and their quotas, API keys (only SHA-256 hashes),
 * tasks with their whole lifecycle, registered hosts. Every write that a
 * client is told about has been committed (fsync'd) first.
 *
 * Thread-safety: a store handle is used by many HTTP threads and the
 * scheduler at once; every call takes the store's lock (one SQLite
 * connection). Returned json_t are new references the caller decrefs.
 *
 * Implemented in api/store/store.c (core: locks, change notification,
 * the shared page, compare-and-set and quota helpers), store_open.c (open,
 * close, the listener), store_migrate.c,
 * store_keys.c (customers, keys, hosts), store_tasks.c, store_sessions.c, store_templates.c,
 * store_snapshots.c, store_volumes.c, store_usage.c (metering);
 * store_int.h is their private interface.
 *
 * Room: the store room's door (api/store/: the store over its two backends,
 * sdb.c and sdb_pg.c, and quotas, quota.c). It may call lib/ only. Other
 * rooms include this header only; store_int.h, sdb.h and sdb_int.h are the
 * room's own. */
#ifndef KILN_STORE_H
#define KILN_STORE_H

#include <stdint.h>

#include <jansson.h>

#include "dest.h"
#include "err.h"

struct store;
struct store_template_use;

/* Quotas of one customer. 0 in a max_* field means "no limit" only where
 * noted; the defaults come from the API's configuration. */
struct quota {
	unsigned max_running;        /* tasks starting/running at once (queued beyond) */
	unsigned max_vcpus;          /* vCPUs of those tasks together (queued beyond) */
	uint64_t max_memory_mib;     /* memory of those tasks together (queued beyond) */
	unsigned max_task_vcpus;     /* per task: over it, 400 */
	unsigned max_task_memory_mib;
	unsigned max_task_timeout_s;
	unsigned max_task_output_mib;
	double submit_rate;          /* token bucket: tasks per second ... */
	unsigned submit_burst;       /* ... and bucket size (429 beyond) */
	unsigned max_queued;         /* tasks queued/scheduled at once (429 beyond) */
	int allow_egress;            /* 0: tasks asking for network egress get 400 */
	int session_auto_pause;      /* idle/lifetime limits pause sessions (else destroy them) */
	unsigned max_streams;        /* long-lived requests at once: event and exec streams, wait= polls
				      * (429 beyond; 0: no limit) */
	/* Templates (docs/templates.md, "Quotas"). */
	unsigned max_templates;      /* templates of the customer at once (429 beyond) */
	unsigned max_template_mib;   /* an OCI archive and a built image (413 beyond) */
	unsigned build_minutes_per_day; /* build time per UTC day (429 beyond) */
	unsigned build_timeout_s;    /* one build */
	/* Snapshots (docs/api.md, "Snapshots"): named ones, not deleted. */
	unsigned max_snapshots;      /* snapshots at once (429 beyond; 0: no limit) */
	uint64_t max_snapshot_mib;   /* their bytes together (429 beyond; 0: no limit) */
	/* Volumes (docs/api.md, "Volumes"): not deleted. */
	unsigned max_volumes;        /* volumes at once (429 beyond; 0: no limit) */
	unsigned max_volume_mib;     /* one volume's size_mib (400 beyond; 0: up to 65536) */
};

/* Task states (docs/api.md). */
enum task_state {
	TASK_QUEUED,
	TASK_SCHEDULED,
	TASK_STARTING,
	TASK_RUNNING,
	TASK_UPLOADING,
	TASK_SUCCEEDED,
	TASK_FAILED,
	TASK_TIMED_OUT,
	TASK_CANCELLED,
	TASK_ERROR,
	TASK_STATE_COUNT
};
const char *task_state_name(enum task_state s);
enum task_state task_state_parse(const char *s); /* TASK_STATE_COUNT if unknown */
static inline int task_state_final(enum task_state s)
{
	return s >= TASK_SUCCEEDED && s < TASK_STATE_COUNT;
}

/* A task row as the scheduler needs it. */
struct store_task {
	char id[40];
	char customer[65];
	enum task_state state;
	unsigned vcpus, memory_mib;
	char host_id[65];            /* "" until scheduled */
	int64_t seq;                 /* submission order */
	int64_t created_ms;
	int cancel_requested;        /* a cancel waits to be forwarded to its host */
	int egress;                  /* the spec asks for network egress */
	char tkey[72];               /* its template: "" default, "@NAME" a built-in, else the image's SHA-256 */
};

/* Open (creating and migrating) the SQLite database at path, or, when path
 * is a postgresql:// (postgres://) URI, PostgreSQL. NULL with err set. */
struct store *store_open(const char *path, struct kiln_err *err);
/* Open PostgreSQL (conninfo: a URI or key=value pairs), migrating its
 * schema (replicas take turns). NULL with err set. */
struct store *store_open_pg(const char *conninfo, struct kiln_err *err);
void store_close(struct store *s);
/* `kiln-api migrate`: bring target's schema (SQLite path, or PostgreSQL
 * conninfo when pg or a postgresql:// URI) to this version. 0 or -1. */
int store_migrate_only(const char *target, int pg, struct kiln_err *err);

/* Connect to the PostgreSQL server conninfo names (the store's own
 * connection settings: a 3 s connect timeout) and disconnect, touching no
 * table: `kiln-api check-config`. 0 with the server's version (e.g. 150004)
 * in *version, or -1 with err set to libpq's words. Any thread. */
int store_pg_ping(const char *conninfo, int *version, struct kiln_err *err);
/* Whether the database answers now (PostgreSQL: a round trip, reconnecting
 * if the connection was lost): 0 yes, -1 no. SQLite: always 0. */
int store_ping(struct store *s);
/* Whether the store found its database unreachable and still does (tries
 * to reconnect, at most once a second): 1 down, 0 up. */
int store_down(struct store *s);
int store_is_pg(const struct store *s);
/* Replicas on PostgreSQL: take part in the election of the one scheduler
 * (an advisory lock on a connection of its own, tried twice a second).
 * SQLite: nothing to do. 0, or -1 when the thread cannot start. */
int store_leader_start(struct store *s);
/* Whether this process is the scheduler's leader now (SQLite: always). */
int store_is_leader(struct store *s);

/* ---- customers, quotas, keys ---- */

/* Create a customer with the default quotas. err->code "duplicate" when the
 * id exists. */
int store_customer_create(struct store *s, const char *id, const char *name, const struct quota *q,
			  struct kiln_err *err);
/* 0 and *q filled, -ENOENT when no such customer, -EIO when the store
 * failed (PostgreSQL unreachable). */
int store_customer_quota(struct store *s, const char *id, struct quota *q);
int store_customer_set_quota(struct store *s, const char *id, const struct quota *q, struct kiln_err *err);

/* Make a new key for customer (admin: an admin key, customer NULL). The full
 * key "kiln_<key id>_<secret>" is returned once in key_out (caller frees);
 * only its SHA-256 is stored. key_id_out (32 bytes) receives its id. */
int store_key_create(struct store *s, const char *customer, int admin, char **key_out, char key_id_out[32],
		     struct kiln_err *err);
/* -ENOENT when no such key; revoking twice is fine. */
int store_key_revoke(struct store *s, const char *key_id);
/* Look a presented key up: 1 and *customer (65 bytes) / *admin filled when it
 * is valid and not revoked, 0 otherwise. Fast path: an in-memory cache of
 * hashes, invalidated on revoke. */
int store_key_check(struct store *s, const char *key, char customer[65], int *admin);

/* ---- tasks ---- */

/* Insert a queued task (committed before returning). idem_key may be NULL;
 * when a task of this customer has the same idempotency key, nothing is
 * inserted, 1 is returned and id_out names the existing task (err->code
 * "idempotency_conflict" and -1 when its request body differed). spec_json is
 * the validated spec; body_hash the SHA-256 hex of the request body. Returns
 * 0 (inserted) with the new id (a random "t_..." id) in id_out. */
int store_task_insert(struct store *s, const char *customer, const char *spec_json, const char *metadata_json,
		      unsigned vcpus, unsigned memory_mib, const char *idem_key, const char *body_hash,
		      char id_out[40], struct kiln_err *err);

/* The task's public JSON (docs/api.md) if it belongs to customer (NULL:
 * any customer, for admins and the scheduler); NULL when not found. */
json_t *store_task_json(struct store *s, const char *id, const char *customer);

/* The customer's tasks, newest first: at most limit, optionally only one
 * state, starting after cursor (an opaque string from a previous page; NULL
 * for the first). *next_cursor (caller frees) is NULL on the last page. */
json_t *store_task_list(struct store *s, const char *customer, const char *state, unsigned limit,
			const char *cursor, char **next_cursor, struct kiln_err *err);

/* The spec JSON text of a task (caller frees), for pushing it to a host. */
char *store_task_spec(struct store *s, const char *id);

/* Move a task to state `to` only if it is now in `from` (compare-and-set,
 * committed). host_id is recorded when non-NULL. Returns 1 moved, 0 not (its
 * state was something else), -1 error. */
int store_task_transition(struct store *s, const char *id, enum task_state from, enum task_state to,
			  const char *host_id);

/* Record a final state with the host's task JSON (result, outputs with
 * S3 keys, artifacts, host timings) and end_reason. Only from a non-final
 * state; returns 1 done, 0 already final. */
int store_task_finish(struct store *s, const char *id, enum task_state state, const char *end_reason,
		      json_t *host_task);

/* Tasks in the given state, oldest first (at most max), for the scheduler
 * and recovery. Returns the number filled. */
int store_tasks_in_state(struct store *s, enum task_state state, struct store_task *out, int max);

/* Use of one customer now: tasks scheduled/starting/running and sessions
 * holding a VM, with their vCPUs and memory; tasks queued; sessions. */
struct usage {
	unsigned running, vcpus, queued;
	uint64_t memory_mib;
	/* Sessions holding a VM (starting, running, pausing, resuming: counted
	 * in running, vcpus and memory_mib above too) and paused ones (not). */
	unsigned sessions, paused_sessions;
};
int store_customer_usage(struct store *s, const char *customer, struct usage *u);

/* ---- hosts ---- */

/* Register or refresh a host (heartbeat): its URL, its capacity JSON (as
 * GET /v1/capacity of kiln-host reports) and the time now. */
int store_host_heartbeat(struct store *s, const char *host_id, const char *url, json_t *capacity,
			 struct kiln_err *err);
/* All hosts with their last heartbeat and state: "lost", else "draining"
 * (an admin drained it, or its heartbeat says "draining": kiln-host drain),
 * else "live"; with "draining" (bool) and, when set, "drain_deadline_ms". */
json_t *store_host_list(struct store *s);
int store_host_set_lost(struct store *s, const char *host_id, int lost);

/* An admin's drain of a host (persisted): drain 1 sets it with deadline_ms
 * (wall ms; 0: none), 0 clears both. 0, -ENOENT (no such host), -EIO. */
int store_host_set_drain(struct store *s, const char *host_id, int drain, int64_t deadline_ms);

/* What still holds a VM on a host: tasks placed there and not final
 * (scheduled, starting, running, uploading) and sessions there that hold
 * one (starting, running, pausing, resuming). 0, or -EIO. */
int store_host_load(struct store *s, const char *host_id, unsigned *tasks, unsigned *sessions);

/* ==== Additions for the HTTP layer and the scheduler ====
 * (The functions above are the original contract; these extend it.) */

#define STORE_SCHEMA_VERSION 14

/* ---- customers' S3 destinations (store_destinations.c) ---- */

#define STORE_DEST_SEALED_MAX 512

/* A customer's destination as stored: its secret only sealed. */
struct store_dest {
	char id[40];                 /* "dst_..."; kept while the place stays the same */
	struct dest d;               /* secret_key "" */
	unsigned char sealed[STORE_DEST_SEALED_MAX];
	size_t sealed_len;
	int64_t created_ms, updated_ms;
};

/* The customer's destination: 1 found, 0 none, -1 store error. */
int store_dest_get(struct store *s, const char *customer, struct store_dest *out);
/* Set the customer's destination (d's secret_key is not stored; sealed is).
 * Its id stays when d names the same place as before (dest_same_place: a
 * change of credentials), else a new one. id_out gets it; *same_place
 * (may be NULL) says which. 0, or -1 with err ("store_error", "not_found"
 * when there is no such customer). */
int store_dest_put(struct store *s, const char *customer, const struct dest *d, const unsigned char *sealed,
		   size_t sealed_len, char id_out[40], int *same_place, struct kiln_err *err);
/* 1 deleted, 0 there was none, -1 store error. */
int store_dest_delete(struct store *s, const char *customer);

/* What the scheduler hands a task's host, from one statement: the task row
 * with its spec, its template reference and its customer's destination. */
struct store_task_push {
	int scheduled_on;            /* the task is scheduled on the host asked about */
	char *spec;                  /* its spec JSON (NULL: no such task) */
	char *template_ref;          /* its template as resolved at submission (NULL: none) */
	int has_dest;                /* dest holds the customer's destination */
	struct store_dest dest;
};

/* Fill p for task id and host_id: 0, or -1 on a store error. Free with
 * store_task_push_free. Takes the lock. */
int store_task_push_get(struct store *s, const char *id, const char *host_id, struct store_task_push *p);
void store_task_push_free(struct store_task_push *p);
/* Record that task's outputs go to destination dest_id (NULL: the
 * operator's bucket). 0 or -1. */
int store_task_set_dest(struct store *s, const char *task, const char *dest_id);
/* The customer's tasks that are on a host and not final and whose outputs
 * go to dest_id: [{"id","url"}] (the host's URL). NULL on error. */
json_t *store_dest_tasks(struct store *s, const char *customer, const char *dest_id);

/* The database's schema version (after migrations: STORE_SCHEMA_VERSION). */
int store_schema_version(struct store *s);

/* store_task_insert with every limit recorded (shown in the task's JSON).
 * store_task_insert is this with timeout_s/output_mib unknown (0). */
struct store_submit {
	const char *customer;
	const char *spec_json;       /* validated spec, stored apart from the row */
	const char *metadata_json;   /* may be NULL */
	unsigned vcpus, memory_mib, timeout_s, output_mib;
	const char *idem_key;        /* may be NULL */
	const char *body_hash;       /* SHA-256 hex of the request body */
	const struct store_template_use *template_use; /* its template (NULL: default), recorded with it */
	/* Replicas (PostgreSQL): the customer's submit rate and queue depth
	 * are checked in the submission's own transaction, under the
	 * customer's lock, against rows every replica shares (the bucket in
	 * submit_buckets). shared 0: the caller checked them itself. Refused:
	 * -1 with err "rate_limited" (*retry_ms: when to retry) or
	 * "queue_full". */
	int shared;
	double submit_rate;
	unsigned submit_burst, max_queued;
	int64_t *retry_ms;
};
int store_task_submit(struct store *s, const struct store_submit *t, char id_out[40], struct kiln_err *err);

/* Idempotency: the customer's task with this key. 0 none; 1 found and the
 * body hash matches (its id in id_out); -1 with err "idempotency_conflict"
 * (id_out still filled) when it does not. */
int store_task_idem_find(struct store *s, const char *customer, const char *idem_key, const char *body_hash,
			 char id_out[40], struct kiln_err *err);

/* The state of a task (any customer): 0 and *state, or -ENOENT. */
int store_task_state(struct store *s, const char *id, enum task_state *state);

/* Cancel on behalf of customer (NULL: any). queued/scheduled tasks become
 * cancelled at once (end_reason "cancelled", compare-and-set); starting and
 * running ones get cancel_requested (the scheduler forwards it: see
 * store_tasks_cancel_pending); uploading and final ones are too late.
 * *state (may be NULL) receives the state after the call. */
enum store_cancel {
	STORE_CANCEL_NOT_FOUND,   /* no such task (of this customer) */
	STORE_CANCEL_DONE,        /* it is cancelled now */
	STORE_CANCEL_REQUESTED,   /* recorded; its host will be told */
	STORE_CANCEL_TOO_LATE,    /* uploading or final */
	STORE_CANCEL_FAILED,      /* store error */
};
enum store_cancel store_task_cancel(struct store *s, const char *id, const char *customer, enum task_state *state);

/* Tasks with a cancel requested but not yet forwarded (oldest first, at most
 * max), and marking one as forwarded (it is not listed again). */
int store_tasks_cancel_pending(struct store *s, struct store_task *out, int max);
int store_task_cancel_sent(struct store *s, const char *id);

/* Queued tasks in a fair order, at most max: every customer's oldest first
 * (round-robin across customers in order of their oldest task), then every
 * customer's second oldest, ... FIFO within one customer. */
int store_tasks_queued_fair(struct store *s, struct store_task *out, int max);

/* queued -> scheduled on host_id, only if the customer's running quota
 * (max_running, max_vcpus, max_memory_mib against store_customer_usage)
 * leaves room: checked and moved in one transaction. Returns 1 moved, 0 the
 * task is not queued (any more), -EDQUOT its customer is at its quota (leave
 * it queued, try its next customer), other negative on error. */
int store_task_schedule(struct store *s, const char *id, const char *host_id);

/* ---- change notification ----
 * Every committed change of a task's state (insert, transition, finish,
 * cancel) bumps a counter and wakes store_wait_change(); the listener (one,
 * set by the HTTP layer) is called after the commit, outside the store's lock,
 * on the thread that made the change, with event "state" and data
 * {"state":NAME,"at":MS} or event "cancel" and data {"at":MS}. data is
 * borrowed. */
typedef void store_listener_fn(void *arg, const char *task_id, const char *event, json_t *data);
void store_set_listener(struct store *s, store_listener_fn *fn, void *arg);
/* Replicas on PostgreSQL: fn is called (from the store's listener thread)
 * for every change another kiln-api committed: task_id, event ("state",
 * "cancel", "session", ...; "resync" with task_id NULL after the listener
 * reconnected: anything may have changed) and data (may be NULL). Those
 * changes also wake store_wait_change and reach the listener above. */
void store_set_remote_hook(struct store *s, store_listener_fn *fn, void *arg);
uint64_t store_changes(struct store *s);
/* Wait until store_changes() differs from seen or deadline_ms (CLOCK_MONOTONIC
 * milliseconds) passes or store_wake_all(). 1 changed, 0 not. */
int store_wait_change(struct store *s, uint64_t seen, int64_t deadline_ms);
void store_wake_all(struct store *s);

/* A customer's row {"id","name","created_at","quotas"} or NULL. */
json_t *store_customer_json(struct store *s, const char *id);
/* Customers' rows (as store_customer_json) with an id after `after` ("" or
 * NULL: from the first), by id, at most limit: a JSON array. */
json_t *store_customer_list(struct store *s, const char *after, unsigned limit);
/* The customer's keys [{"key_id","created_at","revoked_at"|null}] by
 * creation (never their hashes): a JSON array, empty when none. */
json_t *store_key_list(struct store *s, const char *customer);

/* ==== Sessions (docs/api.md, "Sessions") ====
 * A session is a long-lived sandbox on one host. Its row holds what it was
 * created with (the spec sent to a host on create and on every resume) and
 * where it is. starting, running, pausing and resuming hold a VM on a host and
 * count against the customer's running quota like tasks do; paused, destroyed
 * and error do not. Every change of state is a compare-and-set. */

enum session_state {
	SESSION_STARTING,            /* being created on its host */
	SESSION_RUNNING,
	SESSION_PAUSING,             /* its host saves it to S3 */
	SESSION_PAUSED,              /* only in S3: no host, no VM */
	SESSION_RESUMING,            /* a host restores it from S3 */
	SESSION_DESTROYED,
	SESSION_ERROR,               /* lost (end_reason says why); a snapshot it has stays resumable */
	SESSION_STATE_COUNT
};
const char *session_state_name(enum session_state s);
enum session_state session_state_parse(const char *s); /* SESSION_STATE_COUNT if unknown */
/* The states in which a session holds a VM (and quota). */
static inline int session_state_holds(enum session_state s)
{
	return s == SESSION_STARTING || s == SESSION_RUNNING || s == SESSION_PAUSING || s == SESSION_RESUMING;
}

/* A session row as the HTTP layer and the reaper need it. */
struct store_session {
	char id[40];
	char customer[65];
	char host_id[65];            /* "" when on no host */
	enum session_state state;
	unsigned vcpus, memory_mib;
	unsigned idle_timeout_s, max_lifetime_s;
	int egress;                  /* the spec asks for network egress */
	int has_snapshot;            /* paused at least once: resumable from S3 */
	int64_t created_ms;
	int64_t started_ms;          /* created or latest resumed: max_lifetime_s counts from here */
	int64_t last_active_ms;      /* latest exec/files call (start or end) */
	/* E2B (docs/e2b.md): a sandbox made through /e2b has its envd access
	 * token's SHA-256; auto_pause: -1 the customer's session_auto_pause,
	 * else this session's (E2B's autoPause). */
	int has_e2b_token;
	unsigned char e2b_token_sha[32];
	int auto_pause;
	int private_traffic;         /* E2B's network.allowPublicTraffic false: ports need the traffic token */
	int auto_resume;             /* E2B's autoResume: a port request resumes it when paused */
	char e2b_template[64];       /* the templateID it was created with ("" not through /e2b) */
	int leased;                  /* a replica holds a live lease on it: a request in flight */
	char from_snapshot[40];      /* the snapshot it was started from ("" none) */
};

/* One volume mount of a session (docs/api.md "Volumes"). */
#define STORE_SESSION_VOLUMES_MAX 2
struct store_volume_mount {
	char volume_id[40];
	char name[64];               /* the volume's name (filled by reads; not needed to attach) */
	char path[256];              /* its mount point in the guest */
	int read_only;
};

struct store_session_new {
	const char *customer;
	const char *spec_json;       /* {"limits":{...},"network":{...}}: sent to hosts as is */
	const char *metadata_json;   /* may be NULL */
	unsigned vcpus, memory_mib, idle_timeout_s, max_lifetime_s;
	int egress;
	const char *host_id;         /* where it is being created */
	const struct store_template_use *template_use; /* its template (NULL: default), recorded with it */
	const char *lease_owner;     /* non-NULL: its lease (count 1) taken in the same transaction */
	int64_t lease_ttl_ms;
	const char *from_snapshot;   /* started from this snapshot (NULL: none); template_use NULL:
				      * the snapshot's template use is copied */
	const struct store_volume_mount *volumes; /* its mounts (volume_id, path, read_only), recorded
						   * in the insert's transaction (store_volumes.c) */
	unsigned nvolumes;           /* 0..STORE_SESSION_VOLUMES_MAX */
};

/* Insert a session in state starting on n->host_id if the customer's running
 * quota (tasks and sessions together: max_running, max_vcpus,
 * max_memory_mib) leaves room: checked and inserted in one transaction.
 * Returns 0 with the new id ("s_" + 32 hex digits) in id_out; -EDQUOT with
 * err code "quota_exceeded" naming the limit; -ENOENT with err "not_found"
 * when n->from_snapshot is not (any more) a snapshot of the customer;
 * -EINVAL with err "invalid_request" when one of n->volumes is not (any
 * more) a volume of the customer; -EBUSY with err "volume_busy" when a
 * read-write one is mounted read-write by another session that is not
 * destroyed; -1 with err set otherwise. */
int store_session_create(struct store *s, const struct store_session_new *n, char id_out[40], struct kiln_err *err);

/* Remove a session that never reached running (its host refused it), only
 * while it is starting. 1 removed, 0 not. */
int store_session_discard(struct store *s, const char *id);

/* paused, or error with a snapshot -> resuming on host_id, if the running
 * quota leaves room (one transaction, as store_session_create). Returns 1
 * moved (*prev: the state it left); 0 not resumable now (*prev: its state,
 * SESSION_STATE_COUNT when there is no such session of this customer);
 * -EDQUOT with err "quota_exceeded"; -1 error. customer NULL: any. */
int store_session_resume_begin(struct store *s, const char *id, const char *customer, const char *host_id,
			       enum session_state *prev, struct kiln_err *err);

/* Compare-and-set: from -> to, only if the session is in `from` now.
 * host_id: NULL keeps it, "" clears it, else sets it. reason: end_reason,
 * NULL keeps, "" clears. snapshot: the snapshot JSON (pause reply), NULL
 * keeps. Timestamps follow: starting/resuming -> running sets started_ms and
 * last_active_ms; -> paused sets paused_ms; -> destroyed/error sets
 * ended_ms. Returns 1 moved, 0 not, -1 error. */
int store_session_transition(struct store *s, const char *id, enum session_state from, enum session_state to,
			     const char *host_id, const char *reason, json_t *snapshot);

/* The row, if it belongs to customer (NULL: any). 0, or -ENOENT. id may be
 * in E2B's spelling (store_session_id_e2b). */
int store_session_get(struct store *s, const char *id, const char *customer, struct store_session *out);
/* A session id as E2B's API shows it: "s_" + 32 hex digits becomes "s" +
 * the digits, a name that can be a DNS label (E2B's getHost puts it in a
 * host name, and TLS refuses an underscore in a server name). Either
 * spelling names the session: store_session_id_canon turns E2B's back
 * (other ids are returned as they are). out: 40 bytes; returns out or id. */
const char *store_session_id_e2b(const char *id, char out[40]);
const char *store_session_id_canon(const char *id, char out[40]);

/* The public JSON (docs/api.md) of a session of customer (NULL: any), or NULL. */
json_t *store_session_json(struct store *s, const char *id, const char *customer);

/* The customer's (NULL: every customer's) sessions, newest first, as
 * store_task_list pages tasks; state NULL: every state but destroyed,
 * "all": every state. */
json_t *store_session_list(struct store *s, const char *customer, const char *state, unsigned limit,
			   const char *cursor, char **next_cursor, struct kiln_err *err);
/* The same, oldest first when oldest_first (a cursor of one order is not
 * one of the other's: it pages on from where that page ended). */
json_t *store_session_list_order(struct store *s, const char *customer, const char *state, unsigned limit,
				 const char *cursor, int oldest_first, char **next_cursor, struct kiln_err *err);

/* The spec JSON text the session was created with (caller frees) or NULL. */
char *store_session_spec(struct store *s, const char *id);
/* Replace a session's spec (its egress rules changed while it runs: PUT
 * /v1/sessions/{id}/network, after its host applied them): the spec a
 * resume sends on. 1 set, 0 no such session, -1 error. */
int store_session_set_spec(struct store *s, const char *id, const char *spec_json);

/* last_active_ms = now (an exec or files call started or ended). */
int store_session_touch(struct store *s, const char *id);

/* E2B's fields of a session (docs/e2b.md): the SHA-256 of its envd access
 * token, the templateID it was created with, its envVars (JSON object text,
 * may be NULL) and autoPause (-1: the customer's session_auto_pause). 1 set,
 * 0 no such session, -1 error. */
#define STORE_E2B_PRIVATE 0x1u      /* network.allowPublicTraffic false */
#define STORE_E2B_AUTO_RESUME 0x2u  /* autoResume: traffic resumes it */
int store_session_set_e2b(struct store *s, const char *id, const unsigned char token_sha[32], const char *template,
			  const char *env_json, int auto_pause, unsigned flags);

/* A session's idle and lifetime limits (E2B's timeout), of customer (NULL:
 * any). 1 set, 0 no such session, -1 error. */
int store_session_set_limits(struct store *s, const char *id, const char *customer, unsigned idle_timeout_s,
			     unsigned max_lifetime_s);

/* Sessions that hold a VM (starting, running, pausing, resuming), oldest
 * first, at most max; for the reaper. Returns the number filled. */
int store_sessions_holding(struct store *s, struct store_session *out, int max);

/* ---- Session leases: requests in flight, across replicas ----
 * A replica (owner: an id unique to one kiln-api process) with requests in
 * flight on a session holds a row (session, owner, count, expires_ms); a
 * session is leased (store_session.leased) while any owner's row has not
 * expired. Expiry is on the database's clock (SDB_NOW_MS): on PostgreSQL
 * the server's, so replicas' clocks need not agree. touch: the session's
 * last_active_ms = now too, in the same transaction. 0 or -1 (store error).
 * Any thread. */

/* owner's row for session id: count n, expiring ttl_ms from now. */
int store_session_lease_set(struct store *s, const char *id, const char *owner, unsigned n, int64_t ttl_ms,
			    int touch);
/* owner's row for session id removed. */
int store_session_lease_drop(struct store *s, const char *id, const char *owner, int touch);
/* Every row of owner expires ttl_ms from now: the number of rows, or -1. */
int store_session_leases_renew(struct store *s, const char *owner, int64_t ttl_ms);
/* owner's rows replaced by n rows (ids[i], counts[i]) in one transaction
 * (n 0: removed). */
int store_session_leases_replace(struct store *s, const char *owner, const char *const *ids,
				 const unsigned *counts, int n, int64_t ttl_ms);
/* Rows that expired more than older_ms ago (a killed replica's) removed:
 * their number, or -1. */
int store_session_leases_gc(struct store *s, int64_t older_ms);

/* ==== Templates (docs/templates.md) ====
 * A template row is a build too: its id is the build's id on kiln-host.
 * Customer templates belong to their customer; built-in ones (rows made
 * from hosts' heartbeats) have customer "" and are public. A name is unique
 * per customer, and no customer may take a public name. Tasks and sessions
 * record the template they use (struct store_template_use) so that they
 * still run after it is deleted; its image in S3 is deleted
 * (store_template_gc_*) once no template row, unfinished task or live
 * session names its SHA-256. */

enum template_state {
	TEMPLATE_QUEUED,
	TEMPLATE_BUILDING,
	TEMPLATE_READY,
	TEMPLATE_FAILED,
	TEMPLATE_STATE_COUNT
};
const char *template_state_name(enum template_state s);

#define STORE_TEMPLATE_LOG_MAX (64u << 10) /* the build log keeps its last 64 KiB */

/* A template row as the builder and the resolver need it. */
struct store_template {
	char id[40];                 /* "b_" + 32 hex: also the build id */
	char customer[65];           /* "" for a public built-in */
	char name[64];
	char kind[8];                /* "builtin", "recipe", "oci" */
	enum template_state state;
	char host_id[65];            /* building there ("" otherwise) */
	unsigned attempts;           /* builds started */
	char sha256[65];             /* ready: the image's */
	uint64_t size;
	char oci_key[160];           /* oci: the uploaded archive ("" once deleted) */
	uint64_t oci_size;
	int64_t created_ms, started_ms;
};

/* What a task or session records about its template. */
struct store_template_use {
	const char *template_id;     /* the row it resolved to */
	const char *name;
	const char *sha256;          /* NULL for a built-in */
	int builtin;
	const char *template_ref_json; /* what is sent to hosts; NULL for a built-in without one */
};

struct store_template_new {
	const char *customer;
	const char *name;
	const char *kind;            /* "recipe" or "oci" */
	const char *recipe_json;     /* recipe: the validated recipe */
	const char *oci_key;         /* oci: the archive in S3 and its size */
	uint64_t oci_size;
	unsigned max_templates;      /* the customer's quota (0: no limit) */
};

/* A new build id ("b_" + 32 hex) for a template about to be created (the
 * OCI archive is uploaded under it first). 0 or -1. */
int store_template_new_id(char id[40]);

/* Insert a queued template with id (store_template_new_id), committed.
 * -1 with err "duplicate" (the customer has one of that name, or a public
 * one has it), "quota_exceeded" (max_templates), "store_error". */
int store_template_create(struct store *s, const char *id, const struct store_template_new *n, struct kiln_err *err);

/* A built-in template reported by a host: a public ready row (made once). */
int store_template_builtin(struct store *s, const char *name);

/* The template lookup of "template":"NAME" for customer: its own NAME,
 * else the public NAME. 0 and *out, -ENOENT, -EIO. */
int store_template_find(struct store *s, const char *customer, const char *name, struct store_template *out);
/* The row with this id (any customer). 0, -ENOENT, -EIO. */
int store_template_get(struct store *s, const char *id, struct store_template *out);

/* The TREF text of a ready template (caller frees), NULL when it has none. */
char *store_template_ref(struct store *s, const char *id);
/* The recipe text of a recipe template (caller frees), or NULL. */
char *store_template_recipe(struct store *s, const char *id);

/* The public JSON of the row id (with its build log when log). NULL if none. */
json_t *store_template_json(struct store *s, const char *id, int log);
/* The customer's templates and the public ones, by name. */
json_t *store_template_list(struct store *s, const char *customer);

/* The customer's template count and build seconds of the current UTC day. */
int store_template_usage(struct store *s, const char *customer, unsigned *count, double *build_s_today);

/* Delete the row id: -EBUSY (err "template_in_use") while a live session
 * (any state but destroyed) uses it. What it leaves (the build on its host,
 * the uploaded archive, the image) goes to the clean-up list. 0, -ENOENT,
 * -EBUSY, -EIO. */
int store_template_delete(struct store *s, const char *id, struct kiln_err *err);

/* Queued templates, oldest first; building ones (for reattachment and
 * lost hosts). Return how many were filled. */
int store_templates_queued(struct store *s, struct store_template *out, int max);
int store_templates_building(struct store *s, struct store_template *out, int max);

/* queued -> building on host_id (attempts + 1, started now): 1 moved, 0 not. */
int store_template_start(struct store *s, const char *id, const char *host_id);
/* building -> queued (its host is gone or forgot it): 1, 0. */
int store_template_requeue(struct store *s, const char *id);
/* Append build output (kept: the last STORE_TEMPLATE_LOG_MAX bytes). */
int store_template_log(struct store *s, const char *id, const char *text, size_t len);
/* building (or queued) -> ready with ref, a TREF (its sha256, size, s3_key read
 * from it) or failed with code/message; the build time since started is
 * added to the customer's day. The uploaded archive is listed for clean-up.
 * 1 done, 0 the row is gone or settled, -1 error. */
int store_template_finish(struct store *s, const char *id, json_t *ref, const char *code, const char *message);

/* The state, log bytes ever written and the log kept now (caller frees),
 * for the events stream. 0, -ENOENT. */
int store_template_progress(struct store *s, const char *id, enum template_state *state, uint64_t *log_total,
			    char **log, json_t **error);

/* The TREF a task or session (by id) was stored with (caller frees), NULL
 * when it uses the default template. */
char *store_template_use_ref(struct store *s, const char *id);

/* ---- clean-up of what deleted templates and ended builds leave ---- */
struct store_template_gc {
	int64_t seq;
	char build_id[40];
	char host_id[65];            /* "" unless a build is to be cancelled there */
	char oci_key[160];           /* "" or an uploaded archive to delete */
	char sha256[65], s3_key[160];/* "" or an image to delete once unreferenced */
};
int store_template_gc_list(struct store *s, struct store_template_gc *out, int max);
/* Record what is done: the fields cleared in g ("" ) are done; the row goes
 * when nothing is left. */
int store_template_gc_update(struct store *s, const struct store_template_gc *g);
/* 1 when a template row, an unfinished task or a live session still names
 * sha256; 0 not; -1 error. */
int store_template_sha_referenced(struct store *s, const char *sha256);
/* ==== Snapshots (docs/api.md "Snapshots"; store_snapshots.c) ====
 * A snapshot is a running session's state (memory, devices, disk) that
 * its host saved to S3 under CUSTOMER/snapshots/ID/. The row keeps what
 * starting sessions from it takes: the source session's spec, limits and
 * template (a template_uses row under the snapshot's id), and where it was
 * taken (its host caches the chunks). kind "named": the customer's, listed,
 * counted in max_snapshots and max_snapshot_mib; "fork": a fork's own,
 * hidden and deleted once its children started. A deleted snapshot
 * (deleted_ms set) is gone for its customer at once; its row stays until
 * its objects in S3 are deleted, which waits for the sessions started from
 * it (any state but destroyed). */

#define STORE_SNAPSHOT_ID_LEN 29     /* "snap_" + 24 hex digits */
#define STORE_SNAPSHOT_NAME_MAX 63

struct store_snapshot {
	char id[40];
	char customer[65];
	char name[STORE_SNAPSHOT_NAME_MAX + 1]; /* "" when it has none */
	char session_id[40];         /* the session it was taken of */
	char kind[8];                /* "named" or "fork" */
	char host_id[65];            /* where it was taken */
	unsigned vcpus, memory_mib;
	int egress;
	uint64_t bytes;              /* what its host uploaded for it */
	int64_t stop_ms;             /* how long the session was stopped for it */
	int64_t created_ms;
	int64_t deleted_ms;          /* 0: not deleted */
};

struct store_snapshot_new {
	const char *id;              /* store_snapshot_new_id */
	const char *customer;
	const char *name;            /* NULL: none */
	const char *session_id;      /* its template use is copied from this session's */
	const char *kind;            /* "named" or "fork" */
	const char *host_id;
	const char *spec_json;       /* the session's spec */
	unsigned vcpus, memory_mib;
	int egress;
	uint64_t bytes;
	int64_t stop_ms;
	/* kind named: the customer's quotas (0: no limit), checked against its
	 * other named snapshots in the insert's transaction. */
	unsigned max_snapshots;
	uint64_t max_snapshot_mib;
};

/* A new snapshot id ("snap_" + 24 hex digits, 40 bytes): 0 or -1. */
int store_snapshot_new_id(char id[40]);
/* Whether id has the form of a snapshot id. */
int store_snapshot_id_valid(const char *id);

/* Insert a snapshot row (committed). -EDQUOT with err "quota_exceeded"
 * naming max_snapshots or max_snapshot_mib (nothing inserted); -1 with err
 * "store_error". */
int store_snapshot_create(struct store *s, const struct store_snapshot_new *n, struct kiln_err *err);

/* The snapshot id of customer (NULL: any), not deleted unless
 * with_deleted: 0 and *out, -ENOENT, -EIO. */
int store_snapshot_get(struct store *s, const char *id, const char *customer, int with_deleted,
		       struct store_snapshot *out);
/* Its public JSON (docs/api.md), customer's, named (a fork's is never
 * shown) and not deleted; NULL if none. */
json_t *store_snapshot_json(struct store *s, const char *id, const char *customer);
/* Its spec JSON text (caller frees) or NULL. */
char *store_snapshot_spec(struct store *s, const char *id);

/* The customer's named snapshots that are not deleted, newest first, with
 * name and session_id filters (NULL: any), as store_task_list pages. */
json_t *store_snapshot_list(struct store *s, const char *customer, const char *name, const char *session_id,
			    unsigned limit, const char *cursor, char **next_cursor, struct kiln_err *err);

/* Mark the snapshot deleted (customer NULL: any, a fork's too; else only
 * the customer's named ones): 1 marked, 0 no such snapshot (or deleted
 * already), -1 error. */
int store_snapshot_mark_deleted(struct store *s, const char *id, const char *customer);
/* Remove the row and its template use (its objects are gone): 1, 0, -1. */
int store_snapshot_remove(struct store *s, const char *id);

/* The customer's named snapshots that are not deleted: how many, their
 * bytes. 0 or -1. */
int store_snapshot_usage(struct store *s, const char *customer, unsigned *count, uint64_t *bytes);

/* Sessions started from snapshot id that are in any state but destroyed:
 * their number, or -1. */
int store_snapshot_users(struct store *s, const char *id);

/* Deleted snapshots whose rows remain (their objects may still be in S3)
 * and that no session uses any more (all destroyed), oldest deletion
 * first, at most max: the number filled. */
int store_snapshots_deleted(struct store *s, struct store_snapshot *out, int max);

/* ==== Volumes (docs/api.md "Volumes"; store_volumes.c) ====
 * A volume is a customer's named file system kept in S3 under
 * CUSTOMER/volumes/ID/ by the hosts of the sessions that mount it; the row
 * is its name, size and whether it is deleted. A session's mounts are
 * volume_mounts rows written in the transaction that inserts the session
 * (store_session_create), and stay with the row (a destroyed session's are
 * history). The one-writer rule: a read-write mount is refused while
 * another session in any state but destroyed holds a read-write mount of
 * the volume; a volume is deleted only while no session but destroyed ones
 * mounts it. Both checks run under the customer's lock, so replicas see
 * the one or the other. */

#define STORE_VOLUME_ID_LEN 28       /* "vol_" + 24 hex digits */
#define STORE_VOLUME_NAME_MAX 63

struct store_volume {
	char id[40];
	char customer[65];
	char name[STORE_VOLUME_NAME_MAX + 1];
	unsigned size_mib;
	int64_t created_ms;
	int64_t deleted_ms;          /* 0: not deleted */
};

/* Whether id has the form of a volume id. */
int store_volume_id_valid(const char *id);

/* Create the customer's volume name of size_mib under max_volumes (0: no
 * limit; its volumes not deleted), checked in the insert's transaction: 0
 * with its id in id_out (40 bytes); -EDQUOT with err "quota_exceeded"
 * naming max_volumes; -EEXIST with err "conflict" (a volume of that name
 * exists); -1 with err "store_error". */
int store_volume_create(struct store *s, const char *customer, const char *name, unsigned size_mib,
			unsigned max_volumes, char id_out[40], struct kiln_err *err);

/* The customer's volume (not deleted) whose id is id_or_name, or else whose
 * name it is: 0 and *out, -ENOENT, -EIO. */
int store_volume_get(struct store *s, const char *id_or_name, const char *customer, struct store_volume *out);

/* Its public JSON {"id","name","size_mib","created_ms","mounted_by":[{"session_id",
 * "read_only"}]} (mounted_by: sessions in any state but destroyed, oldest
 * first), or NULL when v cannot be read. */
json_t *store_volume_json(struct store *s, const struct store_volume *v);

/* The customer's volumes not deleted, newest first (name: only that one;
 * NULL: all), each as store_volume_json: a new array or NULL (store error). */
json_t *store_volume_list(struct store *s, const char *customer, const char *name);

/* The customer's volumes not deleted: 0 with *count, or -1. */
int store_volume_count(struct store *s, const char *customer, unsigned *count);

/* Mark the customer's volume id deleted if no session but destroyed ones
 * mounts it: 1 marked; 0 no such volume (or deleted already); -EBUSY with
 * err "volume_busy" naming a session that mounts it; -1 error. */
int store_volume_mark_deleted(struct store *s, const char *id, const char *customer, struct kiln_err *err);

/* Undo store_volume_mark_deleted (its objects could not be deleted): 1, 0
 * when it cannot be (a volume of that name was created since), -1. */
int store_volume_unmark_deleted(struct store *s, const char *id);

/* Session id's mounts (the volume's name filled in) into out[0..max): how
 * many, or -1. */
int store_session_volumes(struct store *s, const char *session_id, struct store_volume_mount *out, int max);

/* ---- metering (store_usage.c; docs/api.md "Usage history") ----
 *
 * Usage is kept per customer and wall-clock minute. A task's VM time is
 * recorded when it reaches its final state, a session's when its running
 * interval ends (pause, destroy, error), split over the minutes it spans;
 * each in the transaction of the transition that ends it, which happens
 * once, so a restart or another replica never counts it twice. A session
 * still running shows its current interval once it ends. */

#define STORE_USAGE_MINUTE_MS 60000LL

struct usage_bucket {
	int64_t start_ms;            /* the bucket's first ms */
	int64_t vcpu_ms, mib_ms;     /* ms x vCPUs, ms x MiB */
	int64_t tasks, sessions;     /* started */
	int64_t egress_bytes;        /* sent out by tasks that ended */
	int64_t snapshot_bytes;      /* the largest sample of the step (levels) */
	int64_t volume_mib;
	int64_t pause_bytes;         /* paused sessions' (what their last pause sent) */
	int64_t template_bytes;      /* ready templates' sizes */
};

/* Add `ms x vcpus` and `ms x mib` for the interval [start_ms, end_ms)
 * split over the minutes it spans, and `tasks`/`sessions`/`egress_bytes`
 * (negative: 0) in at_ms's minute, for customer: one upsert per minute, in a transaction of its
 * own (the transitions use the same code inside theirs). At most
 * STORE_USAGE_SPLIT_MAX minutes are written: a longer interval's early
 * part goes into its first minute written. 0 or -1. Takes the lock. */
#define STORE_USAGE_SPLIT_MAX 20160 /* two weeks */
int store_usage_add(struct store *s, const char *customer, int64_t start_ms, int64_t end_ms, unsigned vcpus,
		    unsigned mib, int64_t at_ms, unsigned tasks, unsigned sessions, int64_t egress_bytes);

/* Sample every customer's stored levels (named snapshots' bytes, volumes'
 * sizes, paused sessions' pause bytes, ready templates' sizes) into now's
 * minute, replacing a sample there: the leader, once a
 * minute (minutes without a sample read as 0). 0 or -1. */
int store_usage_sample_stored(struct store *s, int64_t now);

/* Customer's usage in [from_ms, from_ms + n x step_ms) in n buckets of
 * step_ms (from_ms and step_ms multiples of a minute; n <= max) into out,
 * every bucket filled (zeros where nothing ran): 0, or -1 (a store error,
 * or bad arguments). */
int store_usage_history(struct store *s, const char *customer, int64_t from_ms, int64_t step_ms, int n,
			struct usage_bucket *out);

/* The rest of the door. */
#include "quota.h"

#endif
