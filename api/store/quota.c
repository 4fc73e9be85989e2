/* quota: quota JSON, admission and start checks, submit-rate token buckets. */
#include "quota.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec.h"

void quota_defaults(struct quota *q)
{
	*q = (struct quota){
		.max_running = 4,
		.max_vcpus = 8,
		.max_memory_mib = 8192,
		.max_task_vcpus = 4,
		.max_task_memory_mib = 4096,
		.max_task_timeout_s = 3600,
		.max_task_output_mib = 1024,
		.submit_rate = 10,
		.submit_burst = 20,
		.max_queued = 100,
		.allow_egress = 0,
		.session_auto_pause = 0,
		.max_streams = 16,
		.max_templates = 10,
		.max_template_mib = 4096,
		.build_minutes_per_day = 120,
		.build_timeout_s = 1800,
		.max_snapshots = 100,
		.max_snapshot_mib = 20480,
		.max_volumes = 20,
		.max_volume_mib = 10240,
	};
}

enum qtype { Q_UINT, Q_U64, Q_RATE, Q_BOOL };

struct qfield {
	const char *name;
	enum qtype type;
	size_t off;
	double max;
};

#define QF(n, t, m) { #n, t, offsetof(struct quota, n), m }
static const struct qfield qfields[] = {
	QF(max_running, Q_UINT, 1000000),
	QF(max_vcpus, Q_UINT, 1000000),
	QF(max_memory_mib, Q_U64, 1e12),
	QF(max_task_vcpus, Q_UINT, SPEC_MAX_VCPUS),
	QF(max_task_memory_mib, Q_UINT, SPEC_MAX_MEMORY_MIB),
	QF(max_task_timeout_s, Q_UINT, SPEC_MAX_TIMEOUT_S),
	QF(max_task_output_mib, Q_UINT, SPEC_MAX_OUTPUT_MIB),
	QF(submit_rate, Q_RATE, 1e6),
	QF(submit_burst, Q_UINT, 1000000),
	QF(max_queued, Q_UINT, 100000000),
	QF(allow_egress, Q_BOOL, 1),
	QF(session_auto_pause, Q_BOOL, 1),
	QF(max_streams, Q_UINT, 1000000),
	QF(max_templates, Q_UINT, 100000),
	QF(max_template_mib, Q_UINT, 1048576),
	QF(build_minutes_per_day, Q_UINT, 1440),
	QF(build_timeout_s, Q_UINT, 86400),
	QF(max_snapshots, Q_UINT, 1000000),
	QF(max_snapshot_mib, Q_U64, 1e12),
	QF(max_volumes, Q_UINT, 1000000),
	QF(max_volume_mib, Q_UINT, 65536),
};
#define NQFIELDS (sizeof(qfields) / sizeof(qfields[0]))

int quota_from_json(json_t *j, const char *where, struct quota *q, struct kiln_err *err)
{
	struct quota n = *q;
	const char *k;
	json_t *v;

	if (!where)
		where = "quotas";
	if (!json_is_object(j))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "%s: must be an object", *where ? where : "body");
	json_object_foreach(j, k, v) {
		const struct qfield *f = NULL;
		char *p;
		double x;

		for (size_t i = 0; i < NQFIELDS; i++)
			if (!strcmp(qfields[i].name, k))
				f = &qfields[i];
		if (!f)
			return kiln_err_set(err, KERR_INVALID_REQUEST, "%s%s%.64s: unknown quota", where, *where ? "." : "",
					    k);
		p = (char *)&n + f->off;
		if (f->type == Q_BOOL) {
			if (!json_is_boolean(v))
				return kiln_err_set(err, KERR_INVALID_REQUEST, "%s%s%s: must be true or false", where,
						    *where ? "." : "", k);
			*(int *)p = json_is_true(v);
			continue;
		}
		if (f->type == Q_RATE ? !json_is_number(v) : !json_is_integer(v))
			return kiln_err_set(err, KERR_INVALID_REQUEST, "%s%s%s: must be %s from 0 to %g", where,
					    *where ? "." : "", k, f->type == Q_RATE ? "a number" : "an integer", f->max);
		x = json_number_value(v);
		if (!(x >= 0 && x <= f->max))
			return kiln_err_set(err, KERR_INVALID_REQUEST, "%s%s%s: must be from 0 to %g (got %g)", where,
					    *where ? "." : "", k, f->max, x);
		if (f->type == Q_UINT)
			*(unsigned *)p = (unsigned)x;
		else if (f->type == Q_U64)
			*(uint64_t *)p = (uint64_t)x;
		else
			*(double *)p = x;
	}
	*q = n;
	return 0;
}

json_t *quota_to_json(const struct quota *q)
{
	json_t *j = json_object();

	for (size_t i = 0; i < NQFIELDS; i++) {
		const char *p = (const char *)q + qfields[i].off;
		json_t *v;

		switch (qfields[i].type) {
		case Q_UINT:
			v = json_integer(*(const unsigned *)p);
			break;
		case Q_U64:
			v = json_integer((json_int_t)*(const uint64_t *)p);
			break;
		case Q_RATE:
			v = json_real(*(const double *)p);
			break;
		default:
			v = json_boolean(*(const int *)p);
			break;
		}
		json_object_set_new(j, qfields[i].name, v);
	}
	return j;
}

int quota_check_task(const struct quota *q, unsigned vcpus, unsigned memory_mib, unsigned timeout_s,
		     unsigned output_mib, struct kiln_err *err)
{
	const struct {
		const char *field;
		unsigned got, max;
	} c[] = {
		{ "limits.vcpus", vcpus, q->max_task_vcpus },
		{ "limits.memory_mib", memory_mib, q->max_task_memory_mib },
		{ "limits.timeout_s", timeout_s, q->max_task_timeout_s },
		{ "limits.output_mib", output_mib, q->max_task_output_mib },
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
		if (c[i].max && c[i].got > c[i].max)
			return kiln_err_set(err, KERR_OVER_QUOTA, "%s: %u exceeds your quota of %u", c[i].field, c[i].got,
					    c[i].max);
	return 0;
}

int quota_allows_start(const struct quota *q, const struct usage *u, unsigned vcpus, unsigned memory_mib)
{
	if (q->max_running && u->running + 1 > q->max_running)
		return 0;
	if (q->max_vcpus && u->vcpus + vcpus > q->max_vcpus)
		return 0;
	if (q->max_memory_mib && u->memory_mib + memory_mib > q->max_memory_mib)
		return 0;
	return 1;
}

int quota_check_start(const struct quota *q, const struct usage *u, unsigned vcpus, unsigned memory_mib,
		      struct kiln_err *err)
{
	if (q->max_running && u->running + 1 > q->max_running)
		return kiln_err_set(err, KERR_QUOTA_EXCEEDED,
				    "max_running: %u tasks and sessions are running, your quota's limit is %u", u->running,
				    q->max_running);
	if (q->max_vcpus && u->vcpus + vcpus > q->max_vcpus)
		return kiln_err_set(err, KERR_QUOTA_EXCEEDED,
				    "max_vcpus: %u vCPUs are in use, %u more would exceed your quota of %u", u->vcpus,
				    vcpus, q->max_vcpus);
	if (q->max_memory_mib && u->memory_mib + memory_mib > q->max_memory_mib)
		return kiln_err_set(err, KERR_QUOTA_EXCEEDED,
				    "max_memory_mib: %llu MiB are in use, %u more would exceed your quota of %llu",
				    (unsigned long long)u->memory_mib, memory_mib, (unsigned long long)q->max_memory_mib);
	return 0;
}

int quota_check_build(const struct quota *q, unsigned templates, double build_s_today, struct kiln_err *err)
{
	if (q->max_templates && templates >= q->max_templates)
		return kiln_err_set(err, KERR_QUOTA_EXCEEDED,
				    "max_templates: you have %u templates, your quota's limit is %u (DELETE one first)",
				    templates, q->max_templates);
	if (q->build_minutes_per_day && build_s_today >= (double)q->build_minutes_per_day * 60)
		return kiln_err_set(err, KERR_QUOTA_EXCEEDED,
				    "build_minutes_per_day: %.1f minutes of builds today (UTC), your quota's limit is %u",
				    build_s_today / 60, q->build_minutes_per_day);
	return 0;
}

/* ---- token buckets ---- */

static void refill(struct quota_bucket *b, double rate, unsigned burst, int64_t now_ms)
{
	double cap = burst ? burst : 1;

	if (!b->started) {
		b->tokens = cap;
		b->last_ms = now_ms;
		b->started = 1;
		return;
	}
	/* A clock that steps back adds nothing (and takes nothing). */
	if (now_ms > b->last_ms) {
		b->tokens += (double)(now_ms - b->last_ms) * rate / 1000.0;
		b->last_ms = now_ms;
	}
	/* A lowered burst applies at once. */
	if (b->tokens > cap)
		b->tokens = cap;
}

int quota_bucket_take(struct quota_bucket *b, double rate, unsigned burst, int64_t now_ms, int64_t *retry_ms)
{
	if (rate <= 0) {
		if (retry_ms)
			*retry_ms = 0;
		return 1;
	}
	refill(b, rate, burst, now_ms);
	if (b->tokens >= 1.0) {
		b->tokens -= 1.0;
		if (retry_ms)
			*retry_ms = 0;
		return 1;
	}
	if (retry_ms)
		*retry_ms = (int64_t)ceil((1.0 - b->tokens) * 1000.0 / rate - 1e-6); /* no rounding up of float noise */
	return 0;
}

double quota_bucket_peek(const struct quota_bucket *b, double rate, unsigned burst, int64_t now_ms)
{
	struct quota_bucket c = *b;

	if (rate <= 0)
		return burst ? burst : 1;
	refill(&c, rate, burst, now_ms);
	return c.tokens;
}

struct limiter_entry {
	char customer[65];
	struct quota_bucket b;
	unsigned streams;            /* long-lived requests open now */
	struct limiter_entry *next;
};

#define LIMITER_BUCKETS 1024

struct quota_limiter {
	pthread_mutex_t lock;
	struct limiter_entry *tab[LIMITER_BUCKETS];
};

static unsigned str_hash(const char *s)
{
	unsigned h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

struct quota_limiter *quota_limiter_new(void)
{
	struct quota_limiter *l = calloc(1, sizeof(*l));

	if (l)
		pthread_mutex_init(&l->lock, NULL);
	return l;
}

void quota_limiter_free(struct quota_limiter *l)
{
	if (!l)
		return;
	for (unsigned i = 0; i < LIMITER_BUCKETS; i++)
		for (struct limiter_entry *e = l->tab[i], *n; e; e = n) {
			n = e->next;
			free(e);
		}
	pthread_mutex_destroy(&l->lock);
	free(l);
}

/* The customer's entry, made on first use (lock held). Customers are rows of
 * the store, so the table grows only as the admin adds them. */
static struct limiter_entry *limiter_get(struct quota_limiter *l, const char *customer)
{
	unsigned h = str_hash(customer) % LIMITER_BUCKETS;
	struct limiter_entry *e;

	for (e = l->tab[h]; e; e = e->next)
		if (!strcmp(e->customer, customer))
			return e;
	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	snprintf(e->customer, sizeof(e->customer), "%s", customer);
	e->next = l->tab[h];
	l->tab[h] = e;
	return e;
}

int quota_limiter_take(struct quota_limiter *l, const char *customer, double rate, unsigned burst, int64_t now_ms,
		       int64_t *retry_ms)
{
	struct limiter_entry *e;
	int r = 1;

	pthread_mutex_lock(&l->lock);
	e = limiter_get(l, customer);
	if (e)
		r = quota_bucket_take(&e->b, rate, burst, now_ms, retry_ms);
	else if (retry_ms)
		*retry_ms = 1000; /* out of memory: refuse rather than let everything through */
	pthread_mutex_unlock(&l->lock);
	return e ? r : 0;
}

double quota_limiter_peek(struct quota_limiter *l, const char *customer, double rate, unsigned burst,
			  int64_t now_ms)
{
	struct limiter_entry *e;
	double t;

	pthread_mutex_lock(&l->lock);
	e = limiter_get(l, customer);
	t = e ? quota_bucket_peek(&e->b, rate, burst, now_ms) : 0;
	pthread_mutex_unlock(&l->lock);
	return t;
}

int quota_limiter_stream_open(struct quota_limiter *l, const char *customer, unsigned max)
{
	struct limiter_entry *e;
	int r = 0;

	pthread_mutex_lock(&l->lock);
	e = limiter_get(l, customer);
	if (e && (!max || e->streams < max)) {
		e->streams++;
		r = 1;
	}
	pthread_mutex_unlock(&l->lock);
	return r;
}

void quota_limiter_stream_close(struct quota_limiter *l, const char *customer)
{
	struct limiter_entry *e;

	pthread_mutex_lock(&l->lock);
	e = limiter_get(l, customer);
	if (e && e->streams)
		e->streams--;
	pthread_mutex_unlock(&l->lock);
}
