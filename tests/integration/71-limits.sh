#!/usr/bin/env bash
# Connection and body limits of kiln-api and kiln-host (no VMs): an
# unauthenticated 60 MiB POST is answered 401 before its body is read and
# costs no memory; a declared body over the cap gets 413 at once; idle
# connections from one address stop at the per-address limit while another
# address is still served; kiln-api counts long-lived requests per customer
# (429 over the limit, released when the streams close).
. "$(dirname "$0")/lib.sh"
t_plan 16

t_require_tools curl jq
KILN_API=${KILN_API:-$ROOT/build/kiln-api}
[ -x "$KILN_API" ] && [ -x "$KILN_HOST" ] || t_skip_all "kiln-api or kiln-host missing: run make"
KILN_API_BIN=$KILN_API
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
PROBE=$ROOT/tests/integration/limits_probe.py
ip -4 addr show lo | grep -q '127.0.0.1/8' || t_skip_all "lo has no 127.0.0.0/8 (needed for a second client address)"

APORT=$((20000 + RANDOM % 10000))
HPORT=$((30000 + RANDOM % 10000))
ADMIN=it-admin-$RANDOM$RANDOM$RANDOM$RANDOM
TOKEN=it-cluster-$RANDOM$RANDOM
PER_ADDR=8
STREAMS=3
api_pid=
host_pid=

# kiln-api without S3 (tasks stay queued: no host takes them).
api_config "$T_TMP/api.json" "127.0.0.1:$APORT" \
	"del(.s3) + {max_connections: 64, max_connections_per_address: $PER_ADDR,
	  quotas: {submit_rate: 1000, submit_burst: 1000, max_queued: 1000}}"
host_config "$T_TMP/host.json" "127.0.0.1:$HPORT" it-limits \
	"del(.capacity) | .cold = true | .max_connections = 64 | .max_connections_per_address = $PER_ADDR | .connection_timeout_s = 30"

api_up "$T_TMP/api.json" "http://127.0.0.1:$APORT"
host_start "$T_TMP/host.json" host
t_serving "http://127.0.0.1:$HPORT/healthz" "$host_pid" 20 || t_bail "kiln-host starts" "$(tail -3 "$T_TMP/host.err")"
ok "kiln-api and kiln-host start with connection limits in their configs"

# body NAME PORT PID AUTH STATUS [MIB]: a POST declaring MIB MiB (default 60)
# is answered STATUS after at most 8 MiB were sent, and the server's RSS grows by less than 8 MiB.
body() {
	local out
	out=$("$PY" "$PROBE" body "$2" "$3" "$4" "${6:-60}")
	echo "# $1: $out"
	if [ "$(jq -r ".status == $5 and .mib_sent_before_answer <= 8 and .rss_delta_kib < 8192" <<< "$out")" = true ]; then
		ok "$1: a ${6:-60} MiB POST gets $5 before its body is read, RSS flat"
	else
		not_ok "$1: a ${6:-60} MiB POST gets $5 before its body is read, RSS flat" "$out"
	fi
}
body "kiln-api, no key" "$APORT" "$api_pid" - 401
body "kiln-api, unknown key" "$APORT" "$api_pid" "Bearer kiln_0000000000000000_notakeynotakeynotakeynotakeynotakeynotake" 401
body "kiln-host, no token" "$HPORT" "$host_pid" - 401
body "kiln-host, wrong token" "$HPORT" "$host_pid" "Bearer wrong-$TOKEN" 401
body "kiln-host, right token, over the 128 MiB body cap" "$HPORT" "$host_pid" "Bearer $TOKEN" 413 200

# flood NAME PORT: 100 idle connections from 127.0.0.1 keep at most PER_ADDR,
# and 127.0.0.2 still gets /healthz.
flood() {
	local out
	out=$("$PY" "$PROBE" flood "$2" 100)
	echo "# $1: $out"
	if [ "$(jq -r ".held <= $PER_ADDR and .other_status == 200" <<< "$out")" = true ]; then
		ok "$1: idle connections from one address stop at $PER_ADDR, another address is served"
	else
		not_ok "$1: idle connections from one address stop at $PER_ADDR, another address is served" "$out"
	fi
}
flood kiln-api "$APORT"
flood kiln-host "$HPORT"

# ---- long-lived requests per customer (kiln-api): quota max_streams ----
AURL=http://127.0.0.1:$APORT
areq() { # KEY METHOD PATH [curl args]: body in last.json, status echoed
	local k=$1 m=$2 p=$3; shift 3
	curl -s --max-time 20 -o "$T_TMP/last.json" -D "$T_TMP/last.h" -w '%{http_code}' -X "$m" \
		-H "Authorization: Bearer $k" "$@" "$AURL$p"
}
areq "$ADMIN" POST /v1/admin/customers --data-binary "{\"id\":\"hog\",\"quotas\":{\"max_streams\":$STREAMS}}" > /dev/null
areq "$ADMIN" POST /v1/admin/customers/hog/keys > /dev/null; KH=$(jq -r .key "$T_TMP/last.json")
areq "$ADMIN" POST /v1/admin/customers --data-binary '{"id":"other"}' > /dev/null
areq "$ADMIN" POST /v1/admin/customers/other/keys > /dev/null; KO=$(jq -r .key "$T_TMP/last.json")
check "max_streams is a quota, shown by the admin API" \
	[ "$(areq "$ADMIN" GET /v1/admin/customers/hog > /dev/null; jq -r .quotas.max_streams "$T_TMP/last.json")" = "$STREAMS" ]
# A task stays queued (no host): its event stream stays open with keep-alives.
areq "$TOKEN" POST /v1/hosts/h-limits/heartbeat -H 'Content-Type: application/json' \
	--data-binary '{"url":"http://127.0.0.1:9","capacity":{"vcpus":{"total":8,"used":8},"memory_mib":{"total":16384,"used":16384}}}' > /dev/null
st=$(areq "$KH" POST /v1/tasks -H 'Content-Type: application/json' --data-binary '{"language":"sh","code":"true"}')
TID=$(jq -r .id "$T_TMP/last.json")
[ "$st" = 202 ] || echo "# submit: $st $(head -c 300 "$T_TMP/last.json")"
spids=()
for i in $(seq "$STREAMS"); do
	t_bg curl -s -N --max-time 60 -H "Authorization: Bearer $KH" "$AURL/v1/tasks/$TID/events" > "$T_TMP/ev$i"
	spids+=("$T_BG_PID")
done
sleep 1.5
st=$(areq "$KH" GET "/v1/tasks/$TID/events" --max-time 3)
if [ "$st" = 429 ] && [ "$(jq -r .error.code "$T_TMP/last.json")" = too_many_streams ] &&
	[ -n "$(tr -d '\r' < "$T_TMP/last.h" | awk 'tolower($1) == "retry-after:" {print $2}')" ]; then
	ok "hog: $STREAMS event streams open, the next gets 429 too_many_streams with Retry-After"
else
	not_ok "hog: $STREAMS event streams open, the next gets 429 too_many_streams with Retry-After" "status $st: $(head -c 300 "$T_TMP/last.json")"
fi
st=$(areq "$KH" GET "/v1/tasks/$TID?wait=5")
check "hog: a wait= long-poll counts too (429)" [ "$st" = 429 ]
st=$(areq "$KO" GET /v1/usage)
check "another customer still gets GET /v1/usage" [ "$st" = 200 ]
for p in "${spids[@]}"; do t_stop "$p"; done
# kiln-api sees a client gone when it next writes: a keep-alive within 15 s.
for _ in $(seq 40); do
	st=$(areq "$KH" GET "/v1/tasks/$TID?wait=1")
	[ "$st" = 200 ] && break
	sleep 1
done
check "after the streams close, hog long-polls again (the count is released)" [ "$st" = 200 ]
curl -s -N --max-time 2 -H "Authorization: Bearer $KH" -o /dev/null -w '%{http_code}' "$AURL/v1/tasks/$TID/events" > "$T_TMP/again" || true
check "... and opens an event stream again" [ "$(cat "$T_TMP/again")" = 200 ]

check "kiln-api still running" kill -0 "$api_pid"
check "kiln-host still running" kill -0 "$host_pid"
t_done
