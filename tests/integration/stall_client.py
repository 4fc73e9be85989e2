#!/usr/bin/env python3
"""A client that sends one HTTP request and then stops reading: its socket's
receive buffer is made small before connect, so that the server's writes
soon block. It reads only up to the first event (the command's `started`),
then writes what it read to OUT.started and reads nothing more until the
file GO exists; then it reads everything (until the server closes, or
120 s) into OUT. For tests/integration/68-session-stall.sh.

usage: stall_client.py PORT PATH TOKEN BODY GO OUT
"""
import os
import socket
import sys
import time

port, path, token, body, go, out = sys.argv[1:7]
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(("127.0.0.1", int(port)))
data = body.encode()
s.sendall(("POST %s HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
           "Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
           % (path, token, len(data))).encode() + data)
# Up to the command's first event (its stream has begun: the command runs),
# then no more reading until GO.
head = b""
s.settimeout(60)
try:
    while b"event: started" not in head and b"event: error" not in head and len(head) < 65536:
        chunk = s.recv(512)
        if not chunk:
            break
        head += chunk
except socket.timeout:
    pass
open(out + ".started", "wb").write(head)
while not os.path.exists(go):
    time.sleep(0.2)
s.settimeout(120)
end = time.monotonic() + 120
with open(out, "wb") as f:
    f.write(head)
    while time.monotonic() < end:
        try:
            chunk = s.recv(1 << 16)
        except socket.timeout:
            break
        if not chunk:
            break
        f.write(chunk)
s.close()
