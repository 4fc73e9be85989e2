#!/usr/bin/env bash
# A running session's egress rules changed in place (kiln-host's PUT
# /v1/sessions/{id}/network): traffic to a peer in a namespace on this
# machine is blocked, allowed after an update, then blocked again (a flow
# established meanwhile is reset), the sandbox's ruleset is replaced in its
# namespace (sets of host-name rules come and go with their rules), bad
# rules and a session without a network device are refused, and nothing is
# left behind. Numbered 64 (not 100): run.sh takes the scripts in glob
# order, where 100 would sort between 10 and 11; this one belongs beside
# 65-egress, whose namespaces and peers it mirrors.
. "$(dirname "$0")/lib.sh"
t_plan 21
require_image
t_require_tools ip nsenter nft

N=$((RANDOM % 200 + 20))
BR=kubr$N
PFX=kiln-eu-$N
NET=198.51.100       # TEST-NET-2: outside every default deny range
TOKEN=egress-upd-token-$RANDOM$RANDOM
HOST_URL=http://$NET.10:7070
PEER=$ROOT/tests/integration/egress_peer.py

net_bridge "$BR" "$NET.1"
net_ns "$PFX-host" "ku${N}hos" "$NET.10" "$NET.1"
net_ns "$PFX-peer" "ku${N}pee" "$NET.20" "$NET.1"
ip -n "$PFX-peer" addr add 203.0.113.21/32 dev eth0
ip -n "$PFX-host" route add 203.0.113.21/32 via "$NET.20"
ip route add 203.0.113.21/32 via "$NET.20" 2> /dev/null
t_on_exit "ip route del 203.0.113.21/32 via $NET.20 2> /dev/null"
t_bg nsenter --net="/run/netns/$PFX-peer" python3 "$PEER" http 0.0.0.0 8080 allowed 2>> "$T_TMP/peers.err"
t_bg python3 "$PEER" dns "$NET.1" 5353 allowed.test=203.0.113.21 2>> "$T_TMP/peers.err"

host_config "$T_TMP/host.json" "$NET.10:7070" eu \
	".run_dir += \"/eu\" | .capacity = {vcpus: 2}
	 | .network = {egress: true, dns_upstream: \"$NET.1:5353\", link_range: \"10.202.0.0/16\"}"
host_start "$T_TMP/host.json" host "$PFX-host"
if t_serving "$HOST_URL/healthz" "$host_pid"; then ok "kiln-host starts with egress on in its own namespace"
else t_bail "kiln-host starts" "$(tail -5 "$T_TMP/host.err")"; fi

# h METHOD PATH [curl args]: body in $T_TMP/last, status echoed
h() {
	local m=$1 p=$2; shift 2
	curl -s -m 120 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" \
		-H 'Content-Type: application/json' "$@" "$HOST_URL$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
net_put() { h PUT /v1/sessions/$1/network --data-binary "$2"; } # ID BODY
# probe: from inside s1, what the peer's address, the name and its address give.
PROBE='import json, socket
def tcp(ip, port):
    try:
        s = socket.create_connection((ip, port), timeout=1.5)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        d = b""
        while True:
            c = s.recv(4096)
            if not c: break
            d += c
        return d.split(b"\r\n\r\n", 1)[-1].decode()
    except Exception as e:
        return "ERR:" + type(e).__name__
def res(name):
    try: return socket.gethostbyname(name)
    except Exception as e: return "ERR:" + type(e).__name__
print(json.dumps({"ip": tcp("198.51.100.20", 8080), "name": res("allowed.test"), "pinned": tcp("203.0.113.21", 8080)}))'
probe() { # into $T_TMP/probe.json
	h POST /v1/sessions/s1/exec --data-binary "$(jq -cn --arg c "$PROBE" '{language:"python", code:$c}')" > /dev/null
	last .stdout > "$T_TMP/probe.json"
}
pv() { jq -r ".$1" "$T_TMP/probe.json" 2> /dev/null; }
# The sandbox's own namespace: the one thread of kiln-host not in the host's.
sbx_nft() {
	local t
	for t in /proc/"$host_pid"/task/*; do
		[ "$(readlink "$t/ns/net")" != "$(readlink /proc/"$host_pid"/ns/net)" ] || continue
		nsenter --net="$t/ns/net" nft "$@" && return 0
	done
	return 1
}
host_netns() { for t in /proc/"$host_pid"/task/*; do readlink "$t/ns/net"; done 2> /dev/null | sort -u | wc -l; }
host_links() { ip -n "$PFX-host" -o link show | grep -c ': kv' || true; }

# --- a session whose network device reaches nothing yet ---
st=$(h POST /v1/sessions --data-binary '{"id":"s1","customer":"eu","spec":{"network":{"egress":"allow","allow":[]}}}')
if [ "$st" = 201 ]; then ok "a session with egress \"allow\" and no rules yet starts"
else t_bail "session with allow []" "$st $(head -c 600 "$T_TMP/last")"; fi
probe
check "before the update: the peer is blocked, the name refused ($(cat "$T_TMP/probe.json"))" \
	test "$(pv ip)" = ERR:TimeoutError -a "$(pv name)" = ERR:gaierror
sbx_nft list table inet kiln > "$T_TMP/rules0" 2>&1
check "its ruleset is there, with no rule and no host set" \
	test "$(grep -c 'goto sbx_allow' "$T_TMP/rules0")" = 0 -a \
	"$(grep -c 'set host' "$T_TMP/rules0")" = 0 -a "$(grep -c 'chain sbx_forward' "$T_TMP/rules0")" = 1

# --- allowed ---
st=$(net_put s1 '{"allow":["198.51.100.20:8080","allowed.test:8080"]}')
if [ "$st" = 200 ] && [ "$(last '.network.allow | length')" = 2 ]; then ok "PUT .../network answers 200 with the new rules"
else not_ok "update to two rules" "$st $(head -c 600 "$T_TMP/last")"; fi
sbx_nft list table inet kiln > "$T_TMP/rules1" 2>&1
check "the ruleset now has both rules at generation 2 and the host-name rule's set" \
	test "$(grep -c 'ct mark set 0x00000002 goto sbx_allow' "$T_TMP/rules1")" = 2 -a \
	"$(grep -c 'set host1 ' "$T_TMP/rules1")" = 1 -a "$(grep -c 'ct mark set 0x00000001' "$T_TMP/rules1")" = 0
probe
check "after it: the peer answers, the name resolves and its address answers ($(cat "$T_TMP/probe.json"))" \
	test "$(pv ip)" = allowed -a "$(pv name)" = 203.0.113.21 -a "$(pv pinned)" = allowed

# --- a flow established now, then blocked again ---
FLOW='import socket, time
def note(s):
    open("/tmp/flow.tmp", "w").write(s); __import__("os").rename("/tmp/flow.tmp", "/tmp/flow")
try:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096); s.settimeout(60)
    s.connect(("198.51.100.20", 8080)); s.sendall(b"GET /bytes/60000000 HTTP/1.0\r\n\r\n")
    n = 0
    while True:
        c = s.recv(1024)
        if not c: note("eof %d" % n); break
        n += len(c); note("reading %d" % n); time.sleep(0.05)
except Exception as e:
    note("ERR:" + type(e).__name__)'
printf '%s\n' "$FLOW" > "$T_TMP/flow.py"
h PUT "/v1/sessions/s1/files?path=/tmp/flow.py" --data-binary @"$T_TMP/flow.py" -H 'Content-Type: application/octet-stream' > /dev/null
st=$(h POST /v1/sessions/s1/exec --data-binary '{"argv":["sh","-c","nohup python3 /tmp/flow.py > /dev/null 2>&1 &"]}')
flow() { h POST /v1/sessions/s1/exec --data-binary '{"argv":["cat","/tmp/flow"]}' > /dev/null; last .stdout; }
for _ in $(seq 50); do flow | grep -q '^reading' && break; sleep 0.2; done
before=$(flow)
check "a download started in the background is under way ($before)" grep -q '^reading' <<< "$before"
st=$(net_put s1 '{"egress":"allow","allow":[]}')
check "PUT .../network with no rules answers 200" test "$st" = 200 -a "$(last '.network.allow | length')" = 0
for _ in $(seq 50); do flow | grep -q '^ERR' && break; sleep 0.2; done
after=$(flow)
check "the established flow is reset once its destination is no longer allowed ($after)" \
	test "$after" = ERR:ConnectionResetError
probe
check "blocked again: the peer, the name and its pinned address ($(cat "$T_TMP/probe.json"))" \
	test "$(pv ip)" = ERR:TimeoutError -a "$(pv name)" = ERR:gaierror -a "$(pv pinned)" = ERR:TimeoutError
sbx_nft list table inet kiln > "$T_TMP/rules2" 2>&1
check "the ruleset lost the rules and the host-name set, at generation 3" \
	test "$(grep -c 'goto sbx_allow' "$T_TMP/rules2")" = 0 -a "$(grep -c 'set host' "$T_TMP/rules2")" = 0 -a \
	"$(grep -c 'ct mark 0x00000003 goto sbx_pass' "$T_TMP/rules2")" = 1
sbx_nft list chain inet kiln sbx_forward > "$T_TMP/chain2" 2>&1

# --- refused ---
st=$(net_put s1 '{"allow":["198.51.100.20:8080","exa mple.org:443"]}')
check "a malformed rule is a 400 naming it, as at create ($(last .error.message))" \
	test "$st" = 400 -a "$(last .error.code)" = invalid_spec -a "$(last .error.message | grep -c 'network.allow\[1\]')" = 1
st=$(net_put s1 "$(jq -cn '{allow: [range(65) | "198.51.100.20:\(. + 1)"]}')")
check "more than 64 rules is a 400" test "$st" = 400 -a "$(last .error.code)" = invalid_spec
st=$(net_put s1 '{"egress":"none"}')
check "egress \"none\" for a session with a network device is a 400" test "$st" = 400 -a "$(last .error.code)" = invalid_spec
st=$(net_put s1 '{"allow":["198.51.100.20:8080"],"extra":1}')
check "an unknown key is a 400" test "$st" = 400
sbx_nft list chain inet kiln sbx_forward > "$T_TMP/chain3" 2>&1
check "after the refusals the rules are as they were" diff -q "$T_TMP/chain2" "$T_TMP/chain3"
st=$(net_put nosuch '{"allow":[]}')
check "an unknown session is a 404" test "$st" = 404
st=$(h POST /v1/sessions --data-binary '{"id":"s2","customer":"eu","spec":{}}')
st2=$(net_put s2 '{"allow":["198.51.100.20:8080"]}')
check "a session created without egress has no device to change: 409 no_network ($(last .error.message | head -c 120))" \
	test "$st" = 201 -a "$st2" = 409 -a "$(last .error.code)" = no_network

# --- nothing left ---
h DELETE /v1/sessions/s1 > /dev/null
h DELETE /v1/sessions/s2 > /dev/null
for _ in $(seq 50); do [ "$(host_netns)" = 1 ] && [ "$(host_links)" = 0 ] && break; sleep 0.1; done
check "once destroyed its namespace (tap, rules) and veth are gone" test "$(host_netns)" = 1 -a "$(host_links)" = 0
t_stop "$host_pid"; host_pid=
t_nothing_left "nothing left: QEMU, run directories, cgroups, namespaces, bridge"
t_done
