#!/usr/bin/env bash
# Metering over a real kiln-host (real VMs, a local S3): two customers run
# tasks and a session; GET /v1/usage/history then counts each one's tasks
# and sessions started, and its vCPU-seconds and MiB-seconds match what the
# tasks' timings and the session's timestamps say. A kiln-api restart keeps
# the totals as they were; a session running across the restart and a task
# after it are added once; the admin's view and the CSV agree; bad
# parameters are 400s. Then two kiln-api replicas on one PostgreSQL, a
# kiln-host with egress (in a network namespace on a private bridge)
# heartbeating to both: a task sends a known number of bytes to a sink in
# another namespace and the history's egress_bytes counts them (and not
# wildly more); tasks submitted through both replicas are counted once,
# the same read through either, and after one replica's restart; a paused
# session's bytes show in the sampled pause_bytes.
. "$(dirname "$0")/lib.sh"
t_plan 23
require_image
t_require_tools swift-proxy-server memcached jq curl awk ip nsenter nft python3
t_require_built kiln-api kiln-host

TOKEN=meter-token-$RANDOM$RANDOM$RANDOM
ADMIN=meter-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 10000))
URL=http://127.0.0.1:$API_PORT
BUCKET=kiln-meter
api_pid=
# The second part's private network: the replicas and S3 on the bridge's
# address, kiln-host and the egress sink in namespaces; the sink also at
# SINK, in TEST-NET-3 (outside kiln-host's default deny ranges, which hold
# 10/8; 65-egress uses .21 to .23), routed to it from the host's namespace.
N=$((RANDOM % 200 + 20))
NET=10.234.$N
SINK=203.0.113.$((128 + N % 100))
BR=kmbr$N
NS_PREFIX=kiln-me-$N
t_mark
net_bridge "$BR" "$NET.1"
s3_local_start "$NET.1"

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
flows() { lastc '.totals | del(.snapshot_bytes_max, .volume_mib_max, .pause_bytes_max, .template_bytes_max)'; }
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
	[ "$code" = 200 -a "$(head -1 "$T_TMP/h.csv" | tr -d '\r')" = start_ms,start,vcpu_seconds,mib_seconds,tasks_started,sessions_started,snapshot_bytes,volume_mib,egress_bytes,pause_bytes,template_bytes ]
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
hist "$KA"
check "tasks without egress send nothing: acme's egress_bytes is 0" [ "$(last .totals.egress_bytes)" = 0 ]

t_stop "$api_pid"
t_stop "$h_pid"

# ---- two replicas on one PostgreSQL, a host with egress ----
if ! ls /usr/lib/postgresql/*/bin/postgres > /dev/null 2>&1; then
	for n in $(seq 7); do skip "replicas and egress ($n)" "no PostgreSQL server: run scripts/deps.sh"; done
else
pg_start || t_bail "PostgreSQL (scripts/pg-local.sh) starts"
rurl() { echo "http://$NET.1:$((API_PORT + 10 + $1))"; } # replica 0, 1
declare -a api_pids
start_replica() { # R
	api_config "$T_TMP/r$1.json" "$NET.1:$((API_PORT + 10 + $1))" \
		"del(.db) + {store: {postgres: \"$T_PG_URL\"}, quotas: {submit_rate: 1000, submit_burst: 1000}}"
	api_up "$T_TMP/r$1.json" "$(rurl "$1")" "r$1"
	api_pids[$1]=$api_pid
}
start_replica 0
start_replica 1
net_ns "$NS_PREFIX-host" "km$N-h" "$NET.10" "$NET.1"
net_ns "$NS_PREFIX-sink" "km$N-s" "$NET.20" "$NET.1"
ip -n "$NS_PREFIX-sink" addr add "$SINK/32" dev eth0
ip -n "$NS_PREFIX-host" route add "$SINK/32" via "$NET.20"
# The sink: reads one connection to its end, answers the byte count.
t_bg nsenter --net="/run/netns/$NS_PREFIX-sink" python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9000)); s.listen(4)
while True:
    c, _ = s.accept(); n = 0
    while True:
        d = c.recv(65536)
        if not d: break
        n += len(d)
    c.sendall(str(n).encode()); c.close()' 2>> "$T_TMP/sink.err"
host_config "$T_TMP/h2.json" "$NET.10:7070" h2 \
	".api = [\"$(rurl 0)\", \"$(rurl 1)\"] | .heartbeat_ms = 500 | .run_dir += \"/h2\" | .capacity.cpu_overcommit = 8
	 | .network = {egress: true, dns_upstream: \"$NET.1:5353\", link_range: \"10.201.0.0/16\"}"
host_start "$T_TMP/h2.json" h2 "$NS_PREFIX-host"
h_pid=$host_pid
URL=$(rurl 0) API=$(rurl 0)
wait_live 1 600 || t_bail "h2 registers with the replicas" "$(tail -3 "$T_TMP/h2.err")"
URL=$(rurl 1) API=$(rurl 1)
check "two replicas on one PostgreSQL; the host with egress is live on both" wait_live 1 30
URL=$(rurl 0) API=$(rurl 0)
KC=$(new_customer gamma '{"quotas":{"max_running":8,"max_vcpus":8,"max_memory_mib":4096,"allow_egress":true}}')
T_OF[$KC]= S_OF[$KC]=

# Through replica 1: the task that sends EG bytes to the sink.
EG=300000
URL=$(rurl 1)
code=$(jq -cn --arg n "$EG" --arg sink "$SINK" '{language: "python", network: {egress: "allow", allow: [$sink + ":9000"]},
	code: ("import socket\ns = socket.create_connection((\"" + $sink + "\", 9000), timeout=20)\n" +
	       "s.sendall(b\"x\" * " + $n + ")\ns.shutdown(socket.SHUT_WR)\nprint(s.recv(100).decode())")}')
req "$KC" POST /v1/tasks --data-binary "$code" > /dev/null
EID=$(last .id)
task_final "$KC" "$EID" 600 || t_bail "the egress task $EID ends" "$(tail -3 "$T_TMP/h2.err")"
T_OF[$KC]+=" $EID"
check "the egress task succeeds and the sink got its $EG bytes" \
	[ "$(last .state)" = succeeded -a "$(last .result.stdout | tr -d '\n')" = "$EG" ]
# Three more, through both replicas.
URL=$(rurl 0); run_task "$KC" 'sleep 1; echo c1'
URL=$(rurl 1); run_task "$KC" 'echo c2'
URL=$(rurl 0); run_task "$KC" 'sleep 1; echo c3'
URL=$(rurl 0); hist "$KC"
eg=$(last .totals.egress_bytes)
check "the history's egress_bytes counts the $EG bytes sent (got $eg)" \
	[ "${eg:-0}" -ge "$EG" -a "${eg:-0}" -le $((EG * 5 / 4 + 65536)) ]
URL=$(rurl 0); matches "$KC" "4 tasks through two replicas: counted once, vCPU- and MiB-seconds match their timings"
URL=$(rurl 0); hist "$KC"; R0=$(flows)
URL=$(rurl 1); hist "$KC"; R1=$(flows)
check "the totals read through either replica are the same" [ -n "$R0" -a "$R0" = "$R1" ]
# A replica's restart (the one the host heartbeats to first) changes nothing.
t_stop "${api_pids[0]}"
start_replica 0
URL=$(rurl 0); hist "$KC"; R0B=$(flows)
URL=$(rurl 1); hist "$KC"; R1B=$(flows)
check "after replica 0's restart both read the same totals as before" [ "$R0B" = "$R0" -a "$R1B" = "$R0" ]
# A paused session's stored bytes: a level the leader samples once a minute.
URL=$(rurl 1)
st=$(req "$KC" POST /v1/sessions --data-binary '{"idle_timeout_s":900}')
[ "$st" = 201 ] || t_bail "gamma's session starts" "status $st: $(head -c 300 "$T_TMP/last")"
SP=$(last .id)
st=$(req "$KC" POST "/v1/sessions/$SP/pause")
PB=$(last .snapshot.bytes)
[ "$st" = 200 ] || t_bail "gamma's session pauses" "status $st: $(head -c 300 "$T_TMP/last")"
for _ in $(seq 75); do hist "$KC"; [ "$(last .totals.pause_bytes_max)" = "$PB" ] && break; sleep 1; done
check "the paused session's bytes in S3 ($PB, its pause's) show in pause_bytes within a minute" \
	[ "${PB:-0}" -gt 0 -a "$(last .totals.pause_bytes_max)" = "$PB" ]
destroy "$KC" "$SP"
t_stop "${api_pids[0]}"
t_stop "${api_pids[1]}"
t_stop "$h_pid"
pg_stop
fi
t_nothing_left "nothing left: no QEMU, VM directories, cgroups, mounts or slot locks"
t_done
