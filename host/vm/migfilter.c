/* migfilter: keep only the RAM pages of a QEMU migration stream that differ
 * from a base image (see migfilter.h). The stream layout is QEMU 7.2's
 * (migration/savevm.c, migration/ram.c): a header, a configuration
 * section, the iterable "ram" section (START with the block list, PARTs and
 * an END of page records, each closed by EOS), then the devices' FULL
 * sections and EOF, which pass through untouched. */
#include "migfilter.h"

#include <stdlib.h>
#include <string.h>

#define MF_MAGIC        0x5145564du
#define MF_VERSION      3u
#define MF_PAGE         4096u
#define MF_MAX_BLOCKS   32
#define MF_BUF          65536
/* The most of a stream's end kept to find its VM description in: QEMU's
 * for kiln's VMs is ~15 KiB. */
#define MF_TAIL         (1u << 20)

#define SEC_EOF         0x00
#define SEC_START       0x01
#define SEC_PART        0x02
#define SEC_END         0x03
#define SEC_FULL        0x04
#define SEC_SUBSECTION  0x05
#define SEC_CONFIG      0x07
#define SEC_FOOTER      0x7e

#define RAM_ZERO        0x02u
#define RAM_MEM_SIZE    0x04u
#define RAM_PAGE        0x08u
#define RAM_EOS         0x10u
#define RAM_CONTINUE    0x20u

struct mf_block {
	char name[256];
	uint64_t len;
	int is_base, is_sink;
	int is_comp; /* the block a composed stream's pages() gives (the template's own are dropped) */
};

struct mf {
	migfilter_read_fn rd;
	migfilter_view_fn view; /* instead of rd: the stream's bytes where they are */
	void *rctx;
	migfilter_write_fn wr;
	void *wctx;
	const struct migfilter_base *base;
	const struct migfilter_compose *comp;
	int comp_bi; /* its index in blocks, -1: not listed */
	int last_byte; /* the last byte copy_rest copied, -1: none */
	uint8_t *tail; /* filter mode: the stream's last bytes (tail_len, up to 2 * MF_TAIL) */
	size_t tail_len;
	struct migfilter_stats *st;
	struct kiln_err *err;
	uint8_t buf[MF_BUF];
	const uint8_t *cur; /* the bytes being parsed: buf, or the reader's view */
	size_t pos, end;
	int eof;
	int ignore_shared;
	uint32_t ram_id;
	int ram_started, ram_ended;
	struct mf_block blocks[MF_MAX_BLOCKS];
	int nblocks;
	int last_in, last_out; /* block index of the last page record read / written, -1: none */
	uint8_t page[MF_PAGE];
};

static const uint8_t zero_page[MF_PAGE];

static int bad(struct mf *f, const char *what)
{
	return kiln_err_set(f->err, KERR_SNAPSHOT_ERROR, "migration stream: %s (at byte %llu)", what,
			    (unsigned long long)f->st->in_bytes);
}

/* View mode: the pages handed to the sink may point into the current view
 * or into f->page; the sink writes them out before either changes. */
static int flush_view(struct mf *f)
{
	if (!f->view || !f->base || !f->base->flush || f->base->flush(f->base->ctx) == 0)
		return 0;
	return kiln_err_set(f->err, KERR_SNAPSHOT_ERROR, "migration stream: loading pages failed");
}

/* Make at least one byte available; 0, or -1 at the end (f->eof) or on error. */
static int fill(struct mf *f)
{
	ssize_t n;

	if (f->pos < f->end)
		return 0;
	if (f->eof)
		return -1;
	if (f->view && flush_view(f) < 0) {
		f->eof = 2;
		return -1;
	}
	if (f->view) {
		n = f->view(f->rctx, &f->cur);
	} else {
		n = f->rd(f->rctx, f->buf, sizeof(f->buf));
		f->cur = f->buf;
	}
	if (n < 0) {
		bad(f, "read error");
		f->eof = 2;
		return -1;
	}
	if (n == 0) {
		f->eof = 1;
		return -1;
	}
	f->pos = 0;
	f->end = (size_t)n;
	return 0;
}

static int get(struct mf *f, void *out, size_t len)
{
	uint8_t *o = out;

	while (len) {
		size_t n;

		if (fill(f) < 0)
			return f->eof == 2 ? -1 : bad(f, "truncated");
		n = f->end - f->pos < len ? f->end - f->pos : len;
		memcpy(o, f->cur + f->pos, n);
		f->pos += n;
		f->st->in_bytes += n;
		o += n;
		len -= n;
	}
	return 0;
}

static int put(struct mf *f, const void *p, size_t len)
{
	if (len && f->wr(f->wctx, p, len) < 0)
		return kiln_err_set(f->err, KERR_SNAPSHOT_ERROR, "migration stream: write failed");
	f->st->out_bytes += len;
	return 0;
}

/* Read n bytes and write them through. */
static int pass(struct mf *f, void *out, size_t len)
{
	return get(f, out, len) < 0 || put(f, out, len) < 0 ? -1 : 0;
}

static int u8(struct mf *f, uint8_t *v, int through)
{
	return through ? pass(f, v, 1) : get(f, v, 1);
}

static int be32(struct mf *f, uint32_t *v, int through)
{
	uint8_t b[4];

	if ((through ? pass(f, b, 4) : get(f, b, 4)) < 0)
		return -1;
	*v = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
	return 0;
}

static int be64(struct mf *f, uint64_t *v, int through)
{
	uint32_t hi, lo;

	if (be32(f, &hi, through) < 0 || be32(f, &lo, through) < 0)
		return -1;
	*v = (uint64_t)hi << 32 | lo;
	return 0;
}

static void put_be64(uint8_t *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		p[i] = (uint8_t)v;
}

/* A length-prefixed string (u8 length, 1..255 bytes), NUL-terminated in out[256]. */
static int str8(struct mf *f, char out[256], int through)
{
	uint8_t n;

	if (u8(f, &n, through) < 0)
		return -1;
	if (n == 0)
		return bad(f, "empty name");
	if ((through ? pass(f, out, n) : get(f, out, n)) < 0)
		return -1;
	out[n] = '\0';
	if (strlen(out) != n)
		return bad(f, "NUL in a name");
	return 0;
}

static int peek(struct mf *f, uint8_t *v)
{
	if (fill(f) < 0)
		return -1;
	*v = f->cur[f->pos];
	return 0;
}

/* The configuration section: the machine name, then its subsections. */
static int config(struct mf *f)
{
	uint32_t len, ver, v;
	char name[256];
	uint8_t t;

	if (be32(f, &len, 1) < 0)
		return -1;
	if (len == 0 || len > 255)
		return bad(f, "configuration: bad machine name length");
	if (pass(f, name, len) < 0)
		return -1;
	while (peek(f, &t) == 0 && t == SEC_SUBSECTION) {
		if (u8(f, &t, 1) < 0 || str8(f, name, 1) < 0 || be32(f, &ver, 1) < 0)
			return -1;
		if (!strcmp(name, "configuration/target-page-bits")) {
			if (be32(f, &v, 1) < 0)
				return -1;
			if (v != 12)
				return bad(f, "configuration: target page size is not 4 KiB");
		} else if (!strcmp(name, "configuration/capabilities")) {
			if (be32(f, &v, 1) < 0)
				return -1;
			if (v > 64)
				return bad(f, "configuration: too many capabilities");
			for (uint32_t i = 0; i < v; i++) {
				if (str8(f, name, 1) < 0)
					return -1;
				if (!strcmp(name, "x-ignore-shared"))
					f->ignore_shared = 1;
			}
		} else if (!strcmp(name, "configuration/uuid")) {
			uint8_t uuid[16];

			if (pass(f, uuid, sizeof(uuid)) < 0)
				return -1;
		} else {
			return bad(f, "configuration: unknown subsection");
		}
	}
	return f->eof == 2 ? -1 : 0;
}

/* The block list of the ram START section (after its MEM_SIZE word). */
static int ram_blocks(struct mf *f, uint64_t total)
{
	while (total) {
		struct mf_block *b;
		uint64_t addr;

		if (f->nblocks == MF_MAX_BLOCKS)
			return bad(f, "too many RAM blocks");
		b = &f->blocks[f->nblocks];
		if (str8(f, b->name, 1) < 0 || be64(f, &b->len, 1) < 0)
			return -1;
		if (b->len == 0 || b->len > total || b->len % MF_PAGE)
			return bad(f, "RAM block length");
		for (int i = 0; i < f->nblocks; i++)
			if (!strcmp(f->blocks[i].name, b->name))
				return bad(f, "RAM block named twice");
		if (f->ignore_shared && be64(f, &addr, 1) < 0)
			return -1;
		b->is_base = f->base && f->base->data && !f->base->page && !strcmp(b->name, f->base->block) &&
			     b->len == f->base->size;
		b->is_sink = f->base && f->base->page && !strcmp(b->name, f->base->block) && b->len == f->base->size;
		b->is_comp = f->comp && !strcmp(b->name, f->comp->block) && b->len == f->comp->size;
		if (b->is_comp)
			f->comp_bi = f->nblocks;
		total -= b->len;
		f->nblocks++;
	}
	return 0;
}

/* One page record (its header word already read): kept or left out. */
static int ram_page(struct mf *f, uint64_t word)
{
	uint64_t addr = word & ~(uint64_t)(MF_PAGE - 1);
	unsigned flags = (unsigned)(word & (MF_PAGE - 1));
	uint8_t hdr[8 + 1 + 255], fill_byte = 0;
	const uint8_t *data;
	size_t hl = 8;
	int bi = f->last_in, keep = 1;
	struct mf_block *b;

	if (flags & ~(RAM_ZERO | RAM_PAGE | RAM_CONTINUE) || !(flags & RAM_ZERO) == !(flags & RAM_PAGE))
		return bad(f, "unsupported RAM page flags");
	if (!(flags & RAM_CONTINUE)) {
		char name[256];

		if (str8(f, name, 0) < 0)
			return -1;
		for (bi = 0; bi < f->nblocks && strcmp(f->blocks[bi].name, name); bi++)
			;
		if (bi == f->nblocks)
			return bad(f, "page of an unknown RAM block");
	} else if (bi < 0) {
		return bad(f, "continued page without a block");
	}
	b = &f->blocks[bi];
	f->last_in = bi;
	if (addr >= b->len)
		return bad(f, "page outside its RAM block");
	if (flags & RAM_ZERO) {
		if (get(f, &fill_byte, 1) < 0)
			return -1;
		data = zero_page;
		if (fill_byte) {
			if (flush_view(f) < 0)
				return -1;
			memset(f->page, fill_byte, MF_PAGE);
			data = f->page;
		}
	} else if (f->view && f->end - f->pos >= MF_PAGE) {
		/* Whole in the view: no copy. */
		data = f->cur + f->pos;
		f->pos += MF_PAGE;
		f->st->in_bytes += MF_PAGE;
	} else {
		if (flush_view(f) < 0 || get(f, f->page, MF_PAGE) < 0)
			return -1;
		data = f->page;
	}
	if (b->is_base)
		keep = memcmp(f->base->data + addr, data, MF_PAGE) != 0;
	if (b->is_comp)
		return 0;
	f->st->pages++;
	if (b->is_sink) {
		if (f->base->page(f->base->ctx, addr, data) < 0)
			return kiln_err_set(f->err, KERR_SNAPSHOT_ERROR, "migration stream: loading a page failed");
		return 0;
	}
	if (!keep)
		return 0;
	f->st->pages_kept++;
	flags &= ~RAM_CONTINUE;
	if (f->last_out == bi) {
		flags |= RAM_CONTINUE;
	} else {
		size_t n = strlen(b->name);

		hdr[hl++] = (uint8_t)n;
		memcpy(hdr + hl, b->name, n);
		hl += n;
	}
	put_be64(hdr, addr | flags);
	f->last_out = bi;
	if (put(f, hdr, hl) < 0)
		return -1;
	if (flags & RAM_ZERO)
		return put(f, &fill_byte, 1);
	return put(f, data, MF_PAGE);
}

/* A page record of the composed block (migfilter_page_out). */
static int comp_page(struct mf *f, uint64_t addr, const uint8_t *data)
{
	uint8_t hdr[8 + 1 + 255];
	size_t hl = 8;
	unsigned flags = RAM_PAGE;
	int zero = memcmp(data, zero_page, MF_PAGE) == 0;

	if (addr % MF_PAGE || addr >= f->comp->size)
		return kiln_err_set(f->err, KERR_SNAPSHOT_ERROR, "migration stream: composed page outside its block");
	if (zero)
		flags = RAM_ZERO;
	if (f->last_out == f->comp_bi) {
		flags |= RAM_CONTINUE;
	} else {
		size_t n = strlen(f->comp->block);

		hdr[hl++] = (uint8_t)n;
		memcpy(hdr + hl, f->comp->block, n);
		hl += n;
	}
	put_be64(hdr, addr | flags);
	f->last_out = f->comp_bi;
	f->st->pages_kept++;
	if (put(f, hdr, hl) < 0)
		return -1;
	return zero ? put(f, zero_page, 1) : put(f, data, MF_PAGE);
}

int migfilter_page_out(struct migfilter_out *o, uint64_t addr, const uint8_t *data)
{
	return comp_page((struct mf *)o, addr, data);
}

/* The data of one ram section, up to and including its EOS; a composed
 * stream's pages go in before the EOS of the END section. */
static int ram_section(struct mf *f, int start, int end)
{
	uint8_t w[8];

	for (;;) {
		uint64_t word;
		unsigned flags;

		if (get(f, w, 8) < 0)
			return -1;
		word = 0;
		for (int i = 0; i < 8; i++)
			word = word << 8 | w[i];
		flags = (unsigned)(word & (MF_PAGE - 1));
		if (flags == RAM_EOS && !(word >> 12)) {
			if (f->comp && end && f->comp_bi < 0)
				return bad(f, "the template has no RAM block to compose");
			if (f->comp && end && f->comp->pages && f->comp->pages(f->comp->ctx, (struct migfilter_out *)f) < 0)
				return -1;
			if (f->base && f->base->flush && f->base->flush(f->base->ctx) < 0)
				return kiln_err_set(f->err, KERR_SNAPSHOT_ERROR, "migration stream: loading pages failed");
			return put(f, w, 8);
		}
		if (flags == RAM_MEM_SIZE) {
			if (!start || f->nblocks)
				return bad(f, "RAM block list out of place");
			if (put(f, w, 8) < 0 || ram_blocks(f, word & ~(uint64_t)(MF_PAGE - 1)) < 0)
				return -1;
			continue;
		}
		if (start && !f->nblocks)
			return bad(f, "RAM pages before the block list");
		if (ram_page(f, word) < 0)
			return -1;
	}
}

static int footer(struct mf *f, uint32_t id)
{
	uint8_t t;
	uint32_t fid;

	if (peek(f, &t) < 0)
		return f->eof == 2 ? -1 : bad(f, "truncated after a section");
	if (t != SEC_FOOTER)
		return 0;
	if (u8(f, &t, 1) < 0 || be32(f, &fid, 1) < 0)
		return -1;
	return fid == id ? 0 : bad(f, "section footer does not match its section");
}

/* Keep at least the last MF_TAIL bytes copied (f->tail holds up to twice
 * that, so the move to its start happens once per MF_TAIL bytes at most). */
static void keep_tail(struct mf *f, const uint8_t *p, size_t n)
{
	if (n >= MF_TAIL) {
		memcpy(f->tail, p + n - MF_TAIL, MF_TAIL);
		f->tail_len = MF_TAIL;
		return;
	}
	if (f->tail_len + n > 2 * MF_TAIL) {
		size_t keep = MF_TAIL - n;

		memmove(f->tail, f->tail + f->tail_len - keep, keep);
		f->tail_len = keep;
	}
	memcpy(f->tail + f->tail_len, p, n);
	f->tail_len += n;
}

/* Does the stream end as QEMU ends one: EOF (0x00), the VM description
 * (0x06), its length (be32) and exactly that much JSON? The device
 * sections before it are copied without being understood, so this is what
 * tells a whole stream from one cut anywhere after the RAM. */
static int tail_whole(const uint8_t *t, size_t n)
{
	if (n < 8 || t[n - 1] != '}')
		return 0;
	for (size_t p = n - 8 + 1; p-- > 0;) {
		uint32_t len = (uint32_t)t[p + 2] << 24 | (uint32_t)t[p + 3] << 16 | (uint32_t)t[p + 4] << 8 | t[p + 5];

		if (t[p] == 0x00 && t[p + 1] == 0x06 && len == n - p - 6 && t[p + 6] == '{')
			return 1;
	}
	return 0;
}

/* Everything from here on (device state, EOF, the VM description) as is. */
static int copy_rest(struct mf *f)
{
	for (;;) {
		size_t n;

		if (fill(f) < 0) {
			if (f->eof == 2)
				return -1;
			if (f->tail && !tail_whole(f->tail, f->tail_len))
				return bad(f, "does not end with EOF and a whole VM description (cut short?)");
			return 0;
		}
		n = f->end - f->pos;
		if (put(f, f->cur + f->pos, n) < 0)
			return -1;
		if (f->tail)
			keep_tail(f, f->cur + f->pos, n);
		f->st->in_bytes += n;
		f->last_byte = f->cur[f->end - 1];
		f->pos = f->end;
	}
}

/* The devices' part of a composed stream: the device-state stream after its
 * header (its FULL sections and EOF) in place of the template's, then a
 * VM description (QEMU reads and discards it, and says so when missing). */
static int comp_devices(struct mf *f)
{
	static const char desc[] = "{\"page_size\":4096,\"devices\":[]}";
	uint8_t d[5] = { 0x06, 0, 0, 0, (uint8_t)(sizeof(desc) - 1) };
	uint32_t v;

	if (f->ram_started && !f->ram_ended)
		return bad(f, "device state before the end of RAM");
	if (f->comp_bi < 0)
		return bad(f, "the template has no RAM block to compose");
	if (!f->comp->dev_rd)
		return 0; /* a check of the template only */
	f->rd = f->comp->dev_rd;
	f->rctx = f->comp->dev_ctx;
	f->pos = f->end = 0;
	f->eof = 0;
	if (be32(f, &v, 0) < 0)
		return -1;
	if (v != MF_MAGIC)
		return bad(f, "device state: not a QEMU migration stream");
	if (be32(f, &v, 0) < 0)
		return -1;
	if (v != MF_VERSION)
		return bad(f, "device state: unsupported stream version");
	/* Its own last byte must be EOF: a short stream would load as a
	 * broken VM on resume, long after the pause said it worked. */
	f->last_byte = -1;
	if (copy_rest(f) < 0)
		return -1;
	if (f->last_byte != 0x00)
		return bad(f, "device state: does not end with EOF");
	return put(f, d, sizeof(d)) < 0 || put(f, desc, sizeof(desc) - 1) < 0 ? -1 : 0;
}

static int run(struct mf *f)
{
	uint32_t v;
	uint8_t t;
	int configured = 0;

	if (be32(f, &v, 1) < 0)
		return -1;
	if (v != MF_MAGIC)
		return bad(f, "not a QEMU migration stream");
	if (be32(f, &v, 1) < 0)
		return -1;
	if (v != MF_VERSION)
		return bad(f, "unsupported stream version");
	for (;;) {
		uint32_t id, inst, ver;
		char name[256];

		if (u8(f, &t, 0) < 0)
			return -1;
		if (f->comp && (t == SEC_FULL || t == SEC_EOF))
			return comp_devices(f);
		if (put(f, &t, 1) < 0)
			return -1;
		switch (t) {
		case SEC_CONFIG:
			if (configured++ || f->ram_started)
				return bad(f, "configuration out of place");
			if (config(f) < 0)
				return -1;
			break;
		case SEC_START:
		case SEC_FULL:
			if (be32(f, &id, 1) < 0 || str8(f, name, 1) < 0 || be32(f, &inst, 1) < 0 || be32(f, &ver, 1) < 0)
				return -1;
			if (t == SEC_FULL) {
				if (f->ram_started && !f->ram_ended)
					return bad(f, "device state before the end of RAM");
				return copy_rest(f);
			}
			if (strcmp(name, "ram") || f->ram_started)
				return bad(f, "unsupported iterable section");
			f->ram_started = 1;
			f->ram_id = id;
			if (ram_section(f, 1, 0) < 0 || footer(f, id) < 0)
				return -1;
			break;
		case SEC_PART:
		case SEC_END:
			if (be32(f, &id, 1) < 0)
				return -1;
			if (!f->ram_started || f->ram_ended || id != f->ram_id)
				return bad(f, "section part out of place");
			if (ram_section(f, 0, t == SEC_END) < 0 || footer(f, id) < 0)
				return -1;
			f->ram_ended = t == SEC_END;
			break;
		case SEC_EOF:
			if (f->ram_started && !f->ram_ended)
				return bad(f, "end of stream before the end of RAM");
			if (f->tail)
				keep_tail(f, &t, 1);
			return copy_rest(f);
		default:
			return bad(f, "unknown section type");
		}
	}
}

static int start(migfilter_read_fn rd, migfilter_view_fn view, void *rctx, migfilter_write_fn wr, void *wctx,
		 const struct migfilter_base *base, const struct migfilter_compose *comp, struct migfilter_stats *st,
		 struct kiln_err *err)
{
	struct mf *f;
	int r;

	memset(st, 0, sizeof(*st));
	f = calloc(1, sizeof(*f));
	if (!f)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	*f = (struct mf){ .rd = rd, .view = view, .rctx = rctx, .wr = wr, .wctx = wctx, .base = base, .comp = comp,
			  .comp_bi = -1, .st = st, .err = err, .last_in = -1, .last_out = -1 };
	/* Filter mode copies QEMU's device sections without parsing them: the
	 * end is checked instead (copy_rest). */
	if (!comp && !(f->tail = malloc(2 * MF_TAIL))) {
		free(f);
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	}
	r = run(f);
	free(f->tail);
	free(f);
	return r;
}

int migfilter_run(migfilter_read_fn rd, void *rctx, migfilter_write_fn wr, void *wctx,
		  const struct migfilter_base *base, struct migfilter_stats *st, struct kiln_err *err)
{
	return start(rd, NULL, rctx, wr, wctx, base, NULL, st, err);
}

int migfilter_run_view(migfilter_view_fn view, void *vctx, migfilter_write_fn wr, void *wctx,
		       const struct migfilter_base *base, struct migfilter_stats *st, struct kiln_err *err)
{
	return start(NULL, view, vctx, wr, wctx, base, NULL, st, err);
}

int migfilter_compose_run(migfilter_read_fn tpl_rd, void *tpl_ctx, const struct migfilter_compose *c,
			  migfilter_write_fn wr, void *wctx, struct migfilter_stats *st, struct kiln_err *err)
{
	return start(tpl_rd, NULL, tpl_ctx, wr, wctx, NULL, c, st, err);
}
