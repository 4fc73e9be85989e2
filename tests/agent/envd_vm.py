#!/usr/bin/python3
"""envd_vm: boots kiln-init in a bare QEMU (no kiln-host, no jail) with both
virtio-serial ports on Unix sockets, and checks the guest's envd over the
real `kiln.envd` port: HELLO, the default user (uid 1001), processes with
their streams, exit codes, a terminal, files, and HELLO again when the host
reconnects. A developer's check of the guest side until kiln-host adds the
port itself (host/vm/vm.c); needs root for nothing but /dev/kvm-free QEMU.

  usage: envd_vm.py BUILD_DIR   (BUILD_DIR/image/{vmlinux,rootfs.ext4,initramfs.cpio})
"""
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import json
import time

EP_HELLO, EP_STARTED, EP_OUT, EP_END, EP_ERROR, EP_DONE, EP_ENTRY, EP_PROC, EP_DATA = range(0x80, 0x89)
EP_START, EP_INPUT, EP_CLOSE_STDIN, EP_SIGNAL, EP_RESIZE, EP_ACK, EP_LIST = range(0x90, 0x97)
EP_STAT, EP_LISTDIR, EP_MKDIR, EP_MOVE, EP_REMOVE, EP_READ, EP_WRITE, EP_WDATA, EP_WEND, EP_CANCEL = range(0x97, 0xa1)

failures = 0
count = 0


def check(ok, what):
    global failures, count
    count += 1
    print(("ok %d - " if ok else "not ok %d - ") % count + what, flush=True)
    if not ok:
        failures += 1


def sstr(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


class Chan:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.buf = b""

    def send(self, t, payload=b""):
        self.s.sendall(struct.pack("<BBBBI", 1, t, 0, 0, len(payload)) + payload)

    def recv(self, timeout=60):
        deadline = time.time() + timeout
        while True:
            if len(self.buf) >= 8:
                n = struct.unpack("<I", self.buf[4:8])[0]
                if len(self.buf) >= 8 + n:
                    t = self.buf[1]
                    p = self.buf[8:8 + n]
                    self.buf = self.buf[8 + n:]
                    return t, p
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError("no frame")
            self.s.settimeout(left)
            d = self.s.recv(1 << 20)
            if not d:
                raise EOFError("closed")
            self.buf += d


def start(ch, req, argv, flags=0, user="", cwd="", env=(), rows=0, cols=0):
    p = struct.pack("<IIII", req, flags, rows, cols) + sstr(user) + sstr(cwd) + sstr("t")
    p += struct.pack("<I", len(argv)) + b"".join(sstr(a) for a in argv)
    p += struct.pack("<I", len(env)) + b"".join(sstr(e) for e in env)
    ch.send(EP_START, p)
    t, r = ch.recv()
    if t == EP_ERROR:
        raise RuntimeError("START refused: %r" % r[12:])
    assert t == EP_STARTED, hex(t)
    rq, pid = struct.unpack("<II", r)
    assert rq == req
    return pid


def follow(ch, pid):
    out = {1: b"", 2: b"", 3: b""}
    while True:
        t, p = ch.recv()
        if t == EP_OUT:
            ppid, stream = struct.unpack("<IB", p[:5])
            assert ppid == pid
            out[stream] += p[5:]
            ch.send(EP_ACK, struct.pack("<II", pid, len(p) - 5))
            continue
        assert t == EP_END, hex(t)
        ppid, how, status = struct.unpack("<IBI", p)
        return out, how, status


def fsreq(ch, t, req, path, user="", path2=None, depth=None):
    p = struct.pack("<I", req) + sstr(user) + sstr(path)
    if path2 is not None:
        p += sstr(path2)
    if depth is not None:
        p += struct.pack("<I", depth)
    ch.send(t, p)


def qmp(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    f = s.makefile("rw")
    json.loads(f.readline())

    def cmd(name, **args):
        f.write(json.dumps({"execute": name, "arguments": args}) + "\n")
        f.flush()
        while True:
            r = json.loads(f.readline())
            if "return" in r or "error" in r:
                return r
    cmd("qmp_capabilities")
    return s, cmd


def wait_path(*paths):
    for _ in range(200):
        if all(os.path.exists(p) for p in paths):
            return
        time.sleep(0.05)


def main():
    b = sys.argv[1] if len(sys.argv) > 1 else "build"
    img = os.path.join(b, "image")
    d = tempfile.mkdtemp(prefix="kiln-envd-vm.")
    agent_sock, envd_sock = os.path.join(d, "agent.sock"), os.path.join(d, "envd.sock")
    cmd = ["qemu-system-x86_64", "-M", "microvm,acpi=off,rtc=on,x-option-roms=off,isa-serial=on",
           "-accel", "tcg,tb-size=64", "-cpu", "qemu64,vendor=GenuineIntel", "-m", "512", "-smp", "1",
           "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
           "-kernel", os.path.join(img, "vmlinux"), "-initrd", os.path.join(img, "initramfs.cpio"),
           "-append", "console=ttyS0 quiet loglevel=3 acpi=off reboot=t panic=-1 nolapic_timer "
           "pty.legacy_count=0 random.trust_cpu=off",
           "-serial", "file:%s/console.log" % d,
           "-drive", "id=root,if=none,file=%s,format=raw,snapshot=on,cache=unsafe" % os.path.join(img, "rootfs.ext4"),
           "-device", "virtio-blk-device,drive=root",
           "-device", "virtio-serial-device,max_ports=3",
           "-chardev", "socket,id=agent,path=%s,server=on,wait=off" % agent_sock,
           "-device", "virtserialport,chardev=agent,name=kiln.agent",
           "-chardev", "socket,id=envd,path=%s,server=on,wait=off" % envd_sock,
           "-device", "virtserialport,chardev=envd,name=kiln.envd",
           "-qmp", "unix:%s/qmp.sock,server=on,wait=off" % d]
    q = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    try:
        wait_path(envd_sock, agent_sock)
        agent = Chan(agent_sock)
        t, _ = agent.recv(120)
        check(t == 0x01, "the agent says HELLO (boot done)")
        ch = Chan(envd_sock)
        t, p = ch.recv(30)
        check(t == EP_HELLO and struct.unpack("<II", p)[0] == 1, "envd says HELLO on the kiln.envd port")

        pid = start(ch, 1 << 24, ["sh", "-c", "id -u; id -g; echo $HOME $USER $SHELL; pwd; echo err >&2; exit 3"])
        out, how, status = follow(ch, pid)
        check(out[1] == b"1001\n1001\n/home/user user /bin/bash\n/home/user\n", "START runs as user 1001 in its home: %r" % out[1])
        check(out[2] == b"err\n" and how == 1 and status == 3, "stderr apart, exit status 3")

        # What the E2B SDK's commands.run sends: a login bash.
        pid = start(ch, (1 << 24) + 30, ["/bin/bash", "-l", "-c", "whoami; echo $HOME $FOO; pwd"], env=["FOO=bar"])
        out, how, status = follow(ch, pid)
        check(out[1] == b"user\n/home/user bar\n/home/user\n" and status == 0, "bash -l -c as E2B runs it: %r %r" % (out[1], out[2]))

        pid = start(ch, (1 << 24) + 1, ["bash", "-c", "tty; stty size"], flags=2, rows=30, cols=100)
        out, how, status = follow(ch, pid)
        check(b"/dev/pts/" in out[3] and b"30 100" in out[3] and status == 0, "a terminal of 30x100: %r" % out[3])

        pid = start(ch, (1 << 24) + 2, ["cat"], flags=1)
        ch.send(EP_INPUT, struct.pack("<I", pid) + b"typed\n")
        ch.send(EP_CLOSE_STDIN, struct.pack("<I", pid))
        out, how, status = follow(ch, pid)
        check(out[1] == b"typed\n" and status == 0, "stdin through INPUT and CLOSE_STDIN")

        pid = start(ch, (1 << 24) + 3, ["sleep", "100"], user="root")
        ch.send(EP_SIGNAL, struct.pack("<II", pid, 9))
        out, how, status = follow(ch, pid)
        check(how == 2 and status == 9, "SIGNAL kills a root process")

        req = (1 << 24) + 4
        fsreq(ch, EP_WRITE, req, "dir/hello.txt")
        ch.send(EP_WDATA, struct.pack("<I", req) + b"hello from the host\n")
        ch.send(EP_WEND, struct.pack("<I", req))
        t, p = ch.recv()
        check(t == EP_ENTRY and b"/home/user/dir/hello.txt" in p, "WRITE under the home, parents made")
        pid = start(ch, (1 << 24) + 5, ["stat", "-c", "%U:%G %s", "dir", "dir/hello.txt"])
        out, how, status = follow(ch, pid)
        check(out[1] == b"user:user 4096\nuser:user 20\n", "the file and its parent belong to user: %r" % out[1])
        req = (1 << 24) + 6
        fsreq(ch, EP_READ, req, "/home/user/dir/hello.txt")
        t, p = ch.recv()
        t2, p2 = ch.recv()
        check(t == EP_DATA and p[4:] == b"hello from the host\n" and t2 == EP_DONE, "READ gives the bytes back")
        req = (1 << 24) + 7
        fsreq(ch, EP_STAT, req, "/etc/shadow")
        t, p = ch.recv()
        check(t == EP_ENTRY, "STAT of /etc/shadow works (the directory is searchable)")
        req = (1 << 24) + 8
        fsreq(ch, EP_READ, req, "/etc/shadow")
        t, p = ch.recv()
        check(t == EP_ERROR and struct.unpack("<i", p[4:8])[0] == -13, "READ of /etc/shadow as user: EACCES")
        req = (1 << 24) + 9
        fsreq(ch, EP_LISTDIR, req, "/home/user", depth=2)
        names = []
        while True:
            t, p = ch.recv()
            if t == EP_DONE:
                break
            names.append(p)
        check(any(b"/home/user/dir/hello.txt" in n for n in names), "LISTDIR depth 2 finds the file")

        # A new host connection: HELLO again, processes keep running.
        pid = start(ch, (1 << 24) + 10, ["sh", "-c", "sleep 2; echo still here"])
        ch.s.close()
        time.sleep(0.5)
        ch = Chan(envd_sock)
        t, p = ch.recv(30)
        check(t == EP_HELLO, "HELLO again after the host reconnects")
        req = (1 << 24) + 11
        ch.send(EP_LIST, struct.pack("<I", req))
        rows = []
        while True:
            t, p = ch.recv()
            if t == EP_DONE:
                break
            rows.append(struct.unpack("<II", p[:8])[1])
        check(pid in rows, "the process survived the reconnection (LIST)")
        out, how, status = follow(ch, pid)
        check(out[1] == b"still here\n" and status == 0, "and its output and END arrive on the new connection")

        # envd dies: kiln-init's supervisor starts it again, and it says HELLO.
        pid = start(ch, (1 << 24) + 20, ["sh", "-c", "kill -9 $PPID"], user="root")
        t0 = time.time()
        t, p = ch.recv(30)
        check(t == EP_HELLO, "a killed envd is started again and says HELLO (%.1f s)" % (time.time() - t0))
        pid = start(ch, (1 << 24) + 21, ["sh", "-c", "grep -c ^user: /etc/passwd"])
        out, how, status = follow(ch, pid)
        check(out[1] == b"1\n", "the new envd serves, and did not add user twice: %r" % out[1])
        with open(os.path.join(d, "console.log"), "rb") as f:
            con = f.read()
        check(con.count(b"envd") == 1 and b"envd: killed by signal 9; starting it again" in con,
              "the console says only that envd was started again: %r" % con[-300:])

        # A snapshot restored into a new QEMU (kiln's pool and sessions):
        # what does envd see of the new host?
        pid = start(ch, (1 << 24) + 12, ["sh", "-c", "sleep 8; echo after restore"])
        qs, qcmd = qmp(os.path.join(d, "qmp.sock"))
        qcmd("stop")
        state = os.path.join(d, "state")
        qcmd("migrate", uri="exec:cat > %s" % state)
        for _ in range(600):
            st = qcmd("query-migrate")["return"].get("status")
            if st in ("completed", "failed"):
                break
            time.sleep(0.05)
        check(st == "completed", "migrated the VM's state to a file")
        qs.close()
        q.kill()
        q.wait()
        ch.s.close()
        agent.s.close()
        for f in (agent_sock, envd_sock, os.path.join(d, "qmp.sock")):
            os.unlink(f)
        # Twice from the same state: the host connected while the state
        # loads (the port sees no change: envd cannot know, the host asks
        # with its HELLO), then the host connecting only after the VM runs
        # (kiln-host's lazy connection: the port sees it, envd says HELLO).
        for lazy in (False, True):
            q = subprocess.Popen(cmd + ["-incoming", "exec:cat %s" % state], stdin=subprocess.DEVNULL)
            wait_path(envd_sock, agent_sock, os.path.join(d, "qmp.sock"))
            time.sleep(0.2)
            agent = Chan(agent_sock)
            if not lazy:
                ch = Chan(envd_sock)
            qs, qcmd = qmp(os.path.join(d, "qmp.sock"))
            for _ in range(600):
                if qcmd("query-status")["return"]["status"] != "inmigrate":
                    break
                time.sleep(0.05)
            qcmd("cont")
            if lazy:
                time.sleep(0.5)
                ch = Chan(envd_sock)
            try:
                t, p = ch.recv(3)
                spontaneous = t == EP_HELLO
            except TimeoutError:
                spontaneous = False
            print("# restored VM, host %s: envd %s HELLO by itself" %
                  ("connecting after the load" if lazy else "connected during the load",
                   "sent" if spontaneous else "did not send"), flush=True)
            if lazy:
                check(spontaneous, "a restored VM's envd says HELLO when the host connects after the load")
            else:
                ch.send(EP_HELLO, struct.pack("<II", 1, 0xabcdef01))
                t, p = ch.recv(10)
                t2, p2 = ch.recv(10)
                check(t == EP_HELLO and t2 == EP_DONE and p2 == struct.pack("<I", 0xabcdef01),
                      "a restored VM's envd answers the host's HELLO with HELLO, DONE{req}")
            out, how, status = follow(ch, pid)
            check(out[1] == b"after restore\n" and status == 0,
                  "a process started before the snapshot ends in the clone: %r %r %d %d" % (out[1], out[2], how, status))
            if not lazy:
                qs.close()
                q.kill()
                q.wait()
                ch.s.close()
                agent.s.close()
                for f in (agent_sock, envd_sock, os.path.join(d, "qmp.sock")):
                    os.unlink(f)
        qs.close()
        with open(os.path.join(d, "console.log"), "rb") as f:
            con = f.read()
        check(b"envd" not in con, "nothing from envd on the restored VM's console: %r" % con[-300:])
    finally:
        q.kill()
        q.wait()
        shutil.rmtree(d, ignore_errors=True)
    print("1..%d" % count)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
