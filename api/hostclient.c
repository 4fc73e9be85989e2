/* hostclient: requests to kiln-host daemons, and their event streams. */
#include "hostclient.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

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
