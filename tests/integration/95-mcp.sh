#!/usr/bin/env bash
# `kiln mcp` driven by the official MCP TypeScript SDK client
# (@modelcontextprotocol/sdk from npm, pinned in tests/mcp/package-lock.json,
# installed by scripts/mcp-sdk.sh into a cache outside the clone) with
# StdioClientTransport running build/kiln mcp, against the whole stack:
# kiln-api, a local S3 and one kiln-host on loopback, real VMs.
# tests/mcp/client.mjs: tools/list, run_code (with a file in and an output
# file out, downloaded through its url), a failing program, a sandbox round
# trip (create, write, read, list, exec, fork, snapshot, a sandbox from the
# snapshot, a volume written in one sandbox and read in the next, pause, resume, destroy), a failing command, bad arguments, a wrong key and malformed protocol lines; each of
# its checks is one result here (KILN_MCP_BIN runs another kiln binary, e.g. a
# wrapper that runs it under valgrind). Then: nothing of acme's is left running and
# nothing of the stack is left (processes, mounts, cgroups, VM directories).
. "$(dirname "$0")/lib.sh"
t_plan 63
require_image
. "$ROOT/tests/e2b/stack.sh"
e2b_require
t_require_built kiln
SDK=$("$ROOT/scripts/mcp-sdk.sh" 2> "$T_TMP/sdk.err") || t_skip_all "the MCP SDK could not be installed: $(tail -n 1 "$T_TMP/sdk.err")"

before_cg=$(count_cgroups)
before_mounts=$(count_mounts)
before_mcp=$(pgrep -c -x -f "$ROOT/build/kiln mcp" || true)
e2b_stack_start

client_results mcp "$T_TMP/mcp.out" \
	env -i PATH=/usr/bin:/bin HOME="$T_TMP" KILN_MCP_SDK="$SDK" KILN_BIN="${KILN_MCP_BIN:-$ROOT/build/kiln}" \
	KILN_API="$URL" KILN_KEY="$KA" timeout -k 5 900 node "$ROOT/tests/mcp/client.mjs"
summary=$(grep '^mcp_test: ' "$T_TMP/mcp.out" | tail -n 1)
# client.mjs prints exactly 55 checks on every run (one fewer means one died unseen).
check "the MCP client test ran to its end: ${summary:-no summary} (exit ${C_RC:-?}, $C_N checks of 55)" \
	[ -n "$summary" -a "$C_N" = 55 -a "${C_RC:-1}" = "$(grep -q '^FAIL ' "$T_TMP/mcp.out" && echo 1 || echo 0)" ]

SBX=$(sed -n 's/^SANDBOX \(s_[^ ]*\)$/\1/p' "$T_TMP/mcp.out" | head -n 1)
if [ -n "$SBX" ]; then
	st=$(curl -s -m 30 -o "$T_TMP/sess.json" -w '%{http_code}' -H "Authorization: Bearer $KA" "$URL/v1/sessions/$SBX")
	check "its sandbox $SBX is destroyed in kiln's own API (HTTP $st, $(jq -r .state "$T_TMP/sess.json" 2> /dev/null))" \
		[ "$st" = 200 -a "$(jq -r .state "$T_TMP/sess.json")" = destroyed ]
else
	not_ok "the sandbox id is in the client's output" "$(head -n 3 "$T_TMP/mcp.out")"
fi
st=$(curl -s -m 30 -o "$T_TMP/usage.json" -w '%{http_code}' -H "Authorization: Bearer $KA" "$URL/v1/usage")
check "acme holds nothing: usage running 0, sessions 0, paused 0 ($(jq -c .usage "$T_TMP/usage.json" 2> /dev/null))" \
	[ "$st" = 200 -a "$(jq -r '.usage.running + .usage.sessions + .usage.paused_sessions' "$T_TMP/usage.json")" = 0 ]
for _ in $(seq 50); do [ "$(vcpus_used)" = 0 ] && break; sleep 0.2; done
check "the host holds no vCPU ($(vcpus_used))" [ "$(vcpus_used)" = 0 ]
check "no kiln mcp process is left" [ "$(pgrep -c -x -f "$ROOT/build/kiln mcp" || true)" = "$before_mcp" ]

e2b_stack_stop
check "nothing left: no QEMU ($(count_qemu)), VM directories ($(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)), mounts ($(count_mounts) = $before_mounts), cgroups ($(count_cgroups) = $before_cg)" \
	[ "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)" = 0 \
	-a "$(count_mounts)" = "$before_mounts" -a "$(count_cgroups)" = "$before_cg" ]
t_done
