# Servers a port test runs inside a sandbox (tests/integration/97-ports-host.sh,
# 98-ports.sh): an echo server on 7000 (each connection's bytes back, then
# its end once the client's ends), a flood on 7001 (writes without end), a
# sink on 7002 (never reads), and HTTP on 8000: GET /big (the file
# /tmp/big), GET /sse (five events, 0.1 s apart), POST / (the body's sha256
# and length), GET /hdr (the request's headers as JSON), GET /ws (a WebSocket
# that echoes every message). Each request's method and path is appended to
# /tmp/requests.log.
import base64
import hashlib
import http.server
import struct
import json
import socket
import socketserver
import threading
import time


def echo_conn(c):
    while True:
        d = c.recv(65536)
        if not d:
            break
        c.sendall(d)
    c.shutdown(socket.SHUT_WR)
    c.close()


def flood_conn(c):
    block = b"x" * 65536
    try:
        while True:
            c.sendall(block)
    except OSError:
        c.close()


def sink_conn(c):
    time.sleep(3600)  # never reads


def serve(port, handler):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(256)
    while True:
        c, _ = s.accept()
        threading.Thread(target=handler, args=(c,), daemon=True).start()


def echo_server():
    serve(7000, echo_conn)


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def ws_echo(self):
        key = self.headers.get("Sec-WebSocket-Key", "")
        acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", acc.decode())
        self.end_headers()
        self.wfile.flush()
        r = self.rfile
        while True:
            h = r.read(2)
            if len(h) < 2:
                return
            op, n = h[0] & 0x0F, h[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4) if h[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if n < 126:
                out = bytes([0x80 | op, n])
            elif n < 65536:
                out = bytes([0x80 | op, 126]) + struct.pack(">H", n)
            else:
                out = bytes([0x80 | op, 127]) + struct.pack(">Q", n)
            self.wfile.write(out + data)
            self.wfile.flush()
            if op == 8:
                self.close_connection = True
                return

    def do_GET(self):
        with open("/tmp/requests.log", "a") as f:
            f.write("GET %s\n" % self.path)
        self.path = self.path.split("?", 1)[0]
        if self.path == "/ws":
            return self.ws_echo()
        if self.path == "/big":
            n = 0
            with open("/tmp/big", "rb") as f:
                data = f.read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(5):
                self.wfile.write(("data: %d %f\n\n" % (i, time.time())).encode())
                self.wfile.flush()
                time.sleep(0.1)
            self.close_connection = True
        elif self.path == "/hdr":
            b = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)
        else:
            b = b"hello from the sandbox\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

    def do_POST(self):
        with open("/tmp/requests.log", "a") as f:
            f.write("POST %s\n" % self.path)
        h = hashlib.sha256()
        n = 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                d = self.rfile.read(size)
                h.update(d)
                n += len(d)
                self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length", "0"))
            while left:
                d = self.rfile.read(min(left, 65536))
                if not d:
                    break
                h.update(d)
                n += len(d)
                left -= len(d)
        b = ("%s %d\n" % (h.hexdigest(), n)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)


class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


threading.Thread(target=echo_server, daemon=True).start()
threading.Thread(target=serve, args=(7001, flood_conn), daemon=True).start()
threading.Thread(target=serve, args=(7002, sink_conn), daemon=True).start()
S(("127.0.0.1", 8000), H).serve_forever()
