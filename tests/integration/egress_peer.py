#!/usr/bin/env python3
"""Peers for the egress tests, each run inside its own network namespace.

  egress_peer.py http ADDR PORT NAME   answers GET / with NAME, GET /bytes/N with N bytes
  egress_peer.py udp ADDR PORT NAME    echoes NAME back to every datagram
  egress_peer.py dns ADDR PORT NAME=A.B.C.D ...   an upstream resolver: A records
                                       for the names given (TTL 60), NXDOMAIN for others

Every server exits on SIGTERM; none sends anything it was not asked for.
"""
import http.server
import socket
import socketserver
import struct
import sys


def http_server(addr, port, name):
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/bytes/"):
                n = min(int(self.path[7:]), 64 << 20)
                self.send_response(200)
                self.send_header("Content-Length", str(n))
                self.end_headers()
                chunk = b"x" * 65536
                while n > 0:
                    self.wfile.write(chunk[: min(n, len(chunk))])
                    n -= len(chunk)
                return
            body = name.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    S((addr, port), H).serve_forever()


def udp_server(addr, port, name):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    while True:
        _, peer = s.recvfrom(2048)
        s.sendto(name.encode(), peer)


def qname(msg):
    """The question's name (lower-case) and the offset after the question."""
    i, labels = 12, []
    while msg[i]:
        n = msg[i]
        labels.append(msg[i + 1 : i + 1 + n].decode().lower())
        i += 1 + n
    return ".".join(labels), i + 5


def dns_server(addr, port, table):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    while True:
        msg, peer = s.recvfrom(4096)
        try:
            qid, flags = struct.unpack("!HH", msg[:4])
            name, end = qname(msg)
            qtype = struct.unpack("!H", msg[end - 4 : end - 2])[0]
        except Exception:
            continue
        ip = table.get(name)
        answers = b""
        rcode = 3
        if ip:
            rcode = 0
            if qtype == 1:
                answers = struct.pack("!HHHIH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton(ip)
        hdr = struct.pack("!HHHHHH", qid, 0x8180 | (flags & 0x0100) | rcode, 1, 1 if answers else 0, 0, 0)
        s.sendto(hdr + msg[12:end] + answers, peer)


def main():
    kind, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if kind == "http":
        http_server(addr, port, sys.argv[4])
    elif kind == "udp":
        udp_server(addr, port, sys.argv[4])
    elif kind == "dns":
        dns_server(addr, port, dict(a.split("=", 1) for a in sys.argv[4:]))
    else:
        sys.exit("unknown kind " + kind)


if __name__ == "__main__":
    main()
