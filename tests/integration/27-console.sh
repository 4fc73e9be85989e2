#!/usr/bin/env bash
# A hostile guest kernel writing its serial console at full speed: the
# console is a ring inside QEMU (64 KiB), so after 30 s of flooding no
# console file has grown in the VM's directory (a tmpfs by default), the
# ring holds at most its size (QEMU's RSS is reported: the guest's boot
# touches its RAM, so it is no measure of the console).
. "$(dirname "$0")/lib.sh"
t_plan 5
require_image
DRIVER=$ROOT/$B/tests/console-flood
[ -x "$DRIVER" ] || { echo "1..0 # SKIP $DRIVER missing: make unit"; exit 0; }
BB=/bin/busybox
file -L "$BB" 2> /dev/null | grep -q 'statically linked' || { echo "1..0 # SKIP a static /bin/busybox is missing (busybox-static)"; exit 0; }
before_q=$(count_qemu)
before_cg=$(count_cgroups)
CAP=65536

# The hostile guest: an init that writes ttyS0 in a loop, forever.
mkdir -p "$T_TMP/initrd/bin"
cp "$BB" "$T_TMP/initrd/bin/busybox"
cat > "$T_TMP/initrd/init" << 'EOI'
#!/bin/busybox sh
/bin/busybox mount -t devtmpfs dev /dev
while :; do /bin/busybox echo "kiln console flood 0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ"; done > /dev/ttyS0
EOI
chmod +x "$T_TMP/initrd/init"
(cd "$T_TMP/initrd" && printf 'init\nbin\nbin/busybox\n' | cpio --quiet -o -H newc -R 0:0 > "$T_TMP/flood.cpio")

"$DRIVER" "$ROOT/$B/image" "$T_TMP/flood.cpio" 30 > "$T_TMP/out" 2> "$T_TMP/err"
rc=$?
v() { awk -v k="$1" '$1 == k { print $2 }' "$T_TMP/out"; }
grep '^ring_error' "$T_TMP/out" | sed 's/^/# /'
echo "# after 30 s of flooding: console file $(v console_file_bytes) bytes, ring $(v ring_bytes) bytes, QEMU RSS $(v rss_start_kib) -> $(v rss_end_kib) KiB"
check "the flooding guest ran 30 s under kiln's VM driver (rc $rc $(head -c 200 "$T_TMP/err"))" test "$rc" = 0 -a "$(v qemu_alive)" = 1
check "the flood reached the console (the ring holds its lines)" grep -q 'kiln console flood' "$T_TMP/out"
check "no console file grew in the VM's directory (at most the cap, $CAP bytes)" test "$(v console_file_bytes)" -le $CAP
check "the console ring holds at most its size" test "$(v ring_bytes)" -le $CAP
check "no QEMU process or cgroup outlives the test" test "$(count_qemu)" = "$before_q" -a "$(count_cgroups)" = "$before_cg"
t_done
