/* template_build: kiln-api's template builder (see templates.h): one
 * thread places queued builds on hosts (the row moves queued -> building
 * with a compare-and-set), a follower thread per build POSTs it to its
 * host, relays its log lines into the row and follows it to its end; a
 * restarted kiln-api re-follows the rows left building (a host answering
 * 404 has forgotten the build: it is queued again, at most
 * TEMPLATES_MAX_ATTEMPTS times). The clean-up list (builds to cancel,
 * uploads and unreferenced images to delete from S3) is worked through
 * every GC_EVERY_MS. Also the module's lifetime and shared helpers. */
#include "templates_int.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "condwait.h"
#include "s3.h"
#include "store/store.h"

#define TICK_MS 500
#define GC_EVERY_MS 5000
#define MAX_BATCH 64
#define BUILD_VCPUS 1
#define BUILD_MEMORY_MIB 512      /* what a build VM is counted as when placing it */
#define FOLLOW_STALL_S 40
#define TIMEOUT_GRACE_MS 60000    /* past timeout_s + this, kiln-api gives up on the host */

/* ---- shared helpers (templates_int.h) ---- */

void tpl_changed(struct templates *t)
{
	pthread_mutex_lock(&t->lock);
	t->gen++;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
}

void tpl_wake(struct templates *t)
{
	pthread_mutex_lock(&t->lock);
	t->woken = 1;
	t->gen++;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
}

int tpl_stopping(struct templates *t)
{
	return condwait_flag(&t->lock, &t->stopping);
}

/* Wait up to ms on t->cond (or until stopping). */
void tpl_nap(struct templates *t, long ms)
{
	int64_t until = clock_mono_ms() + ms;

	pthread_mutex_lock(&t->lock);
	if (!t->stopping)
		condwait_until(&t->cond, &t->lock, NULL, until);
	pthread_mutex_unlock(&t->lock);
}

void tpl_customer_quota(struct store *st, const char *customer, struct quota *q)
{
	if (!customer[0] || store_customer_quota(st, customer, q) < 0)
		quota_defaults(q);
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
		tpl_changed(f->t);
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
	return tpl_stopping(f->t);
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
static json_t *checked_template_ref(const struct store_template *row, json_t *ref, uint64_t max_bytes, char *msg,
				    size_t cap)
{
	const char *sha = json_string_value(json_object_get(ref, "sha256"));
	const char *key = json_string_value(json_object_get(ref, "s3_key"));
	json_int_t size = json_integer_value(json_object_get(ref, "size"));
	char want[128];
	json_t *out;

	if (!json_is_object(ref) || !hex64(sha)) {
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
	out = json_deep_copy(ref);
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
	tpl_changed(t);
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
	tpl_changed(t);
}

/* POST the build to its host: 1 there (or already), 0 settled or requeued,
 * -1 unreachable (retry). */
static int push_build(struct templates *t, const struct store_template *row, const char *url)
{
	struct kiln_err err = { .code = "" };
	struct quota q;
	json_t *body, *reply = NULL;
	int st;

	tpl_customer_quota(t->st, row->customer, &q);
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
			tpl_changed(t);
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
	tpl_customer_quota(t->st, row.customer, &q);
	deadline = row.started_ms + (int64_t)(q.build_timeout_s ? q.build_timeout_s : 1800) * 1000 + TIMEOUT_GRACE_MS;
	while (!tpl_stopping(t) && still_mine(t, row.id, host, &row)) {
		struct kiln_err err = { .code = "" };
		struct follow_ctx f = { .t = t, .id = row.id };
		json_t *b = NULL;
		int hs = sched_host_state(t->sched, host, url), st;

		if (hs == 0) {
			retry_build(t, &row, "its host is lost");
			return;
		}
		if (!url[0]) {
			tpl_nap(t, 1000);
			continue;
		}
		if (push) {
			int r = push_build(t, &row, url);

			if (r == 0)
				return;
			if (r < 0) {
				tpl_nap(t, backoff);
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
			if (tpl_stopping(t))
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
				json_t *ref = checked_template_ref(&row, json_object_get(b, "template"),
									  (uint64_t)q.max_template_mib << 20, msg, sizeof(msg));

				if (ref) {
					store_template_finish(t->st, row.id, ref, NULL, NULL);
					tpl_changed(t);
					fprintf(stderr, "kiln-api: template %s (%s) is ready\n", row.name, row.id);
				} else if (!strncmp(msg, "too_large: ", 11)) {
					fail_build(t, row.id, "too_large", msg + 11);
				} else {
					fail_build(t, row.id, "build_failed", msg);
				}
				json_decref(ref);
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
		tpl_nap(t, st == 200 ? (t->ops->follow_path ? 200 : 500) : backoff);
		if (st != 200)
			backoff = backoff * 2 < 10000 ? backoff * 2 : 10000;
	}
	/* Deleted while our POST was on its way (the clean-up's DELETE may
	 * have reached the host first): cancel it once more. */
	if (!push && url[0] && !tpl_stopping(t) && store_template_get(t->st, row.id, &row) == -ENOENT) {
		struct kiln_err err = { .code = "" };

		snprintf(path, sizeof(path), "/v1/builds/%s", row0->id);
		t->ops->call(t->ops->ctx, url, t->token, "DELETE", path, NULL, 5000, NULL, &err);
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
			tpl_changed(t);
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

	while (!tpl_stopping(t)) {
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
