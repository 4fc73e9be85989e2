#!/usr/bin/env bash
# Big task logs through the whole stack (kiln-api + one kiln-host + the local
# S3): a task printing 12 MiB of \x01 (6x as JSON) reaches `succeeded` in
# kiln-api within 30 s, its full log is in S3 (sha256 and size compared
# through the presigned URL), the task JSON on both servers carries only a
# bounded excerpt; 20 tasks printing 32 MiB each grow kiln-host's RSS by
# less than 100 MiB; kiln run and kiln task logs print all of a task's output
# (past kiln-api's 1 MiB event list); kiln-api's watcher backs off when a
# (fake) host keeps failing the GET of a final task. Nothing is left running.
. "$(dirname "$0")/lib.sh"
t_plan 17
require_image
t_require_tools swift-proxy-server memcached curl jq
# KILN_IT_BIN: another build's kiln-api/kiln-host (to show this test fails on older code).
BIN=${KILN_IT_BIN:-$ROOT/build}
KILN_HOST=$BIN/kiln-host
KILN_API=$BIN/kiln-api
[ -x "$KILN_API" ] || t_skip_all "$KILN_API missing: run make"
KILN_API_BIN=$KILN_API
PY=/usr/bin/python3

TOKEN=it-token-$RANDOM$RANDOM
ADMIN=it-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 12000))
HOST_PORT=$((API_PORT + 1))
API=http://127.0.0.1:$API_PORT
HOST=http://127.0.0.1:$HOST_PORT
BUCKET=kiln-biglogs
host_pid=
api_pid=
fake_pid=

before_qemu=$(count_qemu)
before_locks=$(count_own_slot_locks)
s3_local_start

api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" \
	'. + {host_lost_after_s: 5, quotas: {submit_rate: 1000, submit_burst: 1000, max_queued: 1000}}'
host_config "$T_TMP/host.json" "127.0.0.1:$HOST_PORT" big-logs \
	".api = \"$API\" | .heartbeat_ms = 500 | .pool = {size: 2, prestart: 1}"

api_up "$T_TMP/api.json" "$API"
host_start "$T_TMP/host.json" host
for _ in $(seq 1200); do
	[ "$(admin "$API/v1/admin/hosts" | jq '[(.hosts // .)[] | select(.state == "live" and .capacity.pool.ready >= 2)] | length' 2> /dev/null)" = 1 ] && break
	kill -0 "$host_pid" 2> /dev/null || break
	sleep 0.2
done
if [ "$(admin "$API/v1/admin/hosts" | jq '[(.hosts // .)[] | select(.state == "live")] | length' 2> /dev/null)" = 1 ]; then
	ok "kiln-api and kiln-host start; the host registers, its pool fills"
else
	t_bail "the stack starts" "$(tail -3 "$T_TMP/api.err")" "$(tail -3 "$T_TMP/host.err")"
fi
admin -X POST --data '{"id":"acme"}' "$API/v1/admin/customers" > /dev/null
KEY=$(admin -X POST "$API/v1/admin/customers/acme/keys" | jq -r .key)

jqe() { jq -e "$@" > /dev/null; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$host_pid/status"; }

# ---- 12 MiB of \x01 ----
want=$($PY -c 'import hashlib; d=b"\x01"*(12<<20); print(len(d), hashlib.sha256(d).hexdigest())')
t0=$SECONDS
T1=$(api_task 'import sys; sys.stdout.buffer.write(b"\x01" * (12 << 20))')
if api_final "$T1" 30 && [ "$(jq -r .state "$T_TMP/$T1.json")" = succeeded ]; then
	ok "12 MiB of \\x01 on stdout: succeeded through kiln-api in $((SECONDS - t0)) s (limit 30 s)"
else
	not_ok "12 MiB of \\x01 reaches succeeded within 30 s" "state $(jq -r .state "$T_TMP/$T1.json" 2> /dev/null) after $((SECONDS - t0)) s" \
		"kiln-host RSS $(rss_kib) KiB" "$(grep -c . "$T_TMP/api.err") lines of kiln-api stderr: $(tail -1 "$T_TMP/api.err")"
fi
api_final "$T1" 60 > /dev/null
url=$(jq -r '.artifacts["stdout.log"].url // empty' "$T_TMP/$T1.json")
got=$([ -n "$url" ] && api_sha_of_url "$url")
check "its whole stdout.log is in S3 through the presigned URL (want $want; got ${got:-nothing})" [ -n "$got" -a "$got" = "$want" ]
api_size=$(wc -c < "$T_TMP/$T1.json")
host_size=$(curl -s -m 30 -H "Authorization: Bearer $TOKEN" "$HOST/v1/tasks/$T1" | wc -c)
check "GET of that task is small: kiln-api $api_size bytes, kiln-host $host_size bytes (each < 64 KiB)" \
	[ "$api_size" -lt 65536 -a "$host_size" -lt 65536 ]
check "the result marks the excerpt: stdout_truncated, stdout_bytes = 12 MiB, head and tail of at most 4 KiB" \
	jqe '.result.stdout_truncated == true and .result.stdout_bytes == 12582912 and
	       (.result.stdout | length) <= 4096 and (.result.stdout_tail | length) <= 4096 and
	       (.result.stdout | length) > 0 and (.result.stdout_tail | length) > 0' "$T_TMP/$T1.json"
check "kiln-host's record.json is small ($(wc -c < "$T_TMP/spool-big-logs/tasks/$T1/record.json" 2> /dev/null) bytes)" \
	[ "$(wc -c < "$T_TMP/spool-big-logs/tasks/$T1/record.json" 2> /dev/null || echo 1000000000)" -lt 65536 ]
st=$(cust "$API/v1/tasks/$T1/events" -m 10 | grep -c '^event: ')
check "the event stream of the finished task still replays and ends ($st events)" [ "$st" -ge 1 ]

# ---- 20 tasks of 32 MiB each, a few at a time: kiln-host's RSS ----
rss0=$(rss_kib)
ids=()
for i in $(seq 20); do
	ids+=("$(api_task "import sys; sys.stdout.buffer.write(b'x' * (32 << 20)); sys.stderr.write('task $i')")")
done
done_ok=0 slow=""
for id in "${ids[@]}"; do
	if api_final "$id" 900 && [ "$(jq -r .state "$T_TMP/$id.json")" = succeeded ]; then
		done_ok=$((done_ok + 1))
	else slow="$slow $id:$(jq -r .state "$T_TMP/$id.json" 2> /dev/null)"; fi
done
rss1=$(rss_kib)
check "20 tasks printing 32 MiB each succeed ($done_ok of 20${slow:+;$slow})" [ "$done_ok" = 20 ]
grow=$(( (rss1 - rss0) / 1024 ))
check "kiln-host's RSS grew by less than 100 MiB over them: $((rss0 / 1024)) -> $((rss1 / 1024)) MiB (+$grow MiB)" \
	[ "$grow" -lt 100 ]
last=${ids[19]}
api_size=$(wc -c < "$T_TMP/$last.json")
host_size=$(curl -s -m 60 -H "Authorization: Bearer $TOKEN" "$HOST/v1/tasks/$last" | wc -c)
check "GET of a 32 MiB task is small: kiln-api $api_size bytes, kiln-host $host_size bytes" \
	[ "$api_size" -lt 65536 -a "$host_size" -lt 65536 ]
url=$(jq -r '.artifacts["stdout.log"].url // empty' "$T_TMP/$last.json")
got=$([ -n "$url" ] && api_sha_of_url "$url")
want=$($PY -c 'import hashlib; d=b"x"*(32<<20); print(len(d), hashlib.sha256(d).hexdigest())')
check "its 32 MiB stdout.log is whole in S3" [ -n "$got" -a "$got" = "$want" ]
check "its short stderr is whole in the result, not marked truncated" \
	jqe '.result.stderr == "task 20" and .result.stderr_truncated == false and .result.stderr_bytes == 7' "$T_TMP/$last.json"

# ---- the CLI shows the whole output: kiln-api's event list keeps 1 MiB per task ----
KILN=$BIN/kiln
printf 'import sys\nsys.stdout.buffer.write(bytes(range(32, 127)) * 40000)\nsys.stderr.write("e" * 3000000)\n' > "$T_TMP/big.py"
want=$($PY -c 'import hashlib; d=bytes(range(32,127))*40000; print(len(d), hashlib.sha256(d).hexdigest())')
(cd "$T_TMP" && KILN_CREDENTIALS=$T_TMP/none KILN_API=$API KILN_KEY=$KEY timeout 300 "$KILN" run big.py > run.out 2> run.err)
rc=$?
got=$($PY -c 'import hashlib,sys; d=open(sys.argv[1],"rb").read(); print(len(d), hashlib.sha256(d).hexdigest())' "$T_TMP/run.out")
check "kiln run prints all 3.8 MB of stdout (exit $rc; want $want, got $got)" [ "$rc" = 0 -a "$got" = "$want" ]
erun=$($PY -c 'import re,sys; print(max(map(len, re.findall(rb"e+", open(sys.argv[1],"rb").read()))))' "$T_TMP/run.err")
check "and all 3 MB of stderr, once (its longest run of e: $erun)" [ "$erun" = 3000000 ]
id=$(grep -o 't_[0-9a-f]*' "$T_TMP/run.err" | head -1)
(cd "$T_TMP" && KILN_CREDENTIALS=$T_TMP/none KILN_API=$API KILN_KEY=$KEY timeout 120 "$KILN" task logs "$id" > logs.out 2> logs.err)
got=$($PY -c 'import hashlib,sys; d=open(sys.argv[1],"rb").read(); print(len(d), hashlib.sha256(d).hexdigest())' "$T_TMP/logs.out")
check "kiln task logs of the finished task prints all of its stdout (got $got)" [ "$got" = "$want" ]

# ---- kiln-api's watcher backs off when a host's GET keeps failing ----
# A fake host says the task is final on its event stream, then answers every
# GET of the task with 500 (as a reply over hostclient's 64 MiB cap did).
t_stop "$host_pid"; host_pid=
FAKE_PORT=$((HOST_PORT + 1))
t_bg $PY "$ROOT/tests/integration/fake_host.py" "$FAKE_PORT" "$API" "$TOKEN" "$T_TMP/gets" 2> "$T_TMP/fake.err"
fake_pid=$T_BG_PID
for _ in $(seq 100); do
	[ "$(admin "$API/v1/admin/hosts" | jq -r '[(.hosts // .)[] | select(.state == "live") | .id] | join(",")' 2> /dev/null)" = fake ] && break
	sleep 0.2
done
TF=$(api_task 'print(1)')
for _ in $(seq 100); do [ -s "$T_TMP/gets" ] && break; sleep 0.1; done
g0=$(cat "$T_TMP/gets" 2> /dev/null || echo 0)
sleep 8
g1=$(cat "$T_TMP/gets" 2> /dev/null || echo 0)
check "a host whose GET keeps failing: kiln-api retries it $((g1 - g0)) times in 8 s (backing off: at most 10)" \
	[ "$g0" -ge 1 -a "$((g1 - g0))" -le 10 ]
t_stop "$fake_pid"; fake_pid=

# ---- nothing left ----
t_stop "$api_pid"; api_pid=
for _ in $(seq 100); do [ "$(count_qemu)" = "$before_qemu" ] && break; sleep 0.1; done
check "no QEMU or slot lock left (qemu $(count_qemu)/$before_qemu, locks $(count_own_slot_locks)/$before_locks)" \
	[ "$(count_qemu)" = "$before_qemu" -a "$(count_own_slot_locks)" -le "$before_locks" ]
t_done
