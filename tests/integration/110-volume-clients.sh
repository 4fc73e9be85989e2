#!/usr/bin/env bash
# The clients of issue 41's volumes against a stand-in kiln-api
# (tests/integration/volume_api.py; no VM, no S3, so it runs where VMs
# cannot): the requests each sends (method, path, key, body) and what it
# makes of the answers, refusals included (a name taken, a quota, a second
# writer, a busy volume, no host to delete it, a checkpoint of a session
# with a read-write volume). The CLI (kiln volume create|list|get|delete,
# kiln session create --volume), kiln mcp's tools (create_volume,
# list_volumes, delete_volume, create_sandbox with volumes) and the Python
# SDK (tests/sdk/test_sdk_volumes.py, each of its tests one result), each
# against a stand-in of its own. The same clients against the real stack:
# 90-cli.sh, 94-python-sdk.sh, 95-mcp.sh.
. "$(dirname "$0")/lib.sh"
t_plan 37
t_require_tools jq python3
t_require_built kiln
KEY=kiln_vol_$RANDOM$RANDOM

# start_api NAME: a stand-in of its own in $T_TMP/NAME; API and REQ name it.
start_api() {
	mkdir -p "$T_TMP/$1"
	t_bg python3 "$ROOT/tests/integration/volume_api.py" "$T_TMP/$1" "$KEY" > "$T_TMP/$1/port"
	for _ in $(seq 100); do [ -s "$T_TMP/$1/port" ] && break; sleep 0.05; done
	[ -s "$T_TMP/$1/port" ] || t_bail "the stand-in kiln-api starts ($1)"
	API=http://127.0.0.1:$(cat "$T_TMP/$1/port")
	REQ=$T_TMP/$1/requests.jsonl
	touch "$REQ"
}

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
start_api cli
kiln volume create ws --size 64
VOL=$(o)
check "volume create --size 64: the id alone on stdout, exit 0; POST /v1/volumes {name, size_mib} with the key ($(req '[.method, .path, .body]'); $(e))" \
	[ "$RC" = 0 -a "$(o | wc -l)" = 1 -a "${VOL#vol_}" != "$VOL" \
	-a "$(req '[.method, .path, .body, .auth]')" = "[\"POST\",\"/v1/volumes\",{\"name\":\"ws\",\"size_mib\":64},\"Bearer $KEY\"]" \
	-a -n "$(grep "volume $VOL ws: 64 MiB" "$T_TMP/e")" ]
kiln volume create ref --json
check "volume create --json: the volume's JSON, no size in the body (kiln-api's default, 1024) ($(req .body))" \
	[ "$RC" = 0 -a "$(jq -c '[.name, .size_mib, .mounted_by]' "$T_TMP/o")" = '["ref",1024,[]]' -a "$(req .body)" = '{"name":"ref"}' ]
REF=$(jq -r .id "$T_TMP/o")
kiln volume create ws
check "volume create of a name taken: exit 1, the API's reason ($(e))" \
	[ "$RC" = 1 -a -n "$(grep 'HTTP 409 conflict' "$T_TMP/e")" -a ! -s "$T_TMP/o" ]
kiln volume create big --size 20000
check "volume create beyond max_volume_mib: exit 1, 400 ($(e))" [ "$RC" = 1 -a -n "$(grep 'HTTP 400 invalid_request' "$T_TMP/e")" ]
kiln volume list
check "volume list: a table, newest first, mounted by none ($(o | tr -s ' ' | tr '\n' ';'))" \
	[ "$RC" = 0 -a "$(head -n 1 "$T_TMP/o" | tr -s ' ')" = "ID NAME SIZE_MIB CREATED MOUNTED_BY" \
	-a "$(tail -n +2 "$T_TMP/o" | awk '{print $1 "," $2 "," $3 "," $NF}' | tr '\n' ' ')" = "$REF,ref,1024,- $VOL,ws,64,- " \
	-a "$(req .path)" = '"/v1/volumes"' ]

kiln session create --volume ws:/data --volume ref:/ref:ro --idle 60
SID=$(o)
check "session create --volume ws:/data --volume ref:/ref:ro: the volumes in the body; the id on stdout ($(req .body))" \
	[ "$RC" = 0 -a "${SID#s_}" != "$SID" -a "$(req '.body.volumes')" = '[{"name":"ws","path":"/data"},{"name":"ref","path":"/ref","read_only":true}]' ]
check "...and stderr says where each is mounted ($(e))" \
	[ -n "$(grep "volume ws ($VOL) mounted at /data, read-write" "$T_TMP/e")" -a -n "$(grep "volume ref ($REF) mounted at /ref, read-only" "$T_TMP/e")" ]
kiln session create --volume ws:/data
check "a second read-write mount: exit 1, volume_busy ($(e))" [ "$RC" = 1 -a -n "$(grep 'HTTP 409 volume_busy' "$T_TMP/e")" ]
kiln session create --volume ws:/mnt/ws:ro --json
RO=$(jq -r .id "$T_TMP/o")
check "a read-only mount beside the writer is fine (:ro) ($(jq -c .volumes "$T_TMP/o"))" \
	[ "$RC" = 0 -a "$(jq -c '[.volumes[] | [.name, .path, .read_only]]' "$T_TMP/o")" = '[["ws","/mnt/ws",true]]' ]
kiln session create --volume nope:/data
check "a volume that is not there: exit 1, kiln-api's reason ($(e))" [ "$RC" = 1 -a -n "$(grep 'no volume named nope' "$T_TMP/e")" ]
kiln volume get ws
check "volume get NAME: its fields, its mounts ($(o | tr -s ' ' | tr '\n' ';' | head -c 300))" \
	[ "$RC" = 0 -a "$(req .path)" = '"/v1/volumes/ws"' -a -n "$(grep "^id  *$VOL$" "$T_TMP/o")" -a -n "$(grep '^size  *64 MiB$' "$T_TMP/o")" \
	-a -n "$(grep "^mounted by  *$SID (rw), $RO (ro)$" "$T_TMP/o")" -a -n "$(grep '^stored  *- ' "$T_TMP/o")" ]
kiln volume delete ws
check "volume delete of a mounted volume: exit 1, volume_busy ($(e))" [ "$RC" = 1 -a -n "$(grep 'HTTP 409 volume_busy' "$T_TMP/e")" ]
kiln session fork "$SID"
check "session fork of a session with a read-write volume: exit 1, volume_attached ($(e))" \
	[ "$RC" = 1 -a -n "$(grep 'HTTP 409 volume_attached' "$T_TMP/e")" ]
kiln session rm "$SID"
kiln session rm "$RO"
kiln volume get "$VOL" --json
check "volume get ID --json once its sessions are gone: no mounts, bytes stored ($(jq -c '[.mounted_by, .bytes]' "$T_TMP/o"))" \
	[ "$RC" = 0 -a "$(jq -c '[.id, .mounted_by, .bytes]' "$T_TMP/o")" = "[\"$VOL\",[],4096]" ]
kiln volume delete ws
check "volume delete NAME: DELETE /v1/volumes/ws, \"ID deleted\" ($(o))" \
	[ "$RC" = 0 -a "$(o)" = "$VOL deleted" -a "$(req '[.method, .path]')" = '["DELETE","/v1/volumes/ws"]' ]
kiln volume get "$VOL"
check "...then it is not_found: exit 1 ($(e))" [ "$RC" = 1 -a -n "$(grep 'HTTP 404 not_found' "$T_TMP/e")" ]
kiln volume create nohost-cli
kiln volume delete nohost-cli
check "volume delete with no host to reach: exit 1, host_unavailable ($(e))" \
	[ "$RC" = 1 -a -n "$(grep 'HTTP 503 host_unavailable' "$T_TMP/e")" ]
kiln volume list --name ref --json
check "volume list --name ref --json: the name in the query, kiln-api's answer ($(req .path))" \
	[ "$RC" = 0 -a "$(req .path)" = '"/v1/volumes?name=ref"' -a "$(jq -c '[.volumes[].id]' "$T_TMP/o")" = "[\"$REF\"]" ]
ok=1 why=
for a in "volume create" "volume create a b" "volume create ../x" "volume create w --size 8" "volume create w --size 70000" \
	"volume create w --size x" "volume get ../x" "volume get" "volume delete a b" "volume list extra" "volume list --name a/b" \
	"volume frobnicate" "volume" "session create --volume ws" "session create --volume ws:data" "session create --volume ws:/" \
	"session create --volume ../x:/data" "session create --volume ws:/data:rx" \
	"session create --volume a:/a --volume b:/b --volume c:/c"; do
	# shellcheck disable=SC2086 # the words of a command line
	kiln $a
	[ "$RC" = 2 -a ! -s "$T_TMP/r" ] || { ok=0; why="$why [$a: exit $RC, $(wc -l < "$T_TMP/r") requests]"; }
done
check "bad usage of volume and --volume: exit 2, nothing sent$why" [ "$ok" = 1 ]

# ---- kiln mcp ----
start_api mcp
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

mcp create_volume '{"name":"mws","size_mib":32}' create_volume '{"name":"mref"}' create_volume '{"name":"mws"}' \
	create_volume '{"name":"m/x"}' create_volume '{"name":"x","size_mib":8}' list_volumes '{}' list_volumes '{"name":"mref"}'
check "tools/list: create_volume, list_volumes, delete_volume; create_sandbox takes volumes (an array of {name, path, read_only})" \
	[ "$(jq -c 'select(.id == 99) | [.result.tools[].name | select(test("volume"))]' "$T_TMP/mcp.out")" = '["create_volume","list_volumes","delete_volume"]' \
	-a "$(jq -c 'select(.id == 99) | .result.tools[] | select(.name == "create_sandbox") | .inputSchema.properties.volumes | [.type, .maxItems, .items.required]' "$T_TMP/mcp.out")" = '["array",2,["name","path"]]' ]
MVOL=$(sc 2 .volume_id | tr -d '"')
check "create_volume {name, size_mib}: POST /v1/volumes; volume_id, name, size_mib, mounted_by ($(sc 2 .))" \
	[ "${MVOL#vol_}" != "$MVOL" -a "$(sc 2 '[.name, .size_mib, .mounted_by]')" = '["mws",32,[]]' -a "$(res 2 | jq .isError)" = false \
	-a "$(sed -n 1p "$T_TMP/r" | jq -c '[.method, .path, .body]')" = '["POST","/v1/volumes",{"name":"mws","size_mib":32}]' ]
check "create_volume of a name taken: an error result with kiln-api's reason; a bad name or size: a bad argument, not sent ($(txt 4); $(txt 5); $(txt 6))" \
	[ "$(res 4 | jq .isError)" = true -a -n "$(txt 4 | grep conflict)" -a -n "$(txt 5 | grep 'bad argument')" -a -n "$(txt 6 | grep 'bad argument')" \
	-a "$(grep -c '"POST"' "$T_TMP/r")" = 3 ]
check "list_volumes: both, newest first, as volume_id; {name}: ?name= ($(sc 7 '[.volumes[].name]'); $(sc 8 '[.volumes[].name]'))" \
	[ "$(sc 7 '[.volumes[].name]')" = '["mref","mws"]' -a "$(sc 8 '[.volumes[].name]')" = '["mref"]' \
	-a "$(sc 7 '.volumes[1].volume_id')" = "\"$MVOL\"" -a "$(grep -c '/v1/volumes?name=mref' "$T_TMP/r")" = 1 ]

mcp create_sandbox '{"volumes":[{"name":"mws","path":"/data"},{"name":"mref","path":"/ref","read_only":true}],"idle_timeout":60}' \
	create_sandbox '{"volumes":[{"name":"mws","path":"/data"}]}' \
	create_sandbox '{"volumes":[{"name":"a","path":"/a"},{"name":"b","path":"/b"},{"name":"c","path":"/c"}]}' \
	create_sandbox '{"volumes":[{"name":"mws","path":"data"}]}' create_sandbox '{"volumes":[{"name":"mws","path":"/d","read_only":"yes"}]}' \
	create_sandbox '{"volumes":"mws"}' delete_volume '{"volume":"mws"}' list_volumes '{"name":"mws"}'
MS=$(sc 2 .sandbox_id | tr -d '"')
check "create_sandbox {volumes}: POST /v1/sessions with them; the sandbox lists its volumes ($(sc 2 .volumes))" \
	[ "$(sed -n 1p "$T_TMP/r" | jq -c .body.volumes)" = '[{"name":"mws","path":"/data"},{"name":"mref","path":"/ref","read_only":true}]' \
	-a "$(sc 2 '[.volumes[] | [.name, .path, .read_only]]')" = '[["mws","/data",false],["mref","/ref",true]]' \
	-a "$(sc 2 '.volumes[0].volume_id')" = "\"$MVOL\"" -a "$(res 2 | jq .isError)" = false ]
check "create_sandbox with a volume another sandbox writes: an error result, volume_busy ($(txt 3))" \
	[ "$(res 3 | jq .isError)" = true -a -n "$(txt 3 | grep volume_busy)" ]
check "create_sandbox with 3 volumes, a relative path, a read_only not boolean or volumes not a list: bad arguments, not sent ($(txt 4); $(txt 5); $(txt 6); $(txt 7))" \
	[ "$(for i in 4 5 6 7; do res $i | jq -r .isError; done | sort -u)" = true -a -n "$(txt 4 | grep 'at most 2')" \
	-a -n "$(txt 5 | grep 'absolute')" -a -n "$(txt 6 | grep 'true or false')" -a "$(grep -c '"/v1/sessions"' "$T_TMP/r")" = 2 ]
check "delete_volume of a mounted volume: an error result, volume_busy; list_volumes shows who mounts it ($(txt 8); $(sc 9 '.volumes[0].mounted_by'))" \
	[ "$(res 8 | jq .isError)" = true -a -n "$(txt 8 | grep volume_busy)" \
	-a "$(sc 9 '.volumes[0].mounted_by')" = "[{\"sandbox_id\":\"$MS\",\"read_only\":false}]" ]
mcp fork_sandbox "{\"sandbox_id\":\"$MS\"}" destroy_sandbox "{\"sandbox_id\":\"$MS\"}" delete_volume '{"volume":"mws"}' \
	delete_volume "{\"volume\":\"$MVOL\"}" delete_volume '{}' delete_volume '{"volume":"../x"}'
check "fork_sandbox of a sandbox with a read-write volume: an error result, volume_attached ($(txt 2))" \
	[ "$(res 2 | jq .isError)" = true -a -n "$(txt 2 | grep volume_attached)" ]
check "delete_volume {volume: name} once its sandbox is destroyed: DELETE /v1/volumes/mws, deleted by id; again: not_found ($(txt 4); $(txt 5))" \
	[ "$(txt 4)" = "deleted volume $MVOL" -a "$(res 5 | jq .isError)" = true -a -n "$(txt 5 | grep not_found)" \
	-a "$(jq -r 'select(.method == "DELETE") | .path | select(startswith("/v1/volumes"))' "$T_TMP/r" | head -n 2 | tr '\n' ' ')" = "/v1/volumes/mws /v1/volumes/$MVOL " ]
check "delete_volume without volume or with a bad one: bad arguments ($(txt 6); $(txt 7))" \
	[ "$(txt 6)" = 'delete_volume: bad argument: "volume" is required' -a -n "$(txt 7 | grep 'bad argument')" \
	-a "$(grep -c '"DELETE"' "$T_TMP/r")" = 3 ]

# ---- the Python SDK ----
start_api sdk
client_results -e "$T_TMP/sdk.err" sdk "$T_TMP/sdk.out" \
	env -i PATH=/usr/bin:/bin HOME="$T_TMP" PYTHONPATH="$ROOT/sdk/python" PYTHONDONTWRITEBYTECODE=1 \
	KILN_API="$API" KILN_KEY="$KEY" KILN_TEST_REQUESTS="$REQ" timeout -k 5 120 python3 "$ROOT/tests/sdk/test_sdk_volumes.py"
summary=$(grep '^sdk_volumes: ' "$T_TMP/sdk.out" | tail -n 1)
check "the SDK's tests ran to their end: ${summary:-no summary} ($C_N of 6)" \
	[ "$summary" = "sdk_volumes: 6 run, 0 failed" -a "$C_N" = 6 ]
[ -n "$summary" ] || echo "# $(tail -n 5 "$T_TMP/sdk.err")"
t_done
