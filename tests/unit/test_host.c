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

#include "excerpt.h"
#include "outdir.h"
#include "qcow2.h"
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
	struct buf b = { 0 };
	char chunk[1000];

	memset(chunk, 'x', sizeof(chunk));
	for (int i = 0; i < 100; i++)
		assert_int_equal(buf_add(&b, chunk, sizeof(chunk)), 0);
	assert_int_equal(b.len, 100000);
	assert_true(b.cap >= b.len);
	buf_free(&b);
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

/* A bounded capture keeps head and tail whatever the stream's length and
 * however it arrives in pieces; short streams come back whole. */
static void textcap_bounded(void **state)
{
	struct textcap c = { .keep = 8 };
	struct buf h, t;
	char big[100];

	(void)state;
	assert_int_equal(textcap_append(&c, "0123456789abcdef", 16), 0);
	assert_false(textcap_cut(&c)); /* exactly 2 * keep: whole */
	textcap_head(&c, &h);
	assert_int_equal(h.len, 16);
	assert_memory_equal(h.p, "0123456789abcdef", 16);
	buf_free(&h);
	assert_int_equal(textcap_append(&c, "g", 1), 0);
	assert_true(textcap_cut(&c));
	textcap_head(&c, &h);
	textcap_tail(&c, &t);
	assert_int_equal(h.len, 8);
	assert_memory_equal(h.p, "01234567", 8);
	assert_int_equal(t.len, 8);
	assert_memory_equal(t.p, "9abcdefg", 8);
	buf_free(&h);
	buf_free(&t);
	/* A piece larger than the ring, then byte by byte across its wrap. */
	for (int i = 0; i < 100; i++)
		big[i] = (char)('A' + i % 26);
	assert_int_equal(textcap_append(&c, big, sizeof(big)), 0);
	for (int i = 0; i < 5; i++)
		assert_int_equal(textcap_append(&c, "xyz" + i % 3, 1), 0);
	assert_int_equal(c.total, 16 + 1 + 100 + 5);
	assert_true(c.head.len == 8 && c.ring_len == 8);
	textcap_tail(&c, &t);
	assert_memory_equal(t.p, "TUVxyzxy", 8); /* big ends ...STUV (99 % 26 = 21: V) */
	buf_free(&t);
	textcap_free(&c);
	/* keep 0: everything. */
	c = (struct textcap){ 0 };
	assert_int_equal(textcap_append(&c, big, sizeof(big)), 0);
	assert_false(textcap_cut(&c));
	assert_int_equal(c.head.len, 100);
	textcap_free(&c);
}

/* A result with whole streams (an older record, another host) is cut to
 * head and tail on character boundaries and marked. */
static void excerpt_cuts_results(void **state)
{
	json_t *r = json_pack("{s:s, s:s, s:b}", "stdout", "aa\xc3\xa9" "bbbbbb\xc3\xa9" "cc", "stderr", "abc",
			      "stdout_truncated", 0);

	(void)state;
	assert_int_equal(excerpt_result(r, 3), 1);
	assert_string_equal(json_string_value(json_object_get(r, "stdout")), "aa");
	assert_string_equal(json_string_value(json_object_get(r, "stdout_tail")), "cc");
	assert_true(json_is_true(json_object_get(r, "stdout_truncated")));
	assert_int_equal(json_integer_value(json_object_get(r, "stdout_bytes")), 14);
	assert_string_equal(json_string_value(json_object_get(r, "stderr")), "abc");
	assert_null(json_object_get(r, "stderr_tail"));
	assert_int_equal(excerpt_result(r, 3), 0); /* already bounded */
	json_object_set_new(r, "stderr_tail", json_string("0123456789"));
	assert_int_equal(excerpt_result(r, 4), 1);
	assert_string_equal(json_string_value(json_object_get(r, "stderr_tail")), "6789");
	json_decref(r);
}

static void outdir_creates_nested(void **state)
{
	struct kiln_err err;
	struct stat st;
	char path[256];
	int dfd = outdir_open(tmpl, &err), fd;

	assert_true(dfd >= 0);
	fd = outdir_create(dfd, "a/b/c.txt", 04755, NULL, &err);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "hi", 2), 2);
	close(fd);
	snprintf(path, sizeof(path), "%s/a/b/c.txt", tmpl);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, 2);
	assert_int_equal(st.st_mode & 07777, 0755); /* setuid dropped */
	/* An existing file is never overwritten. */
	assert_int_equal(outdir_create(dfd, "a/b/c.txt", 0644, NULL, &err), -1);
	close(dfd);
}

static void outdir_refuses_escapes(void **state)
{
	struct kiln_err err;
	char link[256], victim[256];
	int dfd = outdir_open(tmpl, &err);

	assert_int_equal(outdir_create(dfd, "../x", 0644, NULL, &err), -1);
	assert_int_equal(outdir_create(dfd, "/etc/x", 0644, NULL, &err), -1);
	assert_int_equal(outdir_create(dfd, "a//x", 0644, NULL, &err), -1);
	assert_int_equal(outdir_mkdir(dfd, "a/./b", NULL, &err), -1);
	/* A symlink planted in the output directory is not followed. */
	snprintf(victim, sizeof(victim), "%s-victim", tmpl);
	mkdir(victim, 0755);
	snprintf(link, sizeof(link), "%s/sneaky", tmpl);
	assert_int_equal(symlink(victim, link), 0);
	assert_int_equal(outdir_create(dfd, "sneaky/x", 0644, NULL, &err), -1);
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

/* A session's disk layer is checked before qemu-img (as root) opens it. */
static void qcow2_overlay_checked(void **state)
{
	static const char want[] = "/var/cache/kiln/snapshots/0123456789abcdef/disk.qcow2";
	char dir[] = "/tmp/kiln-qcow2.XXXXXX", path[64], cmd[512];
	uint8_t h[QCOW2_HEADER_MAX], x[QCOW2_HEADER_MAX];
	struct kiln_err err = { .code = "" };
	ssize_t n;
	int fd;

	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/disk.qcow2", dir);
	/* What kiln makes: qemu-img create -b on the template (-u: it need not exist). */
	snprintf(cmd, sizeof(cmd), "qemu-img create -q -f qcow2 -F qcow2 -u -b %s %s 64M", want, path);
	if (system(cmd) != 0) {
		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		assert_int_equal(system(cmd), 0);
		skip(); /* no qemu-img: scripts/deps.sh installs qemu-utils */
	}
	assert_int_equal(qcow2_file_check(path, want, &err), 0);
	/* The same template on another host: another directory, same key. */
	assert_int_equal(qcow2_file_check(path, "/srv/kiln/snapshots/0123456789abcdef/disk.qcow2", &err), 0);
	assert_int_equal(qcow2_file_check(path, "/var/cache/kiln/snapshots/fedcba9876543210/disk.qcow2", &err), -1);
	assert_string_equal(err.code, "snapshot_corrupt");
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	n = read(fd, h, sizeof(h));
	close(fd);
	assert_true(n >= 512);
	/* Bad magic; version 4; an external data file (incompatible bit 2); an
	 * encrypted image; a data-file name extension; the backing name past
	 * the buffer; clusters of 2 MiB. */
	memcpy(x, h, (size_t)n);
	x[0] = 'X';
	assert_int_equal(qcow2_header_check(x, (size_t)n, want, &err), -1);
	memcpy(x, h, (size_t)n);
	x[7] = 4;
	assert_int_equal(qcow2_header_check(x, (size_t)n, want, &err), -1);
	memcpy(x, h, (size_t)n);
	x[79] = 0x04;
	assert_int_equal(qcow2_header_check(x, (size_t)n, want, &err), -1);
	assert_non_null(strstr(err.message, "incompatible"));
	memcpy(x, h, (size_t)n);
	x[35] = 1;
	assert_int_equal(qcow2_header_check(x, (size_t)n, want, &err), -1);
	memcpy(x, h, (size_t)n);
	{
		uint32_t hl = (uint32_t)x[100] << 24 | x[101] << 16 | x[102] << 8 | x[103];

		memcpy(x + hl, "\x44\x41\x54\x41", 4); /* "DATA": the external data file's name */
	}
	assert_int_equal(qcow2_header_check(x, (size_t)n, want, &err), -1);
	memcpy(x, h, (size_t)n);
	x[8] = 0x7f;
	assert_int_equal(qcow2_header_check(x, (size_t)n, want, &err), -1);
	memcpy(x, h, (size_t)n);
	x[23] = 21;
	assert_int_equal(qcow2_header_check(x, (size_t)n, want, &err), -1);
	/* Truncated anywhere: refused, never read past. */
	for (size_t len = 0; len < 128; len++)
		assert_int_equal(qcow2_header_check(h, len, want, &err), -1);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(utf8_valid_kept),
		cmocka_unit_test(utf8_invalid_replaced),
		cmocka_unit_test(textbuf_grows),
		cmocka_unit_test(textcap_bounded),
		cmocka_unit_test(excerpt_cuts_results),
		cmocka_unit_test_setup_teardown(outdir_creates_nested, outdir_setup, outdir_teardown),
		cmocka_unit_test_setup_teardown(outdir_refuses_escapes, outdir_setup, outdir_teardown),
		cmocka_unit_test(qmp_kinds),
		cmocka_unit_test(qmp_rejects),
		cmocka_unit_test(qcow2_overlay_checked),
	};

	return cmocka_run_group_tests_name("host", tests, NULL, NULL);
}
