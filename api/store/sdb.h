/* sdb: the SQL layer under kiln-api's store: one connection to SQLite
 * (sdb.c) or PostgreSQL through libpq (sdb_pg.c), with prepared
 * statements, numbered (?1) and named (:name) parameters, and rows. The
 * store (api/store/store*.c) is written once against it.
 *
 * The SQL is SQLite's dialect where both engines agree; sdb_pg.c turns the
 * parameters into $N and rewrites the few SQLite-isms the store uses (a
 * short table there: BEGIN IMMEDIATE, INTEGER/BLOB/AUTOINCREMENT/WITHOUT
 * ROWID in the schema, json_extract, a negative substr, SDB_NOW_MS). Booleans from PostgreSQL read
 * as 1/0, bytea as blobs.
 *
 * Thread-safety: none; the store serialises every use of a connection and
 * its statements (s->lock). */
#ifndef KILN_SDB_H
#define KILN_SDB_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* sdb_step's results (SQLite's numbers). */
enum {
	SDB_ERROR = 1,
	SDB_CONSTRAINT = 19,         /* a UNIQUE, PRIMARY KEY or foreign key refused the row */
	SDB_ROW = 100,
	SDB_DONE = 101,
};

enum sdb_kind { SDB_SQLITE, SDB_PG };

/* The database's own wall clock in ms since the epoch, as an SQL
 * expression: SQLite's (this machine's) as written, PostgreSQL's server
 * clock (clock_timestamp()) once sdb_pg rewrites it, so that times several
 * replicas compare (session leases) come from one clock. */
#define SDB_NOW_MS "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"

struct sdb;
struct sdb_stmt;

/* Open SQLite at path (created, WAL, synchronous=FULL, foreign keys). NULL
 * with err set. */
struct sdb *sdb_open_sqlite(const char *path, struct kiln_err *err);
/* Connect to PostgreSQL (conninfo: a postgresql:// URI or key=value pairs;
 * synchronous_commit is left on). NULL with err set. */
struct sdb *sdb_open_pg(const char *conninfo, struct kiln_err *err);
void sdb_close(struct sdb *db);
enum sdb_kind sdb_kind(const struct sdb *db);

/* Prepare sql: 0, or -1 (sdb_errmsg says why). */
int sdb_prepare(struct sdb *db, const char *sql, struct sdb_stmt **out);
void sdb_finalize(struct sdb_stmt *st);
/* Forget the result of the last step (bindings stay). */
void sdb_reset(struct sdb_stmt *st);
void sdb_clear_bindings(struct sdb_stmt *st);

/* Bind parameter i (1-based); values are copied. Text NULL binds NULL. */
void sdb_bind_text(struct sdb_stmt *st, int i, const char *v);
/* n bytes of v as text (no NUL needed). */
void sdb_bind_textn(struct sdb_stmt *st, int i, const char *v, size_t n);
void sdb_bind_int64(struct sdb_stmt *st, int i, int64_t v);
void sdb_bind_null(struct sdb_stmt *st, int i);
void sdb_bind_blob(struct sdb_stmt *st, int i, const void *v, size_t n);
/* The index of a named parameter (":name"), 0 when st has none. */
int sdb_bind_index(struct sdb_stmt *st, const char *name);

/* Run st (first call) or move to its next row: SDB_ROW, SDB_DONE,
 * SDB_CONSTRAINT or SDB_ERROR. */
int sdb_step(struct sdb_stmt *st);

/* Columns of the current row (0-based). Text is NULL for NULL; it and
 * blobs stay valid until the next step or reset. */
int sdb_col_null(struct sdb_stmt *st, int i);
int64_t sdb_col_int64(struct sdb_stmt *st, int i);
static inline int sdb_col_int(struct sdb_stmt *st, int i)
{
	return (int)sdb_col_int64(st, i);
}
const char *sdb_col_text(struct sdb_stmt *st, int i);
const void *sdb_col_blob(struct sdb_stmt *st, int i);
int sdb_col_bytes(struct sdb_stmt *st, int i);

/* Rows changed by the last INSERT/UPDATE/DELETE on db. */
int sdb_changes(struct sdb *db);
/* The last error's message ("" if none). */
const char *sdb_errmsg(struct sdb *db);
/* Run a script of statements without parameters (migrations): 0, or -1
 * with err ("store_error"; err may be NULL). */
int sdb_exec(struct sdb *db, const char *sql, struct kiln_err *err);

/* Whether the next commits wait for the disk (on: the default) or not (0:
 * SQLite's synchronous=NORMAL, which in WAL mode leaves the commit in the
 * log file until a later durable commit or checkpoint syncs it;
 * PostgreSQL's synchronous_commit=off). Either way a crash loses at most
 * the last relaxed commits, never one made durable after them, and never
 * corrupts the database. For changes that are only progress (a task seen
 * running) and that a restart would find again: 0, or -1 (left as it
 * was). */
int sdb_durable(struct sdb *db, int on);
/* Whether the database answers now: 0 yes, -1 no. For PostgreSQL a lost
 * connection is re-established here (at most once a second); SQLite always
 * answers. */
int sdb_ping(struct sdb *db);
/* Whether the last use found the database unreachable (PostgreSQL down or
 * the connection lost and not yet re-established). */
int sdb_down(struct sdb *db);

/* LISTEN on channel over a connection of its own, in a thread of its own
 * (PostgreSQL only; NULL for SQLite or on failure): fn gets each
 * notification's payload, and NULL after every reconnection (what was
 * sent meanwhile is lost: the caller re-reads). Reconnects once a second
 * while the server is away. */
typedef void sdb_notify_fn(void *arg, const char *payload);
struct sdb_listener;
struct sdb_listener *sdb_listen(struct sdb *db, const char *channel, sdb_notify_fn *fn, void *arg);
void sdb_listen_stop(struct sdb_listener *l);

/* Leader election (PostgreSQL only; NULL for SQLite or on failure): a
 * thread with a connection of its own tries pg_try_advisory_lock(key)
 * every half second; the session holds it until it ends (the process dies,
 * the connection breaks, sdb_leader_stop). sdb_leader_is says whether this
 * process holds it now. */
struct sdb_leader;
struct sdb_leader *sdb_leader_start(struct sdb *db, long long key);
int sdb_leader_is(struct sdb_leader *l);
void sdb_leader_stop(struct sdb_leader *l);

/* The dialect rewrite sdb_pg applies to sql (parameters to $N, the table
 * of SQLite-isms), into a new string (caller frees); *names (caller frees,
 * may be NULL) gets the named parameters' names, NUL-separated, in $N
 * order, *nparams their count. NULL on out of memory. For sdb_pg.c and its
 * unit test. */
char *sdb_pg_translate(const char *sql, char **names, int *nparams);

#endif
