#!/usr/bin/env bash
# Copies of a running session (kiln-host's side of fork and named snapshots,
# docs/architecture.md "Snapshots and forks"): POST .../checkpoint keeps a
# running session's memory, processes and disk as a snapshot in S3 while the
# session goes on; POST .../resume with "snapshot" starts new sessions from
# it, on this host or another. Two kiln-hosts, each in a network namespace
# of its own (veth to a bridge), on one local S3 on the bridge: a snapshot
# started five times across the two hosts; every copy
# has the parent's process (its random bytes and listening socket), its
# file and its variables; a change in one is invisible to the others and to
# the parent; the copies' randomness differs; a copy's pause is a delta over
# the snapshot's chunks and resumes on the other host; a fork's checkpoint
# ({"fork":true}) keeps a copy of the parent's RAM that its children on that
# host map copy-on-write (each holds a fraction of the parent's private
# memory), whose pauses, resumes elsewhere and own forks keep every page;
# copies of copies
# work for 20 generations; a damaged snapshot chunk gives a clear error and
# leaves nothing started; a copy on the snapshot's host reads its chunks
# from that host's pause cache; DELETE /v1/snapshots removes its objects
# and copies; nothing is left on the hosts.
. "$(dirname "$0")/lib.sh"
t_plan 26
require_image
t_require_tools ip nsenter swift-proxy-server memcached python3
t_require_python boto3

S3_DIR=$T_TMP/s3
TOKEN=ckpt-token-$RANDOM$RANDOM
PA=$((20000 + RANDOM % 10000)); PB=$((PA + 1))
BUCKET=kiln-ckpt
N=$((RANDOM % 200 + 20))
NET=10.233.$N
declare -A addr
pids=()
net_bridge "kck$N" "$NET.1"
for n in a:11 b:12; do net_ns "kiln-ck-$N-${n%:*}" "kck$N${n%:*}" "$NET.${n#*:}"; done
addr[$PA]=$NET.11; addr[$PB]=$NET.12
s3_local_start "$NET.1"
before_cg=$(count_cgroups)
start_host() { # NAME PORT: in its namespace (nsenter --net only: the jail needs /sys's cgroups)
	host_config "$T_TMP/$1.json" "${addr[$2]}:$2" "$1" ".run_dir += \"/$1\""
	host_start "$T_TMP/$1.json" "$1" "kiln-ck-$N-$1"
	pids+=("$host_pid")
	t_serving "http://${addr[$2]}:$2/healthz" "$host_pid"
}
h() { # PORT METHOD PATH [curl args]: body in $T_TMP/last, status echoed
	local port=$1 m=$2 p=$3; shift 3
	curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "http://${addr[$port]}:$port$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
s3l() { S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY BUCKET=$BUCKET \
	python3 "$ROOT/tests/integration/s3_layers.py" "$@"; }
j() { h "$@" -H 'Content-Type: application/json'; }
# ask PORT SESSION WORD: the holder's answer (hash of its bytes, after WORD's change)
ask() {
	j "$1" POST "/v1/sessions/$2/exec" --data-binary \
		"{\"language\":\"python\",\"code\":\"import socket\\ns = socket.socket(socket.AF_UNIX)\\ns.connect(\\\"/tmp/h.sock\\\")\\ns.sendall(b\\\"$3\\\")\\nprint(s.recv(200).decode())\"}" > /dev/null
	last .stdout
}
sh_in() { # PORT SESSION COMMAND: its stdout
	j "$1" POST "/v1/sessions/$2/exec" --data-binary "$(jq -nc --arg c "$3" '{argv:["sh","-c",$c]}')" > /dev/null
	last .stdout
}
ckpt() { j "$1" POST "/v1/sessions/$2/checkpoint" --data-binary "{\"customer\":\"acme\",\"snapshot\":\"$3\"}"; }
from() { j "$1" POST "/v1/sessions/$2/resume" --data-binary "{\"customer\":\"acme\",\"snapshot\":\"$3\"}"; }
# a fork's snapshot may still be uploading when its checkpoint answers: a
# host other than the parent's waits for its manifest (as kiln-api asks)
fromw() { j "$1" POST "/v1/sessions/$2/resume" --data-binary "{\"customer\":\"acme\",\"snapshot\":\"$3\",\"wait_ms\":60000}"; }

if start_host a "$PA" && start_host b "$PB"; then ok "two kiln-hosts, each in its own network namespace, share one S3"
else t_bail "hosts start" "$(tail -3 "$T_TMP/a.err") $(tail -3 "$T_TMP/b.err")"; fi

# A process holding 16 MiB of random bytes behind a listening socket;
# "mutate" rewrites 2 MiB of them first.
HOLD=$'import hashlib, os, socket\nb = bytearray(os.urandom(16 << 20))\nn = 0\ns = socket.socket(socket.AF_UNIX)\ns.bind("/tmp/h.sock")\ns.listen()\nwhile True:\n    c, _ = s.accept()\n    if c.recv(16) == b"mutate":\n        at = (n * (3 << 20)) % (14 << 20)\n        b[at:at + (2 << 20)] = os.urandom(2 << 20)\n        n += 1\n    c.sendall(hashlib.sha256(b).hexdigest().encode())\n    c.close()\n'
j "$PA" POST /v1/sessions --data-binary '{"id":"s1","customer":"acme","spec":{}}' > /dev/null
printf '%s' "$HOLD" | h "$PA" PUT "/v1/sessions/s1/files?path=/work/hold.py" --data-binary @- > /dev/null
sh_in "$PA" s1 'python3 /work/hold.py > /dev/null 2>&1 & sleep 2; echo parent > /work/who; sync; echo started' > /dev/null
want=$(ask "$PA" s1 hash)
check "a process in s1 holds 16 MiB of random bytes behind a socket (sha256 ${want:0:12})" test "${#want}" = 64

st=$(ckpt "$PA" s1 k1)
check "checkpoint s1 to snapshot k1: $(last .snapshot.bytes) bytes, the VM stood still $(last .snapshot.stop_ms) ms of $(last .snapshot.ms)" \
	test "$st" = 200 -a "$(last .snapshot.prefix)" = acme/snapshots/k1/
check "... s1 goes on: its process answers the same, its file is there" \
	test "$(ask "$PA" s1 hash)" = "$want" -a "$(sh_in "$PA" s1 'cat /work/who')" = parent
orph=$(s3l orphans acme/snapshots/k1/ | wc -l)
check "the snapshot's objects are its manifest's ($orph others), under its own prefix ($(s3l prefixes acme/snapshots/k1/manifest.json))" \
	test "$orph" = 0 -a "$(s3l prefixes acme/snapshots/k1/manifest.json)" = acme/snapshots/k1

sa=$(from "$PA" c1 k1); sb=$(from "$PB" c2 k1)
check "two sessions start from k1, on A and on B ($sa $sb)" test "$sa" = 200 -a "$sb" = 200
g1=$(ask "$PA" c1 hash); g2=$(ask "$PB" c2 hash)
hits=$(grep -o 'session c1 resumed.*' "$T_TMP/a.err" | grep -o '[0-9]* of [0-9]* chunks from this host.s pause cache')
check "... c1, on the host that took the snapshot, read its chunks from that host's pause cache ($hits)" \
	test -n "$hits" -a "${hits%% *}" -gt 0
check "... both have the process with its bytes and the file" \
	test "$g1" = "$want" -a "$g2" = "$want" -a "$(sh_in "$PA" c1 'cat /work/who')" = parent \
	-a "$(sh_in "$PB" c2 'cat /work/who')" = parent
m1=$(ask "$PA" c1 mutate)
sh_in "$PA" c1 'echo c1 > /work/who; sync' > /dev/null
check "a change in c1 is invisible to c2 and to s1" \
	test "$m1" != "$want" -a "$(ask "$PB" c2 hash)" = "$want" -a "$(ask "$PA" s1 hash)" = "$want" \
	-a "$(sh_in "$PB" c2 'cat /work/who')" = parent -a "$(sh_in "$PA" s1 'cat /work/who')" = parent
# Three more starts of k1 (A, B, B): five copies across two hosts.
ok5=1
for s in c3:$PA c4:$PB c5:$PB; do
	[ "$(from "${s#*:}" "${s%:*}" k1)" = 200 ] || { ok5=0; echo "# ${s%:*}: $(cat "$T_TMP/last")"; continue; }
	[ "$(ask "${s#*:}" "${s%:*}" hash)" = "$want" -a "$(sh_in "${s#*:}" "${s%:*}" 'cat /work/who')" = parent ] || ok5=0
done
rnd=()
for s in c1:$PA c2:$PB c3:$PA c4:$PB c5:$PB; do
	rnd+=("$(sh_in "${s#*:}" "${s%:*}" 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \n"')")
done
r1=${rnd[0]} r2=${rnd[1]}
ndiff=$(printf '%s\n' "${rnd[@]}" | grep -c '^[0-9a-f]\{32\}$' ; :)
nuniq=$(printf '%s\n' "${rnd[@]}" | sort -u | grep -c '^[0-9a-f]\{32\}$' ; :)
check "k1 started five times (two on A, three on B): each has the process's bytes and the file" test "$ok5" = 1
check "the five copies' randomness differs (reseeded: $nuniq distinct of $ndiff; $r1 / $r2 ...)" \
	test "$ndiff" = 5 -a "$nuniq" = 5
for s in c3:$PA c4:$PB c5:$PB; do h "${s#*:}" DELETE "/v1/sessions/${s%:*}?customer=acme" > /dev/null; done

h "$PA" POST /v1/sessions/c1/pause > /dev/null
p1=$(s3l prefixes acme/sessions/c1/manifest.json)
st=$(j "$PB" POST /v1/sessions/c1/resume --data-binary '{"customer":"acme"}')
check "c1's pause names the snapshot's chunks and its own ($p1); it resumes on B with its change" \
	test "$st" = 200 -a "$p1" = "acme/sessions/c1 acme/snapshots/k1" -a "$(ask "$PB" c1 hash)" = "$m1"
h "$PB" DELETE "/v1/sessions/c1?customer=acme" > /dev/null
h "$PA" DELETE "/v1/sessions/c1?customer=acme" > /dev/null
check "destroying c1 removes its own objects, not the snapshot's ($(s3l count acme/sessions/c1/) / $(s3l count acme/snapshots/k1/))" \
	test "$(s3l count acme/sessions/c1/)" = 0 -a "$(s3l orphans acme/snapshots/k1/ | wc -l)" = 0 \
	-a "$(s3l count acme/snapshots/k1/)" -gt 2

# ---- a fork: its children on the parent's host share the parent's RAM ----
ckptf() { j "$1" POST "/v1/sessions/$2/checkpoint" --data-binary "{\"customer\":\"acme\",\"snapshot\":\"$3\",\"fork\":true}"; }
vm_kib() { # PORT SESSION FIELD: that smaps_rollup field of its QEMU (kB)
	h "$1" GET "/v1/sessions/$2" > /dev/null
	awk -v f="$3:" '$1 == f {print $2}' "/proc/$(last .vm_pid)/smaps_rollup" 2> /dev/null
}
metric() { curl -s -H "Authorization: Bearer $TOKEN" "http://${addr[$1]}:$1/metrics" | awk -v m="$2" '$1 == m {print $2}'; }
want=$(ask "$PA" s1 hash)
st=$(ckptf "$PA" s1 f1)
check "a fork's checkpoint of s1: $(last .snapshot.bytes) bytes, the VM stood still $(last .snapshot.stop_ms) ms; A keeps a copy of its RAM ($(metric "$PA" kiln_host_fork_bases))" \
	test "$st" = 200 -a "$(metric "$PA" kiln_host_fork_bases)" = 1
okf=1
for k in 1 2 3; do
	[ "$(from "$PA" "fk$k" f1)" = 200 -a "$(last .fork_shared)" = true ] || { okf=0; echo "# fk$k: $(cat "$T_TMP/last")"; }
done
check "three children of the fork start on A, sharing its RAM (fork_shared)" test "$okf" = 1
okf=1
for k in 1 2 3; do
	[ "$(ask "$PA" "fk$k" hash)" = "$want" -a "$(sh_in "$PA" "fk$k" 'cat /work/who')" = parent ] || okf=0
done
pa=$(vm_kib "$PA" s1 Anonymous); ca=$(vm_kib "$PA" fk2 Anonymous)
check "... each has the process with its bytes and the file; a child's private memory is a fraction of the parent's (${ca} / ${pa} KiB)" \
	test "$okf" = 1 -a -n "$ca" -a -n "$pa" -a "$((ca * 2))" -lt "$pa"
mf=$(ask "$PA" fk1 mutate)
sh_in "$PA" fk1 'echo fk1 > /work/who; sync' > /dev/null
check "a change in fork child 1 is invisible to child 2 and to the parent" \
	test "$mf" != "$want" -a "$(ask "$PA" fk2 hash)" = "$want" -a "$(ask "$PA" s1 hash)" = "$want" \
	-a "$(sh_in "$PA" fk2 'cat /work/who')" = parent
r1=$(sh_in "$PA" fk1 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \n"')
r2=$(sh_in "$PA" fk2 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \n"')
check "the children's randomness differs ($r1 / $r2)" test -n "$r1" -a "${#r1}" = 32 -a "$r1" != "$r2"
h "$PA" POST /v1/sessions/fk1/pause > /dev/null
pb=$(last .snapshot.bytes); pf=$(s3l prefixes acme/sessions/fk1/manifest.json)
st=$(j "$PB" POST /v1/sessions/fk1/resume --data-binary '{"customer":"acme"}')
check "fork child 1's pause is a delta over the fork's chunks ($pb bytes; $pf) and resumes on B with its change" \
	test "$st" = 200 -a "$pf" = "acme/sessions/fk1 acme/snapshots/f1" -a "$(ask "$PB" fk1 hash)" = "$mf" \
	-a "$(sh_in "$PB" fk1 'cat /work/who')" = fk1
# A child's own copy: the pages it shares with the fork's RAM are in it.
m2=$(ask "$PA" fk2 mutate)
st=$(ckptf "$PA" fk2 f2)
a=$(from "$PA" gk1 f2); ash=$(last .fork_shared); b=$(fromw "$PB" gk2 f2)
check "a fork of fork child 2: its children on A (sharing: $ash) and on B (from S3) have its bytes" \
	test "$st" = 200 -a "$a" = 200 -a "$ash" = true -a "$b" = 200 -a "$(ask "$PA" gk1 hash)" = "$m2" \
	-a "$(ask "$PB" gk2 hash)" = "$m2"
for s in fk1:$PB fk2:$PA fk3:$PA gk1:$PA gk2:$PB; do h "${s#*:}" DELETE "/v1/sessions/${s%:*}?customer=acme" > /dev/null; done
h "$PA" DELETE "/v1/snapshots/f1?customer=acme" > /dev/null
h "$PA" DELETE "/v1/snapshots/f2?customer=acme" > /dev/null
check "deleting the fork snapshots drops A's copies of the RAM ($(metric "$PA" kiln_host_fork_bases) left)" \
	test "$(metric "$PA" kiln_host_fork_bases)" = 0 -a "$(s3l count acme/snapshots/f1/)" = 0

# Copies of copies: 20 generations, each a snapshot of the last, on
# alternate hosts, each one changing the bytes.
declare -a sp; cur=c2; port=$PB; okg=1; want=$(ask "$PB" c2 hash)
for g in $(seq 1 20); do
	[ "$(ckpt "$port" "$cur" "g$g")" = 200 ] || { okg=0; echo "# gen $g: checkpoint: $(cat "$T_TMP/last")"; break; }
	sp[g]=$port # its copies are there
	prev=$cur; pport=$port; cur=gen$g
	[ "$port" = "$PA" ] && port=$PB || port=$PA
	[ "$(from "$port" "$cur" "g$g")" = 200 ] || { okg=0; echo "# gen $g: start: $(cat "$T_TMP/last")"; break; }
	[ "$(ask "$port" "$cur" hash)" = "$want" ] || { okg=0; echo "# gen $g: bytes differ"; break; }
	want=$(ask "$port" "$cur" mutate)
	h "$pport" DELETE "/v1/sessions/$prev?customer=acme" > /dev/null
	[ $g -gt 1 ] && h "${sp[g - 1]}" DELETE "/v1/snapshots/g$((g - 1))?customer=acme" > /dev/null
done
check "20 generations of copies of copies, across both hosts, each with its parent's bytes" test "$okg" = 1

s3l damage acme/snapshots/k1/manifest.json
st=$(from "$PB" bad k1)
check "a damaged snapshot chunk: HTTP $st $(last .error.code) ($(last .error.message | head -c 100))" \
	test "$st" = 422 -a "$(last .error.code)" = snapshot_corrupt
check "... and nothing of that session is left started" \
	test "$(h "$PB" GET /v1/sessions/bad)" = 404 -a "$(s3l count acme/sessions/bad/)" = 0

h "$PA" DELETE "/v1/snapshots/k1?customer=acme" > /dev/null
n=$(last .deleted)
h "${sp[20]}" DELETE "/v1/snapshots/g20?customer=acme" > /dev/null
check "DELETE /v1/snapshots removes every object of a snapshot ($n; $(s3l count acme/snapshots/) left of all)" \
	test "$n" -gt 2 -a "$(s3l count acme/snapshots/k1/)" = 0 -a "$(s3l count acme/snapshots/)" = 0
for s in s1 "$cur"; do
	for p in "$PA" "$PB"; do h "$p" DELETE "/v1/sessions/$s?customer=acme" > /dev/null; done
done

for p in "${pids[@]}"; do kill "$p"; done
for p in "${pids[@]}"; do wait "$p" 2> /dev/null; done
pids=()
left_s3=$(s3l count acme/sessions/) # before the bridge S3 listens on goes
net_down
check "nothing left: no QEMU, VM directories, session files, cgroups or namespaces; S3 holds no session's objects" \
	test "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR" -mindepth 2 | wc -l)" = 0 \
	-a "$(find "$T_TMP/spool-a/sessions" "$T_TMP/spool-b/sessions" -mindepth 1 2> /dev/null | wc -l)" = 0 \
	-a "$(find "$T_TMP/spool-a/pause-cache" "$T_TMP/spool-b/pause-cache" -path '*snapshot.*' -type f 2> /dev/null | wc -l)" = 0 \
	-a "$(count_cgroups)" = "$before_cg" -a "$left_s3" = 0 -a "$(net_left)" = 0
t_done
