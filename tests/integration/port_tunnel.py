#!/usr/bin/python3
"""A client of kiln-host's port tunnel (docs/api.md, "kiln-host: ports"):
GET /v1/sessions/{id}/ports/{port}/connect with Upgrade: kiln-tunnel, then
the socket is a byte pipe to the port inside the session's VM.

port_tunnel.py ADDR TOKEN SESSION PORT MODE [ARGS]
  open              print the answer's status and body (no 101: the error)
  get PATH OUT      HTTP GET through the tunnel; print the status, body to OUT
  post PATH IN      HTTP POST IN's bytes; print the status and the body
  echo N            send N random bytes, half close, read all back: print
                    "same" when they came back whole and in order
  many K N          K tunnels at once, each echoing N bytes: print how many
                    came back whole
  idle              open a tunnel, send nothing, hold it 2 s: print "held"
  stall S           open a tunnel, read nothing for S seconds, then read for
                    1 s: print the bytes read (a flooding server is held back)
  push S            write without end for S seconds to a server that never
                    reads: print the bytes the tunnel took
Everything is bounded in time (60 s a socket operation)."""
import http.client
import os
import socket
import sys
import threading


def tunnel(addr, token, session, port):
    host, p = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(p)), timeout=60)
    s.sendall(("GET /v1/sessions/%s/ports/%s/connect HTTP/1.1\r\nHost: %s\r\n"
               "Authorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: kiln-tunnel\r\n\r\n"
               % (session, port, addr, token)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(1)
        if not d:
            break
        head += d
        if len(head) > 16384:
            raise SystemExit("answer head too long")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    return s, status, head


def echo(s, n):
    data = os.urandom(n)
    got = []

    def reader():
        while True:
            d = s.recv(65536)
            if not d:
                return
            got.append(d)
    t = threading.Thread(target=reader)
    t.start()
    for i in range(0, n, 65536):
        s.sendall(data[i:i + 65536])
    s.shutdown(socket.SHUT_WR)
    t.join(60)
    return b"".join(got) == data


def main():
    addr, token, session, port, mode = sys.argv[1:6]
    args = sys.argv[6:]
    if mode == "many":
        k, n = int(args[0]), int(args[1])
        good = []

        def one():
            try:
                s, st, _ = tunnel(addr, token, session, port)
                if st == 101 and echo(s, n):
                    good.append(1)
                s.close()
            except OSError:
                pass
        ts = [threading.Thread(target=one) for _ in range(k)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        print(len(good))
        return
    s, st, head = tunnel(addr, token, session, port)
    if mode == "open" or st != 101:
        body = b""
        if st != 101:
            n = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    n = int(line.split(b":", 1)[1])
            while len(body) < n:
                d = s.recv(n - len(body))
                if not d:
                    break
                body += d
        print(st, body.decode(errors="replace").strip().replace("\n", " "))
        return
    if mode == "stall":
        import time
        time.sleep(float(args[0]))
        s.settimeout(1)
        n = 0
        end = time.monotonic() + 1
        try:
            while time.monotonic() < end:
                d = s.recv(65536)
                if not d:
                    break
                n += len(d)
        except OSError:
            pass
        print(n)
    elif mode == "push":
        import time
        s.setblocking(False)
        n = 0
        block = b"y" * 65536
        end = time.monotonic() + float(args[0])
        while time.monotonic() < end:
            try:
                n += s.send(block)
            except BlockingIOError:
                time.sleep(0.01)
        print(n)
    elif mode == "idle":
        import time
        time.sleep(2)
        print("held")
    elif mode == "echo":
        print("same" if echo(s, int(args[0])) else "different")
    elif mode in ("get", "post"):
        c = http.client.HTTPConnection("sandbox", timeout=60)
        c.sock = s
        if mode == "get":
            c.request("GET", args[0])
            r = c.getresponse()
            with open(args[1], "wb") as f:
                while True:
                    d = r.read(65536)
                    if not d:
                        break
                    f.write(d)
            print(r.status)
        else:
            body = open(args[1], "rb").read()
            c.request("POST", args[0], body=body, headers={"Content-Type": "application/octet-stream"})
            r = c.getresponse()
            print(r.status, r.read().decode().strip())
    s.close()


main()
