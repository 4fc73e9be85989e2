/* store_snapshots: snapshots in kiln-api's store (see store.h,
 * "Snapshots"): the rows (named ones and forks' hidden ones), their quota
 * checked in the insert's own transaction, the customer's list (filters,
 * keyset pages, newest first), deletion in two steps (marked at once, the
 * row removed once its objects in S3 are gone), and the sessions started
 * from one, which keep its objects while any of them is not destroyed. */
#include "store_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"

#define SNAP_COLS                                                                                              \
	"id, customer, name, session_id, kind, host_id, vcpus, memory_mib, egress, bytes, stop_ms, created_ms," \
	" deleted_ms, seq, (SELECT u.name FROM template_uses u WHERE u.id = snapshots.id)"
enum {
	KC_ID, KC_CUSTOMER, KC_NAME, KC_SESSION, KC_KIND, KC_HOST, KC_VCPUS, KC_MEMORY, KC_EGRESS, KC_BYTES, KC_STOP,
	KC_CREATED, KC_DELETED, KC_SEQ, KC_TEMPLATE,
};

enum snap_stmt {
	K_INSERT, K_GET, K_SPEC, K_LIST, K_MARK, K_REMOVE, K_REMOVE_USE, K_USAGE, K_USERS, K_DELETED, K_USE_COPY,
	K_LIVE, K_COUNT
};

static const char *const snap_sql[K_COUNT] = {
	[K_INSERT] = "INSERT INTO snapshots(id, customer, name, session_id, kind, host_id, vcpus, memory_mib, egress,"
		     " bytes, stop_ms, created_ms, spec) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
	[K_GET] = "SELECT " SNAP_COLS " FROM snapshots WHERE id = ?1",
	[K_SPEC] = "SELECT spec FROM snapshots WHERE id = ?1",
	/* A page: ?1 customer, ?2 name (NULL: any), ?3 session (NULL: any),
	 * ?4 before seq, ?5 row limit. */
	[K_LIST] = "SELECT " SNAP_COLS " FROM snapshots WHERE customer = ?1 AND kind = 'named' AND deleted_ms IS NULL"
		   " AND (?2 IS NULL OR name = ?2) AND (?3 IS NULL OR session_id = ?3) AND seq < ?4"
		   " ORDER BY seq DESC LIMIT ?5",
	/* A customer deletes its named ones; a fork's is kiln-api's (?3 NULL). */
	[K_MARK] = "UPDATE snapshots SET deleted_ms = ?1 WHERE id = ?2 AND deleted_ms IS NULL"
		   " AND (?3 IS NULL OR (customer = ?3 AND kind = 'named'))",
	[K_REMOVE] = "DELETE FROM snapshots WHERE id = ?1",
	[K_REMOVE_USE] = "DELETE FROM template_uses WHERE id = ?1",
	[K_USAGE] = "SELECT count(*), coalesce(sum(bytes), 0) FROM snapshots WHERE customer = ?1 AND kind = 'named'"
		    " AND deleted_ms IS NULL",
	[K_USERS] = "SELECT count(*) FROM sessions WHERE from_snapshot = ?1 AND state != 'destroyed'",
	[K_DELETED] = "SELECT " SNAP_COLS " FROM snapshots WHERE deleted_ms IS NOT NULL AND NOT EXISTS"
		      " (SELECT 1 FROM sessions s WHERE s.from_snapshot = snapshots.id AND s.state != 'destroyed')"
		      " ORDER BY deleted_ms LIMIT ?1",
	[K_LIVE] = "SELECT 1 FROM snapshots WHERE id = ?1 AND customer = ?2 AND deleted_ms IS NULL",
	[K_USE_COPY] = "INSERT INTO template_uses(id, template_id, name, sha256, builtin, tref)"
		       " SELECT ?1, template_id, name, sha256, builtin, tref FROM template_uses WHERE id = ?2",
};

_Static_assert(STORE_SLOTS_SNAPSHOTS + K_COUNT <= STORE_SLOTS_VOLUMES, "store_snapshots.c's statements overflow their slots");

static struct sdb_stmt *stmt(struct store *s, enum snap_stmt id)
{
	return store_stmt(s, STORE_SLOTS_SNAPSHOTS + id, snap_sql[id]);
}

/* ---- ids ---- */

int store_snapshot_new_id(char id[40])
{
	unsigned char r[12];
	char hex[25];

	if (store_random(r, sizeof(r)) < 0)
		return -1;
	store_hex(r, sizeof(r), hex);
	snprintf(id, 40, "snap_%s", hex);
	return 0;
}

int store_snapshot_id_valid(const char *id)
{
	return id && strlen(id) == STORE_SNAPSHOT_ID_LEN && !strncmp(id, "snap_", 5) &&
	       strspn(id + 5, "0123456789abcdef") == STORE_SNAPSHOT_ID_LEN - 5;
}

/* ---- rows ---- */

static void snapshot_row(struct sdb_stmt *st, void *elem)
{
	struct store_snapshot *out = elem;

	memset(out, 0, sizeof(*out));
	store_copy_col(st, KC_ID, out->id, sizeof(out->id));
	store_copy_col(st, KC_CUSTOMER, out->customer, sizeof(out->customer));
	store_copy_col(st, KC_NAME, out->name, sizeof(out->name));
	store_copy_col(st, KC_SESSION, out->session_id, sizeof(out->session_id));
	store_copy_col(st, KC_KIND, out->kind, sizeof(out->kind));
	store_copy_col(st, KC_HOST, out->host_id, sizeof(out->host_id));
	out->vcpus = (unsigned)sdb_col_int64(st, KC_VCPUS);
	out->memory_mib = (unsigned)sdb_col_int64(st, KC_MEMORY);
	out->egress = sdb_col_int(st, KC_EGRESS) != 0;
	out->bytes = (uint64_t)sdb_col_int64(st, KC_BYTES);
	out->stop_ms = sdb_col_int64(st, KC_STOP);
	out->created_ms = sdb_col_int64(st, KC_CREATED);
	out->deleted_ms = sdb_col_null(st, KC_DELETED) ? 0 : sdb_col_int64(st, KC_DELETED);
}

/* The public JSON of the row st is on. */
static json_t *snapshot_row_json(struct sdb_stmt *st)
{
	const char *tpl = store_col_text(st, KC_TEMPLATE);

	return json_pack("{s:s, s:o, s:s, s:s, s:i, s:i, s:I, s:I, s:o}", "id", store_col_text(st, KC_ID), "name",
			 store_opt_str(st, KC_NAME), "session_id", store_col_text(st, KC_SESSION), "template",
			 tpl ? tpl : "default", "vcpus", (int)sdb_col_int64(st, KC_VCPUS), "memory_mib",
			 (int)sdb_col_int64(st, KC_MEMORY), "bytes", (json_int_t)sdb_col_int64(st, KC_BYTES),
			 "created_ms", (json_int_t)sdb_col_int64(st, KC_CREATED), "stop_ms", store_opt_int(st, KC_STOP));
}

/* ---- create ---- */

int store_template_use_copy_locked(struct store *s, const char *to, const char *from)
{
	struct sdb_stmt *st = stmt(s, K_USE_COPY);
	int rc;

	if (!st)
		return -1;
	sdb_bind_text(st, 1, to);
	sdb_bind_text(st, 2, from);
	rc = store_step(s, st);
	sdb_reset(st);
	return rc == SDB_DONE ? 0 : -1;
}

int store_snapshot_live_locked(struct store *s, const char *id, const char *customer)
{
	struct sdb_stmt *st = stmt(s, K_LIVE);
	int rc;

	if (!st)
		return -1;
	sdb_bind_text(st, 1, id);
	sdb_bind_text(st, 2, customer);
	rc = store_step(s, st);
	sdb_reset(st);
	return rc == SDB_ROW ? 1 : rc == SDB_DONE ? 0 : -1;
}

/* The customer's named snapshots now: 0 or -1. Lock held. */
static int usage_locked(struct store *s, const char *customer, unsigned *count, uint64_t *bytes)
{
	struct sdb_stmt *st = stmt(s, K_USAGE);
	int r = -1;

	if (!st)
		return -1;
	sdb_bind_text(st, 1, customer);
	if (store_step(s, st) == SDB_ROW) {
		*count = (unsigned)sdb_col_int64(st, 0);
		*bytes = (uint64_t)sdb_col_int64(st, 1);
		r = 0;
	}
	sdb_reset(st);
	return r;
}

int store_snapshot_create(struct store *s, const struct store_snapshot_new *n, struct kiln_err *err)
{
	int named = !strcmp(n->kind, "named");
	struct sdb_stmt *st;
	STORE_TX(tx);

	if (store_tx_start(&tx, s) < 0)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot begin: %s", sdb_errmsg(s->db));
	if (named) {
		unsigned count;
		uint64_t bytes;

		/* Replicas: one quota check at a time per customer. */
		if (store_lock_customer_locked(s, n->customer) < 0 || usage_locked(s, n->customer, &count, &bytes) < 0)
			goto fail_sql;
		if (n->max_snapshots && count + 1 > n->max_snapshots) {
			kiln_err_set(err, KERR_QUOTA_EXCEEDED,
				     "max_snapshots: you have %u snapshots, your quota's limit is %u (DELETE one first)",
				     count, n->max_snapshots);
			return -EDQUOT;
		}
		if (n->max_snapshot_mib && bytes + n->bytes > n->max_snapshot_mib * (1024 * 1024)) {
			kiln_err_set(err, KERR_QUOTA_EXCEEDED,
				     "max_snapshot_mib: your snapshots hold %llu MiB, this one %llu MiB more, your quota's"
				     " limit is %llu MiB",
				     (unsigned long long)(bytes >> 20), (unsigned long long)((n->bytes + (1 << 20) - 1) >> 20),
				     (unsigned long long)n->max_snapshot_mib);
			return -EDQUOT;
		}
	}
	st = stmt(s, K_INSERT);
	if (!st)
		goto fail_sql;
	sdb_bind_text(st, 1, n->id);
	sdb_bind_text(st, 2, n->customer);
	store_bind_opt_text(st, 3, n->name && n->name[0] ? n->name : NULL);
	sdb_bind_text(st, 4, n->session_id);
	sdb_bind_text(st, 5, n->kind);
	store_bind_opt_text(st, 6, n->host_id && n->host_id[0] ? n->host_id : NULL);
	sdb_bind_int64(st, 7, n->vcpus);
	sdb_bind_int64(st, 8, n->memory_mib);
	sdb_bind_int64(st, 9, n->egress ? 1 : 0);
	sdb_bind_int64(st, 10, (int64_t)n->bytes);
	sdb_bind_int64(st, 11, n->stop_ms);
	sdb_bind_int64(st, 12, clock_wall_ms());
	sdb_bind_text(st, 13, n->spec_json);
	if (store_step(s, st) != SDB_DONE) {
		sdb_reset(st);
		goto fail_sql;
	}
	sdb_reset(st);
	/* Its template: the session's, which sessions started from it use. */
	if (store_template_use_copy_locked(s, n->id, n->session_id) < 0)
		goto fail_sql;
	if (store_tx_commit(&tx) < 0)
		goto fail_sql;
	return 0;
fail_sql:
	return kiln_err_set(err, KERR_STORE_ERROR, "cannot store the snapshot: %s", sdb_errmsg(s->db));
}

/* ---- reading ---- */

struct get_arg {
	struct store_snapshot *out;
	int with_deleted;
	json_t *j;                   /* NULL: fill out instead */
	int want_json;
};

static int get_row(struct sdb_stmt *st, void *arg)
{
	struct get_arg *a = arg;

	if (!a->with_deleted && !sdb_col_null(st, KC_DELETED))
		return -ENOENT;
	if (a->want_json) {
		/* A fork's own snapshot is never shown. */
		if (strcmp(store_col_text(st, KC_KIND) ?: "", "named"))
			return -ENOENT;
		a->j = snapshot_row_json(st);
	} else {
		snapshot_row(st, a->out);
	}
	return 0;
}

int store_snapshot_get(struct store *s, const char *id, const char *customer, int with_deleted,
		       struct store_snapshot *out)
{
	struct get_arg a = { .out = out, .with_deleted = with_deleted };

	if (!store_snapshot_id_valid(id))
		return -ENOENT;
	return store_row_by_id(s, STORE_SLOTS_SNAPSHOTS + K_GET, snap_sql[K_GET], id, customer, KC_CUSTOMER, get_row,
			       &a);
}

json_t *store_snapshot_json(struct store *s, const char *id, const char *customer)
{
	struct get_arg a = { .want_json = 1 };

	if (!store_snapshot_id_valid(id))
		return NULL;
	store_row_by_id(s, STORE_SLOTS_SNAPSHOTS + K_GET, snap_sql[K_GET], id, customer, KC_CUSTOMER, get_row, &a);
	return a.j;
}

char *store_snapshot_spec(struct store *s, const char *id)
{
	return store_text_by_id(s, STORE_SLOTS_SNAPSHOTS + K_SPEC, snap_sql[K_SPEC], id);
}

json_t *store_snapshot_list(struct store *s, const char *customer, const char *name, const char *session_id,
			    unsigned limit, const char *cursor, char **next_cursor, struct kiln_err *err)
{
	int64_t before = INT64_MAX, last = 0;
	struct sdb_stmt *st;
	unsigned n = 0;
	json_t *arr;
	int rc;

	*next_cursor = NULL;
	if (limit < 1 || limit > STORE_PAGE_MAX) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "limit: must be from 1 to 100");
		return NULL;
	}
	if (cursor && store_cursor_parse(cursor, &before) < 0) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "after: not a cursor this API gave out");
		return NULL;
	}
	arr = json_array();
	if (!arr) {
		kiln_err_set(err, KERR_INTERNAL, "out of memory");
		return NULL;
	}
	pthread_mutex_lock(&s->lock);
	st = stmt(s, K_LIST);
	if (!st) {
		pthread_mutex_unlock(&s->lock);
		json_decref(arr);
		kiln_err_set(err, KERR_STORE_ERROR, "cannot list snapshots");
		return NULL;
	}
	sdb_bind_text(st, 1, customer);
	store_bind_opt_text(st, 2, name);
	store_bind_opt_text(st, 3, session_id);
	sdb_bind_int64(st, 4, before);
	sdb_bind_int64(st, 5, (int64_t)limit + 1);
	while ((rc = sdb_step(st)) == SDB_ROW) {
		if (n == limit) {
			/* One more than asked for: there is a next page. */
			if (asprintf(next_cursor, "%lld", (long long)last) < 0)
				*next_cursor = NULL;
			break;
		}
		json_array_append_new(arr, snapshot_row_json(st));
		last = sdb_col_int64(st, KC_SEQ);
		n++;
	}
	sdb_reset(st);
	pthread_mutex_unlock(&s->lock);
	if (rc != SDB_ROW && rc != SDB_DONE) {
		json_decref(arr);
		free(*next_cursor);
		*next_cursor = NULL;
		kiln_err_set(err, KERR_STORE_ERROR, "cannot list snapshots");
		return NULL;
	}
	return arr;
}

int store_snapshot_usage(struct store *s, const char *customer, unsigned *count, uint64_t *bytes)
{
	int r;

	pthread_mutex_lock(&s->lock);
	r = usage_locked(s, customer, count, bytes);
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_snapshot_users(struct store *s, const char *id)
{
	struct sdb_stmt *st;
	int n = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, K_USERS);
	if (st) {
		sdb_bind_text(st, 1, id);
		if (store_step(s, st) == SDB_ROW)
			n = (int)sdb_col_int64(st, 0);
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return n;
}

int store_snapshots_deleted(struct store *s, struct store_snapshot *out, int max)
{
	return store_rows(s, STORE_SLOTS_SNAPSHOTS + K_DELETED, snap_sql[K_DELETED], NULL, out, sizeof(*out), max,
			  snapshot_row);
}

/* ---- deletion ---- */

int store_snapshot_mark_deleted(struct store *s, const char *id, const char *customer)
{
	struct sdb_stmt *st;
	int n = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, K_MARK);
	if (st) {
		sdb_bind_int64(st, 1, clock_wall_ms());
		sdb_bind_text(st, 2, id);
		store_bind_opt_text(st, 3, customer);
		n = store_update_locked(s, st);
	}
	pthread_mutex_unlock(&s->lock);
	return n < 0 ? -1 : n > 0;
}

int store_snapshot_remove(struct store *s, const char *id)
{
	struct sdb_stmt *st;
	int n = -1;
	STORE_TX(tx);

	if (store_tx_start(&tx, s) < 0)
		return -1;
	st = stmt(s, K_REMOVE_USE);
	if (!st)
		return -1;
	sdb_bind_text(st, 1, id);
	if (store_update_locked(s, st) < 0)
		return -1;
	st = stmt(s, K_REMOVE);
	if (!st)
		return -1;
	sdb_bind_text(st, 1, id);
	n = store_update_locked(s, st);
	if (n < 0 || store_tx_commit(&tx) < 0)
		return -1;
	return n > 0;
}
