/* test_store: kiln-api's SQLite store in a temporary directory: migrations
 * on a fresh and on an older database, keys (only hashes on disk, revoke,
 * the cache after a reopen), idempotency, compare-and-set transitions and
 * the quota-checked schedule, fair queue order, list pagination, usage,
 * cancel, hosts, change notification, and that a close/reopen keeps all.
 * The pieces' shared helpers (store_int.h): the page helper behind both the
 * task and the session lists (cursor and limit edges), the compare-and-set
 * helper behind both transitions, ids, the running-quota check; and the
 * session half: create under the quota, transitions, resume, discard, and
 * the leases replicas hold on sessions (two handles on one database); push's
 * one read of a task (store_task_push_get) and STORE_TX's release of the
 * lock and an open transaction on an early return; volumes (quota, names,
 * the one-writer rule with the session's insert, deletion refused while
 * mounted), and on PostgreSQL the one-writer rule and deletion raced
 * across two handles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include <libpq-fe.h>
#include <sqlite3.h>

#include "clock.h"
#include "quota.h"
#include "store.h"
#include "store_int.h"

static char dir[] = "/tmp/kiln-test-store.XXXXXX";
static char path[512];
static int seq;
/* The second round: every test again on PostgreSQL (scripts/pg-local.sh in
 * dir/pg), each in a database of its own; path is then its URI. */
static int pg, pg_up;
static char pg_dir[300];

/* Run one statement on PostgreSQL's maintenance database: 0 or -1. */
static int pg_admin(const char *stmt)
{
	char uri[512];
	PGconn *c;
	PGresult *r;
	int ok;

	snprintf(uri, sizeof(uri), "postgresql:///postgres?host=%s&user=kiln", pg_dir);
	c = PQconnectdb(uri);
	r = PQexec(c, stmt);
	ok = PQresultStatus(r) == PGRES_COMMAND_OK;
	if (!ok)
		fprintf(stderr, "%s: %s", stmt, PQerrorMessage(c));
	PQclear(r);
	PQfinish(c);
	return ok ? 0 : -1;
}

/* A fresh database for the next test, in the round pg says. */
static int fresh(void)
{
	char q[100];

	if (!pg) {
		snprintf(path, sizeof(path), "%s/api-%d.db", dir, ++seq);
		return 0;
	}
	snprintf(q, sizeof(q), "CREATE DATABASE t%d", ++seq);
	if (pg_admin(q) < 0)
		return -1;
	snprintf(path, sizeof(path), "postgresql:///t%d?host=%s&user=kiln", seq, pg_dir);
	return 0;
}

static int setup(void **state)
{
	pg = 0;
	return fresh();
}

static struct store *open_ok(void)
{
	struct kiln_err err = { .code = "" };
	struct store *s;

	if (pg && !pg_up) {
		print_message("skipped: the PostgreSQL pass needs initdb and postgres (scripts/deps.sh: postgresql), "
			      "which did not start (see above)\n");
		skip();
	}
	s = store_open(path, &err);
	if (!s)
		fail_msg("store_open(%s): %s", path, err.message);
	return s;
}

static void customer(struct store *s, const char *id, const struct quota *q)
{
	struct kiln_err err = { .code = "" };
	struct quota d;

	quota_defaults(&d);
	if (store_customer_create(s, id, id, q ? q : &d, &err) != 0)
		fail_msg("customer %s: %s", id, err.message);
}

static void submit(struct store *s, const char *cust, char id[40])
{
	struct kiln_err err = { .code = "" };

	if (store_task_insert(s, cust, "{\"argv\":[\"true\"]}", NULL, 1, 256, NULL, "h", id, &err) != 0)
		fail_msg("insert: %s", err.message);
}

/* Is needle anywhere in the file's bytes? */
static int file_contains(const char *file, const char *needle)
{
	FILE *f = fopen(file, "rb");
	size_t n = strlen(needle), len;
	char *buf;
	int found = 0;

	if (!f)
		return 0;
	buf = malloc(64 << 20);
	assert_non_null(buf);
	len = fread(buf, 1, 64 << 20, f);
	fclose(f);
	for (size_t i = 0; i + n <= len && !found; i++)
		found = !memcmp(buf + i, needle, n);
	free(buf);
	return found;
}

static void sql(const char *stmt)
{
	sqlite3 *db;
	char *msg = NULL;

	if (pg) {
		PGconn *c = PQconnectdb(path);
		PGresult *r = PQexec(c, stmt);

		if (PQresultStatus(r) != PGRES_COMMAND_OK)
			fail_msg("%s: %s", stmt, PQerrorMessage(c));
		PQclear(r);
		PQfinish(c);
		return;
	}

	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	if (sqlite3_exec(db, stmt, NULL, NULL, &msg) != SQLITE_OK)
		fail_msg("%s: %s", stmt, msg);
	sqlite3_close(db);
}

static int sql_int(const char *q)
{
	sqlite3 *db;
	sqlite3_stmt *st;
	int v = -1;

	if (pg) {
		PGconn *c = PQconnectdb(path);
		PGresult *r = PQexec(c, q);

		if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0)
			v = atoi(PQgetvalue(r, 0, 0));
		else if (PQresultStatus(r) != PGRES_TUPLES_OK)
			fprintf(stderr, "%s: %s", q, PQerrorMessage(c));
		PQclear(r);
		PQfinish(c);
		return v;
	}
	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(db, q, -1, &st, NULL), SQLITE_OK);
	if (sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_int(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(db);
	return v;
}

/* Whether the table or index exists. */
static int has_rel(const char *name)
{
	char q[200];

	snprintf(q, sizeof(q),
		 pg ? "SELECT count(*) FROM pg_class WHERE relname = '%s'" : "SELECT count(*) FROM sqlite_master WHERE name = '%s'",
		 name);
	return sql_int(q);
}

static void test_migrations(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *s = open_ok();
	struct quota q;

	assert_int_equal(store_schema_version(s), STORE_SCHEMA_VERSION);
	customer(s, "acme", NULL);
	store_close(s);
	if (!pg)
		assert_int_equal(sql_int("SELECT count(*) FROM pragma_journal_mode WHERE journal_mode = 'wal'"), 1);
	/* Make it a version-1 database (without migration 2's indexes, 3's
	 * sessions and 4's templates) and open it again: migrations 2 to 4 run,
	 * the data stays. */
	sql("DROP INDEX tasks_state; DROP INDEX tasks_customer_state; DROP TABLE sessions;"
	    " DROP TABLE templates; DROP TABLE template_uses; DROP TABLE template_gc; DROP TABLE build_usage;"
	    " DROP TABLE destinations; ALTER TABLE tasks DROP COLUMN destination; DROP TABLE submit_buckets;"
	    " DROP TABLE session_leases; DROP TABLE snapshots; DROP TABLE volumes; DROP TABLE volume_mounts;"
	    " ALTER TABLE hosts DROP COLUMN drain_deadline_ms; ALTER TABLE hosts DROP COLUMN drain;"
	    " DROP TABLE usage_minutes; UPDATE schema_version SET version = 1");
	assert_int_equal(has_rel("tasks_state"), 0);
	s = open_ok();
	assert_int_equal(store_schema_version(s), STORE_SCHEMA_VERSION);
	assert_int_equal(store_customer_quota(s, "acme", &q), 0);
	store_close(s);
	assert_int_equal(has_rel("tasks_state"), 1);
	assert_int_equal(has_rel("sessions"), 1);
	assert_int_equal(has_rel("templates"), 1);
	assert_int_equal(has_rel("destinations"), 1);
	assert_int_equal(has_rel("session_leases"), 1);
	assert_int_equal(has_rel("snapshots"), 1);
	assert_int_equal(has_rel("sessions_from_snapshot"), 1);
	assert_int_equal(has_rel("volumes"), 1);
	assert_int_equal(has_rel("volumes_name"), 1);
	assert_int_equal(has_rel("volume_mounts"), 1);
	assert_int_equal(has_rel("usage_minutes"), 1);
	assert_int_equal(sql_int(pg ? "SELECT count(*) FROM information_schema.columns WHERE table_name = 'tasks'"
				    " AND column_name = 'destination'"
				  : "SELECT count(*) FROM pragma_table_info('tasks') WHERE name = 'destination'"),
			 1);
	/* Migration 14's columns. */
	assert_int_equal(sql_int(pg ? "SELECT count(*) FROM information_schema.columns WHERE table_name = 'usage_minutes'"
				    " AND column_name IN ('egress_bytes', 'pause_bytes', 'template_bytes')"
				  : "SELECT count(*) FROM pragma_table_info('usage_minutes')"
				    " WHERE name IN ('egress_bytes', 'pause_bytes', 'template_bytes')"),
			 3);
	assert_int_equal(sql_int(pg ? "SELECT count(*) FROM information_schema.columns WHERE table_name = 'sessions'"
				    " AND column_name = 'pause_bytes'"
				  : "SELECT count(*) FROM pragma_table_info('sessions') WHERE name = 'pause_bytes'"),
			 1);
	assert_int_equal(sql_int("SELECT count(*) FROM schema_version"), 1);
	/* Opening twice more changes nothing; a host's drain (migration 12)
	 * outlives a reopen (a kiln-api restart). */
	s = open_ok();
	{
		json_t *cap = json_pack("{s:{s:i, s:i}}", "vcpus", "total", 4, "used", 0), *hosts;
		unsigned tasks = 9, sessions = 9;

		assert_int_equal(store_host_heartbeat(s, "h1", "http://h1", cap, &err), 0);
		json_decref(cap);
		assert_int_equal(store_host_set_drain(s, "h1", 1, 4102444800000), 0);
		assert_int_equal(store_host_set_drain(s, "h9", 1, 0), -ENOENT);
		store_close(s);
		s = open_ok();
		hosts = store_host_list(s);
		assert_string_equal(json_string_value(json_object_get(json_array_get(hosts, 0), "state")), "draining");
		assert_int_equal(json_integer_value(json_object_get(json_array_get(hosts, 0), "drain_deadline_ms")),
				 4102444800000);
		json_decref(hosts);
		assert_int_equal(store_host_load(s, "h1", &tasks, &sessions), 0);
		assert_int_equal(tasks + sessions, 0);
		assert_int_equal(store_host_set_drain(s, "h1", 0, 0), 0);
		hosts = store_host_list(s);
		assert_string_equal(json_string_value(json_object_get(json_array_get(hosts, 0), "state")), "live");
		assert_null(json_object_get(json_array_get(hosts, 0), "drain_deadline_ms"));
		json_decref(hosts);
	}
	store_close(s);
	assert_int_equal(sql_int("SELECT version FROM schema_version"), STORE_SCHEMA_VERSION);
	/* A database from a newer kiln-api is refused, not "migrated". */
	sql("UPDATE schema_version SET version = 99");
	assert_null(store_open(path, &err));
	assert_non_null(strstr(err.message, "newer"));
}

static void test_keys(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *s = open_ok();
	char *k1, *k2, *adm, kid1[32], kid2[32], kida[32], cust[65], wal[300], bad[200];
	const char *secret;
	int admin = -1;

	customer(s, "acme", NULL);
	assert_int_equal(store_key_create(s, "acme", 0, &k1, kid1, &err), 0);
	assert_int_equal(store_key_create(s, "acme", 0, &k2, kid2, &err), 0);
	assert_int_equal(store_key_create(s, NULL, 1, &adm, kida, &err), 0);
	/* kiln_<id>_<secret>: 32 random bytes of base64url. */
	assert_int_equal(strncmp(k1, "kiln_", 5), 0);
	assert_int_equal(strncmp(k1 + 5, kid1, strlen(kid1)), 0);
	secret = k1 + 5 + strlen(kid1) + 1;
	assert_int_equal(strlen(secret), 43);
	assert_string_not_equal(k1, k2);
	assert_int_equal(store_key_check(s, k1, cust, &admin), 1);
	assert_string_equal(cust, "acme");
	assert_int_equal(admin, 0);
	assert_int_equal(store_key_check(s, adm, cust, &admin), 1);
	assert_int_equal(admin, 1);
	/* Unknown, truncated, or one character off: refused. */
	snprintf(bad, sizeof(bad), "%s", k1);
	bad[strlen(bad) - 1] ^= 1;
	assert_int_equal(store_key_check(s, bad, cust, &admin), 0);
	bad[strlen(bad) - 1] = '\0';
	assert_int_equal(store_key_check(s, bad, cust, &admin), 0);
	assert_int_equal(store_key_check(s, "", cust, &admin), 0);
	free(k2);
	/* A key for no customer is refused. */
	assert_int_equal(store_key_create(s, "nobody", 0, &k2, kid2, &err) < 0, 1);
	assert_null(k2);
	/* Revoke: at once, twice is fine, unknown ids are -ENOENT. */
	assert_int_equal(store_key_revoke(s, kid1), 0);
	assert_int_equal(store_key_revoke(s, kid1), 0);
	assert_int_equal(store_key_revoke(s, "nope"), -ENOENT);
	assert_int_equal(store_key_check(s, k1, cust, &admin), 0);
	/* The admin's lists (GET /v1/admin/customers, .../keys): customers by
	 * id from a cursor; a customer's keys, revoked ones marked, no secret. */
	customer(s, "beta", NULL);
	json_t *l = store_customer_list(s, NULL, 10);
	char *dump;
	size_t i;
	json_t *k;
	int n_revoked = 0;

	assert_int_equal(json_array_size(l), 2);
	assert_string_equal(json_string_value(json_object_get(json_array_get(l, 0), "id")), "acme");
	assert_non_null(json_object_get(json_array_get(l, 0), "quotas"));
	json_decref(l);
	l = store_customer_list(s, "acme", 10);
	assert_int_equal(json_array_size(l), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(l, 0), "id")), "beta");
	json_decref(l);
	l = store_customer_list(s, NULL, 1);
	assert_int_equal(json_array_size(l), 1);
	json_decref(l);
	l = store_key_list(s, "acme");
	assert_int_equal(json_array_size(l), 2);
	json_array_foreach(l, i, k) {
		assert_null(json_object_get(k, "hash"));
		if (!strcmp(json_string_value(json_object_get(k, "key_id")), kid1)) {
			assert_true(json_is_integer(json_object_get(k, "revoked_at")));
			n_revoked++;
		} else {
			assert_true(json_is_null(json_object_get(k, "revoked_at")));
		}
	}
	assert_int_equal(n_revoked, 1);
	dump = json_dumps(l, 0);
	assert_null(strstr(dump, secret));
	free(dump);
	json_decref(l);
	l = store_key_list(s, "beta");
	assert_int_equal(json_array_size(l), 0);
	json_decref(l);
	store_close(s);
	/* Only hashes on disk: the secret is in neither the database nor its WAL. */
	snprintf(wal, sizeof(wal), "%s-wal", path);
	if (!pg) {
		assert_false(file_contains(path, secret));
		assert_false(file_contains(wal, secret));
	} else {
		char q[200];

		snprintf(q, sizeof(q), "SELECT count(*) FROM keys WHERE position('%s' in encode(hash, 'escape')) > 0",
			 secret);
		assert_int_equal(sql_int(q), 0);
	}
	assert_int_equal(sql_int("SELECT count(*) FROM keys WHERE length(hash) = 32"), 3);
	/* After a reopen the cache is rebuilt from the rows. */
	s = open_ok();
	assert_int_equal(store_key_check(s, k1, cust, &admin), 0);
	assert_int_equal(store_key_check(s, adm, cust, &admin), 1);
	assert_int_equal(admin, 1);
	store_close(s);
	free(k1);
	free(adm);
}

static void test_idempotency(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *s = open_ok();
	char a[40], b[40], c[40], d[40];

	customer(s, "acme", NULL);
	customer(s, "beta", NULL);
	assert_int_equal(store_task_insert(s, "acme", "{}", NULL, 1, 256, "k1", "hash1", a, &err), 0);
	assert_int_equal(strncmp(a, "t_", 2), 0);
	/* Same key, same body: the same task, nothing inserted. */
	assert_int_equal(store_task_insert(s, "acme", "{}", NULL, 1, 256, "k1", "hash1", b, &err), 1);
	assert_string_equal(a, b);
	assert_int_equal(store_task_idem_find(s, "acme", "k1", "hash1", c, &err), 1);
	assert_string_equal(a, c);
	/* Same key, another body: a conflict naming the task. */
	assert_int_equal(store_task_insert(s, "acme", "{}", NULL, 1, 256, "k1", "hash2", b, &err), -1);
	assert_string_equal(err.code, "idempotency_conflict");
	assert_int_equal(store_task_idem_find(s, "acme", "k1", "hash2", c, &err), -1);
	/* Keys are per customer. */
	assert_int_equal(store_task_insert(s, "beta", "{}", NULL, 1, 256, "k1", "hash2", d, &err), 0);
	assert_string_not_equal(a, d);
	assert_int_equal(store_task_idem_find(s, "acme", "k2", "hash1", c, &err), 0);
	assert_int_equal(sql_int("SELECT count(*) FROM tasks"), 2);
	store_close(s);
}

static void test_transitions(void **state)
{
	struct store *s = open_ok();
	struct quota q;
	char a[40], b[40];
	enum task_state st;
	json_t *j;
	char *spec;

	quota_defaults(&q);
	q.max_running = 1;
	customer(s, "acme", &q);
	submit(s, "acme", a);
	submit(s, "acme", b);
	spec = store_task_spec(s, a);
	assert_string_equal(spec, "{\"argv\":[\"true\"]}");
	free(spec);
	/* Compare-and-set: from the wrong state nothing moves. */
	assert_int_equal(store_task_transition(s, a, TASK_RUNNING, TASK_SUCCEEDED, NULL), 0);
	assert_int_equal(store_task_schedule(s, a, "h1"), 1);
	assert_int_equal(store_task_schedule(s, a, "h1"), 0);
	/* b's customer has max_running 1 and a holds it. */
	assert_int_equal(store_task_schedule(s, b, "h1"), -EDQUOT);
	assert_int_equal(store_task_state(s, b, &st), 0);
	assert_int_equal(st, TASK_QUEUED);
	assert_int_equal(store_task_transition(s, a, TASK_SCHEDULED, TASK_STARTING, NULL), 1);
	assert_int_equal(store_task_transition(s, a, TASK_SCHEDULED, TASK_STARTING, NULL), 0);
	assert_int_equal(store_task_transition(s, a, TASK_STARTING, TASK_RUNNING, NULL), 1);
	assert_int_equal(store_task_transition(s, a, TASK_RUNNING, TASK_UPLOADING, NULL), 1);
	j = json_pack("{s:{s:i}, s:[{s:s, s:s}]}", "result", "exit_code", 0, "outputs", "path", "a.txt", "s3_key",
		      "acme/x/outputs/a.txt");
	assert_int_equal(store_task_finish(s, a, TASK_SUCCEEDED, "exited", j), 1);
	assert_int_equal(store_task_finish(s, a, TASK_FAILED, "exited", j), 0);
	json_decref(j);
	j = store_task_json(s, a, "acme");
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(j, "state")), "succeeded");
	assert_string_equal(json_string_value(json_object_get(j, "host")), "h1");
	assert_string_equal(json_string_value(json_object_get(j, "end_reason")), "exited");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "result"), "exit_code")), 0);
	assert_int_equal(json_array_size(json_object_get(j, "outputs")), 1);
	assert_true(json_is_integer(json_object_get(json_object_get(j, "timings"), "total_ms")));
	json_decref(j);
	/* Another customer sees nothing; no customer (admin) sees it. */
	assert_null(store_task_json(s, a, "beta"));
	j = store_task_json(s, a, NULL);
	assert_non_null(j);
	json_decref(j);
	/* Now b may start. Back to the queue (a lost host) forgets the host. */
	assert_int_equal(store_task_schedule(s, b, "h2"), 1);
	assert_int_equal(store_task_transition(s, b, TASK_SCHEDULED, TASK_QUEUED, NULL), 1);
	j = store_task_json(s, b, NULL);
	assert_true(json_is_null(json_object_get(j, "host")));
	json_decref(j);
	store_close(s);
}

static void test_fair_and_list(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *s = open_ok();
	struct store_task t[10];
	char a[5][40], b[40], *cursor = NULL, *next = NULL;
	json_t *page;
	int n;

	customer(s, "acme", NULL);
	customer(s, "beta", NULL);
	for (int i = 0; i < 3; i++)
		submit(s, "acme", a[i]);
	submit(s, "beta", b);
	submit(s, "acme", a[3]);
	submit(s, "acme", a[4]);
	/* Fair: each customer's oldest, then each one's second oldest, ... */
	n = store_tasks_queued_fair(s, t, 10);
	assert_int_equal(n, 6);
	assert_string_equal(t[0].id, a[0]);
	assert_string_equal(t[1].id, b);
	assert_string_equal(t[2].id, a[1]);
	assert_string_equal(t[3].id, a[2]);
	assert_int_equal(store_tasks_queued_fair(s, t, 2), 2);
	/* Oldest first by state. */
	n = store_tasks_in_state(s, TASK_QUEUED, t, 10);
	assert_int_equal(n, 6);
	assert_string_equal(t[0].id, a[0]);
	assert_string_equal(t[5].id, a[4]);

	/* acme's 5 tasks, 2 per page, newest first. */
	page = store_task_list(s, "acme", NULL, 2, NULL, &next, &err);
	assert_int_equal(json_array_size(page), 2);
	assert_string_equal(json_string_value(json_object_get(json_array_get(page, 0), "id")), a[4]);
	assert_string_equal(json_string_value(json_object_get(json_array_get(page, 1), "id")), a[3]);
	assert_non_null(next);
	json_decref(page);
	cursor = next;
	page = store_task_list(s, "acme", NULL, 2, cursor, &next, &err);
	free(cursor);
	assert_int_equal(json_array_size(page), 2);
	assert_string_equal(json_string_value(json_object_get(json_array_get(page, 0), "id")), a[2]);
	assert_string_equal(json_string_value(json_object_get(json_array_get(page, 1), "id")), a[1]);
	json_decref(page);
	cursor = next;
	page = store_task_list(s, "acme", NULL, 2, cursor, &next, &err);
	free(cursor);
	assert_int_equal(json_array_size(page), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(page, 0), "id")), a[0]);
	assert_null(next);
	json_decref(page);
	/* Exactly a page's worth: no next cursor. */
	page = store_task_list(s, "beta", NULL, 1, NULL, &next, &err);
	assert_int_equal(json_array_size(page), 1);
	assert_null(next);
	json_decref(page);
	/* By state. */
	assert_int_equal(store_task_cancel(s, a[1], "acme", NULL), STORE_CANCEL_DONE);
	page = store_task_list(s, "acme", "cancelled", 10, NULL, &next, &err);
	assert_int_equal(json_array_size(page), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(page, 0), "id")), a[1]);
	json_decref(page);
	/* Bad cursors are refused. */
	assert_null(store_task_list(s, "acme", NULL, 2, "x1", &next, &err));
	assert_string_equal(err.code, "invalid_request");
	assert_null(store_task_list(s, "acme", "bogus", 2, NULL, &next, &err));
	store_close(s);
}

static void test_usage_and_cancel(void **state)
{
	struct store *s = open_ok();
	struct store_task t[4];
	struct usage u;
	char a[4][40];
	enum task_state st;

	customer(s, "acme", NULL);
	for (int i = 0; i < 4; i++)
		submit(s, "acme", a[i]);
	assert_int_equal(store_customer_usage(s, "acme", &u), 0);
	assert_int_equal(u.queued, 4);
	assert_int_equal(u.running, 0);
	assert_int_equal(store_task_schedule(s, a[0], "h"), 1);
	assert_int_equal(store_task_schedule(s, a[1], "h"), 1);
	assert_int_equal(store_task_transition(s, a[1], TASK_SCHEDULED, TASK_STARTING, NULL), 1);
	assert_int_equal(store_task_transition(s, a[1], TASK_STARTING, TASK_RUNNING, NULL), 1);
	assert_int_equal(store_customer_usage(s, "acme", &u), 0);
	assert_int_equal(u.queued, 2);
	assert_int_equal(u.running, 2);
	assert_int_equal(u.vcpus, 2);
	assert_int_equal(u.memory_mib, 512);
	/* scheduled: cancelled at once; running: requested; final: too late;
	 * another customer's: not found. */
	assert_int_equal(store_task_cancel(s, a[0], "beta", NULL), STORE_CANCEL_NOT_FOUND);
	assert_int_equal(store_task_cancel(s, "t_nope", NULL, NULL), STORE_CANCEL_NOT_FOUND);
	assert_int_equal(store_task_cancel(s, a[0], "acme", &st), STORE_CANCEL_DONE);
	assert_int_equal(st, TASK_CANCELLED);
	assert_int_equal(store_task_cancel(s, a[0], "acme", &st), STORE_CANCEL_TOO_LATE);
	assert_int_equal(store_task_cancel(s, a[1], "acme", &st), STORE_CANCEL_REQUESTED);
	assert_int_equal(st, TASK_RUNNING);
	assert_int_equal(store_tasks_cancel_pending(s, t, 4), 1);
	assert_string_equal(t[0].id, a[1]);
	assert_int_equal(t[0].cancel_requested, 1);
	assert_int_equal(store_task_cancel_sent(s, a[1]), 0);
	assert_int_equal(store_tasks_cancel_pending(s, t, 4), 0);
	assert_int_equal(store_customer_usage(s, "acme", &u), 0);
	assert_int_equal(u.running, 1);
	store_close(s);
}

static void test_hosts_and_changes(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *s = open_ok();
	json_t *cap = json_pack("{s:{s:i}}", "vcpus", "total", 8), *hosts;
	uint64_t g;
	struct timespec ts;
	int64_t now;
	char a[40];

	assert_int_equal(store_host_heartbeat(s, "h1", "http://127.0.0.1:7070", cap, &err), 0);
	assert_int_equal(store_host_heartbeat(s, "h1", "http://127.0.0.1:7071", cap, &err), 0);
	json_decref(cap);
	hosts = store_host_list(s);
	assert_int_equal(json_array_size(hosts), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(hosts, 0), "url")), "http://127.0.0.1:7071");
	assert_string_equal(json_string_value(json_object_get(json_array_get(hosts, 0), "state")), "live");
	json_decref(hosts);
	assert_int_equal(store_host_set_lost(s, "h1", 1), 0);
	assert_int_equal(store_host_set_lost(s, "h9", 1), -ENOENT);
	hosts = store_host_list(s);
	assert_string_equal(json_string_value(json_object_get(json_array_get(hosts, 0), "state")), "lost");
	json_decref(hosts);

	/* Every committed state change bumps the counter; a wait without one
	 * times out. */
	customer(s, "acme", NULL);
	g = store_changes(s);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	assert_int_equal(store_wait_change(s, g, now + 50), 0);
	submit(s, "acme", a);
	assert_true(store_changes(s) > g);
	assert_int_equal(store_wait_change(s, g, now + 50), 1);
	g = store_changes(s);
	assert_int_equal(store_task_transition(s, a, TASK_RUNNING, TASK_FAILED, NULL), 0);
	assert_int_equal(store_changes(s), g);
	store_close(s);
}

static void test_durability(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *s = open_ok();
	char ids[20][40], *key, kid[32], cust[65];
	int admin;
	struct quota q;
	json_t *j;

	quota_defaults(&q);
	q.max_queued = 7;
	customer(s, "acme", &q);
	assert_int_equal(store_key_create(s, "acme", 0, &key, kid, &err), 0);
	for (int i = 0; i < 20; i++)
		submit(s, "acme", ids[i]);
	assert_int_equal(store_task_cancel(s, ids[3], NULL, NULL), STORE_CANCEL_DONE);
	store_close(s);
	s = open_ok();
	for (int i = 0; i < 20; i++) {
		j = store_task_json(s, ids[i], "acme");
		assert_non_null(j);
		assert_string_equal(json_string_value(json_object_get(j, "state")), i == 3 ? "cancelled" : "queued");
		json_decref(j);
	}
	assert_int_equal(store_key_check(s, key, cust, &admin), 1);
	assert_int_equal(store_customer_quota(s, "acme", &q), 0);
	assert_int_equal(q.max_queued, 7);
	q.max_queued = 9;
	assert_int_equal(store_customer_set_quota(s, "acme", &q, &err), 0);
	assert_int_equal(store_customer_set_quota(s, "nobody", &q, &err), -ENOENT);
	store_close(s);
	s = open_ok();
	assert_int_equal(store_customer_quota(s, "acme", &q), 0);
	assert_int_equal(q.max_queued, 9);
	store_close(s);
	free(key);
}

/* ---- the shared helpers (store_int.h) ---- */

static void test_cursor_parse(void **state)
{
	static const char *const bad[] = {
		"", "0", "-1", "+5", " 5", "5 ", "5x", "x5", "0x10", "99999999999999999999", "1.5",
	};
	int64_t before = 0;

	assert_int_equal(store_cursor_parse("1", &before), 0);
	assert_int_equal(before, 1);
	assert_int_equal(store_cursor_parse("9223372036854775807", &before), 0);
	assert_true(before == INT64_MAX);
	assert_int_equal(store_cursor_parse("0042", &before), 0);
	assert_int_equal(before, 42);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		before = 7;
		if (store_cursor_parse(bad[i], &before) != -EINVAL)
			fail_msg("cursor \"%s\" accepted", bad[i]);
		assert_int_equal(before, 7); /* untouched */
	}
}

static void test_names_and_ids(void **state)
{
	static const char *const names[] = { "a", "bb", "c" };
	char a[40], b[40];

	assert_int_equal(store_name_index(names, 3, "bb"), 1);
	assert_int_equal(store_name_index(names, 3, "d"), 3);
	assert_int_equal(store_name_index(names, 3, NULL), 3);
	assert_int_equal(task_state_parse(task_state_name(TASK_TIMED_OUT)), TASK_TIMED_OUT);
	assert_int_equal(task_state_parse("nope"), TASK_STATE_COUNT);
	assert_string_equal(task_state_name(TASK_STATE_COUNT), "unknown");
	assert_int_equal(session_state_parse(session_state_name(SESSION_RESUMING)), SESSION_RESUMING);
	assert_int_equal(session_state_parse("queued"), SESSION_STATE_COUNT);
	assert_string_equal(session_state_name(SESSION_STATE_COUNT), "unknown");
	assert_int_equal(store_new_id("t_", a), 0);
	assert_int_equal(store_new_id("t_", b), 0);
	assert_int_equal(strlen(a), 34);
	assert_int_equal(strncmp(a, "t_", 2), 0);
	assert_int_equal(strspn(a + 2, "0123456789abcdef"), 32);
	assert_string_not_equal(a, b);
}

/* The list's ids, in order, joined by spaces (into out). */
static void page_ids(json_t *page, char *out, size_t cap)
{
	size_t i, o = 0;
	json_t *v;

	out[0] = '\0';
	json_array_foreach(page, i, v)
		o += (size_t)snprintf(out + o, o < cap ? cap - o : 0, "%s%s", i ? " " : "",
				      json_string_value(json_object_get(v, "id")));
}

/* Walk the whole list limit at a time (tasks or sessions): the ids, newest
 * first, and the number of pages. */
static int walk(struct store *s, int sessions, const char *cust, const char *st, unsigned limit, char *out,
		size_t cap)
{
	struct kiln_err err = { .code = "" };
	char *cursor = NULL, *next = NULL, ids[1024];
	size_t o = 0;
	int pages = 0;

	out[0] = '\0';
	do {
		json_t *page = sessions ? store_session_list(s, cust, st, limit, cursor, &next, &err)
					: store_task_list(s, cust, st, limit, cursor, &next, &err);

		if (!page)
			fail_msg("list: %s", err.message);
		assert_true(json_array_size(page) <= limit);
		/* Only the last page may be short, and it has no cursor. */
		if (next)
			assert_int_equal(json_array_size(page), limit);
		page_ids(page, ids, sizeof(ids));
		if (*ids)
			o += (size_t)snprintf(out + o, cap - o, "%s%s", o ? " " : "", ids);
		json_decref(page);
		free(cursor);
		cursor = next;
		pages++;
	} while (cursor);
	return pages;
}

/* Limit and cursor edges, the same for both lists (one helper). */
static void page_edges(struct store *s, int sessions, char ids[][40], int n)
{
	struct kiln_err err = { .code = "" };
	char all[2048], got[2048], *next = (char *)1;
	json_t *page;

	/* Newest first. */
	all[0] = '\0';
	for (int i = n - 1; i >= 0; i--)
		snprintf(all + strlen(all), sizeof(all) - strlen(all), "%s%s", i == n - 1 ? "" : " ", ids[i]);
	for (unsigned limit = 1; limit <= (unsigned)n + 1; limit++) {
		int pages = walk(s, sessions, "acme", NULL, limit, got, sizeof(got));

		assert_string_equal(got, all);
		/* An exact multiple needs no empty page at the end. */
		assert_int_equal(pages, (n + (int)limit - 1) / (int)limit);
	}
	assert_int_equal(walk(s, sessions, "acme", NULL, STORE_PAGE_MAX, got, sizeof(got)), 1);
	assert_string_equal(got, all);
	/* Limits out of 1..1000 and cursors this API never gave out: refused,
	 * *next_cursor NULL. */
	static const unsigned bad_limits[] = { 0, STORE_PAGE_MAX + 1, 100000 };
	for (size_t i = 0; i < 3; i++) {
		page = sessions ? store_session_list(s, "acme", NULL, bad_limits[i], NULL, &next, &err)
				: store_task_list(s, "acme", NULL, bad_limits[i], NULL, &next, &err);
		assert_null(page);
		assert_null(next);
		assert_string_equal(err.code, "invalid_request");
		assert_non_null(strstr(err.message, "limit"));
	}
	static const char *const bad_cursors[] = { "", "0", "-3", "+3", "3a" };
	for (size_t i = 0; i < 5; i++) {
		page = sessions ? store_session_list(s, "acme", NULL, 2, bad_cursors[i], &next, &err)
				: store_task_list(s, "acme", NULL, 2, bad_cursors[i], &next, &err);
		assert_null(page);
		assert_string_equal(err.code, "invalid_request");
		assert_non_null(strstr(err.message, "cursor"));
	}
	/* A cursor below every row: an empty last page. */
	page = sessions ? store_session_list(s, "acme", NULL, 2, "1", &next, &err)
			: store_task_list(s, "acme", NULL, 2, "1", &next, &err);
	assert_non_null(page);
	assert_int_equal(json_array_size(page), 0);
	assert_null(next);
	json_decref(page);
	/* An unknown state is refused before the cursor is looked at. */
	page = sessions ? store_session_list(s, "acme", "bogus", 2, "x", &next, &err)
			: store_task_list(s, "acme", "bogus", 2, "x", &next, &err);
	assert_null(page);
	assert_non_null(strstr(err.message, "state"));
	/* Another customer's list is empty; no customer (admin) sees them all. */
	assert_int_equal(walk(s, sessions, "beta", NULL, 2, got, sizeof(got)), 1);
	assert_string_equal(got, "");
	walk(s, sessions, NULL, NULL, 3, got, sizeof(got));
	assert_string_equal(got, all);
}

static void test_task_page(void **state)
{
	struct store *s = open_ok();
	char ids[7][40], got[1024];

	customer(s, "acme", NULL);
	customer(s, "beta", NULL);
	for (int i = 0; i < 7; i++)
		submit(s, "acme", ids[i]);
	page_edges(s, 0, ids, 7);
	/* By state, across pages. */
	assert_int_equal(store_task_cancel(s, ids[1], NULL, NULL), STORE_CANCEL_DONE);
	assert_int_equal(store_task_cancel(s, ids[4], NULL, NULL), STORE_CANCEL_DONE);
	assert_int_equal(walk(s, 0, "acme", "cancelled", 1, got, sizeof(got)), 2);
	assert_string_equal(strstr(got, ids[4]), got);
	assert_non_null(strstr(got, ids[1]));
	assert_int_equal(walk(s, 0, NULL, "cancelled", 5, got, sizeof(got)), 1);
	assert_int_equal(strlen(got), 2 * 34 + 1);
	store_close(s);
}

static void session_new(struct store *s, const char *cust, char id[40])
{
	struct kiln_err err = { .code = "" };
	struct store_session_new n = {
		.customer = cust, .spec_json = "{\"limits\":{\"vcpus\":1},\"network\":{\"egress\":\"deny\"}}",
		.vcpus = 1, .memory_mib = 256, .idle_timeout_s = 60, .max_lifetime_s = 3600, .host_id = "h1",
	};

	if (store_session_create(s, &n, id, &err) != 0)
		fail_msg("session: %s", err.message);
}

static void test_session_page(void **state)
{
	struct store *s = open_ok();
	char ids[5][40], got[1024];
	struct quota q;

	quota_defaults(&q);
	q.max_running = q.max_vcpus = 0; /* no limit */
	q.max_memory_mib = 0;
	customer(s, "acme", &q);
	customer(s, "beta", NULL);
	for (int i = 0; i < 5; i++)
		session_new(s, "acme", ids[i]);
	page_edges(s, 1, ids, 5);
	/* Destroyed ones are left out unless asked for ("all" or by state). */
	assert_int_equal(store_session_transition(s, ids[2], SESSION_STARTING, SESSION_DESTROYED, "", "deleted", NULL), 1);
	walk(s, 1, "acme", NULL, 2, got, sizeof(got));
	assert_null(strstr(got, ids[2]));
	assert_int_equal(strlen(got), 4 * 34 + 3);
	walk(s, 1, "acme", "all", 2, got, sizeof(got));
	assert_int_equal(strlen(got), 5 * 34 + 4);
	assert_int_equal(walk(s, 1, "acme", "destroyed", 1, got, sizeof(got)), 1);
	assert_string_equal(got, ids[2]);
	store_close(s);
}

/* The compare-and-set helper on a statement of its own: it binds only the
 * named parameters the statement has. */
static void test_cas_helper(void **state)
{
	struct store *s = open_ok();
	struct store_cas c = { .from = "queued", .to = "failed", .reason = "why", .now = 5 };
	struct sdb_stmt *st;
	char a[40];

	customer(s, "acme", NULL);
	submit(s, "acme", a);
	c.id = a;
	pthread_mutex_lock(&s->lock);
	assert_int_equal(sdb_prepare(s->db,
				     "UPDATE tasks SET state = :to, end_reason = :reason, ended_ms = :now"
				     " WHERE id = :id AND state = :from",
				     &st),
			 0);
	/* From a state the row is not in: refused, nothing written. */
	c.from = "running";
	assert_int_equal(store_cas_locked(s, st, &c), 0);
	/* An id that does not exist: refused. */
	c.from = "queued";
	c.id = "t_nope";
	assert_int_equal(store_cas_locked(s, st, &c), 0);
	/* From the state it is in: applied, once. */
	c.id = a;
	assert_int_equal(store_cas_locked(s, st, &c), 1);
	assert_int_equal(store_cas_locked(s, st, &c), 0);
	/* A statement that fails (state is NOT NULL): -1. */
	c.from = "failed";
	c.to = NULL;
	assert_int_equal(store_cas_locked(s, st, &c), -1);
	sdb_finalize(st);
	pthread_mutex_unlock(&s->lock);
	store_close(s);
	assert_int_equal(sql_int("SELECT count(*) FROM tasks WHERE state = 'failed' AND end_reason = 'why'"
				 " AND ended_ms = 5"),
			 1);
}

/* Both users of the helper: from a wrong state refused, from the right one
 * applied; bad arguments are errors, not moves. */
static void test_task_and_session_cas(void **state)
{
	struct store *s = open_ok();
	struct store_session ss;
	char t[40], x[40];
	uint64_t g;
	json_t *j, *snap;

	customer(s, "acme", NULL);
	submit(s, "acme", t);
	session_new(s, "acme", x);
	g = store_changes(s);
	assert_int_equal(store_task_transition(s, t, TASK_SCHEDULED, TASK_STARTING, "h1"), 0);
	assert_int_equal(store_session_transition(s, x, SESSION_PAUSING, SESSION_PAUSED, NULL, NULL, NULL), 0);
	assert_int_equal(store_task_transition(s, t, TASK_QUEUED, TASK_QUEUED, NULL), -1);
	assert_int_equal(store_task_transition(s, t, TASK_QUEUED, TASK_STATE_COUNT, NULL), -1);
	assert_int_equal(store_session_transition(s, x, SESSION_STARTING, SESSION_STARTING, NULL, NULL, NULL), -1);
	assert_int_equal(store_session_transition(s, x, SESSION_STATE_COUNT, SESSION_RUNNING, NULL, NULL, NULL), -1);
	assert_int_equal(store_changes(s), g); /* nothing moved, nothing announced */

	/* Tasks: a final state without a reason takes the state's name. */
	assert_int_equal(store_task_transition(s, t, TASK_QUEUED, TASK_ERROR, "h1"), 1);
	assert_true(store_changes(s) > g);
	j = store_task_json(s, t, NULL);
	assert_string_equal(json_string_value(json_object_get(j, "end_reason")), "error");
	assert_string_equal(json_string_value(json_object_get(j, "host")), "h1");
	json_decref(j);

	/* Sessions: host kept (NULL), cleared (""), set; reason; snapshot. */
	g = store_changes(s);
	assert_int_equal(store_session_transition(s, x, SESSION_STARTING, SESSION_RUNNING, NULL, NULL, NULL), 1);
	assert_true(store_changes(s) > g);
	assert_int_equal(store_session_get(s, x, "acme", &ss), 0);
	assert_int_equal(ss.state, SESSION_RUNNING);
	assert_string_equal(ss.host_id, "h1");
	assert_int_equal(store_session_get(s, x, "beta", &ss), -ENOENT);
	assert_int_equal(store_session_transition(s, x, SESSION_RUNNING, SESSION_PAUSING, NULL, NULL, NULL), 1);
	snap = json_pack("{s:s}", "key", "acme/s/snap");
	assert_int_equal(store_session_transition(s, x, SESSION_PAUSING, SESSION_PAUSED, "", "idle", snap), 1);
	json_decref(snap);
	j = store_session_json(s, x, "acme");
	assert_string_equal(json_string_value(json_object_get(j, "state")), "paused");
	assert_true(json_is_null(json_object_get(j, "host")));
	assert_string_equal(json_string_value(json_object_get(j, "end_reason")), "idle");
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "snapshot"), "key")), "acme/s/snap");
	assert_true(json_is_integer(json_object_get(j, "paused_at")));
	assert_true(json_is_null(json_object_get(j, "expires_at")));
	json_decref(j);
	assert_int_equal(store_session_get(s, x, NULL, &ss), 0);
	assert_int_equal(ss.has_snapshot, 1);
	assert_null(store_session_json(s, x, "beta"));
	store_close(s);
}

static void test_session_quota_resume_discard(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *s = open_ok();
	struct store_session_new n = { .customer = "acme", .spec_json = "{}", .vcpus = 1, .memory_mib = 256,
				       .idle_timeout_s = 60, .max_lifetime_s = 60, .host_id = "h1" };
	enum session_state prev;
	struct usage u;
	struct quota q;
	char a[40], b[40], t[40], *spec;

	quota_defaults(&q);
	q.max_running = 1;
	customer(s, "acme", &q);
	/* No such customer: no quota to check against. */
	n.customer = "nobody";
	assert_int_equal(store_session_create(s, &n, a, &err), -1);
	assert_string_equal(err.code, "store_error");
	n.customer = "acme";
	session_new(s, "acme", a);
	spec = store_session_spec(s, a);
	assert_non_null(strstr(spec, "limits"));
	free(spec);
	assert_null(store_session_spec(s, "s_nope"));
	/* Sessions and tasks share the running quota. */
	assert_int_equal(store_session_create(s, &n, b, &err), -EDQUOT);
	assert_string_equal(err.code, "quota_exceeded");
	submit(s, "acme", t);
	assert_int_equal(store_task_schedule(s, t, "h1"), -EDQUOT);
	assert_int_equal(store_customer_usage(s, "acme", &u), 0);
	assert_int_equal(u.running, 1);
	assert_int_equal(u.sessions, 1);
	/* The shared check, directly: the defaults when the row is gone only
	 * if the caller allows it. */
	pthread_mutex_lock(&s->lock);
	assert_int_equal(store_room_locked(s, "acme", 1, 256, 0, NULL), -EDQUOT);
	assert_int_equal(store_room_locked(s, "nobody", 1, 256, 0, NULL), -ENOENT);
	assert_int_equal(store_room_locked(s, "nobody", 1, 256, 1, NULL), 0);
	pthread_mutex_unlock(&s->lock);
	/* Not resumable while running; paused, it resumes (and holds the quota). */
	assert_int_equal(store_session_transition(s, a, SESSION_STARTING, SESSION_RUNNING, NULL, NULL, NULL), 1);
	assert_int_equal(store_session_resume_begin(s, a, "acme", "h2", &prev, &err), 0);
	assert_int_equal(prev, SESSION_RUNNING);
	assert_int_equal(store_session_resume_begin(s, a, "beta", "h2", &prev, &err), 0);
	assert_int_equal(prev, SESSION_STATE_COUNT);
	assert_int_equal(store_session_transition(s, a, SESSION_RUNNING, SESSION_PAUSED, "", NULL, NULL), 1);
	assert_int_equal(store_customer_usage(s, "acme", &u), 0);
	assert_int_equal(u.paused_sessions, 1);
	assert_int_equal(store_task_schedule(s, t, "h1"), 1);
	assert_int_equal(store_session_resume_begin(s, a, "acme", "h2", &prev, &err), -EDQUOT);
	assert_int_equal(store_task_transition(s, t, TASK_SCHEDULED, TASK_CANCELLED, NULL), 1);
	assert_int_equal(store_session_resume_begin(s, a, NULL, "h2", &prev, &err), 1);
	assert_int_equal(prev, SESSION_PAUSED);
	assert_int_equal(store_sessions_holding(s, (struct store_session[4]){ 0 }, 4), 1);
	/* Discard: only while starting. */
	assert_int_equal(store_session_discard(s, a), 0);
	assert_int_equal(store_session_transition(s, a, SESSION_RESUMING, SESSION_DESTROYED, "", "deleted", NULL), 1);
	session_new(s, "acme", b);
	assert_int_equal(store_session_discard(s, b), 1);
	assert_int_equal(store_session_get(s, b, NULL, &(struct store_session){ 0 }), -ENOENT);
	store_close(s);
}

/* Two stores on one PostgreSQL database, as two kiln-api replicas: a key
 * made on A works on B, one revoked on A stops working on B, both within a
 * second; a change committed on A wakes B's waiters and reaches B's remote
 * hook; an idempotency key used on A gives A's task on B; two replicas
 * racing the same key get one task. */
struct remote_seen {
	pthread_mutex_t lock;
	char id[40], event[16];
	int n;
};

static void on_remote(void *arg, const char *id, const char *event, json_t *data)
{
	struct remote_seen *r = arg;

	pthread_mutex_lock(&r->lock);
	if (id && !strcmp(event, "state")) {
		snprintf(r->id, sizeof(r->id), "%s", id);
		snprintf(r->event, sizeof(r->event), "%s", event);
		r->n++;
	}
	pthread_mutex_unlock(&r->lock);
}

static int key_works_within(struct store *s, const char *key, int want, int ms)
{
	char cust[65];
	int admin;

	for (int i = 0; i < ms / 10; i++) {
		if (store_key_check(s, key, cust, &admin) == want)
			return 1;
		usleep(10000);
	}
	return 0;
}

struct racer {
	struct store *s;
	const char *key;
	char id[40];
	int r;
};

static void *race_insert(void *arg)
{
	struct racer *x = arg;
	struct kiln_err err = { .code = "" };

	x->r = store_task_insert(x->s, "acme", "{}", NULL, 1, 256, x->key, "hr", x->id, &err);
	return NULL;
}

static void test_replicas(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *a, *b;
	struct remote_seen seen = { .lock = PTHREAD_MUTEX_INITIALIZER };
	char *key, kid[32], id[40], id2[40];
	uint64_t g;
	int64_t deadline;

	assert_true(pg); /* registered for the PostgreSQL pass only */
	a = open_ok();
	b = open_ok();
	store_set_remote_hook(b, on_remote, &seen);
	customer(a, "acme", NULL);
	assert_int_equal(store_key_create(a, "acme", 0, &key, kid, &err), 0);
	assert_true(key_works_within(b, key, 1, 1000));
	assert_int_equal(store_key_revoke(a, kid), 0);
	assert_true(key_works_within(b, key, 0, 1000));
	free(key);
	/* A submission on A wakes B's waiters and reaches its hook. */
	g = store_changes(b);
	submit(a, "acme", id);
	deadline = clock_mono_ms() + 2000;
	assert_int_equal(store_wait_change(b, g, deadline), 1);
	for (int i = 0; i < 200; i++) {
		pthread_mutex_lock(&seen.lock);
		int n = seen.n;
		pthread_mutex_unlock(&seen.lock);
		if (n)
			break;
		usleep(10000);
	}
	assert_string_equal(seen.id, id);
	/* Idempotency across replicas: A's task, from B. */
	assert_int_equal(store_task_insert(a, "acme", "{}", NULL, 1, 256, "k1", "h1", id, &err), 0);
	assert_int_equal(store_task_insert(b, "acme", "{}", NULL, 1, 256, "k1", "h1", id2, &err), 1);
	assert_string_equal(id, id2);
	/* The same key on both at once: one task, both told its id. */
	for (int round = 0; round < 5; round++) {
		char k[16];
		struct racer x = { .s = a, .key = k }, y = { .s = b, .key = k };
		pthread_t tx, ty;

		snprintf(k, sizeof(k), "race%d", round);
		assert_int_equal(pthread_create(&tx, NULL, race_insert, &x), 0);
		assert_int_equal(pthread_create(&ty, NULL, race_insert, &y), 0);
		pthread_join(tx, NULL);
		pthread_join(ty, NULL);
		assert_true(x.r >= 0 && y.r >= 0);
		assert_string_equal(x.id, y.id);
	}
	/* Shared quotas: a submit rate of 0.001/s with a burst of 2 is 2 in
	 * all, whichever replica takes them; then max_queued 3 across both. */
	{
		struct store *rep[2] = { a, b };
		struct store_submit t = { .customer = "beta", .spec_json = "{}", .vcpus = 1, .memory_mib = 256,
					  .body_hash = "h", .shared = 1, .submit_rate = 0.001, .submit_burst = 2 };
		int64_t retry = 0;
		char x[40];

		t.retry_ms = &retry;
		customer(a, "beta", NULL);
		for (int i = 0; i < 2; i++)
			assert_int_equal(store_task_submit(rep[i], &t, x, &err), 0);
		assert_int_equal(store_task_submit(a, &t, x, &err), -1);
		assert_string_equal(err.code, "rate_limited");
		assert_true(retry > 0);
		assert_int_equal(store_task_submit(b, &t, x, &err), -1);
		assert_string_equal(err.code, "rate_limited");
		t.submit_rate = 0;
		t.max_queued = 3;
		assert_int_equal(store_task_submit(b, &t, x, &err), 0); /* 3 queued */
		assert_int_equal(store_task_submit(a, &t, x, &err), -1);
		assert_string_equal(err.code, "queue_full");
		assert_int_equal(store_task_submit(b, &t, x, &err), -1);
		assert_string_equal(err.code, "queue_full");
	}
	store_set_remote_hook(b, NULL, NULL);
	store_close(b);
	store_close(a);
}

static int leased(struct store *s, const char *id)
{
	struct store_session c;

	assert_int_equal(store_session_get(s, id, NULL, &c), 0);
	return c.leased;
}

/* Leases: any owner's live row makes a session leased for every handle on
 * the database (a and b: two replicas); a lapsed one does not; renew, the
 * all-at-once rewrite, the touch in the same write, the clean-up of a
 * killed owner's rows, and expiry on the database's own clock. */
static void test_session_leases(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *a = open_ok(), *b = open_ok();
	struct store_session_new n = { .customer = "acme", .spec_json = "{}", .vcpus = 1, .memory_mib = 256,
				       .idle_timeout_s = 60, .max_lifetime_s = 60, .host_id = "h1",
				       .lease_owner = "A", .lease_ttl_ms = 60000 };
	struct store_session held[4], c;
	const char *ids[2];
	unsigned counts[2] = { 1, 3 };
	char x[40], y[40], q[200];
	int64_t t0;

	customer(a, "acme", NULL);
	/* Created with A's lease in the same transaction: B sees it at once. */
	assert_int_equal(store_session_create(a, &n, x, &err), 0);
	assert_int_equal(leased(b, x), 1);
	session_new(a, "acme", y);
	assert_int_equal(leased(b, y), 0);
	assert_int_equal(store_sessions_holding(b, held, 4), 2);
	assert_true(!strcmp(held[0].id, x) ? held[0].leased && !held[1].leased : held[1].leased && !held[0].leased);
	/* B's own request on x as well: x stays leased until both are gone. */
	assert_int_equal(store_session_lease_set(b, x, "B", 1, 60000, 0), 0);
	assert_int_equal(store_session_lease_drop(a, x, "A", 0), 0);
	assert_int_equal(leased(a, x), 1);
	assert_int_equal(store_session_lease_drop(b, x, "B", 0), 0);
	assert_int_equal(leased(a, x), 0);
	assert_int_equal(store_session_lease_drop(b, x, "B", 0), 0); /* gone already: fine */
	/* The count is written as given (set again: an update, not a second row). */
	assert_int_equal(store_session_lease_set(a, x, "A", 1, 60000, 0), 0);
	assert_int_equal(store_session_lease_set(a, x, "A", 2, 60000, 0), 0);
	snprintf(q, sizeof(q), "SELECT n FROM session_leases WHERE session_id = '%s' AND owner = 'A'", x);
	assert_int_equal(sql_int(q), 2);
	assert_int_equal(store_session_lease_set(a, x, "A", 0, 60000, 0), -1); /* a count of 0 is a drop */
	/* Expiry on the database's clock: ttl ms from its now (the server runs
	 * on this machine: within seconds of ours). */
	snprintf(q, sizeof(q), "SELECT (expires_ms - %lld) / 1000 FROM session_leases WHERE owner = 'A'",
		 (long long)clock_wall_ms());
	assert_true(sql_int(q) >= 55 && sql_int(q) <= 65);
	/* A lapsed lease (a killed replica's, never renewed) keeps nothing. */
	assert_int_equal(store_session_lease_set(b, y, "K", 1, -1, 0), 0);
	assert_int_equal(leased(a, y), 0);
	/* Renew: every row of the owner, counted; lapsed ones live again. */
	assert_int_equal(store_session_lease_set(b, y, "B", 1, -1, 0), 0);
	assert_int_equal(store_session_leases_renew(b, "B", 60000), 1);
	assert_int_equal(leased(a, y), 1);
	assert_int_equal(store_session_leases_renew(b, "nobody", 60000), 0);
	/* Clean-up: rows lapsed more than a minute ago go (K's, set so), live
	 * and recently lapsed ones stay. */
	assert_int_equal(store_session_lease_set(b, x, "K", 1, -120000, 0), 0);
	assert_int_equal(store_session_leases_gc(a, 60000), 1);
	assert_int_equal(sql_int("SELECT count(*) FROM session_leases WHERE owner = 'K'"), 1);
	/* Replace: the owner's rows are exactly the list (then none). */
	ids[0] = x;
	ids[1] = y;
	assert_int_equal(store_session_leases_replace(a, "A", ids, counts, 2, 60000), 0);
	assert_int_equal(sql_int("SELECT count(*) FROM session_leases WHERE owner = 'A'"), 2);
	assert_int_equal(sql_int("SELECT sum(n) FROM session_leases WHERE owner = 'A'"), 4);
	assert_int_equal(store_session_leases_replace(a, "A", NULL, NULL, 0, 60000), 0);
	assert_int_equal(sql_int("SELECT count(*) FROM session_leases WHERE owner = 'A'"), 0);
	assert_int_equal(sql_int("SELECT count(*) FROM session_leases WHERE owner = 'B'"), 1);
	/* The touch rides in the lease's write. */
	snprintf(q, sizeof(q), "UPDATE sessions SET last_active_ms = 1 WHERE id = '%s'", x);
	sql(q);
	t0 = clock_wall_ms();
	assert_int_equal(store_session_lease_set(a, x, "A", 1, 60000, 1), 0);
	assert_int_equal(store_session_get(b, x, NULL, &c), 0);
	assert_true(c.last_active_ms >= t0 && c.leased);
	sql(q);
	assert_int_equal(store_session_lease_drop(a, x, "A", 1), 0);
	assert_int_equal(store_session_get(b, x, NULL, &c), 0);
	assert_true(c.last_active_ms >= t0 && !c.leased);
	/* Paused on a, resumed on a fresh handle c: its first compare-and-set
	 * is prepared inside resume's transaction (on PostgreSQL a refused
	 * attempt there aborted the transaction: every first resume on a
	 * replica failed). */
	{
		struct store *h = open_ok();
		enum session_state prev;

		assert_int_equal(store_session_transition(a, y, SESSION_STARTING, SESSION_RUNNING, "h1", "", NULL), 1);
		assert_int_equal(store_session_transition(a, y, SESSION_RUNNING, SESSION_PAUSING, NULL, NULL, NULL), 1);
		assert_int_equal(store_session_transition(a, y, SESSION_PAUSING, SESSION_PAUSED, "", "paused", NULL), 1);
		assert_int_equal(store_session_resume_begin(h, y, "acme", "", &prev, &err), 1);
		assert_int_equal(prev, SESSION_PAUSED);
		assert_int_equal(store_session_transition(h, y, SESSION_RESUMING, SESSION_RUNNING, "h2", "", NULL), 1);
		store_close(h);
	}
	store_close(b);
	store_close(a);
}

/* The PostgreSQL round: each test in a database of its own on a server of
 * the group's (skipped when none can be started). */
static int setup_pg(void **state)
{
	pg = 1;
	if (!pg_up) /* the test itself skips */
		return 0;
	return fresh();
}

static int group_setup(void **state)
{
	char cmd[400];

	snprintf(pg_dir, sizeof(pg_dir), "%s/pg", dir);
	chmod(dir, 0711); /* the server runs as the postgres user when we are root */
	snprintf(cmd, sizeof(cmd), "scripts/pg-local.sh start '%s' > /dev/null", pg_dir);
	pg_up = access("scripts/pg-local.sh", X_OK) == 0 && system(cmd) == 0;
	if (!pg_up)
		printf("# postgresql: scripts/pg-local.sh could not start a server: its tests are skipped\n");
	return 0;
}

static int group_teardown(void **state)
{
	char cmd[400];

	snprintf(cmd, sizeof(cmd), "scripts/pg-local.sh stop '%s'", pg_dir);
	if (pg_up && system(cmd) != 0)
		fprintf(stderr, "cannot stop the PostgreSQL in %s\n", pg_dir);
	return 0;
}

/* push's one read (store_task_push_get): the task's state on a host, its
 * spec, no template, then its customer's destination once it has one; a
 * task that is not there reads as no spec. */
static void test_push_get(void **state)
{
	struct store *s = open_ok();
	struct kiln_err err = { .code = "" };
	struct store_task_push tp;
	struct dest d = { .endpoint = "http://127.0.0.1:9", .region = "us-east-1", .bucket = "cust-out",
			  .prefix = "p/", .access_key = "AK" };
	static const unsigned char sealed[5] = { 1, 0, 2, 0, 3 };
	char a[40], did[40];

	customer(s, "acme", NULL);
	submit(s, "acme", a);
	assert_int_equal(store_task_push_get(s, a, "h1", &tp), 0);
	assert_string_equal(tp.spec, "{\"argv\":[\"true\"]}");
	assert_false(tp.scheduled_on); /* queued */
	assert_null(tp.template_ref);
	assert_false(tp.has_dest);
	store_task_push_free(&tp);
	assert_int_equal(store_task_schedule(s, a, "h1"), 1);
	assert_int_equal(store_dest_put(s, "acme", &d, sealed, sizeof(sealed), did, NULL, &err), 0);
	assert_int_equal(store_task_push_get(s, a, "h1", &tp), 0);
	assert_true(tp.scheduled_on);
	assert_true(tp.has_dest);
	assert_string_equal(tp.dest.id, did);
	assert_string_equal(tp.dest.d.bucket, "cust-out");
	assert_string_equal(tp.dest.d.prefix, "p/");
	assert_int_equal(tp.dest.sealed_len, sizeof(sealed));
	assert_memory_equal(tp.dest.sealed, sealed, sizeof(sealed));
	store_task_push_free(&tp);
	assert_int_equal(store_task_push_get(s, a, "h2", &tp), 0);
	assert_false(tp.scheduled_on); /* another host's */
	store_task_push_free(&tp);
	assert_int_equal(store_task_push_get(s, "t_none", "h1", &tp), 0);
	assert_null(tp.spec);
	store_close(s);
}

/* A write in a STORE_TX, then leaving the scope: early (rolled back) or
 * after the commit. */
static int tx_write_and_leave(struct store *s, const char *id, int commit)
{
	char sql[128];
	STORE_TX(tx);

	if (store_tx_start(&tx, s) < 0)
		return -1;
	snprintf(sql, sizeof(sql), "INSERT INTO task_specs(id, spec) VALUES ('%s', '{}')", id);
	if (store_exec(s->db, sql, NULL) < 0)
		return -1;
	if (!commit)
		return 1; /* the early return the helper is for */
	return store_tx_commit(&tx);
}

/* STORE_TX: whatever return leaves the scope, an open transaction is rolled
 * back and the store's lock released. */
static void test_tx_cleanup(void **state)
{
	struct store *s = open_ok();

	assert_int_equal(tx_write_and_leave(s, "tx-early", 0), 1);
	assert_int_equal(pthread_mutex_trylock(&s->lock), 0);
	pthread_mutex_unlock(&s->lock);
	assert_int_equal(sql_int("SELECT count(*) FROM task_specs WHERE id = 'tx-early'"), 0);
	/* No transaction was left open: the next one begins and commits. */
	assert_int_equal(tx_write_and_leave(s, "tx-kept", 1), 0);
	assert_int_equal(pthread_mutex_trylock(&s->lock), 0);
	pthread_mutex_unlock(&s->lock);
	assert_int_equal(sql_int("SELECT count(*) FROM task_specs WHERE id = 'tx-kept'"), 1);
	store_close(s);
}

/* Snapshots: ids, create with the template use copied from the session,
 * the named quota (count and bytes) in the insert's transaction, get and
 * JSON scoped to the customer, the list's filters and keyset pages (newest
 * first, forks and deleted ones left out), deletion in two steps, sessions
 * started from one (their template use, "snapshot_id", the users count
 * that keeps the objects). */
static void snap_new(struct store *s, const char *cust, const char *session, const char *name, const char *kind,
		     uint64_t bytes, char id[40])
{
	struct kiln_err err = { .code = "" };
	struct store_snapshot_new n = {
		.id = id, .customer = cust, .name = name, .session_id = session, .kind = kind, .host_id = "h1",
		.spec_json = "{\"limits\":{\"vcpus\":1,\"memory_mib\":256}}", .vcpus = 1, .memory_mib = 256,
		.bytes = bytes, .stop_ms = 12, .max_snapshots = 3, .max_snapshot_mib = 100,
	};

	assert_int_equal(store_snapshot_new_id(id), 0);
	if (store_snapshot_create(s, &n, &err) != 0)
		fail_msg("snapshot: %s", err.message);
}

static void test_snapshots(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *s = open_ok();
	struct store_template_use tu = { .template_id = "b_x", .name = "py", .sha256 = "ab", .template_ref_json = "{\"sha256\":\"ab\"}" };
	struct store_session_new sn = {
		.customer = "acme", .spec_json = "{}", .vcpus = 1, .memory_mib = 256, .idle_timeout_s = 60,
		.max_lifetime_s = 60, .host_id = "h1", .template_use = &tu,
	};
	struct store_snapshot k;
	struct store_session c;
	char sess[40], sess2[40], a[40], b[40], f[40], x[40], child[40], *text, *next = NULL;
	unsigned count;
	uint64_t bytes;
	json_t *j, *arr;

	customer(s, "acme", NULL);
	customer(s, "beta", NULL);
	assert_int_equal(store_session_create(s, &sn, sess, &err), 0);
	session_new(s, "acme", sess2);
	/* Ids. */
	assert_int_equal(store_snapshot_new_id(a), 0);
	assert_true(store_snapshot_id_valid(a));
	assert_int_equal(strlen(a), STORE_SNAPSHOT_ID_LEN);
	assert_false(store_snapshot_id_valid("snap_0123"));
	assert_false(store_snapshot_id_valid("snap_0123456789abcdef0123456G"));
	assert_false(store_snapshot_id_valid(NULL));
	/* Named ones count; a fork's does not and is not listed. */
	snap_new(s, "acme", sess, "one", "named", 10u << 20, a);
	snap_new(s, "acme", sess2, NULL, "named", 20u << 20, b);
	snap_new(s, "acme", sess, NULL, "fork", 90u << 20, f);
	assert_int_equal(store_snapshot_usage(s, "acme", &count, &bytes), 0);
	assert_int_equal(count, 2);
	assert_int_equal(bytes, 30u << 20);
	/* The template use of its session, copied. */
	text = store_template_use_ref(s, a);
	assert_non_null(text);
	assert_string_equal(text, "{\"sha256\":\"ab\"}");
	free(text);
	assert_null(store_template_use_ref(s, b));
	assert_int_equal(store_template_sha_referenced(s, "ab"), 1);
	/* The quota, in the insert's transaction: bytes, then count. */
	{
		struct store_snapshot_new n = {
			.id = x, .customer = "acme", .session_id = sess, .kind = "named", .spec_json = "{}", .vcpus = 1,
			.memory_mib = 256, .bytes = 71u << 20, .max_snapshots = 3, .max_snapshot_mib = 100,
		};

		assert_int_equal(store_snapshot_new_id(x), 0);
		assert_int_equal(store_snapshot_create(s, &n, &err), -EDQUOT);
		assert_string_equal(err.code, "quota_exceeded");
		assert_non_null(strstr(err.message, "max_snapshot_mib"));
		n.bytes = 70u << 20;
		n.max_snapshots = 2;
		assert_int_equal(store_snapshot_create(s, &n, &err), -EDQUOT);
		assert_non_null(strstr(err.message, "max_snapshots"));
		assert_int_equal(store_snapshot_get(s, x, NULL, 1, &k), -ENOENT);
		/* A fork's is not the named quota's. */
		n.kind = "fork";
		assert_int_equal(store_snapshot_create(s, &n, &err), 0);
	}
	/* Get: the customer's only. */
	assert_int_equal(store_snapshot_get(s, a, "acme", 0, &k), 0);
	assert_string_equal(k.name, "one");
	assert_string_equal(k.session_id, sess);
	assert_string_equal(k.kind, "named");
	assert_string_equal(k.host_id, "h1");
	assert_int_equal(k.bytes, 10u << 20);
	assert_int_equal(k.stop_ms, 12);
	assert_int_equal(k.deleted_ms, 0);
	assert_int_equal(store_snapshot_get(s, a, "beta", 0, &k), -ENOENT);
	assert_int_equal(store_snapshot_get(s, "s_nope", NULL, 0, &k), -ENOENT);
	assert_null(store_snapshot_json(s, a, "beta"));
	j = store_snapshot_json(s, a, "acme");
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(j, "id")), a);
	assert_string_equal(json_string_value(json_object_get(j, "name")), "one");
	assert_string_equal(json_string_value(json_object_get(j, "template")), "py");
	assert_int_equal(json_integer_value(json_object_get(j, "bytes")), 10 << 20);
	assert_int_equal(json_integer_value(json_object_get(j, "memory_mib")), 256);
	json_decref(j);
	j = store_snapshot_json(s, b, NULL);
	assert_true(json_is_null(json_object_get(j, "name")));
	assert_string_equal(json_string_value(json_object_get(j, "template")), "default");
	json_decref(j);
	text = store_snapshot_spec(s, a);
	assert_non_null(strstr(text, "memory_mib"));
	free(text);
	/* A fork's: never shown, deleted by kiln-api only. */
	assert_null(store_snapshot_json(s, f, "acme"));
	assert_int_equal(store_snapshot_get(s, f, "acme", 0, &k), 0);
	assert_string_equal(k.kind, "fork");
	assert_int_equal(store_snapshot_mark_deleted(s, f, "acme"), 0);
	assert_int_equal(store_snapshot_mark_deleted(s, f, NULL), 1);
	/* The list: newest first, pages, filters; forks left out. */
	arr = store_snapshot_list(s, "acme", NULL, NULL, 1, NULL, &next, &err);
	assert_int_equal(json_array_size(arr), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 0), "id")), b);
	assert_non_null(next);
	json_decref(arr);
	arr = store_snapshot_list(s, "acme", NULL, NULL, 1, next, &text, &err);
	free(next);
	assert_int_equal(json_array_size(arr), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 0), "id")), a);
	assert_null(text);
	json_decref(arr);
	arr = store_snapshot_list(s, "acme", "one", NULL, 10, NULL, &next, &err);
	assert_int_equal(json_array_size(arr), 1);
	json_decref(arr);
	arr = store_snapshot_list(s, "acme", NULL, sess2, 10, NULL, &next, &err);
	assert_int_equal(json_array_size(arr), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 0), "id")), b);
	json_decref(arr);
	arr = store_snapshot_list(s, "beta", NULL, NULL, 10, NULL, &next, &err);
	assert_int_equal(json_array_size(arr), 0);
	json_decref(arr);
	assert_null(store_snapshot_list(s, "acme", NULL, NULL, 0, NULL, &next, &err));
	assert_null(store_snapshot_list(s, "acme", NULL, NULL, 10, "x", &next, &err));
	assert_string_equal(err.code, "invalid_request");
	/* A session started from a: its template use and the snapshot's id. */
	{
		struct store_session_new cn = {
			.customer = "acme", .spec_json = "{}", .vcpus = 1, .memory_mib = 256, .idle_timeout_s = 60,
			.max_lifetime_s = 60, .host_id = "h1", .from_snapshot = a,
		};

		assert_int_equal(store_session_create(s, &cn, child, &err), 0);
	}
	assert_int_equal(store_session_get(s, child, NULL, &c), 0);
	assert_string_equal(c.from_snapshot, a);
	text = store_template_use_ref(s, child);
	assert_string_equal(text, "{\"sha256\":\"ab\"}");
	free(text);
	j = store_session_json(s, child, NULL);
	assert_string_equal(json_string_value(json_object_get(j, "snapshot_id")), a);
	assert_string_equal(json_string_value(json_object_get(j, "template")), "py");
	json_decref(j);
	assert_int_equal(store_snapshot_users(s, a), 1);
	assert_int_equal(store_snapshot_users(s, b), 0);
	/* Deleted: gone for the customer, out of the quota and the list; the
	 * row stays for the clean-up. Another customer cannot. */
	assert_int_equal(store_snapshot_mark_deleted(s, a, "beta"), 0);
	assert_int_equal(store_snapshot_mark_deleted(s, a, "acme"), 1);
	assert_int_equal(store_snapshot_mark_deleted(s, a, "acme"), 0);
	assert_int_equal(store_snapshot_get(s, a, "acme", 0, &k), -ENOENT);
	assert_int_equal(store_snapshot_get(s, a, "acme", 1, &k), 0);
	assert_true(k.deleted_ms > 0);
	assert_null(store_snapshot_json(s, a, "acme"));
	/* No new session from it (nor from another customer's). */
	{
		struct store_session_new cn = {
			.customer = "acme", .spec_json = "{}", .vcpus = 1, .memory_mib = 256, .idle_timeout_s = 60,
			.max_lifetime_s = 60, .host_id = "h1", .from_snapshot = a,
		};
		char none[40];

		assert_int_equal(store_session_create(s, &cn, none, &err), -ENOENT);
		assert_string_equal(err.code, "not_found");
		cn.from_snapshot = b;
		cn.customer = "beta";
		assert_int_equal(store_session_create(s, &cn, none, &err), -ENOENT);
	}
	assert_int_equal(store_snapshot_usage(s, "acme", &count, &bytes), 0);
	assert_int_equal(count, 1);
	assert_int_equal(bytes, 20u << 20);
	/* The session from it keeps it until destroyed (paused too). */
	{
		struct store_snapshot del[4];

		/* (f, the fork's, deleted and used by none, is listed.) */
		assert_int_equal(store_snapshots_deleted(s, del, 4), 1);
		assert_string_equal(del[0].id, f);
		assert_int_equal(store_session_transition(s, child, SESSION_STARTING, SESSION_PAUSED, "", NULL, NULL), 1);
		assert_int_equal(store_snapshot_users(s, a), 1);
		assert_int_equal(store_snapshots_deleted(s, del, 4), 1);
		assert_int_equal(store_session_transition(s, child, SESSION_PAUSED, SESSION_DESTROYED, "", "deleted", NULL),
				 1);
		assert_int_equal(store_snapshot_users(s, a), 0);
		assert_int_equal(store_snapshots_deleted(s, del, 4), 2);
		assert_true(!strcmp(del[0].id, a) || !strcmp(del[1].id, a));
	}
	/* Removed: its row and its template use (the image is still the session's). */
	assert_int_equal(store_snapshot_remove(s, a), 1);
	assert_int_equal(store_snapshot_remove(s, a), 0);
	assert_null(store_template_use_ref(s, a));
	assert_int_equal(store_snapshot_get(s, a, NULL, 1, &k), -ENOENT);
	/* Reopened: all there. */
	store_close(s);
	s = open_ok();
	assert_int_equal(store_snapshot_get(s, b, "acme", 0, &k), 0);
	assert_int_equal(k.egress, 0);
	store_close(s);
}


/* Volumes: ids, create under max_volumes with names unique among those
 * not deleted, get by id or name scoped to the customer, the list, the
 * one-writer rule checked with the session's insert (read-only mounts
 * beside a writer, a paused writer still holding it, a destroyed or
 * discarded one not), the session JSON's "volumes", deletion refused while
 * mounted and its undo. */
static void vol_session(struct store *s, const char *cust, const struct store_volume_mount *m, unsigned n,
			char id[40], int want, const char *code)
{
	struct kiln_err err = { .code = "" };
	struct store_session_new sn = {
		.customer = cust, .spec_json = "{}", .vcpus = 1, .memory_mib = 256, .idle_timeout_s = 60,
		.max_lifetime_s = 60, .host_id = "h1", .volumes = m, .nvolumes = n,
	};
	int r = store_session_create(s, &sn, id, &err);

	if (r != want)
		fail_msg("session with volumes: want %d, got %d (%s)", want, r, err.message);
	if (code)
		assert_string_equal(err.code, code);
}

static void test_volumes(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *s = open_ok();
	struct store_volume v, w;
	struct store_volume_mount m[2], got[4];
	char a[40], b[40], x[40], s1[40], s2[40], s3[40], s4[40];
	unsigned count;
	json_t *j, *arr;

	customer(s, "acme", NULL);
	customer(s, "beta", NULL);
	assert_false(store_volume_id_valid("vol_12"));
	assert_false(store_volume_id_valid(NULL));
	assert_int_equal(store_volume_create(s, "acme", "data", 1024, 2, a, &err), 0);
	assert_true(store_volume_id_valid(a));
	/* The name is taken (a conflict); another customer's may be the same. */
	assert_int_equal(store_volume_create(s, "acme", "data", 16, 2, x, &err), -EEXIST);
	assert_string_equal(err.code, "conflict");
	assert_int_equal(store_volume_create(s, "beta", "data", 16, 2, x, &err), 0);
	assert_int_equal(store_volume_create(s, "acme", "cache", 64, 2, b, &err), 0);
	assert_int_equal(store_volume_create(s, "acme", "third", 64, 2, x, &err), -EDQUOT);
	assert_string_equal(err.code, "quota_exceeded");
	assert_non_null(strstr(err.message, "max_volumes"));
	assert_int_equal(store_volume_count(s, "acme", &count), 0);
	assert_int_equal(count, 2);
	/* By id or name; the customer's only. */
	assert_int_equal(store_volume_get(s, a, "acme", &v), 0);
	assert_string_equal(v.name, "data");
	assert_int_equal(v.size_mib, 1024);
	assert_true(v.created_ms > 0);
	assert_int_equal(store_volume_get(s, "cache", "acme", &w), 0);
	assert_string_equal(w.id, b);
	assert_int_equal(store_volume_get(s, a, "beta", &w), -ENOENT);
	assert_int_equal(store_volume_get(s, "nope", "acme", &w), -ENOENT);
	arr = store_volume_list(s, "acme", NULL);
	assert_int_equal(json_array_size(arr), 2);
	assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 0), "id")), b);
	json_decref(arr);
	arr = store_volume_list(s, "acme", "data");
	assert_int_equal(json_array_size(arr), 1);
	json_decref(arr);
	/* A writer, then a second writer refused, a reader beside it fine. */
	memset(m, 0, sizeof(m));
	snprintf(m[0].volume_id, sizeof(m[0].volume_id), "%s", a);
	snprintf(m[0].path, sizeof(m[0].path), "/data");
	snprintf(m[1].volume_id, sizeof(m[1].volume_id), "%s", b);
	snprintf(m[1].path, sizeof(m[1].path), "/cache");
	m[1].read_only = 1;
	vol_session(s, "acme", m, 2, s1, 0, NULL);
	vol_session(s, "acme", m, 1, s2, -EBUSY, "volume_busy");
	m[0].read_only = 1;
	vol_session(s, "acme", m, 1, s2, 0, NULL);
	/* Another customer's volume: not attachable. */
	vol_session(s, "beta", m, 1, s3, -EINVAL, "invalid_request");
	/* What the session shows and what the volume shows. */
	assert_int_equal(store_session_volumes(s, s1, got, 4), 2);
	assert_string_equal(got[0].path, "/cache");
	assert_string_equal(got[0].name, "cache");
	assert_int_equal(got[0].read_only, 1);
	assert_string_equal(got[1].volume_id, a);
	assert_int_equal(got[1].read_only, 0);
	j = store_session_json(s, s1, NULL);
	arr = json_object_get(j, "volumes");
	assert_int_equal(json_array_size(arr), 2);
	assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 1), "name")), "data");
	assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 1), "id")), a);
	assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 1), "path")), "/data");
	assert_true(json_is_false(json_object_get(json_array_get(arr, 1), "read_only")));
	json_decref(j);
	j = store_session_json(s, s2, NULL);
	assert_true(json_is_true(json_object_get(json_array_get(json_object_get(j, "volumes"), 0), "read_only")));
	json_decref(j);
	assert_int_equal(store_volume_get(s, a, "acme", &v), 0);
	j = store_volume_json(s, &v);
	assert_int_equal(json_array_size(json_object_get(j, "mounted_by")), 2);
	assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "mounted_by"), 0),
							      "session_id")), s1);
	json_decref(j);
	/* Deletion: refused while mounted (paused too). */
	assert_int_equal(store_volume_mark_deleted(s, a, "acme", &err), -EBUSY);
	assert_string_equal(err.code, "volume_busy");
	assert_int_equal(store_session_transition(s, s1, SESSION_STARTING, SESSION_PAUSED, "", NULL, NULL), 1);
	m[0].read_only = 0;
	vol_session(s, "acme", m, 1, s3, -EBUSY, "volume_busy");
	/* The writer destroyed: another may write. */
	assert_int_equal(store_session_transition(s, s1, SESSION_PAUSED, SESSION_DESTROYED, "", "deleted", NULL), 1);
	vol_session(s, "acme", m, 1, s3, 0, NULL);
	/* A discarded session (its host refused it) leaves no mount behind. */
	assert_int_equal(store_session_discard(s, s3), 1);
	vol_session(s, "acme", m, 1, s4, 0, NULL);
	assert_int_equal(store_session_transition(s, s4, SESSION_STARTING, SESSION_DESTROYED, "", "deleted", NULL), 1);
	assert_int_equal(store_volume_mark_deleted(s, a, "acme", &err), -EBUSY); /* s2 reads it */
	assert_int_equal(store_session_transition(s, s2, SESSION_STARTING, SESSION_ERROR, "", "vm_lost", NULL), 1);
	assert_int_equal(store_volume_mark_deleted(s, a, "acme", &err), -EBUSY); /* error is not destroyed */
	assert_int_equal(store_session_transition(s, s2, SESSION_ERROR, SESSION_DESTROYED, "", "deleted", NULL), 1);
	assert_int_equal(store_volume_mark_deleted(s, a, "beta", &err), 0);
	/* Undo, then delete for good. */
	assert_int_equal(store_volume_mark_deleted(s, a, "acme", &err), 1);
	assert_int_equal(store_volume_get(s, "data", "acme", &v), -ENOENT);
	assert_int_equal(store_volume_unmark_deleted(s, a), 1);
	assert_int_equal(store_volume_get(s, "data", "acme", &v), 0);
	assert_int_equal(store_volume_mark_deleted(s, a, "acme", &err), 1);
	assert_int_equal(store_volume_mark_deleted(s, a, "acme", &err), 0);
	/* Gone: not attachable, its name free again, out of the count. */
	vol_session(s, "acme", m, 1, s4, -EINVAL, "invalid_request");
	assert_int_equal(store_volume_create(s, "acme", "data", 16, 2, x, &err), 0);
	assert_int_equal(store_volume_unmark_deleted(s, a), 0); /* the name is taken now */
	/* The destroyed session still names it (history). */
	j = store_session_json(s, s1, NULL);
	assert_int_equal(json_array_size(json_object_get(j, "volumes")), 2);
	json_decref(j);
	store_close(s);
}


/* The one-writer rule across replicas (PostgreSQL, two handles): two
 * read-write mounts of one volume at once, one on each, give one session
 * and one volume_busy; a mount and a deletion at once never both happen. */
struct vol_racer {
	struct store *s;
	const char *volume;
	int del;                     /* mark the volume deleted instead of mounting it */
	int r;
	char id[40];
};

static void *vol_race(void *arg)
{
	struct vol_racer *x = arg;
	struct kiln_err err = { .code = "" };
	struct store_volume_mount m = { .read_only = 0 };
	struct store_session_new sn = {
		.customer = "acme", .spec_json = "{}", .vcpus = 1, .memory_mib = 256, .idle_timeout_s = 60,
		.max_lifetime_s = 60, .host_id = "h1", .volumes = &m, .nvolumes = 1,
	};

	snprintf(m.volume_id, sizeof(m.volume_id), "%s", x->volume);
	snprintf(m.path, sizeof(m.path), "/data");
	x->r = x->del ? store_volume_mark_deleted(x->s, x->volume, "acme", &err) : store_session_create(x->s, &sn, x->id, &err);
	return NULL;
}

static void test_volume_replicas(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *a, *b;
	struct quota q;

	assert_true(pg); /* registered for the PostgreSQL pass only */
	a = open_ok();
	b = open_ok();
	quota_defaults(&q);
	q.max_running = 100;
	q.max_vcpus = 100;
	q.max_memory_mib = 100000;
	customer(a, "acme", &q);
	for (int round = 0; round < 5; round++) {
		char v[40], name[16];
		struct vol_racer x = { .s = a }, y = { .s = b };
		pthread_t tx, ty;

		snprintf(name, sizeof(name), "v%d", round);
		assert_int_equal(store_volume_create(a, "acme", name, 16, 0, v, &err), 0);
		x.volume = y.volume = v;
		/* Two writers at once: one wins. */
		assert_int_equal(pthread_create(&tx, NULL, vol_race, &x), 0);
		assert_int_equal(pthread_create(&ty, NULL, vol_race, &y), 0);
		pthread_join(tx, NULL);
		pthread_join(ty, NULL);
		if (!((x.r == 0 && y.r == -EBUSY) || (x.r == -EBUSY && y.r == 0)))
			fail_msg("round %d: two writers got %d and %d", round, x.r, y.r);
		assert_int_equal(store_session_transition(a, x.r == 0 ? x.id : y.id, SESSION_STARTING, SESSION_DESTROYED, "",
							  "deleted", NULL), 1);
		/* A writer and a deletion at once: never both. */
		x = (struct vol_racer){ .s = a, .volume = v, .del = 1 };
		y = (struct vol_racer){ .s = b, .volume = v };
		assert_int_equal(pthread_create(&tx, NULL, vol_race, &x), 0);
		assert_int_equal(pthread_create(&ty, NULL, vol_race, &y), 0);
		pthread_join(tx, NULL);
		pthread_join(ty, NULL);
		if (!((x.r == 1 && y.r == -EINVAL) || (x.r == -EBUSY && y.r == 0)))
			fail_msg("round %d: deletion %d, mount %d", round, x.r, y.r);
	}
	store_close(a);
	store_close(b);
}

/* Sum of the customer's buckets over the last two hours. */
static void usage_total(struct store *s, const char *cust, struct usage_bucket *tot)
{
	struct usage_bucket b[120];
	int64_t now = clock_wall_ms(), from = now - now % 60000 - 119 * 60000LL;

	memset(tot, 0, sizeof(*tot));
	assert_int_equal(store_usage_history(s, cust, from, 60000, 120, b), 0);
	for (int i = 0; i < 120; i++) {
		tot->vcpu_ms += b[i].vcpu_ms;
		tot->mib_ms += b[i].mib_ms;
		tot->tasks += b[i].tasks;
		tot->sessions += b[i].sessions;
		tot->egress_bytes += b[i].egress_bytes;
	}
}

/* Metering: an interval split over the minutes it spans and added up
 * (upsert), read back per minute and per larger step; a task's and a
 * session's usage recorded once, at the transition that ends it, and
 * never again by a repeated or lost compare-and-set. */
static void test_metering(void **state)
{
	struct store *s = open_ok();
	const int64_t base = 1700000040000LL; /* a whole minute */
	struct usage_bucket b[4], tot;
	char t[40], x[40];
	int dur;

	customer(s, "acme", NULL);
	customer(s, "beta", NULL);
	/* 30 s of minute 0, all of minute 1, 30 s of minute 2; one task. */
	assert_int_equal(store_usage_add(s, "acme", base + 30000, base + 150000, 2, 256, base + 30000, 1, 0, 0), 0);
	assert_int_equal(store_usage_history(s, "acme", base, 60000, 4, b), 0);
	assert_int_equal(b[0].start_ms, base);
	assert_int_equal(b[3].start_ms, base + 180000);
	assert_int_equal(b[0].vcpu_ms, 60000);
	assert_int_equal(b[1].vcpu_ms, 120000);
	assert_int_equal(b[2].vcpu_ms, 60000);
	assert_int_equal(b[3].vcpu_ms, 0);
	assert_int_equal(b[1].mib_ms, 60000LL * 256);
	assert_int_equal(b[0].tasks, 1);
	assert_int_equal(b[1].tasks, 0);
	/* Adding again adds to the same rows. */
	assert_int_equal(store_usage_add(s, "acme", base + 60000, base + 61000, 1, 0, base + 60000, 0, 1, 0), 0);
	assert_int_equal(store_usage_history(s, "acme", base, 120000, 2, b), 0);
	assert_int_equal(b[0].vcpu_ms, 60000 + 120000 + 1000);
	assert_int_equal(b[0].sessions, 1);
	assert_int_equal(b[1].vcpu_ms, 60000);
	assert_int_equal(b[0].tasks, 1);
	/* Egress bytes go into at_ms's minute, added; negative ones count 0. */
	assert_int_equal(store_usage_add(s, "acme", 0, 0, 0, 0, base + 130000, 0, 0, 7000), 0);
	assert_int_equal(store_usage_add(s, "acme", 0, 0, 0, 0, base + 140000, 0, 0, 500), 0);
	assert_int_equal(store_usage_add(s, "acme", 0, 0, 0, 0, base + 140000, 0, 0, -9), 0);
	assert_int_equal(store_usage_history(s, "acme", base, 60000, 4, b), 0);
	assert_int_equal(b[2].egress_bytes, 7500);
	assert_int_equal(b[1].egress_bytes, 0);
	assert_int_equal(b[2].tasks, 0);
	assert_int_equal(b[2].vcpu_ms, 60000);
	/* Another customer's are its own; bad arguments are refused. */
	assert_int_equal(store_usage_history(s, "beta", base, 60000, 4, b), 0);
	assert_int_equal(b[1].vcpu_ms, 0);
	assert_int_equal(store_usage_history(s, "acme", base + 1, 60000, 4, b), -1);
	assert_int_equal(store_usage_history(s, "acme", base, 90000, 4, b), -1);

	/* A task: its VM time from starting to its end, once. */
	submit(s, "beta", t);
	assert_int_equal(store_task_schedule(s, t, "h1"), 1);
	assert_int_equal(store_task_transition(s, t, TASK_SCHEDULED, TASK_STARTING, NULL), 1);
	assert_int_equal(store_task_transition(s, t, TASK_STARTING, TASK_RUNNING, NULL), 1);
	{
		char q[120];

		snprintf(q, sizeof(q), "UPDATE tasks SET starting_ms = starting_ms - 90000 WHERE id = '%s'", t);
		sql(q);
	}
	assert_int_equal(store_task_transition(s, t, TASK_RUNNING, TASK_SUCCEEDED, NULL), 1);
	dur = sql_int("SELECT ended_ms - starting_ms FROM tasks");
	assert_true(dur >= 90000);
	usage_total(s, "beta", &tot);
	assert_int_equal(tot.vcpu_ms, dur);
	assert_int_equal(tot.mib_ms, (int64_t)dur * 256);
	assert_int_equal(tot.tasks, 1);
	/* Its end again (another replica's, a retry): no change, no count. */
	assert_int_equal(store_task_transition(s, t, TASK_RUNNING, TASK_SUCCEEDED, NULL), 0);
	assert_int_equal(store_task_finish(s, t, TASK_FAILED, "error", NULL), 0);
	usage_total(s, "beta", &tot);
	assert_int_equal(tot.vcpu_ms, dur);
	assert_int_equal(tot.tasks, 1);

	/* store_task_finish meters too; a task never started counts nothing. */
	submit(s, "beta", t);
	assert_int_equal(store_task_finish(s, t, TASK_CANCELLED, "cancelled", NULL), 1);
	usage_total(s, "beta", &tot);
	assert_int_equal(tot.tasks, 1);
	submit(s, "beta", t);
	assert_int_equal(store_task_schedule(s, t, "h1"), 1);
	assert_int_equal(store_task_transition(s, t, TASK_SCHEDULED, TASK_STARTING, NULL), 1);
	assert_int_equal(store_task_finish(s, t, TASK_FAILED, "error", NULL), 1);
	usage_total(s, "beta", &tot);
	assert_int_equal(tot.tasks, 2);

	/* Egress: a task's result's network.bytes_out, once, in the
	 * transaction that ends it, whichever replica (another store handle
	 * on the same database) commits the end; both read the same. */
	{
		struct store *s2 = open_ok();
		struct usage_bucket tot2;
		json_t *ht = json_pack("{s:s, s:{s:s, s:{s:s, s:I}}}", "state", "succeeded", "result", "end_reason",
				       "exited", "network", "egress", "allow", "bytes_out", (json_int_t)123456);
		json_t *bad = json_pack("{s:{s:{s:s}}}", "result", "network", "bytes_out", "many");

		usage_total(s, "beta", &tot);
		assert_int_equal(tot.egress_bytes, 0);
		submit(s, "beta", t);
		assert_int_equal(store_task_schedule(s, t, "h1"), 1);
		assert_int_equal(store_task_transition(s, t, TASK_SCHEDULED, TASK_STARTING, NULL), 1);
		assert_int_equal(store_task_finish(s2, t, TASK_SUCCEEDED, "exited", ht), 1);
		assert_int_equal(store_task_finish(s, t, TASK_SUCCEEDED, "exited", ht), 0);
		assert_int_equal(store_task_finish(s2, t, TASK_SUCCEEDED, "exited", ht), 0);
		usage_total(s, "beta", &tot);
		usage_total(s2, "beta", &tot2);
		assert_int_equal(tot.egress_bytes, 123456);
		assert_int_equal(tot.tasks, 3);
		assert_memory_equal(&tot, &tot2, sizeof(tot));
		/* A host's result without a number there adds no bytes. */
		submit(s, "beta", t);
		assert_int_equal(store_task_schedule(s, t, "h1"), 1);
		assert_int_equal(store_task_transition(s, t, TASK_SCHEDULED, TASK_STARTING, NULL), 1);
		assert_int_equal(store_task_finish(s, t, TASK_SUCCEEDED, "exited", bad), 1);
		usage_total(s2, "beta", &tot2);
		assert_int_equal(tot2.egress_bytes, 123456);
		assert_int_equal(tot2.tasks, 4);
		json_decref(ht);
		json_decref(bad);
		store_close(s2);
	}

	/* A session: started once; its running interval at its pause, none
	 * while paused, a new one after a resume at its destruction. */
	session_new(s, "acme", x);
	assert_int_equal(store_session_transition(s, x, SESSION_STARTING, SESSION_RUNNING, "h1", "", NULL), 1);
	{
		char q[120];

		snprintf(q, sizeof(q), "UPDATE sessions SET started_ms = started_ms - 120000 WHERE id = '%s'", x);
		sql(q);
	}
	assert_int_equal(store_session_transition(s, x, SESSION_RUNNING, SESSION_PAUSING, NULL, NULL, NULL), 1);
	usage_total(s, "acme", &tot);
	assert_int_equal(tot.sessions, 1);
	assert_int_equal(tot.vcpu_ms, 0); /* still its interval: not ended */
	assert_int_equal(store_session_transition(s, x, SESSION_PAUSING, SESSION_PAUSED, "", "paused", NULL), 1);
	dur = sql_int("SELECT paused_ms - started_ms FROM sessions");
	assert_true(dur >= 120000);
	usage_total(s, "acme", &tot);
	assert_int_equal(tot.vcpu_ms, dur);
	assert_int_equal(tot.mib_ms, (int64_t)dur * 256);
	assert_int_equal(store_session_transition(s, x, SESSION_PAUSING, SESSION_PAUSED, "", "paused", NULL), 0);
	assert_int_equal(store_session_transition(s, x, SESSION_PAUSED, SESSION_DESTROYED, "", "deleted", NULL), 1);
	usage_total(s, "acme", &tot);
	assert_int_equal(tot.vcpu_ms, dur);
	assert_int_equal(tot.sessions, 1);

	/* Stored levels: sampled into a minute (set, not added: a second
	 * sample there repeats it), the bucket's largest sample read back;
	 * deleted snapshots and volumes and forks are not counted. */
	sql("INSERT INTO snapshots(id, customer, name, session_id, kind, vcpus, memory_mib, bytes, created_ms, spec)"
	    " VALUES ('k1', 'beta', 'one', 's', 'named', 1, 256, 1000, 1, '{}'),"
	    " ('k2', 'beta', 'two', 's', 'named', 1, 256, 500, 1, '{}'),"
	    " ('k3', 'beta', NULL, 's', 'fork', 1, 256, 7000, 1, '{}')");
	sql("INSERT INTO snapshots(id, customer, name, session_id, kind, vcpus, memory_mib, bytes, created_ms,"
	    " deleted_ms, spec) VALUES ('k4', 'beta', 'gone', 's', 'named', 1, 256, 9000, 1, 2, '{}')");
	sql("INSERT INTO volumes(id, customer, name, size_mib, created_ms) VALUES ('v1', 'beta', 'data', 2048, 1)");
	/* Templates: the customer's ready ones (not failed, not built-in). */
	sql("INSERT INTO templates(id, customer, name, kind, state, size, created_ms) VALUES"
	    " ('tp1', 'beta', 'one', 'recipe', 'ready', 4000, 1), ('tp2', 'beta', 'two', 'recipe', 'failed', 99, 1),"
	    " ('tp3', '', 'base', 'recipe', 'ready', 777, 1), ('tp4', 'beta', 'three', 'recipe', 'ready', 1000, 1)");
	/* A paused session: what its pause sent, from the host's reply. */
	{
		json_t *snap = json_pack("{s:s, s:I}", "prefix", "beta/sessions/x/", "bytes", (json_int_t)3000);

		session_new(s, "beta", x);
		assert_int_equal(store_session_transition(s, x, SESSION_STARTING, SESSION_RUNNING, "h1", "", NULL), 1);
		assert_int_equal(store_session_transition(s, x, SESSION_RUNNING, SESSION_PAUSING, NULL, NULL, NULL), 1);
		assert_int_equal(store_session_transition(s, x, SESSION_PAUSING, SESSION_PAUSED, "", "paused", snap), 1);
		json_decref(snap);
	}
	assert_int_equal(store_usage_sample_stored(s, base + 5000), 0);
	assert_int_equal(store_usage_sample_stored(s, base + 6000), 0);
	sql("UPDATE snapshots SET deleted_ms = 3 WHERE id = 'k2'");
	assert_int_equal(store_usage_sample_stored(s, base + 65000), 0);
	assert_int_equal(store_usage_history(s, "beta", base, 60000, 4, b), 0);
	assert_int_equal(b[0].snapshot_bytes, 1500);
	assert_int_equal(b[0].volume_mib, 2048);
	assert_int_equal(b[0].template_bytes, 5000);
	assert_int_equal(b[0].pause_bytes, 3000);
	assert_int_equal(b[1].pause_bytes, 3000);
	assert_int_equal(b[0].egress_bytes, 0);
	assert_int_equal(b[1].snapshot_bytes, 1000);
	assert_int_equal(b[2].snapshot_bytes, 0);
	assert_int_equal(store_usage_history(s, "beta", base, 120000, 2, b), 0);
	assert_int_equal(b[0].snapshot_bytes, 1500);
	assert_int_equal(b[0].vcpu_ms, 0); /* levels leave the flows alone */
	assert_int_equal(store_usage_history(s, "acme", base, 60000, 4, b), 0);
	assert_int_equal(b[0].snapshot_bytes, 0);
	assert_int_equal(b[0].vcpu_ms, 60000); /* and the flows keep theirs */
	store_close(s);

	/* Durable: a reopened store reads the same. */
	s = open_ok();
	usage_total(s, "acme", &tot);
	assert_int_equal(tot.vcpu_ms, dur);
	assert_int_equal(tot.sessions, 1);
	store_close(s);
}

#define BOTH(t) cmocka_unit_test_setup(t, setup), cmocka_unit_test_setup(t, setup_pg)

int main(void)
{
	const struct CMUnitTest tests[] = {
		BOTH(test_migrations),
		BOTH(test_keys),
		BOTH(test_idempotency),
		BOTH(test_transitions),
		BOTH(test_fair_and_list),
		BOTH(test_usage_and_cancel),
		BOTH(test_hosts_and_changes),
		BOTH(test_durability),
		cmocka_unit_test(test_cursor_parse),
		cmocka_unit_test(test_names_and_ids),
		BOTH(test_task_page),
		BOTH(test_session_page),
		BOTH(test_cas_helper),
		BOTH(test_task_and_session_cas),
		BOTH(test_session_quota_resume_discard),
		BOTH(test_session_leases),
		BOTH(test_push_get),
		BOTH(test_tx_cleanup),
		BOTH(test_snapshots),
		BOTH(test_volumes),
		BOTH(test_metering),
		/* Replicas share one PostgreSQL: no SQLite pass to skip. */
		cmocka_unit_test_setup(test_replicas, setup_pg),
		cmocka_unit_test_setup(test_volume_replicas, setup_pg),
	};
	int r;
	char cmd[300];

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	r = cmocka_run_group_tests(tests, group_setup, group_teardown);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
	return r;
}
