#!/usr/bin/env bash
# bench/fleet.sh: kiln-api on PostgreSQL against a fleet of simulated hosts
# (bench/fleet_sim.py, one process), issue 43. Figures only. Per step
# (REPLICAS x HOSTS, each on a PostgreSQL of its own, scripts/pg-local.sh):
#   1. idle: the replicas alone for IDLE_S s: CPU% and RSS (the baseline);
#      then (wrk) BURST0_S s of the burst below without hosts: its baseline
#   2. heartbeats: HOSTS hosts heartbeating every HB_MS for HB_S s: CPU% of
#      each replica and of PostgreSQL (its postmaster and backends, exited
#      ones included), CPU per heartbeat (the leader's CPU over the baseline
#      / the heartbeats it answers: HOSTS/REPLICAS per period), the leader's
#      RSS and per host it answers (over the baseline), PostgreSQL's
#      PSS, the simulator's heartbeat round trip
#   3. burst: CUSTOMERS customers (quotas lifted), submissions taken
#      round-robin over them, CONC at once spread over the replicas (wrk
#      for BURST_S s, ~1,200/s here: ~10,000 tasks; or with
#      BURST_TOOL=python bench/fleet_load.py's TASKS, slower, with each
#      task's queue time), while
#      the simulator holds every host full (fleet_sim --hold: the tasks
#      queue): submit latency p50/p99, CPU%; then the hosts are released:
#      placement throughput (tasks/s from the release to the last push the
#      simulator received) and queue time (push - submission), CPU% of each
#      replica and PostgreSQL, the leader's threads; how many hosts the
#      tasks went to; over-capacity pushes (the host refused them with 503)
#   4. with more than one replica: FAILOVERS SIGKILLs of the leader; the
#      time until another replica's /healthz says leader
# Then compared with the issue's targets. Knobs (env): REPLICAS ("1 3"),
# HOSTS ("100 1000"), HB_MS (1000), HB_S (10), IDLE_S (5), CUSTOMERS (200),
# BURST_S (8), BURST0_S (3, 0: none), TASKS (10000), CONC (32), VCPUS per host (32), RUN_MS per task (1000),
# PLACE_S (the most a burst's placement is waited for, 120), FAILOVERS (3).
# A quick run: REPLICAS=1 HOSTS=100 BURST_S=2 bench/fleet.sh
# KEEP=1: the temporary directory (configurations, kiln-api and simulator
# logs) is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
for t in curl jq; do
	command -v "$t" > /dev/null || { echo "bench/fleet: $t missing (scripts/deps.sh)" >&2; exit 1; }
done
API=build/kiln-api
[ -x "$API" ] || { echo "bench/fleet: $API missing: run make" >&2; exit 1; }
REPLICAS=${REPLICAS:-1 3}
HOSTS=${HOSTS:-100 1000}
HB_MS=${HB_MS:-1000}
HB_S=${HB_S:-10}
IDLE_S=${IDLE_S:-5}
CUSTOMERS=${CUSTOMERS:-200}
TASKS=${TASKS:-10000}
CONC=${CONC:-32}
VCPUS=${VCPUS:-32}
RUN_MS=${RUN_MS:-1000}
PLACE_S=${PLACE_S:-120}
BURST_S=${BURST_S:-8}
BURST0_S=${BURST0_S:-3}
BURST_TOOL=${BURST_TOOL:-$(command -v wrk > /dev/null && echo wrk || echo python)}
FAILOVERS=${FAILOVERS:-3}
HZ=$(getconf CLK_TCK)
tmp=$(mktemp -d /tmp/kiln-bench-fleet.XXXXXX)
pgdir=
base=$((20000 + RANDOM % 9000))
simport=$((9000 + RANDOM % 8000)) # below the ephemeral ports (32768-): the hosts on simport+1..+HOSTS
admin=bench-admin-$RANDOM$RANDOM$RANDOM
token=bench-token-$RANDOM$RANDOM$RANDOM$RANDOM
pids=()
sim_pid=
stop_all() {
	[ -z "$sim_pid" ] || { kill "$sim_pid" 2> /dev/null || true; wait "$sim_pid" 2> /dev/null || true; }
	sim_pid=
	for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2> /dev/null || true; done
	pids=()
	if [ -n "$pgdir" ]; then scripts/pg-local.sh stop "$pgdir" || true; rm -rf "$pgdir"; fi
	pgdir=
}
cleanup() { stop_all; if [ -n "${KEEP:-}" ]; then echo "bench/fleet: kept $tmp" >&2; else rm -rf "$tmp"; fi; }
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

url() { echo "http://127.0.0.1:$((base + $1))"; }
start() { # r
	local r=$1
	jq -n --arg l "127.0.0.1:$((base + r))" --arg a "$admin" --arg t "$token" --arg pg "$pg" \
		'{listen: $l, admin_key: $a, cluster_token: $t, store: {postgres: $pg},
		  max_connections: 16384, max_connections_per_address: 8192,
		  quotas: {submit_rate: 0, max_queued: 0, max_running: 0, max_vcpus: 0, max_memory_mib: 0, max_streams: 0}}' \
		> "$tmp/api$r.json"
	"$API" --config "$tmp/api$r.json" 2>> "$tmp/api$r.err" > /dev/null &
	pids[$r]=$!
	for _ in $(seq 100); do curl -sf "$(url "$r")/healthz" > /dev/null && return 0; sleep 0.1; done
	echo "bench/fleet: replica $r did not start: $(tail -2 "$tmp/api$r.err")" >&2
	exit 1
}
leader() { # the replica whose healthz says leader, or nothing
	for r in "${!pids[@]}"; do
		if curl -s -m 1 "$(url "$r")/healthz" 2> /dev/null | jq -e .leader > /dev/null 2>&1; then echo "$r"; return 0; fi
	done
	return 0
}
# CPU ticks of a process (utime+stime); of PostgreSQL: the postmaster with
# its reaped children and every live backend.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2> /dev/null || echo 0; }
pg_pm() { head -1 "$pgdir/data/postmaster.pid"; }
pg_ticks() {
	local pm t c
	pm=$(pg_pm)
	t=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$pm/stat")
	for c in $(pgrep -P "$pm"); do t=$((t + $(ticks "$c"))); done
	echo "$t"
}
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
threads() { awk '/^Threads/ {print $2}' "/proc/$1/status"; }
pg_pss_kib() {
	local pm t=0 c
	pm=$(pg_pm)
	for c in $pm $(pgrep -P "$pm"); do t=$((t + $(awk '/^Pss:/ {print $2}' "/proc/$c/smaps_rollup" 2> /dev/null || echo 0))); done
	echo "$t"
}
# sample SECONDS: CPU% of each replica and of PostgreSQL over SECONDS, into
# cpu[r] and cpu_pg (percent of one core)
declare -A cpu
sample_begin() {
	for r in "${!pids[@]}"; do cpu0[$r]=$(ticks "${pids[$r]}"); done
	pg0=$(pg_ticks)
	t0=$(date +%s%N)
}
sample_end() {
	local dt=$((($(date +%s%N) - t0) / 1000000))
	for r in "${!pids[@]}"; do cpu[$r]=$(awk -v a="${cpu0[$r]}" -v b="$(ticks "${pids[$r]}")" -v hz="$HZ" -v dt="$dt" 'BEGIN {printf "%.1f", (b - a) * 100000 / hz / dt}'); done
	cpu_pg=$(awk -v a="$pg0" -v b="$(pg_ticks)" -v hz="$HZ" -v dt="$dt" 'BEGIN {printf "%.1f", (b - a) * 100000 / hz / dt}')
}
# wrk_sum: the wrk outputs of a burst as one JSON line (the slowest
# replica's percentiles)
wrk_sum() {
	cat "$tmp"/wrk*.out | awk -v s="$BURST_S" '
				function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /m$/) return v * 60000; return v * 1000 }
				/requests in/ { n += $1 } /Non-2xx/ { bad += $NF } /Socket errors/ { gsub(",", ""); bad += $4 + $6 + $8 + $10 }
				/^ +50%/ { p50 = (ms($2) > p50 ? ms($2) : p50) } /^ +99%/ { p99 = (ms($2) > p99 ? ms($2) : p99) }
				/Latency/ && !/Distribution/ { mx = (ms($4) > mx ? ms($4) : mx) }
				END { printf "{\"submitted\": %d, \"errors\": %d, \"seconds\": %s, \"rate\": %.1f, \"p50_ms\": %.1f, \"p99_ms\": %.1f, \"max_ms\": %.1f}\n", n - bad, bad, s, (n - bad) / s, p50, p99, mx }'
}
# burst SECONDS: wrk, one per replica, CONC connections spread over them,
# for SECONDS s, the customers' keys in turn (fleet_load.py wrk-lua); the
# figures in b (wrk_sum)
burst() {
	local w=() r
	[ -f "$tmp/burst.lua" ] || $PY bench/fleet_load.py wrk-lua "$tmp/keys.json" "$tmp/burst.lua"
	rm -f "$tmp"/wrk*.out
	for r in $(seq 0 $((R - 1))); do
		wrk -t1 -c$((CONC / R)) -d"${1}s" --timeout 30s --latency -s "$tmp/burst.lua" "$(url "$r")" > "$tmp/wrk$r.out" &
		w+=($!)
	done
	wait "${w[@]}"
	b=$(BURST_S=$1 wrk_sum)
}
declare -a cpu0
live_hosts() { curl -s -m 10 -H "Authorization: Bearer $admin" "$(url "$1")/v1/admin/hosts" | jq '[(.hosts // .)[] | select(.state == "live")] | length' 2> /dev/null || echo 0; }
cpus_list() { local s="" r; for r in "${!pids[@]}"; do s+="${s:+ }r$r ${cpu[$r]}%"; done; echo "$s"; }

echo "== kiln-api fleet (simulated hosts, issue 43): $(nproc) CPUs, PostgreSQL $(ls /usr/lib/postgresql | sort -V | tail -1) local;" \
	"hosts of $VCPUS vCPUs heartbeating every $HB_MS ms, tasks of 1 vCPU running $RUN_MS ms"
summary=()
for R in $REPLICAS; do
	for N in $HOSTS; do
		echo "-- $R replica(s), $N hosts"
		pgdir=$(mktemp -d /tmp/kiln-bench-pg.XXXXXX)
		pg=$(scripts/pg-local.sh start "$pgdir")
		for r in $(seq 0 $((R - 1))); do start "$r"; done
		apis=$(for r in $(seq 0 $((R - 1))); do url "$r"; done | paste -sd,)
		for _ in $(seq 50); do L=$(leader); [ -n "$L" ] && break; sleep 0.1; done
		# 1. idle
		rm -f "$tmp/burst.lua"
		$PY bench/fleet_load.py customers "$(url 0)" "$admin" "$CUSTOMERS" c "$tmp/keys.json"
		sample_begin; sleep "$IDLE_S"; sample_end
		idle_leader=${cpu[$L]}
		rss0=$(rss_kib "${pids[$L]}")
		echo "idle (no hosts): $(cpus_list), PostgreSQL ${cpu_pg}%; leader (r$L) RSS $((rss0 / 1024)) MiB"
		b0='{"submitted": 0}'
		if [ "$BURST_TOOL" = wrk ] && [ "$BURST0_S" -gt 0 ]; then
			# the same submissions without hosts, for BURST0_S s: the baseline
			# of the burst below (these tasks are placed with the burst's)
			burst "$BURST0_S"
			b0=$b
			echo "burst without hosts (wrk, ${BURST0_S} s): $(jq -r '"\(.submitted) submitted, \(.rate)/s; submit latency p50 \(.p50_ms) ms p99 \(.p99_ms) ms"' <<< "$b0")"
		fi
		# 2. heartbeats
		$PY bench/fleet_sim.py --api "$apis" --token "$token" --hosts "$N" --base-port "$((simport + 1))" \
			--control-port "$simport" --heartbeat-ms "$HB_MS" --vcpus "$VCPUS" --memory-mib $((VCPUS * 1024)) \
			--run-ms "$RUN_MS" --hold > /dev/null 2> "$tmp/sim.err" &
		sim_pid=$!
		sim="http://127.0.0.1:$simport"
		t_live=$(date +%s%N)
		for _ in $(seq 600); do
			kill -0 "$sim_pid" 2> /dev/null || { echo "bench/fleet: the simulator ended: $(tail -3 "$tmp/sim.err")" >&2; exit 1; }
			[ "$(live_hosts "$L")" -ge "$N" ] && break
			sleep 0.2
		done
		echo "hosts live: $(live_hosts "$L") of $N after $((($(date +%s%N) - t_live) / 1000000)) ms"
		sleep 2
		sample_begin; sleep "$HB_S"; sample_end
		rss1=$(rss_kib "${pids[$L]}")
		hb_leader=${cpu[$L]}
		# The hosts are spread over the replicas (fleet_sim: host I starts
		# with the (I mod R)th URL): the leader answers N/R of them.
		per_host_us=$(awk -v c="$hb_leader" -v i="$idle_leader" -v n="$N" -v r="$R" -v ms="$HB_MS" 'BEGIN {printf "%.0f", (c - i) / 100 * 1e6 * ms / 1000 / (n / r)}')
		per_host_mem=$(((rss1 - rss0) * R / N))
		st=$(curl -s "$sim/stats")
		echo "heartbeats: $(cpus_list), PostgreSQL ${cpu_pg}% (PSS $(($(pg_pss_kib) / 1024)) MiB);" \
			"leader over idle: $(awk -v c="$hb_leader" -v i="$idle_leader" 'BEGIN {printf "%.1f", c - i}')% of a core," \
			"$per_host_us us CPU per heartbeat; leader RSS $((rss1 / 1024)) MiB, $per_host_mem KiB per host;" \
			"leader threads $(threads "${pids[$L]}"); heartbeat round trip p50 $(jq .heartbeat_rtt_ms.p50 <<< "$st") ms" \
			"p99 $(jq .heartbeat_rtt_ms.p99 <<< "$st") ms, errors $(jq .heartbeat_errors <<< "$st")"
		hb_pg=$cpu_pg
		# 3. burst
		sample_begin
		if [ "$BURST_TOOL" = wrk ]; then
			burst "$BURST_S"
		else
			b=$($PY bench/fleet_load.py burst "$apis" "$tmp/keys.json" "$TASKS" "$CONC" "$tmp/sub.json")
		fi
		sample_end
		echo "burst (hosts held full: the tasks queue; $BURST_TOOL): $(jq -r '"\(.submitted) submitted (\(.errors) errors) in \(.seconds) s, \(.rate)/s; submit latency p50 \(.p50_ms) ms p99 \(.p99_ms) ms max \(.max_ms) ms"' <<< "$b");" \
			"$(cpus_list), PostgreSQL ${cpu_pg}%"
		sample_begin
		curl -s -X POST "$sim/hold?on=0" > /dev/null
		if [ "$BURST_TOOL" = wrk ]; then
			p=$($PY bench/fleet_load.py placed-all "$sim" "$(($(jq .submitted <<< "$b") + $(jq .submitted <<< "$b0")))" "$PLACE_S")
		else
			p=$($PY bench/fleet_load.py placed "$sim" "$tmp/sub.json" "$PLACE_S")
		fi
		sample_end
		maxthr=$(threads "${pids[$L]}")
		st=$(curl -s "$sim/stats")
		echo "placement: $(jq -r '"\(.pushed) pushed (\(.missing) not in time) over \(.span_s) s: \(.rate) tasks/s; queue time p50 \(.queue_p50_ms) ms p99 \(.queue_p99_ms) ms; on \(.hosts_used) hosts"' <<< "$p");" \
			"over-capacity pushes $(jq .over_capacity <<< "$st"); pushed twice $(jq .pushed_twice <<< "$st")"
		echo "during the placement: $(cpus_list), PostgreSQL ${cpu_pg}%; leader threads at its end $maxthr"
		fo="-"
		if [ "$R" -gt 1 ]; then
			times=()
			for _ in $(seq "$FAILOVERS"); do
				for _ in $(seq 50); do L=$(leader); [ -n "$L" ] && break; sleep 0.1; done
				kill -9 "${pids[$L]}"; wait "${pids[$L]}" 2> /dev/null || true
				t0=$(date +%s%N)
				while :; do
					M=$(leader)
					[ -n "$M" ] && [ "$M" != "$L" ] && break
					[ $((($(date +%s%N) - t0) / 1000000)) -lt 30000 ] || break
					sleep 0.02
				done
				times+=($((($(date +%s%N) - t0) / 1000000)))
				start "$L"
				sleep 2
			done
			fo=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(((FAILOVERS + 1) / 2))p")
			echo "leader failover (SIGKILL, until another replica's healthz says leader), $N hosts, $FAILOVERS kills: ${times[*]} ms; median $fo ms"
		fi
		summary+=("$(printf '%-3s %-5s %8s %10s %8s %10s %10s %9s %9s' "$R" "$N" "$hb_leader" "$per_host_us" "$hb_pg" \
			"$per_host_mem" "$(jq .rate <<< "$p")" "$(jq .p99_ms <<< "$b")" "$fo")")
		stop_all
	done
done
echo
echo "summary (targets, issue 43: heartbeats of 1,000 hosts at 1/s <= 25% of a core on the leader; placement >= 1,000 tasks/s;"
echo "         submit p99 <= 50 ms; failover <= 2,000 ms; kiln-api memory per host <= 64 KiB)"
printf '%-3s %-5s %8s %10s %8s %10s %10s %9s %9s\n' R hosts "hb-cpu%" "us/beat" "pg-cpu%" "KiB/host" "placed/s" "p99-ms" "failover"
printf '%s\n' "${summary[@]}"
