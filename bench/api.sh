#!/usr/bin/env bash
# bench/api.sh: kiln-api alone (no hosts), figures only:
#   1. GET /v1/tasks/{id} with an API key: wrk, 2 threads, 32 connections, 10 s
#   2. durable submissions: POST /v1/tasks (each 202 committed with fsync) by
#      wrk with 2 threads and 16 connections for 10 s, then the count checked
#      against the store
# Knobs: DURATION (s, default 10), DB_DIR (where the SQLite file lives: its
# fsync cost is what (2) measures; default a temporary directory under /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
for t in wrk curl jq; do
	command -v "$t" > /dev/null || { echo "bench/api: $t missing (apt-get install wrk curl jq)" >&2; exit 1; }
done
API=build/kiln-api
[ -x "$API" ] || { echo "bench/api: $API missing: run make" >&2; exit 1; }
DURATION=${DURATION:-10}
tmp=$(mktemp -d "${DB_DIR:-/tmp}/kiln-bench-api.XXXXXX")
port=$((20000 + RANDOM % 20000))
url=http://127.0.0.1:$port
admin=bench-admin-$RANDOM$RANDOM$RANDOM
pid=
cleanup() { [ -z "$pid" ] || { kill "$pid"; wait "$pid" 2> /dev/null || true; }; rm -rf "$tmp"; }
trap cleanup EXIT

jq -n --arg l "127.0.0.1:$port" --arg db "$tmp/api.db" --arg a "$admin" \
	'{listen: $l, db: $db, admin_key: $a, quotas: {submit_rate: 0, max_queued: 0}}' > "$tmp/api.json"
"$API" --config "$tmp/api.json" 2> "$tmp/api.err" &
pid=$!
for _ in $(seq 100); do curl -sf "$url/healthz" > /dev/null && break; sleep 0.1; done
curl -sf -X POST -H "Authorization: Bearer $admin" "$url/v1/admin/customers" -d '{"id":"bench"}' > /dev/null
key=$(curl -sf -X POST -H "Authorization: Bearer $admin" "$url/v1/admin/customers/bench/keys" | jq -r .key)
id=$(curl -sf -X POST -H "Authorization: Bearer $key" "$url/v1/tasks" -d '{"language":"python","code":"print(1)","metadata":{"n":1}}' | jq -r .id)

echo "== kiln-api: $(nproc) CPUs, SQLite on $(df -T "$tmp" | awk 'NR==2 {print $2}') ($tmp)"
echo "== GET /v1/tasks/{id} with auth: wrk -t2 -c32 -d${DURATION}s"
wrk -t2 -c32 -d"${DURATION}s" --latency -H "Authorization: Bearer $key" "$url/v1/tasks/$id" | grep -E 'Requests/sec|Latency|50%|99%|Non-2xx|Socket errors'

cat > "$tmp/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"language":"python","code":"print(1)","limits":{"memory_mib":256}}'
wrk.headers["Authorization"] = "Bearer $key"
wrk.headers["Content-Type"] = "application/json"
LUA
before=$(curl -sf -H "Authorization: Bearer $key" "$url/v1/usage" | jq .usage.queued)
echo "== POST /v1/tasks (durable: committed with fsync before each 202): wrk -t2 -c16 -d${DURATION}s"
wrk -t2 -c16 -d"${DURATION}s" --latency -s "$tmp/post.lua" "$url/v1/tasks" | grep -E 'Requests/sec|Latency|50%|99%|Non-2xx|Socket errors'
after=$(curl -sf -H "Authorization: Bearer $key" "$url/v1/usage" | jq .usage.queued)
echo "   tasks stored: $((after - before)) in ${DURATION} s = $(((after - before) / DURATION))/s"
