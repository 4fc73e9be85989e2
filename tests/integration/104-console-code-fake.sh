#!/usr/bin/env bash
# The web console's code view and task images in Debian's headless Chromium
# against a stand-in kiln-api (tests/console/fake_api.py serving ui/ with
# kiln-api's CSP; no VM, so it runs where VMs cannot): the same browser test
# as 102-console-code.sh (tests/console/code_test.mjs): a task's template and
# its PNG output inline, a cell's figure, DataFrame table and main result,
# HTML only in a frame with an empty sandbox attribute whose script does not
# run, no CSP violation. Each of its checks is one result here.
. "$(dirname "$0")/lib.sh"
t_require_tools node python3
[ -x /usr/bin/chromium ] || t_skip_all "/usr/bin/chromium missing: run scripts/deps.sh"
DEPS=$("$ROOT/scripts/console-deps.sh" 2> "$T_TMP/deps.err") || t_skip_all "playwright-core could not be installed: $(tail -n 1 "$T_TMP/deps.err")"
before_chrome=$(pgrep -c -x chromium || true)
KEY=kiln_fake_$RANDOM$RANDOM
t_bg python3 "$ROOT/tests/console/fake_api.py" "$ROOT/ui" "$KEY" > "$T_TMP/port"
for _ in $(seq 100); do [ -s "$T_TMP/port" ] && break; sleep 0.05; done
API=http://127.0.0.1:$(cat "$T_TMP/port")
client_results code "$T_TMP/code.out" env -i PATH=/usr/bin:/bin HOME="$T_TMP" KILN_CONSOLE_DEPS="$DEPS" \
	KILN_URL="$API" KILN_KEY="$KEY" TASK_ID="t_$(printf 'a%.0s' $(seq 32))" SESSION_ID="s_$(printf 'b%.0s' $(seq 32))" \
	timeout -k 5 300 node "$ROOT/tests/console/code_test.mjs"
summary=$(grep '^code_test: ' "$T_TMP/code.out" | tail -n 1)
check "the browser test ran to its end: ${summary:-no summary} ($C_N checks)" [ -n "$summary" -a "${C_RC:-1}" = 0 ]
for _ in $(seq 50); do [ "$(pgrep -c -x chromium || true)" = "$before_chrome" ] && break; sleep 0.2; done
check "no Chromium of the test is left" [ "$(pgrep -c -x chromium || true)" = "$before_chrome" ]
t_done
