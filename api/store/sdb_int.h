/* sdb_int.h: what sdb.c (the dispatch and SQLite) and sdb_pg.c
 * (PostgreSQL) share; private to them. */
#ifndef KILN_SDB_INT_H
#define KILN_SDB_INT_H

#include <sqlite3.h>

#include "sdb.h"

struct sdb {
	enum sdb_kind kind;
	sqlite3 *lite;               /* SDB_SQLITE */
	struct sdb_pg *pg;           /* SDB_PG */
};

struct sdb_stmt {
	struct sdb *db;
	sqlite3_stmt *lite;          /* SDB_SQLITE */
	struct sdb_pg_stmt *pg;      /* SDB_PG */
};

/* sdb_pg.c, called by sdb.c's dispatch for SDB_PG handles. */
struct sdb_pg *pg_open(const char *conninfo, struct kiln_err *err);
void pg_close(struct sdb_pg *pg);
struct sdb_pg_stmt *pg_prepare(struct sdb_pg *pg, const char *sql);
void pg_finalize(struct sdb_pg_stmt *st);
void pg_reset(struct sdb_pg_stmt *st);
void pg_clear_bindings(struct sdb_pg_stmt *st);
void pg_bind(struct sdb_pg_stmt *st, int i, const void *v, size_t n, int binary);
int pg_bind_index(struct sdb_pg_stmt *st, const char *name);
int pg_step(struct sdb_pg_stmt *st);
int pg_col_null(struct sdb_pg_stmt *st, int i);
const char *pg_col_text(struct sdb_pg_stmt *st, int i);
const void *pg_col_blob(struct sdb_pg_stmt *st, int i, int *n);
int pg_changes(struct sdb_pg *pg);
const char *pg_errmsg(struct sdb_pg *pg);
int pg_exec(struct sdb_pg *pg, const char *sql);
int pg_ping(struct sdb_pg *pg);
int pg_down(struct sdb_pg *pg);

#endif
