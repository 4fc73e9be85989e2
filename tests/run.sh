#!/usr/bin/env bash
# tests/run.sh: kiln's test runner, the last step of `make test`. Runs the
# unit tests (cmocka, TAP), replays every fuzzer's corpus, then runs the
# integration scripts (TAP), printing each result as it arrives with its
# suite as prefix. Everything must already be built (make unit fuzz ...).
#
#   tests/run.sh [all|check|unit|fuzz|integration] [name-filter]
#
# check is unit + fuzz: what `make check` runs, no root, no VMs, no network
# beyond loopback. all is check, then the integration scripts.
# name-filter is a substring of the program name (test_spec, fuzz_proto,
# boot.sh). The last line printed is "N passed, N failed" (", N skipped" when
# any were skipped); the exit status is 1 when anything failed, 2 on bad usage.
# Knobs: B=build dir, KILN_TEST_TIMEOUT=seconds per unit/integration program.
set -u

usage() {
	echo "usage: $0 [all|check|unit|fuzz|integration] [name-filter]" >&2
	exit 2
}

cd "$(dirname "$0")/.." || exit 2
B=${B:-build}
export B

what=${1:-all}
filter=${2:-}
case $what in
all | check | unit | fuzz | integration) ;;
*) usage ;;
esac
[ $# -le 2 ] || usage

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-test.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT

passed=0
failed=0
skipped=0
matched=0
failures=()

# UBSan only reports and carries on unless told otherwise; a report is a failure.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

selected() { # name
	[ -z "$filter" ] || [[ $1 == *"$filter"* ]]
}

pass() { # suite text
	passed=$((passed + 1))
	echo "[$1] $2"
}

fail() { # suite text summary
	failed=$((failed + 1))
	failures+=("$1: $3")
	echo "[$1] $2"
}

skip() { # suite text
	skipped=$((skipped + 1))
	echo "[$1] $2"
}

# A result the runner itself makes up (not printed by the program).
fail_extra() { # suite reason
	fail "$1" "not ok - $2" "$2"
}

describe_rc() { # exit status -> words
	case $1 in
	124) echo "timed out" ;;
	1[3-9][0-9] | 2[0-5][0-9]) echo "was killed by signal $(($1 - 128))" ;;
	*) echo "exited with status $1" ;;
	esac
}

# Run a program that prints TAP and account for every result line as it
# arrives. A program that dies early, prints no plan, prints fewer or more
# results than its plan, or exits non-zero although every result passed,
# gets one extra failure saying so.
run_tap() { # suite timeout-seconds command...
	local suite=$1 limit=$2
	shift 2
	local line neg desc plan=-1 n=0 nfail=0 rc
	local re_result='^(not )?ok($|[[:space:]])[[:space:]]*([0-9]*)[[:space:]]*-?[[:space:]]*(.*)$'
	local re_skip='#[[:space:]]*[Ss][Kk][Ii][Pp]([^[:alnum:]]|$)'

	rm -f "$tmp/rc"
	while IFS= read -r line; do
		if [[ $line =~ ^1\.\.([0-9]+) ]]; then
			plan=${BASH_REMATCH[1]}
			echo "[$suite] $line"
		elif [[ $line =~ $re_result ]]; then
			n=$((n + 1))
			neg=${BASH_REMATCH[1]}
			desc=${BASH_REMATCH[4]}
			if [[ $line =~ $re_skip ]]; then
				skip "$suite" "$line"
			elif [ -z "$neg" ]; then
				pass "$suite" "$line"
			else
				nfail=$((nfail + 1))
				fail "$suite" "$line" "${desc:-result $n}"
			fi
		elif [[ $line == '#'* ]]; then
			echo "[$suite] $line"
		else
			echo "[$suite] # $line"
		fi
	done < <(
		timeout -k 10 "$limit" "$@" 2>&1 </dev/null
		echo $? >"$tmp/rc"
	)
	rc=$(cat "$tmp/rc" 2>/dev/null || echo 255)

	if [ "$plan" -lt 0 ]; then
		fail_extra "$suite" "$(describe_rc "$rc") without printing a plan (1..N), after $n results"
	elif [ "$n" -lt "$plan" ]; then
		fail_extra "$suite" "$(describe_rc "$rc") after $n of $plan planned results"
	elif [ "$n" -gt "$plan" ]; then
		fail_extra "$suite" "printed $n results but planned $plan"
	elif [ "$rc" -ne 0 ] && [ "$nfail" -eq 0 ]; then
		fail_extra "$suite" "$(describe_rc "$rc") although every result passed"
	fi
}

# ---- unit tests --------------------------------------------------------------

run_unit() {
	local src name bin
	local -A seen=()

	for bin in "$B"/tests/unit/test_*; do
		[ -f "$bin" ] && [ -x "$bin" ] || continue
		name=${bin##*/}
		seen[$name]=1
		selected "$name" || continue
		matched=$((matched + 1))
		CMOCKA_MESSAGE_OUTPUT=TAP run_tap "unit/$name" "${KILN_TEST_TIMEOUT:-300}" "$bin"
	done
	for src in tests/unit/test_*.c; do
		[ -f "$src" ] || continue
		name=${src##*/}
		name=${name%.c}
		[ -z "${seen[$name]:-}" ] || continue
		selected "$name" || continue
		matched=$((matched + 1))
		fail_extra "unit/$name" "not built: $B/tests/unit/$name is missing (run make unit)"
	done
}

# ---- fuzz corpus replay -------------------------------------------------------

# -runs=0 makes libFuzzer execute every file of the corpus once (plus the
# empty input) and stop, exiting non-zero on the first crash, leak or
# sanitizer report. -max_len: by default inputs are cut to 1 MiB; replay
# them whole. A crashing input is saved under $B/fuzz-artifacts/, not in the
# source tree; add it to the corpus once fixed.
# The count of files libFuzzer says it read is checked against the corpus,
# so unreadable inputs cannot silently drop out.
replay_fuzzer() { # binary
	local bin=$1 name=${1##*/}
	local suite=fuzz/$name dir=tests/fuzz/corpus/${name#fuzz_}
	local nfiles maxlen found rc line

	if [ ! -d "$dir" ]; then
		fail_extra "$suite" "no corpus: $dir is missing"
		return
	fi
	nfiles=$(find "$dir" -type f -size +0c | wc -l)
	if [ "$nfiles" -eq 0 ]; then
		fail_extra "$suite" "corpus $dir holds no non-empty inputs"
		return
	fi
	maxlen=$(find "$dir" -type f -printf '%s\n' | sort -n | tail -n 1)
	mkdir -p "$B/fuzz-artifacts"
	timeout -k 10 "${KILN_TEST_TIMEOUT:-600}" "$bin" -runs=0 -max_len="$maxlen" -timeout=60 \
		-artifact_prefix="$B/fuzz-artifacts/$name-" "$dir/" >"$tmp/$name.log" 2>&1 </dev/null
	rc=$?
	found=$(sed -n 's/^INFO: *\([0-9][0-9]*\) files found in .*/\1/p' "$tmp/$name.log" | head -n 1)
	if [ "$rc" -eq 0 ] && [ "${found:-x}" = "$nfiles" ]; then
		pass "$suite" "ok - replayed $nfiles inputs from $dir"
		return
	fi
	tail -n 40 "$tmp/$name.log" | while IFS= read -r line; do
		echo "[$suite] # $line"
	done
	if [ "$rc" -ne 0 ]; then
		fail_extra "$suite" "replaying $dir $(describe_rc "$rc")"
	else
		fail_extra "$suite" "libFuzzer read ${found:-no} files of the $nfiles in $dir"
	fi
}

run_fuzz() {
	local src name bin
	local -A seen=()

	for bin in "$B"/tests/fuzz/fuzz_*; do
		[ -f "$bin" ] && [ -x "$bin" ] || continue
		name=${bin##*/}
		seen[$name]=1
		selected "$name" || continue
		matched=$((matched + 1))
		replay_fuzzer "$bin"
	done
	for src in tests/fuzz/fuzz_*.c; do
		[ -f "$src" ] || continue
		name=${src##*/}
		name=${name%.c}
		[ -z "${seen[$name]:-}" ] || continue
		selected "$name" || continue
		matched=$((matched + 1))
		fail_extra "fuzz/$name" "not built: $B/tests/fuzz/$name is missing (run make fuzz)"
	done
}

# ---- integration tests ----------------------------------------------------------

run_integration() {
	local script name

	for script in tests/integration/*.sh; do
		[ -f "$script" ] && [ -x "$script" ] || continue
		name=${script##*/}
		selected "$name" || continue
		matched=$((matched + 1))
		run_tap "integration/$name" "${KILN_TEST_TIMEOUT:-900}" "$script"
	done
}

case $what in
unit) run_unit ;;
fuzz) run_fuzz ;;
integration) run_integration ;;
check)
	run_unit
	run_fuzz
	;;
all)
	run_unit
	run_fuzz
	run_integration
	;;
esac

status=0
if [ -n "$filter" ] && [ "$matched" -eq 0 ]; then
	echo "# no $what tests match '$filter'"
	status=1
fi
if [ "$failed" -gt 0 ]; then
	echo "# FAILED:"
	for f in "${failures[@]}"; do
		echo "#   $f"
	done
	status=1
fi
if [ "$skipped" -gt 0 ]; then
	echo "$passed passed, $failed failed, $skipped skipped"
else
	echo "$passed passed, $failed failed"
fi
exit "$status"
