/* hostd_int: what hostd's files share (hostd.c: the task table and the
 * task lifecycle; hostd_task.c: a task's record, events and final
 * transition; upload.c: the upload threads, the janitor and the S3
 * settings; recover.c: recovery from the spool at start-up; hostd_metrics.c:
 * capacity and metrics). Not for other rooms: they use task.h.
 *
 * Locking: d->lock guards the task table and every task's mutable fields;
 * functions named _locked are called with it held. */
#ifndef KILN_HOSTD_INT_H
#define KILN_HOSTD_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "clock.h"
#include "evlog.h"
#include "hostd.h"
#include "run/run.h"

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

/* The states' wire names, indexed by enum task_state. */
extern const char *const hostd_state_names[TS_COUNT];

static inline int state_final(enum task_state s)
{
	return s >= TS_SUCCEEDED;
}

/* The state named s, or TS_COUNT for none (s may be NULL). */
enum task_state hostd_state_parse(const char *s);

struct hostd_task {
	char id[65], customer[65];
	char dir[4096];              /* SPOOL/tasks/ID */
	struct task_spec *spec;      /* parsed once, on arrival; until the worker takes it */
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
	/* Events: formatted SSE blocks, kept so that a late subscriber sees all. */
	struct evlog ev;
	/* Upload progress (in memory: a restart uploads again from the start;
	 * PUTs are idempotent). */
	int upload_busy, in_upload;
	int record_pending;          /* the uploading record is on its way to disk: not final before */
	size_t upload_done;
	unsigned upload_attempts;
	int64_t next_upload_ms;      /* monotonic (the hostd's clock) */
	int64_t upload_started_ms;
	unsigned refs;               /* table + workers + streams */
	struct template_ref *ref;           /* the task's template (NULL: default); until the worker ends */
	struct dest *dest;           /* the customer's own S3 destination (NULL: the host's S3) */
	struct hostd_task *next;
};

/* Buckets of kiln_host_task_start_seconds (seconds; one more for +Inf). */
#define HOSTD_START_BUCKETS 11
extern const double hostd_start_buckets[HOSTD_START_BUCKETS];

/* May n more active vCPUs be admitted? 0; -1 with err "no_capacity" when
 * the active ones are full, -2 when the bound on all is reached (d->lock
 * held; hostd.c). */
int hostd_vcpus_admit_locked(struct hostd *d, unsigned n, struct kiln_err *err);

struct hostd {
	struct hostd_config cfg;
	struct run_opts ro;
	struct capacity *cap;
	struct pool *pool;
	const struct vm_ops *ops;        /* runs and uploads go through it */
	const struct kiln_clock *clk;    /* timestamps, back-offs, retention */
	char host_id[65];
	char spool[4096];
	pthread_mutex_t lock;
	pthread_cond_t changed, upload_wake;
	pthread_cond_t vcpus_freed;     /* active vCPUs went idle or were released (hostd_reserve_wait) */
	struct hostd_task *tasks;   /* all tasks, newest first */
	size_t ntasks;
	unsigned vcpus_used;        /* reserved and running work: tasks, builds, sessions not idle-stopped */
	unsigned vcpus_idle;        /* reserved by idle-stopped sessions (hostd_vcpus_idle) */
	int draining;               /* kiln-host drain: reported in the capacity (heartbeat) */
	int64_t drain_deadline_ms;  /* wall ms, 0: none */
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
	/* hostd_set_janitor_hook: called without the lock; hook_busy while it runs. */
	void (*hook_fn)(void *ctx);
	void *hook_ctx;
	unsigned hook_period_ms;
	int64_t next_hook_ms;
	int hook_busy;
	/* Metrics. */
	uint64_t accepted_total, finished_total[TS_COUNT];
	uint64_t upload_bytes, upload_failures, upload_files;
	uint64_t start_hist[HOSTD_START_BUCKETS + 1], start_count;
	double start_sum;
};

/* ---- hostd_task.c (calls none of hostd.c, upload.c, recover.c) ---- */

/* A task record for the table (one reference, the table's; not linked in
 * yet), or NULL when out of memory. */
struct hostd_task *hostd_task_new(struct hostd *d, const char *id, const char *customer);
/* Free a task record at once, whatever its references (one never linked). */
void hostd_task_free(struct hostd_task *t);
/* Drop a reference; the last one frees the task. */
void hostd_task_put_locked(struct hostd_task *t);
/* t is in state s now: its state event goes out (a final one with the
 * task's JSON, and the event log closes). */
void hostd_set_state_locked(struct hostd *d, struct hostd_task *t, enum task_state s);
/* The task as GET /v1/tasks/{id} shows it (new reference, or NULL). */
json_t *hostd_task_json_locked(struct hostd *d, struct hostd_task *t);
/* t's durable record (new reference, or NULL when out of memory). */
json_t *hostd_record_json_locked(struct hostd_task *t);
/* Append one server-sent event (takes data's reference) and wake streams. */
void hostd_event_add_locked(struct hostd *d, struct hostd_task *t, const char *name, json_t *data);
/* Write t's record.json durably. 0 or -1 with err set. */
int hostd_record_write_locked(struct hostd_task *t, struct kiln_err *err);
/* A result for a task whose code did not run to its end (reason: the
 * end_reason; "cancelled" makes the state cancelled, else error). */
json_t *hostd_error_result(const char *reason, const char *code, const char *msg);
/* [PREFIX]CUSTOMER/ID/rel, t's S3 key for rel (PREFIX: its destination's),
 * caller frees; or NULL. */
char *hostd_s3_key(const struct hostd_task *t, const char *rel);
/* Everything is in S3: the task is final now (its state event, with the
 * task's JSON, goes out at once). Returns the final record, which the
 * caller hands to hostd_task_persist_final once it has let go of d->lock:
 * the disk is not waited for under the lock, nor before kiln-api hears. A
 * crash before that write finds the task uploading, and its upload (the
 * same objects again) runs once more. */
json_t *hostd_task_finished_locked(struct hostd *d, struct hostd_task *t);
/* Write the final record durably (record: taken), then remove the spooled
 * files. Called without d->lock, holding a reference on t. */
void hostd_task_persist_final(struct hostd *d, struct hostd_task *t, json_t *record);

/* ---- upload.c ---- */

/* An upload thread (d is its argument): picks the task due first, uploads
 * what is left of it, backs off on failure; runs the janitor. Ends once
 * d->stopping is set. */
void *hostd_uploader_main(void *arg);
/* Forget final tasks older than the retention (record and directory). */
void hostd_janitor_locked(struct hostd *d);
/* Replace the S3 settings with a copy of s3 (NULL: none, freeing the copy). */
void hostd_s3_set_locked(struct hostd *d, const struct s3_config *s3);

/* ---- recover.c ---- */

/* Load every task the spool holds into the (empty) table, ending what a
 * previous process left unfinished, then run the janitor. Takes d->lock.
 * 0 or -1 with err set (the spool's task directory cannot be read). */
int hostd_recover(struct hostd *d, struct kiln_err *err);

#endif
