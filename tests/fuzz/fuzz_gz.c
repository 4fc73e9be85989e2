/* fuzz_gz: libFuzzer target for lib/gz.c. The first input byte picks a
 * slice size and an output bound; the rest is a request body inflated once
 * whole and once cut into slices: both must agree (result and bytes), never
 * give out more than the bound, and whatever inflates must deflate and
 * inflate back to itself. The input read as text also goes through the
 * Accept-Encoding and Content-Encoding readers. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "gz.h"
#include "fuzz.h"

static int collect(void *cls, const uint8_t *p, size_t n)
{
	struct buf *b = cls;

	check(n > 0 && n <= GZ_BLOCK);
	return buf_add(b, p, n) < 0 ? -ENOMEM : 0;
}

static int inflate_in(const uint8_t *p, size_t n, size_t slice, uint64_t max, struct buf *out)
{
	struct gz_in g;
	size_t off = 0;
	int r = 0;

	check(gz_in_init(&g, max) == 0);
	while (off < n && r == 0) {
		size_t k = n - off < slice ? n - off : slice;

		r = gz_in_feed(&g, p + off, k, collect, out);
		off += k;
	}
	if (r == 0)
		r = gz_in_finish(&g);
	gz_in_free(&g);
	check(r == 0 || r == -EFBIG || r == -EBADMSG);
	check(out->len <= max);
	return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct buf whole, cut, z, back;
	size_t slice;
	uint64_t max;
	int r1, r2;
	char *text;

	if (size < 1)
		return 0;
	slice = 1 + (data[0] & 0x0f) * 37;
	max = (data[0] & 0x80) ? 4096 : (4u << 20);
	buf_init(&whole, 8u << 20);
	buf_init(&cut, 8u << 20);
	r1 = inflate_in(data + 1, size - 1, size, max, &whole);
	r2 = inflate_in(data + 1, size - 1, slice, max, &cut);
	/* A bound or an error can be met at another point when cut, but the
	 * bytes given out agree as far as both went, and a success is one. */
	check((r1 == 0) == (r2 == 0));
	if (whole.len && cut.len)
		check(memcmp(whole.p, cut.p, whole.len < cut.len ? whole.len : cut.len) == 0);
	if (r1 == 0) {
		struct gz_out g;
		uint8_t o[4096];
		size_t off = 0;

		check(whole.len == cut.len);
		buf_init(&z, 16u << 20);
		check(gz_out_init(&g) == 0);
		while (!gz_out_ended(&g)) {
			size_t used;
			ssize_t k = gz_out_step(&g, (const uint8_t *)whole.p + off, whole.len - off, &used, 1, o,
						sizeof(o));

			check(k >= 0);
			off += used;
			check(buf_add(&z, o, (size_t)k) == 0);
		}
		gz_out_free(&g);
		buf_init(&back, 8u << 20);
		check(inflate_in((const uint8_t *)z.p, z.len, 1000, max, &back) == 0);
		check(back.len == whole.len && (!whole.len || memcmp(back.p, whole.p, whole.len) == 0));
		buf_free(&back);
		buf_free(&z);
	}
	buf_free(&whole);
	buf_free(&cut);
	text = malloc(size);
	check(text != NULL);
	memcpy(text, data + 1, size - 1);
	text[size - 1] = '\0';
	r1 = gz_accept(text);
	check(r1 >= -1 && r1 <= 1);
	r1 = gz_content_encoding(text);
	check(r1 >= -1 && r1 <= 1);
	free(text);
	return 0;
}
