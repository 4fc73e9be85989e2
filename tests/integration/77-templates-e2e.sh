#!/usr/bin/env bash
# Templates end to end: a real kiln-api, a real kiln-host (its /v1/builds:
# a build VM under TCG) and the real local S3. A recipe (a run step, env and
# workdir; no packages, so no mirror is needed) is created through kiln-api,
# its build followed on GET /v1/templates/{name}/events to ready, its image in
# S3 under _templates/<sha256>.ext4; a task naming it runs in it (sees the
# file the step wrote, the env, the workdir); deleting the template deletes
# its image from S3 once no task needs it. An OCI archive made with umoci is
# uploaded through kiln-api, imported by kiln-host, and a task runs in it as
# the image's user, in its directory, with its env. Nothing is left running.
# kiln-api or kiln-host not starting, or a kiln-host without /v1/builds, is
# a failure that ends the script.
. "$(dirname "$0")/lib.sh"
t_plan 16
require_image
t_require_tools swift-proxy-server memcached curl jq
BIN=${KILN_IT_BIN:-$ROOT/build}
KILN_HOST=$BIN/kiln-host
KILN_API=$BIN/kiln-api
S3TOOL=$ROOT/build/tests/s3tool
for b in "$KILN_API" "$KILN_HOST" "$S3TOOL"; do
	[ -x "$b" ] || t_skip_all "$b missing: run make and make unit"
done
S3_DIR=$T_TMP/s3
TOKEN=it-token-$RANDOM$RANDOM
ADMIN=it-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 12000))
HOST_PORT=$((API_PORT + 1))
API=http://127.0.0.1:$API_PORT
HOST=http://127.0.0.1:$HOST_PORT
BUCKET=kiln-tpl-e2e
host_pid=
api_pid=
before_qemu=$(count_qemu)
before_cg=$(count_cgroups)
s3_local_start
export S3_ENDPOINT S3_REGION S3_ACCESS_KEY S3_SECRET_KEY S3_BUCKET=$BUCKET
api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" '. + {host_lost_after_s: 10}'
host_config "$T_TMP/host.json" "127.0.0.1:$HOST_PORT" tpl-e2e ".api = \"$API\" | .cache = \"$T_TMP/cache\" | .heartbeat_ms = 500"
KILN_API_BIN=$KILN_API api_up "$T_TMP/api.json" "$API"
host_start "$T_TMP/host.json" host
live=
for _ in $(seq 600); do
	[ "$(admin "$API/v1/admin/hosts" | jq '[.hosts[] | select(.state == "live")] | length' 2> /dev/null)" = 1 ] && { live=1; break; }
	kill -0 "$host_pid" 2> /dev/null || break
	sleep 0.2
done
[ -n "$live" ] || t_bail "the kiln-host starts and registers with kiln-api" "$(tail -5 "$T_TMP/host.err")"
# /v1/builds/<unknown id>: a plain 404 (not_found), not the router's "no such endpoint".
st=$(curl -s -o "$T_TMP/builds.json" -w '%{http_code}' -m 5 -H "Authorization: Bearer $TOKEN" "$HOST/v1/builds/none")
[ "$st" = 404 ] && ! grep -q 'no such endpoint' "$T_TMP/builds.json" ||
	t_bail "kiln-host serves /v1/builds (GET /v1/builds/none: $st, want a plain 404)" "$(head -c 300 "$T_TMP/builds.json")"
ok "kiln-api and a kiln-host with /v1/builds start; the host registers"
admin -X POST --data '{"id":"acme"}' "$API/v1/admin/customers" > /dev/null
KEY=$(admin -X POST "$API/v1/admin/customers/acme/keys" | jq -r .key)
jqe() { jq -e "$@" > /dev/null 2>&1; }

recipe='{"name":"hello","run":["echo hi-from-template > /etc/hello"],"env":{"GREETING":"hey"},"workdir":"/srv"}'
t0=$SECONDS
cust -X POST --data "$recipe" "$API/v1/templates" > "$T_TMP/create.json"
check "POST /v1/templates: accepted ($(jq -c '{state,kind}' "$T_TMP/create.json"))" \
	jqe '.kind == "recipe" and (.state == "queued" or .state == "building")' "$T_TMP/create.json"
curl -s -N -m 1200 -H "Authorization: Bearer $KEY" "$API/v1/templates/hello/events" > "$T_TMP/events"
build_s=$((SECONDS - t0))
cust "$API/v1/templates/hello" > "$T_TMP/hello.json"
state=$(jq -r .state "$T_TMP/hello.json")
if [ "$state" = ready ]; then
	ok "the build ran on kiln-host and is ready in ${build_s} s ($(jq -r .size "$T_TMP/hello.json") bytes)"
else
	not_ok "the build is ready" "state $state: $(jq -c .error "$T_TMP/hello.json")" \
		"$(jq -r .build_log "$T_TMP/hello.json" | tail -5)" "$(tail -3 "$T_TMP/host.err")"
	t_done; exit 1
fi
check "its events stream relayed the build's log lines ($(grep -c '^event: log' "$T_TMP/events")) and ended with end {ready}" \
	sh -c "grep -q '^event: log' '$T_TMP/events' && grep '^data: ' '$T_TMP/events' | tail -1 | grep -q '\"state\":\"ready\"'"
sha=$(jq -r .sha256 "$T_TMP/hello.json")
"$S3TOOL" head "_templates/$sha.ext4" > "$T_TMP/head" 2>&1
check "its image is in S3 as _templates/$sha.ext4 ($(cat "$T_TMP/head"))" \
	grep -qx "size=$(jq -r .size "$T_TMP/hello.json")" "$T_TMP/head"
check "env and workdir come from the recipe" \
	jqe '(.env | index("GREETING=hey")) != null and .workdir == "/srv"' "$T_TMP/hello.json"

spec=$(jq -cn '{template:"hello", language:"sh", code:"cat /etc/hello; echo \"g=$GREETING\"; pwd"}')
tid=$(cust -X POST --data "$spec" "$API/v1/tasks" | jq -r .id)
for _ in $(seq 60); do
	cust "$API/v1/tasks/$tid?wait=30" > "$T_TMP/task.json"
	jq -e '.state | test("^(succeeded|failed|timed_out|cancelled|error)$")' "$T_TMP/task.json" > /dev/null && break
done
check "a task of the template runs in it: the step's file, the env, the workdir ($(jq -c '{state, stdout: .result.stdout}' "$T_TMP/task.json"))" \
	jqe '.state == "succeeded" and .result.stdout == "hi-from-template\ng=hey\n/srv\n" and .template == "hello"' "$T_TMP/task.json"

# A session of it: the template's files and env in every exec; it blocks the delete.
sid=$(cust -X POST --data '{"template":"hello"}' "$API/v1/sessions" | jq -r .id)
cust -X POST --data '{"argv":["sh","-c","cat /etc/hello; echo $GREETING"]}' "$API/v1/sessions/$sid/exec" > "$T_TMP/sexec.json"
check "a session of the template: its exec sees the step's file and the env ($(jq -c '{stdout}' "$T_TMP/sexec.json"))" \
	jqe '.stdout == "hi-from-template\nhey\n"' "$T_TMP/sexec.json"
st=$(curl -s -o "$T_TMP/del.json" -w '%{http_code}' -m 10 -X DELETE -H "Authorization: Bearer $KEY" "$API/v1/templates/hello")
check "DELETE while the session lives: 409 template_in_use ($st)" [ "$st" = 409 ]
curl -s -o /dev/null -m 60 -X DELETE -H "Authorization: Bearer $KEY" "$API/v1/sessions/$sid"
st=$(curl -s -o /dev/null -w '%{http_code}' -m 10 -X DELETE -H "Authorization: Bearer $KEY" "$API/v1/templates/hello")
gone=no
for _ in $(seq 100); do
	"$S3TOOL" head "_templates/$sha.ext4" > /dev/null 2>&1
	[ $? = 3 ] && { gone=yes; break; }
	sleep 0.2
done
check "DELETE ($st): with no task left using it, its image is deleted from S3" [ "$st" = 200 -a "$gone" = yes ]

# ---- an OCI archive (umoci-made, busybox inside) uploaded through kiln-api ----
if command -v umoci > /dev/null && [ -x /bin/busybox ]; then
	L=$T_TMP/layout; Bd=$T_TMP/bundle
	(
		set -e
		umoci init --layout "$L"
		umoci new --image "$L:t"
		umoci unpack --image "$L:t" "$Bd"
		R=$Bd/rootfs
		mkdir -p "$R/bin" "$R/etc" "$R/home/app"
		cp /bin/busybox "$R/bin/busybox"
		for a in sh cat id pwd env; do ln -s busybox "$R/bin/$a"; done
		printf 'root:x:0:0:root:/root:/bin/sh\napp:x:1234:2345::/home/app:/bin/sh\n' > "$R/etc/passwd"
		printf 'root:x:0:\napps:x:2345:\n' > "$R/etc/group"
		echo hello-from-oci > "$R/hello.txt"
		chown -R 1234:2345 "$R/home/app"
		umoci repack --image "$L:t" "$Bd"
		umoci config --image "$L:t" --config.env FOO=bar --config.workingdir /home/app --config.user app
		tar -C "$L" -cf "$T_TMP/oci.tar" .
	) > "$T_TMP/oci-build.log" 2>&1
	t0=$SECONDS
	st=$(curl -s -o "$T_TMP/oci.json" -w '%{http_code}' -m 120 -H "Authorization: Bearer $KEY" \
		-H 'Content-Type: application/x-tar' -X POST -T "$T_TMP/oci.tar" "$API/v1/templates?name=busy")
	check "an OCI archive ($(stat -c %s "$T_TMP/oci.tar") bytes) uploaded to kiln-api: $st" [ "$st" = 202 ]
	curl -s -N -m 600 -H "Authorization: Bearer $KEY" "$API/v1/templates/busy/events" > /dev/null
	cust "$API/v1/templates/busy" > "$T_TMP/busy.json"
	if jqe '.state == "ready"' "$T_TMP/busy.json"; then
		ok "imported by kiln-host and ready in $((SECONDS - t0)) s: $(jq -c '{env, workdir, uid, gid}' "$T_TMP/busy.json")"
	else
		not_ok "the OCI import is ready" "$(jq -c '{state, error}' "$T_TMP/busy.json")" "$(jq -r .build_log "$T_TMP/busy.json" | tail -3)"
	fi
	spec=$(jq -cn '{template:"busy", argv:["sh","-c","cat /hello.txt; id -u; pwd; echo $FOO"]}')
	tid=$(cust -X POST --data "$spec" "$API/v1/tasks" | jq -r .id)
	for _ in $(seq 60); do
		cust "$API/v1/tasks/$tid?wait=30" > "$T_TMP/otask.json"
		jq -e '.state | test("^(succeeded|failed|timed_out|cancelled|error)$")' "$T_TMP/otask.json" > /dev/null && break
	done
	check "a task runs in the image as its User, in its WorkingDir, with its Env ($(jq -c '{state, stdout: .result.stdout, stderr: .result.stderr}' "$T_TMP/otask.json"))" \
		jqe '.state == "succeeded" and .result.stdout == "hello-from-oci\n1234\n/home/app\nbar\n"' "$T_TMP/otask.json"
	oid=$(jq -r .id "$T_TMP/busy.json")
	gone=no
	for _ in $(seq 100); do
		"$S3TOOL" head "_templates/uploads/$oid.tar" > /dev/null 2>&1
		[ $? = 3 ] && { gone=yes; break; }
		sleep 0.2
	done
	check "the uploaded archive ($oid) is deleted from S3 once imported" [ "$gone" = yes -a "$oid" != null ]
else
	skip "an OCI archive end to end" "umoci or /bin/busybox missing"
fi

kill "$host_pid" "$api_pid"; wait "$host_pid" "$api_pid" 2> /dev/null; host_pid= api_pid=
check "no QEMU left ($(count_qemu) now, $before_qemu before)" [ "$(count_qemu)" = "$before_qemu" ]
check "no cgroup left ($(count_cgroups) now, $before_cg before)" [ "$(count_cgroups)" = "$before_cg" ]
t_done
