/* recover: hostd's start-up pass over the spool. Every SPOOL/tasks/ID
 * directory becomes a task again, by the state its record.json holds:
 *   accepted, starting, running: its VM died with the previous process; the
 *     code may have had side effects, so it is not run again: it ends as
 *     error/host_restart (record rewritten as uploading), its outputs are
 *     dropped and the logs it wrote so far are uploaded;
 *   uploading: the upload resumes from the start (PUTs are idempotent);
 *   succeeded, failed, timed_out, cancelled, error: final, kept until the
 *     janitor's retention is up.
 * A directory without a readable record (half-created, unparsable, unknown
 * state, bad id or customer) is moved aside as SPOOL/corrupt-ID-MS for the
 * operator; names starting with '.' are skipped. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "excerpt.h"
#include "hostd_int.h"
#include "spool.h"
#include "version.h"

static void recover_one(struct hostd *d, const char *id)
{
	char path[4200];
	json_error_t je;
	json_t *r;
	struct hostd_task *t;
	enum task_state s, fs;
	struct kiln_err err = { .code = "" };
	const char *customer, *le;
	struct dest dest;
	int have_dest = 0;

	snprintf(path, sizeof(path), "%s/tasks/%s/record.json", d->spool, id);
	r = json_load_file(path, 0, &je);
	if (json_integer_value(json_object_get(r, "version")) > SPOOL_RECORD_V) {
		/* Another kiln-host's format: kept as it is for the one that reads it. */
		fprintf(stderr, "kiln-host: spool: task %s: %s has version %lld, newer than this kiln-host (%s) reads "
			"(%d): left as it is, not taken as a task\n", id, path,
			(long long)json_integer_value(json_object_get(r, "version")), kiln_version(), SPOOL_RECORD_V);
		json_decref(r);
		return;
	}
	customer = json_string_value(json_object_get(r, "customer"));
	s = hostd_state_parse(json_string_value(json_object_get(r, "state")));
	fs = hostd_state_parse(json_string_value(json_object_get(r, "final_state")));
	/* A destination that does not parse cannot be uploaded to, and the
	 * host's own bucket is no substitute: aside with the rest. */
	if (r && json_object_get(r, "destination") &&
	    dest_from_json(json_object_get(r, "destination"), state_final(s) ? DEST_SECRET_NONE : DEST_SECRET_REQUIRED,
			   NULL, &dest, &err) == 0)
		have_dest = 1;
	else if (r && json_object_get(r, "destination"))
		customer = NULL;
	if (!r || !spool_id_ok(id) || !spool_id_ok(customer) || s == TS_COUNT) {
		/* Without a readable record there is nothing to report or upload to:
		 * keep the directory aside for the operator rather than delete data. */
		char aside[4200];

		snprintf(path, sizeof(path), "%s/tasks/%s", d->spool, id);
		snprintf(aside, sizeof(aside), "%s/corrupt-%s-%lld", d->spool, id, (long long)kclock_wall_ms(d->clk));
		fprintf(stderr, "kiln-host: spool: task %s has no valid record (%s); moved to %s\n", id,
			r ? "bad fields" : je.text, aside);
		rename(path, aside);
		json_decref(r);
		return;
	}
	t = hostd_task_new(d, id, customer);
	if (t && have_dest && (t->dest = malloc(sizeof(*t->dest))))
		*t->dest = dest;
	if (have_dest)
		dest_wipe(&dest);
	if (!t || (have_dest && !t->dest)) {
		if (t)
			hostd_task_put_locked(t);
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
		t->result = hostd_error_result("host_restart", "host_restart",
					 "kiln-host restarted while the task was running; it was not run again");
		t->final_state = TS_ERROR;
		t->ended_ms = kclock_wall_ms(d->clk);
		t->state = TS_UPLOADING;
		if (hostd_record_write_locked(t, &err) < 0)
			fprintf(stderr, "kiln-host: task %s: %s\n", t->id, err.message);
		fprintf(stderr, "kiln-host: task %s was %s when kiln-host stopped: it ends as error (host_restart)\n",
			id, hostd_state_names[s]);
	} else if (s == TS_UPLOADING) {
		fprintf(stderr, "kiln-host: task %s: resuming its upload\n", id);
	}
	if (!t->result)
		t->result = hostd_error_result("host_error", "host_error", "the task's result was lost");
	hostd_event_add_locked(d, t, "state", json_pack("{s:s}", "state", hostd_state_names[t->state]));
	if (t->state == TS_UPLOADING) {
		t->in_upload = 1;
		t->next_upload_ms = kclock_mono_ms(d->clk);
		t->upload_started_ms = t->next_upload_ms;
	}
	t->next = d->tasks;
	d->tasks = t;
	d->ntasks++;
}

int hostd_recover(struct hostd *d, struct kiln_err *err)
{
	char path[4200];
	DIR *dir;
	struct dirent *e;

	snprintf(path, sizeof(path), "%s/tasks", d->spool);
	dir = opendir(path);
	if (!dir)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot open %s: %s", path, strerror(errno));
	pthread_mutex_lock(&d->lock);
	while ((e = readdir(dir))) {
		if (e->d_name[0] == '.')
			continue;
		recover_one(d, e->d_name);
	}
	hostd_janitor_locked(d);
	pthread_mutex_unlock(&d->lock);
	closedir(dir);
	return 0;
}

