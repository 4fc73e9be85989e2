#!/usr/bin/python3
# A stand-in kiln-api for tests/integration/103-mcp-code.sh: answers POST
# /v1/sessions/{id}/code as kiln-api would (docs/api.md "Code") and records
# each request's body in DIR/requests.jsonl. Session s_plot: a figure (PNG),
# a JPEG and a main result; s_err: an exception; s_plain: 409
# no_interpreter. Prints its port on stdout once listening.
#   usage: mcp_code_api.py DIR
import http.server, json, os, sys

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
JPEG = "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAP////////////////////////////////////////////////////////////////////////////////////8AAAsIAAEAAQEBEQD/xAAUAAEAAAAAAAAAAAAAAAAAAAAD/8QAFBABAAAAAAAAAAAAAAAAAAAAAP/aAAgBAQAAPwA//9k="
DIR = sys.argv[1]


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

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with open(os.path.join(DIR, "requests.jsonl"), "a") as f:
            f.write(json.dumps({"path": self.path, "auth": self.headers.get("Authorization"), "body": body}) + "\n")
        sid = self.path.split("/")[3] if self.path.startswith("/v1/sessions/") else ""
        if sid == "s_plain":
            return self.answer(409, {"error": {"code": "no_interpreter", "message": "session s_plain has no code interpreter"}})
        ex = {"results": [], "logs": {"stdout": ["hello\n"], "stderr": []}, "error": None, "execution_count": 3}
        if sid == "s_plot":
            ex["results"] = [
                {"text": "<Figure>", "png": PNG, "chart": {"type": "line"}, "is_main_result": False},
                {"text": "photo", "jpeg": JPEG, "is_main_result": False},
                {"text": "df", "html": "<table></table>", "data": {"a": [1, 2]}, "is_main_result": False},
                {"text": "2", "is_main_result": True}]
        elif sid == "s_err":
            ex["error"] = {"name": "ValueError", "value": "boom", "traceback": "Traceback...\nValueError: boom\n"}
        self.answer(200, ex)


srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
