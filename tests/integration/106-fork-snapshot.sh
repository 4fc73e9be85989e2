#!/usr/bin/env bash
# Named snapshots and fork through kiln-api over two real kiln-hosts (real
# VMs, a local S3): a running session holding a file in /tmp and a
# background process with a value in its memory (served on a Unix socket)
# is snapshotted and goes on; its manifest is in S3 under
# CUSTOMER/snapshots/ID/; three sessions started from the snapshot each
# see the file and the process's value, and a change in one is invisible
# in the others and in the parent; a fork to three children likewise;
# another customer's GET, DELETE and create from it are 404; max_snapshots
# 1 makes the second snapshot 429; a snapshot deleted while a session
# started from it runs is gone for the customer at once, its objects stay
# while that session pauses and resumes, and go once it is destroyed.
. "$(dirname "$0")/lib.sh"
t_plan 53
require_image
t_require_tools swift-proxy-server memcached jq curl
t_require_built kiln-api kiln-host tests/s3tool

S3_DIR=$T_TMP/s3
TOKEN=snap-token-$RANDOM$RANDOM$RANDOM
ADMIN=snap-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 10000))
URL=http://127.0.0.1:$API_PORT
BUCKET=kiln-snapshots
api_pid=
h_pids=()
s3_local_start
t_mark

api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" '. + {host_lost_after_s: 3, quotas: {submit_rate: 1000, submit_burst: 1000}}'
api_up "$T_TMP/api.json" "$URL"

start_host() { # N: host hN on API_PORT+N
	local port=$((API_PORT + $1))
	host_config "$T_TMP/h$1.json" "127.0.0.1:$port" "h$1" \
		".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h$1\" | .capacity.cpu_overcommit = 8"
	host_start "$T_TMP/h$1.json" "h$1"
	h_pids[$1]=$host_pid
}
stop_host() { t_stop "${h_pids[$1]}"; h_pids[$1]=; }
live_hosts() { admin "$URL/v1/admin/hosts" | jq '[.hosts[] | select(.state == "live")] | length'; }
req() {
	local key=$1 m=$2 p=$3; shift 3
	curl -s -m 900 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $key" \
		-H 'Content-Type: application/json' "$@" "$URL$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
expect() { # NAME STATUS GOT [jq condition]
	local name=$1 want=$2 got=$3 cond=${4:-true}
	if [ "$got" = "$want" ] && [ "$(last "$cond")" = true ]; then ok "$name"
	else not_ok "$name" "status $got (want $want), body: $(head -c 600 "$T_TMP/last")"; fi
}
ex() { req "$1" POST "/v1/sessions/$2/exec" --data-binary "$3"; }
sh_ex() { ex "$1" "$2" "$(jq -cn --arg s "$3" '{argv: ["sh", "-c", $s]}')"; }
# out KEY ID SCRIPT: the stdout of sh -c SCRIPT in the session
out() { sh_ex "$1" "$2" "$3" > /dev/null; last .stdout; }
s3_head() {
	S3_BUCKET=$BUCKET S3_REGION=us-east-1 S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY \
		S3_SECRET_KEY=$S3_SECRET_KEY "$ROOT/build/tests/s3tool" head "$1" > /dev/null 2>&1
	echo $?
}
# manifest_gone KEY SECONDS: until the object is absent (s3tool head: 3)
manifest_gone() { for _ in $(seq $(($2 * 5))); do [ "$(s3_head "$1")" = 3 ] && return 0; sleep 0.2; done; return 1; }

start_host 1
start_host 2
# A first start creates the VM snapshot: minutes.
for _ in $(seq 3000); do [ "$(live_hosts)" = 2 ] && break; sleep 0.2; done
if [ "$(live_hosts)" = 2 ]; then ok "two kiln-hosts register with kiln-api"
else t_bail "hosts register" "$(tail -3 "$T_TMP/h1.err") $(tail -3 "$T_TMP/h2.err")"; fi

admin -X POST --data '{"id":"acme","quotas":{"max_running":16,"max_vcpus":16,"max_memory_mib":8192}}' \
	"$URL/v1/admin/customers" > /dev/null
admin -X POST --data '{"id":"beta"}' "$URL/v1/admin/customers" > /dev/null
admin -X POST --data '{"id":"cee","quotas":{"max_snapshots":1}}' "$URL/v1/admin/customers" > /dev/null
KA=$(admin -X POST "$URL/v1/admin/customers/acme/keys" | jq -r .key)
KB=$(admin -X POST "$URL/v1/admin/customers/beta/keys" | jq -r .key)
KC=$(admin -X POST "$URL/v1/admin/customers/cee/keys" | jq -r .key)

# ---- the parent: a file in /tmp, a background process with a value in memory ----
st=$(req "$KA" POST /v1/sessions --data-binary '{"idle_timeout_s":900}')
expect "parent: 201 running" 201 "$st" '.state == "running"'
[ "$st" = 201 ] || t_bail "the parent starts (everything below uses it)" "$(tail -3 "$T_TMP/h1.err") $(tail -3 "$T_TMP/h2.err")"
P=$(last .id)
KV=$'import os, socket\nvalue = "v-%d" % int.from_bytes(os.urandom(4), "big")\ns = socket.socket(socket.AF_UNIX)\ns.bind("/tmp/kv.sock")\ns.listen()\nwhile True:\n    c, _ = s.accept()\n    c.sendall(value.encode())\n    c.close()\n'
printf '%s' "$KV" > "$T_TMP/kv.py"
req "$KA" PUT "/v1/sessions/$P/files?path=/tmp/kv.py" --data-binary @"$T_TMP/kv.py" > /dev/null
sh_ex "$KA" "$P" 'printf orig > /tmp/state.txt; python3 /tmp/kv.py > /dev/null 2>&1 & sleep 1' > /dev/null
ASK='{"language":"python","code":"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect(\"/tmp/kv.sock\")\nprint(s.recv(100).decode())"}'
ex "$KA" "$P" "$ASK" > /dev/null; VAL=$(last .stdout)
check "the parent's background process serves its value ($VAL)" [ "${VAL:0:2}" = v- ]

# ---- a named snapshot ----
st=$(req "$KA" POST "/v1/sessions/$P/snapshots" --data-binary '{"name":"base"}')
expect "snapshot: 201 with its id, name, session, bytes and stop_ms" 201 "$st" \
	"(.id | test(\"^snap_[0-9a-f]{24}\$\")) and .name == \"base\" and .session_id == \"$P\" and .bytes > 0
	 and (.stop_ms | type) == \"number\" and .vcpus == 1"
K=$(last .id)
check "its manifest is in S3 under acme/snapshots/$K/" [ "$(s3_head "acme/snapshots/$K/manifest.json")" = 0 ]
expect "the parent goes on running" 200 "$(req "$KA" GET "/v1/sessions/$P")" '.state == "running"'
ex "$KA" "$P" "$ASK" > /dev/null
check "... with its process and value" [ "$(last .stdout)" = "$VAL" ]
expect "GET /v1/snapshots/$K" 200 "$(req "$KA" GET "/v1/snapshots/$K")" ".id == \"$K\" and .name == \"base\""
expect "the list by name has it" 200 "$(req "$KA" GET "/v1/snapshots?name=base")" \
	"[.snapshots[].id] == [\"$K\"] and .next == null"

# ---- another customer ----
expect "another customer's GET: 404" 404 "$(req "$KB" GET "/v1/snapshots/$K")" '.error.code == "not_found"'
expect "another customer's DELETE: 404" 404 "$(req "$KB" DELETE "/v1/snapshots/$K")" '.error.code == "not_found"'
expect "another customer's create from it: 404" 404 \
	"$(req "$KB" POST /v1/sessions --data-binary "{\"snapshot\":\"$K\"}")" '.error.code == "not_found"'
expect "another customer's list: empty" 200 "$(req "$KB" GET /v1/snapshots)" '.snapshots == []'
expect "create from it with limits too: 400" 400 \
	"$(req "$KA" POST /v1/sessions --data-binary "{\"snapshot\":\"$K\",\"limits\":{\"vcpus\":1}}")" \
	'.error.code == "invalid_request"'

# ---- three sessions from it ----
C=()
for i in 1 2 3; do
	st=$(req "$KA" POST /v1/sessions --data-binary "{\"snapshot\":\"$K\",\"metadata\":{\"n\":$i}}")
	expect "session $i from the snapshot: 201 running, snapshot_id" 201 "$st" \
		".state == \"running\" and .snapshot_id == \"$K\" and .limits.vcpus == 1"
	C[i]=$(last .id)
done
for i in 1 2 3; do
	check "session $i sees the file" [ "$(out "$KA" "${C[$i]}" 'cat /tmp/state.txt')" = orig ]
	ex "$KA" "${C[$i]}" "$ASK" > /dev/null
	check "session $i: the background process and its value ($VAL)" [ "$(last .stdout)" = "$VAL" ]
done
sh_ex "$KA" "${C[1]}" 'printf changed > /tmp/state.txt' > /dev/null
check "a change in session 1 is there" [ "$(out "$KA" "${C[1]}" 'cat /tmp/state.txt')" = changed ]
check "... and not in session 2" [ "$(out "$KA" "${C[2]}" 'cat /tmp/state.txt')" = orig ]
check "... nor in the parent" [ "$(out "$KA" "$P" 'cat /tmp/state.txt')" = orig ]

# ---- fork to three ----
st=$(req "$KA" POST "/v1/sessions/$P/fork" --data-binary '{"count":3}')
expect "fork count 3: 200, three sessions, no errors, stop_ms" 200 "$st" \
	"(.sessions | length) == 3 and .errors == [] and .parent == \"$P\" and (.stop_ms | type) == \"number\"
	 and ([.sessions[].state] | unique) == [\"running\"]"
mapfile -t F < <(last '.sessions[].id')
FK=$(last '.sessions[0].snapshot_id')
for i in 0 1 2; do
	ex "$KA" "${F[$i]}" "$ASK" > /dev/null
	check "fork child $((i + 1)): the file and the process's value" \
		[ "$(last .stdout)" = "$VAL" -a "$(out "$KA" "${F[$i]:-none}" 'cat /tmp/state.txt')" = orig ]
done
sh_ex "$KA" "${F[0]}" 'printf forked > /tmp/state.txt' > /dev/null
check "a change in fork child 1 is invisible in child 2 and in the parent" \
	[ "$(out "$KA" "${F[1]}" 'cat /tmp/state.txt')" = orig -a "$(out "$KA" "$P" 'cat /tmp/state.txt')" = orig ]
expect "the fork's own snapshot is never listed" 200 "$(req "$KA" GET /v1/snapshots)" \
	"[.snapshots[].id] == [\"$K\"]"
expect "the parent still runs" 200 "$(req "$KA" GET "/v1/sessions/$P")" '.state == "running"'
for i in 0 1 2; do req "$KA" DELETE "/v1/sessions/${F[$i]}" > /dev/null; done
check "its children destroyed: the fork snapshot's objects go" manifest_gone "acme/snapshots/$FK/manifest.json" 30
for i in 1 2; do req "$KA" DELETE "/v1/sessions/${C[$i]}" > /dev/null; done

# ---- fork to ten, on the parent's host ----
PH=$(req "$KA" GET "/v1/sessions/$P" > /dev/null; last .host)
st=$(req "$KA" POST "/v1/sessions/$P/fork" --data-binary '{"count":10}')
expect "fork count 10: 200, ten sessions, no errors" 200 "$st" \
	"(.sessions | length) == 10 and .errors == [] and ([.sessions[].state] | unique) == [\"running\"]"
mapfile -t T < <(last '.sessions[].id')
hosts=$(last '[.sessions[].host] | unique | join(" ")')
good=0
for i in $(seq 0 9); do
	ex "$KA" "${T[$i]:-none}" "$ASK" > /dev/null
	[ "$(last .stdout)" = "$VAL" ] && good=$((good + 1))
done
check "... all ten answer with the parent's process and value ($good), on the parent's host ($hosts; the parent's $PH)" \
	[ "$good" = 10 -a "$hosts" = "$PH" ]
for i in $(seq 0 9); do req "$KA" DELETE "/v1/sessions/${T[$i]:-none}" > /dev/null; done

# ---- quotas ----
st=$(req "$KC" POST /v1/sessions --data-binary '{}')
expect "cee: a session" 201 "$st" '.state == "running"'
CS=$(last .id)
expect "cee: the first snapshot (max_snapshots 1)" 201 "$(req "$KC" POST "/v1/sessions/$CS/snapshots" --data-binary '{}')"
CK=$(last .id)
expect "cee: the second: 429 quota_exceeded naming max_snapshots" 429 \
	"$(req "$KC" POST "/v1/sessions/$CS/snapshots" --data-binary '{}')" \
	'.error.code == "quota_exceeded" and (.error.message | contains("max_snapshots"))'
expect "cee: usage counts it" 200 "$(req "$KC" GET /v1/usage)" '.usage.snapshots == 1 and .usage.snapshot_bytes > 0'
expect "cee: deleted, nothing uses it" 200 "$(req "$KC" DELETE "/v1/snapshots/$CK")" '.deleted == true'
check "... its objects go at once" manifest_gone "cee/snapshots/$CK/manifest.json" 30
req "$KC" DELETE "/v1/sessions/$CS" > /dev/null

# ---- delete while a session from it runs ----
expect "delete the snapshot while session 3 from it runs: 200" 200 "$(req "$KA" DELETE "/v1/snapshots/$K")" \
	".id == \"$K\" and .deleted == true"
expect "... gone for the customer (GET 404)" 404 "$(req "$KA" GET "/v1/snapshots/$K")"
expect "... no new session from it (404)" 404 "$(req "$KA" POST /v1/sessions --data-binary "{\"snapshot\":\"$K\"}")"
check "... its objects stay while session 3 uses them" [ "$(s3_head "acme/snapshots/$K/manifest.json")" = 0 ]
expect "session 3 pauses" 200 "$(req "$KA" POST "/v1/sessions/${C[3]}/pause")" '.state == "paused"'
check "... its objects still stay (a paused session needs them)" [ "$(s3_head "acme/snapshots/$K/manifest.json")" = 0 ]
expect "session 3 resumes" 200 "$(req "$KA" POST "/v1/sessions/${C[3]}/resume")" '.state == "running"'
ex "$KA" "${C[3]}" "$ASK" > /dev/null
check "... with its file and process" [ "$(last .stdout)" = "$VAL" -a "$(out "$KA" "${C[3]}" 'cat /tmp/state.txt')" = orig ]
req "$KA" DELETE "/v1/sessions/${C[3]}" > /dev/null
check "session 3 destroyed: the snapshot's objects go" manifest_gone "acme/snapshots/$K/manifest.json" 30

req "$KA" DELETE "/v1/sessions/$P" > /dev/null
expect "nothing holds the quota now" 200 "$(req "$KA" GET /v1/usage)" '.usage.running == 0 and .usage.snapshots == 0'
t_stop "$api_pid"
for n in 1 2; do [ -n "${h_pids[$n]:-}" ] && stop_host "$n"; done
t_nothing_left "nothing left: no QEMU, VM directories, cgroups, mounts or slot locks"
t_done
