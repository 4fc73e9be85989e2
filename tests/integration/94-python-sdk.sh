#!/usr/bin/env bash
# The Python SDK (sdk/python, package kiln, standard library only) against
# the whole stack: kiln-api, a local S3 and one kiln-host on loopback, real
# VMs (tests/e2b/stack.sh starts them). tests/sdk/test_python_sdk.py runs
# with Python's unittest from the checkout (PYTHONPATH); each of its checks
# is one result here. Then the SDK is installed with pip into a fresh venv,
# offline, and imported from there; and nothing of the stack is left.
. "$(dirname "$0")/lib.sh"
t_plan 28
require_image
. "$ROOT/tests/e2b/stack.sh"
e2b_require
PY=/usr/bin/python3

before_cg=$(count_cgroups)
before_mounts=$(count_mounts)
e2b_stack_start

client_results -e "$T_TMP/sdk.err" sdk "$T_TMP/sdk.out" \
	env -i PATH=/usr/bin:/bin HOME="$T_TMP" T_TMP="$T_TMP" PYTHONPATH="$ROOT/sdk/python" PYTHONDONTWRITEBYTECODE=1 \
	KILN_API="$URL" KILN_KEY="$KA" KILN_TEST_ADMIN="$ADMIN" KILN_TEST_OTHER_KEY="$KB" \
	timeout -k 5 900 "$PY" "$ROOT/tests/sdk/test_python_sdk.py"
summary=$(grep '^sdk_test: ' "$T_TMP/sdk.out" | tail -n 1)
# tests/sdk/test_python_sdk.py has exactly 17 tests.
check "the SDK's unittest ran to its end: ${summary:-no summary} ($C_N checks of 17)" \
	[ "$summary" = "sdk_test: $C_N run, 0 failed" -a "$C_N" = 17 ]
[ -n "$summary" ] || echo "# $(tail -n 5 "$T_TMP/sdk.err")"

# pip install ./sdk/python, offline, into a venv that sees Debian's setuptools
# (from a copy: a build writes kiln.egg-info next to the sources).
cp -r "$ROOT/sdk/python" "$T_TMP/sdk-src"
if $PY -m venv --system-site-packages "$T_TMP/venv" > "$T_TMP/venv.log" 2>&1 &&
	"$T_TMP/venv/bin/python" -m pip install -q --no-index --no-build-isolation "$T_TMP/sdk-src" >> "$T_TMP/venv.log" 2>&1; then
	got=$(cd / && env -i PATH=/usr/bin:/bin HOME="$T_TMP" "$T_TMP/venv/bin/python" -c \
		'import kiln, os; print(kiln.__version__, os.path.dirname(kiln.__file__).startswith(os.environ.get("VIRTUAL_ENV", "") or "'"$T_TMP"'/venv"))')
	check "pip install ./sdk/python works offline; kiln imports from the venv ($got)" [ "$got" = "0.1.0 True" ]
	out=$(cd / && env -i PATH=/usr/bin:/bin HOME="$T_TMP" KILN_API="$URL" KILN_KEY="$KA" "$T_TMP/venv/bin/python" \
		-c 'import kiln; print(kiln.Client().run("print(6 * 7)").stdout, end="")' 2>&1)
	check "...and runs a task from there ($out)" [ "$out" = 42 ]
else
	not_ok "pip install ./sdk/python" "$(tail -n 3 "$T_TMP/venv.log")"
fi

# The example runs as written.
out=$(env -i PATH=/usr/bin:/bin HOME="$T_TMP" PYTHONPATH="$ROOT/sdk/python" PYTHONDONTWRITEBYTECODE=1 KILN_API="$URL" KILN_KEY="$KA" \
	timeout 300 "$PY" "$ROOT/examples/python_sdk.py" 2>&1)
check "examples/python_sdk.py runs ($(tail -n 1 <<< "$out"))" [ "$(tail -n 1 <<< "$out")" = "done" ]

st=$(curl -s -m 30 -o "$T_TMP/usage.json" -w '%{http_code}' -H "Authorization: Bearer $KA" "$URL/v1/usage")
for _ in $(seq 50); do
	[ "$(jq -r '.usage.running + .usage.sessions + .usage.paused_sessions' "$T_TMP/usage.json")" = 0 ] && break
	sleep 0.2; curl -s -m 30 -o "$T_TMP/usage.json" -H "Authorization: Bearer $KA" "$URL/v1/usage"
done
check "acme holds nothing afterwards: usage running 0, sessions 0, paused 0 ($(jq -c .usage "$T_TMP/usage.json" 2> /dev/null))" \
	[ "$st" = 200 -a "$(jq -r '.usage.running + .usage.sessions + .usage.paused_sessions' "$T_TMP/usage.json")" = 0 ]
for _ in $(seq 50); do [ "$(vcpus_used)" = 0 ] && break; sleep 0.2; done
check "the host holds no vCPU ($(vcpus_used))" [ "$(vcpus_used)" = 0 ]
check "no Python process of the test is left" [ "$(pgrep -c -f test_python_sdk.py || true)" = 0 ]
check "the checkout is as it was: no build or bytecode files under sdk/python ($(git -C "$ROOT" status --porcelain --ignored -- sdk/python | head -c 200))" \
	[ -z "$(git -C "$ROOT" status --porcelain --ignored -- sdk/python 2> /dev/null)" ]

e2b_stack_stop
check "nothing left: no QEMU ($(count_qemu)), VM directories ($(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)), mounts ($(count_mounts) = $before_mounts), cgroups ($(count_cgroups) = $before_cg)" \
	[ "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)" = 0 \
	-a "$(count_mounts)" = "$before_mounts" -a "$(count_cgroups)" = "$before_cg" ]
t_done
