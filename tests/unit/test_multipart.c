/* test_multipart: unit tests for lib/multipart.c (streaming
 * multipart/form-data): boundaries from Content-Type, parts and their data
 * however the body is cut into pieces, binary data that resembles a
 * delimiter, empty parts, and malformed bodies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "multipart.h"

struct got {
	int parts, ends;
	char name[8][64], filename[8][64];
	struct buf data[8];
};

static int on_begin(void *cls, const char *name, const char *filename)
{
	struct got *g = cls;

	if (g->parts >= 8)
		return -E2BIG;
	snprintf(g->name[g->parts], 64, "%s", name);
	snprintf(g->filename[g->parts], 64, "%s", filename);
	buf_init(&g->data[g->parts], 0);
	g->parts++;
	return 0;
}

static int on_data(void *cls, const uint8_t *p, size_t n)
{
	struct got *g = cls;

	return buf_add(&g->data[g->parts - 1], p, n);
}

static int on_end(void *cls)
{
	struct got *g = cls;

	g->ends++;
	return 0;
}

static const struct multipart_cb cb = { on_begin, on_data, on_end };

static void got_free(struct got *g)
{
	int i;

	for (i = 0; i < g->parts; i++)
		buf_free(&g->data[i]);
	memset(g, 0, sizeof(*g));
}

/* Parse body fed in pieces of `step` bytes (0: all at once). */
static int parse(const char *boundary, const void *body, size_t len, size_t step, struct got *g)
{
	struct multipart *m = multipart_new(boundary, &cb, g);
	const uint8_t *p = body;
	size_t off = 0;
	int rc = 0;

	assert_non_null(m);
	memset(g, 0, sizeof(*g));
	while (off < len && rc == 0) {
		size_t k = step && step < len - off ? step : len - off;
		rc = multipart_feed(m, p + off, k);
		off += k;
	}
	if (rc == 0)
		rc = multipart_finish(m);
	multipart_free(m);
	return rc;
}

static void test_boundary(void **state)
{
	char b[MULTIPART_MAX_BOUNDARY + 1];

	assert_int_equal(multipart_boundary("multipart/form-data; boundary=abc123", b), 0);
	assert_string_equal(b, "abc123");
	assert_int_equal(multipart_boundary("Multipart/Form-Data; charset=utf-8; BOUNDARY=\"a b:c\"", b), 0);
	assert_string_equal(b, "a b:c");
	assert_int_equal(multipart_boundary("multipart/form-data; x=\"q;boundary=no\"; boundary=yes", b), 0);
	assert_string_equal(b, "yes");
	assert_int_equal(multipart_boundary("multipart/form-data", b), -EINVAL);
	assert_int_equal(multipart_boundary("multipart/form-data; boundary=", b), -EINVAL);
	assert_int_equal(multipart_boundary("text/plain; boundary=x", b), -EINVAL);
	assert_int_equal(multipart_boundary("multipart/form-data; boundary=\"unterminated", b), -EINVAL);
	assert_int_equal(multipart_boundary("multipart/form-data; boundary=a\x01", b), -EINVAL);
	assert_int_equal(
		multipart_boundary("multipart/form-data; boundary=0123456789012345678901234567890123456789012345678901234567890123456789X", b),
		-EINVAL);
	assert_int_equal(multipart_boundary(NULL, b), -EINVAL);
}

static const char two[] = "preamble\r\n"
			  "--XyZ\r\n"
			  "Content-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n"
			  "Content-Type: text/plain\r\n"
			  "\r\n"
			  "hello\r\n--Xy not yet\r\n"
			  "--XyZ  \r\n"
			  "content-disposition: form-data; name=file; filename=\"dir/b\\\"q.bin\"\r\n"
			  "\r\n"
			  "\r\n--XyZ\r\n"
			  "Content-Disposition: form-data; name=\"empty\"\r\n"
			  "\r\n"
			  "\r\n--XyZ--\r\nepilogue ignored";

static void test_parts_any_split(void **state)
{
	static const size_t steps[] = { 0, 1, 2, 3, 5, 7, 13, 64 };
	struct got g;
	size_t i;

	for (i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		assert_int_equal(parse("XyZ", two, sizeof(two) - 1, steps[i], &g), 0);
		assert_int_equal(g.parts, 3);
		assert_int_equal(g.ends, 3);
		assert_string_equal(g.name[0], "file");
		assert_string_equal(g.filename[0], "a.txt");
		assert_int_equal(g.data[0].len, strlen("hello\r\n--Xy not yet"));
		assert_memory_equal(g.data[0].p, "hello\r\n--Xy not yet", g.data[0].len);
		assert_string_equal(g.filename[1], "dir/b\"q.bin");
		assert_int_equal(g.data[1].len, 0);
		assert_string_equal(g.name[2], "empty");
		assert_string_equal(g.filename[2], "");
		assert_int_equal(g.data[2].len, 0);
		got_free(&g);
	}
}

static void test_binary(void **state)
{
	struct buf body = BUF_INIT;
	uint8_t data[70000];
	struct got g;
	size_t i;

	for (i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)(i * 131 + (i >> 8));
	/* Things that look like the delimiter but are not. */
	memcpy(data + 1000, "\r\n--bound", 9);
	memcpy(data + 5000, "\r\n--boundar", 11);
	memcpy(data + 69990, "\r\n-", 3);
	buf_adds(&body, "--boundary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x\"\r\n\r\n");
	buf_add(&body, data, sizeof(data));
	buf_adds(&body, "\r\n--boundary--");
	assert_int_equal(parse("boundary", body.p, body.len, 0, &g), 0);
	assert_int_equal(g.parts, 1);
	assert_int_equal(g.data[0].len, sizeof(data));
	assert_memory_equal(g.data[0].p, data, sizeof(data));
	got_free(&g);
	assert_int_equal(parse("boundary", body.p, body.len, 4093, &g), 0);
	assert_int_equal(g.data[0].len, sizeof(data));
	assert_memory_equal(g.data[0].p, data, sizeof(data));
	got_free(&g);
	buf_free(&body);
}

static void test_malformed(void **state)
{
	struct got g;
	char big[MULTIPART_MAX_HEADERS + 200];
	const char *bad[] = {
		"--B\r\nContent-Type: text/plain\r\n\r\nx\r\n--B--",          /* no disposition */
		"--B\r\nContent-Disposition: attachment\r\n\r\nx\r\n--B--",   /* not form-data */
		"--B\r\nno colon here\r\n\r\nx\r\n--B--",                      /* bad header */
		"--B\r\n\r\nx\r\n--B--",                                       /* no headers */
		"--Bjunk\r\nContent-Disposition: form-data\r\n\r\nx\r\n--B--", /* junk after the delimiter */
		"--B\r\nContent-Disposition: form-data; name=\"unterminated\r\n\r\nx\r\n--B--",
	};
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(parse("B", bad[i], strlen(bad[i]), 0, &g), -EPROTO);
		got_free(&g);
	}
	/* Never closed. */
	assert_int_equal(parse("B", "--B\r\nContent-Disposition: form-data\r\n\r\nxx", 41, 0, &g), -EPROTO);
	got_free(&g);
	/* No delimiter at all. */
	assert_int_equal(parse("B", "just text", 9, 0, &g), -EPROTO);
	got_free(&g);
	/* A header block over the bound. */
	memcpy(big, "--B\r\nX: ", 8);
	memset(big + 8, 'a', sizeof(big) - 8);
	assert_int_equal(parse("B", big, sizeof(big), 0, &g), -EPROTO);
	got_free(&g);
}

static int refuse(void *cls, const uint8_t *p, size_t n)
{
	return -ENOSPC;
}

static void test_callback_error_sticks(void **state)
{
	struct multipart_cb c = { NULL, refuse, NULL };
	struct multipart *m = multipart_new("B", &c, NULL);
	const char *body = "--B\r\nContent-Disposition: form-data\r\n\r\nsome data here\r\n--B--";

	assert_int_equal(multipart_feed(m, (const uint8_t *)body, strlen(body)), -ENOSPC);
	assert_int_equal(multipart_feed(m, (const uint8_t *)"x", 1), -ENOSPC);
	assert_int_equal(multipart_finish(m), -ENOSPC);
	multipart_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_boundary),  cmocka_unit_test(test_parts_any_split),
		cmocka_unit_test(test_binary),    cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_callback_error_sticks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
