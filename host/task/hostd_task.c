/* hostd_task: one task's record in hostd's table: its life (new, the last
 * reference frees it), its events, its state changes, its durable
 * record.json, its S3 keys and JSON, and its final transition once S3 has
 * everything. hostd.c (the lifecycle), upload.c and recover.c all build on
 * these and this file calls none of them: the circle hostd <-> upload <->
 * recover ends here. Every _locked function runs with d->lock held. */
#include "hostd_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "clock.h"
#include "dest.h"
#include "evlog.h"
#include "spool.h"
#include "template/template.h"

#define EVENTS_MAX_BYTES (4u << 20) /* per task, kept for late subscribers */

const char *const hostd_state_names[TS_COUNT] = {
	"accepted", "starting", "running", "uploading", "succeeded", "failed", "timed_out", "cancelled", "error",
};

enum task_state hostd_state_parse(const char *s)
{
	for (int i = 0; s && i < TS_COUNT; i++)
		if (!strcmp(s, hostd_state_names[i]))
			return (enum task_state)i;
	return TS_COUNT;
}

/* ---- the task record (d->lock held) ---- */

void hostd_task_free(struct hostd_task *t)
{
	if (t->spec) {
		spec_free(t->spec);
		free(t->spec);
	}
	if (t->dest) {
		dest_wipe(t->dest);
		free(t->dest);
	}
	if (t->ref) {
		template_ref_free(t->ref);
		free(t->ref);
	}
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

struct hostd_task *hostd_task_new(struct hostd *d, const char *id, const char *customer)
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
						 .max_bytes = EVENTS_MAX_BYTES,
						 .truncated_data = "{\"message\":\"event stream truncated: the full "
								   "output is in stdout.log/stderr.log\"}" });
	return t;
}

void hostd_task_put_locked(struct hostd_task *t)
{
	if (--t->refs == 0)
		hostd_task_free(t);
}

/* Append one server-sent event: "event: NAME\ndata: JSON\n\n". */
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

void hostd_event_add_locked(struct hostd *d, struct hostd_task *t, const char *name, json_t *data)
{
	event_add_locked(d, t, name, data);
}

/* A final state's event carries the task's JSON (what GET /v1/tasks/{id}
 * answers), up to FINAL_TASK_MAX bytes of it, so that kiln-api need not ask
 * for it after the event: one round trip less at the end of every task. */
#define FINAL_TASK_MAX (256u << 10)

void hostd_set_state_locked(struct hostd *d, struct hostd_task *t, enum task_state s)
{
	json_t *ev = json_pack("{s:s, s:I}", "state", hostd_state_names[s], "at", (json_int_t)kclock_wall_ms(d->clk));

	t->state = s;
	if (ev && state_final(s)) {
		json_t *j = hostd_task_json_locked(d, t);
		char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;

		if (text && strlen(text) <= FINAL_TASK_MAX)
			json_object_set(ev, "task", j);
		free(text);
		json_decref(j);
	}
	event_add_locked(d, t, "state", ev);
	if (state_final(s))
		evlog_close_locked(&t->ev);
}

/* The durable record: small, rewritten at each milestone. A task with its
 * customer's own destination keeps it there, secret included (the file is
 * 0600, in a 0700 directory: spool_write_json), so that its upload goes
 * there after a restart too. */
static json_t *record_core_locked(struct hostd_task *t);

json_t *hostd_record_json_locked(struct hostd_task *t)
{
	json_t *r = record_core_locked(t);

	/* Once final, the secret is not needed any more: the record keeps only
	 * where the objects went. */
	if (r && t->dest &&
	    json_object_set_new(r, "destination", dest_to_json(t->dest, !state_final(t->state))) < 0) {
		json_decref(r);
		return NULL;
	}
	return r;
}

static json_t *record_core_locked(struct hostd_task *t)
{
	return json_pack("{s:i, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:O*, s:O, s:O, s:s*}", "version",
			 SPOOL_RECORD_V, "id", t->id, "customer", t->customer, "state", hostd_state_names[t->state],
			 "final_state", hostd_state_names[t->final_state], "created_ms", (json_int_t)t->created_ms, "running_ms",
			 (json_int_t)t->running_ms, "ended_ms", (json_int_t)t->ended_ms, "finished_ms",
			 (json_int_t)t->finished_ms, "result", t->result, "outputs", t->outputs, "artifacts", t->artifacts,
			 "last_error",
			 t->last_error[0] ? t->last_error : NULL);
}

int hostd_record_write_locked(struct hostd_task *t, struct kiln_err *err)
{
	json_t *r = hostd_record_json_locked(t);
	int ret;

	if (!r)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	ret = spool_write_json(t->dir, "record.json", r, SPOOL_DURABLE, err);
	json_decref(r);
	return ret;
}

/* ---- S3 keys ---- */

char *hostd_s3_key(const struct hostd_task *t, const char *rel)
{
	char *k = NULL;

	if (asprintf(&k, "%s%s/%s/%s", t->dest ? t->dest->prefix : "", t->customer, t->id, rel) < 0)
		return NULL;
	return k;
}

json_t *hostd_error_result(const char *reason, const char *code, const char *msg)
{
	return json_pack("{s:s, s:n, s:n, s:s, s:s, s:s, s:b, s:b, s:i, s:i, s:[], s:{s:s, s:s}}", "state",
			 !strcmp(reason, "cancelled") ? "cancelled" : "error", "exit_code", "signal", "end_reason",
			 reason, "stdout", "", "stderr", "", "stdout_truncated", 0, "stderr_truncated", 0, "stdout_bytes",
			 0, "stderr_bytes", 0, "outputs", "error", "code", code, "message", msg);
}

static json_t *ms_between(int64_t a, int64_t b)
{
	return a && b && b >= a ? json_integer(b - a) : json_null();
}

json_t *hostd_task_json_locked(struct hostd *d, struct hostd_task *t)
{
	json_t *j, *res = NULL;

	if (t->result) {
		res = json_deep_copy(t->result);
		json_object_del(res, "outputs");
	}
	j = json_pack("{s:s, s:s, s:s, s:s, s:I, s:o, s:O, s:O, s:s*, s:i, s:{s:s, s:s}, s:{s:o, s:o, s:o, s:o}}",
		      "id", t->id, "customer", t->customer, "host_id", d->host_id, "state",
		      hostd_state_names[t->state], "created_ms", (json_int_t)t->created_ms, "result",
		      res ? res : json_null(), "outputs", t->outputs, "artifacts", t->artifacts, "last_error",
		      t->last_error[0] ? t->last_error : NULL, "upload_attempts", (int)t->upload_attempts, "s3",
		      "bucket", t->dest ? t->dest->bucket : d->have_s3 ? d->s3.bucket : "", "prefix", "", "timings",
		      "start_ms", ms_between(t->created_ms, t->running_ms), "run_ms",
		      ms_between(t->running_ms, t->ended_ms), "upload_ms", ms_between(t->ended_ms, t->finished_ms),
		      "total_ms", ms_between(t->created_ms, t->finished_ms));
	if (j) {
		char prefix[DEST_PREFIX_MAX + 140];

		snprintf(prefix, sizeof(prefix), "%s%s/%s/", t->dest ? t->dest->prefix : "", t->customer, t->id);
		json_object_set_new(json_object_get(j, "s3"), "prefix", json_string(prefix));
		/* The customer's own destination: where, never its credentials. */
		if (t->dest)
			json_object_set_new(json_object_get(j, "s3"), "endpoint", json_string(t->dest->endpoint));
	}
	return j;
}

/* ---- the end of a task ---- */

/* Everything is in S3: the final state goes to disk, then the spooled files go. */
json_t *hostd_task_finished_locked(struct hostd *d, struct hostd_task *t)
{
	t->finished_ms = kclock_wall_ms(d->clk);
	t->last_error[0] = '\0';
	t->in_upload = 0;
	d->finished_total[t->final_state]++;
	events_drop_output_locked(t);
	hostd_set_state_locked(d, t, t->final_state);
	return hostd_record_json_locked(t);
}

void hostd_task_persist_final(struct hostd *d, struct hostd_task *t, json_t *record)
{
	struct kiln_err err = { .code = "" };
	char path[8400];
	static const char *const spooled[] = { "outputs", "stdout.log", "stderr.log", "manifest.json" };

	if (!record || spool_write_json(t->dir, "record.json", record, SPOOL_DURABLE, &err) < 0) {
		fprintf(stderr, "kiln-host: task %s: %s (its spooled files are kept)\n", t->id,
			record ? err.message : "out of memory");
		json_decref(record);
		return;
	}
	json_decref(record);
	/* Uploaded: the customer's secret goes from memory too (the record
	 * just written holds it no more). */
	pthread_mutex_lock(&d->lock);
	if (t->dest)
		OPENSSL_cleanse(t->dest->secret_key, sizeof(t->dest->secret_key));
	pthread_mutex_unlock(&d->lock);
	for (size_t i = 0; i < sizeof(spooled) / sizeof(*spooled); i++) {
		snprintf(path, sizeof(path), "%s/%s", t->dir, spooled[i]);
		spool_rm_tree(path);
	}
}

