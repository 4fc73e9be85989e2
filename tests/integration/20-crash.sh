#!/usr/bin/env bash
# SIGKILL of `kiln-host run` mid-task: QEMU dies with it, and the next start
# reaps what was left (run directory, overlay); counts before and after match.
. "$(dirname "$0")/lib.sh"
t_plan 6
require_image

count_tmp() { find /var/tmp /tmp -maxdepth 1 -name 'vl.*' 2>/dev/null | wc -l; }
before_qemu=$(count_qemu); before_entries=$(count_run_entries); before_tmp=$(count_tmp)

printf '%s' "$(sh_spec 'echo started; sleep 600' '{"limits":{"timeout_s":600}}')" > "$T_TMP/long.spec"
started() { grep -q '"data":"started' "$T_TMP/$1" 2> /dev/null; }
t_bg "$KILN_HOST" run --spec "$T_TMP/long.spec" --stream > "$T_TMP/long.out" 2>&1
host_pid=$T_BG_PID
# Wait (bounded) until the task is really running inside its VM.
if t_until 30 started long.out; then ok "long task started"; else not_ok "long task started" "$(cat "$T_TMP/long.out")"; fi
running=$(count_qemu)
t_stop "$host_pid" KILL
# QEMU dies with its owner (PR_SET_PDEATHSIG); wait for that, bounded.
qemu_back() { [ "$(count_qemu)" = "$before_qemu" ]; }
if [ "$running" -gt "$before_qemu" ] && t_until 10 qemu_back; then
	ok "QEMU exits when kiln-host is SIGKILLed"
else not_ok "QEMU exits with kiln-host" "running=$running now=$(count_qemu) before=$before_qemu"; fi
if [ "$(count_run_entries)" -gt "$before_entries" ]; then ok "the killed run left its VM directory (to be reaped)"
else not_ok "left a VM directory" "entries=$(count_run_entries)"; fi

# The next run reaps it before starting its own VM.
run_spec next "$(py_spec 'print(1)')"
if [ "$(r next .state)" = succeeded ] && [ "$(count_run_entries)" = "$before_entries" ] && [ "$(count_qemu)" = "$before_qemu" ] \
   && [ "$(count_tmp)" = "$before_tmp" ]; then
	ok "the next run reaps the leftovers: QEMU processes, run entries and temp overlays back to their counts"
else not_ok "reaped by the next run" "entries=$(count_run_entries) qemu=$(count_qemu) tmp=$(count_tmp)" "$(show next)"; fi

# A stale directory whose QEMU is still alive (owner gone) is killed by `kiln-host reap`.
t_bg "$KILN_HOST" run --spec "$T_TMP/long.spec" --stream > "$T_TMP/long2.out" 2>&1
host_pid=$T_BG_PID
t_until 30 started long2.out
qpid=$(pgrep -f "qemu-system-x86_64.*$KILN_RUN_DIR" | head -n1)
t_stop "$host_pid" KILL
"$KILN_HOST" reap --run-dir "$KILN_RUN_DIR" > "$T_TMP/reap.out"
# alive = exists and is not a zombie waiting for its (new) parent to reap it
alive() { ps -o stat= -p "$1" 2>/dev/null | grep -qv Z; }
gone() { ! alive "$1"; }
if [ -n "$qpid" ] && t_until 5 gone "$qpid" && [ "$(count_run_entries)" = "$before_entries" ]; then
	ok "kiln-host reap removes what a killed host left: $(cat "$T_TMP/reap.out")"
else not_ok "kiln-host reap" "qpid=$qpid entries=$(count_run_entries)"; fi

# SIGTERM (and Ctrl-C) end a run cleanly: VM destroyed, directory removed, an "interrupted" result.
t_bg "$KILN_HOST" run --spec "$T_TMP/long.spec" --stream > "$T_TMP/term.out" 2>&1
host_pid=$T_BG_PID
t_until 30 started term.out
kill -TERM "$host_pid"; wait "$host_pid"; st=$?
t_stop "$host_pid"
if [ "$st" = 3 ] && grep -q '"code":"interrupted"' "$T_TMP/term.out" && [ "$(count_qemu)" = "$before_qemu" ] \
   && [ "$(count_run_entries)" = "$before_entries" ]; then
	ok "SIGTERM ends a run at once with an interrupted result, leaving no QEMU and no directory"
else not_ok "SIGTERM cleanup" "status=$st qemu=$(count_qemu) entries=$(count_run_entries)" "$(tail -c 400 "$T_TMP/term.out")"; fi

t_done
