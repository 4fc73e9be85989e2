#!/usr/bin/python3
"""Wire helpers for tests/integration/93-e2b-protocol.sh, written from the
Connect protocol and RFC 7578, independent of kiln's C code.

  wire.py envelope JSON              one Connect envelope (flag 0) on stdout
  wire.py frames FILE                the frames of a Connect stream answer, one
                                     JSON line each: {"flag": N, "msg": ...};
                                     exit 1 (saying why) on a short or trailing
                                     frame, a bad flag or a payload not JSON
  wire.py multipart BOUNDARY OUT PART...   a multipart/form-data body in OUT;
                                     PART is name=file[;filename=F]:@DATAFILE
  wire.py tricky OUT BOUNDARY SIZE   SIZE bytes of random data strewn with
                                     CRLF, "--", the boundary minus its last
                                     byte and "\\r\\n--" + that, at offsets around
                                     4/8/16/64 KiB (parsers' buffer edges), and
                                     ending in "\\r"
"""
import json
import os
import struct
import sys


def envelope(payload: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


def frames(path):
    data = open(path, "rb").read()
    i = 0
    out = []
    while i < len(data):
        if len(data) - i < 5:
            sys.exit(f"a short frame header at byte {i}: {data[i:]!r}")
        flag, n = struct.unpack(">BI", data[i:i + 5])
        if flag not in (0, 2):
            sys.exit(f"flag {flag:#x} at byte {i}")
        body = data[i + 5:i + 5 + n]
        if len(body) != n:
            sys.exit(f"frame at byte {i} says {n} bytes, {len(body)} follow")
        try:
            msg = json.loads(body)
        except ValueError:
            sys.exit(f"frame at byte {i} is not JSON: {body[:200]!r}")
        out.append({"flag": flag, "msg": msg})
        i += 5 + n
        if flag == 2 and i != len(data):
            sys.exit(f"{len(data) - i} bytes after the end-of-stream message")
    for f in out:
        print(json.dumps(f))


def multipart(boundary, out, parts):
    b = boundary.encode()
    body = bytearray()
    for p in parts:
        head, _, src = p.partition(":@")
        fields = head.split(";")
        disp = f'form-data; name="{fields[0].split("=", 1)[1]}"'
        for f in fields[1:]:
            k, v = f.split("=", 1)
            disp += f'; {k}="{v}"'
        body += b"--" + b + b"\r\nContent-Disposition: " + disp.encode()
        body += b"\r\nContent-Type: application/octet-stream\r\n\r\n"
        body += open(src, "rb").read() + b"\r\n"
    body += b"--" + b + b"--\r\n"
    open(out, "wb").write(body)


def tricky(out, boundary, size):
    b = boundary.encode()
    traps = [b"\r\n", b"\r\n--", b"--", b"\r\n--" + b[:-1], b[:-1], b"\r\n\r\n", b"\r", b"\n--" + b[:-1],
             b"--" + b[:-1] + b"--", b"\r\n--" + b[:-1] + b"\r\n"]
    data = bytearray(os.urandom(size))
    k = 0
    for edge in (4096, 8192, 16384, 65536, 131072):
        for d in (-3, -1, 0, 1):
            t = traps[k % len(traps)]
            k += 1
            at = edge + d * 7 - len(t) // 2
            if 0 <= at and at + len(t) < size:
                data[at:at + len(t)] = t
    # The full delimiter must not appear: that would end the part. A trap
    # that ends in the boundary minus its last byte, followed by a random
    # byte that happens to be that last byte (1 in 256 a trap), makes one:
    # change that byte (never part of a trap: traps stay short of it).
    i = data.find(b"--" + b)
    while i >= 0:
        data[i + 1 + len(b)] ^= 0xFF
        i = data.find(b"--" + b)
    assert b"\r\n--" + b not in data and b"--" + b not in data
    data[-1:] = b"\r"
    open(out, "wb").write(data)


def main():
    cmd = sys.argv[1]
    if cmd == "envelope":
        sys.stdout.buffer.write(envelope(sys.argv[2].encode()))
    elif cmd == "frames":
        frames(sys.argv[2])
    elif cmd == "multipart":
        multipart(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif cmd == "tricky":
        tricky(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(f"wire.py: unknown command {cmd}")


if __name__ == "__main__":
    main()
