/* events: kiln-api's event hub (see events.h): a table of per-task event
 * logs (lib/evlog.h, under h->lock, one condition variable, one shared
 * memory pool), fed by the store's listener (state changes) and by
 * events_task_event (the scheduler's relay of host output). */
#include "events.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "condwait.h"

#define EV_BUCKETS 1024
#define EV_MAX_TASKS 4096
#define EV_TASK_MAX_BYTES (1u << 20)
#define EV_TOTAL_MAX_BYTES (256u << 20)

struct ev_task {
	char id[40];
	struct evlog log;            /* closed once final */
	enum task_state last_state;
	int final;
	unsigned refs;
	int64_t touched_ms;
	struct ev_task *next;
};

struct events {
	struct store *st;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct ev_task *tab[EV_BUCKETS];
	size_t count;
	struct evlog_pool pool;
	int stopping;
};

static unsigned ev_hash(const char *id)
{
	unsigned h = 2166136261u;

	for (; *id; id++)
		h = (h ^ (unsigned char)*id) * 16777619u;
	return h % EV_BUCKETS;
}

static struct ev_task *ev_find_locked(struct events *h, const char *id)
{
	for (struct ev_task *t = h->tab[ev_hash(id)]; t; t = t->next)
		if (!strcmp(t->id, id))
			return t;
	return NULL;
}

static void ev_free(struct ev_task *t)
{
	evlog_free(&t->log);
	free(t);
}

static void ev_unlink_locked(struct events *h, struct ev_task *t)
{
	struct ev_task **p = &h->tab[ev_hash(t->id)];

	while (*p != t)
		p = &(*p)->next;
	*p = t->next;
	h->count--;
}

/* Drop the oldest finished lists nobody reads until within the bounds. */
static void ev_evict_locked(struct events *h)
{
	while (h->count > EV_MAX_TASKS || h->pool.bytes > h->pool.max) {
		struct ev_task *victim = NULL;

		for (unsigned b = 0; b < EV_BUCKETS; b++)
			for (struct ev_task *t = h->tab[b]; t; t = t->next)
				if (!t->refs && (t->final || h->count > EV_MAX_TASKS) &&
				    (!victim || (t->final && !victim->final) ||
				     (t->final == victim->final && t->touched_ms < victim->touched_ms)))
					victim = t;
		if (!victim)
			return;
		ev_unlink_locked(h, victim);
		ev_free(victim);
	}
}

static void ev_reclaim(void *events)
{
	ev_evict_locked(events);
}

/* Append "event: NAME\ndata: JSON\n\n" (h->lock held). */
static void ev_append_locked(struct events *h, struct ev_task *t, const char *name, json_t *data)
{
	int is_state = !strcmp(name, "state");

	t->refs++; /* what ev_reclaim may drop to make room is never t itself */
	if (evlog_append_locked(&t->log, name, data) < 0) {
		t->refs--;
		return;
	}
	t->refs--;
	t->touched_ms = clock_mono_ms();
	if (is_state) {
		enum task_state st = task_state_parse(json_string_value(json_object_get(data, "state")));

		t->last_state = st;
		if (task_state_final(st)) {
			t->final = 1;
			evlog_close_locked(&t->log);
		}
	}
}

static json_t *state_data(enum task_state st)
{
	return json_pack("{s:s, s:I}", "state", task_state_name(st), "at", (json_int_t)clock_wall_ms());
}

/* The task's list with a reference taken, made (starting with the task's
 * current state) if there is none. NULL when the store has no such task. */
struct ev_task *events_get(struct events *h, const char *id)
{
	enum task_state st, st2;
	struct ev_task *t;

	pthread_mutex_lock(&h->lock);
	t = ev_find_locked(h, id);
	if (t) {
		t->refs++;
		pthread_mutex_unlock(&h->lock);
		return t;
	}
	pthread_mutex_unlock(&h->lock);
	/* The store is read without ev_lock held: its listener takes ev_lock
	 * while the store may be busy, never the other way round. */
	if (store_task_state(h->st, id, &st) < 0)
		return NULL;
	pthread_mutex_lock(&h->lock);
	t = ev_find_locked(h, id);
	if (!t) {
		json_t *d = state_data(st);

		t = calloc(1, sizeof(*t));
		if (!t) {
			pthread_mutex_unlock(&h->lock);
			json_decref(d);
			return NULL;
		}
		snprintf(t->id, sizeof(t->id), "%s", id);
		evlog_init(&t->log, &(struct evlog_opts){ .lock = &h->lock, .cond = &h->cond,
							  .stopping = &h->stopping, .max_bytes = EV_TASK_MAX_BYTES,
							  .pool = &h->pool, .reclaim = ev_reclaim, .reclaim_ctx = h,
							  .truncated_data = "{}" });
		t->last_state = TASK_STATE_COUNT;
		t->next = h->tab[ev_hash(id)];
		h->tab[ev_hash(id)] = t;
		h->count++;
		ev_append_locked(h, t, "state", d);
		json_decref(d);
		ev_evict_locked(h);
	}
	t->refs++;
	pthread_mutex_unlock(&h->lock);
	/* A change committed between the read above and the list's creation
	 * reached no list: look once more. */
	if (store_task_state(h->st, id, &st2) == 0) {
		pthread_mutex_lock(&h->lock);
		if (st2 != t->last_state && !t->final) {
			json_t *d = state_data(st2);

			ev_append_locked(h, t, "state", d);
			json_decref(d);
		}
		pthread_mutex_unlock(&h->lock);
	}
	return t;
}

void events_put(struct events *h, struct ev_task *t)
{
	pthread_mutex_lock(&h->lock);
	t->refs--;
	pthread_mutex_unlock(&h->lock);
}

void events_store_listener(void *arg, const char *task_id, const char *event, json_t *data)
{
	struct events *h = arg;
	struct ev_task *t;

	pthread_mutex_lock(&h->lock);
	t = ev_find_locked(h, task_id);
	if (t && !(t->final && !strcmp(event, "state")))
		ev_append_locked(h, t, event, data);
	pthread_mutex_unlock(&h->lock);
}

void events_task_event(struct events *h, const char *task_id, const char *event, json_t *data)
{
	struct ev_task *t;

	if (!strcmp(event, "state") || !data)
		return;
	t = events_get(h, task_id);
	if (!t)
		return;
	pthread_mutex_lock(&h->lock);
	ev_append_locked(h, t, event, data);
	t->refs--;
	pthread_mutex_unlock(&h->lock);
}

struct events *events_new(struct store *st)
{
	struct events *h = calloc(1, sizeof(*h));

	if (!h)
		return NULL;
	h->st = st;
	pthread_mutex_init(&h->lock, NULL);
	condwait_init(&h->cond); /* evlog_read times its waits in clock_mono_ms */
	h->pool.max = EV_TOTAL_MAX_BYTES;
	return h;
}

void events_stop(struct events *h)
{
	pthread_mutex_lock(&h->lock);
	h->stopping = 1;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
}

int events_stopping(struct events *h)
{
	return condwait_flag(&h->lock, &h->stopping);
}

long events_read(struct ev_task *t, struct evlog_cursor *cur, char *buf, size_t max, int64_t deadline_ms)
{
	return evlog_read(&t->log, cur, buf, max, deadline_ms, 0);
}

void events_free(struct events *h)
{
	if (!h)
		return;
	for (unsigned b = 0; b < EV_BUCKETS; b++)
		for (struct ev_task *t = h->tab[b], *n; t; t = n) {
			n = t->next;
			ev_free(t);
		}
	pthread_mutex_destroy(&h->lock);
	pthread_cond_destroy(&h->cond);
	free(h);
}
