#!/usr/bin/env bash
# A client that stops reading a session's exec stream must not hold the
# session: 20 MB of `yes` streamed to a client that never reads still ends at its
# timeout_s, the session takes the next command and DELETE succeeds; the
# stream says that events were dropped and still ends with the result.
. "$(dirname "$0")/lib.sh"
require_image
command -v python3 > /dev/null || { echo "1..0 # SKIP python3 missing"; exit 0; }

TOKEN=stall-token-$RANDOM$RANDOM
PORT=$((20000 + RANDOM % 20000))
hpid=
stall_pid=
cleanup() {
	[ -n "$stall_pid" ] && kill "$stall_pid" 2> /dev/null
	[ -n "$hpid" ] && kill "$hpid" 2> /dev/null && wait "$hpid" 2> /dev/null
	t_cleanup
}
trap cleanup EXIT
before_q=$(count_qemu)
before_cg=$(count_cgroups)

jq -n --arg port "$PORT" --arg token "$TOKEN" --arg spool "$T_TMP/spool" --arg run "$KILN_RUN_DIR" \
	'{listen: ("127.0.0.1:" + $port), host_id: "stall", token: $token, spool_dir: $spool, run_dir: $run,
	  capacity: {vcpus: 2, cpu_overcommit: 2}, pool: {size: 0, prestart: 0}}' > "$T_TMP/host.json"
"$KILN_HOST" serve --config "$T_TMP/host.json" > "$T_TMP/host.out" 2> "$T_TMP/host.err" &
hpid=$!
for _ in $(seq 1800); do
	curl -s -m 1 "http://127.0.0.1:$PORT/healthz" > /dev/null && break
	sleep 0.2
done
h() { # METHOD PATH [curl args]: body in $T_TMP/last, status echoed
	local m=$1 p=$2; shift 2
	curl -s -m 120 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "http://127.0.0.1:$PORT$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }

st=$(h POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"s1","customer":"acme","spec":{}}')
if [ "$st" = 201 ]; then ok "a session starts"
else not_ok "a session starts" "HTTP $st $(head -c 300 "$T_TMP/last") $(tail -3 "$T_TMP/host.err")"; exit 1; fi

# The stalled client: a 4 KiB receive buffer, the request sent, then nothing
# read for 75 s (its socket stays open); afterwards it reads what is there.
PORT=$PORT TOKEN=$TOKEN OUT=$T_TMP/stalled python3 - > /dev/null 2>&1 << 'EOF' &
import os, socket, time
body = b'{"argv":["sh","-c","yes kiln stall test line | head -c 20000000; exec sleep 300"],"timeout_s":5}'
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(("127.0.0.1", int(os.environ["PORT"])))
s.sendall(b"POST /v1/sessions/s1/exec?stream=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
          os.environ["TOKEN"].encode() + b"\r\nContent-Type: application/json\r\nContent-Length: " +
          str(len(body)).encode() + b"\r\n\r\n" + body)
time.sleep(75)
s.settimeout(30)
raw = bytearray()
try:
    while True:
        d = s.recv(1 << 20)
        if not d:
            break
        raw += d
except Exception:
    pass
# The body, chunked transfer encoding undone.
head, _, rest = bytes(raw).partition(b"\r\n\r\n")
body = bytearray()
while rest:
    size, _, rest = rest.partition(b"\r\n")
    n = int(size.split(b";")[0] or b"0", 16)
    if n == 0:
        break
    body += rest[:n]
    rest = rest[n + 2:]
open(os.environ["OUT"], "wb").write(body)
EOF
stall_pid=$!

# The command runs while nobody reads; at its 5 s timeout it must end: the
# next command is taken (not 409 busy) within a bound far past the timeout
# and well before the client reads again (75 s).
t0=$(date +%s)
st=
for _ in $(seq 50); do
	sleep 1
	st=$(h POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary '{"argv":["echo","next"]}')
	[ "$st" = 200 ] && break
done
t_next=$(($(date +%s) - t0))
echo "# the next command was taken ${t_next} s after the stalled stream began (timeout_s 5; HTTP $st)"
check "with the stream unread, yes still ends at its timeout: the next command runs" \
	test "$st" = 200 -a "$(last .stdout)" = next
st=$(h DELETE /v1/sessions/s1)
check "DELETE of the session succeeds while the stalled client is connected" test "$st" = 200

# Once the client reads again: well-formed events, a "dropped" notice, the result last.
wait "$stall_pid"
stall_pid=
grep -q '^event: dropped$' "$T_TMP/stalled"
check "the stalled stream says its later output was dropped" test $? = 0
lastev=$(grep '^event: ' "$T_TMP/stalled" | tail -1)
check "the stalled stream still ends with the command's result" test "$lastev" = "event: result"
reason=$(python3 -c '
import json, sys
ev, res = None, None
for line in open(sys.argv[1], "rb"):
    line = line.rstrip(b"\r\n")
    if line.startswith(b"event: "):
        ev = line[7:]
    elif line.startswith(b"data: ") and ev == b"result":
        res = json.loads(line[6:])
print(res.get("end_reason") if res else "none")' "$T_TMP/stalled" 2>&1 | tail -1)
check "the result says the command timed out (end_reason $reason)" test "$reason" = timeout
echo "# stalled stream: $(wc -c < "$T_TMP/stalled") bytes, $(grep -c '^event: stdout$' "$T_TMP/stalled") stdout events"

kill "$hpid" 2> /dev/null
wait "$hpid" 2> /dev/null
hpid=
check "no QEMU process outlives the session" test "$(count_qemu)" = "$before_q"
check "no cgroup outlives the session" test "$(count_cgroups)" = "$before_cg"
t_done
