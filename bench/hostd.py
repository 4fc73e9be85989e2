#!/usr/bin/env python3
"""kiln-host serve under load: figures, not pass/fail.

Starts a local S3 (scripts/s3-local.sh) and `kiln-host serve` with a warm
pool, then measures:
  - sustained throughput of trivial tasks (print(1), one small output file)
    submitted by C concurrent clients, each task followed from POST to
    `succeeded` (outputs confirmed by S3) over its event stream;
  - p50/p95 of that POST-to-succeeded latency, and the host's own split
    (start/run/upload);
  - RSS of an idle (paused, warm) pool VM's QEMU process;
  - upload throughput of a 200 MiB output to the local S3 (the task's
    upload_ms for that file).
Usage: bench/hostd.py [TASKS] [CONCURRENCY] [POOL]
"""
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = int(sys.argv[1]) if len(sys.argv) > 1 else 60
CONC = int(sys.argv[2]) if len(sys.argv) > 2 else 4
POOL = int(sys.argv[3]) if len(sys.argv) > 3 else 4
TOKEN = "bench-%d" % random.randrange(1 << 30)
PORT = 30000 + random.randrange(10000)


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round((len(v) - 1) * p / 100)))]


def req(method, path, body=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    h = {"Authorization": "Bearer " + TOKEN}
    if body is not None:
        body = json.dumps(body)
        h["Content-Type"] = "application/json"
    c.request(method, path, body, h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def follow(task_id, timeout=300):
    """Read the task's event stream until its final state; return it."""
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    c.request("GET", "/v1/tasks/%s/events" % task_id, headers={"Authorization": "Bearer " + TOKEN})
    r = c.getresponse()
    ev, final = None, None
    while final is None:
        line = r.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        if line.startswith("event: "):
            ev = line[7:]
        elif line.startswith("data: ") and ev == "state":
            st = json.loads(line[6:])["state"]
            if st in ("succeeded", "failed", "timed_out", "cancelled", "error"):
                final = st
    c.close()
    return final


def run_one(i, code, results, lock):
    tid = "b%d-%d" % (PORT, i)
    spec = {"language": "python", "code": code}
    t0 = time.monotonic()
    st, body = req("POST", "/v1/tasks", {"id": tid, "customer": "bench", "spec": spec})
    if st == 503:  # over capacity: back off briefly and retry, as a scheduler would
        with lock:
            results["refused"] += 1
        time.sleep(0.05)
        return run_one(i, code, results, lock)
    if st != 202:
        raise SystemExit("POST %s: %d %s" % (tid, st, body[:300]))
    final = follow(tid)
    dt = time.monotonic() - t0
    _, body = req("GET", "/v1/tasks/" + tid)
    t = json.loads(body)
    with lock:
        results["lat"].append(dt * 1000)
        results["states"][final] = results["states"].get(final, 0) + 1
        tm = t["timings"]
        for k in ("start_ms", "run_ms", "upload_ms"):
            if tm.get(k) is not None:
                results[k].append(tm[k])
        results["start"][t["result"]["timings"]["start"]] = results["start"].get(t["result"]["timings"]["start"], 0) + 1


def main():
    work = tempfile.mkdtemp(prefix="kiln-bench-hostd.")
    s3dir = os.path.join(work, "s3")
    env = dict(os.environ)
    out = subprocess.run([ROOT + "/scripts/s3-local.sh", "start", s3dir], check=True, capture_output=True, text=True)
    s3 = dict(l.split("=", 1) for l in out.stdout.split())
    cfg = {
        "listen": "127.0.0.1:%d" % PORT, "host_id": "bench", "token": TOKEN,
        "spool_dir": work + "/spool", "run_dir": work + "/run",
        "pool": {"size": POOL, "prestart": 1},
        "s3": {"endpoint": s3["S3_ENDPOINT"], "bucket": "kiln-bench", "access_key": s3["S3_ACCESS_KEY"],
               "secret_key": s3["S3_SECRET_KEY"]},
        "upload": {"workers": 4},
    }
    with open(work + "/host.json", "w") as f:
        json.dump(cfg, f)
    log = open(work + "/host.log", "w")
    host = subprocess.Popen([ROOT + "/build/kiln-host", "serve", "--config", work + "/host.json"], stderr=log, env=env)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                st, body = req("GET", "/v1/capacity", timeout=2)
                if st == 200 and json.loads(body)["pool"]["ready"] >= POOL:
                    break
            except OSError:
                pass
            if host.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("kiln-host did not start: see " + work + "/host.log")
            time.sleep(0.1)
        # Idle pool VMs: paused, warmed QEMUs.
        pids = subprocess.run(["pgrep", "-f", "qemu-system-x86_64.*" + work + "/run"], capture_output=True,
                              text=True).stdout.split()
        rss, pss = [], []
        for p in pids:
            try:
                for l in open("/proc/%s/smaps_rollup" % p):
                    if l.startswith("Rss:"):
                        r = int(l.split()[1]) / 1024
                    elif l.startswith("Pss:"):
                        s_ = int(l.split()[1]) / 1024
                if r > 40:  # a warm pool VM, not a pre-started empty QEMU
                    rss.append(r)
                    pss.append(s_)
            except OSError:
                pass
        print("== kiln-host serve: %d cores, pool %d, %d trivial tasks by %d concurrent clients" %
              (os.cpu_count(), POOL, TASKS, CONC))
        if rss:
            print("  idle warm pool VM (paused) QEMU: RSS median %.1f MiB, PSS median %.1f MiB (%d VMs; RSS counts the"
                  " snapshot RAM pages they share)" % (statistics.median(rss), statistics.median(pss), len(rss)))

        code = 'open("/output/r.txt", "w").write("1")\nprint(1)'
        results = {"lat": [], "states": {}, "start_ms": [], "run_ms": [], "upload_ms": [], "start": {}, "refused": 0}
        lock = threading.Lock()
        # Warm-up: one task through every path once.
        run_one(-1, code, {"lat": [], "states": {}, "start_ms": [], "run_ms": [], "upload_ms": [], "start": {},
                           "refused": 0}, lock)
        todo = list(range(TASKS))
        qlock = threading.Lock()

        def client():
            while True:
                with qlock:
                    if not todo:
                        return
                    i = todo.pop()
                run_one(i, code, results, lock)

        t0 = time.monotonic()
        th = [threading.Thread(target=client) for _ in range(CONC)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.monotonic() - t0
        lat = results["lat"]
        print("  throughput: %.2f tasks/s sustained (%d tasks in %.1f s; states %s; VM from %s; 503 retries %d)" %
              (len(lat) / wall, len(lat), wall, results["states"], results["start"], results["refused"]))
        print("  POST -> succeeded (outputs in S3): p50 %.0f ms  p95 %.0f ms" % (pct(lat, 50), pct(lat, 95)))
        for k in ("start_ms", "run_ms", "upload_ms"):
            v = results[k]
            if v:
                print("    host %-9s p50 %5.0f ms  p95 %5.0f ms" % (k, pct(v, 50), pct(v, 95)))

        # One task alone, from the pool, for the unloaded latency.
        single = {"lat": [], "states": {}, "start_ms": [], "run_ms": [], "upload_ms": [], "start": {}, "refused": 0}
        for i in range(10):
            while True:
                st, body = req("GET", "/v1/capacity", timeout=2)
                if json.loads(body)["pool"]["ready"] >= 1:
                    break
                time.sleep(0.05)
            run_one(100000 + i, code, single, lock)
        print("  one at a time (pool VM ready): POST -> succeeded p50 %.0f ms  p95 %.0f ms (start %s)" %
              (pct(single["lat"], 50), pct(single["lat"], 95), single["start"]))

        # Upload throughput: a 200 MiB output.
        big = ('import os\nb = os.urandom(1 << 20)\nwith open("/output/big.bin", "wb") as f:\n'
               '    for i in range(200): f.write(i.to_bytes(4, "little") + b[4:])\n')
        tid = "big-%d" % PORT
        st, body = req("POST", "/v1/tasks", {"id": tid, "customer": "bench", "spec": {
            "language": "python", "code": big, "limits": {"output_mib": 300, "timeout_s": 600}}})
        follow(tid, timeout=900)
        _, body = req("GET", "/v1/tasks/" + tid)
        t = json.loads(body)
        up = t["timings"]["upload_ms"]
        print("  200 MiB output: collect %d ms (guest -> host spool), upload %d ms to the local S3 = %.0f MiB/s (multipart, 16 MiB parts)" %
              (t["result"]["timings"]["collect_ms"], up, 200 / (up / 1000.0)))
    finally:
        host.terminate()
        host.wait()
        subprocess.run([ROOT + "/scripts/s3-local.sh", "stop", s3dir], capture_output=True)
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
