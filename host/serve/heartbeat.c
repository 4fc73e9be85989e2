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
	struct apilist api;     /* kiln-api base URLs; api.cur the one in use */
	char *host_id, *advertise, *token;
	char *ca_file;          /* NULL: the system's CAs */
	unsigned period_ms;
	pthread_t thread;
	int started;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	int stopping;
	/* What the last attempt on each URL came to ("" ok), logged on change. */
	char last[APILIST_MAX][192];
};

/* One round's context for apilist_try. */
struct beat {
	struct heartbeat *h;
	struct httpc *c;
};

/* One heartbeat to url; returns 0 or -1 with a message in err (cap bytes)
 * and *status the HTTP status (0: none came: no connection, a timeout). */
static int send_one(struct heartbeat *h, struct httpc *c, const char *url, long *status, char *err, size_t cap)
{
	json_t *body = json_pack("{s:s, s:o}", "url", h->advertise, "capacity", hostd_capacity_json(h->d));
	/* A replica's machine gone silent costs the connect timeout, not the
	 * whole one, before the next URL is tried. */
	struct httpc_req q = {
		.method = "POST", .url = url, .bearer = h->token, .ca_file = h->ca_file,
		.lim = { .timeout_ms = 5000, .connect_timeout_ms = 2000 },
	};
	struct httpc_reply r;
	int rc;

	*status = 0;
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
	*status = r.status;
	if (r.status != 200) {
		snprintf(err, cap, "HTTP %ld%s", r.status, r.status == 401 ? " (wrong cluster token?)" : "");
		return -1;
	}
	return 0;
}

/* apilist_try's send: one heartbeat to base. No connection, a timeout or a
 * 5xx moves on to the next URL; another refusal (401...) would be the same
 * everywhere. A heartbeat is an upsert of the host's row (its URL, capacity
 * and the receiving replica's time), so one that timed out yet arrived, then
 * sent again to the next replica, is applied twice harmlessly. */
static enum apilist_outcome beat_send(void *ctx, const char *base)
{
	struct beat *b = ctx;
	struct heartbeat *h = b->h;
	unsigned k;
	char url[APILIST_URL_MAX + 128], err[160] = "";
	long status;
	int r;

	for (k = 0; k < h->api.n && h->api.url[k] != base; k++)
		;
	snprintf(url, sizeof(url), "%s/v1/hosts/%s/heartbeat", base, h->host_id);
	r = send_one(h, b->c, url, &status, err, sizeof(err));
	/* Log changes only: a down kiln-api must not flood the log. */
	if (k < APILIST_MAX && strcmp(err, h->last[k])) {
		if (r < 0)
			fprintf(stderr, "kiln-host: heartbeat to %s failed: %s (%s)\n", url, err,
				h->api.n > 1 && (status == 0 || status >= 500) ? "trying the next kiln-api URL"
									 : "retrying every period");
		else
			fprintf(stderr, "kiln-host: registered with %s\n", base);
		snprintf(h->last[k], sizeof(h->last[k]), "%s", err);
	}
	if (r == 0)
		return APILIST_OK;
	return status == 0 || status >= 500 ? APILIST_NEXT : APILIST_STOP;
}

static void *heartbeat_main(void *arg)
{
	struct heartbeat *h = arg;
	struct beat b = { .h = h, .c = httpc_new() }; /* one connection, kept across beats */

	pthread_mutex_lock(&h->lock);
	while (!h->stopping && b.c) {
		struct timespec ts;

		pthread_mutex_unlock(&h->lock);
		apilist_try(&h->api, beat_send, &b);
		pthread_mutex_lock(&h->lock);
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
	httpc_free(b.c);
	return NULL;
}

struct heartbeat *heartbeat_start(struct hostd *d, const struct apilist *api, const char *host_id,
				  const char *advertise, const char *token, const char *ca_file, unsigned period_ms,
				  struct kiln_err *err)
{
	struct heartbeat *h = calloc(1, sizeof(*h));
	unsigned i;

	if (!h)
		goto oom;
	h->d = d;
	h->period_ms = period_ms ? period_ms : 1000;
	if (apilist_copy(&h->api, api) < 0 || !(h->host_id = strdup(host_id)) || !(h->token = strdup(token)) ||
	    !(h->advertise = strdup(advertise)) || (ca_file && !(h->ca_file = strdup(ca_file))))
		goto oom;
	for (i = 0; i < APILIST_MAX; i++)
		strcpy(h->last[i], "(none yet)");
	pthread_mutex_init(&h->lock, NULL);
	condwait_init(&h->wake);
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
	apilist_free(&h->api);
	free(h->host_id);
	free(h->token);
	free(h->ca_file);
	free(h->advertise);
	free(h);
}
