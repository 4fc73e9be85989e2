#!/usr/bin/env bash
# kiln-host's template store with a real S3 (Swift s3api) and real VMs: a
# customer template (a copy of the default rootfs with a marker file) is
# fetched from S3 on first use, verified by its SHA-256, snapshotted, and
# tasks and sessions run on it (the marker is there, the TREF's uid applies);
# capacity (the heartbeat's body) and /metrics list it; a TREF whose sha256
# does not match the object is refused loudly and leaves nothing in the
# store; a built-in the host lacks is 503 no_template; under a tiny disk
# budget the least recently used unused template is evicted, never one in
# use; nothing is left behind.
. "$(dirname "$0")/lib.sh"
t_plan 63
require_image
t_require_tools swift-proxy-server memcached python3 debugfs resize2fs e2fsck
t_require_python boto3

S3_DIR=$T_TMP/s3
TOKEN=tpl-token-$RANDOM$RANDOM
PORT=$((20000 + RANDOM % 10000))
URL=http://127.0.0.1:$PORT
BUCKET=kiln-templates
CACHE=$T_TMP/cache
host_pid=
s3_local_start

s3py() {
	S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY BUCKET=$BUCKET python3 -c '
import os, sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                  aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"],
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
b = os.environ["BUCKET"]
op = sys.argv[1]
if op == "mkbucket":
    try:
        s3.create_bucket(Bucket=b)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
elif op == "put":
    s3.upload_file(sys.argv[3], b, sys.argv[2])
' "$@"
}

# --- two template images: the default rootfs, shrunk, with a marker each ---
img_dir=$T_TMP/image
mkdir -p "$img_dir" "$CACHE"
for f in vmlinux initramfs.cpio rootfs.ext4; do ln -s "$(readlink -f "$ROOT/build/image/$f")" "$img_dir/$f"; done
# The built-in python-data, when `make image` made it.
PD=$ROOT/build/image/rootfs-python-data.ext4
[ -r "$PD" ] && ln -s "$(readlink -f "$PD")" "$img_dir/rootfs-python-data.ext4"
make_template() { # NAME MARKER: $T_TMP/NAME.ext4, its sha256 in $T_TMP/NAME.sha
	cp --sparse=always "$(readlink -f "$ROOT/build/image/rootfs.ext4")" "$T_TMP/$1.ext4"
	chmod 0644 "$T_TMP/$1.ext4"
	e2fsck -fy "$T_TMP/$1.ext4" > /dev/null 2>&1
	resize2fs -M "$T_TMP/$1.ext4" > /dev/null 2>&1
	# some room for what the guest writes (snapshot=on: never into the file)
	local blocks
	blocks=$(dumpe2fs -h "$T_TMP/$1.ext4" 2> /dev/null | awk -F: '/^Block count/ {print $2 + 8192}')
	resize2fs "$T_TMP/$1.ext4" "$blocks" > /dev/null 2>&1
	printf '%s\n' "$2" > "$T_TMP/$1.marker"
	debugfs -w -R "write $T_TMP/$1.marker /marker" "$T_TMP/$1.ext4" > /dev/null 2>&1
	sha256sum "$T_TMP/$1.ext4" | cut -d' ' -f1 > "$T_TMP/$1.sha"
}
make_template ta "marker-a-$RANDOM"
make_template tb "marker-b-$RANDOM"
SHA_A=$(cat "$T_TMP/ta.sha"); SHA_B=$(cat "$T_TMP/tb.sha")
SIZE_A=$(stat -c %s "$T_TMP/ta.ext4"); SIZE_B=$(stat -c %s "$T_TMP/tb.ext4")
s3py mkbucket && s3py put "_templates/$SHA_A.ext4" "$T_TMP/ta.ext4" && s3py put "_templates/$SHA_B.ext4" "$T_TMP/tb.ext4" \
	|| { echo "1..0 # SKIP cannot put the template images into S3"; exit 0; }
echo "# template images: $SIZE_A bytes each (shrunk copies of the default rootfs)"
tref() { # NAME SHA SIZE [extra]
	jq -cn --arg n "$1" --arg s "$2" --argjson z "$3" --argjson x "${4:-{\}}" \
		'{name: $n, sha256: $s, size: $z, s3_key: ("_templates/" + $s + ".ext4")} + $x'
}
TREF_A=$(tref data "$SHA_A" "$SIZE_A" '{"uid":0,"gid":0,"env":["LANG=C.UTF-8"],"workdir":"/work"}')
TREF_B=$(tref other "$SHA_B" "$SIZE_B")

before_q=$(count_qemu); before_cg=$(count_cgroups); before_m=$(count_mounts)

start_host() { # BUDGET_MIB (0: none) [POOLS-JSON]
	host_config "$T_TMP/host.json" "127.0.0.1:$PORT" tpl \
		".run_dir += \"/h\" | .cache = \"$CACHE\" | .image_dir = \"$img_dir\"
		 | .templates = ({snapshot_ttl_s: 0, pools: ${2:-{\}}} + (if $1 > 0 then {disk_budget_mib: $1} else {} end))"
	host_start "$T_TMP/host.json" host
	t_serving "$URL/healthz" "$host_pid"
}
stop_host() {
	kill "$host_pid" 2> /dev/null
	wait "$host_pid" 2> /dev/null
	host_pid=
}
api() { # METHOD PATH [curl args]: body in $T_TMP/last.json, status echoed
	local m=$1 p=$2; shift 2
	curl -s --max-time 300 -o "$T_TMP/last.json" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" "$@" "$URL$p"
}
last() { jq -r "$1" "$T_TMP/last.json" 2> /dev/null; }
submit() { # ID TREF-JSON|null CODE
	jq -cn --arg id "$1" --argjson t "$2" --arg code "$3" \
		'{id: $id, customer: "acme", spec: {language: "sh", code: $code}} + (if $t == null then {} else {template: $t} end)' \
		| api POST /v1/tasks -H 'Content-Type: application/json' --data-binary @-
}
task() { curl -s --max-time 10 -H "Authorization: Bearer $TOKEN" "$URL/v1/tasks/$1"; }
wait_final() { # ID SECONDS: the task's JSON in $T_TMP/ID.json once final
	local deadline=$((SECONDS + $2)) st
	while [ $SECONDS -lt $deadline ]; do
		task "$1" > "$T_TMP/$1.json"
		st=$(jq -r .state "$T_TMP/$1.json" 2> /dev/null)
		case $st in succeeded | failed | timed_out | cancelled | error) return 0 ;; esac
		sleep 0.2
	done
	return 1
}
cap_tpl() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "$URL/v1/capacity" | jq -c "[.templates[] | select($1)]"; }

if start_host 0 '{"data":1}'; then ok "kiln-host starts with a template store (private cache; templates.pools {\"data\":1})"
else t_bail "kiln-host starts" "$(tail -5 "$T_TMP/host.err")"; fi

# --- a task on the customer template: fetched, verified, snapshotted, run ---
t0=$(/usr/bin/python3 -c 'import time; print(time.time())')
st=$(submit ta "$TREF_A" 'cat /marker; id -u; echo "$LANG"')
if [ "$st" = 202 ] && wait_final ta 600 && [ "$(jq -r .state "$T_TMP/ta.json")" = succeeded ] \
   && [ "$(jq -r .result.stdout "$T_TMP/ta.json" | head -n1)" = "$(cat "$T_TMP/ta.marker")" ] \
   && [ "$(jq -r .result.stdout "$T_TMP/ta.json" | sed -n 2p)" = 0 ]; then
	ok "a task on a customer template runs on its image (marker file there) as the TREF's uid (0)"
else not_ok "task on template a" "status $st: $(head -c 800 "$T_TMP/ta.json")" "$(tail -5 "$T_TMP/host.err")"; fi
t1=$(/usr/bin/python3 -c 'import time; print(time.time())')
echo "# first task on a new template (fetch $SIZE_A bytes + verify + snapshot + run): $(/usr/bin/python3 -c "print(round($t1-$t0,1))") s"
check "the image is in the store: rootfs.ext4 mode 0444, meta.json the TREF" \
	test "$(stat -c %a "$CACHE/templates/$SHA_A/rootfs.ext4" 2> /dev/null)" = 444 -a \
	"$(jq -r .sha256 "$CACHE/templates/$SHA_A/meta.json" 2> /dev/null)" = "$SHA_A"
for _ in $(seq 300); do
	c=$(cap_tpl ".sha256 == \"$SHA_A\"")
	[ "$(jq -r '.[0].ready' <<< "$c")" = 1 ] && break
	sleep 0.2
done
check "capacity.templates lists it (name, sha256, builtin false, snapshot true, its pool's 1 ready VM)" \
	test "$(jq -r '.[0] | "\(.name) \(.builtin) \(.snapshot) \(.ready)"' <<< "$c")" = "data false true 1"
c=$(cap_tpl '.name == "default"')
check "capacity.templates lists the built-in default (sha256 null)" \
	test "$(jq -r '.[0] | "\(.sha256) \(.builtin) \(.snapshot)"' <<< "$c")" = "null true true"

# A second task: no new fetch, restored from the template's snapshot.
t0=$(/usr/bin/python3 -c 'import time; print(time.time())')
st=$(submit ta2 "$TREF_A" 'cat /marker')
if [ "$st" = 202 ] && wait_final ta2 120 && [ "$(jq -r .result.stdout "$T_TMP/ta2.json")" = "$(cat "$T_TMP/ta.marker")" ]; then
	ok "a second task on it reuses the local image (and its pool VM)"
else not_ok "second task" "$(head -c 600 "$T_TMP/ta2.json")"; fi
t1=$(/usr/bin/python3 -c 'import time; print(time.time())')
echo "# a task on a template already held: $(/usr/bin/python3 -c "print(round($t1-$t0,1))") s"
metrics=$(curl -s -m 5 -H "Authorization: Bearer $TOKEN" "$URL/metrics")
check "/metrics: one fetch, per-template pool gauge" \
	grep -q "^kiln_host_template_fetches_total 1$" <<< "$metrics"
check "/metrics: kiln_host_template_pool_ready for the template ($(grep '^kiln_host_template_pool_ready{template="data"' <<< "$metrics"))" \
	grep -qE "^kiln_host_template_pool_ready\{template=\"data\",sha256=\"$SHA_A\"\} [01]$" <<< "$metrics"

# A default task still runs on the default image.
st=$(submit td null 'test -e /marker && echo has-marker || echo no-marker')
if [ "$st" = 202 ] && wait_final td 120 && [ "$(jq -r .result.stdout "$T_TMP/td.json")" = no-marker ]; then
	ok "a task without a template runs on the default image"
else not_ok "default task" "$(head -c 600 "$T_TMP/td.json")"; fi

# --- refusals ---
BAD=$(tref bad "$(printf '%064d' 0 | tr 0 f)" "$SIZE_B")
# The object under the bad sha's key is B's bytes: the hash cannot match.
s3py put "_templates/$(printf '%064d' 0 | tr 0 f).ext4" "$T_TMP/tb.ext4"
st=$(submit tbad "$BAD" 'echo must-not-run')
if [ "$st" = 202 ] && wait_final tbad 300 && [ "$(jq -r .state "$T_TMP/tbad.json")" = error ] \
   && [ "$(jq -r .result.error.code "$T_TMP/tbad.json")" = invalid_image ] \
   && jq -r .result.error.message "$T_TMP/tbad.json" | grep -q "sha256 mismatch" \
   && ! jq -r .result.stdout "$T_TMP/tbad.json" | grep -q must-not-run; then
	ok "a TREF whose sha256 does not match the image: the task ends error invalid_image, never runs"
else not_ok "sha256 mismatch refused" "$(head -c 800 "$T_TMP/tbad.json")"; fi
check "... the refusal is loud in kiln-host's log" grep -q "REFUSED _templates/ffff" "$T_TMP/host.err"
check "... and leaves no file in the store" test ! -e "$CACHE/templates/$(printf '%064d' 0 | tr 0 f)"
check "... no temporary file either" test -z "$(find "$CACHE/templates" -name '.fetch-*' 2> /dev/null)"
st=$(submit tsize "$(tref other "$SHA_B" $((SIZE_B + 4096)))" 'echo must-not-run')
if [ "$st" = 202 ] && wait_final tsize 120 \
   && [ "$(jq -r '.state + " " + .result.error.code' "$T_TMP/tsize.json")" = "error invalid_image" ] \
   && jq -r .result.error.message "$T_TMP/tsize.json" | grep -q "not fetched"; then
	ok "a TREF whose size is not the object's: error invalid_image before any download"
else not_ok "size mismatch" "$(head -c 600 "$T_TMP/tsize.json")"; fi
st=$(submit tgone "$(tref gone "$(printf '%064d' 0 | tr 0 e)" 4096)" 'echo must-not-run')
if [ "$st" = 202 ] && wait_final tgone 120 \
   && [ "$(jq -r '.state + " " + .result.error.code' "$T_TMP/tgone.json")" = "error s3_not_found" ]; then
	ok "a TREF whose image is not in S3: error s3_not_found"
else not_ok "missing image" "$(head -c 600 "$T_TMP/tgone.json")"; fi
check "... neither left anything in the store" \
	test ! -e "$CACHE/templates/$(printf '%064d' 0 | tr 0 e)" -a ! -e "$CACHE/templates/$SHA_B"
st=$(submit tnone '{"name":"gpu","builtin":true}' 'echo x')
check "a built-in this host lacks: 503 no_template" test "$st" = 503 -a "$(last .error.code)" = no_template
st=$(submit tjunk '{"name":"x","builtin":true,"colour":1}' 'echo x')
check "an unknown TREF key: 400 naming it" test "$st" = 400 -a "$(last .error.message)" = "template.colour: unknown field"
st=$(jq -cn '{id:"tk", customer:"acme", spec:{language:"sh",code:"true"}, extra:1}' \
	| api POST /v1/tasks -H 'Content-Type: application/json' --data-binary @-)
check "unknown top-level keys stay errors" test "$st" = 400

# --- another built-in: rootfs-python-data.ext4 is python-data ---
if [ -r "$PD" ]; then
	st=$(submit tpd '{"name":"python-data","builtin":true}' 'python3 -c "import numpy; print(numpy.__name__)"')
	if [ "$st" = 202 ] && wait_final tpd 300 && [ "$(jq -r .result.stdout "$T_TMP/tpd.json")" = numpy ]; then
		ok "a task on the built-in python-data runs on its image (numpy there)"
	else not_ok "python-data task" "status $st: $(head -c 600 "$T_TMP/tpd.json")"; fi
	c=$(cap_tpl '.name == "python-data"')
	check "capacity.templates lists python-data (builtin, snapshot made on first use)" \
		test "$(jq -r '.[0] | "\(.sha256) \(.builtin) \(.snapshot)"' <<< "$c")" = "null true true"
else
	skip "a task on the built-in python-data" "build/image/rootfs-python-data.ext4 missing (make image)"
fi

# --- a session on the template ---
body=$(jq -cn --argjson t "$TREF_A" '{id:"s1", customer:"acme", spec:{}, template:$t}')
st=$(api POST /v1/sessions -H 'Content-Type: application/json' --data-binary "$body")
check "POST /v1/sessions with a template: 201, running on it" test "$st" = 201 -a "$(last .template)" = data
st=$(api POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary '{"argv":["sh","-c","cat /marker; id -u"]}')
check "a session command sees the template's image and uid" \
	test "$st" = 200 -a "$(last .stdout)" = "$(printf '%s\n0\n' "$(cat "$T_TMP/ta.marker")")"
users() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "$URL/metrics" | sed -n "s/^kiln_host_template_users{template=\"data\",.*} //p"; }
check "the running session holds the template (users 1)" test "$(users)" = 1
api POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary '{"argv":["sh","-c","echo kept > /work/k"]}' > /dev/null
st=$(api POST /v1/sessions/s1/pause)
check "pause: 200 paused; the template is no longer held (users 0)" test "$st" = 200 -a "$(last .state)" = paused -a "$(users)" = 0
st=$(api POST /v1/sessions/s1/resume -H 'Content-Type: application/json' \
	--data-binary "$(jq -cn --argjson t "$TREF_A" '{customer:"acme", template:$t}')")
check "resume with its template: 200 running on it" test "$st" = 200 -a "$(last .template)" = data
st=$(api POST /v1/sessions/s1/exec -H 'Content-Type: application/json' --data-binary '{"argv":["sh","-c","cat /marker /work/k"]}')
check "after resume: the template's image and the session's files" \
	test "$(last .stdout)" = "$(printf '%s\nkept\n' "$(cat "$T_TMP/ta.marker")")"
st=$(api POST /v1/sessions/s1/pause)
st=$(api POST /v1/sessions/s1/resume -H 'Content-Type: application/json' --data-binary '{"customer":"acme"}')
check "resume on another template (the default): 409 incompatible_snapshot" \
	test "$st" = 409 -a "$(last .error.code)" = incompatible_snapshot
st=$(api POST /v1/sessions/s1/resume -H 'Content-Type: application/json' \
	--data-binary "$(jq -cn --argjson t "$TREF_A" '{customer:"acme", template:$t}')")
check "... and with the right one it resumes" test "$st" = 200
st=$(api DELETE /v1/sessions/s1)
u=$(users)
check "the session is destroyed ($st); the template is free (users ${u:-none})" \
	eval '{ [ "$st" = 200 ] || [ "$st" = 204 ]; } && [ "$u" = 0 ]'

# --- builds: the framework's failure reporting (template_build_* do the work) ---
wait_build() { # ID SECONDS: the build's JSON in $T_TMP/build-ID.json once not building
	local deadline=$((SECONDS + $2))
	while [ $SECONDS -lt $deadline ]; do
		curl -s -m 5 -H "Authorization: Bearer $TOKEN" "$URL/v1/builds/$1" > "$T_TMP/build-$1.json"
		[ "$(jq -r .state "$T_TMP/build-$1.json" 2> /dev/null)" != building ] && return 0
		sleep 0.2
	done
	return 1
}
vcpus_before=$(curl -s -m 5 -H "Authorization: Bearer $TOKEN" "$URL/v1/capacity" | jq -r '.vcpus.used + .vcpus.idle')
# A recipe whose step fails: build_failed, whatever template_build_recipe's stage (a
# placeholder fails every build as build_failed; the real one names the step).
st=$(api POST /v1/builds -H 'Content-Type: application/json' \
	--data-binary '{"id":"b1","customer":"acme","recipe":{"name":"broken","from":"debian","run":["exit 3"]},"timeout_s":600}')
check "POST /v1/builds (recipe): 202 building" test "$st" = 202 -a "$(last .state)" = building
if wait_build b1 900 && [ "$(jq -r .state "$T_TMP/build-b1.json")" = failed ] \
   && [ "$(jq -r .error.code "$T_TMP/build-b1.json")" = build_failed ] \
   && [ -n "$(jq -r .error.message "$T_TMP/build-b1.json")" ] \
   && jq -r .log_tail "$T_TMP/build-b1.json" | grep -qF "$(jq -r .error.message "$T_TMP/build-b1.json")"; then
	ok "a failing recipe build ends failed/build_failed with its message, also in log_tail"
else not_ok "recipe build failure" "$(head -c 800 "$T_TMP/build-b1.json")"; fi
curl -s -N -m 20 -H "Authorization: Bearer $TOKEN" "$URL/v1/builds/b1/events" > "$T_TMP/b1.events"
check "GET /v1/builds/b1/events: log lines, then end {state failed, error}" \
	test "$(grep -c '^event: log' "$T_TMP/b1.events")" -ge 1 -a \
	"$(grep -A1 '^event: end' "$T_TMP/b1.events" | sed -n 's/^data: //p' | jq -r '.state + " " + .error.code')" = "failed build_failed"
st=$(api POST /v1/builds -H 'Content-Type: application/json' \
	--data-binary '{"id":"b1","customer":"acme","recipe":{"name":"broken","from":"debian"}}')
check "a known build id: 409 duplicate" test "$st" = 409 -a "$(last .error.code)" = duplicate
st=$(api POST /v1/builds -H 'Content-Type: application/json' \
	--data-binary '{"id":"b2","customer":"acme","recipe":{"name":"x","from":"debian","colour":1}}')
check "an invalid recipe: 400 invalid_recipe" test "$st" = 400 -a "$(last .error.code)" = invalid_recipe
st=$(api POST /v1/builds -H 'Content-Type: application/json' \
	--data-binary '{"id":"b2","customer":"acme","recipe":{"name":"x","from":"debian","packages":["jq"]}}')
check "a recipe with packages on a host without egress: 503 egress_unavailable" \
	test "$st" = 503 -a "$(last .error.code)" = egress_unavailable
st=$(api POST /v1/builds -H 'Content-Type: application/json' \
	--data-binary '{"id":"b3","customer":"acme","name":"img","oci":{"s3_key":"_templates/uploads/nope.tar","size":10}}')
if [ "$st" = 202 ] && wait_build b3 120 && [ "$(jq -r '.state + " " + .error.code' "$T_TMP/build-b3.json")" = "failed s3_not_found" ]; then
	ok "an OCI build whose archive is not in S3: failed/s3_not_found"
else not_ok "oci build, no archive" "status $st: $(head -c 600 "$T_TMP/build-b3.json")"; fi
printf 'this is not an image archive' > "$T_TMP/junk.tar"
s3py put _templates/uploads/junk.tar "$T_TMP/junk.tar"
st=$(api POST /v1/builds -H 'Content-Type: application/json' \
	--data-binary '{"id":"b4","customer":"acme","name":"img","oci":{"s3_key":"_templates/uploads/junk.tar","size":28}}')
if [ "$st" = 202 ] && wait_build b4 300 && [ "$(jq -r '.state + " " + .error.code' "$T_TMP/build-b4.json")" = "failed invalid_image" ]; then
	ok "an OCI build of something that is no image: failed/invalid_image ($(jq -r .error.message "$T_TMP/build-b4.json"))"
else not_ok "oci build, junk" "status $st: $(head -c 600 "$T_TMP/build-b4.json")"; fi
st=$(api GET /v1/builds/nope)
check "an unknown build: 404 (kiln-api re-queues)" test "$st" = 404
st=$(api DELETE /v1/builds/nope)
check "cancelling an unknown build: 404" test "$st" = 404
check "builds gave back their vCPUs" \
	test "$(curl -s -m 5 -H "Authorization: Bearer $TOKEN" "$URL/v1/capacity" | jq -r '.vcpus.used + .vcpus.idle')" = "$vcpus_before"

# --- builds end to end: ready, in S3, in the store, tasks run on them ---
s3py_head() { # KEY: its size, or "none"
	S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY BUCKET=$BUCKET python3 -c '
import os, sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                  aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"],
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
try:
    print(s3.head_object(Bucket=os.environ["BUCKET"], Key=sys.argv[1])["ContentLength"])
except Exception:
    print("none")
' "$1"
}
built_ok() { # BUILD-ID NAME: the build is ready, its image in S3 and in the store
	local j=$T_TMP/build-$1.json sha size
	[ "$(jq -r '.state + " " + .template.name' "$j")" = "ready $2" ] || return 1
	sha=$(jq -r .template.sha256 "$j"); size=$(jq -r .template.size "$j")
	[ "$(jq -r .template.s3_key "$j")" = "_templates/$sha.ext4" ] || return 1
	[ "$(s3py_head "_templates/$sha.ext4")" = "$size" ] || return 1
	[ "$(sha256sum < "$CACHE/templates/$sha/rootfs.ext4" | cut -d' ' -f1)" = "$sha" ]
}
t0=$(/usr/bin/python3 -c 'import time; print(time.time())')
st=$(api POST /v1/builds -H 'Content-Type: application/json' --data-binary '{"id":"b5","customer":"acme","timeout_s":900,
	"recipe":{"name":"rb","from":"debian","files":[{"path":"/etc/rb.txt","content_b64":"aGVsbG8tZmlsZQ==","mode":420}],
	"run":["echo built-by-recipe > /etc/built"],"env":{"RB":"1"},"workdir":"/work"}}')
if [ "$st" = 202 ] && wait_build b5 1200 && built_ok b5 rb; then
	t1=$(/usr/bin/python3 -c 'import time; print(time.time())')
	ok "a recipe build (a file, a run step) ends ready: its TREF, the image in S3 and in the store with that sha256"
	echo "# recipe build: $(/usr/bin/python3 -c "print(round($t1-$t0,1))") s, image $(jq -r .template.size "$T_TMP/build-b5.json") bytes"
	st=$(submit trb "$(jq -c .template "$T_TMP/build-b5.json")" 'cat /etc/built /etc/rb.txt; echo; id -u')
	if [ "$st" = 202 ] && wait_final trb 300 \
	   && [ "$(jq -r .result.stdout "$T_TMP/trb.json")" = "$(printf 'built-by-recipe\nhello-file\n1000')" ]; then
		ok "a task on the built template sees what the recipe made, as uid 1000"
	else not_ok "task on the recipe template" "$(head -c 600 "$T_TMP/trb.json")"; fi
else not_ok "recipe build" "status $st: $(head -c 1500 "$T_TMP/build-b5.json")"; fi

if command -v umoci > /dev/null && command -v skopeo > /dev/null && command -v busybox > /dev/null; then
	L=$T_TMP/layout; B=$T_TMP/bundle
	(
		set -e
		umoci init --layout "$L"
		umoci new --image "$L:t"
		umoci unpack --image "$L:t" "$B"
		R=$B/rootfs
		mkdir -p "$R/bin" "$R/etc" "$R/home/app"
		cp "$(command -v busybox)" "$R/bin/busybox"
		for a in sh cat id pwd env; do ln -s busybox "$R/bin/$a"; done
		printf 'root:x:0:0:root:/root:/bin/sh\napp:x:1234:2345::/home/app:/bin/sh\n' > "$R/etc/passwd"
		printf 'root:x:0:\napps:x:2345:\n' > "$R/etc/group"
		echo hello-from-oci > "$R/hello.txt"
		umoci repack --image "$L:t" "$B"
		umoci config --image "$L:t" --config.env FOO=bar --config.workingdir /home/app --config.user app
		tar -C "$L" -cf "$T_TMP/oci.tar" .
	) > "$T_TMP/oci-build.log" 2>&1
	s3py put _templates/uploads/b6.tar "$T_TMP/oci.tar"
	st=$(api POST /v1/builds -H 'Content-Type: application/json' --data-binary \
		"$(jq -cn --argjson z "$(stat -c %s "$T_TMP/oci.tar")" '{id:"b6", customer:"acme", name:"img", oci:{s3_key:"_templates/uploads/b6.tar", size:$z}}')")
	if [ "$st" = 202 ] && wait_build b6 600 && built_ok b6 img \
	   && [ "$(jq -c '.template | [.uid, .gid, .workdir, .env]' "$T_TMP/build-b6.json")" = '[1234,2345,"/home/app",["FOO=bar"]]' ]; then
		ok "an OCI build ends ready: the image's user, workdir and env in its TREF; in S3 and in the store"
		st=$(submit toci "$(jq -c .template "$T_TMP/build-b6.json")" 'cat /hello.txt; id -u')
		if [ "$st" = 202 ] && wait_final toci 300 && [ "$(jq -r .result.stdout "$T_TMP/toci.json")" = "$(printf 'hello-from-oci\n1234')" ]; then
			ok "a task on the OCI template runs in the image as its user (1234)"
		else not_ok "task on the OCI template" "$(head -c 600 "$T_TMP/toci.json")"; fi
	else not_ok "OCI build" "status $st: $(head -c 1500 "$T_TMP/build-b6.json")" "$(tail -3 "$T_TMP/oci-build.log")"; fi
else
	skip "an OCI build ends ready" "umoci, skopeo or busybox missing (scripts/deps.sh)"
fi
# Cancel: DELETE while a step runs ends the build at once, its VM gone.
st=$(api POST /v1/builds -H 'Content-Type: application/json' \
	--data-binary '{"id":"b7","customer":"acme","recipe":{"name":"slow","from":"debian","run":["echo step-started; sleep 600"]}}')
for _ in $(seq 600); do
	curl -s -m 5 -H "Authorization: Bearer $TOKEN" "$URL/v1/builds/b7" | jq -r .log_tail | grep -q step-started && break
	sleep 0.2
done
t0=$(/usr/bin/python3 -c 'import time; print(time.time())')
st=$(api DELETE /v1/builds/b7)
if [ "$st" = 200 ] && wait_build b7 60 && [ "$(jq -r '.state + " " + .error.code' "$T_TMP/build-b7.json")" = "failed cancelled" ]; then
	t1=$(/usr/bin/python3 -c 'import time; print(time.time())')
	ok "DELETE /v1/builds/ID cancels a running build: failed/cancelled ($(/usr/bin/python3 -c "print(round($t1-$t0,1))") s)"
else not_ok "cancel" "status $st: $(head -c 800 "$T_TMP/build-b7.json")"; fi
st=$(api POST /v1/builds -H 'Content-Type: application/json' \
	--data-binary '{"id":"b8","customer":"acme","timeout_s":15,"recipe":{"name":"slow","from":"debian","run":["sleep 600"]}}')
if [ "$st" = 202 ] && wait_build b8 120 && [ "$(jq -r '.state + " " + .error.code' "$T_TMP/build-b8.json")" = "failed build_timeout" ]; then
	ok "a build past its timeout_s: failed/build_timeout"
else not_ok "build timeout" "status $st: $(head -c 800 "$T_TMP/build-b8.json")"; fi
check "after the builds: vCPUs back, no QEMU but the pool's" \
	test "$(curl -s -m 5 -H "Authorization: Bearer $TOKEN" "$URL/v1/capacity" | jq -r '.vcpus.used + .vcpus.idle')" = "$vcpus_before" \
	-a "$(count_qemu)" -le $((before_q + 2))
check "no build scratch directory left" test -z "$(ls -A "$T_TMP/spool-tpl/builds" 2> /dev/null)"
stop_host

# --- eviction under a tiny disk budget ---
if start_host 1; then ok "kiln-host restarts with templates.disk_budget_mib 1"
else t_bail "restart" "$(tail -5 "$T_TMP/host.err")"; fi
check "at start, the unused template is evicted (LRU, over the budget)" test ! -e "$CACHE/templates/$SHA_A"
check "... the built-in images are never touched" test -e "$img_dir/rootfs.ext4"
body=$(jq -cn --argjson t "$TREF_A" '{id:"s2", customer:"acme", spec:{}, template:$t}')
st=$(api POST /v1/sessions -H 'Content-Type: application/json' --data-binary "$body")
check "a session on template a fetches it again (201)" test "$st" = 201
st=$(submit tb "$TREF_B" 'cat /marker')
st2=$(submit tb2 "$TREF_B" 'cat /marker')
if [ "$st" = 202 ] && [ "$st2" = 202 ] && wait_final tb 600 && wait_final tb2 600 \
   && [ "$(jq -r .result.stdout "$T_TMP/tb.json")" = "$(cat "$T_TMP/tb.marker")" ] \
   && [ "$(jq -r .result.stdout "$T_TMP/tb2.json")" = "$(cat "$T_TMP/tb.marker")" ]; then
	ok "two tasks at once on template b run while a's session holds a"
else not_ok "tasks on b" "$(head -c 600 "$T_TMP/tb.json")" "$(head -c 600 "$T_TMP/tb2.json")"; fi
check "... b was fetched once for both (fetches: a, b)" \
	grep -q "^kiln_host_template_fetches_total 2$" <<< "$(curl -s -m 5 -H "Authorization: Bearer $TOKEN" "$URL/metrics")"
# The pass after b's task (at most TEMPLATE_GC_PERIOD_MS later) evicts b, never a.
for _ in $(seq 150); do [ -e "$CACHE/templates/$SHA_B" ] || break; sleep 0.2; done
if [ ! -e "$CACHE/templates/$SHA_B" ]; then
	:
else
	# One more task triggers the next pass.
	sleep 10; submit tnudge null 'true' > /dev/null; wait_final tnudge 120
fi
check "the unused template b is evicted" test ! -e "$CACHE/templates/$SHA_B"
check "template a, in use by the session, is not" test -e "$CACHE/templates/$SHA_A/rootfs.ext4"
metrics=$(curl -s -m 5 -H "Authorization: Bearer $TOKEN" "$URL/metrics")
check "/metrics counts the evictions" grep -qE "^kiln_host_template_evictions_total [1-9]" <<< "$metrics"
st=$(api DELETE /v1/sessions/s2)
check "the session ends" test "$st" = 200 -o "$st" = 204
stop_host

check "no QEMU left" test "$(count_qemu)" = "$before_q"
check "no cgroup left" test "$(count_cgroups)" = "$before_cg"
check "no mount left" test "$(count_mounts)" = "$before_m"
check "no VM directory left" test -z "$(ls -A "$KILN_RUN_DIR/h" 2> /dev/null | grep -v '^slots$')"
t_done
