/* fuzz_multipart: libFuzzer target for lib/multipart.c. The first input byte
 * picks a boundary length and a slice size; the rest is the body, parsed once
 * whole and once cut into slices. Both parses must agree exactly (result,
 * parts, names, data), since a streaming parser must not depend on where
 * the network splits a body; data out never exceeds data in. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "multipart.h"
#include "fuzz.h"

struct log {
	struct buf b; /* everything the callbacks saw, serialised */
	size_t data;
};

static int on_begin(void *cls, const char *name, const char *filename)
{
	struct log *l = cls;

	check(strlen(name) <= MULTIPART_MAX_NAME && strlen(filename) <= MULTIPART_MAX_NAME);
	buf_printf(&l->b, "B[%s|%s]", name, filename);
	return 0;
}

static int on_data(void *cls, const uint8_t *p, size_t n)
{
	struct log *l = cls;

	check(n > 0);
	l->data += n;
	buf_adds(&l->b, "D");
	return buf_add(&l->b, p, n) < 0 ? -ENOMEM : 0;
}

static int on_end(void *cls)
{
	struct log *l = cls;

	buf_adds(&l->b, "E");
	return 0;
}

static int on_data_joined(void *cls, const uint8_t *p, size_t n)
{
	struct log *l = cls;

	check(n > 0);
	l->data += n;
	return buf_add(&l->b, p, n) < 0 ? -ENOMEM : 0;
}

static int run(const char *boundary, const uint8_t *body, size_t len, size_t slice, struct log *l)
{
	static const struct multipart_cb cb = { on_begin, on_data_joined, on_end };
	struct multipart *m = multipart_new(boundary, &cb, l);
	size_t off = 0;
	int rc = 0;

	check(m != NULL);
	while (off < len && rc == 0) {
		size_t k = slice && slice < len - off ? slice : len - off;
		rc = multipart_feed(m, body + off, k);
		off += k;
	}
	if (rc == 0)
		rc = multipart_finish(m);
	multipart_free(m);
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const boundaries[] = { "B", "XyZ", "----WebKitFormBoundary7MA4YWxkTrZu0gW", "a b" };
	struct log whole = { BUF_INIT, 0 }, cut = { BUF_INIT, 0 };
	const char *boundary;
	size_t slice;
	int r1, r2;

	(void)on_data;
	if (size < 1)
		return 0;
	boundary = boundaries[data[0] & 3];
	slice = 1 + (data[0] >> 2);
	r1 = run(boundary, data + 1, size - 1, 0, &whole);
	r2 = run(boundary, data + 1, size - 1, slice, &cut);
	check(r1 == 0 || r1 == -EPROTO);
	check(r1 == r2);
	if (r1 == 0) {
		check(whole.b.len == cut.b.len && (whole.b.len == 0 || memcmp(whole.b.p, cut.b.p, whole.b.len) == 0));
		check(whole.data == cut.data);
	}
	check(whole.data <= size);
	buf_free(&whole.b);
	buf_free(&cut.b);
	return 0;
}
