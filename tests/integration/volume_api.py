#!/usr/bin/python3
# A stand-in kiln-api for the clients of issue 41's volumes
# (tests/integration/110-volume-clients.sh: the CLI, the Python SDK and
# kiln mcp, no VM). It answers as /work/wt/CONTRACT-41-volumes.md's kiln-api
# section (docs/api.md "Volumes") says, from memory, and records every
# request (method, path, key, body) in DIR/requests.jsonl. Prints its port
# on stdout once listening.
#
# Its rules, as kiln-api's: volume names 1-63 of [A-Za-z0-9._-], unique
# among the volumes not deleted (409 conflict); size_mib default 1024,
# 16..65536 and at most MAX_MIB (400 invalid_request); at most MAX_VOLUMES
# (429 quota_exceeded). A session mounts at most 2, by name (400
# invalid_request "no volume named X"); a read-write mount of a volume that
# another session not destroyed mounts read-write is 409 volume_busy;
# read-only ones may be many. A volume mounted by a session not destroyed
# is 409 volume_busy to DELETE; a volume named "nohost-..." is 503
# host_unavailable to DELETE (no host to delete its objects). A fork or
# snapshot of a session with a read-write volume is 409 volume_attached.
# "bytes" in GET /v1/volumes/{id}: 4096 once a read-write session of it was
# destroyed, else null. Only KEY is accepted.
#   usage: volume_api.py DIR KEY
import http.server
import json
import os
import re
import sys
import threading
import time
import urllib.parse

DIR, KEY = sys.argv[1], sys.argv[2]
MAX_VOLUMES, MAX_MIB = 5, 10240
NAME = re.compile(r"^[A-Za-z0-9._-]{1,63}$")
LOCK = threading.Lock()
SESSIONS = {}
VOLUMES = []  # oldest first
COUNTER = [0]


def err(code, message):
    return {"error": {"code": code, "message": message}}


def mounted_by(v):
    return [{"session_id": s["id"], "read_only": m["read_only"]}
            for s in SESSIONS.values() if s["state"] != "destroyed"
            for m in s.get("volumes", []) if m["id"] == v["id"]]


def show(v, with_bytes=False):
    o = dict((k, v[k]) for k in ("id", "name", "size_mib", "created_ms"))
    o["mounted_by"] = mounted_by(v)
    if with_bytes:
        o["bytes"] = v["bytes"]
    return o


def find(key):
    v = next((x for x in VOLUMES if x["id"] == key), None)
    return v or next((x for x in VOLUMES if x["name"] == key), None)


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
        parts = [urllib.parse.unquote(p) for p in u.path.strip("/").split("/")]
        q = dict(urllib.parse.parse_qsl(u.query))
        with LOCK:
            return self.route(method, parts, q, body if isinstance(body, dict) else {})

    def create_session(self, body):
        mounts = body.get("volumes") or []
        if not isinstance(mounts, list) or len(mounts) > 2:
            return self.answer(400, err("invalid_request", "volumes: at most 2"))
        out = []
        for m in mounts:
            v = find(m.get("name")) if isinstance(m, dict) and isinstance(m.get("name"), str) else None
            if not v or v["name"] != m.get("name"):
                return self.answer(400, err("invalid_request", "no volume named %s" % (m.get("name"),)))
            path = m.get("path")
            if not isinstance(path, str) or not path.startswith("/") or path == "/":
                return self.answer(400, err("invalid_request", "volumes[].path: absolute, not /"))
            ro = m.get("read_only", False)
            if not isinstance(ro, bool):
                return self.answer(400, err("invalid_request", "volumes[].read_only: true or false"))
            if not ro and any(not x["read_only"] for x in mounted_by(v)):
                return self.answer(409, err("volume_busy", "volume %s is mounted read-write by another session"
                                            % v["name"]))
            out.append({"name": v["name"], "id": v["id"], "path": path, "read_only": ro})
        COUNTER[0] += 1
        sid = "s_%032x" % (0xc0ffee00 + COUNTER[0])
        s = {"id": sid, "state": "running", "template": "default", "host": "h1",
             "limits": {"vcpus": 1, "memory_mib": 256}, "idle_timeout_s": 600, "max_lifetime_s": 3600,
             "volumes": out}
        SESSIONS[sid] = s
        return self.answer(201, s)

    def route(self, method, parts, q, body):
        if parts == ["v1", "sessions"] and method == "POST":
            return self.create_session(body)
        if parts[:2] == ["v1", "sessions"] and len(parts) >= 3:
            s = SESSIONS.get(parts[2])
            if not s:
                return self.answer(404, err("not_found", "no session %s" % parts[2]))
            rest = parts[3:]
            if rest == [] and method == "GET":
                return self.answer(200, s)
            if rest == [] and method == "DELETE":
                if s["state"] != "destroyed":
                    for m in s["volumes"]:
                        v = find(m["id"])
                        if v and not m["read_only"]:
                            v["bytes"] = 4096
                s["state"] = "destroyed"
                return self.answer(200, s)
            if rest in (["fork"], ["snapshots"]) and method == "POST":
                if any(not m["read_only"] for m in s["volumes"]):
                    return self.answer(409, err("volume_attached", "session %s mounts a volume read-write: it "
                                                "cannot be checkpointed" % s["id"]))
                return self.answer(501, err("not_implemented", "the stand-in does volumes only"))
            return self.answer(404, err("not_found", "no route"))
        if parts[:2] != ["v1", "volumes"]:
            return self.answer(404, err("not_found", "no route"))
        if len(parts) == 2 and method == "POST":
            name, size = body.get("name"), body.get("size_mib", 1024)
            if not isinstance(name, str) or not NAME.match(name):
                return self.answer(400, err("invalid_request", "name: 1-63 of A-Z a-z 0-9 . _ -"))
            if not isinstance(size, int) or isinstance(size, bool) or not 16 <= size <= 65536:
                return self.answer(400, err("invalid_request", "size_mib: 16 to 65536"))
            if size > MAX_MIB:
                return self.answer(400, err("invalid_request", "size_mib: at most max_volume_mib (%d)" % MAX_MIB))
            if find(name) and find(name)["name"] == name:
                return self.answer(409, err("conflict", "a volume named %s exists" % name))
            if len(VOLUMES) >= MAX_VOLUMES:
                return self.answer(429, err("quota_exceeded", "max_volumes (%d) reached" % MAX_VOLUMES))
            COUNTER[0] += 1
            v = {"id": "vol_%024x" % (0xfeed00 + COUNTER[0]), "name": name, "size_mib": size,
                 "created_ms": int(time.time() * 1000) + COUNTER[0], "bytes": None}
            VOLUMES.append(v)
            return self.answer(201, show(v))
        if len(parts) == 2 and method == "GET":
            return self.answer(200, {"volumes": [show(v) for v in reversed(VOLUMES)
                                                 if not q.get("name") or v["name"] == q["name"]]})
        if len(parts) == 3:
            v = find(parts[2])
            if not v:
                return self.answer(404, err("not_found", "no volume %s" % parts[2]))
            if method == "GET":
                return self.answer(200, show(v, with_bytes=True))
            if method == "DELETE":
                if mounted_by(v):
                    return self.answer(409, err("volume_busy", "volume %s is mounted by %s" %
                                                (v["name"], mounted_by(v)[0]["session_id"])))
                if v["name"].startswith("nohost-"):
                    return self.answer(503, err("host_unavailable", "no host to delete the volume's objects"))
                VOLUMES.remove(v)
                return self.answer(200, {"id": v["id"], "deleted": True})
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
