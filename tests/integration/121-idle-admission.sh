#!/usr/bin/env bash
# Admission by what sandboxes use (docs/architecture.md, "Idle stop"): a
# kiln-host of 2 active vCPUs (capacity.vcpus 1 x cpu_overcommit 2) admits
# 12 sessions of 1 vCPU created one by one, each once the one before it is
# idle-stopped; every one answers an exec; GET /v1/capacity and /metrics
# count the idle ones apart. With 2 sessions kept busy (a background sleep),
# a new session is 503 no_capacity saying so (after the create's short wait
# for vCPUs to go idle), while waking an idle one still
# works (past the total: the VMs' CPU shares decide). Deleting everything
# brings every count back to 0 and leaves nothing behind.
. "$(dirname "$0")/lib.sh"
t_plan 11
require_image
t_require_tools jq curl
N=12
TOKEN=idle-adm-$RANDOM$RANDOM
PORT=$((20000 + RANDOM % 10000))
host_pid=

host_config "$T_TMP/h.json" "127.0.0.1:$PORT" idleadm \
	'.run_dir += "/h" | .capacity = {vcpus: 1, cpu_overcommit: 2, memory_mib: 8192}'
host_start "$T_TMP/h.json" h
t_serving "http://127.0.0.1:$PORT/healthz" "$host_pid" 600 || t_bail "kiln-host starts" "$(tail -3 "$T_TMP/h.err")"
h() { # METHOD PATH [curl args]: status echoed, body in $T_TMP/last
	local m=$1 p=$2; shift 2
	curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" \
		-H 'Content-Type: application/json' "$@" "http://127.0.0.1:$PORT$p"
}
last() { jq -r "$1" "$T_TMP/last" 2> /dev/null; }
vcpus() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/v1/capacity" | jq -c "[.vcpus.total, .vcpus.used, .vcpus.idle, .vcpus.idle_max]"; }
metric() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
create() { h POST /v1/sessions --data-binary "{\"id\":\"s$1\",\"customer\":\"acme\",\"spec\":{\"limits\":{\"vcpus\":1,\"memory_mib\":256}}}"; }
stopped() { # ID: until GET says idle_stopped (20 s)
	for _ in $(seq 100); do h GET "/v1/sessions/$1" > /dev/null; [ "$(last .idle_stopped)" = true ] && return 0; sleep 0.2; done
	return 1
}
# until_vcpus JSON: until vcpus (total, used, idle, idle_max) is JSON (30 s)
until_vcpus() { for _ in $(seq 150); do [ "$(vcpus)" = "$1" ] && return 0; sleep 0.2; done; return 1; }

# One by one, as a user would: each waits for the previous one to go idle.
admitted=0 bad= t0=$(date +%s)
for i in $(seq "$N"); do
	st=$(create "$i")
	if [ "$st" != 201 ]; then bad="$bad s$i:$st:$(last .error.message)"; continue; fi
	admitted=$((admitted + 1))
	stopped "s$i" || bad="$bad s$i:not-stopped"
done
check "$admitted of $N sessions of 1 vCPU admitted on 2 active vCPUs, each idle-stopped ($(($(date +%s) - t0)) s)${bad:+:$bad}" \
	test "$admitted" = "$N" -a -z "$bad"
check "GET /v1/capacity counts them idle: [total, used, idle, idle_max] $(vcpus) = [2,0,$N,128]" \
	test "$(vcpus)" = "[2,0,$N,128]"
check "/metrics: kiln_host_vcpus_idle $N, kiln_host_vcpus_used 0" \
	test "$(metric kiln_host_vcpus_idle)" = "$N" -a "$(metric kiln_host_vcpus_used)" = 0

bad=
for i in $(seq "$N"); do
	st=$(h POST "/v1/sessions/s$i/exec" --data-binary "{\"argv\":[\"echo\",\"s$i\"]}")
	[ "$st" = 200 ] && [ "$(last .stdout)" = "s$i" ] || bad="$bad s$i:$st"
done
check "every session answers an exec, in its own VM${bad:+ (not:$bad)}" test -z "$bad"

# Two kept busy: a background sleep keeps the idler off them.
bg='{"argv":["sh","-c","sleep 600 > /dev/null 2>&1 &"]}'
st1=$(h POST /v1/sessions/s1/exec --data-binary "$bg")
st2=$(h POST /v1/sessions/s2/exec --data-binary "$bg")
until_vcpus "[2,2,$((N - 2)),128]"
got=$(vcpus)
check "2 busy, $((N - 2)) idle again: $got (statuses $st1 $st2)" test "$got" = "[2,2,$((N - 2)),128]"
st=$(create 13)
check "a session beyond the active vCPUs: 503 no_capacity ($(last .error.message))" \
	eval '[ "$st" = 503 ] && [ "$(last .error.code)" = no_capacity ] && last .error.message | grep -q "busy running work"'
st=$(h POST /v1/sessions/s5/exec --data-binary '{"argv":["echo","awake"]}')
got=$(vcpus)
check "waking an idle one still works, past the total ($got, exec $st $(last .stdout))" \
	test "$st" = 200 -a "$(last .stdout)" = awake -a "$got" = "[2,3,$((N - 3)),128]"
until_vcpus "[2,2,$((N - 2)),128]"
got=$(vcpus)
check "... and it goes idle again: $got" test "$got" = "[2,2,$((N - 2)),128]"

bad=
for i in $(seq "$N"); do [ "$(h DELETE "/v1/sessions/s$i")" = 200 ] || bad="$bad s$i"; done
check "DELETE destroys each${bad:+ (not:$bad)}, busy and idle" test -z "$bad"
mem=$(curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/v1/capacity" | jq -r .memory_mib.used)
got=$(vcpus)
check "counters back to 0: $got, memory $mem MiB" test "$got" = "[2,0,0,128]" -a "$mem" = 0
t_stop "$host_pid"; host_pid=
t_nothing_left "nothing left: no QEMU, VM directories, cgroups or mounts"
t_done
