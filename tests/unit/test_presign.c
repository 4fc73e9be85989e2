/* test_presign: kiln-api signs S3 keys a host reports only under the task's
 * or session's own prefix (api/base/presign.c, lib/s3.c s3_key_under): fake host
 * reports naming another customer's objects, dot segments, a leading '/',
 * percent-encoded ways out, get no URL and a reason; honest ones get one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "presign.h"
#include "s3.h"

static const struct s3_config cfg = {
	.endpoint = "http://127.0.0.1:9000",
	.region = "us-east-1",
	.bucket = "kiln",
	.access_key = "AK",
	.secret_key = "SK",
};

static void expect_under(const char *key, const char *prefix, int want)
{
	struct kiln_err err = { .code = "" };
	int r = s3_key_under(key, prefix, &err);

	if (r != want)
		fail_msg("s3_key_under(\"%s\", \"%s\") = %d, want %d (%s)", key, prefix, r, want, err.message);
	if (r < 0)
		assert_string_equal(err.code, "s3_key_outside");
}

static void test_key_under(void **state)
{
	(void)state;
	expect_under("acme/t_1/outputs/a.txt", "acme/t_1/", 0);
	expect_under("acme/t_1/stdout.log", "acme/t_1/", 0);
	expect_under("acme/t_1/outputs/100%25 sure.txt", "acme/t_1/", 0); /* a '%' of its own is fine */
	expect_under("acme/t_1/outputs/a%20b", "acme/t_1/", 0);
	/* Another customer's, another task's, the prefix alone, no prefix. */
	expect_under("beta/sessions/s_9/state", "acme/t_1/", -1);
	expect_under("acme/t_2/outputs/a", "acme/t_1/", -1);
	expect_under("acme/t_10/outputs/a", "acme/t_1", -1); /* a prefix must end in '/' */
	expect_under("acme/t_1/", "acme/t_1/", -1);
	expect_under("acme/t_1/x", "", -1);
	expect_under("acme/t_1/x", NULL, -1);
	expect_under(NULL, "acme/t_1/", -1);
	expect_under("", "acme/t_1/", -1);
	/* Ways out of the prefix. */
	expect_under("acme/t_1/../../beta/sessions/s_9/state", "acme/t_1/", -1);
	expect_under("acme/t_1/./x", "acme/t_1/", -1);
	expect_under("acme/t_1//x", "acme/t_1/", -1);
	expect_under("/acme/t_1/x", "acme/t_1/", -1);
	expect_under("acme/t_1/x\n", "acme/t_1/", -1);
	expect_under("acme/t_1/%2e%2e/%2E%2E/beta/sessions/s_9/state", "acme/t_1/", -1);
	expect_under("acme/t_1/%2e/x", "acme/t_1/", -1);
	expect_under("acme/t_1/%2fx", "acme/t_1/", -1);  /* decodes to an empty segment */
	expect_under("acme%2ft_1/x", "acme/t_1/", -1);   /* not under it as written */
	expect_under("acme/t_1/a%00b", "acme/t_1/", -1); /* NUL once decoded */
	expect_under("acme/t_1/a%0ab", "acme/t_1/", -1); /* a control character once decoded */
}

/* The task as kiln-api's store returns it, with outputs and artifacts as a
 * (lying) host reported them. */
static json_t *fake_task(void)
{
	return json_pack("{s:s, s:s, s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}, {s:s}], s:{s:{s:s}, s:{s:s}}}", "id", "t_1",
			 "customer", "acme", "outputs", "path", "ok.txt", "s3_key", "acme/t_1/outputs/ok.txt", "path",
			 "ram", "s3_key", "beta/sessions/s_9/state", "path", "up", "s3_key",
			 "acme/t_1/outputs/%2e%2e/%2e%2e/beta/sessions/s_9/state", "path", "skipped", "artifacts",
			 "stdout.log", "s3_key", "acme/t_1/stdout.log", "stderr.log", "s3_key",
			 "acme/t_1/../../beta/sessions/s_9/disk.qcow2");
}

static void expect_signed(json_t *o, const char *key_in_url)
{
	const char *url = json_string_value(json_object_get(o, "url"));

	assert_non_null(url);
	assert_non_null(strstr(url, key_in_url));
	assert_null(json_object_get(o, "url_error"));
}

static void expect_refused(json_t *o)
{
	assert_true(json_is_null(json_object_get(o, "url")));
	assert_non_null(strstr(json_string_value(json_object_get(o, "url_error")) ?: "", "not available"));
}

static void test_presign_task(void **state)
{
	json_t *t = fake_task(), *outs;

	(void)state;
	assert_ptr_equal(presign_task(&cfg, 3600, t, "", 1700000000), t);
	outs = json_object_get(t, "outputs");
	expect_signed(json_array_get(outs, 0), "/kiln/acme/t_1/outputs/ok.txt?");
	expect_refused(json_array_get(outs, 1));
	expect_refused(json_array_get(outs, 2));
	/* No key (the host skipped it): no url, no error of ours. */
	assert_true(json_is_null(json_object_get(json_array_get(outs, 3), "url")));
	assert_null(json_object_get(json_array_get(outs, 3), "url_error"));
	expect_signed(json_object_get(json_object_get(t, "artifacts"), "stdout.log"), "/kiln/acme/t_1/stdout.log?");
	expect_refused(json_object_get(json_object_get(t, "artifacts"), "stderr.log"));
	/* Signed again (every GET): the answer is the same, no stale reason. */
	presign_task(&cfg, 3600, t, "", 1700000100);
	expect_signed(json_array_get(outs, 0), "/kiln/acme/t_1/outputs/ok.txt?");
	expect_refused(json_array_get(outs, 1));
	json_decref(t);
}

static void test_presign_task_without_owner(void **state)
{
	json_t *t = json_pack("{s:s, s:[{s:s}]}", "id", "t_1", "outputs", "s3_key", "acme/t_1/outputs/ok.txt");

	(void)state;
	presign_task(&cfg, 3600, t, "", 1700000000);
	expect_refused(json_array_get(json_object_get(t, "outputs"), 0));
	json_decref(t);
}

static void test_presign_no_s3(void **state)
{
	struct s3_config none = { 0 };
	json_t *t = fake_task();

	(void)state;
	presign_task(&none, 3600, t, "", 1700000000);
	assert_true(json_is_null(json_object_get(json_array_get(json_object_get(t, "outputs"), 0), "url")));
	assert_true(json_is_null(json_object_get(json_array_get(json_object_get(t, "outputs"), 1), "url")));
	json_decref(t);
}

static void test_presign_session_outputs(void **state)
{
	json_t *r = json_pack("{s:[{s:s}, {s:s}, {s:s}, {s:s}]}", "outputs", "s3_key", "acme/sessions/s_1/outputs/a.txt",
			      "s3_key", "acme/sessions/s_1/state", "s3_key", "beta/sessions/s_9/outputs/a.txt", "s3_key",
			      "acme/sessions/s_1/outputs/%2E%2E/state");
	json_t *outs = json_object_get(r, "outputs");

	(void)state;
	presign_session_outputs(&cfg, 3600, r, "", "acme", "s_1", 1700000000);
	expect_signed(json_array_get(outs, 0), "/kiln/acme/sessions/s_1/outputs/a.txt?");
	expect_refused(json_array_get(outs, 1)); /* its own RAM: not an output */
	expect_refused(json_array_get(outs, 2));
	expect_refused(json_array_get(outs, 3));
	json_decref(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_under),
		cmocka_unit_test(test_presign_task),
		cmocka_unit_test(test_presign_task_without_owner),
		cmocka_unit_test(test_presign_no_s3),
		cmocka_unit_test(test_presign_session_outputs),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
