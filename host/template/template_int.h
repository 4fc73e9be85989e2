/* template_int: what the template store's files share (template.c,
 * template_disk.c, template_entry.c, template_gc.c): its entries, the
 * store, and the helpers they call across files. The store's mutex guards
 * the list and every entry's fields (functions named _locked run with it
 * held). Not for other rooms: they use template.h. */
#ifndef KILN_TEMPLATE_INT_H
#define KILN_TEMPLATE_INT_H

#include <limits.h>
#include <pthread.h>
#include <stdint.h>

#include <jansson.h>

#include "run/run.h"
#include "template.h"

struct template {
	char name[64];
	int builtin;
	char sha256[65];
	char dir[PATH_MAX];        /* customer: <cache>/templates/<sha256> */
	char rootfs[PATH_MAX];
	struct template_ref ref;          /* the customer template's meta.json (env decref'd with it) */
	struct vm_config vmc;      /* base with this rootfs (pools keep pointers into it) */
	int local;                 /* the image is on disk, verified */
	int fetching, snapping;    /* slow work under way, the lock released */
	unsigned fetch_gen;        /* fetches finished */
	int fetch_rc;
	struct kiln_err fetch_err;
	struct snapshot snap, net_snap;
	int have_snap, have_net_snap;
	int64_t snap_retry_ms;     /* a snapshot failed: no new attempt before (monotonic) */
	int snap_lock, net_snap_lock; /* shared flocks on the snapshots' last_used (-1) */
	struct pool *pool;
	unsigned pool_size, pool_max, prestart;
	unsigned users;
	int lock_fd;               /* shared flock on dir/last_used while used (-1) */
	struct template *next;
};

struct template_store {
	struct template_store_config cfg;
	struct vm_config base;
	char image_dir[PATH_MAX], tdir[PATH_MAX], sdir[PATH_MAX];
	json_t *pools;
	pthread_mutex_t lock;
	pthread_cond_t changed;
	struct template *list;
	struct template *def;
	uint64_t fetches, fetch_failures, fetch_bytes, verify_failures, evictions, snapshots_expired;
	int64_t next_gc_ms;
};

/* ---- template_disk.c ---- */

uint64_t template_du_at(int at, const char *name, int depth);
int template_lock_shared(const char *dir);
void template_touch_used(const char *dir);
int64_t template_last_used_ms(const char *dir);
int template_remove_unlocked(const char *dir);

/* ---- template_entry.c (lock held) ---- */

void template_entry_unload_locked(struct template *t);
void template_entry_free(struct template *t);
struct template *template_find_locked(struct template_store *ts, const struct template_ref *r);

#endif
