/* store_open: the store's top piece: open (a SQLite file or a PostgreSQL
 * conninfo, migrated or checked, the key table loaded, the listener
 * started), the leader lock, liveness, close; and the listener's callback,
 * which brings other replicas' changes in (re-reading the key table when
 * keys changed). Everything under it is in store.c and the other pieces;
 * store.c's own file comment has the store's invariants. */
#include "store_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "condwait.h"

/* A notification from the listener's thread (payload NULL: it has just
 * (re)connected and may have missed some: re-read everything). */
static void on_notify(void *arg, const char *payload)
{
	struct store *s = arg;
	json_t *j, *d;
	const char *r, *id, *event;

	if (!payload) {
		store_keys_reload(s);
		store_wake_local(s, NULL, "resync", NULL, 1);
		return;
	}
	j = json_loads(payload, 0, NULL);
	r = json_string_value(json_object_get(j, "r"));
	id = json_string_value(json_object_get(j, "i"));
	event = json_string_value(json_object_get(j, "e"));
	d = json_object_get(j, "d");
	if (r && id && event && strcmp(r, s->nonce)) {
		if (!strcmp(event, "key")) {
			store_keys_reload(s);
		} else if (!strcmp(event, "queued")) {
			/* A batch of submissions: each a "state" change to queued. */
			json_t *ids = json_object_get(j, "ids"), *v;
			json_t *st = json_pack("{s:s, s:O}", "state", "queued", "at", json_object_get(j, "at"));
			size_t k;

			json_array_foreach(ids, k, v)
				if (json_is_string(v))
					store_wake_local(s, json_string_value(v), "state", st, 1);
			json_decref(st);
		} else {
			store_wake_local(s, id, event, d, 1);
		}
	}
	json_decref(j);
}

/* ---- open, close ---- */

/* PostgreSQL: the listener that brings other replicas' changes. */
static int store_listen_start(struct store *s, struct kiln_err *err)
{
	unsigned char rnd[8];

	if (sdb_kind(s->db) != SDB_PG)
		return 0;
	if (store_random(rnd, sizeof(rnd)) < 0)
		return kiln_err_set(err, KERR_STORE_ERROR, "no randomness");
	store_hex(rnd, sizeof(rnd), s->nonce);
	s->listen = sdb_listen(s->db, "kiln_changes", on_notify, s);
	if (!s->listen)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot start the postgresql listener");
	return 0;
}

/* The scheduler's advisory lock key: "kilnsched" folded to 63 bits. */
#define LEADER_KEY 0x6b696c6e73636864LL

int store_leader_start(struct store *s)
{
	if (sdb_kind(s->db) != SDB_PG || s->leader)
		return 0;
	s->leader = sdb_leader_start(s->db, LEADER_KEY);
	return s->leader ? 0 : -1;
}

int store_is_leader(struct store *s)
{
	if (sdb_kind(s->db) != SDB_PG)
		return 1;
	return s->leader && sdb_leader_is(s->leader);
}

/* A store on db (taken over, closed on failure): migrated with
 * migrate, else only checked to be at this kiln-api's schema version. */
static struct store *store_open_db(struct sdb *db, const char *what, int migrate, struct kiln_err *err)
{
	struct store *s;

	if (!db)
		return NULL;
	s = calloc(1, sizeof(*s));
	if (!s) {
		sdb_close(db);
		kiln_err_set(err, KERR_STORE_ERROR, "out of memory");
		return NULL;
	}
	s->db = db;
	pthread_mutex_init(&s->lock, NULL);
	pthread_rwlock_init(&s->keys_lock, NULL);
	pthread_mutex_init(&s->ch_lock, NULL);
	pthread_mutex_init(&s->gc_lock, NULL);
	pthread_cond_init(&s->gc_cond, NULL);
	condwait_init(&s->ch_cond);
	if (store_migrate(s->db, migrate, err) < 0 || store_keys_load(s, err) < 0 ||
	    store_listen_start(s, err) < 0) {
		if (err && strncmp(err->message, what, strlen(what))) {
			char m[sizeof(err->message)];

			snprintf(m, sizeof(m), "%s", err->message);
			kiln_err_set(err, KERR_STORE_ERROR, "%s: %s", what, m);
		}
		store_close(s);
		return NULL;
	}
	return s;
}

/* A PostgreSQL conninfo rather than a file name. */
static int is_pg(const char *target)
{
	return !strncmp(target, "postgresql://", 13) || !strncmp(target, "postgres://", 11);
}

struct store *store_open(const char *path, struct kiln_err *err)
{
	if (is_pg(path))
		return store_open_pg(path, err);
	return store_open_db(sdb_open_sqlite(path, err), path, 1, err);
}

struct store *store_open_pg(const char *conninfo, struct kiln_err *err)
{
	return store_open_db(sdb_open_pg(conninfo, err), "postgresql", 1, err);
}

int store_migrate_only(const char *target, int pg, struct kiln_err *err)
{
	struct sdb *db = pg || is_pg(target) ? sdb_open_pg(target, err) : sdb_open_sqlite(target, err);
	int r;

	if (!db)
		return -1;
	r = store_migrate(db, 1, err);
	sdb_close(db);
	return r;
}

int store_ping(struct store *s)
{
	int r;

	if (sdb_kind(s->db) == SDB_SQLITE)
		return 0;
	pthread_mutex_lock(&s->lock);
	r = sdb_ping(s->db);
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_down(struct store *s)
{
	int r;

	if (sdb_kind(s->db) == SDB_SQLITE)
		return 0;
	/* A racy read is fine: the flag is a hint, set and cleared under s->lock. */
	pthread_mutex_lock(&s->lock);
	r = sdb_down(s->db);
	pthread_mutex_unlock(&s->lock);
	if (r)
		r = store_ping(s) < 0; /* tries to reconnect, at most once a second */
	return r;
}

int store_is_pg(const struct store *s)
{
	return sdb_kind(s->db) == SDB_PG;
}

void store_close(struct store *s)
{
	if (!s)
		return;
	sdb_leader_stop(s->leader);
	sdb_listen_stop(s->listen);
	for (int i = 0; i < STORE_SLOTS_MAX; i++)
		sdb_finalize(s->st[i]);
	sdb_close(s->db);
	free(s->keys);
	pthread_mutex_destroy(&s->lock);
	pthread_rwlock_destroy(&s->keys_lock);
	pthread_mutex_destroy(&s->ch_lock);
	pthread_cond_destroy(&s->ch_cond);
	pthread_mutex_destroy(&s->gc_lock);
	pthread_cond_destroy(&s->gc_cond);
	free(s);
}
