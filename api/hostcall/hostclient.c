/* hostclient: requests to kiln-host daemons, their event streams, raw
 * bodies, and streamed replies relayed piece by piece, over lib/httpc with
 * kiln-api's timeouts and error codes. */
#include "hostclient.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "httpc.h"

#define REPLY_MAX (64u << 20)    /* a task JSON carries stdout/stderr */
#define EVENT_LINE_MAX (4u << 20)
#define CONNECT_MAX_MS 2000L
#define FOLLOW_DRAIN_MS 200L

static const char *host_ca;

void hostclient_set_ca(const char *ca_file)
{
	host_ca = ca_file;
}

const char *hostclient_ca(void)
{
	return host_ca;
}

/* A request to base + path with the cluster token; timeout_ms 0: none. */
static void host_req(struct httpc_req *q, char *url, size_t size, const char *base, const char *token,
		     const char *method, const char *path, long timeout_ms)
{
	snprintf(url, size, "%s%s", base, path);
	*q = (struct httpc_req){
		.method = method,
		.url = url,
		.bearer = token,
		.ca_file = host_ca,
		.lim = { .timeout_ms = timeout_ms,
			 .connect_timeout_ms = timeout_ms && timeout_ms < CONNECT_MAX_MS ? timeout_ms : CONNECT_MAX_MS },
	};
}

int hostclient_call(const char *base, const char *token, const char *method, const char *path, json_t *body,
		    long timeout_ms, json_t **reply, struct kiln_err *err)
{
	struct httpc_req q;
	struct httpc_reply r;
	char url[1024];
	int status;

	host_req(&q, url, sizeof(url), base, token, method, path, timeout_ms);
	q.max_reply = REPLY_MAX;
	if (httpc_json(NULL, &q, body, reply, &r) == 0) {
		status = (int)r.status;
	} else {
		kiln_err_set(err, KERR_HOST_UNREACHABLE, "%s %s: %s", method, url, r.error);
		status = -1;
	}
	httpc_reply_free(&r);
	return status;
}

/* ---- raw bodies ---- */

int hostclient_raw(const char *base, const char *token, const char *method, const char *path, const void *body,
		   size_t len, const char *content_type, long timeout_ms, size_t max_reply, struct hostclient_reply *r,
		   struct kiln_err *err)
{
	struct httpc_req q;
	struct httpc_reply hr;
	char url[8192];
	int rc;

	memset(r, 0, sizeof(*r));
	r->status = -1;
	host_req(&q, url, sizeof(url), base, token, method, path, timeout_ms);
	q.body = body;
	q.body_len = len;
	q.content_type = content_type;
	q.max_reply = max_reply;
	rc = httpc_request(NULL, &q, &hr);
	if (rc == 0) {
		r->status = (int)hr.status;
		r->len = hr.body.len;
		r->body = hr.body.len ? buf_steal(&hr.body, NULL) : NULL;
		snprintf(r->content_type, sizeof(r->content_type), "%s", hr.content_type);
	} else if (rc == -E2BIG) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s %s: the reply is larger than %zu bytes", method, url, max_reply);
	} else {
		kiln_err_set(err, KERR_HOST_UNREACHABLE, "%s %s: %s", method, url, hr.error);
	}
	httpc_reply_free(&hr);
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

struct hostclient_stream {
	struct httpc_stream *s;
	char url[1024];
};

struct hostclient_stream *hostclient_stream_open(const char *base, const char *token, const char *method,
						 const char *path, json_t *body, struct kiln_err *err)
{
	struct hostclient_stream *h = calloc(1, sizeof(*h));
	struct httpc_req q;
	char *req = NULL;
	int rc;

	if (!h) {
		kiln_err_set(err, KERR_HOST_UNREACHABLE, "out of memory");
		return NULL;
	}
	host_req(&q, h->url, sizeof(h->url), base, token, method, path, 0);
	if (body) {
		req = json_dumps(body, JSON_COMPACT);
		q.body = req ? req : "";
		q.body_len = req ? strlen(req) : 0;
		q.content_type = "application/json";
	}
	rc = httpc_stream_open(&q, &h->s);
	free(req);
	if (rc < 0) {
		kiln_err_set(err, KERR_HOST_UNREACHABLE, rc == -ENOMEM ? "out of memory" : "cannot start the request");
		free(h);
		return NULL;
	}
	return h;
}

struct hostclient_stream *hostclient_stream_open_raw(const char *base, const char *token, const char *method,
						     const char *path, const char *const *headers, const void *body,
						     size_t len, const char *content_type, struct kiln_err *err)
{
	struct hostclient_stream *h = calloc(1, sizeof(*h));
	struct httpc_req q;
	int rc;

	if (!h) {
		kiln_err_set(err, KERR_HOST_UNREACHABLE, "out of memory");
		return NULL;
	}
	host_req(&q, h->url, sizeof(h->url), base, token, method, path, 0);
	q.headers = headers;
	q.content_type = content_type;
	q.body = body;
	q.body_len = body ? len : 0;
	rc = httpc_stream_open(&q, &h->s);
	if (rc < 0) {
		kiln_err_set(err, KERR_HOST_UNREACHABLE, rc == -ENOMEM ? "out of memory" : "cannot start the request");
		free(h);
		return NULL;
	}
	return h;
}

const char *hostclient_stream_content_type(struct hostclient_stream *h)
{
	return httpc_stream_content_type(h->s);
}

const char *hostclient_stream_header(struct hostclient_stream *h, const char *name)
{
	return httpc_stream_header(h->s, name);
}

int hostclient_stream_status(struct hostclient_stream *h, long timeout_ms, struct kiln_err *err)
{
	int st = httpc_stream_status(h->s, timeout_ms);

	if (st == -ETIMEDOUT)
		return kiln_err_set(err, KERR_HOST_UNREACHABLE, "%s: no answer in %ld ms", h->url, timeout_ms);
	if (st < 0)
		return kiln_err_set(err, KERR_HOST_UNREACHABLE, "%s: %s", h->url, httpc_stream_error(h->s));
	return st;
}

long hostclient_stream_read(struct hostclient_stream *h, char *buf, size_t max, long wait_ms, struct kiln_err *err)
{
	long n = httpc_stream_read(h->s, buf, max, wait_ms);

	if (n == -ENODATA)
		return -1;
	if (n < 0) {
		kiln_err_set(err, KERR_HOST_UNREACHABLE, "%s: %s", h->url, httpc_stream_error(h->s));
		return -2;
	}
	return n;
}

void hostclient_stream_close(struct hostclient_stream *h)
{
	if (!h)
		return;
	httpc_stream_close(h->s);
	free(h);
}

/* ---- a task's event stream ---- */

int hostclient_follow_path(const char *base, const char *token, const char *path, long stall_s,
			   int (*on_event)(void *ctx, const char *name, json_t *data), void *ctx, struct kiln_err *err)
{
	struct httpc_req q;
	struct httpc_reply r;
	char url[1024];
	int rc;

	host_req(&q, url, sizeof(url), base, token, NULL, path, 0);
	/* The host sends a keep-alive every 15 s: silence beyond stall_s is a dead host. */
	q.lim.stall_s = stall_s;
	q.max_reply = EVENT_LINE_MAX;
	/* A final event is the stream's last: kiln-host ends the stream right
	 * after it, and reading that end keeps the connection for the next
	 * task's push instead of a new TCP connection per task. */
	q.drain_ms = FOLLOW_DRAIN_MS;
	rc = httpc_follow(NULL, &q, on_event, ctx, &r);
	if (rc < 0)
		kiln_err_set(err, KERR_HOST_UNREACHABLE, "%s: %s", path, r.error);
	else if (rc == 0 && r.status != 200)
		rc = kiln_err_set(err, r.status == 404 ? KERR_NOT_FOUND : KERR_HOST_ERROR, "%s: HTTP %ld", path,
				  r.status);
	httpc_reply_free(&r);
	return rc < 0 ? -1 : rc;
}

int hostclient_follow(const char *base, const char *token, const char *task_id, long stall_s,
		      int (*on_event)(void *ctx, const char *name, json_t *data), void *ctx, struct kiln_err *err)
{
	char path[512];

	snprintf(path, sizeof(path), "/v1/tasks/%s/events", task_id);
	return hostclient_follow_path(base, token, path, stall_s, on_event, ctx, err);
}
