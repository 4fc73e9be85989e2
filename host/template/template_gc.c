/* template_gc: the template store's garbage collection: least recently
 * used customer templates go past the disk budget, snapshots unused for
 * their TTL go whoever made them, never anything a process holds (its
 * shared flock on last_used). See template.c for the store's invariants. */
#include "template_int.h"


#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "clock.h"
#include "fsutil.h"
#include "io.h"
#include "proto.h"
#include "run/run.h"
#include "spec.h"

/* Whether a snapshot key is one this process has loaded (lock held). */
static int snapshot_ours_locked(struct template_store *ts, const char *key)
{
	for (struct template *t = ts->list; t; t = t->next)
		if ((t->have_snap && !strcmp(t->snap.key, key)) || (t->have_net_snap && !strcmp(t->net_snap.key, key)))
			return 1;
	return 0;
}

/* Remove the snapshots a customer template's directory notes (snap-KEY). */
static void remove_template_snapshots(struct template_store *ts, const char *tdir)
{
	DIR *d = opendir(tdir);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		char sd[PATH_MAX + 64];

		if (strncmp(e->d_name, "snap-", 5) || strlen(e->d_name) != 21 || strchr(e->d_name, '/'))
			continue;
		snprintf(sd, sizeof(sd), "%s/%s", ts->sdir, e->d_name + 5);
		template_remove_unlocked(sd);
	}
	closedir(d);
}

int template_store_gc(struct template_store *ts, int force)
{
	struct template_lru *lru = NULL;
	char (*names)[72] = NULL;
	size_t n = 0, cap = 0, *idx = NULL, nidx;
	uint64_t total;
	int64_t now = clock_wall_ms();
	int evicted = 0;
	DIR *d;
	struct dirent *e;

	pthread_mutex_lock(&ts->lock);
	if (!force && kclock_mono_ms(ts->cfg.clk) < ts->next_gc_ms) {
		pthread_mutex_unlock(&ts->lock);
		return 0;
	}
	ts->next_gc_ms = kclock_mono_ms(ts->cfg.clk) + TEMPLATE_GC_PERIOD_MS;
	/* What we use is used now (pools restore from their snapshot all the time). */
	for (struct template *t = ts->list; t; t = t->next) {
		char sd[PATH_MAX + 32];

		if (t->users && !t->builtin)
			template_touch_used(t->dir);
		if (t->have_snap) {
			snprintf(sd, sizeof(sd), "%s/%s", ts->sdir, t->snap.key);
			template_touch_used(sd);
		}
		if (t->have_net_snap) {
			snprintf(sd, sizeof(sd), "%s/%s", ts->sdir, t->net_snap.key);
			template_touch_used(sd);
		}
	}
	/* Snapshots unused for the TTL, whoever made them (one another process
	 * uses holds its lock and stays). */
	if (ts->cfg.snapshot_ttl_s && (d = opendir(ts->sdir))) {
		while ((e = readdir(d))) {
			char sd[PATH_MAX + 32];

			if (e->d_name[0] == '.' || strlen(e->d_name) != 16 || snapshot_ours_locked(ts, e->d_name))
				continue;
			snprintf(sd, sizeof(sd), "%s/%s", ts->sdir, e->d_name);
			if (now - template_last_used_ms(sd) > (int64_t)ts->cfg.snapshot_ttl_s * 1000 && template_remove_unlocked(sd)) {
				fprintf(stderr, "kiln-host: snapshot %s unused for %u s: removed\n", e->d_name,
					ts->cfg.snapshot_ttl_s);
				ts->snapshots_expired++;
			}
		}
		closedir(d);
	}
	if (!ts->cfg.disk_budget_mib)
		goto out;
	/* The budget: customer templates (all of the cache's) plus every snapshot. */
	total = template_du_at(AT_FDCWD, ts->sdir, 0) + template_du_at(AT_FDCWD, ts->tdir, 0);
	if (total <= ts->cfg.disk_budget_mib << 20)
		goto out;
	if (!(d = opendir(ts->tdir)))
		goto out;
	while ((e = readdir(d))) {
		char td[PATH_MAX + 80];
		struct template_ref r;
		struct template *t;

		if (!template_ref_hex64_ok(e->d_name))
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			void *a = realloc(lru, nc * sizeof(*lru)), *b;

			if (!a)
				break;
			lru = a;
			b = realloc(names, nc * sizeof(*names));
			if (!b)
				break;
			names = b;
			cap = nc;
		}
		snprintf(td, sizeof(td), "%s/%s", ts->tdir, e->d_name);
		snprintf(names[n], sizeof(names[n]), "%s", e->d_name);
		memset(&r, 0, sizeof(r));
		snprintf(r.sha256, sizeof(r.sha256), "%s", e->d_name);
		t = template_find_locked(ts, &r);
		lru[n] = (struct template_lru){
			.last_used_ms = template_last_used_ms(td),
			.bytes = template_du_at(AT_FDCWD, td, 0),
			.in_use = t && (t->users || t->fetching || t->snapping),
			.evictable = 1,
		};
		{
			/* The snapshots it noted count as its own. */
			DIR *sdn = opendir(td);
			struct dirent *se;

			while (sdn && (se = readdir(sdn))) {
				char sd[PATH_MAX + 64];

				if (strncmp(se->d_name, "snap-", 5) || strlen(se->d_name) != 21)
					continue;
				snprintf(sd, sizeof(sd), "%s/%s", ts->sdir, se->d_name + 5);
				lru[n].bytes += template_du_at(AT_FDCWD, sd, 0);
			}
			if (sdn)
				closedir(sdn);
		}
		n++;
	}
	closedir(d);
	idx = calloc(n ? n : 1, sizeof(*idx));
	if (!idx)
		goto out;
	for (size_t i = 0; i < n; i++)
		lru[i].id = names[i];
	nidx = template_lru_choose(lru, n, total, ts->cfg.disk_budget_mib << 20, idx);
	for (size_t i = 0; i < nidx; i++) {
		char td[PATH_MAX + 80];
		struct template_ref r;
		struct template *t, **pp;

		memset(&r, 0, sizeof(r));
		snprintf(r.sha256, sizeof(r.sha256), "%s", names[idx[i]]);
		snprintf(td, sizeof(td), "%s/%s", ts->tdir, names[idx[i]]);
		t = template_find_locked(ts, &r);
		if (t)
			template_entry_unload_locked(t); /* our own locks go first */
		remove_template_snapshots(ts, td);
		if (!template_remove_unlocked(td))
			continue; /* another process uses it: it stays */
		fprintf(stderr, "kiln-host: template %s evicted (unused since %lld s, disk budget %llu MiB)\n",
			names[idx[i]], (long long)((now - lru[idx[i]].last_used_ms) / 1000),
			(unsigned long long)ts->cfg.disk_budget_mib);
		ts->evictions++;
		evicted++;
		if (t) {
			for (pp = &ts->list; *pp && *pp != t; pp = &(*pp)->next)
				;
			if (*pp)
				*pp = t->next;
			template_entry_free(t);
		}
	}
out:
	pthread_mutex_unlock(&ts->lock);
	free(idx);
	free(lru);
	free(names);
	return evicted;
}
