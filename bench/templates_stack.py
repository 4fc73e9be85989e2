#!/usr/bin/env python3
"""Templates through the whole stack: figures, not pass/fail.

Starts a local S3 (scripts/s3-local.sh), kiln-api and kiln-host h1 (pools as
given below), then measures, each from POST on kiln-api to the task final
with its outputs in S3:
  - print(1) on python-data against default, interleaved, one client with a
    second between tasks: both restored from their snapshots (no pools),
    then both from warm pools of one VM each; p50/p95 and the ratio
    python-data/default (target within 1.2x);
  - `import pandas` on python-data (its pre-started interpreter preloaded
    it);
  - template builds through kiln-api: a recipe (files and a run step, no
    packages: no mirror needed) and an OCI archive (busybox, made here with
    umoci), from POST to ready;
  - the first task on the new recipe template (its snapshot made on first
    use) against the next ones;
  - a host that lacks the template: h2 (an empty cache) is started, h1
    stopped, and the first task on the template (fetch from S3, SHA-256,
    snapshot, run) is timed against the next ones.
Usage: bench/templates_stack.py [RUNS]
"""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
FINAL = ("succeeded", "failed", "timed_out", "cancelled", "error")


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round((len(v) - 1) * p / 100)))]


class Api:
    def __init__(self, port, key):
        self.port, self.key = port, key

    def call(self, method, path, body=None, ctype="application/json", timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Authorization": "Bearer " + self.key, "Content-Type": ctype}
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body)
        c.request(method, path, body, h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, json.loads(data) if data else None


def run_task(api, spec):
    """POST spec, long-poll to final; (ms, task)."""
    t0 = time.monotonic()
    st, t = api.call("POST", "/v1/tasks", spec)
    if st != 202:
        raise SystemExit("POST /v1/tasks: %d %s" % (st, t))
    while t["state"] not in FINAL:
        st, t = api.call("GET", "/v1/tasks/%s?wait=60" % t["id"])
    ms = (time.monotonic() - t0) * 1000
    if t["state"] != "succeeded":
        raise SystemExit("task %s: %s" % (t["state"], json.dumps(t)[:600]))
    return ms, t


def wait_template(api, name, timeout=1800):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        st, t = api.call("GET", "/v1/templates/" + name)
        if t and t.get("state") in ("ready", "failed"):
            if t["state"] != "ready":
                raise SystemExit("template %s failed: %s" % (name, t.get("error")))
            return time.monotonic() - t0, t
        time.sleep(0.2)
    raise SystemExit("template %s: not ready after %d s" % (name, timeout))


def start_host(work, n, api_port, token, s3, extra):
    conf = {"listen": "127.0.0.1:%d" % (api_port + n), "host_id": "h%d" % n, "api": "http://127.0.0.1:%d" % api_port,
            "token": token, "spool_dir": "%s/spool%d" % (work, n), "run_dir": "%s/run%d" % (work, n),
            "cache": "%s/cache%d" % (work, n), "heartbeat_ms": 500, "s3": s3}
    conf.update(extra)
    os.makedirs(conf["cache"], exist_ok=True)
    if n == 1 and not os.path.lexists(conf["cache"] + "/snapshots"):  # h1 shares the machine's snapshots; h2 starts empty
        os.symlink(os.environ.get("KILN_CACHE", "/var/cache/kiln") + "/snapshots", conf["cache"] + "/snapshots")
    path = "%s/host%d.json" % (work, n)
    json.dump(conf, open(path, "w"))
    return subprocess.Popen([ROOT + "/build/kiln-host", "serve", "--config", path], stdout=subprocess.DEVNULL,
                            stderr=open("%s/host%d.log" % (work, n), "w"))


def live_hosts(admin):
    st, h = admin.call("GET", "/v1/admin/hosts")
    hosts = h.get("hosts", h) if isinstance(h, dict) else h
    return {x["id"]: x for x in hosts if x.get("state") == "live"}


def wait_hosts(admin, want, pools=()):
    for _ in range(3000):
        live = live_hosts(admin)
        if set(want) <= set(live) and all(
                any(t.get("name") == p and t.get("ready", 0) >= 1 for t in live[h]["capacity"].get("templates", []))
                for h in want for p in pools):
            return
        time.sleep(0.2)
    raise SystemExit("hosts %s not ready" % want)


def oci_archive(work):
    src = work + "/oci"
    os.makedirs(src + "/src/bin")
    shutil.copy(shutil.which("busybox"), src + "/src/bin/busybox")
    for a in ("sh", "echo", "cat"):
        os.symlink("busybox", src + "/src/bin/" + a)
    cmds = ["umoci init --layout img", "umoci new --image img:latest",
            "umoci unpack --rootless --image img:latest bundle", "cp -a src/. bundle/rootfs/",
            "umoci repack --image img:latest bundle", "tar -C img -cf oci.tar ."]
    for c in cmds:
        subprocess.run(c, shell=True, cwd=src, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return open(src + "/oci.tar", "rb").read()


def interleaved(api, specs, runs, gap):
    got = {k: [] for k in specs}
    for _ in range(runs):
        for k, spec in specs.items():
            time.sleep(gap)
            got[k].append(run_task(api, spec)[0])
    return got


def report(label, got, a, b):
    print("  %s: %s; ratio %s/%s p50 %.2fx" % (
        label, "; ".join("%s p50 %.0f ms p95 %.0f ms" % (k, pct(v, 50), pct(v, 95)) for k, v in got.items()), b, a,
        pct(got[b], 50) / pct(got[a], 50)))


def main():
    if not os.path.exists(ROOT + "/build/image/rootfs-python-data.ext4"):
        print("templates (whole stack): build/image/rootfs-python-data.ext4 missing (make image); skipped")
        return
    work = tempfile.mkdtemp(prefix="kiln-bench-tstack.")
    procs = []
    s3dir = work + "/s3"
    try:
        env = subprocess.run([ROOT + "/scripts/s3-local.sh", "start", s3dir], check=True, capture_output=True,
                             text=True).stdout
        e = dict(l.split("=", 1) for l in env.split() if "=" in l)
        s3 = {"endpoint": e["S3_ENDPOINT"], "region": "us-east-1", "bucket": "kiln-bench-templates",
              "access_key": e["S3_ACCESS_KEY"], "secret_key": e["S3_SECRET_KEY"]}
        port = 31000 + os.getpid() % 8000
        token, admin_key = "bench-token-%d" % os.getpid(), "bench-admin-%d" % os.getpid()
        json.dump({"listen": "127.0.0.1:%d" % port, "db": work + "/api.db", "admin_key": admin_key,
                   "cluster_token": token, "host_lost_after_s": 3, "s3": s3}, open(work + "/api.json", "w"))
        procs.append(subprocess.Popen([ROOT + "/build/kiln-api", "--config", work + "/api.json"],
                                      stdout=subprocess.DEVNULL, stderr=open(work + "/api.log", "w")))
        admin = Api(port, admin_key)
        for _ in range(100):
            try:
                admin.call("GET", "/healthz")
                break
            except OSError:
                time.sleep(0.1)
        admin.call("POST", "/v1/admin/customers", {"id": "bench", "name": "bench",
                                                   "quotas": {"submit_rate": 0, "max_queued": 0, "max_running": 0}})
        api = Api(port, admin.call("POST", "/v1/admin/customers/bench/keys")[1]["key"])
        print("== templates through the whole stack (kiln-api + kiln-host + local S3), %d cores, %d runs" %
              (os.cpu_count(), RUNS))

        # 1. Restored from snapshots: no pools at all.
        h1 = start_host(work, 1, port, token, s3, {"pool": {"size": 0, "prestart": 0}})
        procs.append(h1)
        wait_hosts(admin, ["h1"])
        p1 = {"language": "python", "code": "print(1)"}
        specs = {"default": p1, "python-data": dict(p1, template="python-data")}
        for s in specs.values():
            run_task(api, s)  # snapshots made, caches warm
        report("print(1) restored from snapshots (no pools)", interleaved(api, specs, RUNS, 0.5), "default",
               "python-data")
        h1.send_signal(signal.SIGTERM)
        h1.wait()
        procs.remove(h1)

        # 2. Warm pools of one VM each.
        h1 = start_host(work, 1, port, token, s3, {"pool": {"size": 1, "prestart": 1},
                                                   "templates": {"pools": {"python-data": 1}}})
        procs.append(h1)
        wait_hosts(admin, ["h1"], pools=("default", "python-data"))
        report("print(1) from warm pools (1 s between tasks)", interleaved(api, specs, RUNS, 1.0), "default",
               "python-data")
        imp = {"language": "python", "template": "python-data",
               "code": "import time; t = time.perf_counter(); import pandas; print(time.perf_counter() - t)"}
        v, inside = [], []
        for _ in range(RUNS):
            time.sleep(1.0)
            ms, t = run_task(api, imp)
            v.append(ms)
            inside.append(float(t["result"]["stdout"]) * 1000)
        print("  import pandas on python-data (preloaded): whole task p50 %.0f ms, the import itself p50 %.2f ms" %
              (pct(v, 50), pct(inside, 50)))

        # 3. Builds.
        recipe = {"name": "bench-recipe", "files": [{"path": "/etc/bench", "content_b64": "YmVuY2gK"}],
                  "run": ["echo built > /opt/marker"]}
        t0 = time.monotonic()
        st, _ = api.call("POST", "/v1/templates", recipe)
        if st != 202:
            raise SystemExit("POST /v1/templates: %d" % st)
        secs, tpl = wait_template(api, "bench-recipe")
        print("  recipe build (a file and a run step, no packages), POST to ready: %.1f s (image %d MiB)" %
              (time.monotonic() - t0, tpl["size"] >> 20))
        arc = oci_archive(work)
        t0 = time.monotonic()
        st, _ = api.call("POST", "/v1/templates?name=bench-oci", arc, ctype="application/x-tar")
        if st != 202:
            raise SystemExit("POST /v1/templates?name=: %d" % st)
        wait_template(api, "bench-oci")
        print("  OCI import (busybox, %d KiB archive), POST to ready: %.1f s" % (len(arc) >> 10, time.monotonic() - t0))
        rs = {"language": "sh", "code": "cat /opt/marker", "template": "bench-recipe"}
        first = run_task(api, rs)[0]
        nxt = [run_task(api, rs)[0] for _ in range(RUNS)]
        print("  first task on the new recipe template (its snapshot made): %.0f ms; next ones p50 %.0f ms" %
              (first, pct(nxt, 50)))

        # 4. A host that lacks it: h2 with an empty cache, h1 stopped.
        h2 = start_host(work, 2, port, token, s3, {"pool": {"size": 0, "prestart": 0}})
        procs.append(h2)
        wait_hosts(admin, ["h2"])
        h1.send_signal(signal.SIGTERM)
        h1.wait()
        procs.remove(h1)
        for _ in range(200):
            if "h1" not in live_hosts(admin):
                break
            time.sleep(0.1)
        first, t = run_task(api, rs)
        nxt = [run_task(api, rs)[0] for _ in range(RUNS)]
        print("  on a host without it (fetch %d MiB from S3, SHA-256, snapshot, run): first task %.0f ms on %s; "
              "next ones p50 %.0f ms" % (tpl["size"] >> 20, first, t.get("host"), pct(nxt, 50)))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
        subprocess.run([ROOT + "/scripts/s3-local.sh", "stop", s3dir], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
