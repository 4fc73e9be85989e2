#!/usr/bin/env bash
# make bench: figures, not pass/fail. Medians and p95 over repeated runs;
# baselines are measured in the same run, interleaved with kiln's figures.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-20}
export KILN_RUN_DIR=${KILN_RUN_DIR:-$(mktemp -d /tmp/kiln-bench.XXXXXX)}
echo "== kiln benchmarks ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), RUNS=$RUNS)"
echo
build/bench/boot build/image build/bench/baseline.cpio "$RUNS"
echo
build/bench/start build/image "$RUNS"
echo
build/bench/jail build/image "${JAIL_RUNS:-10}"
echo
echo "print(1) end to end through the kiln-host run command (process start, cold boot, result)"
spec=$(mktemp /tmp/kiln-bench-spec.XXXXXX)
echo '{"language":"python","code":"print(1)"}' > "$spec"
times=()
for _ in $(seq "$RUNS"); do
	s=$(date +%s%N)
	build/kiln-host run --cold --spec "$spec" > /dev/null
	times+=($(( ($(date +%s%N) - s) / 1000 )))
done
printf '%s\n' "${times[@]}" | sort -n | awk '{ v[NR] = $1 } END {
	printf("  kiln-host run --cold print(1): median %6.1f ms  p95 %6.1f ms  (%d runs)\n", v[int((NR + 1) / 2)] / 1000, v[int((NR - 1) * 95 / 100) + 1] / 1000, NR) }'
rm -f "$spec"
rmdir "$KILN_RUN_DIR" 2>/dev/null || true
echo
# The host daemon under load: tasks/s, POST-to-succeeded latency with outputs
# in a local S3, idle pool VM memory, 200 MiB upload throughput.
python3 bench/hostd.py "${HOSTD_TASKS:-60}" "${HOSTD_CONCURRENCY:-4}" "${HOSTD_POOL:-4}"
echo
# kiln-api alone: authenticated GET /v1/tasks/{id} requests/s, durable submissions/s.
bench/api.sh
echo
# The whole stack: print(1) through kiln-api, the scheduler, a host's pool and S3.
python3 bench/stack.py "${STACK_TASKS:-80}" "${STACK_CONCURRENCY:-8}"
echo
# Task output: 200,000 and 1,000,000 unbuffered print() lines and 100 MiB of stdout through a task vs a pipe inside the guest.
LINES_BIG=${LINES_BIG:-1000000} RUNS=${OUTPUT_RUNS:-3} bench/output.sh
echo
# Network egress: extra start-up time, and throughput to an allowed destination.
bench/egress.sh
echo
# Sessions: pause/resume time by guest memory size, exec round trip.
bench/session.sh
echo
# Pause and resume through kiln-api with 64 MiB of incompressible memory: the first pause, unchanged and changed re-pauses (deltas).
RUNS=$RUNS bench/pause_api.sh
echo
# Forks and named snapshots through kiln-api: fork to 1 and 10 children, the parent's stand-still, an idle child's PSS, create from a snapshot.
bench/fork_api.sh
echo
# A session exec through kiln-api (SQLite), and the store's writes per exec (its lease), SQLite and PostgreSQL.
bench/session_exec.sh
pgdir=$(mktemp -d /tmp/kiln-bench-pg.XXXXXX)
build/bench/api_session_store "$(scripts/pg-local.sh start "$pgdir")"
scripts/pg-local.sh stop "$pgdir" > /dev/null; rm -rf "$pgdir"
echo
# Built-in templates: print(1) restored from python-data vs default; import pandas cold vs preloaded.
RUNS=$RUNS bench/templates.sh
echo
# Templates through the whole stack: print(1) python-data vs default (restored, pooled), builds, a host fetching one.
python3 bench/templates_stack.py "${TSTACK_RUNS:-10}"
echo
# E2B's SDK: Sandbox.create() -> first commands.run('echo hi'), SDK vs the native session API.
RUNS=$RUNS bench/e2b.sh
echo
# E2B's Code Interpreter SDK: create -> first runCode('1+1'), warm runCode('x+1'), a plot to PNG.
RUNS=$RUNS bench/code_interpreter.sh
echo
# Density: idle sessions per host in steps (memory, CPU, create time, exec latency), KSM off/on.
bench/density.sh
echo
# What a page fault costs here: QEMU's own load of a resumed session's pages against kiln-host's loader.
build/bench/pagefault
echo
# What a lazy resume would pay per page touched: userfaultfd faults served in-process and over a postcopy-shaped hop.
PAGES=1400 build/bench/uffd
echo
# The floor under it: plain QEMU clones of the same snapshot (memory, CPU running and stopped),
# warmed pool VMs, and the TCG translation buffer's size against a busy workload.
cdir=$(mktemp -d /tmp/kiln-bench-clones.XXXXXX)
KILN_RUN_DIR=$cdir build/bench/clones build/image
rmdir "$cdir" 2> /dev/null || true
echo
# A sandbox's ports through kiln-api: a small GET against the same loop inside the guest, a 50 MiB
# download, a WebSocket round trip, and what 100 idle connections cost kiln-api and kiln-host.
bench/ports.sh
echo
# The control plane against simulated hosts (issue 43): kiln-api on PostgreSQL with 1 and 3 replicas
# and 100 and 1,000 hosts of bench/fleet_sim.py: heartbeat cost, memory per host, submit latency
# under a burst, placement throughput, failover. No VMs; sizes by FLEET_* (bench/fleet.sh's knobs).
REPLICAS=${FLEET_REPLICAS:-1 3} HOSTS=${FLEET_HOSTS:-100 1000} PLACE_S=${FLEET_PLACE_S:-30} bench/fleet.sh
