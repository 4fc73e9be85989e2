#!/usr/bin/env bash
# Prints the path of a promtool (Prometheus' rule checker) for
# tests/integration/115-monitoring.sh: the one on PATH, else the one from
# Debian's prometheus package, taken out of the package with
# `apt-get download` and `dpkg-deb -x` (the server itself is not installed
# and starts nothing) into a cache outside the clone, keyed by the
# package's version:
#
#   ${KILN_CACHE:-/var/cache/kiln}/promtool/<version>/promtool
#
# Idempotent: a cached one is reused without touching the network.
#   usage: scripts/promtool.sh       exit 0 and the path, else 1 and why
set -euo pipefail

if command -v promtool > /dev/null; then
	command -v promtool
	exit 0
fi
cache=${KILN_CACHE:-/var/cache/kiln}/promtool
v=$(apt-cache policy prometheus 2> /dev/null | awk '/Candidate:/ {print $2}')
if [ -z "$v" ] || [ "$v" = "(none)" ]; then
	# No package lists yet (a fresh machine whose packages were all there).
	apt-get update -q > /dev/null 2>&1 || true
	v=$(apt-cache policy prometheus 2> /dev/null | awk '/Candidate:/ {print $2}')
fi
[ -n "$v" ] && [ "$v" != "(none)" ] || { echo "promtool: Debian's prometheus package is not available" >&2; exit 1; }
dir=$cache/${v//[^A-Za-z0-9.+~-]/_}
if [ ! -x "$dir/promtool" ]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	(cd "$tmp" && apt-get download -q "prometheus=$v" > "$tmp/log" 2>&1) ||
		{ echo "promtool: apt-get download prometheus=$v failed: $(tail -n 1 "$tmp/log")" >&2; exit 1; }
	dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
	[ -x "$tmp/x/usr/bin/promtool" ] || { echo "promtool: not in prometheus $v" >&2; exit 1; }
	mkdir -p "$dir"
	cp "$tmp/x/usr/bin/promtool" "$dir/promtool.new"
	mv "$dir/promtool.new" "$dir/promtool"
fi
echo "$dir/promtool"
