#!/usr/bin/env bash
# The test runner's own accounting (tests/run.sh): made-up scripts in a
# directory of their own, run through the real runner, and its counts, its
# list of skips and its exit status checked. Needs nothing but bash.
. "$(dirname "$0")/lib.sh"
t_plan 20

D=$T_TMP/scripts
ALLOW=$T_TMP/allow
mkdir -p "$D"
: > "$ALLOW"

# script NAME BODY: a made-up NN-*.sh, executable.
script() { rm -f "$D"/*.sh; printf '#!/usr/bin/env bash\n%s\n' "$2" > "$D/$1"; chmod +x "$D/$1"; }
# runner [VAR=VALUE...]: tests/run.sh integration over $D; its output in
# $T_TMP/out, its last line in LAST, its status in RC.
runner() {
	env KILN_TEST_INTEGRATION_DIR="$D" KILN_TEST_SKIPS_ALLOWED="$ALLOW" KILN_TEST_STRICT=0 "$@" \
		"$ROOT/tests/run.sh" integration > "$T_TMP/out" 2>&1
	RC=$?
	LAST=$(tail -n 1 "$T_TMP/out")
}
out_has() { grep -qF -- "$1" "$T_TMP/out"; }
diag() { sed 's/^/  /' "$T_TMP/out" | tail -n 8; }
expect() { # NAME LAST RC [TEXT]
	if [ "$LAST" = "$2" ] && [ "$RC" = "$3" ] && { [ -z "${4:-}" ] || out_has "$4"; }; then
		ok "$1"
	else
		not_ok "$1" "want '$2' (status $3)${4:+ and '$4'}, got '$LAST' (status $RC)" "$(diag)"
	fi
}

script 01-whole.sh 'echo "1..0 # SKIP no widget here"'
runner
expect "a script that skips itself whole counts as one skip, listed with its reason" \
	"0 passed, 0 failed, 1 skipped" 0 "integration/01-whole.sh: no widget here"

runner KILN_TEST_STRICT=1
expect "strict: that skip is a failure when the allow-list does not name it" "0 passed, 1 failed" 1 "strict mode allows no such skip: no widget here"

echo 'integration/01-whole\.sh: no widget ## made-up: this machine has no widget' > "$ALLOW"
runner KILN_TEST_STRICT=1
expect "strict: an allow-listed skip stays a skip, listed with the allow-list's why" \
	"0 passed, 0 failed, 1 skipped" 0 "(allowed: made-up: this machine has no widget)"

echo 'integration/01-whole\.sh: no widget' > "$ALLOW"
runner KILN_TEST_STRICT=1
check "strict: an allow-list line that says no why is refused (status 2)" [ "$RC" = 2 ]
: > "$ALLOW"

script 02-noreason.sh 'echo "1..0"'
runner
expect "a plan of 1..0 without a SKIP reason is a failure" "0 passed, 1 failed" 1 "said no SKIP reason"

script 03-notok.sh 'echo "1..2"; echo "ok 1 - a"; echo "not ok 2 - b # SKIP not really"'
runner
expect "'not ok' with a SKIP in it is a failure, not a skip" "1 passed, 1 failed" 1

script 04-skipone.sh 'echo "1..2"; echo "ok 1 - a"; echo "ok 2 - b # SKIP no gadget"'
runner
expect "'ok ... \\# SKIP why' is a skip with its reason" "1 passed, 0 failed, 1 skipped" 0 "integration/04-skipone.sh: b: no gadget"

script 05-hash.sh 'echo "1..2"; echo "ok 1 - issue #3 mended, skipping nothing"; echo "ok 2 - a \\# SKIP escaped"'
runner
expect "a '#' in a description, or an escaped SKIP directive, is no skip" "2 passed, 0 failed" 0

script 06-noexec.sh 'echo "1..1"; echo "ok 1 - a"'
chmod -x "$D/06-noexec.sh"
runner
expect "an NN-*.sh without its exec bit is a failure, not dropped" "0 passed, 1 failed" 1 "not executable"

script 07-short.sh 'echo "1..3"; echo "ok 1 - a"; echo "ok 2 - b"'
runner
expect "fewer results than the plan printed first: a failure" "2 passed, 1 failed" 1 "after 2 of 3 planned results"

script 08-min.sh 'echo "# at least 3 results"; echo "ok 1 - a"; echo "ok 2 - b"; echo "1..2"'
runner
expect "fewer results than the stated minimum: a failure" "2 passed, 1 failed" 1 "fewer than the 3 it said"

script 09-rc.sh 'echo "1..1"; echo "ok 1 - a"; exit 3'
runner
expect "a non-zero exit with every result passing: a failure" "1 passed, 1 failed" 1 "exited with status 3 although every result passed"

script 10-skiprc.sh 'echo "1..0 # SKIP gave up"; exit 1'
runner
expect "a whole-script skip that exits non-zero: a failure, not a skip" "0 passed, 1 failed" 1

script 11-lib.sh ". '$ROOT/tests/integration/lib.sh'; t_plan 2; ok first; check second true; t_done"
runner
expect "lib.sh's t_plan prints the plan first, t_done no second plan" "2 passed, 0 failed" 0

script 12-libshort.sh ". '$ROOT/tests/integration/lib.sh'; t_plan 3; ok first; t_bail 'the daemon did not start' 'its log: x'; ok never"
runner
expect "lib.sh's t_bail: a failure, and the plan shows what was not run" "1 passed, 2 failed" 1 "after 2 of 3 planned results"

script 13-both.sh 'echo "1..1"; echo "ok 1 - a"'
printf '#!/usr/bin/env bash\necho "1..0 # SKIP second"\n' > "$D/14-second.sh"; chmod +x "$D/14-second.sh"
runner
expect "every script runs, and the skip list comes before the last line" "1 passed, 0 failed, 1 skipped" 0 "# SKIPPED"

# A program that leaves a child holding its output: the runner goes on
# when the program ends (it waited forever before), and the child is gone.
script 15-leaves.sh "echo 1..1; (exec -a kiln-runner-leftover-$$ sleep 600) & echo ok 1 - a"
t0=$(date +%s)
timeout 120 env KILN_TEST_INTEGRATION_DIR="$D" KILN_TEST_SKIPS_ALLOWED="$ALLOW" KILN_TEST_STRICT=0 \
	"$ROOT/tests/run.sh" integration > "$T_TMP/out" 2>&1
RC=$?
left=$(pgrep -c -f "kiln-runner-leftover-$$" || true)
check "a child left holding the program's output: the runner ends ($(($(date +%s) - t0)) s, status $RC) and the child is killed ($left left)" \
	[ "$RC" = 0 -a "$(tail -n 1 "$T_TMP/out")" = "1 passed, 0 failed" -a "$left" = 0 ]
pkill -f "kiln-runner-leftover-$$" 2> /dev/null || true

# lib.sh's jq: with -e, nothing printed is a failure (jq 1.6 says 0).
printf '' | jq -e '.ok' > /dev/null; rc1=$?
printf '' | jq -er '.ok' > /dev/null; rc2=$?
check "lib.sh's jq -e (and -er) over an empty answer fails ($rc1, $rc2)" [ "$rc1" != 0 -a "$rc2" != 0 ]
v=$(echo '{"ok":true}' | jq -er .ok); rc1=$?
echo '{"ok":false}' | jq -e .ok > /dev/null; rc2=$?
check "... and still passes a true answer through (status $rc1, '$v') and fails a false one ($rc2)" [ "$rc1" = 0 -a "$v" = true -a "$rc2" = 1 ]
v=$(echo '{"a":1}' | jq -c --arg e x '{b: $e}')
check "... without -e it is jq itself ($v)" [ "$v" = '{"b":"x"}' ]
t_done
