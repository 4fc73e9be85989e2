#!/usr/bin/env bash
# Sessions across kiln-api replicas: three replicas (A, B, C) on one
# PostgreSQL (scripts/pg-local.sh), one kiln-host on loopback heartbeating
# to C, a local S3; every replica's session reaper runs (every 500 ms).
# A session created on A runs commands and takes files on B, gives them
# back on C, pauses on B, resumes on C and runs on A with its files. What
# one replica has in flight is a lease in the store that every reaper
# respects: an exec of 6 s on A in a session with a 2 s idle limit is not
# ended by B's or C's reaper (then, idle, it is); a pause under way on A is
# not settled by another replica as a leftover. A replica SIGKILLed during
# an exec or a pause: its lease lapses (about 5 s) and another replica's
# reaper settles the session (idle: destroyed; pausing: paused or running
# as its host says), not before; the killed replica restarts and serves.
# PostgreSQL stopped for longer than a lease lives under an exec: once it
# is back the exec's replica renews its lease before any reaper judges.
# No lease is left in the store, nothing on the host. On main (requests in
# flight known to their own replica only) the long exec's session is
# destroyed under it and the pause settled under it.
. "$(dirname "$0")/lib.sh"
t_plan 27
require_image
t_require_tools swift-proxy-server jq curl
t_require_built kiln-api kiln-host
ls /usr/lib/postgresql/*/bin/postgres > /dev/null 2>&1 || t_skip_all "no PostgreSQL server: run scripts/deps.sh"
PSQL=$(ls /usr/lib/postgresql/*/bin/psql 2> /dev/null | sort -V | tail -1)
[ -x "$PSQL" ] || PSQL=$(command -v psql) || { echo "1..0 # SKIP no psql: run scripts/deps.sh"; exit 0; }

S3_DIR=$T_TMP/s3
TOKEN=rs-token-$RANDOM$RANDOM$RANDOM
ADMIN=rs-admin-$RANDOM$RANDOM$RANDOM
BASE=$((20000 + RANDOM % 11000))
BUCKET=kiln-replica-sessions
api_pids=()
host_pid=
t_on_exit 'rm -rf "$KILN_RUN_DIR/h1"'
before_cg=$(count_cgroups)
pg_start || t_bail "PostgreSQL (scripts/pg-local.sh) starts"
s3_local_start

url() { echo "http://127.0.0.1:$((BASE + $1))"; } # replicas 0 (A), 1 (B), 2 (C)
start_api() { # r
	local r=$1
	api_config "$T_TMP/api$r.json" "127.0.0.1:$((BASE + r))" "del(.db) + {store: {postgres: \"$T_PG_URL\"}, host_lost_after_s: 10}"
	api_start "$T_TMP/api$r.json" "$(url "$r")" "api$r"
	local rc=$?
	api_pids[$r]=$api_pid
	return $rc
}
# on R KEY METHOD PATH [curl args]: the status; the body in $T_TMP/last
on() {
	local r=$1 k=$2 m=$3 p=$4; shift 4
	curl -s -m 120 -o "$T_TMP/last" -w '%{http_code}' -H "Authorization: Bearer $k" -X "$m" "$@" "$(url "$r")$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
ex() { on "$1" "$KEY" POST "/v1/sessions/$2/exec" -H 'Content-Type: application/json' --data-binary "$3"; }
state_on() { # R ID: the session's state seen on replica R
	curl -s -m 10 -H "Authorization: Bearer $KEY" "$(url "$1")/v1/sessions/$2" | jq -r '.state // "?"'
}
reason_on() { curl -s -m 10 -H "Authorization: Bearer $KEY" "$(url "$1")/v1/sessions/$2" | jq -r '.end_reason // ""'; }
# wait_state R ID REGEX SECONDS: until the state seen on R matches
wait_state() {
	local dl=$((SECONDS + $4))
	while [ "$SECONDS" -lt "$dl" ]; do [[ $(state_on "$1" "$2") =~ $3 ]] && return 0; sleep 0.2; done
	return 1
}
leases() { "$PSQL" "$T_PG_URL" -Atc "SELECT count(*) FROM session_leases WHERE expires_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint"; }
# check (lib.sh's), with the last body and the replicas' last log lines when it fails
check() {
	local name=$1; shift
	if "$@"; then ok "$name"
	else not_ok "$name" "failed: $*" "body: $(head -c 300 "$T_TMP/last")" "$(tail -n 2 "$T_TMP"/api*.err)"; fi
}
settled_logs() { cat "$T_TMP"/api*.err | grep -c 'no request behind it' || true; }

ok_all=1
for r in 0 1 2; do start_api "$r" || ok_all=0; done
if [ "$ok_all" = 1 ]; then ok "three kiln-api replicas start on one PostgreSQL"
else t_bail "replicas start" "$(tail -3 "$T_TMP"/api*.err)"; fi
check "the store has the session_leases table (migration 8)" [ "$(leases)" = 0 ]

host_config "$T_TMP/h1.json" "127.0.0.1:$((BASE + 3))" h1 ".api = \"$(url 2)\" | .heartbeat_ms = 500 | .run_dir += \"/h1\""
host_start "$T_TMP/h1.json" h1
live() { on "$1" "$ADMIN" GET /v1/admin/hosts > /dev/null; last '[.hosts[] | select(.state == "live")] | length'; }
for _ in $(seq 3000); do [ "$(live 2)" = 1 ] && break; sleep 0.2; done
lv=1; for r in 0 1 2; do [ "$(live "$r")" = 1 ] || lv=0; done
if [ "$lv" = 1 ]; then ok "the kiln-host heartbeats to C; every replica sees it live"
else t_bail "host live" "$(tail -3 "$T_TMP/h1.err")"; fi

on 0 "$ADMIN" POST /v1/admin/customers -H 'Content-Type: application/json' --data '{"id":"acme"}' > /dev/null
on 1 "$ADMIN" POST /v1/admin/customers/acme/keys > /dev/null; KEY=$(last .key)

# ---- one session, any replica ----
st=$(on 0 "$KEY" POST /v1/sessions -H 'Content-Type: application/json' --data '{"idle_timeout_s":600}')
S1=$(last .id)
check "create on A: 201 running on h1" [ "$st" = 201 -a "$(last .state)" = running -a "$(last .host)" = h1 ]
st=$(ex 1 "$S1" '{"argv":["sh","-c","echo from-b > /work/b.txt; cat /work/b.txt"]}')
check "exec on B: its stdout" [ "$st" = 200 -a "$(last .stdout)" = from-b ]
head -c 100000 /dev/urandom > "$T_TMP/blob"
st=$(on 1 "$KEY" PUT "/v1/sessions/$S1/files?path=/work/blob.bin" --data-binary @"$T_TMP/blob")
on 2 "$KEY" GET "/v1/sessions/$S1/files?path=/work/blob.bin" > /dev/null
same=$(cmp -s "$T_TMP/last" "$T_TMP/blob" && echo yes)
check "a file put on B is read back on C byte for byte" [ "$st" = 200 -a "$same" = yes ]
st=$(on 1 "$KEY" POST "/v1/sessions/$S1/pause")
check "pause on B: paused (A and C agree)" [ "$st" = 200 -a "$(state_on 0 "$S1")" = paused -a "$(state_on 2 "$S1")" = paused ]
st=$(on 2 "$KEY" POST "/v1/sessions/$S1/resume")
check "resume on C: running" [ "$st" = 200 -a "$(last .state)" = running ]
st=$(ex 0 "$S1" '{"argv":["cat","/work/b.txt"]}')
check "exec on A after the resume: the file B's exec wrote" [ "$st" = 200 -a "$(last .stdout)" = from-b ]
check "no request in flight: no live lease in the store" [ "$(leases)" = 0 ]

# ---- a long exec on A, a 2 s idle limit, B's and C's reapers ticking ----
on 0 "$KEY" POST /v1/sessions -H 'Content-Type: application/json' --data '{"idle_timeout_s":2}' > /dev/null
S2=$(last .id)
ex 0 "$S2" '{"argv":["sh","-c","sleep 6; echo done"],"timeout_s":30}' > "$T_TMP/long.status" &
long=$!
mid=""; nl=0
for _ in $(seq 20); do
	sleep 0.2; mid="$mid $(state_on 1 "$S2")"
	[ "$nl" = 0 ] && nl=$(leases)
done
wait "$long"
st=$(cat "$T_TMP/long.status")
check "while A's exec runs (6 s) past the 2 s idle limit, B sees it running throughout" \
	[ "$(echo "$mid" | tr ' ' '\n' | sort -u | grep -v '^$')" = running ]
check "A's exec holds a live lease in the store meanwhile" [ "$nl" -ge 1 ]
check "the exec of 6 s completes on A (exit 0, its stdout)" [ "$st" = 200 -a "$(last .stdout)" = done -a "$(last .exit_code)" = 0 ]
wait_state 1 "$S2" '^destroyed$' 15
check "idle afterwards, it is ended by a reaper (destroyed, idle_timeout)" \
	[ "$(state_on 1 "$S2")" = destroyed -a "$(reason_on 1 "$S2")" = idle_timeout ]

# ---- a pause under way on A: no other replica takes it for a leftover ----
before=$(settled_logs)
st=$(on 0 "$KEY" POST "/v1/sessions/$S1/pause")
check "pause on A: 200, paused everywhere with its snapshot" \
	[ "$st" = 200 -a "$(last .state)" = paused -a "$(state_on 1 "$S1")" = paused -a "$(state_on 2 "$S1")" = paused ]
check "no replica settled it meanwhile as a leftover" [ "$(settled_logs)" = "$before" ]
st=$(on 1 "$KEY" POST "/v1/sessions/$S1/resume")
check "resume on B: running" [ "$st" = 200 -a "$(last .state)" = running ]

# ---- A SIGKILLed during an exec: its lease lapses, then B or C ends it ----
on 2 "$KEY" POST /v1/sessions -H 'Content-Type: application/json' --data '{"idle_timeout_s":2}' > /dev/null
S3=$(last .id)
t_bg ex 0 "$S3" '{"argv":["sleep","60"],"timeout_s":120}' > /dev/null
long=$T_BG_PID
for _ in $(seq 50); do [ "$(leases)" -ge 1 ] && break; sleep 0.1; done
sleep 1
t_stop "${api_pids[0]}" KILL; wait "$long" 2> /dev/null
t0=$SECONDS
sleep 1.5
check "A killed during an exec: 1.5 s later its lease still keeps the idle session running" [ "$(state_on 1 "$S3")" = running ]
wait_state 1 "$S3" '^destroyed$' 30
check "once A's lease lapsed, another replica's reaper ended it (destroyed, idle_timeout, $((SECONDS - t0)) s)" \
	[ "$(state_on 1 "$S3")" = destroyed -a "$(reason_on 2 "$S3")" = idle_timeout ]
start_api 0 || not_ok "A restarts" "$(tail -3 "$T_TMP/api0.err")"
st=$(ex 0 "$S1" '{"argv":["cat","/work/b.txt"]}')
check "A restarted (a new lease owner): exec on A" [ "$st" = 200 -a "$(last .stdout)" = from-b ]

# ---- A SIGKILLed during a pause: settled by another replica once its lease lapsed ----
# S3 frozen (its proxy SIGSTOPped) holds the pause in pausing: the host
# cannot finish the snapshot's upload until the thaw, so the window is not a
# race. A 64 MiB process gives the pause something to upload.
ex 1 "$S1" '{"argv":["sh","-c","python3 -c \"import os, time; b = os.urandom(64 << 20); time.sleep(3600)\" > /dev/null 2>&1 & sleep 2"]}' > /dev/null
before=$(settled_logs)
s3_local_freeze
t_bg on 0 "$KEY" POST "/v1/sessions/$S1/pause" > /dev/null
pz=$T_BG_PID
caught=0
for _ in $(seq 200); do [ "$(state_on 1 "$S1")" = pausing ] && { caught=1; break; }; sleep 0.05; done
if [ "$caught" = 1 ]; then
	t_stop "${api_pids[0]}" KILL; wait "$pz" 2> /dev/null
	t0=$SECONDS
	sleep 1.5
	check "A killed during a pause: 1.5 s later no replica has settled it yet (its lease lives)" \
		[ "$(state_on 1 "$S1")" = pausing -a "$(settled_logs)" = "$before" ]
	s3_local_thaw
	wait_state 2 "$S1" '^(paused|running)$' 40
	s=$(state_on 2 "$S1")
	n=$(settled_logs)
	check "once A's lease lapsed, another replica settled it ($s, as its host says, $((SECONDS - t0)) s)" \
		[ \( "$s" = paused -o "$s" = running \) -a "$n" -gt "$before" ]
	start_api 0 || not_ok "A restarts" "$(tail -3 "$T_TMP/api0.err")"
else
	s3_local_thaw
	wait "$pz" 2> /dev/null
	not_ok "A killed during a pause" "the pause was never seen in pausing, though S3 was frozen (state $(state_on 1 "$S1"))"
	not_ok "settled after A's lease lapsed" "no pause caught in pausing"
fi
st=$(on 0 "$KEY" GET "/v1/sessions/$S1"); s=$(last .state)
check "A serves again; the session is paused or running ($s)" [ "$st" = 200 -a \( "$s" = paused -o "$s" = running \) ]

# ---- PostgreSQL away longer than a lease lives, an exec in flight on A ----
# Its lease lapses meanwhile (A cannot renew it); once the database is back
# the reapers give A time to renew before judging the idle session.
on 0 "$KEY" POST /v1/sessions -H 'Content-Type: application/json' --data '{"idle_timeout_s":2}' > /dev/null
S4=$(last .id)
ex 0 "$S4" '{"argv":["sh","-c","sleep 16; echo survived"],"timeout_s":60}' > "$T_TMP/long.status" &
long=$!
for _ in $(seq 50); do [ "$(leases)" -ge 1 ] && break; sleep 0.1; done
"$ROOT/scripts/pg-local.sh" stop "$T_PG_DIR" > /dev/null 2>&1
sleep 7
"$ROOT/scripts/pg-local.sh" start "$T_PG_DIR" > /dev/null 2>&1
wait "$long"
st=$(cat "$T_TMP/long.status")
s=$(state_on 1 "$S4")
check "PostgreSQL stopped 7 s under A's exec: the exec completes and the idle session was not ended ($s)" \
	[ "$st" = 200 -a "$(last .stdout)" = survived -a "$s" = running ]

# ---- nothing left ----
for s in "$S1" "$S2" "$S3" "$S4"; do on 2 "$KEY" DELETE "/v1/sessions/$s" > /dev/null; done
check "every session destroyed" [ "$(state_on 0 "$S1")" = destroyed -a "$(state_on 1 "$S3")" = destroyed ]
nl=$("$PSQL" "$T_PG_URL" -Atc "SELECT count(*) FROM session_leases")
check "no live lease left (rows: $nl, the killed A's lapsed ones until the clean-up)" [ "$(leases)" = 0 ]
t_stop "$host_pid"; host_pid=
for r in 0 1 2; do t_stop "${api_pids[$r]}"; done
api_pids=()
"$ROOT/scripts/s3-local.sh" stop "$S3_DIR" 2> /dev/null
d=$T_PG_DIR
pg_stop
# The host's own run directory (h1) stays until t_cleanup; nothing in it.
vm_dirs=$(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)
if [ "$(count_qemu)" = 0 ] && [ "$(count_cgroups)" = "$before_cg" ] && [ "$(count_mounts)" = 0 ] \
   && [ "$vm_dirs" = 0 ] && [ -z "$(pgrep -f "postgres -D $d/")" ] && [ ! -e "$d" ]; then
	ok "nothing left: no QEMU, cgroups as before, no mounts, no VM directory, PostgreSQL stopped"
else
	not_ok "leftovers" "qemu $(count_qemu), cgroups $(count_cgroups) (before $before_cg), mounts $(count_mounts), VM dirs $vm_dirs" \
		"$(find "$KILN_RUN_DIR" -mindepth 1 | head -5)"
fi
t_done
