/* http: kiln-api calls, event streams and downloads for the kiln CLI, over
 * lib/httpc with the CLI's timeouts and wording. */
#include "http.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "httpc.h"

#define REPLY_MAX (64u << 20)    /* largest JSON reply we keep */
#define EVENT_LINE_MAX (8u << 20) /* longest SSE line (an output chunk) */
#define CONNECT_MS 5000L

static void url_of(const struct cli_conn *c, const char *path, char *url, size_t size)
{
	size_t n = strlen(c->api);

	while (n && c->api[n - 1] == '/')
		n--;
	snprintf(url, size, "%.*s%s", (int)n, c->api, path);
}

/* A request to the API: its URL into url, the key as bearer. */
static struct httpc_req api_req(const struct cli_conn *c, const char *method, const char *path, long timeout_s,
				char *url, size_t size)
{
	url_of(c, path, url, size);
	return (struct httpc_req){
		.method = method,
		.url = url,
		.bearer = c->key,
		.ca_file = c->ca_file,
		.max_reply = REPLY_MAX,
		.lim = { .timeout_ms = timeout_s * 1000, .connect_timeout_ms = CONNECT_MS },
	};
}

/* The status, with the reply as JSON in *reply, or -1 with err set. */
static int api_answer(const struct cli_conn *c, int rc, struct httpc_reply *r, json_t **reply, struct kiln_err *err)
{
	int status = (int)r->status;

	if (rc == 0 && r->body.len)
		*reply = json_loadb(r->body.p, r->body.len, 0, NULL);
	if (rc != 0)
		status = kiln_err_set(err, KERR_UNREACHABLE, "cannot reach the kiln API at %s: %s", c->api, r->error);
	httpc_reply_free(r);
	return status;
}

int http_call(const struct cli_conn *c, const char *method, const char *path, json_t *body, long timeout_s,
	      json_t **reply, struct kiln_err *err)
{
	char url[2048];
	struct httpc_req q = api_req(c, method, path, timeout_s, url, sizeof(url));
	struct httpc_reply r;

	*reply = NULL;
	return api_answer(c, httpc_json(NULL, &q, body, NULL, &r), &r, reply, err);
}

void http_describe_error(int status, json_t *reply, char *out, size_t size)
{
	json_t *e = json_object_get(reply, "error");
	const char *code = json_string_value(json_object_get(e, "code"));
	const char *msg = json_string_value(json_object_get(e, "message"));

	if (code || msg)
		snprintf(out, size, "HTTP %d %s: %s", status, code ? code : "error", msg ? msg : "(no message)");
	else
		snprintf(out, size, "HTTP %d (no error message from the server)", status);
}

struct follow {
	int (*tick)(void *ctx);
	void *ctx;
};

int http_follow(const struct cli_conn *c, const char *path, long stall_s,
		int (*on_event)(void *ctx, const char *name, json_t *data), int (*tick)(void *ctx), void *ctx,
		struct kiln_err *err)
{
	return http_follow_body(c, "GET", path, NULL, stall_s, on_event, tick, ctx, err);
}

int http_follow_body(const struct cli_conn *c, const char *method, const char *path, json_t *body, long stall_s,
		     int (*on_event)(void *ctx, const char *name, json_t *data), int (*tick)(void *ctx), void *ctx,
		     struct kiln_err *err)
{
	char url[8192], *req = NULL;
	struct httpc_req q = api_req(c, method, path, 0, url, sizeof(url));
	struct httpc_reply r;
	int ret;

	if (body) {
		req = json_dumps(body, JSON_COMPACT);
		q.body = req ? req : "";
		q.body_len = req ? strlen(req) : 0;
		q.content_type = "application/json";
	}
	/* kiln-api sends a keep-alive every 15 s: longer silence is a dead stream. */
	q.lim.stall_s = stall_s;
	q.max_reply = EVENT_LINE_MAX;
	q.tick = tick;
	q.ctx = ctx;
	ret = httpc_follow(NULL, &q, on_event, ctx, &r);
	if (ret < 0) {
		ret = kiln_err_set(err, KERR_UNREACHABLE, "event stream %s: %s", url, r.error);
	} else if (ret == 0 && r.status != 200) {
		json_t *e = r.body.len ? json_loadb(r.body.p, r.body.len, 0, NULL) : NULL;
		char msg[600];

		http_describe_error((int)r.status, e, msg, sizeof(msg));
		json_decref(e);
		ret = kiln_err_set(err, KERR_HTTP, "%s", msg);
	}
	httpc_reply_free(&r);
	free(req);
	return ret;
}

int http_send(const struct cli_conn *c, const char *method, const char *path, const void *body, size_t len,
	      const char *content_type, long timeout_s, json_t **reply, struct kiln_err *err)
{
	char url[8192];
	struct httpc_req q = api_req(c, method, path, timeout_s, url, sizeof(url));
	struct httpc_reply r;

	*reply = NULL;
	q.body = body ? body : "";
	q.body_len = body ? len : 0;
	q.content_type = content_type;
	return api_answer(c, httpc_request(NULL, &q, &r), &r, reply, err);
}

/* The body of http_send_file: the file read as curl asks for it. */
struct file_body {
	int fd;
	int failed;  /* errno of a failed read */
};

static long file_body_read(void *arg, char *p, size_t n)
{
	struct file_body *b = arg;

	for (;;) {
		ssize_t got = read(b->fd, p, n);

		if (got >= 0)
			return (long)got;
		if (errno != EINTR) {
			b->failed = errno;
			return -1;
		}
	}
}

int http_send_file(const struct cli_conn *c, const char *method, const char *path, const char *file,
		   const char *content_type, long timeout_s, int (*tick)(void *ctx), void *ctx, json_t **reply,
		   struct kiln_err *err)
{
	char url[8192];
	struct httpc_req q = api_req(c, method, path, timeout_s, url, sizeof(url));
	struct file_body b = { .fd = open(file, O_RDONLY | O_CLOEXEC) };
	struct httpc_reply r;
	struct stat st;
	int rc;

	*reply = NULL;
	if (b.fd < 0)
		return kiln_err_set(err, KERR_IO_ERROR, "%s: %s", file, strerror(errno));
	if (fstat(b.fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		int e = errno;

		close(b.fd);
		return kiln_err_set(err, KERR_IO_ERROR, "%s: %s", file, S_ISREG(st.st_mode) ? strerror(e)
										: "not a regular file");
	}
	q.body_read = file_body_read;
	q.body_ctx = &b;
	q.body_len = (size_t)st.st_size;
	q.content_type = content_type;
	q.tick = tick;
	q.ctx = ctx;
	rc = httpc_request(NULL, &q, &r);
	close(b.fd);
	if (rc < 0 && b.failed) {
		httpc_reply_free(&r);
		return kiln_err_set(err, KERR_IO_ERROR, "%s: %s", file, strerror(b.failed));
	}
	if (rc == 1) {
		httpc_reply_free(&r);
		return kiln_err_set(err, KERR_INTERRUPTED, "interrupted");
	}
	/* The API may refuse before it has read the whole body (413 past the
	 * customer's cap) and close: its answer, not the broken send, says why. */
	if (rc < 0 && r.status >= 400 && r.body.len)
		rc = 0;
	return api_answer(c, rc, &r, reply, err);
}

/* A 200/206 body written to a file as it arrives. */
static int to_file(void *arg, const char *p, size_t n)
{
	return fwrite(p, 1, n, arg) == n ? 0 : -1;
}

/* curl's words for a transfer: rc from httpc_request (1: the file could
 * not take what came). */
static const char *xfer_error(int rc, const struct httpc_reply *r)
{
	return rc == 1 ? curl_easy_strerror(CURLE_WRITE_ERROR) : r->error;
}

int http_get_file(const struct cli_conn *c, const char *path, const char *local, long timeout_s, json_t **reply,
		  struct kiln_err *err)
{
	int to_stdout = !strcmp(local, "-");
	char url[8192], tmp[4096];
	struct httpc_req q = api_req(c, NULL, path, timeout_s, url, sizeof(url));
	struct httpc_reply r;
	FILE *f = NULL;
	int fd = -1, rc;

	*reply = NULL;
	if (to_stdout) {
		f = stdout;
	} else {
		if (snprintf(tmp, sizeof(tmp), "%s.kilntmp.XXXXXX", local) >= (int)sizeof(tmp))
			return kiln_err_set(err, KERR_IO_ERROR, "%s: path too long", local);
		fd = mkstemp(tmp);
		if (fd < 0 || !(f = fdopen(fd, "w"))) {
			int e = errno;

			if (fd >= 0) {
				close(fd);
				unlink(tmp);
			}
			return kiln_err_set(err, KERR_IO_ERROR, "%s: %s", local, strerror(e));
		}
	}
	q.sink = to_file;
	q.ctx = f;
	rc = httpc_request(NULL, &q, &r);
	if (rc == -ENOMEM && !r.status) {
		if (!to_stdout) {
			fclose(f);
			unlink(tmp);
		}
		return kiln_err_set(err, KERR_UNREACHABLE, "out of memory");
	}
	if (to_stdout) {
		fflush(stdout);
	} else {
		int bad = fflush(f) || fsync(fileno(f)) || ferror(f);

		fclose(f);
		if (rc == 0 && r.status == 200 && !bad) {
			chmod(tmp, 0644);
			if (rename(tmp, local) < 0) {
				int e = errno;

				unlink(tmp);
				httpc_reply_free(&r);
				return kiln_err_set(err, KERR_IO_ERROR, "%s: %s", local, strerror(e));
			}
		} else {
			unlink(tmp);
			if (bad && rc == 0 && r.status == 200) {
				httpc_reply_free(&r);
				return kiln_err_set(err, KERR_IO_ERROR, "%s: write failed", local);
			}
		}
	}
	if (rc != 0 && !(r.status && r.status != 200)) {
		kiln_err_set(err, KERR_UNREACHABLE, "cannot reach the kiln API at %s: %s", c->api, xfer_error(rc, &r));
		httpc_reply_free(&r);
		return -1;
	}
	if (r.body.len)
		*reply = json_loadb(r.body.p, r.body.len, 0, NULL);
	httpc_reply_free(&r);
	return (int)r.status;
}

/* A download of a presigned URL: no key; a stall, not its length, fails it. */
static struct httpc_req url_req(const char *url, long timeout_s, FILE *out)
{
	return (struct httpc_req){
		.url = url,
		.lim = { .connect_timeout_ms = CONNECT_MS, .stall_s = timeout_s },
		.sink = to_file,
		.ctx = out,
	};
}

int http_stream_url(const char *url, unsigned long long from, FILE *out, long timeout_s, struct kiln_err *err)
{
	struct httpc_req q = url_req(url, timeout_s, out);
	struct httpc_reply r;
	char range[64];
	long status;
	int rc;

	if (from) {
		snprintf(range, sizeof(range), "%llu-", from);
		q.range = range;
	}
	rc = httpc_request(NULL, &q, &r);
	fflush(out);
	status = r.status;
	httpc_reply_free(&r);
	if (rc == -ENOMEM && !status)
		return kiln_err_set(err, KERR_IO_ERROR, "out of memory");
	if (status == 416)
		return 0; /* nothing after `from` */
	if (status != 200 && status != 206)
		return kiln_err_set(err, KERR_HTTP, "download: HTTP %ld", status);
	if (rc != 0)
		return kiln_err_set(err, KERR_UNREACHABLE, "download: %s", xfer_error(rc, &r));
	return 0;
}

int http_download(const char *url, const char *path, long timeout_s, struct kiln_err *err)
{
	char tmp[4096];
	struct httpc_req q;
	struct httpc_reply r;
	FILE *f;
	int fd, rc;

	if (snprintf(tmp, sizeof(tmp), "%s.kilntmp.XXXXXX", path) >= (int)sizeof(tmp))
		return kiln_err_set(err, KERR_IO_ERROR, "%s: path too long", path);
	fd = mkstemp(tmp);
	if (fd < 0)
		return kiln_err_set(err, KERR_IO_ERROR, "%s: %s", tmp, strerror(errno));
	f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		unlink(tmp);
		return kiln_err_set(err, KERR_IO_ERROR, "out of memory");
	}
	q = url_req(url, timeout_s, f);
	rc = httpc_request(NULL, &q, &r);
	if (fflush(f) || fsync(fileno(f)) || ferror(f)) {
		fclose(f);
		unlink(tmp);
		httpc_reply_free(&r);
		return kiln_err_set(err, KERR_IO_ERROR, "%s: write failed", tmp);
	}
	fclose(f);
	if (rc != 0 || r.status != 200) {
		unlink(tmp);
		if (rc != 0)
			kiln_err_set(err, rc == -ENOMEM && !r.status ? KERR_IO_ERROR : KERR_UNREACHABLE, "download: %s",
				     xfer_error(rc, &r));
		else
			kiln_err_set(err, KERR_HTTP, "download: HTTP %ld", r.status);
		httpc_reply_free(&r);
		return -1;
	}
	httpc_reply_free(&r);
	chmod(tmp, 0644);
	if (rename(tmp, path) < 0) {
		int e = errno;

		unlink(tmp);
		return kiln_err_set(err, KERR_IO_ERROR, "%s: %s", path, strerror(e));
	}
	return 0;
}
