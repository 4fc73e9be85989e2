#!/usr/bin/python3
"""Clients for the port tests through kiln-api (tests/integration/98-ports-api.sh).

port_client.py URL MODE [ARGS] (headers as H=V in $PORT_HEADERS, ';'-separated)
  ws PATH N        a WebSocket to PATH: N messages (1 B to 64 KiB) echoed
                   back in order; prints "echoed N" and the median round trip
  many PATH K      K GETs of PATH at once, each on its own connection:
                   prints how many answered 200
  smuggle PATH     a request with both Content-Length and Transfer-Encoding:
                   prints the status kiln-api answered
Bounded: 60 s a socket operation."""
import base64
import os
import socket
import statistics
import struct
import sys
import threading
import time
import urllib.parse


def headers():
    h = os.environ.get("PORT_HEADERS", "")
    return [x.split("=", 1) for x in h.split(";") if x]


def connect(url):
    u = urllib.parse.urlsplit(url)
    return socket.create_connection((u.hostname, u.port), timeout=60), u


def read_head(s):
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(1)
        if not d:
            break
        head += d
    return head


def status_of(head):
    try:
        return int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def req_head(method, u, path, extra=""):
    h = "".join("%s: %s\r\n" % (k, v) for k, v in headers())
    return ("%s %s HTTP/1.1\r\nHost: %s\r\n%s%s\r\n" % (method, path, u.netloc, h, extra)).encode()


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        d = s.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b


def ws(url, path, n):
    s, u = connect(url)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(req_head("GET", u, path, "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                       "Sec-WebSocket-Key: %s\r\n" % key))
    head = read_head(s)
    if status_of(head) != 101:
        print("status", status_of(head))
        return
    rtts = []
    for i in range(n):
        size = 1 + (i * 7919) % 65536 if i % 10 == 0 else 1 + i % 200
        data = os.urandom(size)
        mask = os.urandom(4)
        if size < 126:
            hdr = bytes([0x82, 0x80 | size])
        else:
            hdr = bytes([0x82, 0x80 | 126]) + struct.pack(">H", size)
        t0 = time.monotonic()
        s.sendall(hdr + mask + bytes(b ^ mask[j % 4] for j, b in enumerate(data)))
        h = recv_exact(s, 2)
        m = h[1] & 0x7F
        if m == 126:
            m = struct.unpack(">H", recv_exact(s, 2))[0]
        got = recv_exact(s, m)
        rtts.append(time.monotonic() - t0)
        if got != data:
            print("different at", i)
            return
    mask = os.urandom(4)
    s.sendall(bytes([0x88, 0x80]) + mask)
    print("echoed", n, "%.1f" % (statistics.median(rtts) * 1000))


def many(url, path, k):
    good = []
    bad = {}

    def one():
        try:
            s, u = connect(url)
            s.sendall(req_head("GET", u, path, "Connection: close\r\n"))
            head = read_head(s)
            st = status_of(head)
            if st == 200:
                good.append(1)
            else:
                why = head.split(b"\r\n", 1)[0].decode(errors="replace")
                bad[why] = bad.get(why, 0) + 1
            s.close()
        except OSError as e:
            bad[str(e)] = bad.get(str(e), 0) + 1
    ts = [threading.Thread(target=one) for _ in range(k)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    if bad:
        print("failures:", bad, file=sys.stderr)
    print(len(good))


def smuggle(url, path):
    s, u = connect(url)
    body = b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    s.sendall(req_head("POST", u, path, "Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(body)) + body)
    print(status_of(read_head(s)))


mode = sys.argv[2]
if mode == "ws":
    ws(sys.argv[1], sys.argv[3], int(sys.argv[4]))
elif mode == "many":
    many(sys.argv[1], sys.argv[3], int(sys.argv[4]))
elif mode == "smuggle":
    smuggle(sys.argv[1], sys.argv[3])
