#!/usr/bin/env bash
# bench/session_exec.sh: the round trip of POST /v1/sessions/{id}/exec of
# `true` through kiln-api (figures, not pass/fail): one kiln-api on SQLite
# (the embedded default) or, with STORE=pg, on a PostgreSQL of the bench's
# own (scripts/pg-local.sh), one kiln-host on loopback, one session, RUNS
# execs one after another (after 5 not counted): median, p90 and mean of
# curl's time_total. The exec path's store writes (the session's activity
# and its lease: api/sessions/session_core.c) are in these figures.
# KILN_API=path compares another kiln-api build (e.g. main's).
set -euo pipefail
cd "$(dirname "$0")/.."
for t in curl jq; do
	command -v "$t" > /dev/null || { echo "bench/session_exec: $t missing (scripts/deps.sh)" >&2; exit 1; }
done
API=${KILN_API:-build/kiln-api}
HOST=${KILN_HOST:-build/kiln-host}
RUNS=${RUNS:-200}
STORE=${STORE:-sqlite}
tmp=$(mktemp -d /tmp/kiln-bench-sexec.XXXXXX)
export KILN_RUN_DIR=$tmp/run
base=$((20000 + RANDOM % 11000))
admin=bench-admin-$RANDOM$RANDOM$RANDOM
token=bench-token-$RANDOM$RANDOM$RANDOM
pids=()
pgdir=
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2> /dev/null || true; done
	[ -z "$pgdir" ] || { scripts/pg-local.sh stop "$pgdir" || true; rm -rf "$pgdir"; }
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

if [ "$STORE" = pg ]; then
	pgdir=$(mktemp -d /tmp/kiln-bench-pg.XXXXXX)
	store=$(jq -n --arg pg "$(scripts/pg-local.sh start "$pgdir")" '{store: {postgres: $pg}}')
else
	store=$(jq -n --arg db "$tmp/api.db" '{db: $db}')
fi
jq -n --arg listen "127.0.0.1:$base" --arg admin "$admin" --arg token "$token" --argjson store "$store" \
	'{listen: $listen, admin_key: $admin, cluster_token: $token} + $store' > "$tmp/api.json"
"$API" --config "$tmp/api.json" > /dev/null 2> "$tmp/api.err" &
pids+=($!)
U=http://127.0.0.1:$base
for _ in $(seq 100); do curl -s -m 1 "$U/healthz" > /dev/null && break; sleep 0.1; done
jq -n --arg listen "127.0.0.1:$((base + 1))" --arg api "$U" --arg token "$token" --arg spool "$tmp/spool" \
	--arg run "$KILN_RUN_DIR" \
	'{listen: $listen, host_id: "bench", api: $api, token: $token, spool_dir: $spool, run_dir: $run,
	  heartbeat_ms: 500, pool: {size: 0, prestart: 0}}' > "$tmp/host.json"
"$HOST" serve --config "$tmp/host.json" > /dev/null 2> "$tmp/host.err" &
pids+=($!)
a() { curl -s -m 60 -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' "$@"; }
for _ in $(seq 3000); do
	[ "$(a "$U/v1/admin/hosts" | jq '[.hosts[] | select(.state == "live")] | length')" = 1 ] && break
	sleep 0.2
done
a -X POST --data '{"id":"bench"}' "$U/v1/admin/customers" > /dev/null
key=$(a -X POST "$U/v1/admin/customers/bench/keys" | jq -r .key)
k() { curl -s -m 120 -H "Authorization: Bearer $key" -H 'Content-Type: application/json' "$@"; }
sid=$(k -X POST --data '{}' "$U/v1/sessions" | jq -r .id)
[ -n "$sid" ] && [ "$sid" != null ] || { echo "bench/session_exec: no session: $(tail -3 "$tmp/api.err")" >&2; exit 1; }
for _ in $(seq 5); do k -X POST --data '{"argv":["true"]}' "$U/v1/sessions/$sid/exec" > /dev/null; done
for _ in $(seq "$RUNS"); do
	k -o /dev/null -w '%{time_total}\n' -X POST --data '{"argv":["true"]}' "$U/v1/sessions/$sid/exec"
done > "$tmp/t"
k -X DELETE "$U/v1/sessions/$sid" > /dev/null
/usr/bin/python3 - "$tmp/t" "$STORE" "$API" << 'EOF'
import statistics, sys
v = sorted(float(x) * 1000 for x in open(sys.argv[1]) if x.strip())
print("session exec round trip (%s, %s): n=%d median %.2f ms, p90 %.2f ms, mean %.2f ms"
      % (sys.argv[2], sys.argv[3], len(v), statistics.median(v), v[int(len(v) * 0.9) - 1], statistics.mean(v)))
EOF
