#!/usr/bin/env bash
# Forks and named snapshots through kiln-api (figures, not pass/fail): one `kiln up`
# stack, bench/fork_api.py does the measuring (RUNS rounds, default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
. bench/up.sh
bench_up fork-api || exit 0
(
	set -a
	. "$TMP/up/credentials"
	set +a
	bench/fork_api.py "$RUNS"
)
