#!/usr/bin/env bash
# kiln-host run: one task per fresh VM, results, limits, isolation, cleanup.
# KILN_IT_MODE=cold (default) boots every VM; =restore clones a snapshot
# (11-run-restore.sh runs this whole file that way).
. "$(dirname "$0")/lib.sh"
t_plan 16
require_image
MODE=${KILN_IT_MODE:-cold}
if [ "$MODE" = restore ]; then
	"$KILN_HOST" snapshot create > /dev/null 2> "$T_TMP/snapshot.err" ||
		t_bail "kiln-host snapshot create (the restore mode's snapshot)" "$(tail -3 "$T_TMP/snapshot.err")"
	RUN_MODE_ARGS=()
else
	RUN_MODE_ARGS=(--cold)
fi

t_mark

# hello world
run_spec hello "$(py_spec 'print("hello, kiln")')"
if [ "$(r hello .state)" = succeeded ] && [ "$(r hello .stdout)" = "hello, kiln" ] && [ "$(r hello .exit_code)" = 0 ] \
   && [ "$(rc hello)" = 0 ] && [ "$(r hello .timings.start)" = "$MODE" ]; then ok "hello world succeeds with its stdout ($MODE)"
else not_ok "hello world ($MODE)" "$(show hello)"; fi

# the guest runs its own kernel
host_rel=$(uname -r)
run_spec uname "$(sh_spec 'uname -r')"
guest_rel=$(r uname .stdout)
if [ -n "$guest_rel" ] && [ "$guest_rel" != "$host_rel" ] && [ "$(r uname .guest_kernel)" = "$guest_rel" ]; then
	ok "guest kernel ($guest_rel) differs from the host's ($host_rel)"
else not_ok "guest kernel differs" "$(show uname)"; fi

# exit codes, and the unprivileged task user
run_spec exit3 "$(sh_spec 'echo out; echo err >&2; id -u; exit 3')"
if [ "$(r exit3 .state)" = failed ] && [ "$(r exit3 .exit_code)" = 3 ] && [ "$(r exit3 .end_reason)" = exited ] \
   && [ "$(r exit3 .stderr)" = err ] && [ "$(r exit3 '.stdout')" = "$(printf 'out\n1000')" ] && [ "$(rc exit3)" = 1 ]; then
	ok "exit code 3 is reported as failed/exited, stdout and stderr apart, task uid 1000"
else not_ok "exit code 3" "$(show exit3)"; fi

run_spec sig "$(sh_spec 'kill -SEGV $$')"
if [ "$(r sig .state)" = failed ] && [ "$(r sig .signal)" = SIGSEGV ] && [ "$(r sig .exit_code)" = null ]; then
	ok "death by signal is reported with the signal name"
else not_ok "death by signal" "$(show sig)"; fi

# task processes can never gain privileges (set-uid binaries are inert)
run_spec nnp "$(py_spec 'print([l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs")][0])')"
if [ "$(r nnp .stdout)" = 1 ]; then ok "task processes run with no_new_privs"
else not_ok "no_new_privs" "$(show nnp)"; fi

# programs that read stdin see EOF, not a hang
run_spec stdin "$(py_spec 'import sys; print(repr(sys.stdin.read()))' '{"limits":{"timeout_s":20}}')"
if [ "$(r stdin .state)" = succeeded ] && [ "$(r stdin .stdout)" = "''" ]; then ok "stdin is empty (EOF), no hang"
else not_ok "stdin is empty" "$(show stdin)"; fi

# argv form, env and cwd, input files (binary content intact)
head -c 3000 /dev/urandom > "$T_TMP/blob"
blob_sha=$(sha256sum "$T_TMP/blob" | cut -d' ' -f1)
spec=$(jq -cn --arg b64 "$(base64 -w0 "$T_TMP/blob")" '{argv:["sh","-c","pwd; echo \"$GREETING\"; sha256sum /data/in/blob.bin | cut -d\" \" -f1"],
  env:{GREETING:"hi there"}, cwd:"/data", files:[{path:"/data/in/blob.bin", content_b64:$b64}]}')
run_spec argv "$spec"
if [ "$(r argv .stdout)" = "$(printf '/data\nhi there\n%s' "$blob_sha")" ]; then ok "argv form with env, cwd and a binary input file"
else not_ok "argv/env/cwd/files" "$(show argv)"; fi

# a 50 MiB output file arrives intact, also in --output-dir
code='import hashlib, os, random
os.makedirs("/output/sub", exist_ok=True)
r = random.Random(42); h = hashlib.sha256()
with open("/output/sub/big.bin", "wb") as f:
    for _ in range(50):
        b = r.randbytes(1 << 20); h.update(b); f.write(b)
open("/output/small.txt", "w").write("small\n")
print(h.hexdigest())'
run_spec big "$(py_spec "$code" '{"limits":{"timeout_s":120,"output_mib":64,"memory_mib":256}}')" --output-dir "$T_TMP/big-out"
want=$(r big .stdout)
got=$(r big '.outputs[] | select(.path=="sub/big.bin") | .sha256')
size=$(r big '.outputs[] | select(.path=="sub/big.bin") | .size')
disk=$(sha256sum "$T_TMP/big-out/sub/big.bin" 2>/dev/null | cut -d' ' -f1)
if [ -n "$want" ] && [ "$want" = "$got" ] && [ "$want" = "$disk" ] && [ "$size" = 52428800 ] \
   && [ "$(cat "$T_TMP/big-out/small.txt" 2>/dev/null)" = small ]; then
	ok "a 50 MiB output file arrives intact (sha256 in the guest = result = file on disk)"
else not_ok "50 MiB output" "guest=$want result=$got disk=$disk size=$size" "$(show big)"; fi

# a stdout flood is capped and marked truncated
run_spec flood "$(sh_spec 'yes kiln-flood' '{"limits":{"output_mib":1,"timeout_s":60}}')"
len=$(jq -r '.stdout | length' "$T_TMP/flood.json" 2>/dev/null)
if [ "$(r flood .end_reason)" = output_limit ] && [ "$(r flood .stdout_truncated)" = true ] && [ "$(r flood .state)" = failed ] \
   && [ -n "$len" ] && [ "$len" -le 1048576 ] && [ "$len" -gt 1000000 ]; then
	ok "a stdout flood ends with output_limit, capped at 1 MiB ($len chars) and marked truncated"
else not_ok "stdout flood" "len=$len" "$(show flood)"; fi

# a timeout ends the VM in time (bound is for correctness, not speed: boot + 2 s + grace)
start=$(date +%s%N)
run_spec sleep "$(sh_spec 'echo started; sleep 300' '{"limits":{"timeout_s":2}}')"
elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
if [ "$(r sleep .state)" = timed_out ] && [ "$(r sleep .end_reason)" = timeout ] && [ "$(r sleep .signal)" = SIGKILL ] \
   && [ "$(r sleep .stdout)" = started ] && [ "$elapsed" -lt 30000 ]; then
	ok "a 2 s timeout ends the task as timed_out, keeping its output (${elapsed} ms in all)"
else not_ok "timeout" "elapsed=${elapsed}ms" "$(show sleep)"; fi

# a memory hog ends as oom (or failed), never hangs
code='chunks = []
while True:
    chunks.append(bytearray(16 << 20))'
run_spec hog "$(py_spec "$code" '{"limits":{"memory_mib":128,"timeout_s":60}}')"
st=$(r hog .state); er=$(r hog .end_reason)
if [ "$st" = failed ] && { [ "$er" = oom ] || [ "$er" = exited ]; }; then ok "a memory hog ends as $st/$er"
else not_ok "memory hog" "$(show hog)"; fi

# a file planted on the host is invisible in the guest
secret=/tmp/kiln-secret-$$-$RANDOM
echo "host secret" > "$secret"
run_spec secret "$(py_spec "import os; print(os.path.exists('$secret'), os.path.exists('$T_TMP'))")"
rm -f "$secret"
if [ "$(r secret .stdout)" = "False False" ]; then ok "files planted on the host are not visible in the guest"
else not_ok "host files invisible" "$(show secret)"; fi

# /output symlinks pointing outside are not followed
code='import os
os.symlink("/etc/passwd", "/output/passwd-link")
os.symlink("/etc", "/output/etc-link")
os.mkdir("/output/d"); os.symlink("../../etc/shadow", "/output/d/up")
open("/output/d/real.txt", "w").write("real\n")
print("ok")'
run_spec links "$(py_spec "$code")" --output-dir "$T_TMP/links-out"
paths=$(jq -r '[.outputs[].path] | sort | join(",")' "$T_TMP/links.json" 2>/dev/null)
if [ "$paths" = "d/real.txt" ] && [ ! -e "$T_TMP/links-out/passwd-link" ] && [ ! -e "$T_TMP/links-out/etc-link" ] \
   && [ ! -e "$T_TMP/links-out/d/up" ] && [ "$(find "$T_TMP/links-out" -type l | wc -l)" = 0 ]; then
	ok "symlinks in /output are skipped, never followed"
else not_ok "/output symlinks" "paths=$paths" "$(show links)"; fi

# invalid specs: a clear error naming the field, non-zero exit
run_spec bad '{"language":"python","code":"print(1)","limits":{"memory_mib":"lots"}}'
if [ "$(rc bad)" = 2 ] && [ "$(r bad .state)" = error ] && [ "$(r bad .error.code)" = invalid_spec ] \
   && grep -q 'limits.memory_mib' "$T_TMP/bad.err"; then ok "an invalid spec exits 2 naming limits.memory_mib"
else not_ok "invalid spec" "$(show bad)"; fi

# --stream: stdout/stderr events as they come, then the result line
run_spec stream "$(py_spec 'import sys; print("one"); print("two", file=sys.stderr)')" --stream
if [ "$(jq -rs 'map(select(.stream=="stdout")) | map(.data) | join("")' "$T_TMP/stream.json")" = one ] \
   && [ "$(jq -rs 'last | .state' "$T_TMP/stream.json")" = succeeded ]; then ok "--stream prints output events, then the result"
else not_ok "--stream" "$(show stream)"; fi

# nothing left behind by any of the runs above
no_entries() { [ "$(count_run_entries)" = 0 ]; }
t_nothing_left "no QEMU process, run-directory entry, cgroup, mount or slot lock outlives its task" no_entries

t_done
