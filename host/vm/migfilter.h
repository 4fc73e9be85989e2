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
/* Or the stream where it already is: *p set to the next bytes (valid until
 * the next call), returns their length, 0 at end, -1 on error. */
typedef ssize_t (*migfilter_view_fn)(void *ctx, const uint8_t **p);
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
	 * pages by then). Either returns 0, or -1 to stop the filter. The
	 * page's bytes are valid during the call (migfilter_run_view: until
	 * the next flush). */
	int (*page)(void *ctx, uint64_t addr, const uint8_t *data);
	int (*flush)(void *ctx);
	void *ctx;
};

struct migfilter_stats {
	uint64_t in_bytes, out_bytes;
	uint64_t pages, pages_kept; /* RAM page records seen / written */
};

/* Composing a stream instead of filtering one: a paused session whose
 * changed pages kiln-host reads out of QEMU itself (pause_fast.c). The
 * template stream (one QEMU saved from the same machine: the session's
 * snapshot) gives the header, the configuration, the RAM block list and the
 * pages of the other RAM blocks (firmware, read-only to the guest); pages()
 * adds the pages of `block` with migfilter_page_out, at the end of the RAM
 * section; dev gives the devices' state, a stream as QEMU's
 * xen-save-devices-state writes it (header, FULL sections, EOF); a short
 * VM description ends it. The result loads as a saved session does. With
 * pages and dev_rd NULL, only the template is checked (it has the block, a
 * RAM section and its end). */
struct migfilter_out;
struct migfilter_compose {
	const char *block;
	uint64_t size;
	int (*pages)(void *ctx, struct migfilter_out *o);
	void *ctx;
	migfilter_read_fn dev_rd;
	void *dev_ctx;
};

/* Write one page of the composed block (addr < size, page-aligned; an all-zero
 * page goes as a zero record). Only from inside pages(). 0, or -1 (err set,
 * the run stops). */
int migfilter_page_out(struct migfilter_out *o, uint64_t addr, const uint8_t *data);

/* Compose: read the template with tpl_rd, write the stream with wr. st
 * counts the template's pages and the pages written. 0, or -1 with err. */
int migfilter_compose_run(migfilter_read_fn tpl_rd, void *tpl_ctx, const struct migfilter_compose *c,
			  migfilter_write_fn wr, void *wctx, struct migfilter_stats *st, struct kiln_err *err);

/* Run the filter to the end of the stream. Returns 0, or -1 with err set
 * (KERR_SNAPSHOT_ERROR: a stream it does not understand, one that does
 * not end as QEMU ends one (EOF, then a whole VM description: a stream cut
 * inside the device sections it copies unparsed), or a read/write failure). base may be NULL (keep everything: a
 * parse-only pass). Any thread; no global state. */
int migfilter_run(migfilter_read_fn rd, void *rctx, migfilter_write_fn wr, void *wctx,
		  const struct migfilter_base *base, struct migfilter_stats *st, struct kiln_err *err);

/* The same, reading through views: no copy of the stream into the filter.
 * A page handed to base->page stays valid until base->flush is next
 * called (the filter calls it before it takes the next view, and before
 * it reuses a buffer of its own), so a loader can write the pages out of
 * the view in batches without copying them. */
int migfilter_run_view(migfilter_view_fn view, void *vctx, migfilter_write_fn wr, void *wctx,
		       const struct migfilter_base *base, struct migfilter_stats *st, struct kiln_err *err);

#endif
