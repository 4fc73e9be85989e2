/* test_gz: unit tests for lib/gz.c: a gzip body inflated whole or cut in
 * any slices gives the same bytes; the bound stops a bomb before any byte
 * past it goes on; data that is not gzip, a truncated body and an empty one
 * are refused; several members are one body; deflate round-trips through
 * gz_in; Accept-Encoding and Content-Encoding as E2B's envd reads them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "gz.h"

static int collect(void *cls, const uint8_t *p, size_t n)
{
	struct buf *b = cls;

	assert_true(n > 0 && n <= GZ_BLOCK);
	return buf_add(b, p, n) < 0 ? -ENOMEM : 0;
}

/* Compress p[0..n) with gz_out, in slices of step bytes of input. */
static void deflate_all(const uint8_t *p, size_t n, size_t step, struct buf *out)
{
	struct gz_out g;
	uint8_t o[777]; /* small: the output side is cut too */
	size_t off = 0;

	assert_int_equal(gz_out_init(&g), 0);
	while (!gz_out_ended(&g)) {
		size_t take = n - off < step ? n - off : step, used;
		int fin = off + take == n;
		ssize_t k = gz_out_step(&g, p + off, take, &used, fin, o, sizeof(o));

		assert_true(k >= 0);
		off += used;
		assert_int_equal(buf_add(out, o, (size_t)k), 0);
	}
	assert_int_equal(off, n);
	gz_out_free(&g);
}

static int inflate_all(const uint8_t *p, size_t n, size_t slice, uint64_t max, struct buf *out)
{
	struct gz_in g;
	size_t off = 0;
	int r = 0;

	assert_int_equal(gz_in_init(&g, max), 0);
	while (off < n && r == 0) {
		size_t k = n - off < slice ? n - off : slice;

		r = gz_in_feed(&g, p + off, k, collect, out);
		off += k;
	}
	if (r == 0)
		r = gz_in_finish(&g);
	gz_in_free(&g);
	return r;
}

static void test_roundtrip_any_split(void **state)
{
	static const size_t slices[] = { 1, 7, 4096, 65536, 1 << 22 };
	size_t n = 300000, i;
	uint8_t *data = malloc(n);
	struct buf z, back;

	for (i = 0; i < n; i++) /* half random-ish, half compressible */
		data[i] = i < n / 2 ? (uint8_t)(i * 2654435761u >> 13) : (uint8_t)('a' + i % 7);
	buf_init(&z, 1 << 24);
	deflate_all(data, n, 1000, &z);
	assert_true(z.len > 20 && z.len < n);
	for (i = 0; i < sizeof(slices) / sizeof(slices[0]); i++) {
		buf_init(&back, 1 << 24);
		assert_int_equal(inflate_all((const uint8_t *)z.p, z.len, slices[i], n, &back), 0);
		assert_int_equal(back.len, n);
		assert_memory_equal(back.p, data, n);
		buf_free(&back);
	}
	/* one byte short of the size: the bound */
	buf_init(&back, 1 << 24);
	assert_int_equal(inflate_all((const uint8_t *)z.p, z.len, 4096, n - 1, &back), -EFBIG);
	assert_true(back.len <= n - 1);
	buf_free(&back);
	buf_free(&z);
	free(data);
}

static void test_bomb(void **state)
{
	size_t n = 64u << 20, i;
	uint8_t *zeros = calloc(1, 1 << 20);
	struct gz_out g;
	struct buf z, back;
	uint8_t *o = malloc(1 << 20);

	/* 64 MiB of zeros, deflated piecewise: some 64 KiB of gzip */
	buf_init(&z, 1 << 24);
	assert_int_equal(gz_out_init(&g), 0);
	for (i = 0; i < n; i += 1 << 20) {
		size_t used, fed = 0;

		while (fed < (1u << 20)) {
			ssize_t k = gz_out_step(&g, zeros + fed, (1u << 20) - fed, &used, 0, o, 1 << 20);

			assert_true(k >= 0);
			fed += used;
			buf_add(&z, o, (size_t)k);
		}
	}
	while (!gz_out_ended(&g)) {
		size_t used;
		ssize_t k = gz_out_step(&g, NULL, 0, &used, 1, o, 1 << 20);

		assert_true(k >= 0);
		buf_add(&z, o, (size_t)k);
	}
	gz_out_free(&g);
	assert_true(z.len < (1u << 20));
	buf_init(&back, 1 << 24);
	assert_int_equal(inflate_all((const uint8_t *)z.p, z.len, 65536, 2u << 20, &back), -EFBIG);
	assert_true(back.len <= (2u << 20)); /* nothing past the bound went on */
	buf_free(&back);
	buf_free(&z);
	free(zeros);
	free(o);
}

static void test_malformed(void **state)
{
	static const uint8_t notgz[] = "this is not gzip";
	struct buf z, z2, back;
	uint8_t data[100];

	memset(data, 'q', sizeof(data));
	buf_init(&back, 1 << 20);
	assert_int_equal(inflate_all(notgz, sizeof(notgz) - 1, 5, 1 << 20, &back), -EBADMSG);
	assert_int_equal(inflate_all(notgz, 0, 5, 1 << 20, &back), -EBADMSG); /* empty */
	buf_init(&z, 1 << 20);
	deflate_all(data, sizeof(data), 10, &z);
	assert_int_equal(inflate_all((const uint8_t *)z.p, z.len - 3, 5, 1 << 20, &back), -EBADMSG); /* cut */
	/* a flipped byte of the data or its CRC */
	((uint8_t *)z.p)[z.len - 6] ^= 0x55;
	back.len = 0;
	assert_int_equal(inflate_all((const uint8_t *)z.p, z.len, 5, 1 << 20, &back), -EBADMSG);
	((uint8_t *)z.p)[z.len - 6] ^= 0x55;
	/* two members are one body; garbage after a member is not gzip */
	buf_init(&z2, 1 << 20);
	buf_add(&z2, z.p, z.len);
	buf_add(&z2, z.p, z.len);
	back.len = 0;
	assert_int_equal(inflate_all((const uint8_t *)z2.p, z2.len, 3, 1 << 20, &back), 0);
	assert_int_equal(back.len, 2 * sizeof(data));
	buf_add(&z2, "junk", 4);
	back.len = 0;
	assert_int_equal(inflate_all((const uint8_t *)z2.p, z2.len, 3, 1 << 20, &back), -EBADMSG);
	buf_free(&z2);
	buf_free(&z);
	buf_free(&back);
}

static int refuse(void *cls, const uint8_t *p, size_t n)
{
	(void)cls, (void)p, (void)n;
	return -ENOSPC;
}

static void test_sink_error(void **state)
{
	struct buf z;
	struct gz_in g;
	uint8_t data[10] = "0123456789";

	buf_init(&z, 1 << 20);
	deflate_all(data, sizeof(data), 10, &z);
	assert_int_equal(gz_in_init(&g, 100), 0);
	assert_int_equal(gz_in_feed(&g, (const uint8_t *)z.p, z.len, refuse, NULL), -ENOSPC);
	gz_in_free(&g);
	buf_free(&z);
}

static void test_accept(void **state)
{
	assert_int_equal(gz_accept(NULL), 0);
	assert_int_equal(gz_accept(""), 0);
	assert_int_equal(gz_accept("gzip"), 1);
	assert_int_equal(gz_accept("GZip"), 1);
	assert_int_equal(gz_accept("gzip, deflate, br"), 1);
	assert_int_equal(gz_accept("br;q=1.0, gzip;q=0.8, *;q=0.1"), 1);
	assert_int_equal(gz_accept("deflate"), 0);
	assert_int_equal(gz_accept("identity"), 0);
	assert_int_equal(gz_accept("gzip;q=0"), 0);
	assert_int_equal(gz_accept("gzip;q=0.5, identity"), 0); /* identity is better */
	assert_int_equal(gz_accept("identity;q=0.5, gzip"), 1);
	assert_int_equal(gz_accept("*"), 0);                     /* any: identity will do */
	assert_int_equal(gz_accept("identity;q=0, *"), 1);
	assert_int_equal(gz_accept("identity;q=0"), -1);         /* nothing acceptable: 406 */
	assert_int_equal(gz_accept("identity;q=0, gzip;q=0"), -1);
	assert_int_equal(gz_accept("identity;q=0, br"), -1);
	assert_int_equal(gz_accept("gzip;q=nonsense"), 0);       /* a bad q is 0 */
	assert_int_equal(gz_accept(",,, gzip ;q=1"), 1);
	assert_int_equal(gz_accept(";;; gzip"), 0); /* no coding before the parameters */
	assert_int_equal(gz_content_encoding(NULL), 0);
	assert_int_equal(gz_content_encoding(""), 0);
	assert_int_equal(gz_content_encoding("identity"), 0);
	assert_int_equal(gz_content_encoding("gzip"), 1);
	assert_int_equal(gz_content_encoding(" GZIP"), 1);
	assert_int_equal(gz_content_encoding("br"), -1);
	assert_int_equal(gz_content_encoding("gzip, br"), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_any_split), cmocka_unit_test(test_bomb),
		cmocka_unit_test(test_malformed),           cmocka_unit_test(test_sink_error),
		cmocka_unit_test(test_accept),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
