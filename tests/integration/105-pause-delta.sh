#!/usr/bin/env bash
# Delta pauses (manifest version 3, docs/architecture.md "Pause"): a session
# holding 16 MiB of random bytes in a process pauses whole, then every pause
# after a resume sends only the pages that changed, layered over the chunks
# already in S3. Two kiln-hosts on one local S3: the layers resume on the
# other host (from S3) and on the same one (its pause cache); the process's
# bytes hash the same after every resume, and after changes made on either
# host; an unchanged session's re-pause sends a small fraction of the first;
# past PAUSE_DELTA_MAX layers the pause is whole again; no object in S3 is
# left that the manifest does not name; DELETE removes them all; nothing is
# left on the hosts.
. "$(dirname "$0")/lib.sh"
t_plan 16
require_image
t_require_tools swift-proxy-server memcached python3
t_require_python boto3

S3_DIR=$T_TMP/s3
TOKEN=delta-token-$RANDOM$RANDOM
PA=$((20000 + RANDOM % 10000)); PB=$((PA + 1))
BUCKET=kiln-delta
pids=()
s3_local_start
before_cg=$(count_cgroups)
start_host() { # NAME PORT
	host_config "$T_TMP/$1.json" "127.0.0.1:$2" "$1" ".run_dir += \"/$1\""
	host_start "$T_TMP/$1.json" "$1"
	pids+=("$host_pid")
	t_serving "http://127.0.0.1:$2/healthz" "$host_pid"
}
h() { # PORT METHOD PATH [curl args]: body in $T_TMP/last, status echoed
	local port=$1 m=$2 p=$3; shift 3
	curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "http://127.0.0.1:$port$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
s3l() { S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY BUCKET=$BUCKET \
	python3 "$ROOT/tests/integration/s3_layers.py" "$@"; }
# ask PORT WORD: the holder's answer (hash of its bytes, after WORD's change)
ask() {
	h "$1" POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary \
		"{\"language\":\"python\",\"code\":\"import socket\\ns = socket.socket(socket.AF_UNIX)\\ns.connect(\\\"/tmp/h.sock\\\")\\ns.sendall(b\\\"$2\\\")\\nprint(s.recv(200).decode())\"}" > /dev/null
	last .stdout
}
pause() { h "$1" POST /v1/sessions/s1/pause > /dev/null; echo "$(last .state) $(last .snapshot.bytes)"; }
resume() { h "$1" POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}'; }
fields() { s3l fields acme/sessions/s1/manifest.json; }

if start_host a "$PA" && start_host b "$PB"; then ok "two kiln-hosts share one S3"
else t_bail "hosts start" "$(tail -3 "$T_TMP/a.err") $(tail -3 "$T_TMP/b.err")"; fi

# A process holding 16 MiB of random bytes; "hash" answers their SHA-256,
# "mutate" rewrites 2 MiB of them first (at a place that moves each time).
HOLD=$'import hashlib, os, socket\nb = bytearray(os.urandom(16 << 20))\nn = 0\ns = socket.socket(socket.AF_UNIX)\ns.bind("/tmp/h.sock")\ns.listen()\nwhile True:\n    c, _ = s.accept()\n    if c.recv(16) == b"mutate":\n        at = (n * (3 << 20)) % (14 << 20)\n        b[at:at + (2 << 20)] = os.urandom(2 << 20)\n        n += 1\n    c.sendall(hashlib.sha256(b).hexdigest().encode())\n    c.close()\n'
h "$PA" POST /v1/sessions -H 'Content-Type: application/json' --data-binary '{"id":"s1","customer":"acme","spec":{}}' > /dev/null
printf '%s' "$HOLD" | h "$PA" PUT "/v1/sessions/s1/files?path=/work/hold.py" --data-binary @- > /dev/null
h "$PA" POST /v1/sessions/s1/exec -H 'Content-Type: application/json' \
	--data-binary '{"argv":["sh","-c","python3 /work/hold.py > /dev/null 2>&1 & sleep 2; echo started"]}' > /dev/null
want=$(ask "$PA" hash)
check "a process in s1 holds 16 MiB of random bytes (sha256 ${want:0:12})" test "${#want}" = 64

read -r st full_bytes <<< "$(pause "$PA")"
check "the first pause is whole: $full_bytes bytes, manifest version 3 depth 0 ($(fields))" \
	test "$st" = paused -a "$full_bytes" -gt $((16 << 20)) -a "$(fields | cut -d' ' -f1,2)" = "3 0"
st=$(resume "$PA")
got=$(ask "$PA" hash)
check "resumed on A: the bytes hash the same" test "$st" = 200 -a "$got" = "$want"

read -r st delta_bytes <<< "$(pause "$PA")"
check "re-pause with nothing changed: a delta of $delta_bytes bytes (the first: $full_bytes), depth 1 ($(fields); $(grep -o 'a delta over.*' "$T_TMP/a.err" | tail -1))" \
	test "$st" = paused -a "$delta_bytes" -lt $((full_bytes / 8)) -a "$(fields | cut -d' ' -f1,2)" = "3 1"
st=$(resume "$PB")
got=$(ask "$PB" hash)
check "the layers resume on B, from S3: the bytes hash the same" test "$st" = 200 -a "$got" = "$want"

want=$(ask "$PB" mutate)
read -r st b_bytes <<< "$(pause "$PB")"
check "2 MiB changed on B: its pause is a delta of $b_bytes bytes, depth 2 ($(fields))" \
	test "$st" = paused -a "$b_bytes" -gt $((2 << 20)) -a "$b_bytes" -lt $((full_bytes / 2)) \
	-a "$(fields | cut -d' ' -f1,2)" = "3 2"
st=$(resume "$PA")
got=$(ask "$PA" hash)
check "resumed on A (its cache holds the first layers, S3 the rest): the changed bytes hash as on B" \
	test "$st" = 200 -a "$got" = "$want"

# More changes and pauses: depth 3 to 8 (PAUSE_DELTA_MAX), then whole
# again; every other resume on the other host.
ok_all=1; depths=; cur=$PA
for i in 3 4 5 6 7 8 9; do
	want=$(ask "$cur" mutate)
	pause "$cur" > /dev/null
	depths="$depths $(fields | cut -d' ' -f2)"
	[ $((i % 2)) = 0 ] && { [ "$cur" = "$PA" ] && cur=$PB || cur=$PA; }
	resume "$cur" > /dev/null
	[ "$(ask "$cur" hash)" = "$want" ] || ok_all=0
done
check "pauses and resumes across both hosts, a change before each: the bytes hash as written every time; depths$depths" \
	test "$ok_all" = 1
check "... past 8 layers a pause is whole again (depth 0 seen)" grep -qw 0 <<< "$depths"
other=$PB; [ "$cur" = "$PB" ] && other=$PA
h "$cur" POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary '{"argv":["sh","-c","head -c 1000000 /dev/urandom > /work/f && sync && sha256sum /work/f"]}' > /dev/null
fsum=$(last .stdout | cut -d' ' -f1)
pause "$cur" > /dev/null
resume "$other" > /dev/null
h "$other" POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary '{"argv":["sha256sum","/work/f"]}' > /dev/null
check "a file written before a pause is there after it on the other host (disk layer; ${fsum:0:12})" \
	test -n "$fsum" -a "$(last .stdout | cut -d' ' -f1)" = "$fsum"

pause "$other" > /dev/null
for _ in $(seq 50); do [ -z "$(s3l orphans acme/sessions/s1/)" ] && break; sleep 0.1; done
orph=$(s3l orphans acme/sessions/s1/ | wc -l)
check "every object under the session's prefix is named by its manifest ($orph not; $(s3l count acme/sessions/s1/) objects)" \
	test "$orph" = 0
st=$(resume "$PB")
check "... and the session resumes from them ($(ask "$PB" hash | head -c 12))" test "$st" = 200 -a "$(ask "$PB" hash)" = "$want"
h "$PB" DELETE "/v1/sessions/s1?customer=acme" > /dev/null
# A's copies of the pauses it made (kiln-api would tell it to drop them
# when the session resumed elsewhere; its sweep would, within a minute).
h "$PA" DELETE "/v1/sessions/s1?customer=acme" > /dev/null
for _ in $(seq 50); do [ "$(s3l count acme/sessions/s1/)" = 0 ] && break; sleep 0.1; done
check "DELETE removes every object of the session ($(s3l count acme/sessions/s1/) left)" test "$(s3l count acme/sessions/s1/)" = 0
st=$(h "$PA" GET /v1/sessions/s1)
check "no host holds the session" test "$st" = 404 -a "$(h "$PB" GET /v1/sessions/s1)" = 404

for p in "${pids[@]}"; do kill "$p"; done
for p in "${pids[@]}"; do wait "$p" 2> /dev/null; done
pids=()
check "nothing left: no QEMU, VM directories, session files, pause-cache files or cgroups" \
	test "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR" -mindepth 2 | wc -l)" = 0 \
	-a "$(find "$T_TMP/spool-a/sessions" "$T_TMP/spool-b/sessions" -mindepth 1 2> /dev/null | wc -l)" = 0 \
	-a "$(find "$T_TMP/spool-a/pause-cache" "$T_TMP/spool-b/pause-cache" -type f 2> /dev/null | wc -l)" = 0 \
	-a "$(count_cgroups)" = "$before_cg"
t_done
