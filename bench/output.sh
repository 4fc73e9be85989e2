#!/usr/bin/env bash
# Task output at pipe speed: figures, not pass/fail (medians over RUNS runs,
# one VM at a time, each kind of run interleaved with the others).
#   - N unbuffered Python print() lines ('%040d', PYTHONUNBUFFERED=1, as tasks get
#     it) through `kiln-host run` (a restored VM, the pre-started interpreter):
#     the run's wall time minus a print(1) run's, i.e. what the output costs
#     on top of starting and ending a task; versus the same loop inside the
#     guest writing into a pipe that a thread reads (timed inside the guest).
#   - 100 MiB of `yes | head -c 104857600` on stdout, the same way, versus
#     `... | cat > /dev/null` inside the guest.
#   - how long after being printed a line is on `kiln-host run --stream`
#     (the guest's clock is set by the host at SETUP; a line printed 0.5 s
#     into a task that then sleeps).
# Environment: RUNS (default 5), LINES (default 200000; also LINES_BIG,
# default 0 = skip, e.g. 1000000), IMAGE_DIR (another build's image, e.g. an
# older kiln-init, for a before/after in the same session).
set -euo pipefail
cd "$(dirname "$0")/.."
export KILN_RUN_DIR=${KILN_RUN_DIR:-$(mktemp -d /tmp/kiln-bench-out.XXXXXX)}
exec /usr/bin/python3 - "${RUNS:-5}" "${LINES:-200000}" "${LINES_BIG:-0}" "${IMAGE_DIR:-build/image}" <<'EOF'
import json, os, statistics, subprocess, sys, tempfile, time

runs, lines, lines_big, image = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
HOST = ["build/kiln-host", "run", "--image-dir", image]
LIM = {"timeout_s": 600, "output_mib": 128, "memory_mib": 512}

def spec(language, code, **kw):
    s = {"language": language, "code": code, "limits": LIM, "env": {"PYTHONUNBUFFERED": "1"}}
    s.update(kw)
    return s

def run(s, stream=False):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(s, f)
    t0 = time.monotonic()
    try:
        p = subprocess.run(HOST + ["--spec", f.name] + (["--stream"] if stream else []),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    finally:
        os.unlink(f.name)
    wall = time.monotonic() - t0
    out = p.stdout.decode(errors="replace")
    last = out.strip().splitlines()[-1] if out.strip() else "{}"
    try:
        res = json.loads(last)
    except ValueError:
        res = {}
    if res.get("state") != "succeeded":
        sys.exit("task failed: %s %s" % (last[:400], p.stderr.decode()[-400:]))
    return wall, res

LOOP = "import sys\nfor i in range(%d): print('%%040d' %% i)\n"
# The loop timed inside the guest, its stdout the task's (TIMED) or a pipe
# into cat (CAT); the time goes to stderr.
TIMED = ("import sys, time\ns = time.perf_counter()\nfor i in range(%d): print('%%040d' %% i)\n"
         "print(time.perf_counter() - s, file=sys.stderr)\n")
CAT = "PYTHONUNBUFFERED=1 python3 -c \"$(cat <<'PY'\n" + TIMED + "PY\n)\" | cat > /dev/null\n"
IN_GUEST = """import os, sys, threading, time
r, w = os.pipe()
got = [0]
def reader():
    while True:
        b = os.read(r, 65536)
        if not b: return
        got[0] += len(b)
t = threading.Thread(target=reader); t.start()
import io
out = io.TextIOWrapper(io.FileIO(w, "w"), write_through=True)  # sys.stdout under PYTHONUNBUFFERED
s = time.perf_counter()
for i in range(%d): print('%%040d' %% i, file=out)
out.close(); t.join()
print(time.perf_counter() - s, got[0])
"""
BULK = "yes | head -c 104857600"
BULK_GUEST = "s=$(date +%s%N); yes | head -c 104857600 | cat > /dev/null; e=$(date +%s%N); echo $(( (e - s) / 1000 ))"
LIVE = "import time\ntime.sleep(0.5)\nprint(repr(time.time()))\ntime.sleep(3)\n"

def med(v):
    return statistics.median(v)

def live_latency():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec("python", LIVE), f)
    p = subprocess.Popen(HOST + ["--spec", f.name, "--stream"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    lat = None
    for raw in p.stdout:
        now = time.time()
        try:
            ev = json.loads(raw)
        except ValueError:
            continue
        if ev.get("stream") == "stdout" and lat is None:
            lat = now - float(ev["data"].strip())
    p.wait()
    os.unlink(f.name)
    return lat

print("task output (%s, %d runs, medians; one VM at a time)" % (image, runs))
run(spec("python", "print(1)"))  # the snapshot exists, the cache is warm
figs = {k: [] for k in ("timed", "cat", "base", "lines", "guest", "big", "guest_big", "bulk", "bulk_guest", "live")}
for _ in range(runs):
    figs["base"].append(run(spec("python", "print(1)"))[0])
    w, res = run(spec("python", LOOP % lines))
    figs["lines"].append(w)
    w, res = run(spec("python", IN_GUEST % lines))
    figs["guest"].append(float(res["stdout"].split()[0]))
    w, res = run(spec("python", TIMED % lines))
    figs["timed"].append(float(res["stderr"].split()[-1]))
    w, res = run(spec("sh", CAT % lines))
    figs["cat"].append(float(res["stderr"].split()[-1]))
    if lines_big:
        figs["big"].append(run(spec("python", LOOP % lines_big))[0])
        w, res = run(spec("python", IN_GUEST % lines_big))
        figs["guest_big"].append(float(res["stdout"].split()[0]))
    figs["bulk"].append(run(spec("sh", BULK))[0])
    w, res = run(spec("sh", BULK_GUEST))
    figs["bulk_guest"].append(int(res["stdout"].strip()) / 1e6)
    figs["live"].append(live_latency())

base = med(figs["base"])
def report(name, n, key, gkey):
    t = med(figs[key]) - base
    g = med(figs[gkey])
    print("  %-36s task %7.2f s (run %6.2f s - print(1) run %5.2f s)  in-guest pipe %6.2f s  ratio %5.1fx"
          % (name, t, med(figs[key]), base, g, t / g))
report("%d unbuffered python lines" % lines, lines, "lines", "guest")
print("  %-36s loop timed in the task %6.2f s  into a pipe to cat in the guest %6.2f s  ratio %5.1fx"
      % ("%d unbuffered python lines" % lines, med(figs["timed"]), med(figs["cat"]), med(figs["timed"]) / med(figs["cat"])))
if lines_big:
    report("%d unbuffered python lines" % lines_big, lines_big, "big", "guest_big")
t = med(figs["bulk"]) - base
g = med(figs["bulk_guest"])
print("  %-36s task %7.2f s (%5.1f MiB/s)  in-guest pipe %6.2f s (%5.1f MiB/s)  ratio %5.1fx"
      % ("100 MiB of yes on stdout", t, 100 / t, g, 100 / g, t / g))
lv = [x for x in figs["live"] if x is not None]
if lv:
    print("  %-36s median %6.1f ms  max %6.1f ms  (%d runs; guest clock set by the host)"
          % ("printed line to --stream", med(lv) * 1000, max(lv) * 1000, len(lv)))
EOF
