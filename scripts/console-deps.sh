#!/usr/bin/env bash
# Installs playwright-core pinned by tests/console/package-lock.json (from
# npm, unmodified; it drives Debian's /usr/bin/chromium, no browser download)
# into a cache outside the clone, keyed by the lockfile's hash, and prints the
# node_modules directory on stdout (scripts/npm-pinned.sh does the install):
#
#   ${KILN_CACHE:-/var/cache/kiln}/console-deps/<key>/node_modules
#
# Idempotent: a cache entry that holds the pinned version is reused without
# touching the network. Used by tests/integration/96-web-console.sh, which
# passes the path to node as KILN_CONSOLE_DEPS.
#   usage: scripts/console-deps.sh       exit 0 and the path, else 1 and why
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v node >/dev/null || [ ! -x /usr/bin/chromium ]; then
	echo "console-deps: node or chromium missing: running scripts/deps.sh" >&2
	"$root/scripts/deps.sh" >&2
fi
exec "$root/scripts/npm-pinned.sh" console-deps "$root/tests/console" playwright-core
