/* fuzz_s3xml: S3 reply bodies (the server's bytes, which end up in error
 * messages and in the UploadId we send back) through s3_xml_text; and the
 * same bytes as an object key (built from guest file names) through
 * s3_encode_key. Checks, besides memory safety, the extractor's contract:
 * bounded, NUL-terminated, printable ASCII only, "" on failure, and the same
 * answer whatever the output buffer's size. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3.h"

#define check(cond)                                                             \
	do {                                                                    \
		if (!(cond)) {                                                  \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #cond);                               \
			abort();                                                \
		}                                                               \
	} while (0)

static const char *const tags[] = { "Code", "Message", "UploadId", "ETag", "Key", "RequestId", "Error", "C" };

static void check_text(const char *out, size_t out_size, int n)
{
	size_t len = strnlen(out, out_size);

	check(len < out_size); /* NUL-terminated inside the buffer */
	if (n < 0) {
		check(len == 0);
		return;
	}
	check(len == ((size_t)n < out_size - 1 ? (size_t)n : out_size - 1));
	for (size_t i = 0; i < len; i++)
		check(out[i] >= 0x20 && out[i] < 0x7f);
}

static void fuzz_xml(const uint8_t *data, size_t size)
{
	/* First byte: which tag, and how small the short buffer is. */
	const char *tag = tags[data[0] % (sizeof(tags) / sizeof(tags[0]))];
	size_t small_size = 1 + (data[0] >> 3);
	const char *doc = (const char *)data + 1;
	size_t len = size - 1;
	char big[4096], *small = malloc(small_size);
	int n_big, n_small;

	check(small != NULL);
	/* Poison the buffers: the output must be written, never assumed. */
	memset(big, 0xa5, sizeof(big));
	memset(small, 0xa5, small_size);
	n_big = s3_xml_text(doc, len, tag, big, sizeof(big));
	n_small = s3_xml_text(doc, len, tag, small, small_size);
	check_text(big, sizeof(big), n_big);
	check_text(small, small_size, n_small);
	check(n_big == n_small);
	check(strncmp(big, small, small_size - 1) == 0);
	free(small);
}

/* Uppercase hex digits only, as SigV4 wants. */
static int hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Every byte of the key comes back from the encoding, which holds only
 * unreserved characters, '/' and %XX. */
static void fuzz_key(const uint8_t *data, size_t size)
{
	char *key = malloc(size + 1), *enc, *dec;
	size_t i, o = 0, klen;

	check(key != NULL);
	memcpy(key, data, size);
	key[size] = '\0';
	klen = strlen(key);
	enc = s3_encode_key(key);
	check(enc != NULL);
	dec = malloc(klen + 1);
	check(dec != NULL);
	for (i = 0; enc[i]; i++) {
		char c = enc[i];

		if (c == '%') {
			int hi = hexval(enc[i + 1]), lo = hi < 0 ? -1 : hexval(enc[i + 2]);

			check(hi >= 0 && lo >= 0);
			dec[o++] = (char)(hi << 4 | lo);
			i += 2;
		} else {
			check((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			      strchr("-_.~/", c));
			dec[o++] = c;
		}
		check(o <= klen);
	}
	check(o == klen && memcmp(dec, key, klen) == 0);
	free(dec);
	free(enc);
	free(key);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	fuzz_xml(data, size);
	if (size <= 2048)
		fuzz_key(data, size);
	return 0;
}
