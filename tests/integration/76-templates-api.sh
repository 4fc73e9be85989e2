#!/usr/bin/env bash
# kiln-api's templates (docs/templates.md, docs/api.md "Templates") with a
# real kiln-api, the real local S3 (Swift s3api) and a fake kiln-host
# (fake_host.py with a state directory: it answers /v1/builds and lists
# templates in its heartbeats): public built-ins from heartbeats, create,
# list, get, events, delete; another customer gets 404; duplicates 409;
# quotas (max_templates 429, max_template_mib 413 for an OCI upload, declared
# or chunked); an OCI archive stored in S3 and its upload deleted once built;
# builds relayed to ready / failed with their log; a build the host forgets
# queued again; a delete while building cancels it on the host; tasks with an
# unknown / not ready template refused; the TREF and the merged env/cwd
# arriving at the host with a task and a session; a session blocks the
# delete (409 template_in_use); a task queued when its template is deleted
# still goes out with its TREF; a long build log is kept capped and its
# stream says what it skipped; max_streams counts template event streams; a
# restart of kiln-api loses nothing (queued builds are placed, running ones
# followed again).
. "$(dirname "$0")/lib.sh"
t_plan 50
t_require_tools swift-proxy-server memcached jq curl
KILN_API=${KILN_IT_BIN:-$ROOT/build}/kiln-api
S3TOOL=$ROOT/build/tests/s3tool
[ -x "$KILN_API" ] || t_skip_all "$KILN_API missing: run make"
[ -x "$S3TOOL" ] || t_skip_all "$S3TOOL missing: run make unit"
KILN_API_BIN=$KILN_API
PY=/usr/bin/python3
PORT=$((20000 + RANDOM % 12000))
HPORT=$((PORT + 1))
API=http://127.0.0.1:$PORT
ADMIN=it-admin-$RANDOM$RANDOM$RANDOM
TOKEN=it-token-$RANDOM$RANDOM
BUCKET=kiln-templates
STATE=$T_TMP/host
api_pid=
s3_local_start
export S3_ENDPOINT S3_REGION S3_ACCESS_KEY S3_SECRET_KEY S3_BUCKET=$BUCKET
mkdir -p "$STATE" "$T_TMP/spool"
start_api() { TMPDIR=$T_TMP/spool api_start "$T_TMP/api.json" "$API"; }
# A random port may be taken: another one, a few times, before giving up.
for attempt in 1 2 3 4 5; do
	api_config "$T_TMP/api.json" "127.0.0.1:$PORT" \
		'. + {host_lost_after_s: 5, quotas: {submit_rate: 1000, submit_burst: 1000, max_templates: 4}}'
	start_api && break
	t_stop "$api_pid"
	grep -q 'Address already in use' "$T_TMP/api.err" || attempt=5
	[ "$attempt" = 5 ] && t_bail "kiln-api starts" "$(tail -3 "$T_TMP/api.err")"
	PORT=$((20000 + RANDOM % 12000)); HPORT=$((PORT + 1)); API=http://127.0.0.1:$PORT
	: > "$T_TMP/api.err"
done
t_bg $PY "$ROOT/tests/integration/fake_host.py" "$HPORT" "$API" "$TOKEN" "$T_TMP/count" "$STATE" 2> "$T_TMP/fake.err"
admin() { curl -s -m 30 -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' "$@"; }
# as KEY ARGS...: a customer's request; the body in $T_TMP/out, the status printed
as() { local k=$1; shift; curl -s -m 60 -o "$T_TMP/out" -w '%{http_code}' -H "Authorization: Bearer $k" "$@"; }
asj() { local k=$1; shift; as "$k" -H 'Content-Type: application/json' "$@"; }
out() { jq -r "$1" "$T_TMP/out" 2> /dev/null; }
jqe() { jq -e "$@" > /dev/null 2>&1; }
for _ in $(seq 100); do
	[ "$(admin "$API/v1/admin/hosts" | jq '[.hosts[] | select(.state == "live")] | length' 2> /dev/null)" = 1 ] && break
	sleep 0.1
done
admin -X POST --data '{"id":"acme"}' "$API/v1/admin/customers" > /dev/null
admin -X POST --data '{"id":"bob"}' "$API/v1/admin/customers" > /dev/null
A=$(admin -X POST "$API/v1/admin/customers/acme/keys" | jq -r .key)
B=$(admin -X POST "$API/v1/admin/customers/bob/keys" | jq -r .key)
# wait_state KEY NAME STATE SECONDS
wait_state() {
	local deadline=$((SECONDS + $4))
	while [ $SECONDS -lt "$deadline" ]; do
		as "$1" "$API/v1/templates/$2" > /dev/null
		[ "$(out .state)" = "$3" ] && return 0
		sleep 0.2
	done
	return 1
}

# ---- public built-ins ----
st=$(as "$A" "$API/v1/templates")
check "GET /v1/templates lists the host's built-ins as public and ready ($st: $(out '[.templates[].name] | join(",")'))" \
	jqe '.templates | map(select(.public and .state == "ready" and .kind == "builtin") | .name) | sort == ["default", "python-data"]' "$T_TMP/out"

# ---- a recipe: created, built, relayed ----
recipe='{"name":"data","packages":["jq"],"run":["echo hi > /etc/hi"],"env":{"LANG":"C.UTF-8"},"workdir":"/srv"}'
st=$(asj "$A" -X POST --data "$recipe" "$API/v1/templates")
check "POST /v1/templates (a recipe): 202, queued or building ($st $(out .state))" \
	[ "$st" = 202 -a "$(out .name)" = data ]
jqe '.state == "queued" or .state == "building"' "$T_TMP/out" || not_ok "its first state" "$(cat "$T_TMP/out")"
if wait_state "$A" data ready 20; then
	ok "the build on the (fake) host is followed to ready"
else not_ok "the build reaches ready" "$(cat "$T_TMP/out")" "$(tail -3 "$T_TMP/api.err")"; fi
as "$A" "$API/v1/templates/data" > /dev/null
check "GET /v1/templates/data: sha256, size, env and workdir from the TREF, the build log relayed" \
	jqe '(.sha256 | length) == 64 and .size == 1048576 and .workdir == "/srv" and (.env | index("FROM_TEMPLATE=yes")) != null
	     and (.build_log | contains("installing jq")) and (.build_log | contains("build done")) and .public == false
	     and .attempts == 1 and (.build_seconds | type) == "number"' "$T_TMP/out"
check "the host got the recipe with the quota's timeout_s and max_bytes" \
	jqe '.recipe.name == "data" and .timeout_s == 1800 and .max_bytes == 4294967296' \
	"$(ls -t "$STATE"/builds/*.json | tail -1)"
curl -s -m 5 -H "Authorization: Bearer $A" "$API/v1/templates/data/events" > "$T_TMP/events"
check "GET .../events replays the log lines and ends with end {state:ready} ($(grep -c '^event: log' "$T_TMP/events") log events)" \
	sh -c "grep -q '\"line\":\"installing jq\"' '$T_TMP/events' && tail -3 '$T_TMP/events' | grep -q '^event: end' &&
	       grep '^data: ' '$T_TMP/events' | tail -1 | grep -q '\"state\":\"ready\"'"

# ---- names, isolation ----
st=$(asj "$A" -X POST --data "$recipe" "$API/v1/templates")
check "the same name again: 409 duplicate ($st $(out .error.code))" [ "$st" = 409 -a "$(out .error.code)" = duplicate ]
st=$(asj "$A" -X POST --data '{"name":"python-data"}' "$API/v1/templates")
check "a public template's name: 409 duplicate ($st: $(out .error.message))" [ "$st" = 409 -a "$(out .error.code)" = duplicate ]
st=$(asj "$A" -X POST --data '{"name":"Bad Name"}' "$API/v1/templates")
check "an invalid recipe: 400 invalid_recipe ($st $(out .error.code))" [ "$st" = 400 -a "$(out .error.code)" = invalid_recipe ]
st=$(as "$B" "$API/v1/templates/data"); b1=$(out .error.code)
st2=$(as "$B" "$API/v1/templates/nope"); b2=$(out .error.code)
check "customer B: acme's template is 404 not_found, exactly as a missing one ($st $b1 / $st2 $b2)" \
	[ "$st" = 404 -a "$st2" = 404 -a "$b1" = not_found -a "$b2" = not_found ]
as "$B" "$API/v1/templates" > /dev/null
check "customer B's list has no acme template" jqe '[.templates[].name] | index("data") == null' "$T_TMP/out"
st=$(as "$B" -X DELETE "$API/v1/templates/data")
check "customer B cannot delete it (404)" [ "$st" = 404 ]
st=$(as "$B" "$API/v1/templates/data/events")
check "nor follow its events (404)" [ "$st" = 404 ]

# ---- a failing build ----
st=$(asj "$A" -X POST --data '{"name":"broken","run":["true","exit 3"]}' "$API/v1/templates")
if wait_state "$A" broken failed 20; then
	check "a failing build: failed, error build_failed naming the step, its log kept ($(out .error.message))" \
		jqe '.error.code == "build_failed" and (.error.message | contains("run[1]")) and (.build_log | contains("build failed"))' "$T_TMP/out"
else not_ok "a failing build ends failed" "$(cat "$T_TMP/out")"; fi

# ---- a build its host forgets: queued again ----
asj "$A" -X POST --data '{"name":"forgetful"}' "$API/v1/templates" > /dev/null
if wait_state "$A" forgetful ready 30; then
	check "a build the host forgot (404) is queued again and ends ready on attempt 2 ($(out .attempts))" \
		[ "$(out .attempts)" = 2 ]
else not_ok "a forgotten build is re-queued" "$(cat "$T_TMP/out")" "$(grep forgetful "$T_TMP/api.err" | tail -3)"; fi

# ---- max_templates (4 for acme: data, broken, forgetful, slow1) ----
asj "$A" -X POST --data '{"name":"slow1"}' "$API/v1/templates" > /dev/null
st=$(asj "$A" -X POST --data '{"name":"fifth"}' "$API/v1/templates")
check "a fifth template: 429 quota_exceeded naming max_templates ($st: $(out .error.message))" \
	eval '[ "$st" = 429 -a "$(out .error.code)" = quota_exceeded ] && [[ "$(out .error.message)" == *max_templates* ]]'

# ---- tasks: unknown, not ready, ready ----
task() { jq -cn --arg t "$1" --argjson x "${2:-{\}}" '{argv:["env"], template:$t} + $x'; }
st=$(asj "$A" -X POST --data "$(task nope)" "$API/v1/tasks")
check "a task of an unknown template: 404 not_found \"no template named nope\" ($st)" \
	[ "$st" = 404 -a "$(out .error.message)" = "no template named nope" ]
wait_state "$A" slow1 building 10
st=$(asj "$A" -X POST --data "$(task slow1)" "$API/v1/tasks")
check "a task of a template still building: 409 template_not_ready ($st $(out .error.code))" \
	[ "$st" = 409 -a "$(out .error.code)" = template_not_ready ]
st=$(asj "$B" -X POST --data "$(task data)" "$API/v1/tasks")
check "customer B's task naming acme's template: 404 ($st)" [ "$st" = 404 ]
st=$(asj "$A" -X POST --data "$(task data '{"env":{"LANG":"fr_FR"}}')" "$API/v1/tasks")
tid=$(out .id)
for _ in $(seq 100); do [ -s "$STATE/tasks/$tid.json" ] && break; sleep 0.1; done
sha=$(as "$A" "$API/v1/templates/data" > /dev/null; out .sha256)
check "the task's TREF reaches the host with it, the template's env and workdir merged (the task's LANG wins)" \
	jqe --arg sha "$sha" '.template.sha256 == $sha and .template.s3_key == "_templates/\($sha).ext4" and
	     .template.name == "data" and .spec.env.FROM_TEMPLATE == "yes" and .spec.env.LANG == "fr_FR" and
	     .spec.cwd == "/srv"' "$STATE/tasks/$tid.json"
as "$A" "$API/v1/tasks/$tid" > /dev/null
check "GET /v1/tasks/{id} names its template" [ "$(out .template)" = data ]
st=$(asj "$A" -X POST --data "$(task python-data)" "$API/v1/tasks")
tid2=$(out .id)
for _ in $(seq 100); do [ -s "$STATE/tasks/$tid2.json" ] && break; sleep 0.1; done
check "a built-in's TREF is {name, builtin:true}" \
	jqe '.template == {"name":"python-data","builtin":true}' "$STATE/tasks/$tid2.json"
st=$(asj "$A" -X POST --data '{"argv":["true"]}' "$API/v1/tasks")
tid3=$(out .id)
for _ in $(seq 100); do [ -s "$STATE/tasks/$tid3.json" ] && break; sleep 0.1; done
check "a default task has no TREF" jqe 'has("template") | not' "$STATE/tasks/$tid3.json"

# ---- sessions: the TREF on create; a live session blocks the delete ----
st=$(asj "$A" -X POST --data '{"template":"forgetful"}' "$API/v1/sessions")
sid=$(out .id)
check "a session of a template: created ($st, template $(out .template)), its TREF sent to the host" \
	jqe '.template.name == "forgetful" and (.template.sha256 | length) == 64' "$STATE/sessions/$sid.json"
check "the session's JSON names its template" [ "$(out .template)" = forgetful ]
asj "$A" -X POST --data '{"argv":["env"],"env":{"X":"1"}}' "$API/v1/sessions/$sid/exec" > /dev/null
check "a session's exec gets the template's env (its own kept) and workdir" \
	jqe '.env.FROM_TEMPLATE == "yes" and .env.X == "1" and .cwd == "/srv"' "$STATE/sessions/$sid-exec.json"
st=$(as "$A" -X DELETE "$API/v1/templates/forgetful")
check "DELETE while a live session uses it: 409 template_in_use ($st $(out .error.code))" \
	[ "$st" = 409 -a "$(out .error.code)" = template_in_use ]
st=$(as "$A" -X POST "$API/v1/sessions/$sid/pause"); st2=$(as "$A" -X POST "$API/v1/sessions/$sid/resume")
check "paused ($st) and resumed ($st2): the resume carries the same TREF" \
	jqe --slurpfile c "$STATE/sessions/$sid.json" '.template == $c[0].template and .template.name == "forgetful"' \
	"$STATE/sessions/$sid-resume.json"
as "$A" -X DELETE "$API/v1/sessions/$sid" > /dev/null

# ---- delete while a task is queued: the task keeps its template ----
touch "$STATE/full"
sleep 1.5 # two heartbeats: the host reports itself full
st=$(asj "$A" -X POST --data "$(task data)" "$API/v1/tasks")
tq=$(out .id)
sleep 0.5
as "$A" "$API/v1/tasks/$tq" > /dev/null
qs=$(out .state)
st=$(as "$A" -X DELETE "$API/v1/templates/data")
check "DELETE of a template a queued task ($qs) uses: 200" [ "$st" = 200 -a "$qs" = queued ]
st=$(as "$A" "$API/v1/templates/data")
check "it is gone (404)" [ "$st" = 404 ]
rm -f "$STATE/full"
for _ in $(seq 100); do [ -s "$STATE/tasks/$tq.json" ] && break; sleep 0.1; done
check "the queued task still goes to the host with the deleted template's TREF" \
	jqe --arg sha "$sha" '.template.sha256 == $sha and .spec.env.FROM_TEMPLATE == "yes"' "$STATE/tasks/$tq.json"

# ---- delete while building cancels the build on its host ----
bid=$(as "$A" "$API/v1/templates/slow1" > /dev/null; out .id)
admin -X PUT --data '{"max_streams":1}' "$API/v1/admin/customers/acme/quotas" > /dev/null
curl -s -N -m 30 -H "Authorization: Bearer $A" "$API/v1/templates/slow1/events" > "$T_TMP/slow.events" &
ev_pid=$!
for _ in $(seq 50); do grep -q '^event: state' "$T_TMP/slow.events" && break; sleep 0.1; done
st=$(as "$A" "$API/v1/templates/slow1/events")
check "a second events stream over max_streams (1): 429 too_many_streams ($st $(out .error.code))" \
	[ "$st" = 429 -a "$(out .error.code)" = too_many_streams ]
st=$(as "$A" -X DELETE "$API/v1/templates/slow1")
wait "$ev_pid"
check "the stream following a template deleted while building ends with end {state:deleted}" \
	sh -c "grep '^data: ' '$T_TMP/slow.events' | tail -1 | grep -q '\"state\":\"deleted\"'"
admin -X PUT --data '{"max_streams":16}' "$API/v1/admin/customers/acme/quotas" > /dev/null
for _ in $(seq 100); do [ -s "$STATE/cancelled/$bid.json" ] && break; sleep 0.1; done
check "DELETE while building: 200 and the host's build is cancelled (DELETE /v1/builds/$bid)" \
	[ "$st" = 200 -a -s "$STATE/cancelled/$bid.json" ]

# ---- OCI archives: the cap, the upload in S3 ----
admin -X PUT --data '{"max_template_mib":1}' "$API/v1/admin/customers/bob/quotas" > /dev/null
head -c $((2 << 20)) /dev/urandom > "$T_TMP/big.tar"
head -c $((100 << 10)) /dev/urandom > "$T_TMP/small.tar"
st=$(as "$B" -X POST -H 'Content-Type: application/x-tar' --data-binary @"$T_TMP/big.tar" "$API/v1/templates?name=img")
check "an OCI archive over max_template_mib (Content-Length): 413 too_large before the body ($st $(out .error.code))" \
	[ "$st" = 413 -a "$(out .error.code)" = too_large ]
head -c $((1536 << 10)) "$T_TMP/big.tar" > "$T_TMP/mid.tar"
st=$(as "$B" -X POST -H 'Content-Type: application/x-tar' -H 'Transfer-Encoding: chunked' \
	--data-binary @"$T_TMP/mid.tar" "$API/v1/templates?name=img")
check "1.5 MiB chunked (no Content-Length): dropped past the cap, 413 too_large at its end ($st $(out .error.code))" \
	[ "$st" = 413 -a "$(out .error.code)" = too_large ]
st=$(as "$B" -X POST -H 'Content-Type: application/x-tar' -H 'Transfer-Encoding: chunked' \
	--data-binary @"$T_TMP/big.tar" "$API/v1/templates?name=img")
check "2 MiB chunked (past twice the cap): the connection is closed ($st)" [ "$st" = 100 -o "$st" = 000 ]
check "nothing is left in kiln-api's spool" [ -z "$(ls "$T_TMP/spool")" ]
st=$(as "$B" -X POST -H 'Content-Type: application/x-tar' --data-binary @"$T_TMP/small.tar" "$API/v1/templates")
check "an OCI archive without ?name=: 400 ($st)" [ "$st" = 400 ]
st=$(as "$B" -X POST -H 'Content-Type: application/x-tar' --data-binary @"$T_TMP/small.tar" "$API/v1/templates?name=img")
oid=$(out .id)
check "an OCI archive under the cap: 202 kind oci ($st)" [ "$st" = 202 -a "$(out .kind)" = oci ]
body=$(ls -t "$STATE"/builds/*.json 2> /dev/null | head -1)
for _ in $(seq 100); do [ -s "$STATE/builds/$oid.json" ] && break; sleep 0.1; done
check "the host is asked to import it from S3: oci {s3_key _templates/uploads/$oid.tar, size 102400}" \
	jqe --arg k "_templates/uploads/$oid.tar" '.oci.s3_key == $k and .oci.size == 102400 and .name == "img"' \
	"$STATE/builds/$oid.json"
wait_state "$B" img ready 20
gone=no
for _ in $(seq 100); do
	"$S3TOOL" head "_templates/uploads/$oid.tar" > /dev/null 2>&1
	[ $? = 3 ] && { gone=yes; break; }
	sleep 0.2
done
check "once built, its upload is deleted from S3" [ "$gone" = yes ]
check "nothing is left in kiln-api's spool after it" [ -z "$(ls "$T_TMP/spool")" ]

# ---- a long build log: the row keeps its last 64 KiB, the stream says what it skipped ----
asj "$B" -X POST --data '{"name":"spammy","run":["spam 1500"]}' "$API/v1/templates" > /dev/null
wait_state "$B" spammy ready 30
check "a 150 KB build log: the template keeps its last 64 KiB ($(out '.build_log | length') bytes), up to the end" \
	jqe '(.build_log | length) <= 65536 and (.build_log | length) > 60000 and (.build_log | endswith("build done\n"))' "$T_TMP/out"
curl -s -m 10 -H "Authorization: Bearer $B" "$API/v1/templates/spammy/events" > "$T_TMP/spam.events"
first=$(grep -m1 '^event: ' "$T_TMP/spam.events")
check "its events stream starts with truncated {skipped_bytes}, then whole lines to the end ($first, $(grep -c '^event: log' "$T_TMP/spam.events") lines)" \
	sh -c "[ '$first' = 'event: truncated' ] && grep '^data: {\"line\"' '$T_TMP/spam.events' | head -1 | grep -q '\"line\":\"[0-9]\{6\} s'"

# ---- a restart of kiln-api keeps the rows; a queued build is built after it,
# one building is followed again (its host answers 409 to the new POST) ----
asj "$B" -X POST --data '{"name":"slow-r"}' "$API/v1/templates" > /dev/null
wait_state "$B" slow-r building 10
touch "$STATE/full"
sleep 1.5
asj "$B" -X POST --data '{"name":"after-restart"}' "$API/v1/templates" > /dev/null
t_stop "$api_pid"
rm -f "$STATE/full"
start_api
if wait_state "$B" after-restart ready 30; then
	ok "a template queued before a restart of kiln-api is built after it"
else not_ok "queued build survives a restart" "$(cat "$T_TMP/out")"; fi
sleep 1
as "$B" "$API/v1/templates/slow-r" > /dev/null
check "a build running across the restart is still building, same attempt ($(out .state), attempts $(out .attempts))" \
	[ "$(out .state)" = building -a "$(out .attempts)" = 1 ]
rid=$(out .id)
as "$B" -X DELETE "$API/v1/templates/slow-r" > /dev/null
for _ in $(seq 100); do [ -s "$STATE/cancelled/$rid.json" ] && break; sleep 0.1; done
check "and deleting it then cancels it on its host" [ -s "$STATE/cancelled/$rid.json" ]
as "$B" "$API/v1/templates/img" > /dev/null
check "the OCI template is still there and ready" [ "$(out .state)" = ready ]
kill "$api_pid"; wait "$api_pid"; rc=$?; api_pid=
check "kiln-api stops cleanly on SIGTERM (exit $rc), nothing from a sanitizer on its stderr" \
	sh -c "[ $rc = 0 ] && ! grep -q 'Sanitizer\|runtime error' '$T_TMP/api.err'"
t_done
