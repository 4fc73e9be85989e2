#!/usr/bin/env bash
# Built-in templates (figures, not pass/fail), through the kiln-host run
# command (process start, restore or boot, task, result):
#  - print(1) restored from a python-data snapshot against the same from a
#    default snapshot, interleaved: time to the first stdout line (seen by
#    the host, --stream), the restore itself (timings.boot_ms) and the whole
#    command; the ratio python-data/default, target within 1.2x (its
#    pre-started interpreter holds numpy, pandas and matplotlib, so its
#    snapshot's memory is larger);
#  - `import pandas` in a cold-booted python-data VM (a fresh python3) against
#    the same restored (the pre-started interpreter preloaded it): the import
#    inside the guest and the whole command.
# Medians over RUNS (COLD_RUNS for the cold boots).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10}
COLD_RUNS=${COLD_RUNS:-5}
TMP=$(mktemp -d /tmp/kiln-bench-templates.XXXXXX)
export KILN_RUN_DIR=${KILN_RUN_DIR:-$TMP/run}
trap 'rm -rf "$TMP"; rmdir "$KILN_RUN_DIR" 2> /dev/null || true' EXIT

if [ ! -r build/image/rootfs-python-data.ext4 ]; then
	echo "templates: build/image/rootfs-python-data.ext4 missing (make image); skipped"
	exit 0
fi
# One image dir per template, each file a link to its real path (the
# snapshot key is made of resolved paths: the same snapshots every run).
for t in default:rootfs.ext4 python-data:rootfs-python-data.ext4; do
	d=$TMP/${t%%:*}
	mkdir -p "$d"
	for f in vmlinux initramfs.cpio; do ln -s "$(readlink -f "build/image/$f")" "$d/$f"; done
	ln -s "$(readlink -f "build/image/${t#*:}")" "$d/rootfs.ext4"
	build/kiln-host snapshot create --image-dir "$d" > /dev/null 2> "$TMP/snap.err" ||
		{ echo "templates: snapshot create ${t%%:*} failed: $(tail -n 1 "$TMP/snap.err")"; exit 1; }
done

/usr/bin/python3 - "$TMP" "$RUNS" "$COLD_RUNS" << 'EOF'
import json, statistics, subprocess, sys, time

tmp, runs, cold_runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def run(template, code, cold=False):
    """kiln-host run --stream: (ms to the first stdout event, ms in all, result)."""
    spec = "%s/spec.json" % tmp
    with open(spec, "w") as f:
        json.dump({"language": "python", "code": code}, f)
    argv = ["build/kiln-host", "run", "--stream", "--spec", spec, "--image-dir", "%s/%s" % (tmp, template)]
    if cold:
        argv.append("--cold")
    t0 = time.perf_counter()
    first = None
    result = None
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as p:
        for line in p.stdout:
            ev = json.loads(line)
            if ev.get("stream") == "stdout" and first is None:
                first = time.perf_counter()
            elif ev.get("stream") == "result":
                result = ev
    end = time.perf_counter()
    if not result or result.get("state") != "succeeded" or first is None:
        sys.exit("templates: %s task failed: %s" % (template, json.dumps(result)[:300]))
    return (first - t0) * 1000, (end - t0) * 1000, result


med = statistics.median
fig = {}
for _ in range(runs):
    for t in ("default", "python-data"):
        first, total, r = run(t, "print(1)")
        assert r["timings"]["start"] == "restore", r["timings"]
        fig.setdefault(t, []).append((first, r["timings"]["boot_ms"], total))

print("templates: print(1) restored from each built-in template's snapshot (kiln-host run --stream, %d runs each, interleaved)" % runs)
print("  %-12s %16s %12s %12s" % ("template", "first line ms", "restore ms", "total ms"))
for t in ("default", "python-data"):
    v = fig[t]
    print("  %-12s %16.1f %12.1f %12.1f" % (t, med(x[0] for x in v), med(x[1] for x in v), med(x[2] for x in v)))
d, p = fig["default"], fig["python-data"]
print("  python-data / default: first line %.2fx, total %.2fx (target <= 1.2x)"
      % (med(x[0] for x in p) / med(x[0] for x in d), med(x[2] for x in p) / med(x[2] for x in d)))

code = 'import time\nt = time.perf_counter()\nimport pandas\nprint("%.1f" % ((time.perf_counter() - t) * 1000))'
imp = {"cold": [], "restore": []}
for i in range(max(runs, cold_runs)):
    if i < cold_runs:
        _, total, r = run("python-data", code, cold=True)
        assert r["timings"]["start"] == "cold", r["timings"]
        imp["cold"].append((float(r["stdout"]), total))
    if i < runs:
        _, total, r = run("python-data", code)
        imp["restore"].append((float(r["stdout"]), total))
print()
print("templates: import pandas on python-data, cold boot (fresh python3, %d runs) vs restored (pre-started interpreter, %d runs)" % (cold_runs, runs))
print("  %-28s %16s %12s" % ("", "import ms", "total ms"))
for k, label in (("cold", "cold boot, fresh python3"), ("restore", "restored, preloaded")):
    v = imp[k]
    print("  %-28s %16.1f %12.1f" % (label, med(x[0] for x in v), med(x[1] for x in v)))
c, r = imp["cold"], imp["restore"]
print("  the pre-started interpreter saves %.0f ms of import, %.0f ms end to end"
      % (med(x[0] for x in c) - med(x[0] for x in r), med(x[1] for x in c) - med(x[1] for x in r)))
EOF
