#!/usr/bin/env bash
# E2B compatibility (figures, not pass/fail): Sandbox.create() -> first
# commands.run('echo hi') through E2B's unmodified JavaScript SDK next to the
# same through kiln's own session API, p50/p95 over RUNS runs each, in the
# same run against one `kiln up` stack (local S3, kiln-api, one kiln-host
# with a pool of 1). bench/e2b.mjs does the measuring.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-20}
if ! SDK=$(scripts/e2b-sdk.sh 2> /tmp/kiln-bench-e2b-sdk.err); then
	echo "e2b: not measured: the E2B SDK could not be installed: $(tail -n 1 /tmp/kiln-bench-e2b-sdk.err)"
	exit 0
fi
grep -qa '/e2b/' build/kiln-api || { echo "e2b: not measured: build/kiln-api has no E2B API"; exit 0; }
TMP=$(mktemp -d /tmp/kiln-bench-e2b.XXXXXX)
PORT=$((30000 + RANDOM % 10000))
up_pid=
cleanup() {
	[ -z "$up_pid" ] || { kill -TERM "$up_pid" 2> /dev/null || true; wait "$up_pid" 2> /dev/null || true; }
	rm -rf "$TMP"
}
trap cleanup EXIT
build/kiln up --dir "$TMP/up" --port "$PORT" > "$TMP/up.out" 2> "$TMP/up.err" &
up_pid=$!
for _ in $(seq 2400); do
	[ -f "$TMP/up/credentials" ] && break
	kill -0 "$up_pid" 2> /dev/null || break
	sleep 0.25
done
[ -f "$TMP/up/credentials" ] || { echo "e2b: not measured: kiln up did not get ready: $(tail -n 3 "$TMP/up.err")"; exit 0; }
(
	set -a
	. "$TMP/up/credentials"
	set +a
	# kiln up writes the E2B variables; derive them for an older one.
	export E2B_API_URL=${E2B_API_URL:-$KILN_API/e2b} E2B_SANDBOX_URL=${E2B_SANDBOX_URL:-$KILN_API} E2B_API_KEY=${E2B_API_KEY:-$KILN_KEY}
	KILN_E2B_SDK=$SDK node bench/e2b.mjs "$RUNS"
)
