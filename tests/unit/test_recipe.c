/* test_recipe: recipe_parse (lib/recipe.c): what a good recipe becomes, and
 * that each kind of bad input is refused as invalid_recipe naming its field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe.h"

static void test_full(void **state)
{
	const char *j = "{\"name\":\"data\",\"from\":\"debian\",\"packages\":[\"python3-numpy\",\"jq\"],"
			"\"files\":[{\"path\":\"/etc/x\",\"content_b64\":\"aGk=\",\"mode\":420}],"
			"\"run\":[\"echo done > /etc/built\",\"true\"],\"preload\":[\"numpy\",\"matplotlib.pyplot\"],"
			"\"env\":{\"LANG\":\"C.UTF-8\"},\"workdir\":\"/srv\"}";
	struct kiln_err err;
	struct recipe r;

	(void)state;
	assert_int_equal(recipe_parse(j, strlen(j), &r, &err), 0);
	assert_string_equal(r.name, "data");
	assert_int_equal(r.npackages, 2);
	assert_string_equal(r.packages[1], "jq");
	assert_null(r.packages[2]);
	assert_int_equal(r.nfiles, 1);
	assert_string_equal(r.files[0].path, "/etc/x");
	assert_int_equal(r.files[0].len, 2);
	assert_memory_equal(r.files[0].data, "hi", 2);
	assert_int_equal(r.files[0].mode, 0644);
	assert_int_equal(r.nrun, 2);
	assert_string_equal(r.run[0], "echo done > /etc/built");
	assert_int_equal(r.npreload, 2);
	assert_string_equal(r.preload[1], "matplotlib.pyplot");
	assert_int_equal(r.nenv, 1);
	assert_string_equal(r.env[0], "LANG=C.UTF-8");
	assert_string_equal(r.workdir, "/srv");
	recipe_free(&r);
	recipe_free(&r); /* twice is harmless */
}

static void test_minimal(void **state)
{
	struct kiln_err err;
	struct recipe r;

	(void)state;
	assert_int_equal(recipe_parse("{\"name\":\"a1\"}", 13, &r, &err), 0);
	assert_int_equal(r.npackages + r.nfiles + r.nrun + r.npreload + r.nenv, 0);
	assert_non_null(r.packages);
	assert_non_null(r.env);
	assert_null(r.workdir);
	recipe_free(&r);
}

static void reject(const char *json, const char *field, const char *needle)
{
	struct kiln_err err;
	struct recipe r;
	size_t fl = strlen(field);

	if (recipe_parse(json, strlen(json), &r, &err) != -1)
		fail_msg("accepted %s", json);
	assert_string_equal(err.code, "invalid_recipe");
	if (strncmp(err.message, field, fl) || err.message[fl] != ':' || !strstr(err.message, needle))
		fail_msg("%s: got \"%s\", expected \"%s: ...%s...\"", json, err.message, field, needle);
	assert_null(r.packages);
	assert_int_equal(r.nfiles, 0);
}

static void test_reject(void **state)
{
	(void)state;
	reject("[]", "recipe", "JSON object");
	reject("{\"name\":\"a\"", "recipe", "invalid JSON");
	reject("{}", "name", "is required");
	reject("{\"name\":\"A\"}", "name", "a-z");
	reject("{\"name\":\"a\",\"name\":\"b\"}", "recipe", "duplicate");
	reject("{\"name\":\"a\",\"color\":1}", "recipe", "unknown key \"color\"");
	reject("{\"name\":\"a\",\"from\":\"alpine\"}", "from", "\"debian\"");
	reject("{\"name\":\"a\",\"packages\":\"jq\"}", "packages", "array of strings");
	reject("{\"name\":\"a\",\"packages\":[\"jq\",\"Jq\"]}", "packages[1]", "Debian package name");
	reject("{\"name\":\"a\",\"packages\":[\"jq; rm -rf /\"]}", "packages[0]", "Debian package name");
	reject("{\"name\":\"a\",\"packages\":[\"-o\"]}", "packages[0]", "Debian package name");
	reject("{\"name\":\"a\",\"packages\":[\"jq\",\"jq\"]}", "packages", "twice");
	reject("{\"name\":\"a\",\"packages\":[null]}", "packages[0]", "must be a string");
	reject("{\"name\":\"a\",\"run\":[\"\"]}", "run[0]", "1 to");
	reject("{\"name\":\"a\",\"run\":[\"a\\u0000b\"]}", "run[0]", "NUL");
	reject("{\"name\":\"a\",\"preload\":[\"os.\"]}", "preload[0]", "module name");
	reject("{\"name\":\"a\",\"preload\":[\"1x\"]}", "preload[0]", "module name");
	reject("{\"name\":\"a\",\"preload\":[\"__import__('os')\"]}", "preload[0]", "module name");
	reject("{\"name\":\"a\",\"files\":[{\"path\":\"etc/x\",\"content_b64\":\"\"}]}", "files[0].path", "absolute");
	reject("{\"name\":\"a\",\"files\":[{\"path\":\"/x\",\"content_b64\":\"a\"}]}", "files[0].content_b64", "base64");
	reject("{\"name\":\"a\",\"env\":[1]}", "env", "object");
	reject("{\"name\":\"a\",\"workdir\":\"/a/../b\"}", "workdir", "absolute path");
	reject("{\"name\":\"a\",\"workdir\":3}", "workdir", "must be a string");
	{
		/* 51 steps: one past the limit. */
		size_t cap = 16 + 51 * 4 + 8, o;
		char *j = malloc(cap);
		int i;

		assert_non_null(j);
		o = (size_t)sprintf(j, "{\"name\":\"a\",\"run\":[");
		for (i = 0; i < RECIPE_MAX_RUN + 1; i++)
			o += (size_t)sprintf(j + o, "%s\"x\"", i ? "," : "");
		sprintf(j + o, "]}");
		reject(j, "run", "at most 50");
		free(j);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_full),
		cmocka_unit_test(test_minimal),
		cmocka_unit_test(test_reject),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
