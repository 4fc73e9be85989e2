#!/usr/bin/env bash
# Pause and resume through kiln-api (figures, not pass/fail): one `kiln up`
# stack, bench/pause_api.py does the measuring (RUNS rounds, default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
. bench/up.sh
bench_up pause-api || exit 0
(
	set -a
	. "$TMP/up/credentials"
	set +a
	bench/pause_api.py "$RUNS"
)
