#!/usr/bin/python3
"""What a recipe's run step can reach, for 81-template-recipe.sh: runs inside
the build VM (put there as one of the recipe's files) and prints one line per
probe, each bounded to 3 s:
  mirror <connected|refused|timeout|unreachable|error N>  TCP to ADDR:PORT
  dns <answered|timeout|error N>      a UDP query to resolv.conf's nameserver
  resolve <resolved|failed|timeout>   getaddrinfo of NAME
usage: net_probe.py ADDR PORT NAME
"""
import errno
import socket
import sys
import threading

addr, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def tcp(a, p):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((a, p))
        return "connected"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        if e.errno == errno.ECONNREFUSED:
            return "refused"
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "unreachable"
        return "error %d" % e.errno
    finally:
        s.close()


def nameserver():
    try:
        with open("/etc/resolv.conf") as f:
            for line in f:
                w = line.split()
                if len(w) >= 2 and w[0] == "nameserver":
                    return w[1]
    except OSError:
        pass
    return "10.0.2.1"


def dns(server):
    q = b"\x4b\x1e\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\x00\x00\x01\x00\x01"
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(q, (server, 53))
        s.recvfrom(512)
        return "answered"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return "error %d" % e.errno
    finally:
        s.close()


def resolve():
    out = ["timeout"]

    def look():
        try:
            socket.getaddrinfo(name, 80, socket.AF_INET, socket.SOCK_STREAM)
            out[0] = "resolved"
        except OSError:
            out[0] = "failed"

    t = threading.Thread(target=look, daemon=True)
    t.start()
    t.join(3)
    return out[0]


print("mirror", tcp(addr, port))
print("dns", dns(nameserver()))
print("resolve", resolve())
sys.stdout.flush()
