#!/usr/bin/env bash
# Installs playwright-core pinned by tests/console/package-lock.json (from
# npm, unmodified; it drives Debian's /usr/bin/chromium, no browser download)
# into a cache outside the clone, keyed by the lockfile's hash, and prints the
# node_modules directory on stdout:
#
#   ${KILN_CACHE:-/var/cache/kiln}/console-deps/<key>/node_modules
#
# Idempotent: a cache entry that holds the pinned version is reused without
# touching the network. Used by tests/integration/96-console.sh, which passes
# the path to node as NODE_PATH-like KILN_CONSOLE_DEPS.
#   usage: scripts/console-deps.sh       exit 0 and the path, else 1 and why
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/tests/console
cache=${KILN_CACHE:-/var/cache/kiln}/console-deps
want=$(jq -r '.packages["node_modules/playwright-core"].version' "$src/package-lock.json")
key=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-16)
dest=$cache/$key

have() { # DIR: the playwright-core version installed there, or nothing
	jq -r .version "$1/node_modules/playwright-core/package.json" 2>/dev/null || true
}

if ! command -v node >/dev/null || ! command -v npm >/dev/null || [ ! -x /usr/bin/chromium ]; then
	echo "console-deps: node, npm or chromium missing: running scripts/deps.sh" >&2
	"$root/scripts/deps.sh" >&2
fi

if [ "$(have "$dest")" = "$want" ]; then
	echo "$dest/node_modules"
	exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ "$(have "$dest")" = "$want" ]; then
	echo "$dest/node_modules"
	exit 0
fi

work=$(mktemp -d "$cache/.install-$key.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp "$src/package.json" "$src/package-lock.json" "$work/"
echo "console-deps: npm ci (playwright-core $want) into $dest" >&2
# --ignore-scripts: nothing runs at install time (and no browser download).
if ! (cd "$work" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2); then
	echo "console-deps: npm ci failed (is the npm registry reachable?)" >&2
	exit 1
fi
got=$(have "$work")
if [ "$got" != "$want" ]; then
	echo "console-deps: npm installed playwright-core '${got:-nothing}', not $want" >&2
	exit 1
fi
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
echo "$dest/node_modules"
