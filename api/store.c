/* store: kiln-api's durable state in SQLite (see store.h).
 *
 * One connection, one mutex (s->lock) around every use of it; statements are
 * prepared once and reset after each use. WAL with synchronous=FULL: a
 * commit has reached the disk when sqlite3_step returns, so the HTTP layer
 * may answer 202 right after store_task_submit.
 *
 * Group commit: a commit costs an fsync (a few ms), so submissions that
 * arrive while one is being committed wait and then go to disk together in
 * the next transaction, each inside a savepoint of its own (one failing
 * insert does not take the others with it). Whoever finds no commit under
 * way leads the next batch; the others sleep until theirs is done.
 *
 * Keys: only SHA-256(key) is stored. Every key row is loaded at open into an
 * in-memory table (s->keys, under its own rwlock) that store_key_check reads
 * without touching SQLite; create and revoke update table and database
 * together. This process is the database's only writer, so the table cannot
 * go stale.
 *
 * Change notification: s->gen counts committed state changes (s->ch_lock,
 * s->ch_cond); long-polls and event streams wait on it. */
#include "store.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sqlite3.h>

#include "quota.h"

#define KEY_SECRET_BYTES 32
#define KEY_MAX_LEN 256

static const char *const state_names[TASK_STATE_COUNT] = {
	"queued", "scheduled", "starting", "running", "uploading",
	"succeeded", "failed", "timed_out", "cancelled", "error",
};

const char *task_state_name(enum task_state st)
{
	return st < TASK_STATE_COUNT ? state_names[st] : "unknown";
}

enum task_state task_state_parse(const char *str)
{
	for (int i = 0; str && i < TASK_STATE_COUNT; i++)
		if (!strcmp(str, state_names[i]))
			return (enum task_state)i;
	return TASK_STATE_COUNT;
}

/* ---- schema: ordered migrations, each applied once in its own transaction ---- */

static const char *const migrations[STORE_SCHEMA_VERSION] = {
	/* 1: everything */
	"CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT NOT NULL, quotas TEXT NOT NULL,"
	"  created_ms INTEGER NOT NULL);"
	"CREATE TABLE keys (id TEXT PRIMARY KEY, customer TEXT REFERENCES customers(id), admin INTEGER NOT NULL,"
	"  hash BLOB NOT NULL UNIQUE, created_ms INTEGER NOT NULL, revoked_ms INTEGER);"
	"CREATE TABLE tasks (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
	"  customer TEXT NOT NULL, state TEXT NOT NULL, metadata TEXT, vcpus INTEGER NOT NULL,"
	"  memory_mib INTEGER NOT NULL, timeout_s INTEGER, output_mib INTEGER, idem_key TEXT, body_hash TEXT,"
	"  host_id TEXT, created_ms INTEGER NOT NULL, scheduled_ms INTEGER, starting_ms INTEGER,"
	"  running_ms INTEGER, uploading_ms INTEGER, ended_ms INTEGER, cancel_requested INTEGER NOT NULL DEFAULT 0,"
	"  cancel_sent_ms INTEGER, end_reason TEXT,"
	"  host_task TEXT);" /* last: it can be large, and columns after it would cost reading it */
	"CREATE UNIQUE INDEX tasks_idem ON tasks(customer, idem_key) WHERE idem_key IS NOT NULL;"
	"CREATE INDEX tasks_customer ON tasks(customer, seq);"
	"CREATE TABLE task_specs (id TEXT PRIMARY KEY, spec TEXT NOT NULL);"
	"CREATE TABLE hosts (id TEXT PRIMARY KEY, url TEXT NOT NULL, capacity TEXT NOT NULL,"
	"  last_heartbeat_ms INTEGER NOT NULL, registered_ms INTEGER NOT NULL, lost INTEGER NOT NULL DEFAULT 0);",
	/* 2: the scheduler's and the per-state list's access paths */
	"CREATE INDEX tasks_state ON tasks(state, seq);"
	"CREATE INDEX tasks_customer_state ON tasks(customer, state, seq);",
	/* 3: sessions (long-lived sandboxes) */
	"CREATE TABLE sessions (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
	"  customer TEXT NOT NULL, state TEXT NOT NULL, host_id TEXT, vcpus INTEGER NOT NULL,"
	"  memory_mib INTEGER NOT NULL, idle_timeout_s INTEGER NOT NULL, max_lifetime_s INTEGER NOT NULL,"
	"  egress INTEGER NOT NULL DEFAULT 0, created_ms INTEGER NOT NULL, started_ms INTEGER NOT NULL,"
	"  last_active_ms INTEGER NOT NULL, paused_ms INTEGER, ended_ms INTEGER, end_reason TEXT, metadata TEXT,"
	"  snapshot TEXT, spec TEXT NOT NULL);"
	"CREATE INDEX sessions_customer ON sessions(customer, seq);"
	"CREATE INDEX sessions_state ON sessions(state, seq);",
};

/* ---- prepared statements ---- */

#define TASK_COLS                                                                                         \
	"id, customer, state, metadata, vcpus, memory_mib, timeout_s, output_mib, host_id, created_ms,"   \
	" scheduled_ms, starting_ms, running_ms, uploading_ms, ended_ms, cancel_requested, end_reason,"  \
	" idem_key, seq"
enum {
	TC_ID, TC_CUSTOMER, TC_STATE, TC_METADATA, TC_VCPUS, TC_MEMORY, TC_TIMEOUT, TC_OUTPUT, TC_HOST,
	TC_CREATED, TC_SCHEDULED, TC_STARTING, TC_RUNNING, TC_UPLOADING, TC_ENDED, TC_CANCEL_REQ, TC_END_REASON,
	TC_IDEM, TC_SEQ, TC_HOST_TASK,
};
#define SCHED_BASE "id, customer, state, vcpus, memory_mib, host_id, seq, created_ms, cancel_requested"
/* Whether the task asks for network egress: only hosts that offer it take it. */
#define SCHED_EGRESS "coalesce((SELECT json_extract(sp.spec, '$.network.egress') = 'allow'" \
		     " FROM task_specs sp WHERE sp.id = tasks.id), 0) AS egress"
#define SCHED_COLS SCHED_BASE ", " SCHED_EGRESS

/* Holding a VM: counted in the running quota. */
#define SESS_HOLDING "('starting', 'running', 'pausing', 'resuming')"
#define SESS_COLS                                                                                          \
	"id, customer, state, host_id, vcpus, memory_mib, idle_timeout_s, max_lifetime_s, egress,"         \
	" snapshot IS NOT NULL, created_ms, started_ms, last_active_ms, paused_ms, ended_ms, end_reason,"  \
	" metadata, snapshot, spec, seq"
enum {
	SC_ID, SC_CUSTOMER, SC_STATE, SC_HOST, SC_VCPUS, SC_MEMORY, SC_IDLE, SC_LIFETIME, SC_EGRESS, SC_HAS_SNAP,
	SC_CREATED, SC_STARTED, SC_ACTIVE, SC_PAUSED, SC_ENDED, SC_END_REASON, SC_METADATA, SC_SNAPSHOT, SC_SPEC,
	SC_SEQ,
};

enum stmt_id {
	ST_BEGIN, ST_COMMIT, ST_ROLLBACK, ST_SAVEPOINT, ST_RELEASE, ST_ROLLBACK_TO,
	ST_CUST_INSERT, ST_CUST_QUOTA, ST_CUST_SET_QUOTA, ST_CUST_GET,
	ST_KEY_INSERT, ST_KEY_REVOKE, ST_KEY_GET,
	ST_TASK_INSERT, ST_SPEC_INSERT, ST_IDEM_FIND, ST_TASK_GET, ST_SPEC_GET, ST_TASK_STATE,
	ST_FINISH, ST_IN_STATE, ST_FAIR, ST_USAGE_RUN, ST_USAGE_QUEUED,
	ST_CANCEL_NOW, ST_CANCEL_REQ, ST_CANCEL_PENDING, ST_CANCEL_SENT,
	ST_LIST_ALL, ST_LIST_ALL_STATE, ST_LIST_CUST, ST_LIST_CUST_STATE,
	ST_HOST_HB, ST_HOST_LIST, ST_HOST_LOST,
	ST_SESS_INSERT, ST_SESS_GET, ST_SESS_DISCARD, ST_SESS_TRANS, ST_SESS_TOUCH, ST_SESS_SPEC, ST_SESS_HOLDING,
	ST_SESS_LIST, ST_USAGE_SESS,
	ST_COUNT
};

static const char *const stmt_sql[ST_COUNT] = {
	[ST_BEGIN] = "BEGIN IMMEDIATE",
	[ST_COMMIT] = "COMMIT",
	[ST_ROLLBACK] = "ROLLBACK",
	[ST_SAVEPOINT] = "SAVEPOINT sub",
	[ST_RELEASE] = "RELEASE sub",
	[ST_ROLLBACK_TO] = "ROLLBACK TO sub",
	[ST_CUST_INSERT] = "INSERT INTO customers(id, name, quotas, created_ms) VALUES (?1, ?2, ?3, ?4)",
	[ST_CUST_QUOTA] = "SELECT quotas FROM customers WHERE id = ?1",
	[ST_CUST_SET_QUOTA] = "UPDATE customers SET quotas = ?1 WHERE id = ?2",
	[ST_CUST_GET] = "SELECT id, name, created_ms, quotas FROM customers WHERE id = ?1",
	[ST_KEY_INSERT] = "INSERT INTO keys(id, customer, admin, hash, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
	[ST_KEY_REVOKE] = "UPDATE keys SET revoked_ms = coalesce(revoked_ms, ?1) WHERE id = ?2",
	[ST_KEY_GET] = "SELECT id, customer, admin, hash, revoked_ms FROM keys",
	[ST_TASK_INSERT] = "INSERT INTO tasks(id, customer, state, metadata, vcpus, memory_mib, timeout_s, output_mib,"
			   " idem_key, body_hash, created_ms) VALUES (?1, ?2, 'queued', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
	[ST_SPEC_INSERT] = "INSERT INTO task_specs(id, spec) VALUES (?1, ?2)",
	[ST_IDEM_FIND] = "SELECT id, body_hash FROM tasks WHERE customer = ?1 AND idem_key = ?2",
	[ST_TASK_GET] = "SELECT " TASK_COLS ", host_task FROM tasks WHERE id = ?1",
	[ST_SPEC_GET] = "SELECT spec FROM task_specs WHERE id = ?1",
	[ST_TASK_STATE] = "SELECT state, customer FROM tasks WHERE id = ?1",
	[ST_FINISH] = "UPDATE tasks SET state = ?1, end_reason = ?2, host_task = ?3, ended_ms = ?4"
		      " WHERE id = ?5 AND state IN ('queued', 'scheduled', 'starting', 'running', 'uploading')",
	[ST_IN_STATE] = "SELECT " SCHED_COLS " FROM tasks WHERE state = ?1 ORDER BY seq LIMIT ?2",
	[ST_FAIR] = "SELECT " SCHED_BASE ", egress FROM (SELECT " SCHED_COLS ", row_number() OVER"
		    " (PARTITION BY customer ORDER BY seq) AS rn FROM tasks WHERE state = 'queued')"
		    " ORDER BY rn, seq LIMIT ?1",
	/* Tasks placed and sessions holding a VM share the running quota. */
	[ST_USAGE_RUN] = "SELECT count(*), coalesce(sum(vcpus), 0), coalesce(sum(memory_mib), 0) FROM"
			 " (SELECT vcpus, memory_mib FROM tasks WHERE customer = ?1"
			 " AND state IN ('scheduled', 'starting', 'running')"
			 " UNION ALL SELECT vcpus, memory_mib FROM sessions WHERE customer = ?1 AND state IN " SESS_HOLDING ")",
	[ST_USAGE_QUEUED] = "SELECT count(*) FROM tasks WHERE customer = ?1 AND state = 'queued'",
	[ST_CANCEL_NOW] = "UPDATE tasks SET state = 'cancelled', end_reason = 'cancelled', ended_ms = ?1,"
			  " cancel_requested = 1 WHERE id = ?2 AND state IN ('queued', 'scheduled')",
	[ST_CANCEL_REQ] = "UPDATE tasks SET cancel_requested = 1 WHERE id = ?1 AND state IN ('starting', 'running')"
			  " AND cancel_requested = 0",
	[ST_CANCEL_PENDING] = "SELECT " SCHED_COLS " FROM tasks WHERE cancel_requested = 1 AND cancel_sent_ms IS NULL"
			      " AND state IN ('starting', 'running') ORDER BY seq LIMIT ?1",
	[ST_CANCEL_SENT] = "UPDATE tasks SET cancel_sent_ms = ?1 WHERE id = ?2",
	[ST_LIST_ALL] = "SELECT " TASK_COLS " FROM tasks WHERE seq < ?3 ORDER BY seq DESC LIMIT ?4",
	[ST_LIST_ALL_STATE] = "SELECT " TASK_COLS " FROM tasks WHERE state = ?2 AND seq < ?3 ORDER BY seq DESC LIMIT ?4",
	[ST_LIST_CUST] = "SELECT " TASK_COLS " FROM tasks WHERE customer = ?1 AND seq < ?3 ORDER BY seq DESC LIMIT ?4",
	[ST_LIST_CUST_STATE] = "SELECT " TASK_COLS " FROM tasks WHERE customer = ?1 AND state = ?2 AND seq < ?3"
			       " ORDER BY seq DESC LIMIT ?4",
	[ST_HOST_HB] = "INSERT INTO hosts(id, url, capacity, last_heartbeat_ms, registered_ms, lost)"
		       " VALUES (?1, ?2, ?3, ?4, ?4, 0) ON CONFLICT(id) DO UPDATE SET url = excluded.url,"
		       " capacity = excluded.capacity, last_heartbeat_ms = excluded.last_heartbeat_ms, lost = 0",
	[ST_HOST_LIST] = "SELECT id, url, capacity, last_heartbeat_ms, registered_ms, lost FROM hosts ORDER BY id",
	[ST_HOST_LOST] = "UPDATE hosts SET lost = ?1 WHERE id = ?2",
	[ST_SESS_INSERT] = "INSERT INTO sessions(id, customer, state, host_id, vcpus, memory_mib, idle_timeout_s,"
			   " max_lifetime_s, egress, created_ms, started_ms, last_active_ms, metadata, spec)"
			   " VALUES (?1, ?2, 'starting', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?9, ?10, ?11)",
	[ST_SESS_GET] = "SELECT " SESS_COLS " FROM sessions WHERE id = ?1",
	[ST_SESS_DISCARD] = "DELETE FROM sessions WHERE id = ?1 AND state = 'starting'",
	/* ?1 to, ?2 host (NULL keep, '' clear), ?3 reason (same), ?4 snapshot
	 * (NULL keep), ?5 now, ?6 id, ?7 from. */
	[ST_SESS_TRANS] = "UPDATE sessions SET state = ?1,"
			  " host_id = CASE WHEN ?2 IS NULL THEN host_id WHEN ?2 = '' THEN NULL ELSE ?2 END,"
			  " end_reason = CASE WHEN ?3 IS NULL THEN end_reason WHEN ?3 = '' THEN NULL ELSE ?3 END,"
			  " snapshot = coalesce(?4, snapshot),"
			  " started_ms = CASE WHEN ?1 = 'running' AND ?7 IN ('starting', 'resuming') THEN ?5"
			  "  ELSE started_ms END,"
			  " last_active_ms = CASE WHEN ?1 = 'running' AND ?7 IN ('starting', 'resuming') THEN ?5"
			  "  ELSE last_active_ms END,"
			  " paused_ms = CASE WHEN ?1 = 'paused' THEN ?5 ELSE paused_ms END,"
			  " ended_ms = CASE WHEN ?1 IN ('destroyed', 'error') THEN ?5"
			  "  WHEN ?1 IN ('running', 'resuming') THEN NULL ELSE ended_ms END"
			  " WHERE id = ?6 AND state = ?7",
	[ST_SESS_TOUCH] = "UPDATE sessions SET last_active_ms = max(last_active_ms, ?1) WHERE id = ?2",
	[ST_SESS_SPEC] = "SELECT spec FROM sessions WHERE id = ?1",
	[ST_SESS_HOLDING] = "SELECT " SESS_COLS " FROM sessions WHERE state IN " SESS_HOLDING " ORDER BY seq LIMIT ?1",
	/* ?1 customer (NULL: all), ?2 state (NULL: all but destroyed; 'all'), ?3 before seq, ?4 limit */
	[ST_SESS_LIST] = "SELECT " SESS_COLS " FROM sessions WHERE (?1 IS NULL OR customer = ?1)"
			 " AND (CASE WHEN ?2 IS NULL THEN state != 'destroyed' WHEN ?2 = 'all' THEN 1 ELSE state = ?2 END)"
			 " AND seq < ?3 ORDER BY seq DESC LIMIT ?4",
	[ST_USAGE_SESS] = "SELECT coalesce(sum(state IN " SESS_HOLDING "), 0), coalesce(sum(state = 'paused'), 0)"
			  " FROM sessions WHERE customer = ?1",
};

/* ---- the key cache ---- */

struct key_entry {
	unsigned char hash[SHA256_DIGEST_LENGTH];
	char key_id[32];
	char customer[65];
	int admin, revoked, used;
};

struct store {
	sqlite3 *db;
	pthread_mutex_t lock;
	sqlite3_stmt *st[ST_COUNT];
	sqlite3_stmt *trans[TASK_STATE_COUNT]; /* store_task_transition, by target state */

	pthread_rwlock_t keys_lock;
	struct key_entry *keys;     /* open addressing by hash, at most half full */
	size_t keys_cap, keys_n;

	pthread_mutex_t ch_lock;
	pthread_cond_t ch_cond;
	uint64_t gen;
	int woken;
	store_listener_fn *listener;
	void *listener_arg;

	/* Group commit of submissions (see the top of this file). */
	pthread_mutex_t gc_lock;
	pthread_cond_t gc_cond;
	struct pending_submit *gc_queue; /* waiting for the next batch, newest first */
	int gc_leading;                  /* a batch is being committed */
};

/* One submission on its way into a batch (on its submitter's stack). */
struct pending_submit {
	const struct store_submit *t;
	struct kiln_err *err;
	char id[40];
	int64_t at; /* when it was recorded */
	int r;      /* store_task_submit's result, once done */
	int done;
	struct pending_submit *next;
};

static int64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void hex(const unsigned char *in, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * n] = '\0';
}

static int random_bytes(void *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = getrandom((char *)buf + got, n - got, 0);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		got += (size_t)r;
	}
	return 0;
}

/* The statement, reset and with its bindings cleared (s->lock held). */
static sqlite3_stmt *stmt(struct store *s, enum stmt_id id)
{
	sqlite3_stmt *st = s->st[id];

	if (!st) {
		if (sqlite3_prepare_v3(s->db, stmt_sql[id], -1, SQLITE_PREPARE_PERSISTENT, &s->st[id], NULL) !=
		    SQLITE_OK) {
			fprintf(stderr, "kiln-api: store: cannot prepare \"%s\": %s\n", stmt_sql[id], sqlite3_errmsg(s->db));
			return NULL;
		}
		st = s->st[id];
	}
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
	return st;
}

/* Run a statement that returns no rows; SQLITE_DONE or the error code. */
static int run(struct store *s, enum stmt_id id)
{
	sqlite3_stmt *st = stmt(s, id);
	int rc;

	if (!st)
		return SQLITE_ERROR;
	rc = sqlite3_step(st);
	sqlite3_reset(st);
	return rc;
}

static int step_done(struct store *s, sqlite3_stmt *st)
{
	int rc = sqlite3_step(st);

	if (rc != SQLITE_DONE && rc != SQLITE_ROW)
		fprintf(stderr, "kiln-api: store: %s\n", sqlite3_errmsg(s->db));
	return rc;
}

static const char *col_text(sqlite3_stmt *st, int i)
{
	return (const char *)sqlite3_column_text(st, i);
}

static void copy_col(sqlite3_stmt *st, int i, char *out, size_t cap)
{
	const char *t = col_text(st, i);

	snprintf(out, cap, "%s", t ? t : "");
}

/* ---- change notification ---- */

static void changed(struct store *s, const char *task_id, const char *event, json_t *data)
{
	store_listener_fn *fn;
	void *arg;

	pthread_mutex_lock(&s->ch_lock);
	s->gen++;
	fn = s->listener;
	arg = s->listener_arg;
	pthread_cond_broadcast(&s->ch_cond);
	pthread_mutex_unlock(&s->ch_lock);
	if (fn && data)
		fn(arg, task_id, event, data);
	json_decref(data);
}

static void state_changed(struct store *s, const char *task_id, enum task_state st, int64_t at)
{
	changed(s, task_id, "state", json_pack("{s:s, s:I}", "state", task_state_name(st), "at", (json_int_t)at));
}

void store_set_listener(struct store *s, store_listener_fn *fn, void *arg)
{
	pthread_mutex_lock(&s->ch_lock);
	s->listener = fn;
	s->listener_arg = arg;
	pthread_mutex_unlock(&s->ch_lock);
}

uint64_t store_changes(struct store *s)
{
	uint64_t g;

	pthread_mutex_lock(&s->ch_lock);
	g = s->gen;
	pthread_mutex_unlock(&s->ch_lock);
	return g;
}

int store_wait_change(struct store *s, uint64_t seen, int64_t deadline_ms)
{
	int r;

	pthread_mutex_lock(&s->ch_lock);
	while (s->gen == seen && !s->woken) {
		struct timespec ts = { .tv_sec = deadline_ms / 1000, .tv_nsec = (deadline_ms % 1000) * 1000000 };

		if (mono_ms() >= deadline_ms)
			break;
		pthread_cond_timedwait(&s->ch_cond, &s->ch_lock, &ts);
	}
	r = s->gen != seen;
	pthread_mutex_unlock(&s->ch_lock);
	return r;
}

void store_wake_all(struct store *s)
{
	pthread_mutex_lock(&s->ch_lock);
	s->woken = 1;
	pthread_cond_broadcast(&s->ch_cond);
	pthread_mutex_unlock(&s->ch_lock);
}

/* ---- open, migrate, close ---- */

static int exec_sql(sqlite3 *db, const char *sql, struct kiln_err *err)
{
	char *msg = NULL;

	if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
		kiln_err_set(err, "store_error", "%s", msg ? msg : sqlite3_errmsg(db));
		sqlite3_free(msg);
		return -1;
	}
	return 0;
}

static int read_version(sqlite3 *db)
{
	sqlite3_stmt *st;
	int v = -1;

	if (sqlite3_prepare_v2(db, "SELECT version FROM schema_version", -1, &st, NULL) != SQLITE_OK)
		return -1;
	if (sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_int(st, 0);
	sqlite3_finalize(st);
	return v;
}

static int migrate(sqlite3 *db, struct kiln_err *err)
{
	int v;

	if (exec_sql(db, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)", err) < 0)
		return -1;
	if (exec_sql(db, "INSERT INTO schema_version SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM schema_version)",
		     err) < 0)
		return -1;
	v = read_version(db);
	if (v < 0)
		return kiln_err_set(err, "store_error", "cannot read the schema version");
	if (v > STORE_SCHEMA_VERSION)
		return kiln_err_set(err, "store_error",
				    "the database has schema version %d, newer than this kiln-api knows (%d)", v,
				    STORE_SCHEMA_VERSION);
	for (; v < STORE_SCHEMA_VERSION; v++) {
		char bump[64];

		snprintf(bump, sizeof(bump), "UPDATE schema_version SET version = %d", v + 1);
		if (exec_sql(db, "BEGIN IMMEDIATE", err) < 0)
			return -1;
		if (exec_sql(db, migrations[v], err) < 0 || exec_sql(db, bump, err) < 0) {
			char m[sizeof(err->message)];

			snprintf(m, sizeof(m), "%s", err ? err->message : "");
			exec_sql(db, "ROLLBACK", NULL);
			return kiln_err_set(err, "store_error", "migration %d: %s", v + 1, m);
		}
		if (exec_sql(db, "COMMIT", err) < 0)
			return -1;
	}
	return 0;
}

int store_schema_version(struct store *s)
{
	int v;

	pthread_mutex_lock(&s->lock);
	v = read_version(s->db);
	pthread_mutex_unlock(&s->lock);
	return v;
}

static size_t key_slot(const struct store *s, const unsigned char *hash)
{
	uint64_t h;

	memcpy(&h, hash, sizeof(h));
	return (size_t)(h & (s->keys_cap - 1));
}

/* Add to the table (keys_lock held for writing). */
static int key_table_add(struct store *s, const struct key_entry *e)
{
	if ((s->keys_n + 1) * 2 > s->keys_cap) {
		size_t ncap = s->keys_cap ? s->keys_cap * 2 : 1024;
		struct key_entry *n = calloc(ncap, sizeof(*n)), *old = s->keys;
		size_t ocap = s->keys_cap;

		if (!n)
			return -ENOMEM;
		s->keys = n;
		s->keys_cap = ncap;
		s->keys_n = 0;
		for (size_t i = 0; i < ocap; i++)
			if (old[i].used)
				key_table_add(s, &old[i]);
		free(old);
	}
	for (size_t i = key_slot(s, e->hash);; i = (i + 1) & (s->keys_cap - 1)) {
		if (!s->keys[i].used) {
			s->keys[i] = *e;
			s->keys[i].used = 1;
			s->keys_n++;
			return 0;
		}
	}
}

static int keys_load(struct store *s, struct kiln_err *err)
{
	sqlite3_stmt *st = stmt(s, ST_KEY_GET);
	int rc;

	if (!st)
		return kiln_err_set(err, "store_error", "cannot read keys");
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct key_entry e = { .admin = sqlite3_column_int(st, 2), .revoked = sqlite3_column_type(st, 4) != SQLITE_NULL };

		if (sqlite3_column_bytes(st, 3) != SHA256_DIGEST_LENGTH)
			continue;
		memcpy(e.hash, sqlite3_column_blob(st, 3), SHA256_DIGEST_LENGTH);
		copy_col(st, 0, e.key_id, sizeof(e.key_id));
		copy_col(st, 1, e.customer, sizeof(e.customer));
		if (key_table_add(s, &e) < 0) {
			sqlite3_reset(st);
			return kiln_err_set(err, "store_error", "out of memory");
		}
	}
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? 0 : kiln_err_set(err, "store_error", "reading keys: %s", sqlite3_errmsg(s->db));
}

struct store *store_open(const char *path, struct kiln_err *err)
{
	struct store *s = calloc(1, sizeof(*s));
	pthread_condattr_t ca;
	int rc;

	if (!s) {
		kiln_err_set(err, "store_error", "out of memory");
		return NULL;
	}
	pthread_mutex_init(&s->lock, NULL);
	pthread_rwlock_init(&s->keys_lock, NULL);
	pthread_mutex_init(&s->ch_lock, NULL);
	pthread_mutex_init(&s->gc_lock, NULL);
	pthread_cond_init(&s->gc_cond, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->ch_cond, &ca);
	pthread_condattr_destroy(&ca);
	/* NOMUTEX: s->lock serialises every use of the connection. */
	rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
	if (rc != SQLITE_OK) {
		kiln_err_set(err, "store_error", "%s: %s", path, s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
		goto fail;
	}
	sqlite3_busy_timeout(s->db, 5000);
	if (exec_sql(s->db, "PRAGMA journal_mode=WAL", err) < 0 ||
	    exec_sql(s->db, "PRAGMA synchronous=FULL", err) < 0 || exec_sql(s->db, "PRAGMA foreign_keys=ON", err) < 0)
		goto fail;
	if (migrate(s->db, err) < 0 || keys_load(s, err) < 0)
		goto fail;
	return s;
fail:
	if (err && strncmp(err->message, path, strlen(path))) {
		char m[sizeof(err->message)];

		snprintf(m, sizeof(m), "%s", err->message);
		kiln_err_set(err, "store_error", "%s: %s", path, m);
	}
	store_close(s);
	return NULL;
}

void store_close(struct store *s)
{
	if (!s)
		return;
	for (int i = 0; i < ST_COUNT; i++)
		sqlite3_finalize(s->st[i]);
	for (int i = 0; i < TASK_STATE_COUNT; i++)
		sqlite3_finalize(s->trans[i]);
	sqlite3_close(s->db);
	free(s->keys);
	pthread_mutex_destroy(&s->lock);
	pthread_rwlock_destroy(&s->keys_lock);
	pthread_mutex_destroy(&s->ch_lock);
	pthread_cond_destroy(&s->ch_cond);
	pthread_mutex_destroy(&s->gc_lock);
	pthread_cond_destroy(&s->gc_cond);
	free(s);
}

/* ---- customers ---- */

int store_customer_create(struct store *s, const char *id, const char *name, const struct quota *q,
			  struct kiln_err *err)
{
	json_t *qj = quota_to_json(q);
	char *qs = json_dumps(qj, JSON_COMPACT);
	sqlite3_stmt *st;
	int rc = SQLITE_ERROR;

	json_decref(qj);
	if (!qs)
		return kiln_err_set(err, "internal", "out of memory");
	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_CUST_INSERT);
	if (st) {
		sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, qs, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 4, wall_ms());
		rc = sqlite3_step(st);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	free(qs);
	if (rc == SQLITE_CONSTRAINT)
		return kiln_err_set(err, "duplicate", "a customer with the id \"%s\" exists", id);
	if (rc != SQLITE_DONE)
		return kiln_err_set(err, "store_error", "cannot create the customer");
	return 0;
}

/* s->lock held. */
static int customer_quota_locked(struct store *s, const char *id, struct quota *q)
{
	sqlite3_stmt *st = stmt(s, ST_CUST_QUOTA);
	int r = -ENOENT;

	if (!st)
		return -EIO;
	sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
	if (sqlite3_step(st) == SQLITE_ROW) {
		json_t *j = json_loads(col_text(st, 0) ? col_text(st, 0) : "", 0, NULL);

		/* Stored quotas are complete; a quota added by a later version
		 * that a row lacks takes its built-in default. */
		quota_defaults(q);
		r = j && quota_from_json(j, "", q, NULL) == 0 ? 0 : -EIO;
		json_decref(j);
	}
	sqlite3_reset(st);
	return r;
}

int store_customer_quota(struct store *s, const char *id, struct quota *q)
{
	int r;

	pthread_mutex_lock(&s->lock);
	r = customer_quota_locked(s, id, q);
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_customer_set_quota(struct store *s, const char *id, const struct quota *q, struct kiln_err *err)
{
	json_t *qj = quota_to_json(q);
	char *qs = json_dumps(qj, JSON_COMPACT);
	sqlite3_stmt *st;
	int rc = SQLITE_ERROR, n = 0;

	json_decref(qj);
	if (!qs)
		return kiln_err_set(err, "internal", "out of memory");
	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_CUST_SET_QUOTA);
	if (st) {
		sqlite3_bind_text(st, 1, qs, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
		rc = step_done(s, st);
		n = sqlite3_changes(s->db);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	free(qs);
	if (rc != SQLITE_DONE)
		return kiln_err_set(err, "store_error", "cannot update the quotas");
	if (!n) {
		kiln_err_set(err, "not_found", "no customer \"%s\"", id);
		return -ENOENT;
	}
	return 0;
}

json_t *store_customer_json(struct store *s, const char *id)
{
	sqlite3_stmt *st;
	json_t *j = NULL;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_CUST_GET);
	if (st) {
		sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
		if (sqlite3_step(st) == SQLITE_ROW)
			j = json_pack("{s:s, s:s, s:I, s:o?}", "id", col_text(st, 0), "name", col_text(st, 1),
				      "created_at", (json_int_t)sqlite3_column_int64(st, 2), "quotas",
				      json_loads(col_text(st, 3) ? col_text(st, 3) : "", 0, NULL));
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return j;
}

/* ---- keys ---- */

static void base64url(const unsigned char *in, size_t n, char *out)
{
	static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
	size_t i, o = 0;

	for (i = 0; i + 2 < n; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];

		out[o++] = a[v >> 18];
		out[o++] = a[(v >> 12) & 63];
		out[o++] = a[(v >> 6) & 63];
		out[o++] = a[v & 63];
	}
	if (n - i == 1) {
		out[o++] = a[in[i] >> 2];
		out[o++] = a[(in[i] & 3) << 4];
	} else if (n - i == 2) {
		uint32_t v = (uint32_t)in[i] << 8 | in[i + 1];

		out[o++] = a[v >> 10];
		out[o++] = a[(v >> 4) & 63];
		out[o++] = a[(v & 15) << 2];
	}
	out[o] = '\0';
}

int store_key_create(struct store *s, const char *customer, int admin, char **key_out, char key_id_out[32],
		     struct kiln_err *err)
{
	unsigned char idb[8], secret[KEY_SECRET_BYTES];
	char id[17], sec[64], *key;
	struct key_entry e = { .admin = admin ? 1 : 0 };
	sqlite3_stmt *st;
	int rc = SQLITE_ERROR;

	*key_out = NULL;
	if (random_bytes(idb, sizeof(idb)) < 0 || random_bytes(secret, sizeof(secret)) < 0)
		return kiln_err_set(err, "internal", "no randomness: %s", strerror(errno));
	hex(idb, sizeof(idb), id);
	base64url(secret, sizeof(secret), sec);
	OPENSSL_cleanse(secret, sizeof(secret));
	if (asprintf(&key, "kiln_%s_%s", id, sec) < 0)
		return kiln_err_set(err, "internal", "out of memory");
	OPENSSL_cleanse(sec, sizeof(sec));
	SHA256((const unsigned char *)key, strlen(key), e.hash);
	snprintf(e.key_id, sizeof(e.key_id), "%s", id);
	snprintf(e.customer, sizeof(e.customer), "%s", customer ? customer : "");

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_KEY_INSERT);
	if (st) {
		sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
		if (customer)
			sqlite3_bind_text(st, 2, customer, -1, SQLITE_STATIC);
		sqlite3_bind_int(st, 3, e.admin);
		sqlite3_bind_blob(st, 4, e.hash, sizeof(e.hash), SQLITE_STATIC);
		sqlite3_bind_int64(st, 5, wall_ms());
		rc = sqlite3_step(st);
		sqlite3_reset(st);
	}
	if (rc == SQLITE_DONE) {
		pthread_rwlock_wrlock(&s->keys_lock);
		if (key_table_add(s, &e) < 0)
			rc = SQLITE_NOMEM;
		pthread_rwlock_unlock(&s->keys_lock);
	}
	pthread_mutex_unlock(&s->lock);
	if (rc != SQLITE_DONE) {
		OPENSSL_cleanse(key, strlen(key));
		free(key);
		if (rc == SQLITE_CONSTRAINT)
			return kiln_err_set(err, "not_found", "no customer \"%s\"", customer ? customer : "");
		return kiln_err_set(err, "store_error", "cannot store the key");
	}
	*key_out = key;
	snprintf(key_id_out, 32, "%s", id);
	return 0;
}

int store_key_revoke(struct store *s, const char *key_id)
{
	sqlite3_stmt *st;
	int rc = SQLITE_ERROR, n = 0;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_KEY_REVOKE);
	if (st) {
		sqlite3_bind_int64(st, 1, wall_ms());
		sqlite3_bind_text(st, 2, key_id, -1, SQLITE_STATIC);
		rc = step_done(s, st);
		n = sqlite3_changes(s->db);
		sqlite3_reset(st);
	}
	if (rc == SQLITE_DONE && n) {
		pthread_rwlock_wrlock(&s->keys_lock);
		for (size_t i = 0; i < s->keys_cap; i++)
			if (s->keys[i].used && !strcmp(s->keys[i].key_id, key_id))
				s->keys[i].revoked = 1;
		pthread_rwlock_unlock(&s->keys_lock);
	}
	pthread_mutex_unlock(&s->lock);
	if (rc != SQLITE_DONE)
		return -EIO;
	return n ? 0 : -ENOENT;
}

int store_key_check(struct store *s, const char *key, char customer[65], int *admin)
{
	unsigned char h[SHA256_DIGEST_LENGTH];
	size_t n = strnlen(key, KEY_MAX_LEN + 1);
	int ok = 0;

	if (n > KEY_MAX_LEN || strncmp(key, "kiln_", 5))
		return 0;
	SHA256((const unsigned char *)key, n, h);
	pthread_rwlock_rdlock(&s->keys_lock);
	if (s->keys_cap) {
		for (size_t i = key_slot(s, h); s->keys[i].used; i = (i + 1) & (s->keys_cap - 1)) {
			/* The table is indexed by the hash itself: whoever can
			 * steer this comparison already knows the key. */
			if (!memcmp(s->keys[i].hash, h, sizeof(h))) {
				if (!s->keys[i].revoked) {
					ok = 1;
					memcpy(customer, s->keys[i].customer, 65);
					*admin = s->keys[i].admin;
				}
				break;
			}
		}
	}
	pthread_rwlock_unlock(&s->keys_lock);
	return ok;
}

/* ---- tasks ---- */

static void bind_opt_text(sqlite3_stmt *st, int i, const char *v)
{
	if (v)
		sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
	else
		sqlite3_bind_null(st, i);
}

static void bind_opt_uint(sqlite3_stmt *st, int i, unsigned v)
{
	if (v)
		sqlite3_bind_int64(st, i, v);
	else
		sqlite3_bind_null(st, i);
}

/* s->lock held. */
static int idem_find_locked(struct store *s, const char *customer, const char *idem_key, const char *body_hash,
			    char id_out[40], struct kiln_err *err)
{
	sqlite3_stmt *st = stmt(s, ST_IDEM_FIND);
	int r = 0;

	if (!st)
		return kiln_err_set(err, "store_error", "cannot look the idempotency key up");
	sqlite3_bind_text(st, 1, customer, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, idem_key, -1, SQLITE_STATIC);
	if (sqlite3_step(st) == SQLITE_ROW) {
		const char *h = col_text(st, 1);

		copy_col(st, 0, id_out, 40);
		if (h && body_hash && !strcmp(h, body_hash))
			r = 1;
		else
			r = kiln_err_set(err, "idempotency_conflict",
					 "Idempotency-Key was used for task %s with a different request body", id_out);
	}
	sqlite3_reset(st);
	return r;
}

int store_task_idem_find(struct store *s, const char *customer, const char *idem_key, const char *body_hash,
			 char id_out[40], struct kiln_err *err)
{
	int r;

	pthread_mutex_lock(&s->lock);
	r = idem_find_locked(s, customer, idem_key, body_hash, id_out, err);
	pthread_mutex_unlock(&s->lock);
	return r;
}

/* One submission inside the open transaction, in a savepoint: p->r is 0
 * (inserted, p->id set), 1 (its idempotency key names an earlier task with
 * the same body: p->id is that task), or -1 with p->err. s->lock held. */
static void submit_one_locked(struct store *s, struct pending_submit *p, int64_t now)
{
	const struct store_submit *t = p->t;
	unsigned char rnd[16];
	sqlite3_stmt *st;
	int rc;

	p->r = -1;
	p->at = now;
	if (run(s, ST_SAVEPOINT) != SQLITE_DONE) {
		kiln_err_set(p->err, "store_error", "cannot store the task: %s", sqlite3_errmsg(s->db));
		return;
	}
	if (t->idem_key) {
		p->r = idem_find_locked(s, t->customer, t->idem_key, t->body_hash, p->id, p->err);
		if (p->r != 0)
			goto release;
		p->r = -1;
	}
	/* 128 random bits: a collision is not a practical concern, and the
	 * UNIQUE constraint would refuse one rather than merge two tasks. */
	if (random_bytes(rnd, sizeof(rnd)) < 0) {
		kiln_err_set(p->err, "internal", "no randomness");
		goto undo;
	}
	memcpy(p->id, "t_", 2);
	hex(rnd, sizeof(rnd), p->id + 2);
	st = stmt(s, ST_TASK_INSERT);
	if (!st)
		goto fail_sql;
	sqlite3_bind_text(st, 1, p->id, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, t->customer, -1, SQLITE_STATIC);
	bind_opt_text(st, 3, t->metadata_json);
	sqlite3_bind_int64(st, 4, t->vcpus);
	sqlite3_bind_int64(st, 5, t->memory_mib);
	bind_opt_uint(st, 6, t->timeout_s);
	bind_opt_uint(st, 7, t->output_mib);
	bind_opt_text(st, 8, t->idem_key);
	bind_opt_text(st, 9, t->body_hash);
	sqlite3_bind_int64(st, 10, now);
	rc = step_done(s, st);
	sqlite3_reset(st);
	if (rc != SQLITE_DONE)
		goto fail_sql;
	st = stmt(s, ST_SPEC_INSERT);
	if (!st)
		goto fail_sql;
	sqlite3_bind_text(st, 1, p->id, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, t->spec_json, -1, SQLITE_STATIC);
	rc = step_done(s, st);
	sqlite3_reset(st);
	if (rc != SQLITE_DONE)
		goto fail_sql;
	p->r = 0;
	goto release;
fail_sql:
	kiln_err_set(p->err, "store_error", "cannot store the task: %s", sqlite3_errmsg(s->db));
undo:
	run(s, ST_ROLLBACK_TO);
release:
	run(s, ST_RELEASE);
}

/* Commit a batch (oldest first) in one transaction: every p->r and p->err
 * is set. A failed commit fails the whole batch. Takes s->lock. */
static void commit_batch(struct store *s, struct pending_submit *batch, int64_t now)
{
	struct pending_submit *p;

	pthread_mutex_lock(&s->lock);
	if (run(s, ST_BEGIN) != SQLITE_DONE) {
		for (p = batch; p; p = p->next) {
			p->r = -1;
			kiln_err_set(p->err, "store_error", "cannot begin: %s", sqlite3_errmsg(s->db));
		}
		pthread_mutex_unlock(&s->lock);
		return;
	}
	for (p = batch; p; p = p->next)
		submit_one_locked(s, p, now);
	if (run(s, ST_COMMIT) != SQLITE_DONE) {
		char why[256];

		snprintf(why, sizeof(why), "%s", sqlite3_errmsg(s->db));
		run(s, ST_ROLLBACK);
		for (p = batch; p; p = p->next) {
			p->r = -1;
			kiln_err_set(p->err, "store_error", "cannot store the task: %s", why);
		}
	}
	pthread_mutex_unlock(&s->lock);
}

int store_task_submit(struct store *s, const struct store_submit *t, char id_out[40], struct kiln_err *err)
{
	struct pending_submit me = { .t = t, .err = err };

	pthread_mutex_lock(&s->gc_lock);
	me.next = s->gc_queue;
	s->gc_queue = &me;
	while (!me.done) {
		struct pending_submit *batch = NULL, *p, *next;
		int64_t now;

		if (s->gc_leading) {
			pthread_cond_wait(&s->gc_cond, &s->gc_lock);
			continue;
		}
		/* Lead: take everything queued, oldest first. */
		s->gc_leading = 1;
		for (p = s->gc_queue; p; p = next) {
			next = p->next;
			p->next = batch;
			batch = p;
		}
		s->gc_queue = NULL;
		pthread_mutex_unlock(&s->gc_lock);
		now = wall_ms();
		commit_batch(s, batch, now);
		pthread_mutex_lock(&s->gc_lock);
		for (p = batch; p; p = next) {
			next = p->next; /* p may be gone once done is seen */
			p->done = 1;
		}
		s->gc_leading = 0;
		pthread_cond_broadcast(&s->gc_cond);
	}
	pthread_mutex_unlock(&s->gc_lock);
	if (me.r >= 0)
		memcpy(id_out, me.id, strlen(me.id) + 1);
	if (me.r == 0)
		state_changed(s, id_out, TASK_QUEUED, me.at);
	return me.r;
}

int store_task_insert(struct store *s, const char *customer, const char *spec_json, const char *metadata_json,
		      unsigned vcpus, unsigned memory_mib, const char *idem_key, const char *body_hash,
		      char id_out[40], struct kiln_err *err)
{
	struct store_submit t = {
		.customer = customer, .spec_json = spec_json, .metadata_json = metadata_json, .vcpus = vcpus,
		.memory_mib = memory_mib, .idem_key = idem_key, .body_hash = body_hash,
	};

	return store_task_submit(s, &t, id_out, err);
}

static json_t *opt_int(sqlite3_stmt *st, int i)
{
	return sqlite3_column_type(st, i) == SQLITE_NULL ? json_null() : json_integer(sqlite3_column_int64(st, i));
}

static json_t *opt_str(sqlite3_stmt *st, int i)
{
	const char *t = col_text(st, i);

	return t ? json_string(t) : json_null();
}

/* b - a when both are known, else null. */
static json_t *span(sqlite3_stmt *st, int a, int b)
{
	if (sqlite3_column_type(st, a) == SQLITE_NULL || sqlite3_column_type(st, b) == SQLITE_NULL)
		return json_null();
	return json_integer(sqlite3_column_int64(st, b) - sqlite3_column_int64(st, a));
}

/* The public JSON of the row st is on; with full, the host's result,
 * outputs and artifacts too (the row has TC_HOST_TASK). */
static json_t *row_json(sqlite3_stmt *st, int full)
{
	const char *md = col_text(st, TC_METADATA);
	int run_end = sqlite3_column_type(st, TC_UPLOADING) != SQLITE_NULL ? TC_UPLOADING : TC_ENDED;
	json_t *j, *timings;

	timings = json_pack("{s:o, s:o, s:o, s:o, s:o}", "queued_ms", span(st, TC_CREATED, TC_SCHEDULED), "start_ms",
			    span(st, TC_SCHEDULED, TC_RUNNING), "run_ms", span(st, TC_RUNNING, run_end), "upload_ms",
			    span(st, TC_UPLOADING, TC_ENDED), "total_ms", span(st, TC_CREATED, TC_ENDED));
	j = json_pack("{s:s, s:s, s:s, s:I, s:o, s:{s:I, s:I, s:o, s:o}, s:o, s:o, s:b, s:o, s:o}", "id",
		      col_text(st, TC_ID), "customer", col_text(st, TC_CUSTOMER), "state", col_text(st, TC_STATE),
		      "created_at", (json_int_t)sqlite3_column_int64(st, TC_CREATED), "metadata",
		      md ? json_loads(md, 0, NULL) : json_null(), "limits", "vcpus",
		      (json_int_t)sqlite3_column_int64(st, TC_VCPUS), "memory_mib",
		      (json_int_t)sqlite3_column_int64(st, TC_MEMORY), "timeout_s", opt_int(st, TC_TIMEOUT),
		      "output_mib", opt_int(st, TC_OUTPUT), "host", opt_str(st, TC_HOST), "end_reason",
		      opt_str(st, TC_END_REASON), "cancel_requested", sqlite3_column_int(st, TC_CANCEL_REQ),
		      "idempotency_key", opt_str(st, TC_IDEM), "timings", timings);
	if (j && full) {
		const char *ht = col_text(st, TC_HOST_TASK);
		json_t *h = ht ? json_loads(ht, 0, NULL) : NULL, *v;

		v = json_object_get(h, "result");
		json_object_set(j, "result", v ? v : json_null());
		v = json_object_get(h, "outputs");
		json_object_set_new(j, "outputs", json_is_array(v) ? json_incref(v) : json_array());
		v = json_object_get(h, "artifacts");
		json_object_set_new(j, "artifacts", json_is_object(v) ? json_incref(v) : json_object());
		v = json_object_get(h, "error");
		if (v)
			json_object_set(j, "error", v);
		json_decref(h);
	}
	return j;
}

json_t *store_task_json(struct store *s, const char *id, const char *customer)
{
	sqlite3_stmt *st;
	json_t *j = NULL;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_TASK_GET);
	if (st) {
		sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
		if (sqlite3_step(st) == SQLITE_ROW &&
		    (!customer || !strcmp(customer, col_text(st, TC_CUSTOMER) ? col_text(st, TC_CUSTOMER) : "")))
			j = row_json(st, 1);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return j;
}

int store_task_state(struct store *s, const char *id, enum task_state *state)
{
	sqlite3_stmt *st;
	int r = -ENOENT;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_TASK_STATE);
	if (st) {
		sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
		if (sqlite3_step(st) == SQLITE_ROW) {
			*state = task_state_parse(col_text(st, 0));
			r = 0;
		}
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

json_t *store_task_list(struct store *s, const char *customer, const char *state, unsigned limit,
			const char *cursor, char **next_cursor, struct kiln_err *err)
{
	enum stmt_id which = customer ? (state ? ST_LIST_CUST_STATE : ST_LIST_CUST)
				      : (state ? ST_LIST_ALL_STATE : ST_LIST_ALL);
	int64_t before = INT64_MAX, last = 0;
	sqlite3_stmt *st;
	json_t *arr;
	unsigned n = 0;
	int rc;

	*next_cursor = NULL;
	if (limit < 1 || limit > 1000) {
		kiln_err_set(err, "invalid_request", "limit: must be from 1 to 100");
		return NULL;
	}
	if (state && task_state_parse(state) == TASK_STATE_COUNT) {
		kiln_err_set(err, "invalid_request", "state: unknown state");
		return NULL;
	}
	if (cursor) {
		char *end;

		errno = 0;
		before = strtoll(cursor, &end, 10);
		if (!*cursor || *end || errno || before < 1 || cursor[0] == '+' || cursor[0] == ' ') {
			kiln_err_set(err, "invalid_request", "cursor: not one this API gave out");
			return NULL;
		}
	}
	arr = json_array();
	pthread_mutex_lock(&s->lock);
	st = stmt(s, which);
	if (!st) {
		pthread_mutex_unlock(&s->lock);
		json_decref(arr);
		kiln_err_set(err, "store_error", "cannot list tasks");
		return NULL;
	}
	if (customer)
		sqlite3_bind_text(st, 1, customer, -1, SQLITE_STATIC);
	if (state)
		sqlite3_bind_text(st, 2, state, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, before);
	sqlite3_bind_int64(st, 4, (sqlite3_int64)limit + 1);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (n == limit) {
			/* One more than asked for: there is a next page. */
			if (asprintf(next_cursor, "%lld", (long long)last) < 0)
				*next_cursor = NULL;
			break;
		}
		json_array_append_new(arr, row_json(st, 0));
		last = sqlite3_column_int64(st, TC_SEQ);
		n++;
	}
	sqlite3_reset(st);
	pthread_mutex_unlock(&s->lock);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
		json_decref(arr);
		free(*next_cursor);
		*next_cursor = NULL;
		kiln_err_set(err, "store_error", "cannot list tasks");
		return NULL;
	}
	return arr;
}

char *store_task_spec(struct store *s, const char *id)
{
	sqlite3_stmt *st;
	char *spec = NULL;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_SPEC_GET);
	if (st) {
		sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
		if (sqlite3_step(st) == SQLITE_ROW && col_text(st, 0))
			spec = strdup(col_text(st, 0));
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return spec;
}

/* The timestamp column a target state sets. */
static const char *state_column(enum task_state to)
{
	switch (to) {
	case TASK_QUEUED:
		return NULL;
	case TASK_SCHEDULED:
		return "scheduled_ms";
	case TASK_STARTING:
		return "starting_ms";
	case TASK_RUNNING:
		return "running_ms";
	case TASK_UPLOADING:
		return "uploading_ms";
	default:
		return "ended_ms";
	}
}

/* s->lock held: UPDATE ... WHERE id AND state = from; returns rows changed or -1. */
static int transition_locked(struct store *s, const char *id, enum task_state from, enum task_state to,
			     const char *host_id, int64_t now)
{
	sqlite3_stmt *st = s->trans[to];
	int rc, n;

	if (!st) {
		char sql[512];
		const char *col = state_column(to);

		/* Back to the queue (a host lost before the task started): the
		 * placement is forgotten. */
		if (!col)
			snprintf(sql, sizeof(sql),
				 "UPDATE tasks SET state = ?1, host_id = ?2, scheduled_ms = NULL, starting_ms = NULL,"
				 " cancel_sent_ms = NULL WHERE id = ?4 AND state = ?5");
		else
			snprintf(sql, sizeof(sql),
				 "UPDATE tasks SET state = ?1, host_id = coalesce(?2, host_id), %s = coalesce(%s, ?3)%s"
				 " WHERE id = ?4 AND state = ?5",
				 col, col, task_state_final(to) ? ", end_reason = coalesce(end_reason, ?1)" : "");
		if (sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s->trans[to], NULL) != SQLITE_OK) {
			fprintf(stderr, "kiln-api: store: %s\n", sqlite3_errmsg(s->db));
			return -1;
		}
		st = s->trans[to];
	}
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
	sqlite3_bind_text(st, 1, task_state_name(to), -1, SQLITE_STATIC);
	bind_opt_text(st, 2, host_id);
	sqlite3_bind_int64(st, 3, now);
	sqlite3_bind_text(st, 4, id, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 5, task_state_name(from), -1, SQLITE_STATIC);
	rc = step_done(s, st);
	n = sqlite3_changes(s->db);
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? n : -1;
}

int store_task_transition(struct store *s, const char *id, enum task_state from, enum task_state to,
			  const char *host_id)
{
	int64_t now = wall_ms();
	int n;

	if (from >= TASK_STATE_COUNT || to >= TASK_STATE_COUNT || from == to)
		return -1;
	pthread_mutex_lock(&s->lock);
	n = transition_locked(s, id, from, to, host_id, now);
	pthread_mutex_unlock(&s->lock);
	if (n > 0)
		state_changed(s, id, to, now);
	return n < 0 ? -1 : n > 0;
}

/* Tasks placed and sessions holding a VM: count, vCPUs, memory (s->lock held). */
static int running_usage_locked(struct store *s, const char *customer, struct usage *u)
{
	sqlite3_stmt *st = stmt(s, ST_USAGE_RUN);
	int r = -EIO;

	if (!st)
		return -EIO;
	sqlite3_bind_text(st, 1, customer, -1, SQLITE_STATIC);
	if (step_done(s, st) == SQLITE_ROW) {
		u->running = (unsigned)sqlite3_column_int64(st, 0);
		u->vcpus = (unsigned)sqlite3_column_int64(st, 1);
		u->memory_mib = (uint64_t)sqlite3_column_int64(st, 2);
		r = 0;
	}
	sqlite3_reset(st);
	return r;
}

int store_task_schedule(struct store *s, const char *id, const char *host_id)
{
	int64_t now = wall_ms();
	struct quota q;
	struct usage u = { 0 };
	sqlite3_stmt *st;
	char customer[65] = "";
	unsigned vcpus = 0, mem = 0;
	int r = -EIO, found = 0;

	pthread_mutex_lock(&s->lock);
	if (run(s, ST_BEGIN) != SQLITE_DONE)
		goto out;
	st = stmt(s, ST_TASK_GET);
	if (!st)
		goto rollback;
	sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
	if (sqlite3_step(st) == SQLITE_ROW && task_state_parse(col_text(st, TC_STATE)) == TASK_QUEUED) {
		found = 1;
		copy_col(st, TC_CUSTOMER, customer, sizeof(customer));
		vcpus = (unsigned)sqlite3_column_int64(st, TC_VCPUS);
		mem = (unsigned)sqlite3_column_int64(st, TC_MEMORY);
	}
	sqlite3_reset(st);
	if (!found) {
		r = 0;
		goto rollback;
	}
	if (customer_quota_locked(s, customer, &q) < 0)
		quota_defaults(&q); /* a task whose customer row is gone still runs under the defaults */
	if (running_usage_locked(s, customer, &u) < 0)
		goto rollback;
	if (!quota_allows_start(&q, &u, vcpus, mem)) {
		r = -EDQUOT;
		goto rollback;
	}
	if (transition_locked(s, id, TASK_QUEUED, TASK_SCHEDULED, host_id, now) != 1)
		goto rollback;
	if (run(s, ST_COMMIT) != SQLITE_DONE)
		goto rollback;
	r = 1;
	goto out;
rollback:
	run(s, ST_ROLLBACK);
out:
	pthread_mutex_unlock(&s->lock);
	if (r == 1)
		state_changed(s, id, TASK_SCHEDULED, now);
	return r;
}

int store_task_finish(struct store *s, const char *id, enum task_state state, const char *end_reason,
		      json_t *host_task)
{
	char *ht = host_task ? json_dumps(host_task, JSON_COMPACT) : NULL;
	int64_t now = wall_ms();
	sqlite3_stmt *st;
	int rc = SQLITE_ERROR, n = 0;

	if (!task_state_final(state)) {
		free(ht);
		return -1;
	}
	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_FINISH);
	if (st) {
		sqlite3_bind_text(st, 1, task_state_name(state), -1, SQLITE_STATIC);
		bind_opt_text(st, 2, end_reason);
		bind_opt_text(st, 3, ht);
		sqlite3_bind_int64(st, 4, now);
		sqlite3_bind_text(st, 5, id, -1, SQLITE_STATIC);
		rc = step_done(s, st);
		n = sqlite3_changes(s->db);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	free(ht);
	if (rc != SQLITE_DONE)
		return -1;
	if (n)
		state_changed(s, id, state, now);
	return n > 0;
}

static int fill_tasks(struct store *s, sqlite3_stmt *st, struct store_task *out, int max)
{
	int n = 0;

	while (n < max && step_done(s, st) == SQLITE_ROW) {
		struct store_task *t = &out[n++];

		memset(t, 0, sizeof(*t));
		copy_col(st, 0, t->id, sizeof(t->id));
		copy_col(st, 1, t->customer, sizeof(t->customer));
		t->state = task_state_parse(col_text(st, 2));
		t->vcpus = (unsigned)sqlite3_column_int64(st, 3);
		t->memory_mib = (unsigned)sqlite3_column_int64(st, 4);
		copy_col(st, 5, t->host_id, sizeof(t->host_id));
		t->seq = sqlite3_column_int64(st, 6);
		t->created_ms = sqlite3_column_int64(st, 7);
		t->cancel_requested = sqlite3_column_int(st, 8);
		t->egress = sqlite3_column_int(st, 9);
	}
	sqlite3_reset(st);
	return n;
}

int store_tasks_in_state(struct store *s, enum task_state state, struct store_task *out, int max)
{
	sqlite3_stmt *st;
	int n = 0;

	if (max <= 0 || state >= TASK_STATE_COUNT)
		return 0;
	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_IN_STATE);
	if (st) {
		sqlite3_bind_text(st, 1, task_state_name(state), -1, SQLITE_STATIC);
		sqlite3_bind_int(st, 2, max);
		n = fill_tasks(s, st, out, max);
	}
	pthread_mutex_unlock(&s->lock);
	return n;
}

int store_tasks_queued_fair(struct store *s, struct store_task *out, int max)
{
	sqlite3_stmt *st;
	int n = 0;

	if (max <= 0)
		return 0;
	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_FAIR);
	if (st) {
		sqlite3_bind_int(st, 1, max);
		n = fill_tasks(s, st, out, max);
	}
	pthread_mutex_unlock(&s->lock);
	return n;
}

int store_tasks_cancel_pending(struct store *s, struct store_task *out, int max)
{
	sqlite3_stmt *st;
	int n = 0;

	if (max <= 0)
		return 0;
	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_CANCEL_PENDING);
	if (st) {
		sqlite3_bind_int(st, 1, max);
		n = fill_tasks(s, st, out, max);
	}
	pthread_mutex_unlock(&s->lock);
	return n;
}

int store_task_cancel_sent(struct store *s, const char *id)
{
	sqlite3_stmt *st;
	int rc = SQLITE_ERROR;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_CANCEL_SENT);
	if (st) {
		sqlite3_bind_int64(st, 1, wall_ms());
		sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
		rc = step_done(s, st);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return rc == SQLITE_DONE ? 0 : -1;
}

enum store_cancel store_task_cancel(struct store *s, const char *id, const char *customer, enum task_state *state)
{
	enum store_cancel r = STORE_CANCEL_FAILED;
	enum task_state cur = TASK_STATE_COUNT;
	int64_t now = wall_ms();
	sqlite3_stmt *st;
	int n, rc;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_TASK_STATE);
	if (!st)
		goto out;
	sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		cur = task_state_parse(col_text(st, 0));
		if (customer && strcmp(customer, col_text(st, 1) ? col_text(st, 1) : ""))
			rc = SQLITE_DONE; /* another customer's: as if it did not exist */
	}
	sqlite3_reset(st);
	if (rc != SQLITE_ROW) {
		r = rc == SQLITE_DONE ? STORE_CANCEL_NOT_FOUND : STORE_CANCEL_FAILED;
		cur = TASK_STATE_COUNT;
		goto out;
	}
	if (cur == TASK_QUEUED || cur == TASK_SCHEDULED) {
		st = stmt(s, ST_CANCEL_NOW);
		if (!st)
			goto out;
		sqlite3_bind_int64(st, 1, now);
		sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
		rc = step_done(s, st);
		n = sqlite3_changes(s->db);
		sqlite3_reset(st);
		if (rc != SQLITE_DONE)
			goto out;
		/* Only this thread writes under the lock, so the state read
		 * above still holds; n == 1 always. */
		r = n ? STORE_CANCEL_DONE : STORE_CANCEL_FAILED;
		if (n)
			cur = TASK_CANCELLED;
	} else if (cur == TASK_STARTING || cur == TASK_RUNNING) {
		st = stmt(s, ST_CANCEL_REQ);
		if (!st)
			goto out;
		sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
		rc = step_done(s, st);
		n = sqlite3_changes(s->db);
		sqlite3_reset(st);
		if (rc != SQLITE_DONE)
			goto out;
		r = STORE_CANCEL_REQUESTED;
		if (!n)
			now = 0; /* asked before: nothing new to announce */
	} else {
		r = STORE_CANCEL_TOO_LATE;
	}
out:
	pthread_mutex_unlock(&s->lock);
	if (state)
		*state = cur;
	if (r == STORE_CANCEL_DONE)
		state_changed(s, id, TASK_CANCELLED, now);
	else if (r == STORE_CANCEL_REQUESTED && now)
		changed(s, id, "cancel", json_pack("{s:I}", "at", (json_int_t)now));
	return r;
}

int store_customer_usage(struct store *s, const char *customer, struct usage *u)
{
	sqlite3_stmt *st;
	int r = -EIO;

	memset(u, 0, sizeof(*u));
	pthread_mutex_lock(&s->lock);
	r = running_usage_locked(s, customer, u);
	st = r == 0 ? stmt(s, ST_USAGE_QUEUED) : NULL;
	if (st) {
		sqlite3_bind_text(st, 1, customer, -1, SQLITE_STATIC);
		r = -EIO;
		if (step_done(s, st) == SQLITE_ROW) {
			u->queued = (unsigned)sqlite3_column_int64(st, 0);
			r = 0;
		}
		sqlite3_reset(st);
	}
	st = r == 0 ? stmt(s, ST_USAGE_SESS) : NULL;
	if (st) {
		sqlite3_bind_text(st, 1, customer, -1, SQLITE_STATIC);
		r = -EIO;
		if (step_done(s, st) == SQLITE_ROW) {
			u->sessions = (unsigned)sqlite3_column_int64(st, 0);
			u->paused_sessions = (unsigned)sqlite3_column_int64(st, 1);
			r = 0;
		}
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

/* ---- hosts ---- */

int store_host_heartbeat(struct store *s, const char *host_id, const char *url, json_t *capacity,
			 struct kiln_err *err)
{
	char *cap = json_dumps(capacity ? capacity : json_object(), JSON_COMPACT);
	sqlite3_stmt *st;
	int rc = SQLITE_ERROR;

	if (!cap)
		return kiln_err_set(err, "internal", "out of memory");
	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_HOST_HB);
	if (st) {
		sqlite3_bind_text(st, 1, host_id, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 2, url, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, cap, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 4, wall_ms());
		rc = step_done(s, st);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	free(cap);
	return rc == SQLITE_DONE ? 0 : kiln_err_set(err, "store_error", "cannot record the heartbeat");
}

json_t *store_host_list(struct store *s)
{
	json_t *arr = json_array();
	sqlite3_stmt *st;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_HOST_LIST);
	if (st) {
		while (step_done(s, st) == SQLITE_ROW) {
			const char *cap = col_text(st, 2);
			json_t *c = cap ? json_loads(cap, 0, NULL) : NULL;

			json_array_append_new(arr, json_pack("{s:s, s:s, s:o, s:I, s:I, s:s}", "id", col_text(st, 0),
							     "url", col_text(st, 1), "capacity", c ? c : json_object(),
							     "last_heartbeat_ms", (json_int_t)sqlite3_column_int64(st, 3),
							     "registered_ms", (json_int_t)sqlite3_column_int64(st, 4),
							     "state", sqlite3_column_int(st, 5) ? "lost" : "live"));
		}
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return arr;
}

int store_host_set_lost(struct store *s, const char *host_id, int lost)
{
	sqlite3_stmt *st;
	int rc = SQLITE_ERROR, n = 0;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_HOST_LOST);
	if (st) {
		sqlite3_bind_int(st, 1, lost ? 1 : 0);
		sqlite3_bind_text(st, 2, host_id, -1, SQLITE_STATIC);
		rc = step_done(s, st);
		n = sqlite3_changes(s->db);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	if (rc != SQLITE_DONE)
		return -EIO;
	return n ? 0 : -ENOENT;
}

/* ---- sessions ---- */

static const char *const session_names[SESSION_STATE_COUNT] = {
	"starting", "running", "pausing", "paused", "resuming", "destroyed", "error",
};

const char *session_state_name(enum session_state st)
{
	return st < SESSION_STATE_COUNT ? session_names[st] : "unknown";
}

enum session_state session_state_parse(const char *str)
{
	for (int i = 0; str && i < SESSION_STATE_COUNT; i++)
		if (!strcmp(str, session_names[i]))
			return (enum session_state)i;
	return SESSION_STATE_COUNT;
}

static void session_row(sqlite3_stmt *st, struct store_session *out)
{
	memset(out, 0, sizeof(*out));
	copy_col(st, SC_ID, out->id, sizeof(out->id));
	copy_col(st, SC_CUSTOMER, out->customer, sizeof(out->customer));
	copy_col(st, SC_HOST, out->host_id, sizeof(out->host_id));
	out->state = session_state_parse(col_text(st, SC_STATE));
	out->vcpus = (unsigned)sqlite3_column_int64(st, SC_VCPUS);
	out->memory_mib = (unsigned)sqlite3_column_int64(st, SC_MEMORY);
	out->idle_timeout_s = (unsigned)sqlite3_column_int64(st, SC_IDLE);
	out->max_lifetime_s = (unsigned)sqlite3_column_int64(st, SC_LIFETIME);
	out->egress = sqlite3_column_int(st, SC_EGRESS);
	out->has_snapshot = sqlite3_column_int(st, SC_HAS_SNAP);
	out->created_ms = sqlite3_column_int64(st, SC_CREATED);
	out->started_ms = sqlite3_column_int64(st, SC_STARTED);
	out->last_active_ms = sqlite3_column_int64(st, SC_ACTIVE);
}

/* The public JSON of the session row st is on. */
static json_t *session_row_json(sqlite3_stmt *st)
{
	const char *md = col_text(st, SC_METADATA), *snap = col_text(st, SC_SNAPSHOT), *spec = col_text(st, SC_SPEC);
	json_t *sp = spec ? json_loads(spec, 0, NULL) : NULL, *limits, *net, *j;
	enum session_state state = session_state_parse(col_text(st, SC_STATE));
	json_t *expires = json_null();

	limits = json_object_get(sp, "limits");
	net = json_object_get(sp, "network");
	if (session_state_holds(state)) {
		/* The earlier of the idle deadline and the end of its lifetime. */
		int64_t idle = sqlite3_column_int64(st, SC_ACTIVE) + sqlite3_column_int64(st, SC_IDLE) * 1000;
		int64_t life = sqlite3_column_int64(st, SC_STARTED) + sqlite3_column_int64(st, SC_LIFETIME) * 1000;

		expires = json_integer(idle < life ? idle : life);
	}
	j = json_pack("{s:s, s:s, s:s, s:o, s:s, s:O, s:O, s:I, s:I, s:o, s:I, s:I, s:I, s:o, s:o, s:o, s:o, s:o}",
		      "id", col_text(st, SC_ID), "customer", col_text(st, SC_CUSTOMER), "state",
		      session_state_name(state), "host", opt_str(st, SC_HOST), "image", "default", "limits",
		      limits ? limits : json_null(), "network", net ? net : json_null(), "idle_timeout_s",
		      (json_int_t)sqlite3_column_int64(st, SC_IDLE), "max_lifetime_s",
		      (json_int_t)sqlite3_column_int64(st, SC_LIFETIME), "metadata",
		      md ? json_loads(md, 0, NULL) : json_null(), "created_at",
		      (json_int_t)sqlite3_column_int64(st, SC_CREATED), "started_at",
		      (json_int_t)sqlite3_column_int64(st, SC_STARTED), "last_active_at",
		      (json_int_t)sqlite3_column_int64(st, SC_ACTIVE), "paused_at", opt_int(st, SC_PAUSED), "ended_at",
		      opt_int(st, SC_ENDED), "expires_at", expires, "end_reason", opt_str(st, SC_END_REASON),
		      "snapshot", snap ? json_loads(snap, 0, NULL) : json_null());
	json_decref(sp);
	return j;
}

int store_session_create(struct store *s, const struct store_session_new *n, char id_out[40], struct kiln_err *err)
{
	int64_t now = wall_ms();
	unsigned char rnd[16];
	struct quota q;
	struct usage u = { 0 };
	sqlite3_stmt *st;
	char id[40];
	int r = -1;

	pthread_mutex_lock(&s->lock);
	if (run(s, ST_BEGIN) != SQLITE_DONE) {
		kiln_err_set(err, "store_error", "cannot begin: %s", sqlite3_errmsg(s->db));
		goto out;
	}
	if (customer_quota_locked(s, n->customer, &q) < 0) {
		kiln_err_set(err, "store_error", "cannot read the quotas of %s", n->customer);
		goto rollback;
	}
	if (running_usage_locked(s, n->customer, &u) < 0) {
		kiln_err_set(err, "store_error", "cannot read the usage of %s", n->customer);
		goto rollback;
	}
	if (quota_check_start(&q, &u, n->vcpus, n->memory_mib, err) < 0) {
		r = -EDQUOT;
		goto rollback;
	}
	/* 128 random bits, as task ids. */
	if (random_bytes(rnd, sizeof(rnd)) < 0) {
		kiln_err_set(err, "internal", "no randomness");
		goto rollback;
	}
	memcpy(id, "s_", 2);
	hex(rnd, sizeof(rnd), id + 2);
	st = stmt(s, ST_SESS_INSERT);
	if (!st)
		goto fail_sql;
	sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, n->customer, -1, SQLITE_STATIC);
	bind_opt_text(st, 3, n->host_id);
	sqlite3_bind_int64(st, 4, n->vcpus);
	sqlite3_bind_int64(st, 5, n->memory_mib);
	sqlite3_bind_int64(st, 6, n->idle_timeout_s);
	sqlite3_bind_int64(st, 7, n->max_lifetime_s);
	sqlite3_bind_int(st, 8, n->egress ? 1 : 0);
	sqlite3_bind_int64(st, 9, now);
	bind_opt_text(st, 10, n->metadata_json);
	sqlite3_bind_text(st, 11, n->spec_json, -1, SQLITE_STATIC);
	if (step_done(s, st) != SQLITE_DONE) {
		sqlite3_reset(st);
		goto fail_sql;
	}
	sqlite3_reset(st);
	if (run(s, ST_COMMIT) != SQLITE_DONE)
		goto fail_sql;
	memcpy(id_out, id, strlen(id) + 1);
	r = 0;
	goto out;
fail_sql:
	kiln_err_set(err, "store_error", "cannot store the session: %s", sqlite3_errmsg(s->db));
rollback:
	run(s, ST_ROLLBACK);
out:
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_session_discard(struct store *s, const char *id)
{
	sqlite3_stmt *st;
	int rc = SQLITE_ERROR, n = 0;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_SESS_DISCARD);
	if (st) {
		sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
		rc = step_done(s, st);
		n = sqlite3_changes(s->db);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return rc == SQLITE_DONE && n > 0;
}

/* s->lock held: the compare-and-set UPDATE; rows changed or -1. */
static int session_transition_locked(struct store *s, const char *id, enum session_state from,
				     enum session_state to, const char *host_id, const char *reason,
				     const char *snapshot, int64_t now)
{
	sqlite3_stmt *st = stmt(s, ST_SESS_TRANS);
	int rc, n;

	if (!st)
		return -1;
	sqlite3_bind_text(st, 1, session_state_name(to), -1, SQLITE_STATIC);
	bind_opt_text(st, 2, host_id);
	bind_opt_text(st, 3, reason);
	bind_opt_text(st, 4, snapshot);
	sqlite3_bind_int64(st, 5, now);
	sqlite3_bind_text(st, 6, id, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 7, session_state_name(from), -1, SQLITE_STATIC);
	rc = step_done(s, st);
	n = sqlite3_changes(s->db);
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? n : -1;
}

int store_session_transition(struct store *s, const char *id, enum session_state from, enum session_state to,
			     const char *host_id, const char *reason, json_t *snapshot)
{
	char *snap = snapshot ? json_dumps(snapshot, JSON_COMPACT) : NULL;
	int n;

	if (from >= SESSION_STATE_COUNT || to >= SESSION_STATE_COUNT || from == to || (snapshot && !snap)) {
		free(snap);
		return -1;
	}
	pthread_mutex_lock(&s->lock);
	n = session_transition_locked(s, id, from, to, host_id, reason, snap, wall_ms());
	pthread_mutex_unlock(&s->lock);
	free(snap);
	if (n > 0) {
		/* Long-polls and other waiters on the store see sessions change too. */
		changed(s, id, "session", NULL);
	}
	return n < 0 ? -1 : n > 0;
}

int store_session_resume_begin(struct store *s, const char *id, const char *customer, const char *host_id,
			       enum session_state *prev, struct kiln_err *err)
{
	struct store_session cur;
	struct quota q;
	struct usage u = { 0 };
	sqlite3_stmt *st;
	int r = -1, found = 0;

	*prev = SESSION_STATE_COUNT;
	pthread_mutex_lock(&s->lock);
	if (run(s, ST_BEGIN) != SQLITE_DONE) {
		kiln_err_set(err, "store_error", "cannot begin: %s", sqlite3_errmsg(s->db));
		goto out;
	}
	st = stmt(s, ST_SESS_GET);
	if (!st)
		goto fail_sql;
	sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
	if (sqlite3_step(st) == SQLITE_ROW) {
		session_row(st, &cur);
		found = !customer || !strcmp(customer, cur.customer);
	}
	sqlite3_reset(st);
	if (!found) {
		r = 0;
		goto rollback;
	}
	*prev = cur.state;
	if (!(cur.state == SESSION_PAUSED || (cur.state == SESSION_ERROR && cur.has_snapshot))) {
		r = 0;
		goto rollback;
	}
	if (customer_quota_locked(s, cur.customer, &q) < 0)
		quota_defaults(&q);
	if (running_usage_locked(s, cur.customer, &u) < 0)
		goto fail_sql;
	if (quota_check_start(&q, &u, cur.vcpus, cur.memory_mib, err) < 0) {
		r = -EDQUOT;
		goto rollback;
	}
	/* end_reason stays until it runs again: a failed resume goes back with it. */
	if (session_transition_locked(s, id, cur.state, SESSION_RESUMING, host_id, NULL, NULL, wall_ms()) != 1)
		goto fail_sql;
	if (run(s, ST_COMMIT) != SQLITE_DONE)
		goto fail_sql;
	r = 1;
	goto out;
fail_sql:
	kiln_err_set(err, "store_error", "cannot resume the session: %s", sqlite3_errmsg(s->db));
rollback:
	run(s, ST_ROLLBACK);
out:
	pthread_mutex_unlock(&s->lock);
	if (r == 1)
		changed(s, id, "session", NULL);
	return r;
}

int store_session_get(struct store *s, const char *id, const char *customer, struct store_session *out)
{
	sqlite3_stmt *st;
	int r = -ENOENT;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_SESS_GET);
	if (st) {
		sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
		if (sqlite3_step(st) == SQLITE_ROW &&
		    (!customer || !strcmp(customer, col_text(st, SC_CUSTOMER) ? col_text(st, SC_CUSTOMER) : ""))) {
			session_row(st, out);
			r = 0;
		}
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

json_t *store_session_json(struct store *s, const char *id, const char *customer)
{
	sqlite3_stmt *st;
	json_t *j = NULL;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_SESS_GET);
	if (st) {
		sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
		if (sqlite3_step(st) == SQLITE_ROW &&
		    (!customer || !strcmp(customer, col_text(st, SC_CUSTOMER) ? col_text(st, SC_CUSTOMER) : "")))
			j = session_row_json(st);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return j;
}

json_t *store_session_list(struct store *s, const char *customer, const char *state, unsigned limit,
			   const char *cursor, char **next_cursor, struct kiln_err *err)
{
	int64_t before = INT64_MAX, last = 0;
	sqlite3_stmt *st;
	json_t *arr;
	unsigned n = 0;
	int rc;

	*next_cursor = NULL;
	if (limit < 1 || limit > 1000) {
		kiln_err_set(err, "invalid_request", "limit: must be from 1 to 100");
		return NULL;
	}
	if (state && strcmp(state, "all") && session_state_parse(state) == SESSION_STATE_COUNT) {
		kiln_err_set(err, "invalid_request", "state: unknown state");
		return NULL;
	}
	if (cursor) {
		char *end;

		errno = 0;
		before = strtoll(cursor, &end, 10);
		if (!*cursor || *end || errno || before < 1 || cursor[0] == '+' || cursor[0] == ' ') {
			kiln_err_set(err, "invalid_request", "cursor: not one this API gave out");
			return NULL;
		}
	}
	arr = json_array();
	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_SESS_LIST);
	if (!st) {
		pthread_mutex_unlock(&s->lock);
		json_decref(arr);
		kiln_err_set(err, "store_error", "cannot list sessions");
		return NULL;
	}
	bind_opt_text(st, 1, customer);
	bind_opt_text(st, 2, state);
	sqlite3_bind_int64(st, 3, before);
	sqlite3_bind_int64(st, 4, (sqlite3_int64)limit + 1);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (n == limit) {
			if (asprintf(next_cursor, "%lld", (long long)last) < 0)
				*next_cursor = NULL;
			break;
		}
		json_array_append_new(arr, session_row_json(st));
		last = sqlite3_column_int64(st, SC_SEQ);
		n++;
	}
	sqlite3_reset(st);
	pthread_mutex_unlock(&s->lock);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
		json_decref(arr);
		free(*next_cursor);
		*next_cursor = NULL;
		kiln_err_set(err, "store_error", "cannot list sessions");
		return NULL;
	}
	return arr;
}

char *store_session_spec(struct store *s, const char *id)
{
	sqlite3_stmt *st;
	char *spec = NULL;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_SESS_SPEC);
	if (st) {
		sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
		if (sqlite3_step(st) == SQLITE_ROW && col_text(st, 0))
			spec = strdup(col_text(st, 0));
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return spec;
}

int store_session_touch(struct store *s, const char *id)
{
	sqlite3_stmt *st;
	int rc = SQLITE_ERROR;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_SESS_TOUCH);
	if (st) {
		sqlite3_bind_int64(st, 1, wall_ms());
		sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
		rc = step_done(s, st);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return rc == SQLITE_DONE ? 0 : -1;
}

int store_sessions_holding(struct store *s, struct store_session *out, int max)
{
	sqlite3_stmt *st;
	int n = 0;

	if (max <= 0)
		return 0;
	pthread_mutex_lock(&s->lock);
	st = stmt(s, ST_SESS_HOLDING);
	if (st) {
		sqlite3_bind_int(st, 1, max);
		while (n < max && step_done(s, st) == SQLITE_ROW)
			session_row(st, &out[n++]);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return n;
}
