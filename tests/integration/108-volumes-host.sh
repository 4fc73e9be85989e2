#!/usr/bin/env bash
# Volumes on kiln-host (docs/architecture.md "Volumes"): a session spec's
# "volumes" fill the VM's volume slots from S3 (or make a new ext4) before
# the guest runs, and the guest's root mounts them; read-write ones go back
# to S3 (chunks, then manifest.json under acme/volumes/ID/) at a pause, a
# destroy, and, after kiln-host was SIGKILLed, when the next one starts.
# Two kiln-hosts on one local S3: a file written and synced in one session
# is read in the next, on the other host; a read-only mount cannot write
# (EROFS) and is never uploaded; the file survives pause and resume on the
# other host; a session with a read-write volume cannot be checkpointed
# (409 volume_attached), one with a read-only volume can, and its copy on
# the other host has it mounted; a sync before a SIGKILL is kept; a damaged
# chunk is a clear error and starts nothing; DELETE
# /v1/volumes removes every object; nothing is left on the hosts.
. "$(dirname "$0")/lib.sh"
t_plan 21
require_image
t_require_tools swift-proxy-server memcached python3 jq curl
t_require_python boto3

S3_DIR=$T_TMP/s3
TOKEN=vol-token-$RANDOM$RANDOM
PA=$((20000 + RANDOM % 10000)); PB=$((PA + 1))
BUCKET=kiln-vols
pids=()
s3_local_start
before_cg=$(count_cgroups)
start_host() { # NAME PORT
	# QEMUs started ahead too: their slots move to the session that takes them.
	host_config "$T_TMP/$1.json" "127.0.0.1:$2" "$1" ".run_dir += \"/$1\" | .sessions.prestart = 1"
	host_start "$T_TMP/$1.json" "$1"
	eval "pid_$1=$host_pid"
	t_serving "http://127.0.0.1:$2/healthz" "$host_pid"
}
h() { # PORT METHOD PATH [curl args]: body in $T_TMP/last, status echoed
	local port=$1 m=$2 p=$3; shift 3
	curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "http://127.0.0.1:$port$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
s3l() { S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY BUCKET=$BUCKET \
	python3 "$ROOT/tests/integration/s3_layers.py" "$@"; }
j() { h "$@" -H 'Content-Type: application/json'; }
sh_in() { # PORT SESSION COMMAND: its stdout and stderr
	j "$1" POST "/v1/sessions/$2/exec" --data-binary "$(jq -nc --arg c "$3" '{argv:["sh","-c",$c]}')" > /dev/null
	echo "$(last .stdout)$(last .stderr)"
}
create() { # PORT ID VOLUMES-JSON
	j "$1" POST /v1/sessions --data-binary "{\"id\":\"$2\",\"customer\":\"acme\",\"spec\":{\"volumes\":$3}}"
}
vol() { h "$PA" GET "/v1/volumes/v1?customer=acme"; }
RW='[{"id":"v1","path":"/data","size_mib":64}]'

if start_host a "$PA" && start_host b "$PB"; then ok "two kiln-hosts share one S3"
else t_bail "hosts start" "$(tail -3 "$T_TMP/a.err") $(tail -3 "$T_TMP/b.err")"; fi

st=$(create "$PA" bad '[{"id":"v1","path":"/proc/x","size_mib":64}]')
check "a volume path under /proc: HTTP $st $(last .error.code) ($(last .error.message | head -c 90))" \
	test "$st" = 400 -a "$(last .error.code)" = invalid_spec

t0=$(date +%s%N)
st=$(create "$PA" s1 "$RW")
ms=$((($(date +%s%N) - t0) / 1000000))
check "a session with a new volume v1 at /data starts ($st in $ms ms: made, mounted; $(grep -o 'volume v1 mounted at /data in [0-9]* ms' "$T_TMP/a.err" | tail -1))" \
	test "$st" = 201 -a "$(last '.volumes[0].id')" = v1
out=$(sh_in "$PA" s1 'echo hello-from-s1 > /data/f && sync && cat /data/f && stat -c %U /data && grep -c " /data ext4 rw" /proc/mounts')
check "its user writes a file there and syncs (${out//$'\n'/ })" test "$out" = $'hello-from-s1\nsandbox\n1'
st=$(vol)
check "no volume in S3 before the session ends (GET: $st)" test "$st" = 404
st=$(h "$PA" DELETE "/v1/sessions/s1?customer=acme")
vol > /dev/null
gen1=$(last .generation)
check "destroyed: v1 is in S3 ($st; $(last .bytes) bytes in $(last .chunks) chunks; $(grep -o 'volume v1 kept in S3 (destroy) in [0-9]* ms, [0-9]* bytes sent' "$T_TMP/a.err" | tail -1))" \
	test "$st" = 200 -a -n "$gen1" -a "$(last .size_mib)" = 64 -a "$(s3l orphans acme/volumes/v1/ | wc -l)" = 0

st=$(create "$PB" s2 '[{"id":"v1","path":"/mnt/work","size_mib":64}]')
check "a second session, on B, mounts v1 at /mnt/work and reads the file ($st; $(grep -o 'volume v1 in slot 0 [^)]*) in [0-9]* ms, [0-9]* bytes' "$T_TMP/b.err" | tail -1))" \
	test "$st" = 201 -a "$(sh_in "$PB" s2 'cat /mnt/work/f')" = hello-from-s1
st=$(h "$PB" POST "/v1/sessions/s2/checkpoint" -H 'Content-Type: application/json' --data-binary '{"customer":"acme","snapshot":"k1"}')
check "a session with a read-write volume is not checkpointed: HTTP $st $(last .error.code)" \
	test "$st" = 409 -a "$(last .error.code)" = volume_attached
sh_in "$PB" s2 'echo before-pause >> /mnt/work/f; echo unsynced-but-paused > /mnt/work/g' > /dev/null
st=$(h "$PB" POST /v1/sessions/s2/pause)
check "s2 pauses ($st, $(last .snapshot.pause_ms) ms; $(grep -o 'volume v1 kept in S3 (pause) in [0-9]* ms, [0-9]* bytes sent' "$T_TMP/b.err" | tail -1))" \
	test "$st" = 200
st=$(j "$PA" POST /v1/sessions/s2/resume --data-binary '{"customer":"acme"}')
out=$(sh_in "$PA" s2 'cat /mnt/work/f /mnt/work/g')
ahead=$(grep -c 'session s2 resumed in .*QEMU started ahead' "$T_TMP/a.err")
check "... and resumes on A (into a QEMU started ahead: $ahead) with the volume as it was, the unsynced file too (${out//$'\n'/ })" \
	test "$st" = 200 -a "$ahead" = 1 -a "$out" = $'hello-from-s1\nbefore-pause\nunsynced-but-paused'
vol > /dev/null; gen2=$(last .generation)
sh_in "$PA" s2 'echo written-after-resume-not-synced > /mnt/work/h' > /dev/null
st=$(h "$PA" DELETE "/v1/sessions/s2?customer=acme")
vol > /dev/null; gen3=$(last .generation)
check "destroying it (a sync in the guest first) keeps v1 in S3 again (generations $gen1, $gen2, $gen3)" \
	test "$st" = 200 -a "$gen2" != "$gen1" -a "$gen3" != "$gen2"

st=$(create "$PB" s3 '[{"id":"v1","path":"/ro","read_only":true,"size_mib":64}]')
out=$(sh_in "$PB" s3 'cat /ro/g /ro/h; touch /ro/x 2>&1; echo rc=$?')
check "a read-only mount reads it and cannot write (${out//$'\n'/ })" \
	test "$st" = 201 -a "$(echo "$out" | head -2)" = $'unsynced-but-paused\nwritten-after-resume-not-synced' \
	-a -n "$(echo "$out" | grep 'Read-only file system')" -a "$(echo "$out" | tail -1)" != rc=0
st=$(h "$PB" POST "/v1/sessions/s3/checkpoint" -H 'Content-Type: application/json' --data-binary '{"customer":"acme","snapshot":"k1"}')
st2=$(j "$PA" POST /v1/sessions/c1/resume --data-binary '{"customer":"acme","snapshot":"k1"}')
out=$(sh_in "$PA" c1 'cat /ro/f; grep -c " /ro ext4 ro" /proc/mounts')
check "a session with a read-only volume is checkpointed ($st), and its copy on A has it mounted, filled from S3 ($st2: ${out//$'\n'/ })" \
	test "$st" = 200 -a "$st2" = 200 -a "$out" = $'hello-from-s1\nbefore-pause\n1'
h "$PA" DELETE "/v1/sessions/c1?customer=acme" > /dev/null
h "$PA" DELETE "/v1/snapshots/k1?customer=acme" > /dev/null
sh_in "$PB" s3 'mount -o remount,rw /ro 2>/dev/null; echo x > /ro/x 2>/dev/null; sync' > /dev/null
h "$PB" DELETE "/v1/sessions/s3?customer=acme" > /dev/null
vol > /dev/null
check "... and a read-only volume is never uploaded (generation still $(last .generation))" \
	test "$(last .generation)" = "$gen3"

st=$(create "$PA" s4 "$RW")
out=$(sh_in "$PA" s4 'echo synced-before-crash > /data/crash && sync && echo ok')
kill -KILL "$pid_a"; wait "$pid_a" 2> /dev/null
check "s4 writes and syncs a file on A ($st, $out); then A is SIGKILLed" test "$st" = 201 -a "$out" = ok
start_host a "$PA"
vol > /dev/null
check "the restarted A keeps v1 in S3 from the slot its predecessor left ($(grep -o 'volume v1 kept in S3 in [0-9]* ms, [0-9]* bytes sent' "$T_TMP/a.err" | tail -1))" \
	test "$(last .generation)" != "$gen3" -a "$(find "$T_TMP/spool-a/sessions" -mindepth 1 -maxdepth 1 ! -name '.*' | wc -l)" = 0
st=$(create "$PB" s5 "$RW")
check "the next session reads the file synced before the crash ($st)" \
	test "$st" = 201 -a "$(sh_in "$PB" s5 'cat /data/crash')" = synced-before-crash
h "$PB" DELETE "/v1/sessions/s5?customer=acme" > /dev/null

# A slot holding more than its volume (what a guest's root writing past its
# volume into the slot's device would leave: here the host allocates it, as
# a guest's writes would) has its VM stopped by the sampler: the host's
# disk is not the guest's to fill.
create "$PA" s7 '[]' > /dev/null
fallocate -o 0 -l 96M "$T_TMP/spool-a/sessions/s7/vol0.img"
for _ in $(seq 40); do grep -q 'session s7: its volume slot 0 holds' "$T_TMP/a.err" && break; sleep 0.5; done
check "an empty volume slot holding 96 MiB has its VM stopped ($(grep -o 'session s7: its volume slot.*' "$T_TMP/a.err" | head -c 110))" \
	grep -q 'session s7: its volume slot 0 holds 96 MiB' "$T_TMP/a.err"
h "$PA" DELETE "/v1/sessions/s7?customer=acme" > /dev/null
s3l damage acme/volumes/v1/manifest.json
st=$(create "$PA" s6 "$RW")
check "a damaged volume chunk: HTTP $st $(last .error.code) ($(last .error.message | head -c 120)), and nothing of the session is left" \
	test "$st" = 422 -a "$(last .error.code)" = snapshot_corrupt -a -n "$(last .error.message | grep 'volume v1')" \
	-a "$(h "$PA" GET /v1/sessions/s6)" = 404

n0=$(s3l count acme/volumes/v1/)
st=$(h "$PA" DELETE "/v1/volumes/v1?customer=acme")
n=$(last .deleted)
check "DELETE /v1/volumes/v1 removes its $n objects (of $n0; $(s3l count acme/volumes/) left; GET: $(vol))" \
	test "$st" = 200 -a "$n" = "$n0" -a "$n" -gt 1 -a "$(s3l count acme/volumes/)" = 0 -a "$(vol)" = 404

for p in "$pid_a" "$pid_b"; do kill "$p"; done
for p in "$pid_a" "$pid_b"; do wait "$p" 2> /dev/null; done
check "nothing left: no QEMU, VM directories, session files or cgroups; S3 holds no session's objects" \
	test "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR" -mindepth 2 | wc -l)" = 0 \
	-a "$(find "$T_TMP/spool-a/sessions" "$T_TMP/spool-b/sessions" -mindepth 1 2> /dev/null | wc -l)" = 0 \
	-a "$(count_cgroups)" = "$before_cg" -a "$(s3l count acme/sessions/)" = 0 \
	-a "$(s3l count acme/snapshots/)" = 0
t_done
