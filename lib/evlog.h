/* evlog: one task's event log, the server-sent-event text kiln-api and
 * kiln-host stream from GET /v1/tasks/{id}/events. Each event is kept as its
 * formatted block, "event: NAME\ndata: JSON\n\n", so that a late subscriber
 * sees them all from the first; readers hold a cursor and wait on a
 * condition variable for more. Memory is bounded per log (and optionally
 * across logs, through a shared pool): past the bound, events other than
 * "state" are refused and the first refused one becomes a single
 * "truncated" event.
 *
 * Locking: the log has no lock of its own. It uses its owner's mutex (which
 * also guards whatever decides the log's end) and condition variable (which
 * the owner may broadcast for its own reasons too); every *_locked function
 * is called with that mutex held. The condition variable must use
 * CLOCK_MONOTONIC (deadlines are clock_mono_ms() values). */
#ifndef KILN_EVLOG_H
#define KILN_EVLOG_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* A bound shared by several logs (under the same mutex as they are). */
struct evlog_pool {
	size_t bytes, max;
};

struct evlog_opts {
	pthread_mutex_t *lock;       /* the owner's mutex */
	pthread_cond_t *cond;        /* broadcast on every append and on close */
	const int *stopping;         /* the owner's "shutting down" flag (under lock), or NULL */
	size_t max_bytes;            /* per log */
	struct evlog_pool *pool;     /* or NULL */
	/* Over a bound, called once (lock held) before an event is refused: it
	 * may free other logs to make room, never this one. Or NULL. */
	void (*reclaim)(void *ctx);
	void *reclaim_ctx;
	const char *truncated_data;  /* the JSON of the "truncated" event */
};

struct evlog {
	struct evlog_opts o;
	char **ev;                   /* blocks; NULL where dropped */
	size_t n, cap, bytes;        /* bytes as counted against the bounds */
	int truncated, closed;
};

/* Where a reader is: the next block, and bytes of it already read. */
struct evlog_cursor {
	size_t next, off;
};

#define EVLOG_END (-1L)

/* Set up an empty log (no allocation). Any thread. */
void evlog_init(struct evlog *l, const struct evlog_opts *o);

/* Free the blocks (and give their bytes back to the pool); the log must have
 * no reader left. Lock held if the pool is shared. */
void evlog_free(struct evlog *l);

/* Append one event, data borrowed (serialised compactly) and broadcast.
 * Returns 0; 1 when the event was over a bound and a "truncated" event went
 * in its place; -ENOSPC when it was over a bound after that note (dropped);
 * -ENOMEM. "state" events are never refused. Lock held. */
int evlog_append_locked(struct evlog *l, const char *name, json_t *data);

/* No more events matter: readers end once they have read everything.
 * Appends still work (a reader not at the end yet gets them). Lock held. */
void evlog_close_locked(struct evlog *l);

/* Drop every event whose name is in names (NULL-ended); the last one dropped
 * becomes note, a whole block given as text, so that a reader that had not
 * read them yet learns why. Cursors stay valid (entries are emptied, not
 * removed). Returns how many were dropped. Lock held. */
size_t evlog_drop_locked(struct evlog *l, const char *const *names, const char *note);

/* Copy events from *c on into buf (at most cap > 0 bytes), waiting until
 * deadline_ms (clock_mono_ms) for one if there is none. whole: only whole
 * events (one larger than cap is cut to cap and passed), else a block may be
 * split across calls. Returns bytes copied, 0 at the deadline (or when the
 * only events left were dropped), or EVLOG_END once the log is closed (or the
 * owner stopping) and the reader has read it all. Takes and releases the
 * lock; any thread but the appending one. */
long evlog_read(struct evlog *l, struct evlog_cursor *c, char *buf, size_t cap, int64_t deadline_ms, int whole);

#endif
