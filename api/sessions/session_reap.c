/* session_reap: the session reaper (see sessions.h). Every REAP_TICK_MS
 * it reads the sessions that hold a VM and decides, for each, from its
 * record (with whether any replica holds a lease on it: a request in
 * flight), its host's state and the clock alone (sessions_reap_decide, a
 * pure function the unit tests drive): keep it, settle what a killed
 * kiln-api left half-done, mark it host_lost, or end it (idle timeout, max
 * lifetime: paused when the session's auto_pause (E2B's autoPause) or else
 * the customer's session_auto_pause says so, else
 * destroyed, on a thread of its own). Every RECONCILE_EVERY_MS it also
 * compares each live host's sessions with the store. */
#include "sessions_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- decisions (pure: records and a clock in, an action out) ---- */

enum sessions_reap_action sessions_reap_decide(const struct store_session *c, int host_state, int busy,
					       int64_t now_ms)
{
	int past_lifetime = now_ms - c->started_ms > (int64_t)c->max_lifetime_s * 1000;

	/* An exec running is activity; a lifetime still ends (below, unless
	 * paused meanwhile). */
	if (busy && (c->state != SESSION_RUNNING || !past_lifetime || host_state != 1))
		return REAP_KEEP;
	if (c->state != SESSION_RUNNING)
		return REAP_SETTLE;
	if (host_state == 0)
		return REAP_HOST_LOST;
	if (host_state != 1)
		return REAP_KEEP;
	if (past_lifetime)
		return REAP_MAX_LIFETIME;
	if (!busy && now_ms - c->last_active_ms > (int64_t)c->idle_timeout_s * 1000)
		return REAP_IDLE_TIMEOUT;
	return REAP_KEEP;
}

int sessions_reap_destroy_after_pause(const struct sessions_outcome *o)
{
	/* A pause that cannot be done (the host failed) would leave the
	 * session running past its limit: it is destroyed instead. A busy one
	 * (an exec runs, only at the end of its lifetime) is tried again at the
	 * next tick. */
	return o->status != 200 && o->err.errc != KERR_BUSY && o->status != 503 && o->status != 404 &&
	       o->err.errc != KERR_NOT_RUNNING;
}

int sessions_reap_stale(int known, const struct store_session *cur, const char *host, int *keep_snapshot)
{
	*keep_snapshot = 0;
	if (known && session_state_holds(cur->state) && !strcmp(cur->host_id, host))
		return 0;
	/* A stale copy of a session that is paused, resumable or running
	 * elsewhere goes without its snapshot in S3; one nothing needs
	 * (destroyed, unknown, never paused) with it. */
	*keep_snapshot = known && cur->state != SESSION_DESTROYED && (cur->has_snapshot || session_state_holds(cur->state));
	return 1;
}

/* ---- doing it ---- */

struct ender {
	struct sessions *ss;
	char id[40];
	char reason[32];
	int pause;
	int drain;       /* off a draining host: paused, never destroyed (retried next tick) */
};

static void *ender_main(void *arg)
{
	struct ender *e = arg;
	struct sessions_outcome o = { 0 };
	int paused = 0;

	if (e->pause) {
		sessions_pause(e->ss, e->id, e->reason, &o);
		paused = 1;
		if (!e->drain && sessions_reap_destroy_after_pause(&o)) {
			/* The log says what happened: destroyed, not paused. */
			paused = 0;
			sessions_destroy(e->ss, e->id, e->reason, &o);
		}
	} else {
		sessions_destroy(e->ss, e->id, e->reason, &o);
	}
	fprintf(stderr, "kiln-api: session %s: %s: %s%s%s\n", e->id, e->reason,
		o.status == 200 ? (paused ? "paused" : "destroyed") : "not ended now", o.status == 200 ? "" : ": ",
		o.status == 200 ? "" : o.err.message);
	sessions_op_leave_ending(e->ss, e->id);
	pthread_mutex_lock(&e->ss->lock);
	e->ss->enders--;
	pthread_cond_broadcast(&e->ss->cond);
	pthread_mutex_unlock(&e->ss->lock);
	free(e);
	return NULL;
}

/* End a session past a limit on a thread of its own (a pause moves its
 * memory to S3: seconds), marked busy meanwhile so the next tick skips it.
 * reason "drain": paused whatever its auto-pause says (its host is being
 * emptied; it resumes elsewhere on its next use). */
static void end_later(struct sessions *ss, const struct store_session *cur, const char *reason)
{
	struct ender *e = calloc(1, sizeof(*e));
	struct quota q;
	pthread_attr_t attr;
	pthread_t th;

	if (!e)
		return;
	if (!sessions_op_enter_ending(ss, cur->id)) {
		free(e);
		return; /* under way */
	}
	pthread_mutex_lock(&ss->lock);
	if (ss->enders >= MAX_ENDERS) {
		pthread_mutex_unlock(&ss->lock);
		sessions_op_leave_ending(ss, cur->id);
		free(e);
		return; /* the next tick */
	}
	ss->enders++;
	pthread_mutex_unlock(&ss->lock);
	e->ss = ss;
	snprintf(e->id, sizeof(e->id), "%s", cur->id);
	snprintf(e->reason, sizeof(e->reason), "%s", reason);
	/* A session's own choice (E2B's autoPause) before its customer's. */
	e->drain = !strcmp(reason, "drain");
	e->pause = e->drain || (cur->auto_pause >= 0 ? cur->auto_pause
						     : store_customer_quota(ss->st, cur->customer, &q) == 0 &&
							       q.session_auto_pause);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&th, &attr, ender_main, e) != 0) {
		sessions_op_leave_ending(ss, cur->id);
		pthread_mutex_lock(&ss->lock);
		ss->enders--;
		pthread_mutex_unlock(&ss->lock);
		free(e);
	}
	pthread_attr_destroy(&attr);
}

/* A transient state with no request behind it: what a killed kiln-api
 * left. The host says how it ended. */
static void settle_leftover(struct sessions *ss, const struct store_session *cur)
{
	struct kiln_err err = { .code = "" };
	char url[256], path[96];
	json_t *reply = NULL;
	int st = 404, hs = cur->host_id[0] ? sched_host_state(ss->sched, cur->host_id, url) : 0;

	if (hs < 0)
		return; /* not heard of yet: later */
	if (hs == 1) {
		snprintf(path, sizeof(path), "/v1/sessions/%s", cur->id);
		st = sessions_host_call(ss, url, "GET", path, NULL, SHORT_TIMEOUT_MS, &reply, &err);
		json_decref(reply);
		if (st != 200 && st != 404)
			return; /* no clear answer: later */
	}
	if (st == 200) {
		/* It runs there: a create or resume that completed, or a pause that did not. */
		store_session_transition(ss->st, cur->id, cur->state, SESSION_RUNNING, NULL, "", NULL);
		fprintf(stderr,
			"kiln-api: session %s was %s with no request behind it (its kiln-api stopped); it runs on %s\n",
			cur->id, session_state_name(cur->state), cur->host_id);
		return;
	}
	switch (cur->state) {
	case SESSION_STARTING:
		store_session_transition(ss->st, cur->id, cur->state, SESSION_ERROR, "", "api_restart", NULL);
		break;
	case SESSION_PAUSING:
	case SESSION_RESUMING:
		/* A pause that finished, or a resume that never did: the snapshot
		 * in S3 is the session. */
		store_session_transition(ss->st, cur->id, cur->state, SESSION_PAUSED, "", "api_restart", NULL);
		break;
	default:
		return;
	}
	fprintf(stderr,
		"kiln-api: session %s was %s with no request behind it (its kiln-api stopped); its host has no such "
		"session now\n",
		cur->id, session_state_name(cur->state));
}

/* Compare one live host's sessions with the store: a session the host runs
 * that the store has settled otherwise (destroyed, paused, error, elsewhere,
 * unknown) is destroyed there; one the store had running there since before
 * the host's list was taken, that the host no longer has, is lost. */
static void reconcile_host(struct sessions *ss, const char *host, const char *url, const struct store_session *held,
			   int nheld, int64_t listed_ms)
{
	struct kiln_err err = { .code = "" };
	json_t *reply = NULL, *s;
	size_t i;
	int st = sessions_host_call(ss, url, "GET", "/v1/sessions", NULL, SHORT_TIMEOUT_MS, &reply, &err);
	json_t *list = json_object_get(reply, "sessions");

	if (st != 200 || !json_is_array(list)) {
		json_decref(reply);
		return; /* an older kiln-host without sessions, or no answer: nothing to compare */
	}
	json_array_foreach(list, i, s) {
		const char *id = json_string_value(json_object_get(s, "id"));
		struct store_session cur;
		char path[96];
		int known, keep;

		if (!id || strlen(id) >= sizeof(cur.id) || sessions_op_busy(ss, id))
			continue;
		known = store_session_get(ss->st, id, NULL, &cur) == 0;
		/* A request in flight on any replica (a create the store has not
		 * recorded as running yet, a resume landing there) is no stale copy. */
		if ((known && cur.leased) || !sessions_reap_stale(known, &cur, host, &keep))
			continue;
		if (keep)
			snprintf(path, sizeof(path), "/v1/sessions/%s?keep_snapshot=1", id);
		else
			snprintf(path, sizeof(path), "/v1/sessions/%s", id);
		st = sessions_host_call(ss, url, "DELETE", path, NULL, 30000, NULL, &err);
		fprintf(stderr, "kiln-api: host %s still had session %s (%s here): destroyed there (HTTP %d)\n", host, id,
			known ? session_state_name(cur.state) : "unknown", st);
	}
	for (int k = 0; k < nheld; k++) {
		struct store_session now;
		int found = 0;

		if (held[k].state != SESSION_RUNNING || strcmp(held[k].host_id, host) || held[k].started_ms >= listed_ms)
			continue;
		json_array_foreach(list, i, s)
			found |= !strcmp(json_string_value(json_object_get(s, "id")) ?: "", held[k].id);
		/* Still the same run on this host (not paused and resumed meanwhile)? */
		if (!found && !sessions_op_busy(ss, held[k].id) && store_session_get(ss->st, held[k].id, NULL, &now) == 0 &&
		    !now.leased && now.state == SESSION_RUNNING && !strcmp(now.host_id, host) &&
		    now.started_ms == held[k].started_ms)
			sessions_vm_lost(ss, held[k].id, SESSION_RUNNING);
	}
	json_decref(reply);
}

void sessions_reap_once(struct sessions *ss, int reconcile)
{
	struct store_session *held = calloc(MAX_HOLDING, sizeof(*held));
	int n;
	int64_t now = kclock_wall_ms(ss->clock);

	if (!held)
		return;
	n = store_sessions_holding(ss->st, held, MAX_HOLDING);
	/* The store unreachable (PostgreSQL away): leases may lapse meanwhile,
	 * their holders unable to renew them. Once it is back they get
	 * LEASE_TTL_MS to do so before any session is judged (a pause in
	 * flight would otherwise be settled as a leftover). */
	if (store_down(ss->st))
		ss->store_down_ms = kclock_mono_ms(ss->clock);
	if (ss->store_down_ms && kclock_mono_ms(ss->clock) - ss->store_down_ms < LEASE_TTL_MS) {
		free(held);
		return;
	}
	for (int i = 0; i < n; i++) {
		struct store_session *c = &held[i];
		int hs = c->host_id[0] ? sched_host_state(ss->sched, c->host_id, NULL) : -1;

		int busy = c->leased || sessions_op_busy(ss, c->id);

		/* Its host is draining: paused to S3 when nothing runs in it
		 * (the next use resumes it on another host). */
		if (c->state == SESSION_RUNNING && hs == 1 && !busy && sched_host_draining(ss->sched, c->host_id)) {
			end_later(ss, c, "drain");
			continue;
		}
		/* Busy: a request in flight on any replica (its lease), or here
		 * (a lease write that failed is retried by the renewer). */
		switch (sessions_reap_decide(c, hs, busy, now)) {
		case REAP_KEEP:
			break;
		case REAP_SETTLE:
			settle_leftover(ss, c);
			break;
		case REAP_HOST_LOST:
			if (store_session_transition(ss->st, c->id, SESSION_RUNNING, SESSION_ERROR, NULL, "host_lost", NULL) ==
			    1)
				fprintf(stderr, "kiln-api: session %s: its host %s is lost: error/host_lost\n", c->id,
					c->host_id);
			break;
		case REAP_MAX_LIFETIME:
			end_later(ss, c, "max_lifetime");
			break;
		case REAP_IDLE_TIMEOUT:
			end_later(ss, c, "idle_timeout");
			break;
		}
	}
	if (reconcile) {
		char ids[64][65], urls[64][256];
		int nh = sched_live_hosts(ss->sched, ids, urls, 64);

		for (int h = 0; h < nh; h++)
			reconcile_host(ss, ids[h], urls[h], held, n, kclock_wall_ms(ss->clock));
	}
	free(held);
}

void *sessions_reaper_main(void *arg)
{
	struct sessions *ss = arg;
	int64_t last_reconcile = kclock_mono_ms(ss->clock), last_gc = last_reconcile;

	pthread_mutex_lock(&ss->lock);
	while (!ss->stopping) {
		struct timespec ts;
		int reconcile = kclock_mono_ms(ss->clock) - last_reconcile >= RECONCILE_EVERY_MS;

		pthread_mutex_unlock(&ss->lock);
		if (reconcile)
			last_reconcile = kclock_mono_ms(ss->clock);
		sessions_reap_once(ss, reconcile);
		/* Deleted snapshots' objects that could not go when they could
		 * have (a host away), and rows a killed kiln-api left. Only the
		 * scheduler's leader: one replica at a time. */
		if (kclock_mono_ms(ss->clock) - last_gc >= SNAPSHOT_GC_EVERY_MS) {
			last_gc = kclock_mono_ms(ss->clock);
			if (store_is_leader(ss->st))
				sessions_snapshots_gc(ss);
		}
		pthread_mutex_lock(&ss->lock);
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += REAP_TICK_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		if (!ss->stopping)
			pthread_cond_timedwait(&ss->cond, &ss->lock, &ts);
	}
	pthread_mutex_unlock(&ss->lock);
	return NULL;
}

/* ---- the sessions' start: struct sessions (session_core.c) with the
 * reaper and the lease renewer running. Here, above session_core.c, so that
 * the core does not call up into the reaper. ---- */

struct sessions *sessions_start(const struct api_config *cfg, struct store *st, struct sched *sched,
				const struct host_ops *host, const struct kiln_clock *clock, struct kiln_err *err)
{
	struct sessions *ss = sessions_create(cfg, st, sched, host, clock, err);

	if (!ss)
		return NULL;
	if (pthread_create(&ss->reaper, NULL, sessions_reaper_main, ss) != 0) {
		pthread_mutex_destroy(&ss->lock);
		pthread_mutex_destroy(&ss->lease_lock);
		pthread_cond_destroy(&ss->cond);
		free(ss->token);
		free(ss);
		kiln_err_set(err, KERR_INTERNAL, "cannot start the session reaper");
		return NULL;
	}
	ss->reaping = 1;
	if (pthread_create(&ss->renewer, NULL, sessions_renewer_main, ss) != 0) {
		sessions_stop(ss);
		kiln_err_set(err, KERR_INTERNAL, "cannot start the session lease renewer");
		return NULL;
	}
	ss->renewing = 1;
	return ss;
}
