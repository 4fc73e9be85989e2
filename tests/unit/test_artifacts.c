/* test_artifacts: kiln-api's own links to logs carried inline in a task's
 * manifest (api/http/artifacts.c): what artifacts_sign puts in the answer, that
 * its signature verifies for exactly the task, artifact and expiry it was
 * made for, the path split, and Range parsing (RFC 9110 single ranges). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "artifacts.h"

/* The query value named q of url ("" when absent). */
static void query(const char *url, const char *q, char *out, size_t size)
{
	char pat[32];
	const char *p;

	snprintf(pat, sizeof(pat), "%s=", q);
	p = strstr(url, pat);
	out[0] = '\0';
	if (p)
		snprintf(out, size, "%.*s", (int)strcspn(p + strlen(pat), "&"), p + strlen(pat));
}

static void sign_and_verify(void **state)
{
	unsigned char key[32], other[32];
	char expires[32], sig[80], id[80], name[ARTIFACT_NAME_MAX];
	json_t *t = json_pack("{s:s, s:{s:{s:n, s:s, s:i, s:s}, s:{s:s}}}", "id", "t_1", "artifacts", "stdout.log",
			      "s3_key", "inline", "MQo=", "size", 2, "sha256", "x", "manifest.json", "s3_key",
			      "acme/t_1/manifest.json");
	json_t *a = json_object_get(json_object_get(t, "artifacts"), "stdout.log");
	const char *url;

	(void)state;
	artifacts_key("secret", key);
	artifacts_key("secret2", other);
	artifacts_sign(t, "http://api:8080", key, 60, 1000);
	/* The bytes leave the answer; a flag and a url take their place. */
	assert_true(json_is_true(json_object_get(a, "inline")));
	url = json_string_value(json_object_get(a, "url"));
	assert_non_null(url);
	assert_true(!strncmp(url, "http://api:8080/v1/tasks/t_1/artifacts/stdout.log?", 50));
	/* An S3 artifact is left to presign. */
	assert_null(json_object_get(json_object_get(json_object_get(t, "artifacts"), "manifest.json"), "url"));
	query(url, "expires", expires, sizeof(expires));
	query(url, "sig", sig, sizeof(sig));
	assert_string_equal(expires, "1060");
	assert_int_equal(strlen(sig), 64);
	assert_true(artifacts_path("/v1/tasks/t_1/artifacts/stdout.log", id, sizeof(id), name));
	assert_string_equal(id, "t_1");
	assert_string_equal(name, "stdout.log");
	assert_true(artifacts_sig_ok(key, "t_1", "stdout.log", expires, sig, 1000));
	assert_true(artifacts_sig_ok(key, "t_1", "stdout.log", expires, sig, 1060));
	assert_false(artifacts_sig_ok(key, "t_1", "stdout.log", expires, sig, 1061)); /* expired */
	assert_false(artifacts_sig_ok(key, "t_2", "stdout.log", expires, sig, 1000)); /* another task */
	assert_false(artifacts_sig_ok(key, "t_1", "stderr.log", expires, sig, 1000)); /* another log */
	assert_false(artifacts_sig_ok(key, "t_1", "stdout.log", "1061", sig, 1000));  /* a longer life */
	assert_false(artifacts_sig_ok(other, "t_1", "stdout.log", expires, sig, 1000)); /* another key */
	assert_false(artifacts_sig_ok(key, "t_1", "stdout.log", NULL, sig, 1000));
	assert_false(artifacts_sig_ok(key, "t_1", "stdout.log", "-5", sig, 0));
	assert_false(artifacts_sig_ok(key, "t_1", "stdout.log", "1060x", sig, 1000));
	sig[0] = sig[0] == '0' ? '1' : '0';
	assert_false(artifacts_sig_ok(key, "t_1", "stdout.log", expires, sig, 1000));
	assert_false(artifacts_sig_ok(key, "t_1", "stdout.log", expires, "", 1000));
	json_decref(t);

	/* No key or no base: no link, but no bytes either. */
	t = json_pack("{s:s, s:{s:{s:s}}}", "id", "t_1", "artifacts", "stderr.log", "inline", "");
	artifacts_sign(t, NULL, key, 60, 1000);
	a = json_object_get(json_object_get(t, "artifacts"), "stderr.log");
	assert_true(json_is_true(json_object_get(a, "inline")));
	assert_true(json_is_null(json_object_get(a, "url")));
	json_decref(t);
}

static void paths(void **state)
{
	static const char *const bad[] = {
		"/v1/tasks/t_1/artifacts/",        "/v1/tasks//artifacts/stdout.log", "/v1/tasks/t_1/artifacts/a/b",
		"/v1/tasks/t_1/outputs/stdout.log", "/v1/tasks/t 1/artifacts/x",      "/v1/task/t_1/artifacts/x",
		"/v1/tasks/t_1/artifacts/a%2fb",   "/v1/tasks/t_1",                   "",
		"/v1/tasks/t_1/artifacts/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
	};
	char id[8], name[ARTIFACT_NAME_MAX];

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (artifacts_path(bad[i], id, sizeof(id), name))
			fail_msg("accepted %s", bad[i]);
	assert_false(artifacts_path("/v1/tasks/t_12345678/artifacts/x", id, sizeof(id), name)); /* id too long */
	assert_true(artifacts_path("/v1/tasks/t_1234/artifacts/x", id, sizeof(id), name));
}

static void expect_range(const char *h, size_t len, int want, size_t first, size_t last)
{
	size_t a = 99, b = 99;
	int r = artifacts_range(h, len, &a, &b);

	if (r != want || (r == 0 && (a != first || b != last)))
		fail_msg("range \"%s\" of %zu: %d [%zu, %zu], want %d [%zu, %zu]", h ? h : "(null)", len, r, a, b, want,
			 first, last);
}

static void ranges(void **state)
{
	(void)state;
	expect_range("bytes=0-9", 100, 0, 0, 9);
	expect_range("bytes=10-", 100, 0, 10, 99);
	expect_range("bytes=90-200", 100, 0, 90, 99); /* clipped to the end */
	expect_range("bytes=-5", 100, 0, 95, 99);
	expect_range("bytes=-500", 100, 0, 0, 99);
	expect_range("bytes=100-", 100, 1, 0, 0); /* starts past the end */
	expect_range("bytes=0-", 0, 1, 0, 0);
	expect_range("bytes=-0", 100, 1, 0, 0);
	expect_range("bytes=-3", 0, 1, 0, 0);
	expect_range(NULL, 100, -1, 0, 0);
	expect_range("bytes=5-2", 100, -1, 0, 0);
	expect_range("bytes=0-1,3-4", 100, -1, 0, 0);
	expect_range("bytes=-", 100, -1, 0, 0);
	expect_range("items=0-1", 100, -1, 0, 0);
	expect_range("bytes=99999999999999999999-", 100, -1, 0, 0);
	expect_range("bytes= 1-2", 100, -1, 0, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(sign_and_verify),
		cmocka_unit_test(paths),
		cmocka_unit_test(ranges),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
