/* Unit tests for hostd (host/task/hostd.c, upload.c, recover.c) over fake VM
 * operations, a fake S3 and a hand-moved clock (fake_vm_ops.h), on a
 * temporary spool: crash recovery of every state a task record can be in
 * (accepted, starting, running, uploading, the five final states, past
 * retention) and of every kind of damaged entry (half-written, missing,
 * unparsable or nonsensical record, bad id, a stray file, a leftover
 * temporary file), a task's whole life (events, record milestones, uploads,
 * spool clean-up, timings), upload retries backing off on the clock, the
 * retention on the clock, cancel, shutdown mid-run then restart, and the
 * refusals of hostd_submit. No QEMU, no root, no S3. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "buf.h"
#include "fake_vm_ops.h"
#include "fsutil.h"
#include "hostd.h"
#include "spool.h"
#include "vm_ops.h"

#define WAIT_MS 5000   /* real-time bound for another thread to get somewhere */
#define RETENTION_S 3600
#define JANITOR_PERIOD_MS 60000 /* hostd_priv.h */

struct fixture {
	struct fake_ops f;
	struct fake_clock clk;
	struct capacity cap;
	struct run_opts ro;
	struct s3_config s3;
	char spool[64];
	struct hostd *d;
	unsigned inline_max; /* hostd_config.inline_log_max (0: every log an object) */
	unsigned idle_max;   /* hostd_config.vcpus_idle_max (0: the default) */
	/* For the scripted runs. */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int gate_closed;       /* block_run waits while set */
	int in_run;
};

static struct fixture *cur; /* the fixture the scripted runs see */

static int setup(void **state)
{
	struct fixture *x = calloc(1, sizeof(*x));

	if (!x)
		return -1;
	fake_ops_init(&x->f);
	fake_clock_init(&x->clk);
	pthread_mutex_init(&x->cap.lock, NULL);
	x->cap.total_mib = 4096;
	x->s3 = (struct s3_config){ .endpoint = "http://s3.invalid", .region = "us-east-1", .bucket = "kiln",
				    .access_key = "a", .secret_key = "s" };
	snprintf(x->spool, sizeof(x->spool), "/tmp/kiln-hostd.XXXXXX");
	if (!mkdtemp(x->spool))
		return -1;
	pthread_mutex_init(&x->mu, NULL);
	pthread_cond_init(&x->cv, NULL);
	cur = x;
	*state = x;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *x = *state;

	hostd_close(x->d);
	fs_rmtree(x->spool);
	fake_ops_free(&x->f);
	pthread_mutex_destroy(&x->cap.lock);
	pthread_mutex_destroy(&x->mu);
	pthread_cond_destroy(&x->cv);
	cur = NULL;
	free(x);
	return 0;
}

static void open_hostd(struct fixture *x, int with_s3)
{
	struct kiln_err err = { .code = "" };
	struct hostd_config cfg = {
		.host_id = "h1",
		.spool_dir = x->spool,
		.vcpus_total = 4,
		.vcpus_idle_max = x->idle_max,
		.s3 = with_s3 ? &x->s3 : NULL,
		.upload_workers = 1,
		.inline_log_max = x->inline_max,
		.retention_s = RETENTION_S,
		.accel = "tcg",
	};

	x->d = hostd_open(&cfg, &x->ro, &x->cap, NULL, &x->f.ops, &x->clk.c, &err);
	if (!x->d)
		fail_msg("hostd_open: %s: %s", err.code, err.message);
}

static void close_hostd(struct fixture *x)
{
	hostd_close(x->d);
	x->d = NULL;
}

/* ---- the spool, as a previous kiln-host left it ---- */

static void path_of(char *out, size_t cap, struct fixture *x, const char *id, const char *name)
{
	if (name)
		snprintf(out, cap, "%s/tasks/%s/%s", x->spool, id, name);
	else
		snprintf(out, cap, "%s/tasks/%s", x->spool, id);
}

static void put_file(struct fixture *x, const char *id, const char *name, const char *data)
{
	char path[512];
	FILE *fp;

	path_of(path, sizeof(path), x, id, name);
	fp = fopen(path, "wb");
	assert_non_null(fp);
	fputs(data, fp);
	fclose(fp);
}

static void make_task_dir(struct fixture *x, const char *id)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/tasks", x->spool);
	mkdir(path, 0700);
	path_of(path, sizeof(path), x, id, NULL);
	assert_int_equal(mkdir(path, 0700), 0);
}

static int exists(struct fixture *x, const char *id, const char *name)
{
	char path[512];

	path_of(path, sizeof(path), x, id, name);
	return access(path, F_OK) == 0;
}

/* A result like run_task's. */
static json_t *result_json(const char *state, json_t *outputs)
{
	return json_pack("{s:s, s:i, s:n, s:s, s:s, s:s, s:o}", "state", state, "exit_code",
			 !strcmp(state, "succeeded") ? 0 : 1, "signal", "end_reason", "exited", "stdout", "out", "stderr",
			 "", "outputs", outputs ? outputs : json_array());
}

/* A record as hostd writes it (record_json_locked), in state, ending as
 * final, finished at finished_ms (0: not yet); result may be NULL. */
static json_t *record(const char *id, const char *state, const char *final, int64_t finished_ms, json_t *result)
{
	return json_pack("{s:i, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:o, s:[], s:{}}", "version", 1, "id", id,
			 "customer", "cust", "state", state, "final_state", final, "created_ms",
			 (json_int_t)1600000000000, "running_ms", (json_int_t)1600000000100, "ended_ms",
			 (json_int_t)(finished_ms ? 1600000000900 : 0), "finished_ms", (json_int_t)finished_ms, "result",
			 result ? result : json_null(), "outputs", "artifacts");
}

static void write_record(struct fixture *x, const char *id, json_t *r)
{
	struct kiln_err err = { .code = "" };
	char dir[512];

	assert_non_null(r);
	path_of(dir, sizeof(dir), x, id, NULL);
	if (access(dir, F_OK) < 0)
		make_task_dir(x, id);
	assert_int_equal(spool_write_json(dir, "record.json", r, SPOOL_DURABLE, &err), 0);
	json_decref(r);
}

static json_t *read_record(struct fixture *x, const char *id)
{
	char path[512];
	json_error_t je;

	path_of(path, sizeof(path), x, id, "record.json");
	return json_load_file(path, 0, &je);
}

/* ---- the hostd's view ---- */

struct state_want {
	struct fixture *x;
	const char *id, *state;
};

static int has_state(void *arg)
{
	struct state_want *w = arg;
	json_t *j = hostd_task_json(w->x->d, w->id);
	int r = j && !strcmp(json_string_value(json_object_get(j, "state")), w->state);
	static const char *const finals[] = { "succeeded", "failed", "timed_out", "cancelled", "error" };

	/* A final state is announced first and written to disk just after
	 * (hostd_task_persist_final): the tests read the record and the spool,
	 * so a final state counts once its record says so and the spooled
	 * logs are gone. */
	for (size_t i = 0; r && i < sizeof(finals) / sizeof(*finals); i++)
		if (!strcmp(w->state, finals[i])) {
			json_t *rec = read_record(w->x, w->id);

			r = rec && !strcmp(json_string_value(json_object_get(rec, "state")) ?: "", w->state) &&
			    !exists(w->x, w->id, "outputs") && !exists(w->x, w->id, "stdout.log") &&
			    !exists(w->x, w->id, "stderr.log") && !exists(w->x, w->id, "manifest.json");
			json_decref(rec);
		}
	json_decref(j);
	return r;
}

static void wait_state(struct fixture *x, const char *id, const char *state)
{
	struct state_want w = { x, id, state };

	if (!wait_for(has_state, &w, WAIT_MS)) {
		json_t *j = hostd_task_json(x->d, id);
		char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;

		fail_msg("task %s is not %s: %s", id, state, s ? s : "(no such task)");
	}
}

static void assert_state(struct fixture *x, const char *id, const char *state)
{
	json_t *j = hostd_task_json(x->d, id);

	if (!j)
		fail_msg("no task %s", id);
	assert_string_equal(json_string_value(json_object_get(j, "state")), state);
	json_decref(j);
}

/* A string member of the task's JSON at a path of up to three keys. */
static char *task_str(struct fixture *x, const char *id, const char *k1, const char *k2, const char *k3)
{
	json_t *j = hostd_task_json(x->d, id), *v = json_object_get(j, k1);
	char *s;

	if (k2)
		v = json_object_get(v, k2);
	if (k3)
		v = json_object_get(v, k3);
	s = json_is_string(v) ? strdup(json_string_value(v)) : NULL;
	json_decref(j);
	return s;
}

static json_int_t task_int(struct fixture *x, const char *id, const char *k1, const char *k2)
{
	json_t *j = hostd_task_json(x->d, id), *v = json_object_get(j, k1);
	json_int_t n;

	if (k2)
		v = json_object_get(v, k2);
	n = json_is_integer(v) ? json_integer_value(v) : -1;
	json_decref(j);
	return n;
}

static void assert_task_str(struct fixture *x, const char *id, const char *k1, const char *k2, const char *k3,
			    const char *want)
{
	char *s = task_str(x, id, k1, k2, k3);

	if (!s)
		fail_msg("task %s: no %s.%s.%s", id, k1, k2 ? k2 : "", k3 ? k3 : "");
	assert_string_equal(s, want);
	free(s);
}

static int in_list(struct fixture *x, const char *id, int unfinished_only)
{
	json_t *a = hostd_task_list(x->d, unfinished_only), *e;
	size_t i;
	int found = 0;

	json_array_foreach(a, i, e)
		found |= !strcmp(json_string_value(json_object_get(e, "id")), id);
	json_decref(a);
	return found;
}

static const struct fake_object *object(struct fixture *x, const char *id, const char *rel)
{
	char key[256];

	snprintf(key, sizeof(key), "cust/%s/%s", id, rel);
	return fake_object(&x->f, key);
}

static unsigned objects_of(struct fixture *x, const char *id)
{
	char prefix[128];
	unsigned n = 0;

	snprintf(prefix, sizeof(prefix), "cust/%s/", id);
	pthread_mutex_lock(&x->f.mu);
	for (unsigned i = 0; i < x->f.nobj; i++)
		n += !strncmp(x->f.obj[i].key, prefix, strlen(prefix));
	pthread_mutex_unlock(&x->f.mu);
	return n;
}

/* Everything of a final task is in S3 and only its record is left. */
static void assert_uploaded_and_cleaned(struct fixture *x, const char *id, const char *stdout_log)
{
	const struct fake_object *o = object(x, id, "stdout.log");
	char prefix[128];

	assert_non_null(o);
	assert_string_equal(o->data, stdout_log);
	assert_non_null(object(x, id, "stderr.log"));
	o = object(x, id, "manifest.json");
	assert_non_null(o);
	/* The manifest goes last: its presence means everything else is there. */
	snprintf(prefix, sizeof(prefix), "cust/%s/", id);
	pthread_mutex_lock(&x->f.mu);
	for (unsigned i = 0; i < x->f.nobj; i++)
		if (!strncmp(x->f.obj[i].key, prefix, strlen(prefix)))
			assert_true(x->f.obj[i].seq <= o->seq);
	pthread_mutex_unlock(&x->f.mu);
	assert_true(exists(x, id, "record.json"));
	assert_false(exists(x, id, "stdout.log"));
	assert_false(exists(x, id, "stderr.log"));
	assert_false(exists(x, id, "outputs"));
	assert_false(exists(x, id, "manifest.json"));
}

/* ---- recovery ---- */

/* A task whose VM died with the previous process is not run again: it ends
 * as error/host_restart, its outputs go, its logs are still uploaded. */
static void recover_unfinished(void **state)
{
	struct fixture *x = *state;
	static const char *const states[] = { "accepted", "starting", "running" };

	for (int i = 0; i < 3; i++) {
		char id[32], path[512];

		snprintf(id, sizeof(id), "t-%s", states[i]);
		write_record(x, id, record(id, states[i], "succeeded", 0, NULL));
		put_file(x, id, "stdout.log", "partial output\n");
		path_of(path, sizeof(path), x, id, "outputs");
		assert_int_equal(mkdir(path, 0700), 0);
		put_file(x, id, "outputs/half.bin", "half a file");
	}
	fake_clock_advance(&x->clk, 123);
	open_hostd(x, 0); /* no S3 yet: the recovered state holds still */
	for (int i = 0; i < 3; i++) {
		char id[32];
		json_t *r;

		snprintf(id, sizeof(id), "t-%s", states[i]);
		assert_state(x, id, "uploading");
		assert_true(in_list(x, id, 1));
		assert_task_str(x, id, "result", "end_reason", NULL, "host_restart");
		assert_task_str(x, id, "result", "error", "code", "host_restart");
		assert_task_str(x, id, "result", "state", NULL, "error");
		/* Its outputs are dropped (a half-written file is no output), its
		 * log is kept for the upload. */
		assert_false(exists(x, id, "outputs"));
		assert_true(exists(x, id, "stdout.log"));
		/* Durable: a second crash now resumes the upload, no second restart. */
		r = read_record(x, id);
		assert_non_null(r);
		assert_string_equal(json_string_value(json_object_get(r, "state")), "uploading");
		assert_string_equal(json_string_value(json_object_get(r, "final_state")), "error");
		assert_int_equal(json_integer_value(json_object_get(r, "ended_ms")), atomic_load(&x->clk.wall));
		json_decref(r);
	}
	assert_int_equal(fake_count(&x->f, &x->f.runs), 0); /* never run again */
	assert_int_equal(fake_count(&x->f, &x->f.puts), 0);
	hostd_set_s3(x->d, &x->s3);
	for (int i = 0; i < 3; i++) {
		char id[32];
		json_t *r;

		snprintf(id, sizeof(id), "t-%s", states[i]);
		wait_state(x, id, "error");
		assert_false(in_list(x, id, 1));
		assert_uploaded_and_cleaned(x, id, "partial output\n");
		assert_null(object(x, id, "outputs/half.bin"));
		r = read_record(x, id);
		assert_string_equal(json_string_value(json_object_get(r, "state")), "error");
		json_decref(r);
	}
}

/* A task that was uploading uploads again from the start (PUTs are
 * idempotent) and ends as its record says. */
static void recover_uploading(void **state)
{
	struct fixture *x = *state;
	char sha[65], path[512];
	json_t *outs;

	fake_sha256_hex("hello", 5, sha);
	outs = json_pack("[{s:s, s:i, s:s, s:s}, {s:s, s:n, s:s}]", "path", "a.txt", "size", 5, "sha256", sha,
			 "s3_key", "cust/t-up/outputs/a.txt", "path", "bad\x01name", "s3_key", "skipped",
			 "control character");
	write_record(x, "t-up", json_pack("{s:i, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:o, s:o, s:{}}", "version", 1,
					  "id", "t-up", "customer", "cust", "state", "uploading", "final_state",
					  "succeeded", "created_ms", (json_int_t)1600000000000, "running_ms",
					  (json_int_t)1600000000100, "ended_ms", (json_int_t)1600000000900,
					  "finished_ms", (json_int_t)0, "result",
					  result_json("succeeded", json_deep_copy(outs)), "outputs", outs, "artifacts"));
	put_file(x, "t-up", "stdout.log", "all of it\n");
	put_file(x, "t-up", "stderr.log", "");
	path_of(path, sizeof(path), x, "t-up", "outputs");
	mkdir(path, 0700);
	put_file(x, "t-up", "outputs/a.txt", "hello");
	/* Uploading, with the final state lost: it ends as error. And with the
	 * result lost too. */
	write_record(x, "t-up2", record("t-up2", "uploading", "nonsense", 0, NULL));
	put_file(x, "t-up2", "stdout.log", "x");

	open_hostd(x, 0);
	assert_state(x, "t-up", "uploading");
	assert_state(x, "t-up2", "uploading");
	assert_task_str(x, "t-up2", "result", "error", "message", "the task's result was lost");
	hostd_set_s3(x->d, &x->s3);
	wait_state(x, "t-up", "succeeded");
	wait_state(x, "t-up2", "error");
	assert_uploaded_and_cleaned(x, "t-up", "all of it\n");
	assert_uploaded_and_cleaned(x, "t-up2", "x");
	assert_non_null(object(x, "t-up", "outputs/a.txt"));
	assert_string_equal(object(x, "t-up", "outputs/a.txt")->data, "hello");
	assert_int_equal(objects_of(x, "t-up"), 4); /* the skipped one is not uploaded */
	assert_task_str(x, "t-up", "artifacts", "manifest.json", "s3_key", "cust/t-up/manifest.json");
	assert_task_str(x, "t-up", "artifacts", "stdout.log", "s3_key", "cust/t-up/stdout.log");
}

/* Logs of at most inline_log_max bytes go inside manifest.json (version 2:
 * base64, size, sha256, no s3_key): a small task is one PUT; a bigger log
 * is an object as before. */
static void inline_small_logs(void **state)
{
	struct fixture *x = *state;
	char big[5001], sha[65];
	const struct fake_object *m;
	json_t *mj, *a;

	memset(big, 'e', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	x->inline_max = 4096;
	write_record(x, "t-small", record("t-small", "uploading", "succeeded", 0, result_json("succeeded", NULL)));
	put_file(x, "t-small", "stdout.log", "all of it\n");
	put_file(x, "t-small", "stderr.log", "");
	write_record(x, "t-mixed", record("t-mixed", "uploading", "succeeded", 0, result_json("succeeded", NULL)));
	put_file(x, "t-mixed", "stdout.log", "x");
	put_file(x, "t-mixed", "stderr.log", big);
	open_hostd(x, 1);
	wait_state(x, "t-small", "succeeded");
	wait_state(x, "t-mixed", "succeeded");
	assert_int_equal(objects_of(x, "t-small"), 1); /* the manifest alone */
	assert_null(object(x, "t-small", "stdout.log"));
	assert_int_equal(objects_of(x, "t-mixed"), 2); /* stderr.log, manifest */
	assert_string_equal(object(x, "t-mixed", "stderr.log")->data, big);
	m = object(x, "t-small", "manifest.json");
	assert_non_null(m);
	mj = json_loads(m->data, 0, NULL);
	assert_non_null(mj);
	assert_int_equal(json_integer_value(json_object_get(mj, "version")), 2);
	a = json_object_get(json_object_get(mj, "artifacts"), "stdout.log");
	assert_string_equal(json_string_value(json_object_get(a, "inline")), "YWxsIG9mIGl0Cg==");
	assert_int_equal(json_integer_value(json_object_get(a, "size")), 10);
	assert_true(json_is_null(json_object_get(a, "s3_key")));
	fake_sha256_hex("all of it\n", 10, sha);
	assert_string_equal(json_string_value(json_object_get(a, "sha256")), sha);
	a = json_object_get(json_object_get(mj, "artifacts"), "stderr.log");
	assert_string_equal(json_string_value(json_object_get(a, "inline")), "");
	json_decref(mj);
	/* The task's answer carries the same for kiln-api. */
	assert_task_str(x, "t-small", "artifacts", "stdout.log", "inline", "YWxsIG9mIGl0Cg==");
	assert_task_str(x, "t-mixed", "artifacts", "stdout.log", "inline", "eA==");
	assert_task_str(x, "t-mixed", "artifacts", "stderr.log", "s3_key", "cust/t-mixed/stderr.log");
}

/* A final task stays as it was until its retention is up: no upload, no
 * rewrite of its record; one past its retention goes at once. */
static void recover_final(void **state)
{
	struct fixture *x = *state;
	static const char *const finals[] = { "succeeded", "failed", "timed_out", "cancelled", "error" };
	int64_t now = atomic_load(&x->clk.wall);
	char before[5][4096];

	for (int i = 0; i < 5; i++) {
		char id[32];
		json_t *r;
		char *txt;

		snprintf(id, sizeof(id), "t-%s", finals[i]);
		write_record(x, id, record(id, finals[i], finals[i], now - 1000, result_json(finals[i], NULL)));
		r = read_record(x, id);
		txt = json_dumps(r, JSON_COMPACT | JSON_SORT_KEYS);
		snprintf(before[i], sizeof(before[i]), "%s", txt);
		free(txt);
		json_decref(r);
	}
	write_record(x, "t-old", record("t-old", "succeeded", "succeeded", now - RETENTION_S * 1000 - 1,
					result_json("succeeded", NULL)));
	put_file(x, "t-old", "stdout.log", "left over");

	open_hostd(x, 1);
	for (int i = 0; i < 5; i++) {
		char id[32];
		json_t *r;
		char *txt;

		snprintf(id, sizeof(id), "t-%s", finals[i]);
		assert_state(x, id, finals[i]);
		assert_task_str(x, id, "result", "state", NULL, finals[i]);
		assert_true(in_list(x, id, 0));
		assert_false(in_list(x, id, 1));
		r = read_record(x, id);
		txt = json_dumps(r, JSON_COMPACT | JSON_SORT_KEYS);
		assert_string_equal(txt, before[i]);
		free(txt);
		json_decref(r);
	}
	assert_null(hostd_task_json(x->d, "t-old"));
	assert_false(exists(x, "t-old", NULL));
	/* The uploader has run (its first pass runs the janitor) and uploaded
	 * nothing. */
	{
		struct timespec ts = { 0, 100000000 };

		nanosleep(&ts, NULL);
	}
	assert_int_equal(fake_count(&x->f, &x->f.puts), 0);
	assert_int_equal(fake_count(&x->f, &x->f.runs), 0);
}

/* The spool path of the entry id was moved aside to. */
static int moved_aside(struct fixture *x, const char *id)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/corrupt-%s-%lld", x->spool, id, (long long)atomic_load(&x->clk.wall));
	return access(path, F_OK) == 0;
}

/* What a crash can leave besides whole records: each entry without a valid
 * record is moved aside for the operator (never deleted), not loaded. */
static void recover_damaged(void **state)
{
	struct fixture *x = *state;
	char path[512];
	static const char *const bad[] = { "half", "norecord", "notobject", "badstate", "nocustomer", "bad id", "stray" };

	/* Half-written: the process died while a record was being written
	 * without the rename dance (or the disk lost its end). */
	make_task_dir(x, "half");
	put_file(x, "half", "record.json", "{\"version\":1,\"id\":\"half\",\"customer\":\"cu");
	put_file(x, "half", "stdout.log", "kept for the operator");
	/* Created, then the crash, before the first record write. */
	make_task_dir(x, "norecord");
	make_task_dir(x, "notobject");
	put_file(x, "notobject", "record.json", "[1,2]");
	write_record(x, "badstate", record("badstate", "exploded", "error", 0, NULL));
	write_record(x, "nocustomer",
		     json_pack("{s:i, s:s, s:s, s:s}", "version", 1, "id", "nocustomer", "state", "running", "final_state",
			       "error"));
	write_record(x, "bad id", record("bad id", "running", "error", 0, NULL));
	snprintf(path, sizeof(path), "%s/tasks/stray", x->spool);
	{
		FILE *fp = fopen(path, "w");

		assert_non_null(fp);
		fclose(fp);
	}
	/* Not entries: hidden names are skipped. */
	make_task_dir(x, ".hidden");
	/* The crash came between writing a new record's temporary file and
	 * renaming it: the old record stands. */
	write_record(x, "tmpleft", record("tmpleft", "succeeded", "succeeded", atomic_load(&x->clk.wall),
					  result_json("succeeded", NULL)));
	put_file(x, "tmpleft", ".record.json.tmp", "{\"state\":\"accep");
	/* A later kiln-host's record (a downgrade): left as it is for the one
	 * that reads it, not a task here. One without a version is the first
	 * release's: loaded. */
	{
		json_t *r = record("newer", "succeeded", "succeeded", atomic_load(&x->clk.wall),
				   result_json("succeeded", NULL));

		json_object_set_new(r, "version", json_integer(SPOOL_RECORD_V + 1));
		write_record(x, "newer", r);
		r = record("noversion", "succeeded", "succeeded", atomic_load(&x->clk.wall),
			   result_json("succeeded", NULL));
		json_object_del(r, "version");
		write_record(x, "noversion", r);
	}

	open_hostd(x, 1);
	assert_null(hostd_task_json(x->d, "newer"));
	assert_true(exists(x, "newer", "record.json"));
	assert_false(moved_aside(x, "newer"));
	assert_state(x, "noversion", "succeeded");
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		assert_null(hostd_task_json(x->d, bad[i]));
		assert_false(exists(x, bad[i], NULL));
		if (!moved_aside(x, bad[i]))
			fail_msg("%s was not moved aside", bad[i]);
	}
	snprintf(path, sizeof(path), "%s/corrupt-half-%lld/stdout.log", x->spool, (long long)atomic_load(&x->clk.wall));
	assert_int_equal(access(path, F_OK), 0);
	assert_true(exists(x, ".hidden", NULL));
	assert_null(hostd_task_json(x->d, ".hidden"));
	assert_state(x, "tmpleft", "succeeded");
	{
		json_t *a = hostd_task_list(x->d, 0);

		assert_int_equal(json_array_size(a), 2);
		json_decref(a);
	}
	/* The spool still works. */
	assert_int_equal(fake_count(&x->f, &x->f.runs), 0);
}

/* ---- a task's life ---- */

static void set_run(struct fixture *x, fake_run_fn fn)
{
	pthread_mutex_lock(&x->f.mu);
	x->f.run = fn;
	pthread_mutex_unlock(&x->f.mu);
}

static int submit(struct fixture *x, const char *id, const char *spec, struct kiln_err *err)
{
	json_t *j = json_loads(spec, 0, NULL);
	int r;

	assert_non_null(j);
	r = hostd_submit(x->d, &(struct hostd_submission){ .id = id, .customer = "cust", .spec = j }, err);
	json_decref(j);
	return r;
}

/* A task that starts after 250 ms, prints, writes an output and exits 0
 * after 1 s more (of the fake clock). */
static json_t *good_run(struct fake_ops *f, const struct task_spec *spec, const struct run_opts *ro)
{
	struct run_started st = { .deadline_ms = 0 };
	char path[4300], sha[65];
	FILE *fp;

	fake_clock_advance(&cur->clk, 250);
	ro->on_event(ro->event_ctx, RUN_EV_RUNNING, &st, sizeof(st));
	ro->on_event(ro->event_ctx, RUN_EV_STDOUT, "hello\n", 6);
	ro->on_event(ro->event_ctx, RUN_EV_STDERR, "warn\n", 5);
	mkdir(ro->output_dir, 0700);
	snprintf(path, sizeof(path), "%s/out.txt", ro->output_dir);
	fp = fopen(path, "w");
	if (fp) {
		fputs("42", fp);
		fclose(fp);
	}
	fake_sha256_hex("42", 2, sha);
	fake_clock_advance(&cur->clk, 1000);
	ro->on_event(ro->event_ctx, RUN_EV_EXITED, NULL, 0);
	return result_json("succeeded", json_pack("[{s:s, s:i, s:s}]", "path", "out.txt", "size", 2, "sha256", sha));
}

/* A task that runs until it is cancelled (its cancel fd becomes readable)
 * or the gate opens. */
static json_t *block_run(struct fake_ops *f, const struct task_spec *spec, const struct run_opts *ro)
{
	struct run_started st = { .deadline_ms = 0 };
	int cancelled = 0;

	ro->on_event(ro->event_ctx, RUN_EV_RUNNING, &st, sizeof(st));
	ro->on_event(ro->event_ctx, RUN_EV_STDOUT, "started\n", 8);
	pthread_mutex_lock(&cur->mu);
	cur->in_run = 1;
	pthread_cond_broadcast(&cur->cv);
	while (cur->gate_closed && !cancelled) {
		struct pollfd p = { .fd = ro->vm.cancel_fd, .events = POLLIN };

		pthread_mutex_unlock(&cur->mu);
		cancelled = poll(&p, 1, 5) > 0;
		pthread_mutex_lock(&cur->mu);
	}
	cur->in_run = 0;
	pthread_mutex_unlock(&cur->mu);
	if (cancelled)
		return json_pack("{s:s, s:n, s:n, s:s, s:s, s:s, s:[], s:{s:s, s:s}}", "state", "error", "exit_code",
				 "signal", "end_reason", "vm_error", "stdout", "started\n", "stderr", "", "outputs",
				 "error", "code", "vm_error", "message", "interrupted");
	return result_json("succeeded", NULL);
}

static int running(void *arg)
{
	struct fixture *x = arg;
	int v;

	pthread_mutex_lock(&x->mu);
	v = x->in_run;
	pthread_mutex_unlock(&x->mu);
	return v;
}

/* All of a task's events so far (until the stream would wait), read size
 * bytes at a time. */
static char *events_by(struct fixture *x, const char *id, size_t size)
{
	struct hostd_task *t = hostd_task_get(x->d, id);
	struct buf b = BUF_INIT;
	struct evlog_cursor cursor = { 0 };
	char chunk[65536];
	long n;

	assert_non_null(t);
	assert_true(size <= sizeof(chunk));
	while ((n = hostd_events_read(x->d, t, &cursor, chunk, size, clock_mono_ms() + 10)) > 0) {
		assert_true((size_t)n <= size);
		buf_add(&b, chunk, (size_t)n);
	}
	hostd_task_put(x->d, t);
	return buf_steal(&b, NULL);
}

static char *events_of(struct fixture *x, const char *id)
{
	return events_by(x, id, 65536);
}

static void task_lifecycle(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	int64_t t0 = atomic_load(&x->clk.wall);
	json_t *r, *j;
	char *ev;

	open_hostd(x, 1);
	set_run(x, good_run);
	assert_int_equal(submit(x, "t1", "{\"argv\":[\"true\"]}", &err), 0);
	wait_state(x, "t1", "succeeded");
	assert_int_equal(fake_count(&x->f, &x->f.runs), 1);
	assert_uploaded_and_cleaned(x, "t1", "hello\n");
	assert_string_equal(object(x, "t1", "stderr.log")->data, "warn\n");
	assert_string_equal(object(x, "t1", "outputs/out.txt")->data, "42");
	j = hostd_task_json(x->d, "t1");
	assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "outputs"), 0), "s3_key")),
			    "cust/t1/outputs/out.txt");
	/* Timings on the hostd's clock: the run moved it 250 ms to running and
	 * 1 s more to its end; the upload took no time. */
	assert_int_equal(json_integer_value(json_object_get(j, "created_ms")), t0);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "timings"), "start_ms")), 250);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "timings"), "run_ms")), 1000);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "timings"), "upload_ms")), 0);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "timings"), "total_ms")), 1250);
	assert_int_equal(json_integer_value(json_object_get(j, "upload_attempts")), 0);
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "s3"), "prefix")), "cust/t1/");
	json_decref(j);
	/* The record's last milestone. */
	r = read_record(x, "t1");
	assert_string_equal(json_string_value(json_object_get(r, "state")), "succeeded");
	assert_int_equal(json_integer_value(json_object_get(r, "running_ms")), t0 + 250);
	assert_int_equal(json_integer_value(json_object_get(r, "finished_ms")), t0 + 1250);
	json_decref(r);
	/* The manifest describes the task. */
	r = json_loads(object(x, "t1", "manifest.json")->data, 0, NULL);
	assert_non_null(r);
	assert_string_equal(json_string_value(json_object_get(r, "task")), "t1");
	assert_string_equal(json_string_value(json_object_get(r, "state")), "succeeded");
	assert_null(json_object_get(json_object_get(r, "result"), "stdout"));
	json_decref(r);
	/* Events: every state in order; the output events are dropped once the
	 * task is final, a note saying where the output is instead. */
	ev = events_of(x, "t1");
	{
		static const char *const order[] = { "accepted", "starting", "running", "uploading", "succeeded" };
		const char *at = ev;

		for (int i = 0; i < 5; i++) {
			char want[64];

			snprintf(want, sizeof(want), "event: state\ndata: {\"state\":\"%s\"", order[i]);
			at = strstr(at, want);
			if (!at)
				fail_msg("no %s state event in order in: %s", order[i], ev);
		}
	}
	assert_null(strstr(ev, "event: stdout"));
	assert_non_null(strstr(ev, "event: truncated"));
	/* The final state's event carries the task as GET answers it; the
	 * others do not. */
	{
		const char *fin = strstr(ev, "data: {\"state\":\"succeeded\"");
		const char *end = fin ? strchr(fin, '\n') : NULL;
		json_t *e, *task;

		assert_non_null(end);
		e = json_loadb(fin + 6, (size_t)(end - fin - 6), 0, NULL);
		task = json_object_get(e, "task");
		assert_non_null(task);
		assert_string_equal(json_string_value(json_object_get(task, "id")), "t1");
		assert_string_equal(json_string_value(json_object_get(task, "state")), "succeeded");
		assert_non_null(json_object_get(task, "artifacts"));
		json_decref(e);
		assert_int_equal(strstr(ev, "\"task\":") - fin, strstr(fin, "\"task\":") - fin);
	}
	/* Read through a buffer smaller than any event (libmicrohttpd offers as
	 * little as 32 KiB, less than a stdout chunk's JSON): the same bytes,
	 * each event split over reads, none cut. */
	{
		char *small = events_by(x, "t1", 7);

		assert_string_equal(small, ev);
		free(small);
	}
	/* Server-sent-event framing: each event ends with a blank line (the
	 * blocks ended with one newline until the stream moved to lib/evlog). */
	assert_null(strstr(ev, "}\nevent:"));
	assert_int_equal(strncmp(ev + strlen(ev) - 3, "}\n\n", 3), 0);
	free(ev);
	/* Its vCPUs and memory are free again. */
	j = hostd_capacity_json(x->d);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "vcpus"), "used")), 0);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "memory_mib"), "used")), 0);
	json_decref(j);
	ev = hostd_metrics(x->d);
	assert_non_null(strstr(ev, "kiln_host_tasks_finished_total{state=\"succeeded\"} 1\n"));
	assert_non_null(strstr(ev, "kiln_host_task_start_seconds_bucket{le=\"0.25\"} 1\n"));
	assert_non_null(strstr(ev, "kiln_host_upload_files_total 4\n"));
	free(ev);
}

/* While the code runs, the spool says only what a restart needs: the task
 * was accepted. */
static void record_milestones_while_running(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	json_t *r;

	open_hostd(x, 1);
	set_run(x, block_run);
	x->gate_closed = 1;
	assert_int_equal(submit(x, "t2", "{\"argv\":[\"true\"]}", &err), 0);
	assert_true(wait_for(running, x, WAIT_MS));
	wait_state(x, "t2", "running");
	r = read_record(x, "t2");
	assert_string_equal(json_string_value(json_object_get(r, "state")), "accepted");
	json_decref(r);
	assert_true(exists(x, "t2", "stdout.log"));
	pthread_mutex_lock(&x->mu);
	x->gate_closed = 0;
	pthread_mutex_unlock(&x->mu);
	wait_state(x, "t2", "succeeded");
	assert_uploaded_and_cleaned(x, "t2", "started\n");
}

struct attempts_want {
	struct fixture *x;
	const char *id;
	json_int_t n;
};

static int attempts_are(void *arg)
{
	struct attempts_want *w = arg;

	return task_int(w->x, w->id, "upload_attempts", NULL) == w->n;
}

/* A customer's own destination: the objects go to its bucket under its
 * prefix; refused credentials keep the task uploading (s3_auth), the
 * destination (secret included) in its 0600 record; new credentials for
 * the same place are taken and retried at once, another place refused;
 * once final, the record keeps no secret. */
static void destination_upload(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct attempts_want a1 = { x, "td", 1 };
	struct state_want done = { x, "td", "succeeded" };
	static const char body[] = "{\"endpoint\":\"http://127.0.0.1:9\",\"bucket\":\"cust-out\",\"prefix\":\"p/q/\","
				   "\"access_key\":\"AK\",\"secret_key\":\"refused\"}";
	struct dest d, other;
	struct stat sb;
	char path[512], *le, *dump;
	json_t *spec = json_loads("{\"argv\":[\"true\"]}", 0, NULL), *r, *j;
	const struct fake_object *o;

	open_hostd(x, 1);
	set_run(x, good_run);
	assert_int_equal(dest_parse(body, strlen(body), DEST_SECRET_REQUIRED, &d, &err), 0);
	assert_int_equal(hostd_submit(x->d,
				      &(struct hostd_submission){ .id = "td", .customer = "cust", .spec = spec, .dest = &d },
				      &err),
			 0);
	json_decref(spec);
	assert_true(wait_for(attempts_are, &a1, WAIT_MS));
	assert_state(x, "td", "uploading");
	le = task_str(x, "td", "last_error", NULL, NULL);
	assert_non_null(le);
	assert_int_equal(strncmp(le, "s3_auth: ", 9), 0);
	free(le);
	r = read_record(x, "td");
	assert_string_equal(json_string_value(json_object_get(json_object_get(r, "destination"), "secret_key")), "refused");
	json_decref(r);
	path_of(path, sizeof(path), x, "td", "record.json");
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_mode & 0777, 0600);
	/* Another place: refused; the same place with a good secret: taken. */
	other = d;
	snprintf(other.bucket, sizeof(other.bucket), "elsewhere");
	assert_int_equal(hostd_set_dest(x->d, "td", &other, &err), -1);
	assert_string_equal(err.code, "invalid_request");
	assert_int_equal(hostd_set_dest(x->d, "nosuch", &d, &err), -1);
	assert_string_equal(err.code, "not_found");
	snprintf(d.secret_key, sizeof(d.secret_key), "good");
	assert_int_equal(hostd_set_dest(x->d, "td", &d, &err), 0);
	assert_true(wait_for(has_state, &done, WAIT_MS));
	o = fake_object(&x->f, "p/q/cust/td/outputs/out.txt");
	assert_non_null(o);
	assert_string_equal(o->bucket, "cust-out");
	assert_string_equal(o->data, "42");
	assert_non_null(fake_object(&x->f, "p/q/cust/td/manifest.json"));
	assert_null(object(x, "td", "stdout.log")); /* nothing under the host's own prefix */
	r = read_record(x, "td");
	assert_string_equal(json_string_value(json_object_get(json_object_get(r, "destination"), "bucket")), "cust-out");
	assert_null(json_object_get(json_object_get(r, "destination"), "secret_key"));
	json_decref(r);
	j = hostd_task_json(x->d, "td");
	dump = json_dumps(j, JSON_COMPACT);
	assert_null(strstr(dump, "good"));
	assert_null(strstr(dump, "refused"));
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "s3"), "bucket")), "cust-out");
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "s3"), "prefix")), "p/q/cust/td/");
	free(dump);
	json_decref(j);
	/* A restart recovers the final task with its place, no secret needed. */
	hostd_close(x->d);
	open_hostd(x, 1);
	j = hostd_task_json(x->d, "td");
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "s3"), "bucket")), "cust-out");
	json_decref(j);
	dest_wipe(&d);
}

/* Move the clock on in steps of 100 ms (a real millisecond apart) until
 * pred holds; returns how far it moved. */
static int64_t advance_until(struct fixture *x, int (*pred)(void *), void *arg)
{
	int64_t moved = 0;

	while (!pred(arg)) {
		struct timespec ts = { 0, 1000000 };

		if (moved >= 600000)
			fail_msg("still waiting after ten minutes of the hostd's clock");
		fake_clock_advance(&x->clk, 100);
		moved += 100;
		nanosleep(&ts, NULL);
	}
	return moved;
}

static void s3_down(struct fixture *x, int down)
{
	pthread_mutex_lock(&x->f.mu);
	x->f.s3_down = down;
	pthread_mutex_unlock(&x->f.mu);
}

/* A failed upload is retried after 1 s, 2 s, 4 s... of the hostd's clock. */
static void upload_backs_off_on_the_clock(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct attempts_want a1 = { x, "t3", 1 }, a2 = { x, "t3", 2 };
	struct state_want done = { x, "t3", "succeeded" };
	unsigned puts;
	int64_t moved;
	char *ev, *le;

	open_hostd(x, 1);
	set_run(x, good_run);
	s3_down(x, 1);
	assert_int_equal(submit(x, "t3", "{\"argv\":[\"true\"]}", &err), 0);
	assert_true(wait_for(attempts_are, &a1, WAIT_MS));
	assert_state(x, "t3", "uploading");
	le = task_str(x, "t3", "last_error", NULL, NULL);
	assert_non_null(le);
	assert_non_null(strstr(le, "fake S3 is down"));
	free(le);
	/* Real time alone does not bring the retry... */
	puts = fake_count(&x->f, &x->f.puts);
	assert_false(wait_for(attempts_are, &a2, 200));
	assert_int_equal(fake_count(&x->f, &x->f.puts), puts);
	/* ...1 s of the hostd's clock does, then 2 s more. */
	moved = advance_until(x, attempts_are, &a2);
	assert_true(moved >= 1000);
	assert_true(moved < 1000 + 5000);
	s3_down(x, 0);
	moved = advance_until(x, has_state, &done);
	assert_true(moved >= 2000);
	assert_int_equal(task_int(x, "t3", "upload_attempts", NULL), 2);
	assert_null(task_str(x, "t3", "last_error", NULL, NULL));
	ev = events_of(x, "t3");
	assert_non_null(strstr(ev, "event: upload_error\ndata: {\"code\":\"s3_error\""));
	free(ev);
	assert_uploaded_and_cleaned(x, "t3", "hello\n");
	ev = hostd_metrics(x->d);
	assert_non_null(strstr(ev, "kiln_host_upload_failures_total 2\n"));
	free(ev);
}

/* A final task is forgotten once retention_s of the clock has passed. */
static void retention_on_the_clock(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	struct timespec ts = { 0, 100000000 };

	open_hostd(x, 1);
	set_run(x, good_run);
	assert_int_equal(submit(x, "t4", "{\"argv\":[\"true\"]}", &err), 0);
	wait_state(x, "t4", "succeeded");
	/* Exactly at the retention (and past a janitor period): kept. */
	fake_clock_advance(&x->clk, (int64_t)RETENTION_S * 1000);
	nanosleep(&ts, NULL);
	assert_state(x, "t4", "succeeded");
	assert_true(exists(x, "t4", "record.json"));
	/* One more janitor period: gone, with its directory. */
	fake_clock_advance(&x->clk, JANITOR_PERIOD_MS + 1);
	{
		int gone = 0;

		for (int i = 0; i < WAIT_MS && !gone; i++) {
			json_t *j = hostd_task_json(x->d, "t4");
			struct timespec ms = { 0, 1000000 };

			gone = !j;
			json_decref(j);
			if (!gone)
				nanosleep(&ms, NULL);
		}
		assert_true(gone);
	}
	assert_false(exists(x, "t4", NULL));
}

static void cancel_running_task(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	json_t *r;

	open_hostd(x, 1);
	set_run(x, block_run);
	x->gate_closed = 1;
	assert_int_equal(submit(x, "t5", "{\"argv\":[\"true\"]}", &err), 0);
	assert_true(wait_for(running, x, WAIT_MS));
	assert_int_equal(hostd_cancel(x->d, "nope"), -ENOENT);
	assert_int_equal(hostd_cancel(x->d, "t5"), 0);
	wait_state(x, "t5", "cancelled");
	assert_task_str(x, "t5", "result", "end_reason", NULL, "cancelled");
	assert_task_str(x, "t5", "result", "error", "code", "cancelled");
	assert_int_equal(hostd_cancel(x->d, "t5"), -EALREADY);
	r = read_record(x, "t5");
	assert_string_equal(json_string_value(json_object_get(r, "state")), "cancelled");
	json_decref(r);
	assert_uploaded_and_cleaned(x, "t5", "started\n");
}

/* kiln-host stops while a task runs: the task ends as error/host_shutdown,
 * its upload waits in the spool, and the next kiln-host uploads it. */
static void shutdown_mid_run_then_restart(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	json_t *r;

	open_hostd(x, 1);
	set_run(x, block_run);
	x->gate_closed = 1;
	pthread_mutex_lock(&x->f.mu);
	x->f.s3_down = 1; /* nothing gets out before the stop */
	pthread_mutex_unlock(&x->f.mu);
	assert_int_equal(submit(x, "t6", "{\"argv\":[\"true\"]}", &err), 0);
	assert_true(wait_for(running, x, WAIT_MS));
	close_hostd(x);
	r = read_record(x, "t6");
	assert_string_equal(json_string_value(json_object_get(r, "state")), "uploading");
	assert_string_equal(json_string_value(json_object_get(r, "final_state")), "error");
	assert_string_equal(json_string_value(json_object_get(json_object_get(r, "result"), "end_reason")),
			    "host_shutdown");
	json_decref(r);
	assert_true(exists(x, "t6", "stdout.log"));

	pthread_mutex_lock(&x->f.mu);
	x->f.s3_down = 0;
	pthread_mutex_unlock(&x->f.mu);
	open_hostd(x, 1);
	wait_state(x, "t6", "error");
	assert_task_str(x, "t6", "result", "end_reason", NULL, "host_shutdown");
	assert_uploaded_and_cleaned(x, "t6", "started\n");
	assert_int_equal(fake_count(&x->f, &x->f.runs), 1);
}

static void submit_refusals(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };

	open_hostd(x, 0);
	assert_int_equal(submit(x, "t7", "{\"argv\":[\"true\"]}", &err), -1);
	assert_string_equal(err.code, "no_s3");
	close_hostd(x);
	open_hostd(x, 1);
	set_run(x, block_run);
	x->gate_closed = 1;
	assert_int_equal(submit(x, ".t", "{\"argv\":[\"true\"]}", &err), -1);
	assert_string_equal(err.code, "invalid_request");
	assert_int_equal(submit(x, "t7", "{\"argv\":[\"true\"],\"bogus\":1}", &err), -1);
	assert_string_equal(err.code, "invalid_spec");
	assert_int_equal(submit(x, "t7", "{\"argv\":[\"true\"],\"limits\":{\"vcpus\":4}}", &err), 0);
	assert_int_equal(submit(x, "t7", "{\"argv\":[\"true\"]}", &err), -1);
	assert_string_equal(err.code, "duplicate");
	assert_int_equal(submit(x, "t8", "{\"argv\":[\"true\"]}", &err), -1);
	assert_string_equal(err.code, "no_capacity");
	assert_non_null(strstr(err.message, "vCPUs"));
	/* Nothing of a refused task reaches the spool. */
	assert_false(exists(x, "t8", NULL));
	assert_false(exists(x, ".t", NULL));
	pthread_mutex_lock(&x->mu);
	x->gate_closed = 0;
	pthread_mutex_unlock(&x->mu);
	wait_state(x, "t7", "succeeded");
	pthread_mutex_lock(&x->cap.lock);
	x->cap.total_mib = 100;
	pthread_mutex_unlock(&x->cap.lock);
	assert_int_equal(submit(x, "t8", "{\"argv\":[\"true\"]}", &err), -1);
	assert_string_equal(err.code, "no_capacity");
	assert_non_null(strstr(err.message, "memory"));
}

/* GET /v1/capacity's vcpus.used / idle / idle_max. */
static void check_vcpus(struct fixture *x, int used, int idle, int idle_max)
{
	json_t *j = hostd_capacity_json(x->d), *v;

	assert_non_null(j);
	v = json_object_get(j, "vcpus");
	assert_int_equal(json_integer_value(json_object_get(v, "total")), 4);
	assert_int_equal(json_integer_value(json_object_get(v, "used")), used);
	assert_int_equal(json_integer_value(json_object_get(v, "idle")), idle);
	assert_int_equal(json_integer_value(json_object_get(v, "idle_max")), idle_max);
	json_decref(j);
}

/* The idler, 50 ms from now: one vCPU goes idle. */
static void *idle_one_later(void *arg)
{
	usleep(50000);
	hostd_vcpus_idle(arg, 1);
	return NULL;
}

/* Idle sessions' vCPUs do not count against the active capacity, only
 * against the bound on all; a wake never fails, even past the total. */
static void vcpus_idle_admission(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	open_hostd(x, 1);
	check_vcpus(x, 0, 0, 4 * 64); /* the default bound */
	for (int i = 0; i < 4; i++)
		assert_int_equal(hostd_reserve(x->d, 1, 64, &err), 0);
	assert_int_equal(hostd_reserve(x->d, 1, 64, &err), -1);
	assert_string_equal(err.code, "no_capacity");
	assert_non_null(strstr(err.message, "busy running work"));
	/* A session that waits (hostd_reserve_wait) gets in when one goes idle. */
	{
		pthread_t th;

		assert_int_equal(pthread_create(&th, NULL, idle_one_later, x->d), 0);
		assert_int_equal(hostd_reserve_wait(x->d, 1, 64, 60000, &err), 0);
		pthread_join(th, NULL);
		check_vcpus(x, 4, 1, 256);
		hostd_vcpus_wake(x->d, 1);
		hostd_release(x->d, 1, 64);
	}
	/* Two go idle: two more fit, then the active ones are full again. */
	hostd_vcpus_idle(x->d, 2);
	check_vcpus(x, 2, 2, 256);
	assert_int_equal(hostd_reserve(x->d, 2, 64, &err), 0);
	check_vcpus(x, 4, 2, 256);
	assert_int_equal(hostd_reserve(x->d, 1, 64, &err), -1);
	assert_string_equal(err.code, "no_capacity");
	/* Tasks are admitted by the same rule. */
	assert_int_equal(submit(x, "t1", "{\"argv\":[\"true\"]}", &err), -1);
	assert_string_equal(err.code, "no_capacity");
	/* Both wake: 6 active on 4, and nothing new until they are back under. */
	hostd_vcpus_wake(x->d, 2);
	check_vcpus(x, 6, 0, 256);
	assert_int_equal(hostd_reserve(x->d, 1, 64, &err), -1);
	assert_non_null(strstr(err.message, "6 of 4"));
	/* An idle reservation is released the way the session room does it:
	 * woken back to active first, then given back. */
	hostd_vcpus_idle(x->d, 1);
	check_vcpus(x, 5, 1, 256);
	hostd_vcpus_wake(x->d, 1);
	hostd_release(x->d, 1, 64);
	check_vcpus(x, 5, 0, 256);
	for (int i = 0; i < 3; i++)
		hostd_release(x->d, 1, 64);
	hostd_release(x->d, 2, 64);
	check_vcpus(x, 0, 0, 256);
	pthread_mutex_lock(&x->cap.lock);
	assert_int_equal(x->cap.used_mib, 0);
	pthread_mutex_unlock(&x->cap.lock);
	close_hostd(x);

	/* The bound on all (capacity.idle_vcpus): 6 on a host of 4 active. */
	x->idle_max = 6;
	open_hostd(x, 1);
	for (int i = 0; i < 4; i++)
		assert_int_equal(hostd_reserve(x->d, 1, 64, &err), 0);
	hostd_vcpus_idle(x->d, 4);
	assert_int_equal(hostd_reserve(x->d, 2, 64, &err), 0);
	check_vcpus(x, 2, 4, 6);
	assert_int_equal(hostd_reserve(x->d, 1, 64, &err), -1);
	assert_string_equal(err.code, "no_capacity");
	assert_non_null(strstr(err.message, "capacity.idle_vcpus"));
	hostd_vcpus_wake(x->d, 4);
	for (int i = 0; i < 4; i++)
		hostd_release(x->d, 1, 64);
	hostd_release(x->d, 2, 64);
	check_vcpus(x, 0, 0, 6);
	pthread_mutex_lock(&x->cap.lock);
	assert_int_equal(x->cap.used_mib, 0);
	pthread_mutex_unlock(&x->cap.lock);
	close_hostd(x);

	/* A bound below the active total is raised to it. */
	x->idle_max = 2;
	open_hostd(x, 1);
	check_vcpus(x, 0, 0, 4);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(recover_unfinished, setup, teardown),
		cmocka_unit_test_setup_teardown(recover_uploading, setup, teardown),
		cmocka_unit_test_setup_teardown(recover_final, setup, teardown),
		cmocka_unit_test_setup_teardown(inline_small_logs, setup, teardown),
		cmocka_unit_test_setup_teardown(recover_damaged, setup, teardown),
		cmocka_unit_test_setup_teardown(task_lifecycle, setup, teardown),
		cmocka_unit_test_setup_teardown(destination_upload, setup, teardown),
		cmocka_unit_test_setup_teardown(record_milestones_while_running, setup, teardown),
		cmocka_unit_test_setup_teardown(upload_backs_off_on_the_clock, setup, teardown),
		cmocka_unit_test_setup_teardown(retention_on_the_clock, setup, teardown),
		cmocka_unit_test_setup_teardown(cancel_running_task, setup, teardown),
		cmocka_unit_test_setup_teardown(shutdown_mid_run_then_restart, setup, teardown),
		cmocka_unit_test_setup_teardown(submit_refusals, setup, teardown),
		cmocka_unit_test_setup_teardown(vcpus_idle_admission, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
