#!/usr/bin/env bash
# make demo: run one example task end to end in a fresh microVM and show what came back.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d /tmp/kiln-demo.XXXXXX)
spec=$out/spec.json
cat > "$spec" <<'JSON'
{"language": "python",
 "code": "import os, platform, hashlib\nprint('hello from', platform.node(), 'kernel', platform.release())\nos.makedirs('/output/report', exist_ok=True)\nwith open('/output/report/squares.csv', 'w') as f:\n    f.write('n,n2\\n' + ''.join(f'{i},{i*i}\\n' for i in range(10)))\nprint('wrote /output/report/squares.csv')\n",
 "limits": {"vcpus": 1, "memory_mib": 256, "timeout_s": 30}}
JSON
echo "== task spec: $spec"
echo "== pre-booted snapshot (made once, cached in ${KILN_CACHE:-/var/cache/kiln}/snapshots)"
build/kiln-host snapshot create > /dev/null
echo "== running it in a fresh microVM cloned from the snapshot (build/kiln-host run)"
build/kiln-host run --spec "$spec" --output-dir "$out/output" > "$out/result.json" || true
python3 - "$out/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("state:      ", r["state"], "(exit code %s)" % r.get("exit_code"))
print("stdout:     ", r["stdout"].rstrip().replace("\n", "\n             "))
if r.get("stderr"): print("stderr:     ", r["stderr"].rstrip())
for o in r.get("outputs", []): print("output file:", o["path"], o["size"], "bytes, sha256", o["sha256"][:16] + "...")
print("timings:    ", r.get("timings"))
if r.get("error"): print("error:      ", r["error"])
PY
echo "== output files are in $out/output"
find "$out/output" -type f | sed 's/^/   /'
