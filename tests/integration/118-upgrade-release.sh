#!/usr/bin/env bash
# An upgrade from the previous release (packaging/previous-release: its tag
# and commit) keeps what it made working (docs/architecture.md "Persistent
# formats and upgrades"): the previous release is built from git (once per
# commit, in KILN_CACHE/release/SHA; its image comes from the same caches),
# its kiln-api (SQLite) and kiln-host on a local S3 make a session holding
# 16 MiB of random bytes in a process and a file, a named snapshot of it,
# and a recipe template (a file, no packages), and pause the session. Both
# stop; this tree's kiln-api opens the same database (at its schema
# version) and this tree's kiln-host the same S3 and caches: the session,
# snapshot and template are listed, the session resumes with its process's
# bytes and its file, a session from the old template and one from the old
# snapshot run. A pause manifest of a newer version than the host reads is
# refused (kiln-host: 409 incompatible_snapshot naming the object and the
# versions; kiln-api, with no other host to try: 503 no_capacity with that
# answer), and the session stays paused with its manifest in S3 (put back,
# it resumes). Nothing is left on the hosts.
. "$(dirname "$0")/lib.sh"
t_plan 15
require_image
t_require_tools swift-proxy-server memcached jq curl git sqlite3
t_require_python boto3
t_require_built kiln-api kiln-host

# ---- the previous release: its tag, else its commit; built once ----
read -r PREV_TAG PREV_SHA < "$ROOT/packaging/previous-release"
if git -C "$ROOT" rev-parse -q --verify "refs/tags/$PREV_TAG^{commit}" > /dev/null 2>&1; then
	PREV_REV=$PREV_TAG
	[ "$(git -C "$ROOT" rev-parse "$PREV_TAG^{commit}")" = "$PREV_SHA" ] ||
		t_bail "the tag $PREV_TAG is the commit packaging/previous-release names ($PREV_SHA)"
elif git -C "$ROOT" cat-file -e "$PREV_SHA^{commit}" 2> /dev/null; then
	PREV_REV=$PREV_SHA
else
	t_bail "the previous release ($PREV_TAG, $PREV_SHA) is in this clone" \
		"neither the tag nor the commit is here (a shallow clone or a tarball?): git fetch --tags --unshallow"
fi
REL=${KILN_CACHE:-/var/cache/kiln}/release/$PREV_SHA
OLD=$REL/src/build
if [ ! -e "$REL/built" ]; then
	echo "# building the previous release $PREV_REV into $REL (once)"
	rm -rf "$REL.tmp.$$"
	mkdir -p "$REL.tmp.$$/src"
	t_on_exit "rm -rf '$REL.tmp.$$'"
	if git -C "$ROOT" archive "$PREV_REV" | tar -x -C "$REL.tmp.$$/src" &&
		(cd "$REL.tmp.$$/src" && make -j2 all && image/build-kernel.sh build/image/vmlinux &&
			image/build-rootfs.sh build/image/rootfs.ext4 default) > "$REL.tmp.$$/build.log" 2>&1; then
		# The tree is built where it will stay (paths in the binaries are
		# relative): one rename makes it the cache's, or another run's won.
		touch "$REL.tmp.$$/built"
		mv -T "$REL.tmp.$$" "$REL" 2> /dev/null || true
	fi
	[ -e "$REL/built" ] || t_bail "the previous release $PREV_REV builds" "$(tail -5 "$REL.tmp.$$/build.log")"
fi
OLD_VERSION=$("$OLD/kiln-api" --version 2> /dev/null | awk '{print $NF}')
NEW_VERSION=$("$ROOT/build/kiln-api" --version 2> /dev/null | awk '{print $NF}')
check "the previous release $PREV_REV ($OLD_VERSION) and this tree ($NEW_VERSION) are built and differ" \
	test -x "$OLD/kiln-host" -a -x "$OLD/kiln-jail" -a -r "$OLD/image/rootfs.ext4" -a -n "$OLD_VERSION" \
	-a "$OLD_VERSION" != "$NEW_VERSION"

TOKEN=upgrade-token-$RANDOM$RANDOM$RANDOM
ADMIN=upgrade-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 10000))
URL=http://127.0.0.1:$API_PORT
API=$URL
BUCKET=kiln-release
s3_local_start
t_mark

req() {
	local m=$1 p=$2; shift 2
	curl -s -m 900 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $KEY" \
		-H 'Content-Type: application/json' "$@" "$URL$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
ex() { req POST "/v1/sessions/$1/exec" --data-binary "$2"; }
out() { ex "$1" "$(jq -cn --arg s "$2" '{argv: ["sh", "-c", $s]}')" > /dev/null; last .stdout; }
ask() { # ID: the holder's hash of its bytes
	ex "$1" '{"language":"python","code":"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect(\"/tmp/h.sock\")\ns.sendall(b\"hash\")\nprint(s.recv(200).decode())"}' > /dev/null
	last .stdout
}
s3() { # get KEY | put KEY FILE | head KEY
	S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY BUCKET=$BUCKET /usr/bin/python3 -c '
import boto3, os, sys
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                  aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"],
                  config=Config(s3={"addressing_style": "path"}))
b = os.environ["BUCKET"]
if sys.argv[1] == "get":
    sys.stdout.buffer.write(s3.get_object(Bucket=b, Key=sys.argv[2])["Body"].read())
elif sys.argv[1] == "head":
    s3.head_object(Bucket=b, Key=sys.argv[2])
else:
    s3.put_object(Bucket=b, Key=sys.argv[2], Body=open(sys.argv[3], "rb").read())
' "$@" 2> /dev/null
}
schema() { sqlite3 "$T_TMP/api.db" 'SELECT version FROM schema_version' 2> /dev/null; }
# One host configuration for both releases, as an in-place upgrade keeps
# it: the same spool, run directory, cache and S3; only the binaries and
# the image directory (the package's files) change.
HOST_URL=http://127.0.0.1:$((API_PORT + 1))
host_config "$T_TMP/h1.json" "127.0.0.1:$((API_PORT + 1))" h1 \
	".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h1\" | .capacity.cpu_overcommit = 8"
api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" '. + {host_lost_after_s: 5}'

# ---- the previous release ----
KILN_API_BIN=$OLD/kiln-api api_up "$T_TMP/api.json" "$URL" api-old
jq ".image_dir = \"$OLD/image\"" "$T_TMP/h1.json" > "$T_TMP/h1-old.json"
KILN_HOST=$OLD/kiln-host host_up "$T_TMP/h1-old.json" h1-old "$HOST_URL"
wait_live 1 || t_bail "the previous release's kiln-host registers" "$(tail -3 "$T_TMP/h1-old.err")"
OLD_SCHEMA=$(schema)
old_host_version=$(curl -s -m 5 "$HOST_URL/healthz" | jq -r .version)
KEY=$(new_customer acme '{"quotas":{"max_running":8,"max_vcpus":8,"max_memory_mib":4096}}')

st=$(req POST /v1/sessions --data-binary '{"idle_timeout_s":900}')
[ "$st" = 201 ] || t_bail "the previous release starts a session" "$st $(head -c 300 "$T_TMP/last")"
S=$(last .id)
HOLD=$'import hashlib, os, socket\nb = bytearray(os.urandom(16 << 20))\ns = socket.socket(socket.AF_UNIX)\ns.bind("/tmp/h.sock")\ns.listen()\nwhile True:\n    c, _ = s.accept()\n    c.recv(16)\n    c.sendall(hashlib.sha256(b).hexdigest().encode())\n    c.close()\n'
printf '%s' "$HOLD" > "$T_TMP/hold.py"
req PUT "/v1/sessions/$S/files?path=/work/hold.py" --data-binary @"$T_TMP/hold.py" > /dev/null
out "$S" 'python3 /work/hold.py > /dev/null 2>&1 & sleep 2; echo before > /work/who; sync' > /dev/null
want=$(ask "$S")
st=$(req POST "/v1/sessions/$S/snapshots" --data-binary '{"name":"old"}')
K=$(last .id)
snap_ok=$st
req POST "/v1/sessions/$S/pause" > /dev/null
state=$(last .state)
RECIPE=$(jq -cn --arg c "$(printf 'made by %s' "$OLD_VERSION" | base64 -w0)" \
	'{name: "oldtpl", files: [{path: "/etc/kiln-old", content_b64: $c}]}')
req POST /v1/templates --data-binary "$RECIPE" > /dev/null
for _ in $(seq 3000); do
	req GET /v1/templates/oldtpl > /dev/null
	case $(last .state) in ready|failed) break ;; esac
	sleep 0.2
done
tpl_state=$(last .state)
check "the previous release: session $S (sha256 ${want:0:12} in a process) paused ($state), snapshot $K ($snap_ok), template oldtpl ($tpl_state), schema version $OLD_SCHEMA, kiln-host $old_host_version" \
	test "$old_host_version" = "$OLD_VERSION" -a "${#want}" = 64 -a "$state" = paused -a "$snap_ok" = 201 -a "$tpl_state" = ready -a -n "$OLD_SCHEMA"
t_stop "$host_pid"
t_stop "$api_pid"

# ---- the upgrade: this tree's binaries on the same database, S3 and caches ----
api_up "$T_TMP/api.json" "$URL" api-new
jq ".image_dir = \"$ROOT/build/image\"" "$T_TMP/h1.json" > "$T_TMP/h1-new.json"
# Until this kiln-host answers: kiln-api may still count the old one live.
host_up "$T_TMP/h1-new.json" h1-new "$HOST_URL"
wait_live 1 || t_bail "this tree's kiln-host registers" "$(tail -3 "$T_TMP/h1-new.err")"
host_version=$(curl -s -m 5 "$HOST_URL/healthz" | jq -r .version)
NEW_SCHEMA=$(sed -n 's/^#define STORE_SCHEMA_VERSION \([0-9]*\).*/\1/p' "$ROOT/api/store/store.h")
check "this tree's kiln-api opens the database at its schema version ($OLD_SCHEMA -> $(schema), wants $NEW_SCHEMA); its kiln-host is $host_version" \
	test "$(schema)" = "$NEW_SCHEMA" -a "$host_version" = "$NEW_VERSION"
req GET "/v1/sessions/$S" > /dev/null
check "the session is listed, paused: $(last .state)" test "$(last .state)" = paused
req GET "/v1/snapshots/$K" > /dev/null
check "the snapshot is listed: $(last .name)" test "$(last .name)" = old
req GET /v1/templates/oldtpl > /dev/null
check "the template is listed, ready: $(last .state)" test "$(last .state)" = ready

st=$(req POST "/v1/sessions/$S/resume")
check "the session resumes on this tree's kiln-host: $st $(last '.error.message // ""' | head -c 200)" test "$st" = 200
check "... its process has its bytes and its file is there" \
	test "$(ask "$S")" = "$want" -a "$(out "$S" 'cat /work/who')" = before

st=$(req POST /v1/sessions --data-binary '{"template":"oldtpl"}')
T=$(last .id)
check "a session from the old template runs: $st, /etc/kiln-old: $(out "$T" 'cat /etc/kiln-old')" \
	test "$st" = 201 -a "$(out "$T" 'cat /etc/kiln-old')" = "made by $OLD_VERSION"
req DELETE "/v1/sessions/$T" > /dev/null
st=$(req POST /v1/sessions --data-binary "{\"snapshot\":\"$K\"}")
F=$(last .id)
check "a session from the old snapshot runs: $st, its process's bytes and file" \
	test "$st" = 201 -a "$(ask "$F")" = "$want" -a "$(out "$F" 'cat /work/who')" = before
req DELETE "/v1/sessions/$F" > /dev/null

# ---- a manifest newer than this kiln-host reads ----
req POST "/v1/sessions/$S/pause" > /dev/null
M=acme/sessions/$S/manifest.json
s3 get "$M" > "$T_TMP/m.json"
jq '.version = 99' "$T_TMP/m.json" > "$T_TMP/m99.json"
s3 put "$M" "$T_TMP/m99.json"
hst=$(curl -s -m 120 -o "$T_TMP/last" -w '%{http_code}' -X POST -H "Authorization: Bearer $TOKEN" \
	-H 'Content-Type: application/json' --data '{"customer":"acme"}' "$HOST_URL/v1/sessions/$S/resume")
check "a manifest of version 99: kiln-host refuses it, $hst $(last .error.code) ($(last .error.message | head -c 200))" \
	test "$hst" = 409 -a "$(last .error.code)" = incompatible_snapshot -a -n "$(last .error.message | grep "$M has version 99")"
# kiln-api tries every host (an upgraded one may read it), then says why.
st=$(req POST "/v1/sessions/$S/resume")
check "... and kiln-api, no host reading it: $st $(last .error.code), naming h1's answer" \
	test "$st" = 503 -a "$(last .error.code)" = no_capacity -a \
	-n "$(last .error.message | grep 'h1: HTTP 409 incompatible_snapshot: .*has version 99')"
req GET "/v1/sessions/$S" > /dev/null
check "... the session stays paused ($(last .state)) and its manifest in S3" \
	test "$(last .state)" = paused -a "$(s3 get "$M" | jq .version)" = 99
s3 put "$M" "$T_TMP/m.json"
st=$(req POST "/v1/sessions/$S/resume")
check "... put back, it resumes with its bytes: $st" test "$st" = 200 -a "$(ask "$S")" = "$want"
req DELETE "/v1/sessions/$S" > /dev/null
t_stop "$host_pid"
t_stop "$api_pid"
t_nothing_left "nothing left: no QEMU, VM directories, cgroups, mounts or slot locks"
t_done
