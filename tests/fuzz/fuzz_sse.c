/* fuzz_sse: server-sent event streams (the bytes kiln-host and kiln-api
 * send; the CLI and kiln-api parse them) through lib/httpc's parser. The
 * input is fed whole, then cut at a point taken from its first byte, then a
 * byte at a time: all three must report the same events (or fail the same
 * way), every name NUL-terminated and shorter than its field, every data
 * within the bound. The last byte's low bit picks whether a `complete`
 * callback (data ending in '}') dispatches events early. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "httpc.h"
#include "fuzz.h"

#define MAX 256

struct log {
	struct buf b;
	int events;
	int complete; /* parse with a `complete` callback */
};

static int on_event(void *ctx, const char *name, const char *data, size_t len)
{
	struct log *l = ctx;

	check(strlen(name) < sizeof(((struct httpc_sse *)0)->name));
	check(len <= MAX);
	check(data[len] == '\0');
	l->events++;
	buf_printf(&l->b, "%zu:%s|%zu:", strlen(name), name, len);
	buf_add(&l->b, data, len);
	return 0;
}

/* Whole once it ends in '}' (the JSON follow asks whether it parses). */
static int complete(void *ctx, const char *data, size_t len)
{
	check(data[len] == '\0');
	return len && data[len - 1] == '}';
}

/* Feed p in pieces of `step` bytes (0: whole) after a first piece of `first`. */
static int run(const uint8_t *p, size_t n, size_t first, size_t step, struct log *l)
{
	struct httpc_sse s;
	size_t at = 0;
	int rc = 0;

	httpc_sse_init(&s, MAX, on_event, l->complete ? complete : NULL, l);
	if (first > n)
		first = n;
	if (first)
		rc = httpc_sse_feed(&s, (const char *)p, first), at = first;
	while (!rc && at < n) {
		size_t k = step && n - at > step ? step : n - at;

		rc = httpc_sse_feed(&s, (const char *)p + at, k);
		at += k;
	}
	httpc_sse_free(&s);
	check(rc == 0 || rc == -E2BIG);
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int with = size && (data[size - 1] & 1);
	struct log a = { BUF_INIT, 0, with }, b = { BUF_INIT, 0, with }, c = { BUF_INIT, 0, with };
	int ra = run(data, size, 0, 0, &a);
	int rb = run(data, size, size ? data[0] : 0, 0, &b);
	int rc = run(data, size, 0, 1, &c);

	check(ra == rb && rb == rc);
	/* A failed feed may stop at different events depending on the cut: only
	 * a clean run must agree event for event. */
	if (ra == 0) {
		check(a.events == b.events && b.events == c.events);
		check(a.b.len == b.b.len && b.b.len == c.b.len);
		check(!a.b.len || (!memcmp(a.b.p, b.b.p, a.b.len) && !memcmp(b.b.p, c.b.p, a.b.len)));
	}
	buf_free(&a.b);
	buf_free(&b.b);
	buf_free(&c.b);
	return 0;
}
