#!/usr/bin/env bash
# A client that stops reading a session's exec stream (issue 13, item 7):
# `exec?stream=1` of `yes`, the request sent and the stream never read
# (the client's receive buffer made small), on kiln-host directly and
# through kiln-api. The command must still end at its timeout_s, the
# session must then take other requests (not 409 busy) and DELETE must
# destroy its VM; the stream, once read, holds a `truncated` event and the
# result (timed_out). Nothing is left behind.
# Then item 8: a fake host (lying_host.py) registers with kiln-api and reports
# output and log keys under another customer's prefix: kiln-api signs no URL
# for them (url null, url_error), only for the task's own keys.
. "$(dirname "$0")/lib.sh"
t_plan 23
require_image
t_require_tools jq curl python3
t_require_built kiln-api kiln-host
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
STALL=$ROOT/tests/integration/stall_client.py
PORT=$((20000 + RANDOM % 12000))
HP=$((PORT + 1))
URL=http://127.0.0.1:$PORT
ADMIN=it-admin-$RANDOM$RANDOM$RANDOM$RANDOM
TOKEN=it-cluster-$RANDOM$RANDOM
TIMEOUT_S=8
BOUND_S=60 # beyond the timeout: TCG VMs on a shared machine are slow
api_pid=''
h_pid=''
c_pids=()
before_cg=$(count_cgroups)
before_locks=$(count_own_slot_locks)

# The host knows kiln-api's URL from the start; kiln-api starts after the
# host-only part, so that its reconciliation does not destroy the session
# made on the host directly.
host_config "$T_TMP/h.json" "127.0.0.1:$HP" h1 ".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h\""
host_start "$T_TMP/h.json" h
h_pid=$host_pid
if t_serving "http://127.0.0.1:$HP/healthz" "$h_pid" 600; then ok "kiln-host serves"
else t_bail "kiln-host starts" "$(tail -3 "$T_TMP/h.err")"; fi

# hreq METHOD PATH [curl args]: the host's own API; body in $T_TMP/last, status echoed
hreq() {
	local m=$1 p=$2; shift 2
	curl -s -m 60 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "http://127.0.0.1:$HP$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
# stall NAME PORT PATH KEY: the stalled client in the background; its output in $T_TMP/NAME.sse once $T_TMP/NAME.go exists
stall() {
	t_bg "$PY" "$STALL" "$2" "$3" "$4" "{\"argv\":[\"yes\"],\"timeout_s\":$TIMEOUT_S}" "$T_TMP/$1.go" "$T_TMP/$1.sse"
	c_pids+=("$T_BG_PID")
}
# until_free T0 CMD...: run CMD every second until it prints 200; prints the seconds since T0 (or "never")
until_free() {
	local t0=$1; shift
	while [ $(($(date +%s) - t0)) -le $((TIMEOUT_S + BOUND_S)) ]; do
		if [ "$("$@")" = 200 ]; then echo $(($(date +%s) - t0)); return 0; fi
		sleep 1
	done
	echo never
	return 1
}
# started NAME: until the stalled client saw its command start (60 s); then true if it did
started() {
	for _ in $(seq 300); do [ -e "$T_TMP/$1.sse.started" ] && break; sleep 0.2; done
	grep -q '^event: started' "$T_TMP/$1.sse.started" 2> /dev/null
}
# sse_event FILE NAME: the data of the stream's first event NAME (JSON), or nothing
sse_event() {
	"$PY" - "$1" "$2" << 'EOF'
import sys
raw = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
body = raw.split("\r\n\r\n", 1)[-1]
for block in body.split("\n\n"):
    lines = block.strip("\n").split("\n")
    if lines and lines[0] == "event: " + sys.argv[2]:
        print("".join(l[6:] for l in lines[1:] if l.startswith("data: ")))
        break
EOF
}

# ---- kiln-host directly ----
st=$(hreq POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"s1","customer":"acme","spec":{}}')
check "a session on the host ($st)" test "$st" = 201
t0=$(date +%s)
stall host "$HP" /v1/sessions/s1/exec?stream=1 "$TOKEN"
check "host: \`yes\` started, its stream left unread" started host
st=$(hreq POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary '{"argv":["true"]}')
check "host: meanwhile the session is busy with it ($st)" test "$st" = 409
free_s=$(until_free "$t0" hreq POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary '{"argv":["true"]}')
check "host: with the stream unread, the session takes another exec $free_s s after \`yes\` started (timeout_s $TIMEOUT_S, bound $((TIMEOUT_S + BOUND_S)) s)" \
	test "$free_s" != never
st=$(hreq DELETE /v1/sessions/s1)
check "host: DELETE of the session succeeds ($st $(last .error.code))" test "$st" = 200
touch "$T_TMP/host.go"
wait "${c_pids[0]}"
res=$(sse_event "$T_TMP/host.sse" result)
check "host: the stream, read at last, ends with the result: timed_out after ~${TIMEOUT_S}s (run_ms $(echo "$res" | jq -r .timings.run_ms 2> /dev/null))" \
	test "$(echo "$res" | jq -r '.end_reason == "timeout" and .timings.run_ms < '"$(((TIMEOUT_S + 30) * 1000))" 2> /dev/null)" = true
tr=$(sse_event "$T_TMP/host.sse" truncated)
check "host: a truncated event says output events were dropped ($(echo "$tr" | jq -r .dropped_bytes 2> /dev/null) bytes)" \
	test "$(echo "$tr" | jq -r '.dropped_bytes > 0' 2> /dev/null)" = true
check "host: no QEMU left for the session" test "$(count_qemu)" = 0

# ---- through kiln-api ----
api_config "$T_TMP/api.json" "127.0.0.1:$PORT" '. + {host_lost_after_s: 3, quotas: {submit_rate: 1000, submit_burst: 1000},
	  s3: {endpoint: "http://127.0.0.1:9", bucket: "kiln", access_key: "AK", secret_key: "SK"}}'
api_up "$T_TMP/api.json" "$URL"
for _ in $(seq 300); do
	[ "$(admin "$URL/v1/admin/hosts" | jq '[.hosts[]? | select(.state == "live")] | length' 2> /dev/null)" = 1 ] && break
	sleep 0.2
done
admin -X POST "$URL/v1/admin/customers" --data-binary '{"id":"acme"}' > /dev/null
KA=$(admin -X POST "$URL/v1/admin/customers/acme/keys" | jq -r .key)
areq() { # METHOD PATH [curl args]: kiln-api; body in $T_TMP/last, status echoed
	local m=$1 p=$2; shift 2
	curl -s -m 60 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $KA" "$@" "$URL$p"
}
# 503 (no host live yet, or capacity not yet reported back) says retry.
for _ in $(seq 15); do
	st=$(areq POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{}')
	[ "$st" = 503 ] || break
	echo "# create: 503 $(last .error.code): $(last .error.message); retrying"
	sleep 2
done
SID=$(last .id)
check "a session through kiln-api ($st $SID $(last .error.message))" test "$st" = 201
t0=$(date +%s)
stall api "$PORT" "/v1/sessions/$SID/exec?stream=1" "$KA"
check "api: \`yes\` started, its stream left unread" started api
st=$(areq POST "/v1/sessions/$SID/exec" -H 'Content-Type: application/json' --data-binary '{"argv":["true"]}')
check "api: meanwhile the session is busy with it ($st)" test "$st" = 409
free_s=$(until_free "$t0" areq POST "/v1/sessions/$SID/exec" -H 'Content-Type: application/json' --data-binary '{"argv":["true"]}')
check "api: with the stream unread, the session takes another exec $free_s s after \`yes\` started (bound $((TIMEOUT_S + BOUND_S)) s)" \
	test "$free_s" != never
st=$(areq DELETE "/v1/sessions/$SID")
check "api: DELETE succeeds ($st $(last .state))" test "$st" = 200 -a "$(last .state)" = destroyed
st=$(hreq GET "/v1/sessions/$SID")
check "api: the session's VM is gone from its host ($st)" test "$st" = 404
touch "$T_TMP/api.go"
wait "${c_pids[1]}"
res=$(sse_event "$T_TMP/api.sse" result)
check "api: the stream, read at last, ends with the result: timed_out" \
	test "$(echo "$res" | jq -r '.end_reason' 2> /dev/null)" = timeout
c_pids=()
kill "$h_pid"
wait "$h_pid" 2> /dev/null
h_pid=''

# ---- item 8: a lying host gets no URL signed for another customer's keys ----
# (kiln-api's S3 settings are only used for signing here: no S3 server.)
t_bg "$PY" "$ROOT/tests/integration/lying_host.py" "$URL" "$TOKEN" $((PORT + 2)) h-fake victim 2>> "$T_TMP/fake.err"
c_pids+=("$T_BG_PID")
for _ in $(seq 100); do
	[ "$(admin "$URL/v1/admin/hosts" | jq -r '[.hosts[]? | select(.state == "live") | .id] | join(",")' 2> /dev/null)" = h-fake ] && break
	sleep 0.2
done
st=$(areq POST /v1/tasks -H 'Content-Type: application/json' --data-binary '{"argv":["true"]}')
TID=$(last .id)
for _ in $(seq 30); do
	areq GET "/v1/tasks/$TID?wait=2" > /dev/null
	[ "$(last .state)" = succeeded ] && break
	sleep 0.2
done
if [ "$(last .state)" = succeeded ] && [ "$(last .host)" = h-fake ]; then ok "a task on the fake host ends succeeded ($TID)"
else not_ok "a task on the fake host ends succeeded" "$st $TID $(last .state) on $(last .host)" "fake host: $(tail -3 "$T_TMP/fake.err")" \
	"hosts: $(admin "$URL/v1/admin/hosts" | jq -c '[.hosts[]? | [.id, .state]]')"; fi
cp "$T_TMP/last" "$T_TMP/task.json"
out() { jq -r --arg p "$1" ".outputs[] | select(.path == \$p) | $2" "$T_TMP/task.json"; }
check "the honest output gets a presigned URL under acme/$TID/" \
	eval '[[ "$(out ok.txt .url)" == *"/kiln/acme/$TID/outputs/ok.txt?"*X-Amz-Signature=* ]]'
check "an output key naming another customer's session RAM gets no URL, with a reason ($(out ram .url_error))" \
	test "$(out ram .url)" = null -a "$(out ram '.url_error | test("not available")')" = true
check "a percent-encoded way out of the prefix gets no URL ($(out up .url | head -c 80))" \
	test "$(out up .url)" = null -a "$(out up '.url_error != null')" = true
check "a log key naming another customer's session disk gets no URL; the honest log does" \
	test "$(jq -r '.artifacts["stderr.log"].url' "$T_TMP/task.json")" = null \
	-a "$(jq -r '.artifacts["stdout.log"].url | test("/kiln/acme/")' "$T_TMP/task.json")" = true
check "not a 500: the task is answered, and the refusal is logged" grep -q "outside acme/$TID/: not signed" "$T_TMP/api.err"

kill "$api_pid" "${c_pids[@]}"
wait "$api_pid" "${c_pids[@]}" 2> /dev/null
api_pid=''
c_pids=()
check "nothing left: QEMU $(count_qemu), cgroups $(count_cgroups) (before $before_cg), slot locks $(count_own_slot_locks) (before $before_locks)" \
	test "$(count_qemu)" = 0 -a "$(count_cgroups)" = "$before_cg" -a "$(count_own_slot_locks)" -le "$before_locks"
t_done
