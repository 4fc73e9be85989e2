#!/usr/bin/env bash
# The E2B-compatible protocol with curl through kiln-api (no SDK): the
# control API's answers and errors in E2B's shape; Connect framing of a
# process.Process/Start stream (flag byte, big-endian length, JSON events,
# the end-of-stream message last), keepalives, a Connect-Timeout-Ms deadline;
# unary error codes and HTTP statuses (not_found, already_exists,
# invalid_argument, unauthenticated, unavailable while paused); the
# X-Access-Token and Authorization (user) headers; /files: multipart with two
# parts, a part without filename when path is given, binary data strewn with
# CRLF and boundary-like bytes, a raw octet-stream body, a malformed body
# (400), a body over kiln-api's max_body_mib (413), a missing file (404), a
# directory (400); one path per upload (400 for a second part to it); gzip
# bodies (octet-stream and multipart, sha256 equal), a gzip bomb past
# max_body_mib (413), gzip downloads; X-Metadata-* written, listed, moved,
# cleared on overwrite, bounded; pause, connect, kill; nothing left behind.
# The SDK itself: 92-e2b-sdk.sh.
. "$(dirname "$0")/lib.sh"
t_plan 82
require_image
. "$ROOT/tests/e2b/stack.sh"
e2b_require
PY=/usr/bin/python3
WIRE="$PY $ROOT/tests/e2b/wire.py"

before_cg=$(count_cgroups)
before_mounts=$(count_mounts)
# A small body cap, so that 413 costs 3 MiB.
e2b_stack_start '. + {max_body_mib: 2}'

# e2b KEY METHOD PATH [curl args]: the control API; body in $T_TMP/last, status echoed
e2b() {
	local key=$1 m=$2 p=$3; shift 3
	curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" ${key:+-H "X-API-KEY: $key"} "$@" "$URL/e2b$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
expect() { # NAME STATUS GOT [jq condition]
	local name=$1 want=$2 got=$3 cond=${4:-true}
	if [ "$got" = "$want" ] && [ "$(last "$cond")" = true ]; then ok "$name"
	else not_ok "$name" "status $got (want $want), body: $(head -c 600 "$T_TMP/last")"; fi
}
# envd PATH [curl args]: through the relay as the sandbox's owner; body in
# $T_TMP/last, headers in $T_TMP/hdr, status echoed. SID/TOK overridable.
envd() {
	local p=$1; shift
	curl -s -m 120 -o "$T_TMP/last" -D "$T_TMP/hdr" -w '%{http_code}' \
		${SID:+-H "E2b-Sandbox-Id: $SID"} ${TOK:+-H "X-Access-Token: $TOK"} "$@" "$URL$p"
}
rpc() { # METHOD JSON [curl args]: a unary Connect call
	local m=$1 j=$2; shift 2
	envd "/$m" -X POST -H 'Content-Type: application/json' -H 'Connect-Protocol-Version: 1' --data-binary "$j" "$@"
}
# stream METHOD JSON [curl args]: a server-streaming call; the raw answer in
# $T_TMP/last, its frames (one JSON line each) in $T_TMP/frames; status echoed.
stream() {
	local m=$1 j=$2 st; shift 2
	$WIRE envelope "$j" > "$T_TMP/req.bin"
	st=$(envd "/$m" -X POST -H 'Content-Type: application/connect+json' -H 'Connect-Protocol-Version: 1' \
		--data-binary @"$T_TMP/req.bin" "$@")
	$WIRE frames "$T_TMP/last" > "$T_TMP/frames" 2> "$T_TMP/frames.err" || echo "bad: $(cat "$T_TMP/frames.err")" > "$T_TMP/frames"
	echo "$st"
}
frames() { jq -sr "$1" "$T_TMP/frames" 2> /dev/null; }
same() { cmp -s "$1" "$2" && echo same; }
b64() { printf '%s' "$1" | base64 -w0; }
header() { tr -d '\r' < "$T_TMP/hdr" | sed -n "s/^$1: *//Ip" | tail -n 1; }

# ---- control API ----
st=$(e2b "$KA" POST /v2/sandboxes -H 'Content-Type: application/json' \
	--data '{"templateID":"base","timeout":900,"envVars":{"E2B_T":"ninety-three"},"metadata":{"t":"93"}}')
expect "POST /e2b/v2/sandboxes: 201 {sandboxID, templateID, clientID, envdVersion, envdAccessToken (64 hex), domain: null}" 201 "$st" \
	'(.sandboxID | length > 0) and (.envdAccessToken | test("^[0-9a-f]{64}$")) and .envdVersion == "0.6.2" and .domain == null and (.clientID | length > 0) and (.templateID | length > 0)'
SID=$(last .sandboxID)
TOK=$(last .envdAccessToken)
st=$(e2b "$KA" GET "/sandboxes/$SID")
expect "GET /e2b/sandboxes/ID: running, its metadata and the same token" 200 "$st" \
	".state == \"running\" and .metadata.t == \"93\" and .envdAccessToken == \"$TOK\" and .sandboxID == \"$SID\""
st=$(e2b "" GET "/sandboxes/$SID"); expect "no X-API-KEY: 401 {code: 401, message}" 401 "$st" '.code == 401 and (.message | length > 0)'
st=$(e2b "kiln_wrong_key" GET /v2/sandboxes); expect "a wrong X-API-KEY: 401" 401 "$st" '.code == 401'
st=$(e2b "$KB" GET "/sandboxes/$SID"); expect "another customer's key: 404 {code: 404}" 404 "$st" '.code == 404'
st=$(e2b "$KB" GET /v2/sandboxes); expect "... whose list does not show it" 200 "$st" "[.[].sandboxID] | index(\"$SID\") == null"
st=$(e2b "$KA" GET /v2/sandboxes); expect "the owner's list shows it, without its token" 200 "$st" \
	"[.[] | select(.sandboxID == \"$SID\")] | length == 1 and (.[0].envdAccessToken == null)"
st=$(e2b "$KA" GET /sandboxes/nosuchsandbox); expect "an unknown sandbox: 404" 404 "$st" '.code == 404'
st=$(e2b "$KA" POST /v2/sandboxes -H 'Content-Type: application/json' --data '{"templateID": 7')
expect "a malformed create body: 400" 400 "$st" '.code == 400'

# ---- envd: health, Start framing ----
check "GET /health through the relay: 204" [ "$(envd /health)" = 204 ]
st=$(stream process.Process/Start \
	'{"process":{"cmd":"/bin/sh","args":["-c","printf \"a\\nb\"; echo err >&2; exit 5"]}}')
ct=$(header content-type)
check "Start: 200, application/connect+json ($ct)" [ "$st" = 200 -a "$ct" = application/connect+json ]
if [ "$(frames '[.[].flag] | (.[:-1] | all(. == 0)) and .[-1] == 2')" = true ] &&
   [ "$(frames '.[-1].msg == {}')" = true ]; then
	ok "Start: well-formed frames (flag, big-endian length, JSON), the end-of-stream message {} last ($(wc -l < "$T_TMP/frames") frames)"
else not_ok "Start framing" "$(head -c 800 "$T_TMP/frames")"; fi
check "Start: the first event is start{pid}" [ "$(frames '.[0].msg.event.start.pid > 0')" = true ]
out=$(frames '[.[].msg.event.data.stdout // empty] | join("")' | base64 -d 2> /dev/null)
err=$(frames '[.[].msg.event.data.stderr // empty] | join("")' | base64 -d 2> /dev/null)
check "Start: data{stdout|stderr} in base64 (stdout '${out//$'\n'/\\n}', stderr '${err//$'\n'/\\n}')" \
	[ "$out" = "$(printf 'a\nb')" -a "$err" = err ]
check "Start: end{exitCode 5, exited, status 'exit status 5'} before the end of stream" \
	[ "$(frames '[.[].msg.event.end // empty][0] | .exitCode == 5 and .exited == true and .status == "exit status 5"')" = true \
	-a "$(frames 'map(.msg.event.end != null) | index(true) == length - 2')" = true ]

st=$(stream process.Process/Start '{"process":{"cmd":"/bin/sh","args":["-c","echo \"$E2B_T $X\"; pwd; whoami"],"envs":{"X":"why"},"cwd":"/tmp"}}' \
	-H "Authorization: Basic $(b64 root:)")
out=$(frames '[.[].msg.event.data.stdout // empty] | join("")' | base64 -d 2> /dev/null)
check "Start: the sandbox's envVars and the request's envs, cwd, Authorization Basic root: (${out//$'\n'/ })" \
	[ "$out" = "$(printf 'ninety-three why\n/tmp\nroot')" ]
st=$(stream process.Process/Start '{"process":{"cmd":"whoami"}}')
out=$(frames '[.[].msg.event.data.stdout // empty] | join("")' | base64 -d 2> /dev/null)
check "Start without Authorization: user 'user', argv[0] searched in PATH ($out)" [ "$out" = user ]

st=$(stream process.Process/Start '{"process":{"cmd":"/bin/sh","args":["-c","sleep 2.5; echo k"]}}' -H 'Keepalive-Ping-Interval: 1')
check "Keepalive-Ping-Interval 1: keepalive events during 2.5 s of silence ($(frames '[.[] | select(.msg.event.keepalive != null)] | length'))" \
	[ "$(frames '[.[] | select(.msg.event.keepalive != null)] | length >= 1')" = true ]

s=$(date +%s%N)
st=$(stream process.Process/Start '{"process":{"cmd":"sleep","args":["39"]}}' -H 'Connect-Timeout-Ms: 1500')
ms=$((($(date +%s%N) - s) / 1000000))
check "Connect-Timeout-Ms 1500: the stream ends with deadline_exceeded after ${ms} ms" \
	[ "$(frames '.[-1].flag == 2 and .[-1].msg.error.code == "deadline_exceeded"')" = true -a "$ms" -lt 10000 ]
sleep 0.5
st=$(rpc process.Process/List '{}')
check "List: 200 application/json; the timed-out sleep is gone (killed)" \
	[ "$st" = 200 -a "$(header content-type)" = application/json \
	-a "$(last '[.processes[] | select(.config.args == ["39"])] | length')" = 0 ]

# ---- unary errors ----
st=$(rpc process.Process/SendInput "{\"process\":{\"pid\":999999},\"input\":{\"stdin\":\"$(b64 x)\"}}")
check "SendInput to an unknown pid: 404 not_found ($st $(last .code))" [ "$st" = 404 -a "$(last .code)" = not_found ]
st=$(rpc process.Process/SendSignal '{"process":{"pid":999999},"signal":"SIGNAL_SIGKILL"}')
check "SendSignal to an unknown pid: 404 not_found" [ "$st" = 404 -a "$(last .code)" = not_found ]
st=$(stream process.Process/Connect '{"process":{"pid":999999}}')
check "Connect to an unknown pid: not_found (HTTP $st)" \
	[ "$st:$(last .code)" = 404:not_found -o "$st:$(frames '.[-1].msg.error.code')" = 200:not_found ]
st=$(rpc filesystem.Filesystem/Stat '{"path":"/home/user/no/such/file"}')
check "Stat of a missing path: 404 not_found" [ "$st" = 404 -a "$(last .code)" = not_found ]
st=$(rpc filesystem.Filesystem/MakeDir '{"path":"/tmp"}')
check "MakeDir of an existing directory: 409 already_exists" [ "$st" = 409 -a "$(last .code)" = already_exists ]
st=$(rpc filesystem.Filesystem/Stat '{"path": "/tmp"')
check "a malformed JSON request: 400 invalid_argument ($st $(last .code))" [ "$st" = 400 -a "$(last .code)" = invalid_argument ]
st=$(rpc filesystem.Filesystem/Stat '{"path":"/root"}')
check "Stat as user works; the EntryInfo has E2B's fields" \
	[ "$st" = 200 -a "$(last '.entry | .type == "FILE_TYPE_DIRECTORY" and .path == "/root" and .owner == "root" and (.permissions | startswith("d")) and (.size | type) == "string"')" = true ]
st=$(rpc filesystem.Filesystem/ListDir '{"path":"/root","depth":1}')
check "ListDir of /root as user: 403 permission_denied ($st $(last .code))" [ "$st" = 403 -a "$(last .code)" = permission_denied ]

bad=""
for how in "TOK=$(printf 'f%.0s' $(seq 64))" "TOK=" "SID=nosuchsandbox"; do
	st=$(eval "$how"; rpc filesystem.Filesystem/Stat '{"path":"/tmp"}')
	[ "$st" = 401 ] && [ "$(last .code)" = unauthenticated ] || bad="$bad [$how: $st $(last .code)]"
done
check "a wrong token, no token, an unknown sandbox: 401 unauthenticated${bad:+:$bad}" [ -z "$bad" ]
st=$(SID='' rpc filesystem.Filesystem/Stat '{"path":"/tmp"}')
check "no E2b-Sandbox-Id: refused ($st)" [ "$st" = 401 -o "$st" = 400 ]
st=$(TOK=wrong envd "/files?path=/etc/hostname")
check "GET /files with a wrong token: 401" [ "$st" = 401 ]
st=$(TOK=wrong stream process.Process/Start '{"process":{"cmd":"true"}}')
check "Start with a wrong token: 401 unauthenticated, nothing runs" [ "$st" = 401 -a "$(last .code)" = unauthenticated ]

# ---- /files ----
B=kilnBoundary$RANDOM$RANDOM
printf 'alpha\n' > "$T_TMP/a.txt"
head -c 70000 /dev/urandom > "$T_TMP/b.bin"
$WIRE multipart "$B" "$T_TMP/two.body" "name=file;filename=/home/user/mp/a.txt:@$T_TMP/a.txt" \
	"name=file;filename=mp/sub/b.bin:@$T_TMP/b.bin"
st=$(envd "/files" -X POST -H "Content-Type: multipart/form-data; boundary=$B" --data-binary @"$T_TMP/two.body")
check "multipart, two parts, no path (the filenames are the paths): 200 with both ($(last 'map(.path) | join(" ")'))" \
	[ "$st" = 200 -a "$(last '(map(.path) | sort) == ["/home/user/mp/a.txt", "/home/user/mp/sub/b.bin"] and all(.[]; .type == "file")')" = true ]
envd "/files?path=/home/user/mp/a.txt" > /dev/null; cmp -s "$T_TMP/last" "$T_TMP/a.txt"; ra=$?
envd "/files?path=/home/user/mp/sub/b.bin" > /dev/null; cmp -s "$T_TMP/last" "$T_TMP/b.bin"; rb=$?
check "... both read back byte for byte" [ "$ra" = 0 -a "$rb" = 0 ]
st=$(rpc filesystem.Filesystem/Stat '{"path":"/home/user/mp/sub/b.bin"}')
check "... owned by user, size as a string ($(last '.entry | "\(.owner) \(.size)"'))" \
	[ "$(last '.entry.owner == "user" and .entry.size == "70000"')" = true ]

$WIRE multipart "$B" "$T_TMP/nofn.body" "name=file:@$T_TMP/a.txt"
st=$(envd "/files?path=/home/user/nofn.txt&username=root" -X POST -H "Content-Type: multipart/form-data; boundary=$B" --data-binary @"$T_TMP/nofn.body")
check "a part without filename, path given (username=root): 200, written there" \
	[ "$st" = 200 -a "$(last '.[0].path')" = /home/user/nofn.txt ]
rpc filesystem.Filesystem/Stat '{"path":"/home/user/nofn.txt"}' > /dev/null
check "... owned by root" [ "$(last .entry.owner)" = root ]

$WIRE tricky "$T_TMP/tricky.bin" "$B" 300000
$WIRE multipart "$B" "$T_TMP/tricky.body" "name=file;filename=ignored.bin:@$T_TMP/tricky.bin"
st=$(envd "/files?path=/home/user/tricky.bin" -X POST -H "Content-Type: multipart/form-data; boundary=$B" --data-binary @"$T_TMP/tricky.body")
envd "/files?path=/home/user/tricky.bin" > /dev/null
check "binary data with CRLF, '--' and boundary-like bytes at buffer edges: 200, read back byte for byte ($st)" \
	[ "$st" = 200 -a "$(same "$T_TMP/last" "$T_TMP/tricky.bin")" = same ]
st=$(envd "/files?path=/home/user/raw.bin" -X POST -H 'Content-Type: application/octet-stream' --data-binary @"$T_TMP/tricky.bin")
envd "/files?path=/home/user/raw.bin" > /dev/null
check "application/octet-stream (the raw bytes): 200, read back byte for byte ($st)" \
	[ "$st" = 200 -a "$(same "$T_TMP/last" "$T_TMP/tricky.bin")" = same ]

printf -- '--%s\r\nContent-Disposition: form-data; name="file"; filename="x"\r\n\r\nno closing delimiter' "$B" > "$T_TMP/bad.body"
st=$(envd "/files?path=/home/user/bad.txt" -X POST -H "Content-Type: multipart/form-data; boundary=$B" --data-binary @"$T_TMP/bad.body")
check "a malformed multipart body (no closing delimiter): 400 ($st)" [ "$st" = 400 ]
printf 'garbage' > "$T_TMP/bad2.body"
st=$(envd "/files?path=/home/user/bad2.txt" -X POST -H "Content-Type: multipart/form-data" --data-binary @"$T_TMP/bad2.body")
check "multipart without a boundary: 400 ($st)" [ "$st" = 400 ]
head -c $((3 << 20)) /dev/zero > "$T_TMP/big.bin"
$WIRE multipart "$B" "$T_TMP/big.body" "name=file;filename=big.bin:@$T_TMP/big.bin"
st=$(envd "/files?path=/home/user/big.bin" -X POST -H "Content-Type: multipart/form-data; boundary=$B" --data-binary @"$T_TMP/big.body")
check "a body over max_body_mib (3 MiB > 2): 413 ($st)" [ "$st" = 413 ]
rpc filesystem.Filesystem/Stat '{"path":"/home/user/big.bin"}' > /dev/null
check "... and nothing was written" [ "$(last .code)" = not_found ]

# ---- /files: several parts, gzip, metadata (E2B's envd 0.6.2) ----
$WIRE multipart "$B" "$T_TMP/dup.body" "name=file;filename=/home/user/dup/a.txt:@$T_TMP/a.txt" \
	"name=file;filename=/home/user/dup/b.txt:@$T_TMP/a.txt"
st=$(envd "/files?path=/home/user/dup/one.txt" -X POST -H "Content-Type: multipart/form-data; boundary=$B" --data-binary @"$T_TMP/dup.body")
check "two parts with ?path= (one path for both, as E2B's envd): 400 naming the path ($st)" \
	[ "$st" = 400 -a "$(last '.message | test("same path")')" = true ]
$WIRE multipart "$B" "$T_TMP/dup2.body" "name=file;filename=/home/user/dup/c.txt:@$T_TMP/a.txt" \
	"name=file;filename=/home/user/dup/c.txt:@$T_TMP/b.bin"
st=$(envd "/files" -X POST -H "Content-Type: multipart/form-data; boundary=$B" --data-binary @"$T_TMP/dup2.body")
envd "/files?path=/home/user/dup/c.txt" > /dev/null
check "two parts named alike: 400, the first part's file stays ($st)" [ "$st" = 400 ] && cmp -s "$T_TMP/last" "$T_TMP/a.txt"
head -c 700000 /dev/urandom > "$T_TMP/gz.bin"; printf 'text %.0s' $(seq 20000) >> "$T_TMP/gz.bin"
gzip -c < "$T_TMP/gz.bin" > "$T_TMP/gz.bin.gz"
st=$(envd "/files?path=/home/user/gz/raw.bin" -X POST -H 'Content-Type: application/octet-stream' -H 'Content-Encoding: gzip' \
	--data-binary @"$T_TMP/gz.bin.gz")
envd "/files?path=/home/user/gz/raw.bin" > /dev/null
check "Content-Encoding: gzip, octet-stream (the SDK's gzip: true): 200, sha256 of what is read back equal ($st)" \
	[ "$st" = 200 -a "$(sha256sum < "$T_TMP/last")" = "$(sha256sum < "$T_TMP/gz.bin")" ]
$WIRE multipart "$B" "$T_TMP/gzmp.body" "name=file;filename=/home/user/gz/mp-a.txt:@$T_TMP/a.txt" \
	"name=file;filename=/home/user/gz/mp-b.bin:@$T_TMP/gz.bin"
gzip -c < "$T_TMP/gzmp.body" > "$T_TMP/gzmp.body.gz"
st=$(envd "/files" -X POST -H "Content-Type: multipart/form-data; boundary=$B" -H 'Content-Encoding: gzip' --data-binary @"$T_TMP/gzmp.body.gz")
paths=$(last 'map(.path) | sort | join(" ")')
envd "/files?path=/home/user/gz/mp-b.bin" > /dev/null
check "a gzip multipart body with two parts: 200, both at their paths, read back equal ($st $paths)" \
	[ "$st" = 200 -a "$paths" = "/home/user/gz/mp-a.txt /home/user/gz/mp-b.bin" ] && cmp -s "$T_TMP/last" "$T_TMP/gz.bin"
head -c $((3 << 20)) /dev/zero | gzip -c > "$T_TMP/bomb.gz"
st=$(envd "/files?path=/home/user/gz/bomb.bin" -X POST -H 'Content-Type: application/octet-stream' -H 'Content-Encoding: gzip' \
	--data-binary @"$T_TMP/bomb.gz")
check "a gzip body of $(stat -c %s "$T_TMP/bomb.gz") bytes that inflates past max_body_mib (3 MiB > 2): 413 {code: 413} ($st $(last .message))" \
	[ "$st" = 413 -a "$(last .code)" = 413 ]
rpc filesystem.Filesystem/Stat '{"path":"/home/user/gz/bomb.bin"}' > /dev/null
check "... and nothing was written" [ "$(last .code)" = not_found ]
printf 'not gzip at all' > "$T_TMP/notgz"
st=$(envd "/files?path=/home/user/gz/bad.bin" -X POST -H 'Content-Type: application/octet-stream' -H 'Content-Encoding: gzip' \
	--data-binary @"$T_TMP/notgz")
st2=$(envd "/files?path=/home/user/gz/br.bin" -X POST -H 'Content-Type: application/octet-stream' -H 'Content-Encoding: br' \
	--data-binary @"$T_TMP/notgz")
check "a body that is not gzip: 400; Content-Encoding br: 400 ($st $st2)" [ "$st" = 400 -a "$st2" = 400 ]
st=$(envd "/files?path=/home/user/gz/raw.bin" -H 'Accept-Encoding: gzip')
ce=$(header Content-Encoding)
check "GET /files with Accept-Encoding: gzip: 200 Content-Encoding gzip (as E2B's envd), inflates to the file ($st '$ce' $(stat -c %s "$T_TMP/last") bytes)" \
	[ "$st" = 200 -a "$ce" = gzip ] && [ "$(gzip -dc < "$T_TMP/last" | sha256sum)" = "$(sha256sum < "$T_TMP/gz.bin")" ]
envd "/files?path=/home/user/nofn.txt" -H 'Accept-Encoding: gzip' > /dev/null
small=$(gzip -dc < "$T_TMP/last" 2> /dev/null); ce=$(header Content-Encoding)
st=$(envd "/files?path=/home/user/gz/raw.bin" -H 'Accept-Encoding: identity;q=0')
check "Accept-Encoding: gzip of a 6-byte file is gzip too ('$ce' '$small'); identity;q=0 alone: 406 ($st)" \
	[ "$ce" = gzip -a "$small" = alpha -a "$st" = 406 ]
st=$(envd "/files?path=/home/user/meta/m.txt" -X POST -H 'Content-Type: application/octet-stream' \
	-H 'X-Metadata-Author: mish' -H 'x-metadata-purpose: the test' --data-binary @"$T_TMP/a.txt")
check "X-Metadata-* on an upload: 200, the entry's metadata with lowercased keys ($st $(last '.[0].metadata | tojson'))" \
	[ "$st" = 200 -a "$(last '.[0].metadata == {"author":"mish","purpose":"the test"}')" = true ]
st=$(rpc filesystem.Filesystem/Stat '{"path":"/home/user/meta/m.txt"}')
check "... Stat shows it" [ "$(last '.entry.metadata.author == "mish" and .entry.metadata.purpose == "the test"')" = true ]
st=$(rpc filesystem.Filesystem/ListDir '{"path":"/home/user/meta","depth":1}')
check "... ListDir shows it" [ "$(last '[.entries[] | select(.name == "m.txt") | .metadata.author] == ["mish"]')" = true ]
st=$(rpc filesystem.Filesystem/Move '{"source":"/home/user/meta/m.txt","destination":"/home/user/meta/n.txt"}')
check "... Move's entry keeps it ($st)" [ "$st" = 200 -a "$(last '.entry.metadata.author')" = mish ]
st=$(envd "/files?path=/home/user/meta/n.txt" -X POST -H 'Content-Type: application/octet-stream' --data-binary @"$T_TMP/a.txt")
rpc filesystem.Filesystem/Stat '{"path":"/home/user/meta/n.txt"}' > /dev/null
check "an overwrite without metadata clears it ($st $(last '.entry.metadata | tojson'))" [ "$st" = 200 -a "$(last '.entry.metadata')" = null ]
st=$(envd "/files?path=/home/user/meta/bad.txt" -X POST -H 'Content-Type: application/octet-stream' \
	-H "X-Metadata-Big: $(head -c 4100 /dev/zero | tr '\0' x)" --data-binary @"$T_TMP/a.txt")
st2=$(envd "/files?path=/home/user/meta/bad.txt" -X POST -H 'Content-Type: application/octet-stream' \
	-H "X-Metadata-Tab: a$(printf '\t')b" --data-binary @"$T_TMP/a.txt")
st3=$(envd "/files?path=/home/user/meta/bad.txt" -X POST -H 'Content-Type: application/octet-stream' \
	-H "X-Metadata-Huge: $(head -c 6000 /dev/zero | tr '\0' x)" --data-binary @"$T_TMP/a.txt")
rpc filesystem.Filesystem/Stat '{"path":"/home/user/meta/bad.txt"}' > /dev/null
check "metadata over 4096 bytes (4100 and 6000), a value with a tab: 400 each, naming metadata; nothing written ($st $st2 $st3)" \
	[ "$st" = 400 -a "$st2" = 400 -a "$st3" = 400 -a "$(last .code)" = not_found ]

st1=$(envd "/files?path=/home/user/mp/a.txt")
st=$(envd "/files?path=/home/user/no-such-file")
check "GET /files: 200 for a file ($st1), 404 {code: 404, message} for a missing one ($st)" \
	[ "$st1" = 200 -a "$st" = 404 -a "$(last '.code == 404 and (.message | length > 0)')" = true ]
st=$(envd "/files?path=/home/user/mp")
check "GET /files of a directory: 400 ($st)" [ "$st" = 400 ]

# ---- paused, resumed, killed ----
st=$(e2b "$KA" POST "/sandboxes/$SID/pause")
check "pause: 204 ($st)" [ "$st" = 204 ]
st=$(e2b "$KA" POST "/sandboxes/$SID/pause"); check "pausing it again: 409 ($st)" [ "$st" = 409 ]
st=$(e2b "$KA" GET "/sandboxes/$SID"); expect "GET: state paused" 200 "$st" '.state == "paused"'
check "GET /health of a paused sandbox: 502" [ "$(envd /health)" = 502 ]
st=$(rpc process.Process/List '{}')
check "a unary call to a paused sandbox: 502 unavailable ($st $(last .code))" [ "$st" = 502 -a "$(last .code)" = unavailable ]
st=$(stream process.Process/Start '{"process":{"cmd":"true"}}')
check "Start on a paused sandbox: 502 unavailable ($st)" [ "$st" = 502 -a "$(last .code)" = unavailable ]
st=$(e2b "$KB" POST "/v2/sandboxes/$SID/connect" -H 'Content-Type: application/json' --data '{"timeout":600}')
check "another customer cannot connect (resume) it: 404 ($st)" [ "$st" = 404 ]
st=$(e2b "$KA" POST "/v2/sandboxes/$SID/connect" -H 'Content-Type: application/json' --data '{"timeout":600}')
expect "connect resumes it: 201, the same token" 201 "$st" ".sandboxID == \"$SID\" and .envdAccessToken == \"$TOK\""
st=$(e2b "$KA" POST "/v2/sandboxes/$SID/connect" -H 'Content-Type: application/json' --data '{"timeout":600}')
check "connect to a running sandbox: 200 ($st)" [ "$st" = 200 ]
envd "/files?path=/home/user/mp/sub/b.bin" > /dev/null
check "after resume: a file written before is there" cmp -s "$T_TMP/last" "$T_TMP/b.bin"
st=$(e2b "$KA" POST "/sandboxes/$SID/timeout" -H 'Content-Type: application/json' --data '{"timeout":1000}')
e2b "$KA" GET "/sandboxes/$SID" > /dev/null
left=$(( $(date -d "$(last .endAt)" +%s 2> /dev/null || echo 0) - $(date +%s) ))
check "POST /timeout: 204, endAt ~1000 s away ($st, ${left} s)" [ "$st" = 204 -a "$left" -gt 900 -a "$left" -le 1060 ]
st=$(e2b "$KA" GET "/sandboxes/$SID/metrics")
expect "metrics: [{cpuCount, cpuUsedPct, memUsed, memTotal, ...}]" 200 "$st" \
	'length >= 1 and (.[0] | .cpuCount >= 1 and .memTotal > 0 and (.timestamp | length > 0))'

st=$(e2b "$KB" DELETE "/sandboxes/$SID"); check "another customer cannot kill it: 404 ($st)" [ "$st" = 404 ]
st=$(e2b "$KA" DELETE "/sandboxes/$SID"); check "DELETE: 204 ($st)" [ "$st" = 204 ]
st=$(rpc filesystem.Filesystem/Stat '{"path":"/tmp"}')
check "envd of a killed sandbox: 401 unauthenticated ($st)" [ "$st" = 401 -a "$(last .code)" = unauthenticated ]
st=$(e2b "$KA" GET "/sandboxes/$SID"); check "GET after kill: 404 ($st)" [ "$st" = 404 ]
st=$(e2b "$KA" DELETE "/sandboxes/$SID"); check "DELETE again: 404 ($st)" [ "$st" = 404 ]
rc=$(s3_head "acme/sessions/$SID/manifest.json")
check "the pause snapshot is gone from S3 (s3tool head: $rc; 3 = absent)" [ "$rc" = 3 ]

for _ in $(seq 50); do [ "$(vcpus_used)" = 0 ] && break; sleep 0.2; done
check "the host holds no vCPU ($(vcpus_used))" [ "$(vcpus_used)" = 0 ]
e2b_stack_stop
check "nothing left: no QEMU ($(count_qemu)), VM directories ($(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)), mounts ($(count_mounts) = $before_mounts), cgroups ($(count_cgroups) = $before_cg)" \
	[ "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)" = 0 \
	-a "$(count_mounts)" = "$before_mounts" -a "$(count_cgroups)" = "$before_cg" ]
t_done
