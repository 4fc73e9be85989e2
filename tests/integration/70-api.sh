#!/usr/bin/env bash
# kiln-api on its own (no hosts, no VMs: tasks stay queued): authentication,
# admin, customer isolation, admission (per-task limits, egress, rate, queue
# depth, host fit), idempotent retries, malformed and oversized bodies,
# cancel, long-poll and event stream woken by a cancel, usage, pagination,
# and SIGKILL during a burst of 200 submissions: every 202 survives the
# restart, no id is given twice, nothing is left running.
# KILN_TEST_STORE=postgres (70-api-pg.sh) runs all of it on a PostgreSQL of
# its own (lib.sh pg_start), and then takes the database away under the
# running kiln-api: 503s (healthz too) while it is down, recovery by itself.
. "$(dirname "$0")/lib.sh"
t_plan $([ "${KILN_TEST_STORE:-sqlite}" = postgres ] && echo 80 || echo 73)
STORE=${KILN_TEST_STORE:-sqlite}

t_require_tools curl jq xargs
KILN_API=${KILN_API:-$ROOT/build/kiln-api}
[ -x "$KILN_API" ] || t_skip_all "$KILN_API missing: run make"
KILN_API_BIN=$KILN_API

PORT=$((20000 + RANDOM % 12000))
URL=http://127.0.0.1:$PORT
ADMIN=it-admin-$RANDOM$RANDOM$RANDOM$RANDOM
TOKEN=it-cluster-$RANDOM$RANDOM
api_pid=

store='{}'
if [ "$STORE" = postgres ]; then
	[ -x /usr/lib/postgresql/15/bin/postgres ] || ls /usr/lib/postgresql/*/bin/postgres > /dev/null 2>&1 ||
		t_skip_all "no PostgreSQL server: run scripts/deps.sh"
	pg_start || t_bail "PostgreSQL (scripts/pg-local.sh) starts"
	# The conninfo from a file (the way a password is kept out of the configuration).
	echo "$T_PG_URL" > "$T_TMP/pg.conninfo"
	store=$(jq -cn --arg f "$T_TMP/pg.conninfo" '{store: {postgres_file: $f}}')
fi
# No S3: tasks stay queued (api_config points it where nothing answers).
BUCKET=kiln
api_config "$T_TMP/api.json" "127.0.0.1:$PORT" \
	". + {max_body_mib: 1, quotas: {submit_rate: 1000, submit_burst: 1000, max_queued: 1000}} + $store"

start_api() { api_start "$T_TMP/api.json" "$URL"; }
stop_api() { t_stop "$api_pid"; api_pid=; }

# req KEY METHOD PATH [curl args...]: body in $T_TMP/last.json, headers in
# $T_TMP/last.h, the status echoed. KEY "-" sends no Authorization.
req() {
	local key=$1 m=$2 p=$3 auth=()
	shift 3
	[ "$key" = - ] || auth=(-H "Authorization: Bearer $key")
	curl -s --max-time 70 -o "$T_TMP/last.json" -D "$T_TMP/last.h" -w '%{http_code}' -X "$m" "${auth[@]}" "$@" "$URL$p"
}
last() { jq -r "$1" "$T_TMP/last.json" 2> /dev/null; }
header() { tr -d '\r' < "$T_TMP/last.h" | awk -v h="$(echo "$1" | tr A-Z a-z)" 'BEGIN{FS=": "} tolower($1) == h {print $2}'; }
# submit KEY SPEC-JSON [curl args...]
submit() { local k=$1 s=$2; shift 2; req "$k" POST /v1/tasks -H 'Content-Type: application/json' --data-binary "$s" "$@"; }
PY='{"language":"python","code":"print(1)"}'
# expect NAME STATUS [jq-condition]: one check on the last reply.
expect() {
	local name=$1 want=$2 got=$3 cond=${4:-true}
	if [ "$got" = "$want" ] && [ "$(last "$cond")" = true ]; then
		ok "$name"
	else
		not_ok "$name" "status $got (want $want), body: $(head -c 600 "$T_TMP/last.json")"
	fi
}

start_api || t_bail "kiln-api starts" "$(tail -3 "$T_TMP/api.err")"

st=$(req - GET /healthz); expect "healthz without a key ($STORE)" 200 "$st" '.status == "ok" and .leader == true'
backend=$([ "$STORE" = postgres ] && echo postgresql || echo sqlite)
st=$(req - GET /metrics)
m=0
[ "$st" = 200 ] && grep -qx 'kiln_api_leader 1' "$T_TMP/last.json" && grep -qx 'kiln_api_store_up 1' "$T_TMP/last.json" &&
	grep -qx "kiln_api_store_info{backend=\"$backend\"} 1" "$T_TMP/last.json" && m=1
check "metrics without a key: this kiln-api leads, its store ($backend) is up" [ "$m" = 1 ]
if "$KILN_API" migrate --config "$T_TMP/api.json" 2> "$T_TMP/migrate.err" &&
	grep -q "schema version" "$T_TMP/migrate.err"; then
	ok "kiln-api migrate on the live database: nothing to do, exit 0"
else
	not_ok "kiln-api migrate" "$(cat "$T_TMP/migrate.err")"
fi
if [ "$STORE" = sqlite ]; then
	check "kiln-api migrate --db creates the schema of a new SQLite file" \
		"$KILN_API" migrate --db "$T_TMP/fresh.db" 2> /dev/null
fi

# ---- authentication ----
st=$(req - GET /v1/tasks)
expect "no key: 401 unauthorized" 401 "$st" '.error.code == "unauthorized"'
check "401 carries WWW-Authenticate: Bearer" [ "$(header WWW-Authenticate)" = Bearer ]
st=$(req kiln_0000000000000000_notakeynotakeynotakeynotakeynotakeynotake GET /v1/tasks)
expect "unknown key: 401" 401 "$st" '.error.code == "unauthorized"'
st=$(req "${ADMIN}x" GET /v1/admin/hosts); expect "admin key with a byte more: 401" 401 "$st"

# ---- admin ----
st=$(req "$ADMIN" POST /v1/admin/customers --data-binary '{"id":"acme","name":"Acme"}')
expect "admin creates customer acme (201)" 201 "$st" '.id == "acme" and .quotas.max_queued == 1000'
st=$(req "$ADMIN" POST /v1/admin/customers --data-binary '{"id":"beta"}'); expect "admin creates customer beta" 201 "$st"
st=$(req "$ADMIN" POST /v1/admin/customers --data-binary '{"id":"acme"}')
expect "a duplicate customer: 409" 409 "$st" '.error.code == "duplicate"'
st=$(req "$ADMIN" POST /v1/admin/customers --data-binary '{"id":"../x"}')
expect "a bad customer id: 400" 400 "$st" '.error.message | startswith("id:")'
st=$(req "$ADMIN" POST /v1/admin/customers/acme/keys)
expect "admin makes a key for acme (201, shown once)" 201 "$st" '(.key | startswith("kiln_")) and .key_id != null'
KA=$(last .key)
st=$(req "$ADMIN" POST /v1/admin/customers/beta/keys); KB=$(last .key)
st=$(req "$ADMIN" POST /v1/admin/customers/acme/keys); KA2=$(last .key); KA2_ID=$(last .key_id)
st=$(req "$ADMIN" POST /v1/admin/customers/nobody/keys); expect "a key for no such customer: 404" 404 "$st"
st=$(req "$KA" GET /v1/admin/hosts); expect "a customer key on an admin endpoint: 403" 403 "$st" '.error.code == "forbidden"'

# ---- submit, isolation ----
st=$(submit "$KA" '{"language":"python","code":"print(1)","metadata":{"run":7}}')
expect "submit: 202 queued with an id and the metadata" 202 "$st" \
	'(.id | startswith("t_")) and .state == "queued" and .metadata.run == 7 and .limits.memory_mib == 256'
TA=$(last .id)
st=$(req "$KA" GET "/v1/tasks/$TA"); expect "GET own task" 200 "$st" ".id == \"$TA\" and .state == \"queued\" and .outputs == []"
st=$(req "$KB" GET "/v1/tasks/$TA"); expect "another customer's task: 404 (not 403)" 404 "$st" '.error.code == "not_found"'
st=$(req "$KB" POST "/v1/tasks/$TA/cancel"); expect "cancel another customer's task: 404" 404 "$st"
st=$(req "$KB" GET "/v1/tasks/$TA/events"); expect "events of another customer's task: 404" 404 "$st"
st=$(req "$KB" GET /v1/tasks); expect "another customer's list does not show it" 200 "$st" ".tasks | map(.id) | index(\"$TA\") == null"
st=$(req "$KA" GET /v1/tasks); expect "the owner's list shows it" 200 "$st" ".tasks[0].id == \"$TA\""
st=$(req "$KA" GET /v1/tasks/t_nosuchtask); expect "unknown task: 404" 404 "$st"
st=$(req "$KA" DELETE "/v1/tasks/$TA"); expect "wrong method: 405" 405 "$st" '.error.code == "method_not_allowed"'
st=$(req "$KA" GET /v1/nothing); expect "unknown path: 404" 404 "$st"

# ---- admission ----
st=$(req "$ADMIN" PUT /v1/admin/customers/acme/quotas --data-binary '{"max_task_memory_mib":2048}')
expect "partial quota update" 200 "$st" '.quotas.max_task_memory_mib == 2048 and .quotas.max_queued == 1000'
st=$(submit "$KA" '{"argv":["true"],"limits":{"memory_mib":4096}}')
expect "over the per-task quota: 400 naming the limit" 400 "$st" \
	'.error.message == "limits.memory_mib: 4096 exceeds your quota of 2048"'
st=$(submit "$KA" '{"argv":["true"],"limits":{"vcpus":99}}')
expect "invalid spec: 400 naming the field" 400 "$st" '.error.code == "invalid_spec" and (.error.message | startswith("limits.vcpus"))'
st=$(submit "$KA" $'{"argv":["true"],\n "limits": {,}}')
expect "malformed JSON: 400 with line and column" 400 "$st" '.error.code == "invalid_json" and (.error.message | test("line 2, column [0-9]+"))'
st=$(submit "$KA" '{"argv":["true"],"network":{"egress":"internet"}}')
expect "egress not allowed: 400" 400 "$st" '.error.code == "egress_not_allowed"'
st=$(req "$ADMIN" PUT /v1/admin/customers/acme/quotas --data-binary '{"allow_egress":true}')
st=$(submit "$KA" '{"argv":["true"],"network":{"egress":"allow","allow":["203.0.113.0/24:443","203.0.113.5/24:80"]}}')
expect "with allow_egress, a malformed rule: 400 naming it" 400 "$st" \
	'.error.code == "invalid_spec" and (.error.message | startswith("network.allow[1]: \"203.0.113.5/24:80\""))'
st=$(submit "$KA" '{"argv":["true"],"network":{"egress":"allow","allow":["203.0.113.0/24:443","*.pypi.example:443"]}}')
expect "with allow_egress, a valid policy is accepted" 202 "$st" '.state == "queued"'
req "$KA" POST "/v1/tasks/$(last .id)/cancel" > /dev/null
req "$ADMIN" PUT /v1/admin/customers/acme/quotas --data-binary '{"allow_egress":false}' > /dev/null
head -c $((2 << 20)) /dev/zero | tr '\0' ' ' > "$T_TMP/big.json"
st=$(req "$KA" POST /v1/tasks --data-binary @"$T_TMP/big.json")
expect "a body over max_body_mib: 413" 413 "$st" '.error.code == "too_large"'
st=$(head -c $((3 << 19)) /dev/zero | tr '\0' ' ' | req "$KA" POST /v1/tasks -H 'Transfer-Encoding: chunked' --data-binary @-)
expect "a chunked body over max_body_mib: 413 at its end" 413 "$st" '.error.code == "too_large"'
st=$(head -c $((8 << 20)) /dev/zero | tr '\0' ' ' | req "$KA" POST /v1/tasks -H 'Transfer-Encoding: chunked' --data-binary @-)
# libmicrohttpd takes no reply while a body arrives: the connection closes
# with no final status (curl's 000, or 100 when only the interim 100 Continue came).
check "a chunked body past twice the limit: the connection is closed, no final reply ($st)" [ "$st" = 000 -o "$st" = 100 ]
st=$(req - GET /healthz); check "kiln-api still answers after that" [ "$st" = 200 ]

# Idempotency.
st=$(submit "$KA" '{"argv":["echo","once"]}' -H 'Idempotency-Key: job-42'); T1=$(last .id)
check "first submission with an Idempotency-Key: 202" [ "$st" = 202 ]
st=$(submit "$KA" '{"argv":["echo","once"]}' -H 'Idempotency-Key: job-42')
expect "a retry with the same key and body: 200, the same task" 200 "$st" ".id == \"$T1\" and .idempotency_key == \"job-42\""
st=$(submit "$KA" '{"argv":["echo","twice"]}' -H 'Idempotency-Key: job-42')
expect "the same key with another body: 409" 409 "$st" '.error.code == "idempotency_conflict"'
st=$(submit "$KB" '{"argv":["echo","once"]}' -H 'Idempotency-Key: job-42')
expect "keys are per customer" 202 "$st" ".id != \"$T1\""

# Rate: burst 2, then 429 with Retry-After.
req "$ADMIN" POST /v1/admin/customers --data-binary '{"id":"slow","quotas":{"submit_rate":0.2,"submit_burst":2}}' > /dev/null
req "$ADMIN" POST /v1/admin/customers/slow/keys > /dev/null; KS=$(last .key)
a=$(submit "$KS" "$PY"); b=$(submit "$KS" "$PY"); st=$(submit "$KS" "$PY")
expect "submit rate: 2 accepted then 429 rate_limited" 429 "$st" '.error.code == "rate_limited"'
ra=$(header Retry-After)
check "429 rate_limited carries Retry-After (whole seconds, >= 1): $a $b, Retry-After '$ra'" \
	eval '[ "$a$b" = 202202 ] && [[ $ra =~ ^[0-9]+$ ]] && [ "$ra" -ge 1 ]'

# Queue depth: 2 queued, then 429 queue_full.
req "$ADMIN" POST /v1/admin/customers --data-binary '{"id":"full","quotas":{"max_queued":2}}' > /dev/null
req "$ADMIN" POST /v1/admin/customers/full/keys > /dev/null; KF=$(last .key)
submit "$KF" "$PY" > /dev/null; FT=$(last .id); submit "$KF" "$PY" > /dev/null
st=$(submit "$KF" "$PY")
expect "queue depth: 429 queue_full" 429 "$st" '.error.code == "queue_full"'
check "429 queue_full carries Retry-After" [ -n "$(header Retry-After)" ]
req "$KF" POST "/v1/tasks/$FT/cancel" > /dev/null
st=$(submit "$KF" "$PY"); check "a cancel makes room in the queue" [ "$st" = 202 ]

# ---- cancel, long-poll, events ----
st=$(req "$KA" POST "/v1/tasks/$TA/cancel")
expect "cancel a queued task: 200 cancelled" 200 "$st" '.state == "cancelled" and .end_reason == "cancelled" and .timings.total_ms != null'
st=$(req "$KA" POST "/v1/tasks/$TA/cancel"); expect "cancel a final task: 409" 409 "$st" '.error.code == "not_cancellable"'

st=$(submit "$KA" "$PY"); TW=$(last .id)
st=$(req "$KA" GET "/v1/tasks/$TW?wait=1"); expect "?wait=1 on a queued task answers queued" 200 "$st" '.state == "queued"'
st=$(req "$KA" GET "/v1/tasks/$TW?wait=61"); expect "?wait out of range: 400" 400 "$st"
# The long-poll would block 60 s; curl gives up after 30 s; only the cancel can end it in time.
curl -s --max-time 30 -H "Authorization: Bearer $KA" "$URL/v1/tasks/$TW?wait=60" > "$T_TMP/poll.json" &
poll=$!
curl -s --max-time 30 -N -H "Authorization: Bearer $KA" "$URL/v1/tasks/$TW/events" > "$T_TMP/events.txt" &
sse=$!
for _ in $(seq 50); do grep -q '"queued"' "$T_TMP/events.txt" 2> /dev/null && break; sleep 0.1; done
st=$(req "$KA" POST "/v1/tasks/$TW/cancel")
wait "$poll"; prc=$?
wait "$sse"; src=$?
check "a long-poll returns when another request cancels the task" \
	eval '[ "$prc" = 0 ] && [ "$(jq -r .state "$T_TMP/poll.json")" = cancelled ]'
check "the event stream shows queued then cancelled and ends" \
	eval '[ "$src" = 0 ] && [ "$(sed -n "s/^data: //p" "$T_TMP/events.txt" | jq -r .state | paste -sd,)" = queued,cancelled ]'
st=$(req "$KA" GET "/v1/tasks/$TW/events"); check "events of a final task: replayed, then the stream ends" \
	eval '[ "$st" = 200 ] && grep -q cancelled "$T_TMP/last.json"'

# ---- usage, list ----
st=$(req "$KA" GET /v1/usage)
nq=$(req "$KA" GET '/v1/tasks?state=queued&limit=100' > /dev/null; last '.tasks | length')
req "$KA" GET /v1/usage > /dev/null
expect "usage: quotas, queued count, submit bucket" 200 "$st" \
	".customer == \"acme\" and .quotas.max_task_memory_mib == 2048 and .usage.queued == $nq and .usage.running == 0 and .submit.burst == 1000"
for i in 1 2 3; do submit "$KB" "{\"argv\":[\"echo\",\"$i\"]}" > /dev/null; done
st=$(req "$KB" GET '/v1/tasks?limit=2')
expect "list: newest first, limit 2, a next_cursor" 200 "$st" '(.tasks | length) == 2 and .tasks[0].created_at >= .tasks[1].created_at and .next_cursor != null'
first=$(last '.tasks[0].id'); cur=$(last .next_cursor)
st=$(req "$KB" GET "/v1/tasks?limit=2&cursor=$cur")
expect "list: the next page continues where the first ended" 200 "$st" "(.tasks | map(.id) | index(\"$first\")) == null and (.tasks | length) == 2"
st=$(req "$KB" GET "/v1/tasks?limit=101"); expect "list: limit over 100: 400" 400 "$st"
st=$(req "$KB" GET "/v1/tasks?state=cancelled"); expect "list: by state" 200 "$st" '(.tasks | length) == 0'

# ---- hosts ----
st=$(req "$TOKEN" POST /v1/hosts/h1/heartbeat --data-binary '{"url":"http://127.0.0.1:7070","capacity":{"vcpus":{"total":2,"used":0},"memory_mib":{"total":1024,"used":0}}}')
expect "host heartbeat with the cluster token" 200 "$st" '.ok == true'
st=$(req "$KA" POST /v1/hosts/h1/heartbeat --data-binary '{"url":"http://127.0.0.1:7070","capacity":{}}')
expect "a heartbeat with a customer key: 401" 401 "$st"
st=$(req "$ADMIN" GET /v1/admin/hosts); expect "admin lists the host, live" 200 "$st" '.hosts[0].id == "h1" and .hosts[0].state == "live"'
st=$(submit "$KA" '{"argv":["true"],"limits":{"vcpus":4}}')
expect "a task no live host can ever fit: 503 no_host_fits" 503 "$st" '.error.code == "no_host_fits"'
st=$(submit "$KA" '{"argv":["true"],"limits":{"vcpus":2,"memory_mib":1024}}'); check "a task that fits the largest host: 202" [ "$st" = 202 ]

# ---- revoke ----
st=$(req "$KA2" GET /v1/usage); check "a second key works" [ "$st" = 200 ]
st=$(req "$ADMIN" DELETE "/v1/admin/keys/$KA2_ID"); expect "admin revokes it" 200 "$st" '.revoked == true'
st=$(req "$KA2" GET /v1/usage); expect "a revoked key: 401" 401 "$st"
st=$(req "$KA" GET /v1/usage); check "the customer's other key still works" [ "$st" = 200 ]

# ---- SIGKILL during a burst of 200 submissions ----
req "$ADMIN" POST /v1/admin/customers --data-binary '{"id":"burst","quotas":{"submit_rate":0,"max_queued":0}}' > /dev/null
req "$ADMIN" POST /v1/admin/customers/burst/keys > /dev/null; KX=$(last .key)
mkdir -p "$T_TMP/burst"
export KX URL T_TMP
seq 200 | xargs -P 16 -I{} sh -c 'curl -s --max-time 20 -o "$T_TMP/burst/{}.json" -w "%{http_code}" -X POST \
	-H "Authorization: Bearer $KX" --data-binary "{\"argv\":[\"echo\",\"{}\"]}" "$URL/v1/tasks" > "$T_TMP/burst/{}.code" 2> /dev/null' &
burst=$!
for _ in $(seq 200); do
	[ "$(grep -l '^202$' "$T_TMP"/burst/*.code 2> /dev/null | wc -l)" -ge 40 ] && break
	sleep 0.05
done
t_stop "$api_pid" KILL; api_pid=
wait "$burst"
accepted=$(grep -l '^202$' "$T_TMP"/burst/*.code 2> /dev/null | wc -l)
for f in $(grep -l '^202$' "$T_TMP"/burst/*.code 2> /dev/null); do jq -r .id "${f%.code}.json"; done | sort > "$T_TMP/ids"
check "the burst got some 202s before the SIGKILL ($accepted) and some not" [ "$accepted" -ge 40 -a "$accepted" -lt 200 ]
check "no two 202s share an id" [ "$(sort -u "$T_TMP/ids" | wc -l)" = "$(wc -l < "$T_TMP/ids")" ]
if start_api; then ok "kiln-api restarts over the same database"; else not_ok "kiln-api restarts" "$(tail -3 "$T_TMP/api.err")"; fi
missing=0
while read -r id; do
	st=$(req "$KX" GET "/v1/tasks/$id")
	[ "$st" = 200 ] && [ "$(last .state)" = queued ] || missing=$((missing + 1))
done < "$T_TMP/ids"
check "every task that got a 202 exists after the restart, queued ($accepted checked, $missing missing)" [ "$missing" = 0 ]
st=$(req "$KX" GET '/v1/tasks?limit=100'); n1=$(last '.tasks | length'); c=$(last .next_cursor)
n2=$(req "$KX" GET "/v1/tasks?limit=100&cursor=$c" > /dev/null; last '.tasks | length')
n=$((n1 + ${n2:-0}))
check "the store holds no more burst tasks than were sent ($n)" [ "$n" -ge "$accepted" -a "$n" -le 200 ]
st=$(req "$KA" GET "/v1/tasks/$TW"); expect "earlier tasks survive too" 200 "$st" '.state == "cancelled"'

if [ "$STORE" = postgres ]; then
	# ---- the database goes away under the running kiln-api ----
	"$ROOT/scripts/pg-local.sh" stop "$T_PG_DIR"
	st=$(req - GET /healthz); expect "PostgreSQL down: healthz 503" 503 "$st" '.status == "unavailable"'
	st=$(req "$KX" GET "/v1/tasks/$(head -1 "$T_TMP/ids")")
	expect "PostgreSQL down: a read answers 503 unavailable" 503 "$st" '.error.code == "unavailable"'
	st=$(submit "$KA" "$PY"); expect "PostgreSQL down: a submission answers 503, not 202" 503 "$st"
	"$ROOT/scripts/pg-local.sh" start "$T_PG_DIR" > /dev/null
	up=
	for _ in $(seq 50); do
		[ "$(req - GET /healthz)" = 200 ] && { up=1; break; }
		sleep 0.1
	done
	check "PostgreSQL back: healthz 200 again by itself" [ -n "$up" ]
	st=$(req "$KX" GET "/v1/tasks/$(head -1 "$T_TMP/ids")"); expect "PostgreSQL back: reads work" 200 "$st" '.state == "queued"'
	st=$(submit "$KA" "$PY"); expect "PostgreSQL back: submissions work" 202 "$st"
	id=$(last .id)
	st=$(req "$KA" GET "/v1/tasks/$id"); expect "PostgreSQL back: the new task is there" 200 "$st" '.state == "queued"'
fi

stop_api
check "no kiln-api process left" [ -z "$(pgrep -f "kiln-api --config $T_TMP/api.json")" ]
if [ "$STORE" = postgres ]; then
	d=$T_PG_DIR
	pg_stop
	check "PostgreSQL stopped, its directory gone" [ "$(pgrep -c -f "postgres -D $d/" || true)" = 0 -a ! -e "$d" ]
fi
t_done
