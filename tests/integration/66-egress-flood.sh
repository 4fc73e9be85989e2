#!/usr/bin/env bash
# Issue 13 item 4: one sandbox's blocked flows must not stall the others.
# A guest sends UDP from every source port it can bind to one blocked
# destination (each datagram a new flow to kiln-host's accounting) while a
# second sandbox on the same kiln-host is set up and resolves names; its
# network set-up and its DNS answers must stay quick (< 1 s each: the margin
# is wide, the figures are printed). Traffic only between namespaces on this
# machine: the blocked destination is dropped in the flooding sandbox's own
# namespace, the resolver is a peer on a private bridge.
. "$(dirname "$0")/lib.sh"
t_plan 6
require_image
t_require_tools ip nsenter nft swift-proxy-server

N=$((RANDOM % 200 + 20))
BR=kfbr$N
PFX=kiln-fl-$N
NET=198.51.100       # TEST-NET-2: outside every default deny range
TOKEN=flood-token-$RANDOM$RANDOM$RANDOM
HOST_URL=http://$NET.10:7070
PEER=$ROOT/tests/integration/egress_peer.py
host_pid=
peer_pids=()


before_cg=$(count_cgroups)
net_bridge "$BR" "$NET.1"
net_ns "$PFX-host" "kf${N}h" "$NET.10" "$NET.1"
t_bg python3 "$PEER" dns "$NET.1" 5353 allowed.test=203.0.113.21 2>> "$T_TMP/peers.err"
peer_pids+=("$T_BG_PID")

s3_local_start "$NET.1"

BUCKET=kiln-flood host_config "$T_TMP/host.json" "$NET.10:7070" fl \
	".run_dir += \"/fl\" | .capacity = {vcpus: 2} | .network = {egress: true, dns_upstream: \"$NET.1:5353\", link_range: \"10.202.0.0/16\"}"
hc() { # PATH [curl args]: a request to kiln-host from the root namespace
	local p=$1; shift
	curl -s -m 120 -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' "$@" "$HOST_URL/${p#/}"
}
t_bg nsenter --net="/run/netns/$PFX-host" "$KILN_HOST" serve --config "$T_TMP/host.json" >> "$T_TMP/host.out" 2>> "$T_TMP/host.err"
host_pid=$T_BG_PID
if t_serving "$HOST_URL/healthz" "$host_pid"; then ok "kiln-host starts with egress on in its own namespace"
else t_bail "kiln-host starts" "$(tail -5 "$T_TMP/host.err")"; fi

submit() { jq -cn --arg id "$1" --argjson spec "$2" '{id:$id, customer:"fl", spec:$spec}' | hc v1/tasks -X POST --data-binary @- > "$T_TMP/$1.post"; }
wait_task() {
	for _ in $(seq 900); do
		hc "v1/tasks/$1" > "$T_TMP/$1.json"
		jq -e '.state | test("^(succeeded|failed|error|cancelled|timed_out)$")' "$T_TMP/$1.json" > /dev/null 2>&1 && return 0
		sleep 0.2
	done
	return 1
}

# The flood: a new socket bound to the next source port for each datagram,
# to a destination no rule allows; each round over the ports another
# destination port, so that every datagram is a new flow (bounded: 50 s).
FLOOD='import socket, time
t0 = time.monotonic(); n = 0; dport = 9
while time.monotonic() - t0 < 50:
    for p in range(1024, 65536):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.bind(("0.0.0.0", p)); s.sendto(b"x", ("198.51.100.30", dport)); n += 1
        except OSError:
            pass
        s.close()
        if p % 256 == 0 and time.monotonic() - t0 >= 50: break
    dport += 1
print(n, round(time.monotonic() - t0, 1))'
# A victim: resolves an allowlisted name 20 times, each answer timed in the guest.
VICTIM='import socket, time
w = []
for i in range(20):
    t = time.monotonic()
    try: socket.gethostbyname("allowed.test")
    except Exception: w.append(99999); continue
    w.append(round((time.monotonic() - t) * 1000))
print(max(w), sum(w) // len(w))'
POL='{"network":{"egress":"allow","allow":["allowed.test:8080"]},"limits":{"timeout_s":120}}'
submit flood "$(py_spec "$FLOOD" "$POL")"
# Let the flood fill the blocked-flow accounting before the victims start;
# three victims one after the other while it goes on.
for _ in $(seq 900); do [ "$(hc v1/tasks/flood | jq -r .state)" = running ] && break; sleep 0.2; done
sleep 12
setups=() dmax=0 dsum=0 vok=1
for v in 1 2 3; do
	submit victim$v "$(py_spec "$VICTIM" "$POL")"
	wait_task victim$v
	[ "$(r victim$v .state)" = succeeded ] || vok=0
	setups+=("$(r victim$v .result.network.setup_ms)")
	m=$(r victim$v .result.stdout | awk '{print $1}'); a=$(r victim$v .result.stdout | awk '{print $2}')
	[ "${m:-99999}" -gt "$dmax" ] && dmax=${m:-99999}
	dsum=$((dsum + ${a:-99999}))
done
flood_state=$(hc v1/tasks/flood | jq -r .state)
wait_task flood
setup_max=$(printf '%s\n' "${setups[@]}" | sed 's/^null$/99999/; s/^$/99999/' | sort -n | tail -1)
echo "# flood: $(r flood .result.stdout) (datagrams sent, seconds); blocked_connections $(r flood .result.network.blocked_connections); still $flood_state after the victims"
echo "# victims: network set-up ${setups[*]} ms; DNS answers max $dmax ms, mean of means $((dsum / 3)) ms"
if [ "$(r flood .state)" = succeeded ] && [ "$(r flood .result.stdout | awk '{print $1}')" -ge 20000 ] && [ "$flood_state" = running ]; then
	ok "the flooding task sent $(r flood .result.stdout | awk '{print $1}') datagrams from distinct source ports, still running after the victims"
else not_ok "the flood ran through the victims" "still $flood_state; $(head -c 800 "$T_TMP/flood.json")"; fi
# Bounds for a loaded 2-core machine under TCG, not figures to meet (those
# are bench/'s): what they catch is a flood that starves the others, which
# shows as a set-up of many seconds, or a DNS answer lost (99999) or retried
# after the resolver's 5 s timeout.
if [ $vok = 1 ] && [ "$setup_max" -lt 10000 ]; then
	ok "other sandboxes' network set-up during the flood: ${setups[*]} ms (each < 10000)"
else not_ok "victim network set-up under 10 s" "setup_ms: ${setups[*]}; $(head -c 600 "$T_TMP/victim1.json")"; fi
if [ $vok = 1 ] && [ "$dmax" -lt 4000 ]; then
	ok "their DNS answers during the flood: max $dmax ms (< 4000: none lost or retried)"
else not_ok "victim DNS answers under 4 s" "max=$dmax; $(r victim1 .result.stdout) $(r victim2 .result.stdout) $(r victim3 .result.stdout)"; fi

t_stop "$host_pid"; host_pid=
check "no QEMU, VM directories or cgroups left" \
	test "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR/fl" -mindepth 1 | wc -l)" = 0 -a "$(count_cgroups)" = "$before_cg"
net_down
check "namespaces and bridge removed ($(net_left) left)" test "$(net_left)" = 0
t_done
