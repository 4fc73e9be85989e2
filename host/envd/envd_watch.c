/* envd_watch: kiln-host's end of the directory watches carried over a
 * session's envd channel (envd.h "directory watches", docs/e2b.md
 * "Watching directories"). A watch is a struct envd_watch on the channel's
 * list, under the channel's lock like everything else here: the I/O thread
 * queues the guest's WATCH_EVENTs on it and files its WATCH_END; a stream
 * (WatchDir) takes them with envd_watch_next, a polling watcher
 * (CreateWatcher) keeps them until GetWatcherEvents drains them.
 *
 * The guest is hostile: its frames are decoded by lib/eproto's checked
 * decoders (a malformed one kills the channel, envd.c), and what it may make
 * us hold is bounded: ENVD_MAX_WATCHES watches per channel, each with at most
 * ENVD_WATCH_Q_EVENTS events and ENVD_WATCH_Q_BYTES bytes of names not taken.
 * Past that the watch fails (internal, as E2B's envd fails a watcher whose
 * fsnotify queue overflowed) and the guest is told to stop it. Watch ids come
 * from a counter that does not repeat while the channel lives, so a late
 * frame of a closed watch is never taken for a new one's. */
#include "envd_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "condwait.h"

struct envd_watch {
	struct envd *e;
	uint32_t id;
	int polling;          /* a watcher: no reference on the channel; lives until removed */
	char wid[ENVD_WATCHER_ID];
	int live;             /* the guest has it (no WATCH_END yet) */
	int closing;          /* its owner is done: freed when WATCH_END comes */
	int failed;
	struct envd_err err;
	struct buf q;         /* records: u8 event, u32 name length, name */
	size_t q_off;
	size_t nq;            /* events in q */
	struct envd_watch *next;
};

static struct envd_watch *watch_find(struct envd *e, uint32_t id)
{
	for (struct envd_watch *w = e->watches; w; w = w->next)
		if (w->id == id)
			return w;
	return NULL;
}

/* Lock held. */
static void watch_unlink_free(struct envd *e, struct envd_watch *w)
{
	for (struct envd_watch **pp = &e->watches; *pp; pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	buf_free(&w->q);
	free(w);
}

/* The guest is to stop w (lock held); it answers WATCH_END. */
static void watch_unwatch(struct envd *e, struct envd_watch *w)
{
	uint32_t id = w->id;

	if (w->live && e->state == ENVD_READY)
		envd_queue_u32s(e, EP_UNWATCH, &id, 1);
}

static void watch_fail(struct envd_watch *w, enum connect_code c, int errnum, const char *msg)
{
	if (w->failed)
		return;
	w->failed = 1;
	envd_set_err(&w->err, c, errnum, "%s", msg);
}

int envd_watch_frame(struct envd *e, const struct proto_frame *f)
{
	char name[PROTO_MAX_PATH + 1], msg[PROTO_MAX_MSG + 1];
	struct envd_watch *w;
	uint32_t id, len;
	int32_t code;
	uint8_t ev, hdr[5];

	if (f->type == EP_WATCH_EVENT) {
		if (eproto_wevent_decode(f->payload, f->len, &id, &ev, name) < 0)
			return -1;
		w = watch_find(e, id);
		if (!w || w->closing || w->failed)
			return 0;
		len = (uint32_t)strlen(name);
		if (w->nq >= ENVD_WATCH_Q_EVENTS || w->q.len - w->q_off + sizeof(hdr) + len > ENVD_WATCH_Q_BYTES ||
		    buf_reserve(&w->q, sizeof(hdr) + len) < 0) {
			char why[160];

			snprintf(why, sizeof(why), "watcher error: more than %u events (or %u KiB of names) not taken: queue overflow",
				 ENVD_WATCH_Q_EVENTS, ENVD_WATCH_Q_BYTES >> 10);
			watch_fail(w, CONNECT_INTERNAL, 0, why);
			watch_unwatch(e, w);
		} else {
			hdr[0] = ev;
			memcpy(hdr + 1, &len, 4);
			buf_add(&w->q, hdr, sizeof(hdr));
			buf_add(&w->q, name, len);
			w->nq++;
		}
		pthread_cond_broadcast(&e->cond);
		return 0;
	}
	/* EP_WATCH_END */
	if (eproto_wend_decode(f->payload, f->len, &id, &code, msg) < 0)
		return -1;
	w = watch_find(e, id);
	if (!w)
		return 0;
	w->live = 0;
	if (w->closing) {
		watch_unlink_free(e, w);
	} else if (code) {
		watch_fail(w, code == -EOVERFLOW ? CONNECT_INTERNAL : connect_code_from_errno(code), code,
			   msg[0] ? msg : "the watch ended");
	} else {
		watch_fail(w, CONNECT_INTERNAL, 0, "the watch ended");
	}
	pthread_cond_broadcast(&e->cond);
	return 0;
}

void envd_watches_fail(struct envd *e, const char *why)
{
	struct envd_watch *w = e->watches;

	while (w) {
		struct envd_watch *next = w->next;

		w->live = 0;
		if (w->closing)
			watch_unlink_free(e, w);
		else
			watch_fail(w, CONNECT_UNAVAILABLE, 0, why);
		w = next;
	}
}

void envd_watches_free(struct envd *e)
{
	while (e->watches)
		watch_unlink_free(e, e->watches);
}

int envd_watch_count(struct envd *e)
{
	int n = 0;

	pthread_mutex_lock(&e->lock);
	for (struct envd_watch *w = e->watches; w; w = w->next)
		n++;
	pthread_mutex_unlock(&e->lock);
	return n;
}

/* WATCH path as user; on DONE the watch is on the channel's list (polling:
 * without a reference; else with one, the caller's). NULL with err. */
static struct envd_watch *watch_open(struct envd *e, const char *user, const char *path, int recursive, int polling,
				     int64_t deadline_ms, struct envd_err *err)
{
	struct eproto_watch *m = calloc(1, sizeof(*m));
	uint8_t *p = malloc(PROTO_MAX_PAYLOAD);
	struct envd_watch *w = calloc(1, sizeof(*w));
	struct envd_reply rep;
	struct envd_req *r = NULL;
	int n = 0, rc, count = 0;
	ssize_t len;

	if (!m || !p || !w) {
		envd_set_err(err, CONNECT_RESOURCE_EXHAUSTED, 0, "%s", "out of memory");
		goto fail;
	}
	if (!path || !*path || strlen(path) > PROTO_MAX_PATH || strlen(user) > EPROTO_MAX_USER) {
		envd_set_err(err, CONNECT_INVALID_ARGUMENT, 0, "%s", "path: expected 1-4096 bytes (and a user name of at most 32)");
		goto fail;
	}
	w->e = e;
	w->polling = polling;
	buf_init(&w->q, 0);
	if (polling) {
		uint8_t rnd[8];

		if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd)) {
			envd_set_err(err, CONNECT_INTERNAL, 0, "%s", "no random bytes for a watcher id");
			goto fail;
		}
		snprintf(w->wid, sizeof(w->wid), "w%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2], rnd[3], rnd[4],
			 rnd[5], rnd[6], rnd[7]);
	}
	pthread_mutex_lock(&e->lock);
	rc = envd_wait_ready(e, deadline_ms, err);
	if (rc == 0 && !(e->features & EPROTO_FEAT_WATCH)) {
		envd_set_err(err, CONNECT_UNIMPLEMENTED, 0, "%s",
			     "this sandbox's image predates directory watching: rebuild its template");
		rc = -1;
	}
	for (struct envd_watch *o = e->watches; rc == 0 && o; o = o->next)
		count++;
	if (rc == 0 && count >= ENVD_MAX_WATCHES) {
		char why[80];

		snprintf(why, sizeof(why), "at most %d directory watches per sandbox", ENVD_MAX_WATCHES);
		envd_set_err(err, CONNECT_RESOURCE_EXHAUSTED, 0, "%s", why);
		rc = -1;
	}
	if (rc == 0) {
		/* On the list before WATCH goes: its first events may come
		 * before its DONE is read. */
		w->id = ++e->next_watch;
		w->live = 1;
		w->next = e->watches;
		e->watches = w;
		e->refs++; /* while it opens (a polling watcher gives it back) */
	}
	pthread_mutex_unlock(&e->lock);
	if (rc < 0)
		goto fail;
	m->id = w->id;
	m->flags = recursive ? EP_WATCH_RECURSIVE : 0;
	snprintf(m->user, sizeof(m->user), "%s", user);
	snprintf(m->path, sizeof(m->path), "%s", path);
	len = eproto_watch_encode(p, PROTO_MAX_PAYLOAD, m);
	r = len < 0 ? NULL : envd_req_begin(e, EP_WATCH, p, (size_t)len, deadline_ms, err);
	if (len < 0)
		envd_set_err(err, CONNECT_INVALID_ARGUMENT, 0, "%s", "the request does not fit the guest protocol");
	if (r)
		n = envd_req_next(r, &rep, deadline_ms, err);
	if (r && n == 0) {
		envd_set_err(err, CONNECT_INTERNAL, 0, "%s", "no answer to WATCH");
		n = -1;
	}
	if (r && n == 1 && rep.type != EP_DONE) {
		envd_set_err(err, CONNECT_INTERNAL, 0, "%s", "a malformed answer to WATCH");
		n = -1;
	}
	envd_req_free(r);
	pthread_mutex_lock(&e->lock);
	if (!r || n < 0) {
		/* The guest has no such watch (its ERROR), or may start it
		 * still (a deadline): UNWATCH then ends it. */
		if (r && err && err->errnum == 0)
			watch_unwatch(e, w);
		if (err && err->errnum == -ENOTDIR)
			err->code = CONNECT_INVALID_ARGUMENT; /* E2B: not a directory */
		watch_unlink_free(e, w);
		e->refs--; /* never the last: the caller holds one */
		pthread_mutex_unlock(&e->lock);
		w = NULL;
		goto fail;
	}
	if (polling)
		e->refs--; /* a watcher does not keep the session busy */
	pthread_mutex_unlock(&e->lock);
	free(m);
	free(p);
	return w;
fail:
	if (w && !w->id) {
		buf_free(&w->q);
		free(w);
	}
	free(m);
	free(p);
	return NULL;
}

struct envd_watch *envd_watch_open(struct envd *e, const char *user, const char *path, int recursive,
				   int64_t deadline_ms, struct envd_err *err)
{
	return watch_open(e, user, path, recursive, 0, deadline_ms, err);
}

/* The next record of w's queue (lock held): 1 with it, 0 when none. */
static int watch_take(struct envd_watch *w, struct envd_wevent *ev)
{
	uint32_t len;

	if (w->q.len - w->q_off < 5)
		return 0;
	ev->type = w->q.p[w->q_off];
	memcpy(&len, w->q.p + w->q_off + 1, 4);
	if (len > PROTO_MAX_PATH)
		len = PROTO_MAX_PATH; /* never queued longer */
	memcpy(ev->name, w->q.p + w->q_off + 5, len);
	ev->name[len] = '\0';
	w->q_off += 5 + len;
	w->nq--;
	if (w->q_off == w->q.len) {
		buf_reset(&w->q);
		w->q_off = 0;
	}
	return 1;
}

int envd_watch_next(struct envd_watch *w, struct envd_wevent *ev, int64_t deadline_ms, struct envd_err *err)
{
	struct envd *e = w->e;
	int ret;

	pthread_mutex_lock(&e->lock);
	for (;;) {
		if (watch_take(w, ev)) {
			ret = 1;
			break;
		}
		if (w->failed) {
			if (err)
				*err = w->err;
			ret = -1;
			break;
		}
		if (condwait_until(&e->cond, &e->lock, NULL, deadline_ms) == ETIMEDOUT && w->q.len == w->q_off &&
		    !w->failed) {
			ret = 0;
			break;
		}
	}
	pthread_mutex_unlock(&e->lock);
	return ret;
}

/* Lock held: w's owner is done with it. */
static void watch_close_locked(struct envd *e, struct envd_watch *w)
{
	if (w->live && e->state == ENVD_READY) {
		watch_unwatch(e, w);
		w->closing = 1; /* until WATCH_END: the guest still holds it */
		buf_free(&w->q);
		buf_init(&w->q, 0);
		w->q_off = w->nq = 0;
	} else {
		watch_unlink_free(e, w);
	}
}

void envd_watch_close(struct envd_watch *w)
{
	struct envd *e;

	if (!w)
		return;
	e = w->e;
	pthread_mutex_lock(&e->lock);
	watch_close_locked(e, w);
	pthread_mutex_unlock(&e->lock);
	envd_unref(e);
}

/* ---- polling watchers ---------------------------------------------------------- */

int envd_watcher_create(struct envd *e, const char *user, const char *path, int recursive, int64_t deadline_ms,
			char id[ENVD_WATCHER_ID], struct envd_err *err)
{
	struct envd_watch *w = watch_open(e, user, path, recursive, 1, deadline_ms, err);

	if (!w)
		return -1;
	memcpy(id, w->wid, ENVD_WATCHER_ID);
	return 0;
}

static struct envd_watch *watcher_find(struct envd *e, const char *id, struct envd_err *err)
{
	for (struct envd_watch *w = e->watches; w; w = w->next)
		if (w->polling && !w->closing && !strcmp(w->wid, id))
			return w;
	envd_set_err(err, CONNECT_NOT_FOUND, 0, "watcher with id %.40s not found", id);
	return NULL;
}

int envd_watcher_events(struct envd *e, const char *id, void (*fn)(void *arg, uint8_t type, const char *name),
			void *arg, struct envd_err *err)
{
	struct envd_wevent *ev = malloc(sizeof(*ev));
	struct envd_watch *w;
	int rc = -1;

	if (!ev) {
		envd_set_err(err, CONNECT_RESOURCE_EXHAUSTED, 0, "%s", "out of memory");
		return -1;
	}
	pthread_mutex_lock(&e->lock);
	w = watcher_find(e, id, err);
	if (w && w->failed) {
		/* E2B: a watcher that failed answers its error from then on. */
		if (err)
			*err = w->err;
	} else if (w) {
		while (watch_take(w, ev))
			fn(arg, ev->type, ev->name);
		rc = 0;
	}
	pthread_mutex_unlock(&e->lock);
	free(ev);
	return rc;
}

int envd_watcher_remove(struct envd *e, const char *id, struct envd_err *err)
{
	struct envd_watch *w;

	pthread_mutex_lock(&e->lock);
	w = watcher_find(e, id, err);
	if (w)
		watch_close_locked(e, w);
	pthread_mutex_unlock(&e->lock);
	return w ? 0 : -1;
}
