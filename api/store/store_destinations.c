/* store_destinations: customers' own S3 destinations (one per customer, its
 * secret key only sealed: api/base/destination.h) and which destination a task's
 * outputs went to. Plain statements prepared per call: these are rare. */
#include "store_int.h"

#include <stdio.h>

#include <openssl/crypto.h>

#include "clock.h"

void store_dest_row(struct sdb_stmt *st, int c, struct store_dest *out)
{
	int n = sdb_col_bytes(st, c + 6);

	snprintf(out->id, sizeof(out->id), "%s", store_col_text(st, c) ?: "");
	snprintf(out->d.endpoint, sizeof(out->d.endpoint), "%s", store_col_text(st, c + 1) ?: "");
	snprintf(out->d.region, sizeof(out->d.region), "%s", store_col_text(st, c + 2) ?: "");
	snprintf(out->d.bucket, sizeof(out->d.bucket), "%s", store_col_text(st, c + 3) ?: "");
	snprintf(out->d.prefix, sizeof(out->d.prefix), "%s", store_col_text(st, c + 4) ?: "");
	snprintf(out->d.access_key, sizeof(out->d.access_key), "%s", store_col_text(st, c + 5) ?: "");
	if (n > 0 && (size_t)n <= sizeof(out->sealed)) {
		memcpy(out->sealed, sdb_col_blob(st, c + 6), (size_t)n);
		out->sealed_len = (size_t)n;
	}
	out->created_ms = sdb_col_int64(st, c + 7);
	out->updated_ms = sdb_col_int64(st, c + 8);
}

int store_dest_get(struct store *s, const char *customer, struct store_dest *out)
{
	struct sdb_stmt *st = NULL;
	int found = -1;

	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&s->lock);
	if (sdb_prepare(s->db, "SELECT " STORE_DEST_COLS " FROM destinations WHERE customer = ?1", &st) != 0)
		goto out;
	sdb_bind_text(st, 1, customer);
	switch (sdb_step(st)) {
	case SDB_ROW:
		store_dest_row(st, 0, out);
		found = 1;
		break;
	case SDB_DONE:
		found = 0;
		break;
	}
out:
	sdb_finalize(st);
	pthread_mutex_unlock(&s->lock);
	return found;
}

int store_dest_put(struct store *s, const char *customer, const struct dest *d, const unsigned char *sealed,
		   size_t sealed_len, char id_out[40], int *same_place, struct kiln_err *err)
{
	struct store_dest old;
	struct quota q;
	int64_t now = clock_wall_ms();
	struct sdb_stmt *st = NULL;
	int have, same, rc;

	if (sealed_len > STORE_DEST_SEALED_MAX)
		return kiln_err_set(err, KERR_INTERNAL, "sealed secret too long");
	if (store_customer_quota(s, customer, &q) < 0)
		return kiln_err_set(err, KERR_NOT_FOUND, "no such customer");
	have = store_dest_get(s, customer, &old);
	if (have < 0)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot read the destination");
	same = have == 1 && dest_same_place(&old.d, d);
	if (same)
		snprintf(id_out, 40, "%s", old.id);
	else if (store_new_id("dst_", id_out) < 0)
		return kiln_err_set(err, KERR_INTERNAL, "no randomness");
	pthread_mutex_lock(&s->lock);
	rc = sdb_prepare(s->db,
				"INSERT INTO destinations(customer, id, endpoint, region, bucket, prefix, access_key,"
				" secret_sealed, created_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)"
				" ON CONFLICT(customer) DO UPDATE SET id = ?2, endpoint = ?3, region = ?4, bucket = ?5,"
				" prefix = ?6, access_key = ?7, secret_sealed = ?8, updated_ms = ?9",
				&st);
	if (rc == 0) {
		sdb_bind_text(st, 1, customer);
		sdb_bind_text(st, 2, id_out);
		sdb_bind_text(st, 3, d->endpoint);
		sdb_bind_text(st, 4, d->region);
		sdb_bind_text(st, 5, d->bucket);
		sdb_bind_text(st, 6, d->prefix);
		sdb_bind_text(st, 7, d->access_key);
		sdb_bind_blob(st, 8, sealed, sealed_len);
		sdb_bind_int64(st, 9, now);
		rc = store_step(s, st);
	}
	if (rc != SDB_DONE)
		kiln_err_set(err, KERR_STORE_ERROR, "%s", sdb_errmsg(s->db));
	sdb_finalize(st);
	pthread_mutex_unlock(&s->lock);
	if (same_place)
		*same_place = same;
	return rc == SDB_DONE ? 0 : -1;
}

int store_dest_delete(struct store *s, const char *customer)
{
	struct sdb_stmt *st = NULL;
	int r = -1;

	pthread_mutex_lock(&s->lock);
	if (sdb_prepare(s->db, "DELETE FROM destinations WHERE customer = ?1", &st) == 0) {
		sdb_bind_text(st, 1, customer);
		if (store_step(s, st) == SDB_DONE)
			r = sdb_changes(s->db) > 0;
	}
	sdb_finalize(st);
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_task_set_dest(struct store *s, const char *task, const char *dest_id)
{
	struct sdb_stmt *st = NULL;
	int r = -1;

	pthread_mutex_lock(&s->lock);
	if (sdb_prepare(s->db, "UPDATE tasks SET destination = ?1 WHERE id = ?2", &st) == 0) {
		store_bind_opt_text(st, 1, dest_id);
		sdb_bind_text(st, 2, task);
		if (store_step(s, st) == SDB_DONE)
			r = 0;
	}
	sdb_finalize(st);
	pthread_mutex_unlock(&s->lock);
	return r;
}

json_t *store_dest_tasks(struct store *s, const char *customer, const char *dest_id)
{
	struct sdb_stmt *st = NULL;
	json_t *a = json_array();
	int rc = SDB_ERROR;

	pthread_mutex_lock(&s->lock);
	if (a && sdb_prepare(s->db, "SELECT t.id, h.url FROM tasks t JOIN hosts h ON h.id = t.host_id"
				    " WHERE t.customer = ?1 AND t.destination = ?2"
				    " AND t.state IN ('scheduled', 'starting', 'running', 'uploading')", &st) == 0) {
		sdb_bind_text(st, 1, customer);
		sdb_bind_text(st, 2, dest_id);
		while ((rc = sdb_step(st)) == SDB_ROW)
			json_array_append_new(a, json_pack("{s:s, s:s}", "id", store_col_text(st, 0) ?: "", "url",
							   store_col_text(st, 1) ?: ""));
	}
	sdb_finalize(st);
	pthread_mutex_unlock(&s->lock);
	if (rc != SDB_DONE) {
		json_decref(a);
		return NULL;
	}
	return a;
}
