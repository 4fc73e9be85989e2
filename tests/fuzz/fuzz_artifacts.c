/* fuzz_artifacts: libFuzzer target for kiln-api's parsers of a request for a
 * task's inline artifact (api/http/artifacts.c): the path
 * /v1/tasks/ID/artifacts/NAME and the Range header, both from any client,
 * and the signature check of a signed link. Besides memory safety, checks
 * that a path accepted names only [A-Za-z0-9._-] segments that fit, that a
 * range accepted lies inside the body (first <= last < len), and that a
 * random signature never verifies. Input: a length byte for the body, then
 * the text, tried as a path, as a Range value and as a signature. */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "artifacts.h"
#include "fuzz.h"

static int plain(const char *s)
{
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && *s != '.' && *s != '_' && *s != '-')
			return 0;
	return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const unsigned char key[32] = { 1, 2, 3 };
	char id[80], name[ARTIFACT_NAME_MAX];
	size_t len, first = 0, last = 0;
	char *s;
	int r;

	if (size < 1)
		return 0;
	len = data[0] * 97u; /* bodies of 0 to ~24 KiB */
	s = malloc(size);
	if (!s)
		return 0;
	memcpy(s, data + 1, size - 1);
	s[size - 1] = '\0';
	if (artifacts_path(s, id, sizeof(id), name)) {
		check(*id && plain(id) && strlen(id) < sizeof(id));
		check(*name && plain(name) && strlen(name) < ARTIFACT_NAME_MAX);
		check(!strncmp(s, "/v1/tasks/", 10));
		/* A random signature (the input) never verifies. */
		check(!artifacts_sig_ok(key, id, name, "99999999999", s, 0));
	}
	r = artifacts_range(s, len, &first, &last);
	check(r >= -1 && r <= 1);
	if (r == 0)
		check(first <= last && last < len);
	if (r == 1)
		check(strncmp(s, "bytes=", 6) == 0);
	free(s);
	return 0;
}
