#!/usr/bin/env python3
"""The whole stack end to end: figures, not pass/fail.

Starts `kiln up` (local S3, kiln-api, one kiln-host with a warm pool) in a
temporary directory, then measures print(1) from POST /v1/tasks on kiln-api
to the task being final with its outputs in S3 (API -> scheduler -> host pool
-> S3 -> result), read back with a long-poll GET ?wait=, over one keep-alive
connection per client:
  - one client at a time (pool VM ready): p50/p95/p99;
  - one client submitting back to back (B tasks, default 40): p50/p95/p99,
    where the VMs came from (pool or restore), and the pool's target and
    misses afterwards (kiln-host's GET /v1/capacity, an adaptive pool);
    then the same burst again KILN_BENCH_BURST_GAP_S later (default 10: does
    the pool, grown by the first burst's misses, meet the second?);
  - a steady stream: one client starting a task every KILN_BENCH_STREAM_MS
    (default 350; 0 skips it), as many tasks as back to back, after 10 s for
    the pool to refill: pool hits over all of it and over its second half
    (do refills keep up?), p50;
  - C concurrent clients (default 8): p50/p95/p99 and tasks/s.
Usage: bench/stack.py [TASKS] [CONCURRENCY] [BACK_TO_BACK]
KILN_ROOT: another checkout's build to measure (a before/after in one session).
"""
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.environ.get("KILN_ROOT") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = int(sys.argv[1]) if len(sys.argv) > 1 else 80
CONC = int(sys.argv[2]) if len(sys.argv) > 2 else 8
B2B = int(sys.argv[3]) if len(sys.argv) > 3 else 40
STREAM_MS = int(os.environ.get("KILN_BENCH_STREAM_MS", "350"))
BURST_GAP_S = float(os.environ.get("KILN_BENCH_BURST_GAP_S", "10"))


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round((len(v) - 1) * p / 100)))]


class Api:
    """A keep-alive client: one connection per thread, reopened if the
    server closed it."""

    def __init__(self, url, key):
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.key = u.hostname, u.port, key
        self.local = threading.local()

    def call(self, method, path, body=None, timeout=90):
        h = {"Authorization": "Bearer " + self.key, "Content-Type": "application/json"}
        for attempt in (0, 1):
            c = getattr(self.local, "conn", None)
            if c is None:
                c = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            try:
                c.request(method, path, json.dumps(body) if body is not None else None, h)
                r = c.getresponse()
                data = r.read()
            except (http.client.HTTPException, OSError):
                c.close()
                self.local.conn = None
                if attempt:
                    raise
                continue
            if r.getheader("Connection", "").lower() == "close":
                c.close()
                self.local.conn = None
            return r.status, json.loads(data) if data else None


FINAL = ("succeeded", "failed", "timed_out", "cancelled", "error")


def one(api, code):
    t0 = time.monotonic()
    st, t = api.call("POST", "/v1/tasks", {"language": "python", "code": code})
    while st == 429:
        time.sleep(0.05)
        st, t = api.call("POST", "/v1/tasks", {"language": "python", "code": code})
    if st != 202:
        raise SystemExit("POST: %d %s" % (st, t))
    tid = t["id"]
    while t["state"] not in FINAL:
        st, t = api.call("GET", "/v1/tasks/%s?wait=60" % tid)
    return (time.monotonic() - t0) * 1000, t


def split(t, ms, parts):
    """The task's own timings (queued, start, run, upload, total: kiln-api's
    clock), the VM's (vm.*: kiln-host's), and answer: what the client saw
    beyond kiln-api's total (HTTP, the long-poll's wake-up)."""
    for k, v in (t.get("timings") or {}).items():
        if isinstance(v, (int, float)):
            parts.setdefault(k, []).append(v)
    for k, v in ((t.get("result") or {}).get("timings") or {}).items():
        if isinstance(v, (int, float)):
            parts.setdefault("vm." + k, []).append(v)
    tot = (t.get("timings") or {}).get("total_ms")
    if isinstance(tot, (int, float)):
        parts.setdefault("answer_ms", []).append(ms - tot)


def split_text(parts):
    order = ["queued_ms", "start_ms", "run_ms", "upload_ms", "answer_ms", "total_ms"]
    keys = [k for k in order if k in parts] + sorted(k for k in parts if k not in order)
    return ", ".join("%s %.0f" % (k, pct(parts[k], 50)) for k in keys)


def burst(api, code):
    """B2B tasks back to back: their times, where their VMs came from (counts),
    their split, and their times by where the VM came from."""
    lat, where, parts, by_start = [], {}, {}, {}
    for _ in range(B2B):
        ms, t = one(api, code)
        lat.append(ms)
        s = (t.get("result") or {}).get("timings", {}).get("start", "?")
        where[s] = where.get(s, 0) + 1
        by_start.setdefault(s, []).append(ms)
        split(t, ms, parts)
    return lat, where, parts, by_start


def host_pool(work):
    """kiln-host's pool figures (GET /v1/capacity), {} if it cannot say."""
    try:
        with open(work + "/host.json") as f:
            hc = json.load(f)
        hh, hp = hc["listen"].rsplit(":", 1)
        c = http.client.HTTPConnection(hh, int(hp), timeout=10)
        c.request("GET", "/v1/capacity", headers={"Authorization": "Bearer " + hc["token"]})
        return json.loads(c.getresponse().read()).get("pool", {})
    except (OSError, ValueError, KeyError):
        return {}


def main():
    work = tempfile.mkdtemp(prefix="kiln-bench-stack.")
    up = subprocess.Popen([ROOT + "/build/kiln", "up", "--dir", work, "--port", str(30000 + os.getpid() % 10000)],
                          stdout=subprocess.DEVNULL, stderr=open(work + "/up.log", "w"))
    try:
        creds = work + "/credentials"
        deadline = time.monotonic() + 900
        while not os.path.exists(creds):
            if up.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("kiln up did not get ready: see " + work + "/up.log")
            time.sleep(0.2)
        env = dict(l.strip().split("=", 1) for l in open(creds) if "=" in l)
        env = {k: v.strip("'\"") for k, v in env.items()}
        api = Api(env["KILN_API"], env["KILN_KEY"])
        admin = Api(env["KILN_API"], env["KILN_ADMIN_KEY"])
        admin.call("PUT", "/v1/admin/customers/default/quotas",
                   {"submit_rate": 0, "max_queued": 0, "max_running": 0})
        # print(1) alone: its logs travel inside the manifest, one PUT
        # (upload.inline_max); with an output file: that object, then the
        # manifest, two PUTs in a row.
        code = 'print(1)'
        code_out = 'open("/output/r.txt", "w").write("1")\nprint(1)'
        one(api, code_out)  # warm-up
        print("== the whole stack (kiln up: kiln-api + scheduler + one kiln-host with a warm pool + local S3), %d cores" %
              os.cpu_count())
        for label, c in (("print(1)", code), ("print(1) + a 1-byte output file", code_out)):
            single, where, parts = [], {}, {}
            for _ in range(15):
                time.sleep(1.0)  # let the pool refill: the unloaded path
                ms, t = one(api, c)
                single.append(ms)
                s = (t.get("result") or {}).get("timings", {}).get("start", "?")
                where[s] = where.get(s, 0) + 1
                split(t, ms, parts)
            print("  %s, one client, POST -> succeeded, all in S3: p50 %.0f ms  p95 %.0f ms  p99 %.0f ms (VM from %s)"
                  % (label, pct(single, 50), pct(single, 95), pct(single, 99), where))
            print("    where the time goes (medians, ms): " + split_text(parts))
        time.sleep(1.0)
        b2b, where, bparts, by_start = burst(api, code)
        pool = host_pool(work)
        print("  print(1), one client back to back, %d tasks: p50 %.0f ms  p95 %.0f ms  p99 %.0f ms (VM from %s; pool "
              "target %s, max %s, misses %s, refill %s ms)" % (len(b2b), pct(b2b, 50), pct(b2b, 95), pct(b2b, 99), where,
              pool.get("target", "?"), pool.get("max", "?"), pool.get("misses", "?"), pool.get("refill_ms", "?")))
        print("    where the time goes (medians, ms): " + split_text(bparts))
        # Pool hits and misses are two populations: when about half the tasks
        # miss, the overall p50 flips between them from one run to the next.
        print("    by where the VM came from: " + ", ".join(
            "%s %d tasks p50 %.0f ms" % (k, len(v), pct(v, 50)) for k, v in sorted(by_start.items())))
        # The same burst again once refills had time to follow the pool's
        # target, which the first burst's misses raised.
        time.sleep(BURST_GAP_S)
        b2, where2, _, _ = burst(api, code)
        pool = host_pool(work)
        print("  the same again %.0f s later: p50 %.0f ms  p95 %.0f ms (VM from %s; pool target %s, misses in all %s)" %
              (BURST_GAP_S, pct(b2, 50), pct(b2, 95), where2, pool.get("target", "?"), pool.get("misses", "?")))
        if STREAM_MS > 0:
            time.sleep(10.0)
            st, starts = [], []
            t_next = time.monotonic()
            for _ in range(B2B):
                delay = t_next - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                t_next = max(t_next + STREAM_MS / 1000.0, time.monotonic())
                ms, t = one(api, code)
                st.append(ms)
                starts.append((t.get("result") or {}).get("timings", {}).get("start", "?"))
            pool = host_pool(work)
            half = starts[len(starts) // 2:]
            print("  print(1), a steady stream of one task every %d ms, %d tasks: p50 %.0f ms  p95 %.0f ms; pool hits %d "
                  "(second half: %d of %d); pool target %s, refill %s ms, %s refill threads" %
                  (STREAM_MS, len(st), pct(st, 50), pct(st, 95), starts.count("pool"), half.count("pool"), len(half),
                   pool.get("target", "?"), pool.get("refill_ms", "?"), pool.get("refills", "?")))
        lat, lock, todo = [], threading.Lock(), list(range(TASKS))

        def client():
            while True:
                with lock:
                    if not todo:
                        return
                    todo.pop()
                ms, t = one(api, code)
                with lock:
                    lat.append(ms)

        t0 = time.monotonic()
        th = [threading.Thread(target=client) for _ in range(CONC)]
        for x in th:
            x.start()
        for x in th:
            x.join()
        wall = time.monotonic() - t0
        print("  print(1), %d concurrent clients, %d tasks: p50 %.0f ms  p95 %.0f ms  p99 %.0f ms; %.2f tasks/s" %
              (CONC, len(lat), pct(lat, 50), pct(lat, 95), pct(lat, 99), len(lat) / wall))
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait()
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
