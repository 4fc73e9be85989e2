#!/usr/bin/python3
"""fleet_sim.py: N simulated kiln-hosts in one asyncio process (issue 43).

Each host listens on its own port (127.0.0.1:BASE_PORT+i, host id
PREFIX-i), heartbeats as kiln-host does (host/serve/heartbeat.c: POST
{api}/v1/hosts/{id}/heartbeat, Bearer cluster token, body {"url","capacity"}
as GET /v1/capacity answers, one kept connection, every --heartbeat-ms;
with several kiln-api URLs host I starts with the (I mod n)th and the next
is tried on no answer or a 5xx), and
serves the part of the host API kiln-api's scheduler drives (docs/api.md,
"kiln-host serve"): POST /v1/tasks (202, 409 duplicate, 503 no_capacity
when its vCPUs or memory do not fit), GET /v1/tasks/{id}/events (state
events starting, running and the final one carrying the task, chunked, the
stream then ends), GET /v1/tasks/{id}, GET /v1/tasks, DELETE /v1/tasks/{id},
GET /v1/capacity, and sessions (POST /v1/sessions, .../exec, .../pause,
.../resume, DELETE) in the simplest form. Capacity is honest: a task holds its vCPUs
and memory from its push to its end (--run-ms after --start-ms).

Faults: --die I:T (host I stops heartbeating and answering at T s: its
listener closes and its connections are cut), --slow MS (each answer
delayed), --drop P (a request's connection cut unanswered with
probability P); also at run time through the control port. --hold: every
host reports itself full (and refuses pushes) until POST /hold?on=0, so
that a burst queues first and placement is then measured alone.

Control (--control-port, 127.0.0.1): GET /stats (counts, and checks:
over-capacity pushes, tasks pushed to two hosts, tasks ended on two
hosts); GET /pushes (every push: task, host, customer, time); POST
/die?host=I; POST /hold?on=1|0. Times are wall-clock seconds (time.time()).

usage: fleet_sim.py --api URL[,URL...] --token T [--hosts N] [--base-port P]
       [--control-port C] [--heartbeat-ms MS] [--vcpus V] [--memory-mib M]
       [--run-ms MS] [--start-ms MS] [--prefix ID] [--die I:T]... [--slow MS]
       [--drop P]
"""
import argparse
import asyncio
import json
import random
import sys
import time
import urllib.parse

FINAL = ("succeeded", "failed", "timed_out", "cancelled", "error")


def now_ms():
    return int(time.time() * 1000)


class Stats:
    def __init__(self):
        self.pushes = []          # {"task","host","customer","t"}
        self.push_hosts = {}      # task -> [host index...]
        self.final_hosts = {}     # task -> [host index...]
        self.over_capacity = 0    # pushes that did not fit (refused 503)
        self.held_refusals = 0    # pushes while the fleet was held full
        self.heartbeats = 0
        self.heartbeat_errors = 0
        self.heartbeat_ms = []    # round trip of the last heartbeats (ring)
        self.dead = []            # host indexes that died, with the time
        self.requests = 0
        self.sessions = 0
        self.execs = 0


class Host:
    def __init__(self, sim, i):
        self.sim, self.i = sim, i
        self.id = "%s-%d" % (sim.a.prefix, i)
        self.port = sim.a.base_port + i
        self.url = "http://127.0.0.1:%d" % self.port
        self.tasks = {}           # id -> dict
        self.sessions = {}
        self.used_v = 0
        self.used_m = 0
        self.dead = False
        self.server = None
        self.writers = set()
        self.api_cur = i % len(sim.apis)  # hosts spread over the kiln-api URLs, as operators would list them
        self.hb_conn = None
        self.kick = asyncio.Event()

    # ---- capacity, as kiln-host's GET /v1/capacity ----
    def capacity(self):
        a = self.sim.a
        running = sum(1 for t in self.tasks.values() if t["state"] not in FINAL)
        held = self.sim.held
        return {"host_id": self.id, "accel": "tcg",
                "vcpus": {"total": a.vcpus, "used": a.vcpus if held else self.used_v},
                "memory_mib": {"total": a.memory_mib, "used": a.memory_mib if held else self.used_m},
                "running_tasks": running, "uploading_tasks": 0,
                "pool": {"ready": 0, "prestarted": 0, "memory_mib": 0, "vcpus": 0}, "egress": False,
                "templates": [{"name": "default", "sha256": None, "builtin": True, "ready": 0, "snapshot": True}]}

    # ---- the heartbeat ----
    async def hb_request(self, base, body):
        u = urllib.parse.urlsplit(base)
        path = (u.path.rstrip("/") or "") + "/v1/hosts/%s/heartbeat" % self.id
        if self.hb_conn is None or self.hb_conn[0] != base:
            await self.hb_close()
            r, w = await asyncio.wait_for(asyncio.open_connection(u.hostname, u.port), 2)
            self.hb_conn = (base, r, w)
        _, r, w = self.hb_conn
        w.write(("POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                 "Content-Length: %d\r\n\r\n" % (path, u.netloc, self.sim.a.token, len(body))).encode() + body)
        status, headers, _ = await asyncio.wait_for(read_response(r), 5)
        if headers.get("connection", "").lower() == "close":
            await self.hb_close()
        return status

    async def hb_close(self):
        if self.hb_conn:
            self.hb_conn[2].close()
            self.hb_conn = None

    async def heartbeat_loop(self):
        a, st = self.sim.a, self.sim.stats
        await asyncio.sleep(random.random() * a.heartbeat_ms / 1000)  # spread over the period
        while not self.dead:
            t0 = time.monotonic()
            body = json.dumps({"url": self.url, "capacity": self.capacity()}).encode()
            for k in range(len(self.sim.apis)):
                base = self.sim.apis[(self.api_cur + k) % len(self.sim.apis)]
                try:
                    status = await self.hb_request(base, body)
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                    await self.hb_close()
                    status = 0
                if status == 200:
                    self.api_cur = (self.api_cur + k) % len(self.sim.apis)
                    st.heartbeats += 1
                    st.heartbeat_ms.append((time.monotonic() - t0) * 1000)
                    if len(st.heartbeat_ms) > 10000:
                        del st.heartbeat_ms[:5000]
                    break
                st.heartbeat_errors += 1
                if status and status < 500:
                    break
            self.kick.clear()
            try:
                await asyncio.wait_for(self.kick.wait(), max(0, a.heartbeat_ms / 1000 - (time.monotonic() - t0)))
            except asyncio.TimeoutError:
                pass
        await self.hb_close()

    # ---- dying ----
    async def die(self):
        if self.dead:
            return
        self.dead = True
        self.sim.stats.dead.append({"host": self.i, "t": time.time()})
        if self.server:
            self.server.close()
        for w in list(self.writers):
            w.transport.abort()
        await self.hb_close()

    # ---- tasks ----
    def task_json(self, t):
        j = {"id": t["id"], "customer": t["customer"], "host_id": self.id, "state": t["state"],
             "created_ms": t["created_ms"]}
        j["result"] = t.get("result")
        if t["state"] in FINAL:
            j["outputs"] = []
            j["artifacts"] = {}
            j["timings"] = {"start_ms": self.sim.a.start_ms, "run_ms": self.sim.a.run_ms, "upload_ms": 0,
                            "total_ms": t["ended_ms"] - t["created_ms"]}
        return j

    def release(self, t):
        if not t.get("released"):
            t["released"] = True
            self.used_v -= t["vcpus"]
            self.used_m -= t["memory_mib"]

    async def run_task(self, t):
        a = self.sim.a
        await asyncio.sleep(a.start_ms / 1000)
        if t["state"] in FINAL:
            return
        self.set_state(t, "starting")
        self.set_state(t, "running")
        await asyncio.sleep(a.run_ms / 1000)
        if t["state"] in FINAL or self.dead:
            return
        t["result"] = {"state": "succeeded", "exit_code": 0, "end_reason": "exited", "stdout": "1\n", "stderr": ""}
        t["ended_ms"] = now_ms()
        self.release(t)
        self.set_state(t, "succeeded")
        self.sim.stats.final_hosts.setdefault(t["id"], []).append(self.i)

    def set_state(self, t, state):
        t["state"] = state
        ev = {"state": state, "at": now_ms()}
        if state in FINAL:
            ev["task"] = self.task_json(t)
        t["events"].append(ev)
        for q in t["waiters"]:
            q.set()

    def push(self, body):
        st, a = self.sim.stats, self.sim.a
        tid, cust = body.get("id"), body.get("customer")
        if not isinstance(tid, str) or not isinstance(cust, str):
            return 400, {"error": {"code": "invalid_request", "message": "id, customer"}}
        if tid in self.tasks:
            return 409, {"error": {"code": "duplicate", "message": "a task with this id exists on this host"}}
        lim = (body.get("spec") or {}).get("limits") or {}
        v, m = int(lim.get("vcpus") or 1), int(lim.get("memory_mib") or 256)
        if self.sim.held:
            st.held_refusals += 1
            return 503, {"error": {"code": "no_capacity", "message": "held full (fleet_sim --hold)"}}
        if self.used_v + v > a.vcpus or self.used_m + m > a.memory_mib:
            st.over_capacity += 1
            return 503, {"error": {"code": "no_capacity", "message": "vcpus %d+%d of %d, memory %d+%d of %d MiB"
                                   % (self.used_v, v, a.vcpus, self.used_m, m, a.memory_mib)}}
        self.used_v += v
        self.used_m += m
        t = {"id": tid, "customer": cust, "vcpus": v, "memory_mib": m, "state": "accepted",
             "created_ms": now_ms(), "events": [{"state": "accepted", "at": now_ms()}], "waiters": []}
        self.tasks[tid] = t
        st.pushes.append({"task": tid, "host": self.i, "customer": cust, "t": time.time()})
        st.push_hosts.setdefault(tid, []).append(self.i)
        asyncio.get_running_loop().create_task(self.run_task(t))
        return 202, self.task_json(t)

    def cancel(self, tid):
        t = self.tasks.get(tid)
        if not t:
            return 404, {"error": {"code": "not_found", "message": "no such task"}}
        if t["state"] in FINAL:
            return 409, {"error": {"code": "not_cancellable", "message": "ended"}}
        t["result"] = {"state": "cancelled", "end_reason": "cancelled", "stdout": "", "stderr": ""}
        t["ended_ms"] = now_ms()
        self.release(t)
        self.set_state(t, "cancelled")
        return 202, self.task_json(t)

    async def events(self, w, tid):
        t = self.tasks.get(tid)
        if not t:
            return await send(w, 404, {"error": {"code": "not_found", "message": "no such task"}})
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        sent = 0
        ev = asyncio.Event()
        t["waiters"].append(ev)
        try:
            while True:
                while sent < len(t["events"]):
                    e = t["events"][sent]
                    sent += 1
                    data = ("event: state\ndata: %s\n\n" % json.dumps(e)).encode()
                    w.write(b"%x\r\n%s\r\n" % (len(data), data))
                    if e["state"] in FINAL:
                        w.write(b"0\r\n\r\n")
                        await w.drain()
                        return
                await w.drain()
                ev.clear()
                try:
                    await asyncio.wait_for(ev.wait(), 15)
                except asyncio.TimeoutError:
                    w.write(b"d\r\n: keepalive\n\n\r\n")
                if self.dead:
                    raise ConnectionResetError
        finally:
            t["waiters"].remove(ev)

    # ---- sessions (enough for create, exec, pause, destroy) ----
    def session(self, method, parts, body):
        st, a = self.sim.stats, self.sim.a
        resume = method == "POST" and len(parts) == 4 and parts[3] == "resume"
        if (method == "POST" and len(parts) == 2) or resume:
            sid = parts[2] if resume else body.get("id") or "s%d" % len(self.sessions)
            lim = (body.get("spec") or body).get("limits") or {}
            v, m = int(lim.get("vcpus") or 1), int(lim.get("memory_mib") or 256)
            if self.used_v + v > a.vcpus or self.used_m + m > a.memory_mib:
                st.over_capacity += 1
                return 503, {"error": {"code": "no_capacity", "message": "full"}}
            self.used_v += v
            self.used_m += m
            self.sessions[sid] = {"v": v, "m": m}
            st.sessions += 1
            return (200 if resume else 201), {"id": sid, "state": "running"}
        sid = parts[2] if len(parts) > 2 else ""
        s = self.sessions.get(sid)
        if not s:
            return 404, {"error": {"code": "not_found", "message": "no such session"}}
        if method == "POST" and len(parts) == 4 and parts[3] == "exec":
            st.execs += 1
            return 200, {"exit_code": 0, "stdout": "", "stderr": "", "end_reason": "exited"}
        if (method == "POST" and len(parts) == 4 and parts[3] == "pause") or (method == "DELETE" and len(parts) == 3):
            del self.sessions[sid]
            self.used_v -= s["v"]
            self.used_m -= s["m"]
            if method == "DELETE":
                return 200, {"id": sid, "state": "destroyed"}
            return 200, {"id": sid, "state": "paused", "snapshot": {"key": "sim/%s" % sid}}
        if method == "GET":
            return 200, {"id": sid, "state": "running"}
        return 404, {"error": {"code": "not_found", "message": "no"}}

    # ---- the connection handler ----
    async def handle(self, r, w):
        a, st = self.sim.a, self.sim.stats
        self.writers.add(w)
        try:
            while not self.dead:
                try:
                    method, target, headers, body = await read_request(r, w)
                except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                    return
                st.requests += 1
                if a.drop and random.random() < a.drop:
                    w.transport.abort()
                    return
                if a.slow:
                    await asyncio.sleep(a.slow / 1000)
                if self.dead:
                    return
                if headers.get("authorization") != "Bearer " + a.token:
                    await send(w, 401, {"error": {"code": "unauthorized", "message": "token"}})
                    continue
                path = target.split("?")[0]
                parts = path.strip("/").split("/")
                try:
                    j = json.loads(body) if body else {}
                except ValueError:
                    await send(w, 400, {"error": {"code": "invalid_json", "message": "body"}})
                    continue
                if parts == ["v1", "tasks"] and method == "POST":
                    await send(w, *self.push(j))
                elif parts == ["v1", "tasks"] and method == "GET":
                    live = [{"id": t["id"], "customer": t["customer"], "state": t["state"]}
                            for t in self.tasks.values() if "all=1" in target or t["state"] not in FINAL]
                    await send(w, 200, {"tasks": live})
                elif len(parts) == 4 and parts[:2] == ["v1", "tasks"] and parts[3] == "events" and method == "GET":
                    await self.events(w, parts[2])
                elif len(parts) == 3 and parts[:2] == ["v1", "tasks"] and method == "GET":
                    t = self.tasks.get(parts[2])
                    await send(w, *((200, self.task_json(t)) if t else
                                    (404, {"error": {"code": "not_found", "message": "no such task"}})))
                elif len(parts) == 3 and parts[:2] == ["v1", "tasks"] and method == "DELETE":
                    await send(w, *self.cancel(parts[2]))
                elif parts == ["v1", "capacity"]:
                    await send(w, 200, self.capacity())
                elif parts[:2] == ["v1", "sessions"] and len(parts) >= 2:
                    if parts == ["v1", "sessions"] and method == "GET":
                        await send(w, 200, {"sessions": [{"id": k, "state": "running"} for k in self.sessions]})
                    else:
                        await send(w, *self.session(method, parts, j))
                else:
                    await send(w, 404, {"error": {"code": "not_found", "message": path}})
        except (ConnectionError, OSError):
            pass
        finally:
            self.writers.discard(w)
            w.close()

    async def start(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", self.port, backlog=256)


async def read_head(r):
    head = await r.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for ln in lines[1:]:
        if ":" in ln:
            k, v = ln.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return lines[0], headers


async def read_body(r, headers):
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = b""
        while True:
            size = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await r.readuntil(b"\r\n")
                return out
            out += await r.readexactly(size)
            await r.readexactly(2)
    n = int(headers.get("content-length") or 0)
    return await r.readexactly(n) if n else b""


async def read_request(r, w):
    line, headers = await read_head(r)
    method, target, _ = line.split(" ", 2)
    if headers.get("expect", "").lower() == "100-continue":
        w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    return method, target, headers, await read_body(r, headers)


async def read_response(r):
    line, headers = await read_head(r)
    status = int(line.split(" ")[1])
    return status, headers, await read_body(r, headers)


REASONS = {200: "OK", 201: "Created", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           409: "Conflict", 503: "Service Unavailable"}


async def send(w, status, obj):
    data = json.dumps(obj).encode()
    w.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, REASONS.get(status, "X").encode(), len(data), data))
    await w.drain()


class Sim:
    def __init__(self, a):
        self.a = a
        self.apis = [u.rstrip("/") for u in a.api.split(",") if u]
        self.stats = Stats()
        self.hosts = [Host(self, i) for i in range(a.hosts)]
        self.t0 = time.time()
        self.held = a.hold
        self.released_at = None

    def summary(self):
        st = self.stats
        two_push = {t: h for t, h in st.push_hosts.items() if len(h) > 1}
        dead = {d["host"] for d in st.dead}
        # pushed to two hosts without the first having died: a double placement
        bad_push = [t for t, h in two_push.items() if any(x not in dead for x in h[:-1])]
        two_final = [t for t, h in st.final_hosts.items() if len(h) > 1]
        hb = sorted(st.heartbeat_ms[-5000:])
        pct = (lambda p: round(hb[min(len(hb) - 1, int(len(hb) * p))], 1)) if hb else (lambda p: None)
        return {"hosts": len(self.hosts), "dead": st.dead, "uptime_s": round(time.time() - self.t0, 1),
                "heartbeats": st.heartbeats, "heartbeat_errors": st.heartbeat_errors,
                "heartbeat_rtt_ms": {"p50": pct(0.5), "p99": pct(0.99)},
                "requests": st.requests, "pushes": len(st.pushes), "tasks": len(st.push_hosts),
                "finals": sum(len(h) for h in st.final_hosts.values()), "over_capacity": st.over_capacity,
                "held": self.held, "held_refusals": st.held_refusals, "released_at": self.released_at,
                "pushed_twice": len(two_push), "pushed_twice_not_lost": len(bad_push),
                "ended_twice": len(two_final), "sessions": st.sessions, "execs": st.execs,
                "used_vcpus": sum(h.used_v for h in self.hosts),
                "max_used_vcpus": max((h.used_v for h in self.hosts), default=0)}

    async def control(self, r, w):
        try:
            while True:
                try:
                    method, target, _, _ = await read_request(r, w)
                except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                    return
                u = urllib.parse.urlsplit(target)
                q = urllib.parse.parse_qs(u.query)
                if u.path == "/stats":
                    await send(w, 200, self.summary())
                elif u.path == "/pushes":
                    await send(w, 200, {"pushes": self.stats.pushes,
                                        "finals": self.stats.final_hosts})
                elif u.path == "/hold" and method == "POST":
                    self.held = q.get("on", ["1"])[0] == "1"
                    if not self.held:
                        self.released_at = time.time()
                        for h in self.hosts:  # a heartbeat at once, as capacity frees on a real host
                            h.kick.set()
                    await send(w, 200, {"held": self.held})
                elif u.path == "/die" and method == "POST":
                    i = int(q.get("host", ["0"])[0])
                    await self.hosts[i].die()
                    await send(w, 200, {"dead": i, "tasks": len([t for t in self.hosts[i].tasks.values()
                                                                 if t["state"] not in FINAL])})
                else:
                    await send(w, 404, {"error": "no"})
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def die_at(self, i, t):
        await asyncio.sleep(t)
        await self.hosts[i].die()
        print("fleet_sim: host %d died at %.1f s" % (i, t), file=sys.stderr, flush=True)

    async def main(self):
        for h in self.hosts:
            await h.start()
        if self.a.control_port:
            await asyncio.start_server(self.control, "127.0.0.1", self.a.control_port)
        for spec in self.a.die:
            i, t = spec.split(":")
            asyncio.get_running_loop().create_task(self.die_at(int(i), float(t)))
        print("fleet_sim: %d hosts on 127.0.0.1:%d-%d, heartbeating to %s every %d ms" % (
            len(self.hosts), self.a.base_port, self.a.base_port + len(self.hosts) - 1, ",".join(self.apis),
            self.a.heartbeat_ms), file=sys.stderr, flush=True)
        await asyncio.gather(*(h.heartbeat_loop() for h in self.hosts))
        await asyncio.Event().wait()


def main():
    p = argparse.ArgumentParser(description="simulated kiln-hosts (issue 43)")
    p.add_argument("--api", required=True, help="kiln-api base URL(s), comma-separated")
    p.add_argument("--token", required=True)
    p.add_argument("--hosts", type=int, default=10)
    p.add_argument("--base-port", type=int, default=40000)
    p.add_argument("--control-port", type=int, default=0)
    p.add_argument("--heartbeat-ms", type=int, default=1000)
    p.add_argument("--vcpus", type=int, default=8)
    p.add_argument("--memory-mib", type=int, default=16384)
    p.add_argument("--run-ms", type=int, default=1000)
    p.add_argument("--start-ms", type=int, default=0, help="accepted, before starting")
    p.add_argument("--prefix", default="sim")
    p.add_argument("--hold", action="store_true", help="start held full (capacity all used) until POST /hold?on=0")
    p.add_argument("--die", action="append", default=[], help="I:T: host I dies at T s")
    p.add_argument("--slow", type=int, default=0, help="ms before each answer")
    p.add_argument("--drop", type=float, default=0, help="probability of cutting a request's connection")
    a = p.parse_args()
    try:
        asyncio.run(Sim(a).main())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
