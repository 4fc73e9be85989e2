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

t_cleanup() {
	pg_stop
	rm -rf "$T_TMP"
	rmdir "$KILN_RUN_DIR" 2>/dev/null || true
}

# pg_start: a PostgreSQL of this test's own (scripts/pg-local.sh: initdb in a
# temporary directory, a Unix socket only), its URI in T_PG_URL. t_cleanup
# stops it and removes its directory; a TERM/INT/HUP exits through it too.
T_PG_DIR=
T_PG_URL=
pg_start() {
	T_PG_DIR=$(mktemp -d /tmp/kiln-it-pg.XXXXXX)
	trap 'exit 143' TERM INT HUP
	T_PG_URL=$("$ROOT/scripts/pg-local.sh" start "$T_PG_DIR")
}
pg_stop() {
	[ -n "$T_PG_DIR" ] || return 0
	"$ROOT/scripts/pg-local.sh" stop "$T_PG_DIR" || true
	rm -rf "$T_PG_DIR"
	T_PG_DIR=
}
count_postgres() { [ -z "$T_PG_DIR" ] && echo 0 || pgrep -c -f "postgres -D $T_PG_DIR/" || true; }

ok() { T_N=$((T_N + 1)); echo "ok $T_N - $1"; }
not_ok() {
	T_N=$((T_N + 1)); T_FAILED=$((T_FAILED + 1)); echo "not ok $T_N - $1"
	shift; for l in "$@"; do printf '#   %s\n' "$l"; done
}
skip() { T_N=$((T_N + 1)); echo "ok $T_N - $1 # SKIP $2"; }
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
t_done() { echo "1..$T_N"; [ "$T_FAILED" -eq 0 ]; }

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
# namespace (jails mount only inside their own), and held slot locks.
kiln_cgroup_parent() { # CONTROLLER
	local own
	own=$(awk -F: -v c="$1" '{ n = split($2, a, ","); for (i = 1; i <= n; i++) if (a[i] == c) print $3 }' /proc/self/cgroup)
	[ "$own" = / ] && own=
	echo "/sys/fs/cgroup/$1$own/kiln"
}
count_cgroups() {
	local n=0 c
	for c in memory cpu pids; do
		n=$((n + $(find "$(kiln_cgroup_parent "$c")" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l)))
	done
	echo "$n"
}
count_mounts() { grep -c -- "$KILN_RUN_DIR" /proc/self/mountinfo || true; }
count_slot_locks() {
	local inodes
	inodes=$(stat -c %i "${KILN_SLOT_DIR:-/run/kiln/slots}"/*.lock 2>/dev/null | sort -u)
	if [ -z "$inodes" ]; then echo 0; return; fi
	awk '$2 == "FLOCK" { split($6, a, ":"); print a[3] }' /proc/locks | grep -cxF -f <(echo "$inodes") || true
}
