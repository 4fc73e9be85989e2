/* store_tasks: the store's tasks: submission (with group commit and
 * idempotency keys), their public JSON and lists, compare-and-set state
 * changes, the quota-checked schedule, cancel, and the scheduler's queries.
 *
 * Group commit: a commit costs an fsync (a few ms), so submissions that
 * arrive while one is being committed wait and then go to disk together in
 * the next transaction, each inside a savepoint of its own (one failing
 * insert does not take the others with it). Whoever finds no commit under
 * way leads the next batch; the others sleep until theirs is done. */
#include "store_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "quota.h"

static const char *const state_names[TASK_STATE_COUNT] = {
	"queued", "scheduled", "starting", "running", "uploading",
	"succeeded", "failed", "timed_out", "cancelled", "error",
};

const char *task_state_name(enum task_state st)
{
	return st < TASK_STATE_COUNT ? state_names[st] : "unknown";
}

void store_task_changed(struct store *s, const char *task_id, enum task_state st, int64_t at)
{
	store_changed(s, task_id, "state",
		      json_pack("{s:s, s:I}", "state", task_state_name(st), "at", (json_int_t)at));
}

enum task_state task_state_parse(const char *str)
{
	return (enum task_state)store_name_index(state_names, TASK_STATE_COUNT, str);
}

#define TASK_COLS                                                                                         \
	"id, customer, state, metadata, vcpus, memory_mib, timeout_s, output_mib, host_id, created_ms,"   \
	" scheduled_ms, starting_ms, running_ms, uploading_ms, ended_ms, cancel_requested, end_reason,"  \
	" idem_key, seq"
enum {
	TC_ID, TC_CUSTOMER, TC_STATE, TC_METADATA, TC_VCPUS, TC_MEMORY, TC_TIMEOUT, TC_OUTPUT, TC_HOST,
	TC_CREATED, TC_SCHEDULED, TC_STARTING, TC_RUNNING, TC_UPLOADING, TC_ENDED, TC_CANCEL_REQ, TC_END_REASON,
	TC_IDEM, TC_SEQ, TC_HOST_TASK, TC_TEMPLATE, TC_DEST,
};
#define SCHED_BASE "id, customer, state, vcpus, memory_mib, host_id, seq, created_ms, cancel_requested"
/* Whether the task asks for network egress: only hosts that offer it take it. */
#define LIST_TEMPLATE ", NULL, (SELECT u.name FROM template_uses u WHERE u.id = tasks.id)"
#define SCHED_EGRESS "coalesce((SELECT CASE WHEN json_extract(sp.spec, '$.network.egress') = 'allow'"     \
		     " THEN 1 ELSE 0 END FROM task_specs sp WHERE sp.id = tasks.id), 0) AS egress"
/* Its template, as the scheduler matches it against hosts' heartbeats. */
#define SCHED_TKEY "coalesce((SELECT CASE WHEN u.builtin <> 0 THEN '@' || u.name ELSE u.sha256 END"       \
		   " FROM template_uses u WHERE u.id = tasks.id), '') AS tkey"
#define SCHED_COLS SCHED_BASE ", " SCHED_EGRESS ", " SCHED_TKEY

enum tasks_stmt {
	T_INSERT, T_SPEC_INSERT, T_IDEM_FIND, T_GET, T_SPEC_GET, T_STATE,
	T_FINISH, T_IN_STATE, T_FAIR,
	T_CANCEL_NOW, T_CANCEL_REQ, T_CANCEL_PENDING, T_CANCEL_SENT,
	T_LIST_ALL, T_LIST_ALL_STATE, T_LIST_CUST, T_LIST_CUST_STATE,
	T_QUEUED, T_BUCKET_GET, T_BUCKET_PUT, T_PUSH_GET,
	T_COUNT
};

static const char *const tasks_sql[T_COUNT] = {
	[T_INSERT] = "INSERT INTO tasks(id, customer, state, metadata, vcpus, memory_mib, timeout_s, output_mib,"
		     " idem_key, body_hash, created_ms) VALUES (?1, ?2, 'queued', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
	[T_SPEC_INSERT] = "INSERT INTO task_specs(id, spec) VALUES (?1, ?2)",
	[T_IDEM_FIND] = "SELECT id, body_hash FROM tasks WHERE customer = ?1 AND idem_key = ?2",
	[T_GET] = "SELECT " TASK_COLS ", host_task, (SELECT u.name FROM template_uses u WHERE u.id = tasks.id),"
		  " destination FROM tasks WHERE id = ?1",
	[T_SPEC_GET] = "SELECT spec FROM task_specs WHERE id = ?1",
	/* push: the task, its spec, template and destination in one statement. */
	[T_PUSH_GET] = "SELECT t.state, t.host_id, sp.spec, u.tref, d.id, d.endpoint, d.region,"
		       " d.bucket, d.prefix, d.access_key, d.secret_sealed, d.created_ms, d.updated_ms"
		       " FROM tasks t LEFT JOIN task_specs sp ON sp.id = t.id"
		       " LEFT JOIN template_uses u ON u.id = t.id"
		       " LEFT JOIN destinations d ON d.customer = t.customer WHERE t.id = ?1",
	[T_STATE] = "SELECT state, customer FROM tasks WHERE id = ?1",
	[T_FINISH] = "UPDATE tasks SET state = ?1, end_reason = ?2, host_task = ?3, ended_ms = ?4"
		     " WHERE id = ?5 AND state IN ('queued', 'scheduled', 'starting', 'running', 'uploading')",
	[T_IN_STATE] = "SELECT " SCHED_COLS " FROM tasks WHERE state = ?1 ORDER BY seq LIMIT ?2",
	[T_FAIR] = "SELECT " SCHED_BASE ", egress, tkey FROM (SELECT " SCHED_COLS ", row_number() OVER"
		   " (PARTITION BY customer ORDER BY seq) AS rn FROM tasks WHERE state = 'queued') AS q"
		   " ORDER BY rn, seq LIMIT ?1",
	[T_CANCEL_NOW] = "UPDATE tasks SET state = 'cancelled', end_reason = 'cancelled', ended_ms = ?1,"
			 " cancel_requested = 1 WHERE id = ?2 AND state IN ('queued', 'scheduled')",
	[T_CANCEL_REQ] = "UPDATE tasks SET cancel_requested = 1 WHERE id = ?1 AND state IN ('starting', 'running')"
			 " AND cancel_requested = 0",
	[T_CANCEL_PENDING] = "SELECT " SCHED_COLS " FROM tasks WHERE cancel_requested = 1 AND cancel_sent_ms IS NULL"
			     " AND state IN ('starting', 'running') ORDER BY seq LIMIT ?1",
	[T_CANCEL_SENT] = "UPDATE tasks SET cancel_sent_ms = ?1 WHERE id = ?2",
	/* Pages (store_page_run): ?1 customer, ?2 state, ?3 before seq, ?4 limit.
	 * The template's name too (TC_TEMPLATE; no host_task in a list). */
	[T_LIST_ALL] = "SELECT " TASK_COLS LIST_TEMPLATE " FROM tasks WHERE seq < ?3 ORDER BY seq DESC LIMIT ?4",
	[T_LIST_ALL_STATE] = "SELECT " TASK_COLS LIST_TEMPLATE " FROM tasks WHERE state = ?2 AND seq < ?3"
			     " ORDER BY seq DESC LIMIT ?4",
	[T_LIST_CUST] = "SELECT " TASK_COLS LIST_TEMPLATE " FROM tasks WHERE customer = ?1 AND seq < ?3"
			" ORDER BY seq DESC LIMIT ?4",
	[T_LIST_CUST_STATE] = "SELECT " TASK_COLS LIST_TEMPLATE " FROM tasks WHERE customer = ?1 AND state = ?2"
			      " AND seq < ?3 ORDER BY seq DESC LIMIT ?4",
	/* Shared quotas (store_submit.shared). */
	[T_QUEUED] = "SELECT count(*) FROM tasks WHERE customer = ?1 AND state = 'queued'",
	[T_BUCKET_GET] = "SELECT tokens, last_ms FROM submit_buckets WHERE customer = ?1",
	[T_BUCKET_PUT] = "INSERT INTO submit_buckets(customer, tokens, last_ms) VALUES (?1, ?2, ?3)"
			 " ON CONFLICT(customer) DO UPDATE SET tokens = excluded.tokens, last_ms = excluded.last_ms",
};

/* After the statements: one transition statement per target state. */
#define T_TRANS_SLOT(to) (STORE_SLOTS_TASKS + T_COUNT + (int)(to))
_Static_assert(STORE_SLOTS_TASKS + T_COUNT + TASK_STATE_COUNT <= STORE_SLOTS_SESSIONS,
	       "store_tasks.c's statements overflow their slots");

static struct sdb_stmt *stmt(struct store *s, enum tasks_stmt id)
{
	return store_stmt(s, STORE_SLOTS_TASKS + id, tasks_sql[id]);
}

/* ---- submission ---- */

/* One submission on its way into a batch (on its submitter's stack). */
struct pending_submit {
	const struct store_submit *t;
	struct kiln_err *err;
	char id[40];
	int64_t at; /* when it was recorded */
	int r;      /* store_task_submit's result, once done */
	int done;
	struct pending_submit *next;
};

/* Lock held. */
static int idem_find_locked(struct store *s, const char *customer, const char *idem_key, const char *body_hash,
			    char id_out[40], struct kiln_err *err)
{
	struct sdb_stmt *st = stmt(s, T_IDEM_FIND);
	int r = 0;

	if (!st)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot look the idempotency key up");
	sdb_bind_text(st, 1, customer);
	sdb_bind_text(st, 2, idem_key);
	if (sdb_step(st) == SDB_ROW) {
		const char *h = store_col_text(st, 1);

		store_copy_col(st, 0, id_out, 40);
		if (h && body_hash && !strcmp(h, body_hash))
			r = 1;
		else
			r = kiln_err_set(err, KERR_IDEMPOTENCY_CONFLICT,
					 "Idempotency-Key was used for task %s with a different request body", id_out);
	}
	sdb_reset(st);
	return r;
}

int store_task_idem_find(struct store *s, const char *customer, const char *idem_key, const char *body_hash,
			 char id_out[40], struct kiln_err *err)
{
	int r;

	pthread_mutex_lock(&s->lock);
	r = idem_find_locked(s, customer, idem_key, body_hash, id_out, err);
	pthread_mutex_unlock(&s->lock);
	return r;
}

/* The shared submit rate and queue depth of t's customer (the batch holds
 * its lock): 0 admitted (a token taken), -1 with p->err. Lock held. */
static int shared_quota_locked(struct store *s, struct pending_submit *p, int64_t now)
{
	const struct store_submit *t = p->t;
	struct sdb_stmt *st;
	int64_t retry = 0;
	int rc;

	if (t->submit_rate > 0) {
		struct quota_bucket b = { 0 };
		char tok[40];

		st = stmt(s, T_BUCKET_GET);
		if (!st)
			return kiln_err_set(p->err, KERR_STORE_ERROR, "cannot read the submit rate");
		sdb_bind_text(st, 1, t->customer);
		rc = sdb_step(st);
		if (rc == SDB_ROW) {
			const char *v = sdb_col_text(st, 0);

			b.tokens = v ? strtod(v, NULL) : 0;
			b.last_ms = sdb_col_int64(st, 1);
			b.started = 1;
		}
		sdb_reset(st);
		if (rc != SDB_ROW && rc != SDB_DONE)
			return kiln_err_set(p->err, KERR_STORE_ERROR, "cannot read the submit rate");
		if (!quota_bucket_take(&b, t->submit_rate, t->submit_burst, now, &retry)) {
			if (t->retry_ms)
				*t->retry_ms = retry;
			return kiln_err_set(p->err, KERR_RATE_LIMITED,
					    "more than %g submissions per second (burst %u): retry in %lld s", t->submit_rate,
					    t->submit_burst, (long long)(retry > 1000 ? (retry + 999) / 1000 : 1));
		}
		st = stmt(s, T_BUCKET_PUT);
		if (!st)
			return kiln_err_set(p->err, KERR_STORE_ERROR, "cannot record the submit rate");
		snprintf(tok, sizeof(tok), "%.17g", b.tokens);
		sdb_bind_text(st, 1, t->customer);
		sdb_bind_text(st, 2, tok);
		sdb_bind_int64(st, 3, b.last_ms);
		rc = store_step(s, st);
		sdb_reset(st);
		if (rc != SDB_DONE)
			return kiln_err_set(p->err, KERR_STORE_ERROR, "cannot record the submit rate");
	}
	if (t->max_queued) {
		int64_t n = -1;

		st = stmt(s, T_QUEUED);
		if (!st)
			return kiln_err_set(p->err, KERR_STORE_ERROR, "cannot count the queue");
		sdb_bind_text(st, 1, t->customer);
		if (sdb_step(st) == SDB_ROW)
			n = sdb_col_int64(st, 0);
		sdb_reset(st);
		if (n < 0)
			return kiln_err_set(p->err, KERR_STORE_ERROR, "cannot count the queue");
		if (n >= t->max_queued)
			return kiln_err_set(p->err, KERR_QUEUE_FULL, "%lld tasks are queued, your quota's max_queued",
					    (long long)n);
	}
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Take the customer locks of the batch's shared-quota submissions, in one
 * order (by name) on every replica: two batches cannot deadlock. Lock
 * held, inside the batch's transaction. 0 or -1. */
static int lock_batch_customers(struct store *s, struct pending_submit *batch)
{
	const char **names;
	size_t n = 0, k = 0;
	int r = 0;

	for (struct pending_submit *p = batch; p; p = p->next)
		n += p->t->shared;
	if (!n)
		return 0;
	names = calloc(n, sizeof(*names));
	if (!names)
		return -1;
	for (struct pending_submit *p = batch; p; p = p->next)
		if (p->t->shared)
			names[k++] = p->t->customer;
	qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n && r == 0; i++)
		if (i == 0 || strcmp(names[i], names[i - 1]))
			r = store_lock_customer_locked(s, names[i]);
	free(names);
	return r;
}

/* One submission inside the open transaction, in a savepoint: p->r is 0
 * (inserted, p->id set), 1 (its idempotency key names an earlier task with
 * the same body: p->id is that task), or -1 with p->err. Lock held. */
static void submit_one_locked(struct store *s, struct pending_submit *p, int64_t now)
{
	const struct store_submit *t = p->t;
	struct sdb_stmt *st;
	int rc;

	p->r = -1;
	p->at = now;
	if (store_run(s, STORE_SAVEPOINT) != SDB_DONE) {
		kiln_err_set(p->err, KERR_STORE_ERROR, "cannot store the task: %s", sdb_errmsg(s->db));
		return;
	}
	if (t->idem_key) {
		p->r = idem_find_locked(s, t->customer, t->idem_key, t->body_hash, p->id, p->err);
		if (p->r != 0)
			goto release;
		p->r = -1;
	}
	if (t->shared && shared_quota_locked(s, p, now) < 0)
		goto undo;
	if (store_new_id("t_", p->id) < 0) {
		kiln_err_set(p->err, KERR_INTERNAL, "no randomness");
		goto undo;
	}
	st = stmt(s, T_INSERT);
	if (!st)
		goto fail_sql;
	sdb_bind_text(st, 1, p->id);
	sdb_bind_text(st, 2, t->customer);
	store_bind_opt_text(st, 3, t->metadata_json);
	sdb_bind_int64(st, 4, t->vcpus);
	sdb_bind_int64(st, 5, t->memory_mib);
	store_bind_opt_uint(st, 6, t->timeout_s);
	store_bind_opt_uint(st, 7, t->output_mib);
	store_bind_opt_text(st, 8, t->idem_key);
	store_bind_opt_text(st, 9, t->body_hash);
	sdb_bind_int64(st, 10, now);
	rc = store_step(s, st);
	sdb_reset(st);
	if (rc == SDB_CONSTRAINT && t->idem_key) {
		/* Another replica committed the same key since we looked
		 * (the unique index waited for it): answer with its task. */
		store_run(s, STORE_ROLLBACK_TO);
		p->r = idem_find_locked(s, t->customer, t->idem_key, t->body_hash, p->id, p->err);
		if (p->r != 0)
			goto release;
		p->r = -1;
		kiln_err_set(p->err, KERR_STORE_ERROR, "cannot store the task: idempotency key conflict");
		goto release;
	}
	if (rc != SDB_DONE)
		goto fail_sql;
	st = stmt(s, T_SPEC_INSERT);
	if (!st)
		goto fail_sql;
	sdb_bind_text(st, 1, p->id);
	sdb_bind_text(st, 2, t->spec_json);
	rc = store_step(s, st);
	sdb_reset(st);
	if (rc != SDB_DONE)
		goto fail_sql;
	if (t->template_use && store_template_use_insert_locked(s, p->id, t->template_use) < 0)
		goto fail_sql;
	p->r = 0;
	goto release;
fail_sql:
	kiln_err_set(p->err, KERR_STORE_ERROR, "cannot store the task: %s", sdb_errmsg(s->db));
undo:
	store_run(s, STORE_ROLLBACK_TO);
release:
	store_run(s, STORE_RELEASE);
}

/* Commit a batch (oldest first) in one transaction: every p->r and p->err
 * is set. A failed commit fails the whole batch. Takes s->lock. */
/* Fail every submission of the batch: "WHAT: <the store's error>", the
 * error read before the open transaction is rolled back. */
static void fail_batch(struct store_tx *tx, struct pending_submit *batch, const char *what)
{
	char why[256];

	snprintf(why, sizeof(why), "%s", sdb_errmsg(tx->s->db));
	store_tx_rollback(tx);
	for (struct pending_submit *p = batch; p; p = p->next) {
		p->r = -1;
		kiln_err_set(p->err, KERR_STORE_ERROR, "%s: %s", what, why);
	}
}

static void commit_batch(struct store *s, struct pending_submit *batch, int64_t now)
{
	struct pending_submit *p;
	STORE_TX(tx);

	if (store_tx_start(&tx, s) < 0) {
		fail_batch(&tx, batch, "cannot begin");
		return;
	}
	if (lock_batch_customers(s, batch) < 0) {
		fail_batch(&tx, batch, "cannot store the task");
		return;
	}
	for (p = batch; p; p = p->next)
		submit_one_locked(s, p, now);
	if (s->listen) {
		/* Replicas hear of the batch with its commit: one notification,
		 * not one round trip per task after it. */
		const char *ids[256];
		int n = 0, bad = 0;

		for (p = batch; p; p = p->next) {
			if (p->r != 0)
				continue;
			ids[n++] = p->id;
			if (n == 256) {
				bad |= store_notify_queued_locked(s, ids, n, now) < 0;
				n = 0;
			}
		}
		if (n)
			bad |= store_notify_queued_locked(s, ids, n, now) < 0;
		if (bad) {
			fail_batch(&tx, batch, "cannot store the task");
			return;
		}
	}
	if (store_tx_commit(&tx) < 0)
		fail_batch(&tx, batch, "cannot store the task");
}

int store_task_submit(struct store *s, const struct store_submit *t, char id_out[40], struct kiln_err *err)
{
	struct pending_submit me = { .t = t, .err = err };

	pthread_mutex_lock(&s->gc_lock);
	me.next = s->gc_queue;
	s->gc_queue = &me;
	while (!me.done) {
		struct pending_submit *batch = NULL, *p, *next;

		if (s->gc_leading) {
			pthread_cond_wait(&s->gc_cond, &s->gc_lock);
			continue;
		}
		/* Lead: take everything queued, oldest first. */
		s->gc_leading = 1;
		for (p = s->gc_queue; p; p = next) {
			next = p->next;
			p->next = batch;
			batch = p;
		}
		s->gc_queue = NULL;
		pthread_mutex_unlock(&s->gc_lock);
		commit_batch(s, batch, clock_wall_ms());
		pthread_mutex_lock(&s->gc_lock);
		for (p = batch; p; p = next) {
			next = p->next; /* p may be gone once done is seen */
			p->done = 1;
		}
		s->gc_leading = 0;
		pthread_cond_broadcast(&s->gc_cond);
	}
	pthread_mutex_unlock(&s->gc_lock);
	if (me.r >= 0)
		memcpy(id_out, me.id, strlen(me.id) + 1);
	if (me.r == 0) /* the other replicas heard of it with the batch's commit */
		store_changed_here(s, id_out, "state",
				   json_pack("{s:s, s:I}", "state", task_state_name(TASK_QUEUED), "at", (json_int_t)me.at));
	return me.r;
}

int store_task_insert(struct store *s, const char *customer, const char *spec_json, const char *metadata_json,
		      unsigned vcpus, unsigned memory_mib, const char *idem_key, const char *body_hash,
		      char id_out[40], struct kiln_err *err)
{
	struct store_submit t = {
		.customer = customer, .spec_json = spec_json, .metadata_json = metadata_json, .vcpus = vcpus,
		.memory_mib = memory_mib, .idem_key = idem_key, .body_hash = body_hash,
	};

	return store_task_submit(s, &t, id_out, err);
}

/* ---- reading ---- */

/* b - a when both are known, else null. */
static json_t *span(struct sdb_stmt *st, int a, int b)
{
	if (sdb_col_null(st, a) || sdb_col_null(st, b))
		return json_null();
	return json_integer(sdb_col_int64(st, b) - sdb_col_int64(st, a));
}

/* The public JSON of the row st is on; with full, the host's result,
 * outputs and artifacts too (the row has TC_HOST_TASK). */
static json_t *row_json(struct sdb_stmt *st, int full)
{
	const char *md = store_col_text(st, TC_METADATA);
	int run_end = !sdb_col_null(st, TC_UPLOADING) ? TC_UPLOADING : TC_ENDED;
	json_t *j, *timings;

	timings = json_pack("{s:o, s:o, s:o, s:o, s:o}", "queued_ms", span(st, TC_CREATED, TC_SCHEDULED), "start_ms",
			    span(st, TC_SCHEDULED, TC_RUNNING), "run_ms", span(st, TC_RUNNING, run_end), "upload_ms",
			    span(st, TC_UPLOADING, TC_ENDED), "total_ms", span(st, TC_CREATED, TC_ENDED));
	j = json_pack("{s:s, s:s, s:s, s:I, s:o, s:{s:I, s:I, s:o, s:o}, s:o, s:o, s:b, s:o, s:o}", "id",
		      store_col_text(st, TC_ID), "customer", store_col_text(st, TC_CUSTOMER), "state",
		      store_col_text(st, TC_STATE), "created_at", (json_int_t)sdb_col_int64(st, TC_CREATED),
		      "metadata", md ? json_loads(md, 0, NULL) : json_null(), "limits", "vcpus",
		      (json_int_t)sdb_col_int64(st, TC_VCPUS), "memory_mib",
		      (json_int_t)sdb_col_int64(st, TC_MEMORY), "timeout_s", store_opt_int(st, TC_TIMEOUT),
		      "output_mib", store_opt_int(st, TC_OUTPUT), "host", store_opt_str(st, TC_HOST), "end_reason",
		      store_opt_str(st, TC_END_REASON), "cancel_requested", sdb_col_int(st, TC_CANCEL_REQ),
		      "idempotency_key", store_opt_str(st, TC_IDEM), "timings", timings);
	/* The template it was accepted with (absent: the default), in lists too
	 * (the console's template column). */
	if (j && store_col_text(st, TC_TEMPLATE))
		json_object_set_new(j, "template", json_string(store_col_text(st, TC_TEMPLATE)));
	if (j && full) {
		const char *ht = store_col_text(st, TC_HOST_TASK);
		json_t *h = ht ? json_loads(ht, 0, NULL) : NULL, *v;

		v = json_object_get(h, "result");
		json_object_set(j, "result", v ? v : json_null());
		v = json_object_get(h, "outputs");
		json_object_set_new(j, "outputs", json_is_array(v) ? json_incref(v) : json_array());
		v = json_object_get(h, "artifacts");
		json_object_set_new(j, "artifacts", json_is_object(v) ? json_incref(v) : json_object());
		v = json_object_get(h, "error");
		if (v)
			json_object_set(j, "error", v);
		json_decref(h);
		/* The customer's destination its outputs went to (absent: kiln's bucket). */
		if (store_col_text(st, TC_DEST))
			json_object_set_new(j, "destination", json_string(store_col_text(st, TC_DEST)));
	}
	return j;
}

static int full_json(struct sdb_stmt *st, void *arg)
{
	*(json_t **)arg = row_json(st, 1);
	return 0;
}

json_t *store_task_json(struct store *s, const char *id, const char *customer)
{
	json_t *j = NULL;

	store_row_by_id(s, STORE_SLOTS_TASKS + T_GET, tasks_sql[T_GET], id, customer, TC_CUSTOMER, full_json, &j);
	return j;
}

static int state_of(struct sdb_stmt *st, void *arg)
{
	*(enum task_state *)arg = task_state_parse(store_col_text(st, 0));
	return 0;
}

int store_task_state(struct store *s, const char *id, enum task_state *state)
{
	return store_row_by_id(s, STORE_SLOTS_TASKS + T_STATE, tasks_sql[T_STATE], id, NULL, 0, state_of, state) < 0
		       ? -ENOENT
		       : 0;
}

static json_t *list_row_json(struct sdb_stmt *st)
{
	return row_json(st, 0);
}

static int state_valid(const char *state)
{
	return task_state_parse(state) != TASK_STATE_COUNT;
}

json_t *store_task_list(struct store *s, const char *customer, const char *state, unsigned limit,
			const char *cursor, char **next_cursor, struct kiln_err *err)
{
	/* Four statements rather than one with "?1 IS NULL OR ...": each uses
	 * its own index. */
	enum tasks_stmt which = customer ? (state ? T_LIST_CUST_STATE : T_LIST_CUST)
					 : (state ? T_LIST_ALL_STATE : T_LIST_ALL);
	struct store_page p = {
		.slot = STORE_SLOTS_TASKS + which, .sql = tasks_sql[which], .customer = customer, .state = state,
		.state_valid = state_valid, .seq_col = TC_SEQ, .row_json = list_row_json, .what = "tasks",
	};

	return store_page_run(s, &p, limit, cursor, next_cursor, err);
}

char *store_task_spec(struct store *s, const char *id)
{
	return store_text_by_id(s, STORE_SLOTS_TASKS + T_SPEC_GET, tasks_sql[T_SPEC_GET], id);
}

int store_task_push_get(struct store *s, const char *id, const char *host_id, struct store_task_push *p)
{
	struct sdb_stmt *st;
	int rc, r = 0;

	memset(p, 0, sizeof(*p));
	pthread_mutex_lock(&s->lock);
	st = stmt(s, T_PUSH_GET);
	if (!st) {
		pthread_mutex_unlock(&s->lock);
		return -1;
	}
	sdb_bind_text(st, 1, id);
	rc = store_step(s, st);
	if (rc == SDB_ROW) {
		const char *host = store_col_text(st, 1);

		p->scheduled_on = task_state_parse(store_col_text(st, 0)) == TASK_SCHEDULED && host &&
				  !strcmp(host, host_id);
		if (store_col_text(st, 2) && !(p->spec = strdup(store_col_text(st, 2))))
			r = -1;
		if (store_col_text(st, 3) && !(p->template_ref = strdup(store_col_text(st, 3))))
			r = -1;
		p->has_dest = store_col_text(st, 4) != NULL;
		if (p->has_dest)
			store_dest_row(st, 4, &p->dest);
	} else if (rc != SDB_DONE) {
		r = -1;
	}
	sdb_reset(st);
	pthread_mutex_unlock(&s->lock);
	if (r < 0)
		store_task_push_free(p);
	return r;
}

void store_task_push_free(struct store_task_push *p)
{
	free(p->spec);
	free(p->template_ref);
	memset(p, 0, sizeof(*p));
}

/* ---- changes of state ---- */

/* The timestamp column a target state sets. */
static const char *state_column(enum task_state to)
{
	switch (to) {
	case TASK_QUEUED:
		return NULL;
	case TASK_SCHEDULED:
		return "scheduled_ms";
	case TASK_STARTING:
		return "starting_ms";
	case TASK_RUNNING:
		return "running_ms";
	case TASK_UPLOADING:
		return "uploading_ms";
	default:
		return "ended_ms";
	}
}

/* Lock held: the compare-and-set; 1 moved, 0 not, -1 error. */
static int transition_locked(struct store *s, const char *id, enum task_state from, enum task_state to,
			     const char *host_id, int64_t now)
{
	struct store_cas c = {
		.id = id, .from = task_state_name(from), .to = task_state_name(to), .host = host_id, .now = now,
	};
	const char *col = state_column(to);
	struct sdb_stmt *st;
	char sql[512];

	/* Back to the queue (a host lost before the task started): the
	 * placement is forgotten. */
	if (!col)
		snprintf(sql, sizeof(sql),
			 "UPDATE tasks SET state = :to, host_id = :host, scheduled_ms = NULL, starting_ms = NULL,"
			 " cancel_sent_ms = NULL WHERE id = :id AND state = :from");
	else
		snprintf(sql, sizeof(sql),
			 "UPDATE tasks SET state = :to, host_id = coalesce(:host, host_id), %s = coalesce(%s, :now)%s"
			 " WHERE id = :id AND state = :from",
			 col, col, task_state_final(to) ? ", end_reason = coalesce(end_reason, :to)" : "");
	st = store_stmt(s, T_TRANS_SLOT(to), sql);
	return st ? store_cas_locked(s, st, &c) : -1;
}

int store_task_transition(struct store *s, const char *id, enum task_state from, enum task_state to,
			  const char *host_id)
{
	int64_t now = clock_wall_ms();
	int r, relaxed;

	if (from >= TASK_STATE_COUNT || to >= TASK_STATE_COUNT || from == to)
		return -1;
	/* Starting, running and uploading are progress, not promises: the
	 * commit does not wait for the disk (a restart that lost it follows
	 * the task on its host again, as it does anyway). The placement before
	 * them (store_task_schedule) and the end after them stay durable, and
	 * a durable commit makes every earlier one durable too. */
	relaxed = to == TASK_STARTING || to == TASK_RUNNING || to == TASK_UPLOADING;
	/* The end: its usage metered in the transaction that ends it (once). */
	if (task_state_final(to)) {
		STORE_TX(tx);

		if (store_tx_start(&tx, s) < 0)
			return -1;
		r = transition_locked(s, id, from, to, host_id, now);
		if (r > 0 && (store_usage_task_locked(s, id, 0) < 0 || store_tx_commit(&tx) < 0))
			r = -1;
		store_tx_unlock(&tx);
		if (r > 0)
			store_task_changed(s, id, to, now);
		return r;
	}
	pthread_mutex_lock(&s->lock);
	if (relaxed)
		relaxed = sdb_durable(s->db, 0) == 0;
	r = transition_locked(s, id, from, to, host_id, now);
	if (relaxed && sdb_durable(s->db, 1) < 0)
		fprintf(stderr, "kiln-api: the store's commits may not be durable now: %s\n", sdb_errmsg(s->db));
	pthread_mutex_unlock(&s->lock);
	if (r > 0)
		store_task_changed(s, id, to, now);
	return r;
}

int store_task_schedule(struct store *s, const char *id, const char *host_id)
{
	int64_t now = clock_wall_ms();
	struct sdb_stmt *st;
	char customer[65] = "";
	unsigned vcpus = 0, mem = 0;
	int r, found = 0;
	STORE_TX(tx);

	if (store_tx_start(&tx, s) < 0)
		return -EIO;
	st = stmt(s, T_GET);
	if (!st)
		return -EIO;
	sdb_bind_text(st, 1, id);
	if (sdb_step(st) == SDB_ROW && task_state_parse(store_col_text(st, TC_STATE)) == TASK_QUEUED) {
		found = 1;
		store_copy_col(st, TC_CUSTOMER, customer, sizeof(customer));
		vcpus = (unsigned)sdb_col_int64(st, TC_VCPUS);
		mem = (unsigned)sdb_col_int64(st, TC_MEMORY);
	}
	sdb_reset(st);
	if (!found)
		return 0;
	r = store_room_locked(s, customer, vcpus, mem, 1, NULL);
	if (r < 0)
		return r == -EDQUOT ? -EDQUOT : -EIO;
	if (transition_locked(s, id, TASK_QUEUED, TASK_SCHEDULED, host_id, now) != 1 || store_tx_commit(&tx) < 0)
		return -EIO;
	store_tx_unlock(&tx);
	store_task_changed(s, id, TASK_SCHEDULED, now);
	return 1;
}

/* The bytes a task's sandbox sent out, as its host's result says
 * (result.network.bytes_out; 0 when absent, negative or not an integer). */
static int64_t task_egress_bytes(json_t *host_task)
{
	json_t *n = json_object_get(json_object_get(json_object_get(host_task, "result"), "network"), "bytes_out");
	json_int_t v = json_is_integer(n) ? json_integer_value(n) : 0;

	return v > 0 ? (int64_t)v : 0;
}

int store_task_finish(struct store *s, const char *id, enum task_state state, const char *end_reason,
		      json_t *host_task)
{
	char *ht = host_task ? json_dumps(host_task, JSON_COMPACT) : NULL;
	int64_t egress = task_egress_bytes(host_task);
	int64_t now = clock_wall_ms();
	struct sdb_stmt *st;
	int n = -1;

	if (!task_state_final(state)) {
		free(ht);
		return -1;
	}
	{
		STORE_TX(tx);

		st = store_tx_start(&tx, s) < 0 ? NULL : stmt(s, T_FINISH);
		if (st) {
			sdb_bind_text(st, 1, task_state_name(state));
			store_bind_opt_text(st, 2, end_reason);
			store_bind_opt_text(st, 3, ht);
			sdb_bind_int64(st, 4, now);
			sdb_bind_text(st, 5, id);
			n = store_update_locked(s, st);
			/* Its usage, once: only the update that ended it meters it. */
			if (n > 0 && store_usage_task_locked(s, id, egress) < 0)
				n = -1;
			if (n >= 0 && store_tx_commit(&tx) < 0)
				n = -1;
		}
		store_tx_unlock(&tx);
	}
	free(ht);
	if (n < 0)
		return -1;
	if (n)
		store_task_changed(s, id, state, now);
	return n > 0;
}

/* ---- the scheduler's queries ---- */

/* One row of the scheduler's queries into elem, a struct store_task. */
static void task_row(struct sdb_stmt *st, void *elem)
{
	struct store_task *t = elem;

	memset(t, 0, sizeof(*t));
	store_copy_col(st, 0, t->id, sizeof(t->id));
	store_copy_col(st, 1, t->customer, sizeof(t->customer));
	t->state = task_state_parse(store_col_text(st, 2));
	t->vcpus = (unsigned)sdb_col_int64(st, 3);
	t->memory_mib = (unsigned)sdb_col_int64(st, 4);
	store_copy_col(st, 5, t->host_id, sizeof(t->host_id));
	t->seq = sdb_col_int64(st, 6);
	t->created_ms = sdb_col_int64(st, 7);
	t->cancel_requested = sdb_col_int(st, 8);
	t->egress = sdb_col_int(st, 9);
	store_copy_col(st, 10, t->tkey, sizeof(t->tkey));
}

/* Run statement id (?1 = arg when arg_text, ?last = max) into out. Takes
 * the lock. */
static int fill_tasks(struct store *s, enum tasks_stmt id, const char *arg_text, struct store_task *out, int max)
{
	return store_rows(s, STORE_SLOTS_TASKS + id, tasks_sql[id], arg_text, out, sizeof(*out), max, task_row);
}

int store_tasks_in_state(struct store *s, enum task_state state, struct store_task *out, int max)
{
	if (state >= TASK_STATE_COUNT)
		return 0;
	return fill_tasks(s, T_IN_STATE, task_state_name(state), out, max);
}

int store_tasks_queued_fair(struct store *s, struct store_task *out, int max)
{
	return fill_tasks(s, T_FAIR, NULL, out, max);
}

int store_tasks_cancel_pending(struct store *s, struct store_task *out, int max)
{
	return fill_tasks(s, T_CANCEL_PENDING, NULL, out, max);
}

/* ---- cancel ---- */

int store_task_cancel_sent(struct store *s, const char *id)
{
	return store_stamp(s, STORE_SLOTS_TASKS + T_CANCEL_SENT, tasks_sql[T_CANCEL_SENT], id);
}

enum store_cancel store_task_cancel(struct store *s, const char *id, const char *customer, enum task_state *state)
{
	enum store_cancel r = STORE_CANCEL_FAILED;
	enum task_state cur = TASK_STATE_COUNT;
	int64_t now = clock_wall_ms();
	struct sdb_stmt *st;
	int n, rc;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, T_STATE);
	if (!st)
		goto out;
	sdb_bind_text(st, 1, id);
	rc = sdb_step(st);
	if (rc == SDB_ROW) {
		const char *c = store_col_text(st, 1);

		cur = task_state_parse(store_col_text(st, 0));
		if (customer && strcmp(customer, c ? c : ""))
			rc = SDB_DONE; /* another customer's: as if it did not exist */
	}
	sdb_reset(st);
	if (rc != SDB_ROW) {
		r = rc == SDB_DONE ? STORE_CANCEL_NOT_FOUND : STORE_CANCEL_FAILED;
		cur = TASK_STATE_COUNT;
		goto out;
	}
	if (cur == TASK_QUEUED || cur == TASK_SCHEDULED) {
		st = stmt(s, T_CANCEL_NOW);
		if (!st)
			goto out;
		sdb_bind_int64(st, 1, now);
		sdb_bind_text(st, 2, id);
		n = store_update_locked(s, st);
		if (n < 0)
			goto out;
		/* Only this thread writes under the lock, so the state read
		 * above still holds; n == 1 always. */
		r = n ? STORE_CANCEL_DONE : STORE_CANCEL_FAILED;
		if (n)
			cur = TASK_CANCELLED;
	} else if (cur == TASK_STARTING || cur == TASK_RUNNING) {
		st = stmt(s, T_CANCEL_REQ);
		if (!st)
			goto out;
		sdb_bind_text(st, 1, id);
		n = store_update_locked(s, st);
		if (n < 0)
			goto out;
		r = STORE_CANCEL_REQUESTED;
		if (!n)
			now = 0; /* asked before: nothing new to announce */
	} else {
		r = STORE_CANCEL_TOO_LATE;
	}
out:
	pthread_mutex_unlock(&s->lock);
	if (state)
		*state = cur;
	if (r == STORE_CANCEL_DONE)
		store_task_changed(s, id, TASK_CANCELLED, now);
	else if (r == STORE_CANCEL_REQUESTED && now)
		store_changed(s, id, "cancel", json_pack("{s:I}", "at", (json_int_t)now));
	return r;
}
