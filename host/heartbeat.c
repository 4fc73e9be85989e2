/* heartbeat: the kiln-host side of host registration with kiln-api. */
#include "heartbeat.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "condwait.h"
#include "httpc.h"
#include "proto.h"

struct heartbeat {
	struct hostd *d;
	char *url, *advertise, *token;
	unsigned period_ms;
	pthread_t thread;
	int started;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	int stopping;
	char last_error[256];
};

/* One heartbeat; returns 0 or -1 with a message in err (cap bytes). */
static int send_one(struct heartbeat *h, struct httpc *c, char *err, size_t cap)
{
	json_t *body = json_pack("{s:s, s:o}", "url", h->advertise, "capacity", hostd_capacity_json(h->d));
	struct httpc_req q = {
		.method = "POST", .url = h->url, .bearer = h->token, .lim = { .timeout_ms = 5000 },
	};
	struct httpc_reply r;
	int rc;

	if (!body) {
		snprintf(err, cap, "out of memory");
		return -1;
	}
	rc = httpc_json(c, &q, body, NULL, &r);
	json_decref(body);
	httpc_reply_free(&r);
	if (rc < 0) {
		snprintf(err, cap, "%s", r.error);
		return -1;
	}
	if (r.status != 200) {
		snprintf(err, cap, "HTTP %ld%s", r.status, r.status == 401 ? " (wrong cluster token?)" : "");
		return -1;
	}
	return 0;
}

static void *heartbeat_main(void *arg)
{
	struct heartbeat *h = arg;
	struct httpc *c = httpc_new(); /* one connection, kept across beats */

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
	httpc_free(c);
	return NULL;
}

struct heartbeat *heartbeat_start(struct hostd *d, const char *api, const char *host_id, const char *advertise,
				  const char *token, unsigned period_ms, struct kiln_err *err)
{
	struct heartbeat *h = calloc(1, sizeof(*h));
	size_t n;

	if (!h)
		goto oom;
	h->d = d;
	h->period_ms = period_ms ? period_ms : 1000;
	n = strlen(api);
	while (n && api[n - 1] == '/')
		n--;
	if (asprintf(&h->url, "%.*s/v1/hosts/%s/heartbeat", (int)n, api, host_id) < 0 ||
	    !(h->token = strdup(token)) || !(h->advertise = strdup(advertise)))
		goto oom;
	pthread_mutex_init(&h->lock, NULL);
	condwait_init(&h->wake);
	strcpy(h->last_error, "(none yet)");
	h->started = pthread_create(&h->thread, NULL, heartbeat_main, h) == 0;
	if (!h->started) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot start the heartbeat thread");
		heartbeat_stop(h);
		return NULL;
	}
	return h;
oom:
	kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
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
	free(h->token);
	free(h->advertise);
	free(h);
}
