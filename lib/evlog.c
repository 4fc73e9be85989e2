/* evlog: a task's server-sent-event log with cursor readers (see evlog.h).
 * Invariant: l->bytes is the sum over kept blocks of their strlen, and the
 * pool's bytes include it. */
#include "evlog.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"

void evlog_init(struct evlog *l, const struct evlog_opts *o)
{
	memset(l, 0, sizeof(*l));
	l->o = *o;
}

/* What a kept block counts against the bounds. */
static size_t block_bytes(const struct evlog *l, const char *block)
{
	(void)l;
	return strlen(block);
}

void evlog_free(struct evlog *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->ev[i]);
	if (l->o.pool)
		l->o.pool->bytes -= l->bytes;
	free(l->ev);
	l->ev = NULL;
	l->n = l->cap = l->bytes = 0;
}

static int over_locked(const struct evlog *l, size_t len)
{
	return l->bytes + len > l->o.max_bytes || (l->o.pool && l->o.pool->bytes + len > l->o.pool->max);
}

int evlog_append_locked(struct evlog *l, const char *name, json_t *data)
{
	char *js = json_dumps(data, JSON_COMPACT), *block;
	size_t len;
	int ret = 0;

	if (!js)
		return -ENOMEM;
	len = strlen(name) + strlen(js) + 16; /* "event: " "\ndata: " "\n\n" */
	if (strcmp(name, "state") && over_locked(l, len)) {
		if (l->o.reclaim)
			l->o.reclaim(l->o.reclaim_ctx);
		if (over_locked(l, len)) {
			/* The note itself goes in whatever the bounds say: one
			 * small event, once. */
			free(js);
			if (l->truncated)
				return -ENOSPC;
			l->truncated = 1;
			name = "truncated";
			js = strdup(l->o.truncated_data ? l->o.truncated_data : "{}");
			if (!js)
				return -ENOMEM;
			len = strlen(name) + strlen(js) + 16;
			ret = 1;
		}
	}
	if (l->n == l->cap) {
		size_t ncap = l->cap ? l->cap * 2 : 16;
		char **nev = realloc(l->ev, ncap * sizeof(*nev));

		if (!nev) {
			free(js);
			return -ENOMEM;
		}
		l->ev = nev;
		l->cap = ncap;
	}
	block = malloc(len + 1);
	if (!block) {
		free(js);
		return -ENOMEM;
	}
	snprintf(block, len + 1, "event: %s\ndata: %s\n\n", name, js);
	free(js);
	l->ev[l->n++] = block;
	l->bytes += len;
	if (l->o.pool)
		l->o.pool->bytes += len;
	pthread_cond_broadcast(l->o.cond);
	return ret;
}

void evlog_close_locked(struct evlog *l)
{
	l->closed = 1;
	pthread_cond_broadcast(l->o.cond);
}

/* "event: NAME\n" starts block. */
static int named(const char *block, const char *name)
{
	size_t n = strlen(name);

	return !strncmp(block, "event: ", 7) && !strncmp(block + 7, name, n) && block[7 + n] == '\n';
}

size_t evlog_drop_locked(struct evlog *l, const char *const *names, const char *note)
{
	size_t last = l->n, dropped = 0;

	for (size_t i = 0; i < l->n; i++) {
		const char *const *nm = names;
		size_t b;

		if (!l->ev[i])
			continue;
		while (*nm && !named(l->ev[i], *nm))
			nm++;
		if (!*nm)
			continue;
		b = block_bytes(l, l->ev[i]);
		l->bytes -= b;
		if (l->o.pool)
			l->o.pool->bytes -= b;
		free(l->ev[i]);
		l->ev[i] = NULL;
		last = i;
		dropped++;
	}
	if (last < l->n && note && (l->ev[last] = strdup(note))) {
		size_t b = block_bytes(l, note);

		l->bytes += b;
		if (l->o.pool)
			l->o.pool->bytes += b;
	}
	return dropped;
}

static int ended_locked(const struct evlog *l)
{
	return l->closed || (l->o.stopping && *l->o.stopping);
}

long evlog_read(struct evlog *l, struct evlog_cursor *c, char *buf, size_t cap, int64_t deadline_ms, int whole)
{
	size_t n = 0;

	pthread_mutex_lock(l->o.lock);
	while (c->next >= l->n) {
		struct timespec ts = { .tv_sec = deadline_ms / 1000, .tv_nsec = (deadline_ms % 1000) * 1000000 };

		if (ended_locked(l)) {
			pthread_mutex_unlock(l->o.lock);
			return EVLOG_END;
		}
		if (clock_mono_ms() >= deadline_ms)
			break;
		pthread_cond_timedwait(l->o.cond, l->o.lock, &ts);
	}
	while (c->next < l->n && n < cap) {
		const char *ev = l->ev[c->next];
		size_t len, take;

		if (!ev) { /* dropped (evlog_drop_locked) */
			c->next++;
			c->off = 0;
			continue;
		}
		len = strlen(ev) - c->off;
		if (whole && len > cap - n) {
			if (n)
				break;
			/* One event larger than the whole buffer: cut it. */
			len = cap;
		}
		take = len < cap - n ? len : cap - n;
		memcpy(buf + n, ev + c->off, take);
		n += take;
		c->off += take;
		if (c->off == strlen(ev) || whole) {
			c->next++;
			c->off = 0;
		}
	}
	pthread_mutex_unlock(l->o.lock);
	return (long)n;
}
