/* Unit tests for the kiln CLI's parsers of untrusted or user-written input:
 * credentials-file lines and output paths named by the server. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "cli.h"
#include "creds.h"

static void test_creds_lines(void **state)
{
	char n[64], v[128];

	assert_int_equal(creds_parse_line("KILN_API=http://127.0.0.1:8080\n", n, sizeof(n), v, sizeof(v)), 1);
	assert_string_equal(n, "KILN_API");
	assert_string_equal(v, "http://127.0.0.1:8080");
	assert_int_equal(creds_parse_line("export KILN_KEY='kiln_a_b'\r\n", n, sizeof(n), v, sizeof(v)), 1);
	assert_string_equal(n, "KILN_KEY");
	assert_string_equal(v, "kiln_a_b");
	assert_int_equal(creds_parse_line("S3_SECRET_KEY=\"x=y\"", n, sizeof(n), v, sizeof(v)), 1);
	assert_string_equal(v, "x=y");
	assert_int_equal(creds_parse_line("EMPTY=", n, sizeof(n), v, sizeof(v)), 1);
	assert_string_equal(v, "");
	assert_int_equal(creds_parse_line("# comment\n", n, sizeof(n), v, sizeof(v)), 0);
	assert_int_equal(creds_parse_line("   \n", n, sizeof(n), v, sizeof(v)), 0);
	assert_int_equal(creds_parse_line("no equals sign", n, sizeof(n), v, sizeof(v)), -1);
	assert_int_equal(creds_parse_line("=value", n, sizeof(n), v, sizeof(v)), -1);
	assert_int_equal(creds_parse_line("BAD NAME=x", n, sizeof(n), v, sizeof(v)), -1);
	/* Too long for the buffers: refused, never truncated silently. */
	{
		char longv[300];

		memset(longv, 'a', sizeof(longv));
		memcpy(longv, "K=", 2);
		longv[sizeof(longv) - 1] = '\0';
		assert_int_equal(creds_parse_line(longv, n, sizeof(n), v, sizeof(v)), -1);
	}
}

static void test_output_paths(void **state)
{
	assert_true(cli_output_path_ok("a.txt"));
	assert_true(cli_output_path_ok("report/sub/squares.csv"));
	assert_true(cli_output_path_ok("..hidden/x"));
	assert_false(cli_output_path_ok(""));
	assert_false(cli_output_path_ok("/etc/passwd"));
	assert_false(cli_output_path_ok("../x"));
	assert_false(cli_output_path_ok("a/../../x"));
	assert_false(cli_output_path_ok("a/.."));
	assert_false(cli_output_path_ok("./a"));
	assert_false(cli_output_path_ok("a//b"));
	assert_false(cli_output_path_ok("a/"));
	assert_false(cli_output_path_ok("a\nb"));
	{
		char big[1100];

		memset(big, 'a', sizeof(big));
		big[sizeof(big) - 1] = '\0';
		assert_false(cli_output_path_ok(big));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_creds_lines),
		cmocka_unit_test(test_output_paths),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
