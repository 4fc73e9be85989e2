#!/usr/bin/env bash
# kiln's native code API (docs/api.md "Code") against `kiln up`: a session
# of the template code-interpreter runs cells through POST
# /v1/sessions/{id}/code, whole (JSON) and streamed (server-sent events):
# `1+1` gives text 2, state across cells, stdout/stderr, an error with its
# traceback, a DataFrame's data, a matplotlib plot whose PNG decodes
# (tests/integration/png_check.py) with its chart; contexts (isolated,
# listed, restarted, deleted); timeout_ms interrupts a cell and the next one
# runs; a session of the default template answers 409 no_interpreter; then
# the Python SDK's run_code and kiln mcp's run_code (an image content) with a
# plot; nothing of the stack is left.
. "$(dirname "$0")/lib.sh"
require_image
CI=$ROOT/build/image/rootfs-code-interpreter.ext4
[ -r "$CI" ] || { echo "1..0 # SKIP the code-interpreter image is missing ($CI): run make image"; exit 0; }
t_require_tools swift-proxy-server memcached jq
t_require_built kiln kiln-api kiln-host
KILN=$ROOT/build/kiln
before_procs=$(up_procs)
kiln_up
API=$(sed -n 's/^KILN_API=//p' "$UP/credentials")
KEY=$(sed -n 's/^KILN_KEY=//p' "$UP/credentials")
SANDBOX_DOMAIN=$(sed -n 's/^KILN_SANDBOX_DOMAIN=//p' "$UP/credentials")
BUNDLE=$(sed -n 's/^SSL_CERT_FILE=//p' "$UP/credentials")

# code ID BODY NAME: POST /code whole; status in NAME.st, body in NAME.json.
code() {
	curl -s -m 120 -o "$T_TMP/$3.json" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
		-H 'Content-Type: application/json' --data-binary "$2" "$API/v1/sessions/$1/code" > "$T_TMP/$3.st"
}
cell() { jq -cn --arg c "$1" '{code:$c}'; }
st() { cat "$T_TMP/$1.st"; }
rj() { jq -c "$2" "$T_TMP/$1.json" 2> /dev/null; }

# ---- a session without the interpreter ----
plain=$(cust -X POST -d '{}' "$API/v1/sessions" | jq -r .id)
code "$plain" "$(cell '1+1')" plain
check "a default-template session: 409 no_interpreter ($(st plain) $(r plain .error.message))" \
	[ "$(st plain)" = 409 -a "$(r plain .error.code)" = no_interpreter ]
cust -X DELETE "$API/v1/sessions/$plain" > /dev/null

# ---- a code-interpreter session ----
cust -X POST -d '{"template":"code-interpreter"}' "$API/v1/sessions" > "$T_TMP/s.json"
SID=$(r s .id)
check "a session of the template code-interpreter ($(r s .state))" [ "$(r s .state)" = running ]

code "$SID" "$(cell '1+1')" one
check "1+1: text 2, the main result, execution_count ($(st one) $(head -c 300 "$T_TMP/one.json"))" \
	[ "$(st one)" = 200 -a "$(r one '.results[0].text')" = 2 -a "$(r one '.results[0].is_main_result')" = true \
	-a "$(r one '.execution_count | type')" = number -a "$(r one .error)" = null ]

code "$SID" "$(cell 'x = 1')" s1
code "$SID" "$(cell 'x += 1; x')" s2
check "state across cells: x = 1 then x += 1; x gives 2 ($(r s2 '.results[0].text'))" \
	[ "$(r s2 '.results[0].text')" = 2 ]

code "$SID" "$(cell $'import sys\nprint("out1")\nprint("err1", file=sys.stderr)\nprint("out2")')" logs
check "stdout and stderr in logs ($(rj logs .logs))" \
	[ "$(r logs '.logs.stdout | join("")')" = $'out1\nout2' -a "$(r logs '.logs.stderr | join("")')" = $'err1' ]

code "$SID" "$(cell $'def f():\n    raise ValueError("boom")\nf()')" err
check "an exception: error name, value and traceback, 200 ($(rj err .error | head -c 200))" \
	[ "$(st err)" = 200 -a "$(r err .error.name)" = ValueError -a "$(r err .error.value)" = boom \
	-a -n "$(r err '.error.traceback | select(contains("f()"))')" ]
code "$SID" "$(cell 'x')" after
check "the context survives the exception ($(r after '.results[0].text'))" [ "$(r after '.results[0].text')" = 2 ]

code "$SID" "$(cell $'import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})')" df
check "a DataFrame: data by column and an HTML table ($(rj df '.results[0].data'))" \
	[ "$(rj df '.results[0].data')" = '{"a":[1,2],"b":["x","y"]}' -a -n "$(r df '.results[0].html | select(contains("<table"))')" ]

PLOT=$'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")\nplt.show()'
code "$SID" "$(cell "$PLOT")" plot
dims=$(r plot '.results[0].png' | "$ROOT/tests/integration/png_check.py" 2>&1)
check "a plot: a PNG that decodes ($dims) and a line chart ($(r plot '.results[0].chart.type'))" \
	[ "$(st plot)" = 200 -a -n "$dims" -a "${dims#*x}" != "$dims" -a "$(r plot '.results[0].chart.type')" = line \
	-a "$(r plot '.results[0].chart.title')" = squares ]

# ---- streamed ----
curl -s -N -m 120 -H "Authorization: Bearer $KEY" -H 'Accept: text/event-stream' -H 'Content-Type: application/json' \
	--data-binary "$(cell $'import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.2)\n1+1')" \
	"$API/v1/sessions/$SID/code" > "$T_TMP/sse.txt"
events=$(grep '^event: ' "$T_TMP/sse.txt" | cut -d' ' -f2 | tr '\n' ' ')
check "streamed: stdout x3, result, execution_count, end in order ($events)" \
	[ "$events" = "stdout stdout stdout result execution_count end " ]
check "...the result event's text is 2" \
	[ "$(grep -A1 '^event: result' "$T_TMP/sse.txt" | sed -n 's/^data: //p' | jq -r .text)" = 2 ]

# ---- contexts ----
cust -X POST -d '{"cwd":"/tmp"}' "$API/v1/sessions/$SID/code/contexts" > "$T_TMP/ctx.json"
CID=$(r ctx .id)
check "a context is created ($(head -c 200 "$T_TMP/ctx.json"))" [ -n "$CID" -a "$(r ctx .cwd)" = /tmp ]
code "$SID" "$(jq -cn --arg c $'import os\ny = 5\nos.getcwd()' --arg id "$CID" '{code:$c, context_id:$id}')" cx
code "$SID" "$(cell 'y')" cy
check "contexts are isolated: the new one has y and cwd /tmp, the default has no y ($(r cx '.results[0].text'), $(r cy .error.name))" \
	[ "$(r cx '.results[0].text')" = "'/tmp'" -a "$(r cy .error.name)" = NameError ]
cust "$API/v1/sessions/$SID/code/contexts" > "$T_TMP/list.json"
check "contexts are listed ($(r list '.contexts | length'))" \
	[ "$(jq -r --arg id "$CID" '.contexts[] | select(.id == $id) | .id' "$T_TMP/list.json" 2> /dev/null)" = "$CID" ]
cust -X POST "$API/v1/sessions/$SID/code/contexts/$CID/restart" > /dev/null
code "$SID" "$(jq -cn --arg id "$CID" '{code:"y", context_id:$id}')" cr
check "restart clears a context ($(r cr .error.name))" [ "$(r cr .error.name)" = NameError ]
dst=$(curl -s -m 30 -o /dev/null -w '%{http_code}' -X DELETE -H "Authorization: Bearer $KEY" "$API/v1/sessions/$SID/code/contexts/$CID")
code "$SID" "$(jq -cn --arg id "$CID" '{code:"1", context_id:$id}')" cd
check "delete: 204, then the context is 404 not_found ($dst, $(st cd) $(r cd .error.code))" \
	[ "$dst" = 204 -a "$(st cd)" = 404 -a "$(r cd .error.code)" = not_found ]

# ---- timeout, bad bodies ----
code "$SID" '{"code":"import time\nprint(\"started\", flush=True)\ntime.sleep(60)","timeout_ms":1500}' to
code "$SID" "$(cell '1+1')" next
check "timeout_ms: the cell is interrupted, TimeoutError, the next cell runs ($(r to .error.name), $(r next '.results[0].text'))" \
	[ "$(st to)" = 200 -a "$(r to .error.name)" = TimeoutError -a "$(r next '.results[0].text')" = 2 ]
code "$SID" '{"language":"python"}' bad
code "$SID" '{"code":"1","env_vars":{"1X":"a"}}' bad2
check "a body without code, bad env_vars: 400 invalid_request ($(st bad) $(st bad2))" \
	[ "$(st bad)" = 400 -a "$(r bad .error.code)" = invalid_request -a "$(st bad2)" = 400 ]
code "$SID" '{"code":"import os\nos.environ[\"K1\"]","env_vars":{"K1":"v1"}}' env
check "env_vars reach the cell ($(r env '.results[0].text'))" [ "$(r env '.results[0].text')" = "'v1'" ]
code "$SID" '{"code":"echo hi-$((1+2))","language":"bash"}' bash
check "a bash cell ($(rj bash .logs.stdout))" [ "$(rj bash '.logs.stdout')" = '["hi-3\n"]' ]

# ---- a huge display(): past what a whole answer holds, whole in a stream ----
BIG=$'class Big:\n    def _repr_html_(self):\n        return "<p>" + "x" * (20 << 20) + "</p>"\ndisplay(Big(), Big())'
code "$SID" "$(cell "$BIG")" big
curl -s -N -m 120 -H "Authorization: Bearer $KEY" -H 'Accept: text/event-stream' -H 'Content-Type: application/json' \
	--data-binary "$(cell "$BIG")" "$API/v1/sessions/$SID/code" -o "$T_TMP/big.sse"
code "$SID" "$(cell '1+1')" afterbig
check "two 20 MiB display()s: whole 413 too_large, streamed whole ($(stat -c %s "$T_TMP/big.sse") bytes, $(grep -c '^event: result' "$T_TMP/big.sse") results); the next cell runs" \
	[ "$(st big)" = 413 -a "$(r big .error.code)" = too_large -a "$(grep -c '^event: result' "$T_TMP/big.sse")" = 2 \
	-a "$(stat -c %s "$T_TMP/big.sse")" -gt $((40 << 20)) -a "$(r afterbig '.results[0].text')" = 2 ]

# ---- the Python SDK: session.run_code ----
if [ -r "$ROOT/sdk/python/kiln/__init__.py" ] && grep -q 'def run_code' "$ROOT/sdk/python/kiln/"*.py; then
	out=$(env -i PATH=/usr/bin:/bin HOME="$T_TMP" PYTHONPATH="$ROOT/sdk/python" PYTHONDONTWRITEBYTECODE=1 \
		KILN_API="$API" KILN_KEY="$KEY" SID="$SID" PLOT="$PLOT" timeout 120 /usr/bin/python3 -c '
import os, sys, kiln
s = kiln.Client().get_session(os.environ["SID"])
e = s.run_code("1+1")
print(e.text, flush=True)
seen = []
p = s.run_code(os.environ["PLOT"], on_stdout=seen.append)
png = [r.png for r in p.results if r.png]
print("PNG", len(png), flush=True)
open(os.path.join(os.environ["HOME"], "sdk.png"), "wb").write(png[0])
' 2>&1)
	dims=$("$ROOT/tests/integration/png_check.py" --raw < "$T_TMP/sdk.png" 2>&1)
	check "the Python SDK: run_code('1+1').text is 2, a plot's .png bytes decode ($(head -c 200 <<< "$out"), $dims)" \
		[ "$(head -n 1 <<< "$out")" = 2 -a "$(sed -n 2p <<< "$out")" = "PNG 1" -a "${dims#*x}" != "$dims" ]
else
	skip "the Python SDK's run_code" "sdk/python has no run_code"
fi

# ---- kiln mcp: run_code with an image ----
mcp_in=$(jq -cn --arg sid "$SID" --arg c "$PLOT" \
	'{jsonrpc:"2.0",id:1,method:"initialize",params:{protocolVersion:"2025-06-18",capabilities:{},clientInfo:{name:"t",version:"1"}}},
	 {jsonrpc:"2.0",method:"notifications/initialized"},
	 {jsonrpc:"2.0",id:2,method:"tools/call",params:{name:"run_code",arguments:{sandbox_id:$sid,code:"1+1"}}},
	 {jsonrpc:"2.0",id:3,method:"tools/call",params:{name:"run_code",arguments:{sandbox_id:$sid,code:$c}}}')
if grep -q 'sandbox_id.*code interpreter' "$ROOT/cli/mcp_proto.c"; then
	printf '%s\n' "$mcp_in" | env -i PATH=/usr/bin:/bin HOME="$T_TMP" KILN_API="$API" KILN_KEY="$KEY" timeout 120 "$KILN" mcp > "$T_TMP/mcp.out" 2> "$T_TMP/mcp.err"
	t2=$(jq -r 'select(.id == 2) | .result.structuredContent.results[0].text' "$T_TMP/mcp.out" 2> /dev/null)
	img=$(jq -r 'select(.id == 3) | .result.content[] | select(.type == "image" and .mimeType == "image/png") | .data' "$T_TMP/mcp.out" 2> /dev/null | head -n 1)
	dims=$(printf '%s' "$img" | "$ROOT/tests/integration/png_check.py" 2>&1)
	check "kiln mcp run_code: 1+1's text holds 2; a plot is an image content whose PNG decodes ($dims)" \
		[ "$t2" = 2 -a "${dims#*x}" != "$dims" ]
else
	skip "kiln mcp's run_code" "cli has no run_code tool"
fi

cust -X DELETE "$API/v1/sessions/$SID" > /dev/null
code "$SID" "$(cell '1')" gone
check "a deleted session: 404 not_found or 409 not_running ($(st gone) $(r gone .error.code))" \
	[ "$(st gone)" = 404 -o "$(st gone)" = 409 ]

kill -TERM "$up_pid"
wait "$up_pid"
up_pid=
for _ in $(seq 100); do [ "$(up_procs)" = "$before_procs" ] && break; sleep 0.1; done
t_nothing_left "kiln up stopped: no process of the stack left ($(up_procs)), nor QEMU, files, cgroups, mounts" \
	[ "$(up_procs)" = "$before_procs" ]
t_done
