/* fuzz_proto: libFuzzer target for the host-guest protocol (lib/proto.c).
 * Splits the input into frames and hands every payload to every decoder,
 * each from an exact-size heap copy so that ASan sees any read past the
 * payload. A payload that decodes must re-encode to the very same bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "fuzz.h"

/* struct proto_exec is ~140 KiB: keep it off the fuzzer's stack. */
static struct proto_exec exec_msg;
static uint8_t enc[PROTO_MAX_PAYLOAD];

static void same(ssize_t n, const uint8_t *p, size_t len)
{
	check(n >= 0 && (size_t)n == len && memcmp(enc, p, len) == 0);
}

static void decode_all(const uint8_t *p, size_t len)
{
	struct proto_hello hello;
	struct proto_setup setup;
	struct proto_file file;
	struct proto_exit ex;
	struct proto_out_file of;
	struct proto_out_end oe;
	struct proto_error er;
	struct proto_zdone zd;
	char path[PROTO_MAX_PATH + 1];
	uint32_t i, rows, cols, count, pid;

	if (proto_hello_decode(p, len, &hello) == 0)
		same(proto_hello_encode(enc, sizeof(enc), &hello), p, len);
	if (proto_setup_decode(p, len, &setup) == 0) {
		check(setup.nsec < 1000000000u && setup.entropy_len <= PROTO_MAX_ENTROPY);
		same(proto_setup_encode(enc, sizeof(enc), &setup), p, len);
	}
	if (proto_file_decode(p, len, &file) == 0) {
		check(proto_abspath_ok(file.path) == 0);
		same(proto_file_encode(enc, sizeof(enc), &file), p, len);
	}
	if (proto_exec_decode(p, len, &exec_msg) == 0) {
		check(exec_msg.argc >= 1 && exec_msg.argc <= PROTO_MAX_ARGS);
		check(!(exec_msg.flags & PROTO_EXEC_TTY) ||
		      (exec_msg.rows >= 1 && exec_msg.rows <= PROTO_MAX_TTY_DIM && exec_msg.cols >= 1 && exec_msg.cols <= PROTO_MAX_TTY_DIM));
		check(exec_msg.argv[exec_msg.argc] == NULL && exec_msg.env[exec_msg.envc] == NULL);
		for (i = 0; i < exec_msg.envc; i++)
			check(strchr(exec_msg.env[i], '=') != NULL);
		same(proto_exec_encode(enc, sizeof(enc), &exec_msg), p, len);
	} else {
		/* Not all error paths reset argc/envc (trailing bytes leave them
		 * set), but the arrays must stay NULL-terminated within bounds. */
		check(exec_msg.argc <= PROTO_MAX_ARGS && exec_msg.envc <= PROTO_MAX_ENV);
		check(exec_msg.argv[exec_msg.argc] == NULL && exec_msg.env[exec_msg.envc] == NULL);
	}
	if (proto_exit_decode(p, len, &ex) == 0)
		same(proto_exit_encode(enc, sizeof(enc), &ex), p, len);
	if (proto_out_file_decode(p, len, &of) == 0) {
		check(proto_relpath_ok(of.path) == 0);
		same(proto_out_file_encode(enc, sizeof(enc), &of), p, len);
	}
	if (proto_out_end_decode(p, len, &oe) == 0)
		same(proto_out_end_encode(enc, sizeof(enc), &oe), p, len);
	if (proto_error_decode(p, len, &er) == 0)
		same(proto_error_encode(enc, sizeof(enc), &er), p, len);
	if (proto_resize_decode(p, len, &rows, &cols) == 0) {
		check(rows >= 1 && rows <= PROTO_MAX_TTY_DIM && cols >= 1 && cols <= PROTO_MAX_TTY_DIM);
		same(proto_resize_encode(enc, sizeof(enc), rows, cols), p, len);
	}
	if (proto_procs_decode(p, len, &count, &pid) == 0) {
		check((count == 0) == (pid == 0));
		same(proto_procs_encode(enc, sizeof(enc), count, pid), p, len);
	}
	if (proto_zdone_decode((const char *)p, len, &zd) == 0) {
		check(zd.status <= 255 && zd.user_us < 1000000000000000ull && zd.sys_us < 1000000000000000ull &&
		      zd.maxrss_kib < 1000000000000000ull);
		same(proto_zdone_encode((char *)enc, sizeof(enc), &zd), p, len);
	}
	if (proto_path_decode(p, len, path) == 0)
		check(proto_relpath_ok(path) == 0 && strlen(path) + 4 == len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_each_frame(data, size, decode_all);
	return 0;
}
