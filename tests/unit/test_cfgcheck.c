/* test_cfgcheck: the check-config report (lib/cfgcheck.h): a line per
 * setting used, one line per problem however many newlines a library's
 * message holds, directories that exist, can be created or cannot (a file
 * on the way), files that cannot be read, and S3 on a closed loopback port
 * reported with the endpoint and bucket. Nothing is created. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cfgcheck.h"

struct rep {
	struct cfgcheck c;
	char *out, *problems;
	size_t out_n, problems_n;
};

static void rep_open(struct rep *r)
{
	memset(r, 0, sizeof(*r));
	r->c.out = open_memstream(&r->out, &r->out_n);
	r->c.problems = open_memstream(&r->problems, &r->problems_n);
	assert_non_null(r->c.out);
	assert_non_null(r->c.problems);
}

static void rep_close(struct rep *r)
{
	fclose(r->c.out);
	fclose(r->c.problems);
}

static void rep_free(struct rep *r)
{
	free(r->out);
	free(r->problems);
}

static void test_lines(void **state)
{
	struct rep r;

	rep_open(&r);
	cfgcheck_use(&r.c, "listen", "%s", "127.0.0.1:1");
	cfgcheck_error(&r.c, "store.postgres", "connection refused\n\tIs the server running?\n");
	cfgcheck_warn(&r.c, "admin_key", "not set");
	rep_close(&r);
	assert_int_equal(r.c.errors, 1);
	assert_int_equal(r.c.warnings, 1);
	assert_non_null(strstr(r.out, "  listen"));
	assert_non_null(strstr(r.out, "127.0.0.1:1\n"));
	assert_string_equal(r.problems, "error: store.postgres: connection refused  Is the server running?\n"
					"warning: admin_key: not set\n");
	rep_free(&r);
}

static void test_dir(void **state)
{
	char tmp[] = "/tmp/test-cfgcheck.XXXXXX", path[256];
	struct rep r;
	FILE *f;

	assert_non_null(mkdtemp(tmp));
	rep_open(&r);
	assert_int_equal(cfgcheck_dir(&r.c, "cache", tmp), 0);
	snprintf(path, sizeof(path), "%s/a/b/c", tmp);
	assert_int_equal(cfgcheck_dir(&r.c, "spool_dir", path), 0);
	snprintf(path, sizeof(path), "%s/file", tmp);
	f = fopen(path, "w");
	assert_non_null(f);
	fclose(f);
	snprintf(path, sizeof(path), "%s/file/run", tmp);
	assert_int_equal(cfgcheck_dir(&r.c, "run_dir", path), -1);
	assert_int_equal(cfgcheck_dir(&r.c, "run_dir", ""), -1);
	rep_close(&r);
	assert_int_equal(r.c.errors, 2);
	assert_non_null(strstr(r.out, "(writable, "));
	assert_non_null(strstr(r.out, "/a/b/c (will be created, "));
	assert_non_null(strstr(r.problems, "error: run_dir: "));
	assert_non_null(strstr(r.problems, "/file is not a directory (needed for "));
	assert_non_null(strstr(r.problems, "error: run_dir: empty path\n"));
	/* Checked, not created. */
	snprintf(path, sizeof(path), "%s/a", tmp);
	assert_int_equal(access(path, F_OK), -1);
	snprintf(path, sizeof(path), "%s/file", tmp);
	unlink(path);
	rmdir(tmp);
	rep_free(&r);
}

static void test_file(void **state)
{
	struct rep r;

	rep_open(&r);
	assert_int_equal(cfgcheck_file(&r.c, "image_dir (vmlinux)", "/nonexistent/vmlinux"), -1);
	assert_int_equal(cfgcheck_file(&r.c, "image_dir (vmlinux)", "/tmp"), -1);
	assert_int_equal(cfgcheck_file(&r.c, "x", "/proc/self/exe"), 0);
	rep_close(&r);
	assert_int_equal(r.c.errors, 2);
	assert_non_null(strstr(r.problems, "error: image_dir (vmlinux): cannot read /nonexistent/vmlinux: No such file"));
	assert_non_null(strstr(r.problems, "error: image_dir (vmlinux): /tmp is not a regular file\n"));
	rep_free(&r);
}

/* Port 9 (discard) on loopback: nothing listens there on a test machine,
 * so the connection is refused at once. */
static void test_s3_closed(void **state)
{
	struct s3_config s3 = { .endpoint = "http://127.0.0.1:9", .region = "us-east-1", .bucket = "kiln-b1",
				.access_key = "ak", .secret_key = "sk" };
	struct rep r;

	s3_global_init();
	rep_open(&r);
	assert_int_equal(cfgcheck_s3(&r.c, "s3", &s3), -1);
	rep_close(&r);
	assert_int_equal(r.c.errors, 1);
	assert_non_null(strstr(r.out, "http://127.0.0.1:9 bucket kiln-b1 region us-east-1"));
	assert_non_null(strstr(r.problems, "error: s3: endpoint http://127.0.0.1:9 bucket kiln-b1: "));
	assert_non_null(strstr(r.problems, "(s3_unavailable)\n"));
	rep_free(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lines),
		cmocka_unit_test(test_dir),
		cmocka_unit_test(test_file),
		cmocka_unit_test(test_s3_closed),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
