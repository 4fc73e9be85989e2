#!/usr/bin/env bash
# Builds a built-in kiln guest root filesystem (a "template"): debootstrap
# bookworm minbase plus the template's packages, trimmed, with an unprivileged
# `sandbox` user (uid 1000) that runs task code, as an ext4 image the VMs open
# read-only (each VM writes to its own qcow2 overlay). Cached outside the
# clone, keyed by the template's name, its package list, this script's recipe
# number and the free space.
#   usage: build-rootfs.sh OUT_LINK [NAME]
# Templates:
#   default      python3 (also as `python`) and the everyday tools (ps, curl, git, pip, venv, sudo) plus
#                e2fsprogs and mount (the recipe build VM runs mkfs.ext4 -d,
#                resize2fs and mount --bind inside a `default` guest)
#   python-data  default + numpy, pandas, matplotlib (Agg backend by default,
#                font cache built), scipy; kiln-init's pre-started interpreter
#                imports numpy, pandas, matplotlib and matplotlib.pyplot
#                (/etc/kiln/preload)
#   code-interpreter  python-data + IPython's display objects, and kiln's code
#                interpreter service (guest/interpreter.py, E2B's port 49999):
#                kiln-init starts it at boot, warm, before the snapshot
set -euo pipefail

out=${1:?usage: build-rootfs.sh OUT_LINK [NAME]}
name=${2:-default}
cache=${KILN_CACHE:-/var/cache/kiln}
# Bump when a change to this script changes the images it produces.
recipe=2
# Free space in the image: it bounds what one task can write to its disk.
free_mib=${KILN_ROOTFS_FREE_MIB:-1024}

base_pkgs="python3 python-is-python3 procps curl ca-certificates git python3-pip python3-venv e2fsprogs mount util-linux sudo"
case $name in
  default)     pkgs=$base_pkgs; preload="" ;;
  # libblas-dev, liblapack-dev: what keeps python3-pythran (scipy's) installed
  # once OpenBLAS is removed (below).
  python-data) pkgs="$base_pkgs python3-numpy python3-pandas python3-matplotlib python3-scipy libblas-dev liblapack-dev"
               preload="numpy pandas matplotlib matplotlib.pyplot" ;;
  code-interpreter) pkgs="$base_pkgs python3-numpy python3-pandas python3-matplotlib python3-scipy libblas-dev liblapack-dev python3-ipython"
               # The interpreter service holds the data stack; a second copy
               # in the task zygote would not fit a 256 MiB sandbox beside it.
               preload=""
               interpreter=$(dirname "$0")/../guest/interpreter.py ;;
  *) echo "build-rootfs.sh: unknown template '$name' (default, python-data, code-interpreter)" >&2; exit 2 ;;
esac
# Files of this folder copied into every image: part of the key.
here=$(cd "$(dirname "$0")" && pwd)
files_sum=$(cat "$here/mcp-gateway" | sha256sum | cut -c1-16)
key=$(printf 'bookworm minbase\nname=%s\npackages=%s\npreload=%s\nfree_mib=%s\nrecipe=%s\nfiles=%s\n' \
        "$name" "$pkgs" "$preload" "$free_mib" "$recipe" "$files_sum" | sha256sum | cut -c1-16)
# A template that ships kiln's code interpreter: its program is an input too.
[ -z "${interpreter:-}" ] || key=$(printf '%s\ninterpreter=%s\n' "$key" "$(sha256sum < "$interpreter")" | sha256sum | cut -c1-16)
dest=$cache/rootfs/$key
tag="[rootfs $name]"

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
  echo "$tag $key: debootstrap bookworm minbase + ${pkgs// /,} from $m" >&2
  start=$(date +%s)
  debootstrap --variant=minbase --include="${pkgs// /,}" bookworm "$tree" "$m" 2>&1 |
    awk -v tag="$tag" '/^I: (Retrieving|Validating|Extracting|Unpacking|Configuring|Installing)/ {
           split($0, a, " "); stage = a[2]; if (!(stage in seen)) { print tag " " stage " packages" > "/dev/stderr"; fflush("/dev/stderr"); seen[stage] = 1 } }
         /^[EW]:/ { print tag " " $0 > "/dev/stderr" }'
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "$tag debootstrap failed" >&2; exit 1; }

  if chroot "$tree" dpkg-query -W -f='${Status}\n' libopenblas0 2> /dev/null | grep -q installed; then
    # debootstrap's resolver takes the first alternative of python3-pythran's
    # BLAS dependency (scipy needs pythran): OpenBLAS. Its run-time CPU
    # detection takes QEMU's qemu64 CPU (TCG) for an Opteron and runs kernels
    # TCG does not emulate (SIGILL in every matrix product); the reference
    # BLAS/LAPACK (libblas3, liblapack3) run anywhere. (kiln-host now gives
    # TCG guests an Intel vendor string, vm_cpu_model, which fixes OpenBLAS
    # for every template; this image does not depend on it.)
    echo "$tag replacing OpenBLAS with the reference BLAS/LAPACK" >&2
    chroot "$tree" dpkg --purge libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread \
      > "$work/purge.log" 2>&1 || { echo "$tag cannot remove OpenBLAS:" >&2; tail -n 5 "$work/purge.log" >&2; exit 1; }
    [ "$(readlink "$tree/etc/alternatives/libblas.so.3-x86_64-linux-gnu")" = /usr/lib/x86_64-linux-gnu/blas/libblas.so.3 ] ||
      { echo "$tag libblas.so.3 is not the reference BLAS" >&2; exit 1; }
  fi

  echo "$tag trimming and adding the sandbox user" >&2
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
  # E2B's `user` (made by envd at first start, guest/envd_fs.c) has
  # passwordless sudo, as in E2B's base image; the VM is the boundary, and
  # task code runs as `sandbox`, which has none.
  printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\n' > "$tree/etc/sudoers.d/kiln-user"
  chmod 0440 "$tree/etc/sudoers.d/kiln-user"
  # E2B's SDK starts `mcp-gateway` in a sandbox made with `mcp`: kiln's
  # stand-in says it is not supported (docs/e2b.md).
  install -m 0755 "$here/mcp-gateway" "$tree/usr/local/bin/mcp-gateway"
  if [ -n "$preload" ]; then
    # One module per line: kiln-init's pre-started interpreter imports each.
    mkdir -p "$tree/etc/kiln"
    printf '%s\n' $preload > "$tree/etc/kiln/preload"
  fi
  if [ -d "$tree/usr/lib/python3/dist-packages/matplotlib" ]; then
    # Debian's matplotlib reads /etc/matplotlibrc; tasks have no display and
    # need not inherit MPLBACKEND, so Agg is the image's default.
    if [ -f "$tree/etc/matplotlibrc" ] && grep -qE '^[#[:space:]]*backend[[:space:]]*:' "$tree/etc/matplotlibrc"; then
      sed -i -E 's/^[#[:space:]]*backend[[:space:]]*:.*/backend: Agg/' "$tree/etc/matplotlibrc"
    else
      echo 'backend: Agg' >> "$tree/etc/matplotlibrc"
    fi
    # The sandbox user's matplotlib config and font cache (HOME=/work), made
    # now: else every task builds the font list again, and the pre-started
    # interpreter (root) would leave a root-owned /work/.config behind.
    mkdir -p "$tree/work/.config/matplotlib" "$tree/work/.cache/matplotlib"
    chown -R 1000:1000 "$tree/work/.config" "$tree/work/.cache"
    chroot --userspec=1000:1000 "$tree" env -i HOME=/work PATH=/usr/bin:/bin \
      /usr/bin/python3 -c 'import matplotlib.font_manager' ||
      { echo "$tag cannot build matplotlib's font cache" >&2; exit 1; }
    ls "$tree"/work/.cache/matplotlib/fontlist-*.json > /dev/null
  fi

  if [ -n "${interpreter:-}" ]; then
    # kiln-init starts what /etc/kiln/interpreter names (guest/interp.c). Its
    # matplotlib config and font cache are shared by whoever runs it (E2B's
    # user is made by envd at boot): built now, once.
    mkdir -p "$tree/usr/lib/kiln" "$tree/etc/kiln" "$tree/var/lib/kiln-interpreter/matplotlib"
    install -m 0644 "$interpreter" "$tree/usr/lib/kiln/interpreter.py"
    echo /usr/lib/kiln/interpreter.py > "$tree/etc/kiln/interpreter"
    chroot "$tree" env -i HOME=/root PATH=/usr/bin:/bin MPLCONFIGDIR=/var/lib/kiln-interpreter/matplotlib \
      /usr/bin/python3 -c 'import matplotlib.font_manager' ||
      { echo "$tag cannot build the interpreter's matplotlib font cache" >&2; exit 1; }
    chmod -R a+rwX "$tree/var/lib/kiln-interpreter"
    chmod 1777 "$tree/var/lib/kiln-interpreter/matplotlib"
  fi

  used_mib=$(du -sm "$tree" | cut -f1)
  size_mib=$(( used_mib + used_mib / 5 + free_mib ))
  echo "$tag making ext4 image: ${used_mib} MiB used, ${size_mib} MiB in all" >&2
  mkdir -p "$work/out"
  # No journal: the base is read-only and every VM's writes go to a throw-away overlay.
  : > "$work/out/rootfs.ext4"
  mkfs.ext4 -q -F -L kiln-root -O ^has_journal -E lazy_itable_init=0,root_owner=0:0 \
    -d "$tree" "$work/out/rootfs.ext4" "${size_mib}M"
  chmod 0444 "$work/out/rootfs.ext4"
  rm -rf "$dest"
  mv "$work/out" "$dest"
  echo "$tag done in $(( $(date +%s) - start ))s: $dest/rootfs.ext4" >&2
fi
mkdir -p "$(dirname "$out")"
ln -sfn "$dest/rootfs.ext4" "$out"
