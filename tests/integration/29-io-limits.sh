#!/usr/bin/env bash
# What a guest or a compromised QEMU may do to the host's disk and kernel:
# io_uring is refused inside kiln-jail (it works outside, so the check can
# fail), and a guest's disk I/O is throttled by QEMU (kiln-host "disk"
# settings): 24 MiB written with O_DIRECT under a 4 MiB/s limit take at
# least 4 s, and QEMU's command line carries the limit.
. "$(dirname "$0")/lib.sh"
t_plan 7
require_image
PROBE=$ROOT/$B/tests/uring-probe
KILN_JAIL=$ROOT/$B/kiln-jail
[ -x "$PROBE" ] || { echo "1..0 # SKIP $PROBE missing: make unit"; exit 0; }

TOKEN=io-token-$RANDOM$RANDOM
PORT=$((20000 + RANDOM % 12000))
hpid=
before_q=$(count_qemu)
before_cg=$(count_cgroups)

# ---- io_uring ----
outside=$("$PROBE")
inside=$("$KILN_JAIL" -- "$PROBE" 2>&1)
echo "# outside the jail: $(echo $outside); inside: $(echo $inside)"
check "io_uring works outside the jail (the probe can tell)" test "$(echo "$outside" | head -1)" = "io_uring_setup ok"
check "inside kiln-jail io_uring_setup, io_uring_enter and io_uring_register are refused (ENOSYS)" \
	test "$(echo "$inside" | grep -c ' ENOSYS$')" = 3

# ---- disk throttling ----
host_config "$T_TMP/host.json" "127.0.0.1:$PORT" io '.disk = {bps_mib: 4, iops: 1000}'
host_up "$T_TMP/host.json" host "http://127.0.0.1:$PORT"
hpid=$host_pid
h() { # METHOD PATH [curl args]: body in $T_TMP/last, status echoed
	local m=$1 p=$2; shift 2
	curl -s -m 120 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "http://127.0.0.1:$PORT$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
st=$(h POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"s1","customer":"acme","spec":{}}')
if [ "$st" = 201 ]; then ok "a session starts on a host with disk.bps_mib 4"
else t_bail "a session starts" "HTTP $st $(head -c 300 "$T_TMP/last") $(tail -3 "$T_TMP/host.err")"; fi
cmd=$(pgrep -af "qemu-system-x86_64.*$KILN_RUN_DIR" | head -1)
check "QEMU's drive carries the limit (throttling.bps-total=4194304, iops-total=1000)" \
	grep -q 'throttling.bps-total=4194304,throttling.iops-total=1000' <<< "$cmd"
st=$(h POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary \
	'{"argv":["sh","-c","dd if=/dev/zero of=/work/big bs=1M count=24 oflag=direct 2>&1; rm -f /work/big"],"timeout_s":120}')
ms=$(last .timings.run_ms)
echo "# 24 MiB written with O_DIRECT in ${ms} ms under 4 MiB/s ($(last .stdout | tail -1))"
check "the guest's writes are held to the limit: 24 MiB take at least 4 s (${ms} ms)" \
	test "$st" = 200 -a "$(last .exit_code)" = 0 -a "${ms:-0}" -ge 4000
st=$(h DELETE /v1/sessions/s1)
check "the session is deleted" test "$st" = 200
kill "$hpid" 2> /dev/null
wait "$hpid" 2> /dev/null
hpid=
check "no QEMU process or cgroup outlives the test" test "$(count_qemu)" = "$before_q" -a "$(count_cgroups)" = "$before_cg"
t_done
