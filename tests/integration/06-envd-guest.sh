#!/usr/bin/env bash
# The guest's envd in a real VM: kiln-init booted in a bare QEMU (no kiln-host,
# no jail) with both virtio-serial ports on Unix sockets, driven over the real
# kiln.envd port: the default user, streams, a terminal, stdin, signals,
# files, HELLO on reconnection and after a migration to a file and back.
. "$(dirname "$0")/lib.sh"
require_image
t_require_tools qemu-system-x86_64
# Not exec: the EXIT trap removes $T_TMP and the run directory afterwards.
t_min 26 # the agent harness prints its own plan at the end
/usr/bin/python3 "$ROOT/tests/agent/envd_vm.py" "$ROOT/build"
