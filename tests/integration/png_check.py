#!/usr/bin/python3
# png_check: decode a PNG with the standard library only (chunk CRCs, zlib,
# the scanlines' size and filters) and print "WIDTHxHEIGHT"; exit 1 with the
# reason when it is not a whole PNG. Reads base64 from stdin (--raw: bytes).
import base64, struct, sys, zlib

def main():
    data = sys.stdin.buffer.read()
    if "--raw" not in sys.argv:
        data = base64.b64decode(b"".join(data.split()), validate=True)
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit("not a PNG signature")
    off, idat, ihdr, end = 8, b"", None, False
    while off + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[off:off + 8])
        body = data[off + 8:off + 8 + n]
        crc, = struct.unpack(">I", data[off + 8 + n:off + 12 + n])
        if zlib.crc32(kind + body) != crc:
            sys.exit("bad CRC in %r" % kind)
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            end = True
            break
        off += 12 + n
    if not ihdr or not end:
        sys.exit("no IHDR or IEND")
    w, h, depth, color = ihdr[:4]
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color]
    stride = (w * channels * depth + 7) // 8
    raw = zlib.decompress(idat)
    if w < 1 or h < 1 or len(raw) != h * (1 + stride):
        sys.exit("pixel data of %d bytes for %dx%d" % (len(raw), w, h))
    if any(raw[i * (1 + stride)] > 4 for i in range(h)):
        sys.exit("a bad scanline filter")
    print("%dx%d" % (w, h))

main()
