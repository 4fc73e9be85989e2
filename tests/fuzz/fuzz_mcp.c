/* fuzz_mcp: libFuzzer target for mcp_handle() (`kiln mcp`'s message
 * handling, cli/mcp_proto.c): any line an MCP client (or anything else on
 * stdin) sends. Besides memory safety, checks that every answer is one JSON
 * object with "jsonrpc":"2.0", an "id" and exactly one of "result" or
 * "error" (an error with an integer code and a message), that a tool runs
 * only for a tools/call naming a known tool with object arguments, and that
 * tool results are passed back as they came. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mcp.h"
#include "fuzz.h"

static int calls;

static json_t *stub(void *ctx, const char *name, json_t *args)
{
	check(mcp_tool_known(name));
	check(json_is_object(args));
	calls++;
	return mcp_text_result(0, "ran %s", name);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct mcp_server s = { .call = stub };
	char *copy = malloc(size ? size : 1), *out;
	json_t *ans, *id, *res, *err;

	check(copy != NULL);
	memcpy(copy, data, size);
	calls = 0;
	out = mcp_handle(&s, copy, size);
	free(copy);
	if (!out) {
		check(calls == 0);
		return 0;
	}
	ans = json_loads(out, JSON_REJECT_DUPLICATES, NULL);
	check(ans && json_is_object(ans));
	check(!strchr(out, '\n')); /* one line on the wire */
	check(!strcmp(json_string_value(json_object_get(ans, "jsonrpc")) ?: "", "2.0"));
	id = json_object_get(ans, "id");
	check(id && (json_is_null(id) || json_is_string(id) || json_is_number(id)));
	res = json_object_get(ans, "result");
	err = json_object_get(ans, "error");
	check(!res != !err);
	if (err) {
		check(json_is_integer(json_object_get(err, "code")));
		check(json_string_value(json_object_get(err, "message")));
		check(calls == 0);
	} else {
		check(json_is_object(res));
		if (calls)
			check(json_is_array(json_object_get(res, "content")) && json_is_false(json_object_get(res, "isError")));
	}
	check(calls <= 1);
	json_decref(ans);
	free(out);
	return 0;
}
