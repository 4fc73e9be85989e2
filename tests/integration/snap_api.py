#!/usr/bin/python3
# A stand-in kiln-api for the clients of issue 41's fork and named snapshots
# (tests/integration/106-snapshot-clients.sh: the CLI, the Python SDK and
# kiln mcp, no VM). It answers as /work/wt/CONTRACT-41.md's kiln-api section
# (docs/api.md "Snapshots") says, from memory, and records every request
# (method, path, key, body) in DIR/requests.jsonl. Prints its port on stdout
# once listening.
#
# The world it holds: session s_run (running), s_paused (paused: snapshot and
# fork are 409 not_running), s_full (running, but no room: every fork is
# refused), s_two (running: a fork gets at most 2 children, the rest refused
# with quota_exceeded). Snapshot listings come PAGE (2) at a time whatever
# limit asks, so that a client must follow "next". Only KEY is accepted.
#   usage: snap_api.py DIR KEY
import http.server
import json
import os
import sys
import threading
import urllib.parse

DIR, KEY = sys.argv[1], sys.argv[2]
PAGE = 2
LOCK = threading.Lock()
SESSIONS = {sid: {"id": sid, "state": st, "template": "default", "host": "h1",
                  "limits": {"vcpus": 1, "memory_mib": 256}, "idle_timeout_s": 600, "max_lifetime_s": 3600}
            for sid, st in (("s_run", "running"), ("s_paused", "paused"), ("s_full", "running"), ("s_two", "running"))}
SNAPS = []  # oldest first
COUNTER = [0]


def err(code, message):
    return {"error": {"code": code, "message": message}}


def new_session(extra):
    COUNTER[0] += 1
    sid = "s_%032x" % (0xc0ffee00 + COUNTER[0])
    s = {"id": sid, "state": "running", "template": "default", "host": "h1",
         "limits": {"vcpus": 1, "memory_mib": 256}, "idle_timeout_s": 600, "max_lifetime_s": 3600}
    s.update(extra)
    SESSIONS[sid] = s
    return s


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def answer(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_any(self, method):
        n = int(self.headers.get("Content-Length", 0) or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return self.answer(400, err("invalid_json", "the body is not JSON"))
        u = urllib.parse.urlsplit(self.path)
        with open(os.path.join(DIR, "requests.jsonl"), "a") as f:
            f.write(json.dumps({"method": method, "path": self.path, "auth": self.headers.get("Authorization"),
                                "body": body}) + "\n")
        if self.headers.get("Authorization") != "Bearer " + KEY:
            return self.answer(401, err("unauthorized", "unknown key"))
        parts = u.path.strip("/").split("/")
        q = dict(urllib.parse.parse_qsl(u.query))
        with LOCK:
            return self.route(method, parts, q, body if isinstance(body, dict) else {})

    def route(self, method, parts, q, body):
        if parts[:2] != ["v1", "sessions"] and parts[:2] != ["v1", "snapshots"]:
            return self.answer(404, err("not_found", "no route"))
        if parts == ["v1", "sessions"] and method == "POST":
            snap = body.get("snapshot")
            if not snap:
                return self.answer(201, new_session({}))
            if any(k in body for k in ("template", "network")) or \
                    any(k in (body.get("limits") or {}) for k in ("vcpus", "memory_mib")):
                return self.answer(400, err("invalid_request", "snapshot: vcpus, memory, template and network "
                                                               "come from the snapshot"))
            sn = next((x for x in SNAPS if x["id"] == snap), None)
            if not sn:
                return self.answer(404, err("not_found", "no snapshot %s" % snap))
            return self.answer(201, new_session({"snapshot_id": snap, "template": sn["template"]}))
        if parts[1] == "sessions" and len(parts) >= 3:
            s = SESSIONS.get(parts[2])
            if not s:
                return self.answer(404, err("not_found", "no session %s" % parts[2]))
            rest = parts[3:]
            if rest == [] and method == "GET":
                return self.answer(200, s)
            if rest == [] and method == "DELETE":
                s["state"] = "destroyed"
                return self.answer(200, s)
            if rest == ["snapshots"] and method == "POST":
                if s["state"] != "running":
                    return self.answer(409, err("not_running", "session %s is %s: resume it first" % (s["id"], s["state"])))
                COUNTER[0] += 1
                sn = {"id": "snap_%032x" % (0xabc000 + COUNTER[0]), "name": body.get("name"), "session_id": s["id"],
                      "template": s["template"], "vcpus": 1, "memory_mib": 256, "bytes": 71892992,
                      "created_ms": 1796630400000 + COUNTER[0] * 1000, "stop_ms": 12}
                SNAPS.append(sn)
                return self.answer(201, sn)
            if rest == ["fork"] and method == "POST":
                count = body.get("count", 1)
                if not isinstance(count, int) or not 1 <= count <= 20:
                    return self.answer(400, err("invalid_request", "count: 1 to 20"))
                if s["state"] != "running":
                    return self.answer(409, err("not_running", "session %s is %s" % (s["id"], s["state"])))
                room = {"s_full": 0, "s_two": 2}.get(s["id"], 20)
                kids = [new_session({"template": s["template"]}) for _ in range(min(count, room))]
                errs = [err("quota_exceeded", "max_sessions (4) reached")["error"]
                        for _ in range(count - len(kids))]
                return self.answer(200, {"parent": s["id"], "stop_ms": 7, "sessions": kids, "errors": errs})
            return self.answer(404, err("not_found", "no route"))
        # /v1/snapshots...
        if len(parts) == 2 and method == "GET":
            items = [x for x in reversed(SNAPS)
                     if (not q.get("name") or x["name"] == q["name"])
                     and (not q.get("session_id") or x["session_id"] == q["session_id"])]
            start = int(q["after"][4:]) if q.get("after", "").startswith("tok-") else 0
            limit = min(int(q.get("limit", 100)), PAGE)
            page = items[start:start + limit]
            nxt = "tok-%d" % (start + limit) if start + limit < len(items) else None
            return self.answer(200, {"snapshots": page, "next": nxt})
        if len(parts) == 3:
            sn = next((x for x in SNAPS if x["id"] == parts[2]), None)
            if not sn:
                return self.answer(404, err("not_found", "no snapshot %s" % parts[2]))
            if method == "GET":
                return self.answer(200, sn)
            if method == "DELETE":
                SNAPS.remove(sn)
                return self.answer(200, {"id": sn["id"], "deleted": True})
        return self.answer(404, err("not_found", "no route"))

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_DELETE(self):
        self.handle_any("DELETE")


srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
