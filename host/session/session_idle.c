/* session_idle: an idle session costs no host CPU. Under TCG a guest that
 * does nothing still costs ~1.2% of a core (its timer ticks and QEMU's main
 * loop), so ~200 idle sessions fill 2 cores. The idler thread stops the
 * vCPUs (QMP stop) of a session that has had no request for idle_stop_ms
 * and runs nothing anyone expects to keep running; whatever touches the VM
 * next continues it first (session_wake_held) and resets the guest clock,
 * which stood still while stopped. See docs/architecture.md, "Idle stop".
 *
 * Never stopped: a session with a command running (it holds s->op), an
 * attached interactive command, envd requests or streams in flight (the
 * channel holds more than the session's own reference), or any process in
 * the guest that is not kiln-init's own (PROCS_QUERY: a background child of
 * an earlier command, a server started through envd, a daemon). So a
 * stopped session is one where nothing would have run anyway.
 *
 * Races: the stop decision (re-check, ask the guest, QMP stop) runs under
 * s->wake and s->op; every path to the VM takes s->wake first (session_take,
 * session_envd), so a request that arrives during the decision waits for it
 * and then finds the VM stopped and continues it. */
#include "session_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "condwait.h"
#include "envd/envd.h"
#include "metrics.h"
#include "proto.h"

#define IDLE_TICK_MAX_MS  500   /* how often the idler looks, at most */
#define IDLE_PROBE_MS     10000 /* PROCS_QUERY's deadline */
#define IDLE_QMP_MS       10000 /* stop / cont */
#define IDLE_WAKE_SETUP_MS 10000
#define IDLE_BUSY_RECHECK_MS 2000 /* a guest that runs something: ask again after */
#define IDLE_MAX_BATCH    64    /* sessions examined per pass (the rest wait for the next) */
#define IDLE_ADMIT_SLACK_MS 1000 /* session_admit_wait_ms: the stop itself, under load */

int session_idle_due(const struct session_idle_view *v, int64_t now_ms, unsigned idle_stop_ms)
{
	if (!idle_stop_ms || !v->running || v->stopped || v->interactive || v->envd_busy)
		return 0;
	if (now_ms - v->last_active_ms < (int64_t)idle_stop_ms)
		return 0;
	return now_ms >= v->idle_check_ms;
}

/* The view of s the decision needs (ss->lock held). */
static void idle_view_locked(const struct session *s, struct session_idle_view *v)
{
	v->running = s->state == SS_RUNNING && s->envd_ok && s->vm.pid > 0;
	v->stopped = s->stopped;
	v->interactive = s->input_wr >= 0 || s->exec_id[0];
	/* The session's own reference is one; any more is a request or a
	 * stream (a running process's output, a watch) in flight. */
	v->envd_busy = s->envd && envd_refs(s->envd) > 1;
	v->last_active_ms = s->last_active_ms;
	v->idle_check_ms = s->idle_check_ms;
}

int session_wake_held(struct session_table *ss, struct session *s, struct kiln_err *err)
{
	int r;

	if (!s->stopped)
		return 0;
	r = vm_qmp(&s->vm, "{\"execute\":\"cont\"}", proto_now_ms() + IDLE_QMP_MS, NULL, err);
	/* The guest's clocks stood still while it was stopped: its wall
	 * clock is behind by that long. SETUP sets it (and adds entropy). */
	if (r == 0)
		r = vm_setup(&s->vm, proto_now_ms() + IDLE_WAKE_SETUP_MS, err);
	pthread_mutex_lock(&ss->lock);
	s->stopped = 0;
	/* Its vCPUs run again: active, even past the host's capacity (the
	 * VMs' CPU shares decide who gets the cores). */
	if (s->vcpus_idle)
		hostd_vcpus_wake(ss->d, s->vcpus_idle);
	s->vcpus_idle = 0;
	/* A request is on its way: the idle delay starts again. */
	s->last_active_ms = clock_wall_ms();
	if (r < 0)
		ss->wake_failures++;
	else
		ss->wakes_total++;
	pthread_mutex_unlock(&ss->lock);
	if (r < 0) {
		fprintf(stderr, "kiln-host: session %s: continuing its stopped VM: %s\n", s->id, err->message);
		return -1;
	}
	return 0;
}

unsigned session_admit_wait_ms(const struct session_table *ss)
{
	/* The last session to go idle had its last request at most
	 * idle_stop_ms ago; the idler's next look and its stop (a PROCS query,
	 * a QMP stop: slower when creates load the CPUs) follow. */
	return ss->idle_stop_ms ? ss->idle_stop_ms + IDLE_TICK_MAX_MS + IDLE_ADMIT_SLACK_MS : 0;
}

void session_reservation_release(struct session_table *ss, struct session *s)
{
	pthread_mutex_lock(&ss->lock);
	if (s->vcpus_idle)
		hostd_vcpus_wake(ss->d, s->vcpus_idle);
	s->vcpus_idle = 0;
	pthread_mutex_unlock(&ss->lock);
	if (s->vcpus)
		hostd_release(ss->d, s->vcpus, s->memory_mib);
	s->vcpus = 0;
}

/* Decide for one session (referenced by the caller) and stop it if it is
 * idle: under s->wake and s->op, so no request runs or starts meanwhile. */
static void idle_try_stop(struct session_table *ss, struct session *s)
{
	struct session_idle_view v;
	struct kiln_err err = { .errc = KERR_NONE };
	uint32_t count = 0, pid = 0;
	int due;

	pthread_mutex_lock(&s->wake);
	if (pthread_mutex_trylock(&s->op) != 0) {
		pthread_mutex_unlock(&s->wake); /* an operation runs: not idle */
		return;
	}
	pthread_mutex_lock(&ss->lock);
	idle_view_locked(s, &v);
	due = session_idle_due(&v, clock_wall_ms(), ss->idle_stop_ms) && !ss->idler_quit;
	pthread_mutex_unlock(&ss->lock);
	if (!due)
		goto out;
	if (vm_procs(&s->vm, proto_now_ms() + IDLE_PROBE_MS, &count, &pid, &err) < 0 || count) {
		/* Something runs (or the guest cannot say: an older kiln-init
		 * answers ERROR): leave it running, look again later. */
		if (count == 0 && err.errc != KERR_GUEST_ERROR)
			fprintf(stderr, "kiln-host: session %s: idle check: %s\n", s->id, err.message);
		pthread_mutex_lock(&ss->lock);
		/* No answer in time: one may still come, and a later query
		 * could read it as its own: never ask this VM again. */
		s->idle_check_ms = count ? clock_wall_ms() + IDLE_BUSY_RECHECK_MS
			: err.errc == KERR_TIMEOUT ? INT64_MAX : clock_wall_ms() + 60000;
		pthread_mutex_unlock(&ss->lock);
		goto out;
	}
	if (vm_qmp(&s->vm, "{\"execute\":\"stop\"}", proto_now_ms() + IDLE_QMP_MS, NULL, &err) < 0) {
		fprintf(stderr, "kiln-host: session %s: stopping its idle VM: %s\n", s->id, err.message);
		pthread_mutex_lock(&ss->lock);
		s->idle_check_ms = clock_wall_ms() + 60000;
		pthread_mutex_unlock(&ss->lock);
		goto out;
	}
	pthread_mutex_lock(&ss->lock);
	s->stopped = 1;
	/* Stopped vCPUs use no CPU: they stop counting against the capacity. */
	if (s->vcpus && !s->vcpus_idle) {
		hostd_vcpus_idle(ss->d, s->vcpus);
		s->vcpus_idle = s->vcpus;
	}
	ss->stops_total++;
	pthread_mutex_unlock(&ss->lock);
out:
	pthread_mutex_unlock(&s->op);
	pthread_mutex_unlock(&s->wake);
}

static void *idler_main(void *arg)
{
	struct session_table *ss = arg;
	unsigned tick = ss->idle_stop_ms / 2 < IDLE_TICK_MAX_MS ? ss->idle_stop_ms / 2 : IDLE_TICK_MAX_MS;

	if (!ss->idle_stop_ms)
		tick = IDLE_TICK_MAX_MS; /* metrics only */
	if (tick < 50)
		tick = 50;
	pthread_mutex_lock(&ss->lock);
	while (!ss->idler_quit) {
		struct session *due[IDLE_MAX_BATCH];
		int64_t now = clock_wall_ms(), until = proto_now_ms() + tick;
		size_t n = 0;

		for (struct session *s = ss->list; s && n < IDLE_MAX_BATCH && ss->idle_stop_ms; s = s->next) {
			struct session_idle_view v;

			idle_view_locked(s, &v);
			if (session_idle_due(&v, now, ss->idle_stop_ms)) {
				s->refs++;
				due[n++] = s;
			}
		}
		pthread_mutex_unlock(&ss->lock);
		for (size_t i = 0; i < n; i++) {
			idle_try_stop(ss, due[i]);
			session_unref(ss, due[i]);
		}
		sessions_sample(ss);
		pthread_mutex_lock(&ss->lock);
		while (!ss->idler_quit && condwait_until(&ss->idle_cond, &ss->lock, NULL, until) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&ss->lock);
	return NULL;
}

int sessions_set_idle_stop(struct session_table *ss, unsigned idle_stop_ms, struct kiln_err *err)
{
	ss->idle_stop_ms = idle_stop_ms;
	if (ss->idler_on)
		return 0;
	/* The thread runs without idle stops too: it samples the metrics. */
	if (condwait_init(&ss->idle_cond) != 0 || pthread_create(&ss->idler, NULL, idler_main, ss) != 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot start the session idler thread");
	ss->idler_on = 1;
	return 0;
}

void session_idler_stop(struct session_table *ss)
{
	if (!ss->idler_on)
		return;
	pthread_mutex_lock(&ss->lock);
	ss->idler_quit = 1;
	pthread_cond_broadcast(&ss->idle_cond);
	pthread_mutex_unlock(&ss->lock);
	pthread_join(ss->idler, NULL);
	pthread_cond_destroy(&ss->idle_cond);
	ss->idler_on = 0;
}

static const struct metric m_sessions = {
	.name = "kiln_host_sessions", .type = METRIC_GAUGE, .labels = { "vcpus" },
	.help = "Sessions on this host with a VM, by whether its vCPUs run or are stopped while idle.",
};
static const struct metric m_idle_stops = {
	.name = "kiln_host_session_idle_stops_total", .type = METRIC_COUNTER,
	.help = "Idle sessions whose vCPUs were stopped.",
};
static const struct metric m_wakes = {
	.name = "kiln_host_session_wakes_total", .type = METRIC_COUNTER, .labels = { "result" },
	.help = "Stopped sessions continued for a request, by result.",
};

static const struct metric m_fork_bases = {
	.name = "kiln_host_fork_bases", .type = METRIC_GAUGE,
	.help = "Copies of a forked session's RAM kept for the children started here (session_fork.c).",
};

void sessions_metrics(struct session_table *ss, struct buf *b)
{
	static const char *const vcpus[] = { "running", "stopped" }, *const results[] = { "ok", "failed" };
	uint64_t running = 0, stopped = 0;

	pthread_mutex_lock(&ss->lock);
	for (struct session *s = ss->list; s; s = s->next)
		if (s->state == SS_RUNNING) {
			running += !s->stopped;
			stopped += s->stopped;
		}
	metric_write_by(b, &m_sessions, vcpus, (uint64_t[]){ running, stopped }, 2);
	metric_write(b, &m_idle_stops, ss->stops_total);
	metric_write_by(b, &m_wakes, results, (uint64_t[]){ ss->wakes_total, ss->wake_failures }, 2);
	pthread_mutex_unlock(&ss->lock);
	metric_write(b, &m_fork_bases, (uint64_t)fork_base_count());
	session_prestart_metrics(ss, b);
}
