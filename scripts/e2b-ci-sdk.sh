#!/usr/bin/env bash
# Installs E2B's Code Interpreter SDK pinned by tests/e2b-ci/package-lock.json
# (@e2b/code-interpreter 2.8.0 with e2b 2.51.0, unmodified, from npm) into a
# cache outside the clone, keyed by the lockfile's hash, and prints the
# node_modules directory on stdout:
#
#   ${KILN_CACHE:-/var/cache/kiln}/e2b-ci-sdk/<key>/node_modules
#
# Same node requirement as scripts/e2b-sdk.sh (the e2b SDK's engines field).
# Used by tests/integration/100-code-interpreter.sh and bench/code-interpreter.sh.
#   usage: scripts/e2b-ci-sdk.sh         exit 0 and the path, else 1 and why
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
command -v node >/dev/null || "$root/scripts/deps.sh" >&2
if ! node -e '
const [a, b, c] = process.versions.node.split(".").map(Number);
process.exit((a === 20 && (b > 18 || (b === 18 && c >= 1))) || a >= 22 ? 0 : 1)'; then
	echo "e2b-ci-sdk: node $(node -p 'process.versions.node') is too old for the E2B SDK (it needs node >= 20.18.1 <21 or >= 22)" >&2
	exit 1
fi
exec "$root/scripts/npm-pinned.sh" e2b-ci-sdk "$root/tests/e2b-ci" @e2b/code-interpreter
