#!/usr/bin/env bash
# Prints the path of a clean Debian 12 (bookworm) root for installing a kiln
# package in (tests/integration/117-deb-install.sh): debootstrap minbase,
# the sources a Debian 12 install has (bookworm, bookworm-updates,
# bookworm-security), their package lists, systemd and procps (what a
# Debian 12 server has: the units' targets and ExecReload's /bin/kill, for
# `systemd-analyze verify --root`) and the package's Depends already
# installed (`apt-get satisfy`), so that installing the package is the
# package alone, offline. Cached outside the clone, keyed by the suite,
# variant, mirror, extra packages, this script's recipe number and the
# Depends field:
#
#   ${KILN_CACHE:-/var/cache/kiln}/debootstrap/<key>/root
#
# Built in a temporary directory beside it, in a mount namespace of its own
# (the /proc, /sys and /dev/pts the chroot's apt needs vanish with it), and
# renamed into place only when complete: an interrupted build is never a
# cache hit. Callers must not write into the cached root: copy it or mount
# an overlay over it. Idempotent: a cached root is reused without network.
#   usage: scripts/deb-root.sh DEB     exit 0 and the root's path, else 1 and why
set -euo pipefail

deb=${1:?usage: deb-root.sh DEB}
suite=bookworm
variant=minbase
extra="systemd procps"
# Bump when a change to this script changes the roots it produces.
recipe=1
cache=${KILN_CACHE:-/var/cache/kiln}/debootstrap

mirror() {
	local m
	m=$(grep -hsoE '^URIs: *http[^ ]*debian/?$' /etc/apt/sources.list.d/*.sources | head -n1 | awk '{print $2}')
	[ -n "$m" ] || m=$(grep -hsoE '^deb +http[^ ]*debian/? +bookworm' /etc/apt/sources.list | head -n1 | awk '{print $2}')
	echo "${m:-http://deb.debian.org/debian}"
}

[ "$(id -u)" -eq 0 ] || { echo "deb-root: needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap > /dev/null || { echo "deb-root: debootstrap missing: run scripts/deps.sh" >&2; exit 1; }
depends=$(dpkg-deb --field "$deb" Depends) || { echo "deb-root: cannot read Depends of $deb" >&2; exit 1; }
m=$(mirror)
key=$(printf 'suite=%s\nvariant=%s\nmirror=%s\nextra=%s\nrecipe=%s\ndepends=%s\n' "$suite" "$variant" "$m" "$extra" "$recipe" "$depends" |
	sha256sum | cut -c1-16)
dest=$cache/$key
if [ -d "$dest/root" ]; then
	echo "$dest/root"
	exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/.build-$key.XXXXXX")
# The build's mounts are in its own namespace: gone once it has ended, so
# removing the half-built tree never reaches through one.
trap 'rm -rf "$work"' EXIT
trap 'exit 143' TERM INT HUP
tree=$work/root
echo "deb-root $key: debootstrap $suite $variant + $extra from $m, then the Depends of ${deb##*/}" >&2
start=$SECONDS
unshare -m --propagation private bash -euo pipefail -c '
	tree=$1 suite=$2 variant=$3 m=$4 extra=$5 depends=$6
	debootstrap --variant="$variant" --include="${extra// /,}" "$suite" "$tree" "$m" > "$tree.debootstrap.log" 2>&1 ||
		{ echo "deb-root: debootstrap failed: $(tail -n 3 "$tree.debootstrap.log")" >&2; exit 1; }
	printf "deb %s %s main\ndeb %s %s-updates main\ndeb http://deb.debian.org/debian-security %s-security main\n" \
		"$m" "$suite" "$m" "$suite" "$suite" > "$tree/etc/apt/sources.list"
	cp /etc/resolv.conf "$tree/etc/resolv.conf"
	# As in container images: packages start no services in this root.
	printf "#!/bin/sh\nexit 101\n" > "$tree/usr/sbin/policy-rc.d"
	chmod 0755 "$tree/usr/sbin/policy-rc.d"
	mount -t proc proc "$tree/proc"
	mount -t sysfs sysfs "$tree/sys"
	mount -t devpts -o newinstance,ptmxmode=0666 devpts "$tree/dev/pts"
	export DEBIAN_FRONTEND=noninteractive LC_ALL=C
	chroot "$tree" apt-get update -q > "$tree.apt.log" 2>&1 &&
		chroot "$tree" apt-get satisfy -y -q --no-install-recommends "$depends" >> "$tree.apt.log" 2>&1 ||
		{ echo "deb-root: apt-get in the root failed: $(tail -n 3 "$tree.apt.log")" >&2; exit 1; }
	# The package cache goes; the lists stay (installing the package then resolves offline).
	chroot "$tree" apt-get clean
' _ "$tree" "$suite" "$variant" "$m" "$extra" "$depends"
echo "$key" > "$work/key"
# mv -T: fails rather than moving into a directory another build put there first.
mv -T "$work" "$dest" 2> /dev/null || [ -d "$dest/root" ] ||
	{ echo "deb-root: cannot rename $work to $dest" >&2; exit 1; }
echo "deb-root $key: built in $((SECONDS - start)) s" >&2
echo "$dest/root"
