#!/usr/bin/env bash
# The guest agent (kiln-init's protocol, FILE, EXEC, KILL, COLLECT code) over a
# socketpair, without a VM: fast, and it reaches error paths a VM test cannot.
. "$(dirname "$0")/lib.sh"
if [ "$(id -u)" != 0 ]; then echo "1..0 # SKIP needs root (runs tasks as uid 54321)"; exit 0; fi
# Not exec: the EXIT trap removes $T_TMP and the run directory afterwards.
t_min 85 # the agent harness prints its own plan at the end
python3 "$ROOT/tests/agent/agent_host.py" "$ROOT/build/tests/agent-drive" "$T_TMP"
