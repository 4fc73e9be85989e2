/* sched: placing tasks on hosts and following them there.
 *
 * One scheduler thread ticks every 100 ms (or at once on sched_wake_full):
 * refreshes the host list from the heartbeats in the store, handles hosts
 * that went quiet, forwards cancels and places queued tasks; a submission's
 * sched_wake only places (when some host has room at all). Each placed task then has a
 * watcher thread that pushes it to its host (POST /v1/tasks; a 409 means a
 * previous kiln-api already did) and follows the host's event stream,
 * recording each state in the store with compare-and-set transitions, so
 * that a task cancelled or requeued meanwhile is never overwritten. The
 * watchers are in scheduler_watch.c; scheduler_int.h is what both share. */
#include "scheduler_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "clock.h"
#include "condwait.h"
#include "hostcall/host_ops.h"
#include "spec.h"

/* ---- hosts ---- */

/* vCPUs h could still admit, by kiln-host's rule (hostd_reserve): the ones
 * running work against vcpus_total, and with the idle sessions' against
 * vcpus_idle_max (a host that does not report it: the first bound only). */
static long host_free_vcpus(const struct host_view *h)
{
	long active = (long)h->vcpus_total - (long)h->vcpus_used - (long)h->inflight_vcpus;
	long all = (long)h->vcpus_idle_max - (long)h->vcpus_used - (long)h->vcpus_idle - (long)h->inflight_vcpus;

	return h->vcpus_idle_max && all < active ? all : active;
}

/* n vCPUs left h after its last report: whether they were idle or running
 * work there is unknown here, so they come off the idle ones first (an
 * idle session is the likelier to be destroyed), then the used ones: the
 * active count may stay too high until the next heartbeat, never too low. */
static void host_vcpus_released(struct host_view *h, unsigned n)
{
	unsigned i = n < h->vcpus_idle ? n : h->vcpus_idle;

	h->vcpus_idle -= i;
	n -= i;
	h->vcpus_used -= n < h->vcpus_used ? n : h->vcpus_used;
}

/* capacity.templates of a heartbeat into v: built-ins as "@NAME", others
 * by their SHA-256. Built-ins first and always (a built-in task may only go
 * to a host that lists it: a long list of customer templates must not push
 * them out), then the first customer templates that fit HOST_TEMPLATES. */
static void host_templates(struct host_view *v, json_t *list)
{
	json_t *e;
	size_t i;

	v->ntemplates = 0;
	for (int pass = 0; pass < 2; pass++)
		json_array_foreach(list, i, e) {
			const char *name = json_string_value(json_object_get(e, "name"));
			const char *sha = json_string_value(json_object_get(e, "sha256"));
			int builtin = json_is_true(json_object_get(e, "builtin"));
			struct host_template *ht;
			json_int_t ready = json_integer_value(json_object_get(e, "ready"));

			if (v->ntemplates >= HOST_TEMPLATES)
				return;
			if (builtin != (pass == 0))
				continue;
			ht = &v->templates[v->ntemplates];
			if (builtin && name && strlen(name) < sizeof(ht->key) - 1)
				snprintf(ht->key, sizeof(ht->key), "@%s", name);
			else if (!builtin && sha && strlen(sha) == 64)
				snprintf(ht->key, sizeof(ht->key), "%s", sha);
			else
				continue;
			ht->ready = ready > 0 ? (unsigned)(ready < 1000000 ? ready : 1000000) : 0;
			v->ntemplates++;
		}
}

/* The host's entry for a template key, or NULL. */
static struct host_template *host_template_find(struct host_view *h, const char *key)
{
	for (int i = 0; i < h->ntemplates; i++)
		if (!strcmp(h->templates[i].key, key))
			return &h->templates[i];
	return NULL;
}

static void refresh_hosts_locked(struct sched *s)
{
	json_t *list = store_host_list(s->st), *h;
	size_t i;
	int n = 0;
	struct host_view old[MAX_HOSTS];
	int nold = s->nhosts;

	memcpy(old, s->hosts, sizeof(old[0]) * (size_t)nold);
	json_array_foreach(json_is_array(list) ? list : json_object_get(list, "hosts"), i, h) {
		struct host_view *v = &s->hosts[n];
		json_t *cap = json_object_get(h, "capacity");
		const char *id = json_string_value(json_object_get(h, "id"));

		if (!id || n >= MAX_HOSTS)
			continue;
		memset(v, 0, sizeof(*v));
		snprintf(v->id, sizeof(v->id), "%s", id);
		snprintf(v->url, sizeof(v->url), "%s", json_string_value(json_object_get(h, "url")) ?: "");
		v->last_hb_ms = json_integer_value(json_object_get(h, "last_heartbeat_ms"));
		v->lost = json_is_true(json_object_get(h, "lost")) ||
			  !strcmp(json_string_value(json_object_get(h, "state")) ?: "", "lost");
		v->vcpus_total = (unsigned)json_integer_value(json_object_get(json_object_get(cap, "vcpus"), "total"));
		v->vcpus_used = (unsigned)json_integer_value(json_object_get(json_object_get(cap, "vcpus"), "used"));
		v->vcpus_idle = (unsigned)json_integer_value(json_object_get(json_object_get(cap, "vcpus"), "idle"));
		v->vcpus_idle_max = (unsigned)json_integer_value(json_object_get(json_object_get(cap, "vcpus"), "idle_max"));
		v->mem_total = (uint64_t)json_integer_value(json_object_get(json_object_get(cap, "memory_mib"), "total"));
		v->mem_used = (uint64_t)json_integer_value(json_object_get(json_object_get(cap, "memory_mib"), "used"));
		v->pool_ready = (unsigned)json_integer_value(json_object_get(json_object_get(cap, "pool"), "ready"));
		v->pool_mem = (unsigned)json_integer_value(json_object_get(json_object_get(cap, "pool"), "memory_mib"));
		v->pool_vcpus = (unsigned)json_integer_value(json_object_get(json_object_get(cap, "pool"), "vcpus"));
		v->egress = json_is_true(json_object_get(cap, "egress"));
		v->draining = json_is_true(json_object_get(h, "draining"));
		v->drain_deadline_ms = json_integer_value(json_object_get(h, "drain_deadline_ms"));
		host_templates(v, json_object_get(cap, "templates"));
		for (int j = 0; j < nold; j++) {
			if (strcmp(old[j].id, v->id))
				continue;
			/* Our placements since its last report stay counted until the
			 * next heartbeat includes them. */
			if (old[j].last_hb_ms == v->last_hb_ms) {
				v->inflight_vcpus = old[j].inflight_vcpus;
				v->inflight_mem = old[j].inflight_mem;
				v->released_vcpus = old[j].released_vcpus;
				v->released_mem = old[j].released_mem;
				memcpy(v->templates, old[j].templates, sizeof(v->templates));
				v->ntemplates = old[j].ntemplates;
			}
			v->full_until_ms = old[j].full_until_ms;
			v->was_lost = old[j].lost;
		}
		host_vcpus_released(v, v->released_vcpus);
		v->mem_used -= v->released_mem < v->mem_used ? v->released_mem : v->mem_used;
		n++;
	}
	s->nhosts = n;
	json_decref(list);
	pthread_cond_broadcast(&s->hosts_read);
}

/* A host went quiet: tasks it never started go back to the queue; started
 * ones end (their code may have had side effects: not run twice). */
static void host_lost(struct sched *s, const char *host)
{
	static const enum task_state started[] = { TASK_STARTING, TASK_RUNNING, TASK_UPLOADING };
	struct store_task *t = calloc(MAX_BATCH, sizeof(*t));
	int n;

	if (!t)
		return;
	fprintf(stderr, "kiln-api: host %s is lost (no heartbeat)\n", host);
	store_host_set_lost(s->st, host, 1);
	n = store_tasks_in_state(s->st, TASK_SCHEDULED, t, MAX_BATCH);
	for (int i = 0; i < n; i++)
		if (!strcmp(t[i].host_id, host))
			store_task_transition(s->st, t[i].id, TASK_SCHEDULED, TASK_QUEUED, "");
	for (size_t k = 0; k < sizeof(started) / sizeof(*started); k++) {
		n = store_tasks_in_state(s->st, started[k], t, MAX_BATCH);
		for (int i = 0; i < n; i++) {
			json_t *e;

			if (strcmp(t[i].host_id, host))
				continue;
			e = json_pack("{s:s, s:{s:s, s:s, s:s}}", "state", "error", "result", "end_reason", "host_lost",
				      "state", "error", "error", "the task's host stopped answering; it was not run again");
			store_task_finish(s->st, t[i].id, TASK_ERROR, "host_lost", e);
			json_decref(e);
		}
	}
	free(t);
}

/* A draining host's deadline passed: the tasks still running there go back
 * to the queue (placed elsewhere, from the start: the deadline is the
 * operator's word that they may run again) and are cancelled on it. Tasks
 * uploading have run to the end and are left to finish. The watcher of
 * each is marked superseded after the compare-and-set, so that the host's
 * answer to the cancel is not recorded over the requeue. */
static void drain_requeue(struct sched *s, const char *host, const char *url)
{
	static const enum task_state placed[] = { TASK_SCHEDULED, TASK_STARTING, TASK_RUNNING };
	struct store_task *t = calloc(MAX_BATCH, sizeof(*t));

	if (!t)
		return;
	for (size_t k = 0; k < sizeof(placed) / sizeof(*placed); k++) {
		int n = store_tasks_in_state(s->st, placed[k], t, MAX_BATCH);

		for (int i = 0; i < n; i++) {
			struct kiln_err err = { .code = "" };
			char path[80];

			if (strcmp(t[i].host_id, host) || store_task_transition(s->st, t[i].id, placed[k], TASK_QUEUED, "") != 1)
				continue;
			pthread_mutex_lock(&s->lock);
			for (struct watch *w = s->watches; w; w = w->next)
				if (!strcmp(w->task, t[i].id))
					__atomic_store_n(&w->superseded, 1, __ATOMIC_RELEASE);
			pthread_mutex_unlock(&s->lock);
			snprintf(path, sizeof(path), "/v1/tasks/%s", t[i].id);
			if (url[0])
				sched_host_call(s, url, "DELETE", path, NULL, 5000, NULL, &err);
			fprintf(stderr, "kiln-api: host %s is draining past its deadline: task %s (%s) requeued\n", host,
				t[i].id, task_state_name(placed[k]));
		}
	}
	free(t);
}

/* A host we had given up on is back: whatever it still runs that the store
 * has settled otherwise (requeued elsewhere, or ended as host_lost) is
 * cancelled there, so that no task's code runs twice to completion. */
static void reconcile(struct sched *s, const char *host, const char *url)
{
	struct kiln_err err = { .code = "" };
	json_t *reply = NULL, *t;
	size_t i;
	int st = sched_host_call(s, url, "GET", "/v1/tasks", NULL, 5000, &reply, &err);

	if (st != 200) {
		fprintf(stderr, "kiln-api: reconciling with host %s: %s\n", host, st < 0 ? err.message : "unexpected status");
		json_decref(reply);
		return;
	}
	json_array_foreach(json_object_get(reply, "tasks"), i, t) {
		const char *id = json_string_value(json_object_get(t, "id"));
		json_t *mine = id ? store_task_json(s->st, id, NULL) : NULL;
		enum task_state ms = task_state_parse(json_string_value(json_object_get(mine, "state")));
		const char *mh = json_string_value(json_object_get(mine, "host"));
		char path[80];

		if (!id)
			continue;
		if (!mine || task_state_final(ms) || ms == TASK_QUEUED || !mh || strcmp(mh, host)) {
			snprintf(path, sizeof(path), "/v1/tasks/%s", id);
			sched_host_call(s, url, "DELETE", path, NULL, 5000, NULL, &err);
			fprintf(stderr, "kiln-api: host %s still had task %s (%s here): cancelled there\n", host, id,
				mine ? task_state_name(ms) : "unknown");
		}
		json_decref(mine);
	}
	json_decref(reply);
}

/* ---- placement ---- */

static int excluded(const char *id, char (*exclude)[65], int nexclude)
{
	for (int i = 0; i < nexclude; i++)
		if (!strcmp(exclude[i], id))
			return 1;
	return 0;
}

/* The best host for t now, or NULL; hosts named in exclude are skipped.
 * A task of a template prefers a host with a warm VM of it, then one that
 * holds it, then any (which fetches it from S3); a built-in template goes
 * only to hosts that list it. A task of the default template prefers a
 * warm pool VM of its size. Then the emptiest host. A host named by
 * prefer (sessions: the one that paused it) comes before all of those. */
static struct host_view *pick_host_locked(struct sched *s, const struct store_task *t, const char *prefer,
					  int64_t now, char (*exclude)[65], int nexclude)
{
	struct host_view *best = NULL;
	long best_score = -1;
	int dflt = !t->tkey[0];

	for (int i = 0; i < s->nhosts; i++) {
		struct host_view *h = &s->hosts[i];
		struct host_template *ht = dflt ? NULL : host_template_find(h, t->tkey);
		long free_v, score;
		int64_t free_m;

		/* A draining host takes nothing new: not a queued task, not a
		 * session's create, not even the resume that prefers it. */
		if (h->lost || h->draining || !h->url[0] || now < h->full_until_ms || (t->egress && !h->egress) ||
		    excluded(h->id, exclude, nexclude))
			continue;
		if (t->tkey[0] == '@' && !ht)
			continue;
		free_v = host_free_vcpus(h);
		free_m = (int64_t)h->mem_total - (int64_t)h->mem_used - (int64_t)h->inflight_mem;
		/* A pool VM of the task's size brings its own memory (pool VMs
		 * have no NIC: not for a task with egress). */
		if (dflt && !t->egress && h->pool_ready && h->pool_mem == t->memory_mib && h->pool_vcpus == t->vcpus)
			free_m += h->pool_mem;
		if (free_v < (long)t->vcpus || free_m < (int64_t)t->memory_mib)
			continue;
		score = free_v * 1000 / (long)(h->vcpus_total ? h->vcpus_total : 1);
		if (dflt)
			score += !t->egress && h->pool_ready > h->inflight_vcpus && h->pool_mem == t->memory_mib ? 1000000 : 0;
		else if (ht)
			score += ht->ready ? 3000000 : 2000000;
		if (prefer && prefer[0] && !strcmp(h->id, prefer))
			score += 4000000;
		if (score > best_score) {
			best = h;
			best_score = score;
		}
	}
	return best;
}

/* What was placed on h since its last heartbeat is counted until the next
 * one reports it (and a pool VM of its size is taken). */
static void reserve_locked(struct host_view *h, const struct store_task *t)
{
	h->inflight_vcpus += t->vcpus;
	h->inflight_mem += t->memory_mib;
	if (!t->tkey[0] && !t->egress && h->pool_ready && h->pool_mem == t->memory_mib)
		h->pool_ready--;
	if (t->tkey[0]) {
		struct host_template *ht = host_template_find(h, t->tkey);

		if (ht && ht->ready)
			ht->ready--;
	}
}

/* Could some live host take a task of the smallest size now? When none
 * can, the queue is not read at all: with thousands of tasks queued (the
 * hosts full) reading it fairly is the costliest query there is, and it
 * would run on every submission's wake-up. */
static int any_room_locked(struct sched *s, int64_t now)
{
	for (int i = 0; i < s->nhosts; i++) {
		const struct host_view *h = &s->hosts[i];
		long free_v = host_free_vcpus(h);
		int64_t free_m = (int64_t)h->mem_total - (int64_t)h->mem_used - (int64_t)h->inflight_mem;

		if (h->pool_ready)
			free_m += h->pool_mem;
		if (!h->lost && !h->draining && h->url[0] && now >= h->full_until_ms && free_v >= SPEC_MIN_VCPUS &&
		    free_m >= SPEC_MIN_MEMORY_MIB)
			return 1;
	}
	return 0;
}

static void place(struct sched *s)
{
	struct store_task *q;
	char capped[64][65];
	int n, ncapped = 0;
	int64_t now = kclock_mono_ms(s->clock);

	pthread_mutex_lock(&s->lock);
	n = any_room_locked(s, now);
	pthread_mutex_unlock(&s->lock);
	if (!n)
		return;
	q = calloc(MAX_BATCH, sizeof(*q));

	if (!q)
		return;
	/* Round-robin over customers, FIFO within each (the store orders them):
	 * one busy customer cannot starve the others. */
	n = store_tasks_queued_fair(s->st, q, MAX_BATCH);
	for (int i = 0; i < n; i++) {
		struct host_view *h;
		int skip = 0, r;

		for (int k = 0; k < ncapped; k++)
			skip |= !strcmp(capped[k], q[i].customer);
		if (skip)
			continue;
		pthread_mutex_lock(&s->lock);
		h = pick_host_locked(s, &q[i], NULL, now, NULL, 0);
		if (!h) {
			/* No host fits it now; smaller tasks of other customers may fit. */
			pthread_mutex_unlock(&s->lock);
			continue;
		}
		/* Checked against the customer's running quota and moved in one
		 * transaction: at its cap the task simply stays queued. */
		r = store_task_schedule(s->st, q[i].id, h->id);
		if (r == 1) {
			q[i].state = TASK_SCHEDULED;
			reserve_locked(h, &q[i]);
			sched_watch_start_locked(s, &q[i], h, 1);
		} else if (r == -EDQUOT && ncapped < 64) {
			snprintf(capped[ncapped++], sizeof(capped[0]), "%s", q[i].customer);
		}
		pthread_mutex_unlock(&s->lock);
	}
	free(q);
}

/* Cancels requested through the API for placed tasks: tell their hosts. */
static void forward_cancels(struct sched *s)
{
	struct store_task t[32];
	int n = store_tasks_cancel_pending(s->st, t, 32);

	for (int i = 0; i < n; i++)
		if (sched_cancel(s, t[i].id) == 0)
			store_task_cancel_sent(s->st, t[i].id);
}

/* Follow tasks a previous kiln-api placed (and push those it may not have). */
static void reattach(struct sched *s)
{
	static const enum task_state placed[] = { TASK_SCHEDULED, TASK_STARTING, TASK_RUNNING, TASK_UPLOADING };
	struct store_task *t = calloc(MAX_BATCH, sizeof(*t));

	if (!t)
		return;
	for (size_t k = 0; k < sizeof(placed) / sizeof(*placed); k++) {
		int n = store_tasks_in_state(s->st, placed[k], t, MAX_BATCH);

		for (int i = 0; i < n; i++) {
			struct host_view *h;

			pthread_mutex_lock(&s->lock);
			h = sched_host_find_locked(s, t[i].host_id);
			if (h)
				sched_watch_start_locked(s, &t[i], h, t[i].state == TASK_SCHEDULED);
			pthread_mutex_unlock(&s->lock);
		}
	}
	free(t);
}

/* One pass (lock held on entry and on return): with full, the hosts are
 * read again, hosts gone quiet are lost and hosts back are reconciled, and
 * cancels are forwarded; then queued tasks are placed. */
static void tick_locked(struct sched *s, int full)
{
	int64_t now = kclock_wall_ms(s->clock);
	char lost[MAX_HOSTS][65], back[MAX_HOSTS][65], back_url[MAX_HOSTS][256];
	char (*due)[65] = NULL, (*due_url)[256] = NULL;
	int nlost = 0, nback = 0, ndue = 0;

	if (full) {
		s->last_full = now;
		refresh_hosts_locked(s);
	}
	for (int i = 0; full && i < s->nhosts; i++) {
		struct host_view *h = &s->hosts[i];

		/* While kiln-api itself was down no heartbeat could arrive: a
		 * host is judged only on the time since our own start too. */
		int64_t seen = h->last_hb_ms > s->started_ms ? h->last_hb_ms : s->started_ms;
		int stale = now - seen > (int64_t)s->cfg.host_lost_after_ms;

		if (stale && !h->lost) {
			h->lost = 1;
			snprintf(lost[nlost++], sizeof(lost[0]), "%s", h->id);
		} else if (!stale && (h->lost || h->was_lost)) {
			/* Back (its heartbeat cleared the flag): a host like any other again. */
			h->lost = h->was_lost = 0;
			store_host_set_lost(s->st, h->id, 0);
			fprintf(stderr, "kiln-api: host %s is back\n", h->id);
			snprintf(back[nback], sizeof(back[0]), "%s", h->id);
			snprintf(back_url[nback++], sizeof(back_url[0]), "%s", h->url);
		}
		/* Reading the placed tasks costs a scan of each state: not every tick. */
		if (!h->lost && h->draining && h->drain_deadline_ms > 0 && now >= h->drain_deadline_ms &&
		    (now - s->last_drain_check >= DRAIN_CHECK_MS || now < s->last_drain_check)) {
			if (!due) {
				due = calloc(MAX_HOSTS, sizeof(*due));
				due_url = calloc(MAX_HOSTS, sizeof(*due_url));
			}
			if (due && due_url) {
				snprintf(due[ndue], sizeof(due[0]), "%s", h->id);
				snprintf(due_url[ndue++], sizeof(due_url[0]), "%s", h->url);
			}
		}
	}
	pthread_mutex_unlock(&s->lock);
	for (int i = 0; i < nlost; i++)
		host_lost(s, lost[i]);
	if (ndue)
		s->last_drain_check = now;
	for (int i = 0; i < ndue; i++)
		drain_requeue(s, due[i], due_url[i]);
	free(due);
	free(due_url);
	for (int i = 0; i < nback; i++)
		reconcile(s, back[i], back_url[i]);
	/* Metering's levels (snapshot, pause and template bytes, volume
	 * sizes): sampled by the leader once a minute (store_usage_sample_stored). */
	if (now - s->last_stored_sample >= 60000 || now < s->last_stored_sample) {
		s->last_stored_sample = now;
		if (store_usage_sample_stored(s->st, now) < 0)
			fprintf(stderr, "kiln-api: cannot sample the stored usage levels\n");
	}
	if (!s->reattached) {
		reattach(s);
		s->reattached = 1;
	}
	place(s);
	if (full)
		forward_cancels(s);
	pthread_mutex_lock(&s->lock);
}

static void *sched_main(void *arg)
{
	struct sched *s = arg;

	pthread_mutex_lock(&s->lock);
	while (!s->stopping) {
		struct timespec ts;
		int64_t now = kclock_wall_ms(s->clock);
		/* A submission's wake-up only places (with the hosts as last read,
		 * their placements since counted in flight); the hosts, lost
		 * hosts and cancels are looked at once per tick. Under a burst of
		 * submissions this keeps the scheduler off the store's lock. */
		int full = s->want_full || now - s->last_full >= TICK_MS || now < s->last_full;

		s->want_full = 0;
		/* PostgreSQL: watchers end on a store error (a task's state
		 * cannot be read or written while the database is away), so
		 * the leader reattaches every REATTACH_MS: placed tasks without
		 * a watcher get one again (one that has one keeps it). */
		if (store_is_pg(s->st) && now - s->last_reattach >= REATTACH_MS) {
			s->last_reattach = now;
			s->reattached = 0;
		}
		if (!store_is_leader(s->st) || store_down(s->st)) {
			/* A follower (replicas on PostgreSQL), or the database is
			 * out of reach: only the hosts are read, for sessions
			 * placed through this replica. Once leader (or back), it
			 * reattaches to what is placed and judges hosts from then
			 * on, as a restarted kiln-api does. */
			if (full) {
				s->last_full = now;
				refresh_hosts_locked(s);
			}
			s->reattached = 0;
			s->started_ms = now;
		} else {
			tick_locked(s, full);
		}
		if (s->woken) {
			s->woken = 0;
			continue;
		}
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += TICK_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&s->wake, &s->lock, &ts);
		s->woken = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* Watchers end at their next check of `stopping` (lock held). */
static void wait_watchers_locked(struct sched *s)
{
	while (s->nwatchers) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += 1;
		if (pthread_cond_timedwait(&s->wake, &s->lock, &ts) != 0)
			break; /* one stuck in a long request: the process exit ends it */
	}
}

struct sched *sched_create(struct store *st, const struct sched_config *cfg, struct kiln_err *err)
{
	struct sched *s = calloc(1, sizeof(*s));

	if (!s || !(s->token = strdup(cfg->cluster_token ? cfg->cluster_token : ""))) {
		free(s);
		kiln_err_set(err, KERR_API_ERROR, "out of memory");
		return NULL;
	}
	s->st = st;
	s->cfg = *cfg;
	s->ops = cfg->host ? cfg->host : &host_ops_hostclient;
	s->clock = cfg->clock;
	s->started_ms = kclock_wall_ms(s->clock);
	s->cfg.cluster_token = s->token;
	if (!s->cfg.host_lost_after_ms)
		s->cfg.host_lost_after_ms = 10000;
	pthread_mutex_init(&s->lock, NULL);
	condwait_init(&s->wake);
	condwait_init(&s->hosts_read);
	return s;
}

void sched_tick(struct sched *s)
{
	pthread_mutex_lock(&s->lock);
	tick_locked(s, 1);
	pthread_mutex_unlock(&s->lock);
}

struct sched *sched_start(struct store *st, const struct sched_config *cfg, struct kiln_err *err)
{
	struct sched *s = sched_create(st, cfg, err);

	if (!s)
		return NULL;
	if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
		pthread_mutex_destroy(&s->lock);
		pthread_cond_destroy(&s->wake);
		free(s->token);
		free(s);
		kiln_err_set(err, KERR_API_ERROR, "cannot start the scheduler thread");
		return NULL;
	}
	s->threaded = 1;
	return s;
}

void sched_wake(struct sched *s)
{
	pthread_mutex_lock(&s->lock);
	s->woken = 1;
	pthread_cond_broadcast(&s->wake);
	pthread_mutex_unlock(&s->lock);
}

void sched_wake_full(struct sched *s)
{
	pthread_mutex_lock(&s->lock);
	s->woken = 1;
	s->want_full = 1;
	pthread_cond_broadcast(&s->wake);
	pthread_mutex_unlock(&s->lock);
}

int sched_cancel(struct sched *s, const char *task_id)
{
	char url[256] = "", path[80];
	struct kiln_err err = { .code = "" };
	int st;

	pthread_mutex_lock(&s->lock);
	for (struct watch *w = s->watches; w; w = w->next)
		if (!strcmp(w->task, task_id))
			snprintf(url, sizeof(url), "%s", w->url);
	pthread_mutex_unlock(&s->lock);
	if (!url[0])
		return -1;
	snprintf(path, sizeof(path), "/v1/tasks/%s", task_id);
	st = sched_host_call(s, url, "DELETE", path, NULL, 5000, NULL, &err);
	return st == 202 || st == 409 ? 0 : -1;
}

/* ---- placement outside the queue (sessions) ---- */

int sched_place(struct sched *s, const struct sched_need *need, char (*exclude)[65], int nexclude,
		char host_id[65], char url[256])
{
	struct store_task t = { .vcpus = need->vcpus, .memory_mib = need->memory_mib, .egress = need->egress };
	struct host_view *h;

	if (need->tkey)
		snprintf(t.tkey, sizeof(t.tkey), "%s", need->tkey);
	int live = 0, big = 0;

	pthread_mutex_lock(&s->lock);
	h = pick_host_locked(s, &t, need->prefer, kclock_mono_ms(s->clock), exclude, nexclude);
	if (h) {
		reserve_locked(h, &t);
		snprintf(host_id, 65, "%s", h->id);
		snprintf(url, 256, "%s", h->url);
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	/* Why not: nobody there, nobody big enough, or everybody busy now. */
	for (int i = 0; i < s->nhosts; i++) {
		struct host_view *v = &s->hosts[i];

		if (v->lost || v->draining || !v->url[0])
			continue;
		live++;
		if (v->vcpus_total >= need->vcpus && v->mem_total >= need->memory_mib && (!need->egress || v->egress) &&
		    !(t.tkey[0] == '@' && !host_template_find(v, t.tkey)))
			big++;
	}
	pthread_mutex_unlock(&s->lock);
	return !live ? -ENOENT : !big ? -E2BIG : -EBUSY;
}

int sched_place_wait(struct sched *s, const struct sched_need *need, char (*exclude)[65], int nexclude,
		     char host_id[65], char url[256], unsigned wait_ms)
{
	int64_t until = kclock_mono_ms(s->clock) + wait_ms;
	int r, stop;

	for (;;) {
		r = sched_place(s, need, exclude, nexclude, host_id, url);
		if (r != -EBUSY || !wait_ms)
			return r;
		/* Without the scheduler's thread (sched_create) the hosts are
		 * only read by sched_tick: nothing would change. */
		pthread_mutex_lock(&s->lock);
		stop = !s->threaded || s->stopping ||
		       condwait_until(&s->hosts_read, &s->lock, s->clock, until) == ETIMEDOUT;
		pthread_mutex_unlock(&s->lock);
		if (stop)
			return sched_place(s, need, exclude, nexclude, host_id, url);
	}
}

void sched_unplace(struct sched *s, const char *host_id, const struct sched_need *need)
{
	struct host_view *h;

	pthread_mutex_lock(&s->lock);
	h = sched_host_find_locked(s, host_id);
	if (h) {
		h->inflight_vcpus -= need->vcpus < h->inflight_vcpus ? need->vcpus : h->inflight_vcpus;
		h->inflight_mem -= need->memory_mib < h->inflight_mem ? need->memory_mib : h->inflight_mem;
	}
	pthread_mutex_unlock(&s->lock);
}

void sched_release(struct sched *s, const char *host_id, unsigned vcpus, unsigned memory_mib)
{
	struct host_view *h;

	pthread_mutex_lock(&s->lock);
	h = sched_host_find_locked(s, host_id);
	if (h) {
		h->released_vcpus += vcpus;
		h->released_mem += memory_mib;
		host_vcpus_released(h, vcpus);
		h->mem_used -= memory_mib < h->mem_used ? memory_mib : h->mem_used;
	}
	pthread_mutex_unlock(&s->lock);
}

void sched_host_full(struct sched *s, const char *host_id)
{
	struct host_view *h;

	pthread_mutex_lock(&s->lock);
	h = sched_host_find_locked(s, host_id);
	if (h)
		h->full_until_ms = kclock_mono_ms(s->clock) + HOST_FULL_BACKOFF_MS;
	pthread_mutex_unlock(&s->lock);
}

int sched_host_state(struct sched *s, const char *host_id, char url[256])
{
	struct host_view *h;
	int r = -1;

	pthread_mutex_lock(&s->lock);
	h = sched_host_find_locked(s, host_id);
	if (h) {
		r = !h->lost;
		if (url)
			snprintf(url, 256, "%s", h->url);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

int sched_host_draining(struct sched *s, const char *host_id)
{
	struct host_view *h;
	int r = 0;

	pthread_mutex_lock(&s->lock);
	h = sched_host_find_locked(s, host_id);
	if (h)
		r = h->draining && !h->lost;
	pthread_mutex_unlock(&s->lock);
	return r;
}

int sched_live_hosts(struct sched *s, char (*ids)[65], char (*urls)[256], int max)
{
	int n = 0;

	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < s->nhosts && n < max; i++) {
		if (s->hosts[i].lost || !s->hosts[i].url[0])
			continue;
		snprintf(ids[n], 65, "%s", s->hosts[i].id);
		snprintf(urls[n], 256, "%s", s->hosts[i].url);
		n++;
	}
	pthread_mutex_unlock(&s->lock);
	return n;
}

void sched_destination_changed(struct sched *s, const char *customer)
{
	struct kiln_err err = { .code = "" };
	struct dest d;
	char dest_id[40];
	json_t *tasks, *t;
	size_t i;

	if (destination_load(s->st, s->cfg.dest_key, customer, &d, dest_id, &err) != 1)
		return;
	tasks = store_dest_tasks(s->st, customer, dest_id);
	json_array_foreach(tasks, i, t) {
		const char *id = json_string_value(json_object_get(t, "id"));
		const char *url = json_string_value(json_object_get(t, "url"));
		json_t *body = json_pack("{s:o}", "destination", dest_to_json(&d, 1));
		char path[128];
		int st;

		snprintf(path, sizeof(path), "/v1/tasks/%s/destination", id);
		st = sched_host_call(s, url, "PUT", path, body, 5000, NULL, &err);
		json_decref(body);
		if (st != 200 && st != 404)
			fprintf(stderr, "kiln-api: task %s: cannot hand its host the destination's new credentials: %s\n",
				id, st > 0 ? "refused" : err.message);
	}
	json_decref(tasks);
	dest_wipe(&d);
}

void sched_stop(struct sched *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	s->stopping = 1;
	pthread_cond_broadcast(&s->wake);
	pthread_cond_broadcast(&s->hosts_read);
	pthread_mutex_unlock(&s->lock);
	if (s->threaded)
		pthread_join(s->thread, NULL);
	pthread_mutex_lock(&s->lock);
	wait_watchers_locked(s);
	pthread_mutex_unlock(&s->lock);
	if (!s->nwatchers) {
		free(s->token);
		free(s);
	} /* else a watcher still holds s; the process is exiting */
}
