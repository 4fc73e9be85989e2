/* hostclient: requests to kiln-host daemons, their event streams, raw
 * bodies, and streamed replies relayed piece by piece. */
#include "hostclient.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <strings.h>

#define REPLY_MAX (64u << 20)    /* a task JSON carries stdout/stderr */
#define EVENT_LINE_MAX (4u << 20)

struct buf {
	char *p;
	size_t len, cap;
	int overflow;
};

static int buf_add(struct buf *b, const char *p, size_t n, size_t max)
{
	if (b->len + n + 1 > max) {
		b->overflow = 1;
		return -1;
	}
	if (b->len + n + 1 > b->cap) {
		size_t cap = (b->len + n + 1) * 2;
		char *q = realloc(b->p, cap);

		if (!q)
			return -1;
		b->p = q;
		b->cap = cap;
	}
	memcpy(b->p + b->len, p, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

static size_t collect(char *p, size_t size, size_t n, void *ctx)
{
	return buf_add(ctx, p, size * n, REPLY_MAX) < 0 ? 0 : size * n;
}

static struct curl_slist *headers(const char *token, int json)
{
	char auth[600];
	struct curl_slist *h = NULL;

	snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token);
	h = curl_slist_append(h, auth);
	if (json)
		h = curl_slist_append(h, "Content-Type: application/json");
	return h;
}

int hostclient_call(const char *base, const char *token, const char *method, const char *path, json_t *body,
		    long timeout_ms, json_t **reply, struct kiln_err *err)
{
	CURL *c = curl_easy_init();
	struct curl_slist *h = headers(token, body != NULL);
	struct buf b = { 0 };
	char url[1024], *s = NULL;
	long status = -1;
	CURLcode rc;

	if (reply)
		*reply = NULL;
	if (!c) {
		curl_slist_free_all(h);
		return kiln_err_set(err, "host_unreachable", "out of memory");
	}
	snprintf(url, sizeof(url), "%s%s", base, path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms < 2000 ? timeout_ms : 2000L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	if (body) {
		s = json_dumps(body, JSON_COMPACT);
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, s ? s : "");
	}
	rc = curl_easy_perform(c);
	if (rc == CURLE_OK) {
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
		if (reply && b.p)
			*reply = json_loadb(b.p, b.len, 0, NULL);
	} else {
		kiln_err_set(err, "host_unreachable", "%s %s: %s", method, url, curl_easy_strerror(rc));
		status = -1;
	}
	free(s);
	free(b.p);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	return (int)status;
}

/* ---- raw bodies ---- */

struct raw_ctx {
	struct buf b;
	size_t max;
	char content_type[128];
};

static size_t raw_collect(char *p, size_t size, size_t n, void *arg)
{
	struct raw_ctx *r = arg;

	return buf_add(&r->b, p, size * n, r->max) < 0 ? 0 : size * n;
}

static size_t raw_header(char *p, size_t size, size_t n, void *arg)
{
	struct raw_ctx *r = arg;
	size_t len = size * n;

	if (len > 13 && !strncasecmp(p, "Content-Type:", 13)) {
		const char *v = p + 13;
		size_t vl = len - 13;

		while (vl && (*v == ' ' || *v == '\t'))
			v++, vl--;
		while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
			vl--;
		snprintf(r->content_type, sizeof(r->content_type), "%.*s", (int)vl, v);
	}
	return len;
}

int hostclient_raw(const char *base, const char *token, const char *method, const char *path, const void *body,
		   size_t len, const char *content_type, long timeout_ms, size_t max_reply, struct hostclient_reply *r,
		   struct kiln_err *err)
{
	CURL *c = curl_easy_init();
	struct curl_slist *h = headers(token, 0);
	struct raw_ctx rc = { .max = max_reply + 1 };
	char url[8192], ct[160];
	CURLcode cr;

	memset(r, 0, sizeof(*r));
	r->status = -1;
	if (!c) {
		curl_slist_free_all(h);
		return kiln_err_set(err, "host_unreachable", "out of memory");
	}
	if (content_type) {
		snprintf(ct, sizeof(ct), "Content-Type: %s", content_type);
		h = curl_slist_append(h, ct);
	}
	/* No "Expect: 100-continue" round trip before a large body. */
	h = curl_slist_append(h, "Expect:");
	snprintf(url, sizeof(url), "%s%s", base, path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, raw_collect);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &rc);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, raw_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, &rc);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms < 2000 ? timeout_ms : 2000L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	if (body) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, (const char *)body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
	}
	cr = curl_easy_perform(c);
	if (cr == CURLE_OK) {
		long status = 0;

		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
		r->status = (int)status;
		r->body = rc.b.p;
		r->len = rc.b.len;
		rc.b.p = NULL;
		snprintf(r->content_type, sizeof(r->content_type), "%s", rc.content_type);
	} else if (rc.b.overflow) {
		kiln_err_set(err, "host_error", "%s %s: the reply is larger than %zu bytes", method, url, max_reply);
	} else {
		kiln_err_set(err, "host_unreachable", "%s %s: %s", method, url, curl_easy_strerror(cr));
	}
	free(rc.b.p);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	return r->status;
}

void hostclient_reply_free(struct hostclient_reply *r)
{
	if (!r)
		return;
	free(r->body);
	r->body = NULL;
	r->len = 0;
}

/* ---- streamed replies ---- */

#define STREAM_PENDING_MAX (8u << 20)

struct hostclient_stream {
	CURLM *m;
	CURL *c;
	struct curl_slist *h;
	char *req;                /* the request body */
	struct buf pending;       /* received, not yet read */
	size_t off;               /* read from pending so far */
	int done;                 /* the transfer has finished ... */
	CURLcode result;          /* ... with this */
	char url[1024];
};

static size_t stream_collect(char *p, size_t size, size_t n, void *arg)
{
	struct hostclient_stream *s = arg;

	if (s->off && s->off == s->pending.len)
		s->off = s->pending.len = 0;
	return buf_add(&s->pending, p, size * n, STREAM_PENDING_MAX) < 0 ? 0 : size * n;
}

struct hostclient_stream *hostclient_stream_open(const char *base, const char *token, const char *method,
						 const char *path, json_t *body, struct kiln_err *err)
{
	struct hostclient_stream *s = calloc(1, sizeof(*s));

	if (!s || !(s->m = curl_multi_init()) || !(s->c = curl_easy_init())) {
		hostclient_stream_close(s);
		kiln_err_set(err, "host_unreachable", "out of memory");
		return NULL;
	}
	s->h = headers(token, body != NULL);
	snprintf(s->url, sizeof(s->url), "%s%s", base, path);
	curl_easy_setopt(s->c, CURLOPT_URL, s->url);
	curl_easy_setopt(s->c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(s->c, CURLOPT_HTTPHEADER, s->h);
	curl_easy_setopt(s->c, CURLOPT_WRITEFUNCTION, stream_collect);
	curl_easy_setopt(s->c, CURLOPT_WRITEDATA, s);
	curl_easy_setopt(s->c, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
	curl_easy_setopt(s->c, CURLOPT_NOSIGNAL, 1L);
	if (body) {
		s->req = json_dumps(body, JSON_COMPACT);
		curl_easy_setopt(s->c, CURLOPT_POSTFIELDS, s->req ? s->req : "");
	}
	if (curl_multi_add_handle(s->m, s->c) != CURLM_OK) {
		hostclient_stream_close(s);
		kiln_err_set(err, "host_unreachable", "cannot start the request");
		return NULL;
	}
	return s;
}

/* Advance the transfer, waiting at most wait_ms for something to happen. */
static void stream_step(struct hostclient_stream *s, long wait_ms)
{
	CURLMsg *msg;
	int running = 0, left;

	if (s->done)
		return;
	curl_multi_perform(s->m, &running);
	while ((msg = curl_multi_info_read(s->m, &left)))
		if (msg->msg == CURLMSG_DONE) {
			s->done = 1;
			s->result = msg->data.result;
		}
	if (!s->done && s->pending.len == s->off && wait_ms > 0) {
		curl_multi_poll(s->m, NULL, 0, (int)wait_ms, NULL);
		curl_multi_perform(s->m, &running);
		while ((msg = curl_multi_info_read(s->m, &left)))
			if (msg->msg == CURLMSG_DONE) {
				s->done = 1;
				s->result = msg->data.result;
			}
	}
}

static long mono_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int hostclient_stream_status(struct hostclient_stream *s, long timeout_ms, struct kiln_err *err)
{
	long deadline = mono_now_ms() + timeout_ms, status = 0;

	for (;;) {
		curl_easy_getinfo(s->c, CURLINFO_RESPONSE_CODE, &status);
		if (status > 0)
			return (int)status;
		if (s->done)
			return kiln_err_set(err, "host_unreachable", "%s: %s", s->url,
					    curl_easy_strerror(s->result ? s->result : CURLE_GOT_NOTHING));
		if (mono_now_ms() >= deadline)
			return kiln_err_set(err, "host_unreachable", "%s: no answer in %ld ms", s->url, timeout_ms);
		stream_step(s, deadline - mono_now_ms());
	}
}

long hostclient_stream_read(struct hostclient_stream *s, char *buf, size_t max, long wait_ms, struct kiln_err *err)
{
	long deadline = mono_now_ms() + wait_ms;

	for (;;) {
		size_t n = s->pending.len - s->off;

		if (n) {
			if (n > max)
				n = max;
			memcpy(buf, s->pending.p + s->off, n);
			s->off += n;
			return (long)n;
		}
		if (s->done) {
			if (s->result == CURLE_OK)
				return -1;
			kiln_err_set(err, "host_unreachable", "%s: %s", s->url, curl_easy_strerror(s->result));
			return -2;
		}
		if (mono_now_ms() >= deadline)
			return 0;
		stream_step(s, deadline - mono_now_ms());
	}
}

void hostclient_stream_close(struct hostclient_stream *s)
{
	if (!s)
		return;
	if (s->m && s->c)
		curl_multi_remove_handle(s->m, s->c);
	curl_easy_cleanup(s->c);
	curl_multi_cleanup(s->m);
	curl_slist_free_all(s->h);
	free(s->req);
	free(s->pending.p);
	free(s);
}

struct follow {
	struct buf line;
	char name[64];
	int (*on_event)(void *ctx, const char *name, json_t *data);
	void *ctx;
	int stopped;
};

/* Server-sent events: "event: NAME" then "data: JSON" then a blank line. */
static size_t follow_write(char *p, size_t size, size_t n, void *arg)
{
	struct follow *f = arg;
	size_t total = size * n;

	for (size_t i = 0; i < total; i++) {
		if (p[i] != '\n') {
			if (buf_add(&f->line, p + i, 1, EVENT_LINE_MAX) < 0)
				return 0; /* an absurd line: drop the stream */
			continue;
		}
		if (f->line.len >= 7 && !strncmp(f->line.p, "event: ", 7)) {
			snprintf(f->name, sizeof(f->name), "%s", f->line.p + 7);
		} else if (f->line.len >= 6 && !strncmp(f->line.p, "data: ", 6)) {
			json_t *d = json_loadb(f->line.p + 6, f->line.len - 6, 0, NULL);

			if (d && f->name[0] && f->on_event(f->ctx, f->name, d)) {
				json_decref(d);
				f->stopped = 1;
				return 0;
			}
			json_decref(d);
		}
		f->line.len = 0;
	}
	return total;
}

int hostclient_follow(const char *base, const char *token, const char *task_id, long stall_s,
		      int (*on_event)(void *ctx, const char *name, json_t *data), void *ctx, struct kiln_err *err)
{
	CURL *c = curl_easy_init();
	struct curl_slist *h = headers(token, 0);
	struct follow f = { .on_event = on_event, .ctx = ctx };
	char url[1024];
	long status = 0;
	CURLcode rc;

	if (!c) {
		curl_slist_free_all(h);
		return kiln_err_set(err, "host_unreachable", "out of memory");
	}
	snprintf(url, sizeof(url), "%s/v1/tasks/%s/events", base, task_id);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, follow_write);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &f);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
	/* The host sends a keep-alive every 15 s: silence beyond stall_s is a dead host. */
	curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, stall_s);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	rc = curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	free(f.line.p);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	if (f.stopped)
		return 1;
	if (rc != CURLE_OK)
		return kiln_err_set(err, "host_unreachable", "events of %s: %s", task_id, curl_easy_strerror(rc));
	if (status != 200)
		return kiln_err_set(err, status == 404 ? "not_found" : "host_error", "events of %s: HTTP %ld", task_id,
				    status);
	return 0;
}
