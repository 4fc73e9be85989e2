#!/usr/bin/env bash
# The control plane against a simulated fleet (issue 43; no VMs): 50 hosts
# of bench/fleet_sim.py (one process; 4 vCPUs each, tasks accepted 2 s
# before they start, then running 0.3 s) heartbeating to two kiln-api
# replicas on one PostgreSQL. A burst of 2,000 tasks from 20 customers,
# spread over both replicas; mid-burst one host dies (stops answering and
# heartbeating) and then the leader is SIGKILLed (and restarted). Every task
# ends exactly once: the simulator saw no task end on two hosts and no task
# pushed to a second host unless its first was lost, and kiln-api has every
# task final, succeeded or (started on the dead host) host_lost; the dead
# host's tasks not started there were requeued and ended elsewhere. No push
# should find its host without room for it: today some do (a failure until
# issue 43's item 3 fixes kiln-api's count of capacity in flight). Then a diagnostic, not a check
# (fairness is issue 43's item 5): one customer's single task's queue time
# while another has 1,000 queued.
. "$(dirname "$0")/lib.sh"
t_plan 10
t_require_tools jq curl
[ -x "$ROOT/build/kiln-api" ] || { echo "1..0 # SKIP build/kiln-api missing: run make"; exit 0; }
ls /usr/lib/postgresql/*/bin/postgres > /dev/null 2>&1 || t_skip_all "no PostgreSQL server: run scripts/deps.sh"

PY=/usr/bin/python3
TOKEN=fleet-token-$RANDOM$RANDOM$RANDOM
ADMIN=fleet-admin-$RANDOM$RANDOM$RANDOM
BASE=$((20000 + RANDOM % 5000))
SIM=$((26000 + RANDOM % 5000)) # control port; the hosts on SIM+1..SIM+50
HOSTS=50
DEAD=7
api_pids=()
pg_start || t_bail "PostgreSQL (scripts/pg-local.sh) starts"

url() { echo "http://127.0.0.1:$((BASE + $1))"; }
start_api() { # r
	local r=$1
	api_config "$T_TMP/api$r.json" "127.0.0.1:$((BASE + r))" \
		"del(.db) + {store: {postgres: \"$T_PG_URL\"}, host_lost_after_s: 3,
		  max_connections_per_address: 1024,
		  quotas: {submit_rate: 0, max_queued: 0, max_running: 0, max_vcpus: 0, max_memory_mib: 0}}"
	api_start "$T_TMP/api$r.json" "$(url "$r")" "api$r"
	local rc=$?
	api_pids[$r]=$api_pid
	return $rc
}
leader() { # the replica whose healthz says leader
	for r in "${!api_pids[@]}"; do
		curl -s -m 2 "$(url "$r")/healthz" | jq -e .leader > /dev/null 2>&1 && echo "$r"
	done
}
live_on() { curl -s -m 10 -H "Authorization: Bearer $ADMIN" "$(url "$1")/v1/admin/hosts" | jq '[.hosts[] | select(.state == "live")] | length' 2> /dev/null; }
sim() { curl -s -m 10 "$@"; }
jqe() { jq -e "$@" > /dev/null; }

start_api 0 || t_bail "kiln-api replica 0 starts" "$(tail -3 "$T_TMP/api0.err")"
start_api 1 || t_bail "kiln-api replica 1 starts" "$(tail -3 "$T_TMP/api1.err")"
t_bg $PY "$ROOT/bench/fleet_sim.py" --api "$(url 0),$(url 1)" --token "$TOKEN" --hosts "$HOSTS" \
	--base-port $((SIM + 1)) --control-port "$SIM" --heartbeat-ms 500 --vcpus 4 --memory-mib 4096 \
	--start-ms 2000 --run-ms 300 > "$T_TMP/sim.out" 2> "$T_TMP/sim.err"
S=http://127.0.0.1:$SIM
all_live() { [ "$(live_on 0)" = $HOSTS ] && [ "$(live_on 1)" = $HOSTS ]; }
t_until 30 all_live
check "the simulator's $HOSTS hosts are live on both replicas" all_live

# ---- the burst, a host dying and the leader SIGKILLed in the middle ----
API=$(url 0)
$PY "$ROOT/bench/fleet_load.py" customers "$API" "$ADMIN" 20 c "$T_TMP/keys.json" || t_bail "customers made"
$PY "$ROOT/bench/fleet_load.py" burst "$(url 0),$(url 1)" "$T_TMP/keys.json" 2000 8 "$T_TMP/sub.json" > "$T_TMP/burst.json" &
burst=$!
sleep 2
sim -X POST "$S/die?host=$DEAD" > "$T_TMP/die.json"
echo "# host sim-$DEAD died with $(jq .tasks "$T_TMP/die.json") tasks on it"
sleep 1.5
L=$(leader)
kill -9 "${api_pids[$L]}"
t_killed=$SECONDS
wait "${api_pids[$L]}" 2> /dev/null
other_leads() { local n; n=$(leader); [ -n "$n" ] && [ "$n" != "$L" ]; }
t_until 10 other_leads
check "a follower leads after the leader's SIGKILL mid-burst" other_leads
echo "# leader r$L SIGKILLed; r$(leader) leads after $((SECONDS - t_killed)) s"
start_api "$L" || t_bail "kiln-api replica $L restarts" "$(tail -3 "$T_TMP/api$L.err")"
wait "$burst"
check "2,000 submissions accepted over both replicas (the SIGKILLed one's in flight retried)" \
	jqe '.submitted == 2000 and .errors == 0' "$T_TMP/burst.json"
echo "# burst: $(cat "$T_TMP/burst.json")"
$PY "$ROOT/bench/fleet_load.py" ended "$API" "$T_TMP/keys.json" "$T_TMP/sub.json" 120 > "$T_TMP/ended.json"
echo "# ended: $(cat "$T_TMP/ended.json")"
check "every task is final" jqe '.final == 2000 and .not_final == 0' "$T_TMP/ended.json"
check "each succeeded or, started on the dead host, ended host_lost" \
	jqe '.states | del(.succeeded) | del(."error:host_lost") | length == 0' "$T_TMP/ended.json"
sim "$S/stats" > "$T_TMP/stats.json"
sim "$S/pushes" > "$T_TMP/pushes.json"
echo "# simulator: $(cat "$T_TMP/stats.json")"
check "no task ended on two hosts, and as many ended on the hosts as succeeded in kiln-api" \
	jqe --argjson ok "$(jq '.states.succeeded // 0' "$T_TMP/ended.json")" '.ended_twice == 0 and .finals == $ok' "$T_TMP/stats.json"
check "no task pushed to a second host unless its first was lost" jqe '.pushed_twice_not_lost == 0' "$T_TMP/stats.json"
# The dead host's tasks: those host_lost in kiln-api must not have ended
# anywhere; the others were requeued and ended on another host.
$PY - "$T_TMP/pushes.json" "$T_TMP/sub.json.states" "$DEAD" > "$T_TMP/dead.json" << 'PY'
import json, sys
p, states, dead = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
on_dead = {e["task"] for e in p["pushes"] if e["host"] == dead}
fin = p["finals"]
requeued = [t for t in on_dead if states.get(t) == "succeeded" and fin.get(t) and dead not in fin[t]]
lost = [t for t in on_dead if states.get(t) == "error:host_lost" and not fin.get(t)]
bad = sorted(on_dead - set(requeued) - set(lost))
print(json.dumps({"on_dead": len(on_dead), "requeued_elsewhere": len(requeued), "host_lost": len(lost), "bad": bad[:5]}))
PY
echo "# dead host: $(cat "$T_TMP/dead.json")"
check "the dead host's unstarted tasks were requeued and ended elsewhere, its started ones host_lost" \
	jqe '.on_dead > 0 and .requeued_elsewhere > 0 and (.bad | length) == 0' "$T_TMP/dead.json"
# The simulator refuses such a push (503 no_capacity, as kiln-host does): no
# host ever ran past its capacity; kiln-api's count of what it placed since
# a host's last heartbeat is dropped when a heartbeat built before those
# pushes arrives after them (issue 43: a fix of item 3).
echo "# pushes past a host's capacity (refused by it, requeued): $(jq .over_capacity "$T_TMP/stats.json")"
check "no push found its host without room (kiln-api kept to the heartbeats' capacity)" \
	jqe '.over_capacity == 0' "$T_TMP/stats.json"

# ---- a diagnostic (issue 43, item 5): a single task behind 1,000 of another's ----
jq '[.[0]]' "$T_TMP/keys.json" > "$T_TMP/big.json"
jq '[.[1]]' "$T_TMP/keys.json" > "$T_TMP/small.json"
$PY "$ROOT/bench/fleet_load.py" burst "$API" "$T_TMP/big.json" 1000 8 "$T_TMP/big-sub.json" > /dev/null
$PY "$ROOT/bench/fleet_load.py" burst "$API" "$T_TMP/small.json" 1 1 "$T_TMP/small-sub.json" > /dev/null
echo "# fairness: one task of c-1 submitted behind 1,000 of c-0:" \
	"$($PY "$ROOT/bench/fleet_load.py" placed "$S" "$T_TMP/small-sub.json" 60 | jq -r '"queued \(.queue_p50_ms) ms before its push"')"
$PY "$ROOT/bench/fleet_load.py" ended "$API" "$T_TMP/big.json" "$T_TMP/big-sub.json" 60 > "$T_TMP/big-ended.json"
check "the 1,000 tasks of one customer all end" jqe '.final == 1000' "$T_TMP/big-ended.json"
t_done
