/* template_entry: a template store entry's end and lookup (the store's lock
 * held): unload (its pool, snapshots and flocks go), free, find by TREF.
 * Its own file so that template.c and template_gc.c both call down into it
 * and neither into the other's entries: no circle in the template room. */
#include "template_int.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void template_entry_unload_locked(struct template *t)
{
	if (t->pool) {
		pool_stop(t->pool);
		t->pool = NULL;
	}
	if (t->have_snap)
		snapshot_close(&t->snap);
	if (t->have_net_snap)
		snapshot_close(&t->net_snap);
	t->have_snap = t->have_net_snap = 0;
	if (t->snap_lock >= 0)
		close(t->snap_lock);
	if (t->net_snap_lock >= 0)
		close(t->net_snap_lock);
	t->snap_lock = t->net_snap_lock = -1;
	if (t->lock_fd >= 0)
		close(t->lock_fd);
	t->lock_fd = -1;
}

void template_entry_free(struct template *t)
{
	template_ref_free(&t->ref);
	free(t);
}

struct template *template_find_locked(struct template_store *ts, const struct template_ref *r)
{
	for (struct template *t = ts->list; t; t = t->next) {
		if (r->builtin ? t->builtin && !strcmp(t->name, r->name) : !t->builtin && !strcmp(t->sha256, r->sha256))
			return t;
	}
	return NULL;
}
