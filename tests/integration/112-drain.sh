#!/usr/bin/env bash
# Drain over two real kiln-hosts (real VMs, a local S3): a session and a
# task (sleep) run on h1 (placed there before h2 starts); an admin drains
# h1: GET /v1/admin/hosts and /metrics say so, new sessions and tasks go to
# h2, the task on h1 runs to its end, the session is paused to S3 and its
# resume runs on h2 with its file intact, and h1 then reports drained (no
# tasks or sessions left; `kiln admin hosts` shows it, `kiln admin drain
# --deadline` sets a deadline). The drain survives a kiln-api restart;
# `kiln admin undrain` makes h1 eligible again. `kiln-host drain --config` on h2 (the host's own
# word, in its heartbeat) drains it the same way: its sessions are paused,
# new work goes to h1; an admin's undrain of it is 409, `kiln-host undrain`
# ends it.
. "$(dirname "$0")/lib.sh"
t_plan 30
require_image
t_require_tools swift-proxy-server memcached jq curl
t_require_built kiln-api kiln-host

TOKEN=drain-token-$RANDOM$RANDOM$RANDOM
ADMIN=drain-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 10000))
URL=http://127.0.0.1:$API_PORT
BUCKET=kiln-drain
api_pid=
h_pids=()
s3_local_start
t_mark

api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" '. + {host_lost_after_s: 5, quotas: {submit_rate: 1000, submit_burst: 1000}}'
api_up "$T_TMP/api.json" "$URL"

start_host() { # N: hN on API_PORT+N
	local port=$((API_PORT + $1))
	host_config "$T_TMP/h$1.json" "127.0.0.1:$port" "h$1" \
		".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h$1\" | .capacity.cpu_overcommit = 8"
	host_start "$T_TMP/h$1.json" "h$1"
	h_pids[$1]=$host_pid
}
stop_host() { t_stop "${h_pids[$1]}"; h_pids[$1]=; }
hosts_in() { admin "$URL/v1/admin/hosts" | jq "[.hosts[] | select(.state == \"$1\")] | length"; }
host_json() { admin "$URL/v1/admin/hosts" | jq -c ".hosts[] | select(.id == \"$1\")"; }
# host_is ID JQ SECONDS: until the host's entry in GET /v1/admin/hosts satisfies JQ
host_is() {
	for _ in $(seq $(($3 * 5))); do
		[ "$(host_json "$1" | jq "$2" 2> /dev/null)" = true ] && return 0
		sleep 0.2
	done
	return 1
}
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
sh_ex() { req "$1" POST "/v1/sessions/$2/exec" --data-binary "$(jq -cn --arg s "$3" '{argv: ["sh", "-c", $s]}')"; }
out() { sh_ex "$1" "$2" "$3" > /dev/null; last .stdout; }
# session_is KEY ID JQ SECONDS: until GET /v1/sessions/ID satisfies JQ
session_is() {
	for _ in $(seq $(($4 * 5))); do
		req "$1" GET "/v1/sessions/$2" > /dev/null
		[ "$(last "$3")" = true ] && return 0
		sleep 0.2
	done
	return 1
}
# task_final KEY ID SECONDS: until the task is final (its JSON in last)
task_final() {
	for _ in $(seq $(($3 * 5))); do
		req "$1" GET "/v1/tasks/$2" > /dev/null
		last '.state | test("^(succeeded|failed|timed_out|cancelled|error)$")' | grep -qx true && return 0
		sleep 0.2
	done
	return 1
}
metric() { curl -s -m 10 "$URL/metrics" | grep -F "$1 " | awk '{print $2}'; }

start_host 1
# A first start creates the VM snapshot: minutes.
for _ in $(seq 3000); do [ "$(hosts_in live)" = 1 ] && break; sleep 0.2; done
[ "$(hosts_in live)" = 1 ] || t_bail "h1 registers" "$(tail -3 "$T_TMP/h1.err")"
admin -X POST --data '{"id":"acme","quotas":{"max_running":16,"max_vcpus":16,"max_memory_mib":8192}}' \
	"$URL/v1/admin/customers" > /dev/null
KA=$(admin -X POST "$URL/v1/admin/customers/acme/keys" | jq -r .key)

# ---- on h1: a session holding a file, and a task that sleeps ----
st=$(req "$KA" POST /v1/sessions --data-binary '{"idle_timeout_s":900}')
expect "a session on h1 (the only host)" 201 "$st" '.state == "running" and .host == "h1"'
[ "$st" = 201 ] || t_bail "the session starts (everything below uses it)" "$(tail -3 "$T_TMP/h1.err")"
S=$(last .id)
sh_ex "$KA" "$S" 'printf kept > /tmp/drain.txt' > /dev/null
st=$(req "$KA" POST /v1/tasks --data-binary '{"language":"sh","code":"sleep 8; echo slept"}')
T=$(last .id)
for _ in $(seq 600); do req "$KA" GET "/v1/tasks/$T" > /dev/null; [ "$(last .state)" = running ] && break; sleep 0.2; done
check "a task (sleep 8) runs on h1" [ "$(last .state)" = running -a "$(last .host)" = h1 ]

start_host 2
for _ in $(seq 3000); do [ "$(hosts_in live)" = 2 ] && break; sleep 0.2; done
[ "$(hosts_in live)" = 2 ] || t_bail "h2 registers" "$(tail -3 "$T_TMP/h2.err")"
ok "h2 registers"

# ---- drain h1 ----
expect "drain h1: unknown host 404" 404 "$(req "$ADMIN" POST /v1/admin/hosts/nohost/drain)"
expect "drain h1: bad deadline 400" 400 "$(req "$ADMIN" POST /v1/admin/hosts/h1/drain --data '{"deadline_s":"soon"}')"
expect "POST /v1/admin/hosts/h1/drain: 200 draining" 200 "$(req "$ADMIN" POST /v1/admin/hosts/h1/drain)" \
	'.state == "draining" and .draining == true'
check "GET /v1/admin/hosts: h1 draining, with what it still holds" \
	host_is h1 '.state == "draining" and .drained == false and .tasks_left >= 1' 5
check "/metrics: kiln_api_hosts{state=\"draining\"} 1, kiln_api_host_draining{host=\"h1\"} 1" \
	[ "$(metric 'kiln_api_hosts{state="draining"}')" = 1 -a "$(metric 'kiln_api_host_draining{host="h1"}')" = 1 ]
sleep 1 # the scheduler reads the hosts every 100 ms
st=$(req "$KA" POST /v1/sessions --data-binary '{"idle_timeout_s":900}')
expect "a new session goes to h2" 201 "$st" '.host == "h2"'
N2=$(last .id)
req "$KA" POST /v1/tasks --data-binary '{"language":"sh","code":"echo new"}' > /dev/null
T2=$(last .id)
task_final "$KA" "$T2" 300
check "a new task goes to h2 and succeeds" [ "$(last .state)" = succeeded -a "$(last .host)" = h2 ]
task_final "$KA" "$T" 300
check "the task on h1 runs to its end there" [ "$(last .state)" = succeeded -a "$(last .host)" = h1 ]
check "the session on h1 is paused (to S3)" session_is "$KA" "$S" '.state == "paused"' 300
st=$(req "$KA" POST "/v1/sessions/$S/resume")
expect "its resume runs on h2 (not the host that paused it)" 200 "$st" '.state == "running" and .host == "h2"'
check "... with its file" [ "$(out "$KA" "$S" 'cat /tmp/drain.txt')" = kept ]
check "h1 reports drained: no tasks or sessions left" \
	host_is h1 '.state == "draining" and .drained == true and .tasks_left == 0 and .sessions_left == 0' 60
KILN_API=$URL KILN_ADMIN_KEY=$ADMIN "$ROOT/build/kiln" admin hosts > "$T_TMP/hosts.out" 2>&1
check "kiln admin hosts shows h1 draining and drained ($(grep '^h1 ' "$T_TMP/hosts.out" | tr -s ' '))" \
	grep -qE '^h1 +draining .* drained$' "$T_TMP/hosts.out"
KILN_API=$URL KILN_ADMIN_KEY=$ADMIN "$ROOT/build/kiln" admin drain h1 --deadline 600 > "$T_TMP/kdrain.out" 2>&1
check "kiln admin drain h1 --deadline 600: a deadline 10 minutes out" \
	jq -e '.state == "draining" and .drain_deadline_ms > (now * 1000 + 590000)' "$T_TMP/kdrain.out"

# ---- a kiln-api restart keeps it ----
t_stop "$api_pid"
api_up "$T_TMP/api.json" "$URL"
check "after a kiln-api restart h1 is still draining" host_is h1 '.state == "draining"' 10
sleep 2
st=$(req "$KA" POST /v1/sessions --data-binary '{"idle_timeout_s":900}')
expect "... and takes no session" 201 "$st" '.host == "h2"'
N3=$(last .id)

# ---- undrain h1; drain h2 with kiln-host drain ----
KILN_API=$URL KILN_ADMIN_KEY=$ADMIN "$ROOT/build/kiln" admin undrain h1 > "$T_TMP/last" 2>&1
check "kiln admin undrain h1: live" [ "$(last '.state == "live" and .draining == false')" = true ]
check "/metrics: kiln_api_hosts{state=\"draining\"} 0" [ "$(metric 'kiln_api_hosts{state="draining"}')" = 0 ]
"$KILN_HOST" drain --config "$T_TMP/h2.json" > "$T_TMP/drain.out" 2>&1
check "kiln-host drain --config h2.json: exit 0, draining" grep -q "h2: draining" "$T_TMP/drain.out"
check "h2 reports draining in its heartbeat" host_is h2 '.state == "draining" and .capacity.draining == true' 10
sleep 1
st=$(req "$KA" POST /v1/sessions --data-binary '{"idle_timeout_s":900}')
expect "undrained h1 takes a new session again" 201 "$st" '.host == "h1"'
N4=$(last .id)
expect "an admin's undrain of a host drained by kiln-host drain: 409" 409 \
	"$(req "$ADMIN" POST /v1/admin/hosts/h2/undrain)" '.error.code == "conflict"'
check "h2's sessions are paused off it" session_is "$KA" "$S" '.state == "paused"' 300
check "h2 reports drained" host_is h2 '.drained == true' 300
"$KILN_HOST" undrain --config "$T_TMP/h2.json" > "$T_TMP/undrain.out" 2>&1
check "kiln-host undrain: h2 live again" host_is h2 '.state == "live" and .draining == false' 10
"$KILN_HOST" drain --url "http://127.0.0.1:$((API_PORT + 2))" --token wrong > "$T_TMP/drain-bad.out" 2>&1
check "kiln-host drain with a wrong token fails" [ $? -ne 0 ]

for id in "$S" "$N2" "$N3" "$N4"; do req "$KA" DELETE "/v1/sessions/$id" > /dev/null; done
t_stop "$api_pid"
for n in 1 2; do [ -n "${h_pids[$n]:-}" ] && stop_host "$n"; done
t_nothing_left "nothing left: no QEMU, VM directories, cgroups, mounts or slot locks"
t_done
