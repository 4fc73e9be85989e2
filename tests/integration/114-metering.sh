#!/usr/bin/env bash
# Metering over a real kiln-host (real VMs, a local S3): two customers run
# tasks and a session; GET /v1/usage/history then counts each one's tasks
# and sessions started, and its vCPU-seconds and MiB-seconds match what the
# tasks' timings and the session's timestamps say. A kiln-api restart keeps
# the totals as they were; a session running across the restart and a task
# after it are added once; the admin's view and the CSV agree; bad
# parameters are 400s.
. "$(dirname "$0")/lib.sh"
t_plan 15
require_image
t_require_tools swift-proxy-server memcached jq curl awk
t_require_built kiln-api kiln-host

TOKEN=meter-token-$RANDOM$RANDOM$RANDOM
ADMIN=meter-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 10000))
URL=http://127.0.0.1:$API_PORT
BUCKET=kiln-meter
api_pid=
s3_local_start
t_mark

api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" '. + {quotas: {submit_rate: 1000, submit_burst: 1000}}'
api_up "$T_TMP/api.json" "$URL"
host_config "$T_TMP/h1.json" "127.0.0.1:$((API_PORT + 1))" h1 \
	".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h1\" | .capacity.cpu_overcommit = 8"
host_start "$T_TMP/h1.json" h1
h_pid=$host_pid
API=$URL
# A first start creates the VM snapshot: minutes.
wait_live 1 600 || t_bail "h1 registers" "$(tail -3 "$T_TMP/h1.err")"
FROM=$(( $(date +%s) * 1000 - 60000 ))

req() {
	local key=$1 m=$2 p=$3; shift 3
	curl -s -m 900 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $key" \
		-H 'Content-Type: application/json' "$@" "$URL$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
lastc() { jq -c "$1" "$T_TMP/last" 2> /dev/null; }
# flows: the history's totals without the sampled levels
flows() { lastc '.totals | del(.snapshot_bytes_max, .volume_mib_max)'; }
# destroy KEY ID: DELETE the session and wait until it is destroyed
destroy() {
	req "$1" DELETE "/v1/sessions/$2" > /dev/null
	for _ in $(seq 300); do
		req "$1" GET "/v1/sessions/$2" > /dev/null
		[ "$(last .state)" = destroyed ] && return 0
		sleep 0.2
	done
	t_bail "session $2 is destroyed" "$(head -c 300 "$T_TMP/last")"
}
task_final() { # KEY ID SECONDS: until the task is final (its JSON in last)
	for _ in $(seq $(($3 * 5))); do
		req "$1" GET "/v1/tasks/$2" > /dev/null
		last '.state | test("^(succeeded|failed|timed_out|cancelled|error)$")' | grep -qx true && return 0
		sleep 0.2
	done
	return 1
}
# expected KEY: this customer's [lo, hi] vCPU-ms from its ended tasks'
# timings (the metered interval runs from starting, between scheduled and
# running, to the end) plus its ended sessions' started_at..ended_at, and
# its MiB-ms the same way, into LO HI MLO MHI; its counts into NT NS.
declare -A T_OF S_OF
expected() {
	LO=0 HI=0 MLO=0 MHI=0 NT=0 NS=0
	for t in ${T_OF[$1]}; do
		req "$1" GET "/v1/tasks/$t" > /dev/null
		read -r v m s r u < <(last '[.limits.vcpus, .limits.memory_mib, .timings.start_ms // 0, .timings.run_ms // 0,
			.timings.upload_ms // 0] | @tsv')
		LO=$((LO + v * (r + u))); HI=$((HI + v * (s + r + u)))
		MLO=$((MLO + m * (r + u))); MHI=$((MHI + m * (s + r + u))); NT=$((NT + 1))
	done
	for id in ${S_OF[$1]}; do
		req "$1" GET "/v1/sessions/$id" > /dev/null
		read -r v m d < <(last '[.limits.vcpus, .limits.memory_mib, .ended_at - .started_at] | @tsv')
		LO=$((LO + v * d)); HI=$((HI + v * d)); MLO=$((MLO + m * d)); MHI=$((MHI + m * d)); NS=$((NS + 1))
	done
}
# hist KEY: GET /v1/usage/history from FROM to now by the minute into last
hist() { req "$1" GET "/v1/usage/history?from=$FROM&step=1m" > /dev/null; }
# matches KEY NAME [N]: the history's totals against expected's (N more
# sessions started that are still running: counted, their time not yet)
matches() {
	local vms mms
	expected "$1"
	NS=$((NS + ${3:-0}))
	hist "$1"
	vms=$(last '(.totals.vcpu_seconds * 1000 | round)'); mms=$(last '(.totals.mib_seconds * 1000 | round)')
	if [ "$(last .totals.tasks_started)" = "$NT" ] && [ "$(last .totals.sessions_started)" = "$NS" ] &&
		[ "$vms" -ge $((LO - 5)) ] && [ "$vms" -le $((HI + 5)) ] &&
		[ "$mms" -ge $((MLO - 1300)) ] && [ "$mms" -le $((MHI + 1300)) ]; then
		ok "$2"
	else
		not_ok "$2" "want tasks $NT sessions $NS vcpu_ms $LO..$HI mib_ms $MLO..$MHI; got $(lastc .totals)"
	fi
}
run_task() { # KEY CODE: submit, wait for its end, remember it
	req "$1" POST /v1/tasks --data-binary "$(jq -cn --arg c "$2" '{language: "sh", code: $c}')" > /dev/null
	local id; id=$(last .id)
	task_final "$1" "$id" 600 || t_bail "task $id ends" "$(tail -3 "$T_TMP/h1.err")"
	T_OF[$1]+=" $id"
}

KA=$(new_customer acme '{"quotas":{"max_running":8,"max_vcpus":8,"max_memory_mib":4096}}')
KB=$(new_customer beta '{"quotas":{"max_running":8,"max_vcpus":8,"max_memory_mib":4096}}')
T_OF[$KA]= T_OF[$KB]= S_OF[$KA]= S_OF[$KB]=

# ---- work before the restart ----
run_task "$KA" 'sleep 2; echo a1'
run_task "$KA" 'sleep 1; echo a2'
run_task "$KB" 'sleep 2; echo b1'
st=$(req "$KA" POST /v1/sessions --data-binary '{"idle_timeout_s":900}')
[ "$st" = 201 ] || t_bail "a session starts" "status $st: $(head -c 300 "$T_TMP/last")"
S1=$(last .id)
sleep 2
destroy "$KA" "$S1"
S_OF[$KA]+=" $S1"
# A second session that is still running at the restart.
st=$(req "$KA" POST /v1/sessions --data-binary '{"idle_timeout_s":900}')
[ "$st" = 201 ] || t_bail "a second session starts" "status $st: $(head -c 300 "$T_TMP/last")"
S2=$(last .id)

# The running session's time is not in yet; its start is.
hist "$KA"
check "acme: 2 tasks and 2 sessions started" [ "$(last .totals.tasks_started)" = 2 -a "$(last .totals.sessions_started)" = 2 ]
matches "$KA" "acme: vCPU- and MiB-seconds match its 2 tasks' timings and the ended session (not the running one's)" 1
matches "$KB" "beta: 1 task, no session, vCPU- and MiB-seconds match its timing"
hist "$KA"; A_BEFORE=$(flows)
hist "$KB"; B_BEFORE=$(flows)
# A stored level: beta's volume, sampled by the leader once a minute.
[ "$(req "$KB" POST /v1/volumes --data-binary '{"name":"meter","size_mib":64}')" = 201 ] ||
	t_bail "beta creates a volume" "$(head -c 300 "$T_TMP/last")"

# ---- a kiln-api restart ----
t_stop "$api_pid"
api_up "$T_TMP/api.json" "$URL"
hist "$KA"
check "after a restart acme's totals are unchanged" [ "$(flows)" = "$A_BEFORE" ]
hist "$KB"
check "after a restart beta's totals are unchanged" [ "$(flows)" = "$B_BEFORE" ]
# The restarted leader samples at its first tick.
for _ in $(seq 50); do hist "$KB"; [ "$(last .totals.volume_mib_max)" = 64 ] && break; sleep 0.2; done
check "beta's volume (64 MiB) shows in its history's volume_mib" [ "$(last .totals.volume_mib_max)" = 64 ]

# ---- work after it: the session that ran across it ends, a new task ----
sleep 1
destroy "$KA" "$S2"
S_OF[$KA]+=" $S2"
run_task "$KB" 'sleep 1; echo b2'
matches "$KA" "acme: the session across the restart added once (2 sessions, 2 tasks)"
matches "$KB" "beta: the task after the restart added (2 tasks)"
hist "$KA"; A_NOW=$(lastc .totals)
req "$ADMIN" GET "/v1/admin/customers/acme/usage/history?from=$FROM&step=1m" > /dev/null
check "the admin's view of acme equals acme's own" [ "$(lastc .totals)" = "$A_NOW" ]
code=$(curl -s -m 30 -o "$T_TMP/h.csv" -w '%{http_code}' -H "Authorization: Bearer $KA" -H 'Accept: text/csv' \
	"$URL/v1/usage/history?from=$FROM&step=1m")
check "Accept: text/csv: 200 with the header line" \
	[ "$code" = 200 -a "$(head -1 "$T_TMP/h.csv" | tr -d '\r')" = start_ms,start,vcpu_seconds,mib_seconds,tasks_started,sessions_started,snapshot_bytes,volume_mib ]
csv_tasks=$(tail -n +2 "$T_TMP/h.csv" | awk -F, '{n += $5} END {print n + 0}')
csv_vcpu=$(tail -n +2 "$T_TMP/h.csv" | awk -F, '{s += $3} END {printf "%d", s * 1000 + 0.5}')
json_vcpu=$(jq -r '(.vcpu_seconds * 1000 | round)' <<< "$A_NOW")
check "the CSV's columns add up to the JSON totals" \
	[ "$csv_tasks" = "$(jq -r .tasks_started <<< "$A_NOW")" -a $((csv_vcpu - json_vcpu)) -le 5 -a $((json_vcpu - csv_vcpu)) -le 5 ]
curl -s -m 30 -o "$T_TMP/f.csv" -H "Authorization: Bearer $KB" "$URL/v1/usage/history?from=$FROM&step=1m&format=csv"
check "?format=csv: beta's CSV has its 2 tasks" \
	[ "$(tail -n +2 "$T_TMP/f.csv" | awk -F, '{n += $5} END {print n + 0}')" = 2 ]
bad=0
for q in "step=7s" "from=abc" "from=10&to=5" "from=0&step=1m" "format=xml"; do
	[ "$(req "$KA" GET "/v1/usage/history?$q")" = 400 ] && [ "$(last .error.code)" = invalid_request ] || bad=1
done
check "bad step, from, range, too many buckets, format: 400 invalid_request" [ $bad = 0 ]
check "an admin key on /v1/usage/history: 403" [ "$(req "$ADMIN" GET /v1/usage/history)" = 403 ]

t_stop "$api_pid"
t_stop "$h_pid"
t_nothing_left "nothing left: no QEMU, VM directories, cgroups, mounts or slot locks"
t_done
