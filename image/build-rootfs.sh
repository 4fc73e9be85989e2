#!/usr/bin/env bash
# Builds the kiln guest root filesystem: debootstrap bookworm minbase + python3,
# trimmed, with an unprivileged `sandbox` user (uid 1000) that runs task code, as
# an ext4 image the VMs open read-only (each VM writes to its own qcow2 overlay).
# Cached outside the clone, keyed by this script.
#   usage: build-rootfs.sh OUT_LINK
set -euo pipefail

out=${1:?usage: build-rootfs.sh OUT_LINK}
cache=${KILN_CACHE:-/var/cache/kiln}
# Bump when a change to this script changes the image it produces.
recipe=1
key=$(echo "bookworm minbase python3 recipe=$recipe" | sha256sum | cut -c1-16)
dest=$cache/rootfs/$key
# Free space in the image: it bounds what one task can write to its disk.
free_mib=${KILN_ROOTFS_FREE_MIB:-1024}

mirror() {
  local m
  m=$(grep -hsoE '^URIs: *http[^ ]*debian/?$' /etc/apt/sources.list.d/*.sources | head -n1 | awk '{print $2}')
  [ -n "$m" ] || m=$(grep -hsoE '^deb +http[^ ]*debian/? +bookworm' /etc/apt/sources.list | head -n1 | awk '{print $2}')
  echo "${m:-http://deb.debian.org/debian}"
}

if [ ! -f "$dest/rootfs.ext4" ]; then
  mkdir -p "$cache/rootfs"
  work=$(mktemp -d "$cache/rootfs/.build-$key.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  tree=$work/tree
  m=$(mirror)
  echo "[rootfs] $key: debootstrap bookworm minbase + python3 from $m" >&2
  start=$(date +%s)
  debootstrap --variant=minbase --include=python3 bookworm "$tree" "$m" 2>&1 |
    awk '/^I: (Retrieving|Validating|Extracting|Unpacking|Configuring|Installing)/ {
           split($0, a, " "); stage = a[2]; if (stage != last) { print "[rootfs] " stage " packages" > "/dev/stderr"; fflush("/dev/stderr"); last = stage } }
         /^[EW]:/ { print "[rootfs] " $0 > "/dev/stderr" }'
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "[rootfs] debootstrap failed" >&2; exit 1; }

  echo "[rootfs] trimming and adding the sandbox user" >&2
  rm -rf "$tree"/var/cache/apt/* "$tree"/var/lib/apt/lists/* "$tree"/usr/share/doc/* \
         "$tree"/usr/share/man/* "$tree"/usr/share/info/* "$tree"/usr/share/locale/* \
         "$tree"/var/log/* "$tree"/tmp/* 
  echo 'sandbox:x:1000:1000:kiln task:/work:/bin/sh' >> "$tree/etc/passwd"
  echo 'sandbox:x:1000:' >> "$tree/etc/group"
  echo 'sandbox:!:19000::::::' >> "$tree/etc/shadow"
  echo kiln > "$tree/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 kiln\n::1 localhost\n' > "$tree/etc/hosts"
  : > "$tree/etc/resolv.conf"
  mkdir -p "$tree/work" "$tree/output" "$tree/kiln"
  chown 1000:1000 "$tree/work" "$tree/output"
  chmod 1777 "$tree/tmp"

  used_mib=$(du -sm "$tree" | cut -f1)
  size_mib=$(( used_mib + used_mib / 5 + free_mib ))
  echo "[rootfs] making ext4 image: ${used_mib} MiB used, ${size_mib} MiB in all" >&2
  mkdir -p "$work/out"
  # No journal: the base is read-only and every VM's writes go to a throw-away overlay.
  mkfs.ext4 -q -F -L kiln-root -O ^has_journal -E lazy_itable_init=0,root_owner=0:0 \
    -d "$tree" "$work/out/rootfs.ext4" "${size_mib}M"
  chmod 0444 "$work/out/rootfs.ext4"
  rm -rf "$dest"
  mv "$work/out" "$dest"
  echo "[rootfs] done in $(( $(date +%s) - start ))s: $dest/rootfs.ext4" >&2
fi
mkdir -p "$(dirname "$out")"
ln -sfn "$dest/rootfs.ext4" "$out"
