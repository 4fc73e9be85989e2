#!/usr/bin/env bash
# The web console's code results and task images (tests/console/code_test.mjs
# in Debian's headless Chromium with playwright-core) against `kiln up`: a
# task of python-data writing /output/plot.png (its template in the list and
# the page, the PNG inline through GET /v1/tasks/{id}/outputs/0), and a
# session of code-interpreter whose cell shows a figure, a DataFrame table and
# HTML confined to a sandboxed frame. The outputs route is checked with curl
# first (its headers: an attachment that is never rendered). Each of the
# browser test's checks is one result here; then nothing of the stack is left.
. "$(dirname "$0")/lib.sh"
require_image
CI=$ROOT/build/image/rootfs-code-interpreter.ext4
[ -r "$CI" ] || { echo "1..0 # SKIP the code-interpreter image is missing ($CI): run make image"; exit 0; }
t_require_tools swift-proxy-server memcached jq node
t_require_built kiln kiln-api kiln-host
[ -x /usr/bin/chromium ] || t_skip_all "/usr/bin/chromium missing: run scripts/deps.sh"
DEPS=$("$ROOT/scripts/console-deps.sh" 2> "$T_TMP/deps.err") || t_skip_all "playwright-core could not be installed: $(tail -n 1 "$T_TMP/deps.err")"
KILN=$ROOT/build/kiln
before_procs=$(up_procs)
before_chrome=$(pgrep -c -x chromium || true)
kiln_up
API=$(sed -n 's/^KILN_API=//p' "$UP/credentials")
KEY=$(sed -n 's/^KILN_KEY=//p' "$UP/credentials")

# A 7x5 PNG written with the standard library only.
PNG_CODE=$'import struct, zlib\ndef chunk(k, d): return struct.pack(">I", len(d)) + k + d + struct.pack(">I", zlib.crc32(k + d))\nraw = b"".join(b"\\x00" + b"\\xff\\x00\\x00" * 7 for _ in range(5))\npng = b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 7, 5, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")\nopen("/output/plot.png", "wb").write(png)\nprint("ok")'
TASK=$(jq -cn --arg c "$PNG_CODE" '{language:"python", code:$c, template:"python-data"}' |
	cust -X POST --data-binary @- "$API/v1/tasks" | jq -r .id)
for _ in $(seq 300); do
	st=$(cust "$API/v1/tasks/$TASK" | jq -r .state)
	case $st in succeeded | failed | error | timed_out | cancelled) break ;; esac
	sleep 0.2
done
check "a task of python-data writes /output/plot.png ($st)" [ "$st" = succeeded ]
code=$(curl -s -m 30 -D "$T_TMP/oh" -o "$T_TMP/out.png" -w '%{http_code}' -H "Authorization: Bearer $KEY" "$API/v1/tasks/$TASK/outputs/0")
dims=$("$ROOT/tests/integration/png_check.py" --raw < "$T_TMP/out.png" 2>&1)
check "GET /v1/tasks/{id}/outputs/0: the PNG's bytes ($code, $dims), an attachment of octet-stream, nosniff, a sandbox CSP" \
	eval '[ "$code" = 200 -a "$dims" = 7x5 ] && grep -qi "^content-type: application/octet-stream" "$T_TMP/oh" &&
	grep -qi "^content-disposition: attachment" "$T_TMP/oh" && grep -qi "^x-content-type-options: nosniff" "$T_TMP/oh" &&
	grep -qi "^content-security-policy: sandbox" "$T_TMP/oh"'
code=$(curl -s -m 30 -o "$T_TMP/o.json" -w '%{http_code}' "$API/v1/tasks/$TASK/outputs/0")
code2=$(curl -s -m 30 -o "$T_TMP/o2.json" -w '%{http_code}' -H "Authorization: Bearer $KEY" "$API/v1/tasks/$TASK/outputs/1")
check "...without a key 401, a missing output 404 ($code, $code2)" [ "$code" = 401 -a "$code2" = 404 ]

SESSION=$(cust -X POST -d '{"template":"code-interpreter"}' "$API/v1/sessions" | jq -r .id)
check "a session of code-interpreter ($SESSION)" [ -n "$SESSION" -a "$SESSION" != null ]

client_results code "$T_TMP/code.out" env -i PATH=/usr/bin:/bin HOME="$T_TMP" KILN_CONSOLE_DEPS="$DEPS" \
	KILN_URL="$API" KILN_KEY="$KEY" TASK_ID="$TASK" SESSION_ID="$SESSION" \
	timeout -k 5 300 node "$ROOT/tests/console/code_test.mjs"
summary=$(grep '^code_test: ' "$T_TMP/code.out" | tail -n 1)
check "the browser test ran to its end: ${summary:-no summary} ($C_N checks)" [ -n "$summary" -a "${C_RC:-1}" = 0 ]

cust -X DELETE "$API/v1/sessions/$SESSION" > /dev/null
kill -TERM "$up_pid"
wait "$up_pid"
up_pid=
for _ in $(seq 100); do [ "$(up_procs)" = "$before_procs" ] && break; sleep 0.1; done
for _ in $(seq 50); do [ "$(pgrep -c -x chromium || true)" = "$before_chrome" ] && break; sleep 0.2; done
check "no Chromium of the test is left" [ "$(pgrep -c -x chromium || true)" = "$before_chrome" ]
t_nothing_left "kiln up stopped: no process of the stack left ($(up_procs)), nor QEMU, files, cgroups, mounts" \
	[ "$(up_procs)" = "$before_procs" ]
t_done
