#!/usr/bin/python3
"""A reverse proxy in front of the real Debian mirror for 81-template-recipe.sh.

The build VM's network lives in a test namespace; this proxy, in the root
namespace on the namespace's veth peer address, passes GET/HEAD requests on to
the mirror (the real one: the test installs real packages), so that the test
needs no forwarding or NAT in the root namespace. Counts requests in a file.
usage: mirror_proxy.py ADDR PORT UPSTREAM_URL COUNT_FILE
"""
import http.server
import shutil
import sys
import urllib.error
import urllib.request

addr, port, upstream, count_file = sys.argv[1], int(sys.argv[2]), sys.argv[3].rstrip("/"), sys.argv[4]
served = 0


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def forward(self, body):
        global served
        path = self.path
        if not path.startswith("/debian/"):
            self.send_error(404)
            return
        req = urllib.request.Request(upstream + path[len("/debian"):], method=self.command)
        try:
            resp = urllib.request.urlopen(req, timeout=60)
        except urllib.error.HTTPError as e:
            resp = e
        except OSError:
            self.send_error(502)
            return
        with resp:
            self.send_response(resp.status)
            for k in ("Content-Type", "Content-Length", "Last-Modified", "ETag"):
                if resp.headers.get(k):
                    self.send_header(k, resp.headers[k])
            if not resp.headers.get("Content-Length"):
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if body:
                shutil.copyfileobj(resp, self.wfile, 1 << 16)
        served += 1
        with open(count_file, "w") as f:
            f.write(str(served))

    def do_GET(self):
        self.forward(True)

    def do_HEAD(self):
        self.forward(False)


http.server.ThreadingHTTPServer.daemon_threads = True
http.server.ThreadingHTTPServer((addr, port), Proxy).serve_forever()
