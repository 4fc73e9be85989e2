/* store_int.h: what the pieces of kiln-api's store share, private to
 * api/store/store*.c (and the store's unit test). store.h is the public interface.
 *
 * The pieces: store.c (the handle, its locks, prepared statements, change
 * notification, the shared page, compare-and-set and quota helpers),
 * store_migrate.c (schema), store_keys.c (customers, keys, hosts),
 * store_tasks.c (tasks, group commit of submissions), store_sessions.c,
 * store_templates.c (templates, what tasks and sessions use, clean-up),
 * store_snapshots.c (snapshots of sessions), store_volumes.c (volumes and
 * sessions' mounts), store_usage.c (metering: usage per customer and minute).
 * Every function here that touches SQLite wants s->lock held unless it says
 * otherwise ("(lock held)"). */
#ifndef KILN_STORE_INT_H
#define KILN_STORE_INT_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <openssl/sha.h>
#include "sdb.h"

#include "store.h"

/* Prepared statements: s->st holds them all; each module owns a range of
 * slots and the SQL for them (store_stmt prepares a slot on first use). */
enum store_slots {
	STORE_SLOTS_CORE = 0,       /* store.c: transactions, usage */
	STORE_SLOTS_KEYS = 10,      /* store_keys.c: customers, keys, hosts */
	STORE_SLOTS_TASKS = 24,     /* store_tasks.c: statements, then one transition per target state */
	STORE_SLOTS_SESSIONS = 56,  /* store_sessions.c */
	STORE_SLOTS_TEMPLATES = 76, /* store_templates.c */
	STORE_SLOTS_SNAPSHOTS = 112, /* store_snapshots.c */
	STORE_SLOTS_VOLUMES = 128,  /* store_volumes.c */
	STORE_SLOTS_USAGE = 144,    /* store_usage.c */
	STORE_SLOTS_MAX = 152,
};

/* The core's statements (slots STORE_SLOTS_CORE + these). */
enum store_core_stmt {
	STORE_BEGIN, STORE_COMMIT, STORE_ROLLBACK, STORE_SAVEPOINT, STORE_RELEASE, STORE_ROLLBACK_TO,
	STORE_USAGE_RUN,
	STORE_NOTIFY, STORE_CUSTOMER_LOCK,
	STORE_CORE_COUNT
};

/* One key of the in-memory key table (store_keys.c). */
struct key_entry {
	unsigned char hash[SHA256_DIGEST_LENGTH];
	char key_id[32];
	char customer[65];
	int admin, revoked, used;
};

struct pending_submit;

struct store {
	struct sdb *db;
	pthread_mutex_t lock;        /* every use of db and st */
	struct sdb_stmt *st[STORE_SLOTS_MAX];

	pthread_rwlock_t keys_lock;
	struct key_entry *keys;      /* open addressing by hash, at most half full */
	size_t keys_cap, keys_n;

	pthread_mutex_t ch_lock;
	pthread_cond_t ch_cond;
	uint64_t gen;
	int woken;
	store_listener_fn *listener;
	void *listener_arg;
	/* Replicas (PostgreSQL): changes committed by other kiln-apis arrive
	 * by NOTIFY on a connection of the listener's own. */
	struct sdb_listener *listen;
	struct sdb_leader *leader;   /* NULL: SQLite, always the leader */
	char nonce[17];              /* this process's, to skip its own notifications */
	store_listener_fn *remote;
	void *remote_arg;

	/* Group commit of submissions (store_tasks.c). */
	pthread_mutex_t gc_lock;
	pthread_cond_t gc_cond;
	struct pending_submit *gc_queue; /* waiting for the next batch, newest first */
	int gc_leading;                  /* a batch is being committed */
};

/* ---- statements (store.c) ---- */

/* Slot `slot`'s statement, prepared from sql the first time, reset and with
 * its bindings cleared; NULL (logged) when sql does not prepare. Lock held. */
struct sdb_stmt *store_stmt(struct store *s, int slot, const char *sql);

/* Run one of the core's row-less statements (BEGIN, COMMIT, ...):
 * SDB_DONE or the error code. Lock held. */
int store_run(struct store *s, enum store_core_stmt id);

/* ---- transactions (store.c) ----
 *
 * A write transaction and s->lock, released when the variable goes out of
 * scope: declare it with STORE_TX(tx), then store_tx_start (lock and BEGIN)
 * or store_tx_lock and store_tx_begin apart. Whatever path leaves the scope,
 * an open transaction is rolled back and the lock released, in that order;
 * store_tx_unlock does the same early (to notify after the commit, outside
 * the lock). A failed commit leaves the transaction open, so the caller can
 * read the error (sdb_errmsg) before the rollback. */
struct store_tx {
	struct store *s;             /* NULL until locked */
	int locked;                  /* s->lock held */
	int open;                    /* BEGIN ran, neither COMMIT nor ROLLBACK since */
};

void store_tx_end(struct store_tx *tx);

#define STORE_TX(name) struct store_tx name __attribute__((cleanup(store_tx_end))) = { 0 }

/* Take s->lock (no transaction yet). */
void store_tx_lock(struct store_tx *tx, struct store *s);

/* BEGIN, the lock held: 0, or -1 (the lock stays held). */
int store_tx_begin(struct store_tx *tx);

/* store_tx_lock then store_tx_begin: 0 or -1 (locked either way). */
int store_tx_start(struct store_tx *tx, struct store *s);

/* COMMIT: 0, or -1 with the transaction still open (rolled back by
 * store_tx_rollback, store_tx_unlock or the end of scope). */
int store_tx_commit(struct store_tx *tx);

/* ROLLBACK if open; the lock stays held. */
void store_tx_rollback(struct store_tx *tx);

/* Roll back what is open and release the lock; the end of scope then does
 * nothing. */
void store_tx_unlock(struct store_tx *tx);

/* sdb_step, logging an error other than DONE/ROW. Lock held. */
int store_step(struct store *s, struct sdb_stmt *st);

/* Run st (from store_stmt, bound; s->lock held), a write without rows, and
 * reset it: the rows it changed, or -1 on a store error. */
int store_update_locked(struct store *s, struct sdb_stmt *st);

/* Run st (from stmt(), s->lock held) with ?1 = the wall clock in ms and
 * ?2 = id: the one-statement "mark this row now" writes (touch, cancel
 * sent, key revoked). Returns the rows changed, or -1 on a store error. */
int store_stamp_locked(struct store *s, struct sdb_stmt *st, const char *id);

/* store_stamp_locked on the statement store_stmt(s, slot, sql), taking
 * s->lock. Returns 0 (a row changed or none), -1 on a store error. */
int store_stamp(struct store *s, int slot, const char *sql, const char *id);

static inline const char *store_col_text(struct sdb_stmt *st, int i)
{
	return sdb_col_text(st, i);
}

/* Column i into out (cap bytes, truncated, "" for NULL). */
void store_copy_col(struct sdb_stmt *st, int i, char *out, size_t cap);

/* Bind v at i, NULL when v is NULL (store_bind_opt_text) or 0 (_uint). */
void store_bind_opt_text(struct sdb_stmt *st, int i, const char *v);
void store_bind_opt_uint(struct sdb_stmt *st, int i, unsigned v);

/* Column i as JSON: its integer / string, or null. New references. */
json_t *store_opt_int(struct sdb_stmt *st, int i);
json_t *store_opt_str(struct sdb_stmt *st, int i);

/* The index of str in names (n of them), n when it is none of them (or
 * NULL): task_state_parse and session_state_parse. */
static inline int store_name_index(const char *const *names, int n, const char *str)
{
	for (int i = 0; str && i < n; i++)
		if (!strcmp(str, names[i]))
			return i;
	return n;
}

/* ---- ids and randomness (store.c) ---- */

/* n bytes as 2n lowercase hex digits and a NUL. */
void store_hex(const unsigned char *in, size_t n, char *out);

/* n random bytes (getrandom); 0 or -1 with errno. */
int store_random(void *buf, size_t n);

/* A new row id: prefix ("t_", "s_") and 128 random bits in 32 hex digits,
 * into out (40 bytes). 0, or -1 when there is no randomness. A collision is
 * not a practical concern, and the tables' UNIQUE constraint would refuse
 * one rather than merge two rows. */
int store_new_id(const char *prefix, char out[40]);

/* ---- change notification (store.c); no lock held ---- */

/* Bump the change counter, wake waiters, then hand data (consumed; may be
 * NULL: no listener call) to the listener. After the commit, outside s->lock. */
void store_changed(struct store *s, const char *id, const char *event, json_t *data);

/* store_changed for this process only (what another replica learns some
 * other way: store_notify_queued_locked). data consumed. */
void store_changed_here(struct store *s, const char *id, const char *event, json_t *data);

/* Replicas: announce n submissions queued at `at` inside the transaction
 * that inserts them (one NOTIFY per 100; delivered at its commit). 0 or -1.
 * Lock held. Nothing for SQLite. */
int store_notify_queued_locked(struct store *s, const char *const *ids, int n, int64_t at);

/* Bump the change counter, wake this process's waiters and hand data (not
 * consumed) to the listener and, when remote (it came from another
 * replica), to the remote hook (store_open.c's listener callback). */
void store_wake_local(struct store *s, const char *id, const char *event, json_t *data, int remote);

/* store_changed with event "state" and {"state":NAME,"at":at} (store_tasks.c). */
void store_task_changed(struct store *s, const char *task_id, enum task_state st, int64_t at);

/* ---- one row by id (store.c) ---- */

/* Run the statement in slot/sql (?1 = id) and, if it finds a row whose
 * column cust_col equals customer (customer NULL: any), call fn on it.
 * Takes the lock. Returns fn's result, or -ENOENT when there is no such row
 * (of this customer), -EIO when the statement does not prepare. */
int store_row_by_id(struct store *s, int slot, const char *sql, const char *id, const char *customer, int cust_col,
		    int (*fn)(struct sdb_stmt *st, void *arg), void *arg);

/* A text column (0) of the row of slot/sql (?1 = id), copied (caller frees),
 * or NULL. For the spec getters. Takes the lock. */
char *store_text_by_id(struct store *s, int slot, const char *sql, const char *id);

/* ---- lists of rows (store.c) ---- */

/* Run slot/sql with ?1 = arg (when not NULL) and the next parameter = max,
 * and call row on each of at most max rows with the next element of out
 * (an array of elements of size bytes). Returns how many were filled (0 on
 * a store error). Takes the lock. */
int store_rows(struct store *s, int slot, const char *sql, const char *arg, void *out, size_t size, int max,
	       void (*row)(struct sdb_stmt *st, void *elem));

/* ---- pagination (store.c) ---- */

/* A page of a newest-first list: its statement has ?1 customer, ?2 state
 * (both bound, NULL when not given), ?3 "seq below", ?4 the row limit. */
struct store_page {
	int slot;                    /* statement slot and SQL */
	const char *sql;
	const char *customer;        /* NULL: every customer */
	const char *state;           /* as given by the client; NULL: none */
	int (*state_valid)(const char *state); /* non-zero if state is acceptable */
	int seq_col;                 /* the row's seq column: the cursor */
	json_t *(*row_json)(struct sdb_stmt *st); /* one element of the page */
	const char *what;            /* "tasks", "sessions": for the error message */
	int ascending;               /* sql pages oldest first: ?3 is the seq after which to start */
};

#define STORE_PAGE_MAX 1000

/* Parse a cursor this API gave out: a decimal seq >= 1, nothing else.
 * 0 and *before, or -EINVAL. */
int store_cursor_parse(const char *cursor, int64_t *before);

/* Run page p: at most limit (1..STORE_PAGE_MAX) rows after cursor (NULL:
 * from the newest). *next_cursor (caller frees) is the cursor of the next
 * page, NULL on the last one. A new array, or NULL with err set
 * ("invalid_request" for limit, state and cursor; "store_error"). Takes
 * the lock. */
json_t *store_page_run(struct store *s, const struct store_page *p, unsigned limit, const char *cursor,
		       char **next_cursor, struct kiln_err *err);

/* ---- compare-and-set (store.c) ---- */

/* One change of a row's state, only if it is in `from` now. The statement
 * is an UPDATE ... WHERE id = :id AND state = :from; the helper binds
 * whichever of these named parameters it uses. */
struct store_cas {
	const char *id;              /* :id */
	const char *from, *to;       /* :from, :to (state names) */
	const char *host;            /* :host */
	const char *reason;          /* :reason */
	const char *snapshot;        /* :snapshot */
	int64_t now;                 /* :now */
};

/* Run the compare-and-set statement st (from store_stmt). 1 moved, 0 not
 * (the row is in another state, or gone), -1 error. Lock held. */
int store_cas_locked(struct store *s, struct sdb_stmt *st, const struct store_cas *c);

/* ---- quotas (store.c; store_room_locked, store_customer_quota_locked: store_keys.c) ---- */

/* The customer's stored quotas: 0, -ENOENT (no such customer), -EIO.
 * Lock held. (store_keys.c) */
int store_customer_quota_locked(struct store *s, const char *customer, struct quota *q);

/* Tasks placed and sessions holding a VM: running, vcpus, memory_mib of u.
 * 0 or -EIO. Lock held. */
int store_running_usage_locked(struct store *s, const char *customer, struct usage *u);

/* Inside a transaction: wait for and hold until its end the customer's
 * lock (PostgreSQL: an advisory transaction lock; SQLite: nothing, its
 * writers are serialised). So quota checks and the writes they allow are
 * one step across replicas. 0 or -1. Lock held. */
int store_lock_customer_locked(struct store *s, const char *customer);

/* Whether the customer's running quota (tasks and sessions together) leaves
 * room for one more of vcpus and memory_mib: 0 yes; -EDQUOT no (err, which
 * may be NULL, says which limit); -ENOENT the quotas cannot be read (only
 * when !missing_ok; with it the defaults apply); -EIO the usage cannot be
 * read. Lock held, inside the caller's transaction. */
int store_room_locked(struct store *s, const char *customer, unsigned vcpus, unsigned memory_mib, int missing_ok,
		      struct kiln_err *err);

/* ---- templates (store_templates.c) ---- */

/* Record that task or session id uses the template u (inside the caller's
 * transaction). 0, or -1 (SQLite's error message is in s->db). Lock held. */
int store_template_use_insert_locked(struct store *s, const char *id, const struct store_template_use *u);

/* Give task or session `to` the template use of `from` (a snapshot), in the
 * caller's transaction; nothing when from has none. 0 or -1. Lock held.
 * (store_snapshots.c) */
int store_template_use_copy_locked(struct store *s, const char *to, const char *from);

/* Whether the customer's snapshot id exists and is not deleted: 1, 0, -1.
 * Lock held. (store_snapshots.c) */
int store_snapshot_live_locked(struct store *s, const char *id, const char *customer);

/* Record session id's mounts (n of them) of the customer's volumes, in the
 * caller's transaction (the session's insert), the customer's lock held:
 * 0; -EINVAL with err "invalid_request" (a volume that is not, or no
 * longer, the customer's); -EBUSY with err "volume_busy" (a read-write
 * mount while another session that is not destroyed has one); -1 with
 * err "store_error". Lock held. (store_volumes.c) */
int store_volume_attach_locked(struct store *s, const char *id, const char *customer,
			       const struct store_volume_mount *m, unsigned n, struct kiln_err *err);

/* ---- destinations (store_destinations.c) ---- */

/* The destination columns id, endpoint, region, bucket, prefix, access_key,
 * secret_sealed, created_ms, updated_ms, from column c on, into out (zeroed
 * by the caller). */
#define STORE_DEST_COLS "id, endpoint, region, bucket, prefix, access_key, secret_sealed, created_ms, updated_ms"
void store_dest_row(struct sdb_stmt *st, int c, struct store_dest *out);

/* ---- metering (store_usage.c); lock held, inside the transaction that
 * ends what is metered, so that it is counted exactly once ---- */

/* Task id has just reached a final state: its VM time (from starting_ms,
 * or running_ms, to ended_ms, weighted by its vCPUs and memory) into its
 * customer's minutes, one task started (in starting_ms's minute) and the
 * egress_bytes its sandbox sent (its host's result; in ended_ms's minute)
 * if it ever started. 0 or -1. */
int store_usage_task_locked(struct store *s, const char *id, int64_t egress_bytes);

/* Session id has just moved from `from` to `to` at now: from running or
 * pausing to paused, destroyed or error ends its interval (started_ms to
 * now), from starting to running counts one session started. 0 or -1. */
int store_usage_session_locked(struct store *s, const char *id, enum session_state from, enum session_state to,
			       int64_t now);

/* Whether a session's move from `from` to `to` is one
 * store_usage_session_locked records something for. */
int store_usage_session_metered(enum session_state from, enum session_state to);

/* ---- the pieces' own set-up ---- */

/* Bring the schema to STORE_SCHEMA_VERSION (store_migrate.c); with
 * migrate 0 only check that it is there (an older one is an error naming
 * `kiln-api migrate`). */
int store_migrate(struct sdb *db, int migrate, struct kiln_err *err);

/* The schema version of db, -1 if unreadable (store_migrate.c). */
int store_read_version(struct sdb *db);

/* sdb_exec with the error in err ("store_error"): 0 or -1 (store_migrate.c). */
int store_exec(struct sdb *db, const char *sql, struct kiln_err *err);

/* Build the key table afresh from the rows and swap it in: another
 * replica created or revoked a key. 0 or -1. Takes the locks. */
int store_keys_reload(struct store *s);

/* Fill the key table from the keys rows, at open (store_keys.c). */
int store_keys_load(struct store *s, struct kiln_err *err);

#endif
