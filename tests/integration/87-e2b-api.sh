#!/usr/bin/env bash
# kiln-api's E2B-compatible API (docs/e2b.md) with curl against a real
# kiln-api, a local S3 and a real kiln-host (real VMs): the control API under
# /e2b (X-API-KEY; create with E2B's fields, get, list v2 with its filters and
# the old list, another customer's 404s and empty list, a wrong key's 401,
# the running quota's 429 with Retry-After, setTimeout, pause, connect that
# resumes, kill, autoPause at the timeout) and the envd relay at the root
# paths (no token, a wrong one, another sandbox's, an unknown sandbox: the
# same 401; a paused sandbox: 502), one relayed Start stream, 20 Start
# streams at once with odd-case Content-Types against max_streams 3 (at
# most 3 served, the rest 429), the 415 for a Content-Type that is not
# Connect's JSON for the method's kind, and a 5 MiB
# file round trip. Nothing left behind.
. "$(dirname "$0")/lib.sh"
t_plan 68
require_image
t_require_tools swift-proxy-server memcached jq curl
t_require_built kiln-api kiln-host
PY=/usr/bin/python3

S3_DIR=$T_TMP/s3
TOKEN=e2b-token-$RANDOM$RANDOM$RANDOM
ADMIN=e2b-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 10000))
URL=http://127.0.0.1:$API_PORT
BUCKET=kiln-e2b
api_pid=
h_pid=
s3_local_start
t_mark

api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" \
	'. + {host_lost_after_s: 3, max_body_mib: 16, quotas: {submit_rate: 1000, submit_burst: 1000}}'
api_up "$T_TMP/api.json" "$URL"

host_config "$T_TMP/h1.json" "127.0.0.1:$((API_PORT + 1))" h1 ".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h1\""
host_start "$T_TMP/h1.json" h1
h_pid=$host_pid

live_hosts() { admin "$URL/v1/admin/hosts" | jq '[.hosts[] | select(.state == "live")] | length'; }
for _ in $(seq 3000); do [ "$(live_hosts)" = 1 ] && break; sleep 0.2; done
if [ "$(live_hosts)" = 1 ]; then ok "kiln-host registers with kiln-api"
else t_bail "the host registers" "$(tail -3 "$T_TMP/h1.err")"; fi

# e2b KEY METHOD PATH [curl args]: the control API; body in $T_TMP/last, headers in last.h, status echoed
e2b() {
	local key=$1 m=$2 p=$3; shift 3
	curl -s -m 900 -o "$T_TMP/last" -D "$T_TMP/last.h" -w '%{http_code}' -X "$m" -H "X-API-KEY: $key" \
		-H 'Content-Type: application/json' "$@" "$URL/e2b$p"
}
# native KEY METHOD PATH: kiln's own API
native() { local key=$1 m=$2 p=$3; shift 3; curl -s -m 60 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $key" "$@" "$URL$p"; }
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
jqt() { jq -e "$@" > /dev/null; } # a jq condition on a file, quietly
header() { tr -d '\r' < "$T_TMP/last.h" | sed -n "s/^$1: //Ip" | head -1; }
expect() { # NAME STATUS GOT [jq condition]
	local name=$1 want=$2 got=$3 cond=${4:-true}
	if [ "$got" = "$want" ] && [ "$(last "$cond")" = true ]; then ok "$name"
	else not_ok "$name" "status $got (want $want), body: $(head -c 600 "$T_TMP/last")"; fi
}
# envd ID TOKEN METHOD PATH [curl args]: the relay at the root; status echoed
envd() {
	local id=$1 tok=$2 m=$3 p=$4; shift 4
	local h=()
	[ -n "$id" ] && h+=(-H "E2b-Sandbox-Id: $id")
	[ -n "$tok" ] && h+=(-H "X-Access-Token: $tok")
	curl -s -m 120 -o "$T_TMP/last" -D "$T_TMP/last.h" -w '%{http_code}' -X "$m" "${h[@]}" "$@" "$URL$p"
}
rpc() { envd "$1" "$2" POST "/process.Process/$3" -H 'Content-Type: application/json' --data-binary "${4:-{\}}"; }

admin -X POST "$URL/v1/admin/customers" --data-binary '{"id":"acme","quotas":{"max_running":1}}' > /dev/null
admin -X POST "$URL/v1/admin/customers" --data-binary '{"id":"beta"}' > /dev/null
KA=$(admin -X POST "$URL/v1/admin/customers/acme/keys" | jq -r .key)
KB=$(admin -X POST "$URL/v1/admin/customers/beta/keys" | jq -r .key)

# ---- keys ----
st=$(e2b "kiln_nope_nope" GET /v2/sandboxes)
expect "a wrong key: 401 in E2B's shape" 401 "$st" '.code == 401 and (.message | length > 0)'
st=$(curl -s -m 10 -o "$T_TMP/last" -w '%{http_code}' "$URL/e2b/v2/sandboxes")
expect "no key: 401" 401 "$st" '.code == 401'

ENVVARS='"envVars":{"FOO":"bar-87"},'

# ---- create, get ----
st=$(e2b "$KA" POST /v2/sandboxes --data-binary \
	'{"templateID":"base","timeout":120,"metadata":{"app":"it87"},'"$ENVVARS"'"secure":true,"allow_internet_access":false}')
expect "create: 201 with sandboxID, envdAccessToken, envdVersion" 201 "$st" \
	'(.sandboxID | test("^s[0-9a-f]{32}$")) and (.envdAccessToken | test("^[0-9a-f]{64}$"))
	 and .templateID == "base" and .envdVersion == "0.6.2" and .domain == null'
A=$(last .sandboxID); TA=$(last .envdAccessToken)
st=$(e2b "$KA" GET "/sandboxes/$A")
expect "get: running, metadata, cpu/memory, the same token" 200 "$st" \
	".sandboxID == \"$A\" and .state == \"running\" and .metadata.app == \"it87\" and .cpuCount == 1
	 and .memoryMB > 0 and .envdAccessToken == \"$TA\" and (.startedAt | test(\"Z$\")) and .endAt > .startedAt"
st=$(native "$KA" GET "/v1/sessions/$A")
expect "it is a kiln session: lifetime and idle limit are the timeout (120 s)" 200 "$st" \
	'.state == "running" and .max_lifetime_s == 120 and .idle_timeout_s == 120'

# ---- list ----
st=$(e2b "$KA" GET /v2/sandboxes)
expect "list v2: the caller's sandbox, without its token" 200 "$st" \
	"length == 1 and .[0].sandboxID == \"$A\" and .[0].state == \"running\" and (.[0] | has(\"envdAccessToken\") | not)"
st=$(e2b "$KA" GET "/v2/sandboxes?metadata=app%3Dit87&state=running,paused")
expect "list v2: metadata and state filters match it" 200 "$st" "length == 1"
st=$(e2b "$KA" GET "/v2/sandboxes?metadata=app%3Dother")
expect "list v2: another metadata value: none" 200 "$st" "length == 0"
st=$(e2b "$KA" GET "/v2/sandboxes?state=paused")
expect "list v2: state=paused: none" 200 "$st" "length == 0"
st=$(e2b "$KA" GET /sandboxes)
expect "the old list: the running one" 200 "$st" "length == 1 and .[0].sandboxID == \"$A\""
st=$(e2b "$KB" GET /v2/sandboxes)
expect "another customer's list: empty" 200 "$st" "length == 0"
st=$(e2b "$KB" GET "/sandboxes/$A")
expect "another customer's GET: 404 in E2B's shape" 404 "$st" '.code == 404'
st=$(e2b "$KB" DELETE "/sandboxes/$A")
expect "another customer's kill: 404" 404 "$st"
st=$(e2b "$KB" POST "/sandboxes/$A/pause")
expect "another customer's pause: 404" 404 "$st"

# ---- quota ----
st=$(e2b "$KA" POST /v2/sandboxes --data-binary '{"templateID":"base"}')
ra=$(header Retry-After)
expect "past max_running: 429 with Retry-After ($ra)" 429 "$st" '.code == 429'
check "... Retry-After is a number of seconds" [ "${ra:-0}" -ge 1 ]

# ---- timeout ----
st=$(e2b "$KA" POST "/sandboxes/$A/timeout" --data-binary '{"timeout":600}')
check "setTimeout: 204" [ "$st" = 204 ]
native "$KA" GET "/v1/sessions/$A" > /dev/null
life=$(last .max_lifetime_s)
check "... the session now ends 600 s from now (lifetime $life s)" [ "$life" -ge 600 -a "$life" -lt 700 ]
st=$(e2b "$KA" POST "/sandboxes/$A/timeout" --data-binary '{"timeout":"x"}')
expect "setTimeout with a bad value: 400" 400 "$st" '.code == 400'

# ---- the relay's authentication ----
st=$(rpc "$A" "" List); expect "relay without a token: 401 unauthenticated" 401 "$st" '.code == "unauthenticated"'
st=$(rpc "$A" "0000$TA" List); expect "relay with a wrong token: 401" 401 "$st" '.code == "unauthenticated"'
st=$(rpc "s_00000000000000000000000000000000" "$TA" List); expect "relay to an unknown sandbox: 401" 401 "$st" '.code == "unauthenticated"'
st=$(envd "$A" "bad" GET "/files?path=/etc/hostname"); expect "/files with a wrong token: 401 (E2B's shape)" 401 "$st" '.code == 401'
# Another sandbox's token: beta's own sandbox.
st=$(e2b "$KB" POST /sandboxes --data-binary '{}')
expect "the old create path: 201 for another customer" 201 "$st"
B=$(last .sandboxID); TB=$(last .envdAccessToken)
st=$(rpc "$A" "$TB" List); expect "relay with another sandbox's token: 401" 401 "$st" '.code == "unauthenticated"'
check "the two sandboxes have different tokens" [ -n "$TB" -a "$TB" != "$TA" ]

# ---- through the relay to envd ----
st=$(envd "$A" "$TA" GET /health)
check "relay: /health answers 204" [ "$st" = 204 ]
# A Start stream: Connect envelopes in (one message) and out.
$PY -c 'import json,struct,sys; m=json.dumps({"process":{"cmd":"/bin/sh","args":["-c","echo hello-$FOO; echo err >&2; exit 3"]}}).encode(); sys.stdout.buffer.write(b"\0"+struct.pack(">I",len(m))+m)' > "$T_TMP/start.bin"
curl -s -m 120 -o "$T_TMP/start.out" -D "$T_TMP/start.h" -X POST -H "E2b-Sandbox-Id: $A" -H "X-Access-Token: $TA" \
	-H 'Content-Type: application/connect+json' -H 'Connect-Protocol-Version: 1' -H 'Keepalive-Ping-Interval: 50' \
	--data-binary @"$T_TMP/start.bin" "$URL/process.Process/Start"
$PY - "$T_TMP/start.out" > "$T_TMP/start.txt" << 'EOF'
import base64, json, struct, sys
b = open(sys.argv[1], "rb").read()
out, err, code, end = b"", b"", None, None
while len(b) >= 5:
    flags, n = b[0], struct.unpack(">I", b[1:5])[0]
    m = json.loads(b[5:5 + n]); b = b[5 + n:]
    if flags & 2:
        end = m; continue
    ev = m.get("event", {})
    d = ev.get("data", {})
    out += base64.b64decode(d.get("stdout", "")); err += base64.b64decode(d.get("stderr", ""))
    if "end" in ev: code = ev["end"].get("exitCode", 0)
print(json.dumps({"out": out.decode(), "err": err.decode(), "code": code, "end": end}))
EOF
check "relay: a Start stream brings the output, the env from envVars and the exit code ($(head -c 300 "$T_TMP/start.txt"))" \
	jqt '.out == "hello-bar-87\n" and .err == "err\n" and .code == 3 and .end == {}' "$T_TMP/start.txt"
check "... as application/connect+json" grep -qi '^content-type: application/connect+json' "$T_TMP/start.h"
# max_streams counts every Start, however its Content-Type is spelled
# (a case-sensitive prefix once let odd-case ones through uncounted): 20
# at once with odd-case types against max_streams 3, each running 8 s.
admin -X PUT --data '{"max_streams":3}' "$URL/v1/admin/customers/acme/quotas" > /dev/null
$PY -c 'import json,struct,sys; m=json.dumps({"process":{"cmd":"/bin/sh","args":["-c","sleep 8; echo held"]}}).encode(); sys.stdout.buffer.write(b"\0"+struct.pack(">I",len(m))+m)' > "$T_TMP/hold.bin"
cts=("Application/connect+json" "APPLICATION/CONNECT+JSON" "application/Connect+Json" "application/CONNECT+json"
     "Application/Connect+JSON; charset=utf-8" "aPPLICATION/cONNECT+jSON" "application/connect+JSON"
     "APPLICATION/connect+json" "Application/connect+Json ; charset=UTF-8" "application/cOnNeCt+JsOn")
odd=()
for i in $(seq 0 19); do
	curl -s -m 60 -o "$T_TMP/odd$i.out" -w '%{http_code}' -X POST -H "E2b-Sandbox-Id: $A" -H "X-Access-Token: $TA" \
		-H "Content-Type: ${cts[i % 10]}" -H 'Connect-Protocol-Version: 1' \
		--data-binary @"$T_TMP/hold.bin" "$URL/process.Process/Start" > "$T_TMP/odd$i.st" &
	odd+=($!)
done
wait "${odd[@]}" # these curls only (kiln-api and kiln-host are children too)
served=0 refused=0 other=""
for i in $(seq 0 19); do
	st=$(cat "$T_TMP/odd$i.st")
	if [ "$st" = 200 ]; then served=$((served + 1))
	elif [ "$st" = 429 ] && [ "$(jq -r .code "$T_TMP/odd$i.out" 2> /dev/null)" = resource_exhausted ]; then refused=$((refused + 1))
	else other="$other $st"; fi
done
check "20 odd-case Start streams at once, max_streams 3: $served served (1-3), $refused refused 429 resource_exhausted${other:+, others:$other}" \
	[ "$served" -ge 1 -a "$served" -le 3 -a $((served + refused)) = 20 ]
whole=0
for i in $(seq 0 19); do
	[ "$(cat "$T_TMP/odd$i.st")" = 200 ] && grep -q 'aGVsZAo=' "$T_TMP/odd$i.out" && whole=$((whole + 1))
done
check "... each served one ran to its end (its output 'held': $whole of $served)" [ "$whole" = "$served" ]
admin -X PUT --data '{"max_streams":16}' "$URL/v1/admin/customers/acme/quotas" > /dev/null
# A Content-Type that is not Connect's JSON for the method's kind: 415,
# before the host (nothing runs).
st=$(envd "$A" "$TA" POST /process.Process/Start -H 'Content-Type: application/json' --data-binary @"$T_TMP/hold.bin")
expect "Start as application/json (the unary type): 415 unimplemented, saying which type it takes" 415 "$st" \
	'.code == "unimplemented" and (.message | test("application/connect\\+json"))'
st=$(envd "$A" "$TA" POST /process.Process/List -H 'Content-Type: application/connect+json' --data-binary '{}')
expect "List as application/connect+json (the streaming type): 415" 415 "$st" '.code == "unimplemented"'
st=$(envd "$A" "$TA" POST /process.Process/List -H 'Content-Type: text/plain' --data-binary '{}')
expect "List as text/plain: 415" 415 "$st" '.code == "unimplemented" and (.message | test("application/json"))'
st=$(rpc "$A" "$TA" List)
expect "... and List as application/json still answers" 200 "$st" '.processes | type == "array"'
head -c $((5 << 20)) /dev/urandom > "$T_TMP/big.bin"
st=$(envd "$A" "$TA" POST "/files?path=/tmp/big.bin" -F "file=@$T_TMP/big.bin")
expect "relay: a 5 MiB multipart upload" 200 "$st" '.[0].path == "/tmp/big.bin"'
st=$(envd "$A" "$TA" GET "/files?path=/tmp/big.bin")
check "relay: the download is the same bytes" cmp -s "$T_TMP/big.bin" "$T_TMP/last"
st=$(e2b "$KA" GET "/sandboxes/$A/metrics")
expect "metrics: one sample from the host" 200 "$st" '.[0].cpuCount == 1 and .[0].memTotal > 0'
st=$(rpc "$A" "$TA" List)
expect "relay: with the right token List reaches the host's envd: 200 {processes: [...]}" 200 "$st" '.processes | type == "array"'
native "$KA" GET "/v1/sessions/$A" > /dev/null
check "relayed calls are activity: last_active_at moved past the start" [ "$(last .last_active_at)" -gt "$(last .started_at)" ]

# ---- pause, connect ----
st=$(e2b "$KA" POST "/sandboxes/$A/pause")
check "pause: 204" [ "$st" = 204 ]
st=$(e2b "$KA" GET "/sandboxes/$A"); expect "... then GET says paused" 200 "$st" '.state == "paused"'
st=$(e2b "$KA" POST "/sandboxes/$A/pause"); expect "pause again: 409" 409 "$st" '.code == 409'
st=$(rpc "$A" "$TA" List); expect "relay to a paused sandbox: 502 unavailable" 502 "$st" '.code == "unavailable"'
st=$(envd "$A" "$TA" GET /health); check "relay /health to a paused sandbox: 502" [ "$st" = 502 ]
st=$(e2b "$KA" GET "/v2/sandboxes?state=paused"); expect "list v2 state=paused: it" 200 "$st" "length == 1 and .[0].state == \"paused\""
st=$(e2b "$KA" POST "/v2/sandboxes/$A/connect" --data-binary '{"timeout":300}')
expect "connect resumes it: 201 with its token" 201 "$st" ".sandboxID == \"$A\" and .envdAccessToken == \"$TA\""
st=$(e2b "$KA" GET "/sandboxes/$A"); expect "... running again" 200 "$st" '.state == "running"'
native "$KA" GET "/v1/sessions/$A" > /dev/null
check "... its timeout counts from the resume ($(last .max_lifetime_s) s)" [ "$(last .max_lifetime_s)" = 300 ]
st=$(e2b "$KA" POST "/v2/sandboxes/$A/connect" --data-binary '{}')
expect "connect to a running one: 200" 200 "$st" ".sandboxID == \"$A\""
st=$(envd "$A" "$TA" GET "/files?path=/tmp/big.bin")
check "after the resume, the file is still there" cmp -s "$T_TMP/big.bin" "$T_TMP/last"

# ---- kill ----
st=$(e2b "$KA" DELETE "/sandboxes/$A"); check "kill: 204" [ "$st" = 204 ]
st=$(e2b "$KA" GET "/sandboxes/$A"); expect "... then GET: 404" 404 "$st" '.code == 404'
st=$(e2b "$KA" DELETE "/sandboxes/$A"); check "kill again: 404" [ "$st" = 404 ]
st=$(rpc "$A" "$TA" List); expect "relay to a killed sandbox: 401" 401 "$st" '.code == "unauthenticated"'
st=$(e2b "$KB" DELETE "/sandboxes/$B"); check "kill beta's: 204" [ "$st" = 204 ]

# ---- the timeout ends it: autoPause pauses, else it is killed ----
st=$(e2b "$KA" POST /v2/sandboxes --data-binary '{"timeout":3,"autoPause":true}')
expect "create with autoPause and a 3 s timeout" 201 "$st"
C=$(last .sandboxID)
for _ in $(seq 300); do [ "$(native "$KA" GET "/v1/sessions/$C" > /dev/null; last .state)" = paused ] && break; sleep 0.2; done
st=$(e2b "$KA" GET "/sandboxes/$C"); expect "... at the timeout it is paused, not killed" 200 "$st" '.state == "paused"'
st=$(e2b "$KA" DELETE "/sandboxes/$C"); check "kill the paused one: 204" [ "$st" = 204 ]
st=$(e2b "$KA" POST /v2/sandboxes --data-binary '{"timeout":3}')
expect "create without autoPause, 3 s timeout" 201 "$st"
D=$(last .sandboxID)
for _ in $(seq 150); do [ "$(e2b "$KA" GET "/sandboxes/$D")" = 404 ] && break; sleep 0.2; done
st=$(e2b "$KA" GET "/sandboxes/$D"); expect "... at the timeout it is killed (404)" 404 "$st"
native "$KA" GET "/v1/sessions/$D" > /dev/null
check "... the session is destroyed, end_reason max_lifetime ($(last .end_reason))" [ "$(last .state)" = destroyed -a "$(last .end_reason)" = max_lifetime ]

# ---- the E2B SDK itself (JavaScript, e2b 2.51.0), with the three variables ----
# scripts/e2b-sdk.sh installs the pinned SDK into its cache when missing and
# prints its node_modules.
SDK=$("$ROOT/scripts/e2b-sdk.sh" 2> "$T_TMP/sdk.err" || true)
if command -v node > /dev/null && [ -n "$SDK" ] && [ -d "$SDK/e2b" ]; then
	cat > "$T_TMP/sdk.mjs" << 'EOF'
import { Sandbox } from 'e2b'
const out = {}
const sbx = await Sandbox.create({ timeoutMs: 120000, metadata: { via: 'sdk' } })
out.id = sbx.sandboxId
const info = await Sandbox.getInfo(sbx.sandboxId)
out.state = info.state; out.meta = info.metadata.via; out.cpus = info.cpuCount
const page = await Sandbox.list({ query: { metadata: { via: 'sdk' } } }).nextItems()
out.listed = page.map((s) => s.sandboxId)
await sbx.setTimeout(300000)
const r = await sbx.commands.run('echo sdk-$((6*7))')
out.stdout = r.stdout; out.exit = r.exitCode
await sbx.files.write('/tmp/sdk.txt', 'written by the SDK')
out.read = await sbx.files.read('/tmp/sdk.txt')
out.paused = await sbx.pause()
out.pausedState = (await Sandbox.getInfo(sbx.sandboxId)).state
const again = await Sandbox.connect(sbx.sandboxId)
out.resumedState = (await Sandbox.getInfo(sbx.sandboxId)).state
out.killed = await again.kill()
out.killedAgain = await Sandbox.kill(sbx.sandboxId)
try { await Sandbox.getInfo(sbx.sandboxId); out.gone = false } catch (e) { out.gone = e.constructor.name }
try { await Sandbox.list({ apiKey: 'kiln_wrong_key' }).nextItems(); out.badKey = false } catch (e) { out.badKey = e.constructor.name }
console.log(JSON.stringify(out))
EOF
	ln -sfn "$SDK" "$T_TMP/node_modules"
	E2B_API_URL=$URL/e2b E2B_SANDBOX_URL=$URL E2B_API_KEY=$KA \
		timeout 600 node "$T_TMP/sdk.mjs" > "$T_TMP/sdk.out" 2> "$T_TMP/sdk.err"
	echo "# sdk: $(head -c 600 "$T_TMP/sdk.out") $(tail -3 "$T_TMP/sdk.err" | tr '\n' ' ')"
	check "SDK: create, getInfo (running, metadata), list with a metadata filter" \
		jqt '.state == "running" and .meta == "sdk" and .cpus == 1 and .listed == [.id]' "$T_TMP/sdk.out"
	check "SDK: pause (paused), connect (running), kill (true, then false), getInfo after: NotFound" \
		jqt '.paused == true and .pausedState == "paused" and .resumedState == "running" and .killed == true
		       and .killedAgain == false and (.gone | test("NotFound"))' "$T_TMP/sdk.out"
	check "SDK: a wrong key raises AuthenticationError" jqt '.badKey == "AuthenticationError"' "$T_TMP/sdk.out"
	check "SDK: commands.run and files.write/read through the relay" \
		jqt '.stdout == "sdk-42\n" and .exit == 0 and .read == "written by the SDK"' "$T_TMP/sdk.out"
else
	skip "the E2B SDK against kiln" "node or the SDK missing: $(tail -n 1 "$T_TMP/sdk.err")"
fi

t_stop "$h_pid"; h_pid=
t_nothing_left "nothing left: no QEMU, VM directories, cgroups, mounts or slot locks"
t_done
