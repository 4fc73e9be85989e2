/* test_eproto: unit tests for lib/eproto.c, the guest envd protocol: every
 * codec round-trips, and malformed payloads (bad flags, ranges, NULs,
 * truncation, trailing bytes, hostile entries, watch event names outside
 * the watched directory, malformed metadata sets) are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "eproto.h"

static uint8_t pl[PROTO_MAX_PAYLOAD + 64];
static struct eproto_start s_in, s_out;
static struct eproto_proc p_in, p_out;

static void test_start_roundtrip(void **state)
{
	ssize_t n;

	memset(&s_in, 0, sizeof(s_in));
	s_in.req = 7;
	s_in.flags = EP_START_STDIN;
	s_in.user = "user";
	s_in.cwd = "/home/user";
	s_in.tag = "t1";
	s_in.argc = 3;
	s_in.argv[0] = "/bin/bash";
	s_in.argv[1] = "-c";
	s_in.argv[2] = "echo hi";
	s_in.envc = 1;
	s_in.env[0] = "A=1";
	n = eproto_start_encode(pl, sizeof(pl), &s_in);
	assert_true(n > 0);
	assert_int_equal(eproto_start_decode(pl, (size_t)n, &s_out), 0);
	assert_int_equal(s_out.req, 7);
	assert_int_equal(s_out.flags, EP_START_STDIN);
	assert_string_equal(s_out.user, "user");
	assert_string_equal(s_out.cwd, "/home/user");
	assert_string_equal(s_out.tag, "t1");
	assert_int_equal(s_out.argc, 3);
	assert_string_equal(s_out.argv[2], "echo hi");
	assert_null(s_out.argv[3]);
	assert_int_equal(s_out.envc, 1);
	assert_string_equal(s_out.env[0], "A=1");
	/* trailing byte, truncation */
	assert_int_equal(eproto_start_decode(pl, (size_t)n + 1, &s_out), -EPROTO);
	assert_int_equal(eproto_start_decode(pl, (size_t)n - 1, &s_out), -EPROTO);
	assert_int_equal(s_out.argc, 0);
}

static void start_bad(struct eproto_start *m)
{
	ssize_t n = eproto_start_encode(pl, sizeof(pl), m);

	assert_true(n > 0);
	assert_int_equal(eproto_start_decode(pl, (size_t)n, &s_out), -EPROTO);
}

static void test_start_invalid(void **state)
{
	struct eproto_start m;

	memset(&m, 0, sizeof(m));
	m.user = "";
	m.cwd = "";
	m.tag = "";
	m.argc = 1;
	m.argv[0] = "true";
	assert_true(eproto_start_encode(pl, sizeof(pl), &m) > 0);
	assert_int_equal(eproto_start_decode(pl, (size_t)eproto_start_encode(pl, sizeof(pl), &m), &s_out), 0);

	m.flags = 0x80; /* unknown flag */
	start_bad(&m);
	m.flags = EP_START_PTY; /* a pty without a size */
	start_bad(&m);
	m.rows = 24;
	m.cols = 5000; /* too wide */
	start_bad(&m);
	m.flags = 0; /* a size without a pty */
	m.cols = 80;
	start_bad(&m);
	m.rows = m.cols = 0;
	m.user = "../etc"; /* not a user name */
	start_bad(&m);
	m.user = "-root";
	start_bad(&m);
	m.user = "";
	m.env[0] = "=x"; /* empty key */
	m.envc = 1;
	start_bad(&m);
	m.env[0] = "NOEQUALS";
	start_bad(&m);
	m.envc = 0;
	m.argv[0] = ""; /* empty argv[0] */
	start_bad(&m);
}

static void test_proc_roundtrip(void **state)
{
	ssize_t n;

	memset(&p_in, 0, sizeof(p_in));
	p_in.req = 3;
	p_in.pid = 99;
	p_in.tag = "";
	p_in.cwd = "/tmp";
	p_in.argc = 2;
	p_in.argv[0] = "sleep";
	p_in.argv[1] = "5";
	n = eproto_proc_encode(pl, sizeof(pl), &p_in);
	assert_int_equal(eproto_proc_decode(pl, (size_t)n, &p_out), 0);
	assert_int_equal(p_out.pid, 99);
	assert_string_equal(p_out.argv[1], "5");
	p_in.pid = 0; /* no such pid */
	n = eproto_proc_encode(pl, sizeof(pl), &p_in);
	assert_int_equal(eproto_proc_decode(pl, (size_t)n, &p_out), -EPROTO);
}

static void test_entry(void **state)
{
	struct eproto_entry e = { .req = 1, .type = EP_FILE, .mode = 0100644, .size = 12, .uid = 1001, .gid = 1001,
				  .mtime_sec = 1700000000, .mtime_nsec = 5 };
	struct eproto_entry o;
	ssize_t n;

	strcpy(e.owner, "user");
	strcpy(e.group, "user");
	strcpy(e.name, "a.txt");
	strcpy(e.path, "/home/user/a.txt");
	n = eproto_entry_encode(pl, sizeof(pl), &e);
	assert_int_equal(eproto_entry_decode(pl, (size_t)n, &o), 0);
	assert_string_equal(o.path, "/home/user/a.txt");
	assert_int_equal(o.size, 12);
	assert_int_equal(o.mtime_sec, 1700000000);
	/* hostile entries */
	strcpy(e.name, "a/b");
	n = eproto_entry_encode(pl, sizeof(pl), &e);
	assert_int_equal(eproto_entry_decode(pl, (size_t)n, &o), -EPROTO);
	strcpy(e.name, "a");
	e.type = 9;
	n = eproto_entry_encode(pl, sizeof(pl), &e);
	assert_int_equal(eproto_entry_decode(pl, (size_t)n, &o), -EPROTO);
	e.type = EP_DIR;
	e.mtime_nsec = 1000000000u;
	n = eproto_entry_encode(pl, sizeof(pl), &e);
	assert_int_equal(eproto_entry_decode(pl, (size_t)n, &o), -EPROTO);
	e.mtime_nsec = 0;
	e.size = UINT64_MAX;
	n = eproto_entry_encode(pl, sizeof(pl), &e);
	assert_int_equal(eproto_entry_decode(pl, (size_t)n, &o), -EPROTO);
	e.size = 0;
	strcpy(e.path, "relative");
	n = eproto_entry_encode(pl, sizeof(pl), &e);
	assert_int_equal(eproto_entry_decode(pl, (size_t)n, &o), -EPROTO);
}

static void test_fsreq(void **state)
{
	struct eproto_fsreq r = { .req = 4, .depth = 2 }, o;
	ssize_t n;

	strcpy(r.user, "root");
	strcpy(r.path, "/a");
	strcpy(r.path2, "/b");
	n = eproto_fsreq_encode(pl, sizeof(pl), EP_MOVE, &r);
	assert_int_equal(eproto_fsreq_decode(pl, (size_t)n, EP_MOVE, &o), 0);
	assert_string_equal(o.path2, "/b");
	/* the same payload is not a STAT (trailing bytes) */
	assert_int_equal(eproto_fsreq_decode(pl, (size_t)n, EP_STAT, &o), -EPROTO);
	n = eproto_fsreq_encode(pl, sizeof(pl), EP_LISTDIR, &r);
	assert_int_equal(eproto_fsreq_decode(pl, (size_t)n, EP_LISTDIR, &o), 0);
	assert_int_equal(o.depth, 2);
	r.depth = 17;
	n = eproto_fsreq_encode(pl, sizeof(pl), EP_LISTDIR, &r);
	assert_int_equal(eproto_fsreq_decode(pl, (size_t)n, EP_LISTDIR, &o), -EPROTO);
	r.path[0] = '\0';
	n = eproto_fsreq_encode(pl, sizeof(pl), EP_STAT, &r);
	assert_int_equal(eproto_fsreq_decode(pl, (size_t)n, EP_STAT, &o), -EPROTO);
	assert_int_equal(eproto_fsreq_encode(pl, sizeof(pl), EP_HELLO, &r), -EINVAL);
}

/* Metadata sets: built with meta_add, bounded, refused when malformed, and
 * carried by ENTRY and WRITE (absent: the payload of an older peer). */
static void test_meta(void **state)
{
	static struct eproto_entry e, o;
	static struct eproto_fsreq r, ro;
	char big[EPROTO_MAX_META + 16];
	const char *k, *v;
	size_t off = 0;
	ssize_t n;
	int i;

	assert_int_equal(eproto_meta_add(e.meta, &e.meta_len, "author", 6, "mish", 4), 0);
	assert_int_equal(eproto_meta_add(e.meta, &e.meta_len, "purpose", 7, "a b", 3), 0);
	assert_int_equal(eproto_meta_add(e.meta, &e.meta_len, "empty", 5, "", 0), 0);
	assert_int_equal(e.meta_len, 7 + 5 + 8 + 4 + 6 + 1);
	assert_int_equal(eproto_meta_add(e.meta, &e.meta_len, "author", 6, "again", 5), -EINVAL); /* a key once */
	assert_int_equal(eproto_meta_add(e.meta, &e.meta_len, "", 0, "x", 1), -EINVAL);
	assert_int_equal(eproto_meta_add(e.meta, &e.meta_len, "tab", 3, "a\tb", 3), -EINVAL);
	assert_int_equal(eproto_meta_add(e.meta, &e.meta_len, "h\xc3\xa9", 3, "x", 1), -EINVAL);
	memset(big, 'k', sizeof(big));
	assert_int_equal(eproto_meta_add(e.meta, &e.meta_len, big, EPROTO_MAX_META_KEY + 1, "x", 1), -EINVAL);
	assert_int_equal(eproto_meta_add(e.meta, &e.meta_len, big, EPROTO_MAX_META_KEY, "x", 1), 0);
	/* the budget: prefix + key + value summed, at most 4096 */
	assert_int_equal(eproto_meta_add(e.meta, &e.meta_len, "v", 1, big, 4000), -E2BIG);
	assert_int_equal(eproto_meta_check(e.meta, e.meta_len), 0);
	assert_int_equal(eproto_meta_next(e.meta, e.meta_len, &off, &k, &v), 1);
	assert_string_equal(k, "author");
	assert_string_equal(v, "mish");
	assert_int_equal(eproto_meta_next(e.meta, e.meta_len, &off, &k, &v), 1);
	assert_int_equal(eproto_meta_next(e.meta, e.meta_len, &off, &k, &v), 1);
	assert_string_equal(k, "empty");
	assert_string_equal(v, "");
	assert_int_equal(eproto_meta_next(e.meta, e.meta_len, &off, &k, &v), 1);
	assert_int_equal(eproto_meta_next(e.meta, e.meta_len, &off, &k, &v), 0);
	/* malformed sets */
	assert_int_equal(eproto_meta_check("a\0b", 3), -EPROTO);        /* no final NUL */
	assert_int_equal(eproto_meta_check("a\0", 2), -EPROTO);         /* a key without value */
	assert_int_equal(eproto_meta_check("\0b\0", 3), -EPROTO);       /* an empty key */
	assert_int_equal(eproto_meta_check("a\0b\0a\0c\0", 8), -EPROTO); /* a key twice */
	assert_int_equal(eproto_meta_check("a\0\x7f\0", 4), -EPROTO);   /* not printable */
	assert_int_equal(eproto_meta_check("a\0b\0", 4), 0);
	/* many small pairs: the budget counts the prefix of each */
	memset(&r, 0, sizeof(r));
	for (i = 0; i < 1000; i++) {
		char key[16];
		int rc;

		snprintf(key, sizeof(key), "k%d", i);
		rc = eproto_meta_add(r.meta, &r.meta_len, key, strlen(key), "", 0);
		if (rc == -E2BIG)
			break;
		assert_int_equal(rc, 0);
	}
	assert_true(i > 300 && i < 400);
	assert_int_equal(eproto_meta_check(r.meta, r.meta_len), 0);
	/* ENTRY with and without */
	e.req = 1;
	e.type = EP_FILE;
	strcpy(e.name, "a");
	strcpy(e.path, "/a");
	n = eproto_entry_encode(pl, sizeof(pl), &e);
	assert_true(n > 0);
	assert_int_equal(eproto_entry_decode(pl, (size_t)n, &o), 0);
	assert_int_equal(o.meta_len, e.meta_len);
	assert_memory_equal(o.meta, e.meta, e.meta_len);
	pl[n - 2] = 0x01; /* a byte of a value made unprintable */
	assert_int_equal(eproto_entry_decode(pl, (size_t)n, &o), -EPROTO);
	e.meta_len = 0;
	n = eproto_entry_encode(pl, sizeof(pl), &e);
	assert_int_equal(eproto_entry_decode(pl, (size_t)n, &o), 0);
	assert_int_equal(o.meta_len, 0);
	/* an empty set is never sent: refused */
	memset(pl + n, 0, 4);
	assert_int_equal(eproto_entry_decode(pl, (size_t)n + 4, &o), -EPROTO);
	/* WRITE carries it; other requests may not */
	strcpy(r.user, "user");
	strcpy(r.path, "/w");
	r.req = 9;
	n = eproto_fsreq_encode(pl, sizeof(pl), EP_WRITE, &r);
	assert_int_equal(eproto_fsreq_decode(pl, (size_t)n, EP_WRITE, &ro), 0);
	assert_int_equal(ro.meta_len, r.meta_len);
	assert_memory_equal(ro.meta, r.meta, r.meta_len);
	assert_int_equal(eproto_fsreq_decode(pl, (size_t)n, EP_STAT, &ro), -EPROTO);
	r.meta_len = 0;
	n = eproto_fsreq_encode(pl, sizeof(pl), EP_WRITE, &r);
	assert_int_equal(eproto_fsreq_decode(pl, (size_t)n, EP_WRITE, &ro), 0);
	assert_int_equal(ro.meta_len, 0);
}

static void test_small(void **state)
{
	uint32_t v[2] = { 5, 6 }, w[2], pid, st;
	const uint8_t *raw;
	uint8_t stream, how;
	size_t n;
	int32_t code;
	char msg[PROTO_MAX_MSG + 1];
	ssize_t len;
	static char big[2000];

	len = eproto_u32s_encode(pl, sizeof(pl), v, 2);
	assert_int_equal(len, 8);
	assert_int_equal(eproto_u32s_decode(pl, 8, w, 2), 0);
	assert_int_equal(w[1], 6);
	assert_int_equal(eproto_u32s_decode(pl, 8, w, 1), -EPROTO);

	len = eproto_out_encode(pl, sizeof(pl), 42, EP_STDERR, "abc", 3);
	assert_int_equal(eproto_out_decode(pl, (size_t)len, &pid, &stream, &raw, &n), 0);
	assert_int_equal(pid, 42);
	assert_int_equal(stream, EP_STDERR);
	assert_memory_equal(raw, "abc", 3);
	pl[4] = 7; /* no such stream */
	assert_int_equal(eproto_out_decode(pl, (size_t)len, &pid, &stream, &raw, &n), -EPROTO);
	assert_int_equal(eproto_out_encode(pl, sizeof(pl), 1, 1, pl, EPROTO_MAX_CHUNK + 1), -EINVAL);

	len = eproto_end_encode(pl, sizeof(pl), 42, PROTO_SIGNALED, 9);
	assert_int_equal(eproto_end_decode(pl, (size_t)len, &pid, &how, &st), 0);
	len = eproto_end_encode(pl, sizeof(pl), 42, PROTO_EXITED, 256);
	assert_int_equal(eproto_end_decode(pl, (size_t)len, &pid, &how, &st), -EPROTO);

	memset(big, 'x', sizeof(big) - 1);
	len = eproto_error_encode(pl, sizeof(pl), 3, -ENOENT, big); /* cut to the bound */
	assert_int_equal(eproto_error_decode(pl, (size_t)len, &pid, &code, msg), 0);
	assert_int_equal(code, -ENOENT);
	assert_int_equal(strlen(msg), PROTO_MAX_MSG);
	len = eproto_error_encode(pl, sizeof(pl), 3, 5, "positive");
	assert_int_equal(eproto_error_decode(pl, (size_t)len, &pid, &code, msg), -EPROTO);

	assert_int_equal(eproto_idraw_decode(pl, 3, &pid, &raw, &n), -EPROTO);
}

static void test_watch(void **state)
{
	static struct eproto_watch in, out;
	char name[PROTO_MAX_PATH + 1], msg[PROTO_MAX_MSG + 1], big[PROTO_MAX_MSG + 10];
	static const char *const bad_names[] = { "", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a/.", ".." };
	uint32_t id;
	int32_t code;
	uint8_t ev;
	ssize_t n;

	memset(&in, 0, sizeof(in));
	in.req = 9;
	in.id = 3;
	in.flags = EP_WATCH_RECURSIVE;
	strcpy(in.user, "user");
	strcpy(in.path, "/home/user/w");
	n = eproto_watch_encode(pl, sizeof(pl), &in);
	assert_true(n > 0);
	assert_int_equal(eproto_watch_decode(pl, (size_t)n, &out), 0);
	assert_int_equal(out.req, 9);
	assert_int_equal(out.id, 3);
	assert_int_equal(out.flags, EP_WATCH_RECURSIVE);
	assert_string_equal(out.user, "user");
	assert_string_equal(out.path, "/home/user/w");
	assert_int_equal(eproto_watch_decode(pl, (size_t)n + 1, &out), -EPROTO);
	assert_int_equal(eproto_watch_decode(pl, (size_t)n - 1, &out), -EPROTO);
	assert_string_equal(out.path, "");
	in.flags = 0x4; /* unknown flag */
	n = eproto_watch_encode(pl, sizeof(pl), &in);
	assert_int_equal(eproto_watch_decode(pl, (size_t)n, &out), -EPROTO);
	in.flags = 0;
	in.path[0] = '\0'; /* no path */
	n = eproto_watch_encode(pl, sizeof(pl), &in);
	assert_int_equal(eproto_watch_decode(pl, (size_t)n, &out), -EPROTO);
	strcpy(in.path, "w");
	strcpy(in.user, "-rf"); /* not a user name */
	n = eproto_watch_encode(pl, sizeof(pl), &in);
	assert_int_equal(eproto_watch_decode(pl, (size_t)n, &out), -EPROTO);

	/* WATCH_EVENT: a relative name, or "." for the directory itself */
	n = eproto_wevent_encode(pl, sizeof(pl), 3, EP_WEV_RENAME, "sub/f.txt");
	assert_int_equal(eproto_wevent_decode(pl, (size_t)n, &id, &ev, name), 0);
	assert_int_equal(id, 3);
	assert_int_equal(ev, EP_WEV_RENAME);
	assert_string_equal(name, "sub/f.txt");
	n = eproto_wevent_encode(pl, sizeof(pl), 3, EP_WEV_REMOVE, ".");
	assert_int_equal(eproto_wevent_decode(pl, (size_t)n, &id, &ev, name), 0);
	assert_int_equal(eproto_wevent_decode(pl, (size_t)n + 1, &id, &ev, name), -EPROTO);
	for (size_t i = 0; i < sizeof(bad_names) / sizeof(*bad_names); i++) {
		n = eproto_wevent_encode(pl, sizeof(pl), 3, EP_WEV_CREATE, bad_names[i]);
		assert_int_equal(eproto_wevent_decode(pl, (size_t)n, &id, &ev, name), -EPROTO);
		assert_string_equal(name, "");
	}
	n = eproto_wevent_encode(pl, sizeof(pl), 3, 0, "f"); /* no such event */
	assert_int_equal(eproto_wevent_decode(pl, (size_t)n, &id, &ev, name), -EPROTO);
	n = eproto_wevent_encode(pl, sizeof(pl), 3, EP_WEV_CHMOD + 1, "f");
	assert_int_equal(eproto_wevent_decode(pl, (size_t)n, &id, &ev, name), -EPROTO);
	n = eproto_wevent_encode(pl, sizeof(pl), 3, EP_WEV_WRITE, "ab");
	assert_int_equal(n, 11);
	assert_int_equal(eproto_wevent_decode(pl, (size_t)n, &id, &ev, name), 0);
	pl[10] = '\0'; /* a NUL inside the name */
	assert_int_equal(eproto_wevent_decode(pl, (size_t)n, &id, &ev, name), -EPROTO);

	/* WATCH_END: 0 or a negative errno; the message cut at the bound */
	n = eproto_wend_encode(pl, sizeof(pl), 3, 0, "");
	assert_int_equal(eproto_wend_decode(pl, (size_t)n, &id, &code, msg), 0);
	assert_int_equal(code, 0);
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	n = eproto_wend_encode(pl, sizeof(pl), 3, -EOVERFLOW, big);
	assert_int_equal(eproto_wend_decode(pl, (size_t)n, &id, &code, msg), 0);
	assert_int_equal(code, -EOVERFLOW);
	assert_int_equal(strlen(msg), PROTO_MAX_MSG);
	n = eproto_wend_encode(pl, sizeof(pl), 3, 1, "positive");
	assert_int_equal(eproto_wend_decode(pl, (size_t)n, &id, &code, msg), -EPROTO);
	n = eproto_wend_encode(pl, sizeof(pl), 3, -5000, "past errno");
	assert_int_equal(eproto_wend_decode(pl, (size_t)n, &id, &code, msg), -EPROTO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_start_roundtrip), cmocka_unit_test(test_start_invalid),
		cmocka_unit_test(test_proc_roundtrip),  cmocka_unit_test(test_entry),
		cmocka_unit_test(test_fsreq),           cmocka_unit_test(test_small),
		cmocka_unit_test(test_watch),           cmocka_unit_test(test_meta),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
