/* test_proto: unit tests for lib/proto.c, the host-guest wire protocol:
 * framing, every message codec (round trip and rejection of malformed
 * payloads), the path checks, and proto_send() over a real socketpair. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto.h"

/* Big enough for any payload plus slack for trailing-byte tests. */
static uint8_t pl[PROTO_MAX_PAYLOAD + 64];
static struct proto_exec exec_in, exec_out; /* ~140 KiB each: not on the stack */

#define WRITER(w) struct proto_writer w = { .buf = pl, .cap = sizeof(pl) }

/* ---- framing ------------------------------------------------------------ */

static void test_frame_header_layout(void **state)
{
	uint8_t h[PROTO_HDR_SIZE];

	proto_frame_header(h, PROTO_STDOUT, 0x01020304);
	assert_int_equal(h[0], PROTO_VERSION);
	assert_int_equal(h[1], PROTO_STDOUT);
	assert_int_equal(h[2], 0);
	assert_int_equal(h[3], 0);
	/* Little-endian length. */
	assert_int_equal(h[4], 0x04);
	assert_int_equal(h[5], 0x03);
	assert_int_equal(h[6], 0x02);
	assert_int_equal(h[7], 0x01);
}

static void test_frame_parse_complete(void **state)
{
	uint8_t b[PROTO_HDR_SIZE + 5 + PROTO_HDR_SIZE];
	struct proto_frame f;

	proto_frame_header(b, PROTO_STDERR, 5);
	memcpy(b + PROTO_HDR_SIZE, "hello", 5);
	proto_frame_header(b + PROTO_HDR_SIZE + 5, PROTO_STARTED, 0);

	assert_int_equal(proto_frame_parse(b, sizeof(b), &f), PROTO_HDR_SIZE + 5);
	assert_int_equal(f.type, PROTO_STDERR);
	assert_int_equal(f.len, 5);
	assert_ptr_equal(f.payload, b + PROTO_HDR_SIZE);
	/* The next frame follows; an empty payload is a whole frame. */
	assert_int_equal(proto_frame_parse(b + 13, sizeof(b) - 13, &f), PROTO_HDR_SIZE);
	assert_int_equal(f.type, PROTO_STARTED);
	assert_int_equal(f.len, 0);
	/* Exactly one frame's bytes also parse. */
	assert_int_equal(proto_frame_parse(b, 13, &f), 13);
}

static void test_frame_parse_partial(void **state)
{
	static uint8_t b[PROTO_MAX_FRAME];
	struct proto_frame f;
	size_t i;

	proto_frame_header(b, PROTO_OUT_DATA, 100);
	/* Partial header, then partial payload: always "need more". */
	for (i = 0; i < PROTO_HDR_SIZE + 100; i++)
		assert_int_equal(proto_frame_parse(b, i, &f), 0);
	assert_int_equal(proto_frame_parse(b, PROTO_HDR_SIZE + 100, &f), PROTO_HDR_SIZE + 100);

	/* The largest payload is allowed, and waited for. */
	proto_frame_header(b, PROTO_OUT_DATA, PROTO_MAX_PAYLOAD);
	assert_int_equal(proto_frame_parse(b, PROTO_HDR_SIZE, &f), 0);
	assert_int_equal(proto_frame_parse(b, PROTO_MAX_FRAME - 1, &f), 0);
	assert_int_equal(proto_frame_parse(b, PROTO_MAX_FRAME, &f), PROTO_MAX_FRAME);
	assert_int_equal(f.len, PROTO_MAX_PAYLOAD);
}

static void test_frame_parse_invalid(void **state)
{
	uint8_t b[PROTO_HDR_SIZE + 4];
	struct proto_frame f;

	/* Bad version: 0 and 2. */
	proto_frame_header(b, PROTO_HELLO, 4);
	b[0] = 0;
	assert_int_equal(proto_frame_parse(b, sizeof(b), &f), -EPROTO);
	b[0] = PROTO_VERSION + 1;
	assert_int_equal(proto_frame_parse(b, sizeof(b), &f), -EPROTO);
	/* Reserved bytes must be zero, either of them. */
	proto_frame_header(b, PROTO_HELLO, 4);
	b[2] = 1;
	assert_int_equal(proto_frame_parse(b, sizeof(b), &f), -EPROTO);
	b[2] = 0;
	b[3] = 0x80;
	assert_int_equal(proto_frame_parse(b, sizeof(b), &f), -EPROTO);
	/* Zero type. */
	proto_frame_header(b, 0, 4);
	assert_int_equal(proto_frame_parse(b, sizeof(b), &f), -EPROTO);
	/* Oversized length is refused from the header alone, without waiting
	 * for a payload that would never fit the buffer. */
	proto_frame_header(b, PROTO_STDOUT, PROTO_MAX_PAYLOAD + 1);
	assert_int_equal(proto_frame_parse(b, PROTO_HDR_SIZE, &f), -EPROTO);
	proto_frame_header(b, PROTO_STDOUT, UINT32_MAX);
	assert_int_equal(proto_frame_parse(b, PROTO_HDR_SIZE, &f), -EPROTO);
	/* A bad header is not reported before all 8 bytes are there. */
	b[0] = 0;
	assert_int_equal(proto_frame_parse(b, PROTO_HDR_SIZE - 1, &f), 0);
}

/* ---- codecs: round trips ------------------------------------------------ */

static void test_roundtrip_hello(void **state)
{
	struct proto_hello in = { 1, PROTO_FEAT_ZYGOTE, "" }, out;
	ssize_t n;

	memset(in.release, 'r', 64); /* the longest release that fits */
	in.release[64] = '\0';
	n = proto_hello_encode(pl, sizeof(pl), &in);
	assert_int_equal(n, 4 + 4 + 4 + 64);
	memset(&out, 0xff, sizeof(out));
	assert_int_equal(proto_hello_decode(pl, (size_t)n, &out), 0);
	assert_int_equal(out.version, 1);
	assert_int_equal(out.features, PROTO_FEAT_ZYGOTE);
	assert_string_equal(out.release, in.release);
}

static void test_roundtrip_setup(void **state)
{
	struct proto_setup in = { .sec = 0x1122334455667788ull, .nsec = 999999999 }, out;
	ssize_t n;
	int i;

	for (i = 0; i < PROTO_MAX_ENTROPY; i++)
		in.entropy[i] = (uint8_t)(i * 7);
	in.entropy_len = PROTO_MAX_ENTROPY;
	n = proto_setup_encode(pl, sizeof(pl), &in);
	assert_int_equal(n, 8 + 4 + 4 + PROTO_MAX_ENTROPY);
	assert_int_equal(pl[0], 0x88); /* u64 little-endian */
	assert_int_equal(proto_setup_decode(pl, (size_t)n, &out), 0);
	assert_true(out.sec == in.sec);
	assert_int_equal(out.nsec, in.nsec);
	assert_int_equal(out.entropy_len, PROTO_MAX_ENTROPY);
	assert_memory_equal(out.entropy, in.entropy, PROTO_MAX_ENTROPY);

	in.entropy_len = 0;
	n = proto_setup_encode(pl, sizeof(pl), &in);
	assert_int_equal(proto_setup_decode(pl, (size_t)n, &out), 0);
	assert_int_equal(out.entropy_len, 0);
}

static void test_roundtrip_file(void **state)
{
	struct proto_file in = { 04755, UINT64_MAX, "/work/x.csv" }, out;
	ssize_t n = proto_file_encode(pl, sizeof(pl), &in);

	assert_true(n > 0);
	assert_int_equal(proto_file_decode(pl, (size_t)n, &out), 0);
	assert_int_equal(out.mode, 04755);
	assert_true(out.size == UINT64_MAX);
	assert_string_equal(out.path, "/work/x.csv");
}

static void test_roundtrip_exec(void **state)
{
	static char big[60000];
	ssize_t n;
	uint32_t i;

	memset(&exec_in, 0, sizeof(exec_in));
	exec_in.flags = PROTO_EXEC_ZYGOTE;
	exec_in.output_cap = 64ull << 20;
	exec_in.uid = 1000;
	exec_in.gid = 1001;
	strcpy(exec_in.cwd, "/work");
	exec_in.argc = 3;
	exec_in.argv[0] = "python3";
	exec_in.argv[1] = "/kiln/code/main.py";
	exec_in.argv[2] = ""; /* empty arguments after argv[0] are fine */
	exec_in.envc = 2;
	exec_in.env[0] = "PATH=/usr/bin:/bin";
	exec_in.env[1] = "EMPTY=";
	n = proto_exec_encode(pl, sizeof(pl), &exec_in);
	assert_true(n > 0);
	memset(&exec_out, 0xff, sizeof(exec_out));
	assert_int_equal(proto_exec_decode(pl, (size_t)n, &exec_out), 0);
	assert_int_equal(exec_out.flags, PROTO_EXEC_ZYGOTE);
	assert_true(exec_out.output_cap == 64ull << 20);
	assert_int_equal(exec_out.uid, 1000);
	assert_int_equal(exec_out.gid, 1001);
	assert_string_equal(exec_out.cwd, "/work");
	assert_int_equal(exec_out.argc, 3);
	for (i = 0; i < 3; i++)
		assert_string_equal(exec_out.argv[i], exec_in.argv[i]);
	assert_null(exec_out.argv[3]);
	assert_int_equal(exec_out.envc, 2);
	assert_string_equal(exec_out.env[0], "PATH=/usr/bin:/bin");
	assert_string_equal(exec_out.env[1], "EMPTY=");
	assert_null(exec_out.env[2]);
	/* Strings are copies in the decoder's own buffer, not in the payload. */
	assert_true(exec_out.argv[0] >= exec_out.strbuf &&
		    exec_out.argv[0] < exec_out.strbuf + sizeof(exec_out.strbuf));

	/* The most arguments and entries there may be; large strings. */
	exec_in.flags = 0;
	exec_in.argc = PROTO_MAX_ARGS;
	for (i = 1; i < PROTO_MAX_ARGS; i++)
		exec_in.argv[i] = "a";
	exec_in.envc = PROTO_MAX_ENV;
	for (i = 0; i < PROTO_MAX_ENV; i++)
		exec_in.env[i] = "K=v";
	memset(big, 'b', sizeof(big) - 1);
	exec_in.argv[1] = big;
	n = proto_exec_encode(pl, sizeof(pl), &exec_in);
	assert_true(n > 0 && n <= PROTO_MAX_PAYLOAD);
	assert_int_equal(proto_exec_decode(pl, (size_t)n, &exec_out), 0);
	assert_int_equal(exec_out.argc, PROTO_MAX_ARGS);
	assert_int_equal(exec_out.envc, PROTO_MAX_ENV);
	assert_string_equal(exec_out.argv[1], big);
	assert_string_equal(exec_out.argv[PROTO_MAX_ARGS - 1], "a");
	assert_string_equal(exec_out.env[PROTO_MAX_ENV - 1], "K=v");
	assert_null(exec_out.argv[PROTO_MAX_ARGS]);
	assert_null(exec_out.env[PROTO_MAX_ENV]);
}

static void test_roundtrip_exit(void **state)
{
	struct proto_exit in = { PROTO_SIGNALED, 9, PROTO_EXIT_OOM | PROTO_EXIT_KILLED,
				 1, 2, 3, 4, 5, UINT64_MAX }, out;
	ssize_t n = proto_exit_encode(pl, sizeof(pl), &in);

	assert_int_equal(n, 1 + 4 + 4 + 6 * 8);
	assert_int_equal(proto_exit_decode(pl, (size_t)n, &out), 0);
	assert_int_equal(out.how, PROTO_SIGNALED);
	assert_int_equal(out.status, 9);
	assert_int_equal(out.flags, PROTO_EXIT_OOM | PROTO_EXIT_KILLED);
	assert_true(out.run_us == 1 && out.user_us == 2 && out.sys_us == 3 && out.maxrss_kib == 4);
	assert_true(out.stdout_bytes == 5 && out.stderr_bytes == UINT64_MAX);

	in.how = PROTO_EXITED;
	in.status = 255;
	in.flags = PROTO_EXIT_OUTPUT_LIMIT;
	n = proto_exit_encode(pl, sizeof(pl), &in);
	assert_int_equal(proto_exit_decode(pl, (size_t)n, &out), 0);
	assert_int_equal(out.how, PROTO_EXITED);
	assert_int_equal(out.status, 255);
	in.how = PROTO_SIGNALED;
	in.status = 64;
	n = proto_exit_encode(pl, sizeof(pl), &in);
	assert_int_equal(proto_exit_decode(pl, (size_t)n, &out), 0);
	assert_int_equal(out.status, 64);
}

static void test_roundtrip_out_messages(void **state)
{
	struct proto_out_file fin = { 0600, 12345, "sub/dir/result.json" }, fout;
	struct proto_out_end ein = { 7, 3, 2, PROTO_OUT_TRUNCATED }, eout;
	char path[PROTO_MAX_PATH + 1];
	ssize_t n;
	WRITER(w);

	n = proto_out_file_encode(pl, sizeof(pl), &fin);
	assert_int_equal(proto_out_file_decode(pl, (size_t)n, &fout), 0);
	assert_int_equal(fout.mode, 0600);
	assert_true(fout.size == 12345);
	assert_string_equal(fout.path, "sub/dir/result.json");

	n = proto_out_end_encode(pl, sizeof(pl), &ein);
	assert_int_equal(n, 16);
	assert_int_equal(proto_out_end_decode(pl, (size_t)n, &eout), 0);
	assert_int_equal(eout.files, 7);
	assert_int_equal(eout.dirs, 3);
	assert_int_equal(eout.skipped, 2);
	assert_int_equal(eout.flags, PROTO_OUT_TRUNCATED);

	/* OUT_DIR has no encoder: one string. */
	proto_put_str(&w, "a/b");
	assert_int_equal(w.err, 0);
	assert_int_equal(proto_path_decode(pl, w.len, path), 0);
	assert_string_equal(path, "a/b");
}

static void test_roundtrip_error(void **state)
{
	struct proto_error in = { -ENOENT, "" }, out;
	ssize_t n;

	strcpy(in.message, "no such file: /work/x");
	n = proto_error_encode(pl, sizeof(pl), &in);
	assert_int_equal(proto_error_decode(pl, (size_t)n, &out), 0);
	assert_int_equal(out.code, -ENOENT);
	assert_string_equal(out.message, in.message);

	/* The longest message; the encoder never reads past PROTO_MAX_MSG. */
	memset(in.message, 'm', sizeof(in.message));
	n = proto_error_encode(pl, sizeof(pl), &in);
	assert_int_equal(n, 4 + 4 + PROTO_MAX_MSG);
	assert_int_equal(proto_error_decode(pl, (size_t)n, &out), 0);
	assert_int_equal(strlen(out.message), PROTO_MAX_MSG);
}

static void test_encode_nospace(void **state)
{
	struct proto_hello h = { 1, 0, "6.1.0" };
	struct proto_exit e = { PROTO_EXITED, 0, 0, 0, 0, 0, 0, 0, 0 };
	WRITER(w);

	assert_int_equal(proto_hello_encode(pl, 12, &h), -ENOSPC);
	assert_int_equal(proto_hello_encode(pl, 17, &h), 17);
	assert_int_equal(proto_exit_encode(pl, 56, &e), -ENOSPC);
	assert_int_equal(proto_exit_encode(pl, 57, &e), 57);
	/* After an overflow, later puts are no-ops even if they would fit. */
	w.cap = 5;
	proto_put_u32(&w, 1);
	proto_put_u32(&w, 2);
	proto_put_u8(&w, 3);
	assert_int_equal(w.err, -ENOSPC);
	assert_int_equal(w.len, 4);
}

/* ---- codecs: rejections ------------------------------------------------- */

/* Every decoder behind one signature, decoding into static storage. */
typedef int (*decode_fn)(const uint8_t *p, size_t len);

static int dec_hello(const uint8_t *p, size_t len)
{
	struct proto_hello m;

	return proto_hello_decode(p, len, &m);
}

static int dec_setup(const uint8_t *p, size_t len)
{
	struct proto_setup m;

	return proto_setup_decode(p, len, &m);
}

static int dec_file(const uint8_t *p, size_t len)
{
	struct proto_file m;

	return proto_file_decode(p, len, &m);
}

static int dec_exec(const uint8_t *p, size_t len)
{
	return proto_exec_decode(p, len, &exec_out);
}

static int dec_exit(const uint8_t *p, size_t len)
{
	struct proto_exit m;

	return proto_exit_decode(p, len, &m);
}

static int dec_out_file(const uint8_t *p, size_t len)
{
	struct proto_out_file m;

	return proto_out_file_decode(p, len, &m);
}

static int dec_out_end(const uint8_t *p, size_t len)
{
	struct proto_out_end m;

	return proto_out_end_decode(p, len, &m);
}

static int dec_error(const uint8_t *p, size_t len)
{
	struct proto_error m;

	return proto_error_decode(p, len, &m);
}

static int dec_path(const uint8_t *p, size_t len)
{
	char out[PROTO_MAX_PATH + 1];

	return proto_path_decode(p, len, out);
}

/* The valid payload p[0..n) decodes; every strict prefix, and the payload
 * with one byte more, does not. Each try reads from an exact-size copy so
 * that a sanitizer build catches a read past the end. */
static void check_exact(const char *what, decode_fn dec, const uint8_t *p, size_t n)
{
	uint8_t *copy = malloc(n + 1);
	size_t k;

	assert_non_null(copy);
	memcpy(copy, p, n);
	if (dec(copy, n) != 0)
		fail_msg("%s: valid payload of %zu bytes rejected", what, n);
	for (k = 0; k < n; k++) {
		uint8_t *t = malloc(k ? k : 1);

		assert_non_null(t);
		memcpy(t, p, k);
		if (dec(t, k) != -EPROTO)
			fail_msg("%s: truncated payload (%zu of %zu bytes) accepted", what, k, n);
		free(t);
	}
	copy[n] = 0;
	if (dec(copy, n + 1) != -EPROTO)
		fail_msg("%s: trailing byte accepted", what);
	free(copy);
}

static void test_decode_truncated_and_trailing(void **state)
{
	struct proto_hello h = { 1, 0, "6.1.0-kiln" };
	struct proto_setup s = { 1, 2, { 9, 9, 9 }, 3 };
	struct proto_file f = { 0644, 3, "/a/b" };
	struct proto_exit e = { PROTO_EXITED, 1, 0, 1, 2, 3, 4, 5, 6 };
	struct proto_out_file of = { 0644, 3, "a/b" };
	struct proto_out_end oe = { 1, 2, 3, 0 };
	struct proto_error er = { 5, "boom" };
	ssize_t n;
	WRITER(w);

	n = proto_hello_encode(pl, sizeof(pl), &h);
	check_exact("hello", dec_hello, pl, (size_t)n);
	n = proto_setup_encode(pl, sizeof(pl), &s);
	check_exact("setup", dec_setup, pl, (size_t)n);
	n = proto_file_encode(pl, sizeof(pl), &f);
	check_exact("file", dec_file, pl, (size_t)n);
	memset(&exec_in, 0, sizeof(exec_in));
	strcpy(exec_in.cwd, "/");
	exec_in.argc = 2;
	exec_in.argv[0] = "sh";
	exec_in.argv[1] = "-c";
	exec_in.envc = 1;
	exec_in.env[0] = "A=1";
	n = proto_exec_encode(pl, sizeof(pl), &exec_in);
	check_exact("exec", dec_exec, pl, (size_t)n);
	n = proto_exit_encode(pl, sizeof(pl), &e);
	check_exact("exit", dec_exit, pl, (size_t)n);
	n = proto_out_file_encode(pl, sizeof(pl), &of);
	check_exact("out_file", dec_out_file, pl, (size_t)n);
	n = proto_out_end_encode(pl, sizeof(pl), &oe);
	check_exact("out_end", dec_out_end, pl, (size_t)n);
	n = proto_error_encode(pl, sizeof(pl), &er);
	check_exact("error", dec_error, pl, (size_t)n);
	proto_put_str(&w, "out/x");
	check_exact("path", dec_path, pl, w.len);
}

/* Build a payload: u32 fields from `pre`, then a length-prefixed string. */
static size_t payload_u32s_str(const uint32_t *pre, size_t npre, const void *s, size_t slen)
{
	size_t i;
	WRITER(w);

	for (i = 0; i < npre; i++)
		proto_put_u32(&w, pre[i]);
	proto_put_bytes(&w, s, slen);
	assert_int_equal(w.err, 0);
	return w.len;
}

static void test_decode_string_bounds(void **state)
{
	static char s[PROTO_MAX_PATH + 2];
	uint32_t hello_pre[] = { 1, 0 };
	uint32_t file_pre[] = { 0644, 0, 0 }; /* mode, u64 size as two u32 */
	uint32_t err_pre[] = { 1 };
	size_t n, i;

	/* HELLO release: 64 bytes fit, 65 do not. */
	memset(s, 'r', 65);
	n = payload_u32s_str(hello_pre, 2, s, 64);
	assert_int_equal(dec_hello(pl, n), 0);
	n = payload_u32s_str(hello_pre, 2, s, 65);
	assert_int_equal(dec_hello(pl, n), -EPROTO);
	/* ERROR message: PROTO_MAX_MSG fits, one more does not. */
	memset(s, 'm', PROTO_MAX_MSG + 1);
	n = payload_u32s_str(err_pre, 1, s, PROTO_MAX_MSG);
	assert_int_equal(dec_error(pl, n), 0);
	n = payload_u32s_str(err_pre, 1, s, PROTO_MAX_MSG + 1);
	assert_int_equal(dec_error(pl, n), -EPROTO);
	/* FILE path: a valid 4096-byte absolute path fits, 4097 bytes do not. */
	for (i = 0; i < PROTO_MAX_PATH + 1; i++)
		s[i] = i % 200 == 0 ? '/' : 'p';
	n = payload_u32s_str(file_pre, 3, s, PROTO_MAX_PATH);
	assert_int_equal(dec_file(pl, n), 0);
	n = payload_u32s_str(file_pre, 3, s, PROTO_MAX_PATH + 1);
	assert_int_equal(dec_file(pl, n), -EPROTO);
	/* OUT_DIR path likewise (relative). */
	n = payload_u32s_str(NULL, 0, s + 1, PROTO_MAX_PATH);
	assert_int_equal(dec_path(pl, n), 0);
	n = payload_u32s_str(NULL, 0, s + 1, PROTO_MAX_PATH + 1);
	assert_int_equal(dec_path(pl, n), -EPROTO);
	/* A length prefix far beyond the payload. */
	n = payload_u32s_str(hello_pre, 2, "x", 1);
	pl[8] = 0xff;
	pl[11] = 0xff;
	assert_int_equal(dec_hello(pl, n), -EPROTO);
}

static void test_decode_strings_with_nul(void **state)
{
	uint32_t hello_pre[] = { 1, 0 };
	uint32_t file_pre[] = { 0644, 0, 0 };
	uint32_t err_pre[] = { 1 };
	size_t n;
	WRITER(w);

	n = payload_u32s_str(hello_pre, 2, "6.1\0x", 5);
	assert_int_equal(dec_hello(pl, n), -EPROTO);
	n = payload_u32s_str(file_pre, 3, "/a\0/b", 5);
	assert_int_equal(dec_file(pl, n), -EPROTO);
	n = payload_u32s_str(err_pre, 1, "\0", 1);
	assert_int_equal(dec_error(pl, n), -EPROTO);
	n = payload_u32s_str(NULL, 0, "a\0", 2);
	assert_int_equal(dec_path(pl, n), -EPROTO);

	/* EXEC: NUL inside argv[1], and inside an env entry. */
	proto_put_u32(&w, 0);
	proto_put_u64(&w, 0);
	proto_put_u32(&w, 0);
	proto_put_u32(&w, 0);
	proto_put_str(&w, "/");
	proto_put_u32(&w, 2);
	proto_put_str(&w, "sh");
	proto_put_bytes(&w, "a\0b", 3);
	proto_put_u32(&w, 0);
	assert_int_equal(dec_exec(pl, w.len), -EPROTO);
	assert_int_equal(exec_out.argc, 0);
	assert_null(exec_out.argv[0]);
	w.len = 0;
	proto_put_u32(&w, 0);
	proto_put_u64(&w, 0);
	proto_put_u32(&w, 0);
	proto_put_u32(&w, 0);
	proto_put_str(&w, "/");
	proto_put_u32(&w, 1);
	proto_put_str(&w, "sh");
	proto_put_u32(&w, 1);
	proto_put_bytes(&w, "A=\0", 3);
	assert_int_equal(dec_exec(pl, w.len), -EPROTO);
}

/* Encode an EXEC from exec_in and expect the decoder's verdict. */
static void exec_expect(int want)
{
	ssize_t n = proto_exec_encode(pl, sizeof(pl), &exec_in);

	assert_true(n > 0);
	assert_int_equal(dec_exec(pl, (size_t)n), want);
	if (want) {
		assert_int_equal(exec_out.argc, 0);
		assert_int_equal(exec_out.envc, 0);
		assert_null(exec_out.argv[0]);
		assert_null(exec_out.env[0]);
	}
}

static void test_exec_tty_round_trip(void **state)
{
	uint8_t buf[64];
	uint32_t rows, cols;
	ssize_t n;

	memset(&exec_in, 0, sizeof(exec_in));
	strcpy(exec_in.cwd, "/work");
	exec_in.flags = PROTO_EXEC_TTY | PROTO_EXEC_KEEP;
	exec_in.argc = 1;
	exec_in.argv[0] = "/bin/bash";
	exec_in.rows = 50;
	exec_in.cols = 132;
	n = proto_exec_encode(pl, sizeof(pl), &exec_in);
	assert_true(n > 0);
	assert_int_equal(dec_exec(pl, (size_t)n), 0);
	assert_int_equal(exec_out.rows, 50);
	assert_int_equal(exec_out.cols, 132);
	/* Without the flag the size is not on the wire: 8 bytes shorter. */
	exec_in.flags = PROTO_EXEC_KEEP;
	assert_int_equal(proto_exec_encode(pl, sizeof(pl), &exec_in), n - 8);
	assert_int_equal(dec_exec(pl, (size_t)n - 8), 0);
	assert_int_equal(exec_out.rows, 0);

	n = proto_resize_encode(buf, sizeof(buf), 24, 80);
	assert_int_equal(n, 8);
	assert_int_equal(proto_resize_decode(buf, 8, &rows, &cols), 0);
	assert_int_equal(rows, 24);
	assert_int_equal(cols, 80);
	assert_int_equal(proto_resize_decode(buf, 7, &rows, &cols), -EPROTO);
	n = proto_resize_encode(buf, sizeof(buf), 0, 80);
	assert_int_equal(proto_resize_decode(buf, 8, &rows, &cols), -EPROTO);
	n = proto_resize_encode(buf, sizeof(buf), 24, PROTO_MAX_TTY_DIM + 1);
	assert_int_equal(proto_resize_decode(buf, 8, &rows, &cols), -EPROTO);
	assert_int_equal(proto_resize_encode(buf, 4, 24, 80), -ENOSPC);

	{
		uint32_t count, pid;

		n = proto_procs_encode(buf, sizeof(buf), 3, 117);
		assert_int_equal(n, 8);
		assert_int_equal(proto_procs_decode(buf, 8, &count, &pid), 0);
		assert_int_equal(count, 3);
		assert_int_equal(pid, 117);
		assert_int_equal(proto_procs_decode(buf, 7, &count, &pid), -EPROTO);
		n = proto_procs_encode(buf, sizeof(buf), 0, 0);
		assert_int_equal(proto_procs_decode(buf, 8, &count, &pid), 0);
		assert_int_equal(count, 0);
		/* A pid without a count, or a count without a pid, is no answer. */
		n = proto_procs_encode(buf, sizeof(buf), 0, 5);
		assert_int_equal(proto_procs_decode(buf, 8, &count, &pid), -EPROTO);
		n = proto_procs_encode(buf, sizeof(buf), 2, 0);
		assert_int_equal(proto_procs_decode(buf, 8, &count, &pid), -EPROTO);
		assert_int_equal(proto_procs_encode(buf, 4, 1, 1), -ENOSPC);
	}
}

static void test_decode_exec_invalid(void **state)
{
	static char *many[PROTO_MAX_ARGS + 1];
	size_t i;
	WRITER(w);

	for (i = 0; i < PROTO_MAX_ARGS + 1; i++)
		many[i] = "x";
	memset(&exec_in, 0, sizeof(exec_in));
	strcpy(exec_in.cwd, "/work");
	exec_in.argc = 1;
	exec_in.argv[0] = "true";
	exec_expect(0);

	exec_in.argc = 0; /* no program */
	exec_expect(-EPROTO);
	exec_in.argc = 1;
	exec_in.argv[0] = ""; /* empty program */
	exec_expect(-EPROTO);
	exec_in.argv[0] = "true";
	strcpy(exec_in.cwd, "work"); /* relative cwd */
	exec_expect(-EPROTO);
	strcpy(exec_in.cwd, "/work/../etc");
	exec_expect(-EPROTO);
	strcpy(exec_in.cwd, "/work");
	exec_in.flags = 0x20; /* unknown flag (zygote, keep, stdin, tty and if-ok are known) */
	exec_expect(-EPROTO);
	exec_in.flags = PROTO_EXEC_IF_OK | PROTO_EXEC_KEEP;
	exec_expect(0);
	exec_in.flags = PROTO_EXEC_STDIN | PROTO_EXEC_KEEP;
	exec_expect(0);
	exec_in.flags = PROTO_EXEC_TTY; /* a terminal of 0 x 0 */
	exec_expect(-EPROTO);
	exec_in.rows = 24;
	exec_in.cols = PROTO_MAX_TTY_DIM + 1;
	exec_expect(-EPROTO);
	exec_in.cols = 80;
	exec_expect(0);
	exec_in.flags = PROTO_EXEC_TTY | PROTO_EXEC_ZYGOTE; /* the interpreter has no terminal */
	exec_in.argc = 2;
	exec_in.argv[1] = "x.py";
	exec_expect(-EPROTO);
	exec_in.flags = PROTO_EXEC_STDIN | PROTO_EXEC_ZYGOTE;
	exec_expect(-EPROTO);
	exec_in.flags = 0;
	exec_in.argc = 1;
	exec_in.envc = 1;
	exec_in.env[0] = "NOEQUALS";
	exec_expect(-EPROTO);
	exec_in.env[0] = "=value"; /* empty key */
	exec_expect(-EPROTO);
	exec_in.env[0] = "K=v";
	exec_expect(0);

	/* Counts over the bounds: argc 1025 and envc 1025 (encoded by hand
	 * since the struct has no room for them). */
	proto_put_u32(&w, 0);
	proto_put_u64(&w, 0);
	proto_put_u32(&w, 0);
	proto_put_u32(&w, 0);
	proto_put_str(&w, "/");
	proto_put_u32(&w, PROTO_MAX_ARGS + 1);
	for (i = 0; i < PROTO_MAX_ARGS + 1; i++)
		proto_put_str(&w, many[i]);
	proto_put_u32(&w, 0);
	assert_int_equal(w.err, 0);
	assert_int_equal(dec_exec(pl, w.len), -EPROTO);
	assert_null(exec_out.argv[0]);
	w.len = 0;
	proto_put_u32(&w, 0);
	proto_put_u64(&w, 0);
	proto_put_u32(&w, 0);
	proto_put_u32(&w, 0);
	proto_put_str(&w, "/");
	proto_put_u32(&w, 1);
	proto_put_str(&w, "x");
	proto_put_u32(&w, PROTO_MAX_ENV + 1);
	for (i = 0; i < PROTO_MAX_ENV + 1; i++)
		proto_put_str(&w, "K=v");
	assert_int_equal(w.err, 0);
	assert_int_equal(dec_exec(pl, w.len), -EPROTO);
	assert_null(exec_out.env[0]);
	/* A huge count with no strings behind it. */
	w.len = 0;
	proto_put_u32(&w, 0);
	proto_put_u64(&w, 0);
	proto_put_u32(&w, 0);
	proto_put_u32(&w, 0);
	proto_put_str(&w, "/");
	proto_put_u32(&w, UINT32_MAX);
	assert_int_equal(dec_exec(pl, w.len), -EPROTO);
}

static void test_decode_bad_fields(void **state)
{
	struct proto_exit e = { PROTO_EXITED, 0, 0, 0, 0, 0, 0, 0, 0 };
	struct proto_setup s = { 0, 1000000000, { 0 }, 0 };
	struct proto_file f = { 010000, 0, "/a" };
	struct proto_out_file of = { 010000, 0, "a" };
	struct proto_out_end oe = { 0, 0, 0, 0x2 };
	static const struct {
		uint8_t how;
		uint32_t status, flags;
		int want;
	} exits[] = {
		{ PROTO_EXITED, 0, 0, 0 },
		{ PROTO_EXITED, 255, 0, 0 },
		{ PROTO_EXITED, 256, 0, -EPROTO },
		{ PROTO_EXITED, UINT32_MAX, 0, -EPROTO },
		{ PROTO_SIGNALED, 0, 0, -EPROTO },
		{ PROTO_SIGNALED, 1, 0, 0 },
		{ PROTO_SIGNALED, 64, 0, 0 },
		{ PROTO_SIGNALED, 65, 0, -EPROTO },
		{ 0, 0, 0, -EPROTO },
		{ 3, 0, 0, -EPROTO },
		{ 0xff, 1, 0, -EPROTO },
		{ PROTO_EXITED, 0, PROTO_EXIT_OOM | PROTO_EXIT_OUTPUT_LIMIT | PROTO_EXIT_KILLED, 0 },
		{ PROTO_EXITED, 0, 0x8, 0 }, /* STDIN_LOST */
		{ PROTO_EXITED, 0, 0x10, -EPROTO },
		{ PROTO_EXITED, 0, 0x80000000u, -EPROTO },
	};
	ssize_t n;
	size_t i;

	for (i = 0; i < sizeof(exits) / sizeof(exits[0]); i++) {
		e.how = exits[i].how;
		e.status = exits[i].status;
		e.flags = exits[i].flags;
		n = proto_exit_encode(pl, sizeof(pl), &e);
		if (dec_exit(pl, (size_t)n) != exits[i].want)
			fail_msg("exit how=%u status=%u flags=%#x: expected %d", exits[i].how,
				 exits[i].status, exits[i].flags, exits[i].want);
	}

	/* SETUP: nsec must be below one second. */
	n = proto_setup_encode(pl, sizeof(pl), &s);
	assert_int_equal(dec_setup(pl, (size_t)n), -EPROTO);
	s.nsec = 999999999;
	n = proto_setup_encode(pl, sizeof(pl), &s);
	assert_int_equal(dec_setup(pl, (size_t)n), 0);
	/* SETUP: at most PROTO_MAX_ENTROPY bytes of entropy. */
	{
		static uint8_t ent[PROTO_MAX_ENTROPY + 1];
		WRITER(w);

		proto_put_u64(&w, 0);
		proto_put_u32(&w, 0);
		proto_put_bytes(&w, ent, sizeof(ent));
		assert_int_equal(dec_setup(pl, w.len), -EPROTO);
	}

	/* FILE: mode beyond 07777, relative or unsafe paths. */
	n = proto_file_encode(pl, sizeof(pl), &f);
	assert_int_equal(dec_file(pl, (size_t)n), -EPROTO);
	f.mode = 07777;
	n = proto_file_encode(pl, sizeof(pl), &f);
	assert_int_equal(dec_file(pl, (size_t)n), 0);
	strcpy(f.path, "a/b");
	n = proto_file_encode(pl, sizeof(pl), &f);
	assert_int_equal(dec_file(pl, (size_t)n), -EPROTO);
	strcpy(f.path, "/a/../b");
	n = proto_file_encode(pl, sizeof(pl), &f);
	assert_int_equal(dec_file(pl, (size_t)n), -EPROTO);

	/* OUT_FILE: mode beyond 07777, absolute or unsafe paths. */
	n = proto_out_file_encode(pl, sizeof(pl), &of);
	assert_int_equal(dec_out_file(pl, (size_t)n), -EPROTO);
	of.mode = 0644;
	strcpy(of.path, "/etc/passwd");
	n = proto_out_file_encode(pl, sizeof(pl), &of);
	assert_int_equal(dec_out_file(pl, (size_t)n), -EPROTO);
	strcpy(of.path, "../x");
	n = proto_out_file_encode(pl, sizeof(pl), &of);
	assert_int_equal(dec_out_file(pl, (size_t)n), -EPROTO);
	strcpy(of.path, "");
	n = proto_out_file_encode(pl, sizeof(pl), &of);
	assert_int_equal(dec_out_file(pl, (size_t)n), -EPROTO);

	/* OUT_END: unknown flags. */
	n = proto_out_end_encode(pl, sizeof(pl), &oe);
	assert_int_equal(dec_out_end(pl, (size_t)n), -EPROTO);

	/* OUT_DIR: absolute path. */
	n = (ssize_t)payload_u32s_str(NULL, 0, "/tmp", 4);
	assert_int_equal(dec_path(pl, (size_t)n), -EPROTO);
}

/* ---- paths -------------------------------------------------------------- */

static void test_paths(void **state)
{
	static const struct {
		const char *path;
		int rel_ok, abs_ok;
	} t[] = {
		{ "a", 1, 0 },
		{ "a/b/c.txt", 1, 0 },
		{ "/", 0, 1 },
		{ "/a", 0, 1 },
		{ "/a/b/c.txt", 0, 1 },
		{ "", 0, 0 },
		{ ".", 0, 0 },
		{ "..", 0, 0 },
		{ "/.", 0, 0 },
		{ "/..", 0, 0 },
		{ "a/..", 0, 0 },
		{ "a/../b", 0, 0 },
		{ "/a/../b", 0, 0 },
		{ "./a", 0, 0 },
		{ "/a/./b", 0, 0 },
		{ "a//b", 0, 0 },
		{ "//a", 0, 0 },
		{ "/a//b", 0, 0 },
		{ "a/", 0, 0 },
		{ "/a/", 0, 0 },
		{ "//", 0, 0 },
		/* Names that merely contain dots are fine. */
		{ "...", 1, 0 },
		{ ".a", 1, 0 },
		{ "a..", 1, 0 },
		{ "/.../..a/a..", 0, 1 },
		{ "a b/\n\t\xff", 1, 0 },
	};
	static char p[PROTO_MAX_PATH + 3];
	size_t i;

	for (i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		if ((proto_relpath_ok(t[i].path) == 0) != t[i].rel_ok)
			fail_msg("proto_relpath_ok(\"%s\"): expected %s", t[i].path, t[i].rel_ok ? "ok" : "rejected");
		if ((proto_abspath_ok(t[i].path) == 0) != t[i].abs_ok)
			fail_msg("proto_abspath_ok(\"%s\"): expected %s", t[i].path, t[i].abs_ok ? "ok" : "rejected");
	}
	assert_int_equal(proto_relpath_ok(".."), -EINVAL);

	/* Components: 255 bytes (NAME_MAX) fine, 256 not; first, middle, last. */
	memset(p, 'n', 256);
	p[255] = '\0';
	assert_int_equal(proto_relpath_ok(p), 0);
	p[255] = 'n';
	p[256] = '\0';
	assert_int_equal(proto_relpath_ok(p), -EINVAL);
	p[0] = '/';
	assert_int_equal(proto_abspath_ok(p), 0); /* "/" + 255 */
	p[256] = 'n';
	p[257] = '\0';
	assert_int_equal(proto_abspath_ok(p), -EINVAL);
	memcpy(p, "a/", 2);
	memset(p + 2, 'n', 256);
	strcpy(p + 258, "/z");
	assert_int_equal(proto_relpath_ok(p), -EINVAL);
	p[257] = '/';
	p[258] = 'z';
	p[259] = '\0';
	assert_int_equal(proto_relpath_ok(p), 0);

	/* Long NUL-free paths: exactly PROTO_MAX_PATH fine, one more not. */
	for (i = 0; i < PROTO_MAX_PATH + 2; i++)
		p[i] = i % 100 == 99 ? '/' : 'x';
	p[PROTO_MAX_PATH] = '\0';
	assert_int_equal(proto_relpath_ok(p), 0);
	p[PROTO_MAX_PATH] = 'x';
	p[PROTO_MAX_PATH + 1] = '\0';
	assert_int_equal(proto_relpath_ok(p), -EINVAL);
	p[0] = '/';
	p[PROTO_MAX_PATH] = '\0';
	assert_int_equal(proto_abspath_ok(p), 0);
	p[PROTO_MAX_PATH] = 'x';
	assert_int_equal(proto_abspath_ok(p), -EINVAL);
}

/* ---- proto_send over a socketpair -------------------------------------- */

struct reader {
	int fd;
	size_t want;
	uint8_t *buf;
	size_t got;
};

static void *reader_main(void *arg)
{
	struct reader *r = arg;

	while (r->got < r->want) {
		ssize_t n = read(r->fd, r->buf + r->got, r->want - r->got);

		if (n <= 0)
			break;
		r->got += (size_t)n;
	}
	return NULL;
}

static void test_send_socketpair(void **state)
{
	static uint8_t big[PROTO_MAX_PAYLOAD], rbuf[PROTO_MAX_FRAME + PROTO_HDR_SIZE + 16];
	struct proto_exit e = { PROTO_EXITED, 7, 0, 1, 2, 3, 4, 5, 6 }, eo;
	struct reader r = { .buf = rbuf };
	struct proto_frame f;
	pthread_t th;
	ssize_t n, m;
	size_t i;
	int sv[2];

	/* A small frame on a blocking socket, parsed on the other end. */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	n = proto_exit_encode(pl, sizeof(pl), &e);
	assert_int_equal(proto_send(sv[0], PROTO_EXIT, pl, (size_t)n, 0), 0);
	assert_int_equal(proto_send(sv[0], PROTO_STARTED, NULL, 0, 0), 0);
	m = read(sv[1], rbuf, sizeof(rbuf));
	assert_int_equal(m, PROTO_HDR_SIZE + n + PROTO_HDR_SIZE);
	assert_int_equal(proto_frame_parse(rbuf, (size_t)m, &f), PROTO_HDR_SIZE + n);
	assert_int_equal(f.type, PROTO_EXIT);
	assert_int_equal(proto_exit_decode(f.payload, f.len, &eo), 0);
	assert_int_equal(eo.status, 7);
	assert_int_equal(proto_frame_parse(rbuf + PROTO_HDR_SIZE + n, (size_t)m - PROTO_HDR_SIZE - (size_t)n, &f),
			 PROTO_HDR_SIZE);
	assert_int_equal(f.type, PROTO_STARTED);

	/* Over the bound: refused without writing anything. */
	assert_int_equal(proto_send(sv[0], PROTO_STDOUT, big, PROTO_MAX_PAYLOAD + 1, 0), -EMSGSIZE);

	/* The largest frame from a non-blocking socket (larger than the socket
	 * buffer), so proto_send() has to wait in poll() for the reader. */
	for (i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)(i * 31 + 7);
	assert_int_equal(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
	r.fd = sv[1];
	r.want = PROTO_MAX_FRAME;
	assert_int_equal(pthread_create(&th, NULL, reader_main, &r), 0);
	assert_int_equal(proto_send(sv[0], PROTO_STDOUT, big, sizeof(big), proto_now_ms() + 30000), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(r.got, PROTO_MAX_FRAME);
	assert_int_equal(proto_frame_parse(rbuf, r.got, &f), PROTO_MAX_FRAME);
	assert_int_equal(f.type, PROTO_STDOUT);
	assert_int_equal(f.len, PROTO_MAX_PAYLOAD);
	assert_memory_equal(f.payload, big, sizeof(big));

	/* Nobody reading: once the socket buffer is full, the deadline, not a
	 * hang, ends the send. */
	for (i = 0; i < 64; i++) {
		int rc = proto_send(sv[0], PROTO_STDOUT, big, sizeof(big), proto_now_ms() + 100);

		if (rc == -ETIMEDOUT)
			break;
		assert_int_equal(rc, 0);
	}
	assert_true(i < 64);

	/* Peer gone: an error, not a signal (callers must ignore SIGPIPE; here
	 * SIG_IGN stands in for that). */
	close(sv[1]);
	signal(SIGPIPE, SIG_IGN);
	assert_int_equal(proto_send(sv[0], PROTO_STDOUT, "x", 1, proto_now_ms() + 1000), -EPIPE);
	signal(SIGPIPE, SIG_DFL);
	close(sv[0]);
}

/* The interpreter's last words inside the guest (guest/zygote.c): one exact
 * line; anything the task's code might write instead is refused. */
static void test_zdone(void **state)
{
	static const char *const bad[] = {
		"",
		"X",
		"X 0 1 2 3",           /* no newline */
		"X 0 1 2 3\n\n",       /* more after it */
		"X 0 1 2 3\nX 0 1 2 3\n", /* two lines: junk before the real one */
		"X 256 1 2 3\n",        /* not an exit status */
		"X 00 1 2 3\n",         /* leading zero */
		"X 0 01 2 3\n",
		"X -1 1 2 3\n",
		"X +1 1 2 3\n",
		"X 0 1 2\n",            /* a field missing */
		"X 0 1 2 3 4\n",        /* one too many */
		"X  0 1 2 3\n",
		"X 0 1 2 3 \n",
		"Y 0 1 2 3\n",
		"x 0 1 2 3\n",
		"X 0 1000000000000000 2 3\n", /* 16 digits */
		"X 0 1 2 3\r\n",
		"X 0 1\0002 3\n",
	};
	struct proto_zdone d = { 9, 9, 9, 9 }, back;
	char buf[PROTO_ZDONE_MAX + 8], big[PROTO_ZDONE_MAX + 2];
	ssize_t n;

	(void)state;
	assert_int_equal(proto_zdone_decode("X 7 1173000 573000 20332\n", 25, &d), 0);
	assert_int_equal(d.status, 7);
	assert_true(d.user_us == 1173000 && d.sys_us == 573000 && d.maxrss_kib == 20332);
	assert_int_equal(proto_zdone_decode("X 0 0 0 0\n", 10, &d), 0);
	assert_int_equal(proto_zdone_decode("X 255 999999999999999 999999999999999 999999999999999\n", 54, &d), 0);
	assert_int_equal(d.status, 255);
	assert_true(d.user_us == 999999999999999ull && d.maxrss_kib == 999999999999999ull);
	n = proto_zdone_encode(buf, sizeof(buf), &d);
	assert_int_equal(n, 54);
	assert_int_equal(proto_zdone_decode(buf, (size_t)n, &back), 0);
	assert_memory_equal(&back, &d, sizeof(d));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		size_t len = strlen(bad[i]);

		if (i == sizeof(bad) / sizeof(bad[0]) - 1)
			len = 14; /* the one with a NUL inside */
		d.status = 9;
		assert_int_equal(proto_zdone_decode(bad[i], len, &d), -EPROTO);
		assert_int_equal(d.status, 0); /* nothing half-filled */
	}
	/* Longer than a line can be, even if it would parse. */
	memset(big, '1', sizeof(big));
	memcpy(big, "X 0 ", 4);
	big[sizeof(big) - 1] = '\n';
	assert_int_equal(proto_zdone_decode(big, sizeof(big), &d), -EPROTO);
	assert_int_equal(proto_zdone_encode(buf, 8, &back), -E2BIG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_frame_header_layout),
		cmocka_unit_test(test_frame_parse_complete),
		cmocka_unit_test(test_frame_parse_partial),
		cmocka_unit_test(test_frame_parse_invalid),
		cmocka_unit_test(test_roundtrip_hello),
		cmocka_unit_test(test_roundtrip_setup),
		cmocka_unit_test(test_roundtrip_file),
		cmocka_unit_test(test_roundtrip_exec),
		cmocka_unit_test(test_roundtrip_exit),
		cmocka_unit_test(test_roundtrip_out_messages),
		cmocka_unit_test(test_roundtrip_error),
		cmocka_unit_test(test_encode_nospace),
		cmocka_unit_test(test_decode_truncated_and_trailing),
		cmocka_unit_test(test_decode_string_bounds),
		cmocka_unit_test(test_decode_strings_with_nul),
		cmocka_unit_test(test_decode_exec_invalid),
		cmocka_unit_test(test_exec_tty_round_trip),
		cmocka_unit_test(test_decode_bad_fields),
		cmocka_unit_test(test_paths),
		cmocka_unit_test(test_send_socketpair),
		cmocka_unit_test(test_zdone),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
