#!/usr/bin/env bash
# kiln-host's port tunnel (docs/api.md, "kiln-host: ports"): a session VM
# runs an echo server and an HTTP server (port_server.py); a client
# (port_tunnel.py) reaches them through GET .../ports/{port}/connect with
# Upgrade: kiln-tunnel over the envd channel (the guest has no NIC). Checks:
# the port list, echo both ways with half closes (1 byte to 8 MiB), an 20
# MiB download and upload by sha256, 50 tunnels at once, a port nobody
# listens on (502 port_closed, at once), the cluster token, a bad port, an
# idle tunnel, DELETE with tunnels open, and nothing left behind.
. "$(dirname "$0")/lib.sh"
t_plan 27
require_image
PY=/usr/bin/python3
TOKEN=ports-token-$RANDOM$RANDOM
PA=$((20000 + RANDOM % 10000))
HERE=$(cd "$(dirname "$0")" && pwd)

host_config "$T_TMP/a.json" "127.0.0.1:$PA" a
host_start "$T_TMP/a.json" a
if t_serving "http://127.0.0.1:$PA/healthz" "$host_pid"; then ok "kiln-host starts"; else t_bail "kiln-host starts" "$(tail -3 "$T_TMP/a.err")"; fi

h() { # METHOD PATH [curl args]: body in $T_TMP/last, status echoed
	local m=$1 p=$2; shift 2
	curl -s -m 120 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "http://127.0.0.1:$PA$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
tun() { # PORT MODE [ARGS]
	timeout 180 $PY "$HERE/port_tunnel.py" "127.0.0.1:$PA" "$TOKEN" s1 "$@"
}

st=$(h POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"s1","customer":"acme","spec":{}}')
[ "$st" = 201 ] || t_bail "POST /v1/sessions: 201" "$st $(cat "$T_TMP/last")"
st=$(h PUT "/v1/sessions/s1/files?path=/work/port_server.py" --data-binary @"$HERE/port_server.py")
check "PUT the servers into the session" test "$st" = 200
st=$(h POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary \
	'{"argv":["sh","-c","head -c 20971520 /dev/urandom > /tmp/big; sha256sum /tmp/big > /tmp/big.sha; python3 /work/port_server.py > /tmp/srv.log 2>&1 & for i in $(seq 100); do grep -q \":1F40 \" /proc/net/tcp && break; sleep 0.1; done; echo up"]}')
check "the servers start in the session" test "$st" = 200 -a "$(last .stdout)" = up
sum=$(h POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary '{"argv":["cat","/tmp/big.sha"]}' > /dev/null; last .stdout | cut -d' ' -f1)

st=$(h GET /v1/sessions/s1/ports)
check "GET .../ports lists 7000 and 8000" test "$st" = 200 -a "$(last '[.ports[] | select(. == 7000 or . == 8000)] | length')" = 2

check "echo: 1 byte" test "$(tun 7000 echo 1)" = same
check "echo: 200 KiB (past one chunk)" test "$(tun 7000 echo 204800)" = same
check "echo: 8 MiB (past the window, both ways at once)" test "$(tun 7000 echo 8388608)" = same
check "echo: nothing at all (the client's half close alone)" test "$(tun 7000 echo 0)" = same

st=$(tun 8000 get /big "$T_TMP/big")
got=$(sha256sum "$T_TMP/big" | cut -d' ' -f1)
check "HTTP GET of 20 MiB through the tunnel: 200, sha256 matches" test "$st" = 200 -a "$got" = "$sum" -a -n "$sum"
head -c 20971520 /dev/urandom > "$T_TMP/up"
want="$(sha256sum "$T_TMP/up" | cut -d' ' -f1) 20971520"
check "HTTP POST of 20 MiB through the tunnel: the server saw every byte" test "$(tun 8000 post / "$T_TMP/up")" = "200 $want"
check "50 tunnels at once, each echoing 100 KiB" test "$(tun 7000 many 50 102400)" = 50

t0=$(date +%s%N)
out=$(tun 7999 open)
t1=$(date +%s%N)
check "a port nobody listens on: 502 port_closed" test "${out%% *}" = 502 -a "$(echo "${out#* }" | jq -r .error.code)" = port_closed
check "...answered at once ($(((t1 - t0) / 1000000)) ms)" test $(((t1 - t0) / 1000000)) -lt 3000
out=$(timeout 60 $PY "$HERE/port_tunnel.py" "127.0.0.1:$PA" wrong-token s1 8000 open)
check "a wrong cluster token: 401" test "${out%% *}" = 401
out=$(tun 0 open)
check "port 0: 400" test "${out%% *}" = 400
out=$(timeout 60 $PY "$HERE/port_tunnel.py" "127.0.0.1:$PA" "$TOKEN" nosuch 8000 open)
check "no such session: 404" test "${out%% *}" = 404
st=$(curl -s -m 30 -o "$T_TMP/last" -w '%{http_code}' -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PA/v1/sessions/s1/ports/8000/connect")
check "connect without Upgrade: 400" test "$st" = 400
check "a tunnel that sends nothing is held open" test "$(tun 8000 idle)" = held

# Hostile servers: one that floods a client that does not read, one that
# never reads what a client pushes, a guest with thousands of listeners.
rss() { awk '/^VmRSS/ {print $2}' "/proc/$host_pid/status"; }
r0=$(rss)
t_bg tun 7001 stall 4 > "$T_TMP/stall.out"
stall_pid=$T_BG_PID
sleep 2
r1=$(rss)
wait "$stall_pid"
check "a server flooding a client that does not read: kiln-host holds at most ~2 MiB for it (RSS +$(((r1 - r0) / 1024)) MiB)" \
	test $((r1 - r0)) -lt 16384
check "...and the client then reads the flood" test "$(cat "$T_TMP/stall.out")" -gt 1048576
r0=$(rss)
pushed=$(tun 7002 push 3)
r1=$(rss)
check "a server that never reads: the tunnel takes a bounded amount ($((pushed / 1048576)) MiB in 3 s)" test "$pushed" -lt $((16 * 1048576))
check "...kiln-host's memory does not grow with it (RSS +$(((r1 - r0) / 1024)) MiB)" test $((r1 - r0)) -lt 16384
LS=$'import resource, socket, time\nsoft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\nresource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))\nls = []\nfor i in range(3000):\n    s = socket.socket()\n    s.bind(("127.0.0.1", 20000 + i))\n    s.listen(1)\n    ls.append(s)\nprint(len(ls), flush=True)\ntime.sleep(60)\n'
printf '%s' "$LS" | h PUT "/v1/sessions/s1/files?path=/work/ls.py" --data-binary @- > /dev/null
st=$(h POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary \
	'{"argv":["sh","-c","python3 /work/ls.py > /tmp/ls.out 2>&1 & for i in $(seq 100); do [ -s /tmp/ls.out ] && break; sleep 0.1; done; cat /tmp/ls.out"]}')
check "3,000 listeners in the guest" test "$st" = 200 -a "$(last .stdout | tr -d '\n')" = 3000
st=$(h GET /v1/sessions/s1/ports)
check "GET .../ports with 3,000 listeners: 200, at most 1,024, ascending" \
	test "$st" = 200 -a "$(last '.ports | length')" = 1024 -a "$(last '.ports == (.ports | sort)')" = true
check "...and a port still connects" test "$(tun 7000 echo 1000)" = same

# A tunnel open when the session goes: it ends (a reset), nothing hangs.
t_bg tun 7000 idle > /dev/null
$PY - "127.0.0.1:$PA" "$TOKEN" > "$T_TMP/held" 2>&1 << 'EOF2' &
import socket, sys
host, p = sys.argv[1].rsplit(":", 1)
s = socket.create_connection((host, int(p)), timeout=60)
s.sendall(("GET /v1/sessions/s1/ports/7000/connect HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
           "Connection: Upgrade\r\nUpgrade: kiln-tunnel\r\n\r\n" % sys.argv[2]).encode())
h = b""
while b"\r\n\r\n" not in h:
    h += s.recv(1)
try:
    print("ended", repr(s.recv(10)))
except OSError as e:
    print("ended", e.__class__.__name__)
EOF2
held=$!
sleep 1
st=$(h DELETE /v1/sessions/s1)
timeout 30 tail --pid=$held -f /dev/null
check "DELETE with a tunnel open: 200, the tunnel ends" test "$st" = 200 -a "$(cut -d' ' -f1 "$T_TMP/held")" = ended
t_nothing_left "nothing left behind (QEMU, files, cgroups, mounts)"
t_done
