#!/usr/bin/env bash
# Egress benchmark (figures, not pass/fail): what a task with a network policy
# pays at start-up over one without (both restored from a snapshot, no warm
# pool, interleaved), and the throughput a sandbox gets from an allowed
# destination in another network namespace, next to the same download made
# straight from kiln-host's namespace (the baseline: no VM, no NAT, no rules).
# kiln-host runs in its own namespace; all traffic stays on a private bridge.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10}
MB=${EGRESS_MB:-64}
N=$((RANDOM % 200 + 20))
BR=kbb$N
PFX=kiln-bench-eg-$N
NET=198.51.100
TOKEN=bench-token-$RANDOM$RANDOM
TMP=$(mktemp -d /tmp/kiln-bench-egress.XXXXXX)
export KILN_RUN_DIR=${KILN_RUN_DIR:-$TMP/run}
host_pid= peer_pid=
cleanup() {
	for p in $host_pid $peer_pid; do kill "$p" 2> /dev/null || true; done
	for p in $host_pid $peer_pid; do wait "$p" 2> /dev/null || true; done
	ip netns del "$PFX-host" 2> /dev/null || true
	ip netns del "$PFX-peer" 2> /dev/null || true
	ip link del "$BR" 2> /dev/null || true
	[ -n "${KEEP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT

ip link add "$BR" type bridge && ip addr add "$NET.1/24" dev "$BR" && ip link set "$BR" up
for r in host:10 peer:20; do
	ns=$PFX-${r%%:*}
	ip netns add "$ns"
	ip link add "kb$N${r:0:1}" type veth peer name eth0 netns "$ns"
	ip link set "kb$N${r:0:1}" master "$BR" up
	ip -n "$ns" addr add "$NET.${r##*:}/24" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n "$ns" link set lo up
done
nsenter --net="/run/netns/$PFX-peer" python3 tests/integration/egress_peer.py http 0.0.0.0 8080 peer 2> /dev/null &
peer_pid=$!
jq -n --arg listen "$NET.10:7070" --arg token "$TOKEN" --arg spool "$TMP/spool" --arg run "$KILN_RUN_DIR" \
	'{listen: $listen, host_id: "bench", token: $token, spool_dir: $spool, run_dir: $run,
	  capacity: {vcpus: 2}, pool: {size: 0, prestart: 0}, network: {egress: true}}' > "$TMP/host.json"
nsenter --net="/run/netns/$PFX-host" build/kiln-host serve --config "$TMP/host.json" > /dev/null 2> "$TMP/host.err" &
# (a failed run prints its error below instead of figures)
host_pid=$!
for _ in $(seq 1800); do
	curl -s -m 1 "http://$NET.10:7070/healthz" > /dev/null 2>&1 && break
	kill -0 "$host_pid" 2> /dev/null || { echo "kiln-host did not start: $(tail -3 "$TMP/host.err")"; exit 1; }
	sleep 0.2
done
run() { curl -s -m 300 -H "Authorization: Bearer $TOKEN" --data-binary @- "http://$NET.10:7070/v1/run"; }
none='{"language":"python","code":"print(1)"}'
allow='{"language":"python","code":"print(1)","network":{"egress":"allow","allow":["198.51.100.20:8080"]}}'

echo "egress: start-up of print(1) restored from a snapshot, without and with a network ($RUNS runs each, interleaved)"
: > "$TMP/none" && : > "$TMP/allow"
run <<< "$none" > /dev/null
run <<< "$allow" > "$TMP/first"  # the first clone of each template warms the page cache
jq -e .timings "$TMP/first" > /dev/null || { echo "  a task with egress failed: $(head -c 600 "$TMP/first")"; exit 1; }
for _ in $(seq "$RUNS"); do
	run <<< "$none" | jq -r '[.timings.boot_ms, .timings.total_ms] | @tsv' >> "$TMP/none"
	run <<< "$allow" | tee -a "$TMP/allow.json" | jq -r '[.timings.boot_ms, .timings.total_ms, .network.setup_ms] | @tsv' >> "$TMP/allow"
done
med() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "nan" }'; }
[ -s "$TMP/allow" ] && ! grep -qv "^[0-9]" "$TMP/allow" || echo "  (some runs with egress failed: $(head -c 400 "$TMP/allow.json"))"
nb=$(cut -f1 "$TMP/none" | med); nt=$(cut -f2 "$TMP/none" | med)
ab=$(cut -f1 "$TMP/allow" | med); at=$(cut -f2 "$TMP/allow" | med); as=$(cut -f3 "$TMP/allow" | med)
printf '  no network:    boot (start to guest ready) median %5s ms, total %5s ms\n' "$nb" "$nt"
printf '  with egress:   boot median %5s ms (of which network set-up %s ms), total %5s ms\n' "$ab" "$as" "$at"
awk -v a="$ab" -v n="$nb" -v ta="$at" -v tn="$nt" 'BEGIN {
	printf("  extra start-up for egress: %+d ms to guest ready (x%.2f), %+d ms in total (x%.2f)\n", a - n, a / n, ta - tn, ta / tn) }'
echo
echo "egress: download of $MB MB from an allowed destination in another namespace (3 runs)"
dl=$(jq -cn --arg mb "$MB" '{language:"python", limits:{timeout_s:300},
	network:{egress:"allow", allow:["198.51.100.20:8080"]},
	code:("import socket, time\ns = socket.create_connection((\"198.51.100.20\", 8080), timeout=30)\n"
	      + "s.sendall(b\"GET /bytes/" + (($mb | tonumber) * 1000000 | tostring) + " HTTP/1.0\\r\\n\\r\\n\")\n"
	      + "t0 = time.monotonic(); n = 0\nwhile True:\n    c = s.recv(262144)\n    if not c: break\n    n += len(c)\n"
	      + "print(round(n / (time.monotonic() - t0) / 1e6, 1))")}')
for i in 1 2 3; do
	vm=$(run <<< "$dl" | jq -r .stdout | tr -d '\n')
	host=$(nsenter --net="/run/netns/$PFX-host" curl -s -o /dev/null -w '%{speed_download}' \
		"http://$NET.20:8080/bytes/$((MB * 1000000))" | awk '{ printf("%.1f", $1 / 1e6) }')
	printf '  run %d: sandbox (TCG guest, tap, NAT, rules) %6s MB/s; kiln-host namespace directly %7s MB/s\n' "$i" "$vm" "$host"
done
