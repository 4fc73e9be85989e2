/* migfilter: filters a QEMU 7.2 migration stream (precopy, no multifd, no
 * compression, no xbzrle) so that it keeps only the RAM pages that differ
 * from a base image of one RAM block (a session's template snapshot RAM).
 * The filtered stream loads into a QEMU whose RAM is that base mapped
 * copy-on-write: the pages left out are already right there.
 *
 * The stream comes from a jailed QEMU (and, on the way back, from S3 after
 * a SHA-256 check): every length is bounded and anything the filter does not
 * understand fails the filter, never passes through half-parsed. */
#ifndef KILN_MIGFILTER_H
#define KILN_MIGFILTER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"

/* Where the stream comes from: read exactly-or-less, like read(2):
 * returns bytes read, 0 at end, -1 on error. */
typedef ssize_t (*migfilter_read_fn)(void *ctx, void *buf, size_t len);
/* Where the filtered stream goes: 0, or -1 to stop the filter. */
typedef int (*migfilter_write_fn)(void *ctx, const void *buf, size_t len);

struct migfilter_base {
	const char *block;      /* the RAM block the base describes ("mem") */
	const uint8_t *data;    /* its bytes (a read-only mapping) */
	uint64_t size;          /* must equal the block's length, or nothing is left out */
	/* Instead of comparing with data: every page record of the block goes
	 * to page (addr < size, a multiple of 4096; the page's 4096 bytes, a
	 * zero record's filled in) and is left out of the stream; flush is
	 * called at the end of each part of the RAM section, before anything
	 * after it is written (a loader that batches must have written its
	 * pages by then). Either returns 0, or -1 to stop the filter. */
	int (*page)(void *ctx, uint64_t addr, const uint8_t *data);
	int (*flush)(void *ctx);
	void *ctx;
};

struct migfilter_stats {
	uint64_t in_bytes, out_bytes;
	uint64_t pages, pages_kept; /* RAM page records seen / written */
};

/* Run the filter to the end of the stream. Returns 0, or -1 with err set
 * (KERR_SNAPSHOT_ERROR: a stream it does not understand, or a read/write
 * failure). base may be NULL (keep everything: a parse-only pass). Any
 * thread; no global state. */
int migfilter_run(migfilter_read_fn rd, void *rctx, migfilter_write_fn wr, void *wctx, const struct migfilter_base *base,
		  struct migfilter_stats *st, struct kiln_err *err);

#endif
