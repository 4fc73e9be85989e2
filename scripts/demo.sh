#!/usr/bin/env bash
# make demo: the single-machine stack (a local S3 server and kiln-host serve
# with a warm pool), one example task through the host's task API, its output
# streamed live, its files shown in S3, then everything stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
work=$(mktemp -d /tmp/kiln-demo.XXXXXX)
s3dir=${KILN_DEMO_S3_DIR:-/var/lib/kiln/demo-s3}
port=${KILN_DEMO_PORT:-7071}
token=demo-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')
host_pid=

cleanup() {
	if [ -n "$host_pid" ]; then kill "$host_pid" 2> /dev/null || true; wait "$host_pid" 2> /dev/null || true; fi
	scripts/s3-local.sh stop "$s3dir" 2> /dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT INT TERM

echo "== local S3 (Swift + s3api) in $s3dir"
scripts/s3-local.sh start "$s3dir" > "$work/s3.env"
set -a; . "$work/s3.env"; set +a
echo "   $S3_ENDPOINT"
jq -n --arg port "$port" --arg token "$token" --arg spool "$work/spool" --arg ep "$S3_ENDPOINT" \
	--arg ak "$S3_ACCESS_KEY" --arg sk "$S3_SECRET_KEY" \
	'{listen: ("127.0.0.1:" + $port), host_id: "demo-host", token: $token, spool_dir: $spool,
	  pool: {size: 1, prestart: 1},
	  s3: {endpoint: $ep, region: "us-east-1", bucket: "kiln-demo", access_key: $ak, secret_key: $sk}}' > "$work/host.json"
echo "== kiln-host serve (creates the pre-booted snapshot on first use, cached in ${KILN_CACHE:-/var/cache/kiln}/snapshots)"
build/kiln-host serve --config "$work/host.json" 2> "$work/host.log" &
host_pid=$!
auth=(-H "Authorization: Bearer $token")
url=http://127.0.0.1:$port
for _ in $(seq 1800); do
	[ "$(curl -s --max-time 2 "${auth[@]}" "$url/v1/capacity" | jq -r .pool.ready 2> /dev/null)" = 1 ] && break
	kill -0 "$host_pid" 2> /dev/null || { cat "$work/host.log" >&2; exit 1; }
	sleep 0.1
done

id=demo-$(date +%s)
echo "== task $id: examples/squares.py"
jq -n --arg id "$id" --rawfile code examples/squares.py \
	'{id: $id, customer: "demo", spec: {language: "python", code: $code, limits: {vcpus: 1, memory_mib: 256, timeout_s: 30}}}' \
	| curl -s --fail-with-body "${auth[@]}" -X POST --data-binary @- "$url/v1/tasks" > /dev/null
# Follow the task's events: state changes, and its output raw as it is printed.
curl -s -N --max-time 120 "${auth[@]}" "$url/v1/tasks/$id/events" | while IFS= read -r line; do
	case $line in
	"event: "*) ev=${line#event: } ;;
	"data: "*)
		data=${line#data: }
		case $ev in
		state) echo "   [state] $(jq -r .state <<< "$data")" ;;
		stdout) jq -j .data <<< "$data" ;;
		stderr) jq -j .data <<< "$data" >&2 ;;
		*) echo "   [$ev] $data" ;;
		esac ;;
	esac
done
curl -s "${auth[@]}" "$url/v1/tasks/$id" > "$work/task.json"
python3 - "$work/task.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
r = t.get("result") or {}
print("== result: %s (exit code %s), timings %s" % (t["state"], r.get("exit_code"), t.get("timings")))
b = t["s3"]["bucket"]
print("== in S3 (bucket %s):" % b)
for o in t["outputs"]:
    print("   s3://%s/%s  (%d bytes, sha256 %s...)" % (b, o["s3_key"], o["size"], o["sha256"][:16]))
for name, a in sorted(t["artifacts"].items()):
    print("   s3://%s/%s  (%d bytes)" % (b, a["s3_key"], a["size"]))
PY
key=$(jq -r '.outputs[0].s3_key' "$work/task.json")
echo "== read back with an independent S3 client (boto3): $key"
python3 - "$key" <<'PY'
import os, sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                  aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"],
                  config=Config(s3={"addressing_style": "path"}))
print("   " + s3.get_object(Bucket="kiln-demo", Key=sys.argv[1])["Body"].read().decode().replace("\n", "\n   ").rstrip())
PY
echo "== stopping kiln-host and the local S3 (the objects stay in $s3dir)"
