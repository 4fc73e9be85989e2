/* host_ops: the operations kiln-api's scheduler and sessions perform on a
 * kiln-host, as a small ops table: request/response calls (JSON or raw
 * bytes), following a task's event stream, and a streamed reply read piece
 * by piece. host_ops_hostclient forwards to api/hostcall/hostclient.h; unit tests
 * pass a fake one so that placement, retries, host loss and the reaper run
 * without a network. Every callback gets the table's ctx first; the other
 * arguments and the results are exactly hostclient.h's.
 *
 * Room: the hostcall room's door (api/hostcall/: how kiln-api calls a
 * kiln-host, hostclient.c, and the ops table over it). It may call lib/
 * only. */
#ifndef KILN_HOST_OPS_H
#define KILN_HOST_OPS_H

#include <stddef.h>

#include <jansson.h>

#include "err.h"
#include "hostclient.h"

struct host_ops {
	/* hostclient_call */
	int (*call)(void *ctx, const char *base, const char *token, const char *method, const char *path, json_t *body,
		    long timeout_ms, json_t **reply, struct kiln_err *err);
	/* hostclient_follow */
	int (*follow)(void *ctx, const char *base, const char *token, const char *task_id, long stall_s,
		      int (*on_event)(void *ev_ctx, const char *name, json_t *data), void *ev_ctx, struct kiln_err *err);
	/* hostclient_raw: r is released with hostclient_reply_free (body malloc'd) */
	int (*raw)(void *ctx, const char *base, const char *token, const char *method, const char *path,
		   const void *body, size_t len, const char *content_type, long timeout_ms, size_t max_reply,
		   struct hostclient_reply *r, struct kiln_err *err);
	/* hostclient_stream_open/_status/_read/_close */
	struct hostclient_stream *(*stream_open)(void *ctx, const char *base, const char *token, const char *method,
						 const char *path, json_t *body, struct kiln_err *err);
	int (*stream_status)(void *ctx, struct hostclient_stream *h, long timeout_ms, struct kiln_err *err);
	long (*stream_read)(void *ctx, struct hostclient_stream *h, char *buf, size_t max, long wait_ms,
			    struct kiln_err *err);
	void (*stream_close)(void *ctx, struct hostclient_stream *h);
	/* hostclient_stream_open_raw and _content_type (may be NULL in a fake:
	 * the envd relay then answers 503) */
	struct hostclient_stream *(*stream_open_raw)(void *ctx, const char *base, const char *token,
						     const char *method, const char *path, const char *const *headers,
						     const void *body, size_t len, const char *content_type,
						     struct kiln_err *err);
	const char *(*stream_content_type)(void *ctx, struct hostclient_stream *h);
	/* hostclient_stream_header (may be NULL in a fake: no header relayed) */
	const char *(*stream_header)(void *ctx, struct hostclient_stream *h, const char *name);
	/* hostclient_follow_path (may be NULL in a fake: builds are then
	 * followed by GET /v1/builds/{id} alone) */
	int (*follow_path)(void *ctx, const char *base, const char *token, const char *path, long stall_s,
			   int (*on_event)(void *ev_ctx, const char *name, json_t *data), void *ev_ctx,
			   struct kiln_err *err);
	void *ctx;
};

/* The real table: every call goes to hostclient.h (thread-safe, blocking). */
extern const struct host_ops host_ops_hostclient;

#endif
