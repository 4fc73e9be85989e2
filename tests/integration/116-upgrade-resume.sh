#!/usr/bin/env bash
# A paused session survives a kiln-init (or kernel) change, as every kiln
# upgrade brings (docs/architecture.md "Resume"): a session holding 16 MiB
# of random bytes in a process and a file is paused to S3 by kiln-host A;
# A stops; kiln-host A2 starts on the same S3 with an image directory whose
# initramfs differs (its template snapshot is another: booted anew), and
# the session resumes there with its process's bytes and its file, since
# the rootfs, QEMU and machine it needs are the same (its resume key), and
# pauses again there. A manifest naming another template snapshot and
# another resume key is 409 incompatible_snapshot, saying why. Nothing is
# left on the hosts.
. "$(dirname "$0")/lib.sh"
t_plan 6
require_image
t_require_tools swift-proxy-server memcached python3
t_require_python boto3

S3_DIR=$T_TMP/s3
TOKEN=upgrade-token-$RANDOM$RANDOM
PA=$((20000 + RANDOM % 10000)); PB=$((PA + 1))
BUCKET=kiln-upgrade
s3_local_start
h() { # PORT METHOD PATH [curl args]: body in $T_TMP/last, status echoed
	local port=$1 m=$2 p=$3; shift 3
	curl -s -m 600 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "http://127.0.0.1:$port$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
j() { h "$@" -H 'Content-Type: application/json'; }
ask() { # PORT: the holder's hash of its bytes
	j "$1" POST /v1/sessions/s1/exec --data-binary \
		'{"language":"python","code":"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect(\"/tmp/h.sock\")\ns.sendall(b\"hash\")\nprint(s.recv(200).decode())"}' > /dev/null
	last .stdout
}
manifest() { # get | put FILE: the session's manifest in S3
	S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY BUCKET=$BUCKET python3 -c '
import boto3, os, sys
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                  aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"],
                  config=Config(s3={"addressing_style": "path"}))
k = "acme/sessions/s1/manifest.json"
if sys.argv[1] == "get":
    sys.stdout.buffer.write(s3.get_object(Bucket=os.environ["BUCKET"], Key=k)["Body"].read())
else:
    s3.put_object(Bucket=os.environ["BUCKET"], Key=k, Body=open(sys.argv[2], "rb").read())
' "$@"
}

host_config "$T_TMP/a.json" "127.0.0.1:$PA" a '.run_dir += "/a"'
host_up "$T_TMP/a.json" a "http://127.0.0.1:$PA"
HOLD=$'import hashlib, os, socket\nb = bytearray(os.urandom(16 << 20))\ns = socket.socket(socket.AF_UNIX)\ns.bind("/tmp/h.sock")\ns.listen()\nwhile True:\n    c, _ = s.accept()\n    c.recv(16)\n    c.sendall(hashlib.sha256(b).hexdigest().encode())\n    c.close()\n'
j "$PA" POST /v1/sessions --data-binary '{"id":"s1","customer":"acme","spec":{}}' > /dev/null
printf '%s' "$HOLD" | h "$PA" PUT "/v1/sessions/s1/files?path=/work/hold.py" --data-binary @- > /dev/null
j "$PA" POST /v1/sessions/s1/exec --data-binary \
	'{"argv":["sh","-c","python3 /work/hold.py > /dev/null 2>&1 & sleep 2; echo before > /work/who; sync"]}' > /dev/null
want=$(ask "$PA")
h "$PA" POST /v1/sessions/s1/pause > /dev/null
check "A pauses s1 (16 MiB of random bytes in a process, sha256 ${want:0:12}) to S3: $(last .state)" \
	test "${#want}" = 64 -a "$(last .state)" = paused
t_stop "$host_pid"

# The upgrade: the same kernel, rootfs and QEMU, another initramfs (a new
# kiln-init: cpio's trailing zero padding makes it another file).
IMG=$T_TMP/image2
mkdir -p "$IMG"
for f in "$ROOT"/build/image/vmlinux "$ROOT"/build/image/rootfs*.ext4; do ln -s "$(realpath "$f")" "$IMG/${f##*/}"; done
cp "$ROOT/build/image/initramfs.cpio" "$IMG/initramfs.cpio"
head -c 512 /dev/zero >> "$IMG/initramfs.cpio"
host_config "$T_TMP/a2.json" "127.0.0.1:$PB" a2 \
	".run_dir += \"/a2\" | .image_dir = \"$IMG\" | .cache = \"$T_TMP/cache\""
host_up "$T_TMP/a2.json" a2 "http://127.0.0.1:$PB"
old=$(manifest get | jq -r .template)

st=$(j "$PB" POST /v1/sessions/s1/resume --data-binary '{"customer":"acme"}')
check "A2 (another initramfs, so another template snapshot) resumes s1: $st $(last '.error.message // ""') ($(grep -o 'paused on template snapshot.*' "$T_TMP/a2.err" | head -1))" \
	test "$st" = 200 -a -n "$(grep "session s1: paused on template snapshot $old" "$T_TMP/a2.err")"
check "... its process has its bytes and its file is there" \
	test "$(ask "$PB")" = "$want" -a "$(j "$PB" POST /v1/sessions/s1/exec --data-binary '{"argv":["cat","/work/who"]}' > /dev/null; last .stdout)" = before
h "$PB" POST /v1/sessions/s1/pause > /dev/null
check "... and pauses again on A2: $(last .state), its manifest naming A2's template snapshot" \
	test "$(last .state)" = paused -a "$(manifest get | jq -r .template)" != "$old"

manifest get | jq '.template = "00000000000000aa" | .resume_key = "0123456789abcdef"' > "$T_TMP/m.json"
manifest put "$T_TMP/m.json"
st=$(j "$PB" POST /v1/sessions/s1/resume --data-binary '{"customer":"acme"}')
check "a manifest naming another resume key (another rootfs, QEMU or machine): $st $(last .error.code) ($(last .error.message | head -c 140))" \
	test "$st" = 409 -a "$(last .error.code)" = incompatible_snapshot -a -n "$(last .error.message | grep 'another rootfs, QEMU or machine')"
h "$PB" DELETE "/v1/sessions/s1?customer=acme" > /dev/null
t_stop "$host_pid"
t_nothing_left "nothing left: no QEMU, VM directories, cgroups, mounts or slot locks"
t_done
