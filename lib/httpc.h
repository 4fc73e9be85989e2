/* httpc: kiln's one HTTP client, over libcurl. A request (method, URL, bearer
 * token, body, timeouts) whose reply lands in a capped struct buf or goes to
 * a sink as it arrives; JSON in and out; a server-sent event stream followed
 * with a callback per event; and a reply read piece by piece (curl's multi
 * interface) for relaying. Used by kiln-api's host client, kiln-host's
 * heartbeat and the CLI; lib/s3.c shares httpc_set_limits, which also puts
 * every handle on the process's one connection and DNS cache (kept-alive
 * connections are reused across requests and threads). httpc reports
 * failures as negative errno plus curl's words; the wording the user sees
 * (and the error code) stays with each caller. */
#ifndef KILN_HTTPC_H
#define KILN_HTTPC_H

#include <stddef.h>

#include <curl/curl.h>
#include <jansson.h>

#include "buf.h"

#define HTTPC_REPLY_MAX (64u << 20)     /* default cap of a reply kept in memory */
#define HTTPC_ERROR_BODY_MAX (1u << 20) /* kept of a non-200/206 body while a sink takes the 200/206 ones */

/* How long a transfer may take. Zero fields leave curl's default (none). */
struct httpc_limits {
	long timeout_ms;         /* the whole transfer */
	long connect_timeout_ms; /* connecting */
	long stall_s;            /* fail when slower than stall_bytes per second for this long */
	long stall_bytes;        /* 0 with stall_s: 1 byte/s */
};

/* Apply l to a curl handle, plus what every kiln transfer sets (no
 * signals: callers are threaded). The ORed CURLcode of the setopts. */
CURLcode httpc_set_limits(CURL *h, const struct httpc_limits *l);

/* One request. Everything is borrowed for the duration of the call. */
struct httpc_req {
	const char *method;       /* NULL: GET */
	const char *url;
	const char *bearer;       /* sent as "Authorization: Bearer ..."; NULL: none */
	const char *content_type; /* of the body; NULL: no header */
	const void *body;         /* NULL: no body at all; else body_len bytes (no "Expect: 100-continue") */
	size_t body_len;
	/* Instead of body: a body of body_len bytes (sent as Content-Length)
	 * read piece by piece as the transfer goes, so that a large file is
	 * streamed, never held in memory. body_read copies at most n bytes into
	 * p and returns how many (0 only at the end), or < 0 to abort: the
	 * request then returns -EIO ("reading the request body failed"). A
	 * request with a body_read has no retry or rewind: one attempt. */
	long (*body_read)(void *body_ctx, char *p, size_t n);
	void *body_ctx;
	const char *range;        /* "100-": a Range request; NULL: none */
	/* PEM file of the CA(s) that verify an https:// server, in place of
	 * the system's; NULL: the system's. Per request, so that calls to
	 * kiln's own daemons (a private CA) and to S3 (a public one) share the
	 * process and its connection cache. */
	const char *ca_file;
	const char *const *headers; /* more "Name: value" lines, NULL-terminated; NULL: none */
	struct httpc_limits lim;
	size_t max_reply;         /* cap of the reply body (0: HTTPC_REPLY_MAX); of one event in a follow */
	/* With a sink, a 200/206 body goes to sink as it arrives (nonzero
	 * return: stop), and of any other status the first
	 * HTTPC_ERROR_BODY_MAX bytes are kept in the reply. */
	int (*sink)(void *ctx, const char *p, size_t n);
	/* Called several times a second while the transfer runs (progress
	 * displays); nonzero stops it. NULL: none. */
	int (*tick)(void *ctx);
	void *ctx;                /* for sink and tick */
	/* httpc_follow only: once on_event has stopped, read on (events
	 * ignored) for up to drain_ms while the server ends its stream, so that
	 * the connection is kept alive for the next request instead of closed
	 * with the transfer. 0: stop at once. The wait is checked by curl's
	 * progress calls, so a server that does not end its stream holds the
	 * call up to about a second whatever drain_ms is. */
	long drain_ms;
};

/* What came back. httpc_request initialises it; release with
 * httpc_reply_free whatever the call returned. */
struct httpc_reply {
	long status;             /* the HTTP status; 0 when none came (a failed
				  * transfer may have had one before failing) */
	struct buf body;         /* the body (or, with a sink, a non-200/206 one) */
	char content_type[128];  /* "" when the server sent none */
	char error[128];         /* curl's words when the call returned < 0 */
};

void httpc_reply_free(struct httpc_reply *r);

/* A handle kept across requests, so that they reuse the connection
 * (kiln-host's heartbeat). One thread at a time. NULL when out of memory. */
struct httpc *httpc_new(void);
void httpc_free(struct httpc *c);

/* Perform q on c (NULL: a handle for this call only; any thread). Returns 0
 * when an answer came (r->status), 1 when the sink or tick stopped it, or
 * -ETIMEDOUT (including a stall), -E2BIG (the reply exceeded its cap),
 * -ENOMEM, -EIO (anything else), with curl's words in r->error. */
int httpc_request(struct httpc *c, const struct httpc_req *q, struct httpc_reply *r);

/* httpc_request with a JSON body (body may be NULL: q->body is sent, if
 * any; else body is sent compact with Content-Type: application/json) and
 * the reply parsed as JSON into *reply when it is JSON (else NULL; caller
 * decrefs). Same returns. */
int httpc_json(struct httpc *c, const struct httpc_req *q, json_t *body, json_t **reply, struct httpc_reply *r);

/* ---- server-sent events ---- */

/* The parser: lines end in "\n" (a "\r" before it is dropped); "event:" names
 * the event, "data:" lines (joined by "\n") carry it, ":" lines are comments,
 * a blank line dispatches an event that had data, and so does a data line
 * after which `complete` (optional) says the data is whole (the name is then
 * kept until the blank line). One space after the colon is dropped. The name
 * is "" when the event had none. */
struct httpc_sse {
	struct buf line;  /* the line being read */
	struct buf data;  /* the event's data so far */
	char name[64];
	int has_data;     /* a "data:" line came since the last event */
	int (*on_event)(void *ctx, const char *name, const char *data, size_t len);
	int (*complete)(void *ctx, const char *data, size_t len);
	void *ctx;
};

/* A parser whose lines and events are at most max bytes (0: unbounded).
 * on_event returns nonzero to stop; complete (may be NULL) nonzero when the
 * event's data so far is whole. Both get ctx. */
void httpc_sse_init(struct httpc_sse *s, size_t max,
		    int (*on_event)(void *ctx, const char *name, const char *data, size_t len),
		    int (*complete)(void *ctx, const char *data, size_t len), void *ctx);

/* Feed n bytes, cut anywhere. 0, 1 when on_event stopped (the rest of p is
 * not looked at), -E2BIG for a line or event over max, -ENOMEM. */
int httpc_sse_feed(struct httpc_sse *s, const char *p, size_t n);
void httpc_sse_free(struct httpc_sse *s);

/* Follow q (its sink is replaced) as server-sent events: on_event gets each
 * named event's name and data parsed as JSON (events without a name or
 * whose data is not JSON are skipped; data is the callback's to incref). An
 * event goes out as soon as its data lines parse as JSON: kiln-host's task
 * streams end events with one "\n", not a blank line.
 * Returns as httpc_request: 0 when the stream ended (r->status; a non-200
 * answer's body in r->body), 1 when on_event or q->tick stopped it (also
 * when the stream ended within q->drain_ms after on_event stopped), < 0 when
 * it failed or stalled (r->error). */
int httpc_follow(struct httpc *c, const struct httpc_req *q,
		 int (*on_event)(void *ctx, const char *name, json_t *data), void *ctx, struct httpc_reply *r);

/* ---- a reply read piece by piece ----
 * The transfer advances only inside these calls (curl's multi interface), so
 * the caller sets the pace: one thread, no buffering beyond one read. */
struct httpc_stream;

/* Start q (sink, tick, max_reply and body_read unused; the body is copied). 0 with *out
 * set, -ENOMEM, or -EIO when curl cannot start it. */
int httpc_stream_open(const struct httpc_req *q, struct httpc_stream **out);

/* Wait (at most timeout_ms) until the reply's status is known: the status,
 * -ETIMEDOUT when none came in time, -EIO when the transfer ended without one
 * (httpc_stream_error says why). */
int httpc_stream_status(struct httpc_stream *s, long timeout_ms);

/* Up to max bytes of the body: > 0 bytes copied; 0 when nothing came within
 * wait_ms; -ENODATA the body has ended; -EIO the transfer failed. */
long httpc_stream_read(struct httpc_stream *s, char *buf, size_t max, long wait_ms);

/* The reply's Content-Type once its status is known ("" when none). */
const char *httpc_stream_content_type(struct httpc_stream *s);

/* A header of the reply (its last value) once its status is known, or ""
 * when it has none. The string lives until the next call on s. */
const char *httpc_stream_header(struct httpc_stream *s, const char *name);

/* curl's words for why the transfer ended without (all of) an answer. */
const char *httpc_stream_error(const struct httpc_stream *s);

/* Stop (a transfer still going is aborted) and free. NULL is fine. */
void httpc_stream_close(struct httpc_stream *s);

#endif
