/* fuzz_s3xml: S3 reply bodies (the server's bytes, which end up in error
 * messages and in the UploadId we send back) through s3_xml_text; and the
 * same bytes as an object key (built from guest file names) through
 * s3_encode_key, and as a key a host reports (s3_key_under: signed only
 * under the task's prefix). Checks, besides memory safety, the extractor's contract:
 * bounded, NUL-terminated, printable ASCII only, "" on failure, and the same
 * answer whatever the output buffer's size. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3.h"
#include "fuzz.h"

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

static int hexval_any(char c)
{
	return hexval(c) >= 0 ? hexval(c) : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* A key s3_key_under accepts lies under the prefix and has no dot or empty
 * segment, as written and once percent-decoded. */
static void fuzz_key_under(const uint8_t *data, size_t size)
{
	static const char prefix[] = "acme/t_1/";
	struct kiln_err err = { .code = "" };
	char *key = malloc(size + 1);

	check(key != NULL);
	memcpy(key, data, size);
	key[size] = '\0';
	if (s3_key_under(key, prefix, &err) == 0) {
		/* The key, and the key percent-decoded once, with a '/' at
		 * the end so that a last segment is checked too. */
		size_t n = strlen(key), o = 0;
		char *forms[2] = { malloc(n + 2), malloc(n + 2) };

		check(forms[0] && forms[1]);
		for (size_t i = 0; i < n; i++) {
			int hi = key[i] == '%' ? hexval_any(key[i + 1]) : -1, lo = hi >= 0 ? hexval_any(key[i + 2]) : -1;

			if (hi >= 0 && lo >= 0) {
				forms[1][o++] = (char)(hi << 4 | lo);
				i += 2;
			} else {
				forms[1][o++] = key[i];
			}
		}
		memcpy(forms[1] + o, "/", 2);
		memcpy(forms[0], key, n);
		memcpy(forms[0] + n, "/", 2);
		check(strlen(forms[1]) == o + 1); /* no NUL decoded */
		for (int f = 0; f < 2; f++) {
			check(strncmp(forms[f], prefix, sizeof(prefix) - 1) == 0 && strlen(forms[f]) > sizeof(prefix));
			check(!strstr(forms[f], "/../") && !strstr(forms[f], "/./") && !strstr(forms[f], "//"));
			free(forms[f]);
		}
	} else {
		check(err.errc == KERR_S3_KEY_OUTSIDE && err.message[0]);
	}
	free(key);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	fuzz_xml(data, size);
	if (size <= 2048) {
		fuzz_key(data, size);
		fuzz_key_under(data, size);
	}
	return 0;
}
