"""limits_probe: connection and body checks for 71-limits.sh.

body PORT PID AUTH [MIB]: POST a body declared as MIB MiB (default 60) and
  send up to 60 MiB of it, with AUTH as the Authorization header ("-": none); prints JSON
  {status, mib_sent_before_answer, rss_delta_kib}.
flood PORT N: hold up to N idle connections from 127.0.0.1 (half a request
  line each), then ask GET /healthz from 127.0.0.2; prints JSON
  {held, other_status}. Holds the connections until the answer is printed."""
import json, os, select, socket, sys, time

MIB = 1 << 20


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def body(port, pid, auth, declared):
    before = rss_kib(pid)
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    hdr = f"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {declared * MIB}\r\n"
    if auth != "-":
        hdr += f"Authorization: {auth}\r\n"
    s.sendall((hdr + "\r\n").encode())
    chunk = b"x" * MIB
    sent, answer, at = 0, b"", None
    time.sleep(0.5)
    for _ in range(60):
        r, _, _ = select.select([s], [], [], 0)
        if r:
            break
        try:
            s.sendall(chunk)
        except OSError:
            break
        sent += 1
    r, _, _ = select.select([s], [], [], 20)
    at = sent
    peak = rss_kib(pid)
    try:
        answer = s.recv(4096)
    except OSError:
        pass
    s.close()
    time.sleep(0.3)
    status = int(answer.split()[1]) if answer.startswith(b"HTTP/1.1 ") else 0
    print(json.dumps({"status": status, "mib_sent_before_answer": at,
                      "rss_delta_kib": max(peak, rss_kib(pid)) - before}))


def flood(port, n):
    held = []
    for _ in range(n):
        try:
            c = socket.create_connection(("127.0.0.1", port), timeout=2)
            c.sendall(b"GET /healthz HTTP/1.1\r\n")
            held.append(c)
        except OSError:
            break
    time.sleep(1.0)
    alive = 0
    for c in held:
        r, _, _ = select.select([c], [], [], 0)
        if not r:
            alive += 1
            continue
        try:
            if c.recv(1, socket.MSG_PEEK):
                alive += 1
        except OSError:
            pass
    status = 0
    try:
        o = socket.socket()
        o.settimeout(5)
        o.bind(("127.0.0.2", 0))
        o.connect(("127.0.0.1", port))
        o.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        a = o.recv(4096)
        status = int(a.split()[1]) if a.startswith(b"HTTP/1.1 ") else 0
        o.close()
    except OSError:
        pass
    print(json.dumps({"held": alive, "other_status": status}))
    for c in held:
        c.close()


if __name__ == "__main__":
    if sys.argv[1] == "body":
        body(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else 60)
    else:
        flood(int(sys.argv[2]), int(sys.argv[3]))
