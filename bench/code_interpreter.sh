#!/usr/bin/env bash
# kiln's code interpreter (figures, not pass/fail) through E2B's unmodified
# Code Interpreter SDK (@e2b/code-interpreter 2.8.0) against one `kiln up`
# stack: Sandbox.create() -> first runCode('1+1'), warm runCode('x+1'), a
# matplotlib plot to PNG. bench/code_interpreter.mjs does the measuring; then
# the same three through kiln's native API (bench/code_native.py).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-20}
[ -r build/image/rootfs-code-interpreter.ext4 ] ||
	{ echo "code-interpreter: not measured: build/image/rootfs-code-interpreter.ext4 is missing (make image)"; exit 0; }
if ! SDK=$(scripts/e2b-ci-sdk.sh 2> /tmp/kiln-bench-ci-sdk.err); then
	echo "code-interpreter: not measured: the SDK could not be installed: $(tail -n 1 /tmp/kiln-bench-ci-sdk.err)"
	exit 0
fi
. bench/up.sh
bench_up code-interpreter || exit 0
(
	set -a
	. "$TMP/up/credentials"
	set +a
	KILN_E2B_CI_SDK=$SDK node bench/code_interpreter.mjs "$RUNS"
	bench/code_native.py "$RUNS"
)
