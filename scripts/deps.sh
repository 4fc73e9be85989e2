#!/usr/bin/env bash
# Installs the Debian packages kiln needs to build, test and run. Idempotent:
# does nothing (no apt-get update) when every package is already present.
set -euo pipefail

pkgs=(
  # build
  build-essential pkg-config clang lld libclang-rt-14-dev
  libjansson-dev libcurl4-openssl-dev libssl-dev libseccomp-dev
  libmicrohttpd-dev libsqlite3-dev libarchive-dev libzstd-dev
  # pause deltas hash each page with XXH3 (host/vm/phash.c; the header only)
  libxxhash-dev
  # kiln-api's port proxy reads the sandbox servers' HTTP answers with it
  libhttp-parser-dev
  # kiln-api's PostgreSQL store (libpq) and the server its tests and
  # benchmarks start (scripts/pg-local.sh)
  libpq-dev postgresql
  # guest image: kernel and rootfs
  linux-source-6.1 bc bison flex libelf-dev cpio xz-utils debootstrap e2fsprogs
  busybox-static libcmocka-dev
  # OCI image imports (host/template_build/oci.c): skopeo turns a docker-archive into an OCI
  # layout, umoci unpacks its layers (whiteouts, securejoin)
  umoci skopeo
  # running VMs
  qemu-system-x86 qemu-utils iproute2 nftables libnftables-dev libmnl-dev
  # kiln up's sandbox domain: names under .localhost resolve to loopback
  libnss-myhostname
  # tests and benchmarks
  python3 jq curl hyperfine wrk
  # tests/integration/115-monitoring.sh parses packaging/monitoring/kiln-alerts.yml
  python3-yaml
  # the Python SDK's test installs it with pip into a venv, offline
  python3-venv python3-pip python3-setuptools
  # the E2B SDK tests and benchmark (scripts/e2b-sdk.sh installs the SDK)
  nodejs
  # the web console's tests (tests/integration/96-web-console.sh drive /ui in it)
  chromium
  # the local S3 server (scripts/s3-local.sh: Swift + s3api) and an independent
  # S3 client for the tests to read back what kiln wrote
  swift swift-proxy swift-account swift-container swift-object memcached python3-boto3
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# Debian packages npm separately; other builds of nodejs bring their own npm.
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing packages: ${missing[*]} (run as root to install them)" >&2
  exit 1
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Packages must not start their services: Debian's memcached and swift-* would
# grab 11211/8080/620x system-wide, and kiln runs its own instances
# (scripts/s3-local.sh). invoke-rc.d and deb-systemd-invoke both ask
# policy-rc.d (exit 101 = "action forbidden"); put one in place for the
# install unless the machine already has one (containers usually do).
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# installed by kiln scripts/deps.sh for the duration of apt-get install\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
