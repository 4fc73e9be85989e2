#!/usr/bin/env bash
# Installs the official MCP TypeScript SDK pinned by tests/mcp/package-lock.json
# (@modelcontextprotocol/sdk 1.32.2, unmodified, from npm) into a cache outside the clone, keyed by
# the lockfile's hash, and prints the node_modules directory on stdout:
#
#   ${KILN_CACHE:-/var/cache/kiln}/mcp-sdk/<key>/node_modules
#
# Idempotent: a cache entry that holds the pinned version is reused without
# touching the network. Used by tests/integration/95-mcp.sh, which passes
# the printed path to node as KILN_MCP_SDK (tests/mcp/client.mjs imports the
# SDK from there).
#   usage: scripts/mcp-sdk.sh            exit 0 and the path, else 1 and why
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/tests/mcp
cache=${KILN_CACHE:-/var/cache/kiln}/mcp-sdk
want=$(jq -r '.packages["node_modules/@modelcontextprotocol/sdk"].version' "$src/package-lock.json")
key=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-16)
dest=$cache/$key

have() { # DIR: the SDK version installed there, or nothing
	jq -r .version "$1/node_modules/@modelcontextprotocol/sdk/package.json" 2>/dev/null || true
}

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	echo "mcp-sdk: node or npm missing: running scripts/deps.sh" >&2
	"$root/scripts/deps.sh" >&2
fi

# The SDK's engines field: node >= 18.
nodev=$(node -p 'process.versions.node')
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)'; then
	echo "mcp-sdk: node $nodev is too old for the MCP SDK (it needs node >= 18)" >&2
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
echo "mcp-sdk: npm ci (@modelcontextprotocol/sdk $want) into $dest" >&2
# --ignore-scripts: nothing of the SDK's dependency tree runs at install time.
if ! (cd "$work" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2); then
	echo "mcp-sdk: npm ci failed (is the npm registry reachable?)" >&2
	exit 1
fi
got=$(have "$work")
if [ "$got" != "$want" ]; then
	echo "mcp-sdk: npm installed @modelcontextprotocol/sdk '${got:-nothing}', not $want" >&2
	exit 1
fi
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
echo "$dest/node_modules"
