/* sdb_pg: the SQL layer's PostgreSQL backend (see sdb.h), on libpq.
 *
 * Statements are server-side prepared statements ("k1", "k2", ...), with
 * text parameters (bytea in binary) and text results. A lost connection
 * (PostgreSQL restarted, the network cut) is re-established on the next use
 * at most once a second; every statement is prepared again on the new
 * connection (the epoch tells which are stale). A statement that finds the
 * connection lost outside a transaction is sent once more on the new one;
 * inside a transaction the error goes back to the store, which rolls back.
 * synchronous_commit is PostgreSQL's default (on): a COMMIT has returned
 * once the commit is durable on the server. */
#include "sdb_int.h"

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "clock.h"

struct sdb_pg {
	PGconn *conn;
	char *conninfo;              /* for the listener's own connection */
	unsigned epoch;              /* bumped on every new connection */
	unsigned next_name;
	int changes;
	int down;                    /* the last use found no server */
	int64_t last_try_ms;         /* the last reconnection attempt */
	char err[512];
};

struct sdb_pg_stmt {
	struct sdb_pg *pg;
	char *sql;                   /* translated */
	char *names;                 /* named parameters, NUL-separated, in $N order */
	int nnames, nparams;
	unsigned *types;             /* 0 (the server infers it), text for one the SQL never uses */
	char name[16];
	unsigned epoch;              /* prepared on this connection; 0: not yet */
	char **vals;
	int *lens, *fmts;
	PGresult *res;
	int row, nrows;
	unsigned char *blob;         /* the last decoded bytea: (blob_row, blob_col) */
	size_t blob_len;
	int blob_row, blob_col;
};

/* ---- the dialect ---- */

/* SQLite-isms of the store's SQL and their PostgreSQL, in this order. */
static const char *const rewrites[][2] = {
	{ "BEGIN IMMEDIATE", "BEGIN" },
	{ SDB_NOW_MS, "(extract(epoch from clock_timestamp()) * 1000)::bigint" }, /* before INTEGER */
	{ "INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY" },
	{ "INTEGER", "BIGINT" }, /* SQLite's are 64-bit; only the schema names the type */
	{ "BLOB", "BYTEA" },
	{ ") WITHOUT ROWID", ")" }, /* SQLite's clustered table: PostgreSQL's are heaps */
	{ "json_extract(sp.spec, '$.network.egress')", "(sp.spec::json #>> '{network,egress}')" },
	{ "substr(log || ?2, -?3)", "right(log || ?2, ?3::int)" }, /* the last ?3 characters */
};

/* s with every from replaced by to (s freed), or NULL. */
static char *replace_all(char *s, const char *from, const char *to)
{
	size_t fl = strlen(from), tl = strlen(to), n = 0;
	char *p, *out, *o;

	for (p = strstr(s, from); p; p = strstr(p + fl, from))
		n++;
	if (!n)
		return s;
	out = malloc(strlen(s) + n * tl + 1);
	if (out) {
		const char *q = s;

		o = out;
		for (p = strstr(q, from); p; p = strstr(q, from)) {
			memcpy(o, q, (size_t)(p - q));
			o += p - q;
			memcpy(o, to, tl);
			o += tl;
			q = p + fl;
		}
		strcpy(o, q);
	}
	free(s);
	return out;
}

static int is_ident(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

char *sdb_pg_translate(const char *sql, char **names_out, int *nparams)
{
	char *s = strdup(sql), *out, *o, *names = NULL;
	size_t names_len = 0;
	int nnames = 0, max = 0, seq = 0;

	if (names_out)
		*names_out = NULL;
	*nparams = 0;
	for (size_t i = 0; s && i < sizeof(rewrites) / sizeof(rewrites[0]); i++)
		s = replace_all(s, rewrites[i][0], rewrites[i][1]);
	if (!s)
		return NULL;
	/* "$NNN" is never longer than what it replaces but for a bare "?". */
	out = malloc(strlen(s) * 4 + 1);
	if (!out) {
		free(s);
		return NULL;
	}
	o = out;
	for (const char *p = s; *p;) {
		if (*p == '\'') { /* a string literal, '' inside */
			const char *e = p + 1;

			while (*e && !(*e == '\'' && e[1] != '\''))
				e += *e == '\'' ? 2 : 1;
			if (*e)
				e++;
			memcpy(o, p, (size_t)(e - p));
			o += e - p;
			p = e;
		} else if (p[0] == ':' && p[1] == ':') {
			*o++ = *p++;
			*o++ = *p++;
		} else if (*p == '?') {
			int n;

			p++;
			if (*p >= '0' && *p <= '9') {
				n = (int)strtol(p, (char **)&p, 10);
			} else {
				n = ++seq;
			}
			if (n > max)
				max = n;
			o += sprintf(o, "$%d", n);
		} else if (*p == ':' && is_ident(p[1]) && !(p[1] >= '0' && p[1] <= '9')) {
			const char *e = p + 1, *nm = names;
			int k = 0;

			while (is_ident(*e))
				e++;
			for (k = 0; k < nnames; k++, nm += strlen(nm) + 1)
				if (strlen(nm) == (size_t)(e - p) && !memcmp(nm, p, (size_t)(e - p)))
					break;
			if (k == nnames) {
				char *nn = realloc(names, names_len + (size_t)(e - p) + 1);

				if (!nn) {
					free(names);
					free(out);
					free(s);
					return NULL;
				}
				names = nn;
				memcpy(names + names_len, p, (size_t)(e - p));
				names_len += (size_t)(e - p);
				names[names_len++] = '\0';
				nnames++;
			}
			o += sprintf(o, "$%d", k + 1);
			if (k + 1 > max)
				max = k + 1;
			p = e;
		} else {
			*o++ = *p++;
		}
	}
	*o = '\0';
	free(s);
	*nparams = max;
	if (names_out)
		*names_out = names;
	else
		free(names);
	return out;
}

/* ---- the connection ---- */

static void set_err(struct sdb_pg *pg, const char *what, const char *msg)
{
	size_t n;

	snprintf(pg->err, sizeof(pg->err), "%s%s", what, msg ? msg : "");
	n = strlen(pg->err);
	while (n && (pg->err[n - 1] == '\n' || pg->err[n - 1] == ' '))
		pg->err[--n] = '\0';
}

static PGconn *connect_to(const char *conninfo)
{
	/* Later entries override earlier ones: the operator's conninfo
	 * (expanded from dbname) wins over these defaults. */
	/* Over TCP, a peer that went silent (a partition, a dead machine) is
	 * noticed in seconds, not in the kernel's minutes: here, after 2.5 s
	 * of a query unacknowledged (tcp_user_timeout) or 4 s of silence
	 * (keepalives); at the server (options: its GUCs for this session),
	 * after 8 s. So a partitioned leader's next try fails and it steps
	 * down (within ~3 s) well before the server ends its session and
	 * releases its lock to another replica (~8 s): never two leaders. On
	 * a Unix socket these do nothing. */
	const char *const keys[] = { "connect_timeout", "application_name", "keepalives", "keepalives_idle",
				     "keepalives_interval", "keepalives_count", "tcp_user_timeout", "options",
				     "dbname", NULL };
	const char *const vals[] = { "3", "kiln-api", "1", "2", "1", "2", "2500",
				     "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3",
				     conninfo, NULL };

	return PQconnectdbParams(keys, vals, 1);
}

int store_pg_ping(const char *conninfo, int *version, struct kiln_err *err)
{
	PGconn *conn = connect_to(conninfo);

	if (!conn || PQstatus(conn) != CONNECTION_OK) {
		kiln_err_set(err, KERR_STORE_ERROR, "postgresql: %s", conn ? PQerrorMessage(conn) : "out of memory");
		PQfinish(conn);
		return -1;
	}
	*version = PQserverVersion(conn);
	PQfinish(conn);
	return 0;
}

/* NOTICEs ("relation already exists, skipping") are not worth a log line. */
static void quiet(void *arg, const char *message)
{
}

struct sdb_pg *pg_open(const char *conninfo, struct kiln_err *err)
{
	struct sdb_pg *pg = calloc(1, sizeof(*pg));

	if (!pg) {
		kiln_err_set(err, KERR_STORE_ERROR, "out of memory");
		return NULL;
	}
	pg->conninfo = strdup(conninfo);
	pg->conn = connect_to(conninfo);
	if (!pg->conn || PQstatus(pg->conn) != CONNECTION_OK) {
		kiln_err_set(err, KERR_STORE_ERROR, "postgresql: %s",
			     pg->conn ? PQerrorMessage(pg->conn) : "out of memory");
		PQfinish(pg->conn);
		free(pg->conninfo);
		free(pg);
		return NULL;
	}
	PQsetNoticeProcessor(pg->conn, quiet, NULL);
	pg->epoch = 1;
	return pg;
}

void pg_close(struct sdb_pg *pg)
{
	if (!pg)
		return;
	PQfinish(pg->conn);
	free(pg->conninfo);
	free(pg);
}

/* The connection, re-established if it was lost (at most once a second):
 * 0 usable, -1 not. */
static int ensure_conn(struct sdb_pg *pg)
{
	int64_t now;

	if (PQstatus(pg->conn) == CONNECTION_OK)
		return 0;
	now = clock_mono_ms();
	if (pg->last_try_ms && now - pg->last_try_ms < 1000) {
		pg->down = 1;
		set_err(pg, "postgresql: unreachable", NULL);
		return -1;
	}
	pg->last_try_ms = now;
	PQreset(pg->conn);
	if (PQstatus(pg->conn) != CONNECTION_OK) {
		if (!pg->down)
			fprintf(stderr, "kiln-api: store: postgresql unreachable: %s", PQerrorMessage(pg->conn));
		pg->down = 1;
		set_err(pg, "postgresql: ", PQerrorMessage(pg->conn));
		return -1;
	}
	fprintf(stderr, "kiln-api: store: reconnected to postgresql\n");
	pg->epoch++;
	pg->down = 0;
	return 0;
}

int pg_ping(struct sdb_pg *pg)
{
	PGresult *r;
	int ok;

	if (ensure_conn(pg) < 0)
		return -1;
	r = PQexec(pg->conn, "");
	ok = r && PQresultStatus(r) == PGRES_EMPTY_QUERY;
	PQclear(r);
	if (!ok && PQstatus(pg->conn) != CONNECTION_OK) {
		pg->down = 1;
		pg->last_try_ms = 0;
		return ensure_conn(pg);
	}
	pg->down = !ok;
	return ok ? 0 : -1;
}

int pg_down(struct sdb_pg *pg)
{
	return pg->down;
}

int pg_changes(struct sdb_pg *pg)
{
	return pg->changes;
}

const char *pg_errmsg(struct sdb_pg *pg)
{
	return pg->err;
}

int pg_exec(struct sdb_pg *pg, const char *sql)
{
	int n, ok;
	char *t = sdb_pg_translate(sql, NULL, &n);
	PGresult *r;

	if (!t) {
		set_err(pg, "out of memory", NULL);
		return -1;
	}
	if (ensure_conn(pg) < 0) {
		free(t);
		return -1;
	}
	r = PQexec(pg->conn, t);
	free(t);
	ok = r && (PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK ||
		   PQresultStatus(r) == PGRES_EMPTY_QUERY);
	if (!ok)
		set_err(pg, "", PQerrorMessage(pg->conn));
	if (PQstatus(pg->conn) != CONNECTION_OK)
		pg->down = 1;
	PQclear(r);
	return ok ? 0 : -1;
}

/* ---- statements ---- */

/* PQprepare st on the connection: 0, or -1 (pg->err). A parameter whose
 * type the server cannot infer (one only ever tested with IS NULL first)
 * is text: the store's optional parameters are. Inside a transaction (a
 * statement's first use there, or its first after a reconnection) each
 * attempt has a savepoint of its own: a refused attempt would otherwise
 * abort the caller's transaction. */
static int server_prepare(struct sdb_pg_stmt *st)
{
	struct sdb_pg *pg = st->pg;
	int in_tx = PQtransactionStatus(pg->conn) == PQTRANS_INTRANS;

	for (int tries = 0; tries <= st->nparams; tries++) {
		PGresult *r;
		char msg[256];
		const char *p;
		int ok, k = 0;

		if (in_tx)
			PQclear(PQexec(pg->conn, "SAVEPOINT sdb_prepare"));
		r = PQprepare(pg->conn, st->name, st->sql, st->nparams, st->types);
		ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
		if (!ok) {
			set_err(pg, "", PQerrorMessage(pg->conn));
			snprintf(msg, sizeof(msg), "%s", r ? PQresultErrorMessage(r) : "");
		}
		PQclear(r);
		if (in_tx)
			PQclear(PQexec(pg->conn, ok ? "RELEASE SAVEPOINT sdb_prepare"
						    : "ROLLBACK TO SAVEPOINT sdb_prepare; RELEASE SAVEPOINT sdb_prepare"));
		if (ok)
			return 0;
		p = strstr(msg, "could not determine data type of parameter $");
		if (!p || sscanf(strstr(p, "parameter $") + 11, "%d", &k) != 1 || k < 1 || k > st->nparams ||
		    st->types[k - 1])
			return -1;
		st->types[k - 1] = 25; /* TEXTOID */
	}
	return -1;
}

struct sdb_pg_stmt *pg_prepare(struct sdb_pg *pg, const char *sql)
{
	struct sdb_pg_stmt *st = calloc(1, sizeof(*st));

	if (!st)
		return NULL;
	st->pg = pg;
	st->sql = sdb_pg_translate(sql, &st->names, &st->nparams);
	if (!st->sql)
		goto fail;
	for (const char *n = st->names; n && st->nnames < st->nparams && *n; n += strlen(n) + 1)
		st->nnames++;
	st->vals = calloc((size_t)st->nparams + 1, sizeof(*st->vals));
	st->lens = calloc((size_t)st->nparams + 1, sizeof(*st->lens));
	st->fmts = calloc((size_t)st->nparams + 1, sizeof(*st->fmts));
	if (!st->vals || !st->lens || !st->fmts)
		goto fail;
	st->types = calloc((size_t)st->nparams + 1, sizeof(*st->types));
	if (!st->types)
		goto fail;
	/* A parameter the SQL skips (?1 and ?3 but no ?2: the list pages)
	 * has no type to infer: text. */
	for (int k = 0; k < st->nparams; k++)
		st->types[k] = 25; /* TEXTOID */
	for (const char *p = strchr(st->sql, '$'); p; p = strchr(p + 1, '$'))
		if (p[1] >= '1' && p[1] <= '9') {
			int k = atoi(p + 1);

			if (k >= 1 && k <= st->nparams)
				st->types[k - 1] = 0;
		}
	snprintf(st->name, sizeof(st->name), "k%u", ++pg->next_name);
	/* Prepare now when connected, to report a bad statement at once. */
	if (PQstatus(pg->conn) == CONNECTION_OK) {
		if (server_prepare(st) == 0)
			st->epoch = pg->epoch;
		else if (PQstatus(pg->conn) == CONNECTION_OK)
			goto fail;
	}
	return st;
fail:
	pg_finalize(st);
	return NULL;
}

static void drop_result(struct sdb_pg_stmt *st)
{
	PQclear(st->res);
	st->res = NULL;
	PQfreemem(st->blob);
	st->blob = NULL;
	st->row = st->nrows = 0;
}

void pg_finalize(struct sdb_pg_stmt *st)
{
	if (!st)
		return;
	drop_result(st);
	if (st->epoch && st->epoch == st->pg->epoch && PQstatus(st->pg->conn) == CONNECTION_OK) {
		char sql[40];

		snprintf(sql, sizeof(sql), "DEALLOCATE %s", st->name);
		PQclear(PQexec(st->pg->conn, sql));
	}
	pg_clear_bindings(st);
	free(st->vals);
	free(st->lens);
	free(st->fmts);
	free(st->types);
	free(st->names);
	free(st->sql);
	free(st);
}

void pg_reset(struct sdb_pg_stmt *st)
{
	drop_result(st);
}

void pg_clear_bindings(struct sdb_pg_stmt *st)
{
	for (int i = 0; st->vals && i < st->nparams; i++) {
		free(st->vals[i]);
		st->vals[i] = NULL;
		st->lens[i] = 0;
		st->fmts[i] = 0;
	}
}

void pg_bind(struct sdb_pg_stmt *st, int i, const void *v, size_t n, int binary)
{
	char *copy = NULL;

	if (i < 1 || i > st->nparams)
		return;
	if (v) {
		copy = malloc(n + 1);
		if (!copy)
			return;
		memcpy(copy, v, n);
		copy[n] = '\0';
	}
	free(st->vals[i - 1]);
	st->vals[i - 1] = copy;
	st->lens[i - 1] = (int)n;
	st->fmts[i - 1] = binary;
}

int pg_bind_index(struct sdb_pg_stmt *st, const char *name)
{
	const char *n = st->names;

	for (int k = 0; n && k < st->nnames; k++, n += strlen(n) + 1)
		if (!strcmp(n, name))
			return k + 1;
	return 0;
}

/* Send st once: its result, NULL when the connection failed (pg->err set). */
static PGresult *pg_send(struct sdb_pg_stmt *st)
{
	struct sdb_pg *pg = st->pg;

	if (ensure_conn(pg) < 0)
		return NULL;
	if (st->epoch != pg->epoch) {
		if (server_prepare(st) < 0)
			return NULL;
		st->epoch = pg->epoch;
	}
	return PQexecPrepared(pg->conn, st->name, st->nparams, (const char *const *)st->vals, st->lens, st->fmts, 0);
}

int pg_step(struct sdb_pg_stmt *st)
{
	struct sdb_pg *pg = st->pg;

	if (!st->res) {
		int idle = PQstatus(pg->conn) == CONNECTION_OK && PQtransactionStatus(pg->conn) == PQTRANS_IDLE;
		PGresult *r = pg_send(st);
		ExecStatusType rs;

		if (PQstatus(pg->conn) != CONNECTION_OK && idle) {
			/* The connection broke under this statement (the server
			 * restarted since the last one): once more on a new
			 * connection, as no transaction was open. */
			PQclear(r);
			pg->last_try_ms = 0;
			r = pg_send(st);
		}
		if (PQstatus(pg->conn) != CONNECTION_OK && !pg->down) {
			fprintf(stderr, "kiln-api: store: lost the connection to postgresql\n");
			pg->down = 1;
		}
		rs = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
		if (rs != PGRES_TUPLES_OK && rs != PGRES_COMMAND_OK) {
			const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;

			if (r || !pg->err[0] || PQstatus(pg->conn) == CONNECTION_OK)
				set_err(pg, "", PQerrorMessage(pg->conn));
			PQclear(r);
			/* Class 23: integrity constraint violation. */
			return state && !strncmp(state, "23", 2) ? SDB_CONSTRAINT : SDB_ERROR;
		}
		pg->down = 0;
		st->res = r;
		st->nrows = rs == PGRES_TUPLES_OK ? PQntuples(r) : 0;
		st->row = -1;
		if (rs == PGRES_COMMAND_OK)
			pg->changes = atoi(PQcmdTuples(r));
	}
	PQfreemem(st->blob);
	st->blob = NULL;
	if (++st->row < st->nrows)
		return SDB_ROW;
	st->row = st->nrows;
	return SDB_DONE;
}

int pg_col_null(struct sdb_pg_stmt *st, int i)
{
	if (!st->res || st->row >= st->nrows || i >= PQnfields(st->res))
		return 1;
	return PQgetisnull(st->res, st->row, i);
}

const char *pg_col_text(struct sdb_pg_stmt *st, int i)
{
	return pg_col_null(st, i) ? NULL : PQgetvalue(st->res, st->row, i);
}

const void *pg_col_blob(struct sdb_pg_stmt *st, int i, int *n)
{
	const char *t = pg_col_text(st, i);

	*n = 0;
	if (!t)
		return NULL;
	if (!st->blob || st->blob_row != st->row || st->blob_col != i) {
		PQfreemem(st->blob);
		st->blob = PQunescapeBytea((const unsigned char *)t, &st->blob_len);
		st->blob_row = st->row;
		st->blob_col = i;
		if (!st->blob)
			return NULL;
	}
	*n = (int)st->blob_len;
	return st->blob;
}

/* ---- a background thread with a stop pipe ---- */

/* The thread loops while !bg_stopping(b), polling b->stop_pipe[0] with its
 * own descriptors: bg_stop makes that readable and waits for the thread.
 * It has a connection of its own, to conninfo. The first member of the
 * listener and of the leader's lock, which bg_new makes. */
struct bg {
	char *conninfo;              /* a copy of the store's */
	pthread_t thread;
	int stop;                    /* atomic */
	int stop_pipe[2];
};

/* A new zeroed object of size bytes whose first member is a struct bg,
 * with a copy of db's connection string. NULL unless db is PostgreSQL, or
 * out of memory. */
static void *bg_new(struct sdb *db, size_t size)
{
	struct bg *b;

	if (db->kind != SDB_PG)
		return NULL;
	b = calloc(1, size);
	if (b && !(b->conninfo = strdup(db->pg->conninfo))) {
		free(b);
		b = NULL;
	}
	return b;
}

static int bg_start(struct bg *b, void *(*fn)(void *), void *arg)
{
	if (pipe2(b->stop_pipe, O_CLOEXEC) < 0)
		return -1;
	if (pthread_create(&b->thread, NULL, fn, arg) != 0) {
		close(b->stop_pipe[0]);
		close(b->stop_pipe[1]);
		return -1;
	}
	return 0;
}

static int bg_stopping(struct bg *b)
{
	return __atomic_load_n(&b->stop, __ATOMIC_ACQUIRE);
}

static void bg_stop(struct bg *b)
{
	__atomic_store_n(&b->stop, 1, __ATOMIC_RELEASE);
	if (write(b->stop_pipe[1], "x", 1) < 0) {
		/* the thread sees stop at its poll's timeout anyway */
	}
	pthread_join(b->thread, NULL);
	close(b->stop_pipe[0]);
	close(b->stop_pipe[1]);
}

/* Free what bg_new made, stopping its thread first when started. */
static void bg_free(struct bg *b, int started)
{
	if (started)
		bg_stop(b);
	free(b->conninfo);
	free(b);
}

/* ---- LISTEN ---- */

struct sdb_listener {
	struct bg bg;                /* first: made by bg_new */
	char channel[64];
	sdb_notify_fn *fn;
	void *arg;
	PGconn *first;               /* connected by sdb_listen itself, or NULL */
};

_Static_assert(offsetof(struct sdb_listener, bg) == 0, "bg_free frees the listener by its bg");

/* Connect and LISTEN: the connection, or NULL. */
static PGconn *listen_connect(struct sdb_listener *l)
{
	PGconn *c = connect_to(l->bg.conninfo);
	char sql[96];
	PGresult *r;

	if (!c || PQstatus(c) != CONNECTION_OK) {
		PQfinish(c);
		return NULL;
	}
	PQsetNoticeProcessor(c, quiet, NULL);
	snprintf(sql, sizeof(sql), "LISTEN %s", l->channel);
	r = PQexec(c, sql);
	if (!r || PQresultStatus(r) != PGRES_COMMAND_OK) {
		PQclear(r);
		PQfinish(c);
		return NULL;
	}
	PQclear(r);
	return c;
}

static void *listen_main(void *arg)
{
	struct sdb_listener *l = arg;
	PGconn *c = l->first;
	int was_up = 1;

	while (!bg_stopping(&l->bg)) {
		struct pollfd pfd[2] = { { .fd = l->bg.stop_pipe[0], .events = POLLIN } };
		PGnotify *n;

		if (!c) {
			c = listen_connect(l);
			if (!c) {
				if (was_up)
					fprintf(stderr, "kiln-api: store: cannot LISTEN on postgresql; retrying\n");
				was_up = 0;
				poll(pfd, 1, 1000);
				continue;
			}
			/* Whatever was sent while nobody listened is lost: say so. */
			l->fn(l->arg, NULL);
			was_up = 1;
		}
		pfd[1].fd = PQsocket(c);
		pfd[1].events = POLLIN;
		if (poll(pfd, 2, 1000) < 0)
			continue;
		if (pfd[0].revents)
			break;
		if (!PQconsumeInput(c) || PQstatus(c) != CONNECTION_OK) {
			PQfinish(c);
			c = NULL;
			continue;
		}
		while ((n = PQnotifies(c))) {
			l->fn(l->arg, n->extra);
			PQfreemem(n);
		}
	}
	PQfinish(c);
	return NULL;
}

struct sdb_listener *sdb_listen(struct sdb *db, const char *channel, sdb_notify_fn *fn, void *arg)
{
	struct sdb_listener *l = bg_new(db, sizeof(*l));

	if (!l)
		return NULL;
	snprintf(l->channel, sizeof(l->channel), "%s", channel);
	l->fn = fn;
	l->arg = arg;
	/* LISTEN before returning: the caller reads after this, and
	 * whatever is committed from then on is announced. */
	l->first = listen_connect(l);
	if (bg_start(&l->bg, listen_main, l) < 0) {
		PQfinish(l->first);
		bg_free(&l->bg, 0);
		return NULL;
	}
	return l;
}

void sdb_listen_stop(struct sdb_listener *l)
{
	if (l)
		bg_free(&l->bg, 1);
}

/* ---- the leader's lock ---- */

struct sdb_leader {
	struct bg bg;                /* first: made by bg_new */
	long long key;
	int leader;                  /* atomic */
};

_Static_assert(offsetof(struct sdb_leader, bg) == 0, "bg_free frees the leader by its bg");

/* 1 the lock is held (taken now or before), 0 not, -1 the connection failed. */
static int try_lock(PGconn *c, long long key)
{
	char sql[80];
	PGresult *r;
	int v = -1;

	snprintf(sql, sizeof(sql), "SELECT pg_try_advisory_lock(%lld)", key);
	r = PQexec(c, sql);
	if (r && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
		v = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	return v;
}

static void *leader_main(void *arg)
{
	struct sdb_leader *l = arg;
	PGconn *c = NULL;
	int held = 0;

	while (!bg_stopping(&l->bg)) {
		struct pollfd pfd = { .fd = l->bg.stop_pipe[0], .events = POLLIN };
		int v;

		if (!c) {
			c = connect_to(l->bg.conninfo);
			if (PQstatus(c) != CONNECTION_OK) {
				PQfinish(c);
				c = NULL;
			} else {
				PQsetNoticeProcessor(c, quiet, NULL);
			}
		}
		/* Held already: the query re-takes it (a count we never
		 * release) and says the session still stands. */
		v = c ? try_lock(c, l->key) : -1;
		if (v < 0) {
			PQfinish(c);
			c = NULL;
			v = 0;
		}
		if (v != held) {
			fprintf(stderr, "kiln-api: %s the scheduler's leader\n", v ? "now" : "no longer");
			held = v;
			__atomic_store_n(&l->leader, v, __ATOMIC_RELEASE);
		}
		if (poll(&pfd, 1, 500) > 0)
			break;
	}
	__atomic_store_n(&l->leader, 0, __ATOMIC_RELEASE);
	PQfinish(c); /* the server releases the lock with the session */
	return NULL;
}

struct sdb_leader *sdb_leader_start(struct sdb *db, long long key)
{
	struct sdb_leader *l = bg_new(db, sizeof(*l));

	if (!l)
		return NULL;
	l->key = key;
	if (bg_start(&l->bg, leader_main, l) < 0) {
		bg_free(&l->bg, 0);
		return NULL;
	}
	return l;
}

int sdb_leader_is(struct sdb_leader *l)
{
	return __atomic_load_n(&l->leader, __ATOMIC_ACQUIRE);
}

void sdb_leader_stop(struct sdb_leader *l)
{
	if (l)
		bg_free(&l->bg, 1);
}
