#!/usr/bin/python3
"""fleet_load.py: the client side of bench/fleet.sh (and of the fleet test, 120-fleet-sim.sh).

    fleet_load.py customers API ADMIN N PREFIX KEYS.json
        N customers PREFIX-0.. with every quota that would hold a burst back
        lifted (0: no limit), one key each, written to KEYS.json.
    fleet_load.py burst API[,API...] KEYS.json TASKS CONC OUT.json
        TASKS python tasks, the customers taken in turn, CONC submissions
        at once on kept connections (spread over the APIs); prints one JSON
        line: submitted, errors, rate, p50/p99/max latency (ms); every
        submission has an Idempotency-Key and is retried on the next API on
        no answer or a 5xx (the latency is the answered attempt's); every
        submission (id, customer, t, ms) in OUT.json.
    fleet_load.py placed SIM_CONTROL OUT.json TIMEOUT_S
        waits until the simulator has had every task of OUT.json pushed
        (or TIMEOUT_S pass); prints one JSON line: pushed, missing,
        placement rate (tasks/s, from the simulator's release of a held
        fleet, else from the first push, to the last push), queue time
        (push - submission) p50/p99.
    fleet_load.py placed-all SIM_CONTROL EXPECTED TIMEOUT_S
        the same over every push the simulator received, until EXPECTED
        tasks were pushed (no queue times: for submissions made by wrk).
    fleet_load.py wrk-lua KEYS.json OUT.lua
        a wrk script submitting print(1) tasks, the customers' keys in turn.
    fleet_load.py ended API KEYS.json OUT.json TIMEOUT_S
        waits until every task of OUT.json is final in kiln-api; prints one
        JSON line: final, states (counts), not_final; each task's final
        state (STATE or STATE:END_REASON) in OUT.json.states.
"""
import asyncio
import json
import sys
import time
import urllib.parse
import urllib.request


def req(url, method="GET", key=None, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(url, data=data, method=method,
                               headers={"Content-Type": "application/json",
                                        **({"Authorization": "Bearer " + key} if key else {})})
    try:
        with urllib.request.urlopen(r, timeout=timeout) as f:
            return f.status, json.loads(f.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def pct(v, p):
    v = sorted(v)
    return round(v[min(len(v) - 1, int(len(v) * p))], 1) if v else None


LIFTED = {"max_running": 0, "max_vcpus": 0, "max_memory_mib": 0, "submit_rate": 0, "max_queued": 0,
          "max_streams": 0}


def customers(api, admin, n, prefix, out):
    keys = []
    for i in range(n):
        cid = "%s-%d" % (prefix, i)
        req(api + "/v1/admin/customers", "POST", admin, {"id": cid, "quotas": LIFTED})
        req(api + "/v1/admin/customers/%s/quotas" % cid, "PUT", admin, LIFTED)
        st, k = req(api + "/v1/admin/customers/%s/keys" % cid, "POST", admin)
        if st != 201:
            sys.exit("fleet_load: key for %s: HTTP %s %s" % (cid, st, k))
        keys.append({"customer": cid, "key": k["key"]})
    json.dump(keys, open(out, "w"))


async def http_post(conn, host, path, key, body, idem):
    r, w = conn
    w.write(("POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
             "Idempotency-Key: %s\r\nContent-Length: %d\r\n\r\n" % (path, host, key, idem, len(body))).encode() + body)
    head = await r.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    h = {ln.split(":", 1)[0].lower(): ln.split(":", 1)[1].strip() for ln in lines[1:] if ":" in ln}
    if h.get("transfer-encoding", "").lower() == "chunked":
        data = b""
        while True:
            size = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
            if not size:
                await r.readuntil(b"\r\n")
                break
            data += await r.readexactly(size)
            await r.readexactly(2)
    else:
        data = await r.readexactly(int(h.get("content-length") or 0))
    return status, data, h.get("connection", "").lower() == "close"


async def burst_main(apis, keys, ntasks, conc, out):
    body = json.dumps({"language": "python", "code": "print(1)"}).encode()
    recs, errors = [], []
    nxt = [0]

    nonce = "%x" % int(time.time() * 1000)

    async def worker(wi):
        cur = wi % len(apis)
        u = urllib.parse.urlsplit(apis[cur])
        conn = None
        while nxt[0] < ntasks:
            i = nxt[0]
            nxt[0] += 1
            k = keys[i % len(keys)]
            # A replica gone (SIGKILLed): the same submission, same
            # Idempotency-Key, to the next one: one task either way.
            for attempt in range(50):
                try:
                    if conn is None:
                        conn = await asyncio.open_connection(u.hostname, u.port)
                    t0 = time.time()
                    st, data, close = await http_post(conn, u.netloc, "/v1/tasks", k["key"], body,
                                                      "fl-%s-%d" % (nonce, i))
                    ms = (time.time() - t0) * 1000
                    if close:
                        conn[1].close()
                        conn = None
                    if st < 500:
                        break
                except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                    if conn:
                        conn[1].close()
                    conn = None
                    st, data, ms = 0, str(e).encode(), 0
                cur = (cur + 1) % len(apis)
                u = urllib.parse.urlsplit(apis[cur])
                if conn:
                    conn[1].close()
                    conn = None
                await asyncio.sleep(0.1)
            if st in (200, 201, 202):  # 200: an Idempotency-Key replayed (a retry after a lost answer)
                recs.append({"id": json.loads(data)["id"], "customer": k["customer"], "t": t0, "ms": ms})
            else:
                errors.append("%s %s" % (st, data[:200]))
        if conn:
            conn[1].close()

    t0 = time.time()
    await asyncio.gather(*(worker(i) for i in range(conc)))
    dt = time.time() - t0
    json.dump(recs, open(out, "w"))
    lat = [r["ms"] for r in recs]
    print(json.dumps({"submitted": len(recs), "errors": len(errors), "first_error": errors[0] if errors else None,
                      "seconds": round(dt, 2), "rate": round(len(recs) / dt, 1), "p50_ms": pct(lat, 0.5),
                      "p99_ms": pct(lat, 0.99), "max_ms": pct(lat, 1)}))


def placed(sim, out, timeout):
    recs = {r["id"]: r for r in json.load(open(out))}
    deadline = time.time() + timeout
    while True:
        _, p = req(sim + "/pushes")
        first, hosts = {}, set()
        for e in p["pushes"]:
            if e["task"] in recs and e["task"] not in first:
                first[e["task"]] = e["t"]
                hosts.add(e["host"])
        if len(first) >= len(recs) or time.time() > deadline:
            break
        time.sleep(0.5)
    ts = sorted(first.values())
    q = [(first[t] - recs[t]["t"]) * 1000 for t in first]
    # Held (fleet_sim --hold): from the release; else from the first push.
    rel = req(sim + "/stats")[1].get("released_at")
    start = rel if rel and ts and rel < ts[0] else (ts[0] if ts else 0)
    span = ts[-1] - start if ts else 0
    print(json.dumps({"pushed": len(first), "missing": len(recs) - len(first), "hosts_used": len(hosts),
                      "rate": round(len(ts) / span, 1) if span else None,
                      "span_s": round(span, 2), "queue_p50_ms": pct(q, 0.5), "queue_p99_ms": pct(q, 0.99)}))


def placed_all(sim, expected, timeout):
    deadline = time.time() + timeout
    while True:
        _, p = req(sim + "/pushes")
        first, hosts = {}, set()
        for e in p["pushes"]:
            if e["task"] not in first:
                first[e["task"]] = e["t"]
                hosts.add(e["host"])
        if len(first) >= expected or time.time() > deadline:
            break
        time.sleep(0.5)
    ts = sorted(first.values())
    rel = req(sim + "/stats")[1].get("released_at")
    start = rel if rel and ts and rel < ts[0] else (ts[0] if ts else 0)
    span = ts[-1] - start if ts else 0
    print(json.dumps({"pushed": len(first), "missing": expected - len(first), "hosts_used": len(hosts),
                      "rate": round(len(ts) / span, 1) if span else None, "span_s": round(span, 2),
                      "queue_p50_ms": None, "queue_p99_ms": None}))


def wrk_lua(keysf, out):
    keys = [k["key"] for k in json.load(open(keysf))]
    with open(out, "w") as f:
        f.write("local keys = {%s}\n" % ",".join('"%s"' % k for k in keys))
        f.write('local n = math.random(#keys)\n'
                'local body = \'{"language":"python","code":"print(1)"}\'\n'
                'request = function()\n'
                '  n = n % #keys + 1\n'
                '  return wrk.format("POST", "/v1/tasks", {["Authorization"] = "Bearer " .. keys[n],'
                ' ["Content-Type"] = "application/json"}, body)\n'
                'end\n')


def ended(api, keysf, out, timeout):
    keys = {k["customer"]: k["key"] for k in json.load(open(keysf))}
    pending = {r["id"]: r["customer"] for r in json.load(open(out))}
    states, each = {}, {}
    deadline = time.time() + timeout
    while pending and time.time() < deadline:
        for tid, c in list(pending.items()):
            st, t = req(api + "/v1/tasks/" + tid, key=keys[c])
            s = (t or {}).get("state")
            if s in ("succeeded", "failed", "timed_out", "cancelled", "error"):
                reason = ((t.get("result") or {}).get("end_reason")) or ""
                k = s + (":" + reason if s != "succeeded" else "")
                states[k] = states.get(k, 0) + 1
                each[tid] = k
                del pending[tid]
        if pending:
            time.sleep(1)
    json.dump(each, open(out + ".states", "w"))
    print(json.dumps({"final": sum(states.values()), "states": states, "not_final": len(pending),
                      "not_final_ids": list(pending)[:5]}))


def main():
    a = sys.argv[1:]
    if a and a[0] == "customers":
        customers(a[1], a[2], int(a[3]), a[4], a[5])
    elif a and a[0] == "burst":
        asyncio.run(burst_main(a[1].split(","), json.load(open(a[2])), int(a[3]), int(a[4]), a[5]))
    elif a and a[0] == "placed":
        placed(a[1], a[2], float(a[3]))
    elif a and a[0] == "placed-all":
        placed_all(a[1], int(a[2]), float(a[3]))
    elif a and a[0] == "wrk-lua":
        wrk_lua(a[1], a[2])
    elif a and a[0] == "ended":
        ended(a[1], a[2], a[3], float(a[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
