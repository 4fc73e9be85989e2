#!/usr/bin/env python3
"""A lying kiln-host for tests/integration/68-session-stall.sh (issue 13,
item 8): it registers with kiln-api with the cluster token, takes tasks,
ends each at once as succeeded, and reports outputs and logs whose S3 keys
name another customer's objects (a paused session's RAM and disk) besides
one honest output. kiln-api must not sign URLs for the lying keys.

usage: lying_host.py API_URL TOKEN PORT HOST_ID VICTIM
"""
import json
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

api, token, port, host_id, victim = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
tasks = {}
lock = threading.Lock()
CAPACITY = {"host_id": host_id, "accel": "tcg", "vcpus": {"total": 64, "used": 0},
            "memory_mib": {"total": 65536, "used": 0}, "running_tasks": 0, "uploading_tasks": 0,
            "pool": {"ready": 0, "prestarted": 0, "memory_mib": 0, "vcpus": 0}, "egress": False}


def task_json(t):
    own = "%s/%s/" % (t["customer"], t["id"])
    return {"id": t["id"], "customer": t["customer"], "state": "succeeded",
            "result": {"state": "succeeded", "exit_code": 0, "end_reason": "exited", "stdout": "", "stderr": ""},
            "outputs": [
                {"path": "ok.txt", "size": 2, "sha256": "0" * 64, "s3_key": own + "outputs/ok.txt"},
                {"path": "ram", "size": 1, "sha256": "0" * 64, "s3_key": victim + "/sessions/s_victim/state"},
                {"path": "up", "size": 1, "sha256": "0" * 64,
                 "s3_key": own + "outputs/%2e%2e/%2e%2e/" + victim + "/sessions/s_victim/state"},
            ],
            "artifacts": {
                "stdout.log": {"s3_key": own + "stdout.log", "size": 0, "sha256": "0" * 64},
                "stderr.log": {"s3_key": victim + "/sessions/s_victim/disk.qcow2", "size": 0, "sha256": "0" * 64},
            }}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *a):
        pass

    def reply(self, status, obj, ctype="application/json"):
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def authorized(self):
        if self.headers.get("Authorization") != "Bearer " + token:
            self.reply(401, {"error": {"code": "unauthorized", "message": "token"}})
            return False
        return True

    def do_POST(self):
        if not self.authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path == "/v1/tasks":
            with lock:
                tasks[body["id"]] = {"id": body["id"], "customer": body["customer"]}
            self.reply(202, {"id": body["id"], "state": "accepted"})
        else:
            self.reply(404, {"error": {"code": "not_found", "message": self.path}})

    def do_DELETE(self):
        if self.authorized():
            self.reply(404, {"error": {"code": "not_found", "message": self.path}})

    def do_GET(self):
        if not self.authorized():
            return
        p = self.path.split("?")[0]
        with lock:
            known = dict(tasks)
        if p == "/v1/tasks":
            self.reply(200, {"tasks": [task_json(t) for t in known.values()]})
        elif p == "/v1/sessions":
            self.reply(200, {"sessions": []})
        elif p == "/v1/capacity":
            self.reply(200, CAPACITY)
        elif p.startswith("/v1/tasks/") and p.endswith("/events") and p[10:-7] in known:
            ev = "event: state\ndata: %s\n\n" % json.dumps({"state": "succeeded", "at": int(time.time() * 1000)})
            self.reply(200, ev.encode(), "text/event-stream")
        elif p.startswith("/v1/tasks/") and p[10:] in known:
            self.reply(200, task_json(known[p[10:]]))
        else:
            self.reply(404, {"error": {"code": "not_found", "message": p}})


def heartbeat():
    while True:
        req = urllib.request.Request(
            "%s/v1/hosts/%s/heartbeat" % (api, host_id),
            data=json.dumps({"url": "http://127.0.0.1:%d" % port, "capacity": CAPACITY}).encode(),
            headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"}, method="POST")
        try:
            urllib.request.urlopen(req, timeout=5).read()
        except Exception as e:  # kiln-api not up yet: retry
            sys.stderr.write("heartbeat: %s\n" % e)
        time.sleep(0.5)


threading.Thread(target=heartbeat, daemon=True).start()
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
