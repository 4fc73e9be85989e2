/* upload: hostd's upload threads. A task whose code has ended has its
 * spooled outputs, logs and manifest uploaded to S3 (through the hostd's
 * vm_ops), a few objects at a time, retried with an exponential back-off on
 * the hostd's clock until S3 has confirmed every object; then
 * hostd_task_finished_locked makes it final. Also the janitor (final tasks
 * past their retention go) and the S3 settings, which SIGHUP may replace
 * under running uploads. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "condwait.h"
#include "connectrpc.h"
#include "fsutil.h"
#include "hostd_int.h"
#include "io.h"
#include "proto.h"
#include "spool.h"

/* Copy the S3 settings under the lock so that a reload cannot free them
 * under a running upload. */
struct s3_copy {
	struct s3_config c;
	char *s[5];
};

static void s3_copy_take(struct hostd *d, struct s3_copy *cp)
{
	cp->c = d->s3;
	for (int i = 0; i < 5; i++)
		cp->s[i] = d->s3_strings[i] ? strdup(d->s3_strings[i]) : NULL;
	cp->c.endpoint = cp->s[0];
	cp->c.region = cp->s[1];
	cp->c.bucket = cp->s[2];
	cp->c.access_key = cp->s[3];
	cp->c.secret_key = cp->s[4];
}

static void s3_copy_free(struct s3_copy *cp)
{
	for (int i = 0; i < 5; i++)
		free(cp->s[i]);
}

static json_t *manifest_json_locked(struct hostd *d, struct hostd_task *t)
{
	json_t *res = json_deep_copy(t->result);

	/* The manifest describes; the logs hold the output itself. */
	json_object_del(res, "stdout");
	json_object_del(res, "stderr");
	json_object_del(res, "outputs");
	/* Version 2: an artifact may carry its bytes ("inline", base64). */
	return json_pack("{s:i, s:s, s:s, s:s, s:s, s:o, s:O, s:O, s:{s:I, s:I, s:I}}", "version", 2, "task", t->id,
			 "customer", t->customer, "host_id", d->host_id, "state", hostd_state_names[t->final_state], "result",
			 res, "outputs", t->outputs, "artifacts", t->artifacts, "timestamps_ms", "created",
			 (json_int_t)t->created_ms, "running", (json_int_t)t->running_ms,
			 "ended", (json_int_t)t->ended_ms);
}

/* Upload one file of the task; on success record what landed. */
static int upload_one(struct hostd *d, struct hostd_task *t, const struct s3_config *s3, const char *rel_key,
		      const char *path, const char *content_type, const char *want_sha, const char *artifact,
		      struct kiln_err *err)
{
	char *key = hostd_s3_key(t, rel_key);
	char sha[65] = "";
	uint64_t sent = 0;
	struct stat st;
	int r;

	if (!key)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	if (stat(path, &st) < 0) {
		free(key);
		return kiln_err_set(err, KERR_IO_ERROR, "spooled file %s is missing: %s", path, strerror(errno));
	}
	r = d->ops->put_file(d->ops->ctx, s3, key, path, content_type, sha, &sent, err);
	pthread_mutex_lock(&d->lock);
	d->upload_bytes += sent;
	if (r == 0) {
		d->upload_files++;
		if (artifact)
			json_object_set_new(t->artifacts, artifact,
					    json_pack("{s:s, s:I, s:s}", "s3_key", key, "size", (json_int_t)st.st_size,
						      "sha256", sha));
	}
	pthread_mutex_unlock(&d->lock);
	if (r == 0 && want_sha && strcmp(want_sha, sha))
		r = kiln_err_set(err, KERR_IO_ERROR, "spooled %s does not match the sha256 the guest's data had (%s, now %s)",
				 rel_key, want_sha, sha);
	free(key);
	return r;
}

/* A log of at most cfg.inline_log_max bytes goes inside manifest.json
 * instead of an object of its own (one PUT for a small task, not three):
 * its artifact entry gets {"inline": base64, "size", "sha256"}, no s3_key.
 * 1 when it did (nothing to upload), 0 when the log is too big (upload it),
 * -1 with err. */
static int inline_log(struct hostd *d, struct hostd_task *t, const char *name, const char *path,
		      struct kiln_err *err)
{
	struct buf b = { 0 };
	char sha[65];
	size_t len = 0;
	char *data;
	struct stat st;
	json_t *a;

	if (!d->cfg.inline_log_max || stat(path, &st) < 0 || (uint64_t)st.st_size > d->cfg.inline_log_max)
		return 0;
	data = io_read_file(path, d->cfg.inline_log_max, &len);
	if (!data)
		return errno == EFBIG ? 0 : kiln_err_set(err, KERR_IO_ERROR, "spooled %s: %s", name, strerror(errno));
	if (fs_sha256_buf(data, len, sha) < 0) {
		free(data);
		return kiln_err_set(err, KERR_IO_ERROR, "spooled %s: cannot hash it", name);
	}
	if (connect_b64_append(&b, data, len) < 0) {
		free(data);
		buf_free(&b);
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	}
	free(data);
	a = json_pack("{s:n, s:I, s:s, s:s}", "s3_key", "size", (json_int_t)len, "sha256", sha, "inline", b.p ? b.p : "");
	buf_free(&b);
	if (!a)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	pthread_mutex_lock(&d->lock);
	json_object_set_new(t->artifacts, name, a);
	pthread_mutex_unlock(&d->lock);
	return 1;
}

/* Upload step `step` of t: an output (step < nout; one whose name is no
 * valid key is skipped), stdout.log (nout), stderr.log (nout + 1), the
 * manifest (nout + 2). Thread-safe for distinct steps. */
static int upload_step(struct hostd *d, struct hostd_task *t, const struct s3_config *s3, size_t step, size_t nout,
		       struct kiln_err *err)
{
	char path[8400], rel[PROTO_MAX_PATH + 16], sha[65] = "";

	if (step < nout) {
		json_t *o;
		int skip;

		pthread_mutex_lock(&d->lock);
		o = json_array_get(t->outputs, step);
		skip = json_is_null(json_object_get(o, "s3_key")); /* see its "skipped" */
		snprintf(rel, sizeof(rel), "outputs/%s", json_string_value(json_object_get(o, "path")) ?: "");
		snprintf(sha, sizeof(sha), "%s", json_string_value(json_object_get(o, "sha256")) ?: "");
		pthread_mutex_unlock(&d->lock);
		if (skip)
			return 0;
		snprintf(path, sizeof(path), "%s/%s", t->dir, rel);
		return upload_one(d, t, s3, rel, path, "application/octet-stream", sha, NULL, err);
	}
	if (step == nout || step == nout + 1) {
		const char *name = step == nout ? "stdout.log" : "stderr.log";
		int r;

		snprintf(path, sizeof(path), "%s/%s", t->dir, name);
		/* A task that never started has no logs: an empty one says so. */
		if (access(path, F_OK) < 0) {
			int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);

			if (fd >= 0)
				close(fd);
		}
		r = inline_log(d, t, name, path, err);
		if (r != 0)
			return r < 0 ? -1 : 0;
		return upload_one(d, t, s3, name, path, "text/plain; charset=utf-8", NULL, name, err);
	}
	{
		json_t *m;
		int r;

		pthread_mutex_lock(&d->lock);
		m = manifest_json_locked(d, t);
		pthread_mutex_unlock(&d->lock);
		/* Made again from the record whenever it is uploaded: not waited
		 * onto the disk. */
		r = spool_write_json(t->dir, "manifest.json", m, 0, err);
		json_decref(m);
		snprintf(path, sizeof(path), "%s/manifest.json", t->dir);
		return r < 0 ? -1 : upload_one(d, t, s3, "manifest.json", path, "application/json", NULL, "manifest.json", err);
	}
}

#define UPLOAD_PARALLEL 4 /* objects of one task in flight at once */

struct upload_batch {
	struct hostd *d;
	struct hostd_task *t;
	const struct s3_config *s3;
	size_t next, end, nout, base;
	unsigned char *ok;
	pthread_mutex_t lock;
	int failed;
	struct kiln_err err;
};

static void *upload_batch_worker(void *arg)
{
	struct upload_batch *b = arg;

	for (;;) {
		struct kiln_err e = { .code = "" };
		size_t step;
		int r;

		pthread_mutex_lock(&b->lock);
		step = b->failed ? b->end : b->next++;
		pthread_mutex_unlock(&b->lock);
		if (step >= b->end)
			return NULL;
		r = upload_step(b->d, b->t, b->s3, step, b->nout, &e);
		pthread_mutex_lock(&b->lock);
		if (r < 0 && !b->failed) {
			b->failed = 1;
			b->err = e;
		} else if (r == 0) {
			b->ok[step - b->base] = 1;
		}
		pthread_mutex_unlock(&b->lock);
	}
}

/* Upload whatever of t is not confirmed yet: its outputs and logs, up to
 * UPLOAD_PARALLEL at a time (a trivial task's four small objects would
 * otherwise cost four round trips in a row), then the manifest, last: its
 * presence means everything else is there. */
static int upload_task(struct hostd *d, struct hostd_task *t, const struct s3_config *s3, struct kiln_err *err)
{
	struct upload_batch b = { .d = d, .t = t, .s3 = s3 };
	pthread_t th[UPLOAD_PARALLEL];
	unsigned nth = 0;
	size_t k;

	pthread_mutex_lock(&d->lock);
	b.nout = json_array_size(t->outputs);
	b.base = b.next = t->upload_done;
	pthread_mutex_unlock(&d->lock);
	b.end = b.nout + 2;
	if (b.base < b.end) {
		b.ok = calloc(b.end - b.base, 1);
		if (!b.ok)
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		pthread_mutex_init(&b.lock, NULL);
		/* This thread is one of the uploaders; helpers only when there is more. */
		for (; nth + 1 < UPLOAD_PARALLEL && nth + 1 < b.end - b.base; nth++)
			if (pthread_create(&th[nth], NULL, upload_batch_worker, &b) != 0)
				break;
		upload_batch_worker(&b);
		for (unsigned i = 0; i < nth; i++)
			pthread_join(th[i], NULL);
		pthread_mutex_destroy(&b.lock);
		/* Progress survives a failure: what went up in order need not go again. */
		pthread_mutex_lock(&d->lock);
		for (k = 0; k < b.end - b.base && b.ok[k]; k++)
			t->upload_done++;
		pthread_mutex_unlock(&d->lock);
		free(b.ok);
		if (b.failed) {
			*err = b.err;
			return -1;
		}
	}
	if (upload_step(d, t, s3, b.end, b.nout, err) < 0)
		return -1;
	pthread_mutex_lock(&d->lock);
	t->upload_done = b.end + 1;
	pthread_mutex_unlock(&d->lock);
	return 0;
}

static unsigned backoff_ms(const struct hostd *d, unsigned attempts)
{
	uint64_t ms = 1000ull << (attempts < 16 ? attempts - 1 : 15);
	uint64_t cap = (uint64_t)(d->cfg.max_backoff_s ? d->cfg.max_backoff_s : 30) * 1000;

	return (unsigned)(ms < cap ? ms : cap);
}

void *hostd_uploader_main(void *arg)
{
	struct hostd *d = arg;

	pthread_mutex_lock(&d->lock);
	while (!d->stopping) {
		struct hostd_task *pick = NULL;
		int64_t now = kclock_mono_ms(d->clk), next = now + JANITOR_PERIOD_MS;
		struct s3_copy s3;
		struct dest dest = { .endpoint = "" };
		struct kiln_err err = { .code = "" };
		int r, need_bucket;

		if (now >= d->next_janitor_ms) {
			d->next_janitor_ms = now + JANITOR_PERIOD_MS;
			hostd_janitor_locked(d);
		}
		if (d->hook_fn && !d->hook_busy && now >= d->next_hook_ms) {
			void (*fn)(void *) = d->hook_fn;
			void *ctx = d->hook_ctx;

			/* Without the lock: the hook reads the disk and asks S3,
			 * and tasks must not wait for that. */
			d->next_hook_ms = now + d->hook_period_ms;
			d->hook_busy = 1;
			pthread_mutex_unlock(&d->lock);
			fn(ctx);
			pthread_mutex_lock(&d->lock);
			d->hook_busy = 0;
			pthread_cond_broadcast(&d->changed);
			continue;
		}
		for (struct hostd_task *t = d->tasks; t; t = t->next) {
			if (!t->in_upload || t->upload_busy)
				continue;
			if (t->next_upload_ms <= now && (!pick || t->next_upload_ms < pick->next_upload_ms))
				pick = t;
			else if (t->next_upload_ms > now && t->next_upload_ms < next)
				next = t->next_upload_ms;
		}
		if (!pick || !d->have_s3) {
			if (next > now + 1000)
				next = now + 1000;
			condwait_until(&d->upload_wake, &d->lock, d->clk, next);
			continue;
		}
		pick->upload_busy = 1;
		pick->refs++;
		if (pick->dest) {
			/* The customer's own bucket: its credentials (copied: a PUT
			 * of new ones may replace them meanwhile); never created
			 * here, it is the customer's. */
			dest = *pick->dest;
			dest_s3_config(&dest, d->cfg.dest_allow, &s3.c);
			memset(s3.s, 0, sizeof(s3.s));
			need_bucket = 0;
		} else {
			s3_copy_take(d, &s3);
			need_bucket = !d->bucket_ok;
		}
		pthread_mutex_unlock(&d->lock);

		r = need_bucket ? d->ops->ensure_bucket(d->ops->ctx, &s3.c, &err) : 0;
		if (r == 0)
			r = upload_task(d, pick, &s3.c, &err);
		s3_copy_free(&s3);
		dest_wipe(&dest);

		pthread_mutex_lock(&d->lock);
		if (need_bucket && r == 0)
			d->bucket_ok = 1;
		pick->upload_busy = 0;
		if (r == 0) {
			json_t *record;

			/* Not final before the record of its result is on disk
			 * (its worker writes it while this uploads). */
			while (pick->record_pending)
				pthread_cond_wait(&d->changed, &d->lock);
			record = hostd_task_finished_locked(d, pick);

			pthread_mutex_unlock(&d->lock);
			hostd_task_persist_final(d, pick, record);
			pthread_mutex_lock(&d->lock);
		} else {
			pick->upload_attempts++;
			d->upload_failures++;
			snprintf(pick->last_error, sizeof(pick->last_error), "%s: %s", err.code, err.message);
			pick->next_upload_ms = kclock_mono_ms(d->clk) + backoff_ms(d, pick->upload_attempts);
			hostd_event_add_locked(d, pick, "upload_error",
					       json_pack("{s:s, s:s, s:i}", "code", err.code, "message", err.message, "attempt",
						   (int)pick->upload_attempts));
			fprintf(stderr, "kiln-host: task %s: upload attempt %u failed: %s (retrying)\n", pick->id,
				pick->upload_attempts, pick->last_error);
		}
		hostd_task_put_locked(pick);
	}
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

/* Forget finished tasks older than the retention (record and directory). */
void hostd_janitor_locked(struct hostd *d)
{
	int64_t cutoff = kclock_wall_ms(d->clk) - (int64_t)d->cfg.retention_s * 1000;
	struct hostd_task **pp = &d->tasks;

	while (*pp) {
		struct hostd_task *t = *pp;

		if (state_final(t->state) && t->finished_ms && t->finished_ms < cutoff) {
			*pp = t->next;
			d->ntasks--;
			spool_rm_tree(t->dir);
			hostd_task_put_locked(t);
			continue;
		}
		pp = &t->next;
	}
}


/* ---- S3 settings ---- */

void hostd_s3_set_locked(struct hostd *d, const struct s3_config *s3)
{
	for (int i = 0; i < 5; i++) {
		free(d->s3_strings[i]);
		d->s3_strings[i] = NULL;
	}
	d->have_s3 = s3 && s3->endpoint && s3->bucket;
	if (!d->have_s3)
		return;
	d->s3 = *s3;
	d->s3_strings[0] = strdup(s3->endpoint);
	d->s3_strings[1] = strdup(s3->region ? s3->region : "us-east-1");
	d->s3_strings[2] = strdup(s3->bucket);
	d->s3_strings[3] = strdup(s3->access_key ? s3->access_key : "");
	d->s3_strings[4] = strdup(s3->secret_key ? s3->secret_key : "");
	d->s3.endpoint = d->s3_strings[0];
	d->s3.region = d->s3_strings[1];
	d->s3.bucket = d->s3_strings[2];
	d->s3.access_key = d->s3_strings[3];
	d->s3.secret_key = d->s3_strings[4];
	d->bucket_ok = 0;
	d->s3_generation++;
}

void hostd_set_janitor_hook(struct hostd *d, void (*fn)(void *ctx), void *ctx, unsigned period_ms)
{
	pthread_mutex_lock(&d->lock);
	while (d->hook_busy)
		pthread_cond_wait(&d->changed, &d->lock);
	d->hook_fn = fn;
	d->hook_ctx = ctx;
	d->hook_period_ms = period_ms ? period_ms : JANITOR_PERIOD_MS;
	d->next_hook_ms = kclock_mono_ms(d->clk) + d->hook_period_ms;
	pthread_mutex_unlock(&d->lock);
}

void hostd_set_s3(struct hostd *d, const struct s3_config *s3)
{
	pthread_mutex_lock(&d->lock);
	hostd_s3_set_locked(d, s3);
	/* Retry now: the fix may be exactly what the failing uploads waited for. */
	for (struct hostd_task *t = d->tasks; t; t = t->next)
		if (t->in_upload)
			t->next_upload_ms = kclock_mono_ms(d->clk);
	pthread_cond_broadcast(&d->upload_wake);
	pthread_mutex_unlock(&d->lock);
}


int hostd_set_dest(struct hostd *d, const char *id, const struct dest *dest, struct kiln_err *err)
{
	struct hostd_task *t;
	int r = 0;

	pthread_mutex_lock(&d->lock);
	for (t = d->tasks; t && strcmp(t->id, id); t = t->next)
		;
	/* One writer of the record at a time, the newest last: its worker may
	 * be writing the uploading one now (without the lock). */
	while (t && t->record_pending)
		pthread_cond_wait(&d->changed, &d->lock);
	if (!t)
		r = kiln_err_set(err, KERR_NOT_FOUND, "no such task");
	else if (!t->dest)
		r = kiln_err_set(err, KERR_INVALID_REQUEST, "the task has no destination of its own");
	else if (!dest_same_place(t->dest, dest))
		r = kiln_err_set(err, KERR_INVALID_REQUEST,
				 "a task's destination can get new credentials, not another endpoint, bucket or prefix");
	/* A final task's upload is done: its credentials are not kept. */
	if (r == 0 && !state_final(t->state)) {
		struct dest old = *t->dest;

		*t->dest = *dest;
		if (hostd_record_write_locked(t, err) < 0) {
			*t->dest = old;
			r = -1;
		}
		dest_wipe(&old);
		/* Retry now: the new credentials may be what the upload waited for. */
		if (r == 0 && t->in_upload) {
			t->next_upload_ms = kclock_mono_ms(d->clk);
			pthread_cond_broadcast(&d->upload_wake);
		}
	}
	pthread_mutex_unlock(&d->lock);
	return r;
}

const struct netaddr_allow *hostd_dest_allow(const struct hostd *d)
{
	return d->cfg.dest_allow;
}

int hostd_s3_take(struct hostd *d, struct hostd_s3 *out)
{
	struct s3_copy cp;
	int have;

	pthread_mutex_lock(&d->lock);
	have = d->have_s3;
	if (have)
		s3_copy_take(d, &cp);
	pthread_mutex_unlock(&d->lock);
	if (!have)
		return -1;
	out->c = cp.c;
	memcpy(out->s, cp.s, sizeof(out->s));
	return 0;
}

void hostd_s3_free(struct hostd_s3 *s)
{
	for (int i = 0; i < 5; i++)
		free(s->s[i]);
	memset(s, 0, sizeof(*s));
}
