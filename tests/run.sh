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
# any were skipped), after a list of every skip with its reason; the exit
# status is 1 when anything failed, 2 on bad usage.
#
# What counts: every "ok"/"not ok" line is one result; "ok ... # SKIP why" (the
# TAP directive) is a skip; "not ok" is always a failure, whatever it says. A
# script that skips itself whole ("1..0 # SKIP why", exit 0) counts as one
# skip. A program that dies early, prints no plan, prints fewer or more results
# than its plan, fewer than the minimum it states ("# at least N results"), or
# exits non-zero although every result passed gets one more failure.
#
# Strict mode (KILN_TEST_STRICT=1, set by .ci/run): make test installs every
# dependency first, so a skip is a failure unless "SUITE: REASON" matches a
# pattern of tests/skips-allowed, each of whose lines says why that skip is
# legitimate on a CI machine.
#
# Knobs: B=build dir, KILN_TEST_TIMEOUT=seconds per unit/integration program,
# KILN_TEST_STRICT=1, KILN_TEST_SKIPS_ALLOWED=allow-list file,
# KILN_TEST_INTEGRATION_DIR=where the NN-*.sh scripts are (the runner's own
# test, 00-runner.sh, points it at scripts it makes up).
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
skips=()

idir=${KILN_TEST_INTEGRATION_DIR:-tests/integration}
strict=${KILN_TEST_STRICT:-0}
allow_file=${KILN_TEST_SKIPS_ALLOWED:-tests/skips-allowed}
allow_re=()
allow_why=()
# The allow-list: "ERE ## why" a line (the ERE matched against "SUITE:
# REASON"); blank lines and lines starting with # are comments. A line
# without its why is refused: every allowed skip says why it is legitimate.
load_allow_list() {
	local line n=0 re why
	[ -f "$allow_file" ] || return 0
	while IFS= read -r line || [ -n "$line" ]; do
		n=$((n + 1))
		[[ $line =~ ^[[:space:]]*(#|$) ]] && continue
		re=${line%% ## *}
		why=${line#* ## }
		if [ "$re" = "$line" ] || [ -z "${why// /}" ] || [ -z "${re// /}" ]; then
			echo "$allow_file:$n: want 'PATTERN ## why this skip is legitimate on CI'" >&2
			exit 2
		fi
		allow_re+=("$re")
		allow_why+=("$why")
	done <"$allow_file"
}
[ "$strict" = 1 ] && load_allow_list

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

# A skip: counted and listed with its reason; in strict mode a failure
# unless the allow-list admits it.
skip() { # suite text reason
	local i
	if [ "$strict" = 1 ]; then
		for i in "${!allow_re[@]}"; do
			if [[ "$1: $3" =~ ${allow_re[$i]} ]]; then
				skipped=$((skipped + 1))
				skips+=("$1: $3 (allowed: ${allow_why[$i]})")
				echo "[$1] $2"
				return
			fi
		done
		fail "$1" "$2" "skipped, and strict mode allows no such skip: $3"
		return
	fi
	skipped=$((skipped + 1))
	skips+=("$1: $3")
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
# results than its plan (or fewer than its stated minimum), or exits non-zero
# although every result passed, gets one extra failure saying so. A plan of
# 1..0 with a SKIP directive and no results is the whole program skipped.
run_tap() { # suite timeout-seconds command...
	local suite=$1 limit=$2
	shift 2
	local line neg desc plan=-1 plan_skip= n=0 nfail=0 rc min=0
	local re_result='^(not )?ok($|[[:space:]])[[:space:]]*([0-9]*)[[:space:]]*-?[[:space:]]*(.*)$'
	# The SKIP directive: "#", then a word starting with "skip" (TAP allows
	# SKIP, skipped, Skipping), then the reason. Greedy: the last such "#".
	local re_skip='^(.*[^\\])?#[[:space:]]*[Ss][Kk][Ii][Pp][^[:space:]]*([[:space:]]+(.*))?$'
	local re_plan='^1\.\.([0-9]+)([[:space:]]*#[[:space:]]*[Ss][Kk][Ii][Pp][^[:space:]]*([[:space:]]+(.*))?)?[[:space:]]*$'

	rm -f "$tmp/rc"
	while IFS= read -r line; do
		if [[ $line =~ $re_plan ]]; then
			plan=${BASH_REMATCH[1]}
			[ -z "${BASH_REMATCH[2]}" ] || plan_skip=${BASH_REMATCH[4]:-no reason given}
			echo "[$suite] $line"
		elif [[ $line =~ $re_result ]]; then
			n=$((n + 1))
			neg=${BASH_REMATCH[1]}
			desc=${BASH_REMATCH[4]}
			if [ -n "$neg" ]; then
				nfail=$((nfail + 1))
				fail "$suite" "$line" "${desc:-result $n}"
			elif [[ $line =~ $re_skip ]]; then
				desc=${desc%%#*}
				skip "$suite" "$line" "${desc%"${desc##*[![:space:]]}"}: ${BASH_REMATCH[3]:-no reason given}"
			else
				pass "$suite" "$line"
			fi
		elif [[ $line =~ ^#[[:space:]]*at[[:space:]]+least[[:space:]]+([0-9]+)[[:space:]]+results ]]; then
			min=${BASH_REMATCH[1]}
			echo "[$suite] $line"
		elif [[ $line == '#'* ]]; then
			echo "[$suite] $line"
		else
			echo "[$suite] # $line"
		fi
	done < <(
		# timeout leads its own process group: once the program has
		# ended, whatever it left in that group goes too (a child still
		# holding this pipe would keep the loop above waiting forever).
		timeout -k 10 "$limit" "$@" 2>&1 </dev/null &
		tpid=$!
		wait "$tpid"
		echo $? >"$tmp/rc"
		kill -KILL -- "-$tpid" 2>/dev/null
	)
	rc=$(cat "$tmp/rc" 2>/dev/null || echo 255)

	if [ "$plan" -eq 0 ] && [ "$n" -eq 0 ] && [ "$rc" -eq 0 ]; then
		if [ -n "$plan_skip" ]; then
			skip "$suite" "skipped whole: $plan_skip" "$plan_skip"
		else
			fail_extra "$suite" "planned no results (1..0) and said no SKIP reason"
		fi
	elif [ "$plan" -lt 0 ]; then
		fail_extra "$suite" "$(describe_rc "$rc") without printing a plan (1..N), after $n results"
	elif [ "$n" -lt "$plan" ]; then
		fail_extra "$suite" "$(describe_rc "$rc") after $n of $plan planned results"
	elif [ "$n" -gt "$plan" ]; then
		fail_extra "$suite" "printed $n results but planned $plan"
	elif [ "$n" -lt "$min" ]; then
		fail_extra "$suite" "printed $n results, fewer than the $min it said it would at least"
	elif [ "$rc" -ne 0 ] && [ "$nfail" -eq 0 ]; then
		fail_extra "$suite" "$(describe_rc "$rc") although every result passed"
	fi
}

# ---- unit tests and fuzzers ------------------------------------------------------

# Run every built program of one kind that has a source, then fail each
# source of that kind whose program was not built (so a broken build rule
# cannot drop a test). A program without a source is a stale build of a
# renamed or removed one: named, not run.
run_built() { # kind(unit|fuzz) make-target runner-function
	local kind=$1 target=$2 runner=$3 src name bin prefix
	local -A seen=()

	prefix=$([ "$kind" = unit ] && echo test_ || echo fuzz_)
	for bin in "$B/tests/$kind/$prefix"*; do
		[ -f "$bin" ] && [ -x "$bin" ] || continue
		name=${bin##*/}
		if [ ! -f "tests/$kind/$name.c" ]; then
			echo "# $bin: no tests/$kind/$name.c (a stale build), not run"
			continue
		fi
		seen[$name]=1
		selected "$name" || continue
		matched=$((matched + 1))
		"$runner" "$bin"
	done
	for src in "tests/$kind/$prefix"*.c; do
		[ -f "$src" ] || continue
		name=${src##*/}
		name=${name%.c}
		[ -z "${seen[$name]:-}" ] || continue
		selected "$name" || continue
		matched=$((matched + 1))
		fail_extra "$kind/$name" "not built: $B/tests/$kind/$name is missing (run make $target)"
	done
}

run_unit_test() { # binary
	CMOCKA_MESSAGE_OUTPUT=TAP run_tap "unit/${1##*/}" "${KILN_TEST_TIMEOUT:-300}" "$1"
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

# ---- integration tests ----------------------------------------------------------

run_integration() {
	local script name

	for script in "$idir"/[0-9]*.sh; do
		[ -f "$script" ] || continue
		name=${script##*/}
		selected "$name" || continue
		matched=$((matched + 1))
		if [ ! -x "$script" ]; then
			fail_extra "integration/$name" "not executable: $script (chmod +x, or it never runs)"
			continue
		fi
		run_tap "integration/$name" "${KILN_TEST_TIMEOUT:-900}" "$script"
	done
}

case $what in
unit) run_built unit unit run_unit_test ;;
fuzz) run_built fuzz fuzz replay_fuzzer ;;
integration) run_integration ;;
check)
	run_built unit unit run_unit_test
	run_built fuzz fuzz replay_fuzzer
	;;
all)
	run_built unit unit run_unit_test
	run_built fuzz fuzz replay_fuzzer
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
if [ "${#skips[@]}" -gt 0 ]; then
	echo "# SKIPPED ($([ "$strict" = 1 ] && echo "strict: each allowed by $allow_file" || echo "KILN_TEST_STRICT=1 would fail those not in $allow_file")):"
	for f in "${skips[@]}"; do
		echo "#   $f"
	done
fi
if [ "$skipped" -gt 0 ]; then
	echo "$passed passed, $failed failed, $skipped skipped"
else
	echo "$passed passed, $failed failed"
fi
exit "$status"
