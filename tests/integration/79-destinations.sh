#!/usr/bin/env bash
# Customers' own S3 destinations through the whole stack (kiln-api + one
# kiln-host + the local S3 with a second Swift account, cust:alice, whose
# buckets test:tester cannot see): bad destinations are refused with clear
# errors; the secret is never answered and never stored in plaintext; a
# task's tiny and large (multipart) outputs, logs and manifest land in the
# customer's bucket under its prefix and not in kiln's, presigned URLs
# (signed with the customer's credentials) serve the right bytes, kiln-api's
# own log links never take a request's Host, `kiln task
# logs` reads them; a destination with wrong credentials fails the upload
# with s3_auth, spooled (record 0600) and retried until the destination is
# fixed; deleted: outputs go to kiln's bucket again; kiln-api restarted with
# another key: the customer's task fails with destination_unavailable, never
# kiln's bucket. Where a destination may lead (issue 37): endpoints that are
# or resolve to loopback (127.0.0.1, localhost, [::1], 127.1, a name of
# /etc/hosts), link-local 169.254.169.254, private, CGNAT, unspecified or
# this machine's own addresses are refused with 400 destination_forbidden
# before any connection (a listener on loopback sees none); the local S3 is
# admitted only because the operator lists its address and port in
# destinations.allow_addresses (kiln-api and kiln-host); a kiln-host whose
# list lacks it refuses the upload itself, at the connection. Nothing is
# left running.
. "$(dirname "$0")/lib.sh"
t_plan 86
require_image
t_require_tools swift-proxy-server memcached curl jq sqlite3
t_require_python boto3
PY=/usr/bin/python3
BIN=${KILN_IT_BIN:-$ROOT/build}
KILN_HOST=$BIN/kiln-host
KILN_API=$BIN/kiln-api
KILN_API_BIN=$KILN_API
[ -x "$KILN_API" ] || t_skip_all "$KILN_API missing: run make"

TOKEN=it-token-$RANDOM$RANDOM
ADMIN=it-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 12000))
HOST_PORT=$((API_PORT + 1))
API=http://127.0.0.1:$API_PORT
HOST=http://127.0.0.1:$HOST_PORT
BUCKET=kiln-ops
CBUCKET=acme-out
CPREFIX=runs/kiln/
C_AK=cust:alice
C_SK=alicesecret
S3_HOSTPORT=

s3_local_start
export S3_ENDPOINT S3_REGION S3_ACCESS_KEY S3_SECRET_KEY
S3_HOSTPORT=${S3_ENDPOINT#http://}
S3_HOSTPORT=${S3_HOSTPORT%/}

# s3py AK SK CODE...: python with an S3 client `s3` for those credentials.
s3py() {
	local ak=$1 sk=$2; shift 2
	AK=$ak SK=$sk $PY -c "
import os, sys, boto3, botocore
s3 = boto3.client('s3', endpoint_url=os.environ['S3_ENDPOINT'], region_name='us-east-1',
                  aws_access_key_id=os.environ['AK'], aws_secret_access_key=os.environ['SK'],
                  config=botocore.config.Config(s3={'addressing_style': 'path'}))
$*" 2>&1
}
# keys AK SK BUCKET SUBSTRING: the keys of BUCKET containing SUBSTRING, one a line
keys() {
	s3py "$1" "$2" "
try:
    pages = s3.get_paginator('list_objects_v2').paginate(Bucket='$3')
    for p in pages:
        for o in p.get('Contents', []):
            if '$4' in o['Key']: print(o['Key'])
except botocore.exceptions.ClientError as e:
    print('ERROR', e.response['Error']['Code'])"
}

s3py "$C_AK" "$C_SK" "s3.create_bucket(Bucket='$CBUCKET')" > "$T_TMP/mkbucket.out"
s3py "$S3_ACCESS_KEY" "$S3_SECRET_KEY" "s3.create_bucket(Bucket='$BUCKET')" >> "$T_TMP/mkbucket.out"
ops_view=$(keys "$S3_ACCESS_KEY" "$S3_SECRET_KEY" "$CBUCKET" "")
# Swift keeps buckets per account: to kiln's account the customer's bucket
# does not exist (NoSuchBucket), which is its answer to a listing it may
# not make; any other answer (a bad signature, a 5xx) is not that.
check "the customer's bucket exists in its own account: kiln's credentials cannot list it ($ops_view)" \
	[ "$(keys "$C_AK" "$C_SK" "$CBUCKET" "" | grep -c ERROR)" = 0 -a "$ops_view" = "ERROR NoSuchBucket" ]

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$T_TMP/dest.key"
echo >> "$T_TMP/dest.key"
chmod 600 "$T_TMP/dest.key"
# The local S3 listens on loopback: destinations may reach it only because
# the operator lists its address and port (an on-premises MinIO's case).
write_api_config() { # KEYFILE [ALLOW_JSON_ARRAY]
	api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" \
		".host_lost_after_s = 5 | .destinations = {key_file: \"$1\", allow_addresses: ${2:-[\"$S3_HOSTPORT\"]}}"
}
write_api_config "$T_TMP/dest.key"
write_host_config() { # [ALLOW_JSON_ARRAY]
	host_config "$T_TMP/host.json" "127.0.0.1:$HOST_PORT" dest-host \
		".api = \"$API\" | .heartbeat_ms = 500 | .upload = {max_backoff_s: 2} | .pool = {size: 1, prestart: 1}
		 | .destinations = {allow_addresses: ${1:-[\"$S3_HOSTPORT\"]}}"
}
write_host_config

# start_api / stop_api, start_host / stop_host: the daemons of this test
# (lib.sh's api_up and host_start; t_cleanup ends whichever still runs).
start_api() { api_up "$T_TMP/api.json" "$API"; }
stop_api() { t_stop "$api_pid"; api_pid=; }
start_api
start_host() { host_start "$T_TMP/host.json" host; }
stop_host() { t_stop "$host_pid"; host_pid=; }
start_host
# custst METHOD PATH [BODY]: the status on the first line, then the body
custst() { curl -s -m 70 -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -X "$1" \
	${3:+--data-binary "$3"} -w '\n%{http_code}' "$API$2"; }
# wait_host: until the host is live (120 s: a first start builds its snapshot)
one_live() { [ "$(live_hosts)" = 1 ]; }
wait_host() { t_until 120 one_live; }
if wait_host; then
	ok "kiln-api (with destinations.key_file) and kiln-host start; the host registers"
else
	not_ok "the stack starts" "$(tail -3 "$T_TMP/api.err")" "$(tail -3 "$T_TMP/host.err")"
	t_done; exit 1
fi
admin -X POST --data '{"id":"acme"}' "$API/v1/admin/customers" > /dev/null
KEY=$(admin -X POST "$API/v1/admin/customers/acme/keys" | jq -r .key)

# jqe FILTER [FILE]: the filter's last output is true. jq 1.6's -e exits 0
# on empty input (an empty answer would pass): some output is required.
jqe() { local o; o=$(jq -e "$@" 2> /dev/null) && [ -n "$o" ]; }
# dest JSON: a destination body, fields overridden by the jq object given
dest() {
	jq -cn --arg ep "$S3_ENDPOINT" --arg b "$CBUCKET" --arg p "$CPREFIX" --arg ak "$C_AK" --arg sk "$C_SK" \
		--argjson o "${1:-{\}}" '{endpoint: $ep, region: "us-east-1", bucket: $b, prefix: $p, access_key: $ak, secret_key: $sk} + $o'
}

# ---- validation ----
r=$(custst GET /v1/destination)
check "no destination yet: GET answers 404" [ "$(tail -1 <<< "$r")" = 404 ]
bad() { # NAME OVERRIDE FIELD
	local r
	r=$(custst PUT /v1/destination "$(dest "$2")")
	check "PUT refuses $1: 400 invalid_request naming $3" \
		[ "$(tail -1 <<< "$r")" = 400 -a "$(head -n -1 <<< "$r" | jq -r '.error.code + " " + .error.message' | cut -d' ' -f1-2)" = "invalid_request $3:" ]
}
bad "an ftp:// endpoint" '{"endpoint":"ftp://127.0.0.1:1"}' endpoint
bad "an endpoint with a path" "{\"endpoint\":\"$S3_ENDPOINT/x\"}" endpoint
bad "a bucket with capitals" '{"bucket":"Acme"}' bucket
bad "a prefix without a trailing slash" '{"prefix":"runs"}' prefix
bad "a prefix with a .. segment" '{"prefix":"a/../"}' prefix
bad "a region with spaces" '{"region":"us east"}' region
bad "no secret key" '{"secret_key":""}' secret_key
bad "an unknown field" '{"acl":"public"}' acl

# ---- where a destination may lead: refused before any connection ----
# A listener on loopback that counts the connections it accepts.
t_bg $PY -c '
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1])); __import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
n = 0
while True:
    c, _ = s.accept(); n += 1; c.close()
    open(sys.argv[2], "w").write(str(n))' "$T_TMP/listen.port" "$T_TMP/listen.count"
listen_pid=$T_BG_PID
t_until 5 test -s "$T_TMP/listen.port"
LPORT=$(cat "$T_TMP/listen.port")
forbidden() { # NAME ENDPOINT SAYS [EXTRA_FIELDS]
	local r code msg
	r=$(custst PUT /v1/destination "$(dest "{\"endpoint\":\"$2\"${4:+,$4}}")")
	code=$(head -n -1 <<< "$r" | jq -r .error.code 2> /dev/null)
	msg=$(head -n -1 <<< "$r" | jq -r .error.message 2> /dev/null)
	check "PUT refuses $1: 400 destination_forbidden saying \"$3\" ($msg)" \
		[ "$(tail -1 <<< "$r")" = 400 -a "$code" = destination_forbidden -a -n "$(grep -F -- "$3" <<< "$msg")" ]
}
forbidden "127.0.0.1 (a listener there)" "http://127.0.0.1:$LPORT" "127.0.0.1 (loopback)"
forbidden "127.0.0.1 without the test write (verify:false)" "http://127.0.0.1:$LPORT" "127.0.0.1 (loopback)" '"verify":false'
forbidden "localhost" "http://localhost:$LPORT" "(loopback)"
forbidden "[::1]" "http://[::1]:$LPORT" "::1 (loopback)"
forbidden "127.1, a name the resolver turns into 127.0.0.1" "http://127.1:$LPORT" "127.0.0.1 (loopback)"
forbidden "2130706433, 127.0.0.1 as one number" "http://2130706433:$LPORT" "127.0.0.1 (loopback)"
hname=$(awk '$1 ~ /^127\./ { for (i = 2; i <= NF; i++) if ($i != "localhost" && $i ~ /^[A-Za-z0-9.-]+$/) { print $i; exit } }' /etc/hosts)
if [ -n "$hname" ]; then
	forbidden "$hname, a name that resolves to loopback (/etc/hosts)" "http://$hname:$LPORT" "(loopback)"
else
	skip "PUT refuses a name of /etc/hosts that resolves to loopback" "no name other than localhost resolves to loopback in /etc/hosts"
fi
forbidden "kiln-host's own port on loopback (the allow-list names the S3's port only)" "http://127.0.0.1:$HOST_PORT" "127.0.0.1 (loopback)"
forbidden "kiln-api itself" "http://127.0.0.1:$API_PORT" "127.0.0.1 (loopback)"
forbidden "0.0.0.0" "http://0.0.0.0:$LPORT" "0.0.0.0 (unspecified)"
forbidden "127.0.0.1 as an IPv4-mapped IPv6 address" "http://[::ffff:7f00:1]:$LPORT" "(loopback)"
# Addresses off this machine are asked with verify:false: a kiln-api that
# lost the rule stores them (and fails here) without sending them anything.
forbidden "169.254.169.254 (cloud metadata)" "http://169.254.169.254" "169.254.169.254 (link-local)" '"verify":false'
forbidden "a private range (10/8)" "http://10.20.30.40:9000" "10.20.30.40 (private)" '"verify":false'
forbidden "a private range (192.168/16)" "https://192.168.1.1" "192.168.1.1 (private)" '"verify":false'
forbidden "a private IPv6 range (fc00::/7)" "http://[fd00::1]:9000" "fd00::1 (private)" '"verify":false'
forbidden "CGNAT (100.64/10)" "http://100.64.0.1" "100.64.0.1 (CGNAT)" '"verify":false'
own=$(ip -4 -o addr show scope global 2> /dev/null | awk '{ sub("/.*", "", $4); print $4; exit }')
if [ -n "$own" ]; then
	forbidden "this machine's own address ($own)" "http://$own:$LPORT" "$own (" '"verify":false'
else
	skip "PUT refuses this machine's own address" "this machine has no global IPv4 address"
fi
check "no refused endpoint was connected to (the listener accepted $(cat "$T_TMP/listen.count" 2> /dev/null || echo 0))" \
	[ ! -s "$T_TMP/listen.count" ]
curl -s -m 2 "http://127.0.0.1:$LPORT/" > /dev/null 2>&1
for _ in $(seq 50); do [ -s "$T_TMP/listen.count" ] && break; sleep 0.05; done
check "the listener does count connections (one made here: $(cat "$T_TMP/listen.count" 2> /dev/null))" \
	[ "$(cat "$T_TMP/listen.count" 2> /dev/null)" = 1 ]
t_stop "$listen_pid"; listen_pid=
check "GET still answers 404: nothing refused was stored" [ "$(custst GET /v1/destination | tail -1)" = 404 ]

r=$(custst PUT /v1/destination "$(dest '{"secret_key":"wrong-secret"}')")
msg=$(head -n -1 <<< "$r" | jq -r '.error.code + " " + .error.message')
check "PUT with wrong credentials is verified by a test write: 422 destination_refused naming s3_auth ($msg)" \
	[ "$(tail -1 <<< "$r")" = 422 -a "${msg%% *}" = destination_refused -a -n "$(grep s3_auth <<< "$msg")" ]
r=$(curl -s -m 30 -H "Authorization: Bearer $ADMIN" -X PUT --data-binary "$(dest)" -w '\n%{http_code}' "$API/v1/destination")
check "an admin key has no destination of its own: 403" [ "$(tail -1 <<< "$r")" = 403 ]

# ---- set it; the secret is never answered nor stored in plaintext ----
r=$(custst PUT /v1/destination "$(dest)")
echo "$r" > "$T_TMP/put.out"
sel=$(head -n -1 <<< "$r" | jq -r 'select(.bucket == "'$CBUCKET'" and .prefix == "'$CPREFIX'" and (.id | startswith("dst_")) and .secret_key_set == true and .access_key == "cust******") | .id')
check "PUT the customer's destination at the local S3 on loopback, admitted by destinations.allow_addresses ($S3_HOSTPORT): 200 with its id, the access key masked, secret_key_set ($(head -c 300 <<< "$r"))" \
	[ "$(tail -1 <<< "$r")" = 200 -a -n "$sel" ]
DID=$(head -n -1 <<< "$r" | jq -r .id)
custst GET /v1/destination > "$T_TMP/get.out"
admin "$API/v1/admin/customers/acme/destination" > "$T_TMP/aget.out"
check "GET (customer and admin) shows it without the secret" \
	[ "$(head -n -1 "$T_TMP/get.out" | jq -r .id)" = "$DID" -a "$(jq -r .id "$T_TMP/aget.out")" = "$DID" ]
check "no answer holds the secret key or the whole access key id" \
	[ "$(cat "$T_TMP/put.out" "$T_TMP/get.out" "$T_TMP/aget.out" | grep -c -e "$C_SK" -e "$C_AK")" = 0 ]
r=$(custst POST /v1/destination/test)
check "POST /v1/destination/test: a test write succeeds" [ "$(head -n -1 <<< "$r" | jq -r .test.ok)" = true ]

# ---- a task with a tiny and a large (multipart) output ----
T1=$(api_task 'import os, sys
open("/output/tiny.txt", "w").write("tiny\n")
with open("/output/big.bin", "wb") as f:
    for i in range(20):
        f.write(bytes([i]) * (1 << 20))
print("to the customer")
sys.stderr.write("err line\n")')
api_final "$T1" 120
check "a task of the customer succeeds" jqe '.state == "succeeded"' "$T_TMP/$T1.json"
check "its result names the destination it went to ($DID)" jqe ".destination == \"$DID\"" "$T_TMP/$T1.json"
check "every output and the manifest has an s3_key under PREFIX/CUSTOMER/ID/ and a URL" \
	jqe "[(.artifacts[], .outputs[]) | select((.s3_key // \"\" | startswith(\"${CPREFIX}acme/$T1/\")) and (.url | type == \"string\"))] | length == 3" "$T_TMP/$T1.json"
check "the small logs travel inside the manifest: inline, no s3_key, a kiln-api URL" \
	jqe "[.artifacts[\"stdout.log\"], .artifacts[\"stderr.log\"]] | map(select(.inline == true and .s3_key == null and (.url | startswith(\"$API/v1/tasks/$T1/artifacts/\")))) | length == 2" "$T_TMP/$T1.json"
# The links kiln-api signs come from its configuration, never from the
# request's Host (the client's to write): no public_url here, so its listen address.
cust -H 'Host: evil.example' "$API/v1/tasks/$T1" > "$T_TMP/evil.json"
check "GET with Host: evil.example: the logs' links still start with $API, none names evil.example ($(jq -r '.artifacts["stdout.log"].url // "no url"' "$T_TMP/evil.json" | cut -d'?' -f1))" \
	[ "$(jq "[.artifacts[\"stdout.log\"], .artifacts[\"stderr.log\"]] | map(select(.url | startswith(\"$API/v1/tasks/$T1/artifacts/\"))) | length == 2" "$T_TMP/evil.json")" = true \
	  -a "$(grep -c evil.example "$T_TMP/evil.json")" = 0 ]
keys "$C_AK" "$C_SK" "$CBUCKET" "$T1/" | sort > "$T_TMP/ckeys"
check "the customer's bucket holds its 3 objects, listed with the customer's credentials ($(tr '\n' ' ' < "$T_TMP/ckeys"))" \
	[ "$(cat "$T_TMP/ckeys")" = "$(printf '%s\n' "${CPREFIX}acme/$T1/manifest.json" "${CPREFIX}acme/$T1/outputs/big.bin" \
		"${CPREFIX}acme/$T1/outputs/tiny.txt")" ]
check "the manifest in the customer's bucket carries both logs (base64)" \
	[ "$(s3py "$C_AK" "$C_SK" "import json, base64; m = json.loads(s3.get_object(Bucket='$CBUCKET', Key='${CPREFIX}acme/$T1/manifest.json')['Body'].read()); print(m['version'], base64.b64decode(m['artifacts']['stdout.log']['inline']).decode().strip(), base64.b64decode(m['artifacts']['stderr.log']['inline']).decode().strip())")" = "2 to the customer err line" ]
check "kiln's bucket holds nothing of it" [ -z "$(keys "$S3_ACCESS_KEY" "$S3_SECRET_KEY" "$BUCKET" "$T1")" ]
etag=$(s3py "$C_AK" "$C_SK" "print(s3.head_object(Bucket='$CBUCKET', Key='${CPREFIX}acme/$T1/outputs/big.bin')['ETag'])")
check "the 20 MiB output went up as a multipart upload (ETag $etag)" [ -n "$(grep -- '-[0-9]*"$' <<< "$etag")" ]
want=$($PY -c 'import hashlib; d=b"".join(bytes([i])*(1<<20) for i in range(20)); print(len(d), hashlib.sha256(d).hexdigest())')
got=$(api_sha_of_url "$(jq -r '.outputs[] | select(.path == "big.bin") | .url' "$T_TMP/$T1.json")")
check "the large output's presigned URL serves its bytes ($got)" [ "$got" = "$want" ]
check "the tiny output's presigned URL serves its bytes" \
	[ "$(curl -s -m 30 "$(jq -r '.outputs[] | select(.path == "tiny.txt") | .url' "$T_TMP/$T1.json")")" = tiny ]
check "stdout.log's URL serves the log, without an API key" \
	[ "$(curl -s -m 30 "$(jq -r '.artifacts["stdout.log"].url' "$T_TMP/$T1.json")")" = "to the customer" ]
lurl=$(jq -r '.artifacts["stdout.log"].url' "$T_TMP/$T1.json")
check "a Range of it answers 206 with those bytes (kiln run resumes logs this way)" \
	[ "$(curl -s -m 30 -r 3-5 -w ' %{http_code}' "$lurl")" = "the 206" ]
check "a range past its end answers 416" [ "$(curl -s -m 30 -o /dev/null -r 100- -w '%{http_code}' "$lurl")" = 416 ]
bad=${lurl%?}; [ "${lurl: -1}" = 0 ] && bad=${bad}1 || bad=${bad}0
check "a link with a changed signature answers 403, saying why" \
	[ "$(curl -s -m 30 "$bad" | jq -r .error.code 2> /dev/null)" = forbidden ]
check "so does one pointed at another log of the same task" \
	[ "$(curl -s -m 30 -o /dev/null -w '%{http_code}' "${lurl/stdout.log/stderr.log}")" = 403 ]
check "the unsigned path needs the customer's key, and then serves the log" \
	[ "$(curl -s -m 30 -o /dev/null -w '%{http_code}' "$API/v1/tasks/$T1/artifacts/stdout.log")" = 401 \
	  -a "$(cust "$API/v1/tasks/$T1/artifacts/stderr.log")" = "err line" ]
check "an artifact in S3 is not served there (404)" \
	[ "$(cust -o /dev/null -w '%{http_code}' "$API/v1/tasks/$T1/artifacts/manifest.json")" = 404 ]
check "the presigned URLs are signed with the customer's access key" \
	[ -n "$(jq -r '.artifacts["manifest.json"].url' "$T_TMP/$T1.json" | grep 'X-Amz-Credential=cust%3Aalice')" ]
check "the manifest's URL serves the manifest" \
	[ "$(curl -s -m 30 "$(jq -r '.artifacts["manifest.json"].url' "$T_TMP/$T1.json")" | jq -r .task)" = "$T1" ]
(cd "$T_TMP" && KILN_CREDENTIALS=$T_TMP/none KILN_API=$API KILN_KEY=$KEY timeout 60 "$BIN/kiln" task logs "$T1" > logs.out 2> logs.err)
check "kiln task logs prints the task's output (through its URL)" [ "$(cat "$T_TMP/logs.out")" = "to the customer" ]
sqlite3 "$T_TMP/api.db" 'PRAGMA wal_checkpoint(TRUNCATE)' > /dev/null 2>&1
check "the SQLite store holds no plaintext secret key" \
	[ "$(cat "$T_TMP"/api.db* | grep -c -a "$C_SK")" = 0 -a "$(sqlite3 "$T_TMP/api.db" 'SELECT count(*) FROM destinations')" = 1 ]

# ---- wrong credentials: the upload fails with s3_auth, spooled, retried ----
r=$(custst PUT /v1/destination "$(dest '{"secret_key":"rotated-wrong","verify":false}')")
check "PUT with verify:false keeps a wrong secret for the same place (same id)" \
	[ "$(tail -1 <<< "$r")" = 200 -a "$(head -n -1 <<< "$r" | jq -r .id)" = "$DID" ]
T2=$(api_task 'open("/output/o.txt", "w").write("after the fix\n"); print("retried")')
for _ in $(seq 300); do
	curl -s -m 10 -H "Authorization: Bearer $TOKEN" "$HOST/v1/tasks/$T2" > "$T_TMP/h2.json"
	jqe '.upload_attempts >= 2' "$T_TMP/h2.json" 2> /dev/null && break
	sleep 0.2
done
check "the host's upload fails with s3_auth and is retried ($(jq -r '"\(.upload_attempts) attempts: \(.last_error)"' "$T_TMP/h2.json"))" \
	jqe '.state == "uploading" and .upload_attempts >= 2 and (.last_error | startswith("s3_auth"))' "$T_TMP/h2.json"
check "kiln-api shows the task uploading, not lost" jqe '.state == "uploading"' <(cust "$API/v1/tasks/$T2")
rec=$T_TMP/spool-dest-host/tasks/$T2/record.json
check "its spool record keeps the destination, mode 0600 ($(stat -c %a "$rec" 2> /dev/null))" \
	[ "$(stat -c %a "$rec" 2> /dev/null)" = 600 -a "$(jq -r .destination.bucket "$rec" 2> /dev/null)" = "$CBUCKET" ]
check "the host's task JSON never shows the destination's secret" [ "$(grep -c rotated-wrong "$T_TMP/h2.json")" = 0 ]
# Fixed with the CLI (the secret from stdin, never on the command line).
kcli() { (cd "$T_TMP" && KILN_CREDENTIALS=$T_TMP/none KILN_API=$API KILN_KEY=$KEY timeout 60 "$BIN/kiln" "$@"); }
echo "$C_SK" | kcli destination set --endpoint "$S3_ENDPOINT" --bucket "$CBUCKET" --prefix "$CPREFIX" \
	--access-key "$C_AK" --secret-key-file - > "$T_TMP/cli-set.out" 2> "$T_TMP/cli-set.err"
rc=$?
check "kiln destination set fixes it (exit $rc, same id, no secret printed)" \
	[ "$rc" = 0 -a "$(jq -r .id "$T_TMP/cli-set.out" 2> /dev/null)" = "$DID" -a "$(grep -c "$C_SK" "$T_TMP/cli-set.out")" = 0 ]
api_final "$T2" 60
check "the spooled upload then succeeds" jqe '.state == "succeeded"' "$T_TMP/$T2.json"
check "once uploaded, its spool record keeps where the objects went, not the secret" \
	[ "$(jq -r '.destination.bucket + " " + (.destination.secret_key // "none")' "$rec" 2> /dev/null)" = "$CBUCKET none" \
	  -a "$(grep -c -e "$C_SK" -e rotated-wrong "$rec")" = 0 ]
check "into the customer's bucket (its output and the manifest, which carries its small logs)" [ "$(keys "$C_AK" "$C_SK" "$CBUCKET" "$T2/" | wc -l)" = 2 -a -z "$(keys "$S3_ACCESS_KEY" "$S3_SECRET_KEY" "$BUCKET" "$T2")" ]
check "its output's URL serves it" \
	[ "$(curl -s -m 30 "$(jq -r '.outputs[0].url' "$T_TMP/$T2.json")")" = "after the fix" ]

kcli destination show > "$T_TMP/cli-show.out"; rc1=$?
kcli destination test > "$T_TMP/cli-test.out"; rc2=$?
check "kiln destination show and test (exit $rc1, $rc2; no secret)" \
	[ "$rc1" = 0 -a "$rc2" = 0 -a "$(jq -r .bucket "$T_TMP/cli-show.out")" = "$CBUCKET" \
	  -a "$(jq -r .test.ok "$T_TMP/cli-test.out")" = true -a "$(cat "$T_TMP"/cli-*.out | grep -c "$C_SK")" = 0 ]

# ---- a session's outputs go there too; its snapshot stays in kiln's bucket ----
SID=$(cust -X POST --data '{}' "$API/v1/sessions" | jq -r '.id // empty')
cust -X POST --data '{"argv":["sh","-c","echo session-out > /output/s.txt"]}' "$API/v1/sessions/$SID/exec" > /dev/null
cust -X POST "$API/v1/sessions/$SID/outputs" > "$T_TMP/souts.json"
check "a session's outputs go to the customer's bucket under PREFIX/CUSTOMER/sessions/ID/outputs/ ($(head -c 300 "$T_TMP/souts.json"))" \
	jqe ".destination == \"$DID\" and (.outputs[0].s3_key == \"${CPREFIX}acme/sessions/$SID/outputs/s.txt\")" "$T_TMP/souts.json"
check "and its URL serves the file" [ "$(curl -s -m 30 "$(jq -r '.outputs[0].url' "$T_TMP/souts.json")")" = session-out ]
check "listed with the customer's credentials, not in kiln's bucket" \
	[ "$(keys "$C_AK" "$C_SK" "$CBUCKET" "sessions/$SID/outputs/s.txt" | wc -l)" = 1 -a -z "$(keys "$S3_ACCESS_KEY" "$S3_SECRET_KEY" "$BUCKET" "sessions/$SID/outputs")" ]
st=$(cust -X POST "$API/v1/sessions/$SID/pause" | jq -r .state)
check "its pause snapshot stays in kiln's bucket ($st)" \
	[ "$st" = paused -a -n "$(keys "$S3_ACCESS_KEY" "$S3_SECRET_KEY" "$BUCKET" "sessions/$SID/")" -a -z "$(keys "$C_AK" "$C_SK" "$CBUCKET" "sessions/$SID/" | grep -v /outputs/)" ]
cust -X DELETE "$API/v1/sessions/$SID" > /dev/null

# ---- deleted: kiln's bucket again ----
r=$(custst DELETE /v1/destination)
check "DELETE /v1/destination: 200, then GET 404" \
	[ "$(tail -1 <<< "$r")" = 200 -a "$(custst GET /v1/destination | tail -1)" = 404 ]
T3=$(api_task 'print("ops")')
api_final "$T3" 60
check "a task after it goes to kiln's bucket" \
	jqe '.state == "succeeded" and (has("destination") | not) and (.artifacts["manifest.json"].s3_key | startswith("acme/"))' "$T_TMP/$T3.json"
check "which holds it: one object, the manifest, for a task this small" [ "$(keys "$S3_ACCESS_KEY" "$S3_SECRET_KEY" "$BUCKET" "$T3/" | wc -l)" = 1 ]
cust "$API/v1/tasks/$T1" > "$T_TMP/T1b.json"
check "an earlier task's URLs are withheld, with a reason, once its destination is gone" \
	jqe '.artifacts["manifest.json"].url == null and (.artifacts["manifest.json"].url_error | test("changed or deleted"))' "$T_TMP/T1b.json"

# ---- another key: the customer's task fails, never kiln's bucket ----
r=$(custst PUT /v1/destination "$(dest)")
stop_api
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$T_TMP/other.key"
write_api_config "$T_TMP/other.key"
start_api
wait_host
T4=$(api_task 'print("nowhere")')
api_final "$T4" 60
check "kiln-api with another key: the task fails with destination_unavailable" \
	jqe '.state == "error" and .error.code == "destination_unavailable"' "$T_TMP/$T4.json"
check "and nothing of it is in kiln's bucket" [ -z "$(keys "$S3_ACCESS_KEY" "$S3_SECRET_KEY" "$BUCKET" "$T4")" ]
r=$(custst GET /v1/destination)
check "GET still shows the destination (its secret not needed)" [ "$(tail -1 <<< "$r")" = 200 ]

# ---- the allow-list is what admits the local S3, on kiln-api and on the host ----
stop_api
write_api_config "$T_TMP/dest.key" '[]'
start_api
forbidden "the local S3 once kiln-api's destinations.allow_addresses no longer lists it" "$S3_ENDPOINT" "(loopback)"
r=$(custst POST /v1/destination/test)
check "POST /v1/destination/test of the stored one: ok false, destination_forbidden ($(head -n -1 <<< "$r" | jq -c .test 2> /dev/null))" \
	[ "$(head -n -1 <<< "$r" | jq -r '"\(.test.ok) \(.test.error.code)"' 2> /dev/null)" = "false destination_forbidden" ]
# A host checks each connection itself: kiln-api (listing the S3 again)
# hands it the stored destination; this host's own list lacks it.
stop_api
write_api_config "$T_TMP/dest.key"
start_api
stop_host
write_host_config '[]'
start_host
wait_host
T5=$(api_task 'open("/output/o.txt", "w").write("never\n"); print("never")')
for _ in $(seq 300); do
	curl -s -m 10 -H "Authorization: Bearer $TOKEN" "$HOST/v1/tasks/$T5" > "$T_TMP/h5.json"
	jqe '.upload_attempts >= 2' "$T_TMP/h5.json" && break
	sleep 0.2
done
check "a host whose own list lacks it refuses the upload itself (its check before each connection): destination_forbidden, spooled and retried ($(jq -r '"\(.upload_attempts) attempts: \(.last_error)"' "$T_TMP/h5.json" 2> /dev/null))" \
	[ "$(jq -r '"\(.state) \(.upload_attempts >= 2) \(.last_error | startswith("destination_forbidden"))"' "$T_TMP/h5.json" 2> /dev/null)" = "uploading true true" ]
check "and nothing of that task ($T5) reached the customer's bucket" [ -n "$T5" -a -z "$(keys "$C_AK" "$C_SK" "$CBUCKET" "$T5")" ]

# ---- nothing left ----
t_nothing_left "nothing left: no QEMU, VM directories, cgroups, mounts or slot locks"
t_done
