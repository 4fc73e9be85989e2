/* store_templates: templates in kiln-api's store (see store.h, "Templates"):
 * the rows (one per template, which is also its build), what tasks and
 * sessions use (template_uses, written in their own insert's transaction),
 * the build minutes of each customer's day, and the clean-up list of builds
 * to cancel, uploads to delete and images to delete once nothing names
 * them. Every write is committed before it returns. */
#include "store_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"

static const char *const state_names[TEMPLATE_STATE_COUNT] = { "queued", "building", "ready", "failed" };

const char *template_state_name(enum template_state st)
{
	return st >= 0 && st < TEMPLATE_STATE_COUNT ? state_names[st] : "unknown";
}

static enum template_state state_parse(const char *s)
{
	return (enum template_state)store_name_index(state_names, TEMPLATE_STATE_COUNT, s);
}

#define TPL_COLS                                                                                                \
	"id, customer, name, kind, state, host_id, attempts, sha256, size, oci_key, oci_size, created_ms, started_ms"
#define JSON_COLS                                                                                               \
	"id, customer, name, kind, state, sha256, size, tref, attempts, error_code, error_message, created_ms,"  \
	" started_ms, finished_ms, build_ms, host_id, log"
enum {
	JC_ID, JC_CUSTOMER, JC_NAME, JC_KIND, JC_STATE, JC_SHA, JC_SIZE, JC_TREF, JC_ATTEMPTS, JC_ERR_CODE, JC_ERR_MSG,
	JC_CREATED, JC_STARTED, JC_FINISHED, JC_BUILD_MS, JC_HOST, JC_LOG,
};

/* Whether a session in any state but destroyed, or a task not yet final,
 * uses what ?1 names. */
#define LIVE_SESSION_USES                                                                                       \
	"EXISTS (SELECT 1 FROM template_uses u JOIN sessions s ON s.id = u.id WHERE u.template_id = ?1"        \
	" AND s.state != 'destroyed')"

enum tpl_stmt {
	P_INSERT, P_NAME_TAKEN, P_COUNT, P_BUILTIN, P_FIND, P_GET, P_TREF, P_RECIPE, P_JSON, P_LIST, P_DAY_MS,
	P_IN_USE, P_DELETE_ROW, P_GC_INSERT, P_QUEUED, P_BUILDING, P_START, P_REQUEUE, P_LOG, P_FINISH, P_DAY_ADD,
	P_PROGRESS, P_GC_LIST, P_GC_UPDATE, P_GC_DELETE, P_SHA_REF, P_USE_INSERT, P_ROW_FOR_GC, P_USE_TREF, P_PUBLIC_EXISTS,
	P_COUNT_
};

static const char *const tpl_sql[P_COUNT_] = {
	[P_INSERT] = "INSERT INTO templates(id, customer, name, kind, state, recipe, oci_key, oci_size, created_ms)"
		     " VALUES (?1, ?2, ?3, ?4, 'queued', ?5, ?6, ?7, ?8)",
	[P_NAME_TAKEN] = "SELECT customer FROM templates WHERE name = ?2 AND (customer = ?1 OR customer = '')",
	[P_COUNT] = "SELECT count(*) FROM templates WHERE customer = ?1",
	[P_BUILTIN] = "INSERT INTO templates(id, customer, name, kind, state, created_ms, finished_ms)"
		      " VALUES (?1, '', ?2, 'builtin', 'ready', ?3, ?3) ON CONFLICT DO NOTHING",
	/* Its own first, then the public one. */
	[P_FIND] = "SELECT " TPL_COLS " FROM templates WHERE name = ?2 AND (customer = ?1 OR customer = '')"
		   " ORDER BY customer = '' LIMIT 1",
	[P_GET] = "SELECT " TPL_COLS " FROM templates WHERE id = ?1",
	[P_TREF] = "SELECT tref FROM templates WHERE id = ?1",
	[P_RECIPE] = "SELECT recipe FROM templates WHERE id = ?1",
	[P_JSON] = "SELECT " JSON_COLS " FROM templates WHERE id = ?1",
	[P_LIST] = "SELECT " JSON_COLS " FROM templates WHERE customer = ?1 OR customer = ''"
		   " ORDER BY name, customer = ''",
	[P_DAY_MS] = "SELECT coalesce((SELECT ms FROM build_usage WHERE customer = ?1 AND day = ?2), 0)"
		     " + coalesce((SELECT sum(?3 - started_ms) FROM templates WHERE customer = ?1"
		     " AND state = 'building' AND started_ms IS NOT NULL), 0)",
	[P_IN_USE] = "SELECT " LIVE_SESSION_USES,
	[P_DELETE_ROW] = "DELETE FROM templates WHERE id = ?1",
	[P_GC_INSERT] = "INSERT INTO template_gc(build_id, host_id, oci_key, sha256, s3_key, created_ms)"
			" VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
	[P_QUEUED] = "SELECT " TPL_COLS " FROM templates WHERE state = 'queued' ORDER BY seq LIMIT ?1",
	[P_BUILDING] = "SELECT " TPL_COLS " FROM templates WHERE state = 'building' ORDER BY seq LIMIT ?1",
	[P_START] = "UPDATE templates SET state = 'building', host_id = ?2, attempts = attempts + 1, started_ms = ?3"
		    " WHERE id = ?1 AND state = 'queued'",
	/* The time it spent building counts for its customer's day all the same. */
	[P_REQUEUE] = "UPDATE templates SET state = 'queued', host_id = NULL WHERE id = ?1 AND state = 'building'",
	[P_LOG] = "UPDATE templates SET log = substr(log || ?2, -?3), log_total = log_total + ?4 WHERE id = ?1",
	[P_FINISH] = "UPDATE templates SET state = ?2, tref = ?3, sha256 = ?4, size = ?5, s3_key = ?6,"
		     " error_code = ?7, error_message = ?8, finished_ms = ?9,"
		     " build_ms = CASE WHEN started_ms IS NULL THEN NULL ELSE ?9 - started_ms END,"
		     " host_id = NULL, oci_key = NULL WHERE id = ?1 AND state IN ('queued', 'building')",
	[P_DAY_ADD] = "INSERT INTO build_usage(customer, day, ms) VALUES (?1, ?2, ?3)"
		      " ON CONFLICT(customer, day) DO UPDATE SET ms = build_usage.ms + excluded.ms",
	[P_PROGRESS] = "SELECT state, log_total, log, error_code, error_message FROM templates WHERE id = ?1",
	[P_GC_LIST] = "SELECT seq, build_id, host_id, oci_key, sha256, s3_key FROM template_gc ORDER BY seq LIMIT ?1",
	[P_GC_UPDATE] = "UPDATE template_gc SET host_id = ?2, oci_key = ?3, sha256 = ?4, s3_key = ?5 WHERE seq = ?1",
	[P_GC_DELETE] = "DELETE FROM template_gc WHERE seq = ?1",
	[P_SHA_REF] = "SELECT EXISTS (SELECT 1 FROM templates WHERE sha256 = ?1)"
		      " OR EXISTS (SELECT 1 FROM template_uses u JOIN tasks t ON t.id = u.id WHERE u.sha256 = ?1"
		      "  AND t.state IN ('queued', 'scheduled', 'starting', 'running', 'uploading'))"
		      " OR EXISTS (SELECT 1 FROM template_uses u JOIN sessions s ON s.id = u.id WHERE u.sha256 = ?1"
		      "  AND s.state != 'destroyed')"
		      /* A snapshot's row stays until its objects are gone: sessions may still start from it. */
		      " OR EXISTS (SELECT 1 FROM template_uses u JOIN snapshots k ON k.id = u.id WHERE u.sha256 = ?1)",
	[P_USE_INSERT] = "INSERT INTO template_uses(id, template_id, name, sha256, builtin, tref)"
			 " VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
	[P_PUBLIC_EXISTS] = "SELECT 1 FROM templates WHERE customer = '' AND name = ?1",
	[P_USE_TREF] = "SELECT tref FROM template_uses WHERE id = ?1",
	[P_ROW_FOR_GC] = "SELECT state, host_id, oci_key, sha256, s3_key FROM templates WHERE id = ?1",
};

_Static_assert(STORE_SLOTS_TEMPLATES + P_COUNT_ <= STORE_SLOTS_SNAPSHOTS,
	       "store_templates.c's statements overflow their slots");

static struct sdb_stmt *stmt(struct store *s, enum tpl_stmt id)
{
	return store_stmt(s, STORE_SLOTS_TEMPLATES + id, tpl_sql[id]);
}

/* Today as a UTC day number. */
static int64_t day_of(int64_t ms)
{
	return ms / 86400000;
}

int store_template_new_id(char id[40])
{
	return store_new_id("b_", id);
}

/* One row into elem, a struct store_template (store_rows' row). */
static void fill_row(struct sdb_stmt *st, void *elem)
{
	struct store_template *t = elem;

	memset(t, 0, sizeof(*t));
	store_copy_col(st, 0, t->id, sizeof(t->id));
	store_copy_col(st, 1, t->customer, sizeof(t->customer));
	store_copy_col(st, 2, t->name, sizeof(t->name));
	store_copy_col(st, 3, t->kind, sizeof(t->kind));
	t->state = state_parse(store_col_text(st, 4));
	store_copy_col(st, 5, t->host_id, sizeof(t->host_id));
	t->attempts = (unsigned)sdb_col_int(st, 6);
	store_copy_col(st, 7, t->sha256, sizeof(t->sha256));
	t->size = (uint64_t)sdb_col_int64(st, 8);
	store_copy_col(st, 9, t->oci_key, sizeof(t->oci_key));
	t->oci_size = (uint64_t)sdb_col_int64(st, 10);
	t->created_ms = sdb_col_int64(st, 11);
	t->started_ms = sdb_col_int64(st, 12);
}

int store_template_create(struct store *s, const char *id, const struct store_template_new *n, struct kiln_err *err)
{
	struct sdb_stmt *st;
	int rc;
	STORE_TX(tx);

	/* The default template is public whether or not a host has reported it yet. */
	if (!strcmp(n->name, "default"))
		return kiln_err_set(err, KERR_DUPLICATE, "a public template is named \"default\": choose another name");
	if (store_tx_start(&tx, s) < 0)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot begin: %s", sdb_errmsg(s->db));
	if (store_lock_customer_locked(s, n->customer) < 0) /* max_templates across replicas */
		goto fail_sql;
	st = stmt(s, P_NAME_TAKEN);
	if (!st)
		goto fail_sql;
	sdb_bind_text(st, 1, n->customer);
	sdb_bind_text(st, 2, n->name);
	rc = store_step(s, st);
	if (rc == SDB_ROW) {
		int pub = !(store_col_text(st, 0) ?: "")[0];

		sdb_reset(st);
		return kiln_err_set(err, KERR_DUPLICATE,
				    pub ? "a public template is named \"%s\": choose another name"
					: "you have a template named \"%s\" already (DELETE it first)",
				    n->name);
	}
	sdb_reset(st);
	if (rc != SDB_DONE)
		goto fail_sql;
	if (n->max_templates) {
		st = stmt(s, P_COUNT);
		if (!st)
			goto fail_sql;
		sdb_bind_text(st, 1, n->customer);
		if (store_step(s, st) != SDB_ROW) {
			sdb_reset(st);
			goto fail_sql;
		}
		rc = sdb_col_int(st, 0);
		sdb_reset(st);
		if ((unsigned)rc >= n->max_templates)
			return kiln_err_set(err, KERR_QUOTA_EXCEEDED,
					    "max_templates: you have %d templates, your quota's limit is %u (DELETE one "
					    "first)",
					    rc, n->max_templates);
	}
	st = stmt(s, P_INSERT);
	if (!st)
		goto fail_sql;
	sdb_bind_text(st, 1, id);
	sdb_bind_text(st, 2, n->customer);
	sdb_bind_text(st, 3, n->name);
	sdb_bind_text(st, 4, n->kind);
	store_bind_opt_text(st, 5, n->recipe_json);
	store_bind_opt_text(st, 6, n->oci_key);
	if (n->oci_key)
		sdb_bind_int64(st, 7, (int64_t)n->oci_size);
	sdb_bind_int64(st, 8, clock_wall_ms());
	rc = store_step(s, st);
	sdb_reset(st);
	if (rc != SDB_DONE)
		goto fail_sql;
	if (store_tx_commit(&tx) < 0)
		goto fail_sql;
	return 0;
fail_sql:
	return kiln_err_set(err, KERR_STORE_ERROR, "cannot store the template: %s", sdb_errmsg(s->db));
}

int store_template_builtin(struct store *s, const char *name)
{
	char id[40];
	struct sdb_stmt *st;
	int r = -1;

	if (store_new_id("b_", id) < 0)
		return -1;
	pthread_mutex_lock(&s->lock);
	/* Every heartbeat lists them: a read, and a write only the first time. */
	st = stmt(s, P_PUBLIC_EXISTS);
	if (st) {
		sdb_bind_text(st, 1, name);
		r = store_step(s, st) == SDB_ROW;
		sdb_reset(st);
		if (r) {
			pthread_mutex_unlock(&s->lock);
			return 0;
		}
		r = -1;
	}
	st = stmt(s, P_BUILTIN);
	if (st) {
		sdb_bind_text(st, 1, id);
		sdb_bind_text(st, 2, name);
		sdb_bind_int64(st, 3, clock_wall_ms());
		r = store_step(s, st) == SDB_DONE ? 0 : -1;
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

/* One row of statement id with ?1 = a and ?2 = b (when not NULL). */
static int one_row(struct store *s, enum tpl_stmt id, const char *a, const char *b, struct store_template *out)
{
	struct sdb_stmt *st;
	int r = -EIO, rc;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, id);
	if (st) {
		sdb_bind_text(st, 1, a);
		if (b)
			sdb_bind_text(st, 2, b);
		rc = store_step(s, st);
		if (rc == SDB_ROW) {
			fill_row(st, out);
			r = 0;
		} else if (rc == SDB_DONE) {
			r = -ENOENT;
		}
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_template_find(struct store *s, const char *customer, const char *name, struct store_template *out)
{
	return one_row(s, P_FIND, customer, name, out);
}

int store_template_get(struct store *s, const char *id, struct store_template *out)
{
	return one_row(s, P_GET, id, NULL, out);
}

char *store_template_ref(struct store *s, const char *id)
{
	return store_text_by_id(s, STORE_SLOTS_TEMPLATES + P_TREF, tpl_sql[P_TREF], id);
}

char *store_template_recipe(struct store *s, const char *id)
{
	return store_text_by_id(s, STORE_SLOTS_TEMPLATES + P_RECIPE, tpl_sql[P_RECIPE], id);
}

static json_t *ms_json(struct sdb_stmt *st, int i)
{
	return sdb_col_null(st, i) ? json_null() : json_integer(sdb_col_int64(st, i));
}

/* One row of JSON_COLS as docs/api.md shows a template. */
static json_t *row_json(struct sdb_stmt *st, int log)
{
	const char *customer = store_col_text(st, JC_CUSTOMER) ?: "";
	const char *ref_text = store_col_text(st, JC_TREF);
	json_t *ref = ref_text ? json_loads(ref_text, 0, NULL) : NULL;
	json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:b, s:o, s:o, s:i, s:o, s:o, s:o}", "id",
			      store_col_text(st, JC_ID) ?: "", "name", store_col_text(st, JC_NAME) ?: "", "kind",
			      store_col_text(st, JC_KIND) ?: "", "state", store_col_text(st, JC_STATE) ?: "", "public",
			      !customer[0], "sha256", store_opt_str(st, JC_SHA), "size", store_opt_int(st, JC_SIZE),
			      "attempts", sdb_col_int(st, JC_ATTEMPTS), "created_at", ms_json(st, JC_CREATED),
			      "started_at", ms_json(st, JC_STARTED), "finished_at", ms_json(st, JC_FINISHED));

	if (!j) {
		json_decref(ref);
		return NULL;
	}
	json_object_set_new(j, "build_seconds",
			    sdb_col_null(st, JC_BUILD_MS)
				    ? json_null()
				    : json_real((double)sdb_col_int64(st, JC_BUILD_MS) / 1000.0));
	if (store_col_text(st, JC_ERR_CODE))
		json_object_set_new(j, "error", json_pack("{s:s, s:s}", "code", store_col_text(st, JC_ERR_CODE), "message",
							  store_col_text(st, JC_ERR_MSG) ?: ""));
	else
		json_object_set_new(j, "error", json_null());
	if (json_is_object(ref)) {
		static const char *const keys[] = { "env", "workdir", "uid", "gid" };

		for (size_t i = 0; i < sizeof(keys) / sizeof(*keys); i++)
			if (json_object_get(ref, keys[i]))
				json_object_set(j, keys[i], json_object_get(ref, keys[i]));
	}
	json_decref(ref);
	if (store_col_text(st, JC_HOST))
		json_object_set_new(j, "host", json_string(store_col_text(st, JC_HOST)));
	if (log)
		json_object_set_new(j, "build_log", json_string(store_col_text(st, JC_LOG) ?: ""));
	return j;
}

json_t *store_template_json(struct store *s, const char *id, int log)
{
	struct sdb_stmt *st;
	json_t *j = NULL;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, P_JSON);
	if (st) {
		sdb_bind_text(st, 1, id);
		if (store_step(s, st) == SDB_ROW)
			j = row_json(st, log);
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return j;
}

json_t *store_template_list(struct store *s, const char *customer)
{
	struct sdb_stmt *st;
	json_t *arr = json_array();

	if (!arr)
		return NULL;
	pthread_mutex_lock(&s->lock);
	st = stmt(s, P_LIST);
	if (st) {
		sdb_bind_text(st, 1, customer);
		while (store_step(s, st) == SDB_ROW)
			json_array_append_new(arr, row_json(st, 0));
		sdb_reset(st);
	} else {
		json_decref(arr);
		arr = NULL;
	}
	pthread_mutex_unlock(&s->lock);
	return arr;
}

int store_template_usage(struct store *s, const char *customer, unsigned *count, double *build_s_today)
{
	struct sdb_stmt *st;
	int64_t now = clock_wall_ms();
	int r = -EIO;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, P_COUNT);
	if (!st)
		goto out;
	sdb_bind_text(st, 1, customer);
	if (store_step(s, st) == SDB_ROW)
		*count = (unsigned)sdb_col_int(st, 0);
	sdb_reset(st);
	st = stmt(s, P_DAY_MS);
	if (!st)
		goto out;
	sdb_bind_text(st, 1, customer);
	sdb_bind_int64(st, 2, day_of(now));
	sdb_bind_int64(st, 3, now);
	if (store_step(s, st) == SDB_ROW) {
		*build_s_today = (double)sdb_col_int64(st, 0) / 1000.0;
		r = 0;
	}
	sdb_reset(st);
out:
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_template_delete(struct store *s, const char *id, struct kiln_err *err)
{
	struct sdb_stmt *st;
	char state[16] = "", host[65] = "", oci[160] = "", sha[65] = "", key[160] = "";
	int r = -EIO, rc;
	STORE_TX(tx);

	if (store_tx_start(&tx, s) < 0)
		return -EIO;
	st = stmt(s, P_IN_USE);
	if (!st)
		goto rollback;
	sdb_bind_text(st, 1, id);
	rc = store_step(s, st) == SDB_ROW ? sdb_col_int(st, 0) : -1;
	sdb_reset(st);
	if (rc < 0)
		goto rollback;
	if (rc) {
		kiln_err_set(err, KERR_TEMPLATE_IN_USE,
			     "a session uses this template: destroy its sessions first (queued and running tasks "
			     "would keep working)");
		r = -EBUSY;
		goto rollback;
	}
	st = stmt(s, P_ROW_FOR_GC);
	if (!st)
		goto rollback;
	sdb_bind_text(st, 1, id);
	rc = store_step(s, st);
	if (rc == SDB_ROW) {
		store_copy_col(st, 0, state, sizeof(state));
		store_copy_col(st, 1, host, sizeof(host));
		store_copy_col(st, 2, oci, sizeof(oci));
		store_copy_col(st, 3, sha, sizeof(sha));
		store_copy_col(st, 4, key, sizeof(key));
	}
	sdb_reset(st);
	if (rc != SDB_ROW) {
		r = rc == SDB_DONE ? -ENOENT : -EIO;
		goto rollback;
	}
	if (strcmp(state, "building"))
		host[0] = '\0';
	if (host[0] || oci[0] || sha[0]) {
		st = stmt(s, P_GC_INSERT);
		if (!st)
			goto rollback;
		sdb_bind_text(st, 1, id);
		store_bind_opt_text(st, 2, host[0] ? host : NULL);
		store_bind_opt_text(st, 3, oci[0] ? oci : NULL);
		store_bind_opt_text(st, 4, sha[0] ? sha : NULL);
		store_bind_opt_text(st, 5, key[0] ? key : NULL);
		sdb_bind_int64(st, 6, clock_wall_ms());
		rc = store_step(s, st);
		sdb_reset(st);
		if (rc != SDB_DONE)
			goto rollback;
	}
	st = stmt(s, P_DELETE_ROW);
	if (!st)
		goto rollback;
	sdb_bind_text(st, 1, id);
	rc = store_step(s, st);
	sdb_reset(st);
	if (rc != SDB_DONE || store_tx_commit(&tx) < 0)
		goto rollback;
	return 0;
rollback:
	if (r == -EIO)
		kiln_err_set(err, KERR_STORE_ERROR, "cannot delete the template: %s", sdb_errmsg(s->db));
	return r;
}

static int rows(struct store *s, enum tpl_stmt id, struct store_template *out, int max)
{
	return store_rows(s, STORE_SLOTS_TEMPLATES + id, tpl_sql[id], NULL, out, sizeof(*out), max, fill_row);
}

int store_templates_queued(struct store *s, struct store_template *out, int max)
{
	return rows(s, P_QUEUED, out, max);
}

int store_templates_building(struct store *s, struct store_template *out, int max)
{
	return rows(s, P_BUILDING, out, max);
}

/* Run an UPDATE with ?1 = id and optional ?2 text / ?3 integer: rows changed or -1. */
static int update(struct store *s, enum tpl_stmt id, const char *row, const char *t2, int64_t i3, int with_i3)
{
	struct sdb_stmt *st;
	int r = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, id);
	if (st) {
		sdb_bind_text(st, 1, row);
		if (t2)
			sdb_bind_text(st, 2, t2);
		if (with_i3)
			sdb_bind_int64(st, 3, i3);
		r = store_update_locked(s, st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_template_start(struct store *s, const char *id, const char *host_id)
{
	return update(s, P_START, id, host_id, clock_wall_ms(), 1);
}

int store_template_requeue(struct store *s, const char *id)
{
	return update(s, P_REQUEUE, id, NULL, 0, 0);
}

int store_template_log(struct store *s, const char *id, const char *text, size_t len)
{
	struct sdb_stmt *st;
	int r = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, P_LOG);
	if (st) {
		sdb_bind_text(st, 1, id);
		sdb_bind_textn(st, 2, text, len);
		sdb_bind_int64(st, 3, STORE_TEMPLATE_LOG_MAX);
		sdb_bind_int64(st, 4, (int64_t)len);
		r = store_step(s, st) == SDB_DONE ? 0 : -1;
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_template_finish(struct store *s, const char *id, json_t *ref, const char *code, const char *message)
{
	int64_t now = clock_wall_ms();
	char *ref_text = ref ? json_dumps(ref, JSON_COMPACT) : NULL;
	char customer[65] = "", oci[160] = "";
	int64_t started = 0;
	struct sdb_stmt *st;
	int r = -1, rc;
	STORE_TX(tx);

	if (store_tx_start(&tx, s) < 0)
		goto out;
	st = stmt(s, P_GET);
	if (!st)
		goto out;
	sdb_bind_text(st, 1, id);
	rc = store_step(s, st);
	if (rc == SDB_ROW) {
		struct store_template t;

		fill_row(st, &t);
		snprintf(customer, sizeof(customer), "%s", t.customer);
		snprintf(oci, sizeof(oci), "%s", t.oci_key);
		started = t.started_ms;
		rc = t.state == TEMPLATE_QUEUED || t.state == TEMPLATE_BUILDING ? SDB_ROW : SDB_DONE;
	}
	sdb_reset(st);
	if (rc != SDB_ROW) {
		r = rc == SDB_DONE ? 0 : -1;
		goto out;
	}
	st = stmt(s, P_FINISH);
	if (!st)
		goto out;
	sdb_bind_text(st, 1, id);
	sdb_bind_text(st, 2, code ? "failed" : "ready");
	store_bind_opt_text(st, 3, code ? NULL : ref_text);
	if (!code) {
		store_bind_opt_text(st, 4, json_string_value(json_object_get(ref, "sha256")));
		if (json_is_integer(json_object_get(ref, "size")))
			sdb_bind_int64(st, 5, json_integer_value(json_object_get(ref, "size")));
		store_bind_opt_text(st, 6, json_string_value(json_object_get(ref, "s3_key")));
	}
	store_bind_opt_text(st, 7, code);
	store_bind_opt_text(st, 8, code ? (message ? message : "") : NULL);
	sdb_bind_int64(st, 9, now);
	rc = store_step(s, st);
	sdb_reset(st);
	if (rc != SDB_DONE)
		goto out;
	if (started && customer[0]) {
		st = stmt(s, P_DAY_ADD);
		if (!st)
			goto out;
		sdb_bind_text(st, 1, customer);
		sdb_bind_int64(st, 2, day_of(now));
		sdb_bind_int64(st, 3, now > started ? now - started : 0);
		rc = store_step(s, st);
		sdb_reset(st);
		if (rc != SDB_DONE)
			goto out;
	}
	if (oci[0]) {
		st = stmt(s, P_GC_INSERT);
		if (!st)
			goto out;
		sdb_bind_text(st, 1, id);
		sdb_bind_text(st, 3, oci);
		sdb_bind_int64(st, 6, now);
		rc = store_step(s, st);
		sdb_reset(st);
		if (rc != SDB_DONE)
			goto out;
	}
	if (store_tx_commit(&tx) < 0)
		goto out;
	r = 1;
out:
	store_tx_unlock(&tx);
	free(ref_text);
	return r;
}

int store_template_progress(struct store *s, const char *id, enum template_state *state, uint64_t *log_total,
			    char **log, json_t **error)
{
	struct sdb_stmt *st;
	int r = -EIO, rc;

	*log = NULL;
	*error = NULL;
	pthread_mutex_lock(&s->lock);
	st = stmt(s, P_PROGRESS);
	if (st) {
		sdb_bind_text(st, 1, id);
		rc = store_step(s, st);
		if (rc == SDB_ROW) {
			*state = state_parse(store_col_text(st, 0));
			*log_total = (uint64_t)sdb_col_int64(st, 1);
			*log = strdup(store_col_text(st, 2) ?: "");
			if (store_col_text(st, 3))
				*error = json_pack("{s:s, s:s}", "code", store_col_text(st, 3), "message",
						   store_col_text(st, 4) ?: "");
			r = *log ? 0 : -ENOMEM;
		} else if (rc == SDB_DONE) {
			r = -ENOENT;
		}
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

/* One row of P_GC_LIST into elem, a struct store_template_gc. */
static void gc_row(struct sdb_stmt *st, void *elem)
{
	struct store_template_gc *g = elem;

	memset(g, 0, sizeof(*g));
	g->seq = sdb_col_int64(st, 0);
	store_copy_col(st, 1, g->build_id, sizeof(g->build_id));
	store_copy_col(st, 2, g->host_id, sizeof(g->host_id));
	store_copy_col(st, 3, g->oci_key, sizeof(g->oci_key));
	store_copy_col(st, 4, g->sha256, sizeof(g->sha256));
	store_copy_col(st, 5, g->s3_key, sizeof(g->s3_key));
}

int store_template_gc_list(struct store *s, struct store_template_gc *out, int max)
{
	return store_rows(s, STORE_SLOTS_TEMPLATES + P_GC_LIST, tpl_sql[P_GC_LIST], NULL, out, sizeof(*out), max,
			  gc_row);
}

int store_template_gc_update(struct store *s, const struct store_template_gc *g)
{
	int done = !g->host_id[0] && !g->oci_key[0] && !g->sha256[0];
	struct sdb_stmt *st;
	int r = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, done ? P_GC_DELETE : P_GC_UPDATE);
	if (st) {
		sdb_bind_int64(st, 1, g->seq);
		if (!done) {
			store_bind_opt_text(st, 2, g->host_id[0] ? g->host_id : NULL);
			store_bind_opt_text(st, 3, g->oci_key[0] ? g->oci_key : NULL);
			store_bind_opt_text(st, 4, g->sha256[0] ? g->sha256 : NULL);
			store_bind_opt_text(st, 5, g->s3_key[0] ? g->s3_key : NULL);
		}
		r = store_step(s, st) == SDB_DONE ? 0 : -1;
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_template_sha_referenced(struct store *s, const char *sha256)
{
	struct sdb_stmt *st;
	int r = -1;

	pthread_mutex_lock(&s->lock);
	st = stmt(s, P_SHA_REF);
	if (st) {
		sdb_bind_text(st, 1, sha256);
		if (store_step(s, st) == SDB_ROW)
			r = sdb_col_int(st, 0) ? 1 : 0;
		sdb_reset(st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

int store_template_use_insert_locked(struct store *s, const char *id, const struct store_template_use *u)
{
	struct sdb_stmt *st = stmt(s, P_USE_INSERT);
	int rc;

	if (!st)
		return -1;
	sdb_bind_text(st, 1, id);
	sdb_bind_text(st, 2, u->template_id);
	sdb_bind_text(st, 3, u->name);
	store_bind_opt_text(st, 4, u->sha256);
	sdb_bind_int64(st, 5, u->builtin ? 1 : 0);
	store_bind_opt_text(st, 6, u->template_ref_json);
	rc = store_step(s, st);
	sdb_reset(st);
	return rc == SDB_DONE ? 0 : -1;
}

char *store_template_use_ref(struct store *s, const char *id)
{
	return store_text_by_id(s, STORE_SLOTS_TEMPLATES + P_USE_TREF, tpl_sql[P_USE_TREF], id);
}
