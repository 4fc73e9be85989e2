#!/usr/bin/env bash
# make demo: the one-command local stack (`kiln up`: a local S3 server,
# kiln-api and a kiln-host with a warm pool) in the background, one example
# task through the public API with `kiln run` (its output streamed live, its
# files downloaded from S3), then everything stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
KILN=$ROOT/build/kiln
dir=${KILN_DEMO_DIR:-/var/lib/kiln/demo}
port=${KILN_DEMO_PORT:-8089}
out=$(mktemp -d /tmp/kiln-demo.XXXXXX)
up_pid=

cleanup() {
	if [ -n "$up_pid" ]; then
		echo "== stopping kiln up (SIGTERM): kiln-host, kiln-api, S3 (the objects stay in $dir/s3)"
		kill -TERM "$up_pid" 2> /dev/null || true
		if wait "$up_pid"; then echo "   kiln up exited 0; nothing left running"
		else echo "   kiln up exited $?; its log:" >&2; sed 's/^/   /' "$out/up.log" >&2; fi
	fi
	rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== kiln up --dir $dir --port $port (log: $out/up.log)"
"$KILN" up --dir "$dir" --port "$port" > "$out/up.out" 2> "$out/up.log" &
up_pid=$!
# A first run creates the pre-booted VM snapshot (minutes under TCG, cached in
# ${KILN_CACHE:-/var/cache/kiln}/snapshots); later runs are ready in seconds.
start=$SECONDS shown=0
while [ ! -f "$dir/credentials" ]; do
	if ! kill -0 "$up_pid" 2> /dev/null; then
		wait "$up_pid" || true; up_pid=
		echo "kiln up failed:" >&2; cat "$out/up.log" >&2; exit 1
	fi
	if [ $((SECONDS - start)) -ge 1800 ]; then echo "kiln up not ready after 30 min:" >&2; tail "$out/up.log" >&2; exit 1; fi
	n=$(wc -l < "$out/up.log")
	if [ "$n" -gt "$shown" ]; then sed -n "$((shown + 1)),${n}p" "$out/up.log" | sed 's/^/   /'; shown=$n; fi
	sleep 0.2
done
sed -n "$((shown + 1)),\$p" "$out/up.log" | sed 's/^/   /'
sed 's/^/   /' "$out/up.out"

echo "== kiln run examples/squares.py"
export KILN_CREDENTIALS=$dir/credentials
rc=0
"$KILN" run examples/squares.py --out "$out/outputs" || rc=$?
[ "$rc" = 0 ] || { echo "kiln run exited $rc" >&2; exit "$rc"; }
id=$("$KILN" task list --limit 1 --json | jq -r '.tasks[0].id')
echo "== task $id: where its files are in S3 (bucket kiln), from kiln task get"
"$KILN" task get "$id" | jq -r '(.outputs[] | "   s3://kiln/\(.s3_key)  (\(.size) bytes, sha256 \(.sha256[:16])...)"),
	((.artifacts // {}) | to_entries[] | if .value.s3_key then "   s3://kiln/\(.value.s3_key)  (\(.value.size) bytes)"
		else "   \(.key)  (\(.value.size) bytes, small: inside manifest.json)" end)'
echo "   (presigned GET URLs for each: kiln task get $id | jq '.outputs[].url')"
echo "== the downloaded copy, $out/outputs/report/squares.csv:"
sed 's/^/   /' "$out/outputs/report/squares.csv"
