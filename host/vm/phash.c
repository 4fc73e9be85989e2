/* phash: the pages' hashes of a session's last save or load (phash.h). */
#include "phash.h"

#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t phash_page(const uint8_t *page)
{
	return XXH3_64bits(page, 4096);
}

int phash_add(struct phash *t, uint32_t pg, uint64_t h)
{
	if (t->n == t->cap) {
		size_t nc = t->cap ? 2 * t->cap : 4096;
		struct phash_ent *p = realloc(t->e, nc * sizeof(*p));

		if (!p)
			return -1;
		t->e = p;
		t->cap = nc;
	}
	t->e[t->n++] = (struct phash_ent){ .pg = pg, .seq = t->seq++, .h = h };
	t->finished = 0;
	return 0;
}

static int by_page_then_seq(const void *a, const void *b)
{
	const struct phash_ent *x = a, *y = b;

	if (x->pg != y->pg)
		return x->pg < y->pg ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

int phash_finish(struct phash *t)
{
	size_t o = 0;

	qsort(t->e, t->n, sizeof(*t->e), by_page_then_seq);
	for (size_t i = 0; i < t->n; i++) {
		if (i + 1 < t->n && t->e[i + 1].pg == t->e[i].pg)
			continue; /* a later record of the same page wins */
		t->e[o] = t->e[i];
		t->e[o++].seq = 0;
	}
	t->n = o;
	t->finished = 1;
	return 0;
}

const struct phash_ent *phash_next(const struct phash *t, size_t *cur, uint32_t pg,
				   int (*gone)(void *ctx, uint32_t pg), void *ctx, int *rc)
{
	*rc = 0;
	while (*cur < t->n && t->e[*cur].pg < pg) {
		if (gone && gone(ctx, t->e[*cur].pg) < 0) {
			*rc = -1;
			return NULL;
		}
		(*cur)++;
	}
	return *cur < t->n ? &t->e[*cur] : NULL;
}

void phash_free(struct phash *t)
{
	free(t->e);
	memset(t, 0, sizeof(*t));
}
