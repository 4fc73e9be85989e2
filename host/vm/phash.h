/* phash: what a session's RAM pages held when they were last saved or
 * loaded, one 64-bit XXH3 per page, so that its next pause sends only the
 * pages that changed since (a delta over the chunks already in S3).
 *
 * Built while a resume loads the pages (phash_add in stream order: a later
 * record of a page replaces an earlier one), then phash_finish sorts it by
 * page. A fast pause walks the pages in address order with a cursor
 * (phash_next). Not a security boundary: a guest that makes one of its
 * pages collide with the page's old hash only loses its own change on the
 * next resume (docs/architecture.md, threat model). */
#ifndef KILN_PHASH_H
#define KILN_PHASH_H

#include <stddef.h>
#include <stdint.h>

struct phash_ent {
	uint32_t pg;   /* page index in the RAM block */
	uint32_t seq;  /* order it came in (phash_add); after phash_finish, 0 */
	uint64_t h;
};

struct phash {
	struct phash_ent *e;
	size_t n, cap;
	uint32_t seq;
	int finished;  /* sorted by page, one entry a page */
};

/* The hash of one 4096-byte page. */
uint64_t phash_page(const uint8_t *page);

/* Append page pg's hash (h = phash_page of its bytes). 0, or -1 when out
 * of memory (the table is then unusable: phash_free it). */
int phash_add(struct phash *t, uint32_t pg, uint64_t h);

/* Sort by page, keeping each page's last entry. 0, or -1 (out of memory). */
int phash_finish(struct phash *t);

/* The first entry at or after *cur whose page is >= pg, advancing *cur
 * past the entries below pg (each one passed is given to gone(ctx, pg),
 * when gone is not NULL: a page the table has that the walk did not
 * find); NULL when none is left. Only on a finished table. */
const struct phash_ent *phash_next(const struct phash *t, size_t *cur, uint32_t pg,
				   int (*gone)(void *ctx, uint32_t pg), void *ctx, int *rc);

void phash_free(struct phash *t);

#endif
