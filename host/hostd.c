/* hostd: tasks on one host, from acceptance to outputs confirmed by S3.
 *
 * Threads: one worker per running task (it owns the VM through run_task), a
 * few upload threads, and the HTTP threads that call in. One mutex guards the
 * task table and every task's mutable fields; `changed` is broadcast on every
 * state change or new event (event streams wait on it), `upload_wake` wakes
 * the upload threads.
 *
 * Durability: a task's record.json is written (fsync'd) before hostd_submit
 * returns, again when its code has ended (state "uploading", with the result)
 * and when S3 has confirmed everything (the final state). Spooled files are
 * deleted only after that last write. A restart therefore finds each task
 * either unfinished (it ends as error/host_restart, and its logs are still
 * uploaded), uploading (the upload resumes) or final. */
#include "hostd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "evlog.h"
#include "excerpt.h"
#include "proto.h"
#include "spec.h"
#include "spool.h"
#include "textbuf.h"

#define EVENTS_MAX_BYTES (4u << 20) /* per task, kept for late subscribers */
#define JANITOR_PERIOD_MS 60000

enum task_state {
	TS_ACCEPTED,
	TS_STARTING,
	TS_RUNNING,
	TS_UPLOADING,
	TS_SUCCEEDED,
	TS_FAILED,
	TS_TIMED_OUT,
	TS_CANCELLED,
	TS_ERROR,
	TS_COUNT
};

static const char *const state_names[TS_COUNT] = {
	"accepted", "starting", "running", "uploading", "succeeded", "failed", "timed_out", "cancelled", "error",
};

static int state_final(enum task_state s)
{
	return s >= TS_SUCCEEDED;
}

static enum task_state state_parse(const char *s)
{
	for (int i = 0; s && i < TS_COUNT; i++)
		if (!strcmp(s, state_names[i]))
			return (enum task_state)i;
	return TS_COUNT;
}

struct hostd_task {
	char id[65], customer[65];
	char dir[4096];              /* SPOOL/tasks/ID */
	char *spec_json;             /* until the worker has parsed it */
	unsigned vcpus, memory_mib;
	int reserved;                /* holds vcpus/memory in the capacity */
	enum task_state state;
	enum task_state final_state; /* what the task ends as once uploaded */
	json_t *result;              /* run_task's result, from "uploading" on */
	json_t *outputs;             /* result outputs plus s3_key */
	json_t *artifacts;           /* name -> {s3_key, size, sha256} once uploaded */
	char last_error[600];
	int64_t created_ms, running_ms, ended_ms, finished_ms; /* wall clock */
	int cancel_pipe[2];
	int cancel_requested;
	int stdout_fd, stderr_fd;    /* open while the code runs */
	uint64_t stdout_off, stderr_off; /* bytes in stdout.log / stderr.log so far */
	/* Events: formatted SSE blocks, kept so that a late subscriber sees
	 * all; closed once the task is final. */
	struct evlog ev;
	/* Upload progress (in memory: a restart uploads again from the start;
	 * PUTs are idempotent). */
	int upload_busy, in_upload;
	size_t upload_done;
	unsigned upload_attempts;
	int64_t next_upload_ms;      /* monotonic */
	int64_t upload_started_ms;
	unsigned refs;               /* table + workers + streams */
	struct hostd_task *next;
};

struct hostd {
	struct hostd_config cfg;
	struct run_opts ro;
	struct capacity *cap;
	struct pool *pool;
	char host_id[65];
	char spool[4096];
	pthread_mutex_t lock;
	pthread_cond_t changed, upload_wake;
	struct hostd_task *tasks;   /* all tasks, newest first */
	size_t ntasks;
	unsigned vcpus_used;
	unsigned workers;           /* worker threads alive (detached) */
	int stopping;
	/* S3 settings: copied, replaced by hostd_set_s3. */
	struct s3_config s3;
	char *s3_strings[5];
	int have_s3;
	int bucket_ok;              /* the bucket exists (made on the first upload) */
	unsigned s3_generation;
	pthread_t *uploaders;
	unsigned nuploaders;
	int64_t next_janitor_ms;
	/* Metrics. */
	uint64_t accepted_total, finished_total[TS_COUNT];
	uint64_t upload_bytes, upload_failures, upload_files;
	uint64_t start_hist[12], start_count;
	double start_sum;
};

static const double start_buckets[11] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 };

static int64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- task table (d->lock held) ---- */

static struct hostd_task *find_locked(struct hostd *d, const char *id)
{
	for (struct hostd_task *t = d->tasks; t; t = t->next)
		if (!strcmp(t->id, id))
			return t;
	return NULL;
}

static void task_free(struct hostd_task *t)
{
	free(t->spec_json);
	json_decref(t->result);
	json_decref(t->outputs);
	json_decref(t->artifacts);
	evlog_free(&t->ev);
	if (t->cancel_pipe[0] >= 0)
		close(t->cancel_pipe[0]);
	if (t->cancel_pipe[1] >= 0)
		close(t->cancel_pipe[1]);
	if (t->stdout_fd >= 0)
		close(t->stdout_fd);
	if (t->stderr_fd >= 0)
		close(t->stderr_fd);
	free(t);
}

static struct hostd_task *task_new(struct hostd *d, const char *id, const char *customer)
{
	struct hostd_task *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	snprintf(t->id, sizeof(t->id), "%s", id);
	snprintf(t->customer, sizeof(t->customer), "%s", customer);
	snprintf(t->dir, sizeof(t->dir), "%s/tasks/%s", d->spool, id);
	t->cancel_pipe[0] = t->cancel_pipe[1] = -1;
	t->stdout_fd = t->stderr_fd = -1;
	t->outputs = json_array();
	t->artifacts = json_object();
	t->refs = 1; /* the table's */
	evlog_init(&t->ev, &(struct evlog_opts){ .lock = &d->lock, .cond = &d->changed, .stopping = &d->stopping,
						 .max_bytes = EVENTS_MAX_BYTES, .short_frame = 1,
						 .truncated_data = "{\"message\":\"event stream truncated: the full "
								   "output is in stdout.log/stderr.log\"}" });
	return t;
}

static void task_put_locked(struct hostd_task *t)
{
	if (--t->refs == 0)
		task_free(t);
}

/* Append one server-sent event: "event: NAME\ndata: JSON\n\n" (data taken).
 * Output beyond EVENTS_MAX_BYTES is in the logs in S3, not in the stream. */
static void event_add_locked(struct hostd *d, struct hostd_task *t, const char *name, json_t *data)
{
	(void)d; /* t->ev broadcasts d->changed */
	evlog_append_locked(&t->ev, name, data);
	json_decref(data);
}

/* A final task's output events go (they are in stdout.log/stderr.log in S3):
 * kept for retention_s, they would hold up to EVENTS_MAX_BYTES per task. The
 * last one dropped becomes a `truncated` note, so that a reader that had not
 * read them all yet learns where the output is; entries are NULLed, not
 * removed, so that readers' cursors stay valid. */
static void events_drop_output_locked(struct hostd_task *t)
{
	static const char *const output[] = { "stdout", "stderr", NULL };
	static const char note[] = "event: truncated\ndata: {\"message\":\"output events are not kept once the task "
				   "is final: the whole output is in stdout.log/stderr.log\"}\n\n";

	evlog_drop_locked(&t->ev, output, note);
}

static void set_state_locked(struct hostd *d, struct hostd_task *t, enum task_state s)
{
	t->state = s;
	event_add_locked(d, t, "state", json_pack("{s:s, s:I}", "state", state_names[s], "at", (json_int_t)wall_ms()));
	if (state_final(s))
		evlog_close_locked(&t->ev);
}

/* The durable record: small, rewritten at each milestone. */
static json_t *record_json_locked(struct hostd_task *t)
{
	return json_pack("{s:i, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:O*, s:O, s:O, s:s*}", "version", 1, "id", t->id,
			 "customer", t->customer, "state", state_names[t->state], "final_state",
			 state_names[t->final_state], "created_ms", (json_int_t)t->created_ms, "running_ms",
			 (json_int_t)t->running_ms, "ended_ms", (json_int_t)t->ended_ms, "finished_ms",
			 (json_int_t)t->finished_ms, "result", t->result, "outputs", t->outputs, "artifacts", t->artifacts,
			 "last_error",
			 t->last_error[0] ? t->last_error : NULL);
}

static int record_write_locked(struct hostd_task *t, struct kiln_err *err)
{
	json_t *r = record_json_locked(t);
	int ret;

	if (!r)
		return kiln_err_set(err, "host_error", "out of memory");
	ret = spool_write_json(t->dir, "record.json", r, err);
	json_decref(r);
	return ret;
}

/* ---- S3 keys ---- */

static char *s3_key_for(const struct hostd_task *t, const char *rel)
{
	char *k = NULL;

	if (asprintf(&k, "%s/%s/%s", t->customer, t->id, rel) < 0)
		return NULL;
	return k;
}

/* Outputs with their S3 keys, from run_task's list. */
static json_t *outputs_with_keys(const struct hostd_task *t, json_t *outs)
{
	json_t *a = json_array(), *o;
	size_t i;

	json_array_foreach(outs, i, o) {
		json_t *c = json_deep_copy(o);
		char rel[PROTO_MAX_PATH + 16], *k;

		struct kiln_err err = { .code = "" };

		if (json_object_get(o, "skipped")) { /* collect left it out (its name) */
			json_array_append_new(a, c);
			continue;
		}
		snprintf(rel, sizeof(rel), "outputs/%s", json_string_value(json_object_get(o, "path")) ?: "");
		k = s3_key_for(t, rel);
		/* The guest names its files: one no S3 key can carry (control
		 * characters, too long) is reported, not retried forever. */
		if (k && s3_key_check(k, &err) == 0) {
			json_object_set_new(c, "s3_key", json_string(k));
		} else {
			json_object_set_new(c, "s3_key", json_null());
			json_object_set_new(c, "skipped", json_string(k ? err.message : "out of memory"));
		}
		free(k);
		json_array_append_new(a, c);
	}
	return a;
}

/* ---- running a task (worker thread) ---- */

struct worker_arg {
	struct hostd *d;
	struct hostd_task *t;
};

static void on_run_event(void *ctx, int ev, const void *data, size_t len)
{
	struct worker_arg *w = ctx;
	struct hostd *d = w->d;
	struct hostd_task *t = w->t;
	int fd;

	switch (ev) {
	case RUN_EV_RUNNING:
		pthread_mutex_lock(&d->lock);
		t->running_ms = wall_ms();
		{
			double s = (double)(t->running_ms - t->created_ms) / 1000.0;
			int b = 0;

			while (b < 11 && s > start_buckets[b])
				b++;
			d->start_hist[b]++;
			d->start_count++;
			d->start_sum += s;
		}
		set_state_locked(d, t, TS_RUNNING);
		pthread_mutex_unlock(&d->lock);
		break;
	case RUN_EV_STDOUT:
	case RUN_EV_STDERR: {
		char *s = textbuf_to_utf8(data, len);
		uint64_t *off = ev == RUN_EV_STDOUT ? &t->stdout_off : &t->stderr_off;

		fd = ev == RUN_EV_STDOUT ? t->stdout_fd : t->stderr_fd;
		if (fd >= 0 && proto_write_all(fd, data, len, 0) < 0)
			fprintf(stderr, "kiln-host: task %s: writing its log: %s\n", t->id, strerror(errno));
		pthread_mutex_lock(&d->lock);
		/* offset/bytes: where the chunk's raw bytes are in the log (a reader
		 * that lost events resumes from the log with a Range request). */
		event_add_locked(d, t, ev == RUN_EV_STDOUT ? "stdout" : "stderr",
				 json_pack("{s:s, s:I, s:I}", "data", s ? s : "", "offset", (json_int_t)*off, "bytes",
					   (json_int_t)len));
		*off += len;
		pthread_mutex_unlock(&d->lock);
		free(s);
		break;
	}
	case RUN_EV_BLOCKED: {
		const struct run_blocked *b = data;

		pthread_mutex_lock(&d->lock);
		event_add_locked(d, t, "egress_blocked",
				 json_pack("{s:s, s:i, s:s}", "destination", b->destination, "port", (int)b->port,
					   "protocol", b->protocol));
		pthread_mutex_unlock(&d->lock);
		break;
	}
	case RUN_EV_EXITED:
		break;
	}
}

static enum task_state result_state(json_t *result)
{
	enum task_state s = state_parse(json_string_value(json_object_get(result, "state")));

	return state_final(s) ? s : TS_ERROR;
}

/* The code has ended (or never started): record the result, hand the task to
 * the uploaders. */
static void finish_run_locked(struct hostd *d, struct hostd_task *t, json_t *result, enum task_state final)
{
	struct kiln_err err = { .code = "" };

	json_decref(t->result);
	t->result = result;
	json_decref(t->outputs);
	t->outputs = outputs_with_keys(t, json_object_get(result, "outputs"));
	t->final_state = final;
	t->ended_ms = wall_ms();
	if (t->reserved) {
		d->vcpus_used -= t->vcpus;
		capacity_release(d->cap, t->memory_mib);
		t->reserved = 0;
	}
	set_state_locked(d, t, TS_UPLOADING);
	if (record_write_locked(t, &err) < 0)
		fprintf(stderr, "kiln-host: task %s: %s\n", t->id, err.message);
	t->in_upload = 1;
	t->next_upload_ms = proto_now_ms();
	t->upload_started_ms = proto_now_ms();
	pthread_cond_broadcast(&d->upload_wake);
}

static json_t *error_result(const char *reason, const char *code, const char *msg)
{
	return json_pack("{s:s, s:n, s:n, s:s, s:s, s:s, s:b, s:b, s:i, s:i, s:[], s:{s:s, s:s}}", "state",
			 !strcmp(reason, "cancelled") ? "cancelled" : "error", "exit_code", "signal", "end_reason",
			 reason, "stdout", "", "stderr", "", "stdout_truncated", 0, "stderr_truncated", 0, "stdout_bytes",
			 0, "stderr_bytes", 0, "outputs", "error", "code", code, "message", msg);
}

static int open_log(const struct hostd_task *t, const char *name)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s/%s", t->dir, name);
	return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
}

static void *worker_main(void *arg)
{
	struct worker_arg *w = arg;
	struct hostd *d = w->d;
	struct hostd_task *t = w->t;
	struct task_spec spec;
	struct kiln_err err = { .code = "" };
	struct run_opts ro;
	char outdir[4200];
	json_t *result;
	enum task_state final;
	char *sj;

	pthread_mutex_lock(&d->lock);
	if (t->cancel_requested || d->stopping) {
		finish_run_locked(d, t,
				  t->cancel_requested ? error_result("cancelled", "cancelled", "cancelled before it started")
						      : error_result("host_shutdown", "host_shutdown",
								     "kiln-host stopped before the task started"),
				  t->cancel_requested ? TS_CANCELLED : TS_ERROR);
		goto out_locked;
	}
	set_state_locked(d, t, TS_STARTING);
	sj = t->spec_json;
	t->spec_json = NULL;
	pthread_mutex_unlock(&d->lock);

	t->stdout_fd = open_log(t, "stdout.log");
	t->stderr_fd = open_log(t, "stderr.log");
	snprintf(outdir, sizeof(outdir), "%s/outputs", t->dir);
	if (t->stdout_fd < 0 || t->stderr_fd < 0) {
		result = error_result("host_error", "host_error", "cannot create the task's logs in the spool");
	} else if (spec_parse(sj, strlen(sj), &spec, &err) < 0) {
		result = error_result("invalid_spec", err.code, err.message);
	} else {
		ro = d->ro;
		ro.output_dir = outdir;
		ro.stream = NULL;
		ro.log_excerpt = EXCERPT_BYTES; /* the whole logs are spooled (on_run_event) and go to S3 */
		ro.vm.cancel_fd = t->cancel_pipe[0];
		ro.prereserved = 1;
		ro.on_event = on_run_event;
		ro.event_ctx = w;
		result = run_task(&spec, &ro);
		spec_free(&spec);
	}
	free(sj);
	if (t->stdout_fd >= 0)
		fsync(t->stdout_fd);
	if (t->stderr_fd >= 0)
		fsync(t->stderr_fd);

	pthread_mutex_lock(&d->lock);
	final = result_state(result);
	if (t->cancel_requested) {
		/* Whatever the VM said last, the task was cancelled. */
		final = TS_CANCELLED;
		json_object_set_new(result, "state", json_string("cancelled"));
		json_object_set_new(result, "end_reason", json_string("cancelled"));
		json_object_set_new(result, "error",
				    json_pack("{s:s, s:s}", "code", "cancelled", "message", "cancelled by request"));
	} else if (d->stopping && final == TS_ERROR) {
		json_object_set_new(result, "end_reason", json_string("host_shutdown"));
		json_object_set_new(result, "error", json_pack("{s:s, s:s}", "code", "host_shutdown", "message",
							       "kiln-host stopped while the task ran"));
	}
	finish_run_locked(d, t, result, final);
out_locked:
	if (t->stdout_fd >= 0)
		close(t->stdout_fd);
	if (t->stderr_fd >= 0)
		close(t->stderr_fd);
	t->stdout_fd = t->stderr_fd = -1;
	d->workers--;
	pthread_cond_broadcast(&d->changed);
	pthread_mutex_unlock(&d->lock);
	free(w);
	return NULL;
}

/* ---- uploading (upload threads) ---- */

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
	return json_pack("{s:i, s:s, s:s, s:s, s:s, s:o, s:O, s:O, s:{s:I, s:I, s:I}}", "version", 1, "task", t->id,
			 "customer", t->customer, "host_id", d->host_id, "state", state_names[t->final_state], "result",
			 res, "outputs", t->outputs, "artifacts", t->artifacts, "timestamps_ms", "created",
			 (json_int_t)t->created_ms, "running", (json_int_t)t->running_ms,
			 "ended", (json_int_t)t->ended_ms);
}

/* Upload one file of the task; on success record what landed. */
static int upload_one(struct hostd *d, struct hostd_task *t, const struct s3_config *s3, const char *rel_key,
		      const char *path, const char *content_type, const char *want_sha, const char *artifact,
		      struct kiln_err *err)
{
	char *key = s3_key_for(t, rel_key);
	char sha[65] = "";
	uint64_t sent = 0;
	struct stat st;
	int r;

	if (!key)
		return kiln_err_set(err, "host_error", "out of memory");
	if (stat(path, &st) < 0) {
		free(key);
		return kiln_err_set(err, "io_error", "spooled file %s is missing: %s", path, strerror(errno));
	}
	r = s3_put_file(s3, key, path, content_type, sha, &sent, err);
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
		r = kiln_err_set(err, "io_error", "spooled %s does not match the sha256 the guest's data had (%s, now %s)",
				 rel_key, want_sha, sha);
	free(key);
	return r;
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

		snprintf(path, sizeof(path), "%s/%s", t->dir, name);
		/* A task that never started has no logs: an empty one says so. */
		if (access(path, F_OK) < 0) {
			int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);

			if (fd >= 0)
				close(fd);
		}
		return upload_one(d, t, s3, name, path, "text/plain; charset=utf-8", NULL, name, err);
	}
	{
		json_t *m;
		int r;

		pthread_mutex_lock(&d->lock);
		m = manifest_json_locked(d, t);
		pthread_mutex_unlock(&d->lock);
		r = spool_write_json(t->dir, "manifest.json", m, err);
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
			return kiln_err_set(err, "host_error", "out of memory");
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

/* Everything is in S3: the final state goes to disk, then the spooled files go. */
static void upload_finished_locked(struct hostd *d, struct hostd_task *t)
{
	struct kiln_err err = { .code = "" };
	char path[8400];
	static const char *const spooled[] = { "outputs", "stdout.log", "stderr.log", "manifest.json" };

	t->finished_ms = wall_ms();
	t->last_error[0] = '\0';
	t->in_upload = 0;
	d->finished_total[t->final_state]++;
	events_drop_output_locked(t);
	set_state_locked(d, t, t->final_state);
	if (record_write_locked(t, &err) < 0) {
		fprintf(stderr, "kiln-host: task %s: %s (its spooled files are kept)\n", t->id, err.message);
		return;
	}
	for (size_t i = 0; i < sizeof(spooled) / sizeof(*spooled); i++) {
		snprintf(path, sizeof(path), "%s/%s", t->dir, spooled[i]);
		spool_rm_tree(path);
	}
}

static unsigned backoff_ms(const struct hostd *d, unsigned attempts)
{
	uint64_t ms = 1000ull << (attempts < 16 ? attempts - 1 : 15);
	uint64_t cap = (uint64_t)(d->cfg.max_backoff_s ? d->cfg.max_backoff_s : 30) * 1000;

	return (unsigned)(ms < cap ? ms : cap);
}

static void janitor_locked(struct hostd *d);

static void *uploader_main(void *arg)
{
	struct hostd *d = arg;

	pthread_mutex_lock(&d->lock);
	while (!d->stopping) {
		struct hostd_task *pick = NULL;
		int64_t now = proto_now_ms(), next = now + JANITOR_PERIOD_MS;
		struct s3_copy s3;
		struct kiln_err err = { .code = "" };
		int r, need_bucket;

		if (now >= d->next_janitor_ms) {
			d->next_janitor_ms = now + JANITOR_PERIOD_MS;
			janitor_locked(d);
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
			struct timespec ts;

			clock_gettime(CLOCK_MONOTONIC, &ts);
			if (next > now + 1000)
				next = now + 1000;
			ts.tv_sec += (next - now) / 1000;
			ts.tv_nsec += ((next - now) % 1000) * 1000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&d->upload_wake, &d->lock, &ts);
			continue;
		}
		pick->upload_busy = 1;
		pick->refs++;
		s3_copy_take(d, &s3);
		need_bucket = !d->bucket_ok;
		pthread_mutex_unlock(&d->lock);

		r = need_bucket ? s3_ensure_bucket(&s3.c, &err) : 0;
		if (r == 0)
			r = upload_task(d, pick, &s3.c, &err);
		s3_copy_free(&s3);

		pthread_mutex_lock(&d->lock);
		if (need_bucket && r == 0)
			d->bucket_ok = 1;
		pick->upload_busy = 0;
		if (r == 0) {
			upload_finished_locked(d, pick);
		} else {
			pick->upload_attempts++;
			d->upload_failures++;
			snprintf(pick->last_error, sizeof(pick->last_error), "%s: %s", err.code, err.message);
			pick->next_upload_ms = proto_now_ms() + backoff_ms(d, pick->upload_attempts);
			event_add_locked(d, pick, "upload_error",
					 json_pack("{s:s, s:s, s:i}", "code", err.code, "message", err.message, "attempt",
						   (int)pick->upload_attempts));
			fprintf(stderr, "kiln-host: task %s: upload attempt %u failed: %s (retrying)\n", pick->id,
				pick->upload_attempts, pick->last_error);
		}
		task_put_locked(pick);
	}
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

/* Forget finished tasks older than the retention (record and directory). */
static void janitor_locked(struct hostd *d)
{
	int64_t cutoff = wall_ms() - (int64_t)d->cfg.retention_s * 1000;
	struct hostd_task **pp = &d->tasks;

	while (*pp) {
		struct hostd_task *t = *pp;

		if (state_final(t->state) && t->finished_ms && t->finished_ms < cutoff) {
			*pp = t->next;
			d->ntasks--;
			spool_rm_tree(t->dir);
			task_put_locked(t);
			continue;
		}
		pp = &t->next;
	}
}

/* ---- recovery ---- */

static void recover_one(struct hostd *d, const char *id)
{
	char path[4200];
	json_error_t je;
	json_t *r;
	struct hostd_task *t;
	enum task_state s, fs;
	struct kiln_err err = { .code = "" };
	const char *customer, *le;

	snprintf(path, sizeof(path), "%s/tasks/%s/record.json", d->spool, id);
	r = json_load_file(path, 0, &je);
	customer = json_string_value(json_object_get(r, "customer"));
	s = state_parse(json_string_value(json_object_get(r, "state")));
	fs = state_parse(json_string_value(json_object_get(r, "final_state")));
	if (!r || !spool_id_ok(id) || !spool_id_ok(customer) || s == TS_COUNT) {
		/* Without a readable record there is nothing to report or upload to:
		 * keep the directory aside for the operator rather than delete data. */
		char aside[4200];

		snprintf(path, sizeof(path), "%s/tasks/%s", d->spool, id);
		snprintf(aside, sizeof(aside), "%s/corrupt-%s-%lld", d->spool, id, (long long)wall_ms());
		fprintf(stderr, "kiln-host: spool: task %s has no valid record (%s); moved to %s\n", id,
			r ? "bad fields" : je.text, aside);
		rename(path, aside);
		json_decref(r);
		return;
	}
	t = task_new(d, id, customer);
	if (!t) {
		json_decref(r);
		return;
	}
	t->state = s;
	if (state_final(s))
		evlog_close_locked(&t->ev);
	t->final_state = fs == TS_COUNT ? TS_ERROR : fs;
	t->created_ms = json_integer_value(json_object_get(r, "created_ms"));
	t->running_ms = json_integer_value(json_object_get(r, "running_ms"));
	t->ended_ms = json_integer_value(json_object_get(r, "ended_ms"));
	t->finished_ms = json_integer_value(json_object_get(r, "finished_ms"));
	le = json_string_value(json_object_get(r, "last_error"));
	if (le)
		snprintf(t->last_error, sizeof(t->last_error), "%s", le);
	if (json_object_get(r, "result") && !json_is_null(json_object_get(r, "result"))) {
		t->result = json_incref(json_object_get(r, "result"));
		/* A record an older kiln-host wrote holds the whole output. */
		excerpt_result(t->result, EXCERPT_BYTES);
	}
	if (json_is_object(json_object_get(r, "artifacts")) && s > TS_UPLOADING) {
		json_decref(t->artifacts);
		t->artifacts = json_incref(json_object_get(r, "artifacts"));
	}
	if (json_is_array(json_object_get(r, "outputs"))) {
		json_decref(t->outputs);
		t->outputs = json_incref(json_object_get(r, "outputs"));
	}
	json_decref(r);
	if (s < TS_UPLOADING) {
		/* Its VM died with the previous process; the code may have had side
		 * effects, so it is not run again: it ends as an error, and what it
		 * printed so far is still uploaded. */
		snprintf(path, sizeof(path), "%s/outputs", t->dir);
		spool_rm_tree(path);
		json_decref(t->outputs);
		t->outputs = json_array();
		json_decref(t->result);
		t->result = error_result("host_restart", "host_restart",
					 "kiln-host restarted while the task was running; it was not run again");
		t->final_state = TS_ERROR;
		t->ended_ms = wall_ms();
		t->state = TS_UPLOADING;
		if (record_write_locked(t, &err) < 0)
			fprintf(stderr, "kiln-host: task %s: %s\n", t->id, err.message);
		fprintf(stderr, "kiln-host: task %s was %s when kiln-host stopped: it ends as error (host_restart)\n",
			id, state_names[s]);
	} else if (s == TS_UPLOADING) {
		fprintf(stderr, "kiln-host: task %s: resuming its upload\n", id);
	}
	if (!t->result)
		t->result = error_result("host_error", "host_error", "the task's result was lost");
	event_add_locked(d, t, "state", json_pack("{s:s}", "state", state_names[t->state]));
	if (t->state == TS_UPLOADING) {
		t->in_upload = 1;
		t->next_upload_ms = proto_now_ms();
		t->upload_started_ms = proto_now_ms();
	}
	t->next = d->tasks;
	d->tasks = t;
	d->ntasks++;
}

static int recover(struct hostd *d, struct kiln_err *err)
{
	char path[4200];
	DIR *dir;
	struct dirent *e;

	snprintf(path, sizeof(path), "%s/tasks", d->spool);
	dir = opendir(path);
	if (!dir)
		return kiln_err_set(err, "host_error", "cannot open %s: %s", path, strerror(errno));
	pthread_mutex_lock(&d->lock);
	while ((e = readdir(dir))) {
		if (e->d_name[0] == '.')
			continue;
		recover_one(d, e->d_name);
	}
	janitor_locked(d);
	pthread_mutex_unlock(&d->lock);
	closedir(dir);
	return 0;
}

/* ---- public API ---- */

static void s3_set_locked(struct hostd *d, const struct s3_config *s3)
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

void hostd_set_s3(struct hostd *d, const struct s3_config *s3)
{
	pthread_mutex_lock(&d->lock);
	s3_set_locked(d, s3);
	/* Retry now: the fix may be exactly what the failing uploads waited for. */
	for (struct hostd_task *t = d->tasks; t; t = t->next)
		if (t->in_upload)
			t->next_upload_ms = proto_now_ms();
	pthread_cond_broadcast(&d->upload_wake);
	pthread_mutex_unlock(&d->lock);
}

struct hostd *hostd_open(const struct hostd_config *cfg, const struct run_opts *ro, struct capacity *cap,
			 struct pool *pool, struct kiln_err *err)
{
	struct hostd *d = calloc(1, sizeof(*d));
	pthread_condattr_t ca;

	if (!d) {
		kiln_err_set(err, "host_error", "out of memory");
		return NULL;
	}
	d->cfg = *cfg;
	d->ro = *ro;
	d->cap = cap;
	d->pool = pool;
	snprintf(d->host_id, sizeof(d->host_id), "%s", cfg->host_id);
	snprintf(d->spool, sizeof(d->spool), "%s", cfg->spool_dir);
	d->cfg.host_id = d->host_id;
	d->cfg.spool_dir = d->spool;
	pthread_mutex_init(&d->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d->changed, &ca);
	pthread_cond_init(&d->upload_wake, &ca);
	pthread_condattr_destroy(&ca);
	s3_set_locked(d, cfg->s3);
	if (spool_init(d->spool, err) < 0 || recover(d, err) < 0)
		goto fail;
	d->nuploaders = cfg->upload_workers ? cfg->upload_workers : 2;
	d->uploaders = calloc(d->nuploaders, sizeof(*d->uploaders));
	if (!d->uploaders) {
		kiln_err_set(err, "host_error", "out of memory");
		goto fail;
	}
	for (unsigned i = 0; i < d->nuploaders; i++) {
		if (pthread_create(&d->uploaders[i], NULL, uploader_main, d) != 0) {
			kiln_err_set(err, "host_error", "cannot start upload threads");
			d->nuploaders = i;
			goto fail;
		}
	}
	return d;
fail:
	hostd_close(d);
	return NULL;
}

void hostd_stop(struct hostd *d)
{
	pthread_mutex_lock(&d->lock);
	d->stopping = 1;
	for (struct hostd_task *t = d->tasks; t; t = t->next)
		if (t->cancel_pipe[1] >= 0 && (t->state == TS_STARTING || t->state == TS_RUNNING))
			(void)!write(t->cancel_pipe[1], "x", 1);
	pthread_cond_broadcast(&d->changed);
	pthread_cond_broadcast(&d->upload_wake);
	pthread_mutex_unlock(&d->lock);
}

void hostd_close(struct hostd *d)
{
	if (!d)
		return;
	hostd_stop(d);
	/* Workers end quickly once their VMs are gone. */
	pthread_mutex_lock(&d->lock);
	while (d->workers)
		pthread_cond_wait(&d->changed, &d->lock);
	pthread_mutex_unlock(&d->lock);
	/* An upload in flight may take up to its S3 timeouts: give it a few
	 * seconds, then leave it to the process exit (its task stays "uploading"
	 * in the spool and resumes at the next start). */
	for (unsigned i = 0; i < d->nuploaders; i++) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 5;
		if (pthread_timedjoin_np(d->uploaders[i], NULL, &ts) != 0) {
			fprintf(stderr, "kiln-host: an upload is still in flight; it resumes at the next start\n");
			return; /* d stays allocated: that thread still uses it */
		}
	}
	free(d->uploaders);
	while (d->tasks) {
		struct hostd_task *t = d->tasks;

		d->tasks = t->next;
		if (t->reserved) {
			capacity_release(d->cap, t->memory_mib);
			t->reserved = 0;
		}
		task_put_locked(t);
	}
	s3_set_locked(d, NULL);
	free(d);
}

json_t *hostd_request_parse(const char *body, size_t len, const char **id, const char **customer, json_t **spec,
			    struct kiln_err *err)
{
	json_error_t je;
	json_t *j, *v;
	const char *k;

	*id = *customer = NULL;
	*spec = NULL;
	j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!j) {
		kiln_err_set(err, "invalid_json", "line %d, column %d: %s", je.line, je.column, je.text);
		return NULL;
	}
	if (!json_is_object(j)) {
		kiln_err_set(err, "invalid_request", "expected a JSON object");
		goto fail;
	}
	json_object_foreach(j, k, v) {
		if (!strcmp(k, "id") || !strcmp(k, "customer")) {
			if (!json_is_string(v)) {
				kiln_err_set(err, "invalid_request", "%s: expected a string", k);
				goto fail;
			}
			*(!strcmp(k, "id") ? id : customer) = json_string_value(v);
		} else if (!strcmp(k, "spec")) {
			*spec = v;
		} else {
			kiln_err_set(err, "invalid_request", "%.64s: unknown field", k);
			goto fail;
		}
	}
	if (!*id || !*customer || !*spec) {
		kiln_err_set(err, "invalid_request", "%s: required", !*id ? "id" : !*customer ? "customer" : "spec");
		goto fail;
	}
	return j;
fail:
	json_decref(j);
	*id = *customer = NULL;
	*spec = NULL;
	return NULL;
}

int hostd_submit(struct hostd *d, const char *id, const char *customer, json_t *spec_obj, struct kiln_err *err)
{
	struct task_spec spec;
	struct hostd_task *t;
	struct worker_arg *w;
	char *sj;
	uint64_t free_mib;

	if (!spool_id_ok(id))
		return kiln_err_set(err, "invalid_request", "id: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
	if (!spool_id_ok(customer))
		return kiln_err_set(err, "invalid_request", "customer: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
	if (!json_is_object(spec_obj))
		return kiln_err_set(err, "invalid_request", "spec: expected an object");
	sj = json_dumps(spec_obj, JSON_COMPACT);
	if (!sj)
		return kiln_err_set(err, "host_error", "out of memory");
	if (spec_parse(sj, strlen(sj), &spec, err) < 0) {
		free(sj);
		return -1;
	}
	if (spec.egress && !(d->ro.net && d->ro.net->enabled)) {
		spec_free(&spec);
		free(sj);
		return kiln_err_set(err, "egress_unavailable",
				    "network.egress: this host does not offer network egress (network.egress in its configuration)");
	}
	t = task_new(d, id, customer);
	w = malloc(sizeof(*w));
	if (!t || !w || pipe2(t->cancel_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		spec_free(&spec);
		free(sj);
		free(w);
		if (t)
			task_free(t);
		return kiln_err_set(err, "host_error", "cannot allocate the task");
	}
	t->spec_json = sj;
	t->vcpus = spec.vcpus;
	t->memory_mib = spec.memory_mib;
	spec_free(&spec);
	t->created_ms = wall_ms();
	t->final_state = TS_ERROR;

	pthread_mutex_lock(&d->lock);
	if (d->stopping) {
		kiln_err_set(err, "no_capacity", "kiln-host is shutting down");
		goto refuse;
	}
	if (!d->have_s3) {
		kiln_err_set(err, "no_s3", "this host has no S3 configured for outputs");
		goto refuse;
	}
	if (find_locked(d, id)) {
		kiln_err_set(err, "duplicate", "task %s already exists on this host", id);
		goto refuse;
	}
	if (d->vcpus_used + t->vcpus > d->cfg.vcpus_total) {
		kiln_err_set(err, "no_capacity", "not enough vCPUs: %u requested, %u of %u in use", t->vcpus, d->vcpus_used,
			     d->cfg.vcpus_total);
		goto refuse;
	}
	if (!capacity_reserve(d->cap, t->memory_mib)) {
		pthread_mutex_lock(&d->cap->lock);
		free_mib = d->cap->total_mib - d->cap->used_mib;
		pthread_mutex_unlock(&d->cap->lock);
		kiln_err_set(err, "no_capacity", "not enough memory: %u MiB requested, %llu MiB free", t->memory_mib,
			     (unsigned long long)free_mib);
		goto refuse;
	}
	d->vcpus_used += t->vcpus;
	t->reserved = 1;
	/* Durable before the caller hears "accepted". A directory left by an
	 * older task of the same id (its record expired) is replaced. */
	spool_rm_tree(t->dir);
	if (mkdir(t->dir, 0700) < 0) {
		kiln_err_set(err, "host_error", "cannot create %s: %s", t->dir, strerror(errno));
		goto unreserve;
	}
	if (record_write_locked(t, err) < 0) {
		spool_rm_tree(t->dir);
		goto unreserve;
	}
	set_state_locked(d, t, TS_ACCEPTED);
	t->next = d->tasks;
	d->tasks = t;
	d->ntasks++;
	d->accepted_total++;
	w->d = d;
	w->t = t;
	{
		pthread_attr_t attr;
		pthread_t th;
		int rc;

		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		rc = pthread_create(&th, &attr, worker_main, w);
		pthread_attr_destroy(&attr);
		if (rc != 0) {
			/* Accepted and durable: it ends as an error rather than vanishing. */
			free(w);
			finish_run_locked(d, t, error_result("host_error", "host_error", "cannot start a worker thread"),
					  TS_ERROR);
		} else {
			d->workers++;
		}
	}
	pthread_mutex_unlock(&d->lock);
	return 0;
unreserve:
	d->vcpus_used -= t->vcpus;
	capacity_release(d->cap, t->memory_mib);
	t->reserved = 0;
refuse:
	pthread_mutex_unlock(&d->lock);
	free(w);
	task_free(t);
	return -1;
}

static json_t *ms_between(int64_t a, int64_t b)
{
	return a && b && b >= a ? json_integer(b - a) : json_null();
}

json_t *hostd_task_json(struct hostd *d, const char *id)
{
	struct hostd_task *t;
	json_t *j = NULL, *res = NULL;

	pthread_mutex_lock(&d->lock);
	t = find_locked(d, id);
	if (t) {
		if (t->result) {
			res = json_deep_copy(t->result);
			json_object_del(res, "outputs");
		}
		j = json_pack("{s:s, s:s, s:s, s:s, s:I, s:o, s:O, s:O, s:s*, s:i, s:{s:s, s:s}, s:{s:o, s:o, s:o, s:o}}",
			      "id", t->id, "customer", t->customer, "host_id", d->host_id, "state",
			      state_names[t->state], "created_ms", (json_int_t)t->created_ms, "result",
			      res ? res : json_null(), "outputs", t->outputs, "artifacts", t->artifacts, "last_error",
			      t->last_error[0] ? t->last_error : NULL, "upload_attempts", (int)t->upload_attempts, "s3",
			      "bucket", d->have_s3 ? d->s3.bucket : "", "prefix", "", "timings", "start_ms",
			      ms_between(t->created_ms, t->running_ms), "run_ms", ms_between(t->running_ms, t->ended_ms),
			      "upload_ms", ms_between(t->ended_ms, t->finished_ms), "total_ms",
			      ms_between(t->created_ms, t->finished_ms));
		if (j) {
			char prefix[140];

			snprintf(prefix, sizeof(prefix), "%s/%s/", t->customer, t->id);
			json_object_set_new(json_object_get(j, "s3"), "prefix", json_string(prefix));
		}
	}
	pthread_mutex_unlock(&d->lock);
	return j;
}

json_t *hostd_task_list(struct hostd *d, int unfinished_only)
{
	json_t *a = json_array();

	pthread_mutex_lock(&d->lock);
	for (struct hostd_task *t = d->tasks; t; t = t->next)
		if (!unfinished_only || !state_final(t->state))
			json_array_append_new(a, json_pack("{s:s, s:s, s:s}", "id", t->id, "customer", t->customer, "state",
							   state_names[t->state]));
	pthread_mutex_unlock(&d->lock);
	return a;
}

int hostd_cancel(struct hostd *d, const char *id)
{
	struct hostd_task *t;
	int r = 0;

	pthread_mutex_lock(&d->lock);
	t = find_locked(d, id);
	if (!t)
		r = -ENOENT;
	else if (t->state >= TS_UPLOADING)
		r = -EALREADY;
	else if (!t->cancel_requested) {
		t->cancel_requested = 1;
		event_add_locked(d, t, "cancel", json_pack("{s:I}", "at", (json_int_t)wall_ms()));
		if (t->cancel_pipe[1] >= 0)
			(void)!write(t->cancel_pipe[1], "x", 1);
	}
	pthread_mutex_unlock(&d->lock);
	return r;
}

struct hostd_task *hostd_task_get(struct hostd *d, const char *id)
{
	struct hostd_task *t;

	pthread_mutex_lock(&d->lock);
	t = find_locked(d, id);
	if (t)
		t->refs++;
	pthread_mutex_unlock(&d->lock);
	return t;
}

void hostd_task_put(struct hostd *d, struct hostd_task *t)
{
	pthread_mutex_lock(&d->lock);
	task_put_locked(t);
	pthread_mutex_unlock(&d->lock);
}

long hostd_events_read(struct hostd *d, struct hostd_task *t, size_t *cursor, char *buf, size_t cap,
		       int64_t deadline_ms)
{
	struct evlog_cursor c = { .next = *cursor };
	long n;

	(void)d; /* t->ev waits under d->lock, on d->changed */
	n = evlog_read(&t->ev, &c, buf, cap, deadline_ms, 1);
	*cursor = c.next;
	return n == EVLOG_END ? -1 : n;
}

json_t *hostd_capacity_json(struct hostd *d)
{
	unsigned running = 0, uploading = 0, vcpus_used;
	uint64_t total_mib, used_mib;

	pthread_mutex_lock(&d->lock);
	for (struct hostd_task *t = d->tasks; t; t = t->next) {
		running += t->state == TS_STARTING || t->state == TS_RUNNING;
		uploading += t->state == TS_UPLOADING;
	}
	vcpus_used = d->vcpus_used;
	pthread_mutex_unlock(&d->lock);
	pthread_mutex_lock(&d->cap->lock);
	total_mib = d->cap->total_mib;
	used_mib = d->cap->used_mib;
	pthread_mutex_unlock(&d->cap->lock);
	return json_pack("{s:s, s:s, s:{s:i, s:i}, s:{s:I, s:I}, s:i, s:i, s:{s:i, s:i, s:i, s:i}, s:b}", "host_id",
			 d->host_id, "accel", d->cfg.accel ? d->cfg.accel : "tcg", "vcpus", "total",
			 (int)d->cfg.vcpus_total, "used", (int)vcpus_used, "memory_mib", "total", (json_int_t)total_mib,
			 "used", (json_int_t)used_mib, "running_tasks", (int)running, "uploading_tasks", (int)uploading,
			 "pool", "ready", d->pool ? (int)pool_ready(d->pool) : 0, "prestarted",
			 d->pool ? (int)pool_prestarted(d->pool) : 0, "memory_mib",
			 d->pool ? (int)pool_memory_mib(d->pool) : 0, "vcpus", d->pool ? (int)pool_vcpus(d->pool) : 0,
			 "egress", d->ro.net && d->ro.net->enabled);
}

char *hostd_metrics(struct hostd *d)
{
	unsigned by_state[TS_COUNT] = { 0 };
	char *out = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&out, &len);
	uint64_t cum = 0;

	if (!f)
		return NULL;
	pthread_mutex_lock(&d->lock);
	for (struct hostd_task *t = d->tasks; t; t = t->next)
		by_state[t->state]++;
	fputs("# HELP kiln_host_tasks Tasks known to this host, by state.\n# TYPE kiln_host_tasks gauge\n", f);
	for (int i = 0; i < TS_COUNT; i++)
		fprintf(f, "kiln_host_tasks{state=\"%s\"} %u\n", state_names[i], by_state[i]);
	fputs("# HELP kiln_host_tasks_accepted_total Tasks accepted.\n# TYPE kiln_host_tasks_accepted_total counter\n", f);
	fprintf(f, "kiln_host_tasks_accepted_total %llu\n", (unsigned long long)d->accepted_total);
	fputs("# HELP kiln_host_tasks_finished_total Tasks that reached a final state.\n"
	      "# TYPE kiln_host_tasks_finished_total counter\n", f);
	for (int i = TS_SUCCEEDED; i < TS_COUNT; i++)
		fprintf(f, "kiln_host_tasks_finished_total{state=\"%s\"} %llu\n", state_names[i],
			(unsigned long long)d->finished_total[i]);
	fputs("# HELP kiln_host_task_start_seconds From acceptance to the task's code running.\n"
	      "# TYPE kiln_host_task_start_seconds histogram\n", f);
	for (int b = 0; b < 11; b++) {
		cum += d->start_hist[b];
		fprintf(f, "kiln_host_task_start_seconds_bucket{le=\"%g\"} %llu\n", start_buckets[b], (unsigned long long)cum);
	}
	fprintf(f, "kiln_host_task_start_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)d->start_count);
	fprintf(f, "kiln_host_task_start_seconds_sum %.6f\nkiln_host_task_start_seconds_count %llu\n", d->start_sum,
		(unsigned long long)d->start_count);
	fputs("# HELP kiln_host_vms_running VMs running tasks.\n# TYPE kiln_host_vms_running gauge\n", f);
	fprintf(f, "kiln_host_vms_running %u\n", by_state[TS_STARTING] + by_state[TS_RUNNING]);
	fputs("# HELP kiln_host_upload_bytes_total Bytes sent to S3, retries included.\n"
	      "# TYPE kiln_host_upload_bytes_total counter\n", f);
	fprintf(f, "kiln_host_upload_bytes_total %llu\n", (unsigned long long)d->upload_bytes);
	fputs("# HELP kiln_host_upload_files_total Files S3 confirmed.\n# TYPE kiln_host_upload_files_total counter\n", f);
	fprintf(f, "kiln_host_upload_files_total %llu\n", (unsigned long long)d->upload_files);
	fputs("# HELP kiln_host_upload_failures_total Failed upload attempts (each is retried).\n"
	      "# TYPE kiln_host_upload_failures_total counter\n", f);
	fprintf(f, "kiln_host_upload_failures_total %llu\n", (unsigned long long)d->upload_failures);
	fputs("# HELP kiln_host_vcpus_used vCPUs reserved by tasks.\n# TYPE kiln_host_vcpus_used gauge\n", f);
	fprintf(f, "kiln_host_vcpus_used %u\n", d->vcpus_used);
	pthread_mutex_unlock(&d->lock);
	fputs("# HELP kiln_host_pool_ready Warm pool VMs ready.\n# TYPE kiln_host_pool_ready gauge\n", f);
	fprintf(f, "kiln_host_pool_ready %u\n", d->pool ? pool_ready(d->pool) : 0);
	pthread_mutex_lock(&d->cap->lock);
	fputs("# HELP kiln_host_memory_used_mib Guest memory reserved (tasks and pool).\n"
	      "# TYPE kiln_host_memory_used_mib gauge\n", f);
	fprintf(f, "kiln_host_memory_used_mib %llu\n", (unsigned long long)d->cap->used_mib);
	pthread_mutex_unlock(&d->cap->lock);
	if (d->ro.net && d->ro.net->enabled) {
		struct net_host *n = d->ro.net;

		/* Finished sandboxes' totals (a running task's counters join at its end). */
		pthread_mutex_lock(&n->lock);
		fputs("# HELP kiln_host_egress_sandboxes Sandboxes with a network now.\n"
		      "# TYPE kiln_host_egress_sandboxes gauge\n", f);
		fprintf(f, "kiln_host_egress_sandboxes %llu\n", (unsigned long long)n->active);
		fputs("# HELP kiln_host_egress_connections_total Connections from sandboxes, by verdict.\n"
		      "# TYPE kiln_host_egress_connections_total counter\n", f);
		fprintf(f, "kiln_host_egress_connections_total{verdict=\"allowed\"} %llu\n", (unsigned long long)n->allowed);
		fprintf(f, "kiln_host_egress_connections_total{verdict=\"blocked\"} %llu\n", (unsigned long long)n->blocked);
		fputs("# HELP kiln_host_egress_bytes_total IP bytes through sandboxes' NICs that were let through.\n"
		      "# TYPE kiln_host_egress_bytes_total counter\n", f);
		fprintf(f, "kiln_host_egress_bytes_total{direction=\"out\"} %llu\n", (unsigned long long)n->bytes_out);
		fprintf(f, "kiln_host_egress_bytes_total{direction=\"in\"} %llu\n", (unsigned long long)n->bytes_in);
		fputs("# HELP kiln_host_egress_dns_queries_total Queries to sandboxes' resolvers, by answer.\n"
		      "# TYPE kiln_host_egress_dns_queries_total counter\n", f);
		fprintf(f, "kiln_host_egress_dns_queries_total{answer=\"refused\"} %llu\n", (unsigned long long)n->dns_refused);
		fprintf(f, "kiln_host_egress_dns_queries_total{answer=\"served\"} %llu\n",
			(unsigned long long)(n->dns_queries - n->dns_refused));
		pthread_mutex_unlock(&n->lock);
	}
	fclose(f);
	return out;
}

int hostd_reserve(struct hostd *d, unsigned vcpus, unsigned memory_mib, struct kiln_err *err)
{
	uint64_t free_mib;

	pthread_mutex_lock(&d->lock);
	if (d->stopping) {
		pthread_mutex_unlock(&d->lock);
		return kiln_err_set(err, "no_capacity", "kiln-host is shutting down");
	}
	if (d->vcpus_used + vcpus > d->cfg.vcpus_total) {
		kiln_err_set(err, "no_capacity", "not enough vCPUs: %u requested, %u of %u in use", vcpus, d->vcpus_used,
			     d->cfg.vcpus_total);
		pthread_mutex_unlock(&d->lock);
		return -1;
	}
	if (!capacity_reserve(d->cap, memory_mib)) {
		pthread_mutex_lock(&d->cap->lock);
		free_mib = d->cap->total_mib - d->cap->used_mib;
		pthread_mutex_unlock(&d->cap->lock);
		kiln_err_set(err, "no_capacity", "not enough memory: %u MiB requested, %llu MiB free", memory_mib,
			     (unsigned long long)free_mib);
		pthread_mutex_unlock(&d->lock);
		return -1;
	}
	d->vcpus_used += vcpus;
	pthread_mutex_unlock(&d->lock);
	return 0;
}

void hostd_release(struct hostd *d, unsigned vcpus, unsigned memory_mib)
{
	pthread_mutex_lock(&d->lock);
	d->vcpus_used -= vcpus;
	pthread_mutex_unlock(&d->lock);
	capacity_release(d->cap, memory_mib);
}

const struct run_opts *hostd_run_opts(const struct hostd *d)
{
	return &d->ro;
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
