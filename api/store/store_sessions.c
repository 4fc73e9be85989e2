/* store_sessions: the store's sessions (long-lived sandboxes): create and
 * resume under the running quota, compare-and-set changes of state, their
 * public JSON and list, the reaper's query, and the leases replicas hold on
 * sessions they have requests in flight on (store.h). Pages, single-row
 * reads and compare-and-set are the core's helpers, shared with tasks
 * (store.c). */
#include "store_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"

static const char *const session_names[SESSION_STATE_COUNT] = {
	"starting", "running", "pausing", "paused", "resuming", "destroyed", "error",
};

const char *session_state_name(enum session_state st)
{
	return st < SESSION_STATE_COUNT ? session_names[st] : "unknown";
}

enum session_state session_state_parse(const char *str)
{
	return (enum session_state)store_name_index(session_names, SESSION_STATE_COUNT, str);
}

/* Holding a VM: counted in the running quota. */
#define SESS_HOLDING "('starting', 'running', 'pausing', 'resuming')"
#define SESS_COLS                                                                                          \
	"id, customer, state, host_id, vcpus, memory_mib, idle_timeout_s, max_lifetime_s, egress,"         \
	" snapshot IS NOT NULL, created_ms, started_ms, last_active_ms, paused_ms, ended_ms, end_reason,"  \
	" metadata, snapshot, spec, seq, (SELECT u.name FROM template_uses u WHERE u.id = sessions.id),"   \
	" e2b_token, e2b_template, auto_pause, e2b_flags,"                                                 \
	" EXISTS (SELECT 1 FROM session_leases l WHERE l.session_id = sessions.id AND l.expires_ms > " SDB_NOW_MS "),"\
	" from_snapshot,"                                                                                  \
	" (" SESS_VOL " LIMIT 1), (" SESS_VOL " LIMIT 1 OFFSET 1)"
/* One of its volume mounts as "ID w|r NAME PATH" (ids and names have no
 * spaces; the path, last, may), by path: a session has at most two. */
#define SESS_VOL                                                                                           \
	"SELECT m.volume_id || ' ' || CASE WHEN m.read_only <> 0 THEN 'r' ELSE 'w' END || ' ' ||"          \
	" coalesce(v.name, '-') || ' ' || m.path FROM volume_mounts m LEFT JOIN volumes v ON v.id = m.volume_id" \
	" WHERE m.session_id = sessions.id ORDER BY m.path"
enum {
	SC_ID, SC_CUSTOMER, SC_STATE, SC_HOST, SC_VCPUS, SC_MEMORY, SC_IDLE, SC_LIFETIME, SC_EGRESS, SC_HAS_SNAP,
	SC_CREATED, SC_STARTED, SC_ACTIVE, SC_PAUSED, SC_ENDED, SC_END_REASON, SC_METADATA, SC_SNAPSHOT, SC_SPEC,
	SC_SEQ, SC_TEMPLATE, SC_E2B_TOKEN, SC_E2B_TEMPLATE, SC_AUTO_PAUSE, SC_E2B_FLAGS, SC_LEASED, SC_FROM_SNAPSHOT,
	SC_VOL0, SC_VOL1,
};

enum sessions_stmt {
	S_INSERT, S_GET, S_DISCARD, S_DISCARD_MOUNTS, S_TRANS, S_TOUCH, S_SPEC, S_HOLDING, S_LIST, S_LIST_ASC, S_E2B, S_LIMITS, S_SET_SPEC,
	S_LEASE_SET, S_LEASE_DROP, S_LEASE_RENEW, S_LEASE_DROP_OWNER, S_LEASE_GC, S_PAUSE_BYTES,
	S_COUNT
};

static const char *const sessions_sql[S_COUNT] = {
	[S_INSERT] = "INSERT INTO sessions(id, customer, state, host_id, vcpus, memory_mib, idle_timeout_s,"
		     " max_lifetime_s, egress, created_ms, started_ms, last_active_ms, metadata, spec, from_snapshot)"
		     " VALUES (?1, ?2, 'starting', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?9, ?10, ?11, ?12)",
	[S_GET] = "SELECT " SESS_COLS " FROM sessions WHERE id = ?1",
	[S_DISCARD] = "DELETE FROM sessions WHERE id = ?1 AND state = 'starting'",
	[S_DISCARD_MOUNTS] = "DELETE FROM volume_mounts WHERE session_id = ?1",
	/* :host and :reason: NULL keeps, '' clears; :snapshot: NULL keeps. */
	[S_TRANS] = "UPDATE sessions SET state = :to,"
		    " host_id = CASE WHEN :host IS NULL THEN host_id WHEN :host = '' THEN NULL ELSE :host END,"
		    " end_reason = CASE WHEN :reason IS NULL THEN end_reason WHEN :reason = '' THEN NULL"
		    "  ELSE :reason END,"
		    " snapshot = coalesce(:snapshot, snapshot),"
		    " started_ms = CASE WHEN :to = 'running' AND :from IN ('starting', 'resuming') THEN :now"
		    "  ELSE started_ms END,"
		    " last_active_ms = CASE WHEN :to = 'running' AND :from IN ('starting', 'resuming') THEN :now"
		    "  ELSE last_active_ms END,"
		    " paused_ms = CASE WHEN :to = 'paused' THEN :now ELSE paused_ms END,"
		    " ended_ms = CASE WHEN :to IN ('destroyed', 'error') THEN :now"
		    "  WHEN :to IN ('running', 'resuming') THEN NULL ELSE ended_ms END"
		    " WHERE id = :id AND state = :from",
	[S_TOUCH] = "UPDATE sessions SET last_active_ms = CASE WHEN last_active_ms > ?1 THEN last_active_ms ELSE ?1 END"
		   " WHERE id = ?2",
	[S_SPEC] = "SELECT spec FROM sessions WHERE id = ?1",
	[S_HOLDING] = "SELECT " SESS_COLS " FROM sessions WHERE state IN " SESS_HOLDING " ORDER BY seq LIMIT ?1",
	/* A page (store_page_run): ?1 customer (NULL: all), ?2 state (NULL:
	 * all but destroyed; 'all'), ?3 before seq, ?4 limit. */
	[S_LIST] = "SELECT " SESS_COLS " FROM sessions WHERE (?1 IS NULL OR customer = ?1)"
		   " AND (CASE WHEN ?2 IS NULL THEN state != 'destroyed' WHEN ?2 = 'all' THEN 1 = 1 ELSE state = ?2 END)"
		   " AND seq < ?3 ORDER BY seq DESC LIMIT ?4",
	/* Oldest first (E2B's order=asc): ?3 is the seq after which to start. */
	[S_LIST_ASC] = "SELECT " SESS_COLS " FROM sessions WHERE (?1 IS NULL OR customer = ?1)"
		       " AND (CASE WHEN ?2 IS NULL THEN state != 'destroyed' WHEN ?2 = 'all' THEN 1 = 1 ELSE state = ?2 END)"
		       " AND seq > ?3 ORDER BY seq ASC LIMIT ?4",
	[S_E2B] = "UPDATE sessions SET e2b_token = ?1, e2b_template = ?2, env = ?3, auto_pause = ?4, e2b_flags = ?6"
		  " WHERE id = ?5",
	[S_LIMITS] = "UPDATE sessions SET idle_timeout_s = ?1, max_lifetime_s = ?2 WHERE id = ?3"
		     " AND (?4 IS NULL OR customer = ?4)",
	/* Whatever its state now: its host has applied the spec already (a
	 * pause that took it meanwhile wrote it into the manifest). */
	[S_SET_SPEC] = "UPDATE sessions SET spec = ?1 WHERE id = ?2",
	/* Leases: ?1 session, ?2 owner, ?3 count, ?4 time to live (ms). */
	[S_LEASE_SET] = "INSERT INTO session_leases(session_id, owner, n, expires_ms)"
			" VALUES (?1, ?2, ?3, " SDB_NOW_MS " + ?4)"
			" ON CONFLICT(session_id, owner) DO UPDATE SET n = excluded.n, expires_ms = excluded.expires_ms",
	[S_LEASE_DROP] = "DELETE FROM session_leases WHERE session_id = ?1 AND owner = ?2",
	[S_LEASE_RENEW] = "UPDATE session_leases SET expires_ms = " SDB_NOW_MS " + ?2 WHERE owner = ?1",
	[S_LEASE_DROP_OWNER] = "DELETE FROM session_leases WHERE owner = ?1",
	[S_LEASE_GC] = "DELETE FROM session_leases WHERE expires_ms < " SDB_NOW_MS " - ?1",
	/* What its pause sent to S3 (metering's pause_bytes, store_usage.c). */
	[S_PAUSE_BYTES] = "UPDATE sessions SET pause_bytes = ?2 WHERE id = ?1",
};

_Static_assert(STORE_SLOTS_SESSIONS + S_COUNT <= STORE_SLOTS_TEMPLATES,
	       "store_sessions.c's statements overflow their slots");

static struct sdb_stmt *stmt(struct store *s, enum sessions_stmt id)
{
	return store_stmt(s, STORE_SLOTS_SESSIONS + id, sessions_sql[id]);
}

/* ---- rows ---- */

/* One row into elem, a struct store_session (store_rows' row). */
static void session_row(struct sdb_stmt *st, void *elem)
{
	struct store_session *out = elem;

	memset(out, 0, sizeof(*out));
	store_copy_col(st, SC_ID, out->id, sizeof(out->id));
	store_copy_col(st, SC_CUSTOMER, out->customer, sizeof(out->customer));
	store_copy_col(st, SC_HOST, out->host_id, sizeof(out->host_id));
	out->state = session_state_parse(store_col_text(st, SC_STATE));
	out->vcpus = (unsigned)sdb_col_int64(st, SC_VCPUS);
	out->memory_mib = (unsigned)sdb_col_int64(st, SC_MEMORY);
	out->idle_timeout_s = (unsigned)sdb_col_int64(st, SC_IDLE);
	out->max_lifetime_s = (unsigned)sdb_col_int64(st, SC_LIFETIME);
	out->egress = sdb_col_int(st, SC_EGRESS);
	out->has_snapshot = sdb_col_int(st, SC_HAS_SNAP);
	out->created_ms = sdb_col_int64(st, SC_CREATED);
	out->started_ms = sdb_col_int64(st, SC_STARTED);
	out->last_active_ms = sdb_col_int64(st, SC_ACTIVE);
	if (sdb_col_bytes(st, SC_E2B_TOKEN) == (int)sizeof(out->e2b_token_sha)) {
		memcpy(out->e2b_token_sha, sdb_col_blob(st, SC_E2B_TOKEN), sizeof(out->e2b_token_sha));
		out->has_e2b_token = 1;
	}
	store_copy_col(st, SC_E2B_TEMPLATE, out->e2b_template, sizeof(out->e2b_template));
	out->private_traffic = (sdb_col_int(st, SC_E2B_FLAGS) & STORE_E2B_PRIVATE) != 0;
	out->auto_resume = (sdb_col_int(st, SC_E2B_FLAGS) & STORE_E2B_AUTO_RESUME) != 0;
	out->auto_pause = sdb_col_null(st, SC_AUTO_PAUSE) ? -1
										 : sdb_col_int(st, SC_AUTO_PAUSE) != 0;
	out->leased = sdb_col_int(st, SC_LEASED) != 0;
	store_copy_col(st, SC_FROM_SNAPSHOT, out->from_snapshot, sizeof(out->from_snapshot));
}

/* Its volume mounts (SC_VOL0, SC_VOL1) as [{"name","id","path","read_only"}]. */
static json_t *volumes_json(struct sdb_stmt *st)
{
	json_t *arr = json_array();

	for (int c = SC_VOL0; arr && c <= SC_VOL1; c++) {
		const char *t = store_col_text(st, c);
		char id[40], mode[2], name[STORE_VOLUME_NAME_MAX + 1];
		int off = 0;

		if (!t || sscanf(t, "%39s %1s %63s %n", id, mode, name, &off) != 3 || !off)
			continue;
		json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:b}", "name", name, "id", id, "path", t + off,
						     "read_only", mode[0] == 'r'));
	}
	return arr;
}

/* The public JSON of the session row st is on. */
static json_t *session_row_json(struct sdb_stmt *st)
{
	const char *md = store_col_text(st, SC_METADATA), *snap = store_col_text(st, SC_SNAPSHOT);
	const char *spec = store_col_text(st, SC_SPEC);
	json_t *sp = spec ? json_loads(spec, 0, NULL) : NULL, *limits, *net, *j;
	enum session_state state = session_state_parse(store_col_text(st, SC_STATE));
	json_t *expires = json_null();

	limits = json_object_get(sp, "limits");
	net = json_object_get(sp, "network");
	if (session_state_holds(state)) {
		/* The earlier of the idle deadline and the end of its lifetime. */
		int64_t idle = sdb_col_int64(st, SC_ACTIVE) + sdb_col_int64(st, SC_IDLE) * 1000;
		int64_t life = sdb_col_int64(st, SC_STARTED) + sdb_col_int64(st, SC_LIFETIME) * 1000;

		expires = json_integer(idle < life ? idle : life);
	}
	j = json_pack("{s:s, s:s, s:s, s:o, s:s, s:O, s:O, s:I, s:I, s:o, s:I, s:I, s:I, s:o, s:o, s:o, s:o, s:o}",
		      "id", store_col_text(st, SC_ID), "customer", store_col_text(st, SC_CUSTOMER), "state",
		      session_state_name(state), "host", store_opt_str(st, SC_HOST), "image", "default", "limits",
		      limits ? limits : json_null(), "network", net ? net : json_null(), "idle_timeout_s",
		      (json_int_t)sdb_col_int64(st, SC_IDLE), "max_lifetime_s",
		      (json_int_t)sdb_col_int64(st, SC_LIFETIME), "metadata",
		      md ? json_loads(md, 0, NULL) : json_null(), "created_at",
		      (json_int_t)sdb_col_int64(st, SC_CREATED), "started_at",
		      (json_int_t)sdb_col_int64(st, SC_STARTED), "last_active_at",
		      (json_int_t)sdb_col_int64(st, SC_ACTIVE), "paused_at", store_opt_int(st, SC_PAUSED),
		      "ended_at", store_opt_int(st, SC_ENDED), "expires_at", expires, "end_reason",
		      store_opt_str(st, SC_END_REASON), "snapshot", snap ? json_loads(snap, 0, NULL) : json_null());
	json_decref(sp);
	/* The template it was created with (absent: the default). */
	if (j && store_col_text(st, SC_TEMPLATE))
		json_object_set_new(j, "template", json_string(store_col_text(st, SC_TEMPLATE)));
	/* The snapshot it was started from (absent: none). */
	if (j && store_col_text(st, SC_FROM_SNAPSHOT))
		json_object_set_new(j, "snapshot_id", json_string(store_col_text(st, SC_FROM_SNAPSHOT)));
	if (j)
		json_object_set_new(j, "volumes", volumes_json(st));
	return j;
}

/* ---- leases (the statements; the public functions are at the end) ---- */

/* Lock held: run st (bound); SDB_DONE -> 0, else -1. */
static int run_locked(struct store *s, struct sdb_stmt *st)
{
	int rc = st ? store_step(s, st) : SDB_ERROR;

	if (st)
		sdb_reset(st);
	return rc == SDB_DONE ? 0 : -1;
}

static int lease_set_locked(struct store *s, const char *id, const char *owner, unsigned n, int64_t ttl_ms)
{
	struct sdb_stmt *st = stmt(s, S_LEASE_SET);

	if (st) {
		sdb_bind_text(st, 1, id);
		sdb_bind_text(st, 2, owner);
		sdb_bind_int64(st, 3, n);
		sdb_bind_int64(st, 4, ttl_ms);
	}
	return run_locked(s, st);
}

static int lease_drop_locked(struct store *s, const char *id, const char *owner)
{
	struct sdb_stmt *st = stmt(s, S_LEASE_DROP);

	if (st) {
		sdb_bind_text(st, 1, id);
		sdb_bind_text(st, 2, owner);
	}
	return run_locked(s, st);
}

/* ---- create, discard ---- */

int store_session_create(struct store *s, const struct store_session_new *n, char id_out[40], struct kiln_err *err)
{
	int64_t now = clock_wall_ms();
	struct sdb_stmt *st;
	char id[40];
	int room;
	STORE_TX(tx);

	if (store_tx_start(&tx, s) < 0)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot begin: %s", sdb_errmsg(s->db));
	room = store_room_locked(s, n->customer, n->vcpus, n->memory_mib, 0, err);
	if (room == -ENOENT)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot read the quotas of %s", n->customer);
	if (room == -EIO)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot read the usage of %s", n->customer);
	if (room == -EDQUOT)
		return -EDQUOT;
	/* Its snapshot still there, in the transaction that records the
	 * session as its user: a deletion sees the one or the other. */
	if (n->from_snapshot) {
		int live = store_snapshot_live_locked(s, n->from_snapshot, n->customer);

		if (live < 0)
			goto fail_sql;
		if (!live) {
			kiln_err_set(err, KERR_NOT_FOUND, "snapshot: no such snapshot");
			return -ENOENT;
		}
	}
	if (store_new_id("s_", id) < 0)
		return kiln_err_set(err, KERR_INTERNAL, "no randomness");
	st = stmt(s, S_INSERT);
	if (!st)
		goto fail_sql;
	sdb_bind_text(st, 1, id);
	sdb_bind_text(st, 2, n->customer);
	store_bind_opt_text(st, 3, n->host_id);
	sdb_bind_int64(st, 4, n->vcpus);
	sdb_bind_int64(st, 5, n->memory_mib);
	sdb_bind_int64(st, 6, n->idle_timeout_s);
	sdb_bind_int64(st, 7, n->max_lifetime_s);
	sdb_bind_int64(st, 8, n->egress ? 1 : 0);
	sdb_bind_int64(st, 9, now);
	store_bind_opt_text(st, 10, n->metadata_json);
	sdb_bind_text(st, 11, n->spec_json);
	store_bind_opt_text(st, 12, n->from_snapshot);
	if (store_step(s, st) != SDB_DONE) {
		sdb_reset(st);
		goto fail_sql;
	}
	sdb_reset(st);
	if (n->template_use && store_template_use_insert_locked(s, id, n->template_use) < 0)
		goto fail_sql;
	/* From a snapshot: its template, as the snapshot recorded it. */
	if (!n->template_use && n->from_snapshot && store_template_use_copy_locked(s, id, n->from_snapshot) < 0)
		goto fail_sql;
	/* Its volumes: the one-writer rule checked and its mounts recorded
	 * with the row, under the customer's lock (store_room_locked took it). */
	if (n->nvolumes) {
		int vr = store_volume_attach_locked(s, id, n->customer, n->volumes, n->nvolumes, err);

		if (vr < 0)
			return vr;
	}
	if (n->lease_owner && lease_set_locked(s, id, n->lease_owner, 1, n->lease_ttl_ms) < 0)
		goto fail_sql;
	if (store_tx_commit(&tx) < 0)
		goto fail_sql;
	memcpy(id_out, id, strlen(id) + 1);
	return 0;
fail_sql:
	return kiln_err_set(err, KERR_STORE_ERROR, "cannot store the session: %s", sdb_errmsg(s->db));
}

int store_session_discard(struct store *s, const char *id)
{
	struct sdb_stmt *st;
	int n = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, S_DISCARD);
	if (st) {
		sdb_bind_text(st, 1, id);
		n = store_update_locked(s, st);
	}
	/* Its mounts with it: they held its volumes. */
	st = n > 0 ? stmt(s, S_DISCARD_MOUNTS) : NULL;
	if (st) {
		sdb_bind_text(st, 1, id);
		if (store_update_locked(s, st) < 0)
			n = -1;
	}
	pthread_mutex_unlock(&s->lock);
	return n > 0;
}

/* ---- changes of state ---- */

/* Lock held: the compare-and-set; 1 moved, 0 not, -1 error. */
static int transition_locked(struct store *s, const char *id, enum session_state from, enum session_state to,
			     const char *host_id, const char *reason, const char *snapshot, int64_t now)
{
	struct store_cas c = {
		.id = id, .from = session_state_name(from), .to = session_state_name(to), .host = host_id,
		.reason = reason, .snapshot = snapshot, .now = now,
	};
	struct sdb_stmt *st = stmt(s, S_TRANS);

	return st ? store_cas_locked(s, st, &c) : -1;
}

/* Lock held: a pause's stored bytes (the host's snapshot.bytes; absent,
 * negative or not an integer: 0) onto the session's row. 0 or -1. */
static int pause_bytes_locked(struct store *s, const char *id, json_t *snapshot)
{
	json_t *b = json_object_get(snapshot, "bytes");
	json_int_t v = json_is_integer(b) ? json_integer_value(b) : 0;
	struct sdb_stmt *st = stmt(s, S_PAUSE_BYTES);

	if (!st)
		return -1;
	sdb_bind_text(st, 1, id);
	sdb_bind_int64(st, 2, v > 0 ? (int64_t)v : 0);
	return store_update_locked(s, st) < 0 ? -1 : 0;
}

int store_session_transition(struct store *s, const char *id, enum session_state from, enum session_state to,
			     const char *host_id, const char *reason, json_t *snapshot)
{
	char *snap = snapshot ? json_dumps(snapshot, JSON_COMPACT) : NULL;
	int r;

	if (from >= SESSION_STATE_COUNT || to >= SESSION_STATE_COUNT || from == to || (snapshot && !snap)) {
		free(snap);
		return -1;
	}
	if (store_usage_session_metered(from, to)) {
		/* Metered: the change and its usage in one transaction, so that
		 * only the one compare-and-set that succeeds counts it. */
		int64_t now = clock_wall_ms();
		STORE_TX(tx);

		r = -1;
		if (store_tx_start(&tx, s) == 0) {
			r = transition_locked(s, id, from, to, host_id, reason, snap, now);
			if (r > 0 && to == SESSION_PAUSED && snapshot && pause_bytes_locked(s, id, snapshot) < 0)
				r = -1;
			if (r > 0 && (store_usage_session_locked(s, id, from, to, now) < 0 || store_tx_commit(&tx) < 0))
				r = -1;
		}
		store_tx_unlock(&tx);
	} else {
		pthread_mutex_lock(&s->lock);
		r = transition_locked(s, id, from, to, host_id, reason, snap, clock_wall_ms());
		pthread_mutex_unlock(&s->lock);
	}
	free(snap);
	if (r > 0) {
		/* Long-polls and other waiters on the store see sessions change too. */
		store_changed(s, id, "session", NULL);
	}
	return r;
}

int store_session_resume_begin(struct store *s, const char *id, const char *customer, const char *host_id,
			       enum session_state *prev, struct kiln_err *err)
{
	struct store_session cur;
	struct sdb_stmt *st;
	int found = 0, room;
	STORE_TX(tx);

	*prev = SESSION_STATE_COUNT;
	if (store_tx_start(&tx, s) < 0)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot begin: %s", sdb_errmsg(s->db));
	st = stmt(s, S_GET);
	if (!st)
		goto fail_sql;
	sdb_bind_text(st, 1, id);
	if (sdb_step(st) == SDB_ROW) {
		session_row(st, &cur);
		found = !customer || !strcmp(customer, cur.customer);
	}
	sdb_reset(st);
	if (!found)
		return 0;
	*prev = cur.state;
	if (!(cur.state == SESSION_PAUSED || (cur.state == SESSION_ERROR && cur.has_snapshot)))
		return 0;
	room = store_room_locked(s, cur.customer, cur.vcpus, cur.memory_mib, 1, err);
	if (room == -EDQUOT)
		return -EDQUOT;
	if (room < 0)
		goto fail_sql;
	/* end_reason stays until it runs again: a failed resume goes back with it. */
	if (transition_locked(s, id, cur.state, SESSION_RESUMING, host_id, NULL, NULL, clock_wall_ms()) != 1)
		goto fail_sql;
	if (store_tx_commit(&tx) < 0)
		goto fail_sql;
	store_tx_unlock(&tx);
	store_changed(s, id, "session", NULL);
	return 1;
fail_sql:
	return kiln_err_set(err, KERR_STORE_ERROR, "cannot resume the session: %s", sdb_errmsg(s->db));
}

int store_session_touch(struct store *s, const char *id)
{
	return store_stamp(s, STORE_SLOTS_SESSIONS + S_TOUCH, sessions_sql[S_TOUCH], id);
}

/* Run st (bound) under the lock held: 1 changed a row, 0 none, -1 error. */
int store_session_set_e2b(struct store *s, const char *id, const unsigned char token_sha[32], const char *template,
			  const char *env_json, int auto_pause, unsigned flags)
{
	struct sdb_stmt *st;
	int r = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, S_E2B);
	if (st) {
		sdb_bind_blob(st, 1, token_sha, 32);
		sdb_bind_text(st, 2, template ? template : "");
		store_bind_opt_text(st, 3, env_json);
		if (auto_pause < 0)
			sdb_bind_null(st, 4);
		else
			sdb_bind_int64(st, 4, auto_pause ? 1 : 0);
		sdb_bind_text(st, 5, id);
		sdb_bind_int64(st, 6, flags);
		r = store_update_locked(s, st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_session_set_limits(struct store *s, const char *id, const char *customer, unsigned idle_timeout_s,
			     unsigned max_lifetime_s)
{
	struct sdb_stmt *st;
	int r = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, S_LIMITS);
	if (st) {
		sdb_bind_int64(st, 1, idle_timeout_s);
		sdb_bind_int64(st, 2, max_lifetime_s);
		sdb_bind_text(st, 3, id);
		store_bind_opt_text(st, 4, customer);
		r = store_update_locked(s, st);
	}
	pthread_mutex_unlock(&s->lock);
	if (r > 0)
		store_changed(s, id, "session", NULL);
	return r;
}

int store_session_set_spec(struct store *s, const char *id, const char *spec_json)
{
	struct sdb_stmt *st;
	int r = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, S_SET_SPEC);
	if (st) {
		sdb_bind_text(st, 1, spec_json);
		sdb_bind_text(st, 2, id);
		r = store_update_locked(s, st);
	}
	pthread_mutex_unlock(&s->lock);
	if (r > 0)
		store_changed(s, id, "session", NULL);
	return r;
}

/* ---- reading ---- */

static int row_out(struct sdb_stmt *st, void *arg)
{
	session_row(st, arg);
	return 0;
}

/* "s" + 32 hex digits: E2B's spelling of a session id (no underscore, so
 * that it can be a DNS label). */
static int e2b_form(const char *id)
{
	return id[0] == 's' && strlen(id) == 33 && strspn(id + 1, "0123456789abcdef") == 32;
}

const char *store_session_id_canon(const char *id, char out[40])
{
	if (!e2b_form(id))
		return id;
	snprintf(out, 40, "s_%s", id + 1);
	return out;
}

const char *store_session_id_e2b(const char *id, char out[40])
{
	if (strncmp(id, "s_", 2) || strlen(id) != 34 || strspn(id + 2, "0123456789abcdef") != 32)
		return id;
	snprintf(out, 40, "s%s", id + 2);
	return out;
}

int store_session_get(struct store *s, const char *id, const char *customer, struct store_session *out)
{
	char canon[40];

	id = store_session_id_canon(id, canon);
	return store_row_by_id(s, STORE_SLOTS_SESSIONS + S_GET, sessions_sql[S_GET], id, customer, SC_CUSTOMER,
			       row_out, out) < 0
		       ? -ENOENT
		       : 0;
}

static int json_out(struct sdb_stmt *st, void *arg)
{
	*(json_t **)arg = session_row_json(st);
	return 0;
}

json_t *store_session_json(struct store *s, const char *id, const char *customer)
{
	json_t *j = NULL;

	store_row_by_id(s, STORE_SLOTS_SESSIONS + S_GET, sessions_sql[S_GET], id, customer, SC_CUSTOMER, json_out,
			&j);
	return j;
}

static int state_valid(const char *state)
{
	return !strcmp(state, "all") || session_state_parse(state) != SESSION_STATE_COUNT;
}

json_t *store_session_list(struct store *s, const char *customer, const char *state, unsigned limit,
			   const char *cursor, char **next_cursor, struct kiln_err *err)
{
	return store_session_list_order(s, customer, state, limit, cursor, 0, next_cursor, err);
}

json_t *store_session_list_order(struct store *s, const char *customer, const char *state, unsigned limit,
				 const char *cursor, int oldest_first, char **next_cursor, struct kiln_err *err)
{
	int q = oldest_first ? S_LIST_ASC : S_LIST;
	struct store_page p = {
		.slot = STORE_SLOTS_SESSIONS + q, .sql = sessions_sql[q], .customer = customer,
		.state = state, .state_valid = state_valid, .seq_col = SC_SEQ, .row_json = session_row_json,
		.what = "sessions", .ascending = oldest_first,
	};

	return store_page_run(s, &p, limit, cursor, next_cursor, err);
}

char *store_session_spec(struct store *s, const char *id)
{
	return store_text_by_id(s, STORE_SLOTS_SESSIONS + S_SPEC, sessions_sql[S_SPEC], id);
}

int store_sessions_holding(struct store *s, struct store_session *out, int max)
{
	return store_rows(s, STORE_SLOTS_SESSIONS + S_HOLDING, sessions_sql[S_HOLDING], NULL, out, sizeof(*out), max,
			  session_row);
}

/* ---- leases ---- */

/* Leases are not promises: a crash makes them meaningless (a restarted
 * kiln-api is a new owner; the old one's lapse), so their commits do not
 * wait for the disk (sdb_durable), nor does the touch that rides with them
 * (a crash that lost it brings an idle deadline forward by one request at
 * most). Lock held; returns whether to make commits durable again. */
static int relax_locked(struct store *s)
{
	return sdb_durable(s->db, 0) == 0;
}

static void unrelax_locked(struct store *s, int relaxed)
{
	if (relaxed && sdb_durable(s->db, 1) < 0)
		fprintf(stderr, "kiln-api: the store's commits may not be durable now: %s\n", sdb_errmsg(s->db));
}

/* One lease write (set when n > 0, else drop), with the touch in the same
 * transaction when asked: on the exec path the touch was a write already,
 * so the lease costs no commit of its own there. */
static int lease_write(struct store *s, const char *id, const char *owner, unsigned n, int64_t ttl_ms, int touch)
{
	int r = -1, relaxed;
	STORE_TX(tx);

	store_tx_lock(&tx, s);
	relaxed = relax_locked(s);
	if (!touch || store_tx_begin(&tx) == 0) {
		r = n ? lease_set_locked(s, id, owner, n, ttl_ms) : lease_drop_locked(s, id, owner);
		if (touch && r == 0 && store_stamp_locked(s, stmt(s, S_TOUCH), id) < 0)
			r = -1;
		if (touch && r == 0 && store_tx_commit(&tx) < 0)
			r = -1;
		store_tx_rollback(&tx);
	}
	unrelax_locked(s, relaxed);
	return r;
}

int store_session_lease_set(struct store *s, const char *id, const char *owner, unsigned n, int64_t ttl_ms,
			    int touch)
{
	return n ? lease_write(s, id, owner, n, ttl_ms, touch) : -1;
}

int store_session_lease_drop(struct store *s, const char *id, const char *owner, int touch)
{
	return lease_write(s, id, owner, 0, 0, touch);
}

int store_session_leases_renew(struct store *s, const char *owner, int64_t ttl_ms)
{
	struct sdb_stmt *st;
	int r = -1, relaxed;

	pthread_mutex_lock(&s->lock);
	relaxed = relax_locked(s);
	st = stmt(s, S_LEASE_RENEW);
	if (st) {
		sdb_bind_text(st, 1, owner);
		sdb_bind_int64(st, 2, ttl_ms);
		r = store_update_locked(s, st);
	}
	unrelax_locked(s, relaxed);
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_session_leases_replace(struct store *s, const char *owner, const char *const *ids,
				 const unsigned *counts, int n, int64_t ttl_ms)
{
	struct sdb_stmt *st;
	int r = -1, relaxed;
	STORE_TX(tx);

	store_tx_lock(&tx, s);
	relaxed = relax_locked(s);
	if (store_tx_begin(&tx) == 0) {
		st = stmt(s, S_LEASE_DROP_OWNER);
		if (st)
			sdb_bind_text(st, 1, owner);
		r = run_locked(s, st);
		for (int i = 0; r == 0 && i < n; i++)
			r = lease_set_locked(s, ids[i], owner, counts[i], ttl_ms) < 0 ? -1 : 0;
		if (r == 0 && store_tx_commit(&tx) < 0)
			r = -1;
		store_tx_rollback(&tx);
	}
	unrelax_locked(s, relaxed);
	return r;
}

int store_session_leases_gc(struct store *s, int64_t older_ms)
{
	struct sdb_stmt *st;
	int r = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, S_LEASE_GC);
	if (st) {
		sdb_bind_int64(st, 1, older_ms);
		r = store_update_locked(s, st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}
