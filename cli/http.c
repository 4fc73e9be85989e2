/* http: kiln-api calls, event streams and downloads for the kiln CLI. */
#include "http.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REPLY_MAX (64u << 20)    /* largest JSON reply we keep */
#define EVENT_LINE_MAX (8u << 20) /* longest SSE line (an output chunk) */

struct buf {
	char *p;
	size_t len, cap;
};

static int buf_add(struct buf *b, const char *p, size_t n, size_t max)
{
	if (b->len + n + 1 > max)
		return -1;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		char *q;

		while (cap < b->len + n + 1)
			cap *= 2;
		q = realloc(b->p, cap);
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

static size_t collect(char *p, size_t size, size_t n, void *arg)
{
	return buf_add(arg, p, size * n, REPLY_MAX) < 0 ? 0 : size * n;
}

static struct curl_slist *headers(const char *key, int json_body)
{
	struct curl_slist *h = NULL;
	char auth[1024];

	if (key) {
		snprintf(auth, sizeof(auth), "Authorization: Bearer %s", key);
		h = curl_slist_append(h, auth);
	}
	if (json_body)
		h = curl_slist_append(h, "Content-Type: application/json");
	return h;
}

static void url_of(const struct cli_conn *c, const char *path, char *url, size_t size)
{
	size_t n = strlen(c->api);

	while (n && c->api[n - 1] == '/')
		n--;
	snprintf(url, size, "%.*s%s", (int)n, c->api, path);
}

int http_call(const struct cli_conn *c, const char *method, const char *path, json_t *body, long timeout_s,
	      json_t **reply, struct kiln_err *err)
{
	CURL *h = curl_easy_init();
	struct curl_slist *hd = headers(c->key, body != NULL);
	struct buf b = { 0 };
	char url[2048], *s = NULL;
	long status = -1;
	CURLcode rc;

	*reply = NULL;
	if (!h) {
		curl_slist_free_all(hd);
		return kiln_err_set(err, "unreachable", "out of memory");
	}
	url_of(c, path, url, sizeof(url));
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(h, CURLOPT_TIMEOUT, timeout_s);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 5L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	if (body) {
		s = json_dumps(body, JSON_COMPACT);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, s ? s : "");
	}
	rc = curl_easy_perform(h);
	if (rc == CURLE_OK) {
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
		if (b.p)
			*reply = json_loadb(b.p, b.len, 0, NULL);
	} else {
		kiln_err_set(err, "unreachable", "cannot reach the kiln API at %s: %s", c->api, curl_easy_strerror(rc));
		status = -1;
	}
	free(s);
	free(b.p);
	curl_slist_free_all(hd);
	curl_easy_cleanup(h);
	return (int)status;
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
	struct buf line, body; /* body: a non-200 answer, for its error message */
	char name[64];
	long status;
	CURL *h;
	int (*on_event)(void *ctx, const char *name, json_t *data);
	int (*tick)(void *ctx);
	void *ctx;
	int stopped;
};

/* Server-sent events: "event: NAME", "data: JSON", a blank line; lines
 * starting with ':' are comments (keep-alives). */
static size_t follow_write(char *p, size_t size, size_t n, void *arg)
{
	struct follow *f = arg;
	size_t total = size * n;

	if (!f->status)
		curl_easy_getinfo(f->h, CURLINFO_RESPONSE_CODE, &f->status);
	if (f->status != 200)
		return buf_add(&f->body, p, total, 1u << 20) < 0 ? 0 : total;
	for (size_t i = 0; i < total; i++) {
		if (p[i] != '\n') {
			if (buf_add(&f->line, p + i, 1, EVENT_LINE_MAX) < 0)
				return 0; /* an absurd line: drop the stream */
			continue;
		}
		if (f->line.len && f->line.p[f->line.len - 1] == '\r')
			f->line.p[--f->line.len] = '\0';
		if (f->line.len >= 6 && !strncmp(f->line.p, "event:", 6)) {
			const char *v = f->line.p + 6;

			snprintf(f->name, sizeof(f->name), "%s", v + (*v == ' '));
		} else if (f->line.len >= 5 && !strncmp(f->line.p, "data:", 5)) {
			const char *v = f->line.p + 5;
			json_t *d;

			v += *v == ' ';
			d = json_loads(v, 0, NULL);
			if (d && f->name[0] && f->on_event(f->ctx, f->name, d)) {
				json_decref(d);
				f->stopped = 1;
				return 0;
			}
			json_decref(d);
		} else if (!f->line.len) {
			f->name[0] = '\0';
		}
		f->line.len = 0;
	}
	return total;
}

static int follow_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
	struct follow *f = arg;

	if (f->tick && f->tick(f->ctx)) {
		f->stopped = 1;
		return 1;
	}
	return 0;
}

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
	CURL *h = curl_easy_init();
	struct curl_slist *hd = headers(c->key, body != NULL);
	struct follow f = { .on_event = on_event, .tick = tick, .ctx = ctx, .h = h };
	char url[8192], *req = NULL;
	CURLcode rc;
	int ret = 0;

	if (!h) {
		curl_slist_free_all(hd);
		return kiln_err_set(err, "unreachable", "out of memory");
	}
	url_of(c, path, url, sizeof(url));
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
	if (body) {
		req = json_dumps(body, JSON_COMPACT);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, req ? req : "");
	}
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, follow_write);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &f);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 5L);
	/* kiln-api sends a keep-alive every 15 s: longer silence is a dead stream. */
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, stall_s);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, follow_progress);
	curl_easy_setopt(h, CURLOPT_XFERINFODATA, &f);
	rc = curl_easy_perform(h);
	if (!f.status)
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &f.status);
	if (f.stopped) {
		ret = 1;
	} else if (rc != CURLE_OK) {
		ret = kiln_err_set(err, "unreachable", "event stream %s: %s", url, curl_easy_strerror(rc));
	} else if (f.status != 200) {
		json_t *r = f.body.p ? json_loadb(f.body.p, f.body.len, 0, NULL) : NULL;
		char msg[600];

		http_describe_error((int)f.status, r, msg, sizeof(msg));
		json_decref(r);
		ret = kiln_err_set(err, "http", "%s", msg);
	}
	free(f.line.p);
	free(f.body.p);
	free(req);
	curl_slist_free_all(hd);
	curl_easy_cleanup(h);
	return ret;
}

int http_send(const struct cli_conn *c, const char *method, const char *path, const void *body, size_t len,
	      const char *content_type, long timeout_s, json_t **reply, struct kiln_err *err)
{
	CURL *h = curl_easy_init();
	struct curl_slist *hd = headers(c->key, 0);
	struct buf b = { 0 };
	char url[8192], ct[160];
	long status = -1;
	CURLcode rc;

	*reply = NULL;
	if (!h) {
		curl_slist_free_all(hd);
		return kiln_err_set(err, "unreachable", "out of memory");
	}
	if (content_type) {
		snprintf(ct, sizeof(ct), "Content-Type: %s", content_type);
		hd = curl_slist_append(hd, ct);
	}
	hd = curl_slist_append(hd, "Expect:");
	url_of(c, path, url, sizeof(url));
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(h, CURLOPT_TIMEOUT, timeout_s);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 5L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? (const char *)body : "");
	curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? len : 0));
	rc = curl_easy_perform(h);
	if (rc == CURLE_OK) {
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
		if (b.p)
			*reply = json_loadb(b.p, b.len, 0, NULL);
	} else {
		kiln_err_set(err, "unreachable", "cannot reach the kiln API at %s: %s", c->api, curl_easy_strerror(rc));
		status = -1;
	}
	free(b.p);
	curl_slist_free_all(hd);
	curl_easy_cleanup(h);
	return (int)status;
}

struct save {
	FILE *f;          /* the temporary file (or stdout) */
	struct buf err;   /* a non-200 answer's body */
	long status;
	CURL *h;
};

static size_t save_write(char *p, size_t size, size_t n, void *arg)
{
	struct save *s = arg;
	size_t total = size * n;

	if (!s->status)
		curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
	if (s->status != 200 && s->status != 206)
		return buf_add(&s->err, p, total, 1u << 20) < 0 ? 0 : total;
	return fwrite(p, 1, total, s->f) == total ? total : 0;
}

int http_get_file(const struct cli_conn *c, const char *path, const char *local, long timeout_s, json_t **reply,
		  struct kiln_err *err)
{
	int to_stdout = !strcmp(local, "-");
	struct curl_slist *hd = headers(c->key, 0);
	struct save s = { 0 };
	char url[8192], tmp[4096];
	CURLcode rc;
	int fd = -1;

	*reply = NULL;
	if (to_stdout) {
		s.f = stdout;
	} else {
		if (snprintf(tmp, sizeof(tmp), "%s.kilntmp.XXXXXX", local) >= (int)sizeof(tmp)) {
			curl_slist_free_all(hd);
			return kiln_err_set(err, "io_error", "%s: path too long", local);
		}
		fd = mkstemp(tmp);
		if (fd < 0 || !(s.f = fdopen(fd, "w"))) {
			int e = errno;

			if (fd >= 0) {
				close(fd);
				unlink(tmp);
			}
			curl_slist_free_all(hd);
			return kiln_err_set(err, "io_error", "%s: %s", local, strerror(e));
		}
	}
	s.h = curl_easy_init();
	if (!s.h) {
		if (!to_stdout) {
			fclose(s.f);
			unlink(tmp);
		}
		curl_slist_free_all(hd);
		return kiln_err_set(err, "unreachable", "out of memory");
	}
	url_of(c, path, url, sizeof(url));
	curl_easy_setopt(s.h, CURLOPT_URL, url);
	curl_easy_setopt(s.h, CURLOPT_HTTPHEADER, hd);
	curl_easy_setopt(s.h, CURLOPT_WRITEFUNCTION, save_write);
	curl_easy_setopt(s.h, CURLOPT_WRITEDATA, &s);
	curl_easy_setopt(s.h, CURLOPT_CONNECTTIMEOUT, 5L);
	curl_easy_setopt(s.h, CURLOPT_TIMEOUT, timeout_s);
	curl_easy_setopt(s.h, CURLOPT_NOSIGNAL, 1L);
	rc = curl_easy_perform(s.h);
	if (!s.status)
		curl_easy_getinfo(s.h, CURLINFO_RESPONSE_CODE, &s.status);
	curl_easy_cleanup(s.h);
	curl_slist_free_all(hd);
	if (to_stdout) {
		fflush(stdout);
	} else {
		int bad = fflush(s.f) || fsync(fileno(s.f)) || ferror(s.f);

		fclose(s.f);
		if (rc == CURLE_OK && s.status == 200 && !bad) {
			chmod(tmp, 0644);
			if (rename(tmp, local) < 0) {
				int e = errno;

				unlink(tmp);
				free(s.err.p);
				return kiln_err_set(err, "io_error", "%s: %s", local, strerror(e));
			}
		} else {
			unlink(tmp);
			if (bad && rc == CURLE_OK && s.status == 200) {
				free(s.err.p);
				return kiln_err_set(err, "io_error", "%s: write failed", local);
			}
		}
	}
	if (rc != CURLE_OK && !(s.status && s.status != 200)) {
		free(s.err.p);
		return kiln_err_set(err, "unreachable", "cannot reach the kiln API at %s: %s", c->api,
				    curl_easy_strerror(rc));
	}
	if (s.err.p)
		*reply = json_loadb(s.err.p, s.err.len, 0, NULL);
	free(s.err.p);
	return (int)s.status;
}

int http_stream_url(const char *url, unsigned long long from, FILE *out, long timeout_s, struct kiln_err *err)
{
	struct save s = { .f = out };
	char range[64];
	CURLcode rc;

	s.h = curl_easy_init();
	if (!s.h)
		return kiln_err_set(err, "io_error", "out of memory");
	curl_easy_setopt(s.h, CURLOPT_URL, url);
	if (from) {
		snprintf(range, sizeof(range), "%llu-", from);
		curl_easy_setopt(s.h, CURLOPT_RANGE, range);
	}
	curl_easy_setopt(s.h, CURLOPT_WRITEFUNCTION, save_write);
	curl_easy_setopt(s.h, CURLOPT_WRITEDATA, &s);
	curl_easy_setopt(s.h, CURLOPT_CONNECTTIMEOUT, 5L);
	curl_easy_setopt(s.h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(s.h, CURLOPT_LOW_SPEED_TIME, timeout_s);
	curl_easy_setopt(s.h, CURLOPT_NOSIGNAL, 1L);
	rc = curl_easy_perform(s.h);
	if (!s.status)
		curl_easy_getinfo(s.h, CURLINFO_RESPONSE_CODE, &s.status);
	curl_easy_cleanup(s.h);
	fflush(out);
	free(s.err.p);
	if (s.status == 416)
		return 0; /* nothing after `from` */
	if (s.status != 200 && s.status != 206)
		return kiln_err_set(err, "http", "download: HTTP %ld", s.status);
	if (rc != CURLE_OK)
		return kiln_err_set(err, "unreachable", "download: %s", curl_easy_strerror(rc));
	return 0;
}

int http_download(const char *url, const char *path, long timeout_s, struct kiln_err *err)
{
	char tmp[4096];
	CURL *h;
	FILE *f;
	long status = 0;
	CURLcode rc;
	int fd;

	if (snprintf(tmp, sizeof(tmp), "%s.kilntmp.XXXXXX", path) >= (int)sizeof(tmp))
		return kiln_err_set(err, "io_error", "%s: path too long", path);
	fd = mkstemp(tmp);
	if (fd < 0)
		return kiln_err_set(err, "io_error", "%s: %s", tmp, strerror(errno));
	f = fdopen(fd, "w");
	h = curl_easy_init();
	if (!f || !h) {
		if (f)
			fclose(f);
		else
			close(fd);
		curl_easy_cleanup(h);
		unlink(tmp);
		return kiln_err_set(err, "io_error", "out of memory");
	}
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, f);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 5L);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, timeout_s);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	rc = curl_easy_perform(h);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(h);
	if (fflush(f) || fsync(fileno(f)) || ferror(f)) {
		fclose(f);
		unlink(tmp);
		return kiln_err_set(err, "io_error", "%s: write failed", tmp);
	}
	fclose(f);
	if (rc != CURLE_OK || status != 200) {
		unlink(tmp);
		if (rc != CURLE_OK)
			return kiln_err_set(err, "unreachable", "download: %s", curl_easy_strerror(rc));
		return kiln_err_set(err, "http", "download: HTTP %ld", status);
	}
	chmod(tmp, 0644);
	if (rename(tmp, path) < 0) {
		int e = errno;

		unlink(tmp);
		return kiln_err_set(err, "io_error", "%s: %s", path, strerror(e));
	}
	return 0;
}
