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
want=$(jq -r '.packages["node_modules/@modelcontextprotocol/sdk"].version' "$src/package-lock.json")

command -v node >/dev/null || "$root/scripts/deps.sh" >&2

# The SDK's engines field: node >= 18.
nodev=$(node -p 'process.versions.node')
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)'; then
	echo "mcp-sdk: node $nodev is too old for the MCP SDK (it needs node >= 18)" >&2
	exit 1
fi

exec "$root/scripts/npm-pinned.sh" mcp-sdk "$src" @modelcontextprotocol/sdk
