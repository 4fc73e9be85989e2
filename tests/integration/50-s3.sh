#!/usr/bin/env bash
# lib/s3.c against a real S3 server: Swift + s3api started by
# scripts/s3-local.sh in a temporary directory. Single and multipart uploads
# read back with an independent client (boto3), signing errors, presigned URLs
# fetched with plain curl, S3 down, and s3-local.sh's own contract (idempotent
# start, two instances side by side, nothing left running after stop).
. "$(dirname "$0")/lib.sh"
t_plan 24

S3TOOL=$ROOT/build/tests/s3tool
S3LOCAL=$ROOT/scripts/s3-local.sh
PY=/usr/bin/python3 # Debian's, with Debian's python3-boto3 (scripts/deps.sh)
t_require_built tests/s3tool
t_require_tools swift-proxy-server memcached curl
t_require_python boto3

S3DIR=$T_TMP/s3
S3DIR2=$T_TMP/s3-second
t_on_exit '"$S3LOCAL" stop "$S3DIR2" > /dev/null 2>&1; "$S3LOCAL" stop "$S3DIR" > /dev/null 2>&1'

# Processes of one instance: every one has its directory on its command line.
count_procs() { pgrep -f -- "$1/" | wc -l; }
pids_of() { cat "$1"/run/*.pid 2>/dev/null | sort | tr '\n' ' '; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# ---- start ------------------------------------------------------------------------
before=$(count_procs "$S3DIR")
if "$S3LOCAL" start "$S3DIR" >"$T_TMP/env" 2>"$T_TMP/start.err" && grep -q '^S3_ENDPOINT=http://127.0.0.1:[0-9]*$' "$T_TMP/env" &&
	grep -qx 'S3_REGION=us-east-1' "$T_TMP/env" && grep -qx 'S3_ACCESS_KEY=test:tester' "$T_TMP/env" &&
	grep -qx 'S3_SECRET_KEY=testing' "$T_TMP/env" && [ "$(wc -l <"$T_TMP/env")" = 4 ]; then
	ok "s3-local.sh start prints the four env lines: $(head -n1 "$T_TMP/env")"
else
	not_ok "s3-local.sh start" "$(cat "$T_TMP/env" "$T_TMP/start.err")"
	t_done
	exit 1
fi
eval "$(cat "$T_TMP/env")"
export S3_ENDPOINT S3_REGION S3_ACCESS_KEY S3_SECRET_KEY
export S3_BUCKET=kiln-it
running=$(count_procs "$S3DIR")
"$S3LOCAL" status "$S3DIR" >"$T_TMP/status" 2>&1
st=$?
if [ "$before" = 0 ] && [ "$running" = 5 ] && [ $st = 0 ] && [ "$(grep -c ' running$' "$T_TMP/status")" = 5 ]; then
	ok "5 processes (memcached, account, container, object, proxy) run from the directory; status says so"
else not_ok "processes after start" "before=$before running=$running status=$st" "$(cat "$T_TMP/status")"; fi

pids=$(pids_of "$S3DIR")
"$S3LOCAL" start "$S3DIR" >"$T_TMP/env2" 2>/dev/null
st=$?
if [ $st = 0 ] && cmp -s "$T_TMP/env" "$T_TMP/env2" && [ "$(pids_of "$S3DIR")" = "$pids" ] && [ "$(count_procs "$S3DIR")" = 5 ]; then
	ok "start when already running changes nothing and prints the same env"
else not_ok "second start is a no-op" "status=$st pids before=$pids after=$(pids_of "$S3DIR")"; fi
"$S3LOCAL" env "$S3DIR" >"$T_TMP/env3" 2>/dev/null
check "env prints the same lines" cmp -s "$T_TMP/env" "$T_TMP/env3"

# ---- uploads ------------------------------------------------------------------------
if "$S3TOOL" ensure-bucket 2>"$T_TMP/eb.err" && "$S3TOOL" ensure-bucket 2>>"$T_TMP/eb.err"; then
	ok "ensure-bucket creates the bucket, and a second call is fine"
else not_ok "ensure-bucket" "$(cat "$T_TMP/eb.err")"; fi

SMALL_KEY=$'cust-1/task 1/out/r\xc3\xa9sum\xc3\xa9 a+b~c:d.txt'
printf 'hello from kiln %s\n' "$RANDOM" >"$T_TMP/small"
head -c $((40 << 20)) /dev/urandom >"$T_TMP/big"
"$S3TOOL" put "$SMALL_KEY" "$T_TMP/small" >"$T_TMP/put-small.out" 2>&1
st=$?
if [ $st = 0 ] && grep -q "^sha256=$(sha "$T_TMP/small") " "$T_TMP/put-small.out"; then
	ok "put of a small file under a key that needs encoding; its SHA-256 reported"
else not_ok "put small" "status=$st" "$(cat "$T_TMP/put-small.out")"; fi
"$S3TOOL" put cust-1/task-1/big.bin "$T_TMP/big" >"$T_TMP/put-big.out" 2>&1
st=$?
sent=$(sed -n 's/.*bytes_sent=\([0-9]*\).*/\1/p' "$T_TMP/put-big.out")
if [ $st = 0 ] && grep -q "^sha256=$(sha "$T_TMP/big") " "$T_TMP/put-big.out" && [ "${sent:-0}" -ge $((40 << 20)) ]; then
	ok "put of a 40 MiB file (multipart above 16 MiB): $(cat "$T_TMP/put-big.out")"
else not_ok "put big" "status=$st" "$(cat "$T_TMP/put-big.out")"; fi

# Read back with boto3: bytes, ETags (a multipart ETag ends in -<parts>), no
# upload left open.
$PY - "$SMALL_KEY" "$T_TMP" >"$T_TMP/boto.out" 2>&1 <<'PY'
import hashlib, os, sys
import boto3, botocore
key, tmp = sys.argv[1].encode("utf-8", "surrogateescape").decode("utf-8"), sys.argv[2]
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name=os.environ["S3_REGION"],
                  aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"],
                  config=botocore.config.Config(s3={"addressing_style": "path"}))
b = os.environ["S3_BUCKET"]
for k, f in ((key, "small"), ("cust-1/task-1/big.bin", "big")):
    got = hashlib.sha256(s3.get_object(Bucket=b, Key=k)["Body"].read()).hexdigest()
    want = hashlib.sha256(open(os.path.join(tmp, f), "rb").read()).hexdigest()
    print(f"{f}_sha_match={got == want}")
    print(f"{f}_etag={s3.head_object(Bucket=b, Key=k)['ETag']}")
print(f"open_uploads={len(s3.list_multipart_uploads(Bucket=b).get('Uploads', []))}")
PY
if grep -qx 'small_sha_match=True' "$T_TMP/boto.out" && grep -qx 'big_sha_match=True' "$T_TMP/boto.out"; then
	ok "boto3 reads both objects back with the same SHA-256"
else not_ok "boto3 read-back" "$(cat "$T_TMP/boto.out")"; fi
if grep -qx 'big_etag="[0-9a-f]\{32\}-3"' "$T_TMP/boto.out" && grep -qx 'small_etag="[0-9a-f]\{32\}"' "$T_TMP/boto.out" &&
	grep -qx 'open_uploads=0' "$T_TMP/boto.out"; then
	ok "the 40 MiB object has a 3-part multipart ETag, the small one a plain MD5; no upload left open"
else not_ok "ETags" "$(cat "$T_TMP/boto.out")"; fi

"$S3TOOL" get cust-1/task-1/big.bin "$T_TMP/big.back" 2>"$T_TMP/get.err"
st=$?
if [ $st = 0 ] && cmp -s "$T_TMP/big" "$T_TMP/big.back" && [ -z "$(find "$T_TMP" -name '*.s3tmp.*')" ]; then
	ok "get writes the object to the file (no temporary left)"
else not_ok "get" "status=$st $(cat "$T_TMP/get.err")"; fi
"$S3TOOL" get cust-1/no-such-key "$T_TMP/missing" 2>"$T_TMP/get404.err"
st=$?
if [ $st = 1 ] && grep -q 's3_not_found' "$T_TMP/get404.err" && grep -q NoSuchKey "$T_TMP/get404.err" && [ ! -e "$T_TMP/missing" ] &&
	[ -z "$(find "$T_TMP" -name '*.s3tmp.*')" ]; then
	ok "get of a missing key: s3_not_found, no file, no temporary"
else not_ok "get 404" "status=$st $(cat "$T_TMP/get404.err")"; fi

size=$("$S3TOOL" head "$SMALL_KEY" 2>/dev/null)
"$S3TOOL" delete "$SMALL_KEY" 2>/dev/null
d1=$?
"$S3TOOL" head "$SMALL_KEY" >/dev/null 2>&1
h=$?
"$S3TOOL" delete "$SMALL_KEY" 2>/dev/null
d2=$?
if [ "$size" = "size=$(stat -c %s "$T_TMP/small")" ] && [ $d1 = 0 ] && [ $h = 3 ] && [ $d2 = 0 ]; then
	ok "head gives the size; after delete head says absent; deleting again is fine"
else not_ok "head/delete" "size=$size delete=$d1 head-after=$h delete-again=$d2"; fi

# ---- credentials ------------------------------------------------------------------------
"$S3TOOL" --secret-key wrong-secret put cust-1/x "$T_TMP/small" >/dev/null 2>"$T_TMP/auth.err"
st=$?
if [ $st = 1 ] && grep -q '^s3tool: s3_auth: S3 refused the credentials: SignatureDoesNotMatch: ' "$T_TMP/auth.err"; then
	ok "a wrong secret fails with s3_auth and the server's reason: $(cut -c1-110 "$T_TMP/auth.err")..."
else not_ok "wrong secret" "status=$st $(cat "$T_TMP/auth.err")"; fi
"$S3TOOL" --access-key nobody:nouser put cust-1/x "$T_TMP/small" >/dev/null 2>"$T_TMP/auth2.err"
st=$?
if [ $st = 1 ] && grep -q 's3_auth' "$T_TMP/auth2.err"; then
	ok "an unknown access key fails with s3_auth: $(cut -c1-100 "$T_TMP/auth2.err")"
else not_ok "unknown access key" "status=$st $(cat "$T_TMP/auth2.err")"; fi

# ---- presigned URLs --------------------------------------------------------------------------
url=$("$S3TOOL" presign cust-1/task-1/big.bin 300 2>"$T_TMP/presign.err")
code=$(curl -s -o "$T_TMP/presigned.out" -w '%{http_code}' "$url")
if [ "$code" = 200 ] && cmp -s "$T_TMP/big" "$T_TMP/presigned.out"; then
	ok "plain curl fetches the object's bytes with a presigned URL"
else not_ok "presigned GET" "code=$code url=$url $(cat "$T_TMP/presign.err")"; fi
last=${url: -1}
[ "$last" = 0 ] && swap=1 || swap=0
tampered=${url%?}$swap
code_t=$(curl -s -o "$T_TMP/tampered.out" -w '%{http_code}' "$tampered")
other_key=$(curl -s -o /dev/null -w '%{http_code}' "${url/big.bin/small}")
expired=$("$S3TOOL" presign cust-1/task-1/big.bin 60 $(($(date +%s) - 3600)))
code_e=$(curl -s -o "$T_TMP/expired.out" -w '%{http_code}' "$expired")
if [ "$code_t" = 403 ] && grep -q SignatureDoesNotMatch "$T_TMP/tampered.out" && [ "$other_key" = 403 ] &&
	[ "$code_e" = 403 ] && grep -q 'expired' "$T_TMP/expired.out"; then
	ok "a tampered signature, another key and an expired URL are all refused (403)"
else not_ok "presigned refusals" "tampered=$code_t other-key=$other_key expired=$code_e" "$(head -c 300 "$T_TMP/expired.out")"; fi

# ---- a multipart upload that fails half-way is aborted --------------------------------------------
# The file shrinks once the upload has begun (its first part is on its way):
# a later part cannot be read, the call fails with io_error, and the upload
# must be aborted rather than left open with its parts stored.
head -c $((60 << 20)) /dev/zero >"$T_TMP/shrinks"
"$S3TOOL" --part-size $((5 << 20)) put cust-1/shrinks "$T_TMP/shrinks" >/dev/null 2>"$T_TMP/shrink.err" &
put_pid=$!
for _ in $(seq 500); do
	# (the proxy logs the query string percent-encoded)
	grep -q 'POST /kiln-it/cust-1/shrinks%3Fuploads' "$S3DIR/log/proxy.log" && break
	sleep 0.01
done
truncate -s $((1 << 20)) "$T_TMP/shrinks"
wait $put_pid
st=$?
$PY - >"$T_TMP/abort.out" 2>&1 <<'PY'
import os
import boto3, botocore
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name=os.environ["S3_REGION"],
                  aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"],
                  config=botocore.config.Config(s3={"addressing_style": "path"}))
print(f"open_uploads={len(s3.list_multipart_uploads(Bucket=os.environ['S3_BUCKET']).get('Uploads', []))}")
PY
"$S3TOOL" head cust-1/shrinks >/dev/null 2>&1
h=$?
if [ $st = 1 ] && grep -q '^s3tool: io_error: .*shorter' "$T_TMP/shrink.err" &&
	grep -qx 'open_uploads=0' "$T_TMP/abort.out" && [ $h = 3 ]; then
	ok "a multipart upload whose file shrinks fails with io_error and is aborted (no open upload, no object)"
else not_ok "multipart abort" "status=$st head=$h" "$(cat "$T_TMP/shrink.err" "$T_TMP/abort.out")"; fi

# ---- 5xx: retried with backoff, then s3_unavailable; start repairs a partial instance -------------
kill "$(cat "$S3DIR/run/object.pid")"
for _ in $(seq 100); do [ "$(count_procs "$S3DIR")" = 4 ] && break; sleep 0.1; done
"$S3TOOL" put cust-1/retry "$T_TMP/small" >/dev/null 2>"$T_TMP/503.err"
st=$?
tries=$(grep -c 'PUT /kiln-it/cust-1/retry HTTP/[0-9.]* 503' "$S3DIR/log/proxy.log")
if [ $st = 1 ] && grep -q '^s3tool: s3_unavailable: .* after 3 attempts: PUT kiln-it/cust-1/retry: HTTP 503' "$T_TMP/503.err" &&
	[ "$tries" = 3 ]; then
	ok "with the object server down, a PUT is tried 3 times (503 each) and fails with s3_unavailable"
else not_ok "503 retries" "status=$st tries=$tries $(cat "$T_TMP/503.err")"; fi
"$S3LOCAL" start "$S3DIR" >"$T_TMP/env4" 2>"$T_TMP/restart.err"
st=$?
if [ $st = 0 ] && cmp -s "$T_TMP/env" "$T_TMP/env4" && [ "$(count_procs "$S3DIR")" = 5 ] &&
	grep -q 'restarting all' "$T_TMP/restart.err" && "$S3TOOL" put cust-1/retry "$T_TMP/small" >/dev/null 2>&1; then
	ok "start on a partly running instance restarts it on the same endpoint, and the PUT goes through"
else not_ok "restart" "status=$st procs=$(count_procs "$S3DIR")" "$(cat "$T_TMP/restart.err")"; fi

# ---- a second instance in another directory ------------------------------------------------------
if "$S3LOCAL" start "$S3DIR2" >"$T_TMP/env-second" 2>"$T_TMP/start2.err"; then
	ep2=$(sed -n 's/^S3_ENDPOINT=//p' "$T_TMP/env-second")
	if [ "$ep2" != "$S3_ENDPOINT" ] && [ "$(count_procs "$S3DIR2")" = 5 ] &&
		S3_ENDPOINT=$ep2 "$S3TOOL" ensure-bucket 2>/dev/null && "$S3TOOL" head cust-1/task-1/big.bin >/dev/null 2>&1; then
		ok "a second instance runs beside the first on other ports ($ep2)"
	else not_ok "second instance" "first=$S3_ENDPOINT second=$ep2 procs=$(count_procs "$S3DIR2")"; fi
else
	not_ok "second instance starts" "$(cat "$T_TMP/start2.err")"
fi
"$S3LOCAL" stop "$S3DIR2" 2>/dev/null
if [ "$(count_procs "$S3DIR2")" = 0 ] && [ "$(count_procs "$S3DIR")" = 5 ]; then
	ok "stopping the second instance leaves the first running"
else not_ok "stop second" "second=$(count_procs "$S3DIR2") first=$(count_procs "$S3DIR")"; fi

# ---- S3 down --------------------------------------------------------------------------------
"$S3LOCAL" stop "$S3DIR" 2>"$T_TMP/stop.err"
st=$?
after=$(count_procs "$S3DIR")
"$S3LOCAL" status "$S3DIR" >/dev/null 2>&1
status_st=$?
if [ $st = 0 ] && [ "$after" = "$before" ] && [ $status_st = 3 ] && ! "$S3LOCAL" env "$S3DIR" >/dev/null 2>&1 &&
	[ -z "$(ls "$S3DIR/run/"*.pid 2>/dev/null)" ]; then
	ok "stop leaves no process of the directory ($running before, $after after), status 3, env refuses"
else not_ok "stop" "status=$st procs=$after status-exit=$status_st" "$(cat "$T_TMP/stop.err")"; fi
check "stop when not running is fine" "$S3LOCAL" stop "$S3DIR"

"$S3TOOL" --attempts 2 put cust-1/y "$T_TMP/small" >/dev/null 2>"$T_TMP/down.err"
st=$?
if [ $st = 1 ] && grep -q '^s3tool: s3_unavailable: S3 at .* unavailable after 2 attempts' "$T_TMP/down.err"; then
	ok "with S3 stopped, put fails with s3_unavailable: $(cut -c1-140 "$T_TMP/down.err")"
else not_ok "S3 down" "status=$st $(cat "$T_TMP/down.err")"; fi

t_done
