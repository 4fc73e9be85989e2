#!/usr/bin/env bash
# E2B's own JavaScript SDK (e2b 2.51.0 from npm, unmodified; installed by
# scripts/e2b-sdk.sh into a cache outside the clone) against the whole stack:
# kiln-api, a local S3 and one kiln-host on loopback, real VMs, two
# customers. tests/e2b/sdk_test.mjs runs with only E2B_API_URL,
# E2B_SANDBOX_URL and E2B_API_KEY set (plus the second customer's key for
# the isolation checks); each of its checks is one result here. Then: the
# sandbox it killed is gone from the API, the host and S3, and nothing of the
# stack is left (processes, mounts, cgroups, VM directories).
# The plain protocol with curl: 93-e2b-protocol.sh.
. "$(dirname "$0")/lib.sh"
t_plan 58
require_image
. "$ROOT/tests/e2b/stack.sh"
e2b_require
SDK=$("$ROOT/scripts/e2b-sdk.sh" 2> "$T_TMP/sdk.err") || t_skip_all "the E2B SDK could not be installed: $(tail -n 1 "$T_TMP/sdk.err")"

before_cg=$(count_cgroups)
before_mounts=$(count_mounts)
before_node=$(pgrep -c -f "$ROOT/tests/e2b/sdk_test.mjs" || true)
e2b_stack_start

# ---- the SDK test: each of its checks is a result ----
# Only the three E2B variables (and the test's own two) reach node.
client_results sdk "$T_TMP/sdk.out" env -i PATH=/usr/bin:/bin HOME="$T_TMP" \
	E2B_API_URL="$URL/e2b" E2B_SANDBOX_URL="$URL" E2B_API_KEY="$KA" \
	E2B_TEST_OTHER_KEY="$KB" KILN_E2B_SDK="$SDK" \
	timeout -k 5 600 node "$ROOT/tests/e2b/sdk_test.mjs"
summary=$(grep '^sdk_test: ' "$T_TMP/sdk.out" | tail -n 1)
# tests/e2b/sdk_test.mjs prints exactly 49 checks (E2B_TEST_OTHER_KEY set).
check "the SDK test ran to its end: ${summary:-no summary} (exit ${C_RC:-?}, $C_N checks of 49)" \
	[ -n "$summary" -a "$C_N" = 49 -a "${C_RC:-1}" = "$(grep -q '^FAIL ' "$T_TMP/sdk.out" && echo 1 || echo 0)" ]

# ---- what the killed sandbox leaves: nothing ----
SBX=$(sed -n 's/^PASS Sandbox.create() .* (\([^ ]*\) in [0-9]* ms).*/\1/p' "$T_TMP/sdk.out" | head -n 1)
if [ -n "$SBX" ]; then
	st=$(curl -s -m 30 -o "$T_TMP/sess.json" -w '%{http_code}' -H "Authorization: Bearer $KA" "$URL/v1/sessions/$SBX")
	check "its session $SBX is destroyed in kiln's own API (HTTP $st, $(jq -r '.state + " " + (.end_reason // "")' "$T_TMP/sess.json" 2> /dev/null))" \
		[ "$st" = 200 -a "$(jq -r .state "$T_TMP/sess.json")" = destroyed ]
	rc=$(s3_head "acme/sessions/$SBX/manifest.json")
	check "the snapshot of its pause is deleted from S3 (s3tool head: $rc; 3 = absent)" [ "$rc" = 3 ]
else
	not_ok "the sandbox id is in the SDK test's output" "$(head -n 3 "$T_TMP/sdk.out")"
fi
st=$(curl -s -m 30 -o "$T_TMP/usage.json" -w '%{http_code}' -H "Authorization: Bearer $KA" "$URL/v1/usage")
check "acme holds nothing: usage running 0, sessions 0, paused 0 ($(jq -c .usage "$T_TMP/usage.json" 2> /dev/null))" \
	[ "$st" = 200 -a "$(jq -r '.usage.running + .usage.sessions + .usage.paused_sessions' "$T_TMP/usage.json")" = 0 ]
for _ in $(seq 50); do [ "$(vcpus_used)" = 0 ] && break; sleep 0.2; done
check "the host holds no vCPU ($(vcpus_used))" [ "$(vcpus_used)" = 0 ]
check "no node process of the test is left" [ "$(pgrep -c -f "$ROOT/tests/e2b/sdk_test.mjs" || true)" = "$before_node" ]

e2b_stack_stop
check "nothing left: no QEMU ($(count_qemu)), VM directories ($(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)), mounts ($(count_mounts) = $before_mounts), cgroups ($(count_cgroups) = $before_cg)" \
	[ "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)" = 0 \
	-a "$(count_mounts)" = "$before_mounts" -a "$(count_cgroups)" = "$before_cg" ]
t_done
