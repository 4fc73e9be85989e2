/* hostd: tasks on one host, from acceptance to outputs confirmed by S3.
 * This file holds the task table and the task's lifecycle (submit,
 * worker, cancel); hostd_task.c a task's record, events and final
 * transition; upload.c the upload threads, recover.c the recovery from the
 * spool, hostd_metrics.c capacity and metrics (hostd_int.h is what they
 * share).
 *
 * Threads: one worker per running task (it owns the VM through the vm_ops'
 * run_task), a few upload threads, and the HTTP threads that call in. One
 * mutex guards the task table and every task's mutable fields; `changed` is
 * broadcast on every state change or new event (event streams wait on it),
 * `upload_wake` wakes the upload threads.
 *
 * Durability: a task's record.json is written (fsync'd) before hostd_submit
 * returns, again when its code has ended (state "uploading", with the result)
 * and when S3 has confirmed everything (the final state). Spooled files are
 * deleted only after that last write. A restart therefore finds each task
 * either unfinished (it ends as error/host_restart, and its logs are still
 * uploaded), uploading (the upload resumes) or final. */
#include "hostd.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "condwait.h"
#include "excerpt.h"
#include "hostd_int.h"
#include "proto.h"
#include "run/run.h"
#include "spec.h"
#include "spool.h"
#include "template/template.h"

const double hostd_start_buckets[HOSTD_START_BUCKETS] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 };

/* ---- task table (d->lock held) ---- */

static struct hostd_task *find_locked(struct hostd *d, const char *id)
{
	for (struct hostd_task *t = d->tasks; t; t = t->next)
		if (!strcmp(t->id, id))
			return t;
	return NULL;
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
		k = hostd_s3_key(t, rel);
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
		t->running_ms = kclock_wall_ms(d->clk);
		{
			double s = (double)(t->running_ms - t->created_ms) / 1000.0;
			int b = 0;

			while (b < HOSTD_START_BUCKETS && s > hostd_start_buckets[b])
				b++;
			d->start_hist[b]++;
			d->start_count++;
			d->start_sum += s;
		}
		hostd_set_state_locked(d, t, TS_RUNNING);
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
		hostd_event_add_locked(d, t, ev == RUN_EV_STDOUT ? "stdout" : "stderr",
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
		hostd_event_add_locked(d, t, "egress_blocked",
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
	enum task_state s = hostd_state_parse(json_string_value(json_object_get(result, "state")));

	return state_final(s) ? s : TS_ERROR;
}

/* The task's vCPUs and memory go back to the host (once). */
static void release_reservation_locked(struct hostd *d, struct hostd_task *t)
{
	if (t->reserved) {
		d->vcpus_used -= t->vcpus;
		pthread_cond_broadcast(&d->vcpus_freed);
		capacity_release(d->cap, t->memory_mib);
		t->reserved = 0;
	}
}

/* The code has ended (or never started): record the result, hand the task to
 * the uploaders. Returns the record in its uploading state (a copy), which
 * the caller writes with record_persist: the uploaders start meanwhile, but
 * the task becomes final only once that record is on disk (a crash after
 * that finds it uploading with its result, never final in S3 and lost
 * here). keep_reservation: the task's VM is still being reaped; its worker
 * releases the vCPUs and memory after that. */
static json_t *finish_run_locked(struct hostd *d, struct hostd_task *t, json_t *result, enum task_state final,
				 int keep_reservation)
{
	json_t *rec;

	json_decref(t->result);
	t->result = result;
	json_decref(t->outputs);
	t->outputs = outputs_with_keys(t, json_object_get(result, "outputs"));
	t->final_state = final;
	t->ended_ms = kclock_wall_ms(d->clk);
	if (!keep_reservation)
		release_reservation_locked(d, t);
	hostd_set_state_locked(d, t, TS_UPLOADING);
	rec = hostd_record_json_locked(t);
	if (rec) {
		json_t *copy = json_deep_copy(rec); /* the uploaders change t's artifacts meanwhile */

		json_decref(rec);
		rec = copy;
	}
	t->record_pending = 1;
	t->in_upload = 1;
	t->next_upload_ms = kclock_mono_ms(d->clk);
	t->upload_started_ms = t->next_upload_ms;
	pthread_cond_broadcast(&d->upload_wake);
	return rec;
}

/* Write finish_run_locked's record (rec: taken) durably, then let the upload
 * end. Without d->lock. */
static void record_persist(struct hostd *d, struct hostd_task *t, json_t *rec)
{
	struct kiln_err err = { .code = "" };

	if (!rec)
		fprintf(stderr, "kiln-host: task %s: out of memory for its record\n", t->id);
	else if (spool_write_json(t->dir, "record.json", rec, SPOOL_DURABLE, &err) < 0)
		fprintf(stderr, "kiln-host: task %s: %s\n", t->id, err.message);
	json_decref(rec);
	pthread_mutex_lock(&d->lock);
	t->record_pending = 0;
	pthread_cond_broadcast(&d->changed);
	pthread_mutex_unlock(&d->lock);
}

/* finish_run_locked and its record at once (the rare paths where the code
 * never ran): the record is written under d->lock. */
static void finish_run_now_locked(struct hostd *d, struct hostd_task *t, json_t *result, enum task_state final)
{
	struct kiln_err err = { .code = "" };
	json_t *rec = finish_run_locked(d, t, result, final, 0);

	if (!rec || spool_write_json(t->dir, "record.json", rec, SPOOL_DURABLE, &err) < 0)
		fprintf(stderr, "kiln-host: task %s: %s\n", t->id, rec ? err.message : "out of memory for its record");
	json_decref(rec);
	t->record_pending = 0;
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
	struct task_spec *spec;
	struct kiln_err err = { .code = "" };
	struct run_opts ro;
	char outdir[4200];
	json_t *result;
	enum task_state final;
	struct vm vm = { .pid = -1 }; /* the task's VM, when run_task leaves it to be reaped here */

	pthread_mutex_lock(&d->lock);
	if (t->cancel_requested || d->stopping) {
		finish_run_now_locked(d, t,
				      t->cancel_requested
					      ? hostd_error_result("cancelled", "cancelled", "cancelled before it started")
					      : hostd_error_result("host_shutdown", "host_shutdown",
								   "kiln-host stopped before the task started"),
				      t->cancel_requested ? TS_CANCELLED : TS_ERROR);
		goto out_locked;
	}
	hostd_set_state_locked(d, t, TS_STARTING);
	spec = t->spec; /* parsed by hostd_submit: this thread owns it now */
	t->spec = NULL;
	pthread_mutex_unlock(&d->lock);

	t->stdout_fd = open_log(t, "stdout.log");
	t->stderr_fd = open_log(t, "stderr.log");
	snprintf(outdir, sizeof(outdir), "%s/outputs", t->dir);
	if (t->stdout_fd < 0 || t->stderr_fd < 0) {
		result = hostd_error_result("host_error", "host_error", "cannot create the task's logs in the spool");
	} else {
		struct template_use use = { 0 };
		int have_use = 0;

		ro = d->ro;
		if (d->cfg.templates) {
			/* The task's template: fetched, verified and snapshotted here
			 * (first use), on this thread, not the HTTP one. */
			struct hostd_s3 s3;
			int have_s3 = hostd_s3_take(d, &s3) == 0;

			if (template_acquire(d->cfg.templates, t->ref, spec->egress, have_s3 ? &s3.c : NULL, &use, &err) < 0) {
				fprintf(stderr, "kiln-host: task %s: template %s: %s\n", t->id, t->ref ? t->ref->name : "default",
					err.message);
				result = hostd_error_result("host_error", err.code, err.message);
				if (have_s3)
					hostd_s3_free(&s3);
				goto ran;
			}
			if (have_s3)
				hostd_s3_free(&s3);
			have_use = 1;
			ro.vm.disk = use.rootfs;
			ro.vm.disk_format = "raw";
			ro.snap = use.snap;
			ro.net_snap = use.net_snap;
			ro.pool = use.pool;
			if (use.user_set) {
				ro.user_set = 1;
				ro.uid = use.uid;
				ro.gid = use.gid;
			}
		}
		ro.output_dir = outdir;
		ro.stream = NULL;
		ro.log_excerpt = EXCERPT_BYTES; /* the whole logs are spooled (on_run_event) and go to S3 */
		ro.vm.cancel_fd = t->cancel_pipe[0];
		ro.prereserved = 1;
		ro.on_event = on_run_event;
		ro.event_ctx = w;
		ro.keep_vm = &vm;
		result = d->ops->run_task(d->ops->ctx, spec, &ro);
		if (have_use) {
			template_release(d->cfg.templates, &use);
			template_store_gc(d->cfg.templates, 0);
		}
	}
ran:
	spec_free(spec);
	free(spec);
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
	{
		int held = vm.pid > 0;
		json_t *rec = finish_run_locked(d, t, result, final, held);

		/* The uploaders start now; meanwhile the VM (killed, not yet
		 * reaped) is destroyed and the logs and the record go to disk (the
		 * fds stay this worker's until out_locked). The record comes last:
		 * the task is not final before it, so a final task's VM is gone. */
		pthread_mutex_unlock(&d->lock);
		if (held)
			d->ops->destroy(d->ops->ctx, &vm);
		if (t->stdout_fd >= 0)
			fsync(t->stdout_fd);
		if (t->stderr_fd >= 0)
			fsync(t->stderr_fd);
		record_persist(d, t, rec);
		pthread_mutex_lock(&d->lock);
		release_reservation_locked(d, t);
	}
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

/* ---- public API ---- */

struct hostd *hostd_open(const struct hostd_config *cfg, const struct run_opts *ro, struct capacity *cap,
			 struct pool *pool, const struct vm_ops *ops, const struct kiln_clock *clk, struct kiln_err *err)
{
	struct hostd *d = calloc(1, sizeof(*d));

	if (!d) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		return NULL;
	}
	d->cfg = *cfg;
	d->ro = *ro;
	d->cap = cap;
	d->pool = pool;
	d->ops = ops;
	d->clk = clk;
	snprintf(d->host_id, sizeof(d->host_id), "%s", cfg->host_id);
	snprintf(d->spool, sizeof(d->spool), "%s", cfg->spool_dir);
	d->cfg.host_id = d->host_id;
	d->cfg.spool_dir = d->spool;
	/* Idle sandboxes cost memory, not CPU: by default memory is the limit. */
	if (!d->cfg.vcpus_idle_max)
		d->cfg.vcpus_idle_max = 64 * d->cfg.vcpus_total;
	if (d->cfg.vcpus_idle_max < d->cfg.vcpus_total)
		d->cfg.vcpus_idle_max = d->cfg.vcpus_total;
	pthread_mutex_init(&d->lock, NULL);
	condwait_init(&d->changed);
	condwait_init(&d->upload_wake);
	condwait_init(&d->vcpus_freed);
	hostd_s3_set_locked(d, cfg->s3);
	if (spool_init(d->spool, err) < 0 || hostd_recover(d, err) < 0)
		goto fail;
	d->nuploaders = cfg->upload_workers ? cfg->upload_workers : 2;
	d->uploaders = calloc(d->nuploaders, sizeof(*d->uploaders));
	if (!d->uploaders) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto fail;
	}
	for (unsigned i = 0; i < d->nuploaders; i++) {
		if (pthread_create(&d->uploaders[i], NULL, hostd_uploader_main, d) != 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "cannot start upload threads");
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
	pthread_cond_broadcast(&d->vcpus_freed);
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
		hostd_task_put_locked(t);
	}
	hostd_s3_set_locked(d, NULL);
	free(d);
}

json_t *hostd_request_parse(const char *body, size_t len, const char **id, const char **customer, json_t **spec,
			    json_t **template, struct kiln_err *err)
{
	json_error_t je;
	json_t *j, *v;
	const char *k;

	*id = *customer = NULL;
	*spec = NULL;
	if (template)
		*template = NULL;
	j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!j) {
		kiln_err_set(err, KERR_INVALID_JSON, "line %d, column %d: %s", je.line, je.column, je.text);
		return NULL;
	}
	if (!json_is_object(j)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "expected a JSON object");
		goto fail;
	}
	json_object_foreach(j, k, v) {
		if (!strcmp(k, "id") || !strcmp(k, "customer")) {
			if (!json_is_string(v)) {
				kiln_err_set(err, KERR_INVALID_REQUEST, "%s: expected a string", k);
				goto fail;
			}
			*(!strcmp(k, "id") ? id : customer) = json_string_value(v);
		} else if (!strcmp(k, "spec")) {
			*spec = v;
		} else if (!strcmp(k, "template") && template) {
			*template = v;
		} else if (!strcmp(k, "destination")) {
			/* the caller's (dest_from_json) */
		} else {
			kiln_err_set(err, KERR_INVALID_REQUEST, "%.64s: unknown field", k);
			goto fail;
		}
	}
	if (!*id || !*customer || !*spec) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "%s: required", !*id ? "id" : !*customer ? "customer" : "spec");
		goto fail;
	}
	return j;
fail:
	json_decref(j);
	*id = *customer = NULL;
	*spec = NULL;
	if (template)
		*template = NULL;
	return NULL;
}

int hostd_submit(struct hostd *d, const struct hostd_submission *sub, struct kiln_err *err)
{
	const char *id = sub->id, *customer = sub->customer;
	const struct template_ref *ref = sub->ref;
	const struct dest *dest = sub->dest;
	struct task_spec *spec;
	struct hostd_task *t;
	struct worker_arg *w;
	char *sj;
	int r;
	uint64_t free_mib;

	if (!id || !spool_id_ok(id))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "id: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
	if (!customer || !spool_id_ok(customer))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "customer: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
	if (!json_is_object(sub->spec))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "spec: expected an object");
	/* The one parse of the spec on this host: the worker gets the struct. */
	sj = json_dumps(sub->spec, JSON_COMPACT);
	spec = sj ? calloc(1, sizeof(*spec)) : NULL;
	if (!spec) {
		free(sj);
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	}
	r = spec_parse(sj, strlen(sj), spec, err);
	free(sj);
	if (r < 0) {
		free(spec);
		return -1;
	}
	if (spec->egress && !(d->ro.net && d->ro.net->enabled)) {
		spec_free(spec);
		free(spec);
		return kiln_err_set(err, KERR_EGRESS_UNAVAILABLE,
				    "network.egress: this host does not offer network egress (network.egress in its configuration)");
	}
	t = hostd_task_new(d, id, customer);
	w = malloc(sizeof(*w));
	if (t && ref && (t->ref = malloc(sizeof(*t->ref)))) {
		*t->ref = *ref;
		if (ref->env)
			json_incref(ref->env);
	}
	if (t && dest && (t->dest = malloc(sizeof(*t->dest))))
		*t->dest = *dest;
	if (!t || !w || (ref && !t->ref) || (dest && !t->dest) || pipe2(t->cancel_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		spec_free(spec);
		free(spec);
		free(w);
		if (t)
			hostd_task_free(t);
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot allocate the task");
	}
	t->spec = spec;
	t->vcpus = spec->vcpus;
	t->memory_mib = spec->memory_mib;
	t->created_ms = kclock_wall_ms(d->clk);
	t->final_state = TS_ERROR;

	pthread_mutex_lock(&d->lock);
	if (d->stopping) {
		kiln_err_set(err, KERR_NO_CAPACITY, "kiln-host is shutting down");
		goto refuse;
	}
	if (!d->have_s3) {
		kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured for outputs");
		goto refuse;
	}
	if (find_locked(d, id)) {
		kiln_err_set(err, KERR_DUPLICATE, "task %s already exists on this host", id);
		goto refuse;
	}
	if (d->cfg.templates && template_check(d->cfg.templates, ref, d->have_s3, err) < 0)
		goto refuse;
	if (hostd_vcpus_admit_locked(d, t->vcpus, err) < 0)
		goto refuse;
	if (!capacity_reserve(d->cap, t->memory_mib)) {
		pthread_mutex_lock(&d->cap->lock);
		free_mib = d->cap->total_mib - d->cap->used_mib;
		pthread_mutex_unlock(&d->cap->lock);
		kiln_err_set(err, KERR_NO_CAPACITY, "not enough memory: %u MiB requested, %llu MiB free", t->memory_mib,
			     (unsigned long long)free_mib);
		goto refuse;
	}
	d->vcpus_used += t->vcpus;
	t->reserved = 1;
	/* Durable before the caller hears "accepted". A directory left by an
	 * older task of the same id (its record expired) is replaced. */
	spool_rm_tree(t->dir);
	if (mkdir(t->dir, 0700) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", t->dir, strerror(errno));
		goto unreserve;
	}
	if (hostd_record_write_locked(t, err) < 0) {
		spool_rm_tree(t->dir);
		goto unreserve;
	}
	hostd_set_state_locked(d, t, TS_ACCEPTED);
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
			finish_run_now_locked(d, t,
					      hostd_error_result("host_error", "host_error", "cannot start a worker thread"),
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
	hostd_task_free(t);
	return -1;
}

json_t *hostd_task_json(struct hostd *d, const char *id)
{
	struct hostd_task *t;
	json_t *j = NULL;

	pthread_mutex_lock(&d->lock);
	t = find_locked(d, id);
	if (t)
		j = hostd_task_json_locked(d, t);
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
							   hostd_state_names[t->state]));
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
		hostd_event_add_locked(d, t, "cancel", json_pack("{s:I}", "at", (json_int_t)kclock_wall_ms(d->clk)));
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
	hostd_task_put_locked(t);
	pthread_mutex_unlock(&d->lock);
}

long hostd_events_read(struct hostd *d, struct hostd_task *t, struct evlog_cursor *cursor, char *buf, size_t cap,
		       int64_t deadline_ms)
{
	long n;

	(void)d; /* t->ev waits under d->lock, on d->changed */
	n = evlog_read(&t->ev, cursor, buf, cap, deadline_ms, 0);
	return n == EVLOG_END ? -1 : n;
}

void hostd_set_drain(struct hostd *d, int draining, int64_t deadline_ms)
{
	pthread_mutex_lock(&d->lock);
	d->draining = draining != 0;
	d->drain_deadline_ms = draining && deadline_ms > 0 ? deadline_ms : 0;
	pthread_mutex_unlock(&d->lock);
}

int hostd_vcpus_admit_locked(struct hostd *d, unsigned n, struct kiln_err *err)
{
	unsigned idle_max = d->cfg.vcpus_idle_max;

	/* 64-bit sums: the counters are unsigned and woken sessions may have
	 * taken the active ones past the total. */
	if ((uint64_t)d->vcpus_used + n > d->cfg.vcpus_total) {
		kiln_err_set(err, KERR_NO_CAPACITY,
			     "not enough vCPUs: %u requested, %u of %u busy running work (the %u of idle "
			     "sessions do not count)",
			     n, d->vcpus_used, d->cfg.vcpus_total, d->vcpus_idle);
		return -1;
	}
	if ((uint64_t)d->vcpus_used + d->vcpus_idle + n > idle_max) {
		kiln_err_set(err, KERR_NO_CAPACITY,
			     "not enough vCPUs: %u requested, %u running work and %u held by idle sessions, of %u "
			     "this host admits in all (capacity.idle_vcpus)",
			     n, d->vcpus_used, d->vcpus_idle, idle_max);
		return -2;
	}
	return 0;
}

int hostd_reserve_wait(struct hostd *d, unsigned vcpus, unsigned memory_mib, unsigned wait_ms, struct kiln_err *err)
{
	int64_t until = kclock_mono_ms(d->clk) + wait_ms;
	uint64_t free_mib;
	int r;

	pthread_mutex_lock(&d->lock);
	for (;;) {
		if (d->stopping) {
			pthread_mutex_unlock(&d->lock);
			return kiln_err_set(err, KERR_NO_CAPACITY, "kiln-host is shutting down");
		}
		r = hostd_vcpus_admit_locked(d, vcpus, err);
		/* Only the active vCPUs are worth a wait: sessions that had
		 * their last request idle_stop_ms ago are about to be stopped. */
		if (r != -1 || !wait_ms || condwait_until(&d->vcpus_freed, &d->lock, d->clk, until) == ETIMEDOUT)
			break;
	}
	if (r < 0) {
		pthread_mutex_unlock(&d->lock);
		return -1;
	}
	if (!capacity_reserve(d->cap, memory_mib)) {
		pthread_mutex_lock(&d->cap->lock);
		free_mib = d->cap->total_mib - d->cap->used_mib;
		pthread_mutex_unlock(&d->cap->lock);
		kiln_err_set(err, KERR_NO_CAPACITY, "not enough memory: %u MiB requested, %llu MiB free", memory_mib,
			     (unsigned long long)free_mib);
		pthread_mutex_unlock(&d->lock);
		return -1;
	}
	d->vcpus_used += vcpus;
	pthread_mutex_unlock(&d->lock);
	return 0;
}

int hostd_reserve(struct hostd *d, unsigned vcpus, unsigned memory_mib, struct kiln_err *err)
{
	return hostd_reserve_wait(d, vcpus, memory_mib, 0, err);
}

void hostd_release(struct hostd *d, unsigned vcpus, unsigned memory_mib)
{
	pthread_mutex_lock(&d->lock);
	d->vcpus_used -= vcpus;
	pthread_cond_broadcast(&d->vcpus_freed);
	pthread_mutex_unlock(&d->lock);
	capacity_release(d->cap, memory_mib);
}

void hostd_vcpus_idle(struct hostd *d, unsigned n)
{
	pthread_mutex_lock(&d->lock);
	assert(n <= d->vcpus_used);
	d->vcpus_used -= n;
	d->vcpus_idle += n;
	pthread_cond_broadcast(&d->vcpus_freed);
	pthread_mutex_unlock(&d->lock);
}

void hostd_vcpus_wake(struct hostd *d, unsigned n)
{
	pthread_mutex_lock(&d->lock);
	assert(n <= d->vcpus_idle);
	d->vcpus_idle -= n;
	d->vcpus_used += n;
	pthread_mutex_unlock(&d->lock);
}

struct template_store *hostd_templates(const struct hostd *d)
{
	return d->cfg.templates;
}

const struct run_opts *hostd_run_opts(const struct hostd *d)
{
	return &d->ro;
}

