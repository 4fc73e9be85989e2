#!/usr/bin/env python3
"""A fake kiln-host that heartbeats to kiln-api.

    fake_host.py PORT API_URL CLUSTER_TOKEN COUNT_FILE [STATE_DIR]

Without STATE_DIR (72-big-logs.sh): it accepts every task, says on the event
stream that the task is final, and then answers every GET of the task with
500, counting those GETs in COUNT_FILE, so a test can see whether kiln-api's
watcher backs off or spins.

With STATE_DIR (76-templates-api.sh): templates (docs/templates.md). Its
heartbeat lists the built-ins `default` and `python-data` and every template
it built; it answers /v1/builds (POST, GET, GET .../events with log lines
and a final `end`, DELETE), where the recipe decides the outcome: a `run`
step "exit N" (N != 0) fails the build, "spam N" logs N lines of 100 bytes, a name starting with "slow" builds
until cancelled, one starting with "forget" is forgotten (404) the first
time. Each POST /v1/tasks, /v1/sessions (/v1/sessions/ID/resume:
ID-resume.json), /v1/builds and DELETE /v1/builds/ID body is written to
STATE_DIR/{tasks,sessions,builds,cancelled}/ID.json; a pause answers a fake
snapshot; tasks succeed at once. STATE_DIR/full present: the heartbeat reports every vCPU
used (tasks stay queued).
"""
import hashlib
import json
import os
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, API, TOKEN, COUNT_FILE = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
STATE = sys.argv[5] if len(sys.argv) > 5 else None
gets = 0
lock = threading.Lock()
builds = {}      # id -> {"state", "name", "log": [...], "template"?, "error"?}
forgotten = set()

if STATE:
    for d in ("tasks", "sessions", "builds", "cancelled"):
        os.makedirs(os.path.join(STATE, d), exist_ok=True)


def save(kind, ident, body):
    with open(os.path.join(STATE, kind, "%s.json" % ident), "w") as f:
        json.dump(body, f)


def start_build(body):
    bid = body.get("id")
    recipe = body.get("recipe") or {}
    name = recipe.get("name") or body.get("name") or ""
    b = {"state": "building", "name": name, "log": ["fake build of %s: start" % name]}
    steps = recipe.get("run") or []
    for i, step in enumerate(steps):
        b["log"].append("run[%d]: %s" % (i, step))
        if step.startswith("spam "):  # "spam N": N lines of 100 bytes
            b["log"].extend("%06d %s" % (n, "s" * 93) for n in range(int(step[5:])))
    for p in recipe.get("packages") or []:
        b["log"].append("installing %s" % p)
    failing = [s for s in steps if s.startswith("exit ") and s != "exit 0"]
    if name.startswith("forget") and bid not in forgotten:
        forgotten.add(bid)
        b["forget"] = True
    if failing:
        b["state"] = "failed"
        b["error"] = {"code": "build_failed",
                      "message": "run[%d] exited with status %s" % (steps.index(failing[0]), failing[0][5:])}
        b["log"].append("build failed")
    elif not name.startswith("slow"):
        sha = hashlib.sha256(("fake:" + bid).encode()).hexdigest()
        b["state"] = "ready"
        b["template"] = {"name": name, "sha256": sha, "size": 1048576, "s3_key": "_templates/%s.ext4" % sha,
                         "env": ["FROM_TEMPLATE=yes", "LANG=C.UTF-8"], "workdir": "/srv", "uid": 1000, "gid": 1000}
        b["log"].append("build done")
    builds[bid] = b


def build_json(bid, b):
    j = {"id": bid, "state": b["state"], "log_tail": "\n".join(b["log"][-20:])}
    if "template" in b:
        j["template"] = b["template"]
    if "error" in b:
        j["error"] = b["error"]
    return j


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, ctype="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        parts = self.path.split("?")[0].strip("/").split("/")
        if STATE and parts == ["v1", "builds"]:
            with lock:
                if body.get("id") in builds:
                    return self.reply(409, '{"error":{"code":"duplicate","message":"known build"}}')
                save("builds", body.get("id"), body)
                start_build(body)
            return self.reply(202, json.dumps({"id": body.get("id"), "state": "building"}))
        if STATE and parts == ["v1", "tasks"]:
            save("tasks", body.get("id"), body)
        if STATE and parts[:2] == ["v1", "sessions"]:
            if len(parts) == 4 and parts[3] == "pause":
                return self.reply(200, json.dumps({"id": parts[2], "state": "paused",
                                                   "snapshot": {"key": "fake/%s" % parts[2]}}))
            sid = body.get("id") or parts[2]
            save("sessions", sid + ("-" + parts[3] if len(parts) == 4 else ""), body)
            return self.reply(201 if len(parts) == 2 else 200, json.dumps({"id": sid, "state": "running"}))
        self.reply(202, json.dumps({"id": body.get("id"), "state": "accepted"}))

    def do_DELETE(self):
        parts = self.path.split("?")[0].strip("/").split("/")
        if STATE and len(parts) == 3 and parts[:2] == ["v1", "builds"]:
            with lock:
                b = builds.get(parts[2])
                save("cancelled", parts[2], {"id": parts[2]})
                if not b:
                    return self.reply(404, '{"error":{"code":"not_found","message":"no such build"}}')
                if b["state"] == "building":
                    b["state"] = "failed"
                    b["error"] = {"code": "cancelled", "message": "the build was cancelled"}
            return self.reply(202, "{}")
        self.reply(200, "{}")

    def build_events(self, bid):
        with lock:
            b = builds.get(bid)
        if not b or b.get("forget"):
            return self.reply(404, '{"error":{"code":"not_found","message":"no such build"}}')
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(text):
            data = text.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            for line in b["log"]:
                chunk("event: log\ndata: %s\n\n" % json.dumps({"line": line}))
            while b["state"] == "building":
                chunk(": keepalive\n\n")
                time.sleep(0.5)
            end = {"state": b["state"]}
            for k in ("template", "error"):
                if k in b:
                    end[k] = b[k]
            chunk("event: end\ndata: %s\n\n" % json.dumps(end))
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        global gets
        parts = self.path.split("?")[0].strip("/").split("/")
        if STATE and len(parts) >= 3 and parts[:2] == ["v1", "builds"]:
            if len(parts) == 4 and parts[3] == "events":
                return self.build_events(parts[2])
            with lock:
                b = builds.get(parts[2])
                if b and b.get("forget"):
                    del builds[parts[2]]  # "restarted": the next POST starts it afresh
                    b = None
            if not b:
                return self.reply(404, '{"error":{"code":"not_found","message":"no such build"}}')
            return self.reply(200, json.dumps(build_json(parts[2], b)))
        if parts == ["v1", "tasks"]:
            self.reply(200, '{"tasks":[]}')
        elif parts == ["v1", "sessions"]:
            self.reply(200, '{"sessions":[]}')
        elif len(parts) == 4 and parts[3] == "events":
            self.reply(200, 'event: state\ndata: {"state":"succeeded","at":1}\n\n', "text/event-stream")
        elif len(parts) == 3 and parts[:2] == ["v1", "tasks"]:
            if STATE:
                return self.reply(200, json.dumps({"id": parts[2], "state": "succeeded",
                                                   "result": {"end_reason": "exited", "exit_code": 0}}))
            with lock:
                gets += 1
                with open(COUNT_FILE, "w") as f:
                    f.write(str(gets))
            self.reply(500, '{"error":{"code":"host_error","message":"fake host: this GET always fails"}}')
        else:
            self.reply(404, '{"error":{"code":"not_found","message":"no"}}')


def capacity():
    cap = {"vcpus": {"total": 8, "used": 0}, "memory_mib": {"total": 8192, "used": 0}}
    if STATE:
        cap["egress"] = True
        if os.path.exists(os.path.join(STATE, "full")):
            cap["vcpus"]["used"] = 8
        t = [{"name": "default", "sha256": None, "builtin": True, "ready": 1, "snapshot": True},
             {"name": "python-data", "sha256": None, "builtin": True, "ready": 0, "snapshot": False}]
        with lock:
            for b in builds.values():
                if b["state"] == "ready":
                    t.append({"name": b["name"], "sha256": b["template"]["sha256"], "builtin": False, "ready": 0,
                              "snapshot": False})
        cap["templates"] = t
    return cap


def heartbeat():
    while True:
        body = json.dumps({"url": "http://127.0.0.1:%d" % PORT, "capacity": capacity()}).encode()
        try:
            req = urllib.request.Request(API + "/v1/hosts/fake/heartbeat", data=body, method="POST",
                                         headers={"Authorization": "Bearer " + TOKEN,
                                                  "Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=5).read()
        except Exception as e:  # kiln-api restarting or gone: try again
            print("fake_host: heartbeat: %s" % e, file=sys.stderr)
        time.sleep(0.5)


threading.Thread(target=heartbeat, daemon=True).start()
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
