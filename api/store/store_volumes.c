/* store_volumes: the store's volumes (store.h "Volumes"): create under
 * max_volumes with names unique per customer, get by id or name, list,
 * deletion refused while a session that is not destroyed mounts one, and
 * sessions' mounts, recorded in the transaction that inserts the session
 * under the one-writer rule. Every check that another request could race
 * (the count, the name, busy, deletion) runs under the customer's lock
 * (store_lock_customer_locked), so replicas see the one or the other. */
#include "store_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"

#define VOL_COLS "id, customer, name, size_mib, created_ms, deleted_ms"
enum { VC_ID, VC_CUSTOMER, VC_NAME, VC_SIZE, VC_CREATED, VC_DELETED };

enum vol_stmt {
	V_INSERT, V_BY_ID, V_BY_NAME, V_LIST, V_COUNT, V_NAME_TAKEN, V_USERS, V_MARK, V_UNMARK, V_LIVE, V_WRITER,
	V_MOUNT, V_MOUNTED_BY, V_SESSION, V_COUNT_
};

static const char *const vol_sql[V_COUNT_] = {
	[V_INSERT] = "INSERT INTO volumes(id, customer, name, size_mib, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
	[V_BY_ID] = "SELECT " VOL_COLS " FROM volumes WHERE id = ?1 AND customer = ?2 AND deleted_ms IS NULL",
	[V_BY_NAME] = "SELECT " VOL_COLS " FROM volumes WHERE name = ?1 AND customer = ?2 AND deleted_ms IS NULL",
	/* ?1 customer, ?2 name (NULL: any), ?3 row limit. */
	[V_LIST] = "SELECT " VOL_COLS " FROM volumes WHERE customer = ?1 AND deleted_ms IS NULL"
		   " AND (?2 IS NULL OR name = ?2) ORDER BY seq DESC LIMIT ?3",
	[V_COUNT] = "SELECT count(*) FROM volumes WHERE customer = ?1 AND deleted_ms IS NULL",
	[V_NAME_TAKEN] = "SELECT 1 FROM volumes WHERE customer = ?1 AND name = ?2 AND deleted_ms IS NULL",
	/* A session that is not destroyed and mounts it (any way). */
	[V_USERS] = "SELECT m.session_id FROM volume_mounts m JOIN sessions s ON s.id = m.session_id"
		    " WHERE m.volume_id = ?1 AND s.state != 'destroyed' ORDER BY s.seq LIMIT 1",
	[V_MARK] = "UPDATE volumes SET deleted_ms = ?1 WHERE id = ?2 AND customer = ?3 AND deleted_ms IS NULL",
	[V_UNMARK] = "UPDATE volumes SET deleted_ms = NULL WHERE id = ?1 AND deleted_ms IS NOT NULL"
		     " AND NOT EXISTS (SELECT 1 FROM volumes o WHERE o.customer = volumes.customer"
		     "  AND o.name = volumes.name AND o.deleted_ms IS NULL)",
	[V_LIVE] = "SELECT name FROM volumes WHERE id = ?1 AND customer = ?2 AND deleted_ms IS NULL",
	/* Another session (not ?2), not destroyed, with a read-write mount of ?1. */
	[V_WRITER] = "SELECT m.session_id FROM volume_mounts m JOIN sessions s ON s.id = m.session_id"
		     " WHERE m.volume_id = ?1 AND m.read_only = 0 AND m.session_id != ?2 AND s.state != 'destroyed'"
		     " ORDER BY s.seq LIMIT 1",
	[V_MOUNT] = "INSERT INTO volume_mounts(session_id, volume_id, path, read_only) VALUES (?1, ?2, ?3, ?4)",
	[V_MOUNTED_BY] = "SELECT m.session_id, m.read_only FROM volume_mounts m JOIN sessions s ON s.id = m.session_id"
			 " WHERE m.volume_id = ?1 AND s.state != 'destroyed' ORDER BY s.seq",
	[V_SESSION] = "SELECT m.volume_id, coalesce(v.name, ''), m.path, m.read_only FROM volume_mounts m"
		      " LEFT JOIN volumes v ON v.id = m.volume_id WHERE m.session_id = ?1 ORDER BY m.path",
};

_Static_assert(STORE_SLOTS_VOLUMES + V_COUNT_ <= STORE_SLOTS_MAX, "store_volumes.c's statements overflow their slots");

static struct sdb_stmt *stmt(struct store *s, enum vol_stmt id)
{
	return store_stmt(s, STORE_SLOTS_VOLUMES + id, vol_sql[id]);
}

int store_volume_id_valid(const char *id)
{
	return id && strlen(id) == STORE_VOLUME_ID_LEN && !strncmp(id, "vol_", 4) &&
	       strspn(id + 4, "0123456789abcdef") == STORE_VOLUME_ID_LEN - 4;
}

static void volume_row(struct sdb_stmt *st, struct store_volume *out)
{
	memset(out, 0, sizeof(*out));
	store_copy_col(st, VC_ID, out->id, sizeof(out->id));
	store_copy_col(st, VC_CUSTOMER, out->customer, sizeof(out->customer));
	store_copy_col(st, VC_NAME, out->name, sizeof(out->name));
	out->size_mib = (unsigned)sdb_col_int64(st, VC_SIZE);
	out->created_ms = sdb_col_int64(st, VC_CREATED);
	out->deleted_ms = sdb_col_null(st, VC_DELETED) ? 0 : sdb_col_int64(st, VC_DELETED);
}

/* The customer's volumes not deleted: 0 or -1. Lock held. */
static int count_locked(struct store *s, const char *customer, unsigned *count)
{
	struct sdb_stmt *st = stmt(s, V_COUNT);
	int r = -1;

	if (!st)
		return -1;
	sdb_bind_text(st, 1, customer);
	if (store_step(s, st) == SDB_ROW) {
		*count = (unsigned)sdb_col_int64(st, 0);
		r = 0;
	}
	sdb_reset(st);
	return r;
}

/* The first row of st (bound) as 1 with column 0 copied into out (cap
 * bytes; out may be NULL), 0 when none, -1 error; st is reset. Lock held. */
static int first_text_locked(struct store *s, struct sdb_stmt *st, char *out, size_t cap)
{
	int rc = store_step(s, st);

	if (rc == SDB_ROW && out)
		store_copy_col(st, 0, out, cap);
	sdb_reset(st);
	return rc == SDB_ROW ? 1 : rc == SDB_DONE ? 0 : -1;
}

/* ---- create ---- */

int store_volume_create(struct store *s, const char *customer, const char *name, unsigned size_mib,
			unsigned max_volumes, char id_out[40], struct kiln_err *err)
{
	unsigned char r[12];
	char id[40], hex[25];
	struct sdb_stmt *st;
	unsigned count;
	int taken;
	STORE_TX(tx);

	if (store_random(r, sizeof(r)) < 0)
		return kiln_err_set(err, KERR_INTERNAL, "no randomness");
	store_hex(r, sizeof(r), hex);
	snprintf(id, sizeof(id), "vol_%s", hex);
	if (store_tx_start(&tx, s) < 0)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot begin: %s", sdb_errmsg(s->db));
	/* Replicas: one count and name check at a time per customer. */
	if (store_lock_customer_locked(s, customer) < 0 || count_locked(s, customer, &count) < 0)
		goto fail_sql;
	st = stmt(s, V_NAME_TAKEN);
	if (!st)
		goto fail_sql;
	sdb_bind_text(st, 1, customer);
	sdb_bind_text(st, 2, name);
	taken = first_text_locked(s, st, NULL, 0);
	if (taken < 0)
		goto fail_sql;
	if (taken) {
		kiln_err_set(err, KERR_CONFLICT, "a volume named %s exists", name);
		return -EEXIST;
	}
	if (max_volumes && count + 1 > max_volumes) {
		kiln_err_set(err, KERR_QUOTA_EXCEEDED,
			     "max_volumes: you have %u volumes, your quota's limit is %u (DELETE one first)", count,
			     max_volumes);
		return -EDQUOT;
	}
	st = stmt(s, V_INSERT);
	if (!st)
		goto fail_sql;
	sdb_bind_text(st, 1, id);
	sdb_bind_text(st, 2, customer);
	sdb_bind_text(st, 3, name);
	sdb_bind_int64(st, 4, size_mib);
	sdb_bind_int64(st, 5, clock_wall_ms());
	if (store_update_locked(s, st) != 1 || store_tx_commit(&tx) < 0)
		goto fail_sql;
	memcpy(id_out, id, strlen(id) + 1);
	return 0;
fail_sql:
	return kiln_err_set(err, KERR_STORE_ERROR, "cannot store the volume: %s", sdb_errmsg(s->db));
}

/* ---- reading ---- */

/* One row of statement id (?1 key, ?2 customer) into out: 0, -ENOENT, -EIO.
 * Lock held. */
static int get_locked(struct store *s, enum vol_stmt id, const char *key, const char *customer,
		      struct store_volume *out)
{
	struct sdb_stmt *st = stmt(s, id);
	int rc;

	if (!st)
		return -EIO;
	sdb_bind_text(st, 1, key);
	sdb_bind_text(st, 2, customer);
	rc = store_step(s, st);
	if (rc == SDB_ROW)
		volume_row(st, out);
	sdb_reset(st);
	return rc == SDB_ROW ? 0 : rc == SDB_DONE ? -ENOENT : -EIO;
}

int store_volume_get(struct store *s, const char *id_or_name, const char *customer, struct store_volume *out)
{
	int r = -ENOENT;

	if (!id_or_name || !id_or_name[0] || strlen(id_or_name) > STORE_VOLUME_NAME_MAX)
		return -ENOENT;
	pthread_mutex_lock(&s->lock);
	if (store_volume_id_valid(id_or_name))
		r = get_locked(s, V_BY_ID, id_or_name, customer, out);
	if (r == -ENOENT)
		r = get_locked(s, V_BY_NAME, id_or_name, customer, out);
	pthread_mutex_unlock(&s->lock);
	return r;
}

json_t *store_volume_json(struct store *s, const struct store_volume *v)
{
	json_t *by = json_array(), *j;
	struct sdb_stmt *st;
	int rc = SDB_ERROR;

	if (!by)
		return NULL;
	pthread_mutex_lock(&s->lock);
	st = stmt(s, V_MOUNTED_BY);
	if (st) {
		sdb_bind_text(st, 1, v->id);
		while ((rc = store_step(s, st)) == SDB_ROW)
			json_array_append_new(by, json_pack("{s:s, s:b}", "session_id", store_col_text(st, 0) ?: "",
							    "read_only", sdb_col_int(st, 1) != 0));
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	if (rc != SDB_DONE) {
		json_decref(by);
		return NULL;
	}
	j = json_pack("{s:s, s:s, s:i, s:I, s:o}", "id", v->id, "name", v->name, "size_mib", (int)v->size_mib,
		      "created_ms", (json_int_t)v->created_ms, "mounted_by", by);
	return j;
}

json_t *store_volume_list(struct store *s, const char *customer, const char *name)
{
	struct store_volume *rows = calloc(STORE_PAGE_MAX, sizeof(*rows));
	struct sdb_stmt *st;
	json_t *arr = json_array();
	int n = 0, rc = SDB_ERROR;

	if (!rows || !arr) {
		free(rows);
		json_decref(arr);
		return NULL;
	}
	pthread_mutex_lock(&s->lock);
	st = stmt(s, V_LIST);
	if (st) {
		sdb_bind_text(st, 1, customer);
		store_bind_opt_text(st, 2, name);
		sdb_bind_int64(st, 3, STORE_PAGE_MAX);
		while (n < STORE_PAGE_MAX && (rc = store_step(s, st)) == SDB_ROW)
			volume_row(st, &rows[n++]);
		if (rc == SDB_ROW)
			rc = SDB_DONE;
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	/* Each one's mounts after the list's statement is done with. */
	for (int i = 0; rc == SDB_DONE && i < n; i++) {
		json_t *j = store_volume_json(s, &rows[i]);

		if (!j)
			rc = SDB_ERROR;
		else
			json_array_append_new(arr, j);
	}
	free(rows);
	if (rc != SDB_DONE) {
		json_decref(arr);
		return NULL;
	}
	return arr;
}

int store_volume_count(struct store *s, const char *customer, unsigned *count)
{
	int r;

	pthread_mutex_lock(&s->lock);
	r = count_locked(s, customer, count);
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_session_volumes(struct store *s, const char *session_id, struct store_volume_mount *out, int max)
{
	struct sdb_stmt *st;
	int n = 0, rc = SDB_ERROR;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, V_SESSION);
	if (st) {
		sdb_bind_text(st, 1, session_id);
		while (n < max && (rc = store_step(s, st)) == SDB_ROW) {
			struct store_volume_mount *m = &out[n++];

			memset(m, 0, sizeof(*m));
			store_copy_col(st, 0, m->volume_id, sizeof(m->volume_id));
			store_copy_col(st, 1, m->name, sizeof(m->name));
			store_copy_col(st, 2, m->path, sizeof(m->path));
			m->read_only = sdb_col_int(st, 3) != 0;
		}
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return rc == SDB_ROW || rc == SDB_DONE ? n : -1;
}

/* ---- mounts ---- */

int store_volume_attach_locked(struct store *s, const char *id, const char *customer,
			       const struct store_volume_mount *m, unsigned n, struct kiln_err *err)
{
	for (unsigned i = 0; i < n; i++) {
		struct sdb_stmt *st = stmt(s, V_LIVE);
		char name[STORE_VOLUME_NAME_MAX + 1] = "", other[40] = "";
		int r;

		if (!st)
			goto fail_sql;
		sdb_bind_text(st, 1, m[i].volume_id);
		sdb_bind_text(st, 2, customer);
		r = first_text_locked(s, st, name, sizeof(name));
		if (r < 0)
			goto fail_sql;
		if (!r) {
			kiln_err_set(err, KERR_INVALID_REQUEST, "volumes: volume %s is deleted (or not yours)",
				     m[i].name[0] ? m[i].name : m[i].volume_id);
			return -EINVAL;
		}
		if (!m[i].read_only) {
			st = stmt(s, V_WRITER);
			if (!st)
				goto fail_sql;
			sdb_bind_text(st, 1, m[i].volume_id);
			sdb_bind_text(st, 2, id);
			r = first_text_locked(s, st, other, sizeof(other));
			if (r < 0)
				goto fail_sql;
			if (r) {
				kiln_err_set(err, KERR_VOLUME_BUSY,
					     "volume %s is mounted read-write by session %s (until it is destroyed):"
					     " mount it read-only, or destroy that session first",
					     name, other);
				return -EBUSY;
			}
		}
		st = stmt(s, V_MOUNT);
		if (!st)
			goto fail_sql;
		sdb_bind_text(st, 1, id);
		sdb_bind_text(st, 2, m[i].volume_id);
		sdb_bind_text(st, 3, m[i].path);
		sdb_bind_int64(st, 4, m[i].read_only ? 1 : 0);
		if (store_update_locked(s, st) != 1)
			goto fail_sql;
	}
	return 0;
fail_sql:
	return kiln_err_set(err, KERR_STORE_ERROR, "cannot record the session's volumes: %s", sdb_errmsg(s->db));
}

/* ---- deletion ---- */

int store_volume_mark_deleted(struct store *s, const char *id, const char *customer, struct kiln_err *err)
{
	struct store_volume v;
	struct sdb_stmt *st;
	char user[40] = "";
	int r;
	STORE_TX(tx);

	if (store_tx_start(&tx, s) < 0)
		return -1;
	/* Under the customer's lock: a create that mounts it waits, or is seen. */
	if (store_lock_customer_locked(s, customer) < 0)
		return -1;
	r = get_locked(s, V_BY_ID, id, customer, &v);
	if (r == -ENOENT)
		return 0;
	if (r < 0)
		return -1;
	st = stmt(s, V_USERS);
	if (!st)
		return -1;
	sdb_bind_text(st, 1, id);
	r = first_text_locked(s, st, user, sizeof(user));
	if (r < 0)
		return -1;
	if (r) {
		kiln_err_set(err, KERR_VOLUME_BUSY,
			     "volume %s is mounted by session %s: destroy the sessions that mount it first (paused"
			     " ones too)",
			     v.name, user);
		return -EBUSY;
	}
	st = stmt(s, V_MARK);
	if (!st)
		return -1;
	sdb_bind_int64(st, 1, clock_wall_ms());
	sdb_bind_text(st, 2, id);
	sdb_bind_text(st, 3, customer);
	r = store_update_locked(s, st);
	if (r < 0 || store_tx_commit(&tx) < 0)
		return -1;
	return r > 0;
}

int store_volume_unmark_deleted(struct store *s, const char *id)
{
	struct sdb_stmt *st;
	int n = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, V_UNMARK);
	if (st) {
		sdb_bind_text(st, 1, id);
		n = store_update_locked(s, st);
	}
	pthread_mutex_unlock(&s->lock);
	return n < 0 ? -1 : n > 0;
}
