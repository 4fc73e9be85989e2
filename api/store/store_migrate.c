/* store_migrate: the store's schema as an ordered list of migrations, each
 * applied once, in its own transaction, on open (or by `kiln-api migrate`);
 * a database newer than this kiln-api knows is refused. The same SQL serves
 * SQLite and PostgreSQL (sdb_pg.c turns INTEGER into BIGINT, BLOB into
 * BYTEA, AUTOINCREMENT into BIGSERIAL). Only store.c runs them. */
#include "store_int.h"

#include <stdio.h>

static const char *const migrations[STORE_SCHEMA_VERSION] = {
	/* 1: everything */
	"CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT NOT NULL, quotas TEXT NOT NULL,"
	"  created_ms INTEGER NOT NULL);"
	"CREATE TABLE keys (id TEXT PRIMARY KEY, customer TEXT REFERENCES customers(id), admin INTEGER NOT NULL,"
	"  hash BLOB NOT NULL UNIQUE, created_ms INTEGER NOT NULL, revoked_ms INTEGER);"
	"CREATE TABLE tasks (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
	"  customer TEXT NOT NULL, state TEXT NOT NULL, metadata TEXT, vcpus INTEGER NOT NULL,"
	"  memory_mib INTEGER NOT NULL, timeout_s INTEGER, output_mib INTEGER, idem_key TEXT, body_hash TEXT,"
	"  host_id TEXT, created_ms INTEGER NOT NULL, scheduled_ms INTEGER, starting_ms INTEGER,"
	"  running_ms INTEGER, uploading_ms INTEGER, ended_ms INTEGER, cancel_requested INTEGER NOT NULL DEFAULT 0,"
	"  cancel_sent_ms INTEGER, end_reason TEXT,"
	"  host_task TEXT);" /* last: it can be large, and columns after it would cost reading it */
	"CREATE UNIQUE INDEX tasks_idem ON tasks(customer, idem_key) WHERE idem_key IS NOT NULL;"
	"CREATE INDEX tasks_customer ON tasks(customer, seq);"
	"CREATE TABLE task_specs (id TEXT PRIMARY KEY, spec TEXT NOT NULL);"
	"CREATE TABLE hosts (id TEXT PRIMARY KEY, url TEXT NOT NULL, capacity TEXT NOT NULL,"
	"  last_heartbeat_ms INTEGER NOT NULL, registered_ms INTEGER NOT NULL, lost INTEGER NOT NULL DEFAULT 0);",
	/* 2: the scheduler's and the per-state list's access paths */
	"CREATE INDEX tasks_state ON tasks(state, seq);"
	"CREATE INDEX tasks_customer_state ON tasks(customer, state, seq);",
	/* 3: sessions (long-lived sandboxes) */
	"CREATE TABLE sessions (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
	"  customer TEXT NOT NULL, state TEXT NOT NULL, host_id TEXT, vcpus INTEGER NOT NULL,"
	"  memory_mib INTEGER NOT NULL, idle_timeout_s INTEGER NOT NULL, max_lifetime_s INTEGER NOT NULL,"
	"  egress INTEGER NOT NULL DEFAULT 0, created_ms INTEGER NOT NULL, started_ms INTEGER NOT NULL,"
	"  last_active_ms INTEGER NOT NULL, paused_ms INTEGER, ended_ms INTEGER, end_reason TEXT, metadata TEXT,"
	"  snapshot TEXT, spec TEXT NOT NULL);"
	"CREATE INDEX sessions_customer ON sessions(customer, seq);"
	"CREATE INDEX sessions_state ON sessions(state, seq);",
	/* 4: templates (docs/templates.md), what tasks and sessions use, clean-up */
	"CREATE TABLE templates (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
	"  customer TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, state TEXT NOT NULL,"
	"  recipe TEXT, oci_key TEXT, oci_size INTEGER, sha256 TEXT, size INTEGER, s3_key TEXT, tref TEXT,"
	"  host_id TEXT, attempts INTEGER NOT NULL DEFAULT 0, error_code TEXT, error_message TEXT,"
	"  created_ms INTEGER NOT NULL, started_ms INTEGER, finished_ms INTEGER, build_ms INTEGER,"
	"  log_total INTEGER NOT NULL DEFAULT 0, log TEXT NOT NULL DEFAULT '');"
	"CREATE UNIQUE INDEX templates_name ON templates(customer, name);"
	"CREATE INDEX templates_state ON templates(state, seq);"
	"CREATE INDEX templates_sha ON templates(sha256);"
	"CREATE TABLE template_uses (id TEXT PRIMARY KEY, template_id TEXT NOT NULL, name TEXT NOT NULL,"
	"  sha256 TEXT, builtin INTEGER NOT NULL DEFAULT 0, tref TEXT);"
	"CREATE INDEX template_uses_tid ON template_uses(template_id);"
	"CREATE INDEX template_uses_sha ON template_uses(sha256);"
	"CREATE TABLE template_gc (seq INTEGER PRIMARY KEY AUTOINCREMENT, build_id TEXT NOT NULL,"
	"  host_id TEXT, oci_key TEXT, sha256 TEXT, s3_key TEXT, created_ms INTEGER NOT NULL);"
	"CREATE TABLE build_usage (customer TEXT NOT NULL, day INTEGER NOT NULL, ms INTEGER NOT NULL,"
	"  PRIMARY KEY (customer, day));",
	/* 5: E2B's fields of a session (docs/e2b.md): its envd token's SHA-256, the
	 * templateID it was made with, its envVars, autoPause (NULL: the customer's) */
	"ALTER TABLE sessions ADD COLUMN e2b_token BLOB;"
	"ALTER TABLE sessions ADD COLUMN e2b_template TEXT;"
	"ALTER TABLE sessions ADD COLUMN env TEXT;"
	"ALTER TABLE sessions ADD COLUMN auto_pause INTEGER;",
	/* 6: customers' own S3 destinations (docs/api.md, "Destination"): the
	 * secret key sealed (api/base/destination.h); a task records the destination
	 * id its outputs went to when it was pushed to its host */
	"CREATE TABLE destinations (customer TEXT PRIMARY KEY, id TEXT NOT NULL UNIQUE, endpoint TEXT NOT NULL,"
	"  region TEXT NOT NULL, bucket TEXT NOT NULL, prefix TEXT NOT NULL, access_key TEXT NOT NULL,"
	"  secret_sealed BLOB NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL);"
	"ALTER TABLE tasks ADD COLUMN destination TEXT;",
	/* 7: replicas on PostgreSQL share each customer's submit-rate token
	 * bucket (api/store/quota.c's, in wall-clock ms) */
	"CREATE TABLE submit_buckets (customer TEXT PRIMARY KEY, tokens DOUBLE PRECISION NOT NULL,"
	"  last_ms INTEGER NOT NULL);",
	/* 8: session leases (store.h): which replica has requests in flight on
	 * a session, until when (the database's clock, ms). A few rows (the
	 * requests in flight): one b-tree (SQLite: WITHOUT ROWID), no other
	 * index, so that taking and dropping one writes as little as can be;
	 * the per-owner statements scan it. */
	"CREATE TABLE session_leases (session_id TEXT NOT NULL, owner TEXT NOT NULL, n INTEGER NOT NULL,"
	"  expires_ms INTEGER NOT NULL, PRIMARY KEY (session_id, owner)) WITHOUT ROWID;",
	/* 9: more of E2B's fields of a session (docs/e2b.md "Ports"): bit 0 its
	 * ports are private (network.allowPublicTraffic false: the traffic
	 * token is needed), bit 1 traffic resumes it when paused (autoResume) */
	"ALTER TABLE sessions ADD COLUMN e2b_flags INTEGER;",
	/* 10: named snapshots and forks (docs/api.md "Snapshots"): a running
	 * session's state kept in S3 under CUSTOMER/snapshots/ID/ with what
	 * starting sessions from it takes (its spec, limits; its template is
	 * a template_uses row under the snapshot's id). kind 'named' (the
	 * customer's, counted in max_snapshots/max_snapshot_mib) or 'fork'
	 * (hidden, the few seconds of a fork). deleted_ms: gone for the
	 * customer; the row stays until its objects in S3 are (no session
	 * started from it is left but destroyed ones). A session records the
	 * snapshot it was started from. */
	"CREATE TABLE snapshots (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
	"  customer TEXT NOT NULL, name TEXT, session_id TEXT NOT NULL, kind TEXT NOT NULL, host_id TEXT,"
	"  vcpus INTEGER NOT NULL, memory_mib INTEGER NOT NULL, egress INTEGER NOT NULL DEFAULT 0,"
	"  bytes INTEGER NOT NULL DEFAULT 0, stop_ms INTEGER, created_ms INTEGER NOT NULL, deleted_ms INTEGER,"
	"  spec TEXT NOT NULL);"
	"CREATE INDEX snapshots_customer ON snapshots(customer, seq);"
	"CREATE INDEX snapshots_deleted ON snapshots(deleted_ms) WHERE deleted_ms IS NOT NULL;"
	"ALTER TABLE sessions ADD COLUMN from_snapshot TEXT;"
	"CREATE INDEX sessions_from_snapshot ON sessions(from_snapshot) WHERE from_snapshot IS NOT NULL;",
	/* 11: volumes (docs/api.md "Volumes"): a customer's named file system
	 * kept in S3 under CUSTOMER/volumes/ID/ by the hosts that mount it.
	 * Names are unique per customer among volumes not deleted; a deleted
	 * one's row stays (deleted_ms) as history. volume_mounts: a session's
	 * mounts, written with the session's row; the one-writer rule and
	 * deletion look at those whose session is not destroyed. */
	"CREATE TABLE volumes (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
	"  customer TEXT NOT NULL, name TEXT NOT NULL, size_mib INTEGER NOT NULL, created_ms INTEGER NOT NULL,"
	"  deleted_ms INTEGER);"
	"CREATE UNIQUE INDEX volumes_name ON volumes(customer, name) WHERE deleted_ms IS NULL;"
	"CREATE TABLE volume_mounts (session_id TEXT NOT NULL, volume_id TEXT NOT NULL, path TEXT NOT NULL,"
	"  read_only INTEGER NOT NULL, PRIMARY KEY (session_id, volume_id));"
	"CREATE INDEX volume_mounts_volume ON volume_mounts(volume_id);",
	/* 12: drain (docs/api.md "Hosts"): an admin's drain of a host outlives a
	 * kiln-api restart; drain_deadline_ms (wall ms, NULL: none) is when
	 * its running tasks still there go back to the queue */
	"ALTER TABLE hosts ADD COLUMN drain INTEGER NOT NULL DEFAULT 0;"
	"ALTER TABLE hosts ADD COLUMN drain_deadline_ms INTEGER;",
	/* 13: metering (docs/api.md "Usage history"): per customer and wall
	 * minute (minute_ms, a multiple of 60000), the VM time that ended,
	 * weighted (vcpu_ms: ms x vCPUs, mib_ms: ms x MiB), the tasks and
	 * sessions started. Written by store_usage.c in the transaction that
	 * ends the interval, by adding (ON CONFLICT ... DO UPDATE). Besides,
	 * levels sampled once a minute by the leader (set, not added):
	 * snapshot_bytes (named snapshots kept), volume_mib (volumes' sizes). */
	"CREATE TABLE usage_minutes (customer TEXT NOT NULL, minute_ms INTEGER NOT NULL,"
	"  vcpu_ms INTEGER NOT NULL DEFAULT 0, mib_ms INTEGER NOT NULL DEFAULT 0,"
	"  tasks INTEGER NOT NULL DEFAULT 0, sessions INTEGER NOT NULL DEFAULT 0,"
	"  snapshot_bytes INTEGER NOT NULL DEFAULT 0, volume_mib INTEGER NOT NULL DEFAULT 0,"
	"  PRIMARY KEY (customer, minute_ms)) WITHOUT ROWID;",
	/* 14: more metering: egress_bytes (a flow: the bytes a task's sandbox
	 * sent out, as its host's result reports them, added with the task's
	 * VM time), pause_bytes and template_bytes (levels sampled as
	 * snapshot_bytes: paused sessions' stored bytes, ready templates'
	 * sizes). A session keeps what its last pause sent (pause_bytes, from
	 * the host's pause reply; 0 for pauses before this migration). */
	"ALTER TABLE usage_minutes ADD COLUMN egress_bytes INTEGER NOT NULL DEFAULT 0;"
	"ALTER TABLE usage_minutes ADD COLUMN pause_bytes INTEGER NOT NULL DEFAULT 0;"
	"ALTER TABLE usage_minutes ADD COLUMN template_bytes INTEGER NOT NULL DEFAULT 0;"
	"ALTER TABLE sessions ADD COLUMN pause_bytes INTEGER NOT NULL DEFAULT 0;",
};

int store_exec(struct sdb *db, const char *sql, struct kiln_err *err)
{
	return sdb_exec(db, sql, err);
}

int store_read_version(struct sdb *db)
{
	struct sdb_stmt *st;
	int v = -1;

	if (sdb_prepare(db, "SELECT version FROM schema_version", &st) < 0)
		return -1;
	if (sdb_step(st) == SDB_ROW)
		v = sdb_col_int(st, 0);
	sdb_finalize(st);
	return v;
}

/* PostgreSQL: replicas starting together take turns (a session advisory
 * lock, its key an arbitrary constant: "kiln" in ASCII). */
#define MIGRATE_LOCK "2019189102"

static int migrate_locked(struct sdb *db, int migrate, struct kiln_err *err)
{
	int v;

	if (store_exec(db, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)", err) < 0)
		return -1;
	if (store_exec(db, "INSERT INTO schema_version SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM schema_version)",
		       err) < 0)
		return -1;
	v = store_read_version(db);
	if (v < 0)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot read the schema version");
	if (v > STORE_SCHEMA_VERSION)
		return kiln_err_set(err, KERR_STORE_ERROR,
				    "the database has schema version %d, newer than this kiln-api knows (%d)", v,
				    STORE_SCHEMA_VERSION);
	if (v < STORE_SCHEMA_VERSION && !migrate)
		return kiln_err_set(err, KERR_STORE_ERROR,
				    "the database has schema version %d, this kiln-api wants %d: run kiln-api migrate", v,
				    STORE_SCHEMA_VERSION);
	for (; v < STORE_SCHEMA_VERSION; v++) {
		char bump[64];

		snprintf(bump, sizeof(bump), "UPDATE schema_version SET version = %d", v + 1);
		if (store_exec(db, "BEGIN IMMEDIATE", err) < 0)
			return -1;
		if (store_exec(db, migrations[v], err) < 0 || store_exec(db, bump, err) < 0) {
			char m[sizeof(err->message)];

			snprintf(m, sizeof(m), "%s", err ? err->message : "");
			store_exec(db, "ROLLBACK", NULL);
			return kiln_err_set(err, KERR_STORE_ERROR, "migration %d: %s", v + 1, m);
		}
		if (store_exec(db, "COMMIT", err) < 0)
			return -1;
	}
	return 0;
}

int store_migrate(struct sdb *db, int migrate, struct kiln_err *err)
{
	int r;

	if (sdb_kind(db) != SDB_PG)
		return migrate_locked(db, migrate, err);
	if (store_exec(db, "SELECT pg_advisory_lock(" MIGRATE_LOCK ")", err) < 0)
		return -1;
	r = migrate_locked(db, migrate, err);
	store_exec(db, "SELECT pg_advisory_unlock(" MIGRATE_LOCK ")", NULL);
	return r;
}

int store_schema_version(struct store *s)
{
	int v;

	pthread_mutex_lock(&s->lock);
	v = store_read_version(s->db);
	pthread_mutex_unlock(&s->lock);
	return v;
}
