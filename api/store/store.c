/* store: kiln-api's durable state in SQLite or PostgreSQL (see store.h); this file is its
 * core, under every other piece of the store: the statement cache,
 * transactions, ids, change notification, and the helpers the other pieces
 * share (one row by id, a page of a list, a compare-and-set of a state, the
 * running usage and the customer's lock). The rest: store_open.c (open,
 * close, the listener; on top), store_migrate.c (schema), store_keys.c
 * (customers, keys, hosts, the running quota's check), store_tasks.c,
 * store_sessions.c, store_templates.c, store_destinations.c, store_snapshots.c,
 * store_volumes.c; store_int.h is what they share.
 *
 * One connection (api/store/sdb.h: SQLite or PostgreSQL), one mutex (s->lock)
 * around every use of it; statements are prepared once and reset after each
 * use. SQLite runs WAL with synchronous=FULL, PostgreSQL with its default
 * synchronous_commit=on: a commit is durable when it returns, so the HTTP
 * layer may answer 202 right after store_task_submit.
 *
 * Change notification: s->gen counts committed state changes (s->ch_lock,
 * s->ch_cond); long-polls and event streams wait on it. */
#include "store_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "clock.h"
#include "condwait.h"
#include "quota.h"

static const char *const core_sql[STORE_CORE_COUNT] = {
	[STORE_BEGIN] = "BEGIN IMMEDIATE",
	[STORE_COMMIT] = "COMMIT",
	[STORE_ROLLBACK] = "ROLLBACK",
	[STORE_SAVEPOINT] = "SAVEPOINT sub",
	[STORE_RELEASE] = "RELEASE sub",
	[STORE_ROLLBACK_TO] = "ROLLBACK TO sub",
	/* Tasks placed and sessions holding a VM share the running quota. */
	[STORE_USAGE_RUN] = "SELECT count(*), coalesce(sum(vcpus), 0), coalesce(sum(memory_mib), 0) FROM"
			    " (SELECT vcpus, memory_mib FROM tasks WHERE customer = ?1"
			    " AND state IN ('scheduled', 'starting', 'running')"
			    " UNION ALL SELECT vcpus, memory_mib FROM sessions WHERE customer = ?1"
			    " AND state IN ('starting', 'running', 'pausing', 'resuming')) AS u",
	[STORE_NOTIFY] = "SELECT pg_notify('kiln_changes', ?1)",
	/* PostgreSQL: one transaction at a time checks and takes a customer's
	 * running quota, whichever replica runs it (SQLite's BEGIN IMMEDIATE
	 * serialises every writer already). */
	[STORE_CUSTOMER_LOCK] = "SELECT pg_advisory_xact_lock(hashtext(?1))",
};

_Static_assert(STORE_SLOTS_CORE + STORE_CORE_COUNT <= STORE_SLOTS_KEYS, "store.c's statements overflow their slots");

/* ---- statements ---- */

struct sdb_stmt *store_stmt(struct store *s, int slot, const char *sql)
{
	struct sdb_stmt *st = s->st[slot];

	if (!st) {
		if (sdb_prepare(s->db, sql, &s->st[slot]) < 0) {
			fprintf(stderr, "kiln-api: store: cannot prepare \"%s\": %s\n", sql, sdb_errmsg(s->db));
			return NULL;
		}
		st = s->st[slot];
	}
	sdb_reset(st);
	sdb_clear_bindings(st);
	return st;
}

int store_run(struct store *s, enum store_core_stmt id)
{
	struct sdb_stmt *st = store_stmt(s, STORE_SLOTS_CORE + id, core_sql[id]);
	int rc;

	if (!st)
		return SDB_ERROR;
	rc = sdb_step(st);
	sdb_reset(st);
	return rc;
}

void store_tx_lock(struct store_tx *tx, struct store *s)
{
	pthread_mutex_lock(&s->lock);
	tx->s = s;
	tx->locked = 1;
	tx->open = 0;
}

int store_tx_begin(struct store_tx *tx)
{
	if (store_run(tx->s, STORE_BEGIN) != SDB_DONE)
		return -1;
	tx->open = 1;
	return 0;
}

int store_tx_start(struct store_tx *tx, struct store *s)
{
	store_tx_lock(tx, s);
	return store_tx_begin(tx);
}

int store_tx_commit(struct store_tx *tx)
{
	if (store_run(tx->s, STORE_COMMIT) != SDB_DONE)
		return -1;
	tx->open = 0;
	return 0;
}

void store_tx_rollback(struct store_tx *tx)
{
	if (tx->open)
		store_run(tx->s, STORE_ROLLBACK);
	tx->open = 0;
}

void store_tx_unlock(struct store_tx *tx)
{
	store_tx_rollback(tx);
	if (tx->locked)
		pthread_mutex_unlock(&tx->s->lock);
	tx->locked = 0;
}

void store_tx_end(struct store_tx *tx)
{
	store_tx_unlock(tx);
}

int store_step(struct store *s, struct sdb_stmt *st)
{
	int rc = sdb_step(st);

	if (rc != SDB_DONE && rc != SDB_ROW && rc != SDB_CONSTRAINT && !sdb_down(s->db))
		fprintf(stderr, "kiln-api: store: %s\n", sdb_errmsg(s->db));
	return rc;
}

int store_update_locked(struct store *s, struct sdb_stmt *st)
{
	int rc = store_step(s, st), n = sdb_changes(s->db);

	sdb_reset(st);
	return rc == SDB_DONE ? n : -1;
}

int store_stamp_locked(struct store *s, struct sdb_stmt *st, const char *id)
{
	if (!st)
		return -1;
	sdb_bind_int64(st, 1, clock_wall_ms());
	sdb_bind_text(st, 2, id);
	return store_update_locked(s, st);
}

int store_stamp(struct store *s, int slot, const char *sql, const char *id)
{
	int n;

	pthread_mutex_lock(&s->lock);
	n = store_stamp_locked(s, store_stmt(s, slot, sql), id);
	pthread_mutex_unlock(&s->lock);
	return n < 0 ? -1 : 0;
}

void store_copy_col(struct sdb_stmt *st, int i, char *out, size_t cap)
{
	const char *t = store_col_text(st, i);

	snprintf(out, cap, "%s", t ? t : "");
}

void store_bind_opt_text(struct sdb_stmt *st, int i, const char *v)
{
	if (v)
		sdb_bind_text(st, i, v);
	else
		sdb_bind_null(st, i);
}

void store_bind_opt_uint(struct sdb_stmt *st, int i, unsigned v)
{
	if (v)
		sdb_bind_int64(st, i, v);
	else
		sdb_bind_null(st, i);
}

json_t *store_opt_int(struct sdb_stmt *st, int i)
{
	return sdb_col_null(st, i) ? json_null() : json_integer(sdb_col_int64(st, i));
}

json_t *store_opt_str(struct sdb_stmt *st, int i)
{
	const char *t = store_col_text(st, i);

	return t ? json_string(t) : json_null();
}

/* ---- ids and randomness ---- */

void store_hex(const unsigned char *in, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * n] = '\0';
}

int store_random(void *buf, size_t n)
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

int store_new_id(const char *prefix, char out[40])
{
	unsigned char rnd[16];
	size_t n = strlen(prefix);

	if (n > 40 - 33 || store_random(rnd, sizeof(rnd)) < 0)
		return -1;
	memcpy(out, prefix, n);
	store_hex(rnd, sizeof(rnd), out + n);
	return 0;
}

/* ---- change notification ---- */

/* Tell the other replicas (PostgreSQL): {"r": our nonce, "i": id, "e":
 * event, "d": data}, without d when it would not fit a notification. */
static void publish(struct store *s, const char *id, const char *event, json_t *data)
{
	json_t *j = json_pack("{s:s, s:s, s:s}", "r", s->nonce, "i", id ? id : "", "e", event);
	char *payload;
	struct sdb_stmt *st;

	if (!j)
		return;
	if (data)
		json_object_set(j, "d", data);
	payload = json_dumps(j, JSON_COMPACT);
	if (payload && strlen(payload) > 7900) {
		free(payload);
		json_object_del(j, "d");
		payload = json_dumps(j, JSON_COMPACT);
	}
	json_decref(j);
	if (!payload)
		return;
	pthread_mutex_lock(&s->lock);
	st = store_stmt(s, STORE_SLOTS_CORE + STORE_NOTIFY, core_sql[STORE_NOTIFY]);
	if (st) {
		sdb_bind_text(st, 1, payload);
		store_step(s, st);
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	free(payload);
}

/* Wake this process's waiters and hand data (not consumed) to the
 * listener and, when it came from another replica, the remote hook. */
void store_wake_local(struct store *s, const char *id, const char *event, json_t *data, int remote)
{
	store_listener_fn *fn, *rfn;
	void *arg, *rarg;

	pthread_mutex_lock(&s->ch_lock);
	s->gen++;
	fn = s->listener;
	arg = s->listener_arg;
	rfn = remote ? s->remote : NULL;
	rarg = s->remote_arg;
	pthread_cond_broadcast(&s->ch_cond);
	pthread_mutex_unlock(&s->ch_lock);
	if (fn && data)
		fn(arg, id, event, data);
	if (rfn)
		rfn(rarg, id, event, data);
}

void store_set_remote_hook(struct store *s, store_listener_fn *fn, void *arg)
{
	pthread_mutex_lock(&s->ch_lock);
	s->remote = fn;
	s->remote_arg = arg;
	pthread_mutex_unlock(&s->ch_lock);
}

int store_notify_queued_locked(struct store *s, const char *const *ids, int n, int64_t at)
{
	struct sdb_stmt *st;

	if (!s->listen)
		return 0;
	for (int i = 0; i < n; i += 100) { /* 100 ids: about 4 KB, under NOTIFY's 8000 bytes */
		json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:[]}", "r", s->nonce, "i", "", "e", "queued", "at",
				      (json_int_t)at, "ids");
		json_t *a = json_object_get(j, "ids");
		char *payload;
		int rc = SDB_ERROR;

		for (int k = i; k < n && k < i + 100; k++)
			json_array_append_new(a, json_string(ids[k]));
		payload = json_dumps(j, JSON_COMPACT);
		json_decref(j);
		st = payload ? store_stmt(s, STORE_SLOTS_CORE + STORE_NOTIFY, core_sql[STORE_NOTIFY]) : NULL;
		if (st) {
			sdb_bind_text(st, 1, payload);
			rc = store_step(s, st);
			sdb_reset(st);
		}
		free(payload);
		if (rc != SDB_ROW && rc != SDB_DONE)
			return -1;
	}
	return 0;
}

void store_changed_here(struct store *s, const char *id, const char *event, json_t *data)
{
	store_wake_local(s, id, event, data, 0);
	json_decref(data);
}

void store_changed(struct store *s, const char *id, const char *event, json_t *data)
{
	store_listener_fn *fn;
	void *arg;

	if (s->listen)
		publish(s, id, event, data);

	pthread_mutex_lock(&s->ch_lock);
	s->gen++;
	fn = s->listener;
	arg = s->listener_arg;
	pthread_cond_broadcast(&s->ch_cond);
	pthread_mutex_unlock(&s->ch_lock);
	if (fn && data)
		fn(arg, id, event, data);
	json_decref(data);
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

		if (clock_mono_ms() >= deadline_ms)
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

/* ---- one row by id ---- */

int store_row_by_id(struct store *s, int slot, const char *sql, const char *id, const char *customer, int cust_col,
		    int (*fn)(struct sdb_stmt *st, void *arg), void *arg)
{
	struct sdb_stmt *st;
	int r = -EIO;

	pthread_mutex_lock(&s->lock);
	st = store_stmt(s, slot, sql);
	if (st) {
		r = -ENOENT;
		sdb_bind_text(st, 1, id);
		if (sdb_step(st) == SDB_ROW) {
			const char *c = store_col_text(st, cust_col);

			if (!customer || !strcmp(customer, c ? c : ""))
				r = fn(st, arg);
		}
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

/* store_text_by_id's row: column 0 copied into *(char **)arg. */
static int copy_text(struct sdb_stmt *st, void *arg)
{
	const char *t = store_col_text(st, 0);

	*(char **)arg = t ? strdup(t) : NULL;
	return 0;
}

char *store_text_by_id(struct store *s, int slot, const char *sql, const char *id)
{
	char *text = NULL;

	store_row_by_id(s, slot, sql, id, NULL, 0, copy_text, &text);
	return text;
}

/* ---- lists of rows ---- */

int store_rows(struct store *s, int slot, const char *sql, const char *arg, void *out, size_t size, int max,
	       void (*row)(struct sdb_stmt *st, void *elem))
{
	struct sdb_stmt *st;
	int n = 0;

	if (max <= 0)
		return 0;
	pthread_mutex_lock(&s->lock);
	st = store_stmt(s, slot, sql);
	if (st) {
		if (arg)
			sdb_bind_text(st, 1, arg);
		sdb_bind_int64(st, arg ? 2 : 1, max);
		while (n < max && store_step(s, st) == SDB_ROW)
			row(st, (char *)out + (size_t)n++ * size);
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return n;
}

/* ---- pagination ---- */

int store_cursor_parse(const char *cursor, int64_t *before)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(cursor, &end, 10);
	if (!*cursor || *end || errno || v < 1 || cursor[0] == '+' || cursor[0] == ' ')
		return -EINVAL;
	*before = v;
	return 0;
}

json_t *store_page_run(struct store *s, const struct store_page *p, unsigned limit, const char *cursor,
		       char **next_cursor, struct kiln_err *err)
{
	int64_t before = p->ascending ? 0 : INT64_MAX, last = 0;
	struct sdb_stmt *st;
	json_t *arr;
	unsigned n = 0;
	int rc;

	*next_cursor = NULL;
	if (limit < 1 || limit > STORE_PAGE_MAX) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "limit: must be from 1 to 100");
		return NULL;
	}
	if (p->state && !p->state_valid(p->state)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "state: unknown state");
		return NULL;
	}
	if (cursor && store_cursor_parse(cursor, &before) < 0) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "cursor: not one this API gave out");
		return NULL;
	}
	arr = json_array();
	pthread_mutex_lock(&s->lock);
	st = store_stmt(s, p->slot, p->sql);
	if (!st) {
		pthread_mutex_unlock(&s->lock);
		json_decref(arr);
		kiln_err_set(err, KERR_STORE_ERROR, "cannot list %s", p->what);
		return NULL;
	}
	store_bind_opt_text(st, 1, p->customer);
	store_bind_opt_text(st, 2, p->state);
	sdb_bind_int64(st, 3, before);
	sdb_bind_int64(st, 4, (int64_t)limit + 1);
	while ((rc = sdb_step(st)) == SDB_ROW) {
		if (n == limit) {
			/* One more than asked for: there is a next page. */
			if (asprintf(next_cursor, "%lld", (long long)last) < 0)
				*next_cursor = NULL;
			break;
		}
		json_array_append_new(arr, p->row_json(st));
		last = sdb_col_int64(st, p->seq_col);
		n++;
	}
	sdb_reset(st);
	pthread_mutex_unlock(&s->lock);
	if (rc != SDB_ROW && rc != SDB_DONE) {
		json_decref(arr);
		free(*next_cursor);
		*next_cursor = NULL;
		kiln_err_set(err, KERR_STORE_ERROR, "cannot list %s", p->what);
		return NULL;
	}
	return arr;
}

/* ---- compare-and-set ---- */

/* Bind v to the named parameter if st has it. */
static void bind_named_text(struct sdb_stmt *st, const char *name, const char *v)
{
	int i = sdb_bind_index(st, name);

	if (i)
		store_bind_opt_text(st, i, v);
}

int store_cas_locked(struct store *s, struct sdb_stmt *st, const struct store_cas *c)
{
	int i, n;

	bind_named_text(st, ":id", c->id);
	bind_named_text(st, ":from", c->from);
	bind_named_text(st, ":to", c->to);
	bind_named_text(st, ":host", c->host);
	bind_named_text(st, ":reason", c->reason);
	bind_named_text(st, ":snapshot", c->snapshot);
	i = sdb_bind_index(st, ":now");
	if (i)
		sdb_bind_int64(st, i, c->now);
	n = store_update_locked(s, st);
	return n < 0 ? -1 : n > 0;
}

/* ---- the running quota ---- */

int store_running_usage_locked(struct store *s, const char *customer, struct usage *u)
{
	struct sdb_stmt *st = store_stmt(s, STORE_SLOTS_CORE + STORE_USAGE_RUN, core_sql[STORE_USAGE_RUN]);
	int r = -EIO;

	if (!st)
		return -EIO;
	sdb_bind_text(st, 1, customer);
	if (store_step(s, st) == SDB_ROW) {
		u->running = (unsigned)sdb_col_int64(st, 0);
		u->vcpus = (unsigned)sdb_col_int64(st, 1);
		u->memory_mib = (uint64_t)sdb_col_int64(st, 2);
		r = 0;
	}
	sdb_reset(st);
	return r;
}

int store_lock_customer_locked(struct store *s, const char *customer)
{
	struct sdb_stmt *st;
	int rc;

	if (sdb_kind(s->db) != SDB_PG)
		return 0;
	st = store_stmt(s, STORE_SLOTS_CORE + STORE_CUSTOMER_LOCK, core_sql[STORE_CUSTOMER_LOCK]);
	if (!st)
		return -1;
	sdb_bind_text(st, 1, customer);
	rc = store_step(s, st);
	sdb_reset(st);
	return rc == SDB_ROW || rc == SDB_DONE ? 0 : -1;
}
