#!/usr/bin/env bash
# The clients of issue 41's fork and named snapshots against a stand-in
# kiln-api (tests/integration/snap_api.py; no VM, no S3, so it runs where VMs
# cannot): the requests each sends (method, path, key, body, the page
# tokens it follows) and what it makes of the answers, errors and partial
# forks included. The CLI (kiln session fork, kiln session create
# --snapshot, kiln snapshot create|list|get|delete), kiln mcp's tools
# (fork_sandbox, snapshot_sandbox, list_snapshots, delete_snapshot,
# create_sandbox with snapshot_id) and the Python SDK
# (tests/sdk/test_sdk_snapshots.py, each of its tests one result). The same
# clients against the real stack: 90-cli.sh, 94-python-sdk.sh, 95-mcp.sh.
. "$(dirname "$0")/lib.sh"
t_plan 41
t_require_tools jq python3
t_require_built kiln
KEY=kiln_snap_$RANDOM$RANDOM
t_bg python3 "$ROOT/tests/integration/snap_api.py" "$T_TMP" "$KEY" > "$T_TMP/port"
for _ in $(seq 100); do [ -s "$T_TMP/port" ] && break; sleep 0.05; done
[ -s "$T_TMP/port" ] || t_bail "the stand-in kiln-api starts"
API=http://127.0.0.1:$(cat "$T_TMP/port")
REQ=$T_TMP/requests.jsonl
touch "$REQ"

# kiln CMD...: stdout to $T_TMP/o, stderr to $T_TMP/e, exit status in RC;
# the requests it sent in $T_TMP/r (one JSON a line).
kiln() {
	local n
	n=$(wc -l < "$REQ")
	env -i PATH=/usr/bin:/bin HOME="$T_TMP" KILN_API="$API" KILN_KEY="$KEY" KILN_CREDENTIALS=/nonexistent \
		timeout 60 "$ROOT/build/kiln" "$@" > "$T_TMP/o" 2> "$T_TMP/e"
	RC=$?
	tail -n +$((n + 1)) "$REQ" > "$T_TMP/r"
}
o() { cat "$T_TMP/o"; }
e() { tr '\n' ' ' < "$T_TMP/e" | head -c 300; }
req() { jq -cS "$1" "$T_TMP/r" | tr '\n' ' ' | sed 's/ $//'; }

# ---- the CLI ----
kiln snapshot create s_run --name ready
SNAP=$(o)
check "snapshot create: the id alone on stdout, exit 0; POST /v1/sessions/s_run/snapshots {\"name\":\"ready\"} with the key ($(req '[.method, .path, .body]'))" \
	[ "$RC" = 0 -a "$(o | wc -l)" = 1 -a "${SNAP#snap_}" != "$SNAP" \
	-a "$(req '[.method, .path, .body, .auth]')" = "[\"POST\",\"/v1/sessions/s_run/snapshots\",{\"name\":\"ready\"},\"Bearer $KEY\"]" ]
check "...and says on stderr what it made: session, size, the session's stop ($(e))" \
	grep -q "snapshot $SNAP ready of session s_run: 68.6 MiB, template default, 1 vCPU, 256 MiB (the session stopped 12 ms)" "$T_TMP/e"
kiln snapshot create s_two --json
check "snapshot create --json: the snapshot's JSON, no name in the body ($(req .body))" \
	[ "$RC" = 0 -a "$(jq -r .session_id "$T_TMP/o")" = s_two -a "$(req .body)" = '{}' ]
kiln snapshot create s_paused
check "snapshot create of a paused session: exit 1, the API's reason ($(e))" \
	[ "$RC" = 1 -a -n "$(grep 'HTTP 409 not_running' "$T_TMP/e")" -a ! -s "$T_TMP/o" ]
for i in 1 2 3; do kiln snapshot create s_two --name "my snap"; done
kiln snapshot list
check "snapshot list: every page (2 a page: 3 requests, after=tok-2, tok-4), 5 rows newest first ($(req .path))" \
	[ "$RC" = 0 -a "$(req .path)" = '"/v1/snapshots?limit=100" "/v1/snapshots?limit=100&after=tok-2" "/v1/snapshots?limit=100&after=tok-4"' \
	-a "$(tail -n +2 "$T_TMP/o" | wc -l)" = 5 -a "$(tail -n 1 "$T_TMP/o" | cut -d' ' -f1)" = "$SNAP" ]
check "...a table: ID NAME SESSION VCPUS MEM_MIB SIZE CREATED ($(head -n 1 "$T_TMP/o" | tr -s ' '))" \
	[ "$(head -n 1 "$T_TMP/o" | tr -s ' ')" = "ID NAME SESSION VCPUS MEM_MIB SIZE CREATED" -a -n "$(grep "^$SNAP  *ready  *s_run  *1  *256  *68.6 MiB" "$T_TMP/o")" ]
kiln snapshot list --name "my snap" --json
check "snapshot list --name 'my snap' --json: the name escaped, all 3 across 2 pages in one list, next null ($(req .path))" \
	[ "$RC" = 0 -a "$(jq -c '[(.snapshots | length), ([.snapshots[].name] | unique), .next]' "$T_TMP/o")" = '[3,["my snap"],null]' \
	-a "$(req .path)" = '"/v1/snapshots?limit=100&name=my%20snap" "/v1/snapshots?limit=100&name=my%20snap&after=tok-2"' ]
kiln snapshot list --session s_run
check "snapshot list --session s_run: session_id in the query, only its snapshot ($(req .path))" \
	[ "$RC" = 0 -a "$(req .path)" = '"/v1/snapshots?limit=100&session_id=s_run"' -a "$(tail -n +2 "$T_TMP/o" | cut -d' ' -f1)" = "$SNAP" ]
kiln snapshot get "$SNAP"
check "snapshot get: its fields, one a line ($(o | tr -s ' ' | tr '\n' ';' | head -c 200))" \
	[ "$RC" = 0 -a "$(req .path)" = "\"/v1/snapshots/$SNAP\"" -a -n "$(grep '^name  *ready$' "$T_TMP/o")" \
	-a -n "$(grep '^session  *s_run$' "$T_TMP/o")" -a -n "$(grep '^size  *68.6 MiB$' "$T_TMP/o")" ]
kiln snapshot get "$SNAP" --json
check "snapshot get --json: kiln-api's JSON" [ "$RC" = 0 -a "$(jq -r .id "$T_TMP/o")" = "$SNAP" ]

kiln session create --snapshot "$SNAP" --idle 60
SID=$(o)
check "session create --snapshot: POST /v1/sessions {snapshot, idle_timeout_s}; the new id alone on stdout ($(req .body); $(e))" \
	[ "$RC" = 0 -a "${SID#s_}" != "$SID" -a "$(req '[.method, .path, .body]')" = "[\"POST\",\"/v1/sessions\",{\"idle_timeout_s\":60,\"snapshot\":\"$SNAP\"}]" \
	-a -n "$(grep "from snapshot $SNAP" "$T_TMP/e")" ]
ok=1
for a in "--memory 512" "--vcpus 2" "--template python-data" "--allow pypi.org:443"; do
	# shellcheck disable=SC2086 # each option and its value
	kiln session create --snapshot "$SNAP" $a
	[ "$RC" = 2 -a ! -s "$T_TMP/r" ] || ok=0
done
check "session create --snapshot with --memory, --vcpus, --template or --allow: exit 2, nothing sent ($(e))" [ "$ok" = 1 ]
kiln session create --snapshot snap_gone
check "session create --snapshot of a snapshot that is not there: exit 1, not_found ($(e))" \
	[ "$RC" = 1 -a -n "$(grep 'HTTP 404 not_found' "$T_TMP/e")" ]

kiln session fork s_run --count 3
check "session fork --count 3: three new ids, one a line, exit 0; POST /v1/sessions/s_run/fork {\"count\":3} ($(o | tr '\n' ' '); $(e))" \
	[ "$RC" = 0 -a "$(o | grep -c '^s_')" = 3 -a "$(o | sort -u | wc -l)" = 3 \
	-a "$(req '[.method, .path, .body]')" = '["POST","/v1/sessions/s_run/fork",{"count":3}]' -a -n "$(grep '3 of 3 children made (the parent stopped 7 ms)' "$T_TMP/e")" ]
kiln session fork s_run
check "session fork without --count: one child ($(req .body))" [ "$RC" = 0 -a "$(o | wc -l)" = 1 -a "$(req .body)" = '{"count":1}' ]
kiln session fork s_two --count 4
check "a partial fork: the 2 made printed, each refusal said on stderr, exit 1 ($(e))" \
	[ "$RC" = 1 -a "$(o | grep -c '^s_')" = 2 -a "$(grep -c 'a child was refused: quota_exceeded' "$T_TMP/e")" = 2 ]
kiln session fork s_full --count 2
check "a fork with no child made: nothing on stdout, exit 1 ($(e))" [ "$RC" = 1 -a ! -s "$T_TMP/o" ]
kiln session fork s_paused
check "fork of a paused session: exit 1, not_running ($(e))" [ "$RC" = 1 -a -n "$(grep 'HTTP 409 not_running' "$T_TMP/e")" ]
kiln session fork s_run --count 2 --json
check "session fork --json: kiln-api's answer ($(jq -c '[.parent, (.sessions | length), .errors]' "$T_TMP/o" 2> /dev/null))" \
	[ "$RC" = 0 -a "$(jq -c '[.parent, (.sessions | length), .errors]' "$T_TMP/o")" = '["s_run",2,[]]' ]

kiln snapshot delete "$SNAP"
check "snapshot delete: DELETE /v1/snapshots/ID, \"ID deleted\" ($(o))" \
	[ "$RC" = 0 -a "$(o)" = "$SNAP deleted" -a "$(req '[.method, .path]')" = "[\"DELETE\",\"/v1/snapshots/$SNAP\"]" ]
kiln snapshot delete "$SNAP"
check "...again: exit 1, not_found ($(e))" [ "$RC" = 1 -a -n "$(grep 'HTTP 404 not_found' "$T_TMP/e")" ]
ok=1 why=
for a in "session fork s_run --count 0" "session fork s_run --count 21" "session fork" "session fork ../x" \
	"snapshot get ../x" "snapshot delete" "snapshot get a b" "snapshot list extra" "snapshot create" \
	"snapshot create s_run extra" "snapshot frobnicate" "snapshot"; do
	# shellcheck disable=SC2086 # the words of a command line
	kiln $a
	[ "$RC" = 2 -a ! -s "$T_TMP/r" ] || { ok=0; why="$why [$a: exit $RC, $(wc -l < "$T_TMP/r") requests]"; }
done
check "bad usage of fork and snapshot: exit 2, nothing sent$why" [ "$ok" = 1 ]

# ---- kiln mcp ----
# mcp NAME ARGS [NAME ARGS]...: one initialize, then each pair a tools/call
# (ids from 2); the answers in $T_TMP/mcp.out.
mcp() {
	local i=2 n
	n=$(wc -l < "$REQ")
	{
		echo '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}'
		echo '{"jsonrpc":"2.0","method":"notifications/initialized"}'
		echo '{"jsonrpc":"2.0","id":99,"method":"tools/list"}'
		while [ $# -ge 2 ]; do
			jq -cn --argjson id "$i" --arg name "$1" --argjson args "$2" '{jsonrpc:"2.0",id:$id,method:"tools/call",params:{name:$name,arguments:$args}}'
			i=$((i + 1))
			shift 2
		done
	} | env -i PATH=/usr/bin:/bin HOME="$T_TMP" KILN_API="$API" KILN_KEY="$KEY" KILN_CREDENTIALS=/nonexistent \
		timeout 60 "$ROOT/build/kiln" mcp > "$T_TMP/mcp.out" 2> "$T_TMP/mcp.err"
	tail -n +$((n + 1)) "$REQ" > "$T_TMP/r"
}
res() { jq -c "select(.id == $1) | .result" "$T_TMP/mcp.out"; }
sc() { res "$1" | jq -c ".structuredContent | $2"; }
txt() { res "$1" | jq -r '.content[0].text' | head -c 300; }

mcp snapshot_sandbox '{"sandbox_id":"s_run","name":"mcp"}' snapshot_sandbox '{"sandbox_id":"s_two","name":"mcp"}' \
	snapshot_sandbox '{"sandbox_id":"s_run","name":"mcp"}' snapshot_sandbox '{"sandbox_id":"s_paused"}' \
	list_snapshots '{"name":"mcp"}' list_snapshots '{}'
names=$(jq -c '[.result.tools[]?.name]' "$T_TMP/mcp.out" | grep -v '^\[\]$')
check "tools/list: fork_sandbox, snapshot_sandbox, list_snapshots, delete_snapshot; create_sandbox takes snapshot_id ($names)" \
	[ "$(jq -c '[.[] | select(. == "fork_sandbox" or . == "snapshot_sandbox" or . == "list_snapshots" or . == "delete_snapshot")]' <<< "$names")" = '["fork_sandbox","snapshot_sandbox","list_snapshots","delete_snapshot"]' \
	-a "$(jq -r 'select(.id == 99) | .result.tools[] | select(.name == "create_sandbox") | .inputSchema.properties.snapshot_id.type' "$T_TMP/mcp.out")" = string ]
MSNAP=$(sc 2 .snapshot_id | tr -d '"')
check "snapshot_sandbox: POST /v1/sessions/s_run/snapshots {\"name\":\"mcp\"}; snapshot_id, name, sandbox_id, size ($(sc 2 .))" \
	[ "${MSNAP#snap_}" != "$MSNAP" -a "$(sc 2 '[.name, .sandbox_id, .bytes, .template]')" = '["mcp","s_run",71892992,"default"]' \
	-a "$(res 2 | jq .isError)" = false -a "$(sed -n 1p "$T_TMP/r" | jq -c '[.path, .body]')" = '["/v1/sessions/s_run/snapshots",{"name":"mcp"}]' ]
check "snapshot_sandbox of a paused sandbox: an error result that says not_running ($(txt 5))" \
	[ "$(res 5 | jq .isError)" = true -a -n "$(txt 5 | grep not_running)" ]
check "list_snapshots {name}: all 3 across 2 pages, newest first, as snapshot_id/sandbox_id ($(sc 6 '[.snapshots[].sandbox_id]'))" \
	[ "$(sc 6 '[.snapshots[].sandbox_id]')" = '["s_run","s_two","s_run"]' -a "$(sc 6 '.snapshots[2].snapshot_id')" = "\"$MSNAP\"" \
	-a "$(grep -c '/v1/snapshots?limit=100&name=mcp' "$T_TMP/r")" = 2 ]
check "list_snapshots {}: every snapshot (the CLI's 4 left and the 3 here: 7) ($(sc 7 '.snapshots | length'))" \
	[ "$(sc 7 '.snapshots | length')" = 7 ]

mcp create_sandbox "{\"snapshot_id\":\"$MSNAP\",\"idle_timeout\":120}" create_sandbox "{\"snapshot_id\":\"$MSNAP\",\"memory_mib\":512}" \
	create_sandbox '{"snapshot_id":"../etc"}' fork_sandbox '{"sandbox_id":"s_run","count":2}' \
	fork_sandbox '{"sandbox_id":"s_two","count":3}' fork_sandbox '{"sandbox_id":"s_full"}' \
	fork_sandbox '{"sandbox_id":"s_run","count":21}' delete_snapshot "{\"snapshot_id\":\"$MSNAP\"}" \
	delete_snapshot "{\"snapshot_id\":\"$MSNAP\"}" delete_snapshot '{}'
check "create_sandbox {snapshot_id}: POST /v1/sessions {snapshot, idle_timeout_s}; the sandbox names its snapshot ($(sc 2 .))" \
	[ "$(sed -n 1p "$T_TMP/r" | jq -c .body)" = "{\"snapshot\":\"$MSNAP\",\"idle_timeout_s\":120}" -a "$(sc 2 .snapshot_id)" = "\"$MSNAP\"" \
	-a "$(res 2 | jq .isError)" = false ]
check "create_sandbox {snapshot_id, memory_mib} and a snapshot_id that is not an id: error results, nothing sent ($(txt 3))" \
	[ "$(res 3 | jq .isError)" = true -a "$(res 4 | jq .isError)" = true -a -n "$(txt 3 | grep 'leave out')" \
	-a "$(grep -c '"path": "/v1/sessions"' "$T_TMP/r")" = 1 ]
check "fork_sandbox {count 2}: POST .../fork {\"count\":2}; two sandbox_ids, no errors ($(sc 5 '[.parent, .sandbox_ids, .errors, .stop_ms]'))" \
	[ "$(sc 5 '[.parent, (.sandbox_ids | length), .errors, .stop_ms, (.sandboxes[0].state)]')" = '["s_run",2,[],7,"running"]' \
	-a "$(res 5 | jq .isError)" = false -a "$(grep '/fork' "$T_TMP/r" | head -n 1 | jq -c .body)" = '{"count":2}' ]
check "fork_sandbox, partly refused: the 2 made and the refusal, not an error result ($(sc 6 '[(.sandbox_ids | length), .errors]'))" \
	[ "$(sc 6 '[(.sandbox_ids | length), (.errors | length), .errors[0].code]')" = '[2,1,"quota_exceeded"]' -a "$(res 6 | jq .isError)" = false ]
check "fork_sandbox with none made: an error result with the refusal ($(sc 7 .errors))" \
	[ "$(res 7 | jq .isError)" = true -a "$(sc 7 '[.sandbox_ids, (.errors | length)]')" = '[[],1]' ]
check "fork_sandbox {count 21}: a bad argument, not sent ($(txt 8))" \
	[ "$(txt 8)" = 'fork_sandbox: bad argument: "count" must be an integer from 1 to 20' -a "$(grep -c '/fork' "$T_TMP/r")" = 3 ]
check "delete_snapshot: DELETE /v1/snapshots/ID; again: an error result, not_found; none given: a bad argument ($(txt 9); $(txt 10); $(txt 11))" \
	[ "$(txt 9)" = "deleted snapshot $MSNAP" -a "$(res 10 | jq .isError)" = true -a -n "$(txt 10 | grep not_found)" \
	-a "$(txt 11)" = 'delete_snapshot: bad argument: "snapshot_id" is required' ]

# ---- the Python SDK ----
client_results -e "$T_TMP/sdk.err" sdk "$T_TMP/sdk.out" \
	env -i PATH=/usr/bin:/bin HOME="$T_TMP" PYTHONPATH="$ROOT/sdk/python" PYTHONDONTWRITEBYTECODE=1 \
	KILN_API="$API" KILN_KEY="$KEY" KILN_TEST_REQUESTS="$REQ" timeout -k 5 120 python3 "$ROOT/tests/sdk/test_sdk_snapshots.py"
summary=$(grep '^sdk_snapshots: ' "$T_TMP/sdk.out" | tail -n 1)
check "the SDK's tests ran to their end: ${summary:-no summary} ($C_N of 6)" \
	[ "$summary" = "sdk_snapshots: 6 run, 0 failed" -a "$C_N" = 6 ]
[ -n "$summary" ] || echo "# $(tail -n 5 "$T_TMP/sdk.err")"
t_done
