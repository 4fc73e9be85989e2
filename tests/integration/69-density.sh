#!/usr/bin/env bash
# Many idle sessions on one kiln-host (DENSITY_N, default 50, of template
# default): all start side by side, kiln-host stops every idle one's vCPUs
# (/metrics counts them), stopped they use no measurable host CPU, each still
# answers an exec after the others started (its own output, in its own VM,
# with its clock right again), and destroying them releases everything: no QEMU, no VM
# directories, cgroups or mounts, capacity back to zero (slot locks are
# host-wide: other worktrees' VMs take them too). The
# figures (memory and CPU per sandbox, exec latency by N): bench/density.sh.
. "$(dirname "$0")/lib.sh"
t_plan 16
require_image
t_require_tools jq curl
N=${DENSITY_N:-50}
TOKEN=density-$RANDOM$RANDOM
PORT=$((20000 + RANDOM % 10000))
host_pid=
before_cg=$(count_cgroups)

host_config "$T_TMP/h.json" "127.0.0.1:$PORT" density \
	'.run_dir += "/h" | .capacity = {vcpus: 1024, cpu_overcommit: 1, memory_mib: 1048576}'
host_start "$T_TMP/h.json" h
t_serving "http://127.0.0.1:$PORT/healthz" "$host_pid" 600 || t_bail "kiln-host starts" "$(tail -3 "$T_TMP/h.err")"
h() { # METHOD PATH [curl args]: status echoed, body in $T_TMP/last (or -o)
	local m=$1 p=$2; shift 2
	curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" \
		-H 'Content-Type: application/json' "$@" "http://127.0.0.1:$PORT$p"
}
capacity() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/v1/capacity"; }

# Two creates at a time (2 cores).
create() { # I
	curl -s -m 300 -o "$T_TMP/c$1" -w '%{http_code}' -X POST -H "Authorization: Bearer $TOKEN" \
		-H 'Content-Type: application/json' --data-binary "{\"id\":\"d$1\",\"customer\":\"acme\",\"spec\":{}}" \
		"http://127.0.0.1:$PORT/v1/sessions" > "$T_TMP/c$1.st"
}
t=$(date +%s)
for i in $(seq 1 2 "$N"); do
	t_bg create "$i"
	c=$T_BG_PID
	[ $((i + 1)) -le "$N" ] && create $((i + 1))
	wait "$c"
done
created=0
for i in $(seq "$N"); do [ "$(cat "$T_TMP/c$i.st")" = 201 ] && created=$((created + 1)); done
if [ "$created" = "$N" ] && [ "$(count_qemu)" = "$N" ]; then
	ok "$N sessions start side by side, one QEMU each ($(($(date +%s) - t)) s)"
else
	not_ok "$N sessions start" "created $created, QEMUs $(count_qemu)" "$(head -c 300 "$T_TMP/c1") $(tail -3 "$T_TMP/h.err")"
fi
check "the host counts them: $N vCPUs, $((N * 256)) MiB" \
	test "$(capacity | jq -c '[.vcpus.used + .vcpus.idle, .memory_mib.used]')" = "[$N,$((N * 256))]"

# Idle: kiln-host stops each idle session's vCPUs (sessions.idle_stop_ms,
# default 1.5 s); /metrics counts them.
metric() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
for _ in $(seq 300); do [ "$(metric 'kiln_host_sessions{vcpus="stopped"}')" = "$N" ] && break; sleep 0.2; done
check "all $N idle sessions are stopped ($(metric 'kiln_host_sessions{vcpus="stopped"}') in /metrics)" \
	test "$(metric 'kiln_host_sessions{vcpus="stopped"}')" = "$N"
h GET /v1/sessions/d1 > /dev/null
check "GET shows a stopped session as idle_stopped" test "$(jq -r .idle_stopped "$T_TMP/last")" = true

# Stopped, they cost no CPU: every QEMU's utime+stime over 10 s, summed. An
# idle running 1-vCPU TCG guest costs ~1.2% of a core (50: ~60%); the bound
# is 2% of one core for all 50 together (clock ticks are 10 ms: 10 s at 2% is
# 20 ticks; over 5 s, one stray burst of 2 ticks once made 2.2%).
qemu_pids() { pgrep -f "qemu-system-x86_64.*$KILN_RUN_DIR"; }
ticks() { local s=0 p; for p in $(qemu_pids); do s=$((s + $(awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$p/stat" 2> /dev/null || echo 0))); done; echo "$s"; }
# Measured over the same $N QEMUs at both ends (no QEMU found sums to 0 %).
q0=$(qemu_pids | sort | paste -sd' '); a=$(ticks); sleep 10; b=$(ticks); q1=$(qemu_pids | sort | paste -sd' ')
nq=$(echo "$q0" | wc -w)
hz=$(getconf CLK_TCK)
pct=$(awk -v d=$((b - a)) -v hz="$hz" 'BEGIN { printf("%.2f", d / hz / 10 * 100) }')
check "$N stopped sessions use no measurable CPU: $pct% of one core in all, $nq QEMUs measured (bound 2%)" \
	eval '[ "$nq" = "$N" ] && [ "$q0" = "$q1" ] && awk -v p="$pct" "BEGIN { exit !(p < 2) }"'

# Each answers, in its own VM, continued first: its id back from a file
# written by an exec, and its clock (stopped with the vCPUs) set right again.
bad= skew=
for i in $(seq "$N"); do
	h POST "/v1/sessions/d$i/exec" --data-binary "{\"argv\":[\"sh\",\"-c\",\"echo d$i > /tmp/me; cat /tmp/me; date +%s\"]}" > "$T_TMP/x.st"
	now=$(date +%s)
	[ "$(cat "$T_TMP/x.st")" = 200 ] && [ "$(jq -r .stdout "$T_TMP/last" | head -1)" = "d$i" ] || bad="$bad d$i"
	g=$(jq -r .stdout "$T_TMP/last" | sed -n 2p)
	[ -n "$g" ] && [ $((now - g)) -le 2 ] && [ $((g - now)) -le 2 ] || skew="$skew d$i:${g:-none}/$now"
done
check "each of the $N answers an exec with its own output${bad:+ (not:$bad)}" test -z "$bad"
check "each one's clock is within 2 s of the host's after being stopped${skew:+ (not:$skew)}" test -z "$skew"
check "/metrics counts the wakes (>= $N)" test "$(metric 'kiln_host_session_wakes_total{result="ok"}')" -ge "$N"
h POST /v1/sessions/d1/exec --data-binary '{"argv":["cat","/tmp/me"]}' > /dev/null
check "state stays per session (d1 still reads its own file)" test "$(jq -r .stdout "$T_TMP/last")" = d1

# A background process keeps its session running: never stopped while it
# lives (its counter goes on), stopped again once it is gone.
loop='i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.5; done'
jq -n --arg l "$loop" '{argv: ["sh", "-c", ("echo \u0027" + $l + "\u0027 > /tmp/loop.sh; sh /tmp/loop.sh > /dev/null 2>&1 & echo $! > /tmp/loop.pid")]}' > "$T_TMP/bg.json"
h POST /v1/sessions/d2/exec --data-binary @"$T_TMP/bg.json" > /dev/null
sleep 6
h GET /v1/sessions/d2 > /dev/null
st=$(jq -r .idle_stopped "$T_TMP/last")
h POST /v1/sessions/d2/exec --data-binary '{"argv":["cat","/tmp/counter"]}' > /dev/null
c1=$(jq -r .stdout "$T_TMP/last")
check "a session with a background process is not stopped (idle_stopped $st, counter at $c1 after 6 s)" \
	test "$st" = false -a "${c1:-0}" -ge 8
sleep 3
h POST /v1/sessions/d2/exec --data-binary '{"argv":["cat","/tmp/counter"]}' > /dev/null
c2=$(jq -r .stdout "$T_TMP/last")
check "its background process kept counting ($c1 -> $c2 over 3 s)" test "${c2:-0}" -ge $((c1 + 4))
h POST /v1/sessions/d2/exec --data-binary '{"argv":["sh","-c","kill $(cat /tmp/loop.pid)"]}' > /dev/null
for _ in $(seq 100); do h GET /v1/sessions/d2 > /dev/null; [ "$(jq -r .idle_stopped "$T_TMP/last")" = true ] && break; sleep 0.2; done
check "once it is gone, the session is stopped again" test "$(jq -r .idle_stopped "$T_TMP/last")" = true

bad=
for i in $(seq "$N"); do [ "$(h DELETE "/v1/sessions/d$i")" = 200 ] || bad="$bad d$i"; done
check "DELETE destroys each${bad:+ (not:$bad)}" test -z "$bad"
for _ in $(seq 50); do [ "$(count_qemu)" = 0 ] && break; sleep 0.1; done
check "destroyed: no QEMU, cgroups, mounts; capacity back to zero" \
	test "$(count_qemu)" = 0 -a "$(count_cgroups)" = "$before_cg" -a "$(count_mounts)" = 0 -a "$(capacity | jq -c '[.vcpus.used + .vcpus.idle, .memory_mib.used]')" = "[0,0]"
check "no session directories left in the spool" test "$(find "$T_TMP/spool-density/sessions" -mindepth 1 2> /dev/null | wc -l)" = 0
t_stop "$host_pid"; host_pid=
check "kiln-host stopped cleanly; nothing left in its run directory" \
	test "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)" = 0
t_done
