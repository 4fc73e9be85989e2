/* heartbeat: the kiln-host side of host registration with kiln-api. */
#include "heartbeat.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "proto.h"

struct heartbeat {
	struct hostd *d;
	char *url, *advertise, *auth;
	unsigned period_ms;
	pthread_t thread;
	int started;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	int stopping;
	char last_error[256];
};

static size_t discard(char *p, size_t size, size_t n, void *ctx)
{
	return size * n;
}

/* One heartbeat; returns 0 or -1 with a message in err (cap bytes). */
static int send_one(struct heartbeat *h, CURL *c, char *err, size_t cap)
{
	json_t *body = json_pack("{s:s, s:o}", "url", h->advertise, "capacity", hostd_capacity_json(h->d));
	char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
	struct curl_slist *hdr = NULL;
	long status = 0;
	CURLcode rc;

	json_decref(body);
	if (!s) {
		snprintf(err, cap, "out of memory");
		return -1;
	}
	hdr = curl_slist_append(hdr, "Content-Type: application/json");
	hdr = curl_slist_append(hdr, h->auth);
	curl_easy_reset(c);
	curl_easy_setopt(c, CURLOPT_URL, h->url);
	curl_easy_setopt(c, CURLOPT_POSTFIELDS, s);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	rc = curl_easy_perform(c);
	if (rc == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	curl_slist_free_all(hdr);
	free(s);
	if (rc != CURLE_OK) {
		snprintf(err, cap, "%s", curl_easy_strerror(rc));
		return -1;
	}
	if (status != 200) {
		snprintf(err, cap, "HTTP %ld%s", status, status == 401 ? " (wrong cluster token?)" : "");
		return -1;
	}
	return 0;
}

static void *heartbeat_main(void *arg)
{
	struct heartbeat *h = arg;
	CURL *c = curl_easy_init();

	pthread_mutex_lock(&h->lock);
	while (!h->stopping && c) {
		char err[256] = "";
		struct timespec ts;
		int r;

		pthread_mutex_unlock(&h->lock);
		r = send_one(h, c, err, sizeof(err));
		pthread_mutex_lock(&h->lock);
		/* Log changes only: a down kiln-api must not flood the log. */
		if (strcmp(err, h->last_error)) {
			if (r < 0)
				fprintf(stderr, "kiln-host: heartbeat to %s failed: %s (retrying every %u ms)\n", h->url, err,
					h->period_ms);
			else
				fprintf(stderr, "kiln-host: registered with %s\n", h->url);
			snprintf(h->last_error, sizeof(h->last_error), "%s", err);
		}
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += h->period_ms / 1000;
		ts.tv_nsec += (long)(h->period_ms % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		while (!h->stopping && pthread_cond_timedwait(&h->wake, &h->lock, &ts) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&h->lock);
	if (c)
		curl_easy_cleanup(c);
	return NULL;
}

struct heartbeat *heartbeat_start(struct hostd *d, const char *api, const char *host_id, const char *advertise,
				  const char *token, unsigned period_ms, struct kiln_err *err)
{
	struct heartbeat *h = calloc(1, sizeof(*h));
	pthread_condattr_t ca;
	size_t n;

	if (!h)
		goto oom;
	h->d = d;
	h->period_ms = period_ms ? period_ms : 1000;
	n = strlen(api);
	while (n && api[n - 1] == '/')
		n--;
	if (asprintf(&h->url, "%.*s/v1/hosts/%s/heartbeat", (int)n, api, host_id) < 0 ||
	    asprintf(&h->auth, "Authorization: Bearer %s", token) < 0 || !(h->advertise = strdup(advertise)))
		goto oom;
	pthread_mutex_init(&h->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&h->wake, &ca);
	pthread_condattr_destroy(&ca);
	strcpy(h->last_error, "(none yet)");
	h->started = pthread_create(&h->thread, NULL, heartbeat_main, h) == 0;
	if (!h->started) {
		kiln_err_set(err, "host_error", "cannot start the heartbeat thread");
		heartbeat_stop(h);
		return NULL;
	}
	return h;
oom:
	kiln_err_set(err, "host_error", "out of memory");
	heartbeat_stop(h);
	return NULL;
}

void heartbeat_stop(struct heartbeat *h)
{
	if (!h)
		return;
	if (h->started) {
		pthread_mutex_lock(&h->lock);
		h->stopping = 1;
		pthread_cond_broadcast(&h->wake);
		pthread_mutex_unlock(&h->lock);
		pthread_join(h->thread, NULL);
	}
	free(h->url);
	free(h->auth);
	free(h->advertise);
	free(h);
}
