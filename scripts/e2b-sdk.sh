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
cache=${KILN_CACHE:-/var/cache/kiln}/e2b-sdk
want=$(jq -r '.packages["node_modules/e2b"].version' "$src/package-lock.json")
key=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-16)
dest=$cache/$key

have() { # DIR: the e2b version installed there, or nothing
	jq -r .version "$1/node_modules/e2b/package.json" 2>/dev/null || true
}

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	echo "e2b-sdk: node or npm missing: running scripts/deps.sh" >&2
	"$root/scripts/deps.sh" >&2
fi

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

if [ "$(have "$dest")" = "$want" ]; then
	echo "$dest/node_modules"
	exit 0
fi

mkdir -p "$cache"
# One installer at a time; the second one finds the first one's result.
exec 9>"$cache/.lock"
flock 9
if [ "$(have "$dest")" = "$want" ]; then
	echo "$dest/node_modules"
	exit 0
fi

work=$(mktemp -d "$cache/.install-$key.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp "$src/package.json" "$src/package-lock.json" "$work/"
echo "e2b-sdk: npm ci (e2b $want) into $dest" >&2
# --ignore-scripts: nothing of the SDK's dependency tree runs at install time.
if ! (cd "$work" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2); then
	echo "e2b-sdk: npm ci failed (is the npm registry reachable?)" >&2
	exit 1
fi
got=$(have "$work")
if [ "$got" != "$want" ]; then
	echo "e2b-sdk: npm installed e2b '${got:-nothing}', not $want" >&2
	exit 1
fi
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
echo "$dest/node_modules"
