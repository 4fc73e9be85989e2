/* fuzz_migfilter: a QEMU migration stream (from a jailed QEMU, or from S3
 * after its hash check) through migfilter_run, read in uneven pieces: it
 * must never read outside its buffers, and what it accepts must filter to a
 * stream that itself filters to the same bytes (filtering is idempotent)
 * and passes a keep-everything pass unchanged. Read through views
 * (migfilter_run_view, as a resume does), each poisoned once the next is
 * taken: the same result and output as read through copies, and every
 * page handed over still itself at the flush after it. The same bytes as the
 * template and as the device state of a composed stream (a pause that reads
 * pages itself): errors only as errors. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "migfilter.h"

#define BASE_SIZE (16 * 4096)

struct src {
	const uint8_t *p;
	size_t n, off, step;
};

struct dst {
	uint8_t *p;
	size_t n, cap;
};

static ssize_t rd(void *ctx, void *buf, size_t len)
{
	struct src *s = ctx;
	size_t n = s->n - s->off;

	/* Uneven reads: the parser must not depend on where they end. */
	if (n > s->step)
		n = s->step;
	if (n > len)
		n = len;
	memcpy(buf, s->p + s->off, n);
	s->off += n;
	s->step = s->step * 7 % 61 + 1;
	return (ssize_t)n;
}

static int wr(void *ctx, const void *buf, size_t len)
{
	struct dst *d = ctx;

	if (d->n + len > d->cap) {
		size_t nc = (d->n + len) * 2;
		uint8_t *p = realloc(d->p, nc);

		if (!p)
			return -1;
		d->p = p;
		d->cap = nc;
	}
	memcpy(d->p + d->n, buf, len);
	d->n += len;
	return 0;
}

static int run(const uint8_t *in, size_t n, const struct migfilter_base *b, struct dst *out)
{
	struct src s = { .p = in, .n = n, .step = 1 };
	struct migfilter_stats st;
	struct kiln_err err = { .code = "" };
	int r = migfilter_run(rd, &s, wr, out, b, &st, &err);

	check(r == 0 || err.errc == KERR_SNAPSHOT_ERROR);
	check(st.pages_kept <= st.pages);
	return r;
}

/* The resume's loader: every page it is handed lies inside the block, on a
 * page boundary; it counts them. */
static int sink_page(void *ctx, uint64_t addr, const uint8_t *page)
{
	(void)page;
	check(addr < BASE_SIZE && addr % 4096 == 0);
	(*(uint64_t *)ctx)++;
	return 0;
}

static int sink_flush(void *ctx)
{
	(void)ctx;
	return 0;
}

/* Views of uneven size, each one's bytes poisoned when the next is taken. */
struct views {
	const uint8_t *p;
	size_t n, off, step;
	uint8_t *cur;
	size_t cur_n;
};

static ssize_t view(void *ctx, const uint8_t **p)
{
	struct views *v = ctx;
	size_t n = v->n - v->off;

	if (v->cur) {
		memset(v->cur, 0xee, v->cur_n);
		free(v->cur);
		v->cur = NULL;
	}
	if (n > v->step)
		n = v->step;
	v->step = v->step * 13 % 9001 + 1;
	if (!n)
		return 0;
	v->cur = malloc(n);
	if (!v->cur)
		return -1;
	memcpy(v->cur, v->p + v->off, n);
	v->off += n;
	v->cur_n = n;
	*p = v->cur;
	return (ssize_t)n;
}

/* A loader that holds what it is handed until the flush, and checks then
 * that each page is still what it was handed (its first and last byte
 * and a sum, taken at the hand-over). */
struct held {
	const uint8_t *p[64];
	uint64_t sum[64];
	int n;
	uint64_t pages;
};

static uint64_t page_sum(const uint8_t *p)
{
	uint64_t s = 0;

	for (size_t i = 0; i < 4096; i++)
		s = s * 31 + p[i];
	return s;
}

static int held_flush(void *ctx)
{
	struct held *h = ctx;

	for (int i = 0; i < h->n; i++)
		check(page_sum(h->p[i]) == h->sum[i]);
	h->n = 0;
	return 0;
}

static int held_page(void *ctx, uint64_t addr, const uint8_t *page)
{
	struct held *h = ctx;

	check(addr < BASE_SIZE && addr % 4096 == 0);
	h->p[h->n] = page;
	h->sum[h->n++] = page_sum(page);
	h->pages++;
	return h->n == 64 ? held_flush(h) : 0;
}

static int emit(void *ctx, struct migfilter_out *o)
{
	static uint8_t page[2][4096];

	page[0][0] = 1;
	return migfilter_page_out(o, 0, page[0]) < 0 || migfilter_page_out(o, 4096, page[1]) < 0 ? -1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t base[BASE_SIZE];
	struct migfilter_base b = { .block = "mem", .data = base, .size = BASE_SIZE };
	struct dst o1 = { 0 }, o2 = { 0 }, o3 = { 0 };

	for (size_t i = 0; i < BASE_SIZE / 4096; i++)
		memset(base + i * 4096, i % 2 ? 0 : (int)i + 1, 4096);
	if (run(data, size, &b, &o1) == 0) {
		check(run(o1.p, o1.n, &b, &o2) == 0);
		check(o2.n == o1.n && (!o1.n || !memcmp(o1.p, o2.p, o1.n)));
		check(run(o1.p, o1.n, NULL, &o3) == 0);
		check(o3.n == o1.n && (!o1.n || !memcmp(o1.p, o3.p, o1.n)));
	}
	{
		/* The loader's mode: the same input, the block's pages handed
		 * over instead of compared. */
		uint64_t sunk = 0;
		struct migfilter_base sb = { .block = "mem", .size = BASE_SIZE, .page = sink_page, .flush = sink_flush,
					     .ctx = &sunk };
		struct dst o4 = { 0 };

		struct held h = { .n = 0 };
		struct migfilter_base hb = { .block = "mem", .size = BASE_SIZE, .page = held_page, .flush = held_flush,
					     .ctx = &h };
		struct views v = { .p = data, .n = size, .step = 1 };
		struct migfilter_stats st;
		struct kiln_err err = { .code = "" };
		struct dst o6 = { 0 };
		int r = run(data, size, &sb, &o4), rv = migfilter_run_view(view, &v, wr, &o6, &hb, &st, &err);

		check(rv == r);
		check(rv == 0 || err.errc == KERR_SNAPSHOT_ERROR);
		check(r != 0 || (h.pages == sunk && o6.n == o4.n && (!o4.n || !memcmp(o4.p, o6.p, o4.n))));
		free(v.cur);
		free(o4.p);
		free(o6.p);
	}
	{
		struct src t = { .p = data, .n = size, .step = 3 }, d = { .p = data, .n = size, .step = 5 };
		struct migfilter_compose c = { .block = "mem", .size = BASE_SIZE, .pages = emit, .dev_rd = rd,
					       .dev_ctx = &d };
		struct migfilter_stats st;
		struct kiln_err err = { .code = "" };
		struct dst o5 = { 0 };
		int r = migfilter_compose_run(rd, &t, &c, wr, &o5, &st, &err);

		check(r == 0 || err.errc == KERR_SNAPSHOT_ERROR);
		check(r != 0 || st.pages_kept >= 2);
		free(o5.p);
	}
	free(o1.p);
	free(o2.p);
	free(o3.p);
	return 0;
}
