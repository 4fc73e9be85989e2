#!/usr/bin/env bash
# kiln-host's E2B-compatible envd (docs/e2b.md, "kiln-host: /v1/sessions/{id}/envd/..."),
# driven with curl against kiln-host's own endpoints in a real session VM:
# Connect streams checked envelope by envelope, exit codes, the Content-Type
# by the method's kind (any case the same; the other kind's 415), a background
# process with List/SendInput/Connect/SendSignal, uploads (multipart with one
# or two parts, raw, gzip within and past Kiln-Max-Body-Bytes, X-Metadata-*)
# and downloads by sha256 (also gzip), the file-system RPCs and their error codes,
# directory watching (WatchDir streams, polling watchers, a client's
# disconnect freeing the guest's inotify instance, the bound), the
# Connect-Timeout-Ms deadline, metrics, pause+resume with a process still
# listed and the session's env kept, and nothing left behind.
# KILN_TEST_IMAGE_DIR: another image directory to boot (default build/image).
# kiln-host not starting, or envd not answering its health check, is a
# failure that ends the script.
. "$(dirname "$0")/lib.sh"
t_plan 106
require_image
t_require_tools swift-proxy-server memcached
PY=/usr/bin/python3

S3_DIR=$T_TMP/s3
TOKEN=envd-token-$RANDOM$RANDOM
PA=$((20000 + RANDOM % 10000))
BUCKET=kiln-envd
pids=()
bg=()
s3_local_start
before_cg=$(count_cgroups)

host_config "$T_TMP/a.json" "127.0.0.1:$PA" a \
	".run_dir += \"/a\" | .image_dir = \"${KILN_TEST_IMAGE_DIR:-$ROOT/build/image}\""
host_start "$T_TMP/a.json" a
pids+=("$host_pid")
if t_serving "http://127.0.0.1:$PA/healthz" "$host_pid"; then ok "kiln-host starts"; else t_bail "kiln-host starts" "$(tail -3 "$T_TMP/a.err")"; fi

U=http://127.0.0.1:$PA/v1/sessions/s1
# h METHOD PATH [curl args]: body in $T_TMP/last, status echoed
h() {
	local m=$1 p=$2; shift 2
	curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "http://127.0.0.1:$PA$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
# rpc SERVICE/METHOD JSON [curl args]: a unary Connect call
rpc() {
	local m=$1 j=$2; shift 2
	h POST "/v1/sessions/s1/envd/$m" -H 'Content-Type: application/json' -H 'Connect-Protocol-Version: 1' --data-binary "$j" "$@"
}
# envelope JSON > file: one Connect envelope (flag 0, big-endian length)
envelope() { $PY -c 'import sys,struct; m=sys.argv[1].encode(); sys.stdout.buffer.write(b"\0"+struct.pack(">I",len(m))+m)' "$1"; }
# stream METHOD JSON OUT [curl args]: a server-stream call, the raw body in OUT
stream() {
	local m=$1 j=$2 out=$3; shift 3
	envelope "$j" > "$out.req"
	curl -sN -m 300 -o "$out" -w '%{http_code}' -H "Authorization: Bearer $TOKEN" \
		-H 'Content-Type: application/connect+json' -H 'Connect-Protocol-Version: 1' "$@" \
		--data-binary @"$out.req" "$U/envd/process.Process/$m"
}
# frames FILE: the envelopes, checked byte by byte, one JSON line each:
# {"flags":F,"msg":...}; exit 1 when the body is not exactly whole envelopes.
frames() {
	$PY - "$1" << 'EOF'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
i = 0
while i < len(b):
    if len(b) - i < 5:
        sys.exit("truncated envelope header at %d" % i)
    flags = b[i]
    n = struct.unpack(">I", b[i + 1:i + 5])[0]
    if flags not in (0, 2) or len(b) - i - 5 < n:
        sys.exit("bad envelope at %d: flags %d length %d" % (i, flags, n))
    print(json.dumps({"flags": flags, "msg": json.loads(b[i + 5:i + 5 + n])}))
    i += 5 + n
EOF
}
# outs FILE STREAM: the decoded bytes of that output stream
outs() { frames "$1" | $PY -c '
import base64, json, sys
for l in sys.stdin:
    d = json.loads(l)["msg"].get("event", {}).get("data", {})
    if sys.argv[1] in d: sys.stdout.buffer.write(base64.b64decode(d[sys.argv[1]]))' "$2"; }
b64() { printf '%s' "$1" | base64 -w0; }
# wait_for FILE PATTERN: until FILE's stdout holds PATTERN (30 s)
wait_out() {
	for _ in $(seq 150); do outs "$1" stdout 2> /dev/null | grep -q "$2" && return 0; sleep 0.2; done
	return 1
}
first_pid() { frames "$1" 2> /dev/null | head -1 | jq -r '.msg.event.start.pid // empty'; }
wait_pid() { for _ in $(seq 150); do p=$(first_pid "$1"); [ -n "$p" ] && { echo "$p"; return 0; }; sleep 0.2; done; return 1; }
listed() { rpc process.Process/List '{}' > /dev/null; jq -e --argjson p "$1" '.processes | map(.pid) | index($p) != null' "$T_TMP/last" > /dev/null; }
# not_listed PID: List answered (200, an object) and PID, a pid that was
# seen, is not in it; a List that fails or a pid never learnt is not "gone".
not_listed() {
	[[ $1 =~ ^[1-9][0-9]*$ ]] || return 1
	[ "$(rpc process.Process/List '{}')" = 200 ] || return 1
	jq -e --argjson p "$1" 'type == "object" and ((.processes // []) | map(.pid) | index($p) == null)' "$T_TMP/last" > /dev/null
}

st=$(h POST /v1/sessions -H 'Content-Type: application/json' \
	--data-binary '{"id":"s1","customer":"acme","spec":{"env":{"SESS_VAR":"from-session","OVER":"session"}}}')
check "POST /v1/sessions with env: 201" test "$st" = 201
st=$(h POST /v1/sessions -H 'Content-Type: application/json' \
	--data-binary '{"id":"s2","customer":"acme","spec":{"env":{"1BAD":"x"}}}')
check "a session env with an invalid name: 400 invalid_spec" test "$st" = 400 -a "$(last .error.code)" = invalid_spec
big_env=$(jq -cn '[range(257) | {key: "V\(.)", value: "x"}] | from_entries')
st=$(h POST /v1/sessions -H 'Content-Type: application/json' \
	--data-binary "{\"id\":\"s2\",\"customer\":\"acme\",\"spec\":{\"env\":$big_env}}")
check "a session env of 257 variables: 400 invalid_spec" test "$st" = 400 -a "$(last .error.code)" = invalid_spec

st=$(h GET /v1/sessions/s1/envd/health)
[ "$st" = 204 ] || t_bail "GET .../envd/health: 204" "health: $st $(head -c 300 "$T_TMP/last")" "$(tail -3 "$T_TMP/a.err")"
ok "GET .../envd/health: 204"

# --- A session stopped while idle (sessions.idle_stop_ms, default 1.5 s):
# envd requests, a process, pause and resume all continue it first.
stopped() { # ID: until GET says idle_stopped (20 s)
	for _ in $(seq 100); do h GET "/v1/sessions/$1" > /dev/null; [ "$(last .idle_stopped)" = true ] && return 0; sleep 0.2; done
	return 1
}
st=$(h POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"s3","customer":"acme","spec":{}}')
check "an idle session is stopped (s3)" stopped s3
st=$(h POST /v1/sessions/s3/envd/filesystem.Filesystem/Stat -H 'Content-Type: application/json' \
	-H 'Connect-Protocol-Version: 1' --data-binary '{"path":"/tmp"}')
check "envd Stat on a stopped session: 200, a directory" test "$st" = 200 -a "$(last .entry.type)" = FILE_TYPE_DIRECTORY
stopped s3 > /dev/null
envelope '{"process":{"cmd":"/bin/sh","args":["-c","date +%s"]}}' > "$T_TMP/s3.req"
st=$(curl -sN -m 60 -o "$T_TMP/s3.out" -w '%{http_code}' -H "Authorization: Bearer $TOKEN" \
	-H 'Content-Type: application/connect+json' -H 'Connect-Protocol-Version: 1' \
	--data-binary @"$T_TMP/s3.req" "http://127.0.0.1:$PA/v1/sessions/s3/envd/process.Process/Start")
g=$(outs "$T_TMP/s3.out" stdout | tr -d '\n'); now=$(date +%s)
check "envd Start on a stopped session runs, with the host's clock ($g vs $now)" \
	test "$st" = 200 -a -n "$g" -a "$((now - ${g:-0}))" -le 2 -a "$((${g:-0} - now))" -le 2
stopped s3 > /dev/null
check "pause of a stopped session: 200" test "$(h POST /v1/sessions/s3/pause)" = 200
check "resume: 200" test "$(h POST /v1/sessions/s3/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')" = 200
check "the resumed session is stopped again once idle" stopped s3

# --- Requests racing the idler: a second kiln-host stopping idle sessions
# after 100 ms; 100 envd Stat calls 50-190 ms apart, so that many arrive
# while it decides to stop the VM. Each must be answered (a request that
# reached the guest just before its QMP stop would wait for a stopped VM).
PB=$((PA + 1))
jq --arg port "$PB" --arg run "$KILN_RUN_DIR/b" --arg spool "$T_TMP/spool-b" \
	'.listen = ("127.0.0.1:" + $port) | .host_id = "b" | .run_dir = $run | .spool_dir = $spool | .sessions = {idle_stop_ms: 100}' \
	"$T_TMP/a.json" > "$T_TMP/b.json"
host_start "$T_TMP/b.json" b
hb=$host_pid
pids+=($hb)
t_serving "http://127.0.0.1:$PB/healthz" "$hb" 120 || t_bail "kiln-host b starts" "$(tail -3 "$T_TMP/b.err")"
hb_() { local m=$1 p=$2; shift 2; curl -s -m 3 -o "$T_TMP/lastb" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "http://127.0.0.1:$PB$p"; }
st=$(hb_ POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"r1","customer":"acme","spec":{}}')
bad=0
for _ in $(seq 100); do
	st=$(hb_ POST /v1/sessions/r1/envd/filesystem.Filesystem/Stat -H 'Content-Type: application/json' \
		-H 'Connect-Protocol-Version: 1' --data-binary '{"path":"/tmp"}')
	[ "$st" = 200 ] || bad=$((bad + 1))
	sleep "0.$((5 + RANDOM % 15))"
done
stops=$(curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PB/metrics" | awk '/^kiln_host_session_idle_stops_total/ { print $2 }')
check "100 envd calls racing the idler (idle_stop_ms 100): all answered within 3 s ($bad not; the VM was stopped ${stops:-0} times meanwhile)" \
	test "$bad" = 0 -a "${stops:-0}" -ge 10
hb_ DELETE /v1/sessions/r1 > /dev/null
kill "$hb" 2> /dev/null
wait "$hb" 2> /dev/null
check "the second kiln-host left nothing in its run directory" test -z "$(ls -A "$KILN_RUN_DIR/b" 2> /dev/null)"
rmdir "$KILN_RUN_DIR/b" 2> /dev/null
check "DELETE of a stopped session: 200" test "$(h DELETE /v1/sessions/s3)" = 200

# --- Start: a whole stream, envelope by envelope ---
st=$(stream Start '{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi; echo err >&2; echo \"$SESS_VAR $OVER\"; id -un; pwd"],"envs":{"OVER":"request"}}}' \
	"$T_TMP/s1" -H 'Keepalive-Ping-Interval: 50')
check "Start: 200" test "$st" = 200
if frames "$T_TMP/s1" > "$T_TMP/s1.frames"; then ok "Start: the body is whole envelopes"
else not_ok "Start: the body is whole envelopes" "$(od -c "$T_TMP/s1" | head -5)"; fi
check "Start: the first message is start{pid}" test "$(head -1 "$T_TMP/s1.frames" | jq -r '.flags, (.msg.event.start.pid > 0)' | tr '\n' ' ')" = "0 true "
check "Start: the last envelope is the end-of-stream message {}" \
	test "$(tail -1 "$T_TMP/s1.frames" | jq -c '[.flags, .msg]')" = '[2,{}]'
end=$(grep '"end"' "$T_TMP/s1.frames" | jq -c '.msg.event.end')
check "Start: end{exited, status \"exit status 0\"} (exitCode 0 left out)" test "$end" = '{"exited":true,"status":"exit status 0"}'
out=$(outs "$T_TMP/s1" stdout)
check "stdout: the command's lines" test "$out" = "$(printf 'hi\nfrom-session request\nuser\n/home/user')"
check "stderr: separate" test "$(outs "$T_TMP/s1" stderr)" = err

st=$(stream Start '{"process":{"cmd":"/bin/sh","args":["-c","exit 3"]}}' "$T_TMP/s2")
check "a non-zero exit: end{exitCode 3, status \"exit status 3\"}" \
	test "$(frames "$T_TMP/s2" | grep '"end"' | jq -c '.msg.event.end | [.exitCode, .status]')" = '[3,"exit status 3"]'
stream Start '{"process":{"cmd":"/bin/sh","args":["-c","stty size; tty"]},"pty":{"size":{"rows":24,"cols":81}}}' "$T_TMP/pty" > /dev/null
check "Start with a pty: output as pty data, the terminal's size" \
	test "$(outs "$T_TMP/pty" pty | tr -d '\r' | head -1)" = "24 81"
st=$(stream Start '{"process":{"cmd":"/no/such/program"}}' "$T_TMP/nosuch")
check "Start of a missing program: 200, end-of-stream error" \
	test "$st" = 200 -a "$(frames "$T_TMP/nosuch" | tail -1 | jq -r '.flags, (.msg.error.code != null)' | tr '\n' ' ')" = "2 true "

# The Content-Type, by the method's kind (lib/connect_call.c, as kiln-api's
# relay decides): any case is the same type; the other kind's is refused.
envelope '{"process":{"cmd":"/bin/echo","args":["odd"]}}' > "$T_TMP/odd.req"
st=$(h POST /v1/sessions/s1/envd/process.Process/Start -H 'Content-Type: Application/Connect+JSON; charset=utf-8' \
	--data-binary @"$T_TMP/odd.req")
check "Start as Application/Connect+JSON; charset=utf-8: the stream all the same ($st, '$(outs "$T_TMP/last" stdout | tr -d '\n')')" \
	test "$st" = 200 -a "$(outs "$T_TMP/last" stdout)" = odd
st=$(h POST /v1/sessions/s1/envd/process.Process/Start -H 'Content-Type: application/json' --data-binary @"$T_TMP/odd.req")
check "Start as application/json (the unary type): 415 unimplemented ($st $(jq -r .code "$T_TMP/last" 2> /dev/null))" \
	test "$st" = 415 -a "$(jq -r .code "$T_TMP/last" 2> /dev/null)" = unimplemented
st=$(h POST /v1/sessions/s1/envd/filesystem.Filesystem/Stat -H 'Content-Type: application/connect+json' --data-binary '{"path":"/tmp"}')
check "Stat as application/connect+json (the streaming type): 415 ($st)" test "$st" = 415

# --- a slow reader holds back only its own process (per-process windows) ---
t_bg stream Start '{"process":{"cmd":"/bin/sh","args":["-c","exec cat /dev/zero"]}}' "$T_TMP/flood" --limit-rate 64k > /dev/null
flood_curl=$T_BG_PID
fpid=$(wait_pid "$T_TMP/flood")
sleep 2
t0=$(date +%s%N)
stream Start '{"process":{"cmd":"/bin/echo","args":["quick"]}}' "$T_TMP/quick" > /dev/null
t1=$(date +%s%N)
check "beside a process whose reader is slow, another command streams at once" \
	test "$(outs "$T_TMP/quick" stdout)" = quick -a $(((t1 - t0) / 1000000)) -lt 5000
kill "$flood_curl" 2> /dev/null
wait "$flood_curl" 2> /dev/null
rpc process.Process/SendSignal "{\"process\":{\"pid\":${fpid:-0}},\"signal\":\"SIGNAL_SIGKILL\"}" > /dev/null
check "...and the flooding process is still there to be killed after its reader left (200)" test "$(cat "$T_TMP/last")" = '{}'

# --- a background process: List, SendInput, Connect, SendSignal ---
t_bg stream Start '{"process":{"cmd":"/bin/bash","args":["-c","read line; echo got:$line; exec sleep 300"]},"stdin":true,"tag":"bg1"}' \
	"$T_TMP/bg" > /dev/null
bg+=("$T_BG_PID")
pid=$(wait_pid "$T_TMP/bg")
check "background Start: start{pid} arrives while it runs" test -n "$pid"
pid=${pid:-0}
rpc process.Process/List '{}' > /dev/null
check "List: the process, with its config and tag" \
	test "$(jq -c --argjson p "$pid" '.processes[] | select(.pid == $p) | [.config.cmd, .config.args[0], .tag]' "$T_TMP/last")" = '["/bin/bash","-c","bg1"]'
check "List: its env has the session's variables" \
	test "$(jq -r --argjson p "$pid" '.processes[] | select(.pid == $p) | .config.envs.SESS_VAR' "$T_TMP/last")" = from-session
st=$(rpc process.Process/SendInput "{\"process\":{\"pid\":$pid},\"input\":{\"stdin\":\"$(b64 $'hello\n')\"}}")
check "SendInput: 200 {}" test "$st" = 200 -a "$(cat "$T_TMP/last")" = '{}'
check "the process got the input (its output streams to the Start stream)" wait_out "$T_TMP/bg" got:hello
t_bg stream Connect "{\"process\":{\"pid\":$pid}}" "$T_TMP/conn" > /dev/null
bg+=("$T_BG_PID")
cpid=$(wait_pid "$T_TMP/conn")
check "Connect to the running pid: start{pid}" test "$cpid" = "$pid"
st=$(rpc process.Process/SendSignal "{\"process\":{\"pid\":$pid},\"signal\":\"SIGNAL_SIGKILL\"}")
check "SendSignal SIGKILL: 200" test "$st" = 200
wait "${bg[@]}" 2> /dev/null
bg=()
check "the Start stream ends: end{status \"signal: killed\"}, then {}" \
	test "$(frames "$T_TMP/bg" | tail -2 | jq -c '.msg.event.end.status // .msg' | tr '\n' ' ')" = '"signal: killed" {} '
check "the Connect stream ends the same way" \
	test "$(frames "$T_TMP/conn" | tail -2 | jq -c '.msg.event.end.status // .msg' | tr '\n' ' ')" = '"signal: killed" {} '
check "List: the killed process is gone (pid ${pid:-none})" not_listed "$pid"
st=$(rpc process.Process/SendSignal "{\"process\":{\"pid\":$pid},\"signal\":\"SIGNAL_SIGTERM\"}")
check "SendSignal to a gone pid: 404 not_found" test "$st" = 404 -a "$(last .code)" = not_found
st=$(stream Connect '{"process":{"pid":999999}}' "$T_TMP/c404")
check "Connect to an unknown pid: end-of-stream not_found" \
	test "$(frames "$T_TMP/c404" | tail -1 | jq -r '.msg.error.code')" = not_found

# --- files ---
head -c $((5 << 20)) /dev/urandom > "$T_TMP/big.bin"
want=$(sha256sum < "$T_TMP/big.bin" | cut -d' ' -f1)
st=$(h POST "/v1/sessions/s1/envd/files?path=/home/user/up/big.bin" -F "file=@$T_TMP/big.bin;filename=big.bin")
check "multipart upload of 5 MiB: 200 [{name, type:file, path}]" \
	test "$st" = 200 -a "$(jq -c . "$T_TMP/last")" = '[{"name":"big.bin","type":"file","path":"/home/user/up/big.bin"}]'
curl -s -m 120 -o "$T_TMP/big.back" -w '%{http_code}' -H "Authorization: Bearer $TOKEN" \
	"$U/envd/files?path=/home/user/up/big.bin" > "$T_TMP/dl.st"
check "download: the same bytes (sha256)" test "$(cat "$T_TMP/dl.st")" = 200 -a "$(sha256sum < "$T_TMP/big.back" | cut -d' ' -f1)" = "$want"
st=$(h POST "/v1/sessions/s1/envd/files?path=raw.txt&username=root" -H 'Content-Type: application/octet-stream' --data-binary 'raw bytes')
check "application/octet-stream upload as root, relative to its home" test "$st" = 200 -a "$(last '.[0].path')" = /root/raw.txt
printf 'A' > "$T_TMP/pa"; printf 'BB' > "$T_TMP/pb"
st=$(h POST "/v1/sessions/s1/envd/files" -F "file=@$T_TMP/pa;filename=/home/user/two/a.txt" -F "file=@$T_TMP/pb;filename=two/sub/b.txt")
check "multipart with two parts and no ?path=: each at its filename's path ($st $(last 'map(.path) | join(" ")'))" \
	test "$st" = 200 -a "$(last 'map(.path) | join(" ")')" = "/home/user/two/a.txt /home/user/two/sub/b.txt"
head -c $((2 << 20)) /dev/zero | gzip -c > "$T_TMP/z.gz"
st=$(h POST "/v1/sessions/s1/envd/files?path=/home/user/z.bin" -H 'Content-Type: application/octet-stream' \
	-H 'Content-Encoding: gzip' -H 'Kiln-Max-Body-Bytes: 1048576' --data-binary @"$T_TMP/z.gz")
st2=$(h POST "/v1/sessions/s1/envd/files?path=/home/user/z.bin" -H 'Content-Type: application/octet-stream' \
	-H 'Content-Encoding: gzip' --data-binary @"$T_TMP/z.gz")
rpc filesystem.Filesystem/Stat '{"path":"/home/user/z.bin"}' > /dev/null
check "gzip upload: 413 past Kiln-Max-Body-Bytes (1 MiB < 2), 200 within the default 64 MiB, 2 MiB written ($st $st2 $(last .entry.size))" \
	test "$st" = 413 -a "$st2" = 200 -a "$(last .entry.size)" = 2097152
curl -s -m 60 -o "$T_TMP/z.back" -D "$T_TMP/z.hdr" -H "Authorization: Bearer $TOKEN" -H 'Accept-Encoding: gzip' "$U/envd/files?path=/home/user/z.bin"
check "download with Accept-Encoding: gzip: Content-Encoding gzip, $(stat -c %s "$T_TMP/z.back") bytes that inflate to the file" \
	test "$(tr -d '\r' < "$T_TMP/z.hdr" | sed -n 's/^content-encoding: *//Ip')" = gzip -a \
	"$(gzip -dc < "$T_TMP/z.back" | sha256sum)" = "$(head -c $((2 << 20)) /dev/zero | sha256sum)"
st=$(h POST "/v1/sessions/s1/envd/files?path=/home/user/m.txt" -H 'Content-Type: application/octet-stream' \
	-H 'X-Metadata-Owner-Team: infra' --data-binary 'm')
rpc filesystem.Filesystem/Stat '{"path":"/home/user/m.txt"}' > /dev/null
check "X-Metadata-Owner-Team: metadata {owner-team} in the upload's answer and Stat ($st $(last '.entry.metadata | tojson'))" \
	test "$st" = 200 -a "$(last '.entry.metadata["owner-team"]')" = infra
st=$(rpc filesystem.Filesystem/Stat '{"path":"/home/user/up/big.bin"}')
check "Stat: entry (size as a string, type, owner, permissions)" \
	test "$st" = 200 -a "$(jq -c '.entry | [.name, .type, .size, .owner, .permissions]' "$T_TMP/last")" = '["big.bin","FILE_TYPE_FILE","5242880","user","-rw-r--r--"]'
check "Stat: modifiedTime is RFC 3339" \
	test "$(jq -r '.entry.modifiedTime | test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}(\\.[0-9]+)?Z$")' "$T_TMP/last")" = true
st=$(rpc filesystem.Filesystem/ListDir '{"path":"/home/user/up"}')
check "ListDir: the file" test "$st" = 200 -a "$(jq -c '[.entries[].name]' "$T_TMP/last")" = '["big.bin"]'
st=$(rpc filesystem.Filesystem/MakeDir '{"path":"/home/user/d1/d2"}')
check "MakeDir (with parents): entry of a directory" test "$st" = 200 -a "$(last .entry.type)" = FILE_TYPE_DIRECTORY
st=$(rpc filesystem.Filesystem/MakeDir '{"path":"/home/user/d1/d2"}')
check "MakeDir of an existing directory: 409 already_exists" test "$st" = 409 -a "$(last .code)" = already_exists
st=$(rpc filesystem.Filesystem/Move '{"source":"/home/user/up/big.bin","destination":"/home/user/d1/moved.bin"}')
check "Move: entry of the destination" test "$st" = 200 -a "$(last .entry.path)" = /home/user/d1/moved.bin
st=$(rpc filesystem.Filesystem/Stat '{"path":"/home/user/up/big.bin"}')
check "Stat of the moved-away path: 404 not_found" test "$st" = 404 -a "$(last .code)" = not_found
st=$(rpc filesystem.Filesystem/ListDir '{"path":"/home/user/d1","depth":2}')
check "ListDir depth 2: both levels" test "$(jq -c '[.entries[].name] | sort' "$T_TMP/last")" = '["d2","moved.bin"]'
st=$(rpc filesystem.Filesystem/Remove '{"path":"/home/user/d1"}')
check "Remove (recursive): 200 {}" test "$st" = 200 -a "$(cat "$T_TMP/last")" = '{}'
st=$(rpc filesystem.Filesystem/Stat '{"path":"/home/user/d1"}')
check "Stat after Remove: 404" test "$st" = 404
st=$(rpc filesystem.Filesystem/Remove '{"path":"/home/user/d1"}')
check "Remove of a path that is not there: 200 {} (as E2B's envd)" test "$st" = 200 -a "$(cat "$T_TMP/last")" = '{}'
st=$(h GET "/v1/sessions/s1/envd/files?path=/home/user/nothing")
check "download of a missing file: 404 {code:404, message}" test "$st" = 404 -a "$(last .code)" = 404
st=$(rpc filesystem.Filesystem/Stat '{"path":"/root"}')
check "Stat of /root as user: allowed (a directory's own entry)" test "$st" = 200
st=$(rpc filesystem.Filesystem/ListDir '{"path":"/root"}')
check "ListDir of /root as user: 403 permission_denied" test "$st" = 403 -a "$(last .code)" = permission_denied

# --- directory watching: WatchDir streams and polling watchers ---
# wstream JSON OUT [curl args]: a WatchDir stream, the raw body in OUT;
# wstream_bg the same for t_bg, curl itself the background process (so that
# killing it is the client going away)
wstream() {
	local j=$1 out=$2; shift 2
	envelope "$j" > "$out.req"
	curl -sN -m 300 -o "$out" -w '%{http_code}' -H "Authorization: Bearer $TOKEN" \
		-H 'Content-Type: application/connect+json' -H 'Connect-Protocol-Version: 1' "$@" \
		--data-binary @"$out.req" "$U/envd/filesystem.Filesystem/WatchDir"
}
wstream_bg() {
	local j=$1 out=$2; shift 2
	envelope "$j" > "$out.req"
	exec curl -sN -m 300 -o "$out" -H "Authorization: Bearer $TOKEN" \
		-H 'Content-Type: application/connect+json' -H 'Connect-Protocol-Version: 1' "$@" \
		--data-binary @"$out.req" "$U/envd/filesystem.Filesystem/WatchDir"
}
# wevents FILE: the stream's filesystem events so far, "TYPE name" a line
wevents() { frames "$1" 2> /dev/null | jq -r 'select(.msg.filesystem) | .msg.filesystem | "\(.type | ltrimstr("EVENT_TYPE_")) \(.name)"'; }
wstarted() { for _ in $(seq 150); do frames "$1" 2> /dev/null | head -1 | grep -q '"start":{}' && return 0; sleep 0.2; done; return 1; }
wuntil() { for _ in $(seq 100); do wevents "$1" | grep -qx "$2" && return 0; sleep 0.2; done; return 1; }
# inotify instances the guest's envd holds (a root process counts its descriptors)
guest_inotify() {
	stream Start '{"process":{"cmd":"/bin/sh","args":["-c","for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = kiln-envd ] && ls -l $p/fd 2>/dev/null; done | grep -c inotify"]}}' \
		"$T_TMP/ino" -H "E2b-Authorization: Basic $(b64 root:)" > /dev/null
	outs "$T_TMP/ino" stdout | tr -d '\n'
}
inotify_is() { for _ in $(seq 60); do [ "$(guest_inotify)" = "$1" ] && return 0; sleep 0.5; done; return 1; }
rpc filesystem.Filesystem/MakeDir '{"path":"/home/user/w/pre"}' > /dev/null
ino0=$(guest_inotify)
t_bg wstream_bg '{"path":"/home/user/w"}' "$T_TMP/w1" -H 'Keepalive-Ping-Interval: 1' > /dev/null
w1_curl=$T_BG_PID
t_bg wstream_bg '{"path":"w","recursive":true}' "$T_TMP/w2" -H 'Keepalive-Ping-Interval: 1' > /dev/null
w2_curl=$T_BG_PID
wstarted "$T_TMP/w1" && wstarted "$T_TMP/w2"
check "WatchDir: 200, the first message {\"start\":{}} (both streams)" \
	test "$(frames "$T_TMP/w1" 2> /dev/null | head -1 | jq -c '[.flags, .msg]')" = '[0,{"start":{}}]' -a \
	"$(frames "$T_TMP/w2" 2> /dev/null | head -1 | jq -c '[.flags, .msg]')" = '[0,{"start":{}}]'
check "two open watches: two more inotify instances in the guest's envd (${ino0:-?} before)" inotify_is "$((${ino0:-0} + 2))"
stream Start '{"process":{"cmd":"/bin/sh","args":["-c","cd /home/user/w && echo a > f1 && mv f1 f2 && rm f2 && mkdir nd && sleep 0.5 && echo b > nd/inner && echo c > pre/x && chmod 600 pre/x"]}}' \
	"$T_TMP/wp" > /dev/null
wuntil "$T_TMP/w2" "CHMOD pre/x"
check "WatchDir: create, write, rename (old name; the new one's create), remove, in order" \
	test "$(wevents "$T_TMP/w1" | head -6 | tr '\n' ',')" = "CREATE f1,WRITE f1,RENAME f1,CREATE f2,REMOVE f2,CREATE nd,"
check "WatchDir without recursive: nothing from subdirectories ($(wevents "$T_TMP/w1" | wc -l) events)" \
	test -z "$(wevents "$T_TMP/w1" | grep /)"
check "WatchDir recursive (a path relative to the home): a directory made later is watched, names relative to the watched one" \
	test "$(wevents "$T_TMP/w2" | tr '\n' ',')" = "CREATE f1,WRITE f1,RENAME f1,CREATE f2,REMOVE f2,CREATE nd,CREATE nd/inner,WRITE nd/inner,CREATE pre/x,WRITE pre/x,CHMOD pre/x,"
check "WatchDir: keepalives while nothing happens (Keepalive-Ping-Interval 1)" \
	test "$(frames "$T_TMP/w1" 2> /dev/null | grep -c keepalive)" -ge 1
kill "$w1_curl" 2> /dev/null
wait "$w1_curl" 2> /dev/null
check "a client that goes away: its guest watch is removed (inotify instances $((${ino0:-0} + 1)))" inotify_is "$((${ino0:-0} + 1))"
kill "$w2_curl" 2> /dev/null
wait "$w2_curl" 2> /dev/null
check "...and the other's too (back to ${ino0:-?})" inotify_is "${ino0:-0}"
wstream '{"path":"/home/user/nothere"}' "$T_TMP/wnf" > /dev/null
check "WatchDir of a missing path: end-of-stream not_found" test "$(frames "$T_TMP/wnf" | tail -1 | jq -r '.flags, .msg.error.code' | tr '\n' ' ')" = "2 not_found "
wstream '{"path":"/etc/hostname"}' "$T_TMP/wnd" > /dev/null
check "WatchDir of a file: end-of-stream invalid_argument" test "$(frames "$T_TMP/wnd" | tail -1 | jq -r .msg.error.code)" = invalid_argument
wstream '{"path":"/root"}' "$T_TMP/wroot" > /dev/null
check "WatchDir of /root as user: end-of-stream permission_denied (the watch is the user's)" \
	test "$(frames "$T_TMP/wroot" | tail -1 | jq -r .msg.error.code)" = permission_denied
t0=$(date +%s)
wstream '{"path":"/home/user/w"}' "$T_TMP/wdl" -H 'Connect-Timeout-Ms: 1500' > /dev/null
t1=$(date +%s)
check "WatchDir's Connect-Timeout-Ms: end-of-stream deadline_exceeded, after about 1.5 s ($((t1 - t0)) s)" \
	test "$(frames "$T_TMP/wdl" | tail -1 | jq -r .msg.error.code)" = deadline_exceeded -a $((t1 - t0)) -lt 20
st=$(rpc filesystem.Filesystem/CreateWatcher '{"path":"/home/user/w","recursive":true}')
wid=$(last .watcherId)
check "CreateWatcher: 200 {watcherId}" test "$st" = 200 -a -n "$wid" -a "$wid" != null
stream Start '{"process":{"cmd":"/bin/sh","args":["-c","touch /home/user/w/p1; rm /home/user/w/nd/inner"]}}' "$T_TMP/wp2" > /dev/null
got=
for _ in $(seq 50); do
	rpc filesystem.Filesystem/GetWatcherEvents "{\"watcherId\":\"$wid\"}" > /dev/null
	got="$got$(jq -r '.events[]? | "\(.type) \(.name),"' "$T_TMP/last" | tr -d '\n')"
	case $got in *"EVENT_TYPE_REMOVE nd/inner,"*) break ;; esac
	sleep 0.2
done
check "GetWatcherEvents: the events since CreateWatcher ($got)" \
	test "$got" = "EVENT_TYPE_CREATE p1,EVENT_TYPE_CHMOD p1,EVENT_TYPE_REMOVE nd/inner,"
st=$(rpc filesystem.Filesystem/GetWatcherEvents "{\"watcherId\":\"$wid\"}")
check "GetWatcherEvents drains: nothing new the second time" test "$st" = 200 -a "$(jq -c '.events // []' "$T_TMP/last")" = '[]'
st=$(rpc filesystem.Filesystem/RemoveWatcher "{\"watcherId\":\"$wid\"}")
check "RemoveWatcher: 200 {}" test "$st" = 200 -a "$(cat "$T_TMP/last")" = '{}'
st=$(rpc filesystem.Filesystem/GetWatcherEvents "{\"watcherId\":\"$wid\"}")
check "GetWatcherEvents of a removed watcher: 404 not_found" test "$st" = 404 -a "$(last .code)" = not_found
st=$(rpc filesystem.Filesystem/CreateWatcher '{"path":"/home/user/nothere"}')
check "CreateWatcher of a missing path: 404 not_found" test "$st" = 404 -a "$(last .code)" = not_found
ids=()
for _ in $(seq 16); do rpc filesystem.Filesystem/CreateWatcher '{"path":"/home/user/w"}' > /dev/null; ids+=("$(last .watcherId)"); done
st=$(rpc filesystem.Filesystem/CreateWatcher '{"path":"/home/user/w"}')
check "a 17th watch: resource_exhausted (16 per sandbox)" test "$(last .code)" = resource_exhausted
for i in "${ids[@]}"; do rpc filesystem.Filesystem/RemoveWatcher "{\"watcherId\":\"$i\"}" > /dev/null; done
check "the 16 watchers removed: the guest's inotify instances back to ${ino0:-?}" inotify_is "${ino0:-0}"

# --- the real Connect client (the E2B SDK's) parses what kiln-host sends ---
# scripts/e2b-sdk.sh installs the pinned SDK into its cache when missing and
# prints its node_modules.
SDK_NM=${E2B_SDK_NODE_MODULES:-$("$ROOT/scripts/e2b-sdk.sh" 2> "$T_TMP/sdk.err" || true)}
if command -v node > /dev/null && [ -f "$SDK_NM/e2b/dist/index.js" ]; then
	E2B_SDK_NODE_MODULES=$SDK_NM node "$ROOT/tests/integration/envd_connect.cjs" "$U/envd" "$TOKEN" > "$T_TMP/node.out" 2>&1
	while read -r l; do
		case $l in
		"ok "*) ok "${l#ok }" ;;
		"not ok "*) not_ok "${l#not ok }" ;;
		*) echo "# $l" ;;
		esac
	done < "$T_TMP/node.out"
else
	skip "the E2B SDK's Connect client parses kiln-host's answers" "node or the SDK missing: $(tail -n 1 "$T_TMP/sdk.err")"
fi

# --- the deadline ---
t0=$(date +%s)
st=$(stream Start '{"process":{"cmd":"/bin/sh","args":["-c","echo started; sleep 60"]}}' "$T_TMP/dl" -H 'Connect-Timeout-Ms: 2000')
t1=$(date +%s)
check "Connect-Timeout-Ms: the stream ends with deadline_exceeded" \
	test "$(frames "$T_TMP/dl" | tail -1 | jq -r '.flags, .msg.error.code' | tr '\n' ' ')" = "2 deadline_exceeded "
check "...after about 2 s, not 60" test $((t1 - t0)) -lt 20
dpid=$(first_pid "$T_TMP/dl")
sleep 1
check "...and its process group was killed (pid ${dpid:-none})" not_listed "$dpid"

# --- metrics ---
st=$(h GET /v1/sessions/s1/metrics)
check "metrics: cpu_count, mem and disk figures" \
	test "$st" = 200 -a "$(jq -r '(.cpu_count >= 1) and (.mem_total > 0) and (.mem_used > 0) and (.disk_total > 0) and (.cpu_used_pct >= 0)' "$T_TMP/last")" = true

# --- pause and resume: processes and the session's env survive ---
t_bg stream Start '{"process":{"cmd":"/bin/sh","args":["-c","exec sleep 600"]},"tag":"keeper"}' "$T_TMP/keep" > /dev/null
bg+=("$T_BG_PID")
kpid=$(wait_pid "$T_TMP/keep")
st=$(h POST /v1/sessions/s1/pause)
check "pause: 200" test "$st" = 200
wait "${bg[@]}" 2> /dev/null
bg=()
check "the open stream ended with unavailable" test "$(frames "$T_TMP/keep" | tail -1 | jq -r '.msg.error.code')" = unavailable
st=$(rpc process.Process/List '{}')
check "envd of a paused session: 404/503, not a hang" test "$st" = 404 -o "$st" = 503
st=$(h POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')
check "resume: 200" test "$st" = 200
if listed "${kpid:-0}"; then ok "after resume, List still has the background process"
else not_ok "after resume, List still has the background process" "$(cat "$T_TMP/last")"; fi
st=$(stream Start '{"process":{"cmd":"/bin/sh","args":["-c","echo $SESS_VAR"]}}' "$T_TMP/after")
check "after resume, the session's env is still the default" test "$(outs "$T_TMP/after" stdout)" = from-session

# --- the channel dies with the VM: DELETE, then kiln-host's SIGTERM ---
t_bg stream Start '{"process":{"cmd":"/bin/sh","args":["-c","exec sleep 600"]}}' "$T_TMP/del" > /dev/null
bg+=("$T_BG_PID")
wait_pid "$T_TMP/del" > /dev/null
st=$(h DELETE /v1/sessions/s1)
check "DELETE with an open stream: 200" test "$st" = 200
wait "${bg[@]}" 2> /dev/null
bg=()
check "...the stream ended with unavailable" test "$(frames "$T_TMP/del" | tail -1 | jq -r '.msg.error.code')" = unavailable
h POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"s1","customer":"acme","spec":{}}' > /dev/null
t_bg stream Start '{"process":{"cmd":"/bin/sh","args":["-c","exec sleep 600"]}}' "$T_TMP/term" > /dev/null
bg+=("$T_BG_PID")
wait_pid "$T_TMP/term" > /dev/null
t0=$(date +%s)
kill -TERM "${pids[0]}"
wait "${pids[0]}" 2> /dev/null
pids=()
t1=$(date +%s)
check "SIGTERM with an open envd stream: kiln-host exits at once (not after a keepalive)" test $((t1 - t0)) -lt 20
wait "${bg[@]}" 2> /dev/null
bg=()
check "...and the stream ended with unavailable" test "$(frames "$T_TMP/term" | tail -1 | jq -r '.msg.error.code')" = unavailable
sleep 1
check "no QEMU left" test "$(count_qemu)" = 0
check "no run directory entries left" test "$(count_run_entries)" -le 1
check "no cgroups left" test "$(count_cgroups)" = "$before_cg"
t_done
