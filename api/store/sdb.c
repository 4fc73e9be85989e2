/* sdb: the SQL layer's dispatch and its SQLite backend (see sdb.h); the
 * PostgreSQL backend is sdb_pg.c. SQLite's own API maps one to one. */
#include "sdb_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sdb *sdb_open_sqlite(const char *path, struct kiln_err *err)
{
	struct sdb *db = calloc(1, sizeof(*db));
	int rc;

	if (!db) {
		kiln_err_set(err, KERR_STORE_ERROR, "out of memory");
		return NULL;
	}
	db->kind = SDB_SQLITE;
	/* NOMUTEX: the store serialises every use of the connection. */
	rc = sqlite3_open_v2(path, &db->lite, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
			     NULL);
	if (rc != SQLITE_OK) {
		kiln_err_set(err, KERR_STORE_ERROR, "%s: %s", path,
			     db->lite ? sqlite3_errmsg(db->lite) : sqlite3_errstr(rc));
		sdb_close(db);
		return NULL;
	}
	sqlite3_busy_timeout(db->lite, 5000);
	if (sdb_exec(db, "PRAGMA journal_mode=WAL", err) < 0 || sdb_exec(db, "PRAGMA synchronous=FULL", err) < 0 ||
	    sdb_exec(db, "PRAGMA foreign_keys=ON", err) < 0) {
		sdb_close(db);
		return NULL;
	}
	return db;
}

struct sdb *sdb_open_pg(const char *conninfo, struct kiln_err *err)
{
	struct sdb *db = calloc(1, sizeof(*db));

	if (!db) {
		kiln_err_set(err, KERR_STORE_ERROR, "out of memory");
		return NULL;
	}
	db->kind = SDB_PG;
	db->pg = pg_open(conninfo, err);
	if (!db->pg) {
		free(db);
		return NULL;
	}
	return db;
}

void sdb_close(struct sdb *db)
{
	if (!db)
		return;
	if (db->kind == SDB_PG)
		pg_close(db->pg);
	else
		sqlite3_close(db->lite);
	free(db);
}

enum sdb_kind sdb_kind(const struct sdb *db)
{
	return db->kind;
}

int sdb_prepare(struct sdb *db, const char *sql, struct sdb_stmt **out)
{
	struct sdb_stmt *st = calloc(1, sizeof(*st));

	*out = NULL;
	if (!st)
		return -1;
	st->db = db;
	if (db->kind == SDB_PG)
		st->pg = pg_prepare(db->pg, sql);
	else if (sqlite3_prepare_v3(db->lite, sql, -1, SQLITE_PREPARE_PERSISTENT, &st->lite, NULL) != SQLITE_OK)
		st->lite = NULL;
	if (!st->pg && !st->lite) {
		free(st);
		return -1;
	}
	*out = st;
	return 0;
}

void sdb_finalize(struct sdb_stmt *st)
{
	if (!st)
		return;
	if (st->pg)
		pg_finalize(st->pg);
	else
		sqlite3_finalize(st->lite);
	free(st);
}

void sdb_reset(struct sdb_stmt *st)
{
	if (st->pg)
		pg_reset(st->pg);
	else
		sqlite3_reset(st->lite);
}

void sdb_clear_bindings(struct sdb_stmt *st)
{
	if (st->pg)
		pg_clear_bindings(st->pg);
	else
		sqlite3_clear_bindings(st->lite);
}

void sdb_bind_text(struct sdb_stmt *st, int i, const char *v)
{
	if (!v)
		sdb_bind_null(st, i);
	else if (st->pg)
		pg_bind(st->pg, i, v, strlen(v), 0);
	else
		sqlite3_bind_text(st->lite, i, v, -1, SQLITE_TRANSIENT);
}

void sdb_bind_textn(struct sdb_stmt *st, int i, const char *v, size_t n)
{
	if (st->pg)
		pg_bind(st->pg, i, v, n, 0);
	else
		sqlite3_bind_text(st->lite, i, v, (int)n, SQLITE_TRANSIENT);
}

void sdb_bind_int64(struct sdb_stmt *st, int i, int64_t v)
{
	if (st->pg) {
		char b[24];

		pg_bind(st->pg, i, b, (size_t)snprintf(b, sizeof(b), "%lld", (long long)v), 0);
	} else {
		sqlite3_bind_int64(st->lite, i, v);
	}
}

void sdb_bind_null(struct sdb_stmt *st, int i)
{
	if (st->pg)
		pg_bind(st->pg, i, NULL, 0, 0);
	else
		sqlite3_bind_null(st->lite, i);
}

void sdb_bind_blob(struct sdb_stmt *st, int i, const void *v, size_t n)
{
	if (st->pg)
		pg_bind(st->pg, i, v ? v : "", n, 1);
	else
		sqlite3_bind_blob(st->lite, i, v, (int)n, SQLITE_TRANSIENT);
}

int sdb_bind_index(struct sdb_stmt *st, const char *name)
{
	return st->pg ? pg_bind_index(st->pg, name) : sqlite3_bind_parameter_index(st->lite, name);
}

int sdb_step(struct sdb_stmt *st)
{
	int rc;

	if (st->pg)
		return pg_step(st->pg);
	rc = sqlite3_step(st->lite);
	if (rc == SQLITE_ROW || rc == SQLITE_DONE || rc == SQLITE_CONSTRAINT)
		return rc;
	return SDB_ERROR;
}

int sdb_col_null(struct sdb_stmt *st, int i)
{
	return st->pg ? pg_col_null(st->pg, i) : sqlite3_column_type(st->lite, i) == SQLITE_NULL;
}

int64_t sdb_col_int64(struct sdb_stmt *st, int i)
{
	const char *t;

	if (!st->pg)
		return sqlite3_column_int64(st->lite, i);
	t = pg_col_text(st->pg, i);
	if (!t)
		return 0;
	if (t[0] == 't' && !t[1])
		return 1; /* a boolean */
	return strtoll(t, NULL, 10);
}

const char *sdb_col_text(struct sdb_stmt *st, int i)
{
	return st->pg ? pg_col_text(st->pg, i) : (const char *)sqlite3_column_text(st->lite, i);
}

const void *sdb_col_blob(struct sdb_stmt *st, int i)
{
	int n;

	return st->pg ? pg_col_blob(st->pg, i, &n) : sqlite3_column_blob(st->lite, i);
}

int sdb_col_bytes(struct sdb_stmt *st, int i)
{
	int n = 0;

	if (!st->pg)
		return sqlite3_column_bytes(st->lite, i);
	pg_col_blob(st->pg, i, &n);
	return n;
}

int sdb_changes(struct sdb *db)
{
	return db->kind == SDB_PG ? pg_changes(db->pg) : sqlite3_changes(db->lite);
}

const char *sdb_errmsg(struct sdb *db)
{
	return db->kind == SDB_PG ? pg_errmsg(db->pg) : sqlite3_errmsg(db->lite);
}

int sdb_exec(struct sdb *db, const char *sql, struct kiln_err *err)
{
	char *msg = NULL;

	if (db->kind == SDB_PG) {
		if (pg_exec(db->pg, sql) < 0)
			return kiln_err_set(err, KERR_STORE_ERROR, "%s", pg_errmsg(db->pg));
		return 0;
	}
	if (sqlite3_exec(db->lite, sql, NULL, NULL, &msg) != SQLITE_OK) {
		kiln_err_set(err, KERR_STORE_ERROR, "%s", msg ? msg : sqlite3_errmsg(db->lite));
		sqlite3_free(msg);
		return -1;
	}
	return 0;
}

int sdb_durable(struct sdb *db, int on)
{
	if (db->kind == SDB_PG)
		return pg_exec(db->pg, on ? "SET synchronous_commit TO on" : "SET synchronous_commit TO off");
	return sqlite3_exec(db->lite, on ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL", NULL, NULL,
			    NULL) == SQLITE_OK ? 0 : -1;
}

int sdb_ping(struct sdb *db)
{
	return db->kind == SDB_PG ? pg_ping(db->pg) : 0;
}

int sdb_down(struct sdb *db)
{
	return db->kind == SDB_PG ? pg_down(db->pg) : 0;
}
