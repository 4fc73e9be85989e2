/* test_destination: customers' own S3 destinations: lib/dest.c's
 * validation (endpoint, bucket, prefix, region, credentials, unknown
 * fields), api/base/destination.c's sealing (AES-256-GCM round trip, a fresh
 * nonce per seal, a wrong key, another customer's AAD and a flipped bit all
 * refused, nothing of the plaintext in the sealed bytes), the key file's
 * format, and the store's destination rows (same place keeps the id). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dest.h"
#include "destination.h"
#include "quota.h"
#include "store.h"

#define OK_BODY(extra)                                                                                    \
	"{\"endpoint\":\"http://127.0.0.1:8080\",\"bucket\":\"acme-out\",\"prefix\":\"runs/\","         \
	"\"access_key\":\"AKIAEXAMPLE\",\"secret_key\":\"s3cr3t/Key+x\"" extra "}"

static void expect_refused(const char *body, const char *field)
{
	struct kiln_err err = { .code = "" };
	struct dest d;
	char want[80];

	if (dest_parse(body, strlen(body), DEST_SECRET_REQUIRED, &d, &err) == 0)
		fail_msg("accepted: %s", body);
	snprintf(want, sizeof(want), "%s", field);
	if (strncmp(err.message, want, strlen(want)))
		fail_msg("%s: message \"%s\" does not start with \"%s\"", body, err.message, want);
	/* Nothing is left of a refused destination, the secret least of all. */
	assert_string_equal(d.secret_key, "");
}

static void test_dest_valid(void **state)
{
	struct kiln_err err = { .code = "" };
	struct dest d;
	struct s3_config c;
	json_t *j;
	char m[DEST_ACCESS_MAX + 1];

	(void)state;
	assert_int_equal(dest_parse(OK_BODY(""), strlen(OK_BODY("")), DEST_SECRET_REQUIRED, &d, &err), 0);
	assert_string_equal(d.region, "us-east-1");
	assert_string_equal(d.prefix, "runs/");
	dest_s3_config(&d, NULL, &c);
	assert_string_equal(c.bucket, "acme-out");
	assert_string_equal(c.secret_key, "s3cr3t/Key+x");
	j = dest_to_json(&d, 0);
	assert_null(json_object_get(j, "secret_key"));
	json_decref(j);
	j = dest_to_json(&d, 1);
	assert_string_equal(json_string_value(json_object_get(j, "secret_key")), "s3cr3t/Key+x");
	json_decref(j);
	dest_mask_access(d.access_key, m, sizeof(m));
	assert_string_equal(m, "AKIA*******");
	dest_mask_access("short", m, sizeof(m));
	assert_string_equal(m, "*****");
	/* A trailing '/' of the endpoint goes; https, ports, IPv6, no prefix. */
	{
		const char *b = "{\"endpoint\":\"https://[::1]:9000/\",\"bucket\":\"a.b-c\",\"access_key\":\"k\","
				"\"secret_key\":\"s\",\"region\":\"eu-west-3\"}";

		assert_int_equal(dest_parse(b, strlen(b), DEST_SECRET_REQUIRED, &d, &err), 0);
		assert_string_equal(d.endpoint, "https://[::1]:9000");
		assert_string_equal(d.prefix, "");
	}
	/* The stored form has no secret, and refuses one. */
	{
		const char *b = "{\"endpoint\":\"http://s3\",\"bucket\":\"abc\",\"access_key\":\"k\"}";

		assert_int_equal(dest_parse(b, strlen(b), DEST_SECRET_NONE, &d, &err), 0);
		expect_refused(b, "secret_key: required");
		assert_int_not_equal(dest_parse(OK_BODY(""), strlen(OK_BODY("")), DEST_SECRET_NONE, &d, &err), 0);
	}
	dest_wipe(&d);
	assert_string_equal(d.secret_key, "");
}

/* The good body with field set to value (NULL: removed), as text. */
static char *body_with(const char *field, const char *value)
{
	json_t *j = json_loads(OK_BODY(""), 0, NULL);
	char *t;

	if (value)
		json_object_set_new(j, field, json_string(value));
	else
		json_object_del(j, field);
	t = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	return t;
}

static void refused_with(const char *field, const char *value, const char *why)
{
	char *b = body_with(field, value);

	expect_refused(b, why);
	free(b);
}

static void test_dest_refused(void **state)
{
	static const char *const bad_endpoints[] = {
		"ftp://h", "http://h/p", "http://u@h", "http://h:0", "http://h:65536", "http://h?x", "http://",
		"http://h:", "http://[zz]:1", "http://[]", "http://h h", "HTTP://h", "http://h#f", "",
	};
	static const char *const bad_buckets[] = {
		"ab", "Abc", "a..b", "-abc", "abc-", "a_b", "192.168.1.1", "a.-b", "a-.b",
		"a123456789012345678901234567890123456789012345678901234567890123",
	};
	static const char *const bad_prefixes[] = { "runs", "/runs/", "a//", "./", "a/../", "a/./", "a\\b/", "a\tb/" };

	(void)state;
	expect_refused("[]", "destination: expected a JSON object");
	expect_refused("{", "line");
	expect_refused(OK_BODY(",\"acl\":\"x\""), "acl: unknown field");
	expect_refused(OK_BODY(",\"bucket\":\"x\""), "line"); /* a duplicate key */
	expect_refused("{\"endpoint\":1}", "endpoint: expected a string");
	for (size_t i = 0; i < sizeof(bad_endpoints) / sizeof(*bad_endpoints); i++)
		refused_with("endpoint", bad_endpoints[i], "endpoint:");
	for (size_t i = 0; i < sizeof(bad_buckets) / sizeof(*bad_buckets); i++)
		refused_with("bucket", bad_buckets[i], "bucket:");
	for (size_t i = 0; i < sizeof(bad_prefixes) / sizeof(*bad_prefixes); i++)
		refused_with("prefix", bad_prefixes[i], "prefix:");
	refused_with("region", "us east", "region:");
	refused_with("region", "US-EAST-1", "region:");
	refused_with("access_key", "a b", "access_key:");
	refused_with("access_key", NULL, "access_key: required");
	refused_with("secret_key", "", "secret_key: required");
	refused_with("secret_key", "tab\there", "secret_key:");
	refused_with("bucket", NULL, "bucket: required");
	{
		char big[400];

		memset(big, 'a', sizeof(big) - 1);
		big[sizeof(big) - 1] = '\0';
		refused_with("secret_key", big, "secret_key: too long");
	}
	expect_refused("{\"endpoint\":\"http://h\\u0000x\",\"bucket\":\"abc\",\"access_key\":\"k\",\"secret_key\":\"s\"}",
		       "line"); /* jansson refuses \\u0000 without JSON_ALLOW_NUL */
}

static const unsigned char key1[32] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
					17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32 };

static void test_seal(void **state)
{
	struct kiln_err err = { .code = "" };
	unsigned char a[DESTINATION_SEALED_MAX], b[DESTINATION_SEALED_MAX], key2[32];
	size_t alen = 0, blen = 0;
	char out[DEST_SECRET_MAX + 1];
	const char *secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

	(void)state;
	assert_int_equal(destination_seal(key1, "acme", secret, a, &alen, &err), 0);
	assert_int_equal(alen, strlen(secret) + DESTINATION_SEAL_OVERHEAD);
	assert_null(memmem(a, alen, secret, strlen(secret)));
	assert_null(memmem(a, alen, "EXAMPLE", 7));
	assert_int_equal(destination_open(key1, "acme", a, alen, out, &err), 0);
	assert_string_equal(out, secret);
	/* A fresh nonce per seal: the same secret seals differently. */
	assert_int_equal(destination_seal(key1, "acme", secret, b, &blen, &err), 0);
	assert_int_equal(alen, blen);
	assert_memory_not_equal(a + 1, b + 1, 12);
	assert_memory_not_equal(a, b, alen);
	/* Another customer's row (AAD), another key, a flipped bit anywhere,
	 * a cut or an unknown version: refused, the output left empty. */
	assert_int_equal(destination_open(key1, "acme2", a, alen, out, &err), -1);
	assert_string_equal(err.code, "destination_unavailable");
	assert_string_equal(out, "");
	memcpy(key2, key1, 32);
	key2[31] ^= 1;
	assert_int_equal(destination_open(key2, "acme", a, alen, out, &err), -1);
	for (size_t i = 0; i < alen; i++) {
		memcpy(b, a, alen);
		b[i] ^= 0x10;
		if (destination_open(key1, "acme", b, alen, out, &err) == 0)
			fail_msg("a flipped bit at byte %zu of %zu was not noticed", i, alen);
		assert_string_equal(out, "");
	}
	assert_int_equal(destination_open(key1, "acme", a, alen - 1, out, &err), -1);
	assert_int_equal(destination_open(key1, "acme", a, 10, out, &err), -1);
	/* The longest secret fits. */
	{
		char big[DEST_SECRET_MAX + 1];

		memset(big, 'k', DEST_SECRET_MAX);
		big[DEST_SECRET_MAX] = '\0';
		assert_int_equal(destination_seal(key1, "acme", big, a, &alen, &err), 0);
		assert_true(alen <= DESTINATION_SEALED_MAX && alen <= STORE_DEST_SEALED_MAX);
		assert_int_equal(destination_open(key1, "acme", a, alen, out, &err), 0);
		assert_string_equal(out, big);
	}
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_key_file(void **state)
{
	struct kiln_err err = { .code = "" };
	unsigned char key[32];
	char path[] = "/tmp/kiln-test-destkey-XXXXXX";
	int fd = mkstemp(path);

	(void)state;
	assert_true(fd >= 0);
	close(fd);
	write_file(path, "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20\n");
	assert_int_equal(destination_key_load(path, key, &err), 0);
	assert_memory_equal(key, key1, 32);
	write_file(path, "0102030405060708090A0B0C0D0E0F101112131415161718191A1B1C1D1E1F20");
	assert_int_equal(destination_key_load(path, key, &err), 0);
	assert_memory_equal(key, key1, 32);
	write_file(path, "0102");
	assert_int_equal(destination_key_load(path, key, &err), -1);
	assert_string_equal(err.code, "config");
	write_file(path, "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20\nextra");
	assert_int_equal(destination_key_load(path, key, &err), -1);
	write_file(path, "zz02030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20\n");
	assert_int_equal(destination_key_load(path, key, &err), -1);
	unlink(path);
	assert_int_equal(destination_key_load(path, key, &err), -1);
	assert_non_null(strstr(err.message, path));
}

static void test_store_dest(void **state)
{
	struct kiln_err err = { .code = "" };
	struct store *st;
	struct store_dest sd;
	struct quota q;
	struct dest d, d2;
	unsigned char sealed[DESTINATION_SEALED_MAX];
	size_t n = 0;
	char id1[40], id2[40], id3[40], out[DEST_SECRET_MAX + 1];
	int same = -1;

	(void)state;
	st = store_open(":memory:", &err);
	assert_non_null(st);
	quota_defaults(&q);
	assert_int_equal(store_customer_create(st, "acme", "Acme", &q, &err), 0);
	assert_int_equal(dest_parse(OK_BODY(""), strlen(OK_BODY("")), DEST_SECRET_REQUIRED, &d, &err), 0);
	assert_int_equal(store_dest_get(st, "acme", &sd), 0);
	assert_int_equal(store_dest_put(st, "nobody", &d, sealed, 0, id1, NULL, &err), -1);
	assert_int_equal(destination_seal(key1, "acme", d.secret_key, sealed, &n, &err), 0);
	assert_int_equal(store_dest_put(st, "acme", &d, sealed, n, id1, &same, &err), 0);
	assert_int_equal(same, 0);
	assert_int_equal(strncmp(id1, "dst_", 4), 0);
	assert_int_equal(store_dest_get(st, "acme", &sd), 1);
	assert_string_equal(sd.id, id1);
	assert_string_equal(sd.d.secret_key, ""); /* never stored in the clear */
	assert_int_equal(destination_open(key1, "acme", sd.sealed, sd.sealed_len, out, &err), 0);
	assert_string_equal(out, "s3cr3t/Key+x");
	assert_int_equal(destination_load(st, key1, "acme", &d2, id3, &err), 1);
	assert_string_equal(d2.secret_key, "s3cr3t/Key+x");
	assert_string_equal(id3, id1);
	assert_int_equal(destination_load(st, NULL, "acme", &d2, id3, &err), -1);
	assert_string_equal(err.code, "destination_unavailable");
	assert_int_equal(destination_load(st, key1, "other", &d2, id3, &err), 0);
	/* New credentials, same place: the same id; another bucket: a new one. */
	snprintf(d.access_key, sizeof(d.access_key), "AK2");
	assert_int_equal(store_dest_put(st, "acme", &d, sealed, n, id2, &same, &err), 0);
	assert_int_equal(same, 1);
	assert_string_equal(id2, id1);
	snprintf(d.bucket, sizeof(d.bucket), "other-bucket");
	assert_int_equal(store_dest_put(st, "acme", &d, sealed, n, id2, &same, &err), 0);
	assert_int_equal(same, 0);
	assert_string_not_equal(id2, id1);
	assert_int_equal(store_dest_delete(st, "acme"), 1);
	assert_int_equal(store_dest_delete(st, "acme"), 0);
	assert_int_equal(store_dest_get(st, "acme", &sd), 0);
	store_close(st);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dest_valid), cmocka_unit_test(test_dest_refused), cmocka_unit_test(test_seal),
		cmocka_unit_test(test_key_file), cmocka_unit_test(test_store_dest),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
