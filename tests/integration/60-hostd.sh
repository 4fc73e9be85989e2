#!/usr/bin/env bash
# kiln-host serve as a daemon: authenticated task API, concurrent tasks with
# their outputs in a real S3 (Swift s3api, read back with boto3), event
# streams, cancel, duplicates, capacity, S3 failures that heal, a 200 MiB
# multipart output, and recovery after SIGKILL. Nothing is left behind.
. "$(dirname "$0")/lib.sh"
t_plan 27
require_image

t_require_tools swift-proxy-server memcached python3
t_require_python boto3

S3_DIR=$T_TMP/s3
SPOOL=$T_TMP/spool
TOKEN=it-token-$RANDOM$RANDOM
PORT=$((20000 + RANDOM % 12000))
URL=http://127.0.0.1:$PORT
BUCKET=kiln-it
host_pid=

# The local S3 (lib.sh; $S3_DIR is its directory), stopped and started again below.
s3_start() { s3_local_start; }
s3_stop() { s3_local_stop; }
stop_host() { t_stop "$host_pid"; host_pid=; }

s3_start

# write_config SECRET: the daemon's configuration file.
write_config() {
	host_config "$T_TMP/host.json" "127.0.0.1:$PORT" it-host \
		".spool_dir = \"$SPOOL\" | .capacity.cpu_overcommit = 4 | .pool = {size: 2, prestart: 1}
		 | .s3 += {secret_key: \"$1\", attempts: 1, timeout_s: 20} | .upload = {workers: 2, max_backoff_s: 2}"
}
start_host() {
	t_bg "$KILN_HOST" serve --config "$T_TMP/host.json" "$@" >> "$T_TMP/host.out" 2>> "$T_TMP/host.err"
	host_pid=$T_BG_PID
	for _ in $(seq 1200); do
		[ "$(curl -s --max-time 2 -H "Authorization: Bearer $TOKEN" "$URL/v1/capacity" | jq -r .pool.ready 2> /dev/null)" = 2 ] && return 0
		kill -0 "$host_pid" 2> /dev/null || return 1
		sleep 0.1
	done
	return 1
}
# api METHOD PATH [curl args...]: body to $T_TMP/last.json, status echoed
api() {
	local m=$1 p=$2; shift 2
	curl -s --max-time 60 -o "$T_TMP/last.json" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "$URL$p"
}
# submit ID SPEC-JSON: POST /v1/tasks; status echoed
submit() {
	jq -cn --arg id "$1" --argjson spec "$2" '{id: $id, customer: "acme", spec: $spec}' \
		| api POST /v1/tasks -H 'Content-Type: application/json' --data-binary @-
}
task() { curl -s --max-time 10 -H "Authorization: Bearer $TOKEN" "$URL/v1/tasks/$1"; }
# wait_state ID STATE-REGEX [SECONDS]: until the task's state matches
wait_state() {
	local deadline=$((SECONDS + ${3:-120})) st
	while [ $SECONDS -lt $deadline ]; do
		st=$(task "$1" | jq -r .state 2> /dev/null)
		[[ $st =~ ^($2)$ ]] && return 0
		sleep 0.1
	done
	echo "task $1: state $st after ${3:-120} s" >&2
	return 1
}
# s3get KEY FILE: read an object back with boto3 (an S3 client independent of ours)
s3py() {
	S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY BUCKET=$BUCKET python3 -c '
import os, sys, hashlib, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                  aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"],
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
op, key = sys.argv[1], sys.argv[2]
if op == "sha256":
    print(hashlib.sha256(s3.get_object(Bucket=os.environ["BUCKET"], Key=key)["Body"].read()).hexdigest())
elif op == "cat":
    sys.stdout.buffer.write(s3.get_object(Bucket=os.environ["BUCKET"], Key=key)["Body"].read())
elif op == "etag":
    print(s3.head_object(Bucket=os.environ["BUCKET"], Key=key)["ETag"])
elif op == "log":
    # log PREFIX NAME: the log of a task, from its own object or, when it was
    # small, from inside manifest.json (version 2, "inline": base64)
    import base64, json
    m = json.loads(s3.get_object(Bucket=os.environ["BUCKET"], Key=key + "/manifest.json")["Body"].read())
    a = m["artifacts"][sys.argv[3]]
    if "inline" in a:
        body = base64.b64decode(a["inline"], validate=True)
        assert a["s3_key"] is None and len(body) == a["size"] and hashlib.sha256(body).hexdigest() == a["sha256"]
    else:
        body = s3.get_object(Bucket=os.environ["BUCKET"], Key=a["s3_key"])["Body"].read()
    sys.stdout.buffer.write(body)
elif op == "exists":
    try:
        s3.head_object(Bucket=os.environ["BUCKET"], Key=key); print("yes")
    except Exception:
        print("no")
' "$@"
}
count_spool_files() { find "$SPOOL/tasks" -type f ! -name record.json 2> /dev/null | wc -l; }

before_qemu=$(count_qemu)
write_config "$S3_SECRET_KEY"
if start_host; then ok "kiln-host serve starts from its config file with a warm pool of 2"
else t_bail "serve starts" "$(tail -5 "$T_TMP/host.err")"; fi

# --- authentication ---
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/capacity")
code2=$(curl -s -o "$T_TMP/unauth.json" -w '%{http_code}' -H "Authorization: Bearer wrong" -X POST --data '{}' "$URL/v1/tasks")
code3=$(curl -s -o /dev/null -w '%{http_code}' "$URL/healthz")
if [ "$code" = 401 ] && [ "$code2" = 401 ] && [ "$(jq -r .error.code "$T_TMP/unauth.json")" = unauthorized ] && [ "$code3" = 200 ]; then
	ok "requests without the cluster token get 401 (missing or wrong); /healthz is open"
else not_ok "auth" "no token: $code, wrong token: $code2, healthz: $code3"; fi

# --- 8 concurrent tasks, outputs read back from S3 with boto3 ---
code_py='import hashlib, os, sys
tid = os.environ["TID"]
os.makedirs("/output/sub", exist_ok=True)
data = (tid * 1000).encode() + os.urandom(4096)
open("/output/data.bin", "wb").write(data)
open("/output/sub/id.txt", "w").write(tid)
print("sha", hashlib.sha256(data).hexdigest())
print("to stderr", file=sys.stderr)'
for i in $(seq 1 8); do
	spec=$(py_spec "$code_py" "{\"env\":{\"TID\":\"t$i\"}}")
	st=$(submit "conc-$i" "$spec")
	[ "$st" = 202 ] || echo "submit conc-$i: $st $(cat "$T_TMP/last.json")" >&2
done
all_ok=1
for i in $(seq 1 8); do wait_state "conc-$i" 'succeeded|failed|error|timed_out|cancelled' 240 || all_ok=0; done
good=0
for i in $(seq 1 8); do
	task "conc-$i" > "$T_TMP/conc-$i.json"
	j=$T_TMP/conc-$i.json
	want=$(jq -r '.result.stdout' "$j" | awk '/^sha/{print $2}')
	key=$(jq -r '.outputs[] | select(.path=="data.bin") | .s3_key' "$j")
	[ "$(jq -r .state "$j")" = succeeded ] || { echo "conc-$i: $(head -c 600 "$j")" >&2; continue; }
	[ "$key" = "acme/conc-$i/outputs/data.bin" ] || { echo "conc-$i: key $key" >&2; continue; }
	[ -n "$want" ] && [ "$(s3py sha256 "$key")" = "$want" ] || { echo "conc-$i: sha mismatch" >&2; continue; }
	[ "$(jq -r '.outputs[] | select(.path=="data.bin") | .sha256' "$j")" = "$want" ] || continue
	[ "$(s3py cat "acme/conc-$i/outputs/sub/id.txt")" = "t$i" ] || { echo "conc-$i: id.txt" >&2; continue; }
	[ "$(s3py log "acme/conc-$i" stdout.log)" = "$(jq -r .result.stdout "$j")" ] || { echo "conc-$i: stdout.log" >&2; continue; }
	[ "$(s3py log "acme/conc-$i" stderr.log)" = "to stderr" ] || { echo "conc-$i: stderr.log" >&2; continue; }
	s3py cat "acme/conc-$i/manifest.json" > "$T_TMP/m$i.json"
	# Logs this small travel inside the manifest (upload.inline_max): no objects of their own.
	[ "$(jq -r '.state + " " + (.outputs|length|tostring) + " " + (.version|tostring) + " " + (.artifacts["stdout.log"].inline|type)' "$T_TMP/m$i.json")" = \
	  "succeeded 2 2 string" ] && [ "$(s3py exists "acme/conc-$i/stdout.log")" = no ] \
		|| { echo "conc-$i: manifest $(head -c 400 "$T_TMP/m$i.json")" >&2; continue; }
	good=$((good + 1))
done
if [ "$all_ok" = 1 ] && [ "$good" = 8 ]; then
	ok "8 concurrent tasks all succeed; outputs and manifest.json (carrying the small logs) are in S3 with matching sha256"
else not_ok "8 concurrent tasks" "$good/8 checked out"; fi
check "spooled outputs are deleted once S3 has them (only records remain)" [ "$(count_spool_files)" = 0 ]

# --- duplicate ids, bad requests, capacity ---
st=$(submit conc-1 "$(py_spec 'print(1)')")
check "a duplicate task id gets 409" [ "$st" = 409 ]
st=$(submit "bad id!" "$(py_spec 'print(1)')")
check "an invalid task id gets 400 naming the field" grep -q '"message":"id:' "$T_TMP/last.json"
st=$(submit badspec '{"language":"cobol","code":"x"}')
check "an invalid spec gets 400 naming the field ($st)" grep -q '"code":"invalid_spec".*language' "$T_TMP/last.json"
st=$(submit big "$(py_spec 'print(1)' '{"limits":{"vcpus":9}}')")
if [ "$st" = 503 ] && [ "$(jq -r .error.code "$T_TMP/last.json")" = no_capacity ] && grep -q vCPU "$T_TMP/last.json"; then
	ok "a task beyond the host's capacity gets 503 no_capacity with the reason"
else not_ok "capacity refusal" "$st $(cat "$T_TMP/last.json")"; fi
st=$(api GET /v1/tasks/nope)
check "an unknown task gets 404" [ "$st" = 404 ]

# --- a file name no S3 key can carry: reported, the rest uploaded, never stuck ---
submit oddname "$(py_spec 'open("/output/ok.txt","w").write("ok"); open("/output/bad\x01name","w").write("x")')" > /dev/null
if wait_state oddname 'succeeded|failed|error' 120 && task oddname > "$T_TMP/odd.json" \
   && [ "$(jq -r .state "$T_TMP/odd.json")" = succeeded ] \
   && jq -e '.outputs[] | select(.path | startswith("bad")) | .s3_key == null and (.skipped | test("control character"))' "$T_TMP/odd.json" > /dev/null \
   && [ "$(s3py cat acme/oddname/outputs/ok.txt)" = ok ]; then
	ok "an output whose name cannot be an S3 key is listed as skipped with the reason; the others are uploaded"
else not_ok "odd file name" "$(head -c 800 "$T_TMP/odd.json")"; fi

# --- events stream and cancel ---
submit slow "$(sh_spec 'echo first; sleep 1; echo second; sleep 600' '{"limits":{"timeout_s":900}}')" > /dev/null
t_bg curl -s -N --max-time 120 -H "Authorization: Bearer $TOKEN" "$URL/v1/tasks/slow/events" > "$T_TMP/events.txt"
ev_pid=$T_BG_PID
for _ in $(seq 600); do grep -q 'second' "$T_TMP/events.txt" 2> /dev/null && break; sleep 0.1; done
if grep -q '^event: state' "$T_TMP/events.txt" && grep -q '"state":"running"' "$T_TMP/events.txt" \
   && grep -q '^data: {"data":"first\\n","offset":0,"bytes":6}' "$T_TMP/events.txt" && grep -q 'second' "$T_TMP/events.txt"; then
	ok "GET /v1/tasks/ID/events streams state changes and stdout as they happen"
else not_ok "events" "$(head -c 800 "$T_TMP/events.txt")"; fi
running_qemu=$(count_qemu)
st=$(api DELETE /v1/tasks/slow)
wait_state slow 'cancelled' 60
wait "$ev_pid" 2> /dev/null
task slow > "$T_TMP/slow.json"
if [ "$st" = 202 ] && [ "$(jq -r .state "$T_TMP/slow.json")" = cancelled ] && grep -q '"state":"cancelled"' "$T_TMP/events.txt" \
   && [ "$(jq -r .result.end_reason "$T_TMP/slow.json")" = cancelled ] \
   && [ "$(s3py log acme/slow stdout.log | head -n1)" = first ]; then
	ok "DELETE cancels a running task: state cancelled, the stream ends, its logs still reach S3"
else not_ok "cancel" "delete: $st $(head -c 600 "$T_TMP/slow.json")"; fi
st=$(api DELETE /v1/tasks/slow)
check "cancelling a finished task gets 409" [ "$st" = 409 ]

# --- capacity and metrics ---
api GET /v1/capacity > /dev/null
if jq -e '.vcpus.total == 8 and .vcpus.used == 0 and .running_tasks == 0 and (.accel|length) > 0 and .pool.ready >= 0' "$T_TMP/last.json" > /dev/null; then
	ok "GET /v1/capacity reports vCPUs, memory, running tasks, pool and accel"
else not_ok "capacity" "$(cat "$T_TMP/last.json")"; fi
api GET /metrics > /dev/null
if grep -q '^kiln_host_tasks{state="succeeded"} 9' "$T_TMP/last.json" && grep -q '^kiln_host_task_start_seconds_count 10' "$T_TMP/last.json" \
   && grep -Eq '^kiln_host_upload_bytes_total [1-9]' "$T_TMP/last.json" && grep -q '^kiln_host_vms_running 0' "$T_TMP/last.json"; then
	ok "GET /metrics: tasks by state, start latency histogram, VMs running, upload bytes"
else not_ok "metrics" "$(grep -v '^#' "$T_TMP/last.json" | head -20)"; fi
# The version (lib/version.c): the same string in --version, /healthz and /metrics.
v=$("$KILN_HOST" --version | sed 's/^kiln-host //')
if [ -n "$v" ] && [ "$(curl -s "$URL/healthz" | jq -r .version)" = "$v" ] &&
   grep -qxF "kiln_build_info{version=\"$v\"} 1" "$T_TMP/last.json"; then
	ok "kiln-host's version ($v) in --version, /healthz and kiln_build_info in /metrics"
else not_ok "version" "--version: $v, /healthz: $(curl -s "$URL/healthz"), $(grep kiln_build_info "$T_TMP/last.json")"; fi

# --- wrong S3 secret: stays uploading with a clear error, fixed by SIGHUP ---
write_config "not-the-secret"
kill -HUP "$host_pid"
for _ in $(seq 50); do grep -q 'S3 settings reloaded' "$T_TMP/host.err" && break; sleep 0.1; done
submit badcreds "$(py_spec 'open("/output/x.txt","w").write("x"); print("ok")')" > /dev/null
wait_state badcreds uploading 60
for _ in $(seq 100); do [ "$(task badcreds | jq -r '.last_error // ""')" != "" ] && break; sleep 0.1; done
task badcreds > "$T_TMP/badcreds.json"
if [ "$(jq -r .state "$T_TMP/badcreds.json")" = uploading ] && jq -r .last_error "$T_TMP/badcreds.json" | grep -q 's3_auth'; then
	ok "a wrong S3 secret keeps the task uploading with a clear last_error: $(jq -r .last_error "$T_TMP/badcreds.json" | head -c 120)"
else not_ok "wrong secret" "$(head -c 600 "$T_TMP/badcreds.json")"; fi
write_config "$S3_SECRET_KEY"
kill -HUP "$host_pid"
if wait_state badcreds succeeded 60 && [ "$(s3py cat acme/badcreds/outputs/x.txt)" = x ]; then
	ok "after the config is fixed (SIGHUP) the upload completes"
else not_ok "fixed secret" "$(task badcreds | head -c 600)"; fi

# --- 200 MiB output as multipart, S3 stopped mid-upload ---
big_py='import os, hashlib
h = hashlib.sha256()
block = os.urandom(1 << 20)
with open("/output/big.bin", "wb") as f:
    for i in range(200):
        b = i.to_bytes(4, "little") + block[4:]
        h.update(b); f.write(b)
print(h.hexdigest())'
submit big200 "$(py_spec "$big_py" '{"limits":{"output_mib":300,"timeout_s":600}}')" > /dev/null
# S3 is stopped the moment the program has printed its hash (its output is
# whole; the spool's stdout.log has the line as it is printed): the upload
# cannot have finished by then, so the window is never lost.
deadline=$((SECONDS + 600))
until grep -qE '^[0-9a-f]{64}$' "$SPOOL/tasks/big200/stdout.log" 2> /dev/null || [ $SECONDS -ge $deadline ]; do sleep 0.05; done
if grep -qE '^[0-9a-f]{64}$' "$SPOOL/tasks/big200/stdout.log" 2> /dev/null; then
	s3_stop
	s3_down_at=$(task big200 | jq -r .state)
	# A part in flight may only fail by the stall limit (s3.timeout_s, 20 s)
	# and an abort after it: give a loaded machine up to 90 s.
	for _ in $(seq 900); do [ "$(task big200 | jq -r '.last_error // ""')" != "" ] && break; sleep 0.1; done
	task big200 > "$T_TMP/big-down.json"
	s3_start
	if wait_state big200 succeeded 300; then
		task big200 > "$T_TMP/big.json"
		want=$(jq -r .result.stdout "$T_TMP/big.json" | tr -d '\n')
		etag=$(s3py etag acme/big200/outputs/big.bin)
		if [ "$(s3py sha256 acme/big200/outputs/big.bin)" = "$want" ] && [[ $etag == *-1[0-9]\"* ]]; then
			ok "a 200 MiB output goes up as multipart (ETag $etag) and its sha256 matches"
		else not_ok "multipart output" "etag=$etag want=$want"; fi
		if [[ $s3_down_at =~ ^(running|uploading)$ ]] && [ "$(jq -r .state "$T_TMP/big-down.json")" = uploading ] &&
			jq -r .last_error "$T_TMP/big-down.json" | grep -q 's3_unavailable\|s3_error'; then
			ok "S3 stopped mid-upload (at $s3_down_at): the task waits in uploading ($(jq -r .last_error "$T_TMP/big-down.json" | head -c 100)), then finishes"
		else not_ok "S3 down mid-upload" "stopped at $s3_down_at: $(head -c 400 "$T_TMP/big-down.json")"; fi
	else not_ok "big output after S3 came back" "$(task big200 | head -c 600)"; fi
else not_ok "200 MiB task" "$(task big200 | head -c 600)"; fi

# --- SIGKILL while a task runs and another waits for S3; restart recovers ---
s3_stop
submit pending "$(py_spec 'open("/output/p.txt","w").write("pending"); print("p")')" > /dev/null
wait_state pending uploading 60
submit victim "$(sh_spec 'echo started; sleep 600' '{"limits":{"timeout_s":900}}')" > /dev/null
wait_state victim running 60
# Its output reaches the spool's stdout.log as it is printed.
for _ in $(seq 300); do [ "$(cat "$SPOOL/tasks/victim/stdout.log" 2> /dev/null)" = started ] && break; sleep 0.1; done
t_stop "$host_pid" KILL; host_pid=
for _ in $(seq 100); do [ "$(count_qemu)" = "$before_qemu" ] && break; sleep 0.1; done
check "SIGKILL of kiln-host takes its QEMUs with it" [ "$(count_qemu)" = "$before_qemu" ]
s3_start
if start_host; then ok "kiln-host restarts over the old spool"; else not_ok "restart" "$(tail -5 "$T_TMP/host.err")"; fi
wait_state victim error 60
task victim > "$T_TMP/victim.json"
if [ "$(jq -r .result.end_reason "$T_TMP/victim.json")" = host_restart ] && wait_state victim error 60 \
   && [ "$(s3py log acme/victim stdout.log)" = started ]; then
	ok "a task that was running ends as error/host_restart (not run again); its output so far is uploaded"
else not_ok "victim" "$(head -c 600 "$T_TMP/victim.json")"; fi
if wait_state pending succeeded 60 && [ "$(s3py cat acme/pending/outputs/p.txt)" = pending ]; then
	ok "a finished task whose upload was pending is uploaded after the restart"
else not_ok "pending upload" "$(task pending | head -c 600)"; fi
check "finished tasks survive the restart (GET still answers)" [ "$(task conc-3 | jq -r .state)" = succeeded ]

# --- shutdown leaves nothing ---
stop_host
if [ "$(count_qemu)" = "$before_qemu" ] && [ "$(count_run_entries)" = 0 ] && [ "$(count_spool_files)" = 0 ]; then
	ok "after SIGTERM: no QEMU, no run-directory entries, no spooled files but records"
else not_ok "leftovers" "qemu=$(count_qemu) run entries=$(count_run_entries) spool files=$(count_spool_files)"; fi
s3_stop
check "the local S3 server stops completely" [ "$(pgrep -fc "$S3_DIR" || true)" = 0 ]
t_done
