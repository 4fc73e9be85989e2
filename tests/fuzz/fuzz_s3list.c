/* fuzz_s3list: a ListObjectsV2 reply (from the S3 server) through
 * s3_list_parse: no read outside the buffer, every key handed out is a
 * NUL-terminated string of at most 1024 bytes, a continuation token only
 * with "more pages". */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "s3.h"

static int on_key(void *ctx, const char *key)
{
	size_t *n = ctx;

	check(strlen(key) <= 1024);
	(*n)++;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = malloc(size ? size : 1), token[256];
	size_t n = 0;
	int r;

	if (!buf)
		return 0;
	memcpy(buf, data, size);
	r = s3_list_parse(buf, size, on_key, &n, token, sizeof(token));
	check(r >= -1 && r <= 1);
	if (r == 1)
		check(token[0] && strlen(token) < sizeof(token));
	if (r == 0)
		check(token[0] == '\0');
	free(buf);
	return 0;
}
