#!/usr/bin/env bash
# Installs the E2B JavaScript SDK pinned by tests/e2b/package-lock.json
# (e2b 2.51.0, unmodified, from npm) into a cache outside the clone, keyed by
# the lockfile's hash, and prints the node_modules directory on stdout:
#
#   ${KILN_CACHE:-/var/cache/kiln}/e2b-sdk/<key>/node_modules
#
# Idempotent: a cache entry that holds the pinned version is reused without
# touching the network. node and npm come from Debian (scripts/deps.sh
# installs them when missing). Used by tests/integration/92-e2b-sdk.sh and
# bench/e2b.sh, which pass the printed path to node as KILN_E2B_SDK
# (tests/e2b/sdk.mjs imports the SDK from there).
#   usage: scripts/e2b-sdk.sh            exit 0 and the path, else 1 and why
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/tests/e2b
want=$(jq -r '.packages["node_modules/e2b"].version' "$src/package-lock.json")

command -v node >/dev/null || "$root/scripts/deps.sh" >&2

# The SDK's engines field: node >=20.18.1 <21 || >=22 (undici 7). Debian
# bookworm's own nodejs is 18: install a newer one (bookworm-backports,
# trixie or NodeSource) first.
nodev=$(node -p 'process.versions.node')
if ! node -e '
const [a, b, c] = process.versions.node.split(".").map(Number);
process.exit((a === 20 && (b > 18 || (b === 18 && c >= 1))) || a >= 22 ? 0 : 1)'; then
	echo "e2b-sdk: node $nodev is too old for e2b $want (it needs node >= 20.18.1 <21 or >= 22)" >&2
	exit 1
fi

exec "$root/scripts/npm-pinned.sh" e2b-sdk "$src" e2b
