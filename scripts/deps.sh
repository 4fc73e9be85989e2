#!/usr/bin/env bash
# Installs the Debian packages kiln needs to build, test and run. Idempotent:
# does nothing (no apt-get update) when every package is already present.
set -euo pipefail

pkgs=(
  # build
  build-essential pkg-config clang lld libclang-rt-14-dev
  libjansson-dev libcurl4-openssl-dev libssl-dev libseccomp-dev
  libmicrohttpd-dev libsqlite3-dev
  # guest image: kernel and rootfs
  linux-source-6.1 bc bison flex libelf-dev cpio xz-utils debootstrap e2fsprogs
  busybox-static libcmocka-dev
  # running VMs
  qemu-system-x86 qemu-utils iproute2 nftables
  # tests and benchmarks
  python3 jq curl hyperfine
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing packages: ${missing[*]} (run as root to install them)" >&2
  exit 1
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
