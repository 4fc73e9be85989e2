/* host_ops: the real host_ops table, a forward to api/hostcall/hostclient.h (see
 * host_ops.h). */
#include "host_ops.h"

static int real_call(void *ctx, const char *base, const char *token, const char *method, const char *path,
		     json_t *body, long timeout_ms, json_t **reply, struct kiln_err *err)
{
	(void)ctx;
	return hostclient_call(base, token, method, path, body, timeout_ms, reply, err);
}

static int real_follow(void *ctx, const char *base, const char *token, const char *task_id, long stall_s,
		       int (*on_event)(void *ev_ctx, const char *name, json_t *data), void *ev_ctx,
		       struct kiln_err *err)
{
	(void)ctx;
	return hostclient_follow(base, token, task_id, stall_s, on_event, ev_ctx, err);
}

static int real_raw(void *ctx, const char *base, const char *token, const char *method, const char *path,
		    const void *body, size_t len, const char *content_type, long timeout_ms, size_t max_reply,
		    struct hostclient_reply *r, struct kiln_err *err)
{
	(void)ctx;
	return hostclient_raw(base, token, method, path, body, len, content_type, timeout_ms, max_reply, r, err);
}

static struct hostclient_stream *real_stream_open(void *ctx, const char *base, const char *token,
						  const char *method, const char *path, json_t *body,
						  struct kiln_err *err)
{
	(void)ctx;
	return hostclient_stream_open(base, token, method, path, body, err);
}

static int real_stream_status(void *ctx, struct hostclient_stream *h, long timeout_ms, struct kiln_err *err)
{
	(void)ctx;
	return hostclient_stream_status(h, timeout_ms, err);
}

static long real_stream_read(void *ctx, struct hostclient_stream *h, char *buf, size_t max, long wait_ms,
			     struct kiln_err *err)
{
	(void)ctx;
	return hostclient_stream_read(h, buf, max, wait_ms, err);
}

static struct hostclient_stream *real_stream_open_raw(void *ctx, const char *base, const char *token,
						      const char *method, const char *path, const char *const *headers,
						      const void *body, size_t len, const char *content_type,
						      struct kiln_err *err)
{
	(void)ctx;
	return hostclient_stream_open_raw(base, token, method, path, headers, body, len, content_type, err);
}

static const char *real_stream_content_type(void *ctx, struct hostclient_stream *h)
{
	(void)ctx;
	return hostclient_stream_content_type(h);
}

static const char *real_stream_header(void *ctx, struct hostclient_stream *h, const char *name)
{
	(void)ctx;
	return hostclient_stream_header(h, name);
}

static void real_stream_close(void *ctx, struct hostclient_stream *h)
{
	(void)ctx;
	hostclient_stream_close(h);
}

static int real_follow_path(void *ctx, const char *base, const char *token, const char *path, long stall_s,
			    int (*on_event)(void *ev_ctx, const char *name, json_t *data), void *ev_ctx,
			    struct kiln_err *err)
{
	(void)ctx;
	return hostclient_follow_path(base, token, path, stall_s, on_event, ev_ctx, err);
}

const struct host_ops host_ops_hostclient = {
	.follow_path = real_follow_path,
	.call = real_call,
	.follow = real_follow,
	.raw = real_raw,
	.stream_open = real_stream_open,
	.stream_status = real_stream_status,
	.stream_read = real_stream_read,
	.stream_close = real_stream_close,
	.stream_open_raw = real_stream_open_raw,
	.stream_content_type = real_stream_content_type,
	.stream_header = real_stream_header,
	.ctx = NULL,
};
