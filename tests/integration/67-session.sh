#!/usr/bin/env bash
# kiln-host sessions: a VM that runs many commands, takes and gives files,
# pauses into a real S3 (Swift s3api) and resumes on another kiln-host with
# its files, processes and memory as they were; a damaged snapshot is caught
# on resume; the host that paused a session resumes it from its own copies
# of the chunks (a damaged copy fetched from S3 instead), sealed with a key
# only the manifest in S3 holds; copies a resume elsewhere left go on the
# clean-up kiln-api sends, once past the age limit, or on the sweep once
# another host's pause replaced theirs in S3; a session paused on A and
# destroyed through B leaves nothing on A's disk within a minute (A's sweep
# finds the manifest gone); busy sessions refuse a pause; nothing is left
# behind.
. "$(dirname "$0")/lib.sh"
t_plan 71
require_image
t_require_tools swift-proxy-server memcached python3
t_require_python boto3

S3_DIR=$T_TMP/s3
TOKEN=sess-token-$RANDOM$RANDOM
PA=$((20000 + RANDOM % 10000)); PB=$((PA + 1))
BUCKET=kiln-sessions
pids=()
s3_local_start
before_cg=$(count_cgroups)

start_host() { # NAME PORT
	host_config "$T_TMP/$1.json" "127.0.0.1:$2" "$1" ".run_dir += \"/$1\" | .sessions = {prestart: 1}"
	host_start "$T_TMP/$1.json" "$1"
	pids+=("$host_pid")
	t_serving "http://127.0.0.1:$2/healthz" "$host_pid"
}
# h PORT METHOD PATH [curl args]: body in $T_TMP/last, status echoed
h() {
	local port=$1 m=$2 p=$3; shift 3
	curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "http://127.0.0.1:$port$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
ex() { # PORT JSON: run a command in s1; the result in $T_TMP/last
	h "$1" POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary "$2"
}
s3py() {
	S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY BUCKET=$BUCKET python3 -c '
import os, sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                  aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"],
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
op, key = sys.argv[1], sys.argv[2]
b = os.environ["BUCKET"]
if op == "exists":
    try:
        s3.head_object(Bucket=b, Key=key); print("yes")
    except Exception:
        print("no")
elif op == "manifest":  # the SHA-256 of every chunk a manifest names
    import json
    m = json.loads(s3.get_object(Bucket=b, Key=key)["Body"].read())
    for part in ("state", "disk"):
        for c in m[part]["chunks"]:
            print(c["sha256"])
elif op == "cache_key":  # the key of the pause cache, which only the manifest holds
    import json
    print(json.loads(s3.get_object(Bucket=b, Key=key)["Body"].read()).get("cache_key", ""))
elif op in ("flip", "flipchunk"):  # damage one byte in the middle of the object
    if op == "flipchunk":  # key: a manifest; the object: its last state chunk (the devices,
        import json        # which the latest pause wrote: no other host holds a copy)
        key = json.loads(s3.get_object(Bucket=b, Key=key)["Body"].read())["state"]["chunks"][-1]["key"]
    d = bytearray(s3.get_object(Bucket=b, Key=key)["Body"].read())
    d[len(d) // 2] ^= 0xFF
    s3.put_object(Bucket=b, Key=key, Body=bytes(d))
' "$@"
}
# metric PORT NAME: a value from the host's /metrics
metric() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$1/metrics" | awk -v k="$2" '$1 == k { print $2 }'; }
vcpus_used() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$1/v1/capacity" | jq -r '.vcpus.used + .vcpus.idle'; }

if start_host a "$PA" && start_host b "$PB"; then ok "two kiln-hosts share one S3"
else t_bail "hosts start" "$(tail -3 "$T_TMP/a.err") $(tail -3 "$T_TMP/b.err")"; fi

# --- create, commands, state across commands ---
st=$(h "$PA" POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"s1","customer":"acme","spec":{}}')
check "POST /v1/sessions: 201 running" test "$st" = 201 -a "$(last .state)" = running
check "the session holds a vCPU in the host's capacity" test "$(vcpus_used "$PA")" = 1
st=$(ex "$PA" '{"language":"python","code":"open(\"/work/note.txt\",\"w\").write(\"before\")\nprint(\"hi\")"}')
if [ "$st" = 200 ] && [ "$(last .stdout)" = hi ] && [ "$(last .exit_code)" = 0 ]; then ok "a python command runs and writes a file"
else not_ok "a python command runs and writes a file" "status $st: $(head -c 500 "$T_TMP/last")" "$(tail -5 "$T_TMP/a.err")"; fi
st=$(ex "$PA" '{"argv":["cat","/work/note.txt"]}')
check "a later command sees the earlier one's file" test "$(last .stdout)" = before
st=$(ex "$PA" '{"argv":["sh","-c","exit 3"]}')
check "a command's exit code is reported (failed, 3)" test "$(last .state)" = failed -a "$(last .exit_code)" = 3

st=$(ex "$PA" "{\"language\":\"python\",\"code\":\"import sys\nprint(sys.stdin.read().upper())\",\"stdin_b64\":\"$(printf 'abc\ndef' | base64 -w0)\"}")
check "stdin_b64 becomes the command's stdin (python)" test "$st" = 200 -a "$(last .stdout)" = "$(printf 'ABC\nDEF')"
st=$(ex "$PA" "{\"argv\":[\"wc\",\"-c\"],\"stdin_b64\":\"$(head -c 60000 /dev/zero | base64 -w0)\"}")
check "stdin_b64 of 60 kB reaches wc -c" test "$(last .stdout | tr -d ' ')" = 60000
st=$(ex "$PA" '{"argv":["cat"],"stdin_b64":"a=bc"}')
check "malformed stdin_b64: 400" test "$st" = 400

# A long-lived interpreter holding a value in memory, serving it on a socket.
KV=$'import os, socket\nvalue = "v-%d" % int.from_bytes(os.urandom(4), "big")\ns = socket.socket(socket.AF_UNIX)\ns.bind("/tmp/kv.sock")\ns.listen()\nwhile True:\n    c, _ = s.accept()\n    c.sendall(("%s %d" % (value, os.getpid())).encode())\n    c.close()\n'
st=$(printf '%s' "$KV" | h "$PA" PUT "/v1/sessions/s1/files?path=/work/kv.py" --data-binary @-)
check "PUT a file into the session" test "$st" = 200
st=$(ex "$PA" '{"argv":["sh","-c","python3 /work/kv.py > /dev/null 2>&1 & sleep 1; echo started"]}')
ASK='{"language":"python","code":"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect(\"/tmp/kv.sock\")\nprint(s.recv(100).decode())"}'
st=$(ex "$PA" "$ASK")
kv=$(last .stdout)
check "a background process started by one command still serves the next ($kv)" test "$st" = 200 -a "${kv:0:2}" = v-

head -c 300000 /dev/urandom > "$T_TMP/blob"
h "$PA" PUT "/v1/sessions/s1/files?path=/work/sub/blob.bin" --data-binary @"$T_TMP/blob" > /dev/null
st=$(h "$PA" GET "/v1/sessions/s1/files?path=/work/sub/blob.bin")
check "GET returns a binary file byte for byte (300 kB)" cmp -s "$T_TMP/last" "$T_TMP/blob"
st=$(h "$PA" GET "/v1/sessions/s1/files?path=/work/missing")
check "GET of a missing file: 404" test "$st" = 404
st=$(h "$PA" GET "/v1/sessions/s1/files?dir=/work")
check "GET ?dir= lists a directory" test "$(last '[.entries[] | "\(.name):\(.type)"] | sort | join(",")')" = "kv.py:file,note.txt:file,sub:dir"
st=$(h "$PA" PUT "/v1/sessions/s1/files?path=../etc/x" --data-binary x)
check "a relative or dotted path is refused (400)" test "$st" = 400

# --- whole directories as tar ---
mkdir -p "$T_TMP/tree/sub/deeper"
printf 'alpha\n' > "$T_TMP/tree/a.txt"; head -c 70000 /dev/urandom > "$T_TMP/tree/sub/deeper/r.bin"
printf '#!/bin/sh\necho run\n' > "$T_TMP/tree/sub/x.sh"; chmod 755 "$T_TMP/tree/sub/x.sh"
tar -C "$T_TMP/tree" -cf "$T_TMP/tree.tar" .
st=$(h "$PA" PUT "/v1/sessions/s1/files?dir=/work/up&format=tar" --data-binary @"$T_TMP/tree.tar")
ex "$PA" '{"argv":["sh","-c","cat /work/up/a.txt; /work/up/sub/x.sh; stat -c %U /work/up/sub/deeper/r.bin; ls -a /tmp | grep -c kiln-put"]}' > /dev/null
check "PUT ?dir=&format=tar unpacks the archive as the task user, modes kept, archive removed ($st: $(last .stdout | tr '\n' ' '))" \
	test "$st" = 200 -a "$(last .stdout)" = "$(printf 'alpha\nrun\nsandbox\n0')"
st=$(h "$PA" GET "/v1/sessions/s1/files?dir=/work/up&format=tar")
mkdir -p "$T_TMP/back"; tar -C "$T_TMP/back" -xf "$T_TMP/last" 2> /dev/null
check "GET ?dir=&format=tar: the same tree back ($st)" diff -r "$T_TMP/tree" "$T_TMP/back"
st=$(h "$PA" GET "/v1/sessions/s1/files?dir=/work/nothing-here&format=tar")
check "tar of a missing directory: 404" test "$st" = 404
st=$(h "$PA" PUT "/v1/sessions/s1/files?dir=/work/up2&format=tar" --data-binary 'not a tar archive')
check "PUT of something that is not tar: 400 with tar's message ($(last .error.message | head -c 80))" \
	test "$st" = 400 -a "$(last .error.code)" = invalid_request
ex "$PA" '{"argv":["sh","-c","ls -a /tmp | grep -c kiln-put"]}' > /dev/null
check "a refused archive is removed from the guest too ($(last .stdout))" test "$(last .stdout)" = 0
st=$(h "$PA" GET "/v1/sessions/s1/files?dir=/work&format=zip")
check "format other than tar: 400" test "$st" = 400

# --- interactive commands: a terminal, typed input, resize, end of input ---
# stream_start FILE JSON: exec ?stream=1 in the background (its curl: $spid), waits for its exec id ($xid)
stream_start() {
	t_bg curl -s -m 120 -N -X POST -H "Authorization: Bearer $TOKEN" --data-binary "$2" \
		"http://127.0.0.1:$PA/v1/sessions/s1/exec?stream=1" > "$1"
	spid=$T_BG_PID
	for _ in $(seq 300); do
		grep -q '^event: started' "$1" 2> /dev/null && break
		sleep 0.1
	done
	xid=$(grep -A1 '^event: started' "$1" | sed -n 's/^data: //p' | jq -r .exec_id)
}
input() { h "$PA" POST /v1/sessions/s1/input -H 'Content-Type: application/json' --data-binary "$1"; }
b64() { printf "$1" | base64 -w0; }
# stream_out FILE: what the command wrote so far, decoded exactly
stream_out() { sed -n 's/^data: //p' "$1" | jq -r 'select(.data_b64) | .data_b64' | base64 -d 2> /dev/null; }
wait_for() { # FILE TEXT: until the command's output holds TEXT (30 s)
	for _ in $(seq 300); do stream_out "$1" | grep -q -- "$2" && return 0; sleep 0.1; done; return 1
}
stream_start "$T_TMP/tty" '{"argv":["/bin/bash","--norc","--noprofile","-i"],"tty":{"rows":30,"cols":90},"env":{"PS1":"kiln$ "},"timeout_s":60}'
check "a tty exec's stream starts with the exec id ($xid)" test "${#xid}" = 32
st=$(input "{\"exec_id\":\"$xid\",\"data_b64\":\"$(b64 'echo $((6*7)); stty size; tty\n')\"}")
wait_for "$T_TMP/tty" '^/dev/pts/'
out_has() { stream_out "$1" | grep -q -- "$2"; } # FILE REGEX
check "typed input runs in bash on a 30x90 terminal ($st)" \
	eval 'test "$st" = 200 && out_has "$T_TMP/tty" "^42" && out_has "$T_TMP/tty" "^30 90"'
st=$(input "{\"exec_id\":\"$xid\",\"resize\":{\"rows\":50,\"cols\":132},\"data_b64\":\"$(b64 'stty size\n')\"}")
wait_for "$T_TMP/tty" '^50 132'
check "resize: the command sees the new size ($st)" out_has "$T_TMP/tty" "^50 132"
st=$(input "{\"exec_id\":\"0123456789abcdef0123456789abcdef\",\"data_b64\":\"$(b64 'x')\"}")
check "input naming another exec: 409 no_exec" test "$st" = 409 -a "$(last .error.code)" = no_exec
st=$(input "{\"exec_id\":\"$xid\",\"resize\":{\"rows\":0,\"cols\":80}}")
check "malformed input (rows 0): 400" test "$st" = 400
st=$(h "$PA" POST /v1/sessions/s1/pause)
check "pause while the shell runs: 409 busy" test "$st" = 409
input "{\"exec_id\":\"$xid\",\"data_b64\":\"$(b64 'exit 5\n')\"}" > /dev/null
wait "$spid"
res=$(grep -A1 '^event: result' "$T_TMP/tty" | sed -n 's/^data: //p')
check "exit in the shell ends the exec with its code (5)" test "$(echo "$res" | jq -r .exit_code)" = 5
st=$(input "{\"exec_id\":\"$xid\",\"data_b64\":\"$(b64 'late')\"}")
check "input after the command ended: 409 no_exec" test "$st" = 409

stream_start "$T_TMP/pipe" '{"argv":["tr","a-z","A-Z"],"interactive":true}'
input "{\"exec_id\":\"$xid\",\"data_b64\":\"$(b64 'hello\n')\"}" > /dev/null
st=$(input "{\"exec_id\":\"$xid\",\"data_b64\":\"$(b64 'world')\",\"eof\":true}")
wait "$spid"
res=$(grep -A1 '^event: result' "$T_TMP/pipe" | sed -n 's/^data: //p')
check "interactive (a pipe): input as it comes, eof ends it ($st)" test "$(echo "$res" | jq -r .stdout)" = "$(printf 'HELLO\nWORLD')"
stream_start "$T_TMP/lost" '{"argv":["sleep","3"],"interactive":true}'
printf '{"exec_id":"%s","data_b64":"%s"}' "$xid" "$(head -c 262144 /dev/zero | base64 -w0)" > "$T_TMP/big.json"
codes=""
for _ in 1 2 3 4 5 6; do
	codes="$codes $(h "$PA" POST /v1/sessions/s1/input -H 'Content-Type: application/json' --data-binary @"$T_TMP/big.json")"
done
wait "$spid"
res=$(grep -A1 '^event: result' "$T_TMP/lost" | sed -n 's/^data: //p')
check "1.5 MiB to a command that does not read: accepted or input_full ($codes), the result says stdin_lost" \
	test "$(echo "$res" | jq -r .stdin_lost)" = true -a -z "$(echo "$codes" | tr -d ' ' | sed 's/200//g; s/503//g')"
st=$(ex "$PA" '{"argv":["cat"],"interactive":true,"stdin_b64":"YQ=="}')
check "interactive with stdin_b64: 400" test "$st" = 400
st=$(ex "$PA" '{"argv":["cat"],"tty":{"rows":24}}')
check "tty without cols: 400 naming it ($(last .error.message))" test "$st" = 400

# A client that goes away: its interactive command is killed, the session is free again.
stream_start "$T_TMP/gone" '{"argv":["sh","-c","read x"],"tty":{"rows":24,"cols":80},"timeout_s":300}'
t_stop "$spid"
t0=$(date +%s)
for _ in $(seq 120); do st=$(ex "$PA" '{"argv":["true"]}'); [ "$st" = 200 ] && break; sleep 0.5; done
check "the stream's reader went away: the command is hung up, the next exec runs ($st after $(( $(date +%s) - t0 )) s)" test "$st" = 200
ex "$PA" "$ASK" > /dev/null
check "... and the session's background process was left alone ($(last .stdout))" test "$(last .stdout)" = "$kv"

# --- streaming, busy ---
curl -s -m 60 -N -X POST -H "Authorization: Bearer $TOKEN" --data-binary '{"argv":["sh","-c","echo one; sleep 1; echo two"]}' \
	"http://127.0.0.1:$PA/v1/sessions/s1/exec?stream=1" > "$T_TMP/stream"
check "?stream=1: stdout events, then the result" \
	test "$(grep -c '^event: stdout' "$T_TMP/stream")" -ge 1 -a "$(grep -A1 '^event: result' "$T_TMP/stream" | sed -n 's/^data: //p' | jq -r .stdout)" = "$(printf 'one\ntwo')"
t_bg ex "$PA" '{"argv":["sleep","4"]}' > /dev/null
slow=$T_BG_PID
sleep 1.5
st=$(h "$PA" POST /v1/sessions/s1/pause)
check "pause while a command runs is refused (409 busy), nothing lost" test "$st" = 409 -a "$(last .error.code)" = busy
wait "$slow"
st=$(ex "$PA" "$ASK")
check "after the refused pause the session goes on as before" test "$(last .stdout)" = "$kv"

# --- a QEMU started ahead: after its first session, host B keeps one
# waiting (sessions.prestart), and s1's resume below takes it: the disk
# layer fetched from S3 is copied into the overlay that QEMU holds open ---
st=$(h "$PB" POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"warm","customer":"acme","spec":{}}')
h "$PB" DELETE /v1/sessions/warm > /dev/null
for _ in $(seq 150); do [ "$(metric "$PB" kiln_host_session_prestarted)" = 1 ] && break; sleep 0.2; done
check "host B starts a session QEMU ahead after its first session ($st; /metrics: $(metric "$PB" kiln_host_session_prestarted) waiting)" \
	test "$st" = 201 -a "$(metric "$PB" kiln_host_session_prestarted)" = 1
taken_b=$(metric "$PB" 'kiln_host_session_prestart_total{result="taken"}')
# The QEMU waiting ahead, by its pid: once taken, host B starts the next one
# ahead, and which of the two a search by name finds first is chance.
pre_pid=$(pgrep -f "qemu-system-x86_64.*$T_TMP/spool-b/sessions/\.prestart-" | head -1)
pre_prio() { # PID: the nice values of its threads, then its jail's CPU weight
	local p=$1 cg
	[ -n "$p" ] && [ -d "/proc/$p" ] || { echo none; return; }
	cg=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' /proc/"$p"/cgroup 2>/dev/null)
	echo "$(awk '{print $19}' /proc/"$p"/task/*/stat 2>/dev/null | sort -u | tr '\n' ' ')$(cat "/sys/fs/cgroup/cpu$cg/cpu.shares" 2>/dev/null)"
}
prio=$(pre_prio "$pre_pid")
check "the QEMU waiting ahead runs at nice 19 and CPU weight 15 ($prio)" test "$prio" = "19 15"

# --- pause on A, resume on B ---
st=$(h "$PA" POST /v1/sessions/s1/pause)
pause_json=$(cat "$T_TMP/last"); [ "$st" = 200 ] || echo "# pause: $pause_json"
check "pause: 200 paused, RAM and disk layer in S3 ($(echo "$pause_json" | jq -c .snapshot))" \
	test "$st" = 200 -a "$(last .state)" = paused -a "$(last .snapshot.bytes)" -gt 1000 \
	-a "$(s3py exists acme/sessions/s1/manifest.json)" = yes
check "the paused session is gone from A and its vCPU is free" test "$(h "$PA" GET /v1/sessions/s1)" = 404 -a "$(vcpus_used "$PA")" = 0
st=$(h "$PB" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"other"}')
check "another customer cannot resume it (404)" test "$st" = 404
st=$(h "$PB" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')
check "resume on host B: 200 running" test "$st" = 200 -a "$(last .state)" = running -a "$(last .host_id)" = b
check "... into the QEMU started ahead (taken $taken_b -> $(metric "$PB" 'kiln_host_session_prestart_total{result="taken"}'))" \
	test "$(metric "$PB" 'kiln_host_session_prestart_total{result="taken"}')" = $((taken_b + 1))
prio=$(pre_prio "$pre_pid")
check "... which runs at nice 0 and CPU weight 1024 once taken (pid ${pre_pid:-none}: $prio)" test "$prio" = "0 1024"
st=$(ex "$PB" "$ASK")
check "after resume: the background process and the value in its memory are there ($(last .stdout))" test "$(last .stdout)" = "$kv"
st=$(ex "$PB" '{"argv":["cat","/work/note.txt"]}')
check "after resume: files written before are there" test "$(last .stdout)" = before
h "$PB" GET "/v1/sessions/s1/files?path=/work/sub/blob.bin" > /dev/null
check "after resume: the binary file is intact" cmp -s "$T_TMP/last" "$T_TMP/blob"
head -c 3000000 /dev/urandom > "$T_TMP/after"
h "$PB" PUT "/v1/sessions/s1/files?path=/work/after.bin" --data-binary @"$T_TMP/after" > /dev/null
st=$(ex "$PB" '{"argv":["sh","-c","sync && sha256sum < /work/after.bin"]}')
check "after resume: the disk takes new writes (3 MB put, synced, its sha256 read back in the guest)" \
	test "$st" = 200 -a "$(last .stdout | cut -d' ' -f1)" = "$(sha256sum < "$T_TMP/after" | cut -d' ' -f1)"
st=$(ex "$PB" '{"argv":["sh","-c","date +%s; head -c 16 /dev/urandom | od -An -tx1 | tr -d \" \\n\""]}')
gt=$(last .stdout | head -1); now=$(date +%s)
check "after resume: the guest clock is the host's (±2 s)" test $((gt - now)) -le 2 -a $((now - gt)) -le 2

# --- a damaged snapshot is caught on resume ---
h "$PB" POST /v1/sessions/s1/pause > /dev/null
s3py flipchunk acme/sessions/s1/manifest.json
st=$(h "$PA" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')
check "a damaged paused snapshot is refused on resume (422 snapshot_corrupt: $(last .error.message))" \
	test "$st" = 422 -a "$(last .error.code)" = snapshot_corrupt
check "and the failed resume holds nothing on A" test "$(vcpus_used "$PA")" = 0 -a "$(h "$PA" GET /v1/sessions/s1)" = 404

# --- the pause cache: a host resumes what it paused from its own disk ---
# B paused s1 just above and kept the chunks as they went to S3, sealed
# with the pause's key (in the manifest only) under keyed names; the copy
# of its last state chunk in S3 is damaged now.
cache_b=$T_TMP/spool-b/pause-cache/acme/s1
want=$(s3py manifest acme/sessions/s1/manifest.json | sort -u | tr '\n' ' ')
have=$(ls "$cache_b" 2> /dev/null | sort | tr '\n' ' ')
same=$(comm -12 <(tr ' ' '\n' <<< "$want") <(tr ' ' '\n' <<< "$have") | grep -c .)
check "B's pause cache holds one file per chunk its pause put in S3 ($(echo "$have" | wc -w) of $(echo "$want" | wc -w)), none named by its SHA-256 ($same are)" \
	test -n "$want" -a "$(echo "$have" | wc -w)" = "$(echo "$want" | wc -w)" -a "$same" = 0
magics=$(for f in "$cache_b"/*; do head -c 4 "$f" | tr -c 'A-Za-z0-9' '?'; echo; done | sort | uniq -c | awk '{ print $2 "x" $1 }' | tr '\n' ' ')
check "... each sealed (KPC1, not a zstd frame: $magics), the key only in the manifest in S3" \
	test "$magics" = "KPC1x$(echo "$want" | wc -w) " -a "$(s3py cache_key acme/sessions/s1/manifest.json | wc -c)" = 65 \
	-a "$(grep -rlF "$(s3py cache_key acme/sessions/s1/manifest.json)" "$T_TMP/spool-b" 2> /dev/null | wc -l)" = 0
check "... files 0600 in a directory 0700" test "$(stat -c %a "$cache_b")" = 700 -a \
	"$(find "$cache_b" -type f ! -perm 600 | wc -l)" = 0
st=$(h "$PB" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')
# hits: "N of M chunks from this host's pause cache", kiln-host's last resume line.
hits() { grep -o '[0-9]* of [0-9]* chunks from this host.s pause cache' "$T_TMP/$1.err" | tail -1; }
hit=$(hits b)
check "resume on B, which paused it: 200 from its own copies though S3's last state chunk is damaged ($hit)" \
	test "$st" = 200 -a "$(echo "$hit" | awk '$1 > 0 && $1 == $3 { print "all" }')" = all
st=$(ex "$PB" "$ASK")
check "... with its process and memory intact ($(last .stdout))" test "$(last .stdout)" = "$kv"
# A version 3 manifest's copies stay while the session runs: the layers its
# next pause (a delta) names again.
want=$(s3py manifest acme/sessions/s1/manifest.json | sort -u | wc -l)
check "... and B keeps one copy per chunk of the manifest while it runs ($(ls "$cache_b" | wc -l) of $want)" \
	test "$(ls "$cache_b" | wc -l)" = "$want"
st=$(h "$PB" POST /v1/sessions/s1/pause)
f=$(ls "$cache_b" | head -1)
printf '\x00\x01' | dd of="$cache_b/$f" bs=1 seek=20 conv=notrunc 2> /dev/null
st=$(h "$PB" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')
hit=$(hits b)
check "a damaged copy on B is fetched from S3 instead: 200 ($hit; $(grep -c 'does not open as the chunk the manifest names' "$T_TMP/b.err") said so)" \
	test "$st" = 200 -a "$(grep -c 'does not open as the chunk the manifest names' "$T_TMP/b.err")" = 1 \
	-a "$(echo "$hit" | awk '$1 == $3 - 1 { print "one less" }')" = "one less"
st=$(ex "$PB" "$ASK")
check "... intact ($(last .stdout))" test "$(last .stdout)" = "$kv"
# Paused on B, resumed on A: B's copies stay (no kiln-api here to send B
# the clean-up; the manifest in S3 is still B's pause, so B's sweep keeps
# them). They go once older than sessions.pause_cache_max_age_s: aged here,
# and B restarted (its start prunes).
h "$PB" POST /v1/sessions/s1/pause > /dev/null
h "$PA" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}' > /dev/null
stale=$(find "$T_TMP/spool-b/pause-cache" -type f | wc -l)
find "$T_TMP/spool-b/pause-cache" -type f -exec touch -d '2 hours ago' {} +
t_stop "${pids[1]}"
pids=("${pids[0]}")
start_host b "$PB"
check "copies a resume elsewhere left behind ($stale on B) go once past the age limit (B restarted)" \
	test "$stale" -gt 0 -a "$(find "$T_TMP/spool-b/pause-cache" -type f | wc -l)" = 0
# Paused on A for the rest.
h "$PA" POST /v1/sessions/s1/pause > /dev/null
check "A kept the chunks of its own pause" test "$(ls "$T_TMP/spool-a/pause-cache/acme/s1" 2> /dev/null | wc -l)" -gt 0

# --- kiln-api's clean-up after a resume elsewhere ---
h "$PA" POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"s3","customer":"acme","spec":{}}' > /dev/null
h "$PA" POST /v1/sessions/s3/pause > /dev/null
h "$PB" POST /v1/sessions/s3/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}' > /dev/null
n3=$(ls "$T_TMP/spool-a/pause-cache/acme/s3" 2> /dev/null | wc -l)
st=$(h "$PA" DELETE "/v1/sessions/s3/pause-cache?customer=acme")
check "DELETE /v1/sessions/s3/pause-cache on A, where it paused before resuming on B: A's $n3 copies go ($st $(last .dropped))" \
	test "$n3" -gt 0 -a "$st" = 200 -a "$(last .dropped)" = true -a ! -e "$T_TMP/spool-a/pause-cache/acme/s3" \
	-a "$(h "$PB" GET /v1/sessions/s3)" = 200
st=$(h "$PA" DELETE "/v1/sessions/s3/pause-cache")
check "... without ?customer=: 400" test "$st" = 400
# s3 paused on B, then resumed and paused on A: B's copies are of a pause
# the manifest in S3 no longer names (A's now).
h "$PB" POST /v1/sessions/s3/pause > /dev/null
h "$PA" POST /v1/sessions/s3/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}' > /dev/null
h "$PA" POST /v1/sessions/s3/pause > /dev/null
nb3=$(ls "$T_TMP/spool-b/pause-cache/acme/s3" 2> /dev/null | wc -l)

# --- delete through the other host: the pausing host's copies go within a minute ---
na=$(ls "$T_TMP/spool-a/pause-cache/acme/s1" 2> /dev/null | wc -l)
st=$(h "$PB" DELETE "/v1/sessions/s1?customer=acme")
check "DELETE through B of the session A paused removes the paused snapshot from S3" test "$st" = 200 \
	-a "$(s3py exists acme/sessions/s1/manifest.json)" = no
t0=$(date +%s)
while { [ -e "$T_TMP/spool-a/pause-cache/acme/s1" ] || [ -e "$T_TMP/spool-b/pause-cache/acme/s3" ]; } &&
	[ $(($(date +%s) - t0)) -lt 75 ]; do sleep 1; done
gone_s=$(($(date +%s) - t0))
check "... and A's $na copies go within a minute, A's sweep finding the manifest gone ($gone_s s: $(grep -o 'pause cache: removed the copies of [0-9]* session.*' "$T_TMP/a.err" | tail -1))" \
	test "$na" -gt 0 -a ! -e "$T_TMP/spool-a/pause-cache/acme/s1" -a "$gone_s" -le 61
check "B's $nb3 copies of s3, whose manifest is A's pause now, go on B's sweep within that minute too" \
	test "$nb3" -gt 0 -a ! -e "$T_TMP/spool-b/pause-cache/acme/s3" -a "$(s3py exists acme/sessions/s3/manifest.json)" = yes

# --- a stale copy goes without its snapshot (keep_snapshot=1) ---
h "$PA" POST /v1/sessions/s3/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}' > /dev/null
st=$(h "$PA" DELETE "/v1/sessions/s3?keep_snapshot=1")
check "DELETE ?keep_snapshot=1 destroys the copy here and keeps the paused snapshot" \
	test "$st" = 200 -a "$(h "$PA" GET /v1/sessions/s3)" = 404 -a "$(s3py exists acme/sessions/s3/manifest.json)" = yes
h "$PA" DELETE "/v1/sessions/s3?customer=acme" > /dev/null
h "$PA" POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"s2","customer":"acme","spec":{}}' > /dev/null
st=$(h "$PA" DELETE /v1/sessions/s2)
check "DELETE of a running session: destroyed, capacity back" test "$st" = 200 -a "$(vcpus_used "$PA")" = 0

for p in "${pids[@]}"; do kill "$p"; done
for p in "${pids[@]}"; do wait "$p" 2> /dev/null; done
pids=()
check "nothing left: no QEMU, VM directories, session files or cgroups" \
	test "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR" -mindepth 2 | wc -l)" = 0 \
	-a "$(find "$T_TMP/spool-a/sessions" "$T_TMP/spool-b/sessions" -mindepth 1 2> /dev/null | wc -l)" = 0 \
	-a "$(find "$T_TMP/spool-a/pause-cache" "$T_TMP/spool-b/pause-cache" -type f 2> /dev/null | wc -l)" = 0 \
	-a "$(count_cgroups)" = "$before_cg"
t_done
