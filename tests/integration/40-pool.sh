#!/usr/bin/env bash
# Warm pool (kiln-host serve --pool N): tasks start from paused, pre-restored
# VMs, a pool VM serves one task only, pool VMs are destroyed on shutdown and
# reaped after a SIGKILL.
. "$(dirname "$0")/lib.sh"
t_plan 19
require_image

PORT=$((20000 + RANDOM % 12000))
URL=http://127.0.0.1:$PORT
TOKEN=pool-test-$RANDOM
AUTH=(-H "Authorization: Bearer $TOKEN")
serve_pid=
start_serve() {
	t_bg "$KILN_HOST" serve --token "$TOKEN" --spool-dir "$T_TMP/spool" --listen 127.0.0.1:$PORT --pool 2 "$@" \
		> "$T_TMP/serve.out" 2> "$T_TMP/serve.err"
	serve_pid=$T_BG_PID
}
# wait_ready N: until health says N pool VMs are ready (bounded: snapshot creation may take a while)
pool_is() { [ "$(curl -s --max-time 2 "${AUTH[@]}" "$URL/v1/capacity" | jq -r .pool.ready 2>/dev/null)" = "$1" ]; }
wait_ready() { t_until 120 pool_is "$1"; }
post() { curl -s --max-time 120 "${AUTH[@]}" -X POST --data-binary @- "$URL/v1/run" > "$T_TMP/$1.json"; }
stop_serve() { t_stop "$serve_pid"; serve_pid=; }

start_serve
if wait_ready 2; then ok "serve starts with 2 warm pool VMs"; else not_ok "pool fills" "$(tail -5 "$T_TMP/serve.err")"; fi
check "the pool's VMs are running QEMU processes" [ "$(count_qemu)" -ge 2 ]

code='import os
print(os.path.exists("/tmp/kiln-pool-mark"))
open("/tmp/kiln-pool-mark", "w").write("x")'
py_spec "$code" | post p1
wait_ready 2 || true
py_spec "$code" | post p2
if [ "$(r p1 .timings.start)" = pool ] && [ "$(r p2 .timings.start)" = pool ] && [ "$(r p1 .stdout)" = False ] \
   && [ "$(r p2 .stdout)" = False ]; then
	ok "tasks start from pool VMs, and a pool VM is never reused (second task sees a clean VM)"
else not_ok "pool hand-out" "$(head -c 600 "$T_TMP/p1.json")" "$(head -c 600 "$T_TMP/p2.json")"; fi

# The warm-up ran a sample through the interpreter's task path: nothing of it
# may reach the task (its output, its file, anything in /output).
wait_ready 2 || true
py_spec 'import os, sys
print(os.path.exists("/tmp/.kiln-warm"), os.listdir("/output"), sys.argv)' | post p3
if [ "$(r p3 .timings.start)|$(r p3 .stdout)|$(r p3 .stderr)" = "pool|False [] ['/kiln/code/main.py']|" ]; then
	ok "a pool task sees nothing of the warm-up (no output, no file, empty /output, its own argv)"
else not_ok "warm-up invisible to the task" "$(head -c 600 "$T_TMP/p3.json")"; fi

# The warm-up's fork left the interpreter's pages write-protected (copy on
# write): the interpreter takes them back after it (MADV_POPULATE_WRITE), so
# a task writing all over its heap (gc.collect() writes into every tracked
# object) takes no page fault per page. Without that, this is thousands.
wait_ready 2 || true
py_spec 'import gc, resource
a = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
gc.collect()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - a)' | post p4
faults=$(r p4 .stdout)
if [ "$(r p4 .timings.start)" = pool ] && [ -n "$faults" ] && [ "$faults" -lt 200 ]; then
	ok "a pool task writes over its interpreter's heap without a fault per page ($faults faults in gc.collect())"
else not_ok "the warm-up's fork left the heap copy-on-write ($faults faults)" "$(head -c 600 "$T_TMP/p4.json")"; fi

# The guest's clock: under TCG the kernel calibrates its TSC against the
# emulated PIT, which fails on a loaded host and leaves the snapshot (and
# every clone of it) on refined-jiffies, a 10 ms clock. kiln-host hands the
# host's TSC rate over (tsc_early_khz=), so it is the TSC whatever the load.
wait_ready 2 || true
py_spec 'print(open("/sys/devices/system/clocksource/clocksource0/current_clocksource").read().strip(),
      "tsc_early_khz=" in open("/proc/cmdline").read())' | post cs
case "$(r cs .stdout)" in
"tsc True" | kvm-clock*) ok "the guest keeps a precise clock: $(r cs .stdout)" ;;
*) not_ok "the guest's clock source" "$(head -c 600 "$T_TMP/cs.json")" ;;
esac

# The interpreter says it is done before the kernel tears it down
# (guest/zygote.c): its word must carry the exit status, the usage and every
# byte of output, and only the task's own interpreter may give it.
wait_ready 2 || true
py_spec 'import sys
sys.stdout.write("x" * 200000)
sys.stderr.write("e" * 1000)
sys.exit(3)' | post d1
if [ "$(r d1 .timings.start)|$(r d1 .exit_code)|$(r d1 .end_reason)|$(r d1 .stdout_bytes)|$(r d1 .stderr_bytes)" = "pool|3|exited|200000|1000" ] \
   && [ "$(r d1 .usage.max_rss_kib)" -gt 10000 ] && [ "$(r d1 .usage.user_ms)" -gt 0 ]; then
	ok "a pre-started interpreter's end carries its exit status, its usage and all its output"
else not_ok "the interpreter's word of its end" "$(head -c 600 "$T_TMP/d1.json")"; fi
# A forked child that runs to the script's end goes through the same exit
# path: it must not end the task for its parent.
wait_ready 2 || true
py_spec 'import os, time
if os.fork() == 0:
    print("child", flush=True)
else:
    os.wait()
    time.sleep(0.3)
    print("parent")' | post d2
if [ "$(r d2 .timings.start)|$(r d2 .exit_code)|$(r d2 .stdout)" = "pool|0|child
parent" ]; then
	ok "a forked child reaching the script's end does not end the task before its parent"
else not_ok "a forked child ended the task" "$(head -c 600 "$T_TMP/d2.json")"; fi
# The task's code can write to that pipe: a line that does not parse changes
# nothing (the task ends when it exits); a valid one only ends the task, as
# exiting with that status would, and whatever it started dies with it.
wait_ready 2 || true
py_spec 'import os
os.write(4, b"X 9 1 1")
print("after junk")
raise SystemExit(5)' | post d3
if [ "$(r d3 .timings.start)|$(r d3 .exit_code)|$(r d3 .stdout)" = "pool|5|after junk" ]; then
	ok "junk on the interpreter's status pipe is ignored: the task's real exit counts"
else not_ok "junk on the status pipe" "$(head -c 600 "$T_TMP/d3.json")"; fi
wait_ready 2 || true
py_spec 'import os, subprocess, time
subprocess.Popen(["sleep", "30"])
os.write(4, b"X 7 1 1 1\n")
time.sleep(5)
print("still running")' | post d4
if [ "$(r d4 .timings.start)|$(r d4 .exit_code)|$(r d4 .stdout)" = "pool|7|" ] && [ "$(r d4 .timings.run_ms)" -lt 4000 ]; then
	ok "a forged last word only ends the task with that status (run_ms $(r d4 .timings.run_ms))"
else not_ok "a forged last word" "$(head -c 600 "$T_TMP/d4.json")"; fi

# Priorities: the pool refills at nice 19 (its QEMUs inherit that), a VM
# handed out to a task goes back to 0, every one of its threads.
qemu_nices() { # one line per QEMU of this test: the distinct nice values of its threads, then its cgroup's cpu.shares
	for p in $(pgrep -f "qemu-system-x86_64.*$KILN_RUN_DIR"); do
		awk '{print $19}' /proc/"$p"/task/*/stat 2>/dev/null | sort -u | tr '\n' ' '
		cg=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' /proc/"$p"/cgroup 2>/dev/null)
		cat "/sys/fs/cgroup/cpu$cg/cpu.shares" 2>/dev/null || echo none
	done
}
wait_ready 2 || true
py_spec 'import time; time.sleep(4)' | post slow &
slow_pid=$!
sleep 2
nices=$(qemu_nices | sort | uniq -c | awk '{$1=$1; print}' | tr '\n' ';')
wait "$slow_pid"
# Each QEMU is in a cgroup of its own (the jail), where only the cgroup's
# weight counts against another VM: pool VMs get nice 19's (15), the task's
# the default 1024.
if [ "$(r slow .timings.start)" = pool ] && [[ "$nices" =~ ^"1 0 1024;"([0-9]+" 19 15;")?$ ]]; then
	ok "the task's QEMU runs at nice 0 (all threads) and CPU weight 1024, pool and pre-started QEMUs at 19 and 15 ($nices)"
else not_ok "priorities" "nices: $nices" "$(head -c 300 "$T_TMP/slow.json")"; fi

# Concurrent tasks: more than the pool holds; all succeed, each in its own VM.
pids=()
for i in 1 2 3 4; do py_spec "print($i)" | post "conc$i" & pids+=($!); done
wait "${pids[@]}"   # not a bare wait: the server is a background job too
conc_ok=0
for i in 1 2 3 4; do [ "$(r "conc$i" .state)" = succeeded ] && [ "$(r "conc$i" .stdout)" = "$i" ] && conc_ok=$((conc_ok + 1)); done
check "4 concurrent tasks on a pool of 2 all succeed ($conc_ok/4)" [ "$conc_ok" = 4 ]

echo '{"language":"python","code":"print(1)","limits":{"memory_mib":128}}' | post other
if [ "$(r other .state)" = succeeded ] && [ "$(r other .timings.start)" = cold ]; then
	ok "a task whose size matches no snapshot cold-boots"
else not_ok "non-matching size" "$(head -c 600 "$T_TMP/other.json")"; fi

echo '{"language":"cobol"}' | post bad
check "an invalid spec gets a JSON error naming the field" grep -q '"code":"invalid_spec".*language' "$T_TMP/bad.json"

wait_ready 2 || true
stop_serve

# Capacity: pool VMs reserve their memory; a task that does not fit gets 503.
start_serve --pool 1 --prestart 0 --memory-capacity 300
wait_ready 1 || true
code=$(echo '{"language":"python","code":"print(1)","limits":{"memory_mib":128}}' | curl -s -o "$T_TMP/full.json" -w '%{http_code}' --max-time 60 "${AUTH[@]}" -X POST --data-binary @- "$URL/v1/run")
used=$(curl -s --max-time 2 "${AUTH[@]}" "$URL/v1/capacity" | jq -r .memory_mib.used)
py_spec 'print("fits")' | post fits
if [ "$code" = 503 ] && grep -q no_capacity "$T_TMP/full.json" && [ "$used" = 256 ] && [ "$(r fits .stdout)" = fits ] \
   && [ "$(r fits .timings.start)" = pool ]; then
	ok "capacity: with the pool VM holding 256 of 300 MiB, a 128 MiB task gets 503, a 256 MiB task takes the pool VM"
else not_ok "capacity" "code=$code used=$used" "$(cat "$T_TMP/full.json")" "$(head -c 300 "$T_TMP/fits.json")"; fi
stop_serve
if [ "$(count_qemu)" = 0 ] && [ "$(count_run_entries)" = 0 ]; then ok "SIGTERM destroys every pool VM and its directory"
else not_ok "pool destroyed on shutdown" "qemu=$(count_qemu) entries=$(find "$KILN_RUN_DIR" -mindepth 1 | head)"; fi

# Pre-started QEMUs: with no ready VM, a task restores into one of them.
start_serve --pool 0 --prestart 1
for _ in $(seq 300); do [ "$(curl -s --max-time 2 "${AUTH[@]}" "$URL/v1/capacity" | jq -r .pool.prestarted 2>/dev/null)" = 1 ] && break; sleep 0.1; done
pre=$(curl -s --max-time 2 "${AUTH[@]}" "$URL/v1/capacity" | jq -r .pool.prestarted)
py_spec 'print("from a pre-started QEMU")' | post pre
if [ "$pre" = 1 ] && [ "$(r pre .timings.start)" = restore ] && [ "$(r pre .stdout)" = "from a pre-started QEMU" ]; then
	ok "with no ready VM, a task restores into a pre-started QEMU"
else not_ok "pre-started restore" "prestarted=$pre" "$(head -c 600 "$T_TMP/pre.json")"; fi
stop_serve
check "SIGTERM also destroys pre-started QEMUs" [ "$(count_qemu)" = 0 -a "$(count_run_entries)" = 0 ]

start_serve
wait_ready 2 || true
t_stop "$serve_pid" KILL; serve_pid=
no_qemu() { [ "$(count_qemu)" = 0 ]; }
t_until 10 no_qemu
left=$(count_run_entries)
"$KILN_HOST" reap --run-dir "$KILN_RUN_DIR" > /dev/null
if [ "$(count_qemu)" = 0 ] && [ "$left" -gt 0 ] && [ "$(count_run_entries)" = 0 ]; then
	ok "after SIGKILL the pool's QEMUs die with it and their directories are reaped"
else not_ok "pool reaped after SIGKILL" "qemu=$(count_qemu) left=$left now=$(count_run_entries)"; fi

t_done
