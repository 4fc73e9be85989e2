/* templates: the /v1/templates endpoints, OCI uploads, the builder and the
 * clean-up (see templates.h, docs/templates.md).
 *
 * Everything that matters is in the store (the template rows are the
 * builds): the builder thread reads queued rows, moves one to building on a
 * host with a compare-and-set, and a follower thread per build posts it to
 * its host, relays its log lines into the row and follows it to its end. A
 * restarted kiln-api re-follows the rows left building (a host answering
 * 404 has forgotten the build: it is queued again). Events streams read the
 * row (its log is kept with a count of every byte ever written, so a reader
 * knows what it missed) and wait on t->cond, broadcast on every change. */
#include "templates.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "buf.h"
#include "condwait.h"
#include "httpd.h"
#include "quota.h"
#include "recipe.h"
#include "reply.h"
#include "s3.h"
#include "spec.h"

#define TICK_MS 500
#define GC_EVERY_MS 5000
#define MAX_BATCH 64
#define KEEPALIVE_MS 15000
#define BUILD_VCPUS 1
#define BUILD_MEMORY_MIB 512      /* what a build VM is counted as when placing it */
#define FOLLOW_STALL_S 40
#define TIMEOUT_GRACE_MS 60000    /* past timeout_s + this, kiln-api gives up on the host */

struct follower {
	char id[40];
	struct follower *next;
};

struct templates {
	const struct api_config *cfg;
	struct store *st;
	struct sched *sched;
	const struct host_ops *ops;
	const struct kiln_clock *clock;
	char *token;
	pthread_mutex_t lock;
	pthread_cond_t cond;         /* CLOCK_MONOTONIC: every change, the builder's wake-up */
	uint64_t gen;
	int stopping, woken;
	pthread_t thread;
	int threaded;
	struct follower *followers;  /* builds followed by a thread of ours */
	unsigned nfollowers;
	int64_t last_gc;
	int bucket_ok;               /* the S3 bucket was made (or found) once */
};

static void changed(struct templates *t)
{
	pthread_mutex_lock(&t->lock);
	t->gen++;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
}

static void wake(struct templates *t)
{
	pthread_mutex_lock(&t->lock);
	t->woken = 1;
	t->gen++;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
}

static int stopping(struct templates *t)
{
	int r;

	pthread_mutex_lock(&t->lock);
	r = t->stopping;
	pthread_mutex_unlock(&t->lock);
	return r;
}

/* Wait up to ms on t->cond (or until stopping). */
static void nap(struct templates *t, long ms)
{
	int64_t until = clock_mono_ms() + ms;

	pthread_mutex_lock(&t->lock);
	if (!t->stopping)
		condwait_until(&t->cond, &t->lock, NULL, until);
	pthread_mutex_unlock(&t->lock);
}

static void customer_quota(struct store *st, const char *customer, struct quota *q)
{
	if (!customer[0] || store_customer_quota(st, customer, q) < 0)
		quota_defaults(q);
}

/* ---- resolution (tasks and sessions) ---- */

int template_resolve(struct store *st, const char *customer, const char *name, struct template_use *u,
		     struct kiln_err *err)
{
	memset(u, 0, sizeof(*u));
	if (!name || !strcmp(name, "default"))
		return 0;
	if (store_template_find(st, customer, name, &u->row) < 0)
		return kiln_err_set(err, KERR_NOT_FOUND, "no template named %s", name);
	if (u->row.state != TEMPLATE_READY)
		return kiln_err_set(err, KERR_TEMPLATE_NOT_READY, "template %s is %s%s", name,
				    template_state_name(u->row.state),
				    u->row.state == TEMPLATE_FAILED ? " (see its build log; DELETE it and create it again)"
								    : ": wait until it is ready");
	if (!strcmp(u->row.kind, "builtin")) {
		json_t *j = json_pack("{s:s, s:b}", "name", u->row.name, "builtin", 1);

		u->tref = j ? json_dumps(j, JSON_COMPACT) : NULL;
		json_decref(j);
	} else {
		u->tref = store_template_tref(st, u->row.id);
	}
	if (!u->tref)
		return kiln_err_set(err, KERR_INTERNAL, "template %s has no image reference", name);
	u->use = (struct store_tuse){
		.template_id = u->row.id, .name = u->row.name, .sha256 = u->row.sha256[0] ? u->row.sha256 : NULL,
		.builtin = !strcmp(u->row.kind, "builtin"), .tref_json = u->tref,
	};
	return 1;
}

void template_use_free(struct template_use *u)
{
	free(u->tref);
	memset(u, 0, sizeof(*u));
}

char *template_merge_spec(const char *spec_json, size_t len, int cwd_set, const char *tref_json, struct kiln_err *err)
{
	json_t *spec = json_loadb(spec_json, len, 0, NULL), *tref = json_loads(tref_json, 0, NULL), *env, *v;
	struct task_spec check;
	const char *workdir;
	char *out = NULL;
	size_t i;

	if (!json_is_object(spec) || !json_is_object(tref)) {
		kiln_err_set(err, KERR_INTERNAL, "cannot merge the template into the spec");
		goto out;
	}
	env = json_object_get(spec, "env");
	json_array_foreach(json_object_get(tref, "env"), i, v) {
		const char *kv = json_string_value(v), *eq = kv ? strchr(kv, '=') : NULL;
		char name[SPEC_MAX_ENV_KEY + 1];

		if (!eq || (size_t)(eq - kv) > SPEC_MAX_ENV_KEY || eq == kv)
			continue;
		memcpy(name, kv, (size_t)(eq - kv));
		name[eq - kv] = '\0';
		if (!env) {
			env = json_object();
			json_object_set_new(spec, "env", env);
		}
		if (!json_object_get(env, name)) /* the task's own value wins */
			json_object_set_new(env, name, json_string(eq + 1));
	}
	workdir = json_string_value(json_object_get(tref, "workdir"));
	if (!cwd_set && workdir && strcmp(workdir, SPEC_DEFAULT_CWD))
		json_object_set_new(spec, "cwd", json_string(workdir));
	out = json_dumps(spec, JSON_COMPACT);
	if (!out) {
		kiln_err_set(err, KERR_INTERNAL, "out of memory");
		goto out;
	}
	/* The merged env can pass the spec's bounds: check it all again. */
	if (spec_parse(out, strlen(out), &check, err) < 0) {
		char m[sizeof(err->message)];

		snprintf(m, sizeof(m), "%s", err->message);
		kiln_err_set(err, KERR_INVALID_SPEC, "with the template's env and workdir: %s", m);
		free(out);
		out = NULL;
		goto out;
	}
	spec_free(&check);
out:
	json_decref(spec);
	json_decref(tref);
	return out;
}

void template_merge_exec(json_t *body, const char *tref_json)
{
	json_t *tref = tref_json ? json_loads(tref_json, 0, NULL) : NULL, *env, *v;
	const char *workdir = json_string_value(json_object_get(tref, "workdir"));
	size_t i;

	if (!json_is_object(body) || !json_is_object(tref)) {
		json_decref(tref);
		return;
	}
	env = json_object_get(body, "env");
	json_array_foreach(json_object_get(tref, "env"), i, v) {
		const char *kv = json_string_value(v), *eq = kv ? strchr(kv, '=') : NULL;
		char name[SPEC_MAX_ENV_KEY + 1];

		if (!eq || eq == kv || (size_t)(eq - kv) > SPEC_MAX_ENV_KEY)
			continue;
		memcpy(name, kv, (size_t)(eq - kv));
		name[eq - kv] = '\0';
		if (!env) {
			env = json_object();
			json_object_set_new(body, "env", env);
		}
		if (!json_object_get(env, name))
			json_object_set_new(env, name, json_string(eq + 1));
	}
	if (workdir && !json_object_get(body, "cwd"))
		json_object_set_new(body, "cwd", json_string(workdir));
	json_decref(tref);
}

void templates_heartbeat(struct store *st, json_t *capacity)
{
	json_t *e;
	size_t i;

	json_array_foreach(json_object_get(capacity, "templates"), i, e) {
		const char *name = json_string_value(json_object_get(e, "name"));

		if (i >= 64)
			break;
		if (name && json_is_true(json_object_get(e, "builtin")) && spec_template_name_check(name, "name", NULL) == 0)
			store_template_builtin(st, name); /* a read when it exists: no write */
	}
}

/* ---- the builder ---- */

struct follow_ctx {
	struct templates *t;
	const char *id;
	int ended;
	struct buf pending;          /* log lines not yet in the store */
	int64_t flushed_ms;
	uint64_t seen, skip;         /* lines of this stream; lines an earlier stream already gave */
};

#define LOG_FLUSH_BYTES (16u << 10)
#define LOG_FLUSH_MS 250

/* Lines are written to the row in batches (each write is a commit, and
 * apt prints thousands of lines), at most LOG_FLUSH_MS late. */
static void log_flush(struct follow_ctx *f)
{
	if (f->pending.len) {
		store_template_log(f->t->st, f->id, f->pending.p, f->pending.len);
		f->pending.len = 0;
		changed(f->t);
	}
	f->flushed_ms = clock_mono_ms();
}

/* Host build events: "log" {"line"} into the row, "end" stops. */
static int on_build_event(void *ctx, const char *name, json_t *data)
{
	struct follow_ctx *f = ctx;

	if (!strcmp(name, "log")) {
		const char *line = json_string_value(json_object_get(data, "line"));

		/* A stream followed again replays from the start: skip what the
		 * previous one gave. */
		if (line && f->seen++ >= f->skip) {
			/* One line is bounded; the row keeps the last 64 KiB anyway. */
			buf_add(&f->pending, line, strnlen(line, 8192));
			buf_add(&f->pending, "\n", 1);
		}
		if (f->pending.len >= LOG_FLUSH_BYTES || clock_mono_ms() - f->flushed_ms >= LOG_FLUSH_MS)
			log_flush(f);
	} else if (!strcmp(name, "end")) {
		log_flush(f);
		f->ended = 1;
		return 1;
	}
	return stopping(f->t);
}

static int hex64(const char *s)
{
	if (!s || strlen(s) != 64)
		return 0;
	for (int i = 0; i < 64; i++)
		if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i]))
			return 0;
	return 1;
}

/* The TREF a host reported for a ready build, checked and with our name:
 * a new object, or NULL with why in msg. */
static json_t *checked_tref(const struct store_template *row, json_t *tref, uint64_t max_bytes, char *msg, size_t cap)
{
	const char *sha = json_string_value(json_object_get(tref, "sha256"));
	const char *key = json_string_value(json_object_get(tref, "s3_key"));
	json_int_t size = json_integer_value(json_object_get(tref, "size"));
	char want[128];
	json_t *out;

	if (!json_is_object(tref) || !hex64(sha)) {
		snprintf(msg, cap, "the host reported no valid sha256");
		return NULL;
	}
	snprintf(want, sizeof(want), "_templates/%s.ext4", sha);
	if (!key || strcmp(key, want)) {
		snprintf(msg, cap, "the host reported an s3_key other than %s", want);
		return NULL;
	}
	if (size <= 0) {
		snprintf(msg, cap, "the host reported no valid size");
		return NULL;
	}
	if (max_bytes && (uint64_t)size > max_bytes) {
		snprintf(msg, cap, "too_large: the image (%lld bytes) is larger than your quota's max_template_mib (%llu MiB)",
			 (long long)size, (unsigned long long)(max_bytes >> 20));
		return NULL;
	}
	out = json_deep_copy(tref);
	json_object_set_new(out, "name", json_string(row->name));
	json_object_del(out, "builtin");
	return out;
}

/* The code a failed build keeps: the host's when it is one of the build
 * error codes (docs/templates.md), else build_failed. */
static const char *build_code(const char *code)
{
	static const char *const ok[] = { "build_failed", "build_timeout", "invalid_image", "too_large",
					  "cancelled", "invalid_recipe", "no_template", NULL };

	for (int i = 0; code && ok[i]; i++)
		if (!strcmp(code, ok[i]))
			return ok[i];
	return "build_failed";
}

/* Settle a build as failed (code, message). */
static void fail_build(struct templates *t, const char *id, const char *code, const char *msg)
{
	store_template_finish(t->st, id, NULL, code, msg);
	changed(t);
}

/* A build that did not reach an end on its host: queued again, or failed
 * after TEMPLATES_MAX_ATTEMPTS. */
static void retry_build(struct templates *t, const struct store_template *row, const char *why)
{
	char msg[300];

	if (row->attempts >= TEMPLATES_MAX_ATTEMPTS) {
		snprintf(msg, sizeof(msg), "gave up after %u attempts: %s", row->attempts, why);
		fail_build(t, row->id, "build_failed", msg);
		return;
	}
	fprintf(stderr, "kiln-api: build %s (%s) queued again: %s\n", row->id, row->name, why);
	store_template_requeue(t->st, row->id);
	changed(t);
}

/* POST the build to its host: 1 there (or already), 0 settled or requeued,
 * -1 unreachable (retry). */
static int push_build(struct templates *t, const struct store_template *row, const char *url)
{
	struct kiln_err err = { .code = "" };
	struct quota q;
	json_t *body, *reply = NULL;
	int st;

	customer_quota(t->st, row->customer, &q);
	body = json_pack("{s:s, s:s, s:i}", "id", row->id, "customer", row->customer, "timeout_s",
			 (int)(q.build_timeout_s ? q.build_timeout_s : 1800));
	if (q.max_template_mib) /* 0: no limit */
		json_object_set_new(body, "max_bytes", json_integer((json_int_t)((uint64_t)q.max_template_mib << 20)));
	if (!strcmp(row->kind, "recipe")) {
		char *text = store_template_recipe(t->st, row->id);
		json_t *r = text ? json_loads(text, 0, NULL) : NULL;

		free(text);
		if (!r) {
			json_decref(body);
			fail_build(t, row->id, "build_failed", "the template's recipe cannot be read");
			return 0;
		}
		json_object_set_new(body, "recipe", r);
	} else {
		json_object_set_new(body, "name", json_string(row->name));
		json_object_set_new(body, "oci", json_pack("{s:s, s:I}", "s3_key", row->oci_key, "size",
							   (json_int_t)row->oci_size));
	}
	st = t->ops->call(t->ops->ctx, url, t->token, "POST", "/v1/builds", body, 10000, &reply, &err);
	json_decref(body);
	if (st == 202 || st == 200 || st == 409) {
		json_decref(reply);
		return 1;
	}
	if (st > 0) {
		const char *code = json_string_value(json_object_get(json_object_get(reply, "error"), "code"));
		const char *msg = json_string_value(json_object_get(json_object_get(reply, "error"), "message"));
		char why[300];

		snprintf(why, sizeof(why), "host %s answered HTTP %d %s: %s", row->host_id, st, code ? code : "",
			 msg ? msg : "");
		if (st >= 500 && row->attempts < TEMPLATES_MAX_ATTEMPTS) {
			/* Full, no S3, no egress: another host may do. */
			sched_host_full(t->sched, row->host_id);
			fprintf(stderr, "kiln-api: build %s: %s\n", row->id, why);
			store_template_requeue(t->st, row->id);
			changed(t);
		} else if (st >= 500) {
			char m[400];

			snprintf(m, sizeof(m), "no host could take the build (%u attempts): %s", row->attempts, why);
			fail_build(t, row->id, "build_failed", m);
		} else {
			fail_build(t, row->id, build_code(code), why);
		}
		json_decref(reply);
		return 0;
	}
	json_decref(reply);
	return -1;
}

/* The row is still building on host: 1; else 0 (deleted, requeued, settled). */
static int still_mine(struct templates *t, const char *id, const char *host, struct store_template *row)
{
	return store_template_get(t->st, id, row) == 0 && row->state == TEMPLATE_BUILDING && !strcmp(row->host_id, host);
}

struct fthread {
	struct templates *t;
	struct store_template row;
	int push;
};

static void follow_build(struct templates *t, struct store_template *row0, int push)
{
	struct store_template row = *row0;
	char host[65], url[256] = "", path[128];
	long backoff = 200;
	uint64_t lines = 0;
	struct quota q;
	int64_t deadline;

	snprintf(host, sizeof(host), "%s", row.host_id);
	customer_quota(t->st, row.customer, &q);
	deadline = row.started_ms + (int64_t)(q.build_timeout_s ? q.build_timeout_s : 1800) * 1000 + TIMEOUT_GRACE_MS;
	while (!stopping(t) && still_mine(t, row.id, host, &row)) {
		struct kiln_err err = { .code = "" };
		struct follow_ctx f = { .t = t, .id = row.id };
		json_t *b = NULL;
		int hs = sched_host_state(t->sched, host, url), st;

		if (hs == 0) {
			retry_build(t, &row, "its host is lost");
			return;
		}
		if (!url[0]) {
			nap(t, 1000);
			continue;
		}
		if (push) {
			int r = push_build(t, &row, url);

			if (r == 0)
				return;
			if (r < 0) {
				nap(t, backoff);
				backoff = backoff * 2 < 10000 ? backoff * 2 : 10000;
				continue;
			}
			push = 0;
		}
		if (t->ops->follow_path) {
			snprintf(path, sizeof(path), "/v1/builds/%s/events", row.id);
			buf_init(&f.pending, 0);
			f.flushed_ms = clock_mono_ms();
			f.skip = lines;
			t->ops->follow_path(t->ops->ctx, url, t->token, path, FOLLOW_STALL_S, on_build_event, &f, &err);
			log_flush(&f);
			buf_free(&f.pending);
			if (f.seen > lines)
				lines = f.seen;
			if (stopping(t))
				break;
		}
		snprintf(path, sizeof(path), "/v1/builds/%s", row.id);
		st = t->ops->call(t->ops->ctx, url, t->token, "GET", path, NULL, 10000, &b, &err);
		if (!still_mine(t, row.id, host, &row)) {
			json_decref(b);
			break;
		}
		if (st == 200) {
			const char *state = json_string_value(json_object_get(b, "state"));
			json_t *e = json_object_get(b, "error");

			if (state && !strcmp(state, "ready")) {
				char msg[200];
				json_t *tref = checked_tref(&row, json_object_get(b, "template"),
							    (uint64_t)q.max_template_mib << 20, msg, sizeof(msg));

				if (tref) {
					store_template_finish(t->st, row.id, tref, NULL, NULL);
					changed(t);
					fprintf(stderr, "kiln-api: template %s (%s) is ready\n", row.name, row.id);
				} else if (!strncmp(msg, "too_large: ", 11)) {
					fail_build(t, row.id, "too_large", msg + 11);
				} else {
					fail_build(t, row.id, "build_failed", msg);
				}
				json_decref(tref);
				json_decref(b);
				return;
			}
			if (state && !strcmp(state, "failed")) {
				const char *code = json_string_value(json_object_get(e, "code"));

				fail_build(t, row.id, build_code(code),
					   json_string_value(json_object_get(e, "message")) ?: "the build failed");
				json_decref(b);
				return;
			}
			backoff = 200;
		} else if (st == 404) {
			json_decref(b);
			retry_build(t, &row, "its host no longer knows the build (it restarted)");
			return;
		}
		json_decref(b);
		if (kclock_wall_ms(t->clock) > deadline) {
			t->ops->call(t->ops->ctx, url, t->token, "DELETE", path, NULL, 5000, NULL, &err);
			fail_build(t, row.id, "build_timeout", "the build did not end within build_timeout_s");
			return;
		}
		/* Not ended (the stream broke, or this fake has none): look again soon. */
		nap(t, st == 200 ? (t->ops->follow_path ? 200 : 500) : backoff);
		if (st != 200)
			backoff = backoff * 2 < 10000 ? backoff * 2 : 10000;
	}
}

static void *follow_main(void *arg)
{
	struct fthread *ft = arg;
	struct templates *t = ft->t;

	follow_build(t, &ft->row, ft->push);
	pthread_mutex_lock(&t->lock);
	for (struct follower **pp = &t->followers; *pp; pp = &(*pp)->next)
		if (!strcmp((*pp)->id, ft->row.id)) {
			struct follower *f = *pp;

			*pp = f->next;
			free(f);
			break;
		}
	t->nfollowers--;
	t->woken = 1;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
	free(ft);
	return NULL;
}

/* A follower thread for row unless one runs (lock not held). */
static void follow_start(struct templates *t, const struct store_template *row, int push)
{
	struct fthread *ft;
	struct follower *f;
	pthread_attr_t attr;
	pthread_t th;

	pthread_mutex_lock(&t->lock);
	for (f = t->followers; f; f = f->next)
		if (!strcmp(f->id, row->id))
			break;
	if (f || t->stopping) {
		pthread_mutex_unlock(&t->lock);
		return;
	}
	ft = calloc(1, sizeof(*ft));
	f = calloc(1, sizeof(*f));
	if (!ft || !f) {
		pthread_mutex_unlock(&t->lock);
		free(ft);
		free(f);
		return;
	}
	ft->t = t;
	ft->row = *row;
	ft->push = push;
	snprintf(f->id, sizeof(f->id), "%s", row->id);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&th, &attr, follow_main, ft) != 0) {
		pthread_attr_destroy(&attr);
		pthread_mutex_unlock(&t->lock);
		free(ft);
		free(f);
		return;
	}
	pthread_attr_destroy(&attr);
	f->next = t->followers;
	t->followers = f;
	t->nfollowers++;
	pthread_mutex_unlock(&t->lock);
}

/* Whether the recipe installs packages (its build VM needs egress then). */
static int needs_egress(struct templates *t, const struct store_template *row)
{
	char *text;
	json_t *r;
	int e;

	if (strcmp(row->kind, "recipe"))
		return 0;
	text = store_template_recipe(t->st, row->id);
	r = text ? json_loads(text, 0, NULL) : NULL;
	e = json_array_size(json_object_get(r, "packages")) > 0;
	json_decref(r);
	free(text);
	return e;
}

static void place_builds(struct templates *t)
{
	struct store_template rows[MAX_BATCH];
	int n = store_templates_queued(t->st, rows, MAX_BATCH);

	for (int i = 0; i < n; i++) {
		struct sched_need need = { .vcpus = BUILD_VCPUS, .memory_mib = BUILD_MEMORY_MIB };
		char host[65], url[256];
		int r;

		if (rows[i].attempts >= TEMPLATES_MAX_ATTEMPTS) {
			fail_build(t, rows[i].id, "build_failed", "gave up after 3 attempts on hosts that were lost");
			continue;
		}
		need.egress = needs_egress(t, &rows[i]);
		r = sched_place(t->sched, &need, NULL, 0, host, url);
		if (r == -E2BIG && need.egress) {
			/* Nobody offers egress: try anyway, the host says no_egress. */
			need.egress = 0;
			r = sched_place(t->sched, &need, NULL, 0, host, url);
		}
		if (r < 0)
			continue;
		if (store_template_start(t->st, rows[i].id, host) != 1) {
			sched_unplace(t->sched, host, &need);
			continue;
		}
		if (store_template_get(t->st, rows[i].id, &rows[i]) == 0) {
			fprintf(stderr, "kiln-api: build %s (%s) placed on %s (attempt %u)\n", rows[i].id, rows[i].name, host,
				rows[i].attempts);
			changed(t);
			follow_start(t, &rows[i], 1);
		}
	}
}

/* Rows left building with nobody following them (a restart of kiln-api):
 * follow them again (their host answers 409 to a new POST). */
static void reattach(struct templates *t)
{
	struct store_template rows[MAX_BATCH];
	int n = store_templates_building(t->st, rows, MAX_BATCH);

	for (int i = 0; i < n; i++)
		follow_start(t, &rows[i], 1);
}

/* The clean-up list: cancel builds of deleted templates, delete uploads,
 * delete images nothing names any more. */
static void gc(struct templates *t)
{
	struct store_template_gc g[32];
	int n = store_template_gc_list(t->st, g, 32);

	for (int i = 0; i < n; i++) {
		struct kiln_err err = { .code = "" };
		struct store_template_gc was = g[i];

		if (g[i].host_id[0]) {
			char url[256] = "", path[96];
			int hs = sched_host_state(t->sched, g[i].host_id, url);

			if (hs == 1 && url[0]) {
				snprintf(path, sizeof(path), "/v1/builds/%s", g[i].build_id);
				int st = t->ops->call(t->ops->ctx, url, t->token, "DELETE", path, NULL, 5000, NULL, &err);

				if (st > 0)
					g[i].host_id[0] = '\0';
			} else if (hs == 0) {
				g[i].host_id[0] = '\0'; /* lost: its builds are gone with it */
			}
		}
		if (g[i].oci_key[0] && t->cfg->s3.endpoint && s3_delete(&t->cfg->s3, g[i].oci_key, &err) == 0)
			g[i].oci_key[0] = '\0';
		if (g[i].sha256[0] && store_template_sha_referenced(t->st, g[i].sha256) == 0) {
			if (!g[i].s3_key[0] || !t->cfg->s3.endpoint || s3_delete(&t->cfg->s3, g[i].s3_key, &err) == 0) {
				if (g[i].s3_key[0])
					fprintf(stderr, "kiln-api: template image %s deleted (nothing uses it)\n", g[i].s3_key);
				g[i].sha256[0] = g[i].s3_key[0] = '\0';
			}
		}
		if (memcmp(&was, &g[i], sizeof(was)))
			store_template_gc_update(t->st, &g[i]);
	}
}

void templates_tick(struct templates *t)
{
	int64_t now = kclock_mono_ms(t->clock);

	reattach(t);
	place_builds(t);
	if (now - t->last_gc >= GC_EVERY_MS || now < t->last_gc) {
		t->last_gc = now;
		gc(t);
	}
}

static void *builder_main(void *arg)
{
	struct templates *t = arg;

	while (!stopping(t)) {
		templates_tick(t);
		pthread_mutex_lock(&t->lock);
		if (!t->woken && !t->stopping)
			condwait_until(&t->cond, &t->lock, NULL, clock_mono_ms() + TICK_MS);
		t->woken = 0;
		pthread_mutex_unlock(&t->lock);
	}
	return NULL;
}

struct templates *templates_create(const struct api_config *cfg, struct store *st, struct sched *sched,
				   const struct host_ops *host, const struct kiln_clock *clock, struct kiln_err *err)
{
	struct templates *t = calloc(1, sizeof(*t));

	if (!t || !(t->token = strdup(cfg->cluster_token ? cfg->cluster_token : ""))) {
		free(t);
		kiln_err_set(err, KERR_INTERNAL, "out of memory");
		return NULL;
	}
	t->cfg = cfg;
	t->st = st;
	t->sched = sched;
	t->ops = host ? host : &host_ops_hostclient;
	t->clock = clock;
	t->last_gc = kclock_mono_ms(clock) - GC_EVERY_MS;
	/* The default template is public whether or not a host reported it. */
	store_template_builtin(st, "default");
	pthread_mutex_init(&t->lock, NULL);
	condwait_init(&t->cond);
	return t;
}

int templates_start(struct templates *t)
{
	if (pthread_create(&t->thread, NULL, builder_main, t) != 0)
		return -1;
	t->threaded = 1;
	return 0;
}

void templates_stop(struct templates *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	t->stopping = 1;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
	if (t->threaded) {
		pthread_join(t->thread, NULL);
		t->threaded = 0;
	}
	pthread_mutex_lock(&t->lock);
	for (int i = 0; i < 50 && t->nfollowers; i++)
		condwait_until(&t->cond, &t->lock, NULL, clock_mono_ms() + 100);
	pthread_mutex_unlock(&t->lock);
}

void templates_free(struct templates *t)
{
	if (!t)
		return;
	if (t->nfollowers)
		return; /* one is stuck in a request: the process is exiting */
	pthread_mutex_destroy(&t->lock);
	pthread_cond_destroy(&t->cond);
	free(t->token);
	free(t);
}

/* ---- endpoints ---- */

struct call {
	struct templates *t;
	const char *body;
	size_t len;
	const char *customer;
	int admin;
	struct quota_limiter *lim;
};

static enum MHD_Result reply_template(struct templates *t, struct MHD_Connection *conn, unsigned status,
				      const char *id, int log)
{
	json_t *j = store_template_json(t->st, id, log);

	return j ? reply_json(conn, status, j) : reply_internal(conn, "the template cannot be read back");
}

/* 202 with the new template as stored (queued), then the builder is woken:
 * the answer never shows a later state than the one committed for it. */
static enum MHD_Result reply_created(struct templates *t, struct MHD_Connection *conn, const char *id)
{
	json_t *j = store_template_json(t->st, id, 0);

	wake(t);
	return j ? reply_json(conn, MHD_HTTP_ACCEPTED, j) : reply_internal(conn, "the template cannot be read back");
}

/* The quotas that refuse a new template before anything is read or built:
 * MHD_YES and *ok 1 when it may go on. */
static enum MHD_Result admit(struct templates *t, struct MHD_Connection *conn, const char *customer, int *ok)
{
	struct kiln_err err = { .code = "" };
	struct quota q;
	unsigned count = 0;
	double build_s = 0;

	*ok = 0;
	if (store_customer_quota(t->st, customer, &q) < 0)
		return reply_error(conn, KERR_FORBIDDEN, "this key's customer no longer exists");
	if (store_template_usage(t->st, customer, &count, &build_s) < 0)
		return reply_internal(conn, "cannot read the usage");
	if (quota_check_build(&q, count, build_s, &err) < 0)
		return reply_err(conn, &err);
	*ok = 1;
	return MHD_YES;
}

/* POST /v1/templates with a JSON recipe */
static enum MHD_Result handle_create(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct templates *t = c->t;
	struct kiln_err err = { .code = "" };
	struct recipe r;
	struct quota q;
	char id[40];
	enum MHD_Result ret;
	char *text;
	int ok;

	if (c->admin)
		return reply_error(req->conn, KERR_FORBIDDEN, "an admin key cannot create templates: use a customer key");
	if (MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "name"))
		return reply_error(req->conn, KERR_INVALID_REQUEST,
				   "?name= is for OCI archives (Content-Type: application/x-tar); a recipe names itself");
	if (!c->body || !c->len)
		return reply_error(req->conn, KERR_INVALID_JSON, "the body must be a recipe (a JSON object)");
	if (c->len > RECIPE_MAX_JSON)
		return reply_error(req->conn, KERR_TOO_LARGE, "a recipe is at most 24 MiB");
	if (recipe_parse(c->body, c->len, &r, &err) < 0)
		return reply_err_status(req->conn, MHD_HTTP_BAD_REQUEST, &err);
	ret = admit(t, req->conn, c->customer, &ok);
	if (!ok) {
		recipe_free(&r);
		return ret;
	}
	customer_quota(t->st, c->customer, &q);
	{
		json_t *j = json_loadb(c->body, c->len, 0, NULL);

		text = j ? json_dumps(j, JSON_COMPACT) : NULL;
		json_decref(j);
	}
	if (!text || store_template_new_id(id) < 0) {
		free(text);
		recipe_free(&r);
		return reply_internal(req->conn, "out of memory");
	}
	{
		struct store_template_new n = {
			.customer = c->customer, .name = r.name, .kind = "recipe", .recipe_json = text,
			.max_templates = q.max_templates,
		};

		ok = store_template_create(t->st, id, &n, &err);
	}
	free(text);
	recipe_free(&r);
	if (ok < 0)
		return reply_err(req->conn, &err);
	return reply_created(t, req->conn, id);
}

/* GET /v1/templates */
static enum MHD_Result handle_list(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	json_t *arr = store_template_list(c->t->st, c->customer);

	if (!arr)
		return reply_internal(req->conn, "cannot list the templates");
	return reply_json(req->conn, MHD_HTTP_OK, json_pack("{s:o}", "templates", arr));
}

/* The template {name} names for the caller (own, else public): 0, or -1
 * with the 404 answered (another customer's is exactly as missing). */
static int named(struct call *c, struct httpd_req *req, struct store_template *row, enum MHD_Result *ret)
{
	const char *name = req->param[0];

	if (spec_template_name_check(name, "name", NULL) < 0 || store_template_find(c->t->st, c->customer, name, row) < 0) {
		char msg[128];

		snprintf(msg, sizeof(msg), "no template named %.70s", name);
		*ret = reply_error(req->conn, KERR_NOT_FOUND, msg);
		return -1;
	}
	return 0;
}

/* GET /v1/templates/{name} */
static enum MHD_Result handle_get(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct store_template row;
	enum MHD_Result ret;

	if (named(c, req, &row, &ret) < 0)
		return ret;
	return reply_template(c->t, req->conn, MHD_HTTP_OK, row.id, 1);
}

/* DELETE /v1/templates/{name} */
static enum MHD_Result handle_delete(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct kiln_err err = { .code = "" };
	struct store_template row;
	enum MHD_Result ret;
	int r;

	if (named(c, req, &row, &ret) < 0)
		return ret;
	if (!row.customer[0])
		return reply_error(req->conn, KERR_FORBIDDEN, "public templates cannot be deleted");
	r = store_template_delete(c->t->st, row.id, &err);
	if (r == -EBUSY)
		return reply_err(req->conn, &err);
	if (r == -ENOENT) {
		char msg[128];

		snprintf(msg, sizeof(msg), "no template named %s", row.name);
		return reply_error(req->conn, KERR_NOT_FOUND, msg);
	}
	if (r < 0)
		return reply_internal(req->conn, "cannot delete the template");
	fprintf(stderr, "kiln-api: template %s (%s, %s) deleted\n", row.name, row.id, template_state_name(row.state));
	wake(c->t);
	return reply_json(req->conn, MHD_HTTP_OK,
			  json_pack("{s:s, s:s, s:b, s:b}", "id", row.id, "name", row.name, "deleted", 1, "cancelled",
				    row.state == TEMPLATE_BUILDING || row.state == TEMPLATE_QUEUED));
}

/* GET /v1/templates/{name}/events: "state" on every change, "log"
 * {"line"} per line of build output, "truncated" {"skipped"} for lines no
 * longer kept, and a final "end" {"state","error"?,"sha256"?}. */
struct tsse {
	struct templates *t;
	char id[40];
	uint64_t pos;                /* log bytes sent (of log_total) */
	enum template_state sent;    /* last state sent (TEMPLATE_STATE_COUNT: none) */
	int done;
	struct buf out;              /* formatted, not yet handed to libmicrohttpd */
	size_t off;
	struct quota_limiter *lim;   /* counted there as one of customer's streams (NULL: not) */
	char customer[65];
};

/* Format what is new into e->out. 1 something added, 0 nothing, -1 the end
 * was added (or the row is gone). */
static int tsse_fill(struct tsse *e)
{
	enum template_state state;
	uint64_t total;
	char *log;
	json_t *error;
	int added = 0, r;

	r = store_template_progress(e->t->st, e->id, &state, &total, &log, &error);
	if (r == -ENOENT) {
		reply_sse_event(&e->out, "end", "{\"state\":\"deleted\"}");
		return -1;
	}
	if (r < 0)
		return 0;
	{
		size_t len = strlen(log);
		uint64_t first = total - len; /* the first byte still kept */
		const char *p, *nl;

		if (e->pos < first) {
			char d[64];

			snprintf(d, sizeof(d), "{\"skipped_bytes\":%llu}", (unsigned long long)(first - e->pos));
			reply_sse_event(&e->out, "truncated", d);
			e->pos = first;
			/* Resume at a line's start. */
			p = log;
			if (first && (nl = memchr(log, '\n', len))) {
				e->pos += (uint64_t)(nl + 1 - log);
			}
		}
		p = log + (e->pos - first);
		while ((nl = strchr(p, '\n'))) {
			json_t *d = json_pack("{s:s%}", "line", p, (size_t)(nl - p));
			char *text = d ? json_dumps(d, JSON_COMPACT) : NULL;

			if (text)
				reply_sse_event(&e->out, "log", text);
			free(text);
			json_decref(d);
			e->pos += (uint64_t)(nl + 1 - p);
			p = nl + 1;
			added = 1;
		}
	}
	free(log);
	if (state != e->sent) {
		char d[48];

		snprintf(d, sizeof(d), "{\"state\":\"%s\"}", template_state_name(state));
		reply_sse_event(&e->out, "state", d);
		e->sent = state;
		added = 1;
	}
	if (state == TEMPLATE_READY || state == TEMPLATE_FAILED) {
		json_t *j = store_template_json(e->t->st, e->id, 0), *d;
		char *text;

		d = json_pack("{s:s, s:O?, s:O?, s:O?}", "state", template_state_name(state), "error",
			      json_is_object(error) ? error : NULL, "sha256", json_object_get(j, "sha256"), "size",
			      json_object_get(j, "size"));
		text = d ? json_dumps(d, JSON_COMPACT) : NULL;
		reply_sse_event(&e->out, "end", text ? text : "{}");
		free(text);
		json_decref(d);
		json_decref(j);
		json_decref(error);
		return -1;
	}
	json_decref(error);
	return added;
}

static ssize_t tsse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct tsse *e = cls;
	int64_t deadline = clock_mono_ms() + KEEPALIVE_MS;

	(void)pos;
	for (;;) {
		uint64_t gen;

		if (e->off < e->out.len) {
			size_t n = e->out.len - e->off < max ? e->out.len - e->off : max;

			memcpy(buf, e->out.p + e->off, n);
			e->off += n;
			if (e->off == e->out.len) {
				e->out.len = 0;
				e->off = 0;
			}
			return (ssize_t)n;
		}
		if (e->done || stopping(e->t))
			return MHD_CONTENT_READER_END_OF_STREAM;
		pthread_mutex_lock(&e->t->lock);
		gen = e->t->gen;
		pthread_mutex_unlock(&e->t->lock);
		if (tsse_fill(e) < 0)
			e->done = 1;
		if (e->out.len)
			continue;
		pthread_mutex_lock(&e->t->lock);
		while (e->t->gen == gen && !e->t->stopping && clock_mono_ms() < deadline)
			condwait_until(&e->t->cond, &e->t->lock, NULL, deadline);
		pthread_mutex_unlock(&e->t->lock);
		if (clock_mono_ms() >= deadline)
			return reply_sse_keepalive(buf, max);
	}
}

static void tsse_free(void *cls)
{
	struct tsse *e = cls;

	/* However the stream ends (its end, the client gone, the daemon
	 * stopping): the count goes back. */
	if (e->lim)
		quota_limiter_stream_close(e->lim, e->customer);
	buf_free(&e->out);
	free(e);
}

static enum MHD_Result handle_events(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct store_template row;
	enum MHD_Result ret;
	struct tsse *e;

	if (named(c, req, &row, &ret) < 0)
		return ret;
	e = calloc(1, sizeof(*e));
	if (!e)
		return MHD_NO;
	if (c->lim && !c->admin) {
		struct quota q;

		customer_quota(c->t->st, c->customer, &q);
		if (!quota_limiter_stream_open(c->lim, c->customer, q.max_streams)) {
			free(e);
			return reply_too_many_streams(req->conn, q.max_streams);
		}
		e->lim = c->lim;
		snprintf(e->customer, sizeof(e->customer), "%s", c->customer);
	}
	e->t = c->t;
	snprintf(e->id, sizeof(e->id), "%s", row.id);
	e->sent = TEMPLATE_STATE_COUNT;
	buf_init(&e->out, 0);
	return reply_sse(req->conn, 16384, tsse_read, e, tsse_free);
}

static const struct httpd_route routes[] = {
	{ "GET", "/v1/templates", handle_list },
	{ "POST", "/v1/templates", handle_create },
	{ "GET", "/v1/templates/{name}", handle_get },
	{ "DELETE", "/v1/templates/{name}", handle_delete },
	{ "GET", "/v1/templates/{name}/events", handle_events },
};

static const struct httpd_routes table = { routes, sizeof(routes) / sizeof(routes[0]), "no such endpoint", " or " };

enum MHD_Result templates_handle(struct templates *t, struct MHD_Connection *conn, const char *method,
				 const char *url, const char *body, size_t len, const char *customer, int admin,
				 struct quota_limiter *lim)
{
	struct call c = { .t = t, .body = body, .len = len, .customer = customer, .admin = admin, .lim = lim };
	struct httpd_req r = { .conn = conn, .method = method, .url = url };

	return httpd_dispatch(&table, &c, &r);
}

/* ---- OCI uploads ---- */

struct templates_upload {
	struct templates *t;
	char customer[65], name[64], id[40];
	char path[256];
	int fd;
	uint64_t n, cap;
	int too_big, io_error;
	uint64_t dropped;
	unsigned cap_mib;
};

int templates_is_upload(struct MHD_Connection *conn, const char *method, const char *url)
{
	const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);

	if (strcmp(method, "POST") || strcmp(url, "/v1/templates"))
		return 0;
	return ct && strncasecmp(ct, "application/json", 16);
}

enum MHD_Result templates_upload_begin(struct templates *t, struct MHD_Connection *conn, const char *customer,
				       int admin, struct templates_upload **upp)
{
	const char *name = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "name");
	const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	struct kiln_err err = { .code = "" };
	struct templates_upload *up;
	const char *dir = getenv("TMPDIR");
	enum MHD_Result ret;
	struct quota q;
	int ok;

	*upp = NULL;
	if (admin)
		return reply_error(conn, KERR_FORBIDDEN, "an admin key cannot create templates: use a customer key");
	if (!name)
		return reply_error(conn, KERR_INVALID_REQUEST,
				   "an OCI archive needs ?name=NAME (a recipe is sent as Content-Type: application/json)");
	if (spec_template_name_check(name, "name", &err) < 0)
		return reply_error(conn, KERR_INVALID_REQUEST, err.message);
	if (!t->cfg->s3.endpoint)
		return reply_error(conn, KERR_NO_S3, "this kiln-api has no S3 configured: OCI archives cannot be stored");
	ret = admit(t, conn, customer, &ok);
	if (!ok)
		return ret;
	customer_quota(t->st, customer, &q);
	up = calloc(1, sizeof(*up));
	if (!up)
		return MHD_NO;
	up->t = t;
	up->fd = -1;
	up->cap_mib = q.max_template_mib;
	up->cap = q.max_template_mib ? (uint64_t)q.max_template_mib << 20 : UINT64_MAX / 2;
	snprintf(up->customer, sizeof(up->customer), "%s", customer);
	snprintf(up->name, sizeof(up->name), "%s", name);
	if (cl) {
		char *end;
		unsigned long long v = strtoull(cl, &end, 10);

		if (!*end && v > up->cap) {
			char msg[160];

			free(up);
			snprintf(msg, sizeof(msg), "the archive (%llu bytes) is larger than your quota's max_template_mib (%u MiB)",
				 v, q.max_template_mib);
			return reply_error(conn, KERR_TOO_LARGE, msg);
		}
	}
	snprintf(up->path, sizeof(up->path), "%s/kiln-api-upload-XXXXXX", dir && *dir ? dir : "/tmp");
	up->fd = mkostemp(up->path, O_CLOEXEC);
	if (up->fd < 0 || store_template_new_id(up->id) < 0) {
		templates_upload_free(up);
		return reply_internal(conn, "cannot create a spool file");
	}
	*upp = up;
	return MHD_YES;
}

enum MHD_Result templates_upload_feed(struct templates_upload *up, const char *data, size_t *len)
{
	size_t n = *len;

	*len = 0;
	if (up->too_big || up->n + n > up->cap) {
		if (!up->too_big) {
			up->too_big = 1;
			/* Nothing of it will be kept: give the space back now. */
			if (ftruncate(up->fd, 0) < 0)
				up->io_error = 1;
		}
		up->dropped += n;
		/* libmicrohttpd takes no reply mid-body: drop up to another cap's
		 * worth for the 413 to arrive, then close. */
		return up->dropped > up->cap ? MHD_NO : MHD_YES;
	}
	if (!up->io_error) {
		const char *p = data;
		size_t left = n;

		while (left) {
			ssize_t w = write(up->fd, p, left);

			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0) {
				up->io_error = 1;
				break;
			}
			p += w;
			left -= (size_t)w;
		}
	}
	up->n += n;
	return MHD_YES;
}

enum MHD_Result templates_upload_finish(struct templates_upload *up, struct MHD_Connection *conn)
{
	struct templates *t = up->t;
	struct kiln_err err = { .code = "" };
	char key[128], msg[200];
	struct quota q;
	int r;

	if (up->too_big) {
		snprintf(msg, sizeof(msg), "the archive is larger than your quota's max_template_mib (%u MiB)", up->cap_mib);
		return reply_error(conn, KERR_TOO_LARGE, msg);
	}
	if (up->io_error || fsync(up->fd) < 0)
		return reply_internal(conn, "cannot spool the archive");
	if (!up->n)
		return reply_error(conn, KERR_INVALID_REQUEST, "the body is empty: send the image archive (docker save)");
	snprintf(key, sizeof(key), "_templates/uploads/%s.tar", up->id);
	pthread_mutex_lock(&t->lock);
	r = t->bucket_ok;
	pthread_mutex_unlock(&t->lock);
	if (!r && s3_ensure_bucket(&t->cfg->s3, &err) == 0) {
		pthread_mutex_lock(&t->lock);
		t->bucket_ok = 1;
		pthread_mutex_unlock(&t->lock);
	}
	if (s3_put_file(&t->cfg->s3, key, up->path, "application/x-tar", NULL, NULL, &err) < 0) {
		snprintf(msg, sizeof(msg), "cannot store the archive in S3: %s", err.message);
		return reply_error_status(conn, MHD_HTTP_SERVICE_UNAVAILABLE, KERR_S3_UNAVAILABLE, msg);
	}
	customer_quota(t->st, up->customer, &q);
	{
		struct store_template_new n = {
			.customer = up->customer, .name = up->name, .kind = "oci", .oci_key = key, .oci_size = up->n,
			.max_templates = q.max_templates,
		};

		r = store_template_create(t->st, up->id, &n, &err);
	}
	if (r < 0) {
		struct kiln_err e2 = { .code = "" };

		s3_delete(&t->cfg->s3, key, &e2);
		return reply_err(conn, &err);
	}
	return reply_created(t, conn, up->id);
}

void templates_upload_free(struct templates_upload *up)
{
	if (!up)
		return;
	if (up->fd >= 0) {
		close(up->fd);
		unlink(up->path);
	}
	free(up);
}
