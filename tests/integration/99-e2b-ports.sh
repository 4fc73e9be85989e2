#!/usr/bin/env bash
# A sandbox's ports the way an E2B user reaches them on one machine: `kiln
# up` (local S3, kiln-api with its sandbox domain and TLS listener, one
# kiln-host), then E2B's own SDK (e2b 2.51.0, unmodified) running
# tests/e2b/ports_test.mjs with nothing but what DIR/credentials holds:
# getHost(port) and https fetches through kiln up's local CA (and the URL
# in GET /v1/sessions/{id}), 50 MiB each
# way by sha256, 100 connections, a WebSocket of 1,000 messages, header
# routing, signed file URLs (uploadUrl, downloadUrl: good, expired, another
# path, operation or sandbox), 502 and 409 (each of its checks is one result). Also: the
# certificate kiln up made (for *.kiln.localhost, from its CA), a SIGHUP
# that reloads it without dropping a connection, and nothing of the stack
# left after kiln up stops.
. "$(dirname "$0")/lib.sh"
t_plan 24
require_image
t_require_tools swift-proxy-server memcached jq node openssl
t_require_built kiln kiln-api kiln-host
SDK=$("$ROOT/scripts/e2b-sdk.sh" 2> "$T_TMP/sdk.err") || t_skip_all "the E2B SDK could not be installed: $(tail -n 1 "$T_TMP/sdk.err")"
before_procs=$(up_procs)
kiln_up
DOMAIN=$(sed -n 's/^E2B_DOMAIN=//p' "$UP/credentials")
CA=$(sed -n 's/^NODE_EXTRA_CA_CERTS=//p' "$UP/credentials")
check "kiln up: a sandbox domain under localhost ($DOMAIN) and its local CA in credentials" \
	[ -n "$DOMAIN" -a "${DOMAIN%%:*}" = kiln.localhost -a -f "$CA" ]
TLS=127.0.0.1:${DOMAIN#*:}
[ "$DOMAIN" = kiln.localhost ] && TLS=127.0.0.1:443
check "its certificate is for *.kiln.localhost and verifies against the CA" \
	eval "openssl verify -CAfile '$CA' '$UP/tls/cert.pem' > /dev/null && openssl x509 -in '$UP/tls/cert.pem' -noout -ext subjectAltName | grep -q 'DNS:\*.kiln.localhost'"
check "a name under the domain resolves to loopback (nss-myhostname)" \
	eval "getent ahostsv4 8000-x.kiln.localhost | grep -q '^127.0.0.1 '"

# ---- the SDK: only the credentials file's variables reach node ----
client_results sdk "$T_TMP/ports.out" env -i PATH=/usr/bin:/bin HOME="$T_TMP" "${up_creds[@]}" KILN_E2B_SDK="$SDK" \
	timeout -k 5 900 node --experimental-websocket --no-warnings "$ROOT/tests/e2b/ports_test.mjs" \
	"$ROOT/tests/integration/port_server.py"
summary=$(grep '^ports_test: ' "$T_TMP/ports.out" | tail -n 1)
check "the SDK's ports test ran to its end: ${summary:-no summary} ($C_N checks of 15)" \
	[ -n "$summary" -a "$C_N" = 15 -a "${C_RC:-1}" = 0 ]

# ---- SIGHUP: a new certificate, an open connection kept ----
/usr/bin/python3 - "$TLS" "$CA" > "$T_TMP/held.out" 2>&1 << 'EOF2' &
import socket, ssl, sys, time
host, port = sys.argv[1].rsplit(":", 1)
ctx = ssl.create_default_context(cafile=sys.argv[2])
s = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=30), server_hostname="kiln.localhost")
s.sendall(b"GET /healthz HTTP/1.1\r\nHost: kiln.localhost\r\n\r\n")
def answer():
    b = b""
    while b"}" not in b:
        d = s.recv(4096)
        if not d:
            break
        b += d
    return b.split(b"\r\n")[0].decode()
first = answer()
time.sleep(3)
s.sendall(b"GET /healthz HTTP/1.1\r\nHost: kiln.localhost\r\nConnection: close\r\n\r\n")
print(first, "|", answer())
EOF2
held=$!
sleep 1
serial0=$(echo | timeout 10 openssl s_client -connect "$TLS" -servername kiln.localhost 2> /dev/null | openssl x509 -noout -serial)
# A new certificate from the same CA (what an operator's renewal does).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$T_TMP/k.pem" -out "$T_TMP/c.pem" \
	-subj /CN=kiln.localhost -addext 'subjectAltName=DNS:*.kiln.localhost,DNS:kiln.localhost' \
	-CA "$CA" -CAkey "$UP/tls/ca.key" -days 2 > /dev/null 2>&1
cp "$T_TMP/c.pem" "$UP/tls/cert.pem"; cp "$T_TMP/k.pem" "$UP/tls/key.pem"
api_pid=$(pgrep -P "$up_pid" -f -- "kiln-api --config $UP/api.json")
kill -HUP "$api_pid"
sleep 1
serial1=$(echo | timeout 10 openssl s_client -connect "$TLS" -servername kiln.localhost 2> /dev/null | openssl x509 -noout -serial)
check "SIGHUP: kiln-api serves the new certificate ($serial0 -> $serial1)" [ -n "$serial1" -a "$serial0" != "$serial1" ]
check "...and says so in its log" grep -q 'SIGHUP: TLS certificate read again' "$UP/api.log"
wait "$held"
check "...a connection open across the reload is served on ($(cat "$T_TMP/held.out"))" \
	[ "$(cat "$T_TMP/held.out")" = "HTTP/1.1 200 OK | HTTP/1.1 200 OK" ]
echo garbage > "$UP/tls/cert.pem"
kill -HUP "$api_pid"
sleep 1
check "a certificate that does not load: the running one stays, the log says why" \
	eval "grep -q 'the running certificate stays' '$UP/api.log' && echo | timeout 10 openssl s_client -connect '$TLS' -servername kiln.localhost 2> /dev/null | openssl x509 -noout -serial | grep -qx '$serial1'"

kill -TERM "$up_pid"
wait "$up_pid"
up_pid=
for _ in $(seq 100); do [ "$(up_procs)" = "$before_procs" ] && break; sleep 0.1; done
t_nothing_left "kiln up stopped: no process of the stack left ($(up_procs)), nor QEMU, files, cgroups, mounts" \
	[ "$(up_procs)" = "$before_procs" ]
t_done
