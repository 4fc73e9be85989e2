#!/usr/bin/env bash
# A running session's egress rules changed in place (kiln-host's PUT
# /v1/sessions/{id}/network): traffic to a peer in a namespace on this
# machine is blocked, allowed after an update, then blocked again (a flow
# established meanwhile is reset), the sandbox's ruleset is replaced in its
# namespace (sets of host-name rules come and go with their rules), bad
# rules and a session without a network device are refused, and nothing is
# left behind. Then the same through kiln-api: E2B's updateNetwork (curl
# on PUT /e2b/sandboxes/{id}/network; this script's stack is the only one
# with an egress-capable host, so the SDK's own check is not in
# tests/e2b/sdk_test.mjs), create's allowOut/denyOut, getInfo's network, the
# rules surviving a pause and a resume (kiln-api's stored spec, the
# manifest's), and the native PUT /v1/sessions/{id}/network. Numbered 64 (not 100): run.sh takes the scripts in glob
# order, where 100 would sort between 10 and 11; this one belongs beside
# 65-egress, whose namespaces and peers it mirrors.
. "$(dirname "$0")/lib.sh"
t_plan 33
require_image
t_require_tools ip nsenter nft swift-proxy-server memcached
t_require_built kiln-api kiln-host

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
lastc() { jq -c "$1" "$T_TMP/last" 2> /dev/null; }
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

h DELETE /v1/sessions/s1 > /dev/null
h DELETE /v1/sessions/s2 > /dev/null
for _ in $(seq 50); do [ "$(host_netns)" = 1 ] && [ "$(host_links)" = 0 ] && break; sleep 0.1; done
check "once destroyed its namespace (tap, rules) and veth are gone" test "$(host_netns)" = 1 -a "$(host_links)" = 0
t_stop "$host_pid"; host_pid=

# --- through kiln-api: E2B's updateNetwork and the native endpoint ---
BUCKET=kiln-egress-upd
s3_local_start "$NET.1"
ADMIN=egress-upd-admin-$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 10000))
API=http://$NET.1:$API_PORT
api_config "$T_TMP/api.json" "$NET.1:$API_PORT" '. + {host_lost_after_s: 5, quotas: {submit_rate: 1000, submit_burst: 1000}}'
api_up "$T_TMP/api.json" "$API"
host_config "$T_TMP/host2.json" "$NET.10:7070" eu \
	".run_dir += \"/eu\" | .capacity = {vcpus: 2} | .api = \"$API\" | .heartbeat_ms = 500
	 | .network = {egress: true, dns_upstream: \"$NET.1:5353\", link_range: \"10.202.0.0/16\"}"
host_start "$T_TMP/host2.json" host2 "$PFX-host"
wait_live 1 120 || t_bail "kiln-host registers with kiln-api" "$(tail -3 "$T_TMP/host2.err")"
KEY=$(new_customer acme '{"name":"Acme"}')
admin -X PUT --data '{"allow_egress":true}' "$API/v1/admin/customers/acme/quotas" > /dev/null
# e2b METHOD PATH [curl args]: the control API as acme; body in $T_TMP/last, status echoed
e2b() {
	local m=$1 p=$2; shift 2
	curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "X-API-KEY: $KEY" \
		-H 'Content-Type: application/json' "$@" "$API/e2b$p"
}
# native METHOD PATH [curl args]: kiln's own API as acme
native() {
	local m=$1 p=$2; shift 2
	curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $KEY" \
		-H 'Content-Type: application/json' "$@" "$API$p"
}
aprobe() { # the probe in sandbox $SB, through kiln-api's exec
	native POST "/v1/sessions/$SB/exec" --data-binary "$(jq -cn --arg c "$PROBE" '{language:"python", code:$c}')" > /dev/null
	last .stdout > "$T_TMP/probe.json"
}
st=$(e2b POST /v2/sandboxes --data-binary '{"templateID":"base","timeout":900,"network":{"allowOut":["198.51.100.20"],"denyOut":["0.0.0.0/0"]}}')
SB=$(last .sandboxID)
cp "$T_TMP/last" "$T_TMP/create.json"
st2=$(native GET "/v1/sessions/$SB")
if [ "$st" = 201 ] && [ "$st2" = 200 ] && [ "$(lastc .network.allow)" = '["198.51.100.20:1-65535"]' ]; then
	ok "E2B create with allowOut and denyOut [0.0.0.0/0]: 201, stored as kiln's rule on every port"
else t_bail "E2B create with allowOut" "$st $(head -c 600 "$T_TMP/create.json"); $st2 $(head -c 600 "$T_TMP/last")"; fi
aprobe
check "the allowOut address answers, the name is refused ($(cat "$T_TMP/probe.json"))" \
	test "$(pv ip)" = allowed -a "$(pv name)" = ERR:gaierror
st=$(e2b PUT "/sandboxes/$SB/network" --data-binary '{"allowOut":["allowed.test"],"denyOut":["0.0.0.0/0"]}')
check "updateNetwork (PUT /e2b/sandboxes/{id}/network) with a host name: 204" test "$st" = 204
aprobe
check "now the address is blocked and the name resolves and answers ($(cat "$T_TMP/probe.json"))" \
	test "$(pv ip)" = ERR:TimeoutError -a "$(pv name)" = 203.0.113.21 -a "$(pv pinned)" = allowed
st=$(e2b GET "/sandboxes/$SB")
check "getInfo's network shows allowOut [allowed.test], denyOut [0.0.0.0/0]" \
	test "$st" = 200 -a "$(lastc .network.allowOut)" = '["allowed.test"]' -a "$(lastc .network.denyOut)" = '["0.0.0.0/0"]'
st=$(e2b PUT "/sandboxes/$SB/network" --data-binary '{"denyOut":["8.8.8.8"]}')
st2=$(e2b PUT "/sandboxes/$SB/network" --data-binary '{"egressProxy":{"address":"proxy.example:1080"}}')
check "a partial denyOut and an egressProxy are 400s ($(last .message))" test "$st" = 400 -a "$st2" = 400
st=$(e2b POST "/sandboxes/$SB/pause")
st2=$(e2b POST "/v2/sandboxes/$SB/connect" --data-binary '{"timeout":900}')
aprobe
check "after a pause and a resume the updated rules hold ($st, $st2: $(cat "$T_TMP/probe.json"))" \
	test "$st" = 204 -a "$st2" = 201 -a "$(pv ip)" = ERR:TimeoutError -a "$(pv name)" = 203.0.113.21 -a "$(pv pinned)" = allowed
st=$(e2b PUT "/sandboxes/$SB/network" --data-binary '{}')
aprobe
check "updateNetwork({}) clears the lists: every public address ($st: $(cat "$T_TMP/probe.json"))" \
	test "$st" = 204 -a "$(pv ip)" = allowed -a "$(pv name)" = ERR:gaierror
st=$(native PUT "/v1/sessions/$SB/network" --data-binary '{"allow":[]}')
aprobe
check "the native PUT /v1/sessions/{id}/network with no rules: 200, nothing reachable ($(cat "$T_TMP/probe.json"))" \
	test "$st" = 200 -a "$(pv ip)" = ERR:TimeoutError -a "$(pv name)" = ERR:gaierror
st=$(e2b POST /v2/sandboxes --data-binary '{"templateID":"base"}')
SB2=$(last .sandboxID)
st2=$(e2b PUT "/sandboxes/$SB2/network" --data-binary '{}')
check "a sandbox created without internet access has no device to change: 409 ($(last .message | head -c 100))" \
	test "$st" = 201 -a "$st2" = 409
st=$(e2b PUT /sandboxes/nosuch/network --data-binary '{}')
check "an unknown sandbox: 404" test "$st" = 404
e2b DELETE "/sandboxes/$SB" > /dev/null
e2b DELETE "/sandboxes/$SB2" > /dev/null

# --- nothing left ---
for _ in $(seq 100); do [ "$(host_netns)" = 1 ] && [ "$(host_links)" = 0 ] && break; sleep 0.1; done
check "every sandbox's namespace and veth are gone" test "$(host_netns)" = 1 -a "$(host_links)" = 0
t_stop "$host_pid"; host_pid=
t_stop "$api_pid"; api_pid=
t_nothing_left "nothing left: QEMU, run directories, cgroups, namespaces, bridge"
t_done
