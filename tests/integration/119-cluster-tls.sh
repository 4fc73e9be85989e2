#!/usr/bin/env bash
# TLS between kiln-api and kiln-host (README "TLS", docs/operations.md): a
# test CA signs certificates for 127.0.0.1; kiln-api serves HTTPS beside
# its plain listener and requires hosts to serve TLS (hosts.require_tls,
# hosts.ca_file); kiln-host serves its API over HTTPS only (tls.cert_file,
# key_file) and heartbeats to kiln-api's HTTPS URL verified with
# api_ca_file. Over that: a host registers under an https:// URL, a plain
# http:// heartbeat is refused, a task runs end to end, a session runs
# code, and a sandbox's port answers through the tunnel (20 MiB, checked
# by hash, so the TLS pump moves real volume). Verification is real: a
# host whose API CA is another never registers (its log names the
# certificate), and kiln-api refuses to place work on a host whose
# certificate another CA signed. kiln-api's certificate is reloaded by
# SIGHUP three times under load (HTTPS requests on new and kept-alive
# connections from 4 threads): no request fails, the new certificate is
# served. `kiln` and the Python SDK reach the HTTPS API with a CA file.
# Nothing is left behind.
. "$(dirname "$0")/lib.sh"
t_plan 19
require_image
t_require_tools swift-proxy-server memcached jq curl openssl
t_require_built kiln kiln-api kiln-host

HERE=$(cd "$(dirname "$0")" && pwd)
TOKEN=tls-token-$RANDOM$RANDOM$RANDOM
ADMIN=tls-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 10000))
TLS_PORT=$((API_PORT + 1))
H1_PORT=$((API_PORT + 2))
H2_PORT=$((API_PORT + 3))
PLAIN=http://127.0.0.1:$API_PORT
URL=https://127.0.0.1:$TLS_PORT
BUCKET=kiln-tls
s3_local_start
t_mark

# ---- a test CA, another CA, certificates for 127.0.0.1 ----
C=$T_TMP/tls
mkdir -p "$C"
ca() { # NAME
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$C/$1.key" -out "$C/$1.pem" \
		-days 2 -subj "/CN=kiln test $1" 2> /dev/null
}
cert() { # NAME CA
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$C/$1.key" -out "$C/$1.csr" \
		-subj "/CN=127.0.0.1" 2> /dev/null &&
		openssl x509 -req -in "$C/$1.csr" -CA "$C/$2.pem" -CAkey "$C/$2.key" -CAcreateserial -days 2 \
			-out "$C/$1.pem" -extfile <(printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n') 2> /dev/null
}
ca ca && ca other && cert api1 ca && cert api2 ca && cert host ca && cert rogue other ||
	t_bail "openssl makes the test certificates" "see $C"
cp "$C/api1.pem" "$C/api.pem"
cp "$C/api1.key" "$C/api.key"
export CURL_CA_BUNDLE=$C/ca.pem # every curl below verifies with the test CA

# ---- check-config sees the TLS settings ----
host_config "$T_TMP/bad-host.json" "127.0.0.1:$H1_PORT" hx ".tls = {cert_file: \"$C/host.pem\", key_file: \"$C/rogue.key\"} |
	.api_ca_file = \"$C/host.key\" | .advertise_url = \"http://127.0.0.1:$H1_PORT\""
"$KILN_HOST" check-config "$T_TMP/bad-host.json" > "$T_TMP/chk-host" 2>&1
host_checked() {
	grep -q 'tls.key_file.*is not the key of' "$T_TMP/chk-host" && grep -q 'api_ca_file.*no PEM certificate' "$T_TMP/chk-host" &&
		grep -q 'advertise_url.*must be https' "$T_TMP/chk-host"
}
check "kiln-host check-config: a key that is not the certificate's, a CA file with no certificate, an http:// advertise_url with TLS" host_checked

api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" ". + {host_lost_after_s: 5, quotas: {submit_rate: 1000, submit_burst: 1000},
	tls: {listen: \"127.0.0.1:$TLS_PORT\", cert_file: \"$C/api.pem\", key_file: \"$C/api.key\"},
	hosts: {ca_file: \"$C/ca.pem\", require_tls: true}}"
api_up "$T_TMP/api.json" "$URL"
api_config "$T_TMP/bad-api.json" "127.0.0.1:$API_PORT" ". + {hosts: {ca_file: \"$C/host.key\", require_tls: true}}"
"$ROOT/build/kiln-api" check-config "$T_TMP/bad-api.json" > "$T_TMP/chk-api" 2>&1
api_checked() { grep -q 'hosts.ca_file.*no PEM certificate' "$T_TMP/chk-api" && grep -q 'hosts.require_tls.*yes' "$T_TMP/chk-api"; }
check "kiln-api check-config: hosts.ca_file with no certificate is an error; require_tls is reported" api_checked
API=$URL
host_config "$T_TMP/h1.json" "127.0.0.1:$H1_PORT" h1 ".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h1\" |
	.api_ca_file = \"$C/ca.pem\" | .tls = {cert_file: \"$C/host.pem\", key_file: \"$C/host.key\"}"
host_start "$T_TMP/h1.json" h1
H1=$host_pid
if wait_live 1; then ok "kiln-host registers over HTTPS"; else t_bail "the host registers" "$(tail -3 "$T_TMP/h1.err")"; fi
check "...under its https:// URL" [ "$(admin "$URL/v1/admin/hosts" | jq -r '.hosts[0].url')" = "https://127.0.0.1:$H1_PORT" ]
check "the host answers HTTPS with the test CA's certificate" \
	[ "$(curl -s -m 5 -o /dev/null -w '%{http_code}' "https://127.0.0.1:$H1_PORT/healthz")" = 200 ]
check "...and nothing in clear: plain HTTP to its port gets no HTTP answer" \
	[ "$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$H1_PORT/healthz")" = 000 ]
st=$(curl -s -m 5 -o "$T_TMP/hb" -w '%{http_code}' -X POST -H "Authorization: Bearer $TOKEN" \
	--data-binary "{\"url\":\"http://127.0.0.1:9\",\"capacity\":{}}" "$PLAIN/v1/hosts/plain/heartbeat")
check "a heartbeat naming an http:// URL is refused (require_tls): 400, saying why" \
	[ "$st" = 400 -a "$(jq -r '.error.message' "$T_TMP/hb" | grep -c 'require_tls')" = 1 ]

# ---- work over TLS ----
KEY=$(new_customer acme)
id=$(api_task 'print(6 * 7)')
api_final "$id" 240
check "a task runs end to end over TLS" [ "$(r "$id" .state)" = succeeded -a "$(r "$id" .result.stdout)" = 42 ]
req() { # METHOD PATH [curl args]: body in $T_TMP/last, status echoed
	local m=$1 p=$2; shift 2
	curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $KEY" "$@" "$URL$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
st=$(req POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{}')
S=$(last .id)
[ "$st" = 201 ] || t_bail "a session starts" "$st $(cat "$T_TMP/last")"
req PUT "/v1/sessions/$S/files?path=/work/port_server.py" --data-binary @"$HERE/port_server.py" > /dev/null
st=$(req POST "/v1/sessions/$S/exec" -H 'Content-Type: application/json' --data-binary \
	'{"argv":["sh","-c","head -c 20971520 /dev/urandom > /tmp/big; sha256sum /tmp/big | cut -d\" \" -f1; python3 /work/port_server.py > /tmp/srv.log 2>&1 & for i in $(seq 100); do grep -q \":1F40 \" /proc/net/tcp && break; sleep 0.1; done"]}')
SUM=$(last .stdout | tr -d '\n')
check "a session runs code over TLS" [ "$st" = 200 -a ${#SUM} = 64 ]
st=$(req GET "/v1/sessions/$S/ports/8000/")
check "a sandbox's port answers through the TLS tunnel" [ "$st" = 200 -a "$(cat "$T_TMP/last")" = "hello from the sandbox" ]
got=$(curl -s -m 120 -H "Authorization: Bearer $KEY" "$URL/v1/sessions/$S/ports/8000/big" | sha256sum | cut -d' ' -f1)
check "...20 MiB through it, byte for byte" [ "$got" = "$SUM" ]

# ---- kiln and the Python SDK with a CA file ----
out=$(KILN_CREDENTIALS=/nonexistent KILN_API=$URL KILN_KEY=$KEY CURL_CA_BUNDLE= "$ROOT/build/kiln" --ca-file "$C/ca.pem" session exec "$S" -- echo via-cli 2>&1)
check "kiln --ca-file reaches the HTTPS API" [ "$out" = via-cli ]
out=$(KILN_CREDENTIALS=/nonexistent KILN_API=$URL KILN_KEY=$KEY CURL_CA_BUNDLE= "$ROOT/build/kiln" session exec "$S" -- echo via-cli 2>&1)
check "...and without it the test CA is unknown: a certificate error" grep -qi 'certificate' <<< "$out"
out=$(PYTHONPATH=$ROOT/sdk/python /usr/bin/python3 -c '
import sys, kiln
c = kiln.Client(sys.argv[1], sys.argv[2], ca_file=sys.argv[3])
print(c.get_session(sys.argv[4]).exec(["echo", "via-sdk"]).stdout.strip())' "$URL" "$KEY" "$C/ca.pem" "$S" 2>&1)
check "the Python SDK with ca_file reaches the HTTPS API" [ "$out" = via-sdk ]

# ---- kiln-api's certificate reloaded under load ----
/usr/bin/python3 "$HERE/tls_load.py" "127.0.0.1" "$TLS_PORT" "$C/ca.pem" 4 12 > "$T_TMP/load.json" 2> "$T_TMP/load.err" &
load=$!
serials=$(openssl x509 -in "$C/api.pem" -noout -serial)
for n in 2 1 2; do
	sleep 2.5
	cp "$C/api$n.pem" "$C/api.pem.new" && mv "$C/api.pem.new" "$C/api.pem"
	cp "$C/api$n.key" "$C/api.key.new" && mv "$C/api.key.new" "$C/api.key"
	kill -HUP "$api_pid"
done
wait "$load"
check "SIGHUP x3 under load: no HTTPS request lost ($(jq -c . "$T_TMP/load.json" 2> /dev/null))" \
	jq -e '.ok > 200 and .failed == 0' "$T_TMP/load.json"
now=$(openssl s_client -connect "127.0.0.1:$TLS_PORT" -CAfile "$C/ca.pem" < /dev/null 2> /dev/null | openssl x509 -noout -serial)
check "...and the certificate served is the last one loaded" \
	[ -n "$now" -a "$now" = "$(openssl x509 -in "$C/api2.pem" -noout -serial)" -a "$now" != "$serials" ]

# ---- verification: a host that trusts another CA, a host with a rogue certificate ----
req DELETE "/v1/sessions/$S" > /dev/null
host_config "$T_TMP/h2.json" "127.0.0.1:$H2_PORT" h2 ".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h2\" |
	.api_ca_file = \"$C/other.pem\" | .tls = {cert_file: \"$C/host.pem\", key_file: \"$C/host.key\"}"
host_start "$T_TMP/h2.json" h2
H2=$host_pid
t_until 120 grep -qi 'certificate' "$T_TMP/h2.err"
check "a host whose API CA is another does not register; its log names the certificate" \
	[ "$(admin "$URL/v1/admin/hosts" | jq '[.hosts[] | select(.id == "h2")] | length')" = 0 -a \
	"$(grep -ci certificate "$T_TMP/h2.err")" -gt 0 ]
t_stop "$H2"
t_stop "$H1"
host_config "$T_TMP/h3.json" "127.0.0.1:$H2_PORT" h1 ".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h3\" |
	.api_ca_file = \"$C/ca.pem\" | .tls = {cert_file: \"$C/rogue.pem\", key_file: \"$C/rogue.key\"}"
host_start "$T_TMP/h3.json" h3
H3=$host_pid
t_until 120 sh -c "curl -s -m 5 -H 'Authorization: Bearer $ADMIN' '$URL/v1/admin/hosts' | grep -q ':$H2_PORT'"
id=$(api_task 'print(1)')
sleep 6
check "kiln-api places no work on a host whose certificate another CA signed" \
	[ "$(cust "$URL/v1/tasks/$id" | jq -r .state)" != succeeded -a "$(grep -ci 'certificate' "$T_TMP/api.err")" -gt 0 ]
cust -X POST "$URL/v1/tasks/$id/cancel" > /dev/null
t_stop "$H3"
t_stop "$api_pid"
t_nothing_left "nothing left: no QEMU, VM directories, cgroups, mounts or slot locks"
t_done
