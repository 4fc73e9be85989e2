/* test_migfilter: unit tests for host/vm/migfilter.c: which RAM page records a
 * filtered QEMU migration stream keeps (only pages that differ from the
 * base; zero pages only over non-zero base pages; other blocks whole), that
 * a kept page after a dropped one carries its block name again, that device
 * state passes through unchanged, and that malformed streams fail; a
 * composed stream (migfilter_compose_run): the template's header, block
 * list and other blocks' pages, the given pages, the device stream in place
 * of the template's, a VM description; and that it loads back; read
 * through views (migfilter_run_view), a page handed over stays valid until
 * the flush after it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "migfilter.h"
#include "vmmem.h"

#define PG 4096

struct bytes {
	uint8_t *p;
	size_t n, off;
};

static void add(struct bytes *b, const void *p, size_t n)
{
	b->p = realloc(b->p, b->n + n);
	assert_non_null(b->p);
	memcpy(b->p + b->n, p, n);
	b->n += n;
}

static void u8(struct bytes *b, uint8_t v) { add(b, &v, 1); }

static void be32(struct bytes *b, uint32_t v)
{
	uint8_t x[4] = { v >> 24, v >> 16, v >> 8, v };

	add(b, x, 4);
}

static void be64(struct bytes *b, uint64_t v)
{
	be32(b, (uint32_t)(v >> 32));
	be32(b, (uint32_t)v);
}

static void str8(struct bytes *b, const char *s)
{
	u8(b, (uint8_t)strlen(s));
	add(b, s, strlen(s));
}

static uint8_t base[4 * PG];

/* Page i of the base: non-zero for even i, zero for odd i. */
static void base_init(void)
{
	for (int i = 0; i < 4; i++)
		memset(base + i * PG, i % 2 ? 0 : 'a' + i, PG);
}

static void header(struct bytes *b)
{
	be32(b, 0x5145564d);
	be32(b, 3);
	u8(b, 0x07);
	be32(b, 7);
	add(b, "microvm", 7);
	u8(b, 0x05);
	str8(b, "configuration/capabilities");
	be32(b, 1);
	be32(b, 1);
	str8(b, "x-ignore-shared");
	/* ram START: blocks mem (4 pages) and rom (1 page) */
	u8(b, 0x01);
	be32(b, 2);
	str8(b, "ram");
	be32(b, 0);
	be32(b, 4);
	be64(b, (5 * PG) | 0x04);
	str8(b, "mem");
	be64(b, 4 * PG);
	be64(b, 0);
	str8(b, "rom");
	be64(b, PG);
	be64(b, 0xfffff000u);
	be64(b, 0x10);
	u8(b, 0x7e);
	be32(b, 2);
}

static void page(struct bytes *b, uint64_t addr, const char *blk, int cont, const uint8_t *data)
{
	be64(b, addr | 0x08 | (cont ? 0x20 : 0));
	if (!cont)
		str8(b, blk);
	add(b, data, PG);
}

static void zero(struct bytes *b, uint64_t addr, const char *blk, int cont)
{
	be64(b, addr | 0x02 | (cont ? 0x20 : 0));
	if (!cont)
		str8(b, blk);
	u8(b, 0);
}

static const uint8_t device_tail[] = { 0x04, 0, 0, 0, 3, 5, 't', 'i', 'm', 'e', 'r', 0, 0, 0, 0, 0, 0, 0, 2,
				       1, 2, 3, 4, 0x7e, 0, 0, 0, 3, 0x00 };

/* The devices, EOF, then the VM description QEMU ends a stream with. */
static const char vm_desc[] = "{\"page_size\": 4096, \"devices\": [{\"name\": \"timer\"}]}";

static void trailer(struct bytes *b)
{
	add(b, device_tail, sizeof(device_tail));
	u8(b, 0x06);
	be32(b, sizeof(vm_desc) - 1);
	add(b, vm_desc, sizeof(vm_desc) - 1);
}

static ssize_t rd(void *ctx, void *buf, size_t len)
{
	struct bytes *b = ctx;
	size_t n = b->n - b->off < len ? b->n - b->off : len;

	if (n > 1000)
		n = 1000; /* reads end anywhere */
	memcpy(buf, b->p + b->off, n);
	b->off += n;
	return (ssize_t)n;
}

static int wr(void *ctx, const void *buf, size_t len)
{
	add(ctx, buf, len);
	return 0;
}

static int run(struct bytes *in, struct bytes *out, const struct migfilter_base *mb, struct migfilter_stats *st)
{
	struct kiln_err err = { .code = "" };

	in->off = 0;
	return migfilter_run(rd, in, wr, out, mb, st, &err);
}

static void test_keeps_only_changes(void **state)
{
	struct migfilter_base mb = { .block = "mem", .data = base, .size = sizeof(base) };
	struct bytes in = { 0 }, out = { 0 }, again = { 0 }, want = { 0 };
	struct migfilter_stats st;
	uint8_t changed[PG];

	(void)state;
	base_init();
	memset(changed, 'z', PG);
	header(&in);
	u8(&in, 0x02); /* PART */
	be32(&in, 2);
	page(&in, 0, "mem", 0, base);             /* same as base: dropped */
	zero(&in, PG, "mem", 1);                  /* zero over zero: dropped */
	page(&in, 2 * PG, "mem", 1, changed);     /* differs: kept, now named */
	zero(&in, 3 * PG, "mem", 1);              /* wait: base page 3 is zero too: dropped */
	page(&in, 0, "rom", 0, base);             /* another block: kept */
	be64(&in, 0x10);
	u8(&in, 0x7e);
	be32(&in, 2);
	u8(&in, 0x03); /* END */
	be32(&in, 2);
	zero(&in, 0, "mem", 0);                   /* zero over non-zero: kept */
	be64(&in, 0x10);
	u8(&in, 0x7e);
	be32(&in, 2);
	trailer(&in);

	assert_int_equal(run(&in, &out, &mb, &st), 0);
	assert_int_equal(st.pages, 6);
	assert_int_equal(st.pages_kept, 3);

	header(&want);
	u8(&want, 0x02);
	be32(&want, 2);
	page(&want, 2 * PG, "mem", 0, changed);
	page(&want, 0, "rom", 0, base);
	be64(&want, 0x10);
	u8(&want, 0x7e);
	be32(&want, 2);
	u8(&want, 0x03);
	be32(&want, 2);
	zero(&want, 0, "mem", 0);
	be64(&want, 0x10);
	u8(&want, 0x7e);
	be32(&want, 2);
	trailer(&want);
	assert_int_equal(out.n, want.n);
	assert_memory_equal(out.p, want.p, want.n);

	/* Without a base everything passes through unchanged. */
	assert_int_equal(run(&in, &again, NULL, &st), 0);
	assert_int_equal(again.n, in.n);
	assert_memory_equal(again.p, in.p, in.n);
	assert_int_equal(st.pages_kept, st.pages);

	/* The device sections are copied unparsed: a stream cut anywhere in
	 * them, after EOF or inside the VM description is refused by its end,
	 * and so is one with bytes after that end. */
	{
		size_t whole = in.n, tail = sizeof(device_tail) + 5 + sizeof(vm_desc) - 1;

		for (size_t cut = 1; cut <= tail; cut++) {
			in.n = whole - cut;
			out.n = 0;
			if (run(&in, &out, &mb, &st) != -1)
				fail_msg("a stream cut %zu bytes short of its end was accepted", cut);
		}
		in.n = whole;
		u8(&in, 0x00);
		out.n = 0;
		assert_int_equal(run(&in, &out, &mb, &st), -1);
		in.n = whole;
		out.n = 0;
		assert_int_equal(run(&in, &out, &mb, &st), 0);
	}
	free(in.p);
	free(out.p);
	free(again.p);
	free(want.p);
}

static void test_base_of_other_size_keeps_all(void **state)
{
	struct migfilter_base mb = { .block = "mem", .data = base, .size = 2 * PG };
	struct bytes in = { 0 }, out = { 0 };
	struct migfilter_stats st;

	(void)state;
	base_init();
	header(&in);
	u8(&in, 0x03);
	be32(&in, 2);
	page(&in, 0, "mem", 0, base);
	be64(&in, 0x10);
	trailer(&in);
	assert_int_equal(run(&in, &out, &mb, &st), 0);
	assert_int_equal(st.pages_kept, 1);
	assert_int_equal(out.n, in.n);
	free(in.p);
	free(out.p);
}

static void test_malformed(void **state)
{
	struct migfilter_base mb = { .block = "mem", .data = base, .size = sizeof(base) };
	struct migfilter_stats st;
	struct bytes in = { 0 }, out = { 0 };

	(void)state;
	base_init();
	header(&in);
	u8(&in, 0x03);
	be32(&in, 2);
	be64(&in, 4 * PG | 0x08); /* past the end of mem */
	str8(&in, "mem");
	add(&in, base, PG);
	be64(&in, 0x10);
	trailer(&in);
	assert_int_equal(run(&in, &out, &mb, &st), -1);
	free(in.p);
	in = (struct bytes){ 0 };
	header(&in);
	u8(&in, 0x03);
	be32(&in, 2);
	be64(&in, 0x40 | 0x08); /* xbzrle: not understood */
	str8(&in, "mem");
	assert_int_equal(run(&in, &out, &mb, &st), -1);
	free(in.p);
	in = (struct bytes){ 0 };
	header(&in);
	in.n -= 20; /* truncated in the block list */
	assert_int_equal(run(&in, &out, &mb, &st), -1);
	free(in.p);
	in = (struct bytes){ 0 };
	header(&in);
	u8(&in, 0x03);
	be32(&in, 2);
	zero(&in, 0, "nope", 0); /* unknown block */
	assert_int_equal(run(&in, &out, &mb, &st), -1);
	free(in.p);
	free(out.p);
}

/* A loader's side of the filter: what it was handed, in order. */
struct sunk {
	uint64_t addr[8];
	uint8_t first[8];
	int n, flushes, pages_at_flush[4], fail_at;
};

static int sink_page(void *ctx, uint64_t addr, const uint8_t *data)
{
	struct sunk *k = ctx;

	if (k->n == k->fail_at)
		return -1;
	for (int i = 1; i < PG; i++)
		if (data[i] != data[0])
			return -1; /* these tests' pages are all one byte */
	k->addr[k->n] = addr;
	k->first[k->n++] = data[0];
	return 0;
}

static int sink_flush(void *ctx)
{
	struct sunk *k = ctx;

	if (k->flushes < 4)
		k->pages_at_flush[k->flushes] = k->n;
	k->flushes++;
	return 0;
}

static void test_sink_takes_the_block(void **state)
{
	struct sunk k = { .fail_at = -1 };
	struct migfilter_base mb = { .block = "mem", .size = sizeof(base), .page = sink_page, .flush = sink_flush,
				     .ctx = &k };
	struct bytes in = { 0 }, out = { 0 }, want = { 0 };
	struct migfilter_stats st;
	uint8_t changed[PG], rom[PG];

	(void)state;
	memset(changed, 'z', PG);
	memset(rom, 'r', PG);
	header(&in);
	u8(&in, 0x02); /* PART */
	be32(&in, 2);
	page(&in, 2 * PG, "mem", 0, changed);
	zero(&in, PG, "mem", 1);              /* a zero record: handed over as a zero page */
	page(&in, 0, "rom", 0, rom);          /* another block: stays in the stream, named */
	page(&in, 3 * PG, "mem", 0, changed);
	be64(&in, 0x10);
	u8(&in, 0x7e);
	be32(&in, 2);
	u8(&in, 0x03); /* END */
	be32(&in, 2);
	be64(&in, 0x10);
	u8(&in, 0x7e);
	be32(&in, 2);
	trailer(&in);

	assert_int_equal(run(&in, &out, &mb, &st), 0);
	assert_int_equal(k.n, 3);
	assert_true(k.addr[0] == 2 * PG && k.first[0] == 'z');
	assert_true(k.addr[1] == PG && k.first[1] == 0);
	assert_true(k.addr[2] == 3 * PG && k.first[2] == 'z');
	/* Flushed at the end of each part of the section (the START with the
	 * block list, the PART, the END), before anything after it. */
	assert_int_equal(k.flushes, 3);
	assert_int_equal(k.pages_at_flush[0], 0);
	assert_int_equal(k.pages_at_flush[1], 3);

	header(&want);
	u8(&want, 0x02);
	be32(&want, 2);
	page(&want, 0, "rom", 0, rom);
	be64(&want, 0x10);
	u8(&want, 0x7e);
	be32(&want, 2);
	u8(&want, 0x03);
	be32(&want, 2);
	be64(&want, 0x10);
	u8(&want, 0x7e);
	be32(&want, 2);
	trailer(&want);
	assert_int_equal(out.n, want.n);
	assert_memory_equal(out.p, want.p, want.n);

	/* A loader that fails stops the filter. */
	k = (struct sunk){ .fail_at = 1 };
	free(out.p);
	out = (struct bytes){ 0 };
	assert_int_equal(run(&in, &out, &mb, &st), -1);
	assert_int_equal(k.n, 1);
	free(in.p);
	free(out.p);
	free(want.p);
}

static void ram_end(struct bytes *b);

/* Views: the reader's own buffers, each poisoned once the filter asks for
 * the next one; a loader that holds the pages it was handed until flush. */
struct viewer {
	struct bytes *in;
	size_t size;      /* each view's, or 0: a mix of sizes */
	uint8_t *bufs[1024];
	size_t lens[1024];
	int n;
};

static ssize_t view_rd(void *ctx, const uint8_t **p)
{
	static const size_t sizes[] = { 1, 4097, 3, 9000, 100, 4096, 12 };
	struct viewer *v = ctx;
	size_t n = v->in->n - v->in->off;

	if (v->n)
		memset(v->bufs[v->n - 1], 0xee, v->lens[v->n - 1]); /* gone */
	if (n > (v->size ? v->size : sizes[v->n % 7]))
		n = v->size ? v->size : sizes[v->n % 7];
	if (!n)
		return 0;
	assert_true(v->n < 1024);
	v->bufs[v->n] = malloc(n);
	assert_non_null(v->bufs[v->n]);
	memcpy(v->bufs[v->n], v->in->p + v->in->off, n);
	v->lens[v->n] = n;
	v->in->off += n;
	*p = v->bufs[v->n++];
	return (ssize_t)n;
}

struct held {
	const uint8_t *data[64];
	uint64_t addr[64];
	int n;             /* held, not yet flushed */
	uint8_t got[64];   /* what each page held at its flush */
	uint64_t got_addr[64];
	int ngot;
};

static int held_page(void *ctx, uint64_t addr, const uint8_t *data)
{
	struct held *h = ctx;

	assert_true(h->n < 64);
	h->addr[h->n] = addr;
	h->data[h->n++] = data;
	return 0;
}

static int held_flush(void *ctx)
{
	struct held *h = ctx;

	for (int i = 0; i < h->n; i++) {
		for (int j = 1; j < PG; j++)
			if (h->data[i][j] != h->data[i][0])
				return -1; /* not the page it was: its bytes changed before the flush */
		h->got[h->ngot] = h->data[i][0];
		h->got_addr[h->ngot++] = h->addr[i];
	}
	h->n = 0;
	return 0;
}

static int count_page(void *ctx, uint64_t addr, const uint8_t *data)
{
	(*(int *)ctx)++;
	return 0;
}

static void test_view_pages_live_until_flush(void **state)
{
	struct held h = { 0 };
	int counted = 0;
	struct migfilter_base mb = { .block = "mem", .size = sizeof(base), .page = held_page, .flush = held_flush,
				     .ctx = &h };
	struct migfilter_base mk = { .block = "mem", .size = sizeof(base), .page = count_page, .ctx = &counted };
	struct bytes in = { 0 }, out = { 0 }, want = { 0 };
	struct viewer v = { .in = &in };
	struct migfilter_stats st;
	struct kiln_err err = { .code = "" };
	uint8_t pg[PG];

	(void)state;
	header(&in);
	u8(&in, 0x02); /* PART: 20 page records of mem, a zero one and one of rom among them */
	be32(&in, 2);
	for (int i = 0; i < 20; i++) {
		memset(pg, 'A' + i, PG);
		page(&in, i == 10 ? 0 : (uint64_t)(i % 4) * PG, i == 10 ? "rom" : "mem", i > 0 && i != 10 && i != 11, pg);
		if (i == 5)
			zero(&in, 3 * PG, "mem", 1);
	}
	ram_end(&in);
	trailer(&in);

	in.off = 0;
	assert_int_equal(migfilter_run(rd, &in, wr, &want, &mk, &st, &err), 0);
	assert_int_equal(counted, 20);
	/* A mix of view sizes (0), then views of 4097 to 8200 bytes: they end
	 * at every few bytes of a record (4104 bytes for a continued page). */
	for (size_t size = 0; size <= 8200; size = size ? size + 37 : 4097) {
		v.size = size;
		in.off = 0;
		h = (struct held){ 0 };
		free(out.p);
		out = (struct bytes){ 0 };
		assert_int_equal(migfilter_run_view(view_rd, &v, wr, &out, &mb, &st, &err), 0);
		/* Every mem page, as it was in the stream, in order. */
		assert_int_equal(h.ngot, 20);
		for (int i = 0, j = 0; i < 20; i++) {
			if (i == 10)
				continue; /* rom's */
			assert_true(h.got_addr[j] == (uint64_t)(i % 4) * PG);
			assert_int_equal(h.got[j++], 'A' + i);
			if (i == 5) {
				assert_true(h.got_addr[j] == 3 * PG);
				assert_int_equal(h.got[j++], 0);
			}
		}
		/* The same stream out as the copying filter gives. */
		assert_int_equal(out.n, want.n);
		assert_memory_equal(out.p, want.p, want.n);
		for (int i = 0; i < v.n; i++)
			free(v.bufs[i]);
		v.n = 0;
	}

	/* Cut short: fails as the copying filter does. */
	in.n -= 5;
	in.off = 0;
	h = (struct held){ 0 };
	v.size = 0;
	assert_int_equal(migfilter_run_view(view_rd, &v, wr, &out, &mb, &st, &err), -1);
	for (int i = 0; i < v.n; i++)
		free(v.bufs[i]);
	free(in.p);
	free(out.p);
	free(want.p);
}

/* Composing: pages given by a callback, device state from a stream of its own. */
struct emit {
	int n, bad_addr;
};

static int emit_pages(void *ctx, struct migfilter_out *o)
{
	struct emit *e = ctx;
	uint8_t z[PG], y[PG], zero_pg[PG];

	memset(z, 'z', PG);
	memset(y, 'y', PG);
	memset(zero_pg, 0, PG);
	if (e->bad_addr)
		return migfilter_page_out(o, 4 * PG, z);
	e->n = 3;
	if (migfilter_page_out(o, 2 * PG, z) < 0 || migfilter_page_out(o, PG, zero_pg) < 0 ||
	    migfilter_page_out(o, 3 * PG, y) < 0)
		return -1;
	return 0;
}

/* The end of a RAM PART (EOS, footer), then an empty END section. */
static void ram_end(struct bytes *b)
{
	be64(b, 0x10);
	u8(b, 0x7e);
	be32(b, 2);
	u8(b, 0x03); /* END */
	be32(b, 2);
	be64(b, 0x10);
	u8(b, 0x7e);
	be32(b, 2);
}

static void template_stream(struct bytes *b, const uint8_t *rom, int with_mem_page)
{
	uint8_t m[PG];

	memset(m, 'm', PG);
	header(b);
	u8(b, 0x02); /* PART */
	be32(b, 2);
	page(b, 0, "rom", 0, rom);
	if (with_mem_page)
		page(b, 0, "mem", 0, m); /* the template's own page of the block: left out */
	ram_end(b);
	trailer(b); /* the template's devices: replaced */
}

static const uint8_t dev_state[] = { 0x04, 0, 0, 0, 9, 4, 'v', 'b', 'l', 'k', 0, 0, 0, 0, 0, 0, 0, 1,
				     7, 7, 0x7e, 0, 0, 0, 9, 0x00 };

static void device_stream(struct bytes *b)
{
	be32(b, 0x5145564d);
	be32(b, 3);
	add(b, dev_state, sizeof(dev_state));
}

static int compose(struct bytes *tpl, struct bytes *dev, struct migfilter_compose *c, struct bytes *out,
		   struct migfilter_stats *st)
{
	struct kiln_err err = { .code = "" };

	tpl->off = 0;
	if (dev) {
		dev->off = 0;
		c->dev_rd = rd;
		c->dev_ctx = dev;
	}
	return migfilter_compose_run(rd, tpl, c, wr, out, st, &err);
}

static void test_compose(void **state)
{
	struct emit e = { 0 };
	struct migfilter_compose c = { .block = "mem", .size = sizeof(base), .pages = emit_pages, .ctx = &e };
	struct bytes tpl = { 0 }, dev = { 0 }, out = { 0 }, want = { 0 }, sunk_out = { 0 };
	struct migfilter_stats st;
	uint8_t rom[PG], z[PG], y[PG];
	static const char desc[] = "{\"page_size\":4096,\"devices\":[]}";
	struct sunk k = { .fail_at = -1 };
	struct migfilter_base mb = { .block = "mem", .size = sizeof(base), .page = sink_page, .flush = sink_flush,
				     .ctx = &k };

	(void)state;
	memset(rom, 'r', PG);
	memset(z, 'z', PG);
	memset(y, 'y', PG);
	template_stream(&tpl, rom, 1);
	device_stream(&dev);
	assert_int_equal(compose(&tpl, &dev, &c, &out, &st), 0);
	assert_int_equal(st.pages_kept, 4); /* rom, and the three given */

	header(&want);
	u8(&want, 0x02);
	be32(&want, 2);
	page(&want, 0, "rom", 0, rom);
	be64(&want, 0x10);
	u8(&want, 0x7e);
	be32(&want, 2);
	u8(&want, 0x03);
	be32(&want, 2);
	page(&want, 2 * PG, "mem", 0, z);
	zero(&want, PG, "mem", 1);
	page(&want, 3 * PG, "mem", 1, y);
	be64(&want, 0x10);
	u8(&want, 0x7e);
	be32(&want, 2);
	add(&want, dev_state, sizeof(dev_state));
	u8(&want, 0x06);
	be32(&want, sizeof(desc) - 1);
	add(&want, desc, sizeof(desc) - 1);
	assert_int_equal(out.n, want.n);
	assert_memory_equal(out.p, want.p, want.n);

	/* It loads: the filter hands the three pages to a loader. */
	assert_int_equal(run(&out, &sunk_out, &mb, &st), 0);
	assert_int_equal(k.n, 3);
	assert_true(k.addr[0] == 2 * PG && k.first[0] == 'z');
	assert_true(k.addr[1] == PG && k.first[1] == 0);
	assert_true(k.addr[2] == 3 * PG && k.first[2] == 'y');

	/* Only the template checked: no pages, no devices, nothing fails. */
	free(out.p);
	out = (struct bytes){ 0 };
	{
		struct migfilter_compose chk = { .block = "mem", .size = sizeof(base) };

		assert_int_equal(compose(&tpl, NULL, &chk, &out, &st), 0);
		/* A template whose block has another size (or name) is refused. */
		chk.size = 2 * PG;
		assert_int_equal(compose(&tpl, NULL, &chk, &out, &st), -1);
		chk.size = sizeof(base);
		chk.block = "pc.ram";
		assert_int_equal(compose(&tpl, NULL, &chk, &out, &st), -1);
	}
	/* A page outside the block stops it. */
	e.bad_addr = 1;
	assert_int_equal(compose(&tpl, &dev, &c, &out, &st), -1);
	e.bad_addr = 0;
	/* A device stream cut short (no EOF at its end), or not one at all. */
	dev.n--;
	assert_int_equal(compose(&tpl, &dev, &c, &out, &st), -1);
	dev.n++;
	dev.p[0] ^= 1;
	assert_int_equal(compose(&tpl, &dev, &c, &out, &st), -1);
	free(tpl.p);
	free(dev.p);
	free(out.p);
	free(want.p);
	free(sunk_out.p);
}

/* ---- a fast save checked against QEMU's own (vmmem_compare) ---- */

/* A stream carrying the block's pages given (NULL: left out; all-zero: a
 * zero record), one rom page, and the device trailer. */
static void block_stream(struct bytes *b, const uint8_t *const pages[4])
{
	int first = 1;

	header(b);
	u8(b, 0x02); /* PART */
	be32(b, 2);
	for (int i = 0; i < 4; i++) {
		uint8_t zp[PG];

		if (!pages[i])
			continue;
		memset(zp, 0, PG);
		if (memcmp(pages[i], zp, PG))
			page(b, (uint64_t)i * PG, "mem", !first, pages[i]);
		else
			zero(b, (uint64_t)i * PG, "mem", !first);
		first = 0;
	}
	page(b, 0, "rom", 0, base);
	ram_end(b);
	trailer(b);
}

static int compare(struct bytes *q, struct bytes *c, struct vmmem_cmp *res, struct kiln_err *err)
{
	q->off = c->off = 0;
	return vmmem_compare(rd, q, rd, c, "mem", base, sizeof(base), res, err);
}

static void test_compare_with_qemu(void **state)
{
	uint8_t z[PG], y[PG], zp[PG];
	/* The VM: page 0 as the base, page 1 (zero in the base) written, page 2
	 * written, page 3 zero as in the base. */
	const uint8_t *vm[4] = { base, z, y, base + 3 * PG };
	const uint8_t *fast[4] = { NULL, z, y, NULL };     /* the changed pages only */
	const uint8_t *missed[4] = { NULL, z, NULL, NULL }; /* page 2 left out: the base's is wrong */
	const uint8_t *wrong[4] = { NULL, z, zp, NULL };    /* page 2 carried, but zero */
	const uint8_t *short_q[4] = { base, z, y, NULL };   /* QEMU's lacks page 3 */
	struct bytes q = { 0 }, c1 = { 0 }, c2 = { 0 }, c3 = { 0 }, q2 = { 0 }, qq;
	struct vmmem_cmp res;
	struct kiln_err err = { .code = "" };

	(void)state;
	base_init();
	memset(z, 'z', PG);
	memset(y, 'y', PG);
	memset(zp, 0, PG);
	block_stream(&q, vm);
	block_stream(&c1, fast);
	block_stream(&c2, missed);
	block_stream(&c3, wrong);
	block_stream(&q2, short_q);

	assert_int_equal(compare(&q, &c1, &res, &err), 0);
	assert_int_equal(res.pages, 4);
	assert_int_equal(res.in_stream, 2);
	assert_int_equal(res.differ, 0);
	/* QEMU's whole stream against itself (a second cursor over the same
	 * bytes): every page carried, all equal. */
	qq = q;
	assert_int_equal(compare(&q, &qq, &res, &err), 0);
	assert_int_equal(res.in_stream, 4);
	assert_int_equal(res.differ, 0);

	assert_int_equal(compare(&q, &c2, &res, &err), 0);
	assert_int_equal(res.differ, 1);
	assert_int_equal(res.first_diff, 2 * PG);
	assert_int_equal(compare(&q, &c3, &res, &err), 0);
	assert_int_equal(res.differ, 1);
	assert_int_equal(res.first_diff, 2 * PG);

	assert_int_equal(compare(&q2, &c1, &res, &err), -1);
	assert_non_null(strstr(err.message, "lacks page 0x3000"));
	/* A composed stream cut inside its RAM section is an error, not a match. */
	c1.n /= 2;
	assert_int_equal(compare(&q, &c1, &res, &err), -1);
	free(q.p);
	free(c1.p);
	free(c2.p);
	free(c3.p);
	free(q2.p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keeps_only_changes),
		cmocka_unit_test(test_base_of_other_size_keeps_all),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_sink_takes_the_block),
		cmocka_unit_test(test_view_pages_live_until_flush),
		cmocka_unit_test(test_compose),
		cmocka_unit_test(test_compare_with_qemu),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
