#!/usr/bin/env bash
# bench/replicas.sh: kiln-api on PostgreSQL beside SQLite (no hosts: tasks
# stay queued), figures only, all in one run on this machine:
#   1. durable submissions/s (POST /v1/tasks, each 202 after its commit:
#      SQLite fsync'd, PostgreSQL synchronous_commit=on) by wrk with 16
#      connections for DURATION s: SQLite, then PostgreSQL with 1, 2 and 3
#      replicas (the 16 connections spread evenly over the replicas, one wrk
#      per replica); the tasks stored are counted afterwards
#   2. GET /v1/tasks/{id} req/s on PostgreSQL (wrk, 32 connections, one
#      replica) beside SQLite
#   3. leader failover: 3 replicas; the leader SIGKILLed 5 times (restarted
#      each time); the time until another replica's healthz says leader:
#      each and the median
# PostgreSQL is a server of the bench's own (scripts/pg-local.sh) in a
# temporary directory, on a Unix socket. Knobs: DURATION (s, default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
for t in wrk curl jq; do
	command -v "$t" > /dev/null || { echo "bench/replicas: $t missing (scripts/deps.sh)" >&2; exit 1; }
done
API=build/kiln-api
[ -x "$API" ] || { echo "bench/replicas: $API missing: run make" >&2; exit 1; }
DURATION=${DURATION:-10}
tmp=$(mktemp -d /tmp/kiln-bench-replicas.XXXXXX)
pgdir=$(mktemp -d /tmp/kiln-bench-pg.XXXXXX)
base=$((20000 + RANDOM % 11000))
admin=bench-admin-$RANDOM$RANDOM$RANDOM
pids=()
stop_all() {
	for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2> /dev/null || true; done
	pids=()
}
cleanup() { stop_all; scripts/pg-local.sh stop "$pgdir" || true; rm -rf "$tmp" "$pgdir"; }
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

pg=$(scripts/pg-local.sh start "$pgdir")
url() { echo "http://127.0.0.1:$((base + $1))"; }
start() { # r store-json
	local r=$1
	jq -n --arg l "127.0.0.1:$((base + r))" --arg a "$admin" --argjson st "$2" \
		'{listen: $l, admin_key: $a, quotas: {submit_rate: 0, max_queued: 0}} + $st' > "$tmp/api$r.json"
	"$API" --config "$tmp/api$r.json" 2>> "$tmp/api$r.err" &
	pids[$r]=$!
	for _ in $(seq 100); do curl -sf "$(url "$r")/healthz" > /dev/null && return 0; sleep 0.1; done
	echo "bench/replicas: replica $r did not start: $(tail -2 "$tmp/api$r.err")" >&2
	exit 1
}
key_for() { # r customer
	curl -sf -X POST -H "Authorization: Bearer $admin" "$(url "$1")/v1/admin/customers" -d "{\"id\":\"$2\"}" > /dev/null || true
	curl -sf -X POST -H "Authorization: Bearer $admin" "$(url "$1")/v1/admin/customers/$2/keys" | jq -r .key
}
queued() { curl -sf -H "Authorization: Bearer $2" "$(url "$1")/v1/usage" | jq .usage.queued; }
post_lua() {
	cat > "$tmp/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"language":"python","code":"print(1)","limits":{"memory_mib":256}}'
wrk.headers["Authorization"] = "Bearer $1"
wrk.headers["Content-Type"] = "application/json"
LUA
}
# submit N KEY: 16 connections over replicas 0..N-1; prints "req/s stored/s p99"
submit() {
	local n=$1 key=$2 c=$((16 / $1)) before after rps=0 w=()
	post_lua "$key"
	before=$(queued 0 "$key")
	for r in $(seq 0 $((n - 1))); do
		wrk -t1 -c"$c" -d"${DURATION}s" --latency -s "$tmp/post.lua" "$(url "$r")/v1/tasks" > "$tmp/wrk$r.out" &
		w+=($!)
	done
	wait "${w[@]}"
	for r in $(seq 0 $((n - 1))); do
		rps=$(awk -v a="$rps" '/Requests\/sec/ {printf "%.0f", a + $2}' "$tmp/wrk$r.out")
	done
	after=$(queued 0 "$key")
	echo "$rps req/s, $(((after - before) / DURATION)) stored/s, p99 (replica 0) $(awk '/ 99%/ {print $2}' "$tmp/wrk0.out")"
}

echo "== kiln-api replicas: $(nproc) CPUs; SQLite on $(df -T "$tmp" | awk 'NR==2 {print $2}'), PostgreSQL $(ls /usr/lib/postgresql | sort -V | tail -1) on a Unix socket (same disk); wrk 16 connections, ${DURATION} s"
# ---- SQLite ----
start 0 "{\"db\": \"$tmp/api.db\"}"
key=$(key_for 0 bench)
id=$(curl -sf -X POST -H "Authorization: Bearer $key" "$(url 0)/v1/tasks" -d '{"language":"python","code":"print(1)"}' | jq -r .id)
get_sqlite=$(wrk -t2 -c32 -d"${DURATION}s" -H "Authorization: Bearer $key" "$(url 0)/v1/tasks/$id" | awk '/Requests\/sec/ {print $2}')
echo "SQLite        submissions: $(submit 1 "$key")"
stop_all
# ---- PostgreSQL, 1 to 3 replicas ----
st=$(jq -cn --arg pg "$pg" '{store: {postgres: $pg}}')
start 0 "$st"
key=$(key_for 0 bench)
id=$(curl -sf -X POST -H "Authorization: Bearer $key" "$(url 0)/v1/tasks" -d '{"language":"python","code":"print(1)"}' | jq -r .id)
get_pg=$(wrk -t2 -c32 -d"${DURATION}s" -H "Authorization: Bearer $key" "$(url 0)/v1/tasks/$id" | awk '/Requests\/sec/ {print $2}')
echo "PostgreSQL x1 submissions: $(submit 1 "$key")"
start 1 "$st"
echo "PostgreSQL x2 submissions: $(submit 2 "$key")"
start 2 "$st"
echo "PostgreSQL x3 submissions: $(submit 3 "$key")"
echo "GET /v1/tasks/{id} (wrk -t2 -c32, one replica): SQLite $get_sqlite req/s, PostgreSQL $get_pg req/s"

# ---- leader failover ----
leader() { # the replica whose healthz says leader, or nothing
	for r in 0 1 2; do
		if curl -s -m 1 "$(url "$r")/healthz" 2> /dev/null | jq -e .leader > /dev/null 2>&1; then echo "$r"; return 0; fi
	done
	return 0
}
times=()
for i in 1 2 3 4 5; do
	for _ in $(seq 50); do L=$(leader); [ -n "$L" ] && break; sleep 0.1; done
	kill -9 "${pids[$L]}"; wait "${pids[$L]}" 2> /dev/null || true
	t0=$(date +%s%N)
	while :; do
		N=$(leader)
		[ -n "$N" ] && [ "$N" != "$L" ] && break
		sleep 0.02
	done
	times+=($((($(date +%s%N) - t0) / 1000000)))
	start "$L" "$st"
done
echo "leader failover (SIGKILL of the leader until another replica's healthz says leader), 5 kills: ${times[*]} ms;" \
	"median $(printf '%s\n' "${times[@]}" | sort -n | sed -n 3p) ms"
