/* scheduler_watch: a placed task's watcher thread (see scheduler.h): it
 * pushes the task to its host (POST /v1/tasks; a 409 means a previous
 * kiln-api already did), follows the host's event stream and records each
 * state in the store with compare-and-set transitions, so that a task
 * cancelled or requeued meanwhile is never overwritten; and the helpers the
 * scheduler thread (scheduler.c) shares with it. */
#include "scheduler_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "clock.h"
#include "condwait.h"
#include "excerpt.h"
#include "hostcall/host_ops.h"

int sched_host_call(struct sched *s, const char *url, const char *method, const char *path, json_t *body,
		    long timeout_ms, json_t **reply, struct kiln_err *err)
{
	return s->ops->call(s->ops->ctx, url, s->token, method, path, body, timeout_ms, reply, err);
}

struct host_view *sched_host_find_locked(struct sched *s, const char *id)
{
	for (int i = 0; i < s->nhosts; i++)
		if (!strcmp(s->hosts[i].id, id))
			return &s->hosts[i];
	return NULL;
}

static void relay(struct sched *s, const char *task, const char *event, json_t *data)
{
	if (s->cfg.relay)
		s->cfg.relay(s->cfg.relay_ctx, task, event, data);
}

/* ---- watchers ---- */

/* The task's state in the store (TASK_STATE_COUNT if it is gone). */
static enum task_state stored_state(struct sched *s, const char *id)
{
	json_t *j = store_task_json(s->st, id, NULL);
	enum task_state st = task_state_parse(json_string_value(json_object_get(j, "state")));

	json_decref(j);
	return st;
}

/* Record the host's progress with compare-and-set from what this watcher
 * last recorded. Returns 1 recorded, 0 when the store moved on without us
 * (the task was cancelled through the API meanwhile: the host is told). */
static int transition(struct watch *w, enum task_state to)
{
	if (w->state == to || to < w->state)
		return 1;
	if (store_task_transition(w->s->st, w->task, w->state, to, NULL) == 1) {
		w->state = to;
		return 1;
	}
	if (stored_state(w->s, w->task) == TASK_CANCELLED) {
		char path[80];
		struct kiln_err err = { .code = "" };

		snprintf(path, sizeof(path), "/v1/tasks/%s", w->task);
		sched_host_call(w->s, w->url, "DELETE", path, NULL, 5000, NULL, &err);
		w->state = TASK_CANCELLED; /* final in the store: stop following */
	}
	return 0;
}

static int finish(struct watch *w, json_t *host_task)
{
	json_t *res = json_object_get(host_task, "result");
	enum task_state st = task_state_parse(json_string_value(json_object_get(host_task, "state")));
	const char *reason = json_string_value(json_object_get(res, "end_reason"));

	if (!task_state_final(st))
		return 0;
	/* Requeued off a draining host (drain_requeue): the host's end of it
	 * (cancelled there) is not the task's. */
	if (__atomic_load_n(&w->superseded, __ATOMIC_ACQUIRE)) {
		w->state = TASK_QUEUED;
		return 1;
	}
	/* The store keeps an excerpt, whatever the host sent: the logs are in S3. */
	excerpt_result(res, EXCERPT_BYTES);
	store_task_finish(w->s->st, w->task, st, reason ? reason : "", host_task);
	w->state = st;
	return 1;
}

struct follow_ctx {
	struct watch *w;
	int final_seen;
	json_t *task; /* the final event's task JSON, when the host sent it */
};

static int on_host_event(void *ctx, const char *name, json_t *data)
{
	struct follow_ctx *f = ctx;
	struct watch *w = f->w;

	relay(w->s, w->task, name, data);
	if (!strcmp(name, "state")) {
		enum task_state st = task_state_parse(json_string_value(json_object_get(data, "state")));

		if ((st == TASK_STARTING || st == TASK_RUNNING || st == TASK_UPLOADING) && !transition(w, st) &&
		    task_state_final(w->state))
			return 1;
		else if (task_state_final(st)) {
			json_t *t = json_object_get(data, "task");

			f->final_seen = 1;
			/* The task JSON rides on the final event (kiln-host since
			 * manifest v2); else it is fetched next. */
			if (json_is_object(t) && !strcmp(json_string_value(json_object_get(t, "id")) ?: "", w->task) &&
			    task_state_final(task_state_parse(json_string_value(json_object_get(t, "state"))))) {
				json_decref(f->task);
				f->task = json_incref(t);
			}
			return 1;
		}
	}
	return 0;
}

int sched_stopping(struct sched *s)
{
	return condwait_flag(&s->lock, &s->stopping);
}

static int host_is_lost(struct sched *s, const char *host)
{
	struct host_view *h;
	int lost;

	pthread_mutex_lock(&s->lock);
	h = sched_host_find_locked(s, host);
	lost = !h || h->lost;
	pthread_mutex_unlock(&s->lock);
	return lost;
}

/* Push the task to its host. 1 pushed (or already there), 0 refused for now
 * (requeued), -1 host unreachable (left scheduled: lost-host handling or a
 * later retry settles it). */
static int push(struct watch *w)
{
	struct sched *s = w->s;
	struct store_task_push tp;
	json_t *spec, *body, *reply = NULL;
	struct kiln_err err = { .code = "" };
	int st;

	/* One read: the task's state and host, spec, template and destination. */
	if (store_task_push_get(s->st, w->task, w->host, &tp) < 0)
		return -1;
	spec = tp.spec ? json_loads(tp.spec, 0, NULL) : NULL;
	if (!spec) {
		store_task_push_free(&tp);
		return -1;
	}
	if (!tp.scheduled_on) {
		/* Cancelled, or requeued (and maybe placed elsewhere), before it
		 * reached the host: nothing to push. */
		json_decref(spec);
		store_task_push_free(&tp);
		w->state = TASK_QUEUED;
		return 0;
	}
	body = json_pack("{s:s, s:s, s:o}", "id", w->task, "customer", w->customer, "spec", spec);
	{
		/* The customer's own S3 destination, if it has one: its outputs,
		 * logs and manifest go there. One it has but that cannot be opened
		 * fails the task: never kiln's bucket instead. */
		struct dest d;
		char dest_id[40];
		int r = tp.has_dest ? destination_unseal(s->cfg.dest_key, w->customer, &tp.dest, &d, dest_id, &err) : 0;

		if (r < 0) {
			json_t *e = json_pack("{s:s, s:{s:s, s:s}}", "state", "error", "error", "code", err.code,
					      "message", err.message);

			fprintf(stderr, "kiln-api: task %s: %s\n", w->task, err.message);
			json_decref(body);
			store_task_push_free(&tp);
			store_task_finish(s->st, w->task, TASK_ERROR, err.code, e);
			json_decref(e);
			w->state = TASK_ERROR;
			return 0;
		}
		store_task_set_dest(s->st, w->task, r == 1 ? dest_id : NULL);
		if (r == 1) {
			json_object_set_new(body, "destination", dest_to_json(&d, 1));
			dest_wipe(&d);
		}
	}
	{
		/* Its template as resolved at submission (docs/templates.md):
		 * the task runs even if the template was deleted since. */
		json_t *ref = tp.template_ref ? json_loads(tp.template_ref, 0, NULL) : NULL;

		if (ref)
			json_object_set_new(body, "template", ref);
	}
	store_task_push_free(&tp);
	st = sched_host_call(s, w->url, "POST", "/v1/tasks", body, 10000, &reply, &err);
	json_decref(body); /* it held the destination's secret: not logged, freed here */
	if (st == 202 || st == 409) {
		json_decref(reply);
		return 1;
	}
	if (st > 0) {
		/* Refused (full, or the spec rejected): back to the queue, and the host
		 * is left alone for a moment. */
		struct host_view *h;

		fprintf(stderr, "kiln-api: host %s refused task %s: HTTP %d %s\n", w->host, w->task, st,
			json_string_value(json_object_get(json_object_get(reply, "error"), "message")) ?: "");
		pthread_mutex_lock(&s->lock);
		h = sched_host_find_locked(s, w->host);
		if (h)
			h->full_until_ms = kclock_mono_ms(s->clock) + HOST_FULL_BACKOFF_MS;
		pthread_mutex_unlock(&s->lock);
		json_decref(reply);
		if (st >= 400 && st < 500 && st != 409) {
			json_t *e = json_pack("{s:s, s:{s:s, s:s}}", "state", "error", "error", "code", "host_refused",
					      "message", "the host refused the task");

			store_task_finish(s->st, w->task, TASK_ERROR, "host_refused", e);
			json_decref(e);
			w->state = TASK_ERROR;
			return 0;
		}
		store_task_transition(s->st, w->task, TASK_SCHEDULED, TASK_QUEUED, "");
		w->state = TASK_QUEUED;
		return 0;
	}
	fprintf(stderr, "kiln-api: pushing task %s to %s: %s\n", w->task, w->host, err.message);
	return -1;
}

/* Sleep ms, or less when the scheduler stops. */
static void watch_sleep(struct sched *s, unsigned ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts); /* s->wake's clock */
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&s->lock);
	while (!s->stopping && pthread_cond_timedwait(&s->wake, &s->lock, &ts) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&s->lock);
}

static void *watch_main(void *arg)
{
	struct watch *w = arg;
	struct sched *s = w->s;
	unsigned backoff_ms = WATCH_BACKOFF_MIN_MS;

	while (!sched_stopping(s) && !task_state_final(w->state) && w->state != TASK_QUEUED &&
	       !__atomic_load_n(&w->superseded, __ATOMIC_ACQUIRE)) {
		struct follow_ctx f = { .w = w };
		struct kiln_err err = { .code = "" };
		json_t *t = NULL;
		int st;

		if (host_is_lost(s, w->host))
			break; /* the lost-host handling settles the task */
		if (w->push) {
			int r = push(w);

			if (r == 0)
				break;
			if (r < 0) {
				watch_sleep(s, backoff_ms);
				backoff_ms = backoff_ms * 2 < WATCH_BACKOFF_MAX_MS ? backoff_ms * 2 : WATCH_BACKOFF_MAX_MS;
				continue;
			}
			w->push = 0;
		}
		s->ops->follow(s->ops->ctx, w->url, s->token, w->task, 30, on_host_event, &f, &err);
		if (f.task) {
			t = f.task;
			st = 200;
		} else {
			char path[80];

			snprintf(path, sizeof(path), "/v1/tasks/%s", w->task);
			st = sched_host_call(s, w->url, "GET", path, NULL, 10000, &t, &err);
		}
		if (st == 200 && finish(w, t)) {
			json_decref(t);
			break;
		}
		json_decref(t);
		if (st == 404 && w->state == TASK_SCHEDULED) {
			w->push = 1; /* never arrived (a previous kiln-api died before pushing) */
			continue;
		}
		/* A round whose GET failed (host unreachable, an error status, a
		 * reply over hostclient's size cap) waits, doubling up to
		 * WATCH_BACKOFF_MAX_MS: a task whose GET keeps failing must not make
		 * this thread spin on re-following and re-GETting its host. */
		if (st == 200) {
			if (!f.final_seen)
				watch_sleep(s, WATCH_BACKOFF_MIN_MS);
			backoff_ms = WATCH_BACKOFF_MIN_MS;
		} else {
			watch_sleep(s, backoff_ms);
			backoff_ms = backoff_ms * 2 < WATCH_BACKOFF_MAX_MS ? backoff_ms * 2 : WATCH_BACKOFF_MAX_MS;
		}
	}
	pthread_mutex_lock(&s->lock);
	for (struct watch **pp = &s->watches; *pp; pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	s->nwatchers--;
	/* Capacity may have freed: the hosts are read again (sched_wake_full,
	 * under this same lock: once nwatchers is 0 sched_stop may free s). */
	s->woken = 1;
	s->want_full = 1;
	pthread_cond_broadcast(&s->wake);
	pthread_mutex_unlock(&s->lock);
	free(w);
	return NULL;
}

int sched_watch_start_locked(struct sched *s, const struct store_task *t, const struct host_view *h, int do_push)
{
	struct watch *w;
	pthread_attr_t attr;
	pthread_t th;

	for (w = s->watches; w; w = w->next) {
		if (strcmp(w->task, t->id) || __atomic_load_n(&w->superseded, __ATOMIC_ACQUIRE))
			continue;
		if (!strcmp(w->host, h->id))
			return 0;
		/* Its old watcher still waits on the host it was requeued from
		 * (lost, or refusing): it stands down, a new one takes the task
		 * to this host. */
		__atomic_store_n(&w->superseded, 1, __ATOMIC_RELEASE);
		pthread_cond_broadcast(&s->wake);
	}
	w = calloc(1, sizeof(*w));
	if (!w)
		return -1;
	w->s = s;
	snprintf(w->task, sizeof(w->task), "%s", t->id);
	snprintf(w->customer, sizeof(w->customer), "%s", t->customer);
	snprintf(w->host, sizeof(w->host), "%s", h->id);
	snprintf(w->url, sizeof(w->url), "%s", h->url);
	w->state = t->state;
	w->push = do_push;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&th, &attr, watch_main, w) != 0) {
		pthread_attr_destroy(&attr);
		free(w);
		return -1;
	}
	pthread_attr_destroy(&attr);
	w->next = s->watches;
	s->watches = w;
	s->nwatchers++;
	return 0;
}
