#!/usr/bin/env python3
"""A fake kiln-host for 72-big-logs.sh: it heartbeats to kiln-api, accepts
every task, says on the event stream that the task is final, and then
answers every GET of the task with 500. It counts those GETs in COUNT_FILE,
so a test can see whether kiln-api's watcher backs off or spins.

    fake_host.py PORT API_URL CLUSTER_TOKEN COUNT_FILE
"""
import json
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, API, TOKEN, COUNT_FILE = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
gets = 0
lock = threading.Lock()


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
        self.reply(202, json.dumps({"id": body.get("id"), "state": "accepted"}))

    def do_DELETE(self):
        self.reply(200, "{}")

    def do_GET(self):
        global gets
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts == ["v1", "tasks"]:
            self.reply(200, '{"tasks":[]}')
        elif len(parts) == 4 and parts[3] == "events":
            self.reply(200, 'event: state\ndata: {"state":"succeeded","at":1}\n\n', "text/event-stream")
        elif len(parts) == 3 and parts[:2] == ["v1", "tasks"]:
            with lock:
                gets += 1
                with open(COUNT_FILE, "w") as f:
                    f.write(str(gets))
            self.reply(500, '{"error":{"code":"host_error","message":"fake host: this GET always fails"}}')
        else:
            self.reply(404, '{"error":{"code":"not_found","message":"no"}}')


def heartbeat():
    body = json.dumps({"url": "http://127.0.0.1:%d" % PORT,
                       "capacity": {"vcpus": {"total": 8, "used": 0},
                                    "memory_mib": {"total": 8192, "used": 0}}}).encode()
    while True:
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
