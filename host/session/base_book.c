/* base_book: which snapshots' base RAM was put in S3 ahead of a pause, the
 * queue of the one worker that does it, and an upload lock per base (see
 * base_book.h). Everything is under b->lock; b->cond wakes whoever waits
 * for a base's lock or for the worker to end. */
#include "base_book.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "condwait.h"

/* One snapshot (by id) and how its preparation went. */
struct base_mark {
	char *id;
	int busy, ok;
	int64_t at_ms;           /* when it last ended */
	struct base_mark *next;
};

/* A base whose upload lock is held. */
struct base_flight {
	char sha[65];
	struct base_flight *next;
};

struct base_book {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned refs;
	int stopping;
	int worker;                      /* a worker thread runs */
	struct base_book_job *head, **tail;
	struct base_mark *marks;
	struct base_flight *flights;
};

struct base_book *base_book_new(void)
{
	struct base_book *b = calloc(1, sizeof(*b));

	if (!b)
		return NULL;
	pthread_mutex_init(&b->lock, NULL);
	condwait_init(&b->cond);
	b->refs = 1;
	b->tail = &b->head;
	return b;
}

void base_book_ref(struct base_book *b)
{
	pthread_mutex_lock(&b->lock);
	b->refs++;
	pthread_mutex_unlock(&b->lock);
}

void base_book_unref(struct base_book *b)
{
	unsigned left;

	if (!b)
		return;
	pthread_mutex_lock(&b->lock);
	left = --b->refs;
	pthread_mutex_unlock(&b->lock);
	if (left)
		return;
	while (b->head) {
		struct base_book_job *j = b->head;

		b->head = j->next;
		j->drop(j);
	}
	while (b->marks) {
		struct base_mark *m = b->marks;

		b->marks = m->next;
		free(m->id);
		free(m);
	}
	/* No flight is left: each is held by a thread inside an upload,
	 * which holds a reference. */
	pthread_cond_destroy(&b->cond);
	pthread_mutex_destroy(&b->lock);
	free(b);
}

/* The mark of id (lock held), or NULL. */
static struct base_mark *mark_find_locked(struct base_book *b, const char *id)
{
	for (struct base_mark *m = b->marks; m; m = m->next)
		if (!strcmp(m->id, id))
			return m;
	return NULL;
}

int base_book_claim(struct base_book *b, const char *id, int64_t now_ms, int64_t retry_ms)
{
	struct base_mark *m;
	int r = 0;

	pthread_mutex_lock(&b->lock);
	m = mark_find_locked(b, id);
	if (b->stopping || (m && (m->busy || m->ok || now_ms - m->at_ms < retry_ms)))
		goto out;
	if (!m) {
		if (!(m = calloc(1, sizeof(*m))) || !(m->id = strdup(id))) {
			free(m);
			goto out; /* out of memory: the pause does it as before */
		}
		m->next = b->marks;
		b->marks = m;
	}
	m->busy = 1;
	r = 1;
out:
	pthread_mutex_unlock(&b->lock);
	return r;
}

void base_book_done(struct base_book *b, const char *id, int ok, int64_t now_ms)
{
	struct base_mark *m;

	pthread_mutex_lock(&b->lock);
	if ((m = mark_find_locked(b, id))) {
		m->busy = 0;
		m->ok = ok;
		m->at_ms = now_ms;
	}
	pthread_mutex_unlock(&b->lock);
}

int base_book_push(struct base_book *b, struct base_book_job *j)
{
	int r;

	pthread_mutex_lock(&b->lock);
	if (b->stopping) {
		r = -1;
	} else {
		j->next = NULL;
		*b->tail = j;
		b->tail = &j->next;
		r = !b->worker;
		b->worker = 1;
	}
	pthread_mutex_unlock(&b->lock);
	return r;
}

struct base_book_job *base_book_pop(struct base_book *b)
{
	struct base_book_job *j = NULL;

	pthread_mutex_lock(&b->lock);
	if (!b->stopping && b->head) {
		j = b->head;
		if (!(b->head = j->next))
			b->tail = &b->head;
	} else {
		b->worker = 0;
		pthread_cond_broadcast(&b->cond);
	}
	pthread_mutex_unlock(&b->lock);
	return j;
}

int base_book_stopping(struct base_book *b)
{
	return condwait_flag(&b->lock, &b->stopping);
}

int base_book_stop(struct base_book *b, int wait_ms)
{
	int64_t deadline = kclock_mono_ms(NULL) + wait_ms;
	int r;

	pthread_mutex_lock(&b->lock);
	b->stopping = 1;
	while (b->worker && condwait_until(&b->cond, &b->lock, NULL, deadline) != ETIMEDOUT)
		;
	r = b->worker;
	pthread_mutex_unlock(&b->lock);
	return r;
}

/* The flight of sha (lock held), or NULL. */
static struct base_flight **flight_find_locked(struct base_book *b, const char *sha)
{
	struct base_flight **p;

	for (p = &b->flights; *p; p = &(*p)->next)
		if (!strcmp((*p)->sha, sha))
			return p;
	return NULL;
}

void base_book_enter(struct base_book *b, const char *sha)
{
	struct base_flight *f = calloc(1, sizeof(*f));

	pthread_mutex_lock(&b->lock);
	while (flight_find_locked(b, sha))
		pthread_cond_wait(&b->cond, &b->lock);
	/* Out of memory: go on unlocked (at worst the base goes up twice,
	 * the same bytes under the same keys, as two hosts may do). */
	if (f) {
		snprintf(f->sha, sizeof(f->sha), "%s", sha);
		f->next = b->flights;
		b->flights = f;
	}
	pthread_mutex_unlock(&b->lock);
}

void base_book_leave(struct base_book *b, const char *sha)
{
	struct base_flight **p, *f = NULL;

	pthread_mutex_lock(&b->lock);
	if ((p = flight_find_locked(b, sha))) {
		f = *p;
		*p = f->next;
	}
	pthread_cond_broadcast(&b->cond);
	pthread_mutex_unlock(&b->lock);
	free(f);
}
