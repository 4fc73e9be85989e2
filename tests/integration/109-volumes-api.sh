#!/usr/bin/env bash
# Volumes through kiln-api (docs/api.md "Volumes") over two real kiln-hosts
# (real VMs, a local S3): a volume is created; session A mounts it
# read-write, writes and syncs a file; a second read-write mount is 409
# volume_busy while a read-only one beside it works (and cannot write);
# snapshot and fork of A are 409 volume_attached; DELETE of the mounted
# volume is 409 volume_busy; A destroyed, the volume is in S3 under
# acme/volumes/ID/ and its bytes show; A's host stopped, session B (on the
# other host) reads the file; another customer's GET/DELETE are 404 and its
# mount 400; max_volumes makes the next one 429; after the last destroy
# DELETE is 200 and every object is gone from S3; E2B's POST/GET/DELETE
# /volumes and volumeMounts on POST /v2/sandboxes with curl; nothing left.
. "$(dirname "$0")/lib.sh"
t_plan 48
require_image
t_require_tools swift-proxy-server memcached python3 jq curl
t_require_python boto3
t_require_built kiln-api kiln-host

S3_DIR=$T_TMP/s3
TOKEN=vol-api-token-$RANDOM$RANDOM$RANDOM
ADMIN=vol-api-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 10000))
URL=http://127.0.0.1:$API_PORT
BUCKET=kiln-vols-api
api_pid=
h_pids=()
s3_local_start
t_mark

api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" '. + {host_lost_after_s: 3, quotas: {submit_rate: 1000, submit_burst: 1000}}'
api_up "$T_TMP/api.json" "$URL"

start_host() { # N: host hN on API_PORT+N
	local port=$((API_PORT + $1))
	host_config "$T_TMP/h$1.json" "127.0.0.1:$port" "h$1" \
		".api = \"$URL\" | .heartbeat_ms = 500 | .run_dir += \"/h$1\" | .capacity.cpu_overcommit = 4"
	host_start "$T_TMP/h$1.json" "h$1"
	h_pids[$1]=$host_pid
}
stop_host() { t_stop "${h_pids[$1]}"; h_pids[$1]=; }
live_hosts() { admin "$URL/v1/admin/hosts" | jq '[.hosts[] | select(.state == "live")] | length'; }
req() {
	local key=$1 m=$2 p=$3; shift 3
	curl -s -m 900 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $key" \
		-H 'Content-Type: application/json' "$@" "$URL$p"
}
e2b() { # KEY METHOD PATH [curl args]: E2B's control API (X-API-KEY)
	local key=$1 m=$2 p=$3; shift 3
	curl -s -m 900 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "X-API-KEY: $key" \
		-H 'Content-Type: application/json' "$@" "$URL/e2b$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
expect() { # NAME STATUS GOT [jq condition]
	local name=$1 want=$2 got=$3 cond=${4:-true}
	if [ "$got" = "$want" ] && { [ "$cond" = true ] || [ "$(last "$cond")" = true ]; }; then ok "$name"
	else not_ok "$name" "status $got (want $want), body: $(head -c 600 "$T_TMP/last")"; fi
}
sh_ex() { req "$1" POST "/v1/sessions/$2/exec" --data-binary "$(jq -cn --arg s "$3" '{argv: ["sh", "-c", $s]}')"; }
# out KEY ID SCRIPT: stdout and stderr of sh -c SCRIPT in the session
out() { sh_ex "$1" "$2" "$3" > /dev/null; echo "$(last .stdout)$(last .stderr)"; }
s3l() { S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY BUCKET=$BUCKET \
	python3 "$ROOT/tests/integration/s3_layers.py" "$@"; }
mount_body() { # NAME PATH [read_only]: a create body mounting one volume
	jq -cn --arg n "$1" --arg p "$2" --argjson ro "${3:-false}" '{idle_timeout_s: 900, volumes: [{name: $n, path: $p, read_only: $ro}]}'
}

start_host 1
start_host 2
# A first start creates the VM snapshot: minutes.
for _ in $(seq 3000); do [ "$(live_hosts)" = 2 ] && break; sleep 0.2; done
if [ "$(live_hosts)" = 2 ]; then ok "two kiln-hosts register with kiln-api"
else t_bail "hosts register" "$(tail -3 "$T_TMP/h1.err") $(tail -3 "$T_TMP/h2.err")"; fi

admin -X POST --data '{"id":"acme","quotas":{"max_running":8,"max_vcpus":8,"max_memory_mib":8192,"max_volumes":2}}' \
	"$URL/v1/admin/customers" > /dev/null
admin -X POST --data '{"id":"beta"}' "$URL/v1/admin/customers" > /dev/null
KA=$(admin -X POST "$URL/v1/admin/customers/acme/keys" | jq -r .key)
KB=$(admin -X POST "$URL/v1/admin/customers/beta/keys" | jq -r .key)

# ---- a volume ----
expect "POST /v1/volumes: 201 with its id, name, size and no mounts" 201 \
	"$(req "$KA" POST /v1/volumes --data-binary '{"name":"work","size_mib":64}')" \
	'(.id | test("^vol_[0-9a-f]{24}$")) and .name == "work" and .size_mib == 64 and .mounted_by == []'
V=$(last .id)
expect "the same name again: 409 conflict" 409 "$(req "$KA" POST /v1/volumes --data-binary '{"name":"work"}')" \
	'.error.code == "conflict"'
expect "GET by name: never written, bytes null" 200 "$(req "$KA" GET /v1/volumes/work)" \
	".id == \"$V\" and .bytes == null"

# ---- A writes it ----
st=$(req "$KA" POST /v1/sessions --data-binary "$(mount_body work /work)")
expect "session A mounts it read-write: 201, its volumes" 201 "$st" \
	".state == \"running\" and .volumes == [{\"name\":\"work\",\"id\":\"$V\",\"path\":\"/work\",\"read_only\":false}]"
[ "$st" = 201 ] || t_bail "session A starts (everything below uses it)" "$(tail -3 "$T_TMP/h1.err") $(tail -3 "$T_TMP/h2.err")"
A=$(last .id)
AH=$(last .host)
check "A writes and syncs /work/f" [ "$(out "$KA" "$A" 'echo hello-volume > /work/f && sync && cat /work/f')" = hello-volume ]
expect "a second read-write mount: 409 volume_busy naming A" 409 \
	"$(req "$KA" POST /v1/sessions --data-binary "$(mount_body work /w)")" \
	"(.error.code == \"volume_busy\") and (.error.message | contains(\"$A\"))"
st=$(req "$KA" POST /v1/sessions --data-binary "$(mount_body work /ro true)")
expect "a read-only mount beside it: 201" 201 "$st" '.volumes[0].read_only == true'
R=$(last .id)
check "the read-only mount is there and cannot be written" \
	[ "$(out "$KA" "$R" 'grep -q " /ro ext4 ro" /proc/mounts && echo m; touch /ro/x 2>/dev/null || echo ro')" = "$(printf 'm\nro')" ]
expect "snapshot of A: 409 volume_attached" 409 "$(req "$KA" POST "/v1/sessions/$A/snapshots" --data-binary '{}')" \
	'.error.code == "volume_attached"'
expect "fork of A: 409 volume_attached" 409 "$(req "$KA" POST "/v1/sessions/$A/fork" --data-binary '{"count":1}')" \
	'.error.code == "volume_attached"'
expect "the volume shows both mounts" 200 "$(req "$KA" GET "/v1/volumes/$V")" \
	"[.mounted_by[] | [.session_id, .read_only]] == [[\"$A\", false], [\"$R\", true]]"
expect "DELETE while mounted: 409 volume_busy" 409 "$(req "$KA" DELETE "/v1/volumes/$V")" '.error.code == "volume_busy"'

# ---- A destroyed: the volume is in S3 ----
expect "A destroyed" 200 "$(req "$KA" DELETE "/v1/sessions/$A")" '.state == "destroyed"'
check "its manifest is in S3 under acme/volumes/$V/" [ "$(s3l count "acme/volumes/$V/manifest.json")" = 1 ]
check "... with no orphan chunk" [ "$(s3l orphans "acme/volumes/$V/" | wc -l)" = 0 ]
expect "GET shows its bytes, the reader still mounting it" 200 "$(req "$KA" GET "/v1/volumes/$V")" \
	".bytes > 0 and [.mounted_by[].session_id] == [\"$R\"]"
expect "the destroyed A still names its volume" 200 "$(req "$KA" GET "/v1/sessions/$A")" '.volumes[0].name == "work"'
req "$KA" DELETE "/v1/sessions/$R" > /dev/null

# ---- B, on the other host, reads it ----
n=${AH#h}
stop_host "$n"
for _ in $(seq 100); do [ "$(live_hosts)" = 1 ] && break; sleep 0.2; done
check "A's host $AH is stopped and seen lost" [ "$(live_hosts)" = 1 ]
st=$(req "$KA" POST /v1/sessions --data-binary "$(mount_body work /data)")
expect "session B mounts it read-write on the other host" 201 "$st" ".host != \"$AH\" and .volumes[0].id == \"$V\""
B=$(last .id)
check "B reads what A synced" [ "$(out "$KA" "$B" 'cat /data/f')" = hello-volume ]

# ---- another customer ----
expect "another customer's GET: 404" 404 "$(req "$KB" GET "/v1/volumes/$V")" '.error.code == "not_found"'
expect "another customer's DELETE: 404" 404 "$(req "$KB" DELETE "/v1/volumes/$V")" '.error.code == "not_found"'
expect "another customer's mount by name: 400 (it has no such volume)" 400 \
	"$(req "$KB" POST /v1/sessions --data-binary "$(mount_body work /w true)")" '.error.code == "invalid_request"'
expect "another customer's list: empty" 200 "$(req "$KB" GET /v1/volumes)" '.volumes == []'

# ---- quota ----
expect "a second volume (max_volumes 2)" 201 "$(req "$KA" POST /v1/volumes --data-binary '{"name":"two","size_mib":16}')"
V2=$(last .id)
expect "a third: 429 quota_exceeded naming max_volumes" 429 \
	"$(req "$KA" POST /v1/volumes --data-binary '{"name":"three","size_mib":16}')" \
	'.error.code == "quota_exceeded" and (.error.message | contains("max_volumes"))'
expect "usage counts them" 200 "$(req "$KA" GET /v1/usage)" '.usage.volumes == 2 and .quotas.max_volumes == 2'

# ---- deleted once nothing mounts it ----
expect "B destroyed" 200 "$(req "$KA" DELETE "/v1/sessions/$B")" '.state == "destroyed"'
expect "DELETE after the last destroy: 200" 200 "$(req "$KA" DELETE "/v1/volumes/$V")" \
	".id == \"$V\" and .deleted == true"
check "every object of the volume is gone from S3" [ "$(s3l count "acme/volumes/$V/")" = 0 ]
expect "GET: 404" 404 "$(req "$KA" GET "/v1/volumes/$V")"
expect "a mount by its name now: 400 (no such volume)" 400 \
	"$(req "$KA" POST /v1/sessions --data-binary "$(mount_body work /w)")" '.error.code == "invalid_request"'
expect "the second one deleted (never written)" 200 "$(req "$KA" DELETE "/v1/volumes/$V2")"

# ---- E2B ----
expect "E2B POST /volumes: 201 {volumeID, name, token, domain}" 201 \
	"$(e2b "$KA" POST /volumes --data-binary '{"name":"e2b-vol"}')" \
	'(.volumeID | test("^vol_")) and .name == "e2b-vol" and .token == null and .domain == null'
EV=$(last .volumeID)
expect "E2B GET /volumes lists it" 200 "$(e2b "$KA" GET /volumes)" "[.[].volumeID] == [\"$EV\"]"
expect "E2B GET /volumes/{id}" 200 "$(e2b "$KA" GET "/volumes/$EV")" ".volumeID == \"$EV\" and .name == \"e2b-vol\""
expect "E2B GET of another customer's: 404" 404 "$(e2b "$KB" GET "/volumes/$EV")"
st=$(e2b "$KA" POST /v2/sandboxes --data-binary '{"templateID":"base","timeout":300,"volumeMounts":[{"name":"e2b-vol","path":"/home/user/vol"}]}')
expect "E2B create with volumeMounts: 201" 201 "$st" '(.sandboxID | length) > 0'
SB=$(last .sandboxID)
expect "getInfo shows volumeMounts" 200 "$(e2b "$KA" GET "/sandboxes/$SB")" \
	'.volumeMounts == [{"name":"e2b-vol","path":"/home/user/vol"}]'
expect "a second sandbox mounting it: 409" 409 \
	"$(e2b "$KA" POST /v2/sandboxes --data-binary '{"volumeMounts":[{"name":"e2b-vol","path":"/v"}]}')" '.code == 409'
expect "E2B DELETE while mounted: 409" 409 "$(e2b "$KA" DELETE "/volumes/$EV")" '.code == 409'
expect "the sandbox killed: 204" 204 "$(e2b "$KA" DELETE "/sandboxes/$SB")"
expect "E2B DELETE /volumes/{id}: 204" 204 "$(e2b "$KA" DELETE "/volumes/$EV")"
expect "again: 404" 404 "$(e2b "$KA" DELETE "/volumes/$EV")" '.code == 404'
expect "/volumecontent: 404 saying kiln has none" 404 "$(e2b "$KA" GET "/volumecontent/$EV/file?path=/a")" \
	'.message | contains("volumecontent")'

expect "nothing holds the quota now" 200 "$(req "$KA" GET /v1/usage)" '.usage.running == 0 and .usage.volumes == 0'
t_stop "$api_pid"
for n in 1 2; do [ -n "${h_pids[$n]:-}" ] && stop_host "$n"; done
t_nothing_left "nothing left: no QEMU, VM directories, cgroups, mounts or slot locks"
t_done
