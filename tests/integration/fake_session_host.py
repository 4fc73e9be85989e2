#!/usr/bin/env python3
"""A stand-in for kiln-host's session API (docs/api.md, "kiln-host serve":
sessions), for testing kiln-api's side without VMs: 74-sessions-api.sh.

It keeps each session's files in memory, runs a handful of pretend commands
(echo, cat, write, sleep, exit, pwd), "pauses" a session by writing its
files to a directory shared by all fake hosts (standing in for S3), and
heartbeats to kiln-api like kiln-host does. It is deliberately strict about
what kiln-api sends: a request that breaks the contract is answered 400
and logged, so the test sees it.

usage: fake_session_host.py --listen 127.0.0.1:PORT --host-id h1 --token T
         --api http://127.0.0.1:APIPORT --snapshots DIR [--memory-mib N]
"""
import argparse
import base64
import json
import os
import re
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
LOCK = threading.Lock()
SESSIONS = {}  # id -> dict(customer, spec, files{path: bytes}, busy, created_ms, last_active_ms)
ARGS = None


def now_ms():
    return int(time.time() * 1000)


def log(*a):
    print("fake-host %s:" % ARGS.host_id, *a, file=sys.stderr, flush=True)


def used():
    v = sum(s["spec"]["limits"]["vcpus"] for s in SESSIONS.values())
    m = sum(s["spec"]["limits"]["memory_mib"] for s in SESSIONS.values())
    return v, m


def capacity():
    with LOCK:
        v, m = used()
        n = len(SESSIONS)
    return {"host_id": ARGS.host_id, "accel": "none", "vcpus": {"total": 8, "used": v},
            "memory_mib": {"total": ARGS.memory_mib, "used": m}, "running_tasks": 0,
            "uploading_tasks": 0, "running_sessions": n,
            "pool": {"ready": 0, "prestarted": 0, "memory_mib": 256, "vcpus": 1}, "egress": False}


def session_obj(sid, s):
    return {"id": sid, "customer": s["customer"], "state": "running", "host_id": ARGS.host_id,
            "created_ms": s["created_ms"], "last_active_ms": s["last_active_ms"],
            "vcpus": s["spec"]["limits"]["vcpus"], "memory_mib": s["spec"]["limits"]["memory_mib"]}


def check_spec(spec):
    if not isinstance(spec, dict) or set(spec) - {"limits", "network"}:
        return "spec: only limits and network"
    lim = spec.get("limits")
    if not isinstance(lim, dict) or set(lim) != {"vcpus", "memory_mib", "output_mib"}:
        return "spec.limits: vcpus, memory_mib and output_mib, all of them"
    if not isinstance(spec.get("network"), dict):
        return "spec.network: required"
    return None


def run(files, argv, env, cwd, stdin=b""):
    """The pretend commands: (exit_code, stdout, stderr)."""
    cmd, rest = argv[0], argv[1:]
    if cmd == "cat" and not rest:
        return 0, stdin.decode("utf-8", "replace"), ""
    if cmd == "echo":
        return 0, " ".join(rest) + "\n", ""
    if cmd == "pwd":
        return 0, cwd + "\n", ""
    if cmd == "env":
        return 0, "".join("%s=%s\n" % kv for kv in sorted(env.items())), ""
    if cmd == "cat":
        p = rest[0] if rest[0].startswith("/") else cwd.rstrip("/") + "/" + rest[0]
        if p not in files:
            return 1, "", "cat: %s: No such file or directory\n" % rest[0]
        return 0, files[p].decode("utf-8", "replace"), ""
    if cmd == "write":  # write PATH TEXT
        p = rest[0] if rest[0].startswith("/") else cwd.rstrip("/") + "/" + rest[0]
        files[p] = rest[1].encode()
        return 0, "", ""
    if cmd == "sleep":
        time.sleep(float(rest[0]))
        return 0, "", ""
    if cmd == "exit":
        return int(rest[0]), "", "exiting %s\n" % rest[0]
    return 127, "", "%s: command not found\n" % cmd


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *a):
        pass

    def reply(self, status, obj=None, raw=None, ctype="application/json"):
        body = raw if raw is not None else (json.dumps(obj).encode() if obj is not None else b"")
        self.send_response(status)
        if body or status != 204:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, code, msg):
        if status == 400:
            log("refusing a request:", self.command, self.path, msg)
        self.reply(status, {"error": {"code": code, "message": msg}})

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def json_body(self):
        try:
            j = json.loads(self.body() or b"null")
        except ValueError:
            return None
        return j if isinstance(j, dict) else None

    def authorized(self):
        if self.headers.get("Authorization") != "Bearer " + ARGS.token:
            self.error(401, "unauthorized", "cluster token")
            return False
        return True

    def route(self):
        u = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(u.query))
        parts = u.path.strip("/").split("/")
        if u.path == "/healthz":
            return self.reply(200, {"status": "ok", "host_id": ARGS.host_id})
        if not self.authorized():
            return
        if u.path == "/v1/capacity":
            return self.reply(200, capacity())
        if parts[:2] != ["v1", "sessions"]:
            return self.error(404, "not_found", "no such endpoint")
        if len(parts) == 2:
            return self.sessions_root()
        sid = parts[2]
        rest = "/".join(parts[3:])
        if rest == "resume" and self.command == "POST":
            return self.resume(sid)
        with LOCK:
            s = SESSIONS.get(sid)
        if not s:
            return self.error(404, "not_found", "no such session")
        if rest == "" and self.command == "GET":
            return self.reply(200, session_obj(sid, s))
        if rest == "" and self.command == "DELETE":
            with LOCK:
                SESSIONS.pop(sid, None)
            return self.reply(200, {"id": sid, "state": "destroyed"})
        if rest == "exec" and self.command == "POST":
            return self.exec(sid, s, q.get("stream") == "1")
        if rest == "files":
            return self.files(s, q)
        if rest == "pause" and self.command == "POST":
            return self.pause(sid, s)
        if rest == "outputs" and self.command == "POST":
            outs = [{"path": p[len("/output/"):], "size": len(d), "sha256": "0" * 64,
                     "s3_key": "%s/sessions/%s/outputs/%s" % (s["customer"], sid, p[len("/output/"):])}
                    for p, d in sorted(s["files"].items()) if p.startswith("/output/")]
            return self.reply(200, {"outputs": outs})
        return self.error(404, "not_found", "no such endpoint")

    def sessions_root(self):
        if self.command == "GET":
            with LOCK:
                return self.reply(200, {"sessions": [session_obj(k, v) for k, v in SESSIONS.items()]})
        if self.command != "POST":
            return self.error(405, "method_not_allowed", "GET, POST")
        j = self.json_body()
        if not j or set(j) != {"id", "customer", "spec"}:
            return self.error(400, "invalid_request", "id, customer, spec")
        if not ID_RE.match(j["id"]) or not ID_RE.match(j["customer"]):
            return self.error(400, "invalid_request", "id/customer")
        err = check_spec(j["spec"])
        if err:
            return self.error(400, "invalid_spec", err)
        with LOCK:
            if j["id"] in SESSIONS:
                return self.error(409, "duplicate", "exists")
            _, m = used()
            if m + j["spec"]["limits"]["memory_mib"] > ARGS.memory_mib:
                return self.error(503, "no_capacity", "memory: %d of %d MiB in use" % (m, ARGS.memory_mib))
            s = {"customer": j["customer"], "spec": j["spec"], "files": {}, "busy": False,
                 "created_ms": now_ms(), "last_active_ms": now_ms()}
            SESSIONS[j["id"]] = s
        log("session", j["id"], "created")
        return self.reply(201, session_obj(j["id"], s))

    def exec(self, sid, s, stream):
        j = self.json_body()
        if not j or not ({"argv"} <= set(j) or {"language", "code"} <= set(j)) \
                or set(j) - {"argv", "language", "code", "env", "cwd", "timeout_s", "stdin_b64"} \
                or not isinstance(j.get("timeout_s"), int):
            return self.error(400, "invalid_spec", "exec body (timeout_s filled in by kiln-api)")
        argv = j.get("argv") or ["echo", j.get("code", "")]
        with LOCK:
            if s["busy"]:
                return self.error(409, "busy", "another command runs in this session")
            s["busy"] = True
        try:
            code, out, err = run(s["files"], argv, j.get("env", {}), j.get("cwd", "/work"),
                                 base64.b64decode(j.get("stdin_b64", "")))
        finally:
            with LOCK:
                s["busy"] = False
                s["last_active_ms"] = now_ms()
        result = {"state": "succeeded" if code == 0 else "failed", "exit_code": code, "signal": None,
                  "end_reason": "exited", "stdout": out, "stderr": err, "stdout_truncated": False,
                  "stderr_truncated": False, "timings": {"run_ms": 1}}
        if not stream:
            return self.reply(200, result)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for name, data in (("stdout", out), ("stderr", err)):
            if data:
                self.wfile.write(("event: %s\ndata: %s\n\n" % (name, json.dumps({"data": data}))).encode())
                self.wfile.flush()
        self.wfile.write(("event: result\ndata: %s\n\n" % json.dumps(result)).encode())
        self.close_connection = True

    def files(self, s, q):
        if self.command == "PUT":
            p = q.get("path", "")
            if not p.startswith("/"):
                return self.error(400, "invalid_request", "path")
            s["files"][p] = self.body()
            return self.reply(204)
        if "dir" in q:
            d = q["dir"].rstrip("/") + "/"
            names = {}
            for p, data in s["files"].items():
                if p.startswith(d):
                    head = p[len(d):].split("/")
                    names[head[0]] = ("file", len(data)) if len(head) == 1 else ("dir", 0)
            return self.reply(200, {"entries": [{"name": n, "type": t, "size": z} for n, (t, z) in sorted(names.items())]})
        p = q.get("path", "")
        if p not in s["files"]:
            return self.error(404, "not_found", "%s: no such file" % p)
        return self.reply(200, raw=s["files"][p], ctype="application/octet-stream")

    def pause(self, sid, s):
        with LOCK:
            if s["busy"]:
                return self.error(409, "busy", "a command runs")
            SESSIONS.pop(sid, None)
        snap = {"customer": s["customer"], "files": {p: d.decode("latin-1") for p, d in s["files"].items()}}
        path = os.path.join(ARGS.snapshots, sid + ".json")
        with open(path + ".tmp", "w") as f:
            json.dump(snap, f)
        os.rename(path + ".tmp", path)
        log("session", sid, "paused")
        return self.reply(200, {"id": sid, "state": "paused",
                                "snapshot": {"bucket": "kiln", "prefix": "%s/sessions/%s/" % (s["customer"], sid),
                                             "bytes": os.path.getsize(path), "pause_ms": 5}})

    def resume(self, sid):
        j = self.json_body()
        if not j or set(j) != {"customer", "spec"} or check_spec(j["spec"]):
            return self.error(400, "invalid_request", "customer, spec")
        try:
            with open(os.path.join(ARGS.snapshots, sid + ".json")) as f:
                snap = json.load(f)
        except OSError:
            return self.error(404, "no_snapshot", "no snapshot of %s" % sid)
        if snap.get("customer") != j["customer"]:
            return self.error(404, "no_snapshot", "no snapshot of %s for %s" % (sid, j["customer"]))
        with LOCK:
            if sid in SESSIONS:
                return self.error(409, "duplicate", "exists")
            _, m = used()
            if m + j["spec"]["limits"]["memory_mib"] > ARGS.memory_mib:
                return self.error(503, "no_capacity", "memory")
            s = {"customer": j["customer"], "spec": j["spec"], "busy": False, "created_ms": now_ms(),
                 "last_active_ms": now_ms(), "files": {p: d.encode("latin-1") for p, d in snap["files"].items()}}
            SESSIONS[sid] = s
        log("session", sid, "resumed")
        return self.reply(200, session_obj(sid, s))

    do_GET = do_POST = do_PUT = do_DELETE = route


def heartbeat():
    url = "%s/v1/hosts/%s/heartbeat" % (ARGS.api, ARGS.host_id)
    while True:
        body = json.dumps({"url": "http://" + ARGS.listen, "capacity": capacity()}).encode()
        req = urllib.request.Request(url, data=body, method="POST", headers={
            "Authorization": "Bearer " + ARGS.token, "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=2).read()
        except OSError as e:
            log("heartbeat:", e)
        time.sleep(0.3)


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--host-id", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--api", required=True)
    p.add_argument("--snapshots", required=True)
    p.add_argument("--memory-mib", type=int, default=4096)
    ARGS = p.parse_args()
    host, port = ARGS.listen.rsplit(":", 1)
    srv = ThreadingHTTPServer((host, int(port)), Handler)
    srv.daemon_threads = True
    threading.Thread(target=heartbeat, daemon=True).start()
    log("listening on", ARGS.listen)
    srv.serve_forever()


if __name__ == "__main__":
    main()
