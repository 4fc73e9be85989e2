#!/usr/bin/env bash
# Sessions through the whole stack: kiln-api, a local S3 and two kiln-hosts
# on loopback (own ports, spool and run directories), real VMs. Create; exec
# keeps state across commands (a file, a background process), whatever the
# cwd; files put/get/list; another customer's 404s; the running quota (a
# second session refused, then allowed once the first is paused: usage
# shows it); pause to S3; resume forced onto the other host by stopping the
# first, with files and processes as they were; outputs with presigned URLs;
# the idle limit ends a session; DELETE destroys it and its snapshot; the
# CLI; nothing left behind. kiln-api's logic without VMs: 74-sessions-api.sh.
. "$(dirname "$0")/lib.sh"
t_plan 47
require_image
t_require_tools swift-proxy-server memcached jq curl
t_require_built kiln kiln-api kiln-host tests/s3tool

S3_DIR=$T_TMP/s3
TOKEN=sess-token-$RANDOM$RANDOM$RANDOM
ADMIN=sess-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 10000))
URL=http://127.0.0.1:$API_PORT
BUCKET=kiln-sessions
api_pid=
h_pids=()
s3_local_start
t_mark

api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" '. + {host_lost_after_s: 3}'
api_up "$T_TMP/api.json" "$URL"

start_host() { # N: host hN on API_PORT+N
	local port=$((API_PORT + $1))
	host_config "$T_TMP/h$1.json" "127.0.0.1:$port" "h$1" ".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h$1\""
	host_start "$T_TMP/h$1.json" "h$1"
	h_pids[$1]=$host_pid
}
stop_host() { t_stop "${h_pids[$1]}"; h_pids[$1]=; }
host_state() { admin "$URL/v1/admin/hosts" | jq -r --arg h "$1" '.hosts[] | select(.id == $h) | .state'; }
live_hosts() { admin "$URL/v1/admin/hosts" | jq '[.hosts[] | select(.state == "live")] | length'; }
# req KEY METHOD PATH [curl args]: body in $T_TMP/last, status echoed
req() {
	local key=$1 m=$2 p=$3; shift 3
	curl -s -m 900 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $key" "$@" "$URL$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
expect() { # NAME STATUS GOT [jq condition]
	local name=$1 want=$2 got=$3 cond=${4:-true}
	if [ "$got" = "$want" ] && [ "$(last "$cond")" = true ]; then ok "$name"
	else not_ok "$name" "status $got (want $want), body: $(head -c 600 "$T_TMP/last")"; fi
}
ex() { req "$1" POST "/v1/sessions/$2/exec" -H 'Content-Type: application/json' --data-binary "$3"; }
state_of() { req "$1" GET "/v1/sessions/$2" > /dev/null; last .state; }
vcpus_used() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$((API_PORT + $1))/v1/capacity" | jq -r '.vcpus.used + .vcpus.idle'; }
# s3_head KEY: s3tool's status for the object (0 there, 3 absent, else an error)
s3_head() {
	S3_BUCKET=$BUCKET S3_REGION=us-east-1 S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY \
		S3_SECRET_KEY=$S3_SECRET_KEY "$ROOT/build/tests/s3tool" head "$1" > /dev/null 2>&1
	echo $?
}

start_host 1
start_host 2
# A first start creates the VM snapshot: minutes.
for _ in $(seq 3000); do [ "$(live_hosts)" = 2 ] && break; sleep 0.2; done
if [ "$(live_hosts)" = 2 ]; then ok "two kiln-hosts register with kiln-api"
else t_bail "hosts register" "$(tail -3 "$T_TMP/h1.err") $(tail -3 "$T_TMP/h2.err")"; fi

admin -X POST --data '{"id":"acme","quotas":{"max_running":1}}' "$URL/v1/admin/customers" > /dev/null
admin -X POST --data '{"id":"beta"}' "$URL/v1/admin/customers" > /dev/null
KA=$(admin -X POST "$URL/v1/admin/customers/acme/keys" | jq -r .key)
KB=$(admin -X POST "$URL/v1/admin/customers/beta/keys" | jq -r .key)

# ---- create, commands ----
st=$(req "$KA" POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"idle_timeout_s":600,"metadata":{"t":75}}')
expect "create: 201 running on one of the hosts" 201 "$st" '.state == "running" and (.host | test("^h[12]$"))'
S1=$(last .id); S1_HOST=$(last .host); N1=${S1_HOST#h}
check "its host counts the session's vCPU" [ "$(vcpus_used "$N1")" = 1 ]
st=$(ex "$KA" "$S1" '{"language":"python","code":"import os\nos.makedirs(\"/work/d\", exist_ok=True)\nopen(\"/work/d/note.txt\",\"w\").write(\"before\")\nprint(\"hi\")"}')
expect "exec python: its stdout, exit 0" 200 "$st" '.stdout == "hi\n" and .exit_code == 0'
st=$(ex "$KA" "$S1" '{"argv":["cat","note.txt"],"cwd":"/work/d"}')
expect "a later exec (another cwd) sees the file" 200 "$st" '.stdout == "before"'
st=$(ex "$KA" "$S1" '{"argv":["sh","-c","cd /tmp && pwd"]}'); ex "$KA" "$S1" '{"argv":["pwd"]}' > /dev/null
expect "a cd in one exec does not move the next (default cwd /work)" 200 "$(ex "$KA" "$S1" '{"argv":["pwd"]}')" '.stdout == "/work\n"'
st=$(ex "$KA" "$S1" '{"argv":["sh","-c","exit 3"]}')
expect "a failing command: failed, exit code 3" 200 "$st" '.state == "failed" and .exit_code == 3'
# A background process keeps a value in memory and serves it on a socket.
KV=$'import os, socket\nvalue = "v-%d" % int.from_bytes(os.urandom(4), "big")\ns = socket.socket(socket.AF_UNIX)\ns.bind("/tmp/kv.sock")\ns.listen()\nwhile True:\n    c, _ = s.accept()\n    c.sendall(value.encode())\n    c.close()\n'
printf '%s' "$KV" > "$T_TMP/kv.py"
st=$(req "$KA" PUT "/v1/sessions/$S1/files?path=/work/kv.py" --data-binary @"$T_TMP/kv.py")
expect "files PUT: 200 with path and size" 200 "$st" ".path == \"/work/kv.py\" and .size == $(stat -c %s "$T_TMP/kv.py")"
ex "$KA" "$S1" '{"argv":["sh","-c","python3 /work/kv.py > /dev/null 2>&1 & sleep 1"]}' > /dev/null
ASK='{"language":"python","code":"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect(\"/tmp/kv.sock\")\nprint(s.recv(100).decode())"}'
ex "$KA" "$S1" "$ASK" > /dev/null; KVV=$(last .stdout)
check "a background process started by one exec serves the next ($KVV)" [ "${KVV:0:2}" = v- ]
head -c 200000 /dev/urandom > "$T_TMP/blob"
req "$KA" PUT "/v1/sessions/$S1/files?path=/work/d/blob%20one.bin" --data-binary @"$T_TMP/blob" > /dev/null
req "$KA" GET "/v1/sessions/$S1/files?path=/work/d/blob%20one.bin" > /dev/null
check "files GET: a binary file byte for byte (a space in its name)" cmp -s "$T_TMP/last" "$T_TMP/blob"
st=$(req "$KA" GET "/v1/sessions/$S1/files?dir=/work/d")
expect "files ?dir=: the listing" 200 "$st" '[.entries[] | "\(.name):\(.type)"] | sort == ["blob one.bin:file", "note.txt:file"]'
st=$(req "$KA" GET "/v1/sessions/$S1/files?path=/work/missing"); expect "a missing file: 404" 404 "$st"
curl -s -N -m 120 -H "Authorization: Bearer $KA" --data-binary '{"argv":["sh","-c","echo one; sleep 1; echo two"]}' \
	"$URL/v1/sessions/$S1/exec?stream=1" > "$T_TMP/stream"
if [ "$(grep -c '^event: stdout' "$T_TMP/stream")" -ge 1 ] && \
   [ "$(grep -A1 '^event: result' "$T_TMP/stream" | sed -n 's/^data: //p' | jq -r .stdout)" = "$(printf 'one\ntwo')" ]; then
	ok "exec ?stream=1 through kiln-api: stdout events as they come, then the result"
else not_ok "exec stream" "$(head -c 600 "$T_TMP/stream")"; fi

# ---- another customer ----
bad=""
for m in "GET /v1/sessions/$S1" "POST /v1/sessions/$S1/exec" "GET /v1/sessions/$S1/files?path=/work/kv.py" \
	"POST /v1/sessions/$S1/pause" "DELETE /v1/sessions/$S1"; do
	# shellcheck disable=SC2086
	st=$(req "$KB" ${m% *} "${m#* }" --data-binary '{"argv":["true"]}')
	[ "$st" = 404 ] || bad="$bad [$m: $st]"
done
check "another customer gets 404 everywhere${bad:+:$bad}" [ -z "$bad" ]
check "... and the session is untouched" [ "$(state_of "$KA" "$S1")" = running ]

# ---- quota (max_running 1), pause ----
st=$(req "$KA" POST /v1/sessions --data-binary '{}')
expect "a second session over max_running 1: 429 quota_exceeded" 429 "$st" '.error.code == "quota_exceeded"'
st=$(req "$KA" POST "/v1/sessions/$S1/pause")
expect "pause: 200 paused, snapshot under acme/sessions/ID/" 200 "$st" \
	".state == \"paused\" and .host == null and .snapshot.prefix == \"acme/sessions/$S1/\" and .snapshot.bytes > 1000 and .snapshot.pages_changed < .snapshot.pages_total"
check "its host no longer counts it" [ "$(vcpus_used "$N1")" = 0 ]
st=$(req "$KA" GET /v1/usage)
expect "usage: the quota is free (running 0, paused_sessions 1)" 200 "$st" '.usage.running == 0 and .usage.paused_sessions == 1'
st=$(req "$KA" POST /v1/sessions --data-binary '{"idle_timeout_s":3}')
expect "now another session fits (idle_timeout_s 3)" 201 "$st" '.state == "running"'
SI=$(last .id); SI_HOST=$(last .host)
for _ in $(seq 150); do [ "$(state_of "$KA" "$SI")" = destroyed ] && break; sleep 0.2; done
expect "idle for 3 s: destroyed, end_reason idle_timeout" 200 "$(req "$KA" GET "/v1/sessions/$SI")" \
	'.state == "destroyed" and .end_reason == "idle_timeout"'
for _ in $(seq 50); do [ "$(vcpus_used "${SI_HOST#h}")" = 0 ] && break; sleep 0.2; done
check "... and its VM is gone from $SI_HOST" [ "$(vcpus_used "${SI_HOST#h}")" = 0 ]

# ---- resume on the other host: the first one is stopped ----
stop_host "$N1"
for _ in $(seq 100); do [ "$(host_state "$S1_HOST")" = lost ] && break; sleep 0.2; done
# The admin list calls a host lost by its heartbeat's age; placement goes by the
# scheduler's own view, marked on its next tick: wait for that (it logs it).
for _ in $(seq 50); do grep -qF "host $S1_HOST is lost" "$T_TMP/api.err" && break; sleep 0.2; done
check "$S1_HOST stopped: kiln-api reports it lost" [ "$(host_state "$S1_HOST")" = lost ]
st=$(req "$KA" POST "/v1/sessions/$S1/resume")
OTHER=h$((3 - N1))
expect "resume: 200 running on $OTHER" 200 "$st" ".state == \"running\" and .host == \"$OTHER\""
st=$(ex "$KA" "$S1" "$ASK")
expect "the background process and the value in its memory survived ($KVV)" 200 "$st" ".stdout == \"$KVV\n\""
ex "$KA" "$S1" '{"argv":["cat","/work/d/note.txt"]}' > /dev/null
check "the file written before the pause is there" [ "$(last .stdout)" = before ]
req "$KA" GET "/v1/sessions/$S1/files?path=/work/d/blob%20one.bin" > /dev/null
check "so is the binary file" cmp -s "$T_TMP/last" "$T_TMP/blob"

# ---- outputs ----
ex "$KA" "$S1" '{"argv":["sh","-c","mkdir -p /output/r && echo result-75 > /output/r/a.txt"]}' > /dev/null
st=$(req "$KA" POST "/v1/sessions/$S1/outputs")
expect "outputs: /output uploaded under acme/sessions/ID/outputs/" 200 "$st" \
	".outputs[0].path == \"r/a.txt\" and .outputs[0].s3_key == \"acme/sessions/$S1/outputs/r/a.txt\" and .outputs[0].url != null"
check "its presigned URL serves the file" [ "$(curl -s -m 10 "$(last '.outputs[0].url')")" = result-75 ]

# ---- the CLI ----
export KILN_API=$URL KILN_KEY=$KA
"$ROOT/build/kiln" session exec "$S1" -- sh -c 'echo from-cli; exit 5' > "$T_TMP/cli.out" 2> "$T_TMP/cli.err"
rc=$?
check "kiln session exec streams the output and exits with the command's code ($rc)" \
	[ "$rc" = 5 -a "$(cat "$T_TMP/cli.out")" = from-cli ]
check "kiln session exec --stdin FILE: the command reads the file" \
	[ "$("$ROOT/build/kiln" session exec "$S1" --stdin "$T_TMP/blob" -- wc -c 2> /dev/null | tr -d ' ')" = 200000 ]
printf 'print(sum(range(10)))\n' > "$T_TMP/c.py"
check "kiln session exec --code FILE.py" [ "$("$ROOT/build/kiln" session exec "$S1" --code "$T_TMP/c.py" 2> /dev/null)" = 45 ]
"$ROOT/build/kiln" session put "$S1" "$T_TMP/blob" cli.bin 2> /dev/null
"$ROOT/build/kiln" session get "$S1" /work/cli.bin "$T_TMP/cli.bin" 2> /dev/null
check "kiln session put / get round trip" cmp -s "$T_TMP/blob" "$T_TMP/cli.bin"
check "kiln session list shows it running on $OTHER" grep -q "^$S1 *running *$OTHER" <("$ROOT/build/kiln" session list)
unset KILN_API KILN_KEY

# ---- delete ----
req "$KA" POST "/v1/sessions/$S1/pause" > /dev/null
before=$(s3_head "acme/sessions/$S1/manifest.json")
st=$(req "$KA" DELETE "/v1/sessions/$S1")
expect "DELETE of the paused session: destroyed" 200 "$st" '.state == "destroyed" and .end_reason == "deleted"'
after=$(s3_head "acme/sessions/$S1/manifest.json")
check "its snapshot is deleted from S3 (head before: $before, after: $after; 3 = absent)" [ "$before" = 0 -a "$after" = 3 ]
st=$(req "$KA" POST "/v1/sessions/$S1/resume"); expect "a destroyed session cannot be resumed: 404 not_found" 404 "$st" '.error.code == "not_found"'
for op in "GET files?path=/etc/hostname" "PUT files?path=/tmp/x" "POST exec" "POST pause" "POST outputs"; do
	st=$(req "$KA" "${op%% *}" "/v1/sessions/$S1/${op#* }" --data-binary '{"argv":["true"]}')
	expect "$op of a destroyed session: 404 not_found" 404 "$st" '.error.code == "not_found"'
done
st=$(req "$KA" GET "/v1/sessions/$S1"); expect "... while GET still shows it destroyed" 200 "$st" '.state == "destroyed"'
st=$(req "$KA" POST /v1/sessions --data-binary '{}'); S2=$(last .id)
st=$(req "$KA" DELETE "/v1/sessions/$S2")
expect "DELETE of a running session: destroyed" 200 "$st" '.state == "destroyed"'
check "... its host holds nothing" [ "$(vcpus_used $((3 - N1)))" = 0 ]
st=$(req "$KA" GET /v1/usage); expect "usage: nothing held" 200 "$st" '.usage.running == 0 and .usage.sessions == 0 and .usage.paused_sessions == 0'

for n in 1 2; do [ -n "${h_pids[$n]:-}" ] && stop_host "$n"; done
t_nothing_left "nothing left: no QEMU, VM directories, cgroups, mounts or slot locks"
t_done
