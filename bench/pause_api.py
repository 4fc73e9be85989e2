#!/usr/bin/python3
"""Pause and resume through kiln-api (figures, not pass/fail; issue 41's
benchmark): a 256 MiB session whose process holds 64 MiB of incompressible
bytes (os.urandom, as numpy arrays, model weights and compressed files
are). The first pause is whole; then RUNS rounds of resume -> first exec
answered -> pause, nothing changed (a delta: what the guest itself wrote
since), then RUNS rounds with 8 MiB of the 64 changed before each pause.
Per kind: pause ms and bytes sent to S3 (the host's count, chunks only; the
manifest is ~1-3 kB more), resume ms and resume to first exec answered.
Baseline (docs/performance.md, 2026-12-06, before deltas): every pause
~69 MB and 485-582 ms; resume to first exec 436-495 ms.
Environment: KILN_API, KILN_KEY.   usage: bench/pause_api.py [RUNS]"""
import http.client, json, os, statistics, sys, time, urllib.parse

RUNS = int(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RUNS", 5))
u = urllib.parse.urlsplit(os.environ["KILN_API"])
conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
H = {"Authorization": "Bearer " + os.environ["KILN_KEY"], "Content-Type": "application/json"}
# The bytes are read into place (readinto): no temporary copy leaves more
# random pages behind in the guest than the 64 MiB (or 8 MiB) meant.
HOLD = ("import os, socket\nb = bytearray(64 << 20)\nr = open('/dev/urandom', 'rb', buffering=0)\n"
        "m = memoryview(b)\nfor i in range(0, len(b), 1 << 20):\n    r.readinto(m[i:i + (1 << 20)])\nn = 0\n"
        "s = socket.socket(socket.AF_UNIX)\ns.bind('/tmp/h.sock')\ns.listen()\nwhile True:\n    c, _ = s.accept()\n"
        "    at = (n * (8 << 20)) % (56 << 20)\n    for i in range(at, at + (8 << 20), 1 << 20):\n"
        "        r.readinto(m[i:i + (1 << 20)])\n    n += 1\n    c.sendall(b'ok')\n    c.close()\n")
MUTATE = ("import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('/tmp/h.sock')\nprint(s.recv(10).decode())")


def call(method, path, body=None):
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=H)
    r = conn.getresponse()
    data = r.read()
    if r.status >= 300:
        raise SystemExit("pause-api: %s %s: %d %s" % (method, path, r.status, data[:300]))
    return json.loads(data) if data else None


def timed(method, path, body=None):
    t = time.monotonic()
    out = call(method, path, body)
    return out, (time.monotonic() - t) * 1000


def sent(sid, answer):
    snap = (answer or {}).get("snapshot") or call("GET", "/v1/sessions/" + sid).get("snapshot") or {}
    return snap.get("bytes", 0)


s = call("POST", "/v1/sessions", {"limits": {"memory_mib": 256}})
sid = s["id"]
P = "/v1/sessions/" + sid
try:
    call("POST", P + "/exec", {"argv": ["sh", "-c", "cat > /tmp/hold.py && (python3 /tmp/hold.py > /dev/null 2>&1 &) "
                                        "&& sleep 3"], "stdin_b64": __import__("base64").b64encode(HOLD.encode()).decode()})
    first, first_ms = timed("POST", P + "/pause")
    rows = {"unchanged": [], "8 MiB changed": []}
    for kind in rows:
        for _ in range(RUNS):
            _, rms = timed("POST", P + "/resume", {})
            _, ems = timed("POST", P + "/exec", {"argv": ["true"]})
            if kind != "unchanged":
                call("POST", P + "/exec", {"language": "python", "code": MUTATE})
            a, pms = timed("POST", P + "/pause")
            rows[kind].append((pms, sent(sid, a), rms, rms + ems))
    print("pause-api: 256 MiB session, 64 MiB of random bytes in a process, through kiln-api (kiln up); medians of %d"
          % RUNS)
    print("  first pause (whole): %.0f ms, %.1f MB to S3" % (first_ms, sent(sid, first) / 1e6))
    for kind, r in rows.items():
        med = [statistics.median(x[i] for x in r) for i in range(4)]
        print("  re-pause, %-13s: pause %4.0f ms, %7.3f MB to S3; resume %4.0f ms, resume to first exec %4.0f ms"
              % (kind, med[0], med[1] / 1e6, med[2], med[3]))
    print("  baseline (2026-12-06, every pause whole): pause 485-582 ms, ~69 MB; resume to first exec 436-495 ms")
finally:
    call("DELETE", P)
