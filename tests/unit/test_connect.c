/* test_connect: unit tests for lib/connectrpc.c: envelopes (parse in pieces,
 * bounds, flags), end-of-stream and error messages, code <-> HTTP status,
 * Connect-Timeout-Ms, and base64 both ways. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "connectrpc.h"

static void test_envelope(void **state)
{
	struct buf b = BUF_INIT;
	const uint8_t *msg;
	uint8_t flags;
	size_t n, i;
	json_t *j = json_pack("{s:{s:i}}", "event", "pid", 42);

	assert_int_equal(connect_env_append_json(&b, j), 0);
	json_decref(j);
	assert_int_equal((uint8_t)b.p[0], 0);
	assert_int_equal(((uint8_t)b.p[3] << 8) | (uint8_t)b.p[4], b.len - 5);
	/* every prefix needs more bytes */
	for (i = 0; i < b.len; i++)
		assert_int_equal(connect_env_parse((uint8_t *)b.p, i, 1024, &flags, &msg, &n), 0);
	assert_int_equal(connect_env_parse((uint8_t *)b.p, b.len, 1024, &flags, &msg, &n), (ssize_t)b.len);
	assert_int_equal(n, b.len - 5);
	assert_memory_equal(msg, "{\"event\":{\"pid\":42}}", n);
	/* over the bound, bad flags */
	assert_int_equal(connect_env_parse((uint8_t *)b.p, b.len, 5, &flags, &msg, &n), -EMSGSIZE);
	b.p[0] = 0x04;
	assert_int_equal(connect_env_parse((uint8_t *)b.p, b.len, 1024, &flags, &msg, &n), -EPROTO);
	buf_free(&b);

	assert_int_equal(connect_end_append(&b, CONNECT_OK, NULL), 0);
	assert_int_equal(b.len, 7);
	assert_int_equal((uint8_t)b.p[0], CONNECT_FLAG_END);
	assert_memory_equal(b.p + 5, "{}", 2);
	buf_reset(&b);
	assert_int_equal(connect_end_append(&b, CONNECT_DEADLINE_EXCEEDED, "too \"slow\""), 0);
	assert_int_equal(connect_env_parse((uint8_t *)b.p, b.len, 1024, &flags, &msg, &n), (ssize_t)b.len);
	assert_int_equal(flags, CONNECT_FLAG_END);
	j = json_loadb((const char *)msg, n, 0, NULL);
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "deadline_exceeded");
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "message")), "too \"slow\"");
	json_decref(j);
	buf_free(&b);
}

static void test_codes(void **state)
{
	json_t *j;

	assert_string_equal(connect_code_name(CONNECT_NOT_FOUND), "not_found");
	assert_string_equal(connect_code_name(CONNECT_UNAUTHENTICATED), "unauthenticated");
	assert_string_equal(connect_code_name((enum connect_code)99), "unknown");
	assert_int_equal(connect_code_status(CONNECT_NOT_FOUND), 404);
	assert_int_equal(connect_code_status(CONNECT_UNAUTHENTICATED), 401);
	assert_int_equal(connect_code_status(CONNECT_DEADLINE_EXCEEDED), 504);
	assert_int_equal(connect_code_status(CONNECT_UNAVAILABLE), 503);
	assert_int_equal(connect_code_status(CONNECT_ALREADY_EXISTS), 409);
	assert_int_equal(connect_code_status(CONNECT_INTERNAL), 500);
	assert_int_equal(connect_code_from_errno(-ENOENT), CONNECT_NOT_FOUND);
	assert_int_equal(connect_code_from_errno(-EEXIST), CONNECT_ALREADY_EXISTS);
	assert_int_equal(connect_code_from_errno(-EACCES), CONNECT_PERMISSION_DENIED);
	assert_int_equal(connect_code_from_errno(-EISDIR), CONNECT_INVALID_ARGUMENT);
	assert_int_equal(connect_code_from_errno(-EIO), CONNECT_INTERNAL);
	j = connect_error_json(CONNECT_INVALID_ARGUMENT, "bad path");
	assert_string_equal(json_string_value(json_object_get(j, "code")), "invalid_argument");
	json_decref(j);
}

static void test_timeout(void **state)
{
	assert_int_equal(connect_timeout_ms(NULL), 0);
	assert_int_equal(connect_timeout_ms("1500"), 1500);
	assert_int_equal(connect_timeout_ms("9999999999"), 9999999999LL);
	assert_int_equal(connect_timeout_ms("99999999999"), -EINVAL);
	assert_int_equal(connect_timeout_ms(""), -EINVAL);
	assert_int_equal(connect_timeout_ms("-5"), -EINVAL);
	assert_int_equal(connect_timeout_ms("5 "), -EINVAL);
}

static void test_base64(void **state)
{
	static const struct {
		const char *plain, *enc;
	} v[] = { { "", "" }, { "f", "Zg==" }, { "fo", "Zm8=" }, { "foo", "Zm9v" }, { "foob", "Zm9vYg==" },
		  { "fooba", "Zm9vYmE=" }, { "foobar", "Zm9vYmFy" } };
	struct buf b = BUF_INIT;
	uint8_t *out, bin[256];
	size_t n, i;

	for (i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		buf_reset(&b);
		assert_int_equal(connect_b64_append(&b, v[i].plain, strlen(v[i].plain)), 0);
		assert_string_equal(b.p ? b.p : "", v[i].enc);
		assert_int_equal(connect_b64_decode(v[i].enc, 100, &out, &n), 0);
		assert_int_equal(n, strlen(v[i].plain));
		assert_memory_equal(out, v[i].plain, n);
		free(out);
	}
	for (i = 0; i < sizeof(bin); i++)
		bin[i] = (uint8_t)i;
	buf_reset(&b);
	connect_b64_append(&b, bin, sizeof(bin));
	assert_int_equal(connect_b64_decode(b.p, sizeof(bin), &out, &n), 0);
	assert_int_equal(n, sizeof(bin));
	assert_memory_equal(out, bin, n);
	free(out);
	assert_int_equal(connect_b64_decode(b.p, sizeof(bin) - 1, &out, &n), -EMSGSIZE);
	/* unpadded and URL-safe are accepted, as protobuf JSON parsers do */
	assert_int_equal(connect_b64_decode("Zm9vYg", 10, &out, &n), 0);
	assert_int_equal(n, 4);
	free(out);
	assert_int_equal(connect_b64_decode("-_8", 10, &out, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(out[0], 0xfb);
	assert_int_equal(out[1], 0xff);
	free(out);
	assert_int_equal(connect_b64_decode("Zm9v!", 10, &out, &n), -EINVAL);
	assert_int_equal(connect_b64_decode("Z", 10, &out, &n), -EINVAL);
	assert_int_equal(connect_b64_decode("Zm9=", 10, &out, &n), 0); /* 2 bytes, 1 pad */
	free(out);
	assert_int_equal(connect_b64_decode("Zm=", 10, &out, &n), -EINVAL);
	buf_free(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_envelope), cmocka_unit_test(test_codes),
		cmocka_unit_test(test_timeout),  cmocka_unit_test(test_base64),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
