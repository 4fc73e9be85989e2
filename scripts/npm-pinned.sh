#!/usr/bin/env bash
# Installs the npm packages pinned by a directory's package.json and
# package-lock.json (from npm, unmodified, `npm ci --ignore-scripts`) into a
# cache outside the clone, keyed by the two files' hash, and prints the
# node_modules directory on stdout:
#
#   ${KILN_CACHE:-/var/cache/kiln}/NAME/<key>/node_modules
#
# Idempotent: a cache entry that holds the pinned version of PACKAGE is
# reused without touching the network; concurrent installers take turns
# (flock). node and npm come from Debian (scripts/deps.sh installs them when
# missing). Shared by scripts/e2b-sdk.sh, scripts/mcp-sdk.sh and
# scripts/console-deps.sh, which add their own node version checks.
#   usage: scripts/npm-pinned.sh NAME SRC_DIR PACKAGE
#          exit 0 and the path, else 1 and why (on stderr, prefixed NAME:)
set -euo pipefail

name=$1 src=$2 pkg=$3
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${KILN_CACHE:-/var/cache/kiln}/$name
want=$(jq -r --arg p "node_modules/$pkg" '.packages[$p].version // empty' "$src/package-lock.json")
[ -n "$want" ] || { echo "$name: $src/package-lock.json pins no $pkg" >&2; exit 1; }
key=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-16)
dest=$cache/$key

have() { # DIR: the version of PACKAGE installed there, or nothing
	jq -r .version "$1/node_modules/$pkg/package.json" 2>/dev/null || true
}

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	echo "$name: node or npm missing: running scripts/deps.sh" >&2
	"$root/scripts/deps.sh" >&2
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
echo "$name: npm ci ($pkg $want) into $dest" >&2
# --ignore-scripts: nothing of the dependency tree runs at install time.
if ! (cd "$work" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2); then
	echo "$name: npm ci failed (is the npm registry reachable?)" >&2
	exit 1
fi
got=$(have "$work")
if [ "$got" != "$want" ]; then
	echo "$name: npm installed $pkg '${got:-nothing}', not $want" >&2
	exit 1
fi
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
echo "$dest/node_modules"
