#!/usr/bin/env bash
# kiln-api's sessions over two real kiln-hosts (real VMs, a local S3), with
# real failures injected: create, validation and per-session limits, exec
# (plain and ?stream=1), files, another customer's 404s, the running quota
# shared with tasks (429 naming the limit; a task waits while sessions hold
# the quota), pause (quota freed, usage shows it), resume on the other host,
# a host lost (kill -STOP: error/host_lost, resumable from its last pause;
# once it heartbeats again its stale copies are destroyed there), a
# session only a host knows (destroyed there), a host restarted (SIGKILL and
# start over the same spool: error/vm_lost), a VM killed (error/vm_error),
# idle and lifetime limits (destroy, or auto-pause per quota; a paused
# session's DELETE reaching the host that holds its pause cache), an exec
# longer than the idle limit, kiln-api restarts (SIGTERM during an exec,
# SIGKILL), the CLI, delete, nothing left behind. The happy path with
# processes kept across pause/resume and outputs: 75-sessions.sh.
. "$(dirname "$0")/lib.sh"
t_plan 115
require_image
t_require_tools swift-proxy-server memcached jq curl
t_require_built kiln-api kiln-host
KILN_API=$ROOT/build/kiln-api

S3_DIR=$T_TMP/s3
PORT=$((20000 + RANDOM % 12000))
URL=http://127.0.0.1:$PORT
ADMIN=it-admin-$RANDOM$RANDOM$RANDOM$RANDOM
TOKEN=it-cluster-$RANDOM$RANDOM
BUCKET=kiln-sessions
api_pid=''
h_pids=()
s3_local_start
t_mark

api_config "$T_TMP/api.json" "127.0.0.1:$PORT" '. + {host_lost_after_s: 3, quotas: {submit_rate: 1000, submit_burst: 1000}}'

start_api() { api_start "$T_TMP/api.json" "$URL"; }
stop_api() { [ -n "$api_pid" ] && kill "${1:--TERM}" "$api_pid" 2> /dev/null && wait "$api_pid" 2> /dev/null; api_pid=; }
start_host() { # N: host hN on PORT+N, its own spool and run directory (kept across restarts)
	local port=$((PORT + $1))
	host_config "$T_TMP/h$1.json" "127.0.0.1:$port" "h$1" ".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h$1\""
	host_start "$T_TMP/h$1.json" "h$1"
	h_pids[$1]=$host_pid
}
# wait_host N: until host N answers on its port
wait_host() { t_serving "http://127.0.0.1:$((PORT + $1))/healthz" "${h_pids[$1]}" 60; }
stop_host() { kill "${2:--TERM}" "${h_pids[$1]}" 2> /dev/null; wait "${h_pids[$1]}" 2> /dev/null; h_pids[$1]=; }
host_state() { admin "$URL/v1/admin/hosts" | jq -r --arg h "$1" '.hosts[] | select(.id == $h) | .state'; }
live_hosts() { admin "$URL/v1/admin/hosts" | jq '[.hosts[] | select(.state == "live")] | length'; }
# wait_live N SECONDS: until N hosts are live
wait_live() { for _ in $(seq $(($2 * 5))); do [ "$(live_hosts)" = "$1" ] && return 0; sleep 0.2; done; return 1; }
# on_host N METHOD PATH: the host's own API (cluster token), status echoed
on_host() { curl -s -o /dev/null -w '%{http_code}' -m 30 -X "$2" -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$((PORT + $1))$3"; }
vcpus_used() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$((PORT + $1))/v1/capacity" | jq -r '.vcpus.used + .vcpus.idle'; }
# host_qemu N: pids of QEMU processes under host N's run directory
host_qemu() { pgrep -f "qemu-system-x86_64.*$KILN_RUN_DIR/h$1/" || true; }

# req KEY METHOD PATH [curl args...]: body in $T_TMP/last.json, the status echoed.
req() {
	local key=$1 m=$2 p=$3
	shift 3
	curl -s --max-time 120 -o "$T_TMP/last.json" -D "$T_TMP/last.h" -w '%{http_code}' -X "$m" \
		-H "Authorization: Bearer $key" "$@" "$URL$p"
}
last() { jq -r "$1" "$T_TMP/last.json" 2> /dev/null; }
expect() { # NAME STATUS GOT [jq condition]
	local name=$1 want=$2 got=$3 cond=${4:-true}
	if [ "$got" = "$want" ] && [ "$(last "$cond")" = true ]; then ok "$name"
	else not_ok "$name" "status $got (want $want), body: $(head -c 600 "$T_TMP/last.json")"; fi
}
create() { req "$1" POST /v1/sessions -H 'Content-Type: application/json' --data-binary "${2:-{\}}"; }
sexec() { req "$1" POST "/v1/sessions/$2/exec" -H 'Content-Type: application/json' --data-binary "$3"; }
# sh_exec KEY ID SCRIPT: exec sh -c SCRIPT
sh_exec() { sexec "$1" "$2" "$(jq -cn --arg s "$3" '{argv: ["sh", "-c", $s]}')"; }
state_of() { req "$1" GET "/v1/sessions/$2" > /dev/null; last .state; }
# wait_state KEY ID STATE SECONDS: until the session is in STATE.
wait_state() {
	for _ in $(seq $(($4 * 5))); do [ "$(state_of "$1" "$2")" = "$3" ] && return 0; sleep 0.2; done
	return 1
}
# wait_log TEXT SECONDS: until kiln-api's stderr has TEXT
wait_log() { for _ in $(seq $(($2 * 5))); do grep -qF -- "$1" "$T_TMP/api.err" && return 0; sleep 0.2; done; return 1; }

start_api || t_bail "kiln-api starts" "$(tail -3 "$T_TMP/api.err")"
start_host 1
start_host 2
# A first start creates the VM snapshot: minutes.
wait_live 2 600
if [ "$(live_hosts)" = 2 ]; then ok "two kiln-hosts register with kiln-api"
else t_bail "hosts register" "$(tail -3 "$T_TMP/h1.err") $(tail -3 "$T_TMP/h2.err")"; fi

req "$ADMIN" POST /v1/admin/customers --data-binary '{"id":"acme","quotas":{"max_running":2}}' > /dev/null
req "$ADMIN" POST /v1/admin/customers --data-binary '{"id":"beta"}' > /dev/null
req "$ADMIN" POST /v1/admin/customers/acme/keys > /dev/null; KA=$(last .key)
req "$ADMIN" POST /v1/admin/customers/beta/keys > /dev/null; KB=$(last .key)

# ---- create ----
st=$(create "$KA" '{"image":"default","limits":{"memory_mib":256},"idle_timeout_s":300,"metadata":{"job":7}}')
expect "create: 201 running on a host, limits filled in, metadata kept" 201 "$st" \
	'(.id | test("^s_[0-9a-f]{32}$")) and .state == "running" and (.host | test("^h[12]$"))
	 and .limits == {"vcpus":1,"memory_mib":256,"output_mib":64} and .network.egress == "none"
	 and .metadata.job == 7 and .idle_timeout_s == 300 and .max_lifetime_s == 3600 and .expires_at > .created_at'
[ "$st" = 201 ] || t_bail "the first session starts (everything below uses it)" "$(tail -3 "$T_TMP/h1.err") $(tail -3 "$T_TMP/h2.err")"
S1=$(last .id); S1_HOST=$(last .host); N1=${S1_HOST#h}; N2=$((3 - N1)); OTHER=h$N2
check "the host has it (200 from $S1_HOST, its vCPU counted)" \
	[ "$(on_host "$N1" GET "/v1/sessions/$S1")" = 200 -a "$(vcpus_used "$N1")" = 1 ]
st=$(req "$KA" GET /v1/usage)
expect "usage counts the running session (running 1, 256 MiB, sessions 1)" 200 "$st" \
	'.usage.running == 1 and .usage.memory_mib == 256 and .usage.sessions == 1 and .usage.paused_sessions == 0'

for bad in '{"image":"ubuntu"}|image:' '{"limits":{"timeout_s":10}}|limits.timeout_s:' \
	'{"limits":{"memory_mib":64}}|limits.memory_mib:' '{"idle_timeout_s":0}|idle_timeout_s:' \
	'{"max_lifetime_s":999999999}|max_lifetime_s:' '{"colour":"red"}|colour:' '{"metadata":[1]}|metadata:' \
	'[1,2]|body:' '{"limits":|invalid JSON'; do
	st=$(create "$KA" "${bad%%|*}")
	expect "create ${bad%%|*}: 400 naming ${bad#*|}" 400 "$st" ".error.message | contains(\"${bad#*|}\")"
done
st=$(create "$KA" '{"network":{"egress":"allow","allow":["203.0.113.0/24:443"]}}')
expect "egress without allow_egress: 400 egress_not_allowed" 400 "$st" '.error.code == "egress_not_allowed"'
st=$(create "$KA" '{"limits":{"memory_mib":8192}}')
expect "memory over the per-task quota: 400 over_quota" 400 "$st" '.error.code == "over_quota"'
st=$(create "$ADMIN" '{}'); expect "an admin key cannot create sessions: 403" 403 "$st"

# ---- exec, files ----
st=$(sh_exec "$KA" "$S1" 'printf "kept across execs" > /work/state.txt')
expect "exec: 200 with the result" 200 "$st" '.state == "succeeded" and .exit_code == 0'
st=$(sexec "$KA" "$S1" '{"argv":["cat","/work/state.txt"],"cwd":"/tmp"}')
expect "a later exec sees the file (another cwd)" 200 "$st" '.stdout == "kept across execs"'
st=$(sh_exec "$KA" "$S1" 'exit 3')
expect "a failing command: its exit code" 200 "$st" '.state == "failed" and .exit_code == 3'
st=$(sexec "$KA" "$S1" '{"argv":["pwd"]}')
expect "exec without timeout_s gets the default (30) sent: the host accepts it" 200 "$st" '.stdout == "/work\n"'
st=$(sexec "$KA" "$S1" '{"argv":[]}'); expect "exec with an empty argv: 400 invalid_spec naming argv" 400 "$st" \
	'.error.code == "invalid_spec" and (.error.message | startswith("argv"))'
st=$(sexec "$KA" "$S1" '{"argv":["pwd"],"timeout_s":7200}')
expect "exec timeout_s over the quota: 400 over_quota" 400 "$st" '.error.code == "over_quota"'
st=$(sexec "$KA" "$S1" '{"argv":["pwd"],"stdin":"x"}'); expect "exec with an unknown field: 400" 400 "$st"
st=$(sexec "$KA" "$S1" '{"argv":["cat"],"stdin_b64":"aGVsbG8gc3RkaW4="}')
expect "exec with stdin_b64: the command reads it" 200 "$st" '.stdout == "hello stdin"'
st=$(sexec "$KA" "$S1" '{"argv":["cat"],"stdin_b64":"not base64!"}')
expect "exec with a malformed stdin_b64: 400 naming it" 400 "$st" '.error.message | startswith("stdin_b64")'
curl -s -N --max-time 60 -H "Authorization: Bearer $KA" -H 'Content-Type: application/json' \
	--data-binary '{"argv":["echo","streamed","line"]}' "$URL/v1/sessions/$S1/exec?stream=1" > "$T_TMP/stream.txt"
if grep -q '^event: stdout' "$T_TMP/stream.txt" && grep -q 'streamed line' "$T_TMP/stream.txt" \
   && grep -A1 '^event: result' "$T_TMP/stream.txt" | sed -n 's/^data: //p' | jq -e '.exit_code == 0' > /dev/null; then
	ok "exec ?stream=1: stdout events, then the result event"
else not_ok "exec stream" "$(head -c 600 "$T_TMP/stream.txt")"; fi

printf 'line one\nline two\n' > "$T_TMP/up.txt"
st=$(req "$KA" PUT "/v1/sessions/$S1/files?path=/work/dir%20x/up.txt" --data-binary @"$T_TMP/up.txt")
expect "files PUT: 200 with the path and size" 200 "$st" '.path == "/work/dir x/up.txt" and .size == 18'
st=$(req "$KA" GET "/v1/sessions/$S1/files?path=/work/dir%20x/up.txt")
check "files GET: the same bytes back ($st)" cmp -s "$T_TMP/last.json" "$T_TMP/up.txt"
st=$(req "$KA" GET "/v1/sessions/$S1/files?dir=/work")
expect "files ?dir=: the listing" 200 "$st" \
	'([.entries[] | .name] | sort) == ["dir x", "state.txt"] and (.entries[] | select(.name == "state.txt") | .type == "file" and .size == 17)'
st=$(req "$KA" GET "/v1/sessions/$S1/files?path=/work/nope")
expect "a missing file: 404 not_found (the session stays running)" 404 "$st" '.error.code == "not_found"'
check "... still running" [ "$(state_of "$KA" "$S1")" = running ]
st=$(req "$KA" GET "/v1/sessions/$S1/files?path=relative.txt"); expect "a relative path: 400" 400 "$st"
st=$(req "$KA" GET "/v1/sessions/$S1/files"); expect "neither path nor dir: 400" 400 "$st"

# ---- another customer ----
bad=""
for m in "GET /v1/sessions/$S1" "DELETE /v1/sessions/$S1" "POST /v1/sessions/$S1/exec" "POST /v1/sessions/$S1/pause" \
	"POST /v1/sessions/$S1/resume" "POST /v1/sessions/$S1/outputs" "GET /v1/sessions/$S1/files?dir=/work" \
	"PUT /v1/sessions/$S1/files?path=/work/x"; do
	# shellcheck disable=SC2086
	st=$(req "$KB" ${m% *} "${m#* }" --data-binary '{"argv":["pwd"]}')
	[ "$st" = 404 ] && [ "$(last .error.code)" = not_found ] || bad="$bad [$m: $st]"
done
check "another customer gets 404 on every session endpoint${bad:+:$bad}" [ -z "$bad" ]
check "... and the session is untouched" [ "$(state_of "$KA" "$S1")" = running ]
st=$(req "$KB" GET /v1/sessions); expect "... and an empty list" 200 "$st" '.sessions == []'
st=$(req "$KA" GET /v1/sessions); expect "the owner's list has it" 200 "$st" ".sessions[0].id == \"$S1\""
st=$(req "$ADMIN" GET /v1/sessions); expect "an admin lists every customer's" 200 "$st" ".sessions | map(.id) | index(\"$S1\") != null"
st=$(req "$ADMIN" POST "/v1/sessions/$S1/exec" --data-binary '{"argv":["pwd"]}')
expect "an admin cannot exec in a customer's session: 403" 403 "$st"

# ---- the running quota, shared with tasks (max_running 2) ----
st=$(create "$KA" '{"idle_timeout_s":300}'); S2=$(last .id); S2_HOST=$(last .host)
check "a second session fits max_running 2 ($st, on $S2_HOST)" [ "$st" = 201 ]
st=$(create "$KA" '{}')
expect "a third: 429 quota_exceeded naming max_running" 429 "$st" \
	'.error.code == "quota_exceeded" and (.error.message | startswith("max_running: 2 tasks and sessions"))'
st=$(req "$KA" POST /v1/tasks -H 'Content-Type: application/json' --data-binary '{"argv":["true"]}'); T1=$(last .id)
# Nothing to wait for: the check is that it does not leave queued.
sleep 1
check "a task submitted meanwhile waits queued: sessions hold the quota" \
	[ "$(req "$KA" GET "/v1/tasks/$T1" > /dev/null; last .state)" = queued ]
req "$KA" POST "/v1/tasks/$T1/cancel" > /dev/null

# ---- pause, resume on the other host ----
st=$(req "$KA" POST "/v1/sessions/$S1/pause")
expect "pause: 200 paused, no host, the snapshot under CUSTOMER/sessions/ID/, naming the host that paused it" 200 "$st" \
	".state == \"paused\" and .host == null and .snapshot.prefix == \"acme/sessions/$S1/\" and .end_reason == \"paused\" and .snapshot.bytes > 1000 and .snapshot.pages_changed < .snapshot.pages_total and .snapshot.host_id == \"$S1_HOST\""
check "its host no longer has it (404)" [ "$(on_host "$N1" GET "/v1/sessions/$S1")" = 404 ]
st=$(req "$KA" GET /v1/usage)
expect "usage: the paused session holds no quota (running 1, paused_sessions 1)" 200 "$st" \
	'.usage.running == 1 and .usage.sessions == 1 and .usage.paused_sessions == 1 and .usage.memory_mib == 256'
check "the freed slot takes a new session" [ "$(create "$KA" '{}')" = 201 ]
S3=$(last .id)
st=$(req "$KA" POST "/v1/sessions/$S1/resume")
expect "resume while the quota is full: 429 quota_exceeded" 429 "$st" '.error.code == "quota_exceeded"'
check "... and it stays paused" [ "$(state_of "$KA" "$S1")" = paused ]
req "$KA" DELETE "/v1/sessions/$S3" > /dev/null
st=$(sexec "$KA" "$S1" '{"argv":["pwd"]}'); expect "exec in a paused session: 409 not_running" 409 "$st" '.error.code == "not_running"'
st=$(req "$KA" POST "/v1/sessions/$S1/pause"); expect "pausing it again: 409" 409 "$st"

# Force the other host: stop (SIGSTOP) the one it ran on; its heartbeats stop.
kill -STOP "${h_pids[$N1]}"
for _ in $(seq 50); do [ "$(host_state "$S1_HOST")" = lost ] && break; sleep 0.2; done
# The admin list calls a host lost by its heartbeat's age; placement goes by the
# scheduler's own view, marked on its next tick: wait for that (it logs it).
for _ in $(seq 50); do grep -qF "host $S1_HOST is lost" "$T_TMP/api.err" && break; sleep 0.2; done
check "$S1_HOST stopped (SIGSTOP): kiln-api reports it lost" [ "$(host_state "$S1_HOST")" = lost ]
st=$(req "$KA" POST "/v1/sessions/$S1/resume")
expect "resume: 200 running on the other host ($OTHER), lifetime counted from now" 200 "$st" \
	".state == \"running\" and .host == \"$OTHER\" and .started_at > .created_at and .end_reason == null"
st=$(sexec "$KA" "$S1" '{"argv":["cat","/work/state.txt"]}')
expect "what it wrote before the pause is there" 200 "$st" '.stdout == "kept across execs"'
req "$KA" GET "/v1/sessions/$S1/files?path=/work/dir%20x/up.txt" > /dev/null
check "so is the uploaded file" cmp -s "$T_TMP/last.json" "$T_TMP/up.txt"

# ---- the stopped host: its never-paused session S2 (if there) ends as error/host_lost ----
# s2_lost: S2's host is stopped: S2 is error/host_lost and cannot be resumed.
s2_lost() {
	wait_state "$KA" "$S2" error 15
	expect "a never-paused session on the lost host $S2_HOST: error/host_lost" 200 "$(req "$KA" GET "/v1/sessions/$S2")" \
		'.state == "error" and .end_reason == "host_lost" and .snapshot == null'
	st=$(req "$KA" POST "/v1/sessions/$S2/resume")
	expect "... not resumable (409 not_paused)" 409 "$st" '.error.code == "not_paused"'
}
# s2_gone N: host N is back: reconciliation destroys its copy of S2.
s2_gone() {
	wait_log "host h$1 still had session $S2" 25
	check "once h$1 is back, reconciliation destroys its copy of the lost session there ($(on_host "$1" GET "/v1/sessions/$S2"))" \
		[ "$(on_host "$1" GET "/v1/sessions/$S2")" = 404 ]
}
if [ "$S2_HOST" = "$S1_HOST" ]; then s2_lost
else check "a session on the other host ($S2_HOST) is not affected by the loss of $S1_HOST" [ "$(state_of "$KA" "$S2")" = running ]; fi
kill -CONT "${h_pids[$N1]}"
wait_live 2 20
check "$S1_HOST continued (SIGCONT): live again" [ "$(host_state "$S1_HOST")" = live ]
[ "$S2_HOST" = "$S1_HOST" ] && s2_gone "$N1"

# ---- a session only a host knows is destroyed there ----
curl -s -m 60 -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' -X POST "http://127.0.0.1:$((PORT + N1))/v1/sessions" \
	--data-binary '{"id":"s_orphan","customer":"acme","spec":{}}' > "$T_TMP/orphan.json"
o_before=$(on_host "$N1" GET /v1/sessions/s_orphan)
wait_log "still had session s_orphan" 25
check "reconciliation destroys a session its host has and the store does not (host: $o_before, then $(on_host "$N1" GET /v1/sessions/s_orphan))" \
	[ "$o_before" = 200 -a "$(on_host "$N1" GET /v1/sessions/s_orphan)" = 404 ]

# A session lost with its host after a pause resumes from that pause.
st=$(sh_exec "$KA" "$S1" 'echo written after the last pause > /work/after.txt')
expect "a file written after the last pause, on $OTHER" 200 "$st" '.exit_code == 0'
kill -STOP "${h_pids[$N2]}"
wait_state "$KA" "$S1" error 15
[ "$S2_HOST" = "$OTHER" ] && s2_lost
expect "its host lost: error/host_lost, snapshot kept" 200 "$(req "$KA" GET "/v1/sessions/$S1")" \
	'.state == "error" and .end_reason == "host_lost" and .snapshot != null'
st=$(req "$KA" POST "/v1/sessions/$S1/resume")
expect "... and it resumes from its last pause (on $S1_HOST)" 200 "$st" ".state == \"running\" and .host == \"$S1_HOST\""
st=$(sexec "$KA" "$S1" '{"argv":["cat","/work/after.txt"]}')
expect "what came after the pause is gone, what came before is there" 200 "$st" '.exit_code == 1'
st=$(sexec "$KA" "$S1" '{"argv":["cat","/work/state.txt"]}'); expect "... (state.txt)" 200 "$st" '.stdout == "kept across execs"'
kill -CONT "${h_pids[$N2]}"
wait_live 2 20
wait_log "host $OTHER still had session $S1" 25
check "the stale copy on $OTHER is destroyed there once it is back (host: $(on_host "$N2" GET "/v1/sessions/$S1"))" \
	[ "$(on_host "$N2" GET "/v1/sessions/$S1")" = 404 ]
[ "$S2_HOST" = "$OTHER" ] && s2_gone "$N2"
st=$(sexec "$KA" "$S1" '{"argv":["cat","/work/state.txt"]}')
expect "... while the session runs on, on $S1_HOST" 200 "$st" '.stdout == "kept across execs"'

# ---- a host that restarted lost the VM: error/vm_lost ----
stop_host "$N1" -KILL
start_host "$N1"
wait_host "$N1"
wait_live 2 20
st=$(sexec "$KA" "$S1" '{"argv":["pwd"]}')
expect "exec after its host restarted (SIGKILL, same spool): 409 not_running" 409 "$st" '.error.code == "not_running"'
check "... state error/vm_lost" [ "$(state_of "$KA" "$S1")/$(last .end_reason)" = error/vm_lost ]
check "... and the restarted host runs no VM ($(host_qemu "$N1" | wc -l) QEMU)" [ -z "$(host_qemu "$N1")" ]

# ---- a VM killed under a session: error/vm_error ----
st=$(create "$KA" '{"idle_timeout_s":300}'); SV=$(last .id); NV=$(last .host); NV=${NV#h}
q=$(host_qemu "$NV")
check "the session's QEMU is found ($q on h$NV)" [ -n "$q" -a "$(echo "$q" | wc -l)" = 1 ]
# shellcheck disable=SC2086 # one pid per line
[ -n "$q" ] && kill -KILL $q
st=$(sexec "$KA" "$SV" '{"argv":["pwd"]}')
check "exec after its QEMU was killed: not a success ($st: $(head -c 200 "$T_TMP/last.json"))" \
	[ "$st" != 200 -o "$(last .end_reason)" = vm_error ]
check "... the session is error/vm_error" [ "$(state_of "$KA" "$SV")/$(last .end_reason)" = error/vm_error ]
check "... and its host no longer counts it" [ "$(vcpus_used "$NV")" = 0 ]

# ---- idle and lifetime limits ----
st=$(create "$KA" '{"idle_timeout_s":2}'); SI=$(last .id)
sexec "$KA" "$SI" '{"argv":["sleep","3.5"]}' > /dev/null
check "an exec longer than the idle limit is activity: still running after it" [ "$(state_of "$KA" "$SI")" = running ]
wait_state "$KA" "$SI" destroyed 10
expect "idle for longer than idle_timeout_s: destroyed, end_reason idle_timeout" 200 "$(req "$KA" GET "/v1/sessions/$SI")" \
	'.state == "destroyed" and .end_reason == "idle_timeout"'
st=$(create "$KA" '{"max_lifetime_s":3}'); SL=$(last .id)
for _ in 1 2 3 4 5 6; do sexec "$KA" "$SL" '{"argv":["pwd"]}' > /dev/null; [ "$(last .stdout)" = "/work" ] || break; sleep 0.5; done
wait_state "$KA" "$SL" destroyed 10
expect "busy but past max_lifetime_s: destroyed, end_reason max_lifetime" 200 "$(req "$KA" GET "/v1/sessions/$SL")" \
	'.state == "destroyed" and .end_reason == "max_lifetime"'
req "$ADMIN" PUT /v1/admin/customers/acme/quotas --data-binary '{"session_auto_pause":true}' > /dev/null
st=$(create "$KA" '{"idle_timeout_s":2}'); SP=$(last .id)
sh_exec "$KA" "$SP" 'printf v > /work/k' > /dev/null
wait_state "$KA" "$SP" paused 15
expect "with session_auto_pause: paused instead, end_reason idle_timeout" 200 "$(req "$KA" GET "/v1/sessions/$SP")" \
	'.state == "paused" and .end_reason == "idle_timeout" and .snapshot != null'
st=$(req "$KA" POST "/v1/sessions/$SP/resume"); sexec "$KA" "$SP" '{"argv":["cat","/work/k"]}' > /dev/null
check "... and resumes with its files" [ "$(last .stdout)" = v ]
# Paused again: the pausing host keeps its chunks in its pause cache; a
# DELETE through kiln-api goes to that host, and they go with the snapshot.
req "$KA" POST "/v1/sessions/$SP/pause" > /dev/null
HP=$(last .snapshot.host_id)
pc=$T_TMP/spool-$HP/pause-cache/acme/$SP
npc=$(ls "$pc" 2> /dev/null | wc -l)
st=$(req "$KA" DELETE "/v1/sessions/$SP")
check "DELETE of a session paused on $HP: its $npc pause-cache copies there go at once (the destroy goes to that host)" \
	[ "$st" = 200 -a "$npc" -gt 0 -a ! -e "$pc" ]
req "$ADMIN" PUT /v1/admin/customers/acme/quotas --data-binary '{"session_auto_pause":false}' > /dev/null

# ---- kiln-api restarts: sessions survive and keep working ----
st=$(create "$KA" '{"idle_timeout_s":300}'); SR=$(last .id)
sh_exec "$KA" "$SR" 'printf v > /work/k' > /dev/null
t_bg sexec "$KA" "$SR" '{"argv":["sleep","8"]}' > /dev/null
slow=$T_BG_PID
sleep 0.5
t0=$(date +%s%N)
stop_api
t1=$(date +%s%N)
wait "$slow"
check "SIGTERM during an 8 s exec: kiln-api exits in $(( (t1 - t0) / 1000000 )) ms, not after the exec" \
	[ $(( (t1 - t0) / 1000000 )) -lt 5000 ]
grep -q "session requests still in flight" "$T_TMP/api.err" || echo "# (the exec had already ended?)"
start_api
for _ in $(seq 150); do [ "$(sexec "$KA" "$SR" '{"argv":["pwd"]}')" = 200 ] && break; sleep 0.1; done
st=$(sexec "$KA" "$SR" '{"argv":["cat","/work/k"]}')
expect "after a kiln-api restart the running session answers" 200 "$st" '.stdout == "v"'
stop_api -KILL
start_api
st=$(sexec "$KA" "$SR" '{"argv":["cat","/work/k"]}')
expect "... and after kiln-api was SIGKILLed and started again" 200 "$st" '.stdout == "v" and .exit_code == 0'

# ---- the CLI: kiln session ... ----
KILN=$ROOT/build/kiln
if [ -x "$KILN" ]; then
	export KILN_API=$URL KILN_KEY=$KA
	cs=$("$KILN" session create --memory 256 --idle 120 2> "$T_TMP/cli.err")
	check "kiln session create prints the id ($cs) and where it runs" \
		eval '[ "$(state_of "$KA" "$cs")" = running ] && grep -q "session $cs running on h" "$T_TMP/cli.err"'
	"$KILN" session exec "$cs" -- echo hello cli > "$T_TMP/cli.out" 2> "$T_TMP/cli.err"
	rc=$?
	check "kiln session exec -- ARGV streams stdout, exit 0 ($rc)" [ "$rc" = 0 -a "$(cat "$T_TMP/cli.out")" = "hello cli" ]
	"$KILN" session exec "$cs" -- sh -c 'exit 4' > /dev/null 2> "$T_TMP/cli.err"
	rc=$?
	check "... and exits with the command's exit code ($rc)" [ "$rc" = 4 ]
	check "kiln session exec --stdin -: the command reads kiln's stdin" \
		[ "$(printf 'piped in' | "$KILN" session exec "$cs" --stdin - -- cat 2> /dev/null)" = "piped in" ]
	echo "payload $RANDOM" > "$T_TMP/p.txt"
	"$KILN" session put "$cs" "$T_TMP/p.txt" in/p.txt 2> "$T_TMP/cli.err"
	rc=$?
	"$KILN" session get "$cs" /work/in/p.txt "$T_TMP/back.txt" 2>> "$T_TMP/cli.err"
	check "kiln session put (relative: under /work) then get: the same bytes ($rc)" cmp -s "$T_TMP/p.txt" "$T_TMP/back.txt"
	check "kiln session get GUEST -: to stdout" [ "$("$KILN" session get "$cs" in/p.txt - 2> /dev/null)" = "$(cat "$T_TMP/p.txt")" ]
	"$KILN" session get "$cs" /work/none "$T_TMP/none.txt" 2> "$T_TMP/cli.err"
	rc=$?
	check "kiln session get of a missing file: exit 1, the API's message, no local file ($rc)" \
		eval '[ "$rc" = 1 -a ! -e "$T_TMP/none.txt" ] && grep -q "404 not_found" "$T_TMP/cli.err"'
	check "kiln session ls" grep -q "^dir .* in$" <("$KILN" session ls "$cs" 2>&1)
	mkdir -p "$T_TMP/dirup/sub"; echo one > "$T_TMP/dirup/one.txt"; head -c 5000 /dev/urandom > "$T_TMP/dirup/sub/r.bin"
	"$KILN" session put "$cs" "$T_TMP/dirup" tree 2> "$T_TMP/cli.err"
	rc=$?
	(cd "$T_TMP" && "$KILN" session get "$cs" tree/ dirback 2>> "$T_TMP/cli.err")
	check "kiln session put DIR / get DIR/: a whole directory up and back as tar ($rc)" diff -r "$T_TMP/dirup" "$T_TMP/dirback"
	out=$(printf 'echo piped-$((1+1))\nexit 6\n' | "$KILN" shell "$cs" 2> "$T_TMP/cli.err")
	rc=$?
	# The output is the terminal's: the echo of the lines typed, bash's
	# prompts and its bracketed-paste switches (ESC [ ? 2004 l/h), CR LF.
	if [ "$rc" = 6 ] && sed 's/\x1b\[[0-9;?]*[A-Za-z]//g' <<< "$out" | tr -d '\r' | grep -qx piped-2; then
		ok "kiln shell with stdin not a terminal: lines typed in, the shell's exit code ($rc)"
	else not_ok "kiln shell with stdin not a terminal (exit $rc, want 6; a line piped-2)" "$(printf '%q' "$out" | head -c 600)"; fi
	drv=$(timeout 300 python3 "$ROOT/tests/integration/shell_drive.py" "$KILN" "$cs")
	echo "# shell_drive: $(jq -c 'del(.tail)' <<< "$drv" 2> /dev/null || echo "$drv")"
	saw() { jq -e "$1" <<< "$drv" > /dev/null; }
	check "kiln shell on a terminal: bash -l prompt, the terminal's size (33x101), a tty" \
		saw '.prompt and .size and .tty and .math'
	check "... a window resize reaches the command (40x120)" saw '.resized'
	check "... ^C interrupts the remote command, not kiln" saw '.ctrl_c and .kiln_alive_after_ctrl_c'
	check "... exit 3 ends kiln with 3, the local terminal restored" saw '.rc == 3 and .termios_restored'
	check "after kiln shell the session takes commands again" [ "$("$KILN" session exec "$cs" -- echo free 2> /dev/null)" = free ]
	check "kiln session list shows it running" grep -q "^$cs *running" <("$KILN" session list 2>&1)
	check "kiln session pause" [ "$("$KILN" session pause "$cs" 2>&1)" = "$cs paused" ]
	check "kiln session resume" grep -q "^$cs running on h" <("$KILN" session resume "$cs" 2>&1)
	check "... with its files" [ "$("$KILN" session get "$cs" in/p.txt - 2> /dev/null)" = "$(cat "$T_TMP/p.txt")" ]
	check "kiln session rm" [ "$("$KILN" session rm "$cs" 2>&1)" = "$cs destroyed" ]
	check "kiln session list --all shows it destroyed, the default list does not" \
		eval 'grep -q "^$cs *destroyed" <("$KILN" session list --all 2>&1) && ! "$KILN" session list 2>&1 | grep -q "^$cs"'
	"$KILN" session exec "$cs" -- true > /dev/null 2> "$T_TMP/cli.err"
	rc=$?
	check "kiln session exec in a destroyed session: exit 1 with the API's 404 not_found ($rc)" \
		eval '[ "$rc" = 1 ] && grep -q "404 not_found" "$T_TMP/cli.err"'
	bad=""
	for args in "session" "session frob" "session exec $cs" "session exec $cs --" "session exec $cs --code x.rb" \
		"session put $cs onlyone" "session get $cs" "session create --memory lots" "session pause" "shell" \
		"shell $cs --" "shell $cs --timeout x" "shell bad/id"; do
		# shellcheck disable=SC2086
		"$KILN" $args > /dev/null 2>&1
		rc=$?
		[ "$rc" = 2 ] || bad="$bad [kiln $args: $rc]"
	done
	check "kiln session: bad usage exits 2${bad:+:$bad}" [ -z "$bad" ]
	check "kiln shell --help describes the terminal" grep -q "pseudo-terminal" <("$KILN" shell --help)
	unset KILN_API KILN_KEY
else
	skip "kiln session commands" "build/kiln missing: run make"
fi

# ---- delete ----
st=$(req "$KA" DELETE "/v1/sessions/$SR"); expect "DELETE: 200 destroyed" 200 "$st" '.state == "destroyed" and .end_reason == "deleted"'
st=$(req "$KA" DELETE "/v1/sessions/$SR"); expect "DELETE again: 200, still destroyed" 200 "$st" '.state == "destroyed"'
code=$(on_host 1 GET "/v1/sessions/$SR") code2=$(on_host 2 GET "/v1/sessions/$SR")
check "no host has it any more ($code $code2)" [ "$code" = 404 -a "$code2" = 404 ]
st=$(req "$KA" GET /v1/sessions); expect "the list leaves destroyed sessions out" 200 "$st" ".sessions | map(.id) | index(\"$SR\") == null"
st=$(req "$KA" GET "/v1/sessions?state=destroyed"); expect "... unless asked (?state=destroyed)" 200 "$st" ".sessions | map(.id) | index(\"$SR\") != null"
st=$(req "$KA" GET /v1/usage); expect "nothing holds the quota now" 200 "$st" '.usage.running == 0 and .usage.sessions == 0'
check "no host counts a vCPU ($(vcpus_used 1) $(vcpus_used 2))" [ "$(vcpus_used 1)" = 0 -a "$(vcpus_used 2)" = 0 ]

stop_api
for n in 1 2; do [ -n "${h_pids[$n]:-}" ] && stop_host "$n"; done
t_nothing_left "nothing left: no QEMU, VM directories, cgroups, mounts or slot locks"
t_done
