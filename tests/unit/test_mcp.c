/* Unit tests for `kiln mcp`'s protocol handling (cli/mcp_proto.c): the
 * initialize handshake and version negotiation, notifications, JSON-RPC
 * errors, tools/list and tools/call's dispatch (with a stub for the tools;
 * the tools against a real stack: tests/integration/95-mcp.sh). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "mcp.h"

static char last_tool[64];
static json_t *last_args;

static json_t *stub(void *ctx, const char *name, json_t *args)
{
	snprintf(last_tool, sizeof(last_tool), "%s", name);
	json_decref(last_args);
	last_args = json_incref(args);
	return mcp_text_result(!strcmp(name, "exec"), "stub %s", name);
}

/* The answer to line, parsed (NULL when there is none). */
static json_t *ask(struct mcp_server *s, const char *line)
{
	char *out = mcp_handle(s, line, strlen(line));
	json_t *j;

	if (!out)
		return NULL;
	assert_null(strchr(out, '\n'));
	j = json_loads(out, 0, NULL);
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(j, "jsonrpc")), "2.0");
	free(out);
	return j;
}

static int error_code(json_t *j)
{
	return (int)json_integer_value(json_object_get(json_object_get(j, "error"), "code"));
}

static void test_handshake(void **state)
{
	struct mcp_server s = { .call = stub };
	json_t *j;

	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-03-26\","
		    "\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}\n");
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "result"), "protocolVersion")), "2025-03-26");
	assert_non_null(json_object_get(json_object_get(json_object_get(j, "result"), "capabilities"), "tools"));
	assert_string_equal(json_string_value(json_object_get(json_object_get(json_object_get(j, "result"), "serverInfo"), "name")),
			    "kiln");
	assert_int_equal(json_integer_value(json_object_get(j, "id")), 1);
	json_decref(j);
	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":\"i\",\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2030-01-01\"}}");
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "result"), "protocolVersion")),
			    MCP_LATEST_VERSION);
	assert_string_equal(json_string_value(json_object_get(j, "id")), "i");
	json_decref(j);
	assert_int_equal(s.initialized, 0);
	assert_null(ask(&s, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}"));
	assert_int_equal(s.initialized, 1);
	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}");
	assert_int_equal(json_object_size(json_object_get(j, "result")), 0);
	json_decref(j);
}

static void test_errors(void **state)
{
	struct mcp_server s = { .call = stub };
	json_t *j;

	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/li");
	assert_int_equal(error_code(j), MCP_PARSE_ERROR);
	assert_true(json_is_null(json_object_get(j, "id")));
	json_decref(j);
	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"prompts/list\"}");
	assert_int_equal(error_code(j), MCP_METHOD_NOT_FOUND);
	assert_int_equal(json_integer_value(json_object_get(j, "id")), 7);
	json_decref(j);
	j = ask(&s, "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]");
	assert_int_equal(error_code(j), MCP_INVALID_REQUEST);
	json_decref(j);
	j = ask(&s, "{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}");
	assert_int_equal(error_code(j), MCP_INVALID_REQUEST);
	json_decref(j);
	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ping\"}");
	assert_int_equal(error_code(j), MCP_INVALID_REQUEST);
	json_decref(j);
	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{}}");
	assert_int_equal(error_code(j), MCP_INVALID_PARAMS);
	json_decref(j);
	/* Notifications of any kind, responses and blank lines: no answer. */
	assert_null(ask(&s, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":1}}"));
	assert_null(ask(&s, "{\"jsonrpc\":\"2.0\",\"method\":\"tools/call\",\"params\":{\"name\":\"exec\"}}"));
	assert_null(ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{}}"));
	assert_null(ask(&s, "  \r\n"));
	assert_null(ask(&s, ""));
	assert_string_equal(last_tool, "");
}

static void test_tools(void **state)
{
	struct mcp_server s = { .call = stub };
	json_t *j, *t;
	size_t i;

	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}");
	t = json_object_get(json_object_get(j, "result"), "tools");
	assert_int_equal(json_array_size(t), 16);
	for (i = 0; i < json_array_size(t); i++) {
		json_t *tool = json_array_get(t, i);

		assert_true(mcp_tool_known(json_string_value(json_object_get(tool, "name"))));
		assert_true(strlen(json_string_value(json_object_get(tool, "description"))) > 30);
		assert_string_equal(json_string_value(json_object_get(json_object_get(tool, "inputSchema"), "type")), "object");
	}
	/* run_code: code is required; sandbox_id (a code interpreter) and
	 * language are not (language is checked by the tool without
	 * sandbox_id). */
	for (i = 0; i < json_array_size(t); i++) {
		json_t *tool = json_array_get(t, i), *schema = json_object_get(tool, "inputSchema");

		if (strcmp(json_string_value(json_object_get(tool, "name")), "run_code"))
			continue;
		assert_int_equal(json_array_size(json_object_get(schema, "required")), 1);
		assert_string_equal(json_string_value(json_array_get(json_object_get(schema, "required"), 0)), "code");
		assert_non_null(json_object_get(json_object_get(schema, "properties"), "sandbox_id"));
		assert_non_null(strstr(json_string_value(json_object_get(tool, "description")), "image"));
	}
	/* Fork and snapshots (issue 41): what each requires; create_sandbox's
	 * snapshot_id is optional like its other arguments. */
	{
		static const char *const want[][2] = {
			{ "fork_sandbox", "[\"sandbox_id\"]" }, { "snapshot_sandbox", "[\"sandbox_id\"]" },
			{ "list_snapshots", NULL }, { "delete_snapshot", "[\"snapshot_id\"]" }, { "create_sandbox", NULL },
			{ "create_volume", "[\"name\"]" }, { "list_volumes", NULL }, { "delete_volume", "[\"volume\"]" },
		};
		size_t w;

		for (w = 0; w < sizeof(want) / sizeof(want[0]); w++) {
			json_t *schema = NULL, *req;
			char *got;

			assert_true(mcp_tool_known(want[w][0]));
			for (i = 0; i < json_array_size(t); i++)
				if (!strcmp(json_string_value(json_object_get(json_array_get(t, i), "name")), want[w][0]))
					schema = json_object_get(json_array_get(t, i), "inputSchema");
			assert_non_null(schema);
			req = json_object_get(schema, "required");
			if (!want[w][1]) {
				assert_null(req);
				continue;
			}
			got = json_dumps(req, JSON_COMPACT);
			assert_string_equal(got, want[w][1]);
			free(got);
		}
		for (i = 0; i < json_array_size(t); i++) {
			json_t *tool = json_array_get(t, i), *props;
			const char *name = json_string_value(json_object_get(tool, "name"));

			props = json_object_get(json_object_get(tool, "inputSchema"), "properties");
			if (!strcmp(name, "create_sandbox"))
				assert_string_equal(json_string_value(json_object_get(json_object_get(props, "snapshot_id"), "type")),
						    "string");
			if (!strcmp(name, "create_sandbox")) {
				json_t *vols = json_object_get(props, "volumes");
				char *req = json_dumps(json_object_get(json_object_get(vols, "items"), "required"), JSON_COMPACT);

				assert_string_equal(json_string_value(json_object_get(vols, "type")), "array");
				assert_int_equal(json_integer_value(json_object_get(vols, "maxItems")), 2);
				assert_string_equal(req, "[\"name\",\"path\"]");
				free(req);
			}
			if (!strcmp(name, "create_volume")) {
				assert_int_equal(json_integer_value(json_object_get(json_object_get(props, "size_mib"), "minimum")), 16);
				assert_int_equal(json_integer_value(json_object_get(json_object_get(props, "size_mib"), "maximum")), 65536);
			}
			if (!strcmp(name, "fork_sandbox")) {
				assert_int_equal(json_integer_value(json_object_get(json_object_get(props, "count"), "minimum")), 1);
				assert_int_equal(json_integer_value(json_object_get(json_object_get(props, "count"), "maximum")), 20);
			}
		}
	}
	json_decref(j);

	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"exec\","
		    "\"arguments\":{\"sandbox_id\":\"s_1\",\"command\":\"ls\"}}}");
	assert_string_equal(last_tool, "exec");
	assert_string_equal(json_string_value(json_object_get(last_args, "command")), "ls");
	assert_true(json_is_true(json_object_get(json_object_get(j, "result"), "isError")));
	json_decref(j);
	/* No arguments: the tool gets {}. */
	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"name\":\"create_sandbox\"}}");
	assert_string_equal(last_tool, "create_sandbox");
	assert_int_equal(json_object_size(last_args), 0);
	assert_true(json_is_false(json_object_get(json_object_get(j, "result"), "isError")));
	json_decref(j);

	/* The new tools reach the tool function with their arguments. */
	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"tools/call\",\"params\":{\"name\":\"fork_sandbox\","
		    "\"arguments\":{\"sandbox_id\":\"s_1\",\"count\":3}}}");
	assert_string_equal(last_tool, "fork_sandbox");
	assert_int_equal(json_integer_value(json_object_get(last_args, "count")), 3);
	json_decref(j);
	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":\"create_sandbox\","
		    "\"arguments\":{\"volumes\":[{\"name\":\"ws\",\"path\":\"/data\"}]}}}");
	assert_string_equal(last_tool, "create_sandbox");
	assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(last_args, "volumes"), 0), "path")),
			    "/data");
	json_decref(j);
	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"tools/call\",\"params\":{\"name\":\"delete_volume\","
		    "\"arguments\":{\"volume\":\"ws\"}}}");
	assert_string_equal(last_tool, "delete_volume");
	assert_string_equal(json_string_value(json_object_get(last_args, "volume")), "ws");
	json_decref(j);

	last_tool[0] = '\0';
	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":{\"name\":\"rm_rf\",\"arguments\":{}}}");
	assert_int_equal(error_code(j), MCP_INVALID_PARAMS);
	json_decref(j);
	j = ask(&s, "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{\"name\":\"exec\",\"arguments\":\"ls\"}}");
	assert_int_equal(error_code(j), MCP_INVALID_PARAMS);
	json_decref(j);
	assert_string_equal(last_tool, "");

	j = mcp_json_result(0, json_pack("{s:i}", "exit_code", 0));
	assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "content"), 0), "text")),
			    "{\n  \"exit_code\": 0\n}");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "structuredContent"), "exit_code")), 0);
	json_decref(j);
	json_decref(last_args);
	last_args = NULL;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_handshake),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_tools),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
