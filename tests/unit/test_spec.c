/* test_spec: unit tests for lib/spec.c, the task spec parser: defaults, each
 * way of saying what to run, base64 file contents, and every rejection path
 * with the field its message must name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "spec.h"

/* ---- helpers ------------------------------------------------------------ */

static void parse_ok_n(const char *json, size_t len, struct task_spec *s)
{
	struct kiln_err err = { "", "" };

	if (spec_parse(json, len, s, &err) != 0)
		fail_msg("spec_parse(%.300s) failed: %s: %s", json, err.code, err.message);
}

static void parse_ok(const char *json, struct task_spec *s)
{
	parse_ok_n(json, strlen(json), s);
}

/* Expect rejection with code invalid_spec, a message that starts with
 * "<path>: " and contains needle, and *out left zeroed. */
static void reject_n(const char *json, size_t len, const char *path, const char *needle)
{
	static const struct task_spec zero;
	struct kiln_err err = { "", "" };
	struct task_spec s;
	size_t pl = strlen(path);

	memset(&s, 0xa5, sizeof(s));
	if (spec_parse(json, len, &s, &err) != -1)
		fail_msg("spec_parse(%.300s) accepted it", json);
	assert_string_equal(err.code, "invalid_spec");
	if (strncmp(err.message, path, pl) != 0 || err.message[pl] != ':' || !strstr(err.message, needle))
		fail_msg("spec_parse(%.300s): got \"%s\", expected \"%s: ...%s...\"", json,
			 err.message, path, needle);
	assert_memory_equal(&s, &zero, sizeof(s));
}

static void reject(const char *json, const char *path, const char *needle)
{
	reject_n(json, strlen(json), path, needle);
}

struct reject_case {
	const char *json, *path, *needle;
};

static void reject_all(const struct reject_case *c, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		reject(c[i].json, c[i].path, c[i].needle);
}
#define REJECT_ALL(cases) reject_all(cases, sizeof(cases) / sizeof(cases[0]))

/* A growable string for generated specs. */
struct sbuf {
	char *s;
	size_t len, cap;
};

static void sb_add(struct sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
		va_end(ap);
		assert_true(n >= 0);
		if (b->s && (size_t)n < b->cap - b->len)
			break;
		b->cap = (b->cap + (size_t)n + 1) * 2;
		b->s = realloc(b->s, b->cap);
		assert_non_null(b->s);
	}
	b->len += (size_t)n;
}

static void sb_repeat(struct sbuf *b, char c, size_t n)
{
	if (b->cap - b->len <= n) {
		b->cap = b->len + n + 1024;
		b->s = realloc(b->s, b->cap);
		assert_non_null(b->s);
	}
	memset(b->s + b->len, c, n);
	b->len += n;
	b->s[b->len] = '\0';
}

/* ---- accepted specs ----------------------------------------------------- */

static void test_defaults(void **state)
{
	struct task_spec s;

	parse_ok("{\"argv\":[\"true\"]}", &s);
	assert_int_equal(s.language, SPEC_LANG_NONE);
	assert_null(s.code);
	assert_int_equal(s.code_len, 0);
	assert_int_equal(s.argc, 1);
	assert_string_equal(s.argv[0], "true");
	assert_null(s.argv[1]);
	assert_null(s.files);
	assert_int_equal(s.nfiles, 0);
	assert_non_null(s.env);
	assert_null(s.env[0]);
	assert_int_equal(s.nenv, 0);
	assert_string_equal(s.cwd, "/work");
	assert_int_equal(s.vcpus, 1);
	assert_int_equal(s.memory_mib, 256);
	assert_int_equal(s.timeout_s, 30);
	assert_int_equal(s.output_mib, 64);
	assert_int_equal(s.egress_none, 1);
	spec_free(&s);
	/* spec_free() zeroes, so a second call is harmless. */
	assert_null(s.argv);
	spec_free(&s);

	/* Empty limits / network objects also give the defaults. */
	parse_ok("{\"argv\":[\"true\"],\"limits\":{},\"network\":{},\"env\":{},\"files\":[]}", &s);
	assert_int_equal(s.memory_mib, 256);
	assert_int_equal(s.egress_none, 1);
	assert_int_equal(s.nfiles, 0);
	spec_free(&s);
}

static void check_code_spec(const char *lang, enum spec_language want, const char *interp,
			    const char *path)
{
	static const char code[] = "print('h\\u00e9')\nexit 3\n";
	char json[256];
	struct task_spec s;

	snprintf(json, sizeof(json),
		 "{\"language\":\"%s\",\"code\":\"print('h\\u00e9')\\nexit 3\\n\","
		 "\"files\":[{\"path\":\"/work/in\",\"content_b64\":\"QUJD\"}]}", lang);
	parse_ok(json, &s);
	assert_int_equal(s.language, want);
	/* \u00e9 arrives as two UTF-8 bytes. */
	assert_string_equal(s.code, "print('h\xc3\xa9')\nexit 3\n");
	assert_int_equal(s.code_len, sizeof(code) - 1 - 6 + 2);
	assert_int_equal(s.argc, 2);
	assert_string_equal(s.argv[0], interp);
	assert_string_equal(s.argv[1], path);
	assert_null(s.argv[2]);
	/* The code file comes last, after the user's files. */
	assert_int_equal(s.nfiles, 2);
	assert_string_equal(s.files[0].path, "/work/in");
	assert_string_equal(s.files[1].path, path);
	assert_int_equal(s.files[1].mode, 0644);
	assert_int_equal(s.files[1].size, s.code_len);
	assert_memory_equal(s.files[1].data, s.code, s.code_len);
	spec_free(&s);
}

static void test_languages(void **state)
{
	struct task_spec s;

	check_code_spec("python", SPEC_LANG_PYTHON, "python3", "/kiln/code/main.py");
	check_code_spec("bash", SPEC_LANG_BASH, "bash", "/kiln/code/main.sh");
	check_code_spec("sh", SPEC_LANG_SH, "sh", "/kiln/code/main.sh");

	/* Empty code is a valid (empty) program; no user files: one file. */
	parse_ok("{\"language\":\"sh\",\"code\":\"\"}", &s);
	assert_int_equal(s.nfiles, 1);
	assert_int_equal(s.files[0].size, 0);
	assert_non_null(s.files[0].data);
	assert_string_equal(s.code, "");
	spec_free(&s);
}

static void test_argv_form(void **state)
{
	struct task_spec s;

	parse_ok("{\"argv\":[\"/usr/bin/env\",\"\",\"a b\",\"\\u00fc\"],\"cwd\":\"/\","
		 "\"env\":{\"B\":\"2\",\"A\":\"x=y\",\"_e\":\"\"}}", &s);
	assert_int_equal(s.language, SPEC_LANG_NONE);
	assert_null(s.code);
	assert_int_equal(s.argc, 4);
	assert_string_equal(s.argv[0], "/usr/bin/env");
	assert_string_equal(s.argv[1], ""); /* only argv[0] must be non-empty */
	assert_string_equal(s.argv[2], "a b");
	assert_string_equal(s.argv[3], "\xc3\xbc");
	assert_null(s.argv[4]);
	assert_int_equal(s.nfiles, 0);
	assert_string_equal(s.cwd, "/");
	/* Env keeps the spec's order. */
	assert_int_equal(s.nenv, 3);
	assert_string_equal(s.env[0], "B=2");
	assert_string_equal(s.env[1], "A=x=y");
	assert_string_equal(s.env[2], "_e=");
	assert_null(s.env[3]);
	spec_free(&s);
}

static void test_limits_and_network(void **state)
{
	struct task_spec s;

	parse_ok("{\"argv\":[\"x\"],\"limits\":{\"vcpus\":16,\"memory_mib\":16384,"
		 "\"timeout_s\":86400,\"output_mib\":4096},\"network\":{\"egress\":\"none\"}}", &s);
	assert_int_equal(s.vcpus, 16);
	assert_int_equal(s.memory_mib, 16384);
	assert_int_equal(s.timeout_s, 86400);
	assert_int_equal(s.output_mib, 4096);
	assert_int_equal(s.egress_none, 1);
	spec_free(&s);

	parse_ok("{\"argv\":[\"x\"],\"limits\":{\"vcpus\":1,\"memory_mib\":128,"
		 "\"timeout_s\":1,\"output_mib\":1}}", &s);
	assert_int_equal(s.vcpus, 1);
	assert_int_equal(s.memory_mib, 128);
	assert_int_equal(s.timeout_s, 1);
	assert_int_equal(s.output_mib, 1);
	spec_free(&s);
}

/* ---- files and base64 --------------------------------------------------- */

static void check_b64(const char *b64, const void *want, size_t want_len)
{
	char json[512];
	struct task_spec s;

	snprintf(json, sizeof(json),
		 "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/work/f\",\"content_b64\":\"%s\"}]}", b64);
	parse_ok(json, &s);
	assert_int_equal(s.nfiles, 1);
	assert_non_null(s.files[0].data);
	if (s.files[0].size != want_len)
		fail_msg("base64 \"%s\": decoded %zu bytes, expected %zu", b64, s.files[0].size, want_len);
	if (want_len)
		assert_memory_equal(s.files[0].data, want, want_len);
	spec_free(&s);
}

static void test_files_base64(void **state)
{
	unsigned char all[256], b64[4 * 86 + 1];
	size_t i;

	/* Padding: 0, 1 and 2 '=' give exactly 3n, 3n-1 and 3n-2 bytes. */
	check_b64("", "", 0);
	check_b64("QQ==", "A", 1);
	check_b64("QUI=", "AB", 2);
	check_b64("QUJD", "ABC", 3);
	check_b64("QUJDRA==", "ABCD", 4);
	check_b64("QUJDREU=", "ABCDE", 5);
	check_b64("QUJDREVG", "ABCDEF", 6);
	/* Binary content, including NUL bytes and '+' / '/' in the alphabet. */
	check_b64("AP8A/w==", "\x00\xff\x00\xff", 4);
	check_b64("+/+/", "\xfb\xff\xbf", 3);
	check_b64("AAAA", "\0\0\0", 3);
	for (i = 0; i < sizeof(all); i++)
		all[i] = (unsigned char)i;
	EVP_EncodeBlock(b64, all, sizeof(all));
	check_b64((const char *)b64, all, sizeof(all));
	EVP_EncodeBlock(b64, all, sizeof(all) - 1);
	check_b64((const char *)b64, all, sizeof(all) - 1);
	/* JSON escapes inside the base64 string are decoded by JSON first. */
	check_b64("Q\\u0051==", "A", 1);
	check_b64("\\/w==", "\xff", 1);
}

static void test_files_fields(void **state)
{
	struct task_spec s;

	parse_ok("{\"argv\":[\"x\"],\"files\":["
		 "{\"path\":\"/work/a\",\"content_b64\":\"\"},"
		 "{\"mode\":0,\"content_b64\":\"QQ==\",\"path\":\"/work/a.txt\"},"
		 "{\"path\":\"/work/a-b/c\",\"content_b64\":\"\",\"mode\":511},"
		 "{\"path\":\"/process\",\"content_b64\":\"\",\"mode\":420},"
		 "{\"path\":\"/kilnx/devx\",\"content_b64\":\"\"},"
		 "{\"path\":\"/output/..x/.y\",\"content_b64\":\"\"}]}", &s);
	assert_int_equal(s.nfiles, 6);
	assert_string_equal(s.files[0].path, "/work/a");
	assert_int_equal(s.files[0].mode, 0644);
	assert_int_equal(s.files[0].size, 0);
	assert_non_null(s.files[0].data);
	assert_string_equal(s.files[1].path, "/work/a.txt");
	assert_int_equal(s.files[1].mode, 0);
	assert_int_equal(s.files[1].size, 1);
	assert_int_equal(s.files[2].mode, 0777);
	assert_int_equal(s.files[3].mode, 0644);
	assert_string_equal(s.files[3].path, "/process");
	spec_free(&s);
}

/* ---- rejections --------------------------------------------------------- */

static void test_reject_document(void **state)
{
	static const struct reject_case cases[] = {
		{ "", "spec", "invalid JSON at line 1, column 0" },
		{ "   ", "spec", "invalid JSON at line 1" },
		{ "{\"argv\":[\"x\"]", "spec", "invalid JSON at line 1, column 13" },
		{ "{\"argv\":[\"x\"],}", "spec", "invalid JSON at line 1" },
		{ "{\"argv\":[\"x\"]}\n\n x", "spec", "invalid JSON at line 3, column 2" },
		{ "{\"argv\":[\"x\"]}{}", "spec", "invalid JSON" },
		{ "{\"argv\":[\"\xff\"]}", "spec", "invalid JSON" }, /* not UTF-8 */
		{ "{\"argv\":[\"x\"],\"cwd\":\"/a\",\"cwd\":\"/b\"}", "spec", "duplicate" },
		{ "{'argv':['x']}", "spec", "invalid JSON" },
		{ "[\"argv\"]", "spec", "must be a JSON object (got an array)" },
		{ "\"argv\"", "spec", "must be a JSON object (got a string)" },
		{ "42", "spec", "must be a JSON object (got an integer)" },
		{ "null", "spec", "must be a JSON object (got null)" },
		{ "true", "spec", "must be a JSON object (got a boolean)" },
		{ "{}", "spec", "one of \"code\" (with \"language\") or \"argv\" is required" },
		{ "{\"argv\":[\"x\"],\"langauge\":\"python\"}", "spec",
		  "unknown key \"langauge\" (expected language, code, argv, files, env, cwd, limits, network)" },
		{ "{\"argv\":[\"x\"],\"\":1}", "spec", "unknown key \"\"" },
		{ "{\"argv\":[\"x\"],\"a\\nb\\\"\\u0001\":1}", "spec", "unknown key \"a\\x0ab\\\"\\x01\"" },
	};

	REJECT_ALL(cases);
}

static void test_reject_code(void **state)
{
	static const struct reject_case cases[] = {
		{ "{\"language\":\"python\",\"code\":\"x\",\"argv\":[\"y\"]}", "code",
		  "cannot be combined with \"argv\"" },
		{ "{\"code\":\"x\"}", "language", "is required with \"code\"" },
		{ "{\"language\":\"python\",\"argv\":[\"python3\"]}", "language", "is not allowed with \"argv\"" },
		{ "{\"language\":\"ruby\",\"code\":\"x\"}", "language",
		  "\"ruby\" is not supported (one of \"python\", \"bash\", \"sh\")" },
		{ "{\"language\":\"Python\",\"code\":\"x\"}", "language", "\"Python\" is not supported" },
		/* A bad language is reported before the missing code. */
		{ "{\"language\":\"cobol\"}", "language", "\"cobol\" is not supported" },
		{ "{\"language\":\"python\"}", "spec", "one of \"code\" (with \"language\") or \"argv\" is required" },
		{ "{\"language\":\"python\\u0000\",\"code\":\"x\"}", "language", "must not contain NUL" },
		{ "{\"language\":\"\",\"code\":\"x\"}", "language", "\"\" is not supported" },
		{ "{\"language\":1,\"code\":\"x\"}", "language", "must be a string (got an integer)" },
		{ "{\"language\":null,\"code\":\"x\"}", "language", "must be a string (got null)" },
		{ "{\"language\":\"sh\",\"code\":[\"x\"]}", "code", "must be a string (got an array)" },
		{ "{\"language\":\"sh\",\"code\":\"echo\\u0000\"}", "code", "must not contain NUL" },
		{ "{\"language\":\"sh\",\"code\":\"\",\"cwd\":\"/kiln/code/main.sh/x\"}", "cwd",
		  "is or is below the file \"/kiln/code/main.sh\"" },
	};
	struct sbuf b = { 0 };
	struct task_spec s;

	REJECT_ALL(cases);

	/* 1 MiB of code is the limit; one byte more is rejected. */
	sb_add(&b, "{\"language\":\"sh\",\"code\":\"");
	sb_repeat(&b, 'x', SPEC_MAX_CODE);
	sb_add(&b, "\"}");
	parse_ok_n(b.s, b.len, &s);
	assert_int_equal(s.code_len, SPEC_MAX_CODE);
	assert_int_equal(s.files[0].size, SPEC_MAX_CODE);
	spec_free(&s);
	b.len = 0;
	sb_add(&b, "{\"language\":\"sh\",\"code\":\"");
	sb_repeat(&b, 'x', SPEC_MAX_CODE + 1);
	sb_add(&b, "\"}");
	reject_n(b.s, b.len, "code", "must be at most 1048576 bytes (got 1048577)");
	free(b.s);
}

static void test_reject_argv(void **state)
{
	static const struct reject_case cases[] = {
		{ "{\"argv\":\"ls -l\"}", "argv", "must be an array of strings (got a string)" },
		{ "{\"argv\":{}}", "argv", "must be an array of strings (got an object)" },
		{ "{\"argv\":null}", "argv", "must be an array of strings (got null)" },
		{ "{\"argv\":[]}", "argv", "must have 1 to 1024 entries (got 0)" },
		{ "{\"argv\":[1]}", "argv[0]", "must be a string (got an integer)" },
		{ "{\"argv\":[\"x\",\"y\",null]}", "argv[2]", "must be a string (got null)" },
		{ "{\"argv\":[\"x\",1.5]}", "argv[1]", "must be a string (got a real number)" },
		{ "{\"argv\":[\"x\",[]]}", "argv[1]", "must be a string (got an array)" },
		{ "{\"argv\":[\"\"]}", "argv[0]", "must not be empty" },
		{ "{\"argv\":[\"x\",\"a\\u0000b\"]}", "argv[1]", "must not contain NUL" },
		{ "{\"argv\":[\"\\u0000\"]}", "argv[0]", "must not contain NUL" },
	};
	struct sbuf b = { 0 };
	struct task_spec s;
	int i;

	REJECT_ALL(cases);

	/* 1024 entries are accepted, 1025 are not. */
	sb_add(&b, "{\"argv\":[\"x\"");
	for (i = 1; i < SPEC_MAX_ARGS; i++)
		sb_add(&b, ",\"%d\"", i);
	sb_add(&b, "]}");
	parse_ok_n(b.s, b.len, &s);
	assert_int_equal(s.argc, SPEC_MAX_ARGS);
	assert_string_equal(s.argv[SPEC_MAX_ARGS - 1], "1023");
	assert_null(s.argv[SPEC_MAX_ARGS]);
	spec_free(&s);
	b.len -= 2;
	sb_add(&b, ",\"y\"]}");
	reject_n(b.s, b.len, "argv", "must have 1 to 1024 entries (got 1025)");

	/* 64 KiB counting a NUL per entry: one 65535-byte string fits exactly. */
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"");
	sb_repeat(&b, 'a', SPEC_MAX_ARGV_BYTES - 1);
	sb_add(&b, "\"]}");
	parse_ok_n(b.s, b.len, &s);
	assert_int_equal(strlen(s.argv[0]), SPEC_MAX_ARGV_BYTES - 1);
	spec_free(&s);
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"");
	sb_repeat(&b, 'a', SPEC_MAX_ARGV_BYTES - 1);
	sb_add(&b, "\",\"\"]}");
	reject_n(b.s, b.len, "argv", "must total at most 65536 bytes");
	free(b.s);
}

static void test_reject_files(void **state)
{
	static const struct reject_case cases[] = {
		{ "{\"argv\":[\"x\"],\"files\":{}}", "files", "must be an array (got an object)" },
		{ "{\"argv\":[\"x\"],\"files\":\"a\"}", "files", "must be an array (got a string)" },
		{ "{\"argv\":[\"x\"],\"files\":[\"/a\"]}", "files[0]", "must be an object (got a string)" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\",\"content_b64\":\"\"},null]}", "files[1]",
		  "must be an object (got null)" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\",\"content\":\"x\"}]}", "files[0]",
		  "unknown key \"content\" (expected path, content_b64, mode)" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"content_b64\":\"\"}]}", "files[0].path", "is required" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\"}]}", "files[0].content_b64", "is required" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":7,\"content_b64\":\"\"}]}", "files[0].path",
		  "must be a string (got an integer)" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\",\"content_b64\":null}]}", "files[0].content_b64",
		  "must be a string (got null)" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\",\"content_b64\":\"\"},"
		  "{\"path\":\"/a\\u0000b\",\"content_b64\":\"\"}]}", "files[1].path", "must not contain NUL" },
		/* mode */
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\",\"content_b64\":\"\",\"mode\":-1}]}",
		  "files[0].mode", "must be an integer from 0 to 511" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\",\"content_b64\":\"\",\"mode\":512}]}",
		  "files[0].mode", "(got 512)" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\",\"content_b64\":\"\",\"mode\":644}]}",
		  "files[0].mode", "0644 is written 420" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\",\"content_b64\":\"\",\"mode\":2541}]}",
		  "files[0].mode", "(got 2541)" }, /* 04755: no setuid */
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\",\"content_b64\":\"\",\"mode\":\"0644\"}]}",
		  "files[0].mode", "(got a string)" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\",\"content_b64\":\"\",\"mode\":420.0}]}",
		  "files[0].mode", "(got a real number)" },
	};

	REJECT_ALL(cases);
}

static void reject_path(const char *path_json, const char *needle)
{
	char json[8192];

	snprintf(json, sizeof(json),
		 "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/ok\",\"content_b64\":\"\"},"
		 "{\"path\":\"%s\",\"content_b64\":\"\"}]}", path_json);
	reject(json, "files[1].path", needle);
}

static void test_reject_file_paths(void **state)
{
	static const char *const bad[] = {
		"work/x", "", ".", "..", "/work/../etc/passwd", "/work/./x", "/..", "/.",
		"/work/..", "/work/.", "//work", "/work//x", "/work/x/", "/work/x//",
	};
	static const char *const reserved[][2] = {
		{ "/proc", "/proc" }, { "/proc/self/mem", "/proc" }, { "/sys/kernel", "/sys" },
		{ "/dev/null", "/dev" }, { "/dev", "/dev" }, { "/kiln", "/kiln" },
		{ "/kiln/code/main.py", "/kiln" },
	};
	char name[4200], json[8192], want[64];
	struct task_spec s;
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		reject_path(bad[i], "must be an absolute path without '.' or '..' components");
	reject_path("/", "must name a file, not \"/\"");
	for (i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++) {
		snprintf(want, sizeof(want), "is under %s, which is reserved", reserved[i][1]);
		reject_path(reserved[i][0], want);
	}

	/* A component of 255 bytes is fine, 256 is not. */
	name[0] = '/';
	memset(name + 1, 'n', 255);
	name[256] = '\0';
	snprintf(json, sizeof(json), "{\"argv\":[\"x\"],\"files\":[{\"path\":\"%s\",\"content_b64\":\"\"}]}", name);
	parse_ok(json, &s);
	assert_int_equal(strlen(s.files[0].path), 256);
	spec_free(&s);
	memset(name + 1, 'n', 256);
	name[257] = '\0';
	reject_path(name, "must be an absolute path");

	/* A whole path of 4096 bytes is fine, 4097 is not. */
	for (i = 0; i < 4096; i++)
		name[i] = i % 128 == 0 ? '/' : 'p';
	name[4096] = '\0';
	snprintf(json, sizeof(json), "{\"argv\":[\"x\"],\"files\":[{\"path\":\"%s\",\"content_b64\":\"\"}]}", name);
	parse_ok(json, &s);
	assert_int_equal(strlen(s.files[0].path), 4096);
	spec_free(&s);
	name[4096] = 'p';
	name[4097] = '\0';
	reject_path(name, "must be an absolute path");
}

static void test_reject_file_conflicts(void **state)
{
	static const struct reject_case cases[] = {
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/w/a\",\"content_b64\":\"\"},"
		  "{\"path\":\"/w/b\",\"content_b64\":\"\"},{\"path\":\"/w/a\",\"content_b64\":\"QQ==\"}]}",
		  "files[2].path", "duplicates files[0].path" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/w/a\",\"content_b64\":\"\"},"
		  "{\"path\":\"/w/a/b\",\"content_b64\":\"\"}]}",
		  "files[1].path", "is below files[0].path, which is a file" },
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/w/a/b/c\",\"content_b64\":\"\"},"
		  "{\"path\":\"/w/a\",\"content_b64\":\"\"}]}",
		  "files[0].path", "is below files[1].path" },
		/* "/w/a-b" sorts between "/w/a" and "/w/a/b" bytewise; still caught. */
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/w/a\",\"content_b64\":\"\"},"
		  "{\"path\":\"/w/a-b\",\"content_b64\":\"\"},{\"path\":\"/w/a.b\",\"content_b64\":\"\"},"
		  "{\"path\":\"/w/a/b\",\"content_b64\":\"\"}]}",
		  "files[3].path", "is below files[0].path" },
		/* The default cwd /work cannot be a file. */
		{ "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/work\",\"content_b64\":\"\"}]}",
		  "cwd", "\"/work\" is or is below the file \"/work\"" },
		{ "{\"argv\":[\"x\"],\"cwd\":\"/w/a/b\",\"files\":[{\"path\":\"/w/a\",\"content_b64\":\"\"}]}",
		  "cwd", "is or is below the file \"/w/a\"" },
	};
	struct task_spec s;

	REJECT_ALL(cases);
	/* Siblings that share a prefix are not conflicts. */
	parse_ok("{\"argv\":[\"x\"],\"cwd\":\"/w/ab\",\"files\":[{\"path\":\"/w/a\",\"content_b64\":\"\"},"
		 "{\"path\":\"/w/a-b\",\"content_b64\":\"\"},{\"path\":\"/w/ab/c\",\"content_b64\":\"\"}]}", &s);
	assert_int_equal(s.nfiles, 3);
	spec_free(&s);
}

static void test_reject_base64(void **state)
{
	static const char *const bad[][2] = {
		{ "Q", "padded with '=' to a multiple of 4 bytes (got 1 bytes)" },
		{ "QQ", "padded with '='" }, /* unpadded */
		{ "QQ=", "padded with '='" },
		{ "QUJDR", "padded with '='" },
		{ "QQ=A", "not valid base64 ('A' at offset 3)" },
		{ "Q===", "not valid base64 ('=' at offset 1)" },
		{ "====", "not valid base64 ('=' at offset 0)" },
		{ "QQ==QUJD", "not valid base64 ('=' at offset 2)" },
		{ "QUJ-", "not valid base64 ('-' at offset 3)" }, /* base64url */
		{ "QUJ_", "not valid base64 ('_' at offset 3)" },
		{ "QU J", "not valid base64 (' ' at offset 2)" },
		{ "QUJD\\nQUJD", "padded with '='" },
		{ "QUJ\\n", "not valid base64 (byte 0x0a at offset 3)" },
		{ "QUJ\\u0000", "not valid base64 (byte 0x00 at offset 3)" },
		{ "QUJ\\u00e9", "padded with '='" }, /* 2 UTF-8 bytes */
		{ "QU\\u00e9", "not valid base64 (byte 0xc3 at offset 2)" },
	};
	char json[256];
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(json, sizeof(json),
			 "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\",\"content_b64\":\"%s\"}]}", bad[i][0]);
		reject(json, "files[0].content_b64", bad[i][1]);
	}
}

static void test_reject_files_huge(void **state)
{
	struct sbuf b = { 0 };
	struct task_spec s;
	size_t i, groups = SPEC_MAX_FILE_BYTES / 3; /* 64 MiB = 3 * groups + 1 */

	/* 1000 files are accepted, 1001 are not. */
	sb_add(&b, "{\"argv\":[\"x\"],\"files\":[");
	for (i = 0; i < SPEC_MAX_FILES; i++)
		sb_add(&b, "%s{\"path\":\"/f/%zu\",\"content_b64\":\"\"}", i ? "," : "", i);
	sb_add(&b, "]}");
	parse_ok_n(b.s, b.len, &s);
	assert_int_equal(s.nfiles, SPEC_MAX_FILES);
	spec_free(&s);
	b.len -= 2;
	sb_add(&b, ",{\"path\":\"/f/x\",\"content_b64\":\"\"}]}");
	reject_n(b.s, b.len, "files", "must have at most 1000 entries (got 1001)");

	/* Exactly 64 MiB decoded in total is accepted; one byte more is not. */
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"x\"],\"files\":[{\"path\":\"/a\",\"content_b64\":\"");
	sb_repeat(&b, 'A', groups * 4);
	sb_add(&b, "\"},{\"path\":\"/b\",\"content_b64\":\"AA==\"}]}");
	parse_ok_n(b.s, b.len, &s);
	assert_int_equal(s.files[0].size + s.files[1].size, SPEC_MAX_FILE_BYTES);
	spec_free(&s);
	memcpy(strstr(b.s, "AA=="), "AAA=", 4);
	reject_n(b.s, b.len, "files[1].content_b64", "decoded files exceed 67108864 bytes in total");
	free(b.s);
}

static void test_reject_env(void **state)
{
	static const struct reject_case cases[] = {
		{ "{\"argv\":[\"x\"],\"env\":[\"A=1\"]}", "env", "must be an object of name: string (got an array)" },
		{ "{\"argv\":[\"x\"],\"env\":\"A=1\"}", "env", "(got a string)" },
		{ "{\"argv\":[\"x\"],\"env\":{\"1A\":\"v\"}}", "env", "invalid name \"1A\": must match [A-Za-z_][A-Za-z0-9_]*" },
		{ "{\"argv\":[\"x\"],\"env\":{\"\":\"v\"}}", "env", "invalid name \"\"" },
		{ "{\"argv\":[\"x\"],\"env\":{\"A-B\":\"v\"}}", "env", "invalid name \"A-B\"" },
		{ "{\"argv\":[\"x\"],\"env\":{\"A=B\":\"v\"}}", "env", "invalid name \"A=B\"" },
		{ "{\"argv\":[\"x\"],\"env\":{\"A B\":\"v\"}}", "env", "invalid name \"A B\"" },
		{ "{\"argv\":[\"x\"],\"env\":{\"\\u00c4\":\"v\"}}", "env", "invalid name \"\\xc3\\x84\"" },
		{ "{\"argv\":[\"x\"],\"env\":{\"OK\":\"1\",\"A\":1}}", "env.A", "must be a string (got an integer)" },
		{ "{\"argv\":[\"x\"],\"env\":{\"A\":null}}", "env.A", "must be a string (got null)" },
		{ "{\"argv\":[\"x\"],\"env\":{\"A\":\"x\\u0000y\"}}", "env.A", "must not contain NUL" },
		{ "{\"argv\":[\"x\"],\"env\":{\"A\":\"1\",\"A\":\"2\"}}", "spec", "duplicate" },
	};
	struct sbuf b = { 0 };
	struct task_spec s;
	char name[SPEC_MAX_ENV_KEY + 2];
	int i;

	REJECT_ALL(cases);

	/* Names of 256 bytes are fine, 257 are not. */
	memset(name, 'N', sizeof(name));
	name[SPEC_MAX_ENV_KEY] = '\0';
	sb_add(&b, "{\"argv\":[\"x\"],\"env\":{\"%s\":\"v\"}}", name);
	parse_ok_n(b.s, b.len, &s);
	assert_int_equal(strlen(s.env[0]), SPEC_MAX_ENV_KEY + 2);
	spec_free(&s);
	name[SPEC_MAX_ENV_KEY] = 'N';
	name[SPEC_MAX_ENV_KEY + 1] = '\0';
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"x\"],\"env\":{\"%s\":\"v\"}}", name);
	reject_n(b.s, b.len, "env", "at most 256 bytes");

	/* 1024 entries are accepted, 1025 are not. */
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"x\"],\"env\":{\"V0\":\"\"");
	for (i = 1; i < SPEC_MAX_ENV; i++)
		sb_add(&b, ",\"V%d\":\"%d\"", i, i);
	sb_add(&b, "}}");
	parse_ok_n(b.s, b.len, &s);
	assert_int_equal(s.nenv, SPEC_MAX_ENV);
	assert_string_equal(s.env[SPEC_MAX_ENV - 1], "V1023=1023");
	assert_null(s.env[SPEC_MAX_ENV]);
	spec_free(&s);
	b.len -= 2;
	sb_add(&b, ",\"W\":\"\"}}");
	reject_n(b.s, b.len, "env", "must have at most 1024 entries (got 1025)");

	/* 64 KiB counting "K=V" plus a NUL: "A=" + 65533 bytes fits exactly. */
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"x\"],\"env\":{\"A\":\"");
	sb_repeat(&b, 'v', SPEC_MAX_ENV_BYTES - 3);
	sb_add(&b, "\"}}");
	parse_ok_n(b.s, b.len, &s);
	assert_int_equal(strlen(s.env[0]), SPEC_MAX_ENV_BYTES - 1);
	spec_free(&s);
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"x\"],\"env\":{\"A\":\"");
	sb_repeat(&b, 'v', SPEC_MAX_ENV_BYTES - 3);
	sb_add(&b, "\",\"B\":\"\"}}");
	reject_n(b.s, b.len, "env", "must total at most 65536 bytes");

	/* Both near their own bounds: too big for one exec message together. */
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"");
	sb_repeat(&b, 'a', 64000);
	sb_add(&b, "\"],\"env\":{\"A\":\"");
	sb_repeat(&b, 'v', 64000);
	sb_add(&b, "\"}}");
	reject_n(b.s, b.len, "env", "argv, env and cwd together take");
	free(b.s);
}

static void test_reject_cwd(void **state)
{
	static const struct reject_case cases[] = {
		{ "{\"argv\":[\"x\"],\"cwd\":7}", "cwd", "must be a string (got an integer)" },
		{ "{\"argv\":[\"x\"],\"cwd\":null}", "cwd", "must be a string (got null)" },
		{ "{\"argv\":[\"x\"],\"cwd\":\"work\"}", "cwd", "must be an absolute path without '.' or '..'" },
		{ "{\"argv\":[\"x\"],\"cwd\":\"\"}", "cwd", "must be an absolute path" },
		{ "{\"argv\":[\"x\"],\"cwd\":\"/work/..\"}", "cwd", "must be an absolute path" },
		{ "{\"argv\":[\"x\"],\"cwd\":\"/work/\"}", "cwd", "must be an absolute path" },
		{ "{\"argv\":[\"x\"],\"cwd\":\"/work\\u0000/x\"}", "cwd", "must not contain NUL" },
	};

	REJECT_ALL(cases);
}

static void test_reject_limits(void **state)
{
	static const struct {
		const char *key;
		long long min, max;
	} lim[] = {
		{ "vcpus", 1, 16 },
		{ "memory_mib", 128, 16384 },
		{ "timeout_s", 1, 86400 },
		{ "output_mib", 1, 4096 },
	};
	static const struct reject_case cases[] = {
		{ "{\"argv\":[\"x\"],\"limits\":[]}", "limits", "must be an object (got an array)" },
		{ "{\"argv\":[\"x\"],\"limits\":{\"cpus\":2}}", "limits",
		  "unknown key \"cpus\" (expected vcpus, memory_mib, timeout_s, output_mib)" },
		{ "{\"argv\":[\"x\"],\"limits\":{\"memory_mib\":1.5}}", "limits.memory_mib", "(got a real number)" },
		{ "{\"argv\":[\"x\"],\"limits\":{\"memory_mib\":256.0}}", "limits.memory_mib", "(got a real number)" },
		{ "{\"argv\":[\"x\"],\"limits\":{\"memory_mib\":\"256\"}}", "limits.memory_mib", "(got a string)" },
		{ "{\"argv\":[\"x\"],\"limits\":{\"timeout_s\":true}}", "limits.timeout_s", "(got a boolean)" },
		{ "{\"argv\":[\"x\"],\"limits\":{\"timeout_s\":null}}", "limits.timeout_s", "(got null)" },
		{ "{\"argv\":[\"x\"],\"limits\":{\"vcpus\":9223372036854775807}}", "limits.vcpus",
		  "(got 9223372036854775807)" },
		{ "{\"argv\":[\"x\"],\"limits\":{\"vcpus\":-9223372036854775808}}", "limits.vcpus",
		  "(got -9223372036854775808)" },
		{ "{\"argv\":[\"x\"],\"limits\":{\"vcpus\":4294967297}}", "limits.vcpus", "(got 4294967297)" },
		/* Beyond int64 or double, jansson itself refuses the number. */
		{ "{\"argv\":[\"x\"],\"limits\":{\"vcpus\":99999999999999999999}}", "spec", "invalid JSON at line 1" },
		{ "{\"argv\":[\"x\"],\"limits\":{\"vcpus\":1e999}}", "spec", "invalid JSON at line 1" },
	};
	char json[256], want[128];
	size_t i;

	REJECT_ALL(cases);
	for (i = 0; i < sizeof(lim) / sizeof(lim[0]); i++) {
		long long bad[] = { lim[i].min - 1, lim[i].max + 1, -1 };
		size_t j;

		for (j = 0; j < sizeof(bad) / sizeof(bad[0]); j++) {
			snprintf(json, sizeof(json), "{\"argv\":[\"x\"],\"limits\":{\"%s\":%lld}}", lim[i].key, bad[j]);
			snprintf(want, sizeof(want), "must be an integer from %lld to %lld (got %lld)",
				 lim[i].min, lim[i].max, bad[j]);
			snprintf(json + 200, 56, "limits.%s", lim[i].key);
			reject(json, json + 200, want);
		}
	}
}

static void test_reject_network(void **state)
{
	static const struct reject_case cases[] = {
		{ "{\"argv\":[\"x\"],\"network\":\"none\"}", "network", "must be an object (got a string)" },
		{ "{\"argv\":[\"x\"],\"network\":{\"ingress\":\"none\"}}", "network",
		  "unknown key \"ingress\" (expected egress)" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"all\"}}", "network.egress",
		  "\"all\" is not supported yet (only \"none\")" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"None\"}}", "network.egress",
		  "\"None\" is not supported yet" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"none\\u0000x\"}}", "network.egress",
		  "must not contain NUL" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":false}}", "network.egress",
		  "must be a string (got a boolean)" },
	};
	struct kiln_err err;
	struct sbuf b = { 0 };
	struct task_spec s;

	REJECT_ALL(cases);

	/* A huge hostile value is echoed cut short, as printable ASCII. */
	sb_add(&b, "{\"argv\":[\"x\"],\"network\":{\"egress\":\"\\u0001\\u001b[31m");
	sb_repeat(&b, 'z', 100000);
	sb_add(&b, "\"}}");
	assert_int_equal(spec_parse(b.s, b.len, &s, &err), -1);
	assert_non_null(strstr(err.message, "network.egress: \"\\x01\\x1b[31mzzz"));
	assert_non_null(strstr(err.message, "zzz...\" is not supported yet"));
	assert_true(strlen(err.message) < 200);
	free(b.s);
}

static void test_reject_oversized_document(void **state)
{
	struct kiln_err err;
	struct task_spec s;
	/* Never touched: the length alone is refused, before jansson reads it. */
	char *big = malloc((size_t)SPEC_MAX_JSON + 1);

	assert_non_null(big);
	assert_int_equal(spec_parse(big, (size_t)SPEC_MAX_JSON + 1, &s, &err), -1);
	assert_string_equal(err.code, "invalid_spec");
	assert_non_null(strstr(err.message, "spec: must be at most 134217728 bytes of JSON"));
	free(big);
}

static void test_json_nodes(void **state)
{
	struct sbuf b = { 0 };
	struct task_spec s;
	size_t i;

	/* Cheap-to-send, costly-to-build structure is refused before parsing. */
	sb_add(&b, "{\"argv\":[\"x\"],\"pad\":[");
	for (i = 0; i < SPEC_MAX_JSON_NODES; i++)
		sb_add(&b, "[],");
	sb_add(&b, "[]]}");
	reject_n(b.s, b.len, "spec", "must have at most 16384 JSON arrays, objects and ',' separators");

	/* Separators inside strings do not count, also after escaped quotes
	 * and escaped backslashes. */
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"a\\\\\",\"q\\\"");
	sb_repeat(&b, ',', 3 * SPEC_MAX_JSON_NODES);
	sb_add(&b, "\\\\\"]}");
	parse_ok_n(b.s, b.len, &s);
	assert_string_equal(s.argv[0], "a\\");
	assert_int_equal(strlen(s.argv[1]), 2 + 3 * SPEC_MAX_JSON_NODES + 1);
	assert_int_equal(s.argv[1][1], '"');
	spec_free(&s);

	/* The largest valid spec stays well under the bound. */
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"x\"");
	for (i = 1; i < SPEC_MAX_ARGS; i++)
		sb_add(&b, ",\"a\"");
	sb_add(&b, "],\"env\":{\"E0\":\"\"");
	for (i = 1; i < SPEC_MAX_ENV; i++)
		sb_add(&b, ",\"E%zu\":\"v\"", i);
	sb_add(&b, "},\"files\":[");
	for (i = 0; i < SPEC_MAX_FILES; i++)
		sb_add(&b, "%s{\"path\":\"/f/%zu\",\"content_b64\":\"QQ==\",\"mode\":420}", i ? "," : "", i);
	sb_add(&b, "],\"cwd\":\"/w\",\"limits\":{\"vcpus\":2,\"memory_mib\":512,\"timeout_s\":5,"
	       "\"output_mib\":2},\"network\":{\"egress\":\"none\"}}");
	parse_ok_n(b.s, b.len, &s);
	assert_int_equal(s.argc, SPEC_MAX_ARGS);
	assert_int_equal(s.nenv, SPEC_MAX_ENV);
	assert_int_equal(s.nfiles, SPEC_MAX_FILES);
	assert_int_equal(s.vcpus, 2);
	spec_free(&s);
	free(b.s);
}

static void test_err_set(void **state)
{
	struct kiln_err e;
	char longer[1000];

	assert_int_equal(kiln_err_set(&e, "vm_error", "boot failed: %d", 5), -1);
	assert_string_equal(e.code, "vm_error");
	assert_string_equal(e.message, "boot failed: 5");
	memset(longer, 'x', sizeof(longer) - 1);
	longer[sizeof(longer) - 1] = '\0';
	kiln_err_set(&e, longer, "%s", longer);
	assert_int_equal(strlen(e.code), sizeof(e.code) - 1);
	assert_int_equal(strlen(e.message), sizeof(e.message) - 1);
	assert_int_equal(kiln_err_set(NULL, "x", "y"), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_languages),
		cmocka_unit_test(test_argv_form),
		cmocka_unit_test(test_limits_and_network),
		cmocka_unit_test(test_files_base64),
		cmocka_unit_test(test_files_fields),
		cmocka_unit_test(test_reject_document),
		cmocka_unit_test(test_reject_code),
		cmocka_unit_test(test_reject_argv),
		cmocka_unit_test(test_reject_files),
		cmocka_unit_test(test_reject_file_paths),
		cmocka_unit_test(test_reject_file_conflicts),
		cmocka_unit_test(test_reject_base64),
		cmocka_unit_test(test_reject_files_huge),
		cmocka_unit_test(test_reject_env),
		cmocka_unit_test(test_reject_cwd),
		cmocka_unit_test(test_reject_limits),
		cmocka_unit_test(test_reject_network),
		cmocka_unit_test(test_reject_oversized_document),
		cmocka_unit_test(test_json_nodes),
		cmocka_unit_test(test_err_set),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
