/* fuzz_dest: libFuzzer target for dest_parse() (a customer's S3
 * destination, from PUT /v1/destination and from kiln-api to a host with a
 * task). Besides memory safety, checks that an accepted destination holds
 * to the rules the uploads and presigning rely on (an http(s) endpoint
 * without path or query, a valid bucket name, a prefix that is "" or ends
 * in '/' with no "." or ".." segment, credentials of printable ASCII), that
 * it round-trips through dest_to_json, that lib/netaddr.c's endpoint split
 * (the host and port a destination's addresses are checked for) takes
 * every endpoint accepted here, and that a refusal leaves nothing of the
 * secret behind and carries a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dest.h"
#include "fuzz.h"
#include "netaddr.h"

static int printable(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f)
			return 0;
	return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kiln_err err = { .code = "" };
	struct dest d, back;
	json_t *j;
	size_t n;

	if (dest_parse((const char *)data, size, DEST_SECRET_REQUIRED, &d, &err) < 0) {
		check(err.code[0] && err.message[0]);
		check(d.secret_key[0] == '\0' && d.endpoint[0] == '\0');
		/* The stored form is stricter still. */
		check(dest_parse((const char *)data, size, DEST_SECRET_NONE, &d, &err) < 0 || !d.secret_key[0]);
		return 0;
	}
	check(!strncmp(d.endpoint, "http://", 7) || !strncmp(d.endpoint, "https://", 8));
	check(!strpbrk(d.endpoint + 8, "/?#@ "));
	n = strlen(d.bucket);
	check(n >= 3 && n <= DEST_BUCKET_MAX && strspn(d.bucket, "abcdefghijklmnopqrstuvwxyz0123456789.-") == n);
	check(!strstr(d.bucket, ".."));
	n = strlen(d.prefix);
	check(n == 0 || (d.prefix[n - 1] == '/' && d.prefix[0] != '/'));
	check(!strstr(d.prefix, "//") && !strstr(d.prefix, "/./") && !strstr(d.prefix, "/../") &&
	      strncmp(d.prefix, "./", 2) && strncmp(d.prefix, "../", 3));
	check(d.region[0] && printable(d.region));
	check(d.access_key[0] && printable(d.access_key) && d.secret_key[0] && printable(d.secret_key));
	/* The address check sees the same host and port a client would. */
	{
		char host[DEST_ENDPOINT_MAX + 1];
		unsigned port = 0;

		check(netaddr_endpoint_split(d.endpoint, host, sizeof(host), &port) == 0);
		check(host[0] && port >= 1 && port <= 65535 && strstr(d.endpoint, host));
	}
	/* A key under the prefix passes the S3 client's own key check. */
	{
		char key[DEST_PREFIX_MAX + 32];

		snprintf(key, sizeof(key), "%sacme/t_1/stdout.log", d.prefix);
		check(s3_key_check(key, NULL) == 0);
	}
	/* What kiln-api sends to a host parses back the same. */
	j = dest_to_json(&d, 1);
	check(j);
	check(dest_from_json(j, DEST_SECRET_REQUIRED, NULL, &back, &err) == 0);
	check(dest_same_place(&d, &back) && !strcmp(d.access_key, back.access_key) &&
	      !strcmp(d.secret_key, back.secret_key));
	json_decref(j);
	j = dest_to_json(&d, 0);
	check(j && !json_object_get(j, "secret_key"));
	json_decref(j);
	dest_wipe(&d);
	return 0;
}
