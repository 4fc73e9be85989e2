#!/usr/bin/env bash
# A sandbox's ports through kiln-api (docs/api.md "Ports", docs/e2b.md
# "Ports"): servers in a session (port_server.py) reached with curl and
# port_client.py at /v1/sessions/{id}/ports/{port}/... with the customer's
# key and by E2B's header routing (E2b-Sandbox-Id, E2b-Sandbox-Port) for a
# sandbox made through /e2b: small GETs, 20 MiB down and up (Content-Length
# and chunked) by sha256, the headers the server sees (no kiln key), an
# event stream, a WebSocket echoing 1,000 messages, 100 connections at once,
# a port nobody listens on (502), no key (401), another customer's key and a
# non-E2B session by header (E2B's 502 "The sandbox was not found"), a smuggling attempt refused before the
# server, a paused session (409), and nothing left behind.
. "$(dirname "$0")/lib.sh"
t_plan 41
require_image
t_require_tools swift-proxy-server memcached jq curl
t_require_built kiln-api kiln-host
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
TOKEN=ports-token-$RANDOM$RANDOM$RANDOM
ADMIN=ports-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 10000))
URL=http://127.0.0.1:$API_PORT
BUCKET=kiln-ports
s3_local_start
t_mark

api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" ". + {sandbox_domain: \"kiln.localhost:$API_PORT\", max_connections_per_address: 256, quotas: {submit_rate: 1000, submit_burst: 1000}}"
api_up "$T_TMP/api.json" "$URL"
host_config "$T_TMP/h1.json" "127.0.0.1:$((API_PORT + 1))" h1 ".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h1\""
host_start "$T_TMP/h1.json" h1
API=$URL
if wait_live 1; then ok "kiln-host registers with kiln-api"; else t_bail "the host registers" "$(tail -3 "$T_TMP/h1.err")"; fi

admin -X POST "$URL/v1/admin/customers" --data-binary '{"id":"acme"}' > /dev/null
admin -X POST "$URL/v1/admin/customers" --data-binary '{"id":"beta"}' > /dev/null
KA=$(admin -X POST "$URL/v1/admin/customers/acme/keys" | jq -r .key)
KB=$(admin -X POST "$URL/v1/admin/customers/beta/keys" | jq -r .key)
req() { # KEY METHOD PATH [curl args]: body in $T_TMP/last, status echoed
	local key=$1 m=$2 p=$3; shift 3
	curl -s -m 300 -o "$T_TMP/last" -D "$T_TMP/last.h" -w '%{http_code}' -X "$m" ${key:+-H "Authorization: Bearer $key"} "$@" "$URL$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }

st=$(req "$KA" POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{}')
S=$(last .id)
[ "$st" = 201 ] || t_bail "a session starts" "$st $(cat "$T_TMP/last")"
st=$(req "$KA" PUT "/v1/sessions/$S/files?path=/work/port_server.py" --data-binary @"$HERE/port_server.py")
st=$(req "$KA" POST "/v1/sessions/$S/exec" -H 'Content-Type: application/json' --data-binary \
	'{"argv":["sh","-c","head -c 20971520 /dev/urandom > /tmp/big; sha256sum /tmp/big | cut -d\" \" -f1; python3 /work/port_server.py > /tmp/srv.log 2>&1 & for i in $(seq 100); do grep -q \":1F40 \" /proc/net/tcp && break; sleep 0.1; done"]}')
SUM=$(last .stdout | tr -d '\n')
check "the servers start in the session" test "$st" = 200 -a ${#SUM} = 64
for _ in $(seq 50); do req "$KA" POST "/v1/sessions/$S/exec" -H 'Content-Type: application/json' --data-binary '{"argv":["cat","/proc/net/tcp"]}' > /dev/null; last .stdout | grep -q ':1B5E ' && break; sleep 0.2; done
P=/v1/sessions/$S/ports

st=$(req "$KA" GET "$P/8000/")
check "GET through /v1/sessions/{id}/ports/8000/: 200, the server's body" \
	test "$st" = 200 -a "$(cat "$T_TMP/last")" = "hello from the sandbox"
st=$(req "$KA" GET "$P/8000")
check "the port's root without a slash: 200" test "$st" = 200
st=$(req "$KA" GET "$P/8000/big")
check "a 20 MiB download: 200, sha256 matches, Content-Length kept" \
	test "$st" = 200 -a "$(sha256sum < "$T_TMP/last" | cut -d' ' -f1)" = "$SUM" -a "$(tr -d '\r' < "$T_TMP/last.h" | sed -n 's/^content-length: //Ip')" = 20971520
head -c 20971520 /dev/urandom > "$T_TMP/up"
UP="$(sha256sum < "$T_TMP/up" | cut -d' ' -f1) 20971520"
st=$(req "$KA" POST "$P/8000/" --data-binary @"$T_TMP/up")
check "a 20 MiB upload (Content-Length): the server saw every byte" test "$st" = 200 -a "$(cat "$T_TMP/last")" = "$UP"
st=$(req "$KA" POST "$P/8000/" -H 'Transfer-Encoding: chunked' --data-binary @"$T_TMP/up")
check "a 20 MiB upload (chunked): the server saw every byte" test "$st" = 200 -a "$(cat "$T_TMP/last")" = "$UP"
st=$(req "$KA" GET "$P/8000/hdr?x=1" -H 'X-Test: yes')
check "the server sees its headers and X-Forwarded-For, never the kiln key" \
	test "$st" = 200 -a "$(last '.["x-test"]')" = yes -a "$(last '.["x-forwarded-for"]')" = 127.0.0.1 -a "$(last '.authorization // "none"')" = none
t0=$(date +%s%N)
st=$(req "$KA" GET "$P/8000/sse" -N)
t1=$(date +%s%N)
check "an event stream: 200 text/event-stream, five events" \
	test "$st" = 200 -a "$(grep -c '^data: ' "$T_TMP/last")" = 5 -a "$(tr -d '\r' < "$T_TMP/last.h" | sed -n 's/^content-type: //Ip')" = text/event-stream
out=$(PORT_HEADERS="Authorization=Bearer $KA" timeout 300 $PY "$HERE/port_client.py" "$URL" ws "$P/8000/ws" 1000)
check "a WebSocket: 1,000 messages echoed in order ($out ms median)" test "${out% *}" = "echoed 1000"
out=$(PORT_HEADERS="Authorization=Bearer $KA" timeout 300 $PY "$HERE/port_client.py" "$URL" many "$P/8000/" 100)
check "100 connections at once: all 200" test "$out" = 100
st=$(req "$KA" GET "$P/7999/")
check "a port nobody listens on: 502 port_closed" test "$st" = 502 -a "$(last .error.code)" = port_closed
st=$(req "" GET "$P/8000/")
check "no key: 401" test "$st" = 401
st=$(req "$KB" GET "$P/8000/")
check "another customer's key: 404, as for no session" test "$st" = 404 -a "$(last .error.code)" = not_found
st=$(req "$KA" GET "/v1/sessions/s_00000000000000000000000000000000/ports/8000/")
check "an unknown session: 404" test "$st" = 404
st=$(req "$KA" GET "$P/0/")
check "port 0: 400" test "$st" = 400
before=$(req "$KA" POST "/v1/sessions/$S/exec" -H 'Content-Type: application/json' --data-binary '{"argv":["wc","-l","/tmp/requests.log"]}' > /dev/null; last .stdout | cut -d' ' -f1)
out=$(PORT_HEADERS="Authorization=Bearer $KA" timeout 60 $PY "$HERE/port_client.py" "$URL" smuggle "$P/8000/")
after=$(req "$KA" POST "/v1/sessions/$S/exec" -H 'Content-Type: application/json' --data-binary '{"argv":["wc","-l","/tmp/requests.log"]}' > /dev/null; last .stdout | cut -d' ' -f1)
check "Content-Length with Transfer-Encoding: 400, and the server saw nothing ($before -> $after)" test "$out" = 400 -a "$before" = "$after"

st=$(req "$KA" GET "$P")
check "GET /v1/sessions/{id}/ports lists 7000, 7001, 7002 and 8000 with their paths" \
	test "$st" = 200 -a "$(last '[.ports[] | select(.port == 7000 or .port == 7001 or .port == 7002 or .port == 8000)] | length')" = 4 \
	-a "$(last '.ports[] | select(.port == 8000) | .path')" = "$P/8000/"
st=$(req "$KA" GET "/v1/sessions/$S")
check "GET /v1/sessions/{id} of the running session carries the same list (8000 at $P/8000/, no host-name url: not an E2B sandbox)" \
	test "$st" = 200 -a "$(last .state)" = running -a "$(last '.ports[] | select(.port == 8000) | .path')" = "$P/8000/" \
	-a "$(last '[.ports[] | select(.url)] | length')" = 0
# kiln session forward: any TCP through kiln-api's raw tunnel.
LP=$((API_PORT + 7))
KILN_API=$URL KILN_KEY=$KA t_bg "$ROOT/build/kiln" session forward "$S" 7000 "$LP" > "$T_TMP/fwd.out" 2> "$T_TMP/fwd.err"
fwd_pid=$T_BG_PID
t_until 10 grep -q Forwarding "$T_TMP/fwd.out"
out=$(timeout 60 $PY - "$LP" << 'EOF2'
import os, socket, sys, threading
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
data = os.urandom(3 << 20)
got = []
def rd():
    while True:
        d = s.recv(65536)
        if not d:
            return
        got.append(d)
t = threading.Thread(target=rd); t.start()
s.sendall(data); s.shutdown(socket.SHUT_WR); t.join(60)
print("same" if b"".join(got) == data else "different")
EOF2
)
check "kiln session forward ID 7000 LOCAL: 3 MiB echoed through 127.0.0.1:LOCAL, half close passed on" test "$out" = same
kill "$fwd_pid"
KILN_API=$URL KILN_KEY=$KB timeout 20 "$ROOT/build/kiln" session forward "$S" 8000 $((LP + 1)) > /dev/null 2>&1 &
fwd2=$!
t_until 10 eval "ss -ltn | grep -q ':$((LP + 1)) '"
out=$(curl -s -m 10 "http://127.0.0.1:$((LP + 1))/" -o /dev/null -w '%{http_code}' || true)
kill "$fwd2" 2> /dev/null; wait "$fwd2" 2> /dev/null
check "kiln session forward with another customer's key: the connection is refused (no answer: $out)" test "$out" = 000

# --- E2B's header routing ---
e2b() { local m=$1 p=$2; shift 2; curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "X-API-KEY: $KA" -H 'Content-Type: application/json' "$@" "$URL/e2b$p"; }
st=$(e2b POST /v2/sandboxes --data-binary '{"templateID":"base","timeout":300}')
E=$(last .sandboxID)
check "an E2B sandbox starts" test "$st" = 201
req "$KA" PUT "/v1/sessions/$E/files?path=/work/port_server.py" --data-binary @"$HERE/port_server.py" > /dev/null
req "$KA" POST "/v1/sessions/$E/exec" -H 'Content-Type: application/json' --data-binary \
	'{"argv":["sh","-c","echo hi > /tmp/big; python3 /work/port_server.py > /tmp/srv.log 2>&1 & for i in $(seq 100); do grep -q \":1F40 \" /proc/net/tcp && break; sleep 0.1; done"]}' > /dev/null
st=$(req "" GET /any/path -H "E2b-Sandbox-Id: $E" -H "E2b-Sandbox-Port: 8000")
check "E2B header routing: E2b-Sandbox-Id + E2b-Sandbox-Port reach the port, no key (public)" \
	test "$st" = 200 -a "$(cat "$T_TMP/last")" = "hello from the sandbox"
st=$(req "" GET /hdr -H "E2b-Sandbox-Id: $E" -H "E2b-Sandbox-Port: 8000")
check "...routing headers are not passed on" test "$st" = 200 -a "$(last '.["e2b-sandbox-id"] // "none"')" = none
out=$(PORT_HEADERS="E2b-Sandbox-Id=$E;E2b-Sandbox-Port=8000" timeout 120 $PY "$HERE/port_client.py" "$URL" ws /ws 100)
check "a WebSocket by header routing" test "${out% *}" = "echoed 100"
st=$(curl -s -m 60 -o "$T_TMP/last" -w '%{http_code}' "http://8000-$E.kiln.localhost:$API_PORT/")
check "host name routing: http://8000-ID.kiln.localhost:PORT/ reaches the port" \
	test "$st" = 200 -a "$(cat "$T_TMP/last")" = "hello from the sandbox"
st=$(curl -s -m 60 -o "$T_TMP/last" -w '%{http_code}' "http://8000-s_${E#s}.kiln.localhost:$API_PORT/")
check "...the stored spelling of its id works too (no TLS: no server-name check)" test "$st" = 200
st=$(req "" GET / -H "E2b-Sandbox-Id: $S" -H "E2b-Sandbox-Port: 8000")
check "a session not made through /e2b is not public: E2B's 502 'The sandbox was not found', as for no sandbox" \
	test "$st" = 502 -a "$(last .message)" = "The sandbox was not found" -a "$(last .sandboxId)" = "$S"

# --- getMetrics over a range: the host samples every 5 s ---
sleep 6
st=$(e2b GET "/sandboxes/$E/metrics")
check "metrics of a running sandbox: a series, oldest first, the last one now" \
	test "$st" = 200 -a "$(last 'length >= 2 and (map(.timestampUnix) == (map(.timestampUnix) | sort)) and (.[-1].memTotal > 0)')" = true
now=$(date +%s)
st=$(e2b GET "/sandboxes/$E/metrics?start=$((now - 3600))&end=$((now - 1800))")
check "...a range before it started: empty" test "$st" = 200 -a "$(last 'length')" = 0
st=$(e2b GET "/sandboxes/$E/metrics?start=soon")
check "...a bad start: 400" test "$st" = 400

# --- E2B's allowPublicTraffic false and autoResume ---
st=$(e2b POST /v2/sandboxes --data-binary '{"templateID":"base","timeout":300,"network":{"allowPublicTraffic":false},"autoPause":true,"autoResume":{"enabled":true}}')
PV=$(last .sandboxID); TT=$(last .trafficAccessToken)
check "a private sandbox: create returns a trafficAccessToken" test "$st" = 201 -a ${#TT} = 64
req "$KA" PUT "/v1/sessions/$PV/files?path=/work/port_server.py" --data-binary @"$HERE/port_server.py" > /dev/null
req "$KA" POST "/v1/sessions/$PV/exec" -H 'Content-Type: application/json' --data-binary \
	'{"argv":["sh","-c","echo hi > /tmp/big; python3 /work/port_server.py > /tmp/srv.log 2>&1 & for i in $(seq 100); do grep -q \":1F40 \" /proc/net/tcp && break; sleep 0.1; done"]}' > /dev/null
st=$(req "" GET / -H "E2b-Sandbox-Id: $PV" -H "E2b-Sandbox-Port: 8000")
check "...its port without the token: 403 forbidden" test "$st" = 403 -a "$(last .error.code)" = forbidden
# The token with its last digit changed (a 0 becomes 1, anything else 0).
bad=${TT%?}0; [ "$bad" != "$TT" ] || bad=${TT%?}1
st=$(req "" GET / -H "E2b-Sandbox-Id: $PV" -H "E2b-Sandbox-Port: 8000" -H "e2b-traffic-access-token: $bad")
check "...with a wrong token: 403" test "$st" = 403
st=$(req "" GET / -H "E2b-Sandbox-Id: $PV" -H "E2b-Sandbox-Port: 8000" -H "e2b-traffic-access-token: $TT")
check "...with its token: 200" test "$st" = 200 -a "$(cat "$T_TMP/last")" = "hello from the sandbox"
st=$(e2b POST "/sandboxes/$PV/pause")
paused=$(req "$KA" GET "/v1/sessions/$PV" > /dev/null; last .state)
st=$(req "" GET / -H "E2b-Sandbox-Id: $PV" -H "E2b-Sandbox-Port: 8000" -H "e2b-traffic-access-token: $TT")
body=$(cat "$T_TMP/last")
state=$(req "$KA" GET "/v1/sessions/$PV" > /dev/null; last .state)
check "autoResume: a request to a paused sandbox's port resumes it and is served, its server too ($paused -> $state)" \
	test "$paused" = paused -a "$st" = 200 -a "$body" = "hello from the sandbox" -a "$state" = running
e2b DELETE "/sandboxes/$PV" > /dev/null

m=$(curl -s -m 10 "$URL/metrics")
check "kiln-api's /metrics counts port requests by way, refusals and upgrades" \
	eval "echo \"\$m\" | grep -Eq '^kiln_api_port_requests_total\\{way=\"native\"\\} [1-9]' &&
	      echo \"\$m\" | grep -Eq '^kiln_api_port_requests_total\\{way=\"e2b\"\\} [1-9]' &&
	      echo \"\$m\" | grep -Eq '^kiln_api_port_refused_total [1-9]' && echo \"\$m\" | grep -Eq '^kiln_api_port_upgrades_total [1-9]'"
m=$(curl -s -m 10 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$((API_PORT + 1))/metrics")
check "kiln-host's /metrics counts its tunnels" eval "echo \"\$m\" | grep -Eq '^kiln_host_port_tunnels_total [1-9]'"

# --- paused ---
st=$(req "$KA" POST "/v1/sessions/$S/pause")
st=$(req "$KA" GET "$P/8000/")
check "a paused session's port: 409 not_running" test "$st" = 409 -a "$(last .error.code)" = not_running
req "$KA" DELETE "/v1/sessions/$S" > /dev/null
st=$(e2b DELETE "/sandboxes/$E")
check "the sandboxes are removed" test "$st" = 204
t_nothing_left "nothing left behind (QEMU, files, cgroups, mounts)"
t_done
