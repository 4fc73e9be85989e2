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
. bench/up.sh
bench_up e2b || exit 0
(
	set -a
	. "$TMP/up/credentials"
	set +a
	# kiln up writes the E2B variables; derive them for an older one.
	export E2B_API_URL=${E2B_API_URL:-$KILN_API/e2b} E2B_SANDBOX_URL=${E2B_SANDBOX_URL:-$KILN_API} E2B_API_KEY=${E2B_API_KEY:-$KILN_KEY}
	KILN_E2B_SDK=$SDK node bench/e2b.mjs "$RUNS"
)
