#!/usr/bin/env bash
# kiln's code interpreter the way an E2B user reaches it: `kiln up` (local
# S3, kiln-api with its sandbox domain, one kiln-host with the built-in
# `code-interpreter` template), then E2B's own Code Interpreter SDK
# (@e2b/code-interpreter 2.8.0 with e2b 2.51.0, unmodified) running
# tests/e2b-ci/ci_test.mjs with nothing but what DIR/credentials holds: the
# SDK's default template code-interpreter-v1, state across cells, streamed
# output, errors, DataFrames, matplotlib PNGs and charts, display(),
# contexts, bash, env vars, timeouts, restart, reconnect, hostile cells, a
# killed sandbox (each of its checks is one result). Then nothing of the
# stack is left after kiln up stops.
. "$(dirname "$0")/lib.sh"
require_image
CI=$ROOT/build/image/rootfs-code-interpreter.ext4
[ -r "$CI" ] || { echo "1..0 # SKIP the code-interpreter image is missing ($CI): run make image"; exit 0; }
t_require_tools swift-proxy-server memcached jq node
t_require_built kiln kiln-api kiln-host
SDK=$("$ROOT/scripts/e2b-ci-sdk.sh" 2> "$T_TMP/sdk.err") || t_skip_all "the Code Interpreter SDK could not be installed: $(tail -n 1 "$T_TMP/sdk.err")"
before_procs=$(up_procs)
kiln_up

# ---- the SDK: only the credentials file's variables reach node ----
client_results ci "$T_TMP/ci.out" env -i PATH=/usr/bin:/bin HOME="$T_TMP" "${up_creds[@]}" KILN_E2B_CI_SDK="$SDK" \
	timeout -k 5 1500 node --no-warnings "$ROOT/tests/e2b-ci/ci_test.mjs"
summary=$(grep '^ci_test: ' "$T_TMP/ci.out" | tail -n 1)
check "the SDK's code interpreter test ran to its end: ${summary:-no summary} ($C_N checks)" \
	[ -n "$summary" -a "${C_RC:-1}" = 0 ]

kill -TERM "$up_pid"
wait "$up_pid"
up_pid=
for _ in $(seq 100); do [ "$(up_procs)" = "$before_procs" ] && break; sleep 0.1; done
t_nothing_left "kiln up stopped: no process of the stack left ($(up_procs)), nor QEMU, files, cgroups, mounts" \
	[ "$(up_procs)" = "$before_procs" ]
t_done
