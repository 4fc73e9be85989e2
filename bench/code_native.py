#!/usr/bin/python3
"""kiln's code interpreter through kiln's native API (figures, not pass/fail;
docs/api.md "Code"), with the standard library only, one kept-alive
connection: POST /v1/sessions {"template":"code-interpreter"} -> the first
POST /v1/sessions/{id}/code '1+1' result, p50/p95 over RUNS sessions (each
destroyed after its run, outside the timing); on one warm session, 'x+1'
round trips; a matplotlib line plot cell to its PNG result.
Environment: KILN_API, KILN_KEY (what `kiln up` writes into DIR/credentials).
  usage: bench/code_native.py [RUNS]   (bench/code_interpreter.sh starts the stack)"""
import http.client, json, math, os, sys, time, urllib.parse

RUNS = int(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RUNS", 20))
u = urllib.parse.urlsplit(os.environ["KILN_API"])
conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
H = {"Authorization": "Bearer " + os.environ["KILN_KEY"], "Content-Type": "application/json"}


def call(method, path, body=None):
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=H)
    r = conn.getresponse()
    data = r.read()
    if r.status >= 300:
        raise SystemExit("code-native: %s %s: %d %s" % (method, path, r.status, data[:300]))
    return json.loads(data) if data else None


def pct(a, p):
    s = sorted(a)
    return s[min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1)]


def fmt(a):
    return "p50 %.0f ms, p95 %.0f ms (n=%d)" % (pct(a, 50), pct(a, 95), len(a))


def text(ex):
    return next((r.get("text") for r in ex["results"] if r.get("is_main_result")), None)


# The template's snapshot is made on first use: not in the figures.
s = call("POST", "/v1/sessions", {"template": "code-interpreter"})
call("DELETE", "/v1/sessions/" + s["id"])
first = []
for _ in range(RUNS):
    t0 = time.monotonic()
    s = call("POST", "/v1/sessions", {"template": "code-interpreter"})
    ex = call("POST", "/v1/sessions/%s/code" % s["id"], {"code": "1+1"})
    first.append((time.monotonic() - t0) * 1000)
    if text(ex) != "2":
        raise SystemExit("code-native: '1+1' gave %r" % ex)
    call("DELETE", "/v1/sessions/" + s["id"])
    time.sleep(0.5)  # the pool refills between runs, as between users
print("code-native: POST /v1/sessions -> first POST /code '1+1': " + fmt(first))

s = call("POST", "/v1/sessions", {"template": "code-interpreter"})
path = "/v1/sessions/%s/code" % s["id"]
call("POST", path, {"code": "x = 1"})
warm = []
for _ in range(max(RUNS, 50)):
    t0 = time.monotonic()
    ex = call("POST", path, {"code": "x+1"})
    warm.append((time.monotonic() - t0) * 1000)
    if text(ex) != "2":
        raise SystemExit("code-native: 'x+1' gave %r" % ex)
print("code-native: warm POST /code 'x+1' round trip: " + fmt(warm))

plot = []
cell = 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3, 4], [1, 4, 2, 3])\nplt.title("t")\nplt.show()'
for _ in range(RUNS):
    t0 = time.monotonic()
    ex = call("POST", path, {"code": cell})
    plot.append((time.monotonic() - t0) * 1000)
    if not ex["results"] or not ex["results"][0].get("png"):
        raise SystemExit("code-native: no PNG: %r" % ex.get("error"))
print("code-native: matplotlib line plot cell -> PNG result: " + fmt(plot))
call("DELETE", "/v1/sessions/" + s["id"])
