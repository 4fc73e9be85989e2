#!/usr/bin/env bash
# Memory overload: a kiln-host with a small real budget (768 MiB) and memory
# overcommit 2 admits six 256 MiB sessions (1536 MiB nominal) and refuses a
# seventh (no_capacity). Then all six touch 160 MiB at once, more than the
# budget holds: the kernel OOM-kills inside the VMs' common cgroup, never
# kiln-host; at least one session ends with end_reason host_memory (and says
# why), the others' execs succeed, kiln-host keeps answering, and deleting
# everything releases QEMUs, cgroups, mounts and capacity.
. "$(dirname "$0")/lib.sh"
t_plan 14
require_image
t_require_tools jq curl
N=6
TOKEN=overload-$RANDOM$RANDOM
PORT=$((20000 + RANDOM % 10000))
host_pid=
before_cg=$(count_cgroups)
memcg=$(kiln_cgroup_parent memory)

host_config "$T_TMP/h.json" "127.0.0.1:$PORT" overload \
	'.run_dir += "/h" | .capacity = {vcpus: 64, cpu_overcommit: 1, memory_mib: 768, memory_overcommit: 2}'
host_start "$T_TMP/h.json" h
t_serving "http://127.0.0.1:$PORT/healthz" "$host_pid" 600 || t_bail "kiln-host starts" "$(tail -3 "$T_TMP/h.err")"
h() { # METHOD PATH [curl args]: status echoed, body in $T_TMP/last (or -o)
	local m=$1 p=$2; shift 2
	curl -s -m 300 -o "$T_TMP/last" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $TOKEN" \
		-H 'Content-Type: application/json' "$@" "http://127.0.0.1:$PORT$p"
}
capacity() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/v1/capacity"; }
host_alive() { kill -0 "$host_pid" 2> /dev/null && curl -s -m 5 "http://127.0.0.1:$PORT/healthz" > /dev/null; }

check "the host admits budget x overcommit: 768 MiB x 2 = 1536 MiB nominal" \
	test "$(capacity | jq -c '[.memory_mib.total, .memory_mib.budget]')" = "[1536,768]"

bad=
for i in $(seq "$N"); do
	st=$(h POST /v1/sessions --data-binary "{\"id\":\"o$i\",\"customer\":\"acme\",\"spec\":{}}")
	[ "$st" = 201 ] || bad="$bad o$i:$st"
done
check "$N sessions of 256 MiB admitted${bad:+ (not:$bad $(head -c 300 "$T_TMP/last"))}" test -z "$bad"
st=$(h POST /v1/sessions --data-binary '{"id":"o-extra","customer":"acme","spec":{}}')
check "one more is refused past budget x overcommit: 503 no_capacity (got $st $(jq -r .error.code "$T_TMP/last" 2> /dev/null))" \
	test "$st" = 503 -a "$(jq -r .error.code "$T_TMP/last" 2> /dev/null)" = no_capacity
check "the VMs' common memory cgroup is limited to the budget" \
	test "$(cat "$memcg/memory.limit_in_bytes" 2> /dev/null)" = $((768 << 20))
adj_ok=1
for p in $(pgrep -f "qemu-system-x86_64.*$KILN_RUN_DIR"); do
	[ "$(cat "/proc/$p/oom_score_adj" 2> /dev/null)" = 800 ] || adj_ok=0
done
check "every QEMU is the OOM killer's first choice (oom_score_adj 800)" test "$adj_ok" = 1
echo "# usage with $N idle sessions: $(capacity | jq -c .memory_mib)"

# All touch 160 MiB at once and hold it for 3 s: 6 x (160 + idle) is well past 768 MiB.
touch_code='import time
b = b"k" * (160 << 20)
time.sleep(3)
print("held", len(b) >> 20)'
pids=
body=$(jq -cn --arg c "$touch_code" '{argv: ["python3", "-c", $c], timeout_s: 120}')
for i in $(seq "$N"); do
	curl -s -m 300 -o "$T_TMP/x$i" -w '%{http_code}' -X POST -H "Authorization: Bearer $TOKEN" \
		-H 'Content-Type: application/json' --data-binary "$body" \
		"http://127.0.0.1:$PORT/v1/sessions/o$i/exec" > "$T_TMP/x$i.st" &
	pids="$pids $!"
done
wait $pids
killed=0 held=0 other=
for i in $(seq "$N"); do
	reason=$(jq -r '.end_reason // .error.code' "$T_TMP/x$i" 2> /dev/null)
	if [ "$reason" = host_memory ] && jq -e '.error.code == "host_memory" and (.error.message | test("ran out of memory"))' "$T_TMP/x$i" > /dev/null 2>&1; then
		killed=$((killed + 1))
	elif [ "$(cat "$T_TMP/x$i.st")" = 200 ] && [ "$(jq -r .stdout "$T_TMP/x$i")" = "held 160" ]; then
		held=$((held + 1))
	else
		other="$other o$i:$(cat "$T_TMP/x$i.st"):$(head -c 300 "$T_TMP/x$i")"
	fi
done
echo "# $killed sessions stopped for host memory, $held held their memory"
check "kiln-host survived and answers" host_alive
check "at least one sandbox ended with host_memory, telling why" test "$killed" -ge 1
check "the others finished normally (none ended any other way${other:+:$other})" test -z "$other" -a "$held" -ge 1
check "kiln-host ranks below every QEMU for the OOM killer (oom_score_adj $(cat /proc/$host_pid/oom_score_adj): -500, or 0 without CAP_SYS_RESOURCE)" \
	test "$(cat "/proc/$host_pid/oom_score_adj")" -le 0
curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/metrics" > "$T_TMP/metrics"
check "/metrics shows the budget, admitted memory, usage and budget hits" \
	grep -q '^kiln_host_memory_budget_hits_total [1-9]' "$T_TMP/metrics"
grep -E '^kiln_host_memory_(budget|admitted|usage|used)' "$T_TMP/metrics" | sed 's/^/# /'

# The killed ones are gone; the survivors still answer, then everything goes.
gone=0 alive_bad=
for i in $(seq "$N"); do
	st=$(h GET "/v1/sessions/o$i")
	if [ "$st" = 404 ]; then
		gone=$((gone + 1))
	else
		[ "$(h POST "/v1/sessions/o$i/exec" --data-binary '{"argv":["echo","hi"]}')" = 200 ] || alive_bad="$alive_bad o$i"
		h DELETE "/v1/sessions/o$i" > /dev/null
	fi
done
check "the $killed killed sessions are gone; the survivors still answer${alive_bad:+ (not:$alive_bad)}" \
	test "$gone" = "$killed" -a -z "$alive_bad"
for _ in $(seq 50); do [ "$(count_qemu)" = 0 ] && break; sleep 0.1; done
check "released: no QEMU, cgroups, mounts; capacity back to zero" \
	test "$(count_qemu)" = 0 -a "$(count_cgroups)" = "$before_cg" -a "$(count_mounts)" = 0 -a "$(capacity | jq -c '[.vcpus.used + .vcpus.idle, .memory_mib.used]')" = "[0,0]"
st=$(h POST /v1/sessions --data-binary '{"id":"o-after","customer":"acme","spec":{}}')
check "capacity is whole again: a new session starts and answers" \
	test "$st" = 201 -a "$(h POST /v1/sessions/o-after/exec --data-binary '{"argv":["echo","hi"]}')" = 200
h DELETE /v1/sessions/o-after > /dev/null
t_stop "$host_pid"; host_pid=
check "kiln-host stopped cleanly; nothing left in its run directory" \
	test "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)" = 0
t_done
