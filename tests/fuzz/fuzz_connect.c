/* fuzz_connect: libFuzzer target for lib/connectrpc.c's parsers of client
 * bytes: the streaming envelope (walked message by message from exact-size
 * copies; a parsed envelope must re-encode to the same bytes), base64 (a
 * decoded string must re-encode to its canonical form and decode again to the
 * same bytes) and Connect-Timeout-Ms. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connectrpc.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *copy = malloc(size ? size : 1);
	char *str = malloc(size + 1);
	size_t off = 0;

	check(copy && str);
	memcpy(copy, data, size);
	while (off < size) {
		const uint8_t *msg;
		uint8_t flags;
		size_t n;
		ssize_t used = connect_env_parse(copy + off, size - off, 4096, &flags, &msg, &n);
		struct buf b = BUF_INIT;

		if (used <= 0) {
			check(used == 0 || used == -EPROTO || used == -EMSGSIZE);
			break;
		}
		check((size_t)used == n + CONNECT_ENV_HDR && n <= 4096 && msg == copy + off + CONNECT_ENV_HDR);
		check(connect_env_append(&b, flags, msg, n) == 0);
		check(b.len == (size_t)used && memcmp(b.p, copy + off, b.len) == 0);
		buf_free(&b);
		off += (size_t)used;
	}

	/* The input as a string, up to its first NUL. */
	memcpy(str, data, size);
	str[size] = '\0';
	{
		uint8_t *out, *again;
		size_t n, n2;
		int64_t ms = connect_timeout_ms(str);

		check(ms >= 0 || ms == -EINVAL);
		if (connect_b64_decode(str, 1 << 20, &out, &n) == 0) {
			struct buf b = BUF_INIT;
			check(connect_b64_append(&b, out, n) == 0);
			check(connect_b64_decode(b.p ? b.p : "", 1 << 20, &again, &n2) == 0);
			check(n2 == n && (n == 0 || memcmp(again, out, n) == 0));
			free(again);
			free(out);
			buf_free(&b);
		}
	}
	free(str);
	free(copy);
	return 0;
}
