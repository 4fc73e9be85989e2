#!/usr/bin/python3
# A stand-in kiln-api for the web console's code view (tests/integration/
# 103-console-code-fake.sh; no VM): serves ui/ with kiln-api's headers (the
# CSP from api/http/ui.h) and answers what tests/console/code_test.mjs makes
# the page ask for: a customer's usage, a finished task of template
# python-data with a 7x5 PNG output (GET /v1/tasks/{id}/outputs/0), a
# session of code-interpreter, and POST /v1/sessions/{id}/code with a
# figure (a 160x120 PNG), a DataFrame, hostile HTML and a main result 2, as
# kiln-api answers them (docs/api.md). Prints its port once listening.
#   usage: fake_api.py UI_DIR KEY
import http.server, json, os, re, struct, sys, zlib, base64

UI, KEY = sys.argv[1], sys.argv[2]
TASK, SESSION = "t_" + "a" * 32, "s_" + "b" * 32
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def png(w, h):
    def chunk(k, d):
        return struct.pack(">I", len(d)) + k + d + struct.pack(">I", zlib.crc32(k + d))
    raw = b"".join(b"\x00" + b"\x20\x60\xc0" * w for _ in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


HOSTILE = ('<p id="hello">hello from html</p><script>parent.document.title = "pwned"</script>'
           '<img src="x" onerror="parent.document.title = 1">')
TASK_JSON = {"id": TASK, "customer": "acme", "state": "succeeded", "created_at": 1764680000000, "template": "python-data",
             "result": {"exit_code": 0, "stdout": "ok\n", "stderr": ""},
             "outputs": [{"path": "plot.png", "size": len(png(7, 5)), "url": "http://s3.invalid/plot.png"}],
             "artifacts": {}}
SESSION_JSON = {"id": SESSION, "state": "running", "template": "code-interpreter", "created_at": 1764680000000}


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, body, ctype="application/json", extra=()):
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def authed(self):
        if self.headers.get("Authorization") != "Bearer " + KEY:
            self.send(401, {"error": {"code": "unauthorized", "message": "unknown or revoked API key"}})
            return False
        return True

    def do_GET(self):
        p = self.path.split("?")[0]
        if p in ("/ui", "/ui/") or p.startswith("/ui/"):
            name = "index.html" if p in ("/ui", "/ui/") else p[4:]
            if not re.fullmatch(r"[A-Za-z0-9_-]+\.(html|js|css)", name):
                return self.send(404, b"not found", "text/plain")
            ctype = {"html": "text/html", "js": "text/javascript", "css": "text/css"}[name.rsplit(".", 1)[1]]
            return self.send(200, open(os.path.join(UI, name), "rb").read(), ctype + "; charset=utf-8",
                             [("Content-Security-Policy", CSP), ("X-Content-Type-Options", "nosniff")])
        if not self.authed():
            return
        if p == "/v1/usage":
            return self.send(200, {"customer": "acme", "usage": {}, "quotas": {}})
        if p == "/v1/tasks":
            return self.send(200, {"tasks": [{k: v for k, v in TASK_JSON.items() if k not in ("result", "outputs", "artifacts")}],
                                   "next_cursor": None})
        if p == "/v1/tasks/" + TASK:
            return self.send(200, TASK_JSON)
        if p == "/v1/tasks/%s/outputs/0" % TASK:
            return self.send(200, png(7, 5), "application/octet-stream", [("Content-Disposition", "attachment")])
        if p == "/v1/sessions":
            return self.send(200, {"sessions": [SESSION_JSON], "next_cursor": None})
        if p == "/v1/sessions/" + SESSION:
            return self.send(200, SESSION_JSON)
        if p == "/v1/sessions/%s/files" % SESSION:
            return self.send(200, {"entries": []})
        self.send(404, {"error": {"code": "not_found", "message": "no such endpoint"}})

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(n) or b"{}")
        if not self.authed():
            return
        if self.path == "/v1/sessions/%s/code" % SESSION and body.get("code"):
            ex = {"results": [
                {"text": "<Figure size 160x120>", "png": base64.b64encode(png(160, 120)).decode(),
                 "chart": {"type": "line", "title": "from the page"}, "is_main_result": False},
                {"text": "   col_a col_b", "html": "<table><tr><td>1</td></tr></table>",
                 "data": {"col_a": [1, 2], "col_b": ["x", "y"]}, "is_main_result": False},
                {"text": "<Hostile>", "html": HOSTILE, "is_main_result": False},
                {"text": "2", "is_main_result": True}],
                "logs": {"stdout": [], "stderr": []}, "error": None, "execution_count": 1}
            if "text/event-stream" not in (self.headers.get("Accept") or ""):
                return self.send(200, ex)
            # As kiln-api streams it: one event a result, in order, then the count and the end.
            events = [("stdout", {"text": "started\n"})] + [("result", r) for r in ex["results"]] + [
                ("execution_count", {"execution_count": 1}), ("end", {"execution_count": 1})]
            data = "".join("event: %s\ndata: %s\n\n" % (n, json.dumps(d)) for n, d in events).encode()
            return self.send(200, data, "text/event-stream")
        self.send(404, {"error": {"code": "not_found", "message": "no such endpoint"}})


srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
