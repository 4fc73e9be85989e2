/* store_usage: metering in kiln-api's store: per customer and wall-clock
 * minute, the weighted VM time of tasks and sessions and the tasks and
 * sessions started and the bytes tasks sent out (usage_minutes, migrations
 * 13 and 14), added in the transaction of the state change that ends an
 * interval (exactly once, whichever replica commits it); the stored
 * levels sampled by the leader; read back in buckets of a given step. */
#include "store_int.h"

#include <string.h>

enum usage_stmt {
	U_ADD, U_TASK, U_SESSION, U_HISTORY, U_SAMPLE_SNAP, U_SAMPLE_VOL, U_SAMPLE_PAUSE, U_SAMPLE_TMPL, U_COUNT_
};

static const char *const usage_sql[U_COUNT_] = {
	/* Both engines' upsert; the sums are the row's own plus the new. */
	[U_ADD] = "INSERT INTO usage_minutes(customer, minute_ms, vcpu_ms, mib_ms, tasks, sessions, egress_bytes)"
		  " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT(customer, minute_ms) DO UPDATE SET"
		  " vcpu_ms = usage_minutes.vcpu_ms + excluded.vcpu_ms, mib_ms = usage_minutes.mib_ms + excluded.mib_ms,"
		  " tasks = usage_minutes.tasks + excluded.tasks, sessions = usage_minutes.sessions + excluded.sessions,"
		  " egress_bytes = usage_minutes.egress_bytes + excluded.egress_bytes",
	[U_TASK] = "SELECT customer, vcpus, memory_mib, starting_ms, running_ms, ended_ms FROM tasks WHERE id = ?1",
	[U_SESSION] = "SELECT customer, vcpus, memory_mib, started_ms FROM sessions WHERE id = ?1",
	/* ?2 from, ?3 end (exclusive), ?4 step. */
	[U_HISTORY] = "SELECT (minute_ms - ?2) / ?4, sum(vcpu_ms), sum(mib_ms), sum(tasks), sum(sessions),"
		      " max(snapshot_bytes), max(volume_mib), sum(egress_bytes), max(pause_bytes), max(template_bytes)"
		      " FROM usage_minutes WHERE customer = ?1 AND minute_ms >= ?2 AND minute_ms < ?3"
		      " GROUP BY (minute_ms - ?2) / ?4",
	/* Levels, ?1 the minute: set (a second sample in the minute, by
	 * another replica that was leader a moment ago, only repeats it).
	 * What /v1/usage counts: named snapshots, volumes not deleted. */
	[U_SAMPLE_SNAP] = "INSERT INTO usage_minutes(customer, minute_ms, snapshot_bytes)"
			  " SELECT customer, ?1, sum(bytes) FROM snapshots WHERE kind = 'named' AND deleted_ms IS NULL"
			  " GROUP BY customer"
			  " ON CONFLICT(customer, minute_ms) DO UPDATE SET snapshot_bytes = excluded.snapshot_bytes",
	[U_SAMPLE_VOL] = "INSERT INTO usage_minutes(customer, minute_ms, volume_mib)"
			 " SELECT customer, ?1, sum(size_mib) FROM volumes WHERE deleted_ms IS NULL GROUP BY customer"
			 " ON CONFLICT(customer, minute_ms) DO UPDATE SET volume_mib = excluded.volume_mib",
	/* Paused sessions: what their last pause sent to S3 (the host's
	 * reply's snapshot.bytes, kept in sessions.pause_bytes). */
	[U_SAMPLE_PAUSE] = "INSERT INTO usage_minutes(customer, minute_ms, pause_bytes)"
			   " SELECT customer, ?1, sum(pause_bytes) FROM sessions WHERE state = 'paused' GROUP BY customer"
			   " ON CONFLICT(customer, minute_ms) DO UPDATE SET pause_bytes = excluded.pause_bytes",
	/* The customer's ready templates (built-in ones have no customer). */
	[U_SAMPLE_TMPL] = "INSERT INTO usage_minutes(customer, minute_ms, template_bytes)"
			  " SELECT customer, ?1, sum(size) FROM templates WHERE state = 'ready' AND customer <> ''"
			  " AND size IS NOT NULL GROUP BY customer"
			  " ON CONFLICT(customer, minute_ms) DO UPDATE SET template_bytes = excluded.template_bytes",
};

_Static_assert(STORE_SLOTS_USAGE + U_COUNT_ <= STORE_SLOTS_MAX, "store_usage.c's statements overflow their slots");

static struct sdb_stmt *stmt(struct store *s, enum usage_stmt id)
{
	return store_stmt(s, STORE_SLOTS_USAGE + id, usage_sql[id]);
}

static int64_t minute_of(int64_t ms)
{
	int64_t m = ms / STORE_USAGE_MINUTE_MS;

	if (ms < 0 && ms % STORE_USAGE_MINUTE_MS)
		m--;
	return m * STORE_USAGE_MINUTE_MS;
}

/* One upsert (lock held): 0 or -1. */
static int add_one_locked(struct store *s, const char *customer, int64_t minute, int64_t ms, unsigned vcpus,
			  unsigned mib, unsigned tasks, unsigned sessions, int64_t egress_bytes)
{
	struct sdb_stmt *st = stmt(s, U_ADD);

	if (!st)
		return -1;
	sdb_bind_text(st, 1, customer);
	sdb_bind_int64(st, 2, minute);
	sdb_bind_int64(st, 3, ms * (int64_t)vcpus);
	sdb_bind_int64(st, 4, ms * (int64_t)mib);
	sdb_bind_int64(st, 5, tasks);
	sdb_bind_int64(st, 6, sessions);
	sdb_bind_int64(st, 7, egress_bytes);
	return store_update_locked(s, st) < 0 ? -1 : 0;
}

static int add_locked(struct store *s, const char *customer, int64_t start_ms, int64_t end_ms, unsigned vcpus,
		      unsigned mib, int64_t at_ms, unsigned tasks, unsigned sessions, int64_t egress_bytes)
{
	int64_t m, first, last;

	if (egress_bytes < 0)
		egress_bytes = 0;
	/* The counts and the bytes go into at_ms's minute (bytes counted at
	 * the end that reports them, not spread over the interval). */
	if (tasks || sessions || egress_bytes)
		if (add_one_locked(s, customer, minute_of(at_ms), 0, 0, 0, tasks, sessions, egress_bytes) < 0)
			return -1;
	if (end_ms <= start_ms || (!vcpus && !mib))
		return 0;
	first = minute_of(start_ms);
	last = minute_of(end_ms - 1);
	/* Bounded work per transition: beyond the cap, the oldest part of
	 * the interval is added to the first minute written. */
	if ((last - first) / STORE_USAGE_MINUTE_MS >= STORE_USAGE_SPLIT_MAX)
		first = last - (STORE_USAGE_SPLIT_MAX - 1) * STORE_USAGE_MINUTE_MS;
	for (m = first; m <= last; m += STORE_USAGE_MINUTE_MS) {
		int64_t a = m == first ? start_ms : m, b = m + STORE_USAGE_MINUTE_MS < end_ms ? m + STORE_USAGE_MINUTE_MS : end_ms;

		if (b > a && add_one_locked(s, customer, m, b - a, vcpus, mib, 0, 0, 0) < 0)
			return -1;
	}
	return 0;
}

int store_usage_add(struct store *s, const char *customer, int64_t start_ms, int64_t end_ms, unsigned vcpus,
		    unsigned mib, int64_t at_ms, unsigned tasks, unsigned sessions, int64_t egress_bytes)
{
	int r;
	STORE_TX(tx);

	if (store_tx_start(&tx, s) < 0)
		return -1;
	r = add_locked(s, customer, start_ms, end_ms, vcpus, mib, at_ms, tasks, sessions, egress_bytes);
	if (r < 0 || store_tx_commit(&tx) < 0)
		return -1;
	return 0;
}

int store_usage_task_locked(struct store *s, const char *id, int64_t egress_bytes)
{
	struct sdb_stmt *st = stmt(s, U_TASK);
	char customer[65] = "";
	int64_t start = 0, end = 0;
	unsigned vcpus = 0, mib = 0, started = 0;
	int found = 0;

	if (!st)
		return -1;
	sdb_bind_text(st, 1, id);
	if (store_step(s, st) == SDB_ROW && !sdb_col_null(st, 5)) {
		found = 1;
		store_copy_col(st, 0, customer, sizeof(customer));
		vcpus = (unsigned)sdb_col_int64(st, 1);
		mib = (unsigned)sdb_col_int64(st, 2);
		/* Its VM from the start of its boot; a task that never started
		 * (cancelled while queued) has no time and is not counted. */
		if (!sdb_col_null(st, 3)) {
			start = sdb_col_int64(st, 3);
			started = 1;
		} else if (!sdb_col_null(st, 4)) {
			start = sdb_col_int64(st, 4);
			started = 1;
		}
		end = sdb_col_int64(st, 5);
	}
	sdb_reset(st);
	if (!found || !started)
		return 0;
	/* The task in its start's minute; the bytes it sent in its end's. */
	if (add_locked(s, customer, start, end, vcpus, mib, start, 1, 0, 0) < 0)
		return -1;
	return egress_bytes > 0 ? add_locked(s, customer, 0, 0, 0, 0, end, 0, 0, egress_bytes) : 0;
}

int store_usage_session_metered(enum session_state from, enum session_state to)
{
	if (from == SESSION_STARTING && to == SESSION_RUNNING)
		return 1;
	return (from == SESSION_RUNNING || from == SESSION_PAUSING) &&
	       (to == SESSION_PAUSED || to == SESSION_DESTROYED || to == SESSION_ERROR);
}

int store_usage_session_locked(struct store *s, const char *id, enum session_state from, enum session_state to,
			       int64_t now)
{
	struct sdb_stmt *st;
	char customer[65] = "";
	int64_t started = 0;
	unsigned vcpus = 0, mib = 0;
	int found = 0;

	if (!store_usage_session_metered(from, to))
		return 0;
	st = stmt(s, U_SESSION);
	if (!st)
		return -1;
	sdb_bind_text(st, 1, id);
	if (store_step(s, st) == SDB_ROW) {
		found = 1;
		store_copy_col(st, 0, customer, sizeof(customer));
		vcpus = (unsigned)sdb_col_int64(st, 1);
		mib = (unsigned)sdb_col_int64(st, 2);
		started = sdb_col_int64(st, 3);
	}
	sdb_reset(st);
	if (!found)
		return 0;
	if (to == SESSION_RUNNING)
		return add_locked(s, customer, 0, 0, 0, 0, now, 0, 1, 0);
	return add_locked(s, customer, started, now, vcpus, mib, now, 0, 0, 0);
}

int store_usage_sample_stored(struct store *s, int64_t now)
{
	static const enum usage_stmt which[] = { U_SAMPLE_SNAP, U_SAMPLE_VOL, U_SAMPLE_PAUSE, U_SAMPLE_TMPL };
	STORE_TX(tx);

	if (store_tx_start(&tx, s) < 0)
		return -1;
	for (size_t i = 0; i < sizeof(which) / sizeof(which[0]); i++) {
		struct sdb_stmt *st = stmt(s, which[i]);

		if (!st)
			return -1;
		sdb_bind_int64(st, 1, minute_of(now));
		if (store_update_locked(s, st) < 0)
			return -1;
	}
	return store_tx_commit(&tx);
}

int store_usage_history(struct store *s, const char *customer, int64_t from_ms, int64_t step_ms, int n,
			struct usage_bucket *out)
{
	struct sdb_stmt *st;
	int r = 0, rc;

	if (n <= 0 || step_ms <= 0 || step_ms % STORE_USAGE_MINUTE_MS || minute_of(from_ms) != from_ms)
		return -1;
	for (int i = 0; i < n; i++) {
		memset(&out[i], 0, sizeof(out[i]));
		out[i].start_ms = from_ms + (int64_t)i * step_ms;
	}
	pthread_mutex_lock(&s->lock);
	st = stmt(s, U_HISTORY);
	if (!st) {
		pthread_mutex_unlock(&s->lock);
		return -1;
	}
	sdb_bind_text(st, 1, customer);
	sdb_bind_int64(st, 2, from_ms);
	sdb_bind_int64(st, 3, from_ms + (int64_t)n * step_ms);
	sdb_bind_int64(st, 4, step_ms);
	while ((rc = store_step(s, st)) == SDB_ROW) {
		int64_t i = sdb_col_int64(st, 0);

		if (i < 0 || i >= n)
			continue;
		out[i].vcpu_ms = sdb_col_int64(st, 1);
		out[i].mib_ms = sdb_col_int64(st, 2);
		out[i].tasks = sdb_col_int64(st, 3);
		out[i].sessions = sdb_col_int64(st, 4);
		out[i].snapshot_bytes = sdb_col_int64(st, 5);
		out[i].volume_mib = sdb_col_int64(st, 6);
		out[i].egress_bytes = sdb_col_int64(st, 7);
		out[i].pause_bytes = sdb_col_int64(st, 8);
		out[i].template_bytes = sdb_col_int64(st, 9);
	}
	if (rc != SDB_DONE)
		r = -1;
	sdb_reset(st);
	pthread_mutex_unlock(&s->lock);
	return r;
}
