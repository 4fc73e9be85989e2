/* fuzz_portresp: libFuzzer target for kiln-api's reading of a sandbox
 * server's HTTP answer (api/ports/port_resp.c): the server is anyone's code.
 * Input: one byte of mode (bit 0: the request was HEAD; bits 1-7: the size
 * of the pieces the bytes arrive in, 1-128), then the answer. Besides memory
 * safety, checks that a finished head has a status 101 or 200-599 (1xx other than
 * 101 skipped), at most PORT_RESP_MAX_HEADERS headers lying inside the
 * stored head, no body for HEAD, that the body never exceeds the input, and
 * that feeding never takes more bytes than it was given. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "ports_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct port_resp *r;
	struct buf body;
	size_t piece, off = 1;
	int failed = 0;

	if (size < 1)
		return 0;
	r = malloc(sizeof(*r));
	if (!r)
		return 0;
	buf_init(&body, 1u << 20);
	port_resp_init(r, data[0] & 1, &body);
	piece = (size_t)(data[0] >> 1) + 1;
	while (off < size && !failed) {
		size_t n = size - off < piece ? size - off : piece;
		long k = port_resp_feed(r, (const char *)data + off, n);

		if (k < 0) {
			failed = 1;
			break;
		}
		check((size_t)k <= n);
		if ((size_t)k < n) {
			check(r->done || r->upgrade);
			break;
		}
		off += n;
	}
	if (!failed && !r->done && !r->upgrade)
		(void)port_resp_eof(r);
	if (r->head_done) {
		check(r->status == 101 || (r->status >= 200 && r->status <= 599));
		check(r->nh <= PORT_RESP_MAX_HEADERS && r->hlen <= sizeof(r->hbuf));
		for (size_t i = 0; i < r->nh; i++) {
			const char *name, *value;
			size_t nl, vl;

			check(port_resp_header(r, i, &name, &nl, &value, &vl) == 1);
			check(name >= r->hbuf && name + nl <= r->hbuf + r->hlen);
			check(value >= r->hbuf && value + vl <= r->hbuf + r->hlen);
		}
		if (data[0] & 1)
			check(body.len == 0);
	}
	check(body.len <= size);
	buf_free(&body);
	free(r);
	return 0;
}
