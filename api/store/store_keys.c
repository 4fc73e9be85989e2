/* store_keys: the store's customers (and their quotas and usage), API keys
 * and registered hosts.
 *
 * Keys: only SHA-256(key) is stored. Every key row is loaded at open into an
 * in-memory table (s->keys, under its own rwlock) that store_key_check reads
 * without touching SQLite; create and revoke update table and database
 * together. This process is the database's only writer, so the table cannot
 * go stale. */
#include "store_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "clock.h"
#include "quota.h"

#define KEY_SECRET_BYTES 32
#define KEY_MAX_LEN 256

enum keys_stmt {
	K_CUST_INSERT, K_CUST_QUOTA, K_CUST_SET_QUOTA, K_CUST_GET,
	K_KEY_INSERT, K_KEY_REVOKE, K_KEY_GET,
	K_HOST_HB, K_HOST_LIST, K_HOST_LOST,
	K_USAGE_QUEUED, K_USAGE_SESS,
	K_CUST_LIST, K_KEY_LIST,
	K_COUNT
};

static const char *const keys_sql[K_COUNT] = {
	[K_CUST_INSERT] = "INSERT INTO customers(id, name, quotas, created_ms) VALUES (?1, ?2, ?3, ?4)",
	[K_CUST_QUOTA] = "SELECT quotas FROM customers WHERE id = ?1",
	[K_CUST_SET_QUOTA] = "UPDATE customers SET quotas = ?1 WHERE id = ?2",
	[K_CUST_GET] = "SELECT id, name, created_ms, quotas FROM customers WHERE id = ?1",
	[K_KEY_INSERT] = "INSERT INTO keys(id, customer, admin, hash, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
	[K_KEY_REVOKE] = "UPDATE keys SET revoked_ms = coalesce(revoked_ms, ?1) WHERE id = ?2",
	[K_KEY_GET] = "SELECT id, customer, admin, hash, revoked_ms FROM keys",
	[K_HOST_HB] = "INSERT INTO hosts(id, url, capacity, last_heartbeat_ms, registered_ms, lost)"
		      " VALUES (?1, ?2, ?3, ?4, ?4, 0) ON CONFLICT(id) DO UPDATE SET url = excluded.url,"
		      " capacity = excluded.capacity, last_heartbeat_ms = excluded.last_heartbeat_ms, lost = 0",
	[K_HOST_LIST] = "SELECT id, url, capacity, last_heartbeat_ms, registered_ms, lost, drain, drain_deadline_ms"
			" FROM hosts ORDER BY id",
	[K_HOST_LOST] = "UPDATE hosts SET lost = ?1 WHERE id = ?2",
	[K_USAGE_QUEUED] = "SELECT count(*) FROM tasks WHERE customer = ?1 AND state = 'queued'",
	[K_USAGE_SESS] = "SELECT coalesce(sum(CASE WHEN state IN ('starting', 'running', 'pausing', 'resuming')"
			 " THEN 1 ELSE 0 END), 0),"
			 " coalesce(sum(CASE WHEN state = 'paused' THEN 1 ELSE 0 END), 0) FROM sessions WHERE customer = ?1",
	[K_CUST_LIST] = "SELECT id, name, created_ms, quotas FROM customers WHERE id > ?1 ORDER BY id LIMIT ?2",
	[K_KEY_LIST] = "SELECT id, created_ms, revoked_ms FROM keys WHERE customer = ?1 ORDER BY created_ms, id",
};

_Static_assert(STORE_SLOTS_KEYS + K_COUNT <= STORE_SLOTS_TASKS, "store_keys.c's statements overflow their slots");

static struct sdb_stmt *stmt(struct store *s, enum keys_stmt id)
{
	return store_stmt(s, STORE_SLOTS_KEYS + id, keys_sql[id]);
}

/* Run statement id, an insert with ?1..?3 = t1..t3 and ?4 = the wall clock
 * in ms (a new customer, a host's heartbeat): SDB_DONE or the error code
 * (SDB_CONSTRAINT: the row exists). Takes the lock. With relaxed, its
 * commit does not wait for the disk (sdb_durable). */
static int insert_now_as(struct store *s, enum keys_stmt id, const char *t1, const char *t2, const char *t3,
			 int relaxed)
{
	struct sdb_stmt *st;
	int rc = SDB_ERROR;

	pthread_mutex_lock(&s->lock);
	if (relaxed)
		relaxed = sdb_durable(s->db, 0) == 0;
	st = stmt(s, id);
	if (st) {
		sdb_bind_text(st, 1, t1);
		sdb_bind_text(st, 2, t2);
		sdb_bind_text(st, 3, t3);
		sdb_bind_int64(st, 4, clock_wall_ms());
		rc = store_step(s, st);
		sdb_reset(st);
	}
	if (relaxed && sdb_durable(s->db, 1) < 0)
		fprintf(stderr, "kiln-api: the store's commits may not be durable now: %s\n", sdb_errmsg(s->db));
	pthread_mutex_unlock(&s->lock);
	return rc;
}

static int insert_now(struct store *s, enum keys_stmt id, const char *t1, const char *t2, const char *t3)
{
	return insert_now_as(s, id, t1, t2, t3, 0);
}

static int insert_now_relaxed(struct store *s, enum keys_stmt id, const char *t1, const char *t2, const char *t3)
{
	return insert_now_as(s, id, t1, t2, t3, 1);
}

/* ---- customers ---- */

int store_customer_create(struct store *s, const char *id, const char *name, const struct quota *q,
			  struct kiln_err *err)
{
	json_t *qj = quota_to_json(q);
	char *qs = json_dumps(qj, JSON_COMPACT);
	int rc;

	json_decref(qj);
	if (!qs)
		return kiln_err_set(err, KERR_INTERNAL, "out of memory");
	rc = insert_now(s, K_CUST_INSERT, id, name, qs);
	free(qs);
	if (rc == SDB_CONSTRAINT)
		return kiln_err_set(err, KERR_DUPLICATE, "a customer with the id \"%s\" exists", id);
	if (rc != SDB_DONE)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot create the customer");
	return 0;
}

int store_customer_quota_locked(struct store *s, const char *id, struct quota *q)
{
	struct sdb_stmt *st = stmt(s, K_CUST_QUOTA);
	int r = -ENOENT, rc;

	if (!st)
		return -EIO;
	sdb_bind_text(st, 1, id);
	/* No row is -ENOENT only when the query ran: a database that went away
	 * meanwhile is -EIO (a 503, not "no such customer"). */
	rc = sdb_step(st);
	if (rc != SDB_ROW && rc != SDB_DONE)
		r = -EIO;
	if (rc == SDB_ROW) {
		const char *t = store_col_text(st, 0);
		json_t *j = json_loads(t ? t : "", 0, NULL);

		/* Stored quotas are complete; a quota added by a later version
		 * that a row lacks takes its built-in default. */
		quota_defaults(q);
		r = j && quota_from_json(j, "", q, NULL) == 0 ? 0 : -EIO;
		json_decref(j);
	}
	sdb_reset(st);
	return r;
}

int store_customer_quota(struct store *s, const char *id, struct quota *q)
{
	int r;

	pthread_mutex_lock(&s->lock);
	r = store_customer_quota_locked(s, id, q);
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_customer_set_quota(struct store *s, const char *id, const struct quota *q, struct kiln_err *err)
{
	json_t *qj = quota_to_json(q);
	char *qs = json_dumps(qj, JSON_COMPACT);
	struct sdb_stmt *st;
	int n = -1;

	json_decref(qj);
	if (!qs)
		return kiln_err_set(err, KERR_INTERNAL, "out of memory");
	pthread_mutex_lock(&s->lock);
	st = stmt(s, K_CUST_SET_QUOTA);
	if (st) {
		sdb_bind_text(st, 1, qs);
		sdb_bind_text(st, 2, id);
		n = store_update_locked(s, st);
	}
	pthread_mutex_unlock(&s->lock);
	free(qs);
	if (n < 0)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot update the quotas");
	if (!n) {
		kiln_err_set(err, KERR_NOT_FOUND, "no customer \"%s\"", id);
		return -ENOENT;
	}
	return 0;
}

static int customer_row_json(struct sdb_stmt *st, void *arg)
{
	const char *q = store_col_text(st, 3);

	*(json_t **)arg = json_pack("{s:s, s:s, s:I, s:o?}", "id", store_col_text(st, 0), "name",
				    store_col_text(st, 1), "created_at", (json_int_t)sdb_col_int64(st, 2),
				    "quotas", json_loads(q ? q : "", 0, NULL));
	return 0;
}

json_t *store_customer_json(struct store *s, const char *id)
{
	json_t *j = NULL;

	store_row_by_id(s, STORE_SLOTS_KEYS + K_CUST_GET, keys_sql[K_CUST_GET], id, NULL, 0, customer_row_json, &j);
	return j;
}

json_t *store_customer_list(struct store *s, const char *after, unsigned limit)
{
	json_t *arr = json_array(), *j;
	struct sdb_stmt *st;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, K_CUST_LIST);
	if (st) {
		sdb_bind_text(st, 1, after ? after : "");
		sdb_bind_int64(st, 2, (int64_t)limit);
		while (store_step(s, st) == SDB_ROW) {
			j = NULL;
			customer_row_json(st, &j);
			if (j)
				json_array_append_new(arr, j);
		}
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return arr;
}

json_t *store_key_list(struct store *s, const char *customer)
{
	json_t *arr = json_array();
	struct sdb_stmt *st;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, K_KEY_LIST);
	if (st) {
		sdb_bind_text(st, 1, customer);
		while (store_step(s, st) == SDB_ROW) {
			json_t *k = json_pack("{s:s, s:I}", "key_id", store_col_text(st, 0), "created_at",
					      (json_int_t)sdb_col_int64(st, 1));

			json_object_set_new(k, "revoked_at",
					    sdb_col_null(st, 2) ? json_null() : json_integer(sdb_col_int64(st, 2)));
			json_array_append_new(arr, k);
		}
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return arr;
}

int store_customer_usage(struct store *s, const char *customer, struct usage *u)
{
	struct sdb_stmt *st;
	int r = -EIO;

	memset(u, 0, sizeof(*u));
	pthread_mutex_lock(&s->lock);
	r = store_running_usage_locked(s, customer, u);
	st = r == 0 ? stmt(s, K_USAGE_QUEUED) : NULL;
	if (st) {
		sdb_bind_text(st, 1, customer);
		r = -EIO;
		if (store_step(s, st) == SDB_ROW) {
			u->queued = (unsigned)sdb_col_int64(st, 0);
			r = 0;
		}
		sdb_reset(st);
	}
	st = r == 0 ? stmt(s, K_USAGE_SESS) : NULL;
	if (st) {
		sdb_bind_text(st, 1, customer);
		r = -EIO;
		if (store_step(s, st) == SDB_ROW) {
			u->sessions = (unsigned)sdb_col_int64(st, 0);
			u->paused_sessions = (unsigned)sdb_col_int64(st, 1);
			r = 0;
		}
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
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

/* Every row of st (K_KEY_GET, from stmt()) into the key table of into,
 * then reset st: 0, -ENOMEM, or -EIO (the step failed). Lock held. */
static int key_rows(struct sdb_stmt *st, struct store *into)
{
	int rc, r = 0;

	while ((rc = sdb_step(st)) == SDB_ROW) {
		struct key_entry e = { .admin = sdb_col_int(st, 2), .revoked = !sdb_col_null(st, 4) };

		if (sdb_col_bytes(st, 3) != SHA256_DIGEST_LENGTH)
			continue;
		memcpy(e.hash, sdb_col_blob(st, 3), SHA256_DIGEST_LENGTH);
		store_copy_col(st, 0, e.key_id, sizeof(e.key_id));
		store_copy_col(st, 1, e.customer, sizeof(e.customer));
		if (key_table_add(into, &e) < 0) {
			r = -ENOMEM;
			break;
		}
	}
	sdb_reset(st);
	return r ? r : rc == SDB_DONE ? 0 : -EIO;
}

int store_keys_load(struct store *s, struct kiln_err *err)
{
	struct sdb_stmt *st = stmt(s, K_KEY_GET);
	int r;

	if (!st)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot read keys");
	r = key_rows(st, s);
	if (r == -ENOMEM)
		return kiln_err_set(err, KERR_STORE_ERROR, "out of memory");
	return r ? kiln_err_set(err, KERR_STORE_ERROR, "reading keys: %s", sdb_errmsg(s->db)) : 0;
}

int store_key_create(struct store *s, const char *customer, int admin, char **key_out, char key_id_out[32],
		     struct kiln_err *err)
{
	unsigned char idb[8], secret[KEY_SECRET_BYTES];
	char id[17], sec[64], *key;
	struct key_entry e = { .admin = admin ? 1 : 0 };
	struct sdb_stmt *st;
	int rc = SDB_ERROR;

	*key_out = NULL;
	if (store_random(idb, sizeof(idb)) < 0 || store_random(secret, sizeof(secret)) < 0)
		return kiln_err_set(err, KERR_INTERNAL, "no randomness: %s", strerror(errno));
	store_hex(idb, sizeof(idb), id);
	base64url(secret, sizeof(secret), sec);
	OPENSSL_cleanse(secret, sizeof(secret));
	if (asprintf(&key, "kiln_%s_%s", id, sec) < 0)
		return kiln_err_set(err, KERR_INTERNAL, "out of memory");
	OPENSSL_cleanse(sec, sizeof(sec));
	SHA256((const unsigned char *)key, strlen(key), e.hash);
	snprintf(e.key_id, sizeof(e.key_id), "%s", id);
	snprintf(e.customer, sizeof(e.customer), "%s", customer ? customer : "");

	pthread_mutex_lock(&s->lock);
	st = stmt(s, K_KEY_INSERT);
	if (st) {
		sdb_bind_text(st, 1, id);
		if (customer)
			sdb_bind_text(st, 2, customer);
		sdb_bind_int64(st, 3, e.admin);
		sdb_bind_blob(st, 4, e.hash, sizeof(e.hash));
		sdb_bind_int64(st, 5, clock_wall_ms());
		rc = sdb_step(st);
		sdb_reset(st);
	}
	if (rc == SDB_DONE) {
		pthread_rwlock_wrlock(&s->keys_lock);
		if (key_table_add(s, &e) < 0)
			rc = SDB_ERROR;
		pthread_rwlock_unlock(&s->keys_lock);
	}
	pthread_mutex_unlock(&s->lock);
	if (rc != SDB_DONE) {
		OPENSSL_cleanse(key, strlen(key));
		free(key);
		if (rc == SDB_CONSTRAINT)
			return kiln_err_set(err, KERR_NOT_FOUND, "no customer \"%s\"", customer ? customer : "");
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot store the key");
	}
	*key_out = key;
	snprintf(key_id_out, 32, "%s", id);
	store_changed(s, id, "key", NULL); /* other replicas reload their tables */
	return 0;
}

int store_key_revoke(struct store *s, const char *key_id)
{
	int n;

	pthread_mutex_lock(&s->lock);
	n = store_stamp_locked(s, stmt(s, K_KEY_REVOKE), key_id);
	if (n > 0) {
		pthread_rwlock_wrlock(&s->keys_lock);
		for (size_t i = 0; i < s->keys_cap; i++)
			if (s->keys[i].used && !strcmp(s->keys[i].key_id, key_id))
				s->keys[i].revoked = 1;
		pthread_rwlock_unlock(&s->keys_lock);
	}
	pthread_mutex_unlock(&s->lock);
	if (n < 0)
		return -EIO;
	if (n)
		store_changed(s, key_id, "key", NULL); /* other replicas reload their tables */
	return n ? 0 : -ENOENT;
}

int store_keys_reload(struct store *s)
{
	struct store fresh = { 0 }; /* only its key table is used */
	struct sdb_stmt *st;
	int r;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, K_KEY_GET);
	r = st ? key_rows(st, &fresh) : -EIO;
	pthread_mutex_unlock(&s->lock);
	if (r < 0) {
		free(fresh.keys);
		return -1;
	}
	pthread_rwlock_wrlock(&s->keys_lock);
	free(s->keys);
	s->keys = fresh.keys;
	s->keys_cap = fresh.keys_cap;
	s->keys_n = fresh.keys_n;
	pthread_rwlock_unlock(&s->keys_lock);
	return 0;
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

/* ---- hosts ---- */

int store_host_heartbeat(struct store *s, const char *host_id, const char *url, json_t *capacity,
			 struct kiln_err *err)
{
	char *cap = capacity ? json_dumps(capacity, JSON_COMPACT) : strdup("{}");
	int rc;

	if (!cap)
		return kiln_err_set(err, KERR_INTERNAL, "out of memory");
	/* Not a promise: the next heartbeat repeats it, so its commit does not
	 * wait for the disk (issue 43: with 1,000 hosts, one fsync'd commit per
	 * heartbeat on the replica's one connection left no time for the rest). */
	rc = insert_now_relaxed(s, K_HOST_HB, host_id, url, cap);
	free(cap);
	return rc == SDB_DONE ? 0 : kiln_err_set(err, KERR_STORE_ERROR, "cannot record the heartbeat");
}

json_t *store_host_list(struct store *s)
{
	json_t *arr = json_array();
	struct sdb_stmt *st;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, K_HOST_LIST);
	if (st) {
		while (store_step(s, st) == SDB_ROW) {
			const char *cap = store_col_text(st, 2);
			json_t *c = cap ? json_loads(cap, 0, NULL) : NULL, *h;
			/* Drained by an admin (the row) or by kiln-host drain (its
			 * heartbeat): either way it takes no new work. */
			int host_drain = json_is_true(json_object_get(c, "draining"));
			int drain = sdb_col_int(st, 6) || host_drain;
			int64_t deadline = sdb_col_null(st, 7) ? 0 : sdb_col_int64(st, 7);

			if (!deadline && host_drain)
				deadline = json_integer_value(json_object_get(c, "drain_deadline_ms"));
			h = json_pack("{s:s, s:s, s:o, s:I, s:I, s:s, s:b}", "id", store_col_text(st, 0), "url",
				      store_col_text(st, 1), "capacity", c ? c : json_object(), "last_heartbeat_ms",
				      (json_int_t)sdb_col_int64(st, 3), "registered_ms", (json_int_t)sdb_col_int64(st, 4),
				      "state", sdb_col_int(st, 5) ? "lost" : drain ? "draining" : "live", "draining", drain);
			if (h && drain && deadline > 0)
				json_object_set_new(h, "drain_deadline_ms", json_integer((json_int_t)deadline));
			if (h)
				json_array_append_new(arr, h);
		}
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return arr;
}

int store_host_set_lost(struct store *s, const char *host_id, int lost)
{
	struct sdb_stmt *st;
	int n = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, K_HOST_LOST);
	if (st) {
		sdb_bind_int64(st, 1, lost ? 1 : 0);
		sdb_bind_text(st, 2, host_id);
		n = store_update_locked(s, st);
	}
	pthread_mutex_unlock(&s->lock);
	if (n < 0)
		return -EIO;
	return n ? 0 : -ENOENT;
}

int store_host_set_drain(struct store *s, const char *host_id, int drain, int64_t deadline_ms)
{
	struct sdb_stmt *st = NULL;
	int n = -1;

	/* An admin's call, seldom: a statement of its own, not a slot. */
	pthread_mutex_lock(&s->lock);
	if (sdb_prepare(s->db, "UPDATE hosts SET drain = ?1, drain_deadline_ms = ?2 WHERE id = ?3", &st) == 0) {
		sdb_bind_int64(st, 1, drain ? 1 : 0);
		if (drain && deadline_ms > 0)
			sdb_bind_int64(st, 2, deadline_ms);
		else
			sdb_bind_null(st, 2);
		sdb_bind_text(st, 3, host_id);
		n = store_update_locked(s, st);
	}
	sdb_finalize(st);
	pthread_mutex_unlock(&s->lock);
	if (n < 0)
		return -EIO;
	return n ? 0 : -ENOENT;
}

int store_host_load(struct store *s, const char *host_id, unsigned *tasks, unsigned *sessions)
{
	struct sdb_stmt *st = NULL;
	int rc = SDB_ERROR;

	*tasks = *sessions = 0;
	pthread_mutex_lock(&s->lock);
	if (sdb_prepare(s->db, "SELECT (SELECT count(*) FROM tasks WHERE host_id = ?1"
			       " AND state IN ('scheduled', 'starting', 'running', 'uploading')),"
			       " (SELECT count(*) FROM sessions WHERE host_id = ?1"
			       " AND state IN ('starting', 'running', 'pausing', 'resuming'))", &st) == 0) {
		sdb_bind_text(st, 1, host_id);
		rc = store_step(s, st);
		if (rc == SDB_ROW) {
			*tasks = (unsigned)sdb_col_int64(st, 0);
			*sessions = (unsigned)sdb_col_int64(st, 1);
		}
	}
	sdb_finalize(st);
	pthread_mutex_unlock(&s->lock);
	return rc == SDB_ROW ? 0 : -EIO;
}

/* ---- the running quota's check (the usage and the lock are store.c's) ---- */

int store_room_locked(struct store *s, const char *customer, unsigned vcpus, unsigned memory_mib, int missing_ok,
		      struct kiln_err *err)
{
	struct quota q;
	struct usage u = { 0 };

	if (store_lock_customer_locked(s, customer) < 0)
		return -EIO;
	if (store_customer_quota_locked(s, customer, &q) < 0) {
		if (!missing_ok)
			return -ENOENT;
		quota_defaults(&q); /* a row whose customer is gone still runs under the defaults */
	}
	if (store_running_usage_locked(s, customer, &u) < 0)
		return -EIO;
	return quota_check_start(&q, &u, vcpus, memory_mib, err) < 0 ? -EDQUOT : 0;
}
