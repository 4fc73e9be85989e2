/* session_core: struct sessions (create, stop, the requests held; the
 * reaper and lease renewer threads are started by sessions_start in
 * session_reap.c, above this file), the
 * sessions with a request in flight and their leases in the store, and the
 * two actions both the endpoints (sessions.c) and the reaper
 * (session_reap.c) take: pausing and destroying a session (see sessions.h,
 * sessions_int.h).
 *
 * State lives in the store; every change is a compare-and-set, so that an
 * HTTP request and the reaper racing on one session cannot both win: the
 * transient states starting, pausing and resuming are taken before the
 * host is asked and left once it has answered. A session that holds a VM
 * (starting, running, pausing, resuming) counts against the customer's
 * running quota, checked in the same transaction that takes the state.
 *
 * Requests in flight: counted per session in this process (ss->inflight)
 * and, so that every replica sees them, held as a lease in the store: a
 * row (session, this process's owner id, count, expiry on the database's
 * clock) written when the count changes (with the request's touch, in one
 * transaction: no extra commit on the exec path) and renewed every
 * LEASE_RENEW_MS by a thread of its own while held. Every replica's reaper
 * leaves a leased session alone: an exec that runs is activity, and a
 * transient state with a request behind it is not a leftover. A killed
 * kiln-api's leases lapse LEASE_TTL_MS after their last renewal; a
 * restarted one has a new owner id. Then a transient state in the store is
 * what it left, and a reaper settles it by asking the host. */
#include "condwait.h"
#include "sessions_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

/* ---- requests in flight: counted here, leased in the store ---- */

/* id's entry in the in-flight list, made (count 0) if it has none; NULL
 * when out of memory. ss->lock held. */
static struct op *op_get_locked(struct sessions *ss, const char *id)
{
	struct op *o;

	for (o = ss->inflight; o; o = o->next)
		if (!strcmp(o->id, id))
			return o;
	if ((o = calloc(1, sizeof(*o)))) {
		snprintf(o->id, sizeof(o->id), "%s", id);
		o->next = ss->inflight;
		ss->inflight = o;
	}
	return o;
}

/* Write this process's lease on id as its count n now says (0: drop it),
 * and the touch with it. A failed write (PostgreSQL away) is left to the
 * renewer, which then rewrites every lease of this process. ss->lease_lock
 * held: this process's lease writes reach the store in the order of the
 * counts they carry. */
static void lease_write(struct sessions *ss, const char *id, unsigned n, int touch)
{
	int r = n ? store_session_lease_set(ss->st, id, ss->owner, n, ss->lease_ttl_ms, touch)
		  : store_session_lease_drop(ss->st, id, ss->owner, touch);

	if (r < 0) {
		pthread_mutex_lock(&ss->lock);
		ss->lease_resync = 1;
		pthread_mutex_unlock(&ss->lock);
	}
}

/* One more request on id (ending: the reaper's end of it, refused with 0
 * when one is under way): 1 entered. */
static int op_enter(struct sessions *ss, const char *id, int touch, int ending)
{
	struct op *o;
	unsigned n = 0;
	int r = 1;

	pthread_mutex_lock(&ss->lease_lock);
	pthread_mutex_lock(&ss->lock);
	o = op_get_locked(ss, id);
	if (o && ending && o->ending)
		r = 0;
	else if (o) {
		n = ++o->n;
		o->ending |= ending;
	}
	pthread_mutex_unlock(&ss->lock);
	if (n)
		lease_write(ss, id, n, touch);
	else if (r && touch)
		store_session_touch(ss->st, id); /* out of memory: no lease, the touch still */
	pthread_mutex_unlock(&ss->lease_lock);
	return r;
}

static void op_leave(struct sessions *ss, const char *id, int touch, int ending)
{
	unsigned n = 0;
	int found = 0;

	pthread_mutex_lock(&ss->lease_lock);
	pthread_mutex_lock(&ss->lock);
	for (struct op **p = &ss->inflight; *p; p = &(*p)->next)
		if (!strcmp((*p)->id, id)) {
			struct op *o = *p;

			found = 1;
			if (ending)
				o->ending = 0;
			if ((n = --o->n) == 0) {
				*p = o->next;
				free(o);
			}
			break;
		}
	pthread_mutex_unlock(&ss->lock);
	if (found)
		lease_write(ss, id, n, touch);
	else if (touch)
		store_session_touch(ss->st, id);
	pthread_mutex_unlock(&ss->lease_lock);
}

void sessions_op_enter(struct sessions *ss, const char *id)
{
	op_enter(ss, id, 0, 0);
}

void sessions_op_leave(struct sessions *ss, const char *id)
{
	op_leave(ss, id, 0, 0);
}

void sessions_op_enter_touch(struct sessions *ss, const char *id)
{
	op_enter(ss, id, 1, 0);
}

void sessions_op_leave_touch(struct sessions *ss, const char *id)
{
	op_leave(ss, id, 1, 0);
}

int sessions_op_enter_ending(struct sessions *ss, const char *id)
{
	return op_enter(ss, id, 0, 1);
}

void sessions_op_leave_ending(struct sessions *ss, const char *id)
{
	op_leave(ss, id, 0, 1);
}

int sessions_op_busy(struct sessions *ss, const char *id)
{
	int busy = 0;

	pthread_mutex_lock(&ss->lock);
	for (struct op *o = ss->inflight; o && !busy; o = o->next)
		busy = !strcmp(o->id, id);
	pthread_mutex_unlock(&ss->lock);
	return busy;
}

int sessions_op_create(struct sessions *ss, struct store_session_new *n, char id[40], struct kiln_err *err)
{
	struct op *o;
	int r;

	pthread_mutex_lock(&ss->lease_lock);
	n->lease_owner = ss->owner;
	n->lease_ttl_ms = ss->lease_ttl_ms;
	r = store_session_create(ss->st, n, id, err);
	if (r == 0) {
		pthread_mutex_lock(&ss->lock);
		o = op_get_locked(ss, id);
		if (o)
			o->n++;
		else
			ss->lease_resync = 1; /* the row stays: the renewer removes it */
		pthread_mutex_unlock(&ss->lock);
	}
	pthread_mutex_unlock(&ss->lease_lock);
	return r;
}

void sessions_leases_renew(struct sessions *ss)
{
	const char **ids = NULL;
	unsigned *counts = NULL;
	int k = 0, resync, r;

	pthread_mutex_lock(&ss->lease_lock);
	pthread_mutex_lock(&ss->lock);
	for (struct op *o = ss->inflight; o; o = o->next)
		k++;
	resync = ss->lease_resync;
	pthread_mutex_unlock(&ss->lock);
	if (!k && !resync)
		goto out; /* nothing held: no write at all (an idle SQLite stays idle) */
	/* Every row of this process renewed: as many as it holds, unless a
	 * write failed or another replica's clean-up took one that lapsed
	 * (PostgreSQL away longer than the lease): then all are rewritten. */
	if (!resync && store_session_leases_renew(ss->st, ss->owner, ss->lease_ttl_ms) == k)
		goto out;
	ids = calloc((size_t)k + 1, sizeof(*ids));
	counts = calloc((size_t)k + 1, sizeof(*counts));
	if (ids && counts) {
		int i = 0;

		/* The list cannot change meanwhile: every change takes lease_lock. */
		pthread_mutex_lock(&ss->lock);
		for (struct op *o = ss->inflight; o && i < k; o = o->next, i++) {
			ids[i] = o->id;
			counts[i] = o->n;
		}
		pthread_mutex_unlock(&ss->lock);
		r = store_session_leases_replace(ss->st, ss->owner, ids, counts, i, ss->lease_ttl_ms);
	} else {
		r = -1;
	}
	pthread_mutex_lock(&ss->lock);
	ss->lease_resync = r < 0;
	pthread_mutex_unlock(&ss->lock);
out:
	pthread_mutex_unlock(&ss->lease_lock);
	free(ids);
	free(counts);
}

/* The renewer thread (sessions_start): this process's leases renewed every
 * LEASE_RENEW_MS, on a thread of its own because the reaper's host calls
 * can take longer than a lease lives; now and then a killed replica's
 * lapsed rows removed. */
void *sessions_renewer_main(void *arg)
{
	struct sessions *ss = arg;
	int64_t last_gc = 0;

	pthread_mutex_lock(&ss->lock);
	while (!ss->stopping) {
		int64_t deadline = kclock_mono_ms(ss->clock) + LEASE_RENEW_MS;

		pthread_mutex_unlock(&ss->lock);
		sessions_leases_renew(ss);
		if (kclock_mono_ms(ss->clock) - last_gc >= LEASE_GC_EVERY_MS) {
			last_gc = kclock_mono_ms(ss->clock);
			store_session_leases_gc(ss->st, LEASE_GC_AFTER_MS);
		}
		pthread_mutex_lock(&ss->lock);
		while (!ss->stopping && condwait_until(&ss->cond, &ss->lock, ss->clock, deadline) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&ss->lock);
	return NULL;
}

void sessions_hold(struct sessions *ss)
{
	pthread_mutex_lock(&ss->lock);
	ss->users++;
	pthread_mutex_unlock(&ss->lock);
}

void sessions_release(struct sessions *ss)
{
	pthread_mutex_lock(&ss->lock);
	ss->users--;
	pthread_cond_broadcast(&ss->cond);
	pthread_mutex_unlock(&ss->lock);
}

/* ---- talking to hosts ---- */

int sessions_host_call(struct sessions *ss, const char *url, const char *method, const char *path, json_t *body,
		       long timeout_ms, json_t **reply, struct kiln_err *err)
{
	return ss->host->call(ss->host->ctx, url, ss->token, method, path, body, timeout_ms, reply, err);
}

int sessions_host_raw(struct sessions *ss, const char *url, const char *method, const char *path, const void *body,
		      size_t len, const char *content_type, long timeout_ms, size_t max_reply,
		      struct hostclient_reply *r, struct kiln_err *err)
{
	return ss->host->raw(ss->host->ctx, url, ss->token, method, path, body, len, content_type, timeout_ms,
			     max_reply, r, err);
}

/* The string error.FIELD of the host's JSON error answer r, copied into buf
 * ("" when r has none); returns buf. */
static const char *host_error_field(const struct hostclient_reply *r, const char *field, char *buf, size_t cap)
{
	json_t *j = r->body ? json_loadb(r->body, r->len, 0, NULL) : NULL;
	const char *v = json_string_value(json_object_get(json_object_get(j, "error"), field));

	snprintf(buf, cap, "%s", v ? v : "");
	json_decref(j);
	return buf;
}

const char *sessions_host_error_code(const struct hostclient_reply *r, char *buf, size_t cap)
{
	return host_error_field(r, "code", buf, cap);
}

const char *sessions_host_error_message(const struct hostclient_reply *r, char *buf, size_t cap)
{
	return host_error_field(r, "message", buf, cap);
}

/* Whether the host confirms it has no such session (GET answered 404). */
int sessions_host_lacks(struct sessions *ss, const char *url, const char *id)
{
	struct kiln_err err = { .code = "" };
	char path[96];
	int st;

	snprintf(path, sizeof(path), "/v1/sessions/%s", id);
	st = sessions_host_call(ss, url, "GET", path, NULL, SHORT_TIMEOUT_MS, NULL, &err);
	return st == 404;
}

/* The session's VM is gone from its host (kiln-host restarted, or the VM
 * died): from `from` to error/vm_lost. */
void sessions_vm_lost(struct sessions *ss, const char *id, enum session_state from)
{
	if (store_session_transition(ss->st, id, from, SESSION_ERROR, NULL, "vm_lost", NULL) == 1)
		fprintf(stderr, "kiln-api: session %s: its VM is gone from its host: error/vm_lost\n", id);
}

/* ---- the actions shared by the endpoints and the reaper ---- */

/* Pause a running session: running -> pausing -> paused (snapshot in S3,
 * VM gone, quota freed) with end_reason `reason`. */
void sessions_pause(struct sessions *ss, const char *id, const char *reason, struct sessions_outcome *o)
{
	struct store_session cur;
	struct hostclient_reply r;
	struct kiln_err err = { .code = "" };
	char url[256], path[96], code[64], msg[256];
	json_t *j, *snap;
	int hs;

	o->status = 200;
	if (store_session_get(ss->st, id, NULL, &cur) < 0) {
		o->status = 404;
		kiln_err_set(&o->err, KERR_NOT_FOUND, "no such session");
		return;
	}
	if (cur.state != SESSION_RUNNING) {
		o->status = 409;
		kiln_err_set(&o->err, cur.state == SESSION_PAUSED ? KERR_NOT_RUNNING : KERR_BUSY, "the session is %s",
			     session_state_name(cur.state));
		return;
	}
	hs = sched_host_state(ss->sched, cur.host_id, url);
	if (hs != 1) {
		o->status = 503;
		kiln_err_set(&o->err, KERR_HOST_UNAVAILABLE, "the session's host %s is %s", cur.host_id,
			     hs == 0 ? "lost" : "not known yet");
		return;
	}
	if (store_session_transition(ss->st, id, SESSION_RUNNING, SESSION_PAUSING, NULL, NULL, NULL) != 1) {
		o->status = 409;
		kiln_err_set(&o->err, KERR_BUSY, "the session changed state meanwhile: try again");
		return;
	}
	snprintf(path, sizeof(path), "/v1/sessions/%s/pause", id);
	sessions_host_raw(ss, url, "POST", path, NULL, 0, NULL, SNAPSHOT_TIMEOUT_MS, 1u << 20, &r, &err);
	if (r.status == 200) {
		j = json_loadb(r.body ? r.body : "", r.len, 0, NULL);
		snap = json_object_get(j, "snapshot");
		/* Which host paused it: a resume goes back there when it has room
		 * (that host reads the chunks from its own pause cache). */
		if (json_is_object(snap))
			json_object_set_new(snap, "host_id", json_string(cur.host_id));
		store_session_transition(ss->st, id, SESSION_PAUSING, SESSION_PAUSED, "", reason,
					 json_is_object(snap) ? snap : NULL);
		sched_release(ss->sched, cur.host_id, cur.vcpus, cur.memory_mib);
		json_decref(j);
	} else if (r.status == 404 && sessions_host_lacks(ss, url, id)) {
		sessions_vm_lost(ss, id, SESSION_PAUSING);
		o->status = 409;
		kiln_err_set(&o->err, KERR_NOT_RUNNING, "the session's VM is gone from its host: it is error/vm_lost");
	} else {
		/* Still there (busy with an exec, or the host failed): running again. */
		store_session_transition(ss->st, id, SESSION_PAUSING, SESSION_RUNNING, NULL, NULL, NULL);
		if (r.status < 0) {
			o->status = 503;
			kiln_err_set(&o->err, KERR_HOST_UNAVAILABLE, "%s", err.message);
		} else {
			sessions_host_error_code(&r, code, sizeof(code));
			sessions_host_error_message(&r, msg, sizeof(msg));
			o->status = r.status == 409 ? 409 : 502;
			kiln_err_relay(&o->err, code, KERR_HOST_ERROR, "the host could not pause it: HTTP %d %s",
				       r.status, msg);
		}
	}
	hostclient_reply_free(&r);
}

static int any_live_host(struct sessions *ss, char url[256])
{
	char ids[1][65], urls[1][256];

	if (sched_live_hosts(ss->sched, ids, urls, 1) < 1)
		return 0;
	snprintf(url, 256, "%s", urls[0]);
	return 1;
}

/* Where a destroy of a session that is not running goes (url): the host
 * that paused it when that one is live, since its pause cache holds copies
 * of the session's memory and its DELETE removes them along with the
 * snapshot in S3; else any live host, which deletes the snapshot in S3 (the
 * pausing host's sweep then finds the manifest gone and removes its
 * copies). 0 when no host is live. */
static int snapshot_host(struct sessions *ss, const char *id, char url[256])
{
	json_t *sj = store_session_json(ss->st, id, NULL);
	const char *h = json_string_value(json_object_get(json_object_get(sj, "snapshot"), "host_id"));
	int live = h && h[0] && sched_host_state(ss->sched, h, url) == 1;

	json_decref(sj);
	return live || any_live_host(ss, url);
}

void sessions_pcache_cleanup(struct sessions *ss, const char *host_id, const char *id, const char *customer)
{
	struct kiln_err err = { .code = "" };
	char url[256], path[200];
	int st;

	if (!host_id || !host_id[0] || sched_host_state(ss->sched, host_id, url) != 1)
		return; /* away: its sweep and the cache's age limit see to it */
	snprintf(path, sizeof(path), "/v1/sessions/%s/pause-cache?customer=%s", id, customer);
	st = sessions_host_call(ss, url, "DELETE", path, NULL, SHORT_TIMEOUT_MS, NULL, &err);
	if (st != 200)
		fprintf(stderr, "kiln-api: session %s: removing the pause-cache copies on %s: %s\n", id, host_id,
			st < 0 ? err.message : "unexpected status");
}

/* Destroy a session in any state but a transient one: its VM (if it has
 * one) is destroyed on its host, the row becomes destroyed with `reason`.
 * A host that cannot be reached is reconciled later (reaper). */
void sessions_destroy(struct sessions *ss, const char *id, const char *reason, struct sessions_outcome *o)
{
	for (int attempt = 0; attempt < 3; attempt++) {
		struct store_session cur;
		struct kiln_err err = { .code = "" };
		char url[256], path[96];
		int st;

		o->status = 200;
		if (store_session_get(ss->st, id, NULL, &cur) < 0) {
			o->status = 404;
			kiln_err_set(&o->err, KERR_NOT_FOUND, "no such session");
			return;
		}
		switch (cur.state) {
		case SESSION_DESTROYED:
			return;
		case SESSION_RUNNING:
		case SESSION_PAUSED:
		case SESSION_ERROR:
			/* kiln-host's DELETE destroys the VM if it runs there and deletes
			 * the snapshot in S3 (found by ?customer= when it does not run
			 * there): a destroyed session leaves nothing. A paused one's
			 * goes to the host that paused it (snapshot_host). */
			if (cur.state == SESSION_RUNNING ? sched_host_state(ss->sched, cur.host_id, url) == 1
							 : cur.has_snapshot && snapshot_host(ss, id, url)) {
				json_t *reply = NULL;
				const char *code;

				snprintf(path, sizeof(path), "/v1/sessions/%s?customer=%s", id, cur.customer);
				st = sessions_host_call(ss, url, "DELETE", path, NULL, 60000, &reply, &err);
				code = json_string_value(json_object_get(json_object_get(reply, "error"), "code"));
				if (cur.state == SESSION_RUNNING && st == 503 && code && !strcmp(code, "s3_unavailable")) {
					/* Its read-write volume could not be uploaded: the host
					 * keeps it running, so does the store (destroy again). */
					const char *m = json_string_value(
						json_object_get(json_object_get(reply, "error"), "message"));

					o->status = 503;
					kiln_err_set(&o->err, KERR_S3_UNAVAILABLE,
						     "the session's volume could not be saved to S3, so the session keeps"
						     " running: destroy it again later (%s)",
						     m ? m : "S3 refused the upload");
					json_decref(reply);
					return;
				}
				json_decref(reply);
				if (st != 200 && st != 404)
					fprintf(stderr, "kiln-api: session %s: destroying it on %s: %s\n", id, url,
						st < 0 ? err.message : "unexpected status");
			}
			if (store_session_transition(ss->st, id, cur.state, SESSION_DESTROYED, "", reason, NULL) == 1) {
				if (cur.state == SESSION_RUNNING)
					sched_release(ss->sched, cur.host_id, cur.vcpus, cur.memory_mib);
				/* The last user of a deleted snapshot: its objects can go. */
				if (cur.from_snapshot[0])
					sessions_snapshot_release(ss, cur.from_snapshot);
				return;
			}
			break; /* changed meanwhile: look again */
		default:
			o->status = 409;
			kiln_err_set(&o->err, KERR_BUSY, "the session is %s: try again once that is done",
				     session_state_name(cur.state));
			return;
		}
	}
	o->status = 409;
	kiln_err_set(&o->err, KERR_BUSY, "the session keeps changing state: try again");
}


int sessions_snapshot_release(struct sessions *ss, const char *id)
{
	struct kiln_err err = { .code = "" };
	struct store_snapshot k;
	char url[256], path[200];
	int users, st;

	if (store_snapshot_get(ss->st, id, NULL, 1, &k) < 0 || !k.deleted_ms)
		return 0;
	users = store_snapshot_users(ss->st, id);
	if (users != 0)
		return users < 0 ? -1 : 0;
	/* The host it was taken on holds cached copies of its chunks too: its
	 * DELETE drops them along with the objects. Any live host else. */
	if (!(k.host_id[0] && sched_host_state(ss->sched, k.host_id, url) == 1) && !any_live_host(ss, url))
		return -1;
	snprintf(path, sizeof(path), "/v1/snapshots/%s?customer=%s", k.id, k.customer);
	st = sessions_host_call(ss, url, "DELETE", path, NULL, 60000, NULL, &err);
	if (st != 200) {
		fprintf(stderr, "kiln-api: snapshot %s: deleting its objects: %s (retried later)\n", k.id,
			st < 0 ? err.message : "unexpected status");
		return -1;
	}
	if (store_snapshot_remove(ss->st, k.id) < 0)
		return -1;
	fprintf(stderr, "kiln-api: snapshot %s of %s: its objects are deleted\n", k.id, k.customer);
	return 1;
}

static void e2b_mac(struct sessions *ss, const char *prefix, const char *id, char hex[65])
{
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned int n = 0;
	char msg[128];

	snprintf(msg, sizeof(msg), "%s%s", prefix, id);
	HMAC(EVP_sha256(), ss->e2b_key, sizeof(ss->e2b_key), (const unsigned char *)msg, strlen(msg), mac, &n);
	for (unsigned i = 0; i < 32; i++)
		sprintf(hex + 2 * i, "%02x", i < n ? mac[i] : 0);
	hex[64] = '\0';
	OPENSSL_cleanse(mac, sizeof(mac));
}

void sessions_e2b_token(struct sessions *ss, const char *id, char hex[65])
{
	e2b_mac(ss, "", id, hex);
}

void sessions_traffic_token(struct sessions *ss, const char *id, char hex[65])
{
	e2b_mac(ss, "traffic:", id, hex);
}

/* ---- start and stop ---- */

/* This process's lease owner id: its host's name, its pid and 32 random
 * bits, unique to the process (a restarted kiln-api has a new one, and
 * never renews what its killed predecessor held) and telling an operator
 * reading session_leases where a lease comes from. */
static void lease_owner_id(char *out, size_t cap)
{
	char host[48] = "";
	unsigned char r[4] = { 0 };

	gethostname(host, sizeof(host) - 1);
	if (RAND_bytes(r, sizeof(r)) != 1) {
		int64_t t = clock_mono_ms();

		memcpy(r, &t, sizeof(r));
	}
	snprintf(out, cap, "%s/%ld/%02x%02x%02x%02x", host[0] ? host : "kiln-api", (long)getpid(), r[0], r[1], r[2],
		 r[3]);
}

struct sessions *sessions_create(const struct api_config *cfg, struct store *st, struct sched *sched,
				 const struct host_ops *host, const struct kiln_clock *clock, struct kiln_err *err)
{
	struct sessions *ss = calloc(1, sizeof(*ss));

	if (!ss || !(ss->token = strdup(cfg->cluster_token ? cfg->cluster_token : ""))) {
		free(ss);
		kiln_err_set(err, KERR_INTERNAL, "out of memory");
		return NULL;
	}
	/* E2B's envd tokens: the same across restarts when there is a cluster
	 * token to derive them from, else valid for this process only. */
	if (cfg->cluster_token && cfg->cluster_token[0]) {
		unsigned int n = 0;

		HMAC(EVP_sha256(), cfg->cluster_token, (int)strlen(cfg->cluster_token),
		     (const unsigned char *)"kiln e2b envd token key", 23, ss->e2b_key, &n);
	} else if (RAND_bytes(ss->e2b_key, sizeof(ss->e2b_key)) != 1) {
		free(ss->token);
		free(ss);
		kiln_err_set(err, KERR_INTERNAL, "no randomness");
		return NULL;
	}
	lease_owner_id(ss->owner, sizeof(ss->owner));
	ss->lease_ttl_ms = LEASE_TTL_MS;
	ss->cfg = cfg;
	ss->st = st;
	ss->sched = sched;
	ss->host = host ? host : &host_ops_hostclient;
	ss->clock = clock;
	pthread_mutex_init(&ss->lock, NULL);
	pthread_mutex_init(&ss->lease_lock, NULL);
	condwait_init(&ss->cond);
	return ss;
}

int sessions_stop(struct sessions *ss)
{
	int64_t deadline;

	if (!ss)
		return 0;
	pthread_mutex_lock(&ss->lock);
	ss->stopping = 1;
	pthread_cond_broadcast(&ss->cond);
	pthread_mutex_unlock(&ss->lock);
	if (ss->reaping)
		pthread_join(ss->reaper, NULL);
	if (ss->renewing)
		pthread_join(ss->renewer, NULL);
	/* Ends in progress finish their host call, or the process exit cuts them. */
	deadline = clock_mono_ms() + 2000;
	pthread_mutex_lock(&ss->lock);
	while ((ss->enders || ss->users) && clock_mono_ms() < deadline) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 100 * 1000000L;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&ss->cond, &ss->lock, &ts);
	}
	if (ss->enders || ss->users) {
		pthread_mutex_unlock(&ss->lock);
		/* The process exits with them: what they lease goes now rather
		 * than when it lapses. */
		store_session_leases_replace(ss->st, ss->owner, NULL, NULL, 0, 0);
		return -1; /* an ender or a request (a long exec) still holds ss */
	}
	pthread_mutex_unlock(&ss->lock);
	if (ss->inflight || ss->lease_resync)
		store_session_leases_replace(ss->st, ss->owner, NULL, NULL, 0, 0);
	for (struct op *o = ss->inflight, *nx; o; o = nx) {
		nx = o->next;
		free(o);
	}
	pthread_mutex_destroy(&ss->lock);
	pthread_mutex_destroy(&ss->lease_lock);
	pthread_cond_destroy(&ss->cond);
	free(ss->token);
	free(ss);
	return 0;
}
