/* quota: per-customer quotas as JSON (the admin API's bodies, the store's
 * column, the config's defaults), the checks admission and the scheduler
 * apply, and the submit-rate token buckets (in memory, one per customer).
 * Everything here is pure or guarded by its own lock: no store, no HTTP. */
#ifndef KILN_QUOTA_H
#define KILN_QUOTA_H

#include <pthread.h>
#include <stdint.h>

#include <jansson.h>

#include "err.h"
#include "store.h"

/* The built-in defaults (README, "kiln-api configuration"); the config's
 * "quotas" object is applied over them. */
void quota_defaults(struct quota *q);

/* Apply the keys present in j (an object) over *q: a partial update. Unknown
 * keys, wrong types and out-of-range values are refused (-1, err code
 * "invalid_request", the message naming the key as "<where>.<key>"); *q is
 * untouched then. where may be "" ("quotas" when NULL). */
int quota_from_json(json_t *j, const char *where, struct quota *q, struct kiln_err *err);

/* The full quota object (new reference). */
json_t *quota_to_json(const struct quota *q);

/* Per-task limits against the quota: 0, or -1 with err code "over_quota" and
 * a message like "limits.memory_mib: 4096 exceeds your quota of 2048". */
int quota_check_task(const struct quota *q, unsigned vcpus, unsigned memory_mib, unsigned timeout_s,
		     unsigned output_mib, struct kiln_err *err);

/* Whether one more task of vcpus/memory_mib may start (be scheduled) for a
 * customer whose tasks now use *u. 1 yes, 0 it must stay queued. */
int quota_allows_start(const struct quota *q, const struct usage *u, unsigned vcpus, unsigned memory_mib);

/* quota_allows_start with the reason: 0, or -1 with err code
 * "quota_exceeded" and a message naming the limit, e.g. "max_running: 4
 * tasks and sessions are running, your quota's limit is 4". For sessions,
 * which are refused rather than queued. */
int quota_check_start(const struct quota *q, const struct usage *u, unsigned vcpus, unsigned memory_mib,
		      struct kiln_err *err);

/* Whether the customer may create one more template, having templates now
 * and having built for build_s_today seconds of the current UTC day: 0, or
 * -1 with err "quota_exceeded" naming max_templates or
 * build_minutes_per_day. (max_template_mib is checked against bytes by the
 * upload: 413.) */
int quota_check_build(const struct quota *q, unsigned templates, double build_s_today, struct kiln_err *err);

/* ---- submit rate: token buckets ---- */

/* One bucket: `burst` tokens, refilled at `rate` per second; a submission
 * takes one. Starts full. */
struct quota_bucket {
	double tokens;
	int64_t last_ms;
	int started;
};

/* Take a token at now_ms (any monotonic millisecond clock: the tests inject
 * one). 1 taken; 0 empty, with *retry_ms (may be NULL) the wait until one
 * is there. rate <= 0 means no limit (always 1). burst 0 counts as 1. */
int quota_bucket_take(struct quota_bucket *b, double rate, unsigned burst, int64_t now_ms, int64_t *retry_ms);

/* Tokens in the bucket at now_ms, without taking any. */
double quota_bucket_peek(const struct quota_bucket *b, double rate, unsigned burst, int64_t now_ms);

/* The buckets of all customers, by customer id; thread-safe. */
struct quota_limiter;
struct quota_limiter *quota_limiter_new(void);
void quota_limiter_free(struct quota_limiter *l);
int quota_limiter_take(struct quota_limiter *l, const char *customer, double rate, unsigned burst, int64_t now_ms,
		       int64_t *retry_ms);
double quota_limiter_peek(struct quota_limiter *l, const char *customer, double rate, unsigned burst,
			  int64_t now_ms);

/* Long-lived requests (event streams, exec streams, wait= polls) of a
 * customer: open counts one more unless max (the quota's max_streams; 0: no
 * limit) are open already. 1 counted, 0 refused (or out of memory). Each 1
 * is paired with exactly one close, on whatever path the request ends.
 * Thread-safe. */
int quota_limiter_stream_open(struct quota_limiter *l, const char *customer, unsigned max);
void quota_limiter_stream_close(struct quota_limiter *l, const char *customer);

#endif
