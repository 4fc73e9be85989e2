/* Unit tests for host-side helpers: UTF-8 sanitising, safe output-directory
 * creation, QMP message classification. No VM, no root needed. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "outdir.h"
#include "qmp.h"
#include "textbuf.h"

static void utf8_valid_kept(void **state)
{
	const char *s = "plain ascii, caf\xc3\xa9, \xe2\x82\xac, \xf0\x9f\x98\x80";
	char *out = textbuf_to_utf8(s, strlen(s));

	assert_string_equal(out, s);
	free(out);
}

static void utf8_invalid_replaced(void **state)
{
	/* lone continuation, overlong '/', surrogate, truncated sequence, NUL */
	const char in[] = "a\x80" "b\xc0\xaf" "c\xed\xa0\x80" "d\xe2\x82" "\0e";
	char *out = textbuf_to_utf8(in, sizeof(in) - 1);

	assert_string_equal(out, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd" "c\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
				 "d\xef\xbf\xbd\xef\xbf\xbd" "\xef\xbf\xbd" "e");
	free(out);
}

static void textbuf_grows(void **state)
{
	struct textbuf b = { 0 };
	char chunk[1000];

	memset(chunk, 'x', sizeof(chunk));
	for (int i = 0; i < 100; i++)
		assert_int_equal(textbuf_append(&b, chunk, sizeof(chunk)), 0);
	assert_int_equal(b.len, 100000);
	assert_true(b.cap >= b.len);
	textbuf_free(&b);
	assert_null(b.p);
}

static char tmpl[64];

static int outdir_setup(void **state)
{
	snprintf(tmpl, sizeof(tmpl), "/tmp/kiln-unit.XXXXXX");
	return mkdtemp(tmpl) ? 0 : -1;
}

static int outdir_teardown(void **state)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpl);
	return system(cmd) == 0 ? 0 : -1;
}

static void outdir_creates_nested(void **state)
{
	struct kiln_err err;
	struct stat st;
	char path[256];
	int dfd = outdir_open(tmpl, &err), fd;

	assert_true(dfd >= 0);
	fd = outdir_create(dfd, "a/b/c.txt", 04755, &err);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "hi", 2), 2);
	close(fd);
	snprintf(path, sizeof(path), "%s/a/b/c.txt", tmpl);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, 2);
	assert_int_equal(st.st_mode & 07777, 0755); /* setuid dropped */
	/* An existing file is never overwritten. */
	assert_int_equal(outdir_create(dfd, "a/b/c.txt", 0644, &err), -1);
	close(dfd);
}

static void outdir_refuses_escapes(void **state)
{
	struct kiln_err err;
	char link[256], victim[256];
	int dfd = outdir_open(tmpl, &err);

	assert_int_equal(outdir_create(dfd, "../x", 0644, &err), -1);
	assert_int_equal(outdir_create(dfd, "/etc/x", 0644, &err), -1);
	assert_int_equal(outdir_create(dfd, "a//x", 0644, &err), -1);
	assert_int_equal(outdir_mkdir(dfd, "a/./b", &err), -1);
	/* A symlink planted in the output directory is not followed. */
	snprintf(victim, sizeof(victim), "%s-victim", tmpl);
	mkdir(victim, 0755);
	snprintf(link, sizeof(link), "%s/sneaky", tmpl);
	assert_int_equal(symlink(victim, link), 0);
	assert_int_equal(outdir_create(dfd, "sneaky/x", 0644, &err), -1);
	snprintf(link, sizeof(link), "%s/x", victim);
	assert_int_equal(access(link, F_OK), -1);
	rmdir(victim);
	close(dfd);
}

static void qmp_kinds(void **state)
{
	struct qmp_msg m;
	const char *g = "{\"QMP\": {\"version\": {}, \"capabilities\": []}}";
	const char *r = "{\"return\": {\"status\": \"running\"}}";
	const char *e = "{\"error\": {\"class\": \"GenericError\", \"desc\": \"nope\"}}";
	const char *ev = "{\"event\": \"MIGRATION\", \"data\": {\"status\": \"completed\"}}";

	assert_int_equal(qmp_parse(g, strlen(g), &m), 0);
	assert_int_equal(m.kind, QMP_GREETING);
	qmp_msg_free(&m);
	assert_int_equal(qmp_parse(r, strlen(r), &m), 0);
	assert_int_equal(m.kind, QMP_RETURN);
	assert_string_equal(json_string_value(json_object_get(m.ret, "status")), "running");
	qmp_msg_free(&m);
	assert_int_equal(qmp_parse(e, strlen(e), &m), 0);
	assert_int_equal(m.kind, QMP_ERROR);
	assert_string_equal(m.errdesc, "nope");
	qmp_msg_free(&m);
	assert_int_equal(qmp_parse(ev, strlen(ev), &m), 0);
	assert_int_equal(m.kind, QMP_EVENT);
	assert_string_equal(m.event, "MIGRATION");
	qmp_msg_free(&m);
}

static void qmp_rejects(void **state)
{
	struct qmp_msg m;
	const char *bad[] = { "", "[]", "{}", "{\"event\": 1}", "{\"error\": {\"class\": 1}}", "{\"return\"",
			      "{\"return\": 1, \"return\": 2}" };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(qmp_parse(bad[i], strlen(bad[i]), &m), -EPROTO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(utf8_valid_kept),
		cmocka_unit_test(utf8_invalid_replaced),
		cmocka_unit_test(textbuf_grows),
		cmocka_unit_test_setup_teardown(outdir_creates_nested, outdir_setup, outdir_teardown),
		cmocka_unit_test_setup_teardown(outdir_refuses_escapes, outdir_setup, outdir_teardown),
		cmocka_unit_test(qmp_kinds),
		cmocka_unit_test(qmp_rejects),
	};

	return cmocka_run_group_tests_name("host", tests, NULL, NULL);
}
