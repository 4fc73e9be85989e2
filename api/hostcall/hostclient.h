/* hostclient: kiln-api's HTTP client for the kiln-host API (docs/api.md,
 * "kiln-host serve"), over libcurl, authenticated with the cluster token.
 * Every call is synchronous and thread-safe. */
#ifndef KILN_HOSTCLIENT_H
#define KILN_HOSTCLIENT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "err.h"

/* The CA file (PEM) that verifies hosts' https:// URLs (configuration
 * `hosts.ca_file`); NULL: the system's CAs. Set once at start, before any
 * call; the string must outlive every call. */
void hostclient_set_ca(const char *ca_file);
const char *hostclient_ca(void);

/* A byte stream to a host's base URL for a tunnel: for http:// a TCP
 * connection, for https:// a TLS connection verified with hostclient_ca()
 * whose plaintext is pumped by a thread of its own to the returned end of a
 * socketpair (closing it ends the pump and the connection; a shutdown of
 * its write side is not passed on over TLS). The fd is nonblocking and
 * close-on-exec. Returns -1 with why set when no connection was made by
 * deadline_ms (CLOCK_MONOTONIC ms). */
int hostclient_connect(const char *base, int64_t deadline_ms, char *why, size_t why_len);

/* One request: method, base URL + path, optional JSON body. Returns the
 * HTTP status (the response JSON in *reply when it parses; may be NULL), or
 * -1 with err set ("host_unreachable") when no answer came. */
int hostclient_call(const char *base, const char *token, const char *method, const char *path, json_t *body,
		    long timeout_ms, json_t **reply, struct kiln_err *err);

/* Follow GET base/v1/tasks/{id}/events: on_event is called with each event's
 * name and parsed data until the stream ends (returns 0), the callback
 * returns nonzero (returns 1), or the connection fails or stalls for
 * stall_s seconds (-1, err set). */
int hostclient_follow(const char *base, const char *token, const char *task_id, long stall_s,
		      int (*on_event)(void *ctx, const char *name, json_t *data), void *ctx, struct kiln_err *err);

/* The same for any event stream of the host (path: "/v1/builds/ID/events"). */
int hostclient_follow_path(const char *base, const char *token, const char *path, long stall_s,
			   int (*on_event)(void *ctx, const char *name, json_t *data), void *ctx, struct kiln_err *err);

/* ---- raw bodies (session files) ---- */

/* A reply kept as bytes. */
struct hostclient_reply {
	int status;               /* the HTTP status; -1 when no answer came */
	char *body;               /* malloc'd, NUL-terminated (not counted in len); NULL when empty */
	size_t len;
	char content_type[128];   /* "" when the host sent none */
};

/* One request with a raw body (body may be NULL; content_type names it)
 * whose reply is kept as bytes, at most max_reply of them (a longer one is
 * a failure). Returns the status (also in r->status), or -1 with err set
 * ("host_unreachable", or "host_error" for an oversized reply). Release r
 * with hostclient_reply_free. */
int hostclient_raw(const char *base, const char *token, const char *method, const char *path, const void *body,
		   size_t len, const char *content_type, long timeout_ms, size_t max_reply, struct hostclient_reply *r,
		   struct kiln_err *err);
void hostclient_reply_free(struct hostclient_reply *r);

/* ---- a streamed reply, read piece by piece (server-sent events relayed) ----
 * The transfer advances only inside these calls (curl's multi interface), so
 * the caller sets the pace: one thread, no buffering beyond one read. */
struct hostclient_stream;

/* Start a request with an optional JSON body. NULL with err set when it
 * cannot even be set up. */
struct hostclient_stream *hostclient_stream_open(const char *base, const char *token, const char *method,
						 const char *path, json_t *body, struct kiln_err *err);

/* The same with a raw body (len bytes, copied; body NULL: none) of
 * content_type (NULL: no header) and more header lines (NULL-terminated
 * "Name: value"; NULL: none): the envd relay (e2b_relay.c). */
struct hostclient_stream *hostclient_stream_open_raw(const char *base, const char *token, const char *method,
						     const char *path, const char *const *headers, const void *body,
						     size_t len, const char *content_type, struct kiln_err *err);

/* The reply's Content-Type once its status is known ("" when none). */
const char *hostclient_stream_content_type(struct hostclient_stream *h);

/* A header of the reply ("" when none), once its status is known. */
const char *hostclient_stream_header(struct hostclient_stream *h, const char *name);

/* Wait (at most timeout_ms) until the reply's status is known: the status,
 * or -1 with err set (no answer, or none in time). */
int hostclient_stream_status(struct hostclient_stream *h, long timeout_ms, struct kiln_err *err);

/* Up to max bytes of the body: > 0 bytes copied; 0 when nothing came within
 * wait_ms; -1 the body has ended; -2 the transfer failed (err set). */
long hostclient_stream_read(struct hostclient_stream *h, char *buf, size_t max, long wait_ms, struct kiln_err *err);

/* Stop (a transfer still going is aborted) and free. NULL is fine. */
void hostclient_stream_close(struct hostclient_stream *h);

#endif
