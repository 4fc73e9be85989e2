/* fuzz_eproto: libFuzzer target for the guest envd protocol (lib/eproto.c).
 * Splits the input into lib/proto frames and hands every payload to every
 * decoder, each from an exact-size heap copy so that ASan sees any read past
 * the payload. A payload that decodes must re-encode to the same bytes; a
 * payload that is a well-formed metadata set must rebuild to itself. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eproto.h"
#include "fuzz.h"

static struct eproto_start start_msg; /* ~130 KiB each: off the stack */
static struct eproto_proc proc_msg;
static struct eproto_entry entry_msg;
static struct eproto_fsreq fs_msg;
static uint8_t enc[PROTO_MAX_PAYLOAD];
static uint16_t ports[EPROTO_MAX_PORTS];
static struct eproto_watch watch_msg;
static char wname[PROTO_MAX_PATH + 1];

static void same(ssize_t n, const uint8_t *p, size_t len)
{
	check(n >= 0 && (size_t)n == len && memcmp(enc, p, len) == 0);
}

static void decode_all(const uint8_t *p, size_t len)
{
	static const uint8_t fstypes[] = { EP_STAT, EP_LISTDIR, EP_MKDIR, EP_MOVE, EP_REMOVE, EP_READ, EP_WRITE };
	char msg[PROTO_MAX_MSG + 1];
	const uint8_t *raw;
	uint32_t v[3], id, status;
	int32_t code;
	uint8_t stream, how;
	uint32_t pn;
	size_t n, i;

	if (eproto_start_decode(p, len, &start_msg) == 0) {
		check(start_msg.argc >= 1 && start_msg.argv[start_msg.argc] == NULL);
		check(start_msg.env[start_msg.envc] == NULL && strlen(start_msg.user) <= EPROTO_MAX_USER);
		for (i = 0; i < start_msg.envc; i++)
			check(strchr(start_msg.env[i], '=') && start_msg.env[i][0] != '=');
		same(eproto_start_encode(enc, sizeof(enc), &start_msg), p, len);
	} else {
		check(start_msg.argc == 0 || start_msg.argv[start_msg.argc] == NULL);
	}
	if (eproto_proc_decode(p, len, &proc_msg) == 0) {
		check(proc_msg.pid != 0 && proc_msg.argc >= 1);
		same(eproto_proc_encode(enc, sizeof(enc), &proc_msg), p, len);
	}
	if (eproto_entry_decode(p, len, &entry_msg) == 0) {
		check(entry_msg.type >= EP_FILE && entry_msg.type <= EP_OTHER && !strchr(entry_msg.name, '/'));
		check(entry_msg.meta_len <= EPROTO_MAX_META && eproto_meta_check(entry_msg.meta, entry_msg.meta_len) == 0);
		same(eproto_entry_encode(enc, sizeof(enc), &entry_msg), p, len);
	}
	for (i = 0; i < sizeof(fstypes); i++)
		if (eproto_fsreq_decode(p, len, fstypes[i], &fs_msg) == 0) {
			check(fs_msg.path[0] != '\0');
			same(eproto_fsreq_encode(enc, sizeof(enc), fstypes[i], &fs_msg), p, len);
		}
	/* A metadata set that checks is rebuilt pair by pair into the same bytes. */
	if (eproto_meta_check((const char *)p, len) == 0) {
		static char rebuilt[EPROTO_MAX_META];
		uint32_t rl = 0;
		size_t off = 0;
		const char *k, *v;

		check(len <= EPROTO_MAX_META);
		while (eproto_meta_next((const char *)p, len, &off, &k, &v))
			check(eproto_meta_add(rebuilt, &rl, k, strlen(k), v, strlen(v)) == 0);
		check(rl == len && (!len || memcmp(rebuilt, p, len) == 0));
	}
	for (i = 1; i <= 3; i++)
		if (eproto_u32s_decode(p, len, v, (unsigned)i) == 0)
			same(eproto_u32s_encode(enc, sizeof(enc), v, (unsigned)i), p, len);
	if (eproto_idraw_decode(p, len, &id, &raw, &n) == 0) {
		check(raw == p + 4 && n == len - 4 && n <= EPROTO_MAX_CHUNK);
		same(eproto_idraw_encode(enc, sizeof(enc), id, raw, n), p, len);
	}
	if (eproto_ports_decode(p, len, &id, ports, &pn) == 0) {
		check(pn <= EPROTO_MAX_PORTS);
		for (i = 0; i < pn; i++)
			check(ports[i] >= 1);
		same(eproto_ports_encode(enc, sizeof(enc), id, ports, pn), p, len);
	}
	if (eproto_out_decode(p, len, &id, &stream, &raw, &n) == 0) {
		check(n <= EPROTO_MAX_CHUNK && stream >= EP_STDOUT && stream <= EP_PTY);
		same(eproto_out_encode(enc, sizeof(enc), id, stream, raw, n), p, len);
	}
	if (eproto_end_decode(p, len, &id, &how, &status) == 0)
		same(eproto_end_encode(enc, sizeof(enc), id, how, status), p, len);
	if (eproto_watch_decode(p, len, &watch_msg) == 0) {
		check(watch_msg.path[0] != '\0' && !(watch_msg.flags & ~EP_WATCH_FLAGS));
		same(eproto_watch_encode(enc, sizeof(enc), &watch_msg), p, len);
	}
	if (eproto_wevent_decode(p, len, &id, &how, wname) == 0) {
		check(how >= EP_WEV_CREATE && how <= EP_WEV_CHMOD && (!strcmp(wname, ".") || proto_relpath_ok(wname) == 0));
		same(eproto_wevent_encode(enc, sizeof(enc), id, how, wname), p, len);
	}
	if (eproto_wend_decode(p, len, &id, &code, msg) == 0) {
		check(code <= 0);
		same(eproto_wend_encode(enc, sizeof(enc), id, code, msg), p, len);
	}
	if (eproto_error_decode(p, len, &id, &code, msg) == 0) {
		check(code < 0);
		same(eproto_error_encode(enc, sizeof(enc), id, code, msg), p, len);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_each_frame(data, size, decode_all);
	return 0;
}
