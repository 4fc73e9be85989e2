#!/usr/bin/env bash
# A task's output batched by kiln-init (docs/protocol.md, "Output"), through
# kiln-host serve and a real S3: 1,000,000 unbuffered Python lines arrive
# complete and in order (count and sha256, in the task's stdout.log in S3,
# and on `kiln-host run --stream`'s stdout events);
# interleaved stdout/stderr writes keep each stream's order; the output cap
# still truncates exactly (the first output_mib bytes); a line printed before
# a sleep is on GET /v1/tasks/ID/events within 100 ms of being printed
# (the guest's clock is set by the host), while the task still sleeps (the
# batch delay flushes it, not the task's exit). Terminals stay immediate:
# 67-session, 75-sessions and 90-cli cover them.
. "$(dirname "$0")/lib.sh"
t_plan 7
require_image

t_require_tools swift-proxy-server memcached jq curl
PY=/usr/bin/python3
t_require_python boto3

S3_DIR=$T_TMP/s3
TOKEN=it-token-$RANDOM$RANDOM
PORT=$((20000 + RANDOM % 12000))
URL=http://127.0.0.1:$PORT
BUCKET=kiln-outbatch
host_pid=


before_qemu=$(count_qemu)
s3_local_start

host_config "$T_TMP/host.json" "127.0.0.1:$PORT" it-outbatch \
	'.capacity.cpu_overcommit = 4 | .pool = {size: 1, prestart: 1} | .s3 += {attempts: 2, timeout_s: 30}
	 | .upload = {workers: 2, max_backoff_s: 2}'
host_start "$T_TMP/host.json" host
started=0
for _ in $(seq 1200); do
	[ "$(curl -s --max-time 2 -H "Authorization: Bearer $TOKEN" "$URL/v1/capacity" | jq -r .pool.ready 2> /dev/null)" = 1 ] && { started=1; break; }
	kill -0 "$host_pid" 2> /dev/null || break
	sleep 0.1
done
if [ $started = 1 ]; then ok "kiln-host serve starts with a pool VM"
else t_bail "kiln-host starts" "$(tail -5 "$T_TMP/host.err")"; fi

api() {
	local m=$1 p=$2; shift 2
	curl -s --max-time 60 -o "$T_TMP/last.json" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "$URL$p"
}
submit() {
	jq -cn --arg id "$1" --argjson spec "$2" '{id: $id, customer: "acme", spec: $spec}' \
		| api POST /v1/tasks -H 'Content-Type: application/json' --data-binary @-
}
task() { curl -s --max-time 10 -H "Authorization: Bearer $TOKEN" "$URL/v1/tasks/$1"; }
# wait_done ID [SECONDS]: until the task is final and its logs are in S3
wait_done() {
	local deadline=$((SECONDS + ${2:-180})) st
	while [ $SECONDS -lt $deadline ]; do
		task "$1" > "$T_TMP/$1.json"
		st=$(jq -r .state "$T_TMP/$1.json" 2> /dev/null)
		if [[ $st =~ ^(succeeded|failed|error|timed_out|cancelled)$ ]] \
		   && [ "$(jq -r '[.artifacts["stdout.log"], .artifacts["stderr.log"]] | map(select(.s3_key or .inline)) | length' "$T_TMP/$1.json" 2> /dev/null)" = 2 ]; then
			return 0
		fi
		sleep 0.2
	done
	echo "task $1: state $st" >&2
	return 1
}
# s3py cat|sha KEY
s3py() {
	S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY BUCKET=$BUCKET $PY -c '
import boto3, hashlib, os, sys
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                  aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"],
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))
body = s3.get_object(Bucket=os.environ["BUCKET"], Key=sys.argv[2])["Body"].read()
if sys.argv[1] == "cat":
    sys.stdout.buffer.write(body)
else:
    print(len(body), body.count(b"\n"), hashlib.sha256(body).hexdigest())
' "$@"
}
# lines N [PREFIX]: the expected text of N lines, as the tasks below print them
lines() { $PY -c 'import sys
p = sys.argv[2] if len(sys.argv) > 2 else ""
sys.stdout.write("".join(p + "%040d\n" % i for i in range(int(sys.argv[1]))))' "$@"; }
spec_env='{"env":{"PYTHONUNBUFFERED":"1"},"limits":{"timeout_s":300,"output_mib":64}}'

# --- 1,000,000 lines, one write each ---
N=1000000
code='import sys
for i in range(1000000): sys.stdout.write("%040d\n" % i)'
st=$(submit many "$(py_spec "$code" "$spec_env")")
want=$(lines $N | $PY -c 'import hashlib, sys; b = sys.stdin.buffer.read(); print(len(b), b.count(b"\n"), hashlib.sha256(b).hexdigest())')
got=
if [ "$st" = 202 ] && wait_done many 600; then got=$(s3py sha acme/many/stdout.log 2> "$T_TMP/s3py.err"); fi
if [ "$(jq -r .state "$T_TMP/many.json")" = succeeded ] && [ -n "$got" ] && [ "$got" = "$want" ] \
   && [ "$(jq -r .result.end_reason "$T_TMP/many.json")" = exited ]; then
	ok "1,000,000 unbuffered lines arrive complete and in order (stdout.log in S3: $got)"
else not_ok "1,000,000 lines in S3" "submit $st want=$want got=$got" "$(head -c 600 "$T_TMP/many.json")" "$(tail -3 "$T_TMP/s3py.err" 2> /dev/null)"; fi

# The same on stdout: `kiln-host run --stream` prints each output chunk as a
# JSON line as it comes; their concatenation is the task's stdout.
py_spec "$code" "$spec_env" > "$T_TMP/many-spec.json"
"$KILN_HOST" run --spec "$T_TMP/many-spec.json" --stream 2> "$T_TMP/many-run.err" | $PY -c '
import hashlib, json, sys
h, n, nl, last = hashlib.sha256(), 0, 0, {}
for raw in sys.stdin:
    ev = json.loads(raw)
    if ev.get("stream") == "stdout":
        b = ev["data"].encode()
        h.update(b); n += len(b); nl += b.count(b"\n")
    elif ev.get("stream") == "result":
        last = ev
print(n, nl, h.hexdigest(), last.get("state"))' > "$T_TMP/many-run.out" 2>> "$T_TMP/many-run.err"
got=$(cat "$T_TMP/many-run.out")
if [ "$got" = "$want succeeded" ]; then
	ok "1,000,000 unbuffered lines arrive complete and in order on kiln-host run --stream's stdout"
else not_ok "1,000,000 lines on stdout" "want=$want succeeded got=$got" "$(tail -3 "$T_TMP/many-run.err")"; fi

# --- interleaved stdout/stderr: each stream keeps its order ---
code='import sys
for i in range(30000):
    sys.stdout.write("o%040d\n" % i)
    sys.stderr.write("e%040d\n" % i)'
st=$(submit mixed "$(py_spec "$code" "$spec_env")")
got_o= got_e=
if [ "$st" = 202 ] && wait_done mixed 300; then
	got_o=$(s3py sha acme/mixed/stdout.log 2> "$T_TMP/s3py.err")
	got_e=$(s3py sha acme/mixed/stderr.log 2>> "$T_TMP/s3py.err")
fi
want_o=$(lines 30000 o | $PY -c 'import hashlib, sys; b = sys.stdin.buffer.read(); print(len(b), b.count(b"\n"), hashlib.sha256(b).hexdigest())')
want_e=$(lines 30000 e | $PY -c 'import hashlib, sys; b = sys.stdin.buffer.read(); print(len(b), b.count(b"\n"), hashlib.sha256(b).hexdigest())')
if [ "$(jq -r .state "$T_TMP/mixed.json")" = succeeded ] && [ "$got_o" = "$want_o" ] && [ "$got_e" = "$want_e" ]; then
	ok "30,000 alternating stdout/stderr writes: each stream complete and in its own order"
else not_ok "interleaved streams" "stdout want=$want_o got=$got_o" "stderr want=$want_e got=$got_e" "$(head -c 600 "$T_TMP/mixed.json")"; fi

# --- the output cap truncates exactly: the first 1 MiB, in write order ---
code='import sys
for i in range(200000): sys.stdout.write("%040d\n" % i)'
st=$(submit capped "$(py_spec "$code" '{"env":{"PYTHONUNBUFFERED":"1"},"limits":{"timeout_s":300,"output_mib":1}}')")
got=
if [ "$st" = 202 ] && wait_done capped 300; then got=$(s3py sha acme/capped/stdout.log 2> "$T_TMP/s3py.err"); fi
want=$(lines 30000 | head -c 1048576 | $PY -c 'import hashlib, sys; b = sys.stdin.buffer.read(); print(len(b), b.count(b"\n"), hashlib.sha256(b).hexdigest())')
if [ "$(jq -r .result.end_reason "$T_TMP/capped.json")" = output_limit ] && [ "$(jq -r .result.stdout_truncated "$T_TMP/capped.json")" = true ] \
   && [ -n "$got" ] && [ "$got" = "$want" ]; then
	ok "the output cap truncates exactly: stdout.log is the first 1 MiB of what the task wrote ($got)"
else not_ok "output cap" "want=$want got=$got" "$(head -c 800 "$T_TMP/capped.json")"; fi

# --- a line printed before a sleep is on the event stream at once ---
# Arrival times on the host: after 1 s (the stream is open by then), 'one'
# carrying the guest's time.time() (the host sets the guest's clock), then
# 'two' 2 s later, then 5 s of sleep. 'one' must be on the stream within
# 100 ms of being printed; batched until the exit (or a size), both would
# come together at the end.
code='import time
time.sleep(1); print("one", repr(time.time())); time.sleep(2); print("two"); time.sleep(5)'
st=$(submit live "$(py_spec "$code" '{"limits":{"timeout_s":120}}')")
$PY - "$URL/v1/tasks/live/events" "$TOKEN" > "$T_TMP/live.times" 2> "$T_TMP/live.err" <<'EOF'
import json, sys, time, urllib.request
req = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
t = {}
lat = None
ev = None
part = ""  # stdout since the last newline: an event may end inside a line
with urllib.request.urlopen(req, timeout=120) as r:
    for raw in r:
        line = raw.decode().rstrip("\n")
        now = time.monotonic()
        if line.startswith("event: "):
            ev = line[7:]
        elif line.startswith("data: "):
            d = json.loads(line[6:])
            if ev == "stdout":
                part += d.get("data", "")
                *whole, part = part.split("\n")
                for l in whole:
                    w = l.split()[0] if l.split() else ""
                    if w in ("one", "two") and w not in t:
                        t[w] = now
                        if w == "one":
                            lat = time.time() - float(l.split()[1])
            if ev == "state" and d.get("state") in ("succeeded", "failed", "error", "timed_out", "cancelled"):
                t["end"] = now
                break
out = {k: round(v - t.get("one", v), 3) for k, v in t.items()}
out["latency"] = round(lat, 4) if lat is not None else None
print(json.dumps(out))
EOF
times=$(cat "$T_TMP/live.times")
gap=$(jq -r '.two // empty' <<< "$times" 2> /dev/null)
lat=$(jq -r '.latency // empty' <<< "$times" 2> /dev/null)
tail_s=$(jq -r 'if .two and .end then .end - .two else empty end' <<< "$times" 2> /dev/null)
if [ "$st" = 202 ] && [ -n "$gap" ] && [ -n "$tail_s" ] && [ -n "$lat" ] \
   && $PY -c "import sys; sys.exit(not ($lat < 0.1 and 1.0 < $gap < 3.0 and $tail_s > 4.0))"; then
	ok "a printed line is on the event stream $(awk -v l="$lat" 'BEGIN { printf "%.0f", l * 1000 }') ms after the print, while the task sleeps ('two' $gap s after 'one', $tail_s s before the end)"
else not_ok "live output" "submit $st times=$times (the latency must be under 0.1 s)" "$(tail -3 "$T_TMP/live.err")"; fi

kill "$host_pid" 2> /dev/null
wait "$host_pid" 2> /dev/null
host_pid=
check "no QEMU is left running" [ "$(count_qemu)" = "$before_qemu" ]
t_done
