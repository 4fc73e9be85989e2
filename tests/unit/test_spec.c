/* test_spec: unit tests for lib/spec.c, the task spec parser: defaults, each
 * way of saying what to run, base64 file contents, the network policy's rules
 * and their normalized form, and every rejection path with the field (or the
 * network rule) its message must name. */
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
	struct kiln_err err = { .code = "" };

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
	struct kiln_err err = { .code = "" };
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
	assert_int_equal(s.egress, 0);
	assert_null(s.net_rules);
	assert_int_equal(s.nnet_rules, 0);
	spec_free(&s);
	/* spec_free() zeroes, so a second call is harmless. */
	assert_null(s.argv);
	spec_free(&s);

	/* Empty limits / network objects also give the defaults. */
	parse_ok("{\"argv\":[\"true\"],\"limits\":{},\"network\":{},\"env\":{},\"files\":[]}", &s);
	assert_int_equal(s.memory_mib, 256);
	assert_int_equal(s.egress, 0);
	assert_null(s.net_rules);
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
	assert_int_equal(s.egress, 0);
	assert_null(s.net_rules);
	assert_int_equal(s.nnet_rules, 0);
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
		  "unknown key \"langauge\" (expected language, code, argv, files, env, cwd, limits, network, template)" },
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
		{ "{\"argv\":[\"x\"],\"network\":null}", "network", "must be an object (got null)" },
		{ "{\"argv\":[\"x\"],\"network\":{\"ingress\":\"none\"}}", "network",
		  "unknown key \"ingress\" (expected egress, allow)" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"deny\":[]}}", "network",
		  "unknown key \"deny\" (expected egress, allow)" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"all\"}}", "network.egress",
		  "\"all\" is not supported (one of \"none\", \"allow\")" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"None\"}}", "network.egress",
		  "\"None\" is not supported (one of" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"Allow\",\"allow\":[\"a.org:1\"]}}",
		  "network.egress", "\"Allow\" is not supported (one of" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow \",\"allow\":[\"a.org:1\"]}}",
		  "network.egress", "\"allow \" is not supported" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"\"}}", "network.egress", "\"\" is not supported" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":null}}", "network.egress",
		  "must be a string (got null)" },
		/* "none" (said or by default) takes no rules. */
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"none\",\"allow\":[\"example.org:443\"]}}",
		  "network.allow", "is not allowed with egress \"none\": use \"egress\":\"allow\"" },
		{ "{\"argv\":[\"x\"],\"network\":{\"allow\":[\"example.org:443\"]}}",
		  "network.allow", "is not allowed with egress \"none\" (the default)" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"none\",\"allow\":[]}}",
		  "network.allow", "is not allowed with egress \"none\"" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"none\",\"allow\":null}}",
		  "network.allow", "is not allowed with egress \"none\"" },
		/* "allow" needs 0-64 rules as strings. */
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\"}}", "network.allow",
		  "is required with egress \"allow\" (0 to 64 rules" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":\"example.org:443\"}}",
		  "network.allow", "must be an array of strings (got a string)" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":{}}}",
		  "network.allow", "must be an array of strings (got an object)" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":null}}",
		  "network.allow", "must be an array of strings (got null)" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[\"a.org:1\",443]}}",
		  "network.allow[1]", "must be a string (got an integer)" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[[\"a.org:1\"]]}}",
		  "network.allow[0]", "must be a string (got an array)" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[\"a.org:1\",null]}}",
		  "network.allow[1]", "must be a string (got null)" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[\"a.org\\u0000:1\"]}}",
		  "network.allow[0]", "must not contain NUL" },
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
	assert_non_null(strstr(err.message, "zzz...\" is not supported (one of"));
	assert_true(strlen(err.message) < 200);
	free(b.s);
}

/* ---- network policy ----------------------------------------------------- */

/* A spec whose network.allow holds the given JSON string bodies. */
static void net_spec(struct sbuf *b, const char *const *rules, size_t n)
{
	size_t i;

	b->len = 0;
	sb_add(b, "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[");
	for (i = 0; i < n; i++)
		sb_add(b, "%s\"%s\"", i ? "," : "", rules[i]);
	sb_add(b, "]}}");
}

static void check_rule_format(const struct spec_net_rule *r, const char *want)
{
	char text[SPEC_NET_RULE_TEXT];

	spec_net_rule_format(r, text, sizeof(text));
	assert_string_equal(text, want);
}

static void test_network_allow(void **state)
{
	static const char *const rules[] = {
		"203.0.113.0/24:443", "203.0.113.7:80", "example.org:443", "*.pypi.example:8000-8100",
	};
	struct sbuf b = { 0 };
	struct task_spec s;

	/* No rules yet: a network device that reaches nothing (its rules can
	 * be changed while it runs). */
	net_spec(&b, rules, 0);
	parse_ok_n(b.s, b.len, &s);
	assert_int_equal(s.egress, 1);
	assert_int_equal(s.nnet_rules, 0);
	assert_null(s.net_rules);
	spec_free(&s);

	/* The example from the docs, in order. */
	net_spec(&b, rules, 4);
	parse_ok_n(b.s, b.len, &s);
	assert_int_equal(s.egress, 1);
	assert_int_equal(s.nnet_rules, 4);
	assert_non_null(s.net_rules);
	assert_int_equal(s.net_rules[0].kind, SPEC_NET_CIDR);
	assert_int_equal(s.net_rules[0].addr, 0xcb007100u);
	assert_int_equal(s.net_rules[0].prefix, 24);
	assert_string_equal(s.net_rules[0].host, "");
	assert_int_equal(s.net_rules[0].port_lo, 443);
	assert_int_equal(s.net_rules[0].port_hi, 443);
	assert_int_equal(s.net_rules[1].kind, SPEC_NET_CIDR);
	assert_int_equal(s.net_rules[1].addr, 0xcb007107u);
	assert_int_equal(s.net_rules[1].prefix, 32);
	assert_int_equal(s.net_rules[1].port_lo, 80);
	assert_int_equal(s.net_rules[1].port_hi, 80);
	assert_int_equal(s.net_rules[2].kind, SPEC_NET_HOST);
	assert_string_equal(s.net_rules[2].host, "example.org");
	assert_int_equal(s.net_rules[2].addr, 0);
	assert_int_equal(s.net_rules[2].prefix, 0);
	assert_int_equal(s.net_rules[2].port_lo, 443);
	assert_int_equal(s.net_rules[3].kind, SPEC_NET_WILDCARD);
	assert_string_equal(s.net_rules[3].host, "pypi.example");
	assert_int_equal(s.net_rules[3].port_lo, 8000);
	assert_int_equal(s.net_rules[3].port_hi, 8100);
	/* The normalized text is what was written. */
	check_rule_format(&s.net_rules[0], "203.0.113.0/24:443");
	check_rule_format(&s.net_rules[1], "203.0.113.7:80");
	check_rule_format(&s.net_rules[2], "example.org:443");
	check_rule_format(&s.net_rules[3], "*.pypi.example:8000-8100");
	spec_free(&s);
	assert_null(s.net_rules);
	assert_int_equal(s.nnet_rules, 0);
	assert_int_equal(s.egress, 0);
	free(b.s);
}

static void test_network_normalize(void **state)
{
	static const struct {
		const char *rule, *norm;
		enum spec_net_kind kind;
		const char *host;
		uint32_t addr;
		unsigned prefix, lo, hi;
	} ok[] = {
		/* Names are lower-cased. */
		{ "ExAmple.ORG:443", "example.org:443", SPEC_NET_HOST, "example.org", 0, 0, 443, 443 },
		{ "*.PyPI.Example:1", "*.pypi.example:1", SPEC_NET_WILDCARD, "pypi.example", 0, 0, 1, 1 },
		/* /32 is the same as no prefix, and is written without one. */
		{ "203.0.113.7/32:80", "203.0.113.7:80", SPEC_NET_CIDR, "", 0xcb007107u, 32, 80, 80 },
		/* A one-port range is that port. */
		{ "example.org:5-5", "example.org:5", SPEC_NET_HOST, "example.org", 0, 0, 5, 5 },
		/* Edges of addresses, prefixes and ports. */
		{ "0.0.0.0/0:1-65535", "0.0.0.0/0:1-65535", SPEC_NET_CIDR, "", 0, 0, 1, 65535 },
		{ "255.255.255.255:65535", "255.255.255.255:65535", SPEC_NET_CIDR, "", 0xffffffffu, 32, 65535, 65535 },
		{ "10.0.0.0/8:53", "10.0.0.0/8:53", SPEC_NET_CIDR, "", 0x0a000000u, 8, 53, 53 },
		{ "128.0.0.0/1:9", "128.0.0.0/1:9", SPEC_NET_CIDR, "", 0x80000000u, 1, 9, 9 },
		{ "192.0.2.254/31:9", "192.0.2.254/31:9", SPEC_NET_CIDR, "", 0xc00002feu, 31, 9, 9 },
		{ "0.0.0.0:1", "0.0.0.0:1", SPEC_NET_CIDR, "", 0, 32, 1, 1 },
		/* Digits and hyphens inside labels; only the last label must have a non-digit. */
		{ "1.2.3.4.example:443", "1.2.3.4.example:443", SPEC_NET_HOST, "1.2.3.4.example", 0, 0, 443, 443 },
		{ "xn--bcher-kva.Example:443", "xn--bcher-kva.example:443", SPEC_NET_HOST, "xn--bcher-kva.example", 0, 0,
		  443, 443 },
		{ "a-b.c-d:1", "a-b.c-d:1", SPEC_NET_HOST, "a-b.c-d", 0, 0, 1, 1 },
		{ "a.b1:1", "a.b1:1", SPEC_NET_HOST, "a.b1", 0, 0, 1, 1 },
		{ "*.a.b:65535", "*.a.b:65535", SPEC_NET_WILDCARD, "a.b", 0, 0, 65535, 65535 },
		{ "*.x.y.z:1000-2000", "*.x.y.z:1000-2000", SPEC_NET_WILDCARD, "x.y.z", 0, 0, 1000, 2000 },
	};
	char json[512];
	struct task_spec s;
	size_t i;

	for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		const struct spec_net_rule *r;

		snprintf(json, sizeof(json), "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[\"%s\"]}}",
			 ok[i].rule);
		parse_ok(json, &s);
		assert_int_equal(s.nnet_rules, 1);
		r = &s.net_rules[0];
		assert_int_equal(r->kind, ok[i].kind);
		assert_string_equal(r->host, ok[i].host);
		assert_int_equal(r->addr, ok[i].addr);
		assert_int_equal(r->prefix, ok[i].prefix);
		assert_int_equal(r->port_lo, ok[i].lo);
		assert_int_equal(r->port_hi, ok[i].hi);
		check_rule_format(r, ok[i].norm);
		spec_free(&s);
	}

	/* The key order inside "network" does not matter. */
	parse_ok("{\"argv\":[\"x\"],\"network\":{\"allow\":[\"a.org:1\"],\"egress\":\"allow\"}}", &s);
	assert_int_equal(s.egress, 1);
	assert_int_equal(s.nnet_rules, 1);
	spec_free(&s);
}

static void test_network_format(void **state)
{
	struct spec_net_rule r;
	char small[8], text[SPEC_NET_RULE_TEXT];

	/* The longest rule fits SPEC_NET_RULE_TEXT exactly or better. */
	memset(&r, 0, sizeof(r));
	r.kind = SPEC_NET_WILDCARD;
	memset(r.host, 'a', SPEC_MAX_NET_HOST);
	r.host[SPEC_MAX_NET_HOST] = '\0';
	r.port_lo = 65534;
	r.port_hi = 65535;
	spec_net_rule_format(&r, text, sizeof(text));
	assert_int_equal(strlen(text), 2 + SPEC_MAX_NET_HOST + 12);
	assert_true(strlen(text) < sizeof(text));
	assert_string_equal(text + 2 + SPEC_MAX_NET_HOST, ":65534-65535");

	/* A short buffer is truncated and still NUL-terminated. */
	r.kind = SPEC_NET_CIDR;
	r.host[0] = '\0';
	r.addr = 0xcb007100u;
	r.prefix = 24;
	memset(small, 'x', sizeof(small));
	spec_net_rule_format(&r, small, sizeof(small));
	assert_string_equal(small, "203.0.1");
}

/* Rule `rule` (JSON string body) as network.allow[1] is refused with
 * network.allow[1]: "<shown>": <why>... */
static void reject_rule(const char *rule, const char *shown, const char *why)
{
	char json[1024], want[512];

	snprintf(json, sizeof(json),
		 "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[\"example.org:443\",\"%s\"]}}", rule);
	snprintf(want, sizeof(want), "\"%s\": %s", shown ? shown : rule, why);
	reject(json, "network.allow[1]", want);
}

static void test_reject_network_rules(void **state)
{
	static const char *const bad_ip[] = {
		"010.0.0.1:80", "10.0.0.01:80", "00.0.0.0:80", "1.2.3:80", "1.2.3.4.5:80", "256.1.1.1:80",
		"1.2.3.1000:80", "1..2.3:80", "1.2.3.4.:80", ".1.2.3.4:80", "1234:80",
		"example.org/24:443", "/24:443",
	};
	static const char *const bad_prefix[] = {
		"10.0.0.0/33:80", "10.0.0.0/08:80", "10.0.0.0/00:80", "10.0.0.0/:80", "10.0.0.0/8/8:80",
		"10.0.0.0/-8:80", "10.0.0.0/99999:80",
	};
	static const char *const bad_port[] = {
		"example.org:0", "example.org:65536", "example.org:080", "example.org:+80", "example.org:80 ",
		"example.org:-80", "example.org:80-", "example.org:1-2-3", "example.org:http", "example.org:99999999",
		"example.org:1-0", "example.org:0-1", "example.org:1-65536", "example.org:8000-08100",
		"10.0.0.0/8:x",
	};
	static const char *const ipv6[] = {
		"[::1]:443", "::1:443", "2001:db8::1:443", "[2001:db8::]/32:443", "a:b:c", "[example.org]:443",
		"example.org:443:1",
	};
	static const char *const bad_wild[] = {
		"a.*.b:1", "*example.org:1", "*:1", "*.*.example.org:1", "**.example.org:1", "example.*:1",
		"*.example.*:1", ".*.example.org:1", "x*.example.org:1",
	};
	char name[300], rule[400], shown[80];
	size_t i;

	for (i = 0; i < sizeof(bad_ip) / sizeof(bad_ip[0]); i++)
		reject_rule(bad_ip[i], NULL, "not a valid IPv4 address");
	for (i = 0; i < sizeof(bad_prefix) / sizeof(bad_prefix[0]); i++)
		reject_rule(bad_prefix[i], NULL, "the prefix length must be a number from 0 to 32");
	for (i = 0; i < sizeof(bad_port) / sizeof(bad_port[0]); i++)
		reject_rule(bad_port[i], NULL, "the port must be a number from 1 to 65535 without leading zeros");
	for (i = 0; i < sizeof(ipv6) / sizeof(ipv6[0]); i++)
		reject_rule(ipv6[i], NULL, "IPv6 is not supported");
	for (i = 0; i < sizeof(bad_wild) / sizeof(bad_wild[0]); i++)
		reject_rule(bad_wild[i], NULL, "only a leading \"*.\" wildcard is allowed");

	/* CIDR with host bits set names the network it probably meant. */
	reject_rule("203.0.113.5/24:443", NULL, "the host bits are set (the network is 203.0.113.0/24)");
	reject_rule("10.1.0.0/8:1", NULL, "the host bits are set (the network is 10.0.0.0/8)");
	reject_rule("0.0.0.1/0:1", NULL, "the host bits are set (the network is 0.0.0.0/0)");
	reject_rule("192.0.2.255/31:1", NULL, "the host bits are set (the network is 192.0.2.254/31)");

	/* Ports. */
	reject_rule("example.org", NULL, "a port is required");
	reject_rule("203.0.113.7", NULL, "a port is required");
	reject_rule("203.0.113.0/24", NULL, "a port is required");
	reject_rule("*.example.org", NULL, "a port is required");
	reject_rule("example.org:", NULL, "the port is empty");
	reject_rule(":443", NULL, "the destination before ':' is empty");
	reject_rule("", NULL, "a port is required");
	reject_rule("example.org:8100-8000", NULL, "the port range 8100-8000 is reversed");
	reject_rule("example.org:2-1", NULL, "the port range 2-1 is reversed");

	/* Host names. */
	reject_rule("exa mple.org:443", NULL, "' ' is not allowed in a host name (letters, digits, '-' and '.')");
	reject_rule("under_score.example:80", NULL, "'_' is not allowed in a host name");
	reject_rule("_sip._tcp.example.org:5060", NULL, "'_' is not allowed in a host name");
	reject_rule("a+b.example:80", NULL, "'+' is not allowed in a host name");
	reject_rule("\\u00e9.example:80", "\\xc3\\xa9.example:80", "byte 0xc3 is not allowed in a host name");
	reject_rule("a\\tb.example:80", "a\\x09b.example:80", "byte 0x09 is not allowed in a host name");
	reject_rule("example.org.:443", NULL, "the host name must not end with '.'");
	reject_rule(".:443", NULL, "the host name must not end with '.'");
	reject_rule(".example.org:443", NULL, "the host name has an empty label");
	reject_rule("a..org:1", NULL, "the host name has an empty label");
	reject_rule("-a.org:1", NULL, "a label of the host name starts or ends with '-'");
	reject_rule("a-.org:1", NULL, "a label of the host name starts or ends with '-'");
	reject_rule("a.-org:1", NULL, "a label of the host name starts or ends with '-'");
	reject_rule("a.org-:1", NULL, "a label of the host name starts or ends with '-'");
	reject_rule("localhost:80", NULL, "the host name needs at least two labels");
	reject_rule("Example:80", NULL, "the host name needs at least two labels");
	reject_rule("example.123:80", NULL, "the last label of the host name must not be all digits");
	reject_rule("a.b.0:80", NULL, "the last label of the host name must not be all digits");
	reject_rule("1.2.3.-1:80", NULL, "a label of the host name starts or ends with '-'");

	/* Wildcard suffixes obey the same rules. */
	reject_rule("*.org:443", NULL, "the wildcard suffix needs at least two labels");
	reject_rule("*.:443", NULL, "the wildcard suffix is empty");
	reject_rule("*.example.org.:443", NULL, "the wildcard suffix must not end with '.'");
	reject_rule("*..example.org:443", NULL, "the wildcard suffix has an empty label");
	reject_rule("*.-x.org:443", NULL, "a label of the wildcard suffix starts or ends with '-'");
	reject_rule("*.example.42:443", NULL, "the last label of the wildcard suffix must not be all digits");
	reject_rule("*.ex_ample.org:443", NULL, "'_' is not allowed in a wildcard suffix");

	/* Labels of 63 bytes are fine, 64 are not; names of 253 bytes are
	 * fine, 254 are not (also as a wildcard suffix). */
	memset(name, 'l', 63);
	snprintf(name + 63, sizeof(name) - 63, ".org");
	snprintf(rule, sizeof(rule), "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[\"%s:1\"]}}",
		 name);
	{
		struct task_spec s;

		parse_ok(rule, &s);
		assert_int_equal(strlen(s.net_rules[0].host), 67);
		spec_free(&s);
	}
	memset(name, 'l', 64);
	snprintf(name + 64, sizeof(name) - 64, ".org");
	snprintf(rule, sizeof(rule), "%s:1", name);
	snprintf(shown, sizeof(shown), "%.48s...", rule);
	reject_rule(rule, shown, "the host name has a label longer than 63 bytes");

	/* 253 bytes: labels of 49 bytes and a last one of 3. */
	for (i = 0; i < 253; i++)
		name[i] = i % 50 == 49 ? '.' : 'h';
	name[253] = '\0';
	{
		struct task_spec s;
		char json[700];

		snprintf(json, sizeof(json), "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":"
			 "[\"%s:1\",\"*.%s:2\"]}}", name, name);
		parse_ok(json, &s);
		assert_int_equal(s.nnet_rules, 2);
		assert_int_equal(strlen(s.net_rules[0].host), 253);
		assert_int_equal(strlen(s.net_rules[1].host), 253);
		spec_free(&s);
	}
	name[253] = 'h';
	name[254] = '\0';
	snprintf(rule, sizeof(rule), "%s:1", name);
	snprintf(shown, sizeof(shown), "%.48s...", rule);
	reject_rule(rule, shown, "the host name is longer than 253 bytes");
	snprintf(rule, sizeof(rule), "*.%s:1", name);
	snprintf(shown, sizeof(shown), "%.48s...", rule);
	reject_rule(rule, shown, "the wildcard suffix is longer than 253 bytes");
}

static void test_reject_network_limits(void **state)
{
	const char *rules[SPEC_MAX_NET_RULES + 1];
	char names[SPEC_MAX_NET_RULES + 1][32], want[128];
	struct sbuf b = { 0 };
	struct kiln_err err;
	struct task_spec s;
	size_t i;

	/* 64 rules are accepted, 65 are not. */
	for (i = 0; i <= SPEC_MAX_NET_RULES; i++) {
		snprintf(names[i], sizeof(names[i]), "h%zu.example:%zu", i, 1000 + i);
		rules[i] = names[i];
	}
	net_spec(&b, rules, SPEC_MAX_NET_RULES);
	parse_ok_n(b.s, b.len, &s);
	assert_int_equal(s.nnet_rules, SPEC_MAX_NET_RULES);
	assert_string_equal(s.net_rules[SPEC_MAX_NET_RULES - 1].host, "h63.example");
	assert_int_equal(s.net_rules[SPEC_MAX_NET_RULES - 1].port_lo, 1063);
	spec_free(&s);
	net_spec(&b, rules, SPEC_MAX_NET_RULES + 1);
	reject_n(b.s, b.len, "network.allow", "must have 0 to 64 entries (got 65)");

	/* No valid rule comes near 300 bytes, but an entry of 300 is looked
	 * at (and refused for its port); one of 301 is refused for its length. */
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[\"x.org:");
	sb_repeat(&b, '1', SPEC_MAX_NET_RULE_BYTES - 6);
	sb_add(&b, "\"]}}");
	reject_n(b.s, b.len, "network.allow[0]", "the port must be a number from 1 to 65535");
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[\"x.org:");
	sb_repeat(&b, '1', SPEC_MAX_NET_RULE_BYTES - 5);
	sb_add(&b, "\"]}}");
	reject_n(b.s, b.len, "network.allow[0]", "...\": must be at most 300 bytes (got 301)");

	/* A hostile value is echoed cut short, as printable ASCII. */
	b.len = 0;
	sb_add(&b, "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[\"a.org:1\",\"\\u001b[31m");
	sb_repeat(&b, 'z', SPEC_MAX_NET_RULE_BYTES - 4);
	sb_add(&b, "\"]}}");
	assert_int_equal(spec_parse(b.s, b.len, &s, &err), -1);
	assert_string_equal(err.code, "invalid_spec");
	snprintf(want, sizeof(want), "network.allow[1]: \"\\x1b[31mzzz");
	assert_int_equal(strncmp(err.message, want, strlen(want)), 0);
	assert_non_null(strstr(err.message, "zzz...\": must be at most 300 bytes (got 301)"));
	assert_true(strlen(err.message) < 200);
	free(b.s);
}

static void test_reject_network_duplicates(void **state)
{
	static const struct reject_case cases[] = {
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":"
		  "[\"example.org:443\",\"a.org:1\",\"EXAMPLE.org:443\"]}}",
		  "network.allow[2]", "\"EXAMPLE.org:443\": duplicates network.allow[0]" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":"
		  "[\"203.0.113.7:80\",\"203.0.113.7/32:80\"]}}",
		  "network.allow[1]", "\"203.0.113.7/32:80\": duplicates network.allow[0]" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":"
		  "[\"*.a.org:1-2\",\"b.org:3\",\"*.A.org:1-2\"]}}",
		  "network.allow[2]", "duplicates network.allow[0]" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[\"x.org:5\",\"x.org:5-5\"]}}",
		  "network.allow[1]", "\"x.org:5-5\": duplicates network.allow[0]" },
		{ "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[\"a.org:1\",\"x.org:5\",\"x.org:5\"]}}",
		  "network.allow[2]", "duplicates network.allow[1]" },
	};
	struct kiln_err err = { .code = "" };
	struct task_spec s;
	const char *json;

	REJECT_ALL(cases);

	/* The whole message, as the API client sees it. */
	json = "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":"
	       "[\"a.org:1\",\"b.org:2\",\"exa mple.org:443\"]}}";
	assert_int_equal(spec_parse(json, strlen(json), &s, &err), -1);
	assert_string_equal(err.code, "invalid_spec");
	assert_string_equal(err.message, "network.allow[2]: \"exa mple.org:443\": ' ' is not allowed in a "
			    "host name (letters, digits, '-' and '.')");

	/* Overlapping but different rules are not duplicates. */
	parse_ok("{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":["
		 "\"example.org:443\",\"example.org:444\",\"example.org:443-444\",\"*.example.org:443\","
		 "\"10.0.0.0/8:1\",\"10.0.0.0/16:1\",\"10.0.0.0:1\",\"www.example.org:443\"]}}", &s);
	assert_int_equal(s.nnet_rules, 8);
	assert_int_equal(s.net_rules[3].kind, SPEC_NET_WILDCARD);
	assert_string_equal(s.net_rules[3].host, "example.org");
	spec_free(&s);
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

	assert_int_equal(kiln_err_set(&e, KERR_VM_ERROR, "boot failed: %d", 5), -1);
	assert_string_equal(e.code, "vm_error");
	assert_int_equal(e.errc, KERR_VM_ERROR);
	assert_string_equal(e.message, "boot failed: 5");
	memset(longer, 'x', sizeof(longer) - 1);
	longer[sizeof(longer) - 1] = '\0';
	kiln_err_set(&e, KERR_HOST_ERROR, "%s", longer);
	assert_string_equal(e.code, "host_error");
	assert_int_equal(strlen(e.message), sizeof(e.message) - 1);
	assert_int_equal(kiln_err_set(NULL, KERR_INTERNAL, "y"), -1);
}

static void test_template(void **state)
{
	static const struct reject_case bad[] = {
		{ "{\"argv\":[\"x\"],\"template\":\"\"}", "template", "1-63 characters" },
		{ "{\"argv\":[\"x\"],\"template\":\"Data\"}", "template", "a-z, 0-9" },
		{ "{\"argv\":[\"x\"],\"template\":\"-x\"}", "template", "starting with" },
		{ "{\"argv\":[\"x\"],\"template\":\"a/b\"}", "template", "a-z, 0-9" },
		{ "{\"argv\":[\"x\"],\"template\":7}", "template", "must be a string" },
		{ "{\"argv\":[\"x\"],\"template\":\"a\\u0000\"}", "template", "NUL" },
		{ "{\"argv\":[\"x\"],\"template\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}", "template",
		  "1-63" },
	};
	struct task_spec s;
	struct kiln_err err;
	const char *ok = "{\"argv\":[\"x\"],\"template\":\"python-data.v2_x\",\"cwd\":\"/srv\"}";

	(void)state;
	REJECT_ALL(bad);
	assert_int_equal(spec_parse(ok, strlen(ok), &s, &err), 0);
	assert_string_equal(s.template_name, "python-data.v2_x");
	assert_int_equal(s.cwd_set, 1);
	spec_free(&s);
	assert_int_equal(spec_parse("{\"argv\":[\"x\"]}", 14, &s, &err), 0);
	assert_null(s.template_name);
	assert_int_equal(s.cwd_set, 0);
	assert_string_equal(s.cwd, SPEC_DEFAULT_CWD);
	spec_free(&s);
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
		cmocka_unit_test(test_network_allow),
		cmocka_unit_test(test_network_normalize),
		cmocka_unit_test(test_network_format),
		cmocka_unit_test(test_reject_network_rules),
		cmocka_unit_test(test_reject_network_limits),
		cmocka_unit_test(test_reject_network_duplicates),
		cmocka_unit_test(test_reject_oversized_document),
		cmocka_unit_test(test_json_nodes),
		cmocka_unit_test(test_template),
		cmocka_unit_test(test_err_set),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
