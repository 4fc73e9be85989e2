/* test_connect_call: unit tests for lib/connect_call.c: envd's methods and
 * their kinds (by name and by path), the Content-Type parser (case, spaces,
 * parameters, quoted strings, charset, malformed values) and the check that
 * kiln-api's relay and kiln-host both apply (the right codec for the kind,
 * 415's message). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "connect_call.h"

static void test_kinds(void **state)
{
	static const char *const streams[][2] = {
		{ "process.Process", "Start" },
		{ "process.Process", "Connect" },
		{ "filesystem.Filesystem", "WatchDir" },
	};
	static const char *const unary[][2] = {
		{ "process.Process", "List" },          { "process.Process", "SendInput" },
		{ "process.Process", "SendSignal" },    { "process.Process", "CloseStdin" },
		{ "process.Process", "Update" },        { "filesystem.Filesystem", "Stat" },
		{ "filesystem.Filesystem", "ListDir" }, { "filesystem.Filesystem", "MakeDir" },
		{ "filesystem.Filesystem", "Move" },    { "filesystem.Filesystem", "Remove" },
		{ "filesystem.Filesystem", "CreateWatcher" },
	};

	for (size_t i = 0; i < sizeof(streams) / sizeof(streams[0]); i++) {
		assert_int_equal(connect_call_kind(streams[i][0], streams[i][1]), CONNECT_KIND_SERVER_STREAM);
		assert_true(connect_kind_streams(connect_call_kind(streams[i][0], streams[i][1])));
	}
	for (size_t i = 0; i < sizeof(unary) / sizeof(unary[0]); i++) {
		assert_int_equal(connect_call_kind(unary[i][0], unary[i][1]), CONNECT_KIND_UNARY);
		assert_false(connect_kind_streams(CONNECT_KIND_UNARY));
	}
	assert_int_equal(connect_call_kind("process.Process", "StreamInput"), CONNECT_KIND_CLIENT_STREAM);
	assert_true(connect_kind_streams(CONNECT_KIND_CLIENT_STREAM));
	/* Names are exact: Connect's paths are case-sensitive. */
	assert_int_equal(connect_call_kind("process.Process", "start"), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind("Process.process", "Start"), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind("filesystem.Filesystem", "Start"), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind("process.Process", ""), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind(NULL, "Start"), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind("process.Process", NULL), CONNECT_KIND_NONE);
	assert_false(connect_kind_streams(CONNECT_KIND_NONE));

	assert_int_equal(connect_call_kind_path("/process.Process/Start"), CONNECT_KIND_SERVER_STREAM);
	assert_int_equal(connect_call_kind_path("/filesystem.Filesystem/Stat"), CONNECT_KIND_UNARY);
	assert_int_equal(connect_call_kind_path("/process.Process/Start/"), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind_path("/process.Process/Start/x"), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind_path("process.Process/Start"), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind_path("//Start"), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind_path("/process.Process"), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind_path("/process.Process/"), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind_path("/process.Process/Li st"), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind_path("/a-service-name-longer-than-any-in-the-table/Start"), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind_path(""), CONNECT_KIND_NONE);
	assert_int_equal(connect_call_kind_path(NULL), CONNECT_KIND_NONE);
}

static void test_media(void **state)
{
	static const struct {
		const char *ct;
		enum connect_media want;
	} cases[] = {
		{ "application/json", CONNECT_MEDIA_JSON },
		{ "Application/JSON", CONNECT_MEDIA_JSON },
		{ "application/json; charset=utf-8", CONNECT_MEDIA_JSON },
		{ "application/json;charset=UTF-8", CONNECT_MEDIA_JSON },
		{ "application/json ; charset=\"utf-8\"", CONNECT_MEDIA_JSON },
		{ " application/json ", CONNECT_MEDIA_JSON },
		{ "application/json;", CONNECT_MEDIA_JSON },
		{ "application/json;;x=1", CONNECT_MEDIA_JSON },
		{ "application/json; x=\"a;b\\\"c\"", CONNECT_MEDIA_JSON },
		{ "application/proto", CONNECT_MEDIA_PROTO },
		{ "application/connect+json", CONNECT_MEDIA_STREAM_JSON },
		{ "Application/connect+json", CONNECT_MEDIA_STREAM_JSON },
		{ "APPLICATION/CONNECT+JSON", CONNECT_MEDIA_STREAM_JSON },
		{ "application/Connect+Json; charset=utf-8", CONNECT_MEDIA_STREAM_JSON },
		{ "application/connect+proto", CONNECT_MEDIA_STREAM_PROTO },
		/* a charset Connect's JSON is not in */
		{ "application/json; charset=latin1", CONNECT_MEDIA_OTHER },
		{ "application/json; charset=\"utf-8-and-then-some-more\"", CONNECT_MEDIA_OTHER },
		{ "application/json; charset=utf-8; charset=utf-16", CONNECT_MEDIA_OTHER },
		/* near misses are other types, not prefixes of Connect's */
		{ "application/jsonx", CONNECT_MEDIA_OTHER },
		{ "application/connect+jsonx", CONNECT_MEDIA_OTHER },
		{ "application/connect+", CONNECT_MEDIA_OTHER },
		{ "application/connect", CONNECT_MEDIA_OTHER },
		{ "text/plain", CONNECT_MEDIA_OTHER },
		{ "applications/json", CONNECT_MEDIA_OTHER },
		{ "multipart/form-data; boundary=x", CONNECT_MEDIA_OTHER },
		/* not media types */
		{ "", CONNECT_MEDIA_INVALID },
		{ "   ", CONNECT_MEDIA_INVALID },
		{ "application", CONNECT_MEDIA_INVALID },
		{ "application/", CONNECT_MEDIA_INVALID },
		{ "/json", CONNECT_MEDIA_INVALID },
		{ "application/json x", CONNECT_MEDIA_INVALID },
		{ "application/connect+json, application/json", CONNECT_MEDIA_INVALID },
		{ "application/json; charset", CONNECT_MEDIA_INVALID },
		{ "application/json; charset=", CONNECT_MEDIA_INVALID },
		{ "application/json; =utf-8", CONNECT_MEDIA_INVALID },
		{ "application/json; charset=\"utf-8", CONNECT_MEDIA_INVALID },
		{ "application/json; x=\"a\\", CONNECT_MEDIA_INVALID },
		{ "application/json; x=\"\x01\"", CONNECT_MEDIA_INVALID },
		{ "application/json; x=a b", CONNECT_MEDIA_INVALID },
		{ "application/json\r\n", CONNECT_MEDIA_INVALID },
		{ "application/js\xc3\xb6n", CONNECT_MEDIA_INVALID },
		{ NULL, CONNECT_MEDIA_INVALID },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		if (connect_call_media(cases[i].ct) != cases[i].want)
			fail_msg("\"%s\": %d, want %d", cases[i].ct ? cases[i].ct : "(null)",
				 connect_call_media(cases[i].ct), cases[i].want);
}

static void test_check(void **state)
{
	char why[200];
	char longct[300];

	assert_string_equal(connect_call_media_want(CONNECT_KIND_UNARY), "application/json");
	assert_string_equal(connect_call_media_want(CONNECT_KIND_SERVER_STREAM), "application/connect+json");
	assert_string_equal(connect_call_media_want(CONNECT_KIND_CLIENT_STREAM), "application/connect+json");
	assert_null(connect_call_media_want(CONNECT_KIND_NONE));

	assert_int_equal(connect_call_check_media(CONNECT_KIND_SERVER_STREAM, "Application/connect+json", why, sizeof(why)), 0);
	assert_int_equal(connect_call_check_media(CONNECT_KIND_UNARY, "application/JSON; charset=utf-8", why, sizeof(why)), 0);
	/* the other kind's type, both ways */
	assert_int_equal(connect_call_check_media(CONNECT_KIND_SERVER_STREAM, "application/json", why, sizeof(why)), -1);
	assert_non_null(strstr(why, "is for unary calls; this method is streaming: send application/connect+json"));
	assert_int_equal(connect_call_check_media(CONNECT_KIND_UNARY, "application/connect+json", why, sizeof(why)), -1);
	assert_non_null(strstr(why, "is for streaming calls; this method is unary: send application/json"));
	assert_int_equal(connect_call_check_media(CONNECT_KIND_UNARY, "application/connect+proto", why, sizeof(why)), -1);
	assert_non_null(strstr(why, "is for streaming calls"));
	/* the binary codec of the right kind */
	assert_int_equal(connect_call_check_media(CONNECT_KIND_SERVER_STREAM, "application/connect+proto", why, sizeof(why)), -1);
	assert_non_null(strstr(why, "JSON codec only"));
	assert_int_equal(connect_call_check_media(CONNECT_KIND_UNARY, "application/proto", why, sizeof(why)), -1);
	assert_non_null(strstr(why, "JSON codec only: send application/json"));
	/* none, another, not one */
	assert_int_equal(connect_call_check_media(CONNECT_KIND_UNARY, NULL, why, sizeof(why)), -1);
	assert_string_equal(why, "no Content-Type: a unary method takes application/json");
	assert_int_equal(connect_call_check_media(CONNECT_KIND_CLIENT_STREAM, "text/plain", why, sizeof(why)), -1);
	assert_string_equal(why, "Content-Type \"text/plain\" is not Connect's: a streaming method takes application/connect+json");
	assert_int_equal(connect_call_check_media(CONNECT_KIND_UNARY, "json", why, sizeof(why)), -1);
	assert_non_null(strstr(why, "is not a media type"));
	assert_int_equal(connect_call_check_media(CONNECT_KIND_NONE, "application/json", why, sizeof(why)), -1);
	assert_string_equal(why, "no such method");
	/* The header in the message: 60 bytes at most, printable, no quote. */
	memset(longct, 'a', sizeof(longct) - 1);
	longct[sizeof(longct) - 1] = '\0';
	longct[3] = '"';
	longct[4] = '\x01';
	assert_int_equal(connect_call_check_media(CONNECT_KIND_UNARY, longct, why, sizeof(why)), -1);
	assert_non_null(strstr(why, "\"aaa??aaaa"));
	assert_non_null(strstr(why, "a...\" is not a media type"));
	assert_true(strlen(why) < 140);
	/* A small buffer is cut, not overrun. */
	assert_int_equal(connect_call_check_media(CONNECT_KIND_UNARY, "text/plain", why, 8), -1);
	assert_int_equal(strlen(why), 7);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kinds),
		cmocka_unit_test(test_media),
		cmocka_unit_test(test_check),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
