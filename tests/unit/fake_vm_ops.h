/* fake_vm_ops: a struct vm_ops and a struct kiln_clock for unit tests of
 * kiln-host's daemon logic (test_hostd.c, test_pool.c): no QEMU, no root,
 * no S3. Fake VMs are numbers (vm->pid) with a state; fake runs follow a
 * script the test sets; fake uploads keep each object's key and bytes. Every
 * call is counted under one mutex, so that a test can compare what was
 * created with what was destroyed. The clock moves only when the test moves
 * it. Header-only: each test program includes it once. */
#ifndef KILN_FAKE_VM_OPS_H
#define KILN_FAKE_VM_OPS_H

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "clock.h"
#include "vm_ops.h"

#define FAKE_UNUSED __attribute__((unused))

/* ---- the clock ---- */

struct fake_clock {
	_Atomic int64_t wall, mono;
	struct kiln_clock c;
};

static int64_t fake_wall(void *ctx)
{
	return atomic_load(&((struct fake_clock *)ctx)->wall);
}

static int64_t fake_mono(void *ctx)
{
	return atomic_load(&((struct fake_clock *)ctx)->mono);
}

/* Start at a fixed, recognisable time. */
static FAKE_UNUSED void fake_clock_init(struct fake_clock *fc)
{
	atomic_store(&fc->wall, 1700000000000);
	atomic_store(&fc->mono, 5000000);
	fc->c = (struct kiln_clock){ fake_wall, fake_mono, fc };
}

/* Move both clocks on by ms. */
static FAKE_UNUSED void fake_clock_advance(struct fake_clock *fc, int64_t ms)
{
	atomic_fetch_add(&fc->wall, ms);
	atomic_fetch_add(&fc->mono, ms);
}

/* ---- waiting for another thread (real time, bounded) ---- */

/* Poll pred(arg) every millisecond for up to ms of real time: 1 once it
 * holds, 0 if it never did. */
static FAKE_UNUSED int wait_for(int (*pred)(void *), void *arg, int ms)
{
	for (int i = 0; i < ms; i++) {
		struct timespec ts = { 0, 1000000 };

		if (pred(arg))
			return 1;
		nanosleep(&ts, NULL);
	}
	return pred(arg);
}

/* ---- VMs, runs and uploads ---- */

#define FAKE_MAX_VMS 256
#define FAKE_MAX_OBJECTS 256

enum fake_vm_state { FVM_NONE, FVM_SPAWNED, FVM_RUNNING, FVM_PAUSED, FVM_DEAD, FVM_DESTROYED };

struct fake_object {
	char key[512];
	char bucket[64];       /* the s3_config's bucket it was put with */
	char *data;
	size_t len;
	unsigned seq; /* order of arrival */
};

struct fake_ops;
/* A scripted run: the test's stand-in for run_task. */
typedef json_t *(*fake_run_fn)(struct fake_ops *f, const struct task_spec *spec, const struct run_opts *ro);

struct fake_ops {
	struct vm_ops ops;
	pthread_mutex_t mu;
	pthread_cond_t cv;          /* broadcast on every call */
	/* VMs: vm->pid is the index in state[] (1-based). */
	enum fake_vm_state state[FAKE_MAX_VMS + 1];
	int nvms;
	unsigned created, destroyed, restores, spawns, loads, warmups, pauses, resumes, nices;
	unsigned fail_restores;     /* the next N restores fail */
	unsigned fail_spawns;
	/* A gate the next restore waits at (tests of pool_stop during a refill). */
	int restore_gate_closed;
	int in_restore;     /* restores under way now */
	int max_in_restore; /* the most at once so far */
	/* Runs. */
	fake_run_fn run;
	unsigned runs;
	/* Uploads. */
	struct fake_object obj[FAKE_MAX_OBJECTS];
	unsigned nobj, puts, put_failures_left, buckets_made;
	int s3_down;                /* every put fails while set */
};

static int fake_new_vm_locked(struct fake_ops *f, struct vm *vm, enum fake_vm_state s)
{
	if (f->nvms >= FAKE_MAX_VMS)
		return -1;
	f->nvms++;
	f->state[f->nvms] = s;
	f->created++;
	memset(vm, 0, sizeof(*vm));
	vm->pid = f->nvms;
	vm->pidfd = vm->agent_fd = vm->qmp_fd = vm->lock_fd = -1;
	return 0;
}

static int fake_restore(void *ctx, const struct snapshot *s, const struct vm_config *base, struct vm *vm,
			struct kiln_err *err)
{
	struct fake_ops *f = ctx;
	int r = 0;

	pthread_mutex_lock(&f->mu);
	f->restores++;
	if (++f->in_restore > f->max_in_restore)
		f->max_in_restore = f->in_restore;
	pthread_cond_broadcast(&f->cv);
	while (f->restore_gate_closed)
		pthread_cond_wait(&f->cv, &f->mu);
	f->in_restore--;
	if (f->fail_restores) {
		f->fail_restores--;
		r = kiln_err_set(err, KERR_VM_ERROR, "fake restore failure");
	} else if (fake_new_vm_locked(f, vm, FVM_RUNNING) < 0) {
		r = kiln_err_set(err, KERR_VM_ERROR, "too many fake VMs");
	}
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	return r;
}

static int fake_spawn(void *ctx, const struct snapshot *s, const struct vm_config *base, struct vm *vm,
		      struct kiln_err *err)
{
	struct fake_ops *f = ctx;
	int r = 0;

	pthread_mutex_lock(&f->mu);
	f->spawns++;
	if (f->fail_spawns) {
		f->fail_spawns--;
		r = kiln_err_set(err, KERR_VM_ERROR, "fake spawn failure");
	} else if (fake_new_vm_locked(f, vm, FVM_SPAWNED) < 0) {
		r = kiln_err_set(err, KERR_VM_ERROR, "too many fake VMs");
	}
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	return r;
}

/* Move vm from state `from` (FVM_NONE: any live one) to `to`; -1 with err
 * when it is not in that state (dead, destroyed, never made). */
static int fake_step(struct fake_ops *f, struct vm *vm, enum fake_vm_state from, enum fake_vm_state to,
		     unsigned *counter, struct kiln_err *err)
{
	int r = 0;

	pthread_mutex_lock(&f->mu);
	(*counter)++;
	if (vm->pid <= 0 || vm->pid > f->nvms ||
	    (from != FVM_NONE ? f->state[vm->pid] != from
			      : f->state[vm->pid] == FVM_DEAD || f->state[vm->pid] == FVM_DESTROYED))
		r = kiln_err_set(err, KERR_VM_ERROR, "fake VM %d is not usable", (int)vm->pid);
	else if (to != FVM_NONE)
		f->state[vm->pid] = to;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	return r;
}

static int fake_load(void *ctx, const struct snapshot *s, struct vm *vm, struct kiln_err *err)
{
	struct fake_ops *f = ctx;

	return fake_step(f, vm, FVM_SPAWNED, FVM_RUNNING, &f->loads, err);
}

static int fake_warm_up(void *ctx, struct vm *vm, struct kiln_err *err)
{
	struct fake_ops *f = ctx;

	return fake_step(f, vm, FVM_RUNNING, FVM_NONE, &f->warmups, err);
}

static int fake_pause(void *ctx, struct vm *vm, struct kiln_err *err)
{
	struct fake_ops *f = ctx;

	return fake_step(f, vm, FVM_RUNNING, FVM_PAUSED, &f->pauses, err);
}

static int fake_resume(void *ctx, struct vm *vm, struct kiln_err *err)
{
	struct fake_ops *f = ctx;

	return fake_step(f, vm, FVM_PAUSED, FVM_RUNNING, &f->resumes, err);
}

static int fake_set_nice(void *ctx, const struct vm *vm, int nice)
{
	struct fake_ops *f = ctx;

	pthread_mutex_lock(&f->mu);
	f->nices++;
	pthread_mutex_unlock(&f->mu);
	return 0;
}

/* Like vm_destroy: safe on a zeroed or failed vm, idempotent. */
static void fake_destroy(void *ctx, struct vm *vm)
{
	struct fake_ops *f = ctx;

	pthread_mutex_lock(&f->mu);
	if (vm->pid > 0 && vm->pid <= f->nvms && f->state[vm->pid] != FVM_DESTROYED) {
		f->state[vm->pid] = FVM_DESTROYED;
		f->destroyed++;
	}
	vm->pid = -1;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

/* A VM's QEMU dies (OOM killer, a crash) while the pool holds it. */
static FAKE_UNUSED void fake_kill(struct fake_ops *f, int id)
{
	pthread_mutex_lock(&f->mu);
	if (f->state[id] != FVM_DESTROYED)
		f->state[id] = FVM_DEAD;
	pthread_mutex_unlock(&f->mu);
}

static json_t *fake_run_task(void *ctx, const struct task_spec *spec, const struct run_opts *ro)
{
	struct fake_ops *f = ctx;
	fake_run_fn run;

	pthread_mutex_lock(&f->mu);
	f->runs++;
	run = f->run;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	if (!run)
		return json_pack("{s:s, s:s}", "state", "error", "end_reason", "vm_error");
	return run(f, spec, ro);
}

static int fake_ensure_bucket(void *ctx, const struct s3_config *s3, struct kiln_err *err)
{
	struct fake_ops *f = ctx;

	pthread_mutex_lock(&f->mu);
	f->buckets_made++;
	pthread_mutex_unlock(&f->mu);
	return 0;
}

static FAKE_UNUSED int fake_sha256_hex(const void *data, size_t len, char out[65])
{
	unsigned char md[32];
	unsigned int mdlen = 0;

	if (!EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
		return -1;
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
	return 0;
}

/* The whole file at path (NUL-terminated), or NULL. */
static FAKE_UNUSED char *fake_read_file(const char *path, size_t *len)
{
	FILE *fp = fopen(path, "rb");
	char *p = NULL;
	size_t n = 0, cap = 0;
	int c;

	if (!fp)
		return NULL;
	while ((c = fgetc(fp)) != EOF) {
		if (n + 2 > cap) {
			char *q = realloc(p, cap = cap ? cap * 2 : 256);

			if (!q) {
				free(p);
				fclose(fp);
				return NULL;
			}
			p = q;
		}
		p[n++] = (char)c;
	}
	fclose(fp);
	if (!p && !(p = malloc(1)))
		return NULL;
	p[n] = 0;
	if (len)
		*len = n;
	return p;
}

/* Keeps the object (a second PUT of a key replaces it, as S3 does). */
static int fake_put_file(void *ctx, const struct s3_config *s3, const char *key, const char *path,
			 const char *content_type, char sha256_hex[65], uint64_t *bytes_sent, struct kiln_err *err)
{
	struct fake_ops *f = ctx;
	size_t len = 0;
	char *data;
	unsigned i;
	int r = 0;

	pthread_mutex_lock(&f->mu);
	f->puts++;
	/* A bucket whose owner refuses these credentials. */
	if (s3->secret_key && !strcmp(s3->secret_key, "refused")) {
		pthread_mutex_unlock(&f->mu);
		return kiln_err_set(err, KERR_S3_AUTH, "S3 refused the credentials (fake)");
	}
	if (f->s3_down || f->put_failures_left) {
		if (f->put_failures_left)
			f->put_failures_left--;
		pthread_mutex_unlock(&f->mu);
		return kiln_err_set(err, KERR_S3_ERROR, "fake S3 is down");
	}
	pthread_mutex_unlock(&f->mu);
	data = fake_read_file(path, &len);
	if (!data)
		return kiln_err_set(err, KERR_IO_ERROR, "fake S3: cannot read %s", path);
	fake_sha256_hex(data, len, sha256_hex);
	*bytes_sent += len;
	pthread_mutex_lock(&f->mu);
	for (i = 0; i < f->nobj && strcmp(f->obj[i].key, key); i++)
		;
	if (i == FAKE_MAX_OBJECTS) {
		free(data);
		r = kiln_err_set(err, KERR_S3_ERROR, "fake S3 is full");
	} else {
		if (i == f->nobj)
			f->nobj++;
		else
			free(f->obj[i].data);
		snprintf(f->obj[i].key, sizeof(f->obj[i].key), "%s", key);
		snprintf(f->obj[i].bucket, sizeof(f->obj[i].bucket), "%s", s3->bucket ? s3->bucket : "");
		f->obj[i].data = data;
		f->obj[i].len = len;
		f->obj[i].seq = f->puts;
	}
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	return r;
}

/* The object stored under key, or NULL. */
static FAKE_UNUSED const struct fake_object *fake_object(struct fake_ops *f, const char *key)
{
	const struct fake_object *o = NULL;

	pthread_mutex_lock(&f->mu);
	for (unsigned i = 0; i < f->nobj; i++)
		if (!strcmp(f->obj[i].key, key))
			o = &f->obj[i];
	pthread_mutex_unlock(&f->mu);
	return o;
}

static FAKE_UNUSED void fake_ops_init(struct fake_ops *f)
{
	memset(f, 0, sizeof(*f));
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	f->ops = (struct vm_ops){
		.run_task = fake_run_task,
		.restore = fake_restore,
		.spawn = fake_spawn,
		.load = fake_load,
		.warm_up = fake_warm_up,
		.pause = fake_pause,
		.resume = fake_resume,
		.set_nice = fake_set_nice,
		.destroy = fake_destroy,
		.ensure_bucket = fake_ensure_bucket,
		.put_file = fake_put_file,
		.ctx = f,
	};
}

static FAKE_UNUSED void fake_ops_free(struct fake_ops *f)
{
	for (unsigned i = 0; i < f->nobj; i++)
		free(f->obj[i].data);
	pthread_mutex_destroy(&f->mu);
	pthread_cond_destroy(&f->cv);
}

/* A counter read under the lock. */
static FAKE_UNUSED unsigned fake_count(struct fake_ops *f, const unsigned *counter)
{
	unsigned v;

	pthread_mutex_lock(&f->mu);
	v = *counter;
	pthread_mutex_unlock(&f->mu);
	return v;
}

#endif
