#!/usr/bin/env bash
# Builds the kiln guest kernel (vmlinux, PVH entry) from Debian's linux-source-6.1
# with tinyconfig + image/kernel.config. The result is cached outside the clone,
# keyed by the config fragment, this script and the source package version.
#   usage: build-kernel.sh OUT_LINK      (OUT_LINK becomes a symlink to the cached vmlinux)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-kernel.sh OUT_LINK}
cache=${KILN_CACHE:-/var/cache/kiln}
src_tar=/usr/src/linux-source-6.1.tar.xz
srcver=$(dpkg-query -W -f='${Version}' linux-source-6.1)
# Bump when a change to this script changes the kernel it produces.
recipe=1
key=$( { cat "$here/kernel.config"; echo "recipe=$recipe source=$srcver"; } | sha256sum | cut -c1-16)
dest=$cache/kernel/$key

if [ ! -f "$dest/vmlinux" ]; then
  mkdir -p "$cache/kernel"
  work=$(mktemp -d "$cache/kernel/.build-$key.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  echo "[kernel] $key: unpacking linux-source $srcver" >&2
  tar -C "$work" -xf "$src_tar"
  ksrc=$work/linux-source-6.1
  echo "[kernel] configuring (tinyconfig + image/kernel.config)" >&2
  make -C "$ksrc" -s tinyconfig >/dev/null
  (cd "$ksrc" && ./scripts/kconfig/merge_config.sh -m .config "$here/kernel.config" >/dev/null)
  make -C "$ksrc" -s olddefconfig >/dev/null
  # merge_config only warns when an option is dropped (a missing dependency):
  # refuse to build a kernel that lacks something the guest needs.
  bad=0
  while IFS= read -r line; do
    case $line in
      CONFIG_*=y) grep -qx "$line" "$ksrc/.config" || { echo "[kernel] option not set after olddefconfig: $line" >&2; bad=1; } ;;
      "# CONFIG_"*" is not set") opt=${line#\# }; opt=${opt%% *}
                                 ! grep -q "^$opt=" "$ksrc/.config" || { echo "[kernel] option should be off: $opt" >&2; bad=1; } ;;
    esac
  done < "$here/kernel.config"
  [ $bad -eq 0 ] || exit 1
  echo "[kernel] compiling vmlinux with $(nproc) jobs (progress: objects compiled)" >&2
  start=$(date +%s)
  make -C "$ksrc" -j"$(nproc)" vmlinux 2>&1 | awk -v start="$start" '
    / CC / { n++ }
    { now = systime(); if (now - last >= 10) { printf("[kernel] %d objects compiled, %ds elapsed\n", n, now - start) > "/dev/stderr"; fflush("/dev/stderr"); last = now } }
    / error: |Error [0-9]/ { print > "/dev/stderr" }'
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "[kernel] build failed" >&2; exit 1; }
  mkdir -p "$work/out"
  cp "$ksrc/vmlinux" "$work/out/vmlinux"
  cp "$ksrc/.config" "$work/out/config"
  rm -rf "$dest"
  mv "$work/out" "$dest"
  echo "[kernel] done in $(( $(date +%s) - start ))s: $dest/vmlinux" >&2
fi
mkdir -p "$(dirname "$out")"
ln -sfn "$dest/vmlinux" "$out"
