/* fake_host_ops: a struct host_ops (api/hostcall/host_ops.h) for unit tests of
 * kiln-api's scheduler and sessions, answering from a table of rules
 * (method, host URL, path prefix -> status and JSON body; status -1: the
 * host cannot be reached) and recording every call; and a kiln_clock the
 * test moves by hand (wall = the real wall clock + an offset, because the
 * store stamps heartbeats and sessions with the real one; monotonic: a
 * number). Header-only, thread-safe (watchers and enders call it from
 * their own threads). */
#ifndef KILN_TEST_FAKE_HOST_OPS_H
#define KILN_TEST_FAKE_HOST_OPS_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "host_ops.h"

#define FAKE_MAX_RULES 64
#define FAKE_MAX_CALLS 1024

struct fake_rule {
	char method[8];
	char url[64];                /* "" any host */
	char path[128];              /* a prefix */
	int status;
	char body[512];
};

struct fake_call {
	char method[8], url[64], path[160];
	char body[1024];             /* the request body (JSON text), truncated; "" none */
};

struct fake_host {
	pthread_mutex_t lock;
	struct fake_rule rules[FAKE_MAX_RULES];
	int nrules;
	struct fake_call calls[FAKE_MAX_CALLS];
	int ncalls;
	int final_event;             /* fake_follow: a final state event carrying the task */
};

static struct fake_host fake = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void fake_reset(void)
{
	pthread_mutex_lock(&fake.lock);
	fake.nrules = fake.ncalls = 0;
	fake.final_event = 0;
	pthread_mutex_unlock(&fake.lock);
}

/* Answer method url path* with status and body (NULL: none). The rule
 * added last wins. */
static void fake_rule(const char *method, const char *url, const char *path, int status, const char *body)
{
	struct fake_rule *r;

	pthread_mutex_lock(&fake.lock);
	if (fake.nrules < FAKE_MAX_RULES) {
		r = &fake.rules[fake.nrules++];
		snprintf(r->method, sizeof(r->method), "%s", method);
		snprintf(r->url, sizeof(r->url), "%s", url ? url : "");
		snprintf(r->path, sizeof(r->path), "%s", path);
		r->status = status;
		snprintf(r->body, sizeof(r->body), "%s", body ? body : "");
	}
	pthread_mutex_unlock(&fake.lock);
}

/* How many calls matched method url path* (url NULL: any). */
__attribute__((unused)) static int fake_count(const char *method, const char *url, const char *path)
{
	int n = 0;

	pthread_mutex_lock(&fake.lock);
	for (int i = 0; i < fake.ncalls; i++)
		n += !strcmp(fake.calls[i].method, method) && (!url || !strcmp(fake.calls[i].url, url)) &&
		     !strncmp(fake.calls[i].path, path, strlen(path));
	pthread_mutex_unlock(&fake.lock);
	return n;
}

/* The URL of the i-th call matching method path* (NULL when none). */
__attribute__((unused)) static const char *fake_nth_url(const char *method, const char *path, int nth)
{
	const char *u = NULL;

	pthread_mutex_lock(&fake.lock);
	for (int i = 0; i < fake.ncalls && !u; i++)
		if (!strcmp(fake.calls[i].method, method) && !strncmp(fake.calls[i].path, path, strlen(path)) && !nth--)
			u = fake.calls[i].url;
	pthread_mutex_unlock(&fake.lock);
	return u;
}

/* The body of the i-th call matching method path* ("" when none). */
__attribute__((unused)) static const char *fake_nth_body(const char *method, const char *path, int nth)
{
	const char *b = "";

	pthread_mutex_lock(&fake.lock);
	for (int i = 0; i < fake.ncalls; i++)
		if (!strcmp(fake.calls[i].method, method) && !strncmp(fake.calls[i].path, path, strlen(path)) && !nth--) {
			b = fake.calls[i].body;
			break;
		}
	pthread_mutex_unlock(&fake.lock);
	return b;
}

/* Record the call (with req, len bytes of its body), find its rule: the
 * status (404 when no rule), its body copied into body (cap bytes). */
static int fake_answer_req(const char *method, const char *url, const char *path, const void *req, size_t len,
			   char *body, size_t cap)
{
	int st = 404;

	body[0] = '\0';
	pthread_mutex_lock(&fake.lock);
	if (fake.ncalls < FAKE_MAX_CALLS) {
		struct fake_call *c = &fake.calls[fake.ncalls++];

		snprintf(c->method, sizeof(c->method), "%s", method);
		snprintf(c->url, sizeof(c->url), "%s", url);
		snprintf(c->path, sizeof(c->path), "%s", path);
		snprintf(c->body, sizeof(c->body), "%.*s", (int)(req ? len : 0), req ? (const char *)req : "");
	}
	for (int i = fake.nrules - 1; i >= 0; i--) {
		struct fake_rule *r = &fake.rules[i];

		if (!strcmp(r->method, method) && (!r->url[0] || !strcmp(r->url, url)) &&
		    !strncmp(path, r->path, strlen(r->path))) {
			st = r->status;
			snprintf(body, cap, "%s", r->body);
			break;
		}
	}
	pthread_mutex_unlock(&fake.lock);
	return st;
}

static int fake_call(void *ctx, const char *base, const char *token, const char *method, const char *path,
		     json_t *body, long timeout_ms, json_t **reply, struct kiln_err *err)
{
	char b[512], *req = body ? json_dumps(body, JSON_COMPACT) : NULL;
	int st = fake_answer_req(method, base, path, req, req ? strlen(req) : 0, b, sizeof(b));

	free(req);
	if (reply)
		*reply = NULL;
	if (st < 0) {
		kiln_err_set(err, KERR_HOST_UNREACHABLE, "fake: %s cannot be reached", base);
		return -1;
	}
	if (reply && b[0])
		*reply = json_loads(b, 0, NULL);
	return st;
}

static int fake_follow(void *ctx, const char *base, const char *token, const char *task_id, long stall_s,
		       int (*on_event)(void *ev_ctx, const char *name, json_t *data), void *ev_ctx,
		       struct kiln_err *err)
{
	json_t *data;
	int final;

	pthread_mutex_lock(&fake.lock);
	final = fake.final_event;
	pthread_mutex_unlock(&fake.lock);
	if (!final)
		return 0; /* the stream ends at once: the watcher GETs the task next */
	/* As kiln-host does: the final state's event carries the task. */
	data = json_pack("{s:s, s:I, s:{s:s, s:s, s:{s:s, s:s, s:i}}}", "state", "succeeded", "at", (json_int_t)1, "task",
			 "id", task_id, "state", "succeeded", "result", "state", "succeeded", "end_reason", "exited",
			 "exit_code", 0);
	on_event(ev_ctx, "state", data);
	json_decref(data);
	return 0;
}

static int fake_raw(void *ctx, const char *base, const char *token, const char *method, const char *path,
		    const void *body, size_t len, const char *content_type, long timeout_ms, size_t max_reply,
		    struct hostclient_reply *r, struct kiln_err *err)
{
	char b[512];
	int st = fake_answer_req(method, base, path, body, len, b, sizeof(b));

	memset(r, 0, sizeof(*r));
	r->status = st;
	if (st < 0) {
		kiln_err_set(err, KERR_HOST_UNREACHABLE, "fake: %s cannot be reached", base);
		return -1;
	}
	if (b[0]) {
		r->body = strdup(b);
		r->len = strlen(b);
		snprintf(r->content_type, sizeof(r->content_type), "application/json");
	}
	return st;
}

static struct hostclient_stream *fake_stream_open(void *ctx, const char *base, const char *token,
						  const char *method, const char *path, json_t *body,
						  struct kiln_err *err)
{
	kiln_err_set(err, KERR_HOST_UNREACHABLE, "fake: no streams");
	return NULL;
}

static int fake_stream_status(void *ctx, struct hostclient_stream *h, long timeout_ms, struct kiln_err *err)
{
	kiln_err_set(err, KERR_HOST_UNREACHABLE, "fake: no streams");
	return -1;
}

static long fake_stream_read(void *ctx, struct hostclient_stream *h, char *buf, size_t max, long wait_ms,
			     struct kiln_err *err)
{
	return -1;
}

static void fake_stream_close(void *ctx, struct hostclient_stream *h)
{
}

static const struct host_ops fake_ops = {
	.call = fake_call,
	.follow = fake_follow,
	.raw = fake_raw,
	.stream_open = fake_stream_open,
	.stream_status = fake_stream_status,
	.stream_read = fake_stream_read,
	.stream_close = fake_stream_close,
};

/* ---- the hand-moved clock ---- */

static int64_t fake_wall_off, fake_mono = 1000000;

static int64_t fake_wall_ms(void *ctx)
{
	return clock_wall_ms() + __atomic_load_n(&fake_wall_off, __ATOMIC_SEQ_CST);
}

static int64_t fake_mono_ms(void *ctx)
{
	return __atomic_load_n(&fake_mono, __ATOMIC_SEQ_CST);
}

static const struct kiln_clock fake_clock = { fake_wall_ms, fake_mono_ms, NULL };

__attribute__((unused)) static void clock_advance(int64_t ms)
{
	__atomic_add_fetch(&fake_wall_off, ms, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&fake_mono, ms, __ATOMIC_SEQ_CST);
}

__attribute__((unused)) static void clock_reset(void)
{
	__atomic_store_n(&fake_wall_off, 0, __ATOMIC_SEQ_CST);
}

/* Sleep a few milliseconds of real time (waiting for a watcher or ender
 * thread, polled with a deadline by the tests). */
__attribute__((unused)) static void real_nap(void)
{
	struct timespec ts = { 0, 5 * 1000000L };

	nanosleep(&ts, NULL);
}

#endif
