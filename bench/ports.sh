#!/usr/bin/env bash
# bench/ports.sh: a sandbox's ports through kiln-api (figures, not pass/fail;
# docs/api.md "Ports"). One kiln-api on SQLite, one kiln-host on loopback,
# one session running tests/integration/port_server.py. Side by side, in one
# run:
#   - a small GET (a fresh connection each, RUNS of them) through
#     /v1/sessions/{id}/ports/8000/ vs the same client loop inside the guest
#     against 127.0.0.1:8000: p50 of each and the added latency;
#   - a 50 MiB download through the port vs inside the guest (MiB/s);
#   - a WebSocket echo round trip (p50 over 500 messages);
#   - 100 idle WebSocket connections held open: what they cost in kiln-api's
#     and kiln-host's RSS (and the guest's envd, per connection).
# KILN_API / KILN_HOST: other builds to compare.
set -euo pipefail
cd "$(dirname "$0")/.."
for t in curl jq; do
	command -v "$t" > /dev/null || { echo "bench/ports: $t missing (scripts/deps.sh)" >&2; exit 1; }
done
API=${KILN_API:-build/kiln-api}
HOST=${KILN_HOST:-build/kiln-host}
RUNS=${RUNS:-200}
PY=/usr/bin/python3
tmp=$(mktemp -d /tmp/kiln-bench-ports.XXXXXX)
export KILN_RUN_DIR=$tmp/run
base=$((20000 + RANDOM % 11000))
admin=bench-admin-$RANDOM$RANDOM$RANDOM
token=bench-token-$RANDOM$RANDOM$RANDOM
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2> /dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

jq -n --arg listen "127.0.0.1:$base" --arg admin "$admin" --arg token "$token" --arg db "$tmp/api.db" \
	'{listen: $listen, admin_key: $admin, cluster_token: $token, db: $db, max_connections_per_address: 1024}' > "$tmp/api.json"
"$API" --config "$tmp/api.json" > /dev/null 2> "$tmp/api.err" &
api_pid=$!
pids+=($api_pid)
U=http://127.0.0.1:$base
for _ in $(seq 100); do curl -s -m 1 "$U/healthz" > /dev/null && break; sleep 0.1; done
jq -n --arg listen "127.0.0.1:$((base + 1))" --arg api "$U" --arg token "$token" --arg spool "$tmp/spool" \
	--arg run "$KILN_RUN_DIR" \
	'{listen: $listen, host_id: "bench", api: $api, token: $token, spool_dir: $spool, run_dir: $run,
	  heartbeat_ms: 500, pool: {size: 0, prestart: 0}}' > "$tmp/host.json"
"$HOST" serve --config "$tmp/host.json" > /dev/null 2> "$tmp/host.err" &
host_pid=$!
pids+=($host_pid)
a() { curl -s -m 60 -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' "$@"; }
for _ in $(seq 3000); do
	[ "$(a "$U/v1/admin/hosts" | jq '[.hosts[] | select(.state == "live")] | length')" = 1 ] && break
	sleep 0.2
done
a -X POST --data '{"id":"bench"}' "$U/v1/admin/customers" > /dev/null
key=$(a -X POST "$U/v1/admin/customers/bench/keys" | jq -r .key)
k() { curl -s -m 300 -H "Authorization: Bearer $key" "$@"; }
sid=$(k -H 'Content-Type: application/json' -X POST --data '{}' "$U/v1/sessions" | jq -r .id)
[ -n "$sid" ] && [ "$sid" != null ] || { echo "bench/ports: no session: $(tail -3 "$tmp/api.err")" >&2; exit 1; }
k -X PUT --data-binary @tests/integration/port_server.py "$U/v1/sessions/$sid/files?path=/work/port_server.py" > /dev/null
ex() { k -H 'Content-Type: application/json' -X POST --data-binary "$1" "$U/v1/sessions/$sid/exec"; }
ex '{"argv":["sh","-c","head -c 52428800 /dev/urandom > /tmp/big; python3 /work/port_server.py > /dev/null 2>&1 & for i in $(seq 100); do grep -q \":1F40 \" /proc/net/tcp && break; sleep 0.1; done"]}' > /dev/null
# The client loop, the same inside the guest and here: RUNS GETs, each on a
# fresh connection; prints the times in ms, one a line.
LOOP='import http.client, sys, time
host, port, path, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
hdrs = {"Authorization": sys.argv[5]} if len(sys.argv) > 5 else {}
for i in range(n + 5):
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=60)
    c.request("GET", path, headers=hdrs)
    c.getresponse().read()
    c.close()
    if i >= 5:
        print("%.3f" % ((time.perf_counter() - t0) * 1000))'
printf '%s' "$LOOP" | k -X PUT --data-binary @- "$U/v1/sessions/$sid/files?path=/work/loop.py" > /dev/null
guest_t=$(ex "{\"argv\":[\"python3\",\"/work/loop.py\",\"127.0.0.1\",\"8000\",\"/\",\"$RUNS\"],\"timeout_s\":600}" | jq -r .stdout)
port_t=$(printf '%s' "$LOOP" | $PY - 127.0.0.1 "$base" "/v1/sessions/$sid/ports/8000/" "$RUNS" "Bearer $key")
guest_dl=$(ex '{"argv":["python3","-c","import http.client,time\nt=time.perf_counter()\nc=http.client.HTTPConnection(\"127.0.0.1\",8000)\nc.request(\"GET\",\"/big\")\nr=c.getresponse()\nn=0\nwhile True:\n    d=r.read(65536)\n    if not d: break\n    n+=len(d)\nprint(\"%.1f\" % (n/1048576/(time.perf_counter()-t)))"],"timeout_s":600}' | jq -r .stdout | tr -d '\n')
port_dl=$(k -o /dev/null -w '%{speed_download}' "$U/v1/sessions/$sid/ports/8000/big" | awk '{printf "%.1f", $1 / 1048576}')
ws=$(PORT_HEADERS="Authorization=Bearer $key" $PY tests/integration/port_client.py "$U" ws "/v1/sessions/$sid/ports/8000/ws" 500)
rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
a0=$(rss "$api_pid"); h0=$(rss "$host_pid")
$PY - "$U" "/v1/sessions/$sid/ports/8000/ws" "Bearer $key" > "$tmp/idle.out" 2>&1 << 'PYEOF' &
import base64, os, socket, sys, time, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
socks = []
for i in range(100):
    s = socket.create_connection((u.hostname, u.port), timeout=60)
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
               "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\n\r\n"
               % (sys.argv[2], u.netloc, sys.argv[3], base64.b64encode(os.urandom(16)).decode())).encode())
    h = b""
    while b"\r\n\r\n" not in h:
        h += s.recv(1)
    socks.append(s)
print("open", len(socks), flush=True)
time.sleep(8)
PYEOF
idle_pid=$!
for _ in $(seq 100); do grep -q open "$tmp/idle.out" 2> /dev/null && break; sleep 0.1; done
sleep 1
a1=$(rss "$api_pid"); h1=$(rss "$host_pid")
wait "$idle_pid" || true
k -X DELETE "$U/v1/sessions/$sid" > /dev/null
$PY - "$guest_t" "$port_t" "$guest_dl" "$port_dl" "$ws" "$a0" "$a1" "$h0" "$h1" "$(cat "$tmp/idle.out")" << 'PYEOF'
import statistics, sys
g = sorted(float(x) for x in sys.argv[1].split())
p = sorted(float(x) for x in sys.argv[2].split())
gm, pm = statistics.median(g), statistics.median(p)
print("ports: a small GET, a fresh connection each (%d runs)" % len(p))
print("  inside the guest (127.0.0.1:8000): p50 %.2f ms  p90 %.2f ms" % (gm, g[int(len(g) * 0.9) - 1]))
print("  through kiln-api (/v1/sessions/{id}/ports/8000/): p50 %.2f ms  p90 %.2f ms" % (pm, p[int(len(p) * 0.9) - 1]))
print("  added latency p50: %.2f ms (target <= 5 ms); ratio %.1fx" % (pm - gm, pm / gm))
print("ports: a 50 MiB download: inside the guest %s MiB/s, through the port %s MiB/s (target >= 20)" % (sys.argv[3], sys.argv[4]))
print("ports: WebSocket echo through kiln-api: %s (p50 ms; target <= 10)" % sys.argv[5])
a0, a1, h0, h1 = (int(x) for x in sys.argv[6:10])
print("ports: 100 idle WebSocket connections (%s): kiln-api RSS +%d KiB (%.1f KiB each), kiln-host RSS +%d KiB (%.1f KiB each)"
      % (sys.argv[10].strip(), a1 - a0, (a1 - a0) / 100, h1 - h0, (h1 - h0) / 100))
PYEOF
