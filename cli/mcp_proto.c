/* mcp_proto: the MCP protocol of `kiln mcp` (mcp.h): JSON-RPC 2.0 messages,
 * one a line, and the tools' declarations. Pure functions over jansson. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mcp.h"

static const char *const versions[] = { "2025-06-18", "2025-03-26", "2024-11-05" };

#define SANDBOX_ID "{\"type\":\"string\",\"description\":\"The sandbox's id, as create_sandbox returned it (s_...)\"}"

/* name, description, inputSchema (JSON text) */
static const char *const tool_defs[][3] = {
	{ "run_code",
	  "Run a piece of code once in a fresh, isolated Linux microVM (Debian, Python 3.11, no network) and "
	  "return its exit code, stdout and stderr. Files the code writes under /output come back as download "
	  "links. Nothing persists after the run: for several steps on the same files use create_sandbox and exec. "
	  "With sandbox_id (a sandbox created with template code-interpreter) the code is a notebook cell run in "
	  "that sandbox's live interpreter instead: variables and imports persist from one call to the next, and "
	  "the result carries the cell's stdout, stderr, its rich results (the last expression's value, display() "
	  "calls, DataFrames) and its error; every matplotlib figure (plt.show()) and PNG or JPEG result comes "
	  "back as an image.",
	  "{\"type\":\"object\",\"properties\":{"
	  "\"sandbox_id\":{\"type\":\"string\",\"description\":\"Run in this sandbox's code interpreter "
	  "(template code-interpreter) instead of a fresh VM\"},"
	  "\"language\":{\"type\":\"string\",\"enum\":[\"python\",\"bash\",\"sh\"],"
	  "\"description\":\"The language of code (required without sandbox_id; with it, default python)\"},"
	  "\"code\":{\"type\":\"string\","
	  "\"description\":\"The program to run (runs in /work as an unprivileged user)\"},"
	  "\"files\":{\"type\":\"array\","
	  "\"description\":\"Files to create before the code runs\",\"items\":{\"type\":\"object\","
	  "\"properties\":{\"path\":{\"type\":\"string\",\"description\":\"Where (relative paths are under /work)\"},"
	  "\"content\":{\"type\":\"string\",\"description\":\"The file's text\"},"
	  "\"content_base64\":{\"type\":\"string\","
	  "\"description\":\"Or its bytes, base64-encoded\"}},\"required\":[\"path\"]}},"
	  "\"timeout\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":86400,"
	  "\"description\":\"Seconds the code may run (default 30; with sandbox_id, 300)\"}},"
	  "\"required\":[\"code\"]}" },
	{ "create_sandbox",
	  "Create a sandbox: a Linux microVM (Debian, Python 3.11, no network) that stays up between commands, "
	  "so files and background processes persist from one exec to the next. Returns its sandbox_id. It ends "
	  "after idle_timeout seconds without a command; destroy it with destroy_sandbox when done. With "
	  "snapshot_id it starts as the snapshot's sandbox was, running processes included.",
	  "{\"type\":\"object\",\"properties\":{"
	  "\"template\":{\"type\":\"string\",\"description\":\"The environment (default: default; "
	  "python-data has numpy, pandas and matplotlib; code-interpreter adds a live notebook interpreter for "
	  "run_code with sandbox_id)\"},"
	  "\"memory_mib\":{\"type\":\"integer\",\"minimum\":128,\"maximum\":16384,"
	  "\"description\":\"RAM in MiB (default 256)\"},"
	  "\"vcpus\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":16,\"description\":\"CPUs (default 1)\"},"
	  "\"idle_timeout\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":86400,"
	  "\"description\":\"Seconds without a command before it ends (default 600)\"},"
	  "\"lifetime\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":604800,"
	  "\"description\":\"Seconds it may live at most (default 3600)\"},"
	  "\"snapshot_id\":{\"type\":\"string\",\"description\":\"Start from this snapshot (snapshot_sandbox, "
	  "list_snapshots: snap_...) with its memory, processes and files; its template, memory and vCPUs are the "
	  "snapshot's, so template, memory_mib and vcpus cannot go with it\"},"
	  "\"volumes\":{\"type\":\"array\",\"maxItems\":2,\"description\":\"Volumes (create_volume) to mount: "
	  "what is written there and synced is kept for the next sandbox that mounts it. Read-write by one sandbox "
	  "at a time, read-only by any number\",\"items\":{\"type\":\"object\",\"properties\":{"
	  "\"name\":{\"type\":\"string\",\"description\":\"The volume's name\"},"
	  "\"path\":{\"type\":\"string\",\"description\":\"Where it appears in the sandbox, e.g. /data\"},"
	  "\"read_only\":{\"type\":\"boolean\",\"description\":\"Mount it read-only (default false)\"}},"
	  "\"required\":[\"name\",\"path\"]}}}}" },
	{ "exec",
	  "Run a shell command (bash -c) in a sandbox and return its exit code, stdout and stderr. Runs in /work "
	  "as an unprivileged user; a non-zero exit is reported as an error result with the output.",
	  "{\"type\":\"object\",\"properties\":{\"sandbox_id\":" SANDBOX_ID ","
	  "\"command\":{\"type\":\"string\",\"description\":\"The command line, run by bash -c\"},"
	  "\"cwd\":{\"type\":\"string\",\"description\":\"Working directory (default /work)\"},"
	  "\"env\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"},"
	  "\"description\":\"Environment variables\"},"
	  "\"stdin\":{\"type\":\"string\",\"description\":\"Text given to the command as its stdin\"},"
	  "\"timeout\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":86400,"
	  "\"description\":\"Seconds it may run (default 30)\"}},"
	  "\"required\":[\"sandbox_id\",\"command\"]}" },
	{ "write_file",
	  "Write a file in a sandbox (parent directories are created; an existing file is replaced).",
	  "{\"type\":\"object\",\"properties\":{\"sandbox_id\":" SANDBOX_ID ","
	  "\"path\":{\"type\":\"string\",\"description\":\"The file (relative paths are under /work)\"},"
	  "\"content\":{\"type\":\"string\","
	  "\"description\":\"The file's text, or its bytes base64-encoded with encoding base64\"},"
	  "\"encoding\":{\"type\":\"string\",\"enum\":[\"utf8\",\"base64\"],"
	  "\"description\":\"How content is given (default utf8)\"}},"
	  "\"required\":[\"sandbox_id\",\"path\",\"content\"]}" },
	{ "read_file",
	  "Read a file from a sandbox: its text, or its bytes base64-encoded when it is not UTF-8 text.",
	  "{\"type\":\"object\",\"properties\":{\"sandbox_id\":" SANDBOX_ID ","
	  "\"path\":{\"type\":\"string\",\"description\":\"The file (relative paths are under /work)\"}},"
	  "\"required\":[\"sandbox_id\",\"path\"]}" },
	{ "list_files",
	  "List a directory of a sandbox: each entry's name, type (file, dir, link, other) and size.",
	  "{\"type\":\"object\",\"properties\":{\"sandbox_id\":" SANDBOX_ID ","
	  "\"path\":{\"type\":\"string\","
	  "\"description\":\"The directory (default /work; relative paths are under /work)\"}},"
	  "\"required\":[\"sandbox_id\"]}" },
	{ "pause_sandbox",
	  "Pause a sandbox: its memory and disk are saved and it stops using resources until resume_sandbox "
	  "brings it back as it was (files and processes).",
	  "{\"type\":\"object\",\"properties\":{\"sandbox_id\":" SANDBOX_ID "},\"required\":[\"sandbox_id\"]}" },
	{ "resume_sandbox",
	  "Resume a paused sandbox, with its files and processes as they were at the pause.",
	  "{\"type\":\"object\",\"properties\":{\"sandbox_id\":" SANDBOX_ID "},\"required\":[\"sandbox_id\"]}" },
	{ "destroy_sandbox",
	  "Destroy a sandbox and everything in it, for good.",
	  "{\"type\":\"object\",\"properties\":{\"sandbox_id\":" SANDBOX_ID "},\"required\":[\"sandbox_id\"]}" },
	{ "fork_sandbox",
	  "Fork a running sandbox: make count new sandboxes, each with the sandbox's memory, running processes, "
	  "variables and files as they are at this instant (the sandbox itself goes on). Returns the new "
	  "sandbox_ids: try several approaches from one state, one per fork, keep the one that works and destroy "
	  "the others. Changes in one are invisible to the others. Each fork counts against the quotas as a "
	  "sandbox; those refused are listed in errors.",
	  "{\"type\":\"object\",\"properties\":{\"sandbox_id\":" SANDBOX_ID ","
	  "\"count\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":20,"
	  "\"description\":\"How many forks (default 1)\"}},\"required\":[\"sandbox_id\"]}" },
	{ "snapshot_sandbox",
	  "Save a running sandbox's state (memory, processes, files) as a snapshot that outlives it; "
	  "create_sandbox with snapshot_id starts any number of sandboxes from it. The sandbox goes on. Returns the "
	  "snapshot_id. Snapshots count against a quota until delete_snapshot.",
	  "{\"type\":\"object\",\"properties\":{\"sandbox_id\":" SANDBOX_ID ","
	  "\"name\":{\"type\":\"string\",\"description\":\"A name to find it by (list_snapshots)\"}},"
	  "\"required\":[\"sandbox_id\"]}" },
	{ "list_snapshots",
	  "List your snapshots, newest first: each one's snapshot_id, name, the sandbox it was taken of, "
	  "template, size and creation time (milliseconds since the epoch).",
	  "{\"type\":\"object\",\"properties\":{"
	  "\"name\":{\"type\":\"string\",\"description\":\"Only the snapshots of this name\"}}}" },
	{ "delete_snapshot",
	  "Delete a snapshot for good (sandboxes already started from it are not affected).",
	  "{\"type\":\"object\",\"properties\":{\"snapshot_id\":{\"type\":\"string\","
	  "\"description\":\"The snapshot's id (snap_...)\"}},\"required\":[\"snapshot_id\"]}" },
	{ "create_volume",
	  "Create a volume: a named filesystem of your own that outlives sandboxes. Mount it with create_sandbox's "
	  "volumes; what a sandbox writes there and syncs is in the next sandbox that mounts it. Returns its "
	  "volume_id.",
	  "{\"type\":\"object\",\"properties\":{"
	  "\"name\":{\"type\":\"string\",\"description\":\"Its name, unique among your volumes (1-63 of "
	  "A-Z a-z 0-9 . _ -)\"},"
	  "\"size_mib\":{\"type\":\"integer\",\"minimum\":16,\"maximum\":65536,"
	  "\"description\":\"Its size in MiB (default 1024)\"}},\"required\":[\"name\"]}" },
	{ "list_volumes",
	  "List your volumes, newest first: each one's volume_id, name, size_mib, creation time (milliseconds since "
	  "the epoch) and the sandboxes that mount it.",
	  "{\"type\":\"object\",\"properties\":{"
	  "\"name\":{\"type\":\"string\",\"description\":\"Only the volume of this name\"}}}" },
	{ "delete_volume",
	  "Delete a volume and its files for good. Refused while a sandbox (even a paused one) mounts it: destroy "
	  "that sandbox first.",
	  "{\"type\":\"object\",\"properties\":{\"volume\":{\"type\":\"string\","
	  "\"description\":\"The volume's id (vol_...) or name\"}},\"required\":[\"volume\"]}" },
};

#define NTOOLS (sizeof(tool_defs) / sizeof(tool_defs[0]))

json_t *mcp_tools(void)
{
	static json_t *tools;
	size_t i;

	if (tools)
		return tools;
	tools = json_array();
	for (i = 0; i < NTOOLS; i++) {
		json_t *schema = json_loads(tool_defs[i][2], 0, NULL);

		if (!schema) {
			fprintf(stderr, "kiln mcp: tool %s: its schema is not JSON\n", tool_defs[i][0]);
			abort();
		}
		json_array_append_new(tools, json_pack("{s:s, s:s, s:o}", "name", tool_defs[i][0], "description",
						       tool_defs[i][1], "inputSchema", schema));
	}
	return tools;
}

int mcp_tool_known(const char *name)
{
	size_t i;

	for (i = 0; i < NTOOLS; i++)
		if (!strcmp(name, tool_defs[i][0]))
			return 1;
	return 0;
}

json_t *mcp_text_result(int is_error, const char *fmt, ...)
{
	char buf[4096];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	return json_pack("{s:[{s:s, s:s%}], s:b}", "content", "type", "text", "text", buf, strlen(buf), "isError",
			 is_error);
}

json_t *mcp_json_result(int is_error, json_t *obj)
{
	char *text = json_dumps(obj, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_t *r;

	if (!text) {
		json_decref(obj);
		return mcp_text_result(1, "kiln mcp: out of memory");
	}
	r = json_pack("{s:[{s:s, s:s}], s:o, s:b}", "content", "type", "text", "text", text, "structuredContent", obj,
		      "isError", is_error);
	free(text);
	return r;
}

static char *dump(json_t *msg)
{
	char *s = msg ? json_dumps(msg, JSON_COMPACT) : NULL;

	json_decref(msg);
	return s;
}

/* id: borrowed (NULL: null). */
static char *error_reply(json_t *id, int code, const char *message)
{
	return dump(json_pack("{s:s, s:O?, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id, "error", "code", code, "message",
			      message));
}

static char *result_reply(json_t *id, json_t *result)
{
	return dump(json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result));
}

static char *initialize(struct mcp_server *s, json_t *id, json_t *params)
{
	const char *want = json_string_value(json_object_get(params, "protocolVersion"));
	const char *v = MCP_LATEST_VERSION;
	size_t i;

	if (!json_is_object(params) || !want)
		return error_reply(id, MCP_INVALID_PARAMS, "initialize: params.protocolVersion (a string) is missing");
	for (i = 0; i < sizeof(versions) / sizeof(versions[0]); i++)
		if (!strcmp(want, versions[i]))
			v = versions[i];
	snprintf(s->version, sizeof(s->version), "%s", v);
	return result_reply(id, json_pack("{s:s, s:{s:{s:b}}, s:{s:s, s:s, s:s}, s:s}", "protocolVersion", v,
					  "capabilities", "tools", "listChanged", 0, "serverInfo", "name", "kiln",
					  "title", "kiln code sandboxes", "version", "1.0", "instructions",
					  "kiln runs code in isolated Linux microVMs. run_code runs a program once; "
					  "create_sandbox gives a VM that keeps its files between exec calls "
					  "(write_file, read_file, list_files, exec, pause_sandbox, resume_sandbox, "
					  "destroy_sandbox). fork_sandbox branches a running sandbox into copies, to try "
					  "several things from one state; snapshot_sandbox keeps a state to start new "
					  "sandboxes from (create_sandbox snapshot_id); create_volume makes a filesystem "
					  "that outlives sandboxes, mounted with create_sandbox volumes. Destroy sandboxes and delete "
					  "snapshots you no longer need."));
}

static char *tools_call(struct mcp_server *s, json_t *id, json_t *params)
{
	const char *name = json_string_value(json_object_get(params, "name"));
	json_t *args = json_object_get(params, "arguments"), *res;
	char msg[300];

	if (!json_is_object(params) || !name)
		return error_reply(id, MCP_INVALID_PARAMS, "tools/call: params.name (a string) is missing");
	if (!mcp_tool_known(name)) {
		snprintf(msg, sizeof(msg), "tools/call: unknown tool \"%.100s\" (tools/list names them)", name);
		return error_reply(id, MCP_INVALID_PARAMS, msg);
	}
	if (args && !json_is_object(args) && !json_is_null(args))
		return error_reply(id, MCP_INVALID_PARAMS, "tools/call: params.arguments must be an object");
	if (!json_is_object(args))
		args = NULL;
	args = args ? json_incref(args) : json_object();
	res = s->call(s->ctx, name, args);
	json_decref(args);
	if (!res)
		res = mcp_text_result(1, "%s: failed", name);
	return result_reply(id, res);
}

char *mcp_handle(struct mcp_server *s, const char *line, size_t len)
{
	json_error_t jerr;
	json_t *msg, *id, *params;
	const char *method, *jsonrpc;
	char *out = NULL, text[300];
	size_t i;

	for (i = 0; i < len && strchr(" \t\r\n", line[i]) && line[i]; i++)
		;
	if (i == len)
		return NULL;
	msg = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!msg) {
		snprintf(text, sizeof(text), "parse error: %s", jerr.text);
		return error_reply(NULL, MCP_PARSE_ERROR, text);
	}
	if (!json_is_object(msg)) {
		json_decref(msg);
		return error_reply(NULL, MCP_INVALID_REQUEST,
				   "invalid request: a message is one JSON object (batches are not supported)");
	}
	id = json_object_get(msg, "id");
	method = json_string_value(json_object_get(msg, "method"));
	jsonrpc = json_string_value(json_object_get(msg, "jsonrpc"));
	params = json_object_get(msg, "params");
	if (id && !json_is_string(id) && !json_is_integer(id) && !json_is_real(id))
		id = NULL, out = error_reply(NULL, MCP_INVALID_REQUEST, "invalid request: id must be a string or a number");
	else if (!method) {
		/* A response (result or error) to a request we never send, or junk. */
		if (!json_object_get(msg, "result") && !json_object_get(msg, "error"))
			out = error_reply(id, MCP_INVALID_REQUEST, "invalid request: no method");
	} else if (!jsonrpc || strcmp(jsonrpc, "2.0"))
		out = id ? error_reply(id, MCP_INVALID_REQUEST, "invalid request: jsonrpc must be \"2.0\"") : NULL;
	else if (params && !json_is_object(params) && !json_is_array(params))
		out = id ? error_reply(id, MCP_INVALID_REQUEST, "invalid request: params must be an object") : NULL;
	else if (!id) {
		/* Notifications get no answer, whatever they are. */
		if (!strcmp(method, "notifications/initialized"))
			s->initialized = 1;
	} else if (!strcmp(method, "initialize"))
		out = initialize(s, id, params);
	else if (!strcmp(method, "ping"))
		out = result_reply(id, json_object());
	else if (!strcmp(method, "tools/list"))
		out = result_reply(id, json_pack("{s:O}", "tools", mcp_tools()));
	else if (!strcmp(method, "tools/call"))
		out = tools_call(s, id, params);
	else {
		snprintf(text, sizeof(text), "method not found: %.200s", method);
		out = error_reply(id, MCP_METHOD_NOT_FOUND, text);
	}
	json_decref(msg);
	return out;
}
