# Shared helpers for integration tests (sourced). Tests print TAP:
#   ok N - name / not ok N - name / ok N - name # SKIP reason
# Each test script gets its own run directory so resource counts are exact.

set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KILN_HOST=$ROOT/build/kiln-host
T_N=0
T_FAILED=0
export KILN_RUN_DIR=${KILN_RUN_DIR:-$(mktemp -d /tmp/kiln-it-run.XXXXXX)}
T_TMP=$(mktemp -d /tmp/kiln-it.XXXXXX)
trap 't_cleanup' EXIT
trap 'exit 143' TERM INT HUP

# t_cleanup: on every exit (a TERM, INT or HUP exits through it too), ends
# what the test started (the processes of t_bg, PostgreSQL, the local S3,
# namespaces and bridge) and removes its directories. A script needs no
# cleanup of its own: what lib.sh does not know of, it names with
# t_on_exit COMMAND (a shell command, run in order after the processes are
# ended: a directory a host kept, a namespace made by hand).
T_ON_EXIT=()
t_on_exit() { T_ON_EXIT+=("$1"); }
t_cleanup() {
	local c
	t_reap
	for c in "${T_ON_EXIT[@]}"; do eval "$c"; done
	T_ON_EXIT=()
	pg_stop
	s3_local_stop
	net_down
	rm -rf "$T_TMP"
	# The per-host run directories a test named (run_dir += "/h1"): empty
	# once their VMs are gone; anything left in them stays, to be seen.
	find "$KILN_RUN_DIR" -mindepth 1 -depth -type d -empty -delete 2> /dev/null || true
	rmdir "$KILN_RUN_DIR" 2>/dev/null || true
}

# ---- processes a test starts: one registry, ended by t_cleanup ----
# t_bg CMD...: runs CMD in the background (the caller's redirections apply),
# its pid in T_BG_PID and in the registry. t_stop PID [SIGNAL]: sends SIGNAL
# (default TERM; after a SIGCONT: a test may have stopped it), waits for it
# and forgets it. t_reap: t_stop of every one still registered. Only this
# shell's own children are signalled: a pid that ended and was reused by
# another process is left alone.
T_PIDS=()
T_BG_PID=
t_bg() { "$@" & T_BG_PID=$!; T_PIDS+=("$T_BG_PID"); }

# kiln_up [ARGS...]: `kiln up` on a directory and a port of this test's own
# (UP, PORT; the stack's processes counted by up_procs), in the background
# (up_pid), waited for until it says it is ready (else t_bail with its
# log); up_creds then holds DIR/credentials' lines, for `env -i`.
kiln_up() {
	UP=$T_TMP/up
	PORT=$((20000 + RANDOM % 12000))
	t_bg "$ROOT/build/kiln" up --dir "$UP" --port "$PORT" "$@" > "$T_TMP/up.out" 2> "$T_TMP/up.err"
	up_pid=$T_BG_PID
	for _ in $(seq 1200); do
		grep -q '^kiln up: ready' "$T_TMP/up.out" 2> /dev/null && break
		kill -0 "$up_pid" 2> /dev/null || break
		sleep 0.25
	done
	grep -q '^kiln up: ready' "$T_TMP/up.out" || t_bail "kiln up gets ready" "$(tail -5 "$T_TMP/up.err")"
	up_creds=()
	while IFS= read -r l; do case $l in *=*) up_creds+=("$l") ;; esac; done < "$UP/credentials"
}
up_procs() { pgrep -f -- "$T_TMP/up/" | grep -vx "$$" | wc -l; }
t_child() { [ -n "$1" ] && [ "$(sed 's/^.*) //' "/proc/$1/stat" 2> /dev/null | cut -d' ' -f2)" = "$$" ]; }
t_stop() {
	local p=$1 sig=${2:-TERM} i
	[ -n "$p" ] || return 0
	if t_child "$p"; then
		kill -CONT "$p" 2> /dev/null
		kill "-$sig" "$p" 2> /dev/null
		wait "$p" 2> /dev/null
	fi
	for i in "${!T_PIDS[@]}"; do [ "${T_PIDS[$i]}" != "$p" ] || unset "T_PIDS[$i]"; done
	return 0
}
t_reap() {
	local p
	for p in "${T_PIDS[@]}"; do ! t_child "$p" || { kill -CONT "$p"; kill "$p"; } 2> /dev/null; done
	for p in "${T_PIDS[@]}"; do ! t_child "$p" || wait "$p" 2> /dev/null; done
	T_PIDS=()
}

# t_until SECONDS CMD...: runs CMD every 0.1 s until it succeeds (0) or
# SECONDS have passed (1; CMD is tried once more at the end). For a wait on
# something asynchronous; the check that follows says what was awaited.
t_until() {
	local end=$((SECONDS + $1))
	shift
	until "$@"; do
		[ "$SECONDS" -lt "$end" ] || { "$@"; return; }
		sleep 0.1
	done
}
# t_serving URL [PID] [SECONDS]: until URL answers HTTP (any status), 0; 1
# when PID (if given) has ended first or SECONDS (default 360: kiln-host's
# first start builds a snapshot under TCG) have passed.
t_serving() {
	local url=$1 pid=${2:-} end=$((SECONDS + ${3:-360}))
	until curl -s -m 1 -o /dev/null "$url"; do
		[ -z "$pid" ] || kill -0 "$pid" 2> /dev/null || return 1
		[ "$SECONDS" -lt "$end" ] || return 1
		sleep 0.2
	done
}

# pg_start: a PostgreSQL of this test's own (scripts/pg-local.sh: initdb in a
# temporary directory, a Unix socket only), its URI in T_PG_URL. t_cleanup
# stops it and removes its directory.
T_PG_DIR=
T_PG_URL=
pg_start() {
	T_PG_DIR=$(mktemp -d /tmp/kiln-it-pg.XXXXXX)
	T_PG_URL=$("$ROOT/scripts/pg-local.sh" start "$T_PG_DIR")
}
pg_stop() {
	[ -n "$T_PG_DIR" ] || return 0
	"$ROOT/scripts/pg-local.sh" stop "$T_PG_DIR" || true
	rm -rf "$T_PG_DIR"
	T_PG_DIR=
}
count_postgres() { [ -z "$T_PG_DIR" ] && echo 0 || pgrep -c -f "postgres -D $T_PG_DIR/" || true; }

# ---- a stack on a private network (65-egress, 80-cluster, 85-templates) ----
# net_bridge NAME ADDR: a bridge in the root namespace with ADDR/24, up; a
# machine where that cannot be skips the whole script. net_ns NS VETH ADDR
# [GATEWAY]: network namespace NS on it, its eth0 ADDR/24 (VETH the root
# end), lo up, with GATEWAY its default route. net_down removes them (the
# namespaces first); t_cleanup calls it, a test that checks the removal too.
# net_left: how many of them are still there (this test's own: other tests
# may add and remove namespaces meanwhile).
T_BRIDGE=
T_NETNS=()
net_bridge() {
	ip link add "$1" type bridge && ip addr add "$2/24" dev "$1" && ip link set "$1" up || {
		echo "1..0 # SKIP cannot create a bridge (needs root and CAP_NET_ADMIN)"; exit 0; }
	T_BRIDGE=$1
}
net_ns() {
	ip netns add "$1"
	T_NETNS+=("$1")
	ip link add "$2" type veth peer name eth0 netns "$1"
	ip link set "$2" master "$T_BRIDGE" up
	ip -n "$1" addr add "$3/24" dev eth0
	ip -n "$1" link set eth0 up
	ip -n "$1" link set lo up
	[ -z "${4:-}" ] || ip -n "$1" route add default via "$4"
}
net_down() {
	local n
	for n in "${T_NETNS[@]}"; do [ ! -e "/run/netns/$n" ] || ip netns del "$n"; done
	[ -z "$T_BRIDGE" ] || ! ip link show "$T_BRIDGE" > /dev/null 2>&1 || ip link del "$T_BRIDGE"
}
net_left() {
	local n c=0
	for n in "${T_NETNS[@]}"; do [ ! -e "/run/netns/$n" ] || c=$((c + 1)); done
	[ -z "$T_BRIDGE" ] || ! ip link show "$T_BRIDGE" > /dev/null 2>&1 || c=$((c + 1))
	echo "$c"
}
# s3_local_start [BIND]: a local S3 (scripts/s3-local.sh) in $T_TMP/s3, its
# endpoint on BIND (default 127.0.0.1), S3_ENDPOINT, S3_ACCESS_KEY and
# S3_SECRET_KEY set. When it does not start the script bails (t_bail): the
# tools it needs are checked first (t_require_tools swift-proxy-server
# memcached), and `make test` installs them, so a server that does not come
# up is a failure, not a skip. t_cleanup stops it.
T_S3_DIR=
s3_local_start() {
	T_S3_DIR=$T_TMP/s3
	KILN_S3_BIND=${1:-127.0.0.1} "$ROOT/scripts/s3-local.sh" start "$T_S3_DIR" > "$T_TMP/s3.env" 2> "$T_TMP/s3.log" ||
		t_bail "the local S3 (scripts/s3-local.sh) starts" "$(tail -3 "$T_TMP/s3.log")"
	. "$T_TMP/s3.env"
}
s3_local_stop() {
	[ -n "$T_S3_DIR" ] || return 0
	s3_local_thaw
	"$ROOT/scripts/s3-local.sh" stop "$T_S3_DIR" 2> /dev/null
	T_S3_DIR=
}
# s3_local_freeze / s3_local_thaw: SIGSTOP / SIGCONT the local S3's proxy
# (one process, workers = 0): requests to S3 hang until the thaw, which holds
# whatever waits on them (a pause's upload) in its state for as long as a
# test needs. 0, or 1 when there is no proxy of this test's S3.
s3_local_proxy_pid() { [ -n "$T_S3_DIR" ] && cat "$T_S3_DIR/run/proxy.pid" 2> /dev/null; }
s3_local_freeze() { local p; p=$(s3_local_proxy_pid) && [ -n "$p" ] && kill -STOP "$p"; }
s3_local_thaw() { local p; p=$(s3_local_proxy_pid) && [ -n "$p" ] && kill -CONT "$p" 2> /dev/null; return 0; }
# ---- kiln-api and kiln-host ----
# api_config FILE LISTEN [JQ]: kiln-api's configuration into FILE: listen
# on LISTEN, its SQLite database beside FILE (FILE's name, .db), admin_key
# $ADMIN, cluster_token $TOKEN, and the local S3 (S3_* of s3_local_start,
# bucket $BUCKET, default kiln-it; when no S3 was started an address where
# nothing answers). JQ (a jq filter, default .) adds to it or changes it.
api_config() {
	local file=$1 listen=$2 extra=${3:-.}
	jq -n --arg listen "$listen" --arg db "${file%.json}.db" --arg admin "$ADMIN" --arg token "$TOKEN" \
		--arg ep "${S3_ENDPOINT:-http://127.0.0.1:9}" --arg ak "${S3_ACCESS_KEY:-ak}" --arg sk "${S3_SECRET_KEY:-sk}" \
		--arg b "${BUCKET:-kiln-it}" \
		'{listen: $listen, db: $db, admin_key: $admin, cluster_token: $token,
		  s3: {endpoint: $ep, region: "us-east-1", bucket: $b, access_key: $ak, secret_key: $sk}}' | jq "$extra" > "$file"
}
# api_start CONFIG URL [NAME]: kiln-api (KILN_API_BIN, default
# build/kiln-api) with CONFIG (t_bg; its output
# appended to $T_TMP/NAME.out and NAME.err, default api), its pid in
# api_pid; 0 once URL/healthz answers, 1 when it has not in 10 s or it died.
api_start() {
	t_bg "${KILN_API_BIN:-$ROOT/build/kiln-api}" --config "$1" >> "$T_TMP/${3:-api}.out" 2>> "$T_TMP/${3:-api}.err"
	api_pid=$T_BG_PID
	t_serving "$2/healthz" "$api_pid" 10
}
# api_up CONFIG URL [NAME]: api_start, or the script bails (kiln-api is ours).
api_up() { api_start "$@" || t_bail "kiln-api${3:+ $3} starts" "$(tail -3 "$T_TMP/${3:-api}.err")"; }
# host_start CONFIG NAME [NETNS]: kiln-host serve with CONFIG (t_bg; output
# appended to $T_TMP/NAME.out and NAME.err), in network namespace NETNS when
# given (nsenter --net only: ip netns exec would remount /sys, hiding the
# cgroups the jail needs); its pid in host_pid.
host_start() {
	local ns=()
	[ -z "${3:-}" ] || ns=(nsenter --net="/run/netns/$3")
	t_bg "${ns[@]}" "$KILN_HOST" serve --config "$1" >> "$T_TMP/$2.out" 2>> "$T_TMP/$2.err"
	host_pid=$T_BG_PID
}
# host_up CONFIG NAME URL [NETNS]: host_start, then until URL/healthz
# answers; the script bails when kiln-host ends or does not answer in time.
host_up() {
	host_start "$1" "$2" "${4:-}"
	t_serving "$3/healthz" "$host_pid" || t_bail "kiln-host $2 starts" "$(tail -3 "$T_TMP/$2.err")"
}
# host_config FILE LISTEN ID [JQ]: kiln-host's configuration into FILE:
# listen on LISTEN, host_id ID, token $TOKEN, its spool in $T_TMP/spool-ID
# and VMs in $KILN_RUN_DIR (the counts below see them), two vCPUs at
# overcommit 2, no warm pool, and the local S3 when one was started (bucket
# $BUCKET, default kiln-it). JQ (a jq filter, default .) adds or changes.
host_config() {
	local file=$1 listen=$2 id=$3 extra=${4:-.}
	jq -n --arg listen "$listen" --arg id "$id" --arg token "$TOKEN" --arg spool "$T_TMP/spool-$id" \
		--arg run "$KILN_RUN_DIR" --arg ep "${S3_ENDPOINT:-}" --arg ak "${S3_ACCESS_KEY:-}" \
		--arg sk "${S3_SECRET_KEY:-}" --arg b "${BUCKET:-kiln-it}" \
		'{listen: $listen, host_id: $id, token: $token, spool_dir: $spool, run_dir: $run,
		  capacity: {vcpus: 2, cpu_overcommit: 2}, pool: {size: 0, prestart: 0}}
		 + (if $ep == "" then {} else
		    {s3: {endpoint: $ep, region: "us-east-1", bucket: $b, access_key: $ak, secret_key: $sk}} end)' |
		jq "$extra" > "$file"
}
# Requests to kiln-api at $API: admin with $ADMIN, cust with $KEY (curl args).
admin() { curl -s -m 30 -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' "$@"; }
cust() { curl -s -m 70 -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' "$@"; }
live_hosts() { admin "$API/v1/admin/hosts" | jq '[(.hosts // .)[] | select(.state == "live")] | length' 2> /dev/null; }
# wait_live N [SECONDS]: until N hosts are live (default 240 s); 0, or 1.
wait_live() {
	local i
	for i in $(seq $((${2:-240} * 5))); do [ "$(live_hosts)" = "$1" ] && return 0; sleep 0.2; done
	return 1
}
# api_task CODE [JSON]: submits a python task (JSON: more of its spec) as
# $KEY and prints its id. api_final ID SECONDS: long-polls until the task
# is final, its JSON in $T_TMP/ID.json; 1 when SECONDS pass first.
api_task() { py_spec "$1" "${2:-{\}}" | cust -X POST --data-binary @- "$API/v1/tasks" | jq -r .id; }
api_final() {
	local deadline=$((SECONDS + $2)) w
	while :; do
		w=$((deadline - SECONDS)); [ "$w" -gt 30 ] && w=30; [ "$w" -lt 1 ] && w=1
		cust "$API/v1/tasks/$1?wait=$w" > "$T_TMP/$1.json"
		jq -e '.state | test("^(succeeded|failed|timed_out|cancelled|error)$")' "$T_TMP/$1.json" > /dev/null 2>&1 && return 0
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.2
	done
}
# api_sha_of_url URL: "SIZE SHA256" of what URL serves (an artifact link)
api_sha_of_url() { curl -s -m 120 "$1" | /usr/bin/python3 -c 'import hashlib,sys; d=sys.stdin.buffer.read(); print(len(d), hashlib.sha256(d).hexdigest())'; }
# new_customer ID [JSON]: creates customer ID (JSON: more of its fields) and
# prints a key of it.
new_customer() {
	jq -cn --arg id "$1" --argjson more "${2:-{\}}" '{id: $id} + $more' | admin -X POST --data-binary @- "$API/v1/admin/customers" > /dev/null
	admin -X POST "$API/v1/admin/customers/$1/keys" | jq -r .key
}

# jq 1.6's -e exits 0 when it saw no value at all (empty input, an empty
# answer), so `jq -e COND` over an empty answer passed as if COND held.
# With -e (alone or in a cluster such as -er), this wrapper also fails
# (status 4, as jq 1.7 does) when jq printed nothing.
jq() {
	local a e=
	for a; do
		case $a in
		--exit-status) e=1 ;;
		--*) ;;
		-*e*) e=1 ;;
		esac
	done
	[ -n "$e" ] || { command jq "$@"; return; }
	local out rc
	out=$(command jq "$@")
	rc=$?
	[ "$rc" -ne 0 ] || [ -n "$out" ] || rc=4
	[ -z "$out" ] || printf '%s\n' "$out"
	return "$rc"
}

ok() { t_plan_show; T_N=$((T_N + 1)); echo "ok $T_N - $1"; }
not_ok() {
	t_plan_show; T_N=$((T_N + 1)); T_FAILED=$((T_FAILED + 1)); echo "not ok $T_N - $1"
	shift; for l in "$@"; do printf '#   %s\n' "$l"; done
}
skip() { t_plan_show; T_N=$((T_N + 1)); echo "ok $T_N - $1 # SKIP $2"; }
# check NAME CONDITION-COMMAND...: ok when the command succeeds.
check() { local name=$1; shift; if "$@"; then ok "$name"; else not_ok "$name" "failed: $*"; fi; }
# client_results [-e ERRFILE] PREFIX OUT CMD...: runs a client test that
# prints a line a check, "PASS what", "FAIL what: why" or "SKIP what: why",
# and makes each a result "PREFIX: what" (the why a diagnostic or the skip's
# reason); its other lines become comments. Every line goes to OUT as well,
# and a last one "exit N". Sets C_N (the checks seen) and C_RC (CMD's exit
# status). CMD's stderr is read with its stdout, or goes to ERRFILE.
client_results() {
	local err= line rest name why
	if [ "$1" = -e ]; then err=$2; shift 2; fi
	local prefix=$1 out=$2; shift 2
	C_N=0; C_RC=
	while IFS= read -r line; do
		echo "$line" >> "$out"
		case $line in
		PASS\ *) ok "$prefix: ${line#PASS }" ;;
		FAIL\ *|SKIP\ *)
			rest=${line#* } name=$rest why=
			case $rest in *': '*) name=${rest%%: *} why=${rest#*: } ;; esac
			case $line in
			FAIL*) not_ok "$prefix: $name" ${why:+"$why"} ;;
			*) skip "$prefix: $name" "${why:-no reason given}" ;;
			esac ;;
		exit\ *) C_RC=${line#exit }; echo "# $line"; continue ;;
		*) echo "# $line"; continue ;;
		esac
		C_N=$((C_N + 1))
	done < <(if [ -n "$err" ]; then "$@" 2> "$err"; else "$@" 2>&1; fi; echo "exit $?")
}
# Plans. t_plan N, at the top of a script whose number of results is fixed:
# the plan "1..N" is printed before the first result (not at once, so that a
# whole-script skip for a missing dependency can still say "1..0 # SKIP"),
# and the runner fails a script that prints more or fewer, so a result a
# changed branch drops is caught. t_min N, where the number varies (a client
# that prints its own plan at the end): the runner fails the script when it
# prints fewer. t_done prints the plan at the end unless t_plan gave it.
T_PLANNED=
T_PLAN_SHOWN=
t_plan() { T_PLANNED=$1; }
t_plan_show() {
	[ -n "$T_PLANNED" ] && [ -z "$T_PLAN_SHOWN" ] || return 0
	echo "1..$T_PLANNED"
	T_PLAN_SHOWN=1
}
t_min() { echo "# at least $1 results"; }
t_done() {
	if [ -n "$T_PLANNED" ]; then t_plan_show; else echo "1..$T_N"; fi
	[ "$T_FAILED" -eq 0 ]
}
# t_bail REASON [DIAGNOSTIC...]: kiln itself failed where the rest cannot
# run (a daemon did not start, answered wrong): one failure, then stop. Never
# a skip: a skip is for what the machine lacks, not for what kiln got wrong.
t_bail() { not_ok "$@"; t_done; exit 1; }

# ---- skip or bail ----
# A dependency the machine lacks skips the whole script, loudly (the runner
# makes such a skip a failure in strict CI unless it is allow-listed); kiln
# itself failing (kiln-api, kiln-host or envd does not start or answers
# wrong) is a failure and ends the script: t_bail.
# t_skip_all REASON: "1..0 # SKIP REASON", exit 0 (before any result only).
t_skip_all() { echo "1..0 # SKIP $*"; exit 0; }
# t_require_tools COMMAND...: skips the whole script when a command is missing.
t_require_tools() {
	local t
	for t; do command -v "$t" > /dev/null || t_skip_all "$t missing: run scripts/deps.sh"; done
}
# t_require_python MODULE...: the same for modules of Debian's /usr/bin/python3
# (boto3 ...), the one the tests use (python3 on PATH may be another).
t_require_python() {
	local m
	t_require_tools /usr/bin/python3
	for m; do /usr/bin/python3 -c "import $m" 2> /dev/null || t_skip_all "python3 module $m missing: run scripts/deps.sh"; done
}
# t_require_built FILE...: the same for build outputs, named relative to
# build/ (kiln-api, kiln-host, kiln, tests/s3tool ...).
t_require_built() {
	local b
	for b; do [ -x "$ROOT/build/$b" ] || t_skip_all "build/$b missing: run make all unit"; done
}

# require_image: skip the whole script (loudly) when the guest image is missing.
require_image() {
	local d=$ROOT/build/image
	for f in vmlinux initramfs.cpio rootfs.ext4; do
		if [ ! -r "$d/$f" ]; then
			echo "1..0 # SKIP guest image missing ($d/$f): run make image"
			exit 0
		fi
	done
}

# run_spec NAME JSON [kiln-host args...]: runs the task, result JSON in $T_TMP/NAME.json,
# kiln-host's exit status in $T_TMP/NAME.rc.
run_spec() {
	local name=$1 json=$2; shift 2
	printf '%s' "$json" > "$T_TMP/$name.spec"
	"$KILN_HOST" run --spec "$T_TMP/$name.spec" ${RUN_MODE_ARGS[@]+"${RUN_MODE_ARGS[@]}"} "$@" > "$T_TMP/$name.json" 2> "$T_TMP/$name.err"
	echo $? > "$T_TMP/$name.rc"
}
# jq over a result: r NAME FILTER
r() { jq -r "$2" "$T_TMP/$1.json" 2>/dev/null; }
rc() { cat "$T_TMP/$1.rc"; }
# py CODE: a spec for a python task (code JSON-escaped here)
py_spec() { jq -cn --arg code "$1" --argjson extra "${2:-{\}}" '{language:"python", code:$code} + $extra'; }
sh_spec() { jq -cn --arg code "$1" --argjson extra "${2:-{\}}" '{language:"sh", code:$code} + $extra'; }
# show NAME: diagnostics for a failing check
show() { echo "result: $(head -c 1500 "$T_TMP/$1.json")"; echo "stderr: $(head -c 500 "$T_TMP/$1.err")"; }

# Resources a VM takes, counted for this test's run directory.
count_qemu() { pgrep -c -f "qemu-system-x86_64.*$KILN_RUN_DIR" || true; }
count_run_entries() { find "$KILN_RUN_DIR" -mindepth 1 2>/dev/null | wc -l; }

# What a jail takes besides its QEMU process: cgroup directories under the
# kiln/ parents of this shell's own cgroups (kiln-host nests its VMs' cgroups
# there), mounts naming the run directory in this (the host's) mount
# namespace (jails mount only inside their own), and held slot locks
# (count_own_slot_locks, below).
kiln_cgroup_parent() { # CONTROLLER
	local own
	own=$(awk -F: -v c="$1" '{ n = split($2, a, ","); for (i = 1; i <= n; i++) if (a[i] == c) print $3 }' /proc/self/cgroup)
	[ "$own" = / ] && own=
	echo "/sys/fs/cgroup/$1$own/kiln"
}
# Where this shell has a cgroup of its own in some of the hierarchies (a
# machine that runs each session in one, with other worktrees' tests beside
# it), a hierarchy where it is at the root is shared with them: their VMs
# come and go there. Only the private ones are counted then; where all are
# at the root (CI), all three.
count_cgroups() {
	local n=0 c cs=() private=()
	for c in memory cpu pids; do
		[ "$(kiln_cgroup_parent "$c")" = "/sys/fs/cgroup/$c/kiln" ] || private+=("$c")
	done
	if [ ${#private[@]} -gt 0 ]; then cs=("${private[@]}"); else cs=(memory cpu pids); fi
	for c in "${cs[@]}"; do
		n=$((n + $(find "$(kiln_cgroup_parent "$c")" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l)))
	done
	echo "$n"
}
count_mounts() { grep -c -- "$KILN_RUN_DIR" /proc/self/mountinfo || true; }

# count_own_slot_locks: the held slot locks taken by this test's processes
# (kiln-host, kiln-jail: a command line naming its $T_TMP or run
# directory). Other tests' VMs may come and go on the machine meanwhile; a
# lock whose taker is gone is held by a QEMU that count_qemu sees.
count_own_slot_locks() {
	local inodes ino pid n=0
	inodes=$(stat -c %i "${KILN_SLOT_DIR:-/run/kiln/slots}"/*.lock 2> /dev/null | sort -u)
	[ -n "$inodes" ] || { echo 0; return; }
	while read -r ino pid; do
		grep -qx "$ino" <<< "$inodes" || continue
		tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null | grep -qF -e "$T_TMP" -e "$KILN_RUN_DIR" && n=$((n + 1))
	done < <(awk '$2 == "FLOCK" { split($6, a, ":"); print a[3], $5 }' /proc/locks)
	echo "$n"
}

# ---- nothing left ----
# t_left: what this test's VMs hold now, one line: QEMU processes of its run
# directory, what is under that directory (files anywhere, directories
# below its first level: a first-level directory may be a host's run_dir),
# cgroups, mounts, slot locks its processes hold, its namespaces and bridge.
# t_mark: remembers those counts as the ones to come back to (lib.sh marks
# when it is sourced; a script marks again when its setup holds some on
# purpose). t_nothing_left NAME: ends what the test started (t_reap, then
# net_down), waits up to 10 s for exits to settle, and is one result NAME:
# ok when every count is back to its mark and CMD,
# when given (t_nothing_left NAME CMD...: what else the test must find
# gone), succeeds; else the counts before and now.
t_left() {
	echo "qemu=$(count_qemu) run=$(find "$KILN_RUN_DIR" -mindepth 1 \( -mindepth 2 -o ! -type d \) 2> /dev/null | wc -l)" \
		"cgroups=$(count_cgroups) mounts=$(count_mounts) locks=$(count_own_slot_locks) net=$(net_left)"
}
T_MARK=
t_mark() { T_MARK=$(t_left); }
t_nothing_left() {
	t_reap
	net_down
	local name=$1
	shift
	if t_until 10 _t_at_mark && { [ $# = 0 ] || "$@"; }; then ok "$name"
	else not_ok "$name" "before: $T_MARK" "now:    $(t_left)" ${1:+"and: $*"}; fi
}
_t_at_mark() { [ "$(t_left)" = "$T_MARK" ]; }
t_mark
