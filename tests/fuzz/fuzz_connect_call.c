/* fuzz_connect_call: libFuzzer target for lib/connect_call.c, which reads a
 * client's Content-Type and request path. The input, as a string up to its
 * first NUL (from an exact-size heap copy, so that ASan sees any read past
 * it), goes to connect_call_media, connect_call_check_media for every kind
 * and connect_call_kind_path. Properties: a result in range; the same
 * result with every ASCII letter upper- or lower-cased (media types compare
 * without case: an odd-case spelling must never change what a call is);
 * the check passes exactly for the kind's JSON type and otherwise says why
 * in a bounded, printable message; a path's kind is that of its parts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connect_call.h"
#include "fuzz.h"

static char *dup_str(const uint8_t *data, size_t size, int fold)
{
	size_t n = strnlen((const char *)data, size);
	char *s = malloc(n + 1);

	check(s != NULL);
	for (size_t i = 0; i < n; i++) {
		char c = (char)data[i];

		if (fold > 0 && c >= 'a' && c <= 'z')
			c = (char)(c - 'a' + 'A');
		else if (fold < 0 && c >= 'A' && c <= 'Z')
			c = (char)(c - 'A' + 'a');
		s[i] = c;
	}
	s[n] = '\0';
	return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const enum connect_kind kinds[] = { CONNECT_KIND_NONE, CONNECT_KIND_UNARY, CONNECT_KIND_SERVER_STREAM,
						   CONNECT_KIND_CLIENT_STREAM };
	char *s = dup_str(data, size, 0), *up = dup_str(data, size, 1), *low = dup_str(data, size, -1);
	enum connect_media m = connect_call_media(s);
	enum connect_kind k;
	char why[128];

	check(m >= CONNECT_MEDIA_INVALID && m <= CONNECT_MEDIA_STREAM_PROTO);
	check(connect_call_media(up) == m && connect_call_media(low) == m);
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		int want = (kinds[i] == CONNECT_KIND_UNARY && m == CONNECT_MEDIA_JSON) ||
			   (connect_kind_streams(kinds[i]) && m == CONNECT_MEDIA_STREAM_JSON);
		int r;

		memset(why, 'x', sizeof(why));
		r = connect_call_check_media(kinds[i], s, why, sizeof(why));
		check(r == (want ? 0 : -1));
		if (r < 0) {
			size_t n = strnlen(why, sizeof(why));

			check(n > 0 && n < sizeof(why));
			for (size_t j = 0; j < n; j++)
				check(why[j] >= 0x20 && why[j] < 0x7f);
		}
		check(connect_call_check_media(kinds[i], up, why, sizeof(why)) == r);
	}

	k = connect_call_kind_path(s);
	check(k >= CONNECT_KIND_NONE && k <= CONNECT_KIND_CLIENT_STREAM);
	if (k != CONNECT_KIND_NONE) {
		char *slash = strchr(s + 1, '/');

		check(s[0] == '/' && slash && !strchr(slash + 1, '/'));
		*slash = '\0';
		check(connect_call_kind(s + 1, slash + 1) == k);
	}
	free(low);
	free(up);
	free(s);
	return 0;
}
