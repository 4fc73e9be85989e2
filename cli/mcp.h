/* mcp: `kiln mcp`, a Model Context Protocol server on stdin/stdout
 * (docs/mcp.md). mcp_proto.c is the protocol (JSON-RPC 2.0, one message a
 * line, the 2025 initialize handshake, ping, tools/list, tools/call) and the
 * tools' declarations: pure, no I/O, fuzzed (tests/fuzz/fuzz_mcp.c). mcp.c
 * runs the tools against kiln-api and reads and writes the lines. */
#ifndef KILN_CLI_MCP_H
#define KILN_CLI_MCP_H

#include <stddef.h>

#include <jansson.h>

#define MCP_LATEST_VERSION "2025-06-18"
#define MCP_MAX_LINE (100u << 20) /* a write_file of 64 MiB, base64-encoded, fits */

/* JSON-RPC error codes */
#define MCP_PARSE_ERROR -32700
#define MCP_INVALID_REQUEST -32600
#define MCP_METHOD_NOT_FOUND -32601
#define MCP_INVALID_PARAMS -32602

/* Runs tool `name` (one of mcp_tools()) with its arguments (an object) and
 * returns a CallToolResult ({"content":[…],"isError":…}), never NULL. */
typedef json_t *(*mcp_tool_fn)(void *ctx, const char *name, json_t *args);

struct mcp_server {
	mcp_tool_fn call;
	void *ctx;
	int initialized;              /* notifications/initialized came */
	char version[16];             /* the protocol version agreed on */
};

/* The tools' declarations (tools/list's "tools"): name, description,
 * inputSchema. Borrowed, built once. */
json_t *mcp_tools(void);

/* 1 when name is one of mcp_tools(). */
int mcp_tool_known(const char *name);

/* One message (a line without its newline, len bytes, not necessarily
 * NUL-terminated): the answer to write as one line (malloc'd, compact JSON,
 * no newline), or NULL when there is none (a notification, a response, a
 * blank line). Never fails on any input. */
char *mcp_handle(struct mcp_server *s, const char *line, size_t len);

/* A CallToolResult with one text content item (printf format). */
json_t *mcp_text_result(int is_error, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A CallToolResult whose text is obj as indented JSON, also as
 * structuredContent (steals obj). */
json_t *mcp_json_result(int is_error, json_t *obj);

#endif
