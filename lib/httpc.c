/* httpc: the HTTP client over libcurl (lib/httpc.h): requests into capped
 * buffers or sinks, JSON, server-sent events, replies read piece by piece. */
#include "httpc.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "clock.h"

/* One connection cache and DNS cache for the whole process: every handle
 * (one-shot requests, streams, S3 calls) takes a kept-alive connection to
 * the same server when one is idle, instead of a new TCP connection per
 * request. libcurl calls these under its own rules; one mutex per kind of
 * shared data. */
static CURLSH *share;
static pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
static pthread_once_t share_once = PTHREAD_ONCE_INIT;

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ctx)
{
	(void)h;
	(void)access;
	(void)ctx;
	pthread_mutex_lock(&share_locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *ctx)
{
	(void)h;
	(void)ctx;
	pthread_mutex_unlock(&share_locks[data]);
}

static void share_init(void)
{
	for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_init(&share_locks[i], NULL);
	share = curl_share_init();
	if (share && (curl_share_setopt(share, CURLSHOPT_LOCKFUNC, share_lock) != CURLSHE_OK ||
		      curl_share_setopt(share, CURLSHOPT_UNLOCKFUNC, share_unlock) != CURLSHE_OK ||
		      curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) != CURLSHE_OK ||
		      curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) != CURLSHE_OK)) {
		curl_share_cleanup(share);
		share = NULL; /* each handle keeps its own cache, as before */
	}
}

CURLcode httpc_set_limits(CURL *h, const struct httpc_limits *l)
{
	CURLcode e = curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);

	pthread_once(&share_once, share_init);
	if (share)
		e |= curl_easy_setopt(h, CURLOPT_SHARE, share);

	if (l->timeout_ms > 0)
		e |= curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, l->timeout_ms);
	if (l->connect_timeout_ms > 0)
		e |= curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, l->connect_timeout_ms);
	if (l->stall_s > 0) {
		e |= curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, l->stall_bytes > 0 ? l->stall_bytes : 1L);
		e |= curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, l->stall_s);
	}
	return e;
}

/* The request's header list (NULL when it has none or out of memory: *oom). */
static struct curl_slist *req_headers(const struct httpc_req *q, int *oom)
{
	struct curl_slist *l = NULL, *t;
	char line[1024];

	*oom = 0;
	if (q->bearer) {
		snprintf(line, sizeof(line), "Authorization: Bearer %s", q->bearer);
		if (!(l = curl_slist_append(l, line)))
			goto oom;
	}
	if (q->content_type) {
		snprintf(line, sizeof(line), "Content-Type: %s", q->content_type);
		if (!(t = curl_slist_append(l, line)))
			goto oom;
		l = t;
	}
	for (const char *const *h = q->headers; h && *h; h++) {
		if (!(t = curl_slist_append(l, *h)))
			goto oom;
		l = t;
	}
	if (q->body || q->body_read) {
		/* No "Expect: 100-continue" round trip before a large body. */
		if (!(t = curl_slist_append(l, "Expect:")))
			goto oom;
		l = t;
	}
	return l;
oom:
	curl_slist_free_all(l);
	*oom = 1;
	return NULL;
}

/* Options common to one-shot requests and streams. */
static CURLcode req_setup(CURL *h, const struct httpc_req *q, struct curl_slist *hdrs)
{
	CURLcode e = curl_easy_setopt(h, CURLOPT_URL, q->url);

	if (q->method)
		e |= curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
	if (hdrs)
		e |= curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	if (q->range)
		e |= curl_easy_setopt(h, CURLOPT_RANGE, q->range);
	if (q->ca_file)
		e |= curl_easy_setopt(h, CURLOPT_CAINFO, q->ca_file);
	e |= httpc_set_limits(h, &q->lim);
	return e;
}

/* ---- one request ---- */

struct httpc {
	CURL *h;
};

struct httpc *httpc_new(void)
{
	struct httpc *c = calloc(1, sizeof(*c));

	if (c && !(c->h = curl_easy_init())) {
		free(c);
		c = NULL;
	}
	return c;
}

void httpc_free(struct httpc *c)
{
	if (!c)
		return;
	curl_easy_cleanup(c->h);
	free(c);
}

void httpc_reply_free(struct httpc_reply *r)
{
	if (r)
		buf_free(&r->body);
}

struct xfer {
	const struct httpc_req *q;
	struct httpc_reply *r;
	CURL *h;
	int too_large;
	int stopped;
	int read_failed;  /* q->body_read refused */
};

/* curl asks for the next piece of a streamed request body. */
static size_t on_read(char *p, size_t size, size_t n, void *arg)
{
	struct xfer *x = arg;
	long got = x->q->body_read(x->q->body_ctx, p, size * n);

	if (got < 0 || (size_t)got > size * n) {
		x->read_failed = 1;
		return CURL_READFUNC_ABORT;
	}
	return (size_t)got;
}

static size_t on_write(char *p, size_t size, size_t n, void *arg)
{
	struct xfer *x = arg;
	size_t total = size * n;

	if (x->q->sink) {
		if (!x->r->status)
			curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->r->status);
		if (x->r->status == 200 || x->r->status == 206) {
			if (x->q->sink(x->q->ctx, p, total)) {
				x->stopped = 1;
				return 0;
			}
			return total;
		}
		/* An error answer: its first bytes say why, the rest is dropped. */
		if (x->r->body.len < HTTPC_ERROR_BODY_MAX)
			buf_add(&x->r->body, p, total < HTTPC_ERROR_BODY_MAX - x->r->body.len ? total
								     : HTTPC_ERROR_BODY_MAX - x->r->body.len);
		return total;
	}
	switch (buf_add(&x->r->body, p, total)) {
	case 0:
		return total;
	case -E2BIG:
		x->too_large = 1;
		return 0;
	default:
		return 0;
	}
}

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
	struct httpc_reply *r = arg;
	size_t len = size * n;

	/* A new status line (after a "100 Continue") starts a new header set. */
	if (len >= 5 && !memcmp(p, "HTTP/", 5)) {
		r->content_type[0] = '\0';
	} else if (len > 13 && !strncasecmp(p, "Content-Type:", 13)) {
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

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
	struct xfer *x = arg;

	if (x->q->tick(x->q->ctx)) {
		x->stopped = 1;
		return 1;
	}
	return 0;
}

int httpc_request(struct httpc *c, const struct httpc_req *q, struct httpc_reply *r)
{
	struct xfer x = { .q = q, .r = r };
	struct curl_slist *hdrs;
	CURLcode e;
	int oom, ret;

	memset(r, 0, sizeof(*r));
	buf_init(&r->body, q->sink ? 0 : q->max_reply ? q->max_reply : HTTPC_REPLY_MAX);
	hdrs = req_headers(q, &oom);
	x.h = c ? c->h : curl_easy_init();
	if (oom || !x.h) {
		snprintf(r->error, sizeof(r->error), "out of memory");
		ret = -ENOMEM;
		goto out;
	}
	if (c)
		curl_easy_reset(x.h); /* keeps the connection cache */
	e = req_setup(x.h, q, hdrs);
	e |= curl_easy_setopt(x.h, CURLOPT_WRITEFUNCTION, on_write);
	e |= curl_easy_setopt(x.h, CURLOPT_WRITEDATA, &x);
	e |= curl_easy_setopt(x.h, CURLOPT_HEADERFUNCTION, on_header);
	e |= curl_easy_setopt(x.h, CURLOPT_HEADERDATA, r);
	if (q->body) {
		e |= curl_easy_setopt(x.h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
		e |= curl_easy_setopt(x.h, CURLOPT_POSTFIELDS, (const char *)q->body);
	} else if (q->body_read) {
		/* POST with a read callback (CUSTOMREQUEST names any other method). */
		e |= curl_easy_setopt(x.h, CURLOPT_POST, 1L);
		e |= curl_easy_setopt(x.h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
		e |= curl_easy_setopt(x.h, CURLOPT_READFUNCTION, on_read);
		e |= curl_easy_setopt(x.h, CURLOPT_READDATA, &x);
	}
	if (q->tick) {
		e |= curl_easy_setopt(x.h, CURLOPT_NOPROGRESS, 0L);
		e |= curl_easy_setopt(x.h, CURLOPT_XFERINFOFUNCTION, on_progress);
		e |= curl_easy_setopt(x.h, CURLOPT_XFERINFODATA, &x);
	}
	if (e != CURLE_OK) {
		snprintf(r->error, sizeof(r->error), "%s", curl_easy_strerror(e));
		ret = -EIO;
		goto out;
	}
	e = curl_easy_perform(x.h);
	if (!r->status)
		curl_easy_getinfo(x.h, CURLINFO_RESPONSE_CODE, &r->status);
	if (x.stopped) {
		ret = 1;
	} else if (x.read_failed) {
		snprintf(r->error, sizeof(r->error), "reading the request body failed");
		ret = -EIO;
	} else if (e == CURLE_OK) {
		ret = 0;
	} else {
		snprintf(r->error, sizeof(r->error), "%s", curl_easy_strerror(e));
		ret = x.too_large ? -E2BIG : e == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT
					 : e == CURLE_OUT_OF_MEMORY ? -ENOMEM : -EIO;
	}
out:
	if (x.h && !c)
		curl_easy_cleanup(x.h);
	curl_slist_free_all(hdrs);
	return ret;
}

int httpc_json(struct httpc *c, const struct httpc_req *q, json_t *body, json_t **reply, struct httpc_reply *r)
{
	struct httpc_req jq = *q;
	char *s = NULL;
	int ret;

	if (reply)
		*reply = NULL;
	if (body) {
		s = json_dumps(body, JSON_COMPACT);
		jq.body = s ? s : "";
		jq.body_len = s ? strlen(s) : 0;
		jq.content_type = "application/json";
	}
	ret = httpc_request(c, &jq, r);
	if (ret == 0 && reply && r->body.len)
		*reply = json_loadb(r->body.p, r->body.len, 0, NULL);
	free(s);
	return ret;
}

/* ---- server-sent events ---- */

void httpc_sse_init(struct httpc_sse *s, size_t max,
		    int (*on_event)(void *ctx, const char *name, const char *data, size_t len),
		    int (*complete)(void *ctx, const char *data, size_t len), void *ctx)
{
	memset(s, 0, sizeof(*s));
	buf_init(&s->line, max);
	buf_init(&s->data, max);
	s->on_event = on_event;
	s->complete = complete;
	s->ctx = ctx;
}

void httpc_sse_free(struct httpc_sse *s)
{
	buf_free(&s->line);
	buf_free(&s->data);
}

/* One complete line (without its "\n"). */
static int sse_line(struct httpc_sse *s, char *l, size_t n)
{
	int rc = 0;

	if (n && l[n - 1] == '\r')
		l[--n] = '\0';
	if (!n) {
		if (s->has_data)
			rc = s->on_event(s->ctx, s->name, s->data.p ? s->data.p : "", s->data.len) ? 1 : 0;
		s->name[0] = '\0';
		s->has_data = 0;
		buf_reset(&s->data);
		return rc;
	}
	if (n >= 6 && !strncmp(l, "event:", 6)) {
		const char *v = l + 6;

		snprintf(s->name, sizeof(s->name), "%s", v + (*v == ' '));
	} else if (n >= 5 && !strncmp(l, "data:", 5)) {
		const char *v = l + 5 + (l[5] == ' ');

		/* A second data line joins the first with "\n". */
		if (s->has_data && (rc = buf_add(&s->data, "\n", 1)) < 0)
			return rc;
		if ((rc = buf_add(&s->data, v, n - (size_t)(v - l))) < 0)
			return rc;
		s->has_data = 1;
		/* Complete already: out at once (the name stays until the blank line). */
		if (s->complete && s->complete(s->ctx, s->data.p, s->data.len)) {
			rc = s->on_event(s->ctx, s->name, s->data.p, s->data.len) ? 1 : 0;
			s->has_data = 0;
			buf_reset(&s->data);
			return rc;
		}
	}
	return 0;
}

int httpc_sse_feed(struct httpc_sse *s, const char *p, size_t n)
{
	while (n) {
		const char *nl = memchr(p, '\n', n);
		size_t k = nl ? (size_t)(nl - p) : n;
		int rc = buf_add(&s->line, p, k);

		if (rc < 0)
			return rc;
		if (!nl)
			return 0;
		p += k + 1;
		n -= k + 1;
		rc = sse_line(s, s->line.p, s->line.len);
		buf_reset(&s->line);
		if (rc)
			return rc;
	}
	return 0;
}

struct follow {
	struct httpc_sse sse;
	const struct httpc_req *q; /* the caller's, for its tick */
	int (*on_event)(void *ctx, const char *name, json_t *data);
	void *ctx;
	json_t *parsed;            /* the data follow_complete found whole */
	int failed;                /* the stream broke the parser's bounds */
	int stopped;               /* on_event stopped: the rest is drained, unread */
	int64_t drain_until_ms;    /* ... until the stream ends or this time */
};

/* kiln's events carry one JSON value each, on one data line, and
 * kiln-host's task streams end an event with a single "\n": an event is
 * complete once its data parses, not only at the blank line. */
static int follow_complete(void *arg, const char *data, size_t len)
{
	struct follow *f = arg;

	json_decref(f->parsed);
	f->parsed = json_loadb(data, len, 0, NULL);
	return f->parsed != NULL;
}

static int follow_event(void *arg, const char *name, const char *data, size_t len)
{
	struct follow *f = arg;
	json_t *d = f->parsed ? f->parsed : json_loadb(data, len, 0, NULL);
	int stop = 0;

	f->parsed = NULL;
	if (d && name[0])
		stop = f->on_event(f->ctx, name, d);
	json_decref(d);
	return stop;
}

static int follow_sink(void *arg, const char *p, size_t n)
{
	struct follow *f = arg;
	int rc;

	if (f->stopped)
		return 0; /* draining to the stream's end */
	rc = httpc_sse_feed(&f->sse, p, n);
	if (rc < 0)
		f->failed = rc; /* an absurd line: drop the stream */
	if (rc > 0 && f->q->drain_ms > 0) {
		f->stopped = 1;
		f->drain_until_ms = clock_mono_ms() + f->q->drain_ms;
		return 0;
	}
	return rc;
}

static int follow_tick(void *arg)
{
	struct follow *f = arg;

	if (f->stopped && clock_mono_ms() >= f->drain_until_ms)
		return 1;
	return f->q->tick ? f->q->tick(f->q->ctx) : 0;
}

int httpc_follow(struct httpc *c, const struct httpc_req *q,
		 int (*on_event)(void *ctx, const char *name, json_t *data), void *ctx, struct httpc_reply *r)
{
	struct follow f = { .q = q, .on_event = on_event, .ctx = ctx };
	struct httpc_req fq = *q;
	int ret;

	httpc_sse_init(&f.sse, q->max_reply ? q->max_reply : HTTPC_REPLY_MAX, follow_event, follow_complete, &f);
	fq.sink = follow_sink;
	fq.tick = q->tick || q->drain_ms > 0 ? follow_tick : NULL;
	fq.ctx = &f;
	ret = httpc_request(c, &fq, r);
	if (f.stopped)
		ret = 1; /* stopped by on_event: the rest (its end, or a failure) was only drained */
	if (f.failed) {
		/* As if the write had failed: the stream is dropped, not stopped. */
		snprintf(r->error, sizeof(r->error), "%s", curl_easy_strerror(CURLE_WRITE_ERROR));
		ret = f.failed;
	}
	httpc_sse_free(&f.sse);
	json_decref(f.parsed);
	return ret;
}

/* ---- a reply read piece by piece ---- */

#define STREAM_PENDING_MAX (8u << 20)

struct httpc_stream {
	CURLM *m;
	CURL *h;
	struct curl_slist *hdrs;
	struct buf pending;       /* received, not yet read */
	size_t off;               /* read from pending so far */
	int done;                 /* the transfer has finished ... */
	CURLcode result;          /* ... with this */
};

static size_t stream_collect(char *p, size_t size, size_t n, void *arg)
{
	struct httpc_stream *s = arg;

	if (s->off && s->off == s->pending.len) {
		buf_reset(&s->pending);
		s->off = 0;
	}
	return buf_add(&s->pending, p, size * n) < 0 ? 0 : size * n;
}

int httpc_stream_open(const struct httpc_req *q, struct httpc_stream **out)
{
	struct httpc_stream *s = calloc(1, sizeof(*s));
	CURLcode e;
	int oom;

	*out = NULL;
	if (!s || !(s->m = curl_multi_init()) || !(s->h = curl_easy_init()))
		goto oom;
	buf_init(&s->pending, STREAM_PENDING_MAX);
	s->hdrs = req_headers(q, &oom);
	if (oom)
		goto oom;
	e = req_setup(s->h, q, s->hdrs);
	e |= curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, stream_collect);
	e |= curl_easy_setopt(s->h, CURLOPT_WRITEDATA, s);
	if (q->body) {
		e |= curl_easy_setopt(s->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
		e |= curl_easy_setopt(s->h, CURLOPT_COPYPOSTFIELDS, (const char *)q->body);
	}
	if (e != CURLE_OK || curl_multi_add_handle(s->m, s->h) != CURLM_OK) {
		httpc_stream_close(s);
		return -EIO;
	}
	*out = s;
	return 0;
oom:
	httpc_stream_close(s);
	return -ENOMEM;
}

static void stream_reap(struct httpc_stream *s)
{
	CURLMsg *msg;
	int running = 0, left;

	curl_multi_perform(s->m, &running);
	while ((msg = curl_multi_info_read(s->m, &left)))
		if (msg->msg == CURLMSG_DONE) {
			s->done = 1;
			s->result = msg->data.result;
		}
}

/* Advance the transfer, waiting at most wait_ms for something to happen. */
static void stream_step(struct httpc_stream *s, long wait_ms)
{
	if (s->done)
		return;
	stream_reap(s);
	if (!s->done && s->pending.len == s->off && wait_ms > 0) {
		curl_multi_poll(s->m, NULL, 0, (int)wait_ms, NULL);
		stream_reap(s);
	}
}

int httpc_stream_status(struct httpc_stream *s, long timeout_ms)
{
	int64_t deadline = clock_mono_ms() + timeout_ms;
	long status = 0;

	for (;;) {
		curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
		if (status > 0)
			return (int)status;
		if (s->done)
			return -EIO;
		if (clock_mono_ms() >= deadline)
			return -ETIMEDOUT;
		stream_step(s, (long)(deadline - clock_mono_ms()));
	}
}

long httpc_stream_read(struct httpc_stream *s, char *buf, size_t max, long wait_ms)
{
	int64_t deadline = clock_mono_ms() + wait_ms;

	for (;;) {
		size_t n = s->pending.len - s->off;

		if (n) {
			if (n > max)
				n = max;
			memcpy(buf, s->pending.p + s->off, n);
			s->off += n;
			return (long)n;
		}
		if (s->done)
			return s->result == CURLE_OK ? -ENODATA : -EIO;
		if (clock_mono_ms() >= deadline)
			return 0;
		stream_step(s, (long)(deadline - clock_mono_ms()));
	}
}

const char *httpc_stream_content_type(struct httpc_stream *s)
{
	char *ct = NULL;

	return curl_easy_getinfo(s->h, CURLINFO_CONTENT_TYPE, &ct) == CURLE_OK && ct ? ct : "";
}

const char *httpc_stream_header(struct httpc_stream *s, const char *name)
{
	struct curl_header *h = NULL;

	return curl_easy_header(s->h, name, 0, CURLH_HEADER, -1, &h) == CURLHE_OK && h && h->value ? h->value : "";
}

const char *httpc_stream_error(const struct httpc_stream *s)
{
	return curl_easy_strerror(s->result ? s->result : CURLE_GOT_NOTHING);
}

void httpc_stream_close(struct httpc_stream *s)
{
	if (!s)
		return;
	if (s->m && s->h)
		curl_multi_remove_handle(s->m, s->h);
	curl_easy_cleanup(s->h);
	curl_multi_cleanup(s->m);
	curl_slist_free_all(s->hdrs);
	buf_free(&s->pending);
	free(s);
}
