#!/usr/bin/env bash
# The jail around QEMU, checked on live QEMU processes: a restored clone
# (uid, capabilities, no_new_privs, seccomp, namespaces, root, mounts, cgroup
# limits, rlimits, network), seen from inside its jail as its own uid (the
# snapshot's RAM cannot be changed), a cold boot, a snapshot template and a
# pool's QEMUs; afterwards nothing is left (process, cgroups, mounts, slot
# lock, directory), also after a SIGKILL of kiln-host. Then kiln-jail, the
# standalone launcher, with its limits enforced.
. "$(dirname "$0")/lib.sh"
t_plan 24
require_image
if [ "$(id -u)" != 0 ]; then echo "1..0 # SKIP the jail needs root"; exit 0; fi
for c in memory cpu pids; do
	if [ ! -e "/sys/fs/cgroup/$c/cgroup.procs" ]; then
		echo "1..0 # SKIP no cgroup v1 $c hierarchy at /sys/fs/cgroup/$c"; exit 0
	fi
done
PROBE=$ROOT/build/tests/jail-probe
KILN_JAIL=$ROOT/build/kiln-jail
if [ ! -x "$PROBE" ] || [ ! -x "$KILN_JAIL" ]; then
	echo "1..0 # SKIP build/tests/jail-probe or build/kiln-jail missing: run make all unit"; exit 0
fi
CACHE=${KILN_CACHE:-/var/cache/kiln}
SLOTS=${KILN_SLOT_DIR:-/run/kiln/slots}
UID_BASE=64000
host_pid=

key=$("$KILN_HOST" snapshot create 2> "$T_TMP/snap.err")
SNAP=$CACHE/snapshots/$key
if [ -z "$key" ] || [ ! -f "$SNAP/mem" ]; then
	t_bail "kiln-host snapshot create" "$(tail -3 "$T_TMP/snap.err")"
fi
mem_sha=$(sha256sum "$SNAP/mem" | cut -d' ' -f1)
before_qemu=$(count_qemu); before_entries=$(count_run_entries); before_cg=$(count_cgroups)
before_locks=$(count_own_slot_locks)

LONG=$(sh_spec 'echo started; sleep 600' '{"limits":{"timeout_s":600}}')
# start_long NAME [kiln-host run args...]: a task that runs until killed; sets
# host_pid, Q (its QEMU), VMDIR and the VM's cgroup directories.
start_long() {
	local name=$1; shift
	printf '%s' "$LONG" > "$T_TMP/$name.spec"
	t_bg "$KILN_HOST" run --spec "$T_TMP/$name.spec" --stream "$@" > "$T_TMP/$name.out" 2>&1
	host_pid=$T_BG_PID
	t_until 30 grep -q '"data":"started' "$T_TMP/$name.out"
	Q=$(pgrep -f "qemu-system-x86_64.*$KILN_RUN_DIR" | head -n1)
	VMDIR=$(find "$KILN_RUN_DIR" -mindepth 1 -maxdepth 1 -name 'vm-*' | head -n1)
	MEMCG=/sys/fs/cgroup/memory$(cg_of "$Q" memory); CPUCG=/sys/fs/cgroup/cpu$(cg_of "$Q" cpu)
	PIDCG=/sys/fs/cgroup/pids$(cg_of "$Q" pids)
}
cg_of() { # PID CONTROLLER: its cgroup path in that hierarchy
	awk -F: -v c="$2" '{ n = split($2, a, ","); for (i = 1; i <= n; i++) if (a[i] == c) print $3 }' "/proc/$1/cgroup" 2>/dev/null
}
status_of() { awk -v k="$2:" '$1 == k { $1 = ""; print substr($0, 2) }' "/proc/$1/status"; }
# jailed PID: the identity checks every jailed QEMU must pass (prints what fails)
jailed() {
	local p=$1 u g n bad=""
	read -r -a u <<< "$(status_of "$p" Uid)"; read -r -a g <<< "$(status_of "$p" Gid)"
	[ "${#u[@]}" = 4 ] && [ "${u[0]}" -ge "$UID_BASE" ] && [ "${u[0]}" = "${u[1]}" ] && [ "${u[0]}" = "${u[2]}" ] \
		&& [ "${u[0]}" = "${u[3]}" ] || bad+=" uid=${u[*]}"
	[ "${g[*]}" = "${u[*]}" ] || bad+=" gid=${g[*]}"
	[ "$(status_of "$p" NoNewPrivs)" = 1 ] || bad+=" NoNewPrivs"
	[ "$(status_of "$p" Seccomp)" = 2 ] || bad+=" Seccomp"
	for n in CapInh CapPrm CapEff CapBnd CapAmb; do
		[ "$(status_of "$p" $n)" = 0000000000000000 ] || bad+=" $n=$(status_of "$p" $n)"
	done
	for n in mnt pid ipc uts net; do
		[ "$(readlink "/proc/$p/ns/$n")" != "$(readlink /proc/self/ns/$n)" ] || bad+=" ns:$n"
	done
	[ "$(status_of "$p" NSpid | awk '{ print $NF }')" = 1 ] || bad+=" not-pid-1"
	echo "$bad"
}
alive() { ps -o stat= -p "$1" 2>/dev/null | grep -qv Z; }

# ---- a restored clone, live -------------------------------------------------
start_long live
if [ -n "$Q" ] && [ -n "$VMDIR" ]; then ok "a long task runs in a restored clone (QEMU $Q)"
else not_ok "long task started" "$(cat "$T_TMP/live.out")"; fi
bad=$(jailed "$Q")
read -r -a quid <<< "$(status_of "$Q" Uid)"
if [ -z "$bad" ]; then
	ok "QEMU runs as slot uid ${quid[0]} (uid=gid, not 0), no capabilities (CapInh/Prm/Eff/Bnd/Amb 0), NoNewPrivs 1, Seccomp 2, PID 1 of its own mnt/pid/ipc/uts/net namespaces"
else not_ok "QEMU's identity" "$bad"; fi

# Its root: only what QEMU needs. Allowed top-level entries: /dev, /proc, the
# library directories, and the first component of every path it is given.
allowed=" dev proc usr lib lib64 bin sbin "
for p in /usr/bin/qemu-system-x86_64 "$ROOT/build/image/vmlinux" "$ROOT/build/image/initramfs.cpio" \
	"$ROOT/build/image/rootfs.ext4" "$SNAP/disk.qcow2" "$KILN_RUN_DIR"; do
	for q in "$p" "$(readlink -f "$p")"; do q=${q#/}; allowed+="${q%%/*} "; done
done
entries=$(ls -A "/proc/$Q/root" | tr '\n' ' ')
extra=""
for e in $entries; do [[ $allowed == *" $e "* ]] || extra+=" $e"; done
if [ -z "$extra" ] && [[ " $entries " != *" etc "* ]] && [[ " $entries " != *" home "* ]] \
   && [ "$(ls -A "/proc/$Q/root/dev" | tr '\n' ' ')" = "null urandom " ]; then
	ok "QEMU's root holds only [$entries] (no /etc, /home, ...); /dev only null and urandom"
else not_ok "QEMU's root" "entries: $entries" "not allowed:$extra" "dev: $(ls -A "/proc/$Q/root/dev" | tr '\n' ' ')"; fi

# Its mounts (seen from the host through /proc/PID): everything read-only and
# nosuid, except its own directory and /proc; the binaries are read-only binds.
awk '{ print $5, $6 }' "/proc/$Q/mountinfo" > "$T_TMP/mounts"
rw=$(awk '$2 ~ /^rw/ { print $1 }' "$T_TMP/mounts" | sort | tr '\n' ' ')
suid=$(awk '$2 !~ /nosuid/' "$T_TMP/mounts" | wc -l)
# A task's volume slots (docs/architecture.md "Volumes") are read-only binds:
# it never mounts a volume.
want_rw=$(printf '%s\n' /proc "$VMDIR/vm" | sort | tr '\n' ' ')
if [ "$rw" = "$want_rw" ] && [ "$suid" = 0 ] \
   && grep -q '^/usr/bin/qemu-system-x86_64 ro,' "$T_TMP/mounts" && grep -q '/libc.so.6 ro,' "$T_TMP/mounts" \
   && grep -q "^$(readlink -f "$ROOT/build/image/rootfs.ext4") ro," "$T_TMP/mounts" && grep -q "^/ ro," "$T_TMP/mounts" \
   && grep -q "^$VMDIR/vol/vol0.img ro," "$T_TMP/mounts"; then
	ok "$(wc -l < "$T_TMP/mounts") mounts: all nosuid, read-only except $VMDIR/vm and /proc (a task's volume slots too); qemu, libc, the rootfs and / itself read-only"
else not_ok "QEMU's mounts" "rw: $rw (want $want_rw)" "without nosuid: $suid" "$(head -5 "$T_TMP/mounts")"; fi
check "none of the jail's mounts is visible in the host's mount namespace" [ "$(count_mounts)" = 0 ]

# Cgroups: guest RAM + 192 MiB + RAM/16 (256 MiB guest), 1 vCPU of quota, 128 + vCPUs pids.
name=$(basename "$VMDIR")
if [ "$MEMCG" = "$(kiln_cgroup_parent memory)/$name" ] && [ "$CPUCG" = "$(kiln_cgroup_parent cpu)/$name" ] \
   && [ "$PIDCG" = "$(kiln_cgroup_parent pids)/$name" ] \
   && [ "$(cat "$MEMCG/memory.limit_in_bytes")" = $(((256 + 192 + 16) << 20)) ] \
   && [ "$(cat "$CPUCG/cpu.cfs_quota_us")" = "$(cat "$CPUCG/cpu.cfs_period_us")" ] \
   && [ "$(cat "$PIDCG/pids.max")" = 129 ] \
   && grep -qx "$Q" "$MEMCG/cgroup.procs" && grep -qx "$Q" "$CPUCG/cgroup.procs" && grep -qx "$Q" "$PIDCG/cgroup.procs"; then
	ok "cgroups kiln/$name: memory.limit_in_bytes 464 MiB, cfs_quota_us = 1 x cfs_period_us, pids.max 129, QEMU in each cgroup.procs"
else not_ok "cgroups" "memory $MEMCG: $(cat "$MEMCG/memory.limit_in_bytes" 2>&1)" "cpu $CPUCG: $(cat "$CPUCG/cpu.cfs_quota_us" 2>&1)/$(cat "$CPUCG/cpu.cfs_period_us" 2>&1)" \
	"pids $PIDCG: $(cat "$PIDCG/pids.max" 2>&1)"; fi

lim() { awk -v k="$1" 'index($0, k) == 1 { n = split(substr($0, length(k) + 1), a, " "); print a[1], a[2] }' "/proc/$Q/limits"; }
fsize=$(lim "Max file size"); read -r fs_soft fs_hard <<< "$fsize"
if [ "$(lim "Max core file size")" = "0 0" ] && [ "$(lim "Max open files")" = "256 256" ] \
   && [ "$(lim "Max processes")" = "129 129" ] && [ "$(lim "Max msgqueue size")" = "0 0" ] \
   && [ "$fs_soft" = "$fs_hard" ] && [ "$fs_soft" != unlimited ] && [ "$fs_soft" -ge "$(stat -Lc %s "$ROOT/build/image/rootfs.ext4")" ]; then
	ok "rlimits: core 0, nofile 256, nproc 129, msgqueue 0, fsize $((fs_soft >> 20)) MiB (rootfs or volume slot size + slack)"
else not_ok "rlimits" "$(cat "/proc/$Q/limits")"; fi

links=$(nsenter -t "$Q" -n ip -o link 2>&1)
if [ "$(echo "$links" | wc -l)" = 1 ] && [[ $links == "1: lo:"* ]]; then ok "its network namespace has only lo: QEMU has no network"
else not_ok "network namespace" "$links"; fi

# From inside the jail, as QEMU's uid (jail-probe enters its namespaces).
# The snapshot RAM is the memfd among QEMU's descriptors (its number follows
# the sockets host/vm/vm.c passes first).
memfd_fd=5
for f in /proc/"$Q"/fd/*; do
	case $(readlink "$f" 2>/dev/null) in /memfd:*) memfd_fd=${f##*/}; break ;; esac
done
read -r -a libc_line <<< "$(grep '/libc.so.6 ' "$T_TMP/mounts")"
"$PROBE" "$Q" --memfd "/proc/1/fd/$memfd_fd" --write /usr/bin/qemu-system-x86_64 --write "${libc_line[0]}" \
	--write "$(readlink -f "$ROOT/build/image/vmlinux")" --write "$(readlink -f "$ROOT/build/image/rootfs.ext4")" \
	--write "$SNAP/disk.qcow2" --open "$SNAP/mem" --open /etc/passwd --open /root --open "$VMDIR/lock" \
	--open "$VMDIR/qemu.pid" --write "$VMDIR/vm/qemu.log" > "$T_TMP/probe.out" 2>&1
pv() { awk -v k="$1" '$1 == k { $1 = ""; print substr($0, 2) }' "$T_TMP/probe.out"; }
memfd=$(pv memfd)
seals=$(echo "$memfd" | sed -n 's/.*seals=\(0x[0-9a-f]*\).*/\1/p')
if [ "$(pv uid)" = "${quid[0]}" ] && [ -n "$seals" ] && [ $((seals & 0xf)) = 15 ] \
   && [[ $memfd == *" open=ok "* && $memfd == *" write=EPERM "* && $memfd == *" truncate=EPERM "* ]] \
   && [[ $memfd == *" punch=EPERM "* && $memfd == *" mmap_shared=EPERM "* && $memfd == *" mmap_private=ok "* ]] \
   && [[ $memfd == *" unseal=EPERM" ]]; then
	ok "as uid ${quid[0]} inside the jail, the snapshot RAM QEMU maps (its fd $memfd_fd, a memfd sealed $seals) cannot be written, truncated, hole-punched, mapped shared-writable or unsealed; a private (copy-on-write) mapping works"
else not_ok "template memfd from inside the jail" "$(cat "$T_TMP/probe.out")"; fi
wr_bad=$(awk '$1 == "write" && $2 !~ /qemu.log$/ && $3 != "EACCES" && $3 != "EROFS"' "$T_TMP/probe.out")
if [ -z "$wr_bad" ] && grep -q "^write $VMDIR/vm/qemu.log ok$" "$T_TMP/probe.out" \
   && [ "$(awk '$1 == "open" && $3 != "ENOENT"' "$T_TMP/probe.out")" = "" ] && [ "$(pv mkdir_root)" = EROFS ]; then
	ok "inside the jail: qemu, libc, kernel, rootfs and snapshot disk not writable; / read-only; the snapshot's RAM file, /etc/passwd, /root and the host-side lock and qemu.pid do not exist; its own log is writable"
else not_ok "files inside the jail" "$(cat "$T_TMP/probe.out")"; fi
pids_seen=$(pv proc_pids | tr ',' '\n' | grep -c '^[0-9]')
if [ "$(pv netifs)" = lo ] && [ "$(pv hostname)" = kiln ] && [ "$pids_seen" -le 2 ] \
   && [ "$(pv rw_mounts | tr ',' '\n' | sort | tr '\n' ' ')" = "$want_rw" ]; then
	ok "inside the jail: only lo, hostname kiln, /proc shows only the jail's own processes ($(pv proc_pids)), the same two writable mounts"
else not_ok "inside the jail" "$(cat "$T_TMP/probe.out")"; fi

slot=$((quid[0] - UID_BASE))
slot_ino=$(stat -c %i "$SLOTS/$slot.lock" 2>/dev/null)
held() { awk '$2 == "FLOCK" { split($6, a, ":"); print a[3] }' /proc/locks | grep -qx "$1"; }
if [ -n "$slot_ino" ] && held "$slot_ino"; then ok "slot $slot's lock ($SLOTS/$slot.lock) is held while the VM lives"
else not_ok "slot lock held" "slot=$slot inode=$slot_ino"; fi

kill -TERM "$host_pid"; wait "$host_pid"; st=$?; t_stop "$host_pid"; host_pid=
gone=0
for d in "$MEMCG" "$CPUCG" "$PIDCG"; do [ -e "$d" ] || gone=$((gone + 1)); done
if [ "$st" = 3 ] && [ "$gone" = 3 ] && [ "$(count_cgroups)" = "$before_cg" ] && [ "$(count_qemu)" = "$before_qemu" ] \
   && [ "$(count_run_entries)" = "$before_entries" ] && [ "$(count_mounts)" = 0 ] && ! held "$slot_ino" \
   && [ "$(count_own_slot_locks)" = "$before_locks" ]; then
	ok "after the task: no QEMU, its 3 cgroups removed, no mounts, slot $slot free, no directory (counts as before)"
else not_ok "cleanup after the task" "status=$st cgroups gone=$gone count=$(count_cgroups)/$before_cg qemu=$(count_qemu)" \
	"entries=$(count_run_entries)/$before_entries mounts=$(count_mounts) locks=$(count_own_slot_locks)/$before_locks"; fi

# A clone that writes (almost) all of its RAM leaves the template unchanged.
run_spec dirty "$(py_spec 'import os
x = bytearray(os.urandom(1 << 20)) * 160
print(len(x) >> 20)')"
if [ "$(r dirty .state)" = succeeded ] && [ "$(r dirty .timings.start)" = restore ] && [ "$(r dirty .stdout)" = 160 ] \
   && [ "$(sha256sum "$SNAP/mem" | cut -d' ' -f1)" = "$mem_sha" ]; then
	ok "a restored clone that fills 160 MiB of its RAM leaves the template's RAM file unchanged (sha256)"
else not_ok "template unchanged" "$(show dirty)"; fi

# ---- a cold boot, live -----------------------------------------------------------
start_long cold --cold
bad=$(jailed "$Q")
if [ -n "$Q" ] && [ -z "$bad" ] && grep -q '"data":"started' "$T_TMP/cold.out" \
   && [ "$(cat "$MEMCG/memory.limit_in_bytes" 2>/dev/null)" = $(((256 + 192 + 16) << 20)) ]; then
	ok "a cold-booted QEMU is jailed the same way"
else not_ok "cold boot jailed" "Q=$Q$bad" "$(tail -c 300 "$T_TMP/cold.out")"; fi

# ---- SIGKILL of kiln-host: its QEMU dies with it, reap removes the rest --------------
t_stop "$host_pid" KILL; host_pid=
dead() { ! alive "$1"; }
t_until 10 dead "$Q"
left=0
for d in "$MEMCG" "$CPUCG" "$PIDCG"; do [ -e "$d" ] && left=$((left + 1)); done
if ! alive "$Q" && [ "$left" = 3 ] && [ -d "$VMDIR" ]; then
	ok "after SIGKILL of kiln-host its QEMU dies; the cgroups and directory are left to reap"
else not_ok "QEMU dies with kiln-host" "alive=$(alive "$Q" && echo yes) cgroups left=$left dir=$VMDIR"; fi
"$KILN_HOST" reap --run-dir "$KILN_RUN_DIR" > "$T_TMP/reap.out"
gone=0
for d in "$MEMCG" "$CPUCG" "$PIDCG"; do [ -e "$d" ] || gone=$((gone + 1)); done
if [ "$gone" = 3 ] && [ "$(count_cgroups)" = "$before_cg" ] && [ "$(count_run_entries)" = "$before_entries" ] \
   && [ "$(count_qemu)" = "$before_qemu" ] && [ "$(count_mounts)" = 0 ] && [ "$(count_own_slot_locks)" = "$before_locks" ]; then
	ok "kiln-host reap removes the cgroups and the directory; no mounts, no slot lock left ($(cat "$T_TMP/reap.out"))"
else not_ok "reap after SIGKILL" "gone=$gone cgroups=$(count_cgroups)/$before_cg entries=$(count_run_entries)" \
	"qemu=$(count_qemu) mounts=$(count_mounts) locks=$(count_own_slot_locks)/$before_locks"; fi

start_long crash2
t_stop "$host_pid" KILL; host_pid=
t_until 10 dead "$Q"
run_spec next "$(py_spec 'print(1)')"
gone=0
for d in "$MEMCG" "$CPUCG" "$PIDCG"; do [ -e "$d" ] || gone=$((gone + 1)); done
if [ "$(r next .state)" = succeeded ] && [ "$gone" = 3 ] && [ "$(count_cgroups)" = "$before_cg" ] \
   && [ "$(count_run_entries)" = "$before_entries" ] && [ "$(count_qemu)" = "$before_qemu" ] \
   && [ "$(count_own_slot_locks)" = "$before_locks" ]; then
	ok "the next run reaps what a SIGKILLed kiln-host left (cgroups, directory) before its own VM"
else not_ok "next run reaps" "gone=$gone cgroups=$(count_cgroups)/$before_cg entries=$(count_run_entries)" "$(show next)"; fi

# ---- a snapshot template and a pool's QEMUs are jailed too --------------------------
t_bg env KILN_CACHE="$T_TMP/cache" "$KILN_HOST" snapshot create > "$T_TMP/tmpl.out" 2> "$T_TMP/tmpl.err"
tmpl_pid=$T_BG_PID
tq=
template_qemu() { tq=$(pgrep -f "qemu-system-x86_64.*$KILN_RUN_DIR" | head -n1); [ -n "$tq" ]; }
t_until 30 template_qemu
bad=$(jailed "$tq")
wait "$tmpl_pid"; st=$?; t_stop "$tmpl_pid"
tkey=$(cat "$T_TMP/tmpl.out")
if [ -n "$tq" ] && [ -z "$bad" ] && [ "$st" = 0 ] && [ "$(stat -c %u:%g "$T_TMP/cache/snapshots/$tkey/mem" "$T_TMP/cache/snapshots/$tkey/disk.qcow2" | sort -u)" = 0:0 ]; then
	ok "the snapshot template's QEMU is jailed; its RAM file and overlay are root's again afterwards"
else not_ok "template jailed" "q=$tq$bad status=$st" "$(tail -3 "$T_TMP/tmpl.err")"; fi

PORT=$((20000 + RANDOM % 12000))
TOKEN=jail-test-$RANDOM
t_bg "$KILN_HOST" serve --token "$TOKEN" --spool-dir "$T_TMP/spool" --listen 127.0.0.1:$PORT --pool 1 --prestart 1 \
	> "$T_TMP/serve.out" 2> "$T_TMP/serve.err"
host_pid=$T_BG_PID
pool_ready() { # both pool VMs are up, or kiln-host has ended (nothing to wait for)
	kill -0 "$host_pid" 2> /dev/null || return 0
	curl -s --max-time 2 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/v1/capacity" |
		jq -e '.pool.ready == 1 and .pool.prestarted == 1' > /dev/null 2>&1
}
t_until 120 pool_ready
qs=$(pgrep -f "qemu-system-x86_64.*$KILN_RUN_DIR"); nq=0; bad=""
for q in $qs; do nq=$((nq + 1)); b=$(jailed "$q"); [ -n "$b" ] && bad+=" $q:$b"; done
t_stop "$host_pid"; host_pid=
if [ "$nq" = 2 ] && [ -z "$bad" ] && [ "$(count_qemu)" = "$before_qemu" ] && [ "$(count_cgroups)" = "$before_cg" ] \
   && [ "$(count_own_slot_locks)" = "$before_locks" ]; then
	ok "serve: the pool VM and the pre-started QEMU are jailed, each in its own slot; shutdown leaves no QEMU, cgroup or slot lock"
else not_ok "pool jailed" "qemus=$nq$bad cgroups=$(count_cgroups)/$before_cg" "$(tail -3 "$T_TMP/serve.err")"; fi

# ---- kiln-jail, the standalone launcher ---------------------------------------------
BB=/bin/busybox
if [ -x "$BB" ] && file -L "$BB" 2>/dev/null | grep -q 'statically linked'; then
	JD=$T_TMP/jd
	out=$("$KILN_JAIL" --dir "$JD" -- "$BB" sh -c 'id -u; ls /; cat /proc/self/status; unshare -U true; echo unshare=$?; mount -t tmpfs x /dev 2>&1; echo mount=$?' 2>&1)
	u=$(echo "$out" | head -1)
	if [ "$u" -ge "$UID_BASE" ] && echo "$out" | grep -qx 'NoNewPrivs:	1' && echo "$out" | grep -qx 'Seccomp:	2' \
	   && echo "$out" | grep -qx 'CapBnd:	0000000000000000' && ! echo "$out" | grep -qx etc \
	   && echo "$out" | grep -q 'unshare(0x10000000): Operation not permitted' && echo "$out" | grep -qx 'unshare=1' \
	   && ! echo "$out" | grep -qx 'mount=0'; then
		ok "kiln-jail runs busybox as slot uid $u with no capabilities and no /etc; unshare (user namespace) and mount are denied"
	else not_ok "kiln-jail basics" "$out"; fi
	"$KILN_JAIL" -- "$BB" sh -c 'exit 7'; st=$?
	"$KILN_JAIL" --memory 16 --dev /dev/zero -- "$BB" dd if=/dev/zero of=/dev/null bs=64M count=1 2> /dev/null; oom=$?
	pids=$("$KILN_JAIL" --pids 4 -- "$BB" sh -c 'for i in 1 2 3 4 5 6 7 8; do sleep 1 & done; wait' 2>&1)
	"$KILN_JAIL" --dir "$JD" --fsize 1 --dev /dev/zero -- "$BB" dd if=/dev/zero of="$JD/work/big" bs=1M count=4 2> /dev/null; fsz=$?
	if [ "$st" = 7 ] && [ "$oom" = 137 ] && [[ $pids == *"can't fork"* ]] && [ "$fsz" != 0 ] \
	   && [ "$(stat -c %s "$JD/work/big" 2>/dev/null)" = $((1 << 20)) ]; then
		ok "kiln-jail: exit status passed through; --memory 16 OOM-kills a 64 MiB allocation; --pids 4 stops forks; --fsize 1 stops a file at 1 MiB"
	else not_ok "kiln-jail limits" "status=$st oom=$oom fsize=$fsz size=$(stat -c %s "$JD/work/big" 2>&1)" "$pids"; fi
	wr=$("$KILN_JAIL" --memfd "$SNAP/mem" --dev /dev/zero -- "$BB" sh -c 'dd if=/dev/zero of=/proc/self/fd/3 bs=1 count=1 conv=notrunc 2>&1; echo dd=$?')
	if [[ $wr == *"Operation not permitted"* ]] && [[ $wr == *"dd=1"* ]] && [ "$(sha256sum "$SNAP/mem" | cut -d' ' -f1)" = "$mem_sha" ]; then
		ok "kiln-jail --memfd: a write to the sealed snapshot RAM fails with EPERM; the file is unchanged"
	else not_ok "kiln-jail --memfd" "$wr"; fi
	if [ "$(ls -d /run/kiln/jail-* 2>/dev/null | wc -l)" = 0 ] && [ "$(count_cgroups)" = "$before_cg" ] \
	   && [ "$(count_own_slot_locks)" = "$before_locks" ]; then
		ok "kiln-jail leaves no directory, cgroup or slot lock"
	else not_ok "kiln-jail cleanup" "$(ls -d /run/kiln/jail-* 2>&1) cgroups=$(count_cgroups)/$before_cg locks=$(count_own_slot_locks)"; fi
else
	skip "kiln-jail with busybox" "no static /bin/busybox (busybox-static)"
fi

t_done
