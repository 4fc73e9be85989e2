#!/usr/bin/python3
"""Density (figures, not pass/fail): N idle sessions on one kiln-host.

Starts one kiln-host (no pool, no S3) and creates idle sessions of the
built-in template `default` (256 MiB, 1 vCPU) in steps. At each step:
  - host memory per sandbox: PSS of the sessions' QEMU processes
    (/proc/PID/smaps_rollup) summed / N, and kiln-host's own PSS / N;
  - host CPU while all are idle: the QEMUs' utime+stime over IDLE_S seconds,
    as % of one core (and kiln-host's own);
  - the time to create the step (CONC creates at a time);
  - exec latency of `true` on a random idle session, p50/p99 over EXECS.
Then, with KSM (if DENSITY_KSM=1 and /sys/kernel/mm/ksm is writable): the
same figures at the last step once ksmd has scanned everything twice, and
what ksmd cost. Everything started is destroyed at the end, on Ctrl-C and on
failure; KSM's settings are put back.

Environment: DENSITY_STEPS ("10 100 250 500 1000 2000": up to where memory runs out, see DENSITY_MIN_FREE_MIB), DENSITY_EXECS (20),
DENSITY_IDLE_S (5), DENSITY_CONC (2), DENSITY_BUDGET_S (600: no new step
starts after that), DENSITY_IDLE_STOP_MS (kiln-host's sessions.idle_stop_ms;
unset: its default, 0: idle sessions keep running), DENSITY_FIRST_EXEC (1:
each session runs `true` once right after its create, so that the exec
latency measured is an idle session's, not a new clone's first command,
which translates the exec path afresh: ~90 ms here), DENSITY_KSM (1), DENSITY_MIN_FREE_MIB (3072: no step that
would leave less MemAvailable, counting ~60 MiB per new session)."""
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = [int(x) for x in os.environ.get("DENSITY_STEPS", "10 100 250 500 1000 2000").split()]
EXECS = int(os.environ.get("DENSITY_EXECS", "20"))
IDLE_S = float(os.environ.get("DENSITY_IDLE_S", "5"))
CONC = int(os.environ.get("DENSITY_CONC", "2"))
BUDGET_S = float(os.environ.get("DENSITY_BUDGET_S", "600"))
KSM = os.environ.get("DENSITY_KSM", "1") == "1"
IDLE_STOP_MS = os.environ.get("DENSITY_IDLE_STOP_MS")
FIRST_EXEC = os.environ.get("DENSITY_FIRST_EXEC", "1") == "1"
MIN_FREE_MIB = int(os.environ.get("DENSITY_MIN_FREE_MIB", "3072"))
KSM_DIR = "/sys/kernel/mm/ksm"
TICK = os.sysconf("SC_CLK_TCK")
t0 = time.monotonic()

work = tempfile.mkdtemp(prefix="kiln-bench-density.")
run_dir = os.path.join(work, "run")
port = random.randint(30000, 39999)
token = "density-%d" % random.getrandbits(48)
host = None
sessions = []
ksm_saved = {}


def req(method, path, body=None, timeout=300, conn=None):
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    hdr = {"Authorization": "Bearer " + token}
    if body is not None:
        hdr["Content-Type"] = "application/json"
        body = json.dumps(body)
    c.request(method, path, body, hdr)
    r = c.getresponse()
    data = r.read()
    if conn is None:
        c.close()
    return r.status, data


def qemu_pids():
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = open("/proc/%s/cmdline" % p, "rb").read()
        except OSError:
            continue
        if b"qemu-system-x86_64" in cmd.split(b"\0")[0] and run_dir.encode() in cmd:
            out.append(int(p))
    return out


def pss_kib(pid):
    try:
        for l in open("/proc/%d/smaps_rollup" % pid):
            if l.startswith("Pss:"):
                return int(l.split()[1])
    except OSError:
        pass
    return 0


def rss_kib(pid):
    try:
        for l in open("/proc/%d/smaps_rollup" % pid):
            if l.startswith("Rss:"):
                return int(l.split()[1])
    except OSError:
        pass
    return 0


def cpu_ticks(pid):
    try:
        f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])  # utime, stime
    except (OSError, IndexError):
        return 0


def ksmd_pid():
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if open("/proc/%s/comm" % p).read().strip() == "ksmd":
                    return int(p)
            except OSError:
                pass
    return None


def mem_available_mib():
    for l in open("/proc/meminfo"):
        if l.startswith("MemAvailable:"):
            return int(l.split()[1]) // 1024
    return 0


def ksm_get(k):
    return open(os.path.join(KSM_DIR, k)).read().strip()


def ksm_set(k, v):
    with open(os.path.join(KSM_DIR, k), "w") as f:
        f.write(str(v))


def cleanup():
    global host
    for sid in list(sessions):
        try:
            req("DELETE", "/v1/sessions/" + sid, timeout=60)
        except Exception:
            pass
    if host is not None and host.poll() is None:
        host.terminate()
        try:
            host.wait(60)
        except subprocess.TimeoutExpired:
            host.kill()
            host.wait()
    host = None
    # Anything of ours still there (a kiln-host that died mid-way): by PID.
    for p in qemu_pids():
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    for k, v in ksm_saved.items():
        try:
            ksm_set(k, v)
        except OSError:
            pass
    subprocess.run(["umount", "-R", "-l", run_dir], stderr=subprocess.DEVNULL)
    shutil.rmtree(work, ignore_errors=True)


def on_signal(sig, _frame):
    raise KeyboardInterrupt("signal %d" % sig)


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int((len(v) - 1) * p / 100 + 0.5))] if v else float("nan")


def create(n_from, n_to):
    """Create sessions d<n_from>..d<n_to - 1>, CONC at a time; wall seconds."""
    todo = list(range(n_from, n_to))
    lock = threading.Lock()
    errors = []

    def worker():
        while True:
            with lock:
                if not todo or errors:
                    return
                i = todo.pop(0)
            sid = "d%d" % i
            try:
                st, body = req("POST", "/v1/sessions", {"id": sid, "customer": "bench", "spec": {}})
                if st == 201 and FIRST_EXEC:
                    est, ebody = req("POST", "/v1/sessions/%s/exec" % sid, {"argv": ["true"]})
                    if est != 200:
                        st, body = est, ebody
            except OSError as e:
                st, body = 0, str(e).encode()
            with lock:
                if st == 201:
                    sessions.append(sid)
                else:
                    errors.append("%s: %d %s" % (sid, st, body[:300]))

    t = time.monotonic()
    ths = [threading.Thread(target=worker) for _ in range(CONC)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    if errors:
        raise SystemExit("session create failed: " + errors[0])
    return time.monotonic() - t


def measure(label, extra_pids=()):
    pids = qemu_pids()
    n = len(sessions)
    pss = sum(pss_kib(p) for p in pids) / 1024
    rss = sum(rss_kib(p) for p in pids) / 1024
    hpss = pss_kib(host.pid) / 1024
    watch = pids + [host.pid] + list(extra_pids)
    a = {p: cpu_ticks(p) for p in watch}
    time.sleep(IDLE_S)
    b = {p: cpu_ticks(p) for p in watch}
    q_cpu = sum(b[p] - a[p] for p in pids) / TICK / IDLE_S * 100
    h_cpu = (b[host.pid] - a[host.pid]) / TICK / IDLE_S * 100
    x_cpu = sum(b[p] - a[p] for p in extra_pids) / TICK / IDLE_S * 100
    lat = []
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for _ in range(EXECS):
        sid = random.choice(sessions)
        t = time.monotonic()
        st, body = req("POST", "/v1/sessions/%s/exec" % sid, {"argv": ["true"]}, conn=c)
        lat.append((time.monotonic() - t) * 1000)
        if st != 200 or json.loads(body).get("exit_code") != 0:
            raise SystemExit("exec in %s: %d %s" % (sid, st, body[:300]))
    c.close()
    return {"label": label, "n": n, "qemus": len(pids), "pss": pss / max(n, 1), "rss": rss / max(n, 1),
            "hpss": hpss / max(n, 1), "qcpu": q_cpu, "hcpu": h_cpu, "xcpu": x_cpu,
            "p50": pct(lat, 50), "p99": pct(lat, 99)}


def row(m, create_s):
    print("  %-10s %5d %9.1f %9.1f %9.2f %9.1f %8.2f %8s %8.1f %8.1f" % (
        m["label"], m["n"], m["pss"], m["rss"], m["hpss"], m["qcpu"], m["hcpu"],
        "-" if create_s is None else "%.1f" % create_s, m["p50"], m["p99"]), flush=True)


def tcg_buffer_kib(pid):
    """Resident KiB of TCG's translation buffer (the executable anonymous mapping of tb-size)."""
    cur, tot = {}, 0
    try:
        for l in open("/proc/%d/smaps" % pid):
            f = l.split()
            if "-" in f[0] and len(f) >= 2:
                cur = {"perm": f[1], "file": len(f) >= 6}
            elif f[0] == "Rss:":
                cur["rss"] = int(f[1])
            elif f[0] == "VmFlags:":
                if "x" in cur.get("perm", "") and "w" in cur.get("perm", "") and not cur.get("file"):
                    tot += cur.get("rss", 0)
    except OSError:
        pass
    return tot


def ram_mapping(pid):
    """The guest RAM mapping (QEMU's largest): (size KiB, Rss KiB, Anonymous KiB, madvised MERGEABLE)."""
    best, cur = (0, 0, 0, False), {}
    try:
        for l in open("/proc/%d/smaps" % pid):
            f = l.split()
            if f[0] in ("Size:", "Rss:", "Anonymous:"):
                cur[f[0]] = int(f[1])
            elif f[0] == "VmFlags:":
                if cur.get("Size:", 0) > best[0]:
                    best = (cur["Size:"], cur.get("Rss:", 0), cur.get("Anonymous:", 0), "mg" in f[1:])
                cur = {}
    except OSError:
        pass
    return best


def main():
    global host
    signal.signal(signal.SIGTERM, on_signal)
    os.makedirs(run_dir)
    cfg = {"listen": "127.0.0.1:%d" % port, "host_id": "density", "token": token,
           "spool_dir": os.path.join(work, "spool"), "run_dir": run_dir,
           "capacity": {"vcpus": 4096, "cpu_overcommit": 1, "memory_mib": 1 << 30},
           "pool": {"size": 0, "prestart": 0}}
    if IDLE_STOP_MS is not None:
        cfg["sessions"] = {"idle_stop_ms": int(IDLE_STOP_MS)}
    with open(os.path.join(work, "host.json"), "w") as f:
        json.dump(cfg, f)
    log = open(os.path.join(work, "host.log"), "w")
    host = subprocess.Popen([os.path.join(ROOT, "build/kiln-host"), "serve", "--config",
                             os.path.join(work, "host.json")], stdout=log, stderr=log)
    deadline = time.monotonic() + 600
    while True:
        try:
            if req("GET", "/healthz", timeout=2)[0] == 200:
                break
        except OSError:
            pass
        if host.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("kiln-host did not start: " + open(os.path.join(work, "host.log")).read()[-600:])
        time.sleep(0.2)

    print("density: idle sessions of template default (256 MiB, 1 vCPU) on one kiln-host; %d cores, %d MiB RAM, "
          "TCG; %s s idle window, %d execs of `true` per step, %d creates at a time; idle stop %s; %s" % (
              os.cpu_count(), os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20, IDLE_S, EXECS, CONC,
              "kiln-host's default" if IDLE_STOP_MS is None else ("off" if IDLE_STOP_MS == "0" else IDLE_STOP_MS + " ms"),
              "one exec per session at create" if FIRST_EXEC else "no exec at create"))
    ksm_ok = KSM and os.access(os.path.join(KSM_DIR, "run"), os.W_OK)
    if ksm_ok:
        for k in ("run", "pages_to_scan", "sleep_millisecs"):
            ksm_saved[k] = ksm_get(k)
        ksm_set("run", 0)  # the KSM-off figures are without it, whatever the machine had
    print("  %-10s %5s %9s %9s %9s %9s %8s %8s %8s %8s" % (
        "", "N", "PSS MiB", "RSS MiB", "host PSS", "QEMU CPU", "host CPU", "create", "exec p50", "exec p99"))
    print("  %-10s %5s %9s %9s %9s %9s %8s %8s %8s %8s" % (
        "", "", "/sandbox", "/sandbox", "/sandbox", "% 1 core", "% core", "s", "ms", "ms"))
    last = None
    avail0 = mem_available_mib()
    for n in STEPS:
        have = len(sessions)
        if n <= have:
            continue
        if time.monotonic() - t0 > BUDGET_S:
            print("  (stopped before %d: the %d s budget is spent)" % (n, BUDGET_S))
            break
        # What a session has cost so far (60 MiB before the first step),
        # with a fifth more for margin: a step that would not fit is cut to
        # what does, and is the last.
        per = max(30.0, 1.2 * (avail0 - mem_available_mib()) / have) if have else 60.0
        fit = have + int((mem_available_mib() - MIN_FREE_MIB) / per)
        if fit < n:
            if fit <= have + max(1, have // 10):
                print("  (stopped before %d: MemAvailable %d MiB, ~%.0f MiB a session)" % (n, mem_available_mib(), per))
                break
            print("  (step %d cut to %d: MemAvailable %d MiB, ~%.0f MiB a session)" % (n, fit, mem_available_mib(), per))
            n = fit
        cs = create(have, n)
        time.sleep(2)  # the last ones settle (their first exec's aftermath)
        last = measure("ksm off", ())
        row(last, cs)
    if not sessions:
        return
    rams = [ram_mapping(p) for p in qemu_pids()]
    print("  guest RAM mapping per QEMU: %d MiB, resident %.1f MiB, of which private copies (anonymous, what KSM can "
          "merge) %.1f MiB; madvised MERGEABLE: %d of %d" % (
              rams[0][0] >> 10, sum(r[1] for r in rams) / len(rams) / 1024, sum(r[2] for r in rams) / len(rams) / 1024,
              sum(1 for r in rams if r[3]), len(rams)))
    tb = [tcg_buffer_kib(p) for p in qemu_pids()]
    print("  TCG translation buffer resident per QEMU: %.1f MiB (tb-size=64)" % (sum(tb) / len(tb) / 1024))
    if ksm_ok:
        kp = ksmd_pid()
        ksm_set("pages_to_scan", os.environ.get("DENSITY_KSM_PAGES", "4000"))
        ksm_set("sleep_millisecs", os.environ.get("DENSITY_KSM_SLEEP", "20"))
        full0 = int(ksm_get("full_scans"))
        k0, t = cpu_ticks(kp) if kp else 0, time.monotonic()
        ksm_set("run", 1)
        while int(ksm_get("full_scans")) < full0 + 2 and time.monotonic() - t < 240:
            time.sleep(1)
        conv = time.monotonic() - t
        conv_cpu = ((cpu_ticks(kp) if kp else 0) - k0) / TICK
        m = measure("ksm on", [kp] if kp else [])
        row(m, None)
        print("  ksm: %d full scans in %.0f s (%.1f s of ksmd CPU, pages_to_scan %s, sleep %s ms); pages_shared %s, "
              "pages_sharing %s (%.0f MiB saved); ksmd steady: %.1f%% of a core" % (
                  int(ksm_get("full_scans")) - full0, conv, conv_cpu, ksm_get("pages_to_scan"),
                  ksm_get("sleep_millisecs"), ksm_get("pages_shared"), ksm_get("pages_sharing"),
                  int(ksm_get("pages_sharing")) * 4 / 1024, m["xcpu"]))
        print("  ksm saves %.1f MiB PSS per sandbox (%.1f -> %.1f)" % (last["pss"] - m["pss"], last["pss"], m["pss"]))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("density: interrupted, cleaning up", file=sys.stderr)
        sys.exit(130)
    finally:
        n = len(qemu_pids())
        cleanup()
        left = len(qemu_pids())
        print("  cleanup: %d QEMU processes before, %d left; %.0f s in all" % (n, left, time.monotonic() - t0))
