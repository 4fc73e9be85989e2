#!/usr/bin/env bash
# Session pause as a diff (manifest v2): a session with a ~200 MiB working
# set held by a background process that also listens on a TCP socket, and
# files on its disk, pauses on one kiln-host into a real S3 (Swift s3api) and
# resumes on another whose snapshot was built on its own (other RAM bytes),
# each host in a network namespace of its own on a private bridge (the S3
# server on the bridge's address in the root namespace),
# B pausing it in turn (reading its pages itself, the stream it was resumed
# from as the template), each fast pause checked page by page against
# QEMU's own save of the VM,
# from the base RAM that A put in S3 ahead of any pause (sessions.prepare_base,
# on: the first pause uploads none of it; B, with it off, puts nothing ahead
# and its first pause on its own snapshot uploads that base itself), with
# all of it intact; a
# flipped byte in any chunk object (RAM, disk or base) fails the resume
# clearly and the session stays paused;
# a host where process_vm_readv is refused (a seccomp filter) resumes and
# pauses it through QEMU's own load and save;
# a pause cut by SIGKILL of kiln-host leaves a paused session that resumes
# (the manifest, written last, names only whole chunks); DELETE removes the
# chunks; nothing is left behind.
. "$(dirname "$0")/lib.sh"
t_plan 43
require_image
t_require_tools ip nsenter swift-proxy-server memcached python3
t_require_python boto3

N=$((RANDOM % 200 + 20))
NET=10.232.$N
TOKEN=pd-token-$RANDOM$RANDOM
PA=$((20000 + RANDOM % 10000)); PB=$((PA + 1)); PC=$((PA + 2))
BUCKET=kiln-pausediff
declare -A hostpid addr
before_cg=$(count_cgroups)
# A bridge in the root namespace, one namespace per host (a .11, b .12, c .13).
net_bridge "kpd$N" "$NET.1"
for n in a:11 b:12 c:13; do net_ns "kiln-pd-$N-${n%:*}" "kpd$N${n%:*}" "$NET.${n#*:}"; done
addr[$PA]=$NET.11; addr[$PB]=$NET.12; addr[$PC]=$NET.13
s3_local_start "$NET.1"

start_host() { # NAME PORT [CACHE [WRAPPER]]: B builds its own snapshot (RAM not byte-identical to A's)
	host_config "$T_TMP/$1.json" "${addr[$2]}:$2" "$1" \
		".run_dir += \"/$1\" | .pool.memory_mib = 512
		 | .sessions = ({prestart: 1} + (if .host_id == \"c\" then {} else {save_pages: 2} end)
		               + (if .host_id == \"b\" then {prepare_base: false} else {} end))
		 | if \"${3:-}\" == \"\" then . else .cache = \"${3:-}\" end"
	# nsenter --net: only the network namespace (ip netns exec would also
	# remount /sys, hiding the cgroups the jail needs); it execs the host.
	t_bg nsenter --net="/run/netns/kiln-pd-$N-$1" ${4:+"$4"} "$KILN_HOST" serve --config "$T_TMP/$1.json" \
		>> "$T_TMP/$1.out" 2>> "$T_TMP/$1.err"
	hostpid[$1]=$T_BG_PID
	t_serving "http://${addr[$2]}:$2/healthz" "$T_BG_PID"
}
h() { # PORT METHOD PATH [curl args]: body in $T_TMP/last, status echoed
	local port=$1 m=$2 p=$3; shift 3
	curl -s -m 600 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "http://${addr[$port]}:$port$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
ex() { h "$1" POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary "$2"; }
s3py() { # OP MANIFEST-KEY [ARG]
	S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY BUCKET=$BUCKET /usr/bin/python3 -c '
import json, os, sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                  aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"],
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
b = os.environ["BUCKET"]
op, key = sys.argv[1], sys.argv[2]
def manifest():
    return json.loads(s3.get_object(Bucket=b, Key=key)["Body"].read())
def exists(k):
    try:
        s3.head_object(Bucket=b, Key=k); return True
    except Exception:
        return False
if op == "exists":
    print("yes" if exists(key) else "no")
elif op == "base":  # the base RAM the manifest names
    print(manifest()["base"]["sha256"])
elif op == "flip":  # flip one bit in chunk N of a stream (state, disk or base); twice puts it back
    stream, n = sys.argv[3].split(":")
    if stream == "base":
        sha = manifest()["base"]["sha256"]
        chunks = json.loads(s3.get_object(Bucket=b, Key=".bases/%s/manifest.json" % sha)["Body"].read())["mem"]["chunks"]
    else:
        chunks = manifest()[stream]["chunks"]
    k = chunks[int(n) % len(chunks)]["key"]
    d = bytearray(s3.get_object(Bucket=b, Key=k)["Body"].read())
    d[len(d) // 3] ^= 0x10
    s3.put_object(Bucket=b, Key=k, Body=bytes(d))
    print(k)
elif op == "whole":  # the manifest parses and names only chunks that exist
    m = manifest()
    ks = [c["key"] for s in ("state", "disk") for c in m[s]["chunks"]]
    print("yes" if m["version"] in (2, 3) and ks and all(exists(k) for k in ks) else "no")
elif op == "keys":
    m = manifest()
    print(" ".join(c["key"] for s in ("state", "disk") for c in m[s]["chunks"]))
elif op == "count":  # objects under a prefix
    print(sum(1 for _ in s3.get_paginator("list_objects_v2").paginate(Bucket=b, Prefix=key) for _ in _.get("Contents", [])))
' "$@"
}
vcpus_used() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://${addr[$1]}:$1/v1/capacity" | jq -r '.vcpus.used + .vcpus.idle'; }
M=acme/sessions/s1/manifest.json

CACHE_B=$T_TMP/cache-b
if start_host a "$PA" && start_host b "$PB" "$CACHE_B"; then ok "two kiln-hosts, each in its own network namespace, share one S3"
else t_bail "hosts start" "$(tail -3 "$T_TMP/a.err") $(tail -3 "$T_TMP/b.err")"; fi

# --- A's base RAM goes to S3 ahead of any pause (sessions.prepare_base) ---
# kiln-host logs "base SHA in S3 (N bytes in M ms, ahead of any pause)".
ahead() { grep -o "kiln-host: base [0-9a-f]\{64\} $1" "$T_TMP/$2.err" | tail -1 | cut -d' ' -f3; }
t_until 180 test -n "$(ahead 'in S3 (' a)"
PBASE=$(ahead 'in S3 (' a)
check "A put its snapshot's base RAM (${PBASE:0:12}) in S3 by itself, before any pause ($(grep -o 'base [0-9a-f]* in S3 (.*' "$T_TMP/a.err" | tail -1 | cut -c 71-))" \
	test "${#PBASE}" = 64 -a "$(s3py exists ".bases/$PBASE/manifest.json")" = yes

st=$(h "$PA" POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"s1","customer":"acme","spec":{"limits":{"memory_mib":512}}}')
if [ "$st" = 201 ] && [ "$(last .state)" = running ]; then ok "a 512 MiB session runs on A"; else t_bail "a 512 MiB session runs on A ($st)" "$(cat "$T_TMP/last")"; fi

# A process holding ~200 MiB of written memory (a random MiB repeated, each
# page made distinct) that serves its hashes on a TCP socket.
WS=$'import hashlib, os, socket\nb = bytearray(os.urandom(1 << 20)) * 200\nfor i in range(0, len(b), 4096):\n    b[i] = (i >> 12) % 251\nh0 = hashlib.sha256(b).hexdigest()\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(("127.0.0.1", 7000))\ns.listen()\nopen("/work/ws.ready", "w").write(h0)\nwhile True:\n    c, _ = s.accept()\n    c.sendall(("%s %s %d" % (h0, hashlib.sha256(b).hexdigest(), os.getpid())).encode())\n    c.close()\n'
printf '%s' "$WS" | h "$PA" PUT "/v1/sessions/s1/files?path=/work/ws.py" --data-binary @- > /dev/null
ex "$PA" '{"argv":["sh","-c","python3 /work/ws.py > /dev/null 2>&1 & while [ ! -s /work/ws.ready ]; do sleep 0.2; done; cat /work/ws.ready"],"timeout_s":300}' > /dev/null
h0=$(last .stdout)
ASK='{"language":"python","code":"import socket\ns = socket.create_connection((\"127.0.0.1\", 7000))\nprint(s.recv(200).decode())","timeout_s":120}'
ask() { ex "$1" "$ASK" > /dev/null; last .stdout; }
a0=$(ask "$PA")
pid0=${a0##* }
check "the working set is held and served on a socket (${h0:0:12}, pid $pid0)" test "${#h0}" = 64 -a "$a0" = "$h0 $h0 $pid0"
head -c 8000000 /dev/urandom > "$T_TMP/data.bin"
h "$PA" PUT "/v1/sessions/s1/files?path=/work/data.bin" --data-binary @"$T_TMP/data.bin" > /dev/null
ex "$PA" '{"argv":["sh","-c","sync; echo ok"]}' > /dev/null

# --- pause on A: a diff ---
st=$(h "$PA" POST /v1/sessions/s1/pause)
pj=$(jq -c .snapshot "$T_TMP/last")
check "pause: 200 paused as a diff ($pj)" test "$st" = 200 -a "$(last .state)" = paused \
	-a "$(last .snapshot.pages_changed)" -lt "$(last .snapshot.pages_total)" -a "$(last .snapshot.pages_changed)" -gt 50000
check "the manifest (v2, or v3: cut before the devices) names only chunks that exist" test "$(s3py whole $M)" = yes
check "...A read the changed pages out of QEMU itself ($(grep -o 'saved from its pages.*' "$T_TMP/a.err" | tail -1))" \
	grep -q "session s1 saved from its pages" "$T_TMP/a.err"
# A and B run with sessions.save_pages 2: each fast pause is checked
# against QEMU's own save of the same stopped VM, every page of its RAM.
check "...and every page of its RAM matches QEMU's own save of the same VM ($(grep -o 'pause checked: .*' "$T_TMP/a.err" | tail -1))" \
	grep -q "session s1: pause checked: all 1310[0-9]* pages match QEMU's own save" "$T_TMP/a.err"
BASE=$(s3py base $M)
check "the first pause diffs against that base (${BASE:0:12}), found in S3: it uploaded none of it (base_bytes $(last .snapshot.base_bytes))" \
	test "$BASE" = "$PBASE" -a "$(last .snapshot.base_bytes)" = 0 -a "$(grep -c 'compressed into S3 in' "$T_TMP/a.err")" = 0

# --- a flipped bit in any chunk: refused, the session stays paused ---
for which in state:0 state:-1 disk:0 base:0 base:-1; do
	k=$(s3py flip $M "$which")
	st=$(h "$PB" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')
	check "a flipped bit in $which ($k) fails the resume: 422 snapshot_corrupt ($(last .error.message))" \
		test "$st" = 422 -a "$(last .error.code)" = snapshot_corrupt
	check "...and B holds nothing, the session is still paused in S3" \
		test "$(vcpus_used "$PB")" = 0 -a "$(h "$PB" GET /v1/sessions/s1)" = 404 -a "$(s3py whole $M)" = yes
	s3py flip $M "$which" > /dev/null # back as it was
done

# --- resume on B: everything intact ---
t0=$(date +%s%N)
st=$(h "$PB" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')
t1=$(( ($(date +%s%N) - t0) / 1000000 ))
check "resume on B: 200 running ($st $(last .error.message); $t1 ms, base $(grep -o 'fetched from S3 and checked in [0-9]* ms' "$T_TMP/b.err" | tail -1))" test "$st" = 200 -a "$(last .state)" = running -a "$(last .host_id)" = b
sha_b=$(cut -c1-64 "$CACHE_B"/snapshots/*/mem.sha256 2> /dev/null | head -1)
check "...B's own snapshot RAM (${sha_b:0:12}) is not the base (${BASE:0:12}): B used the base from S3" \
	test "${#sha_b}" = 64 -a "$sha_b" != "$BASE"
# B runs with sessions.prepare_base false: its own base goes to S3 with the
# first pause of a session on it, as before there was a preparation.
check "B (sessions.prepare_base false) put nothing of its own snapshot in S3 ahead" \
	test "$(s3py exists ".bases/$sha_b/manifest.json")" = no -a "$(grep -c 'ahead of any pause' "$T_TMP/b.err")" = 0
st=$(h "$PB" POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"s2","customer":"acme","spec":{"limits":{"memory_mib":512}}}')
st2=$(h "$PB" POST /v1/sessions/s2/pause)
check "...so the first pause of a session on it uploads that base itself ($st $st2, base_bytes $(last .snapshot.base_bytes); $(grep -o 'compressed into S3 in [0-9]* ms' "$T_TMP/b.err" | tail -1))" \
	test "$st" = 201 -a "$st2" = 200 -a "$(last .snapshot.base_bytes)" -gt 0 -a "$(s3py exists ".bases/$sha_b/manifest.json")" = yes
h "$PB" DELETE "/v1/sessions/s2?customer=acme" > /dev/null
a1=$(ask "$PB")
check "after resume: the same process answers on its socket with its 200 MiB intact ($a1)" test "$a1" = "$h0 $h0 $pid0"
h "$PB" GET "/v1/sessions/s1/files?path=/work/data.bin" > /dev/null
check "after resume: the file on disk is intact (8 MB)" cmp -s "$T_TMP/last" "$T_TMP/data.bin"

# --- a pause on B diffs against the base B fetched; A resumes it on its own snapshot ---
st=$(h "$PB" POST /v1/sessions/s1/pause)
check "pause on B: 200, against the same base, nothing more to upload ($(jq -c .snapshot "$T_TMP/last"))" \
	test "$st" = 200 -a "$(s3py base $M)" = "$BASE" -a "$(last .snapshot.base_bytes)" = 0
check "...B read the changed pages itself, its template the stream it was resumed from ($(grep -o 'saved from its pages.*' "$T_TMP/b.err" | tail -1))" \
	grep -q "session s1 saved from its pages" "$T_TMP/b.err"
check "...and every page of its RAM matches QEMU's own save of the same VM ($(grep -o 'pause checked: .*' "$T_TMP/b.err" | tail -1))" \
	grep -q "session s1: pause checked: all 1310[0-9]* pages match QEMU's own save" "$T_TMP/b.err"
t0=$(date +%s%N)
st=$(h "$PA" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')
t1=$(( ($(date +%s%N) - t0) / 1000000 ))
check "resume on A: 200 running ($st $(last .error.message); $t1 ms, its own snapshot RAM)" test "$st" = 200 -a "$(last .state)" = running -a "$(last .host_id)" = a
a1=$(ask "$PA")
check "...with its process and memory intact ($a1)" test "$a1" = "$h0 $h0 $pid0"

# --- a pause cut by SIGKILL of kiln-host ---
old_keys=$(s3py keys $M)
ex "$PA" '{"argv":["sh","-c","echo after > /work/mark; sync"]}' > /dev/null
t_bg curl -s -m 60 -o /dev/null -X POST -H "Authorization: Bearer $TOKEN" "http://${addr[$PA]}:$PA/v1/sessions/s1/pause"
cpid=$T_BG_PID
sleep 0.4
t_stop "${hostpid[a]}" KILL; wait "$cpid" 2> /dev/null
check "after SIGKILL mid-pause the manifest in S3 is whole (the old one or the new one)" test "$(s3py whole $M)" = yes
st=$(h "$PB" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')
check "...and the session resumes on B ($st $(last .error.message))" test "$st" = 200 -a "$(last .state)" = running
a2=$(ask "$PB")
check "...with its process and memory intact ($a2)" test "$a2" = "$h0 $h0 $pid0"
if [ "$(s3py keys $M)" = "$old_keys" ]; then
	ex "$PB" '{"argv":["sh","-c","cat /work/mark 2>/dev/null || echo none"]}' > /dev/null
	check "...as of the previous pause (the cut one left no manifest): no mark file" test "$(last .stdout)" = none
else
	ex "$PB" '{"argv":["cat","/work/mark"]}' > /dev/null
	check "...as of the cut pause (its manifest was in): the mark file is there" test "$(last .stdout)" = after
fi
start_host a "$PA" || not_ok "A restarts" "$(tail -3 "$T_TMP/a.err")"
t_until 120 test -n "$(ahead 'already in S3' a)"
check "A, restarted, finds its base already in S3 ($(ahead 'already in S3' a | cut -c1-12)): nothing more uploaded" \
	test "$(ahead 'already in S3' a)" = "$PBASE" -a "$(grep -c "base $PBASE in S3 (" "$T_TMP/a.err")" = 1

# --- where process_vm_readv is refused: host C (A's snapshot, a seccomp
# filter refusing process_vm_readv/writev) loads and saves through QEMU ---
h "$PB" POST /v1/sessions/s1/pause > /dev/null
if [ -x "$ROOT/build/tests/no-vm-readv" ] && start_host c "$PC" "" "$ROOT/build/tests/no-vm-readv"; then
	st=$(h "$PC" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')
	check "resume on C, where process_vm_readv is refused: 200 running ($st $(last .error.message); $(grep -o 'process_vm_readv/writev are not allowed here' "$T_TMP/c.err" | head -1))" \
		test "$st" = 200 -a "$(last .state)" = running -a "$(last .host_id)" = c -a \
		"$(grep -c 'process_vm_readv/writev are not allowed here' "$T_TMP/c.err")" -ge 1
	a3=$(ask "$PC")
	check "...QEMU loaded the pages itself: the process and its memory are intact ($a3)" test "$a3" = "$h0 $h0 $pid0"
	st=$(h "$PC" POST /v1/sessions/s1/pause)
	check "pause on C: 200, saved through QEMU's own stream ($(grep -o 'session s1: saved through QEMU.*' "$T_TMP/c.err" | tail -1))" \
		test "$st" = 200 -a "$(last .state)" = paused -a "$(grep -c 'session s1 saved from its pages' "$T_TMP/c.err")" = 0 \
		-a "$(grep -c 'session s1: saved through QEMU: process_vm_readv is not allowed here' "$T_TMP/c.err")" -ge 1
	t_stop "${hostpid[c]}"; unset 'hostpid[c]'
else
	not_ok "host C under build/tests/no-vm-readv starts" "$(tail -3 "$T_TMP/c.err" 2> /dev/null)"
fi
st=$(h "$PB" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')
a3=$(ask "$PB")
check "...and B resumes what C saved, intact ($st, $a3)" test "$st" = 200 -a "$a3" = "$h0 $h0 $pid0"

# --- a second pause deletes the first one's chunks; DELETE deletes all ---
keys1=$(s3py keys $M)
h "$PB" POST /v1/sessions/s1/pause > /dev/null
keys2=" $(s3py keys $M) "
gone=0; left=
for k in $keys1; do
	case "$keys2" in *" $k "*) continue ;; esac # named again: an unchanged chunk, not sent twice
	if [ "$(s3py exists "$k")" = no ]; then gone=$((gone + 1)); else left="$left $k"; fi
done
check "a newer pause removed the older pause's chunks it does not name ($gone removed; left:${left:- none})" \
	test "$gone" -gt 0 -a -z "$left" -a "$(s3py whole $M)" = yes
st=$(h "$PB" DELETE "/v1/sessions/s1?customer=acme")
check "DELETE of the paused session removes its manifest and every chunk" \
	test "$st" = 200 -a "$(s3py count acme/sessions/s1/)" = 0
check "...and leaves the shared base RAM in S3 (kiln never deletes a base)" \
	test "$(s3py exists ".bases/$BASE/manifest.json")" = yes

for p in "${hostpid[@]}"; do kill "$p" 2> /dev/null; done
for p in "${hostpid[@]}"; do wait "$p" 2> /dev/null; done
hostpid=()
net_down
check "nothing left: no QEMU, VM directories, session files, cgroups, namespaces or bridge" \
	test "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR" -mindepth 2 | wc -l)" = 0 \
	-a "$(find "$T_TMP/spool-a/sessions" "$T_TMP/spool-b/sessions" "$T_TMP/spool-c/sessions" -mindepth 1 2> /dev/null | wc -l)" = 0 \
	-a "$(count_cgroups)" = "$before_cg" -a "$(net_left)" = 0
t_done
