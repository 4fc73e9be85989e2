#!/usr/bin/env bash
# kiln mcp's run_code with sandbox_id (docs/mcp.md) against a stand-in
# kiln-api (tests/integration/mcp_code_api.py; no VM): the request it sends
# (POST /v1/sessions/{id}/code with the key, code, language, timeout_ms),
# the result's text (stdout, each result's text and formats, the error,
# the execution count) and each PNG or JPEG result as an MCP image item in
# order; an exception is an error result; no_interpreter is said; language
# is still required without sandbox_id. (101-code-native.sh runs the tool
# against a real code interpreter.)
. "$(dirname "$0")/lib.sh"
t_plan 8
t_require_tools jq
t_require_built kiln
t_bg python3 "$ROOT/tests/integration/mcp_code_api.py" "$T_TMP" > "$T_TMP/port"
for _ in $(seq 100); do [ -s "$T_TMP/port" ] && break; sleep 0.05; done
API=http://127.0.0.1:$(cat "$T_TMP/port")

mcp() { # one initialize, then each argument a tools/call of run_code (ids from 2)
	local i=2 a
	{
		echo '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}'
		echo '{"jsonrpc":"2.0","method":"notifications/initialized"}'
		for a; do
			jq -cn --argjson id "$i" --argjson args "$a" '{jsonrpc:"2.0",id:$id,method:"tools/call",params:{name:"run_code",arguments:$args}}'
			i=$((i + 1))
		done
	} | env -i PATH=/usr/bin:/bin HOME="$T_TMP" KILN_API="$API" KILN_KEY=kiln_test_key timeout 60 "$ROOT/build/kiln" mcp 2> "$T_TMP/mcp.err"
}
mcp '{"sandbox_id":"s_plot","code":"plot()"}' '{"sandbox_id":"s_err","code":"f()","language":"sh","timeout":86400}' \
	'{"sandbox_id":"s_plain","code":"1+1"}' '{"code":"1+1"}' '{"sandbox_id":"../x","code":"1"}' > "$T_TMP/out"
res() { jq -c "select(.id == $1) | .result" "$T_TMP/out"; }
req() { sed -n "${1}p" "$T_TMP/requests.jsonl"; }

check "the request: POST /v1/sessions/s_plot/code with the key, code and the default timeout (300 s) ($(req 1))" \
	[ "$(req 1 | jq -c '[.path, .auth, .body]')" = '["/v1/sessions/s_plot/code","Bearer kiln_test_key",{"code":"plot()","timeout_ms":300000}]' ]
check "sh is bash; a timeout past an hour is an hour ($(req 2 | jq -c .body))" \
	[ "$(req 2 | jq -c .body)" = '{"code":"f()","timeout_ms":3600000,"language":"bash"}' ]
kinds=$(res 2 | jq -r '[.content[] | .type + (if .mimeType then ":" + .mimeType else "" end)] | join(",")')
check "a figure and a photo: a text item, then an image/png and an image/jpeg item ($kinds)" \
	[ "$kinds" = "text,image:image/png,image:image/jpeg" -a "$(res 2 | jq -r '.content[1].data')" = "$(sed -n 's/^PNG = "\(.*\)"$/\1/p' "$ROOT/tests/integration/mcp_code_api.py")" ]
check "the text: stdout, results' text, formats and image numbers, the execution count; not an error ($(res 2 | jq -c '.structuredContent.results'))" \
	[ "$(res 2 | jq -c '[.isError, .structuredContent.stdout, [.structuredContent.results[] | [.text, .is_main_result, .image]], .structuredContent.results[0].formats, .structuredContent.results[2].data, .structuredContent.execution_count]')" = \
	'[false,"hello\n",[["<Figure>",false,1],["photo",false,2],["df",false,null],["2",true,null]],["png","chart"],{"a":[1,2]},3]' ]
check "an exception: an error result with its name, value and traceback, no image ($(res 3 | jq -c '.structuredContent.error'))" \
	[ "$(res 3 | jq -c '[.isError, .structuredContent.error.name, .structuredContent.error.value, (.content | length)]')" = '[true,"ValueError","boom",1]' ]
check "a session without an interpreter: an error result that says no_interpreter ($(res 4 | jq -r '.content[0].text' | head -c 200))" \
	[ "$(res 4 | jq -r .isError)" = true -a -n "$(res 4 | jq -r '.content[0].text' | grep no_interpreter)" ]
check "without sandbox_id, language is still required ($(res 5 | jq -r '.content[0].text'))" \
	[ "$(res 5 | jq -r '.content[0].text')" = 'run_code: bad argument: "language" is required' ]
check "a sandbox_id that is not an id is refused before any request ($(res 6 | jq -r '.content[0].text'); $(wc -l < "$T_TMP/requests.jsonl") requests)" \
	[ "$(res 6 | jq -r .isError)" = true -a "$(wc -l < "$T_TMP/requests.jsonl")" = 3 ]
t_done
