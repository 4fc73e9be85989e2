#!/usr/bin/env bash
# The kiln CLI over the one-command local stack: `kiln up` (local S3,
# kiln-api, one kiln-host) in the background, then kiln run (live output,
# outputs downloaded, exit codes, --file/--env, kiln-api's connection to
# the host kept from one task to the next), kiln task list/get/logs/
# cancel, kiln session fork and kiln snapshot create|list|get|delete with
# kiln session create --snapshot, kiln volume create|list|get|delete with
# kiln session create --volume, kiln admin (customer, key, revoke), bad
# usage; finally SIGTERM to kiln up: exit 0, credentials gone, no process or
# cgroup of the stack left.
. "$(dirname "$0")/lib.sh"
t_plan 50
require_image
t_require_tools swift-proxy-server memcached jq
t_require_built kiln kiln-api kiln-host

KILN=$ROOT/build/kiln
UP=$T_TMP/up
PORT=$((20000 + RANDOM % 12000))
export KILN_CREDENTIALS=$UP/credentials
unset KILN_API KILN_KEY KILN_ADMIN_KEY
up_pid=


stack_procs() { pgrep -f -- "$UP/" | grep -vx "$$" | wc -l; }
before_cg=$(count_cgroups)
before_procs=$(stack_procs)

t_bg "$KILN" up --dir "$UP" --port "$PORT" > "$T_TMP/up.out" 2> "$T_TMP/up.err"
up_pid=$T_BG_PID
# A first run creates the VM snapshot (minutes); later ones take seconds.
for _ in $(seq 1200); do
	[ -f "$UP/credentials" ] && break
	kill -0 "$up_pid" 2> /dev/null || break
	sleep 0.25
done
if [ -f "$UP/credentials" ]; then
	ok "kiln up writes $UP/credentials once the stack is ready"
else
	t_bail "kiln up gets ready" "$(tail -5 "$T_TMP/up.err")"
fi
names=$(sed -n 's/^\([A-Z0-9_]*\)=.*/\1/p' "$UP/credentials" | sort | tr '\n' ' ')
check "credentials: the fifteen variables, mode 0600 ($names)" \
	[ "$names" = "E2B_API_KEY E2B_API_URL E2B_DOMAIN KILN_ADMIN_KEY KILN_API KILN_KEY KILN_SANDBOX_DOMAIN NODE_EXTRA_CA_CERTS REQUESTS_CA_BUNDLE S3_ACCESS_KEY S3_BUCKET S3_ENDPOINT S3_REGION S3_SECRET_KEY SSL_CERT_FILE " \
	-a "$(stat -c %a "$UP/credentials")" = 600 ]
running_procs=$(stack_procs)
dkey=$(cat "$UP/destinations.key" 2> /dev/null)
check "kiln up makes DIR/destinations.key (64 hex digits, mode 0600) and names it in api.json" \
	[ -n "$(grep -x '[0-9a-f]\{64\}' <<< "$dkey")" -a "$(stat -c %a "$UP/destinations.key")" = 600 \
	  -a "$(jq -r .destinations.key_file "$UP/api.json")" = "$UP/destinations.key" ]

cd "$T_TMP" || exit 1

# --- kiln run: streamed output, outputs downloaded ---
cat > "$T_TMP/ok.py" <<'PY'
import os
print("line one")
print("line two")
os.makedirs("/output/sub", exist_ok=True)
open("/output/a.txt", "w").write("alpha\n")
open("/output/sub/b.csv", "w").write("n,n2\n" + "".join(f"{i},{i*i}\n" for i in range(5)))
PY
"$KILN" run "$T_TMP/ok.py" --out "$T_TMP/out1" > "$T_TMP/ok.out" 2> "$T_TMP/ok.err"
rc=$?
check "kiln run of a python file exits 0 and streams its stdout" \
	[ "$rc" = 0 -a "$(cat "$T_TMP/ok.out")" = "$(printf 'line one\nline two')" ]
python3 -c 'print("n,n2\n" + "".join(f"{i},{i*i}\n" for i in range(5)), end="")' > "$T_TMP/b.expected"
if [ "$(cat "$T_TMP/out1/a.txt" 2> /dev/null)" = alpha ] && cmp -s "$T_TMP/out1/sub/b.csv" "$T_TMP/b.expected"; then
	ok "its /output files are downloaded under --out, relative paths kept"
else not_ok "outputs downloaded" "$(find "$T_TMP/out1" 2>&1)" "$(tail -5 "$T_TMP/ok.err")"; fi
check "it says where the outputs are in S3" grep -q "s3://kiln/default/.*/outputs/sub/b.csv" "$T_TMP/ok.err"
ok_id=$(sed -n 's/^kiln: task \(t_[0-9a-f]*\) .*/\1/p' "$T_TMP/ok.err" | head -n1)

# default output directory: ./kiln-out/TASK_ID/
# (and kiln-api's connection to kiln-host outlives a task: the next task's
# push goes over it, not over a new TCP connection)
host_port=$(jq -r .listen "$UP/host.json" | sed 's/.*://')
host_conns() { ss -Htn state established "( dport = :$host_port )" | awk '{print $3}' | sort; }
conns1=$(host_conns)
"$KILN" run "$T_TMP/ok.py" > /dev/null 2> "$T_TMP/ok2.err"
id2=$(sed -n 's/^kiln: task \(t_[0-9a-f]*\) .*/\1/p' "$T_TMP/ok2.err" | head -n1)
check "without --out the outputs land in ./kiln-out/TASK_ID/" [ -n "$id2" -a -f "$T_TMP/kiln-out/$id2/sub/b.csv" ]
conns2=$(host_conns)
check "kiln-api's connection to kiln-host is kept across tasks (after one: $(echo $conns1); after the next: $(echo $conns2))" \
	[ -n "$conns1" -a -n "$(comm -12 <(echo "$conns1") <(echo "$conns2"))" ]

# --- a failing script: its exit code ---
printf 'import sys\nprint("bad", file=sys.stderr)\nsys.exit(7)\n' > "$T_TMP/fail.py"
"$KILN" run "$T_TMP/fail.py" > /dev/null 2> "$T_TMP/fail.err"
rc=$?
check "a script that exits 7 makes kiln run exit 7 (its stderr streamed: $(grep -c '^bad$' "$T_TMP/fail.err"))" \
	eval '[ "$rc" = 7 ] && grep -qx bad "$T_TMP/fail.err"'

# --- --file and --env (a shell script) ---
echo "payload-$RANDOM" > "$T_TMP/data.txt"
printf 'echo "env=$GREETING"\ncat /work/in/data.txt\ncat /opt/x.txt\n' > "$T_TMP/files.sh"
"$KILN" run "$T_TMP/files.sh" --env GREETING=hello --file "$T_TMP/data.txt:in/data.txt" \
	--file "$T_TMP/data.txt:/opt/x.txt" --memory 256 --vcpus 1 --timeout 20 > "$T_TMP/files.out" 2> "$T_TMP/files.err"
rc=$?
check "--env and --file (relative and absolute guest paths) reach the task" \
	[ "$rc" = 0 -a "$(cat "$T_TMP/files.out")" = "$(printf 'env=hello\n%s\n%s' "$(cat "$T_TMP/data.txt")" "$(cat "$T_TMP/data.txt")")" ]

# --- --allow: egress needs the customer's quota (this customer has none) ---
"$KILN" run "$T_TMP/fail.py" --allow 203.0.113.0/24:443 > /dev/null 2> "$T_TMP/allow.err"
rc=$?
check "kiln run --allow is refused, saying why, when the quota does not allow egress (exit $rc)" \
	eval '[ "$rc" != 0 ] && grep -q "egress" "$T_TMP/allow.err"'

# --- kiln task list / get / logs ---
"$KILN" task list --limit 10 > "$T_TMP/list.out" 2>&1
check "kiln task list shows the tasks" grep -q "^$ok_id *succeeded" "$T_TMP/list.out"
"$KILN" task list --state failed --json > "$T_TMP/list.json" 2>&1
check "kiln task list --state failed --json" [ "$(jq -r '[.tasks[].state] | unique | join(",")' "$T_TMP/list.json")" = failed ]
"$KILN" task get "$ok_id" > "$T_TMP/get.json" 2>&1
check "kiln task get prints the task" [ "$(jq -r .state "$T_TMP/get.json")" = succeeded -a "$(jq -r '.outputs | length' "$T_TMP/get.json")" = 2 ]
"$KILN" task logs "$ok_id" > "$T_TMP/logs.out" 2> "$T_TMP/logs.err"
check "kiln task logs replays its stdout" [ "$(cat "$T_TMP/logs.out")" = "$(printf 'line one\nline two')" ]

# --- cancel a long sleep ---
printf 'import time\nprint("sleeping", flush=True)\ntime.sleep(120)\n' > "$T_TMP/sleep.py"
t_bg "$KILN" run "$T_TMP/sleep.py" > "$T_TMP/sleep.out" 2> "$T_TMP/sleep.err"
run_pid=$T_BG_PID
sid=
for _ in $(seq 200); do
	sid=$(sed -n 's/^kiln: task \(t_[0-9a-f]*\) .*/\1/p' "$T_TMP/sleep.err" | head -n1)
	[ -n "$sid" ] && grep -q sleeping "$T_TMP/sleep.out" && break
	sleep 0.1
done
"$KILN" task cancel "$sid" > "$T_TMP/cancel.out" 2>&1
crc=$?
wait "$run_pid"
rrc=$?
check "kiln task cancel of a running task ($(cat "$T_TMP/cancel.out")); kiln run then exits 1" \
	[ "$crc" = 0 -a "$rrc" = 1 -a "$("$KILN" task get "$sid" | jq -r .state)" = cancelled ]
"$KILN" task cancel "$sid" > /dev/null 2> "$T_TMP/cancel2.err"
rc=$?
check "cancelling it again: exit 1 and the API's message ($(cat "$T_TMP/cancel2.err"))" \
	eval '[ "$rc" = 1 ] && grep -q "409 not_cancellable" "$T_TMP/cancel2.err"'

# --- kiln session fork and kiln snapshot (issue 41), on the real stack ---
# (the same commands against a stand-in kiln-api, their requests and errors:
# 106-snapshot-clients.sh)
FS=$("$KILN" session create --memory 256 --idle 300 2> "$T_TMP/fs.err")
"$KILN" session exec "$FS" -- sh -c 'echo parent-state > /work/state.txt' > /dev/null 2>> "$T_TMP/fs.err"
"$KILN" session fork "$FS" --count 2 > "$T_TMP/fork.out" 2> "$T_TMP/fork.err"
rc=$?
kids=$(grep '^s_' "$T_TMP/fork.out")
check "kiln session fork --count 2: two new ids, one a line, exit 0 ($(tr '\n' ' ' < "$T_TMP/fork.err"))" \
	[ "$rc" = 0 -a "$(wc -l < "$T_TMP/fork.out")" = 2 -a "$(sort -u <<< "$kids" | wc -l)" = 2 -a -z "$(grep -x -- "$FS" <<< "$kids")" ]
got=
for k in $kids; do got="$got $("$KILN" session get "$k" state.txt - 2> /dev/null)"; done
check "each fork has the parent's file ($got)" [ "$got" = " parent-state parent-state" ]
k1=$(head -n 1 <<< "$kids") k2=$(tail -n 1 <<< "$kids")
"$KILN" session exec "$k1" -- sh -c 'echo changed > /work/state.txt' > /dev/null 2>&1
check "a change in one fork is invisible to the other and to the parent" \
	[ "$("$KILN" session get "$k1" state.txt - 2> /dev/null)" = changed \
	-a "$("$KILN" session get "$k2" state.txt - 2> /dev/null)" = parent-state \
	-a "$("$KILN" session get "$FS" state.txt - 2> /dev/null)" = parent-state ]
SNAP=$("$KILN" snapshot create "$FS" --name "cli-test-$$" 2> "$T_TMP/snap.err")
rc=$?
check "kiln snapshot create: the snapshot's id alone on stdout ($SNAP; $(tr '\n' ' ' < "$T_TMP/snap.err"))" \
	[ "$rc" = 0 -a "${SNAP#snap_}" != "$SNAP" ]
check "kiln snapshot list --name shows it" grep -q "^$SNAP  *cli-test-$$  *$FS " <("$KILN" snapshot list --name "cli-test-$$" 2>&1)
check "kiln snapshot get --json: its session" [ "$("$KILN" snapshot get "$SNAP" --json 2> /dev/null | jq -r .session_id)" = "$FS" ]
NS=$("$KILN" session create --snapshot "$SNAP" --idle 120 2> "$T_TMP/ns.err")
check "kiln session create --snapshot: a new session with the snapshot's file ($NS; $(tr '\n' ' ' < "$T_TMP/ns.err"))" \
	[ -n "$NS" -a "$NS" != "$FS" -a "$("$KILN" session get "$NS" state.txt - 2> /dev/null)" = parent-state ]
check "kiln snapshot delete; then the list no longer has it" \
	[ "$("$KILN" snapshot delete "$SNAP" 2>&1)" = "$SNAP deleted" -a -z "$("$KILN" snapshot list --name "cli-test-$$" 2>&1 | grep "^$SNAP")" ]
bad=
for s in $FS $kids $NS; do [ "$("$KILN" session rm "$s" 2>&1)" = "$s destroyed" ] || bad="$bad $s"; done
check "the parent, its forks and the session from the snapshot are destroyed${bad:+ (not:$bad)}" [ -z "$bad" ]

# --- kiln volume and kiln session create --volume (issue 41), on the real stack ---
# (the same commands against a stand-in kiln-api, their requests and errors:
# 110-volume-clients.sh)
VN=cli-vol-$$
VOL=$("$KILN" volume create "$VN" --size 64 2> "$T_TMP/vol.err")
rc=$?
check "kiln volume create --size 64: the volume's id alone on stdout ($VOL; $(tr '\n' ' ' < "$T_TMP/vol.err"))" \
	[ "$rc" = 0 -a "${VOL#vol_}" != "$VOL" ]
VS=$("$KILN" session create --memory 256 --idle 300 --volume "$VN:/data" 2> "$T_TMP/vs.err")
"$KILN" session exec "$VS" -- sh -c 'echo kept-in-volume > /data/note.txt && sync' > /dev/null 2>> "$T_TMP/vs.err"
check "kiln session create --volume NAME:/data: mounted read-write, a file written there; volume list names the session ($VS; $(tr '\n' ' ' < "$T_TMP/vs.err" | head -c 300))" \
	[ -n "$VS" -a -n "$(grep "volume $VN ($VOL) mounted at /data, read-write" "$T_TMP/vs.err")" \
	-a -n "$("$KILN" volume list --name "$VN" 2>&1 | grep "^$VOL  *$VN  *64 .*$VS (rw)")" ]
check "kiln volume delete of a mounted volume: refused, volume_busy" \
	grep -q 'HTTP 409 volume_busy' <("$KILN" volume delete "$VN" 2>&1)
"$KILN" session rm "$VS" > /dev/null 2>&1
VS2=$("$KILN" session create --memory 256 --idle 300 --volume "$VN:/mnt/v:ro" 2> "$T_TMP/vs2.err")
check "the next session (read-only, elsewhere) reads the file the last one synced ($VS2; $(tr '\n' ' ' < "$T_TMP/vs2.err" | head -c 300))" \
	[ -n "$VS2" -a "$("$KILN" session exec "$VS2" -- cat /mnt/v/note.txt 2> /dev/null)" = kept-in-volume ]
"$KILN" session rm "$VS2" > /dev/null 2>&1
check "kiln volume delete once no session mounts it; then get is not_found" \
	[ "$("$KILN" volume delete "$VN" 2>&1)" = "$VOL deleted" -a -n "$("$KILN" volume get "$VOL" 2>&1 | grep 'HTTP 404 not_found')" ]

# --- admin: a customer, a key, a run with it, revoke ---
"$KILN" admin customer create "acme$RANDOM" --name Acme > "$T_TMP/cust.json" 2>&1
cust=$(jq -r .id "$T_TMP/cust.json" 2> /dev/null)
check "kiln admin customer create" [ -n "$cust" -a "$(jq -r .name "$T_TMP/cust.json")" = Acme ]
"$KILN" admin quota set "$cust" max_running=2 > "$T_TMP/quota.json" 2>&1
check "kiln admin quota set" [ "$(jq -r .quotas.max_running "$T_TMP/quota.json")" = 2 ]
key=$("$KILN" admin key create "$cust" 2> /dev/null)
printf 'print("as customer")\n' > "$T_TMP/cust.py"
KILN_KEY=$key "$KILN" run "$T_TMP/cust.py" > "$T_TMP/cust.out" 2> "$T_TMP/cust.err"
rc=$?
check "kiln admin key create; kiln run with that key" [ "$rc" = 0 -a "$(cat "$T_TMP/cust.out")" = "as customer" ]
check "the task belongs to the new customer" [ "$(KILN_KEY=$key "$KILN" task list --json | jq -r '.tasks[0].customer')" = "$cust" ]
key_id=$(echo "$key" | cut -d_ -f2)
"$KILN" admin key revoke "$key_id" > /dev/null 2>&1
KILN_KEY=$key "$KILN" run "$T_TMP/cust.py" > /dev/null 2> "$T_TMP/revoked.err"
rc=$?
check "after kiln admin key revoke the key gets a clear 401 ($(cat "$T_TMP/revoked.err")), exit $rc" \
	eval '[ "$rc" = 1 ] && grep -q "HTTP 401 unauthorized" "$T_TMP/revoked.err"'
KILN_ADMIN_KEY=not-the-admin-key-at-all "$KILN" admin hosts > /dev/null 2> "$T_TMP/badadmin.err"
rc=$?
check "a wrong admin key: exit 1, 401" eval '[ "$rc" = 1 ] && grep -q 401 "$T_TMP/badadmin.err"'
"$KILN" admin hosts > "$T_TMP/hosts.out" 2>&1
check "kiln admin hosts shows the live host" grep -q "^local *live" "$T_TMP/hosts.out"

# --- bad usage: exit 2 ---
bad=""
for args in "" "frobnicate" "run" "run $T_TMP/data.txt" "run $T_TMP/ok.py --memory lots" "run $T_TMP/ok.py --env NOEQUALS" \
	"task" "task get" "task list --limit 0" "admin key" "admin quota set acme max_running"; do
	# shellcheck disable=SC2086
	"$KILN" $args > /dev/null 2>&1
	rc=$?
	[ "$rc" = 2 ] || bad="$bad [kiln $args: $rc]"
done
check "bad usage exits 2${bad:+:$bad}" [ -z "$bad" ]
KILN_CREDENTIALS=$T_TMP/none KILN_API= "$KILN" task list > /dev/null 2> "$T_TMP/noconf.err"
rc=$?
check "no configuration: exit 2 with a hint ($(cat "$T_TMP/noconf.err"))" eval '[ "$rc" = 2 ] && grep -q "kiln up" "$T_TMP/noconf.err"'
KILN_API=http://127.0.0.1:1 KILN_KEY=x "$KILN" task list > /dev/null 2> "$T_TMP/unreach.err"
rc=$?
check "an unreachable API: exit 3 ($(cat "$T_TMP/unreach.err"))" eval '[ "$rc" = 3 ] && grep -q "cannot reach" "$T_TMP/unreach.err"'

# --- SIGTERM: everything stops ---
kill -TERM "$up_pid"
wait "$up_pid"
rc=$?
up_pid=
check "kiln up exits 0 on SIGTERM" [ "$rc" = 0 ]
check "its credentials file is removed" [ ! -e "$UP/credentials" ]
after_procs=$(stack_procs)
if [ "$running_procs" -gt 5 ] && [ "$after_procs" = "$before_procs" ]; then
	ok "no process of the stack is left ($running_procs while up: kiln-api, kiln-host, QEMU, Swift, memcached; $after_procs after)"
else not_ok "processes left" "before=$before_procs up=$running_procs after=$after_procs" "$(pgrep -af -- "$UP/")"; fi
check "no cgroup left ($(count_cgroups) = $before_cg)" [ "$(count_cgroups)" = "$before_cg" ]

# --- a child that dies: kiln up stops the rest and fails (second start over the same DIR) ---
t_bg "$KILN" up --dir "$UP" --port "$PORT" > "$T_TMP/up2.out" 2> "$T_TMP/up2.err"
up_pid=$T_BG_PID
for _ in $(seq 600); do
	[ -f "$UP/credentials" ] && break
	kill -0 "$up_pid" 2> /dev/null || break
	sleep 0.25
done
check "kiln up starts again over the same directory (customer default exists already)" [ -f "$UP/credentials" ]
check "and keeps its destinations.key (stored destinations still open)" [ "$(cat "$UP/destinations.key")" = "$dkey" ]
# kiln up's own child only: a process kiln-host has just forked (to start a
# VM) carries the same command line until it execs, and pgrep would list it.
host_pid=$(pgrep -P "$up_pid" -f -- "kiln-host serve --config $UP/host.json")
kill -KILL "$host_pid"
wait "$up_pid"
rc=$?
up_pid=
check "kiln-host SIGKILLed: kiln up exits $rc and says so ($(grep -m1 'unexpectedly' "$T_TMP/up2.err"))" \
	eval '[ "$rc" = 1 ] && grep -q "kiln-host was killed by signal 9" "$T_TMP/up2.err"'
# The killed host's QEMUs die with it (PR_SET_PDEATHSIG), asynchronously.
for _ in $(seq 100); do [ "$(stack_procs)" = 0 ] && break; sleep 0.1; done
check "then no credentials and no process of the stack ($(stack_procs))" [ ! -e "$UP/credentials" -a "$(stack_procs)" = 0 ]
"$KILN_HOST" reap --run-dir "$UP/run" > /dev/null 2>&1
check "no cgroup left after the killed host is reaped ($(count_cgroups) = $before_cg)" [ "$(count_cgroups)" = "$before_cg" ]
t_done
