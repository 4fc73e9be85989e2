/* fuzz_codeev: libFuzzer target for kiln-api's reading of the code
 * interpreter's event lines (api/ports/port_code_ev.c): they come from the
 * sandbox, anyone's code. Input: one byte of mode (bits 0-5: the size of the
 * pieces the bytes arrive in, 1-64; bit 6: a whole answer's model kept;
 * bit 7: small caps, 256 bytes), then the body. Besides memory safety,
 * checks that a feed fails only with -E2BIG and then stays failed, that the
 * model holds no more than its cap, that every event handed on is one of
 * the six names with an object, and that the model is always a whole
 * {results, logs, error, execution_count}. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "ports_int.h"

static int on_event(void *cls, const char *name, json_t *ev)
{
	static const char *const names[] = { "stdout", "stderr", "result", "error", "execution_count", "end" };
	int known = 0;

	(void)cls;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		known |= !strcmp(name, names[i]);
	check(known);
	check(json_is_object(ev));
	if (!strcmp(name, "stdout") || !strcmp(name, "stderr"))
		check(json_is_string(json_object_get(ev, "text")));
	if (!strcmp(name, "result"))
		check(json_is_boolean(json_object_get(ev, "is_main_result")) && !json_object_get(ev, "type"));
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct code_exec x;
	size_t piece, off = 1, cap;
	int whole, rc = 0;
	json_t *r;

	if (size < 1)
		return 0;
	piece = (size_t)(data[0] & 63) + 1;
	whole = (data[0] >> 6) & 1;
	cap = data[0] & 128 ? 256 : 1u << 20;
	code_exec_init(&x, whole ? cap : 0, cap);
	while (off < size) {
		size_t n = size - off < piece ? size - off : piece;

		rc = code_exec_feed(&x, (const char *)data + off, n, on_event, NULL);
		if (rc < 0)
			break;
		off += n;
	}
	check(rc == 0 || (rc == -E2BIG && x.too_big));
	if (rc < 0)
		check(code_exec_feed(&x, "\n", 1, on_event, NULL) == -E2BIG);
	check(x.held <= x.held_max || !whole);
	check(x.line.len <= cap);
	r = code_exec_result(&x);
	check(json_is_array(json_object_get(r, "results")));
	check(json_is_array(json_object_get(json_object_get(r, "logs"), "stdout")));
	check(json_is_array(json_object_get(json_object_get(r, "logs"), "stderr")));
	check(json_object_get(r, "error") && json_object_get(r, "execution_count"));
	json_decref(r);
	code_exec_free(&x);
	return 0;
}
