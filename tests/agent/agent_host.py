#!/usr/bin/env python3
# The guest agent without a VM: drives tests/agent/drive (the real kiln-init
# agent, task and collect code) over a socketpair and checks every reply.
# Prints TAP. Needs root (it runs tasks as uid 54321 and chowns files).
#   usage: agent_host.py DRIVE_BINARY SCRATCH_DIR
import os, socket, struct, subprocess, sys, time, stat, errno, signal, pwd

T = dict(HELLO=1, OK=2, ERROR=3, STARTED=4, STDOUT=5, STDERR=6, EXIT=7, OUT_DIR=8, OUT_FILE=9,
         OUT_DATA=10, OUT_END=11, SETUP=0x40, FILE=0x41, FILE_DATA=0x42, EXEC=0x43, KILL=0x44, COLLECT=0x45,
         STDIN=0x48, RESIZE=0x49, HANGUP=0x4a, PROCS=0x0c, PROCS_QUERY=0x4b)
N = {v: k for k, v in T.items()}
ROOT = os.path.join(sys.argv[2], 'root')
DRIVE = sys.argv[1]
UID = 54321
fails = 0
count = 0

def check(cond, what):
    global fails, count
    count += 1
    what = what.replace('\n', ' ')[:300]
    print(('ok %d - ' if cond else 'not ok %d - ') % count + what, flush=True)
    if not cond:
        fails += 1

def s(b):
    if isinstance(b, str): b = b.encode()
    return struct.pack('<I', len(b)) + b

class Host:
    def __init__(self):
        a, b = socket.socketpair()
        self.sock = a
        self.proc = subprocess.Popen([DRIVE, ROOT + '/output', str(b.fileno())], pass_fds=(b.fileno(),))
        b.close()
        self.buf = b''
    def send(self, t, payload=b''):
        self.sock.sendall(struct.pack('<BBHI', 1, t, 0, len(payload)) + payload)
    def frame(self, timeout=10):
        self.sock.settimeout(timeout)
        while True:
            if len(self.buf) >= 8:
                v, t, r, n = struct.unpack('<BBHI', self.buf[:8])
                assert v == 1 and r == 0 and n <= 128 * 1024, (v, t, r, n)
                if len(self.buf) >= 8 + n:
                    p = self.buf[8:8 + n]
                    self.buf = self.buf[8 + n:]
                    return N.get(t, t), p
            d = self.sock.recv(1 << 20)
            if not d:
                raise EOFError
            self.buf += d
    def none_pending(self, wait=0.3):
        try:
            f = self.frame(wait)
            return f
        except socket.timeout:
            return None

def error(p):
    code, = struct.unpack('<i', p[:4])
    return code, p[8:].decode(errors='replace')

EXEC_STDIN, EXEC_TTY = 0x4, 0x8

def exec_payload(argv, uid=UID, gid=UID, cwd='/tmp', env=('HOME=/tmp',), cap=1 << 30, flags=0, tty=None):
    p = struct.pack('<IQII', flags, cap, uid, gid) + s(cwd) + struct.pack('<I', len(argv))
    p += b''.join(s(x) for x in argv) + struct.pack('<I', len(env)) + b''.join(s(x) for x in env)
    if tty:
        p += struct.pack('<II', *tty)
    return p

def run(h, argv, kill_after=None, feed=(), **kw):
    h.send(T['EXEC'], exec_payload(argv, **kw))
    t, p = h.frame()
    if t != 'STARTED':
        return t, p
    # Frames to send once the task runs: (type, payload), or a number (seconds to wait).
    for f in feed:
        if isinstance(f, (int, float)): time.sleep(f)
        else: h.send(T[f[0]], f[1])
    out, err, nframes = b'', b'', 0
    t0 = time.time()
    killed = False
    while True:
        if kill_after is not None and not killed and time.time() - t0 > kill_after:
            h.send(T['KILL']); killed = True
        try:
            t, p = h.frame(0.2 if kill_after is not None else 30)
        except socket.timeout:
            continue
        if t == 'STDOUT': out += p; nframes += 1; assert len(p) <= 65536
        elif t == 'STDERR': err += p; nframes += 1
        elif t == 'EXIT':
            v = struct.unpack('<BIIQQQQQQ', p)
            return dict(how=v[0], status=v[1], flags=v[2], run_us=v[3], user_us=v[4], sys_us=v[5],
                        maxrss=v[6], stdout_bytes=v[7], stderr_bytes=v[8], out=out, err=err, frames=nframes)
        else:
            return t, p

def uid_procs():
    n = 0
    for d in os.listdir('/proc'):
        if d.isdigit():
            try:
                if os.stat('/proc/' + d).st_uid == UID: n += 1
            except FileNotFoundError:
                pass
    return n

def file_req(h, path, data, mode=0o644, chunks=1):
    h.send(T['FILE'], struct.pack('<IQ', mode, len(data)) + s(path))
    step = max(1, (len(data) + chunks - 1) // chunks)
    for i in range(0, len(data), step):
        h.send(T['FILE_DATA'], data[i:i + step])

subprocess.run(['rm', '-rf', ROOT]); os.makedirs(ROOT + '/output')
h = Host()
t, p = h.frame()
ver, feat = struct.unpack('<II', p[:8])
check(t == 'HELLO' and ver == 1 and feat == 0 and p[12:].decode() == os.uname().release, 'HELLO %r' % (p,))

# FILE: nested new dirs, data in 3 frames
path = ROOT + '/work/sub/dir/a.txt'
file_req(h, path, b'0123456789' * 1000, mode=0o640, chunks=3)
t, p = h.frame()
check(t == 'OK' and p == bytes([0x41]), 'FILE ok reply %r' % ((t, p),))
st = os.stat(path)
check(open(path, 'rb').read() == b'0123456789' * 1000, 'FILE content')
check(stat.S_IMODE(st.st_mode) == 0o640 and st.st_uid == UID and st.st_gid == UID, 'FILE mode/owner %o %d' % (st.st_mode, st.st_uid))
d = os.stat(ROOT + '/work/sub')
check(stat.S_IMODE(d.st_mode) == 0o755 and d.st_uid == UID, 'FILE new dir 0755 owned by uid')
# mode with bits the umask would strip, and rewrite (truncate) an existing file
file_req(h, path, b'xy', mode=0o777)
t, p = h.frame()
check(t == 'OK' and open(path, 'rb').read() == b'xy' and stat.S_IMODE(os.stat(path).st_mode) == 0o777, 'FILE overwrite + mode 0777')
# empty file
file_req(h, ROOT + '/work/empty', b'')
t, p = h.frame()
check(t == 'OK' and os.path.getsize(ROOT + '/work/empty') == 0, 'FILE empty')
# refused path, its data is swallowed: exactly one ERROR
file_req(h, '/proc/foo', b'hello', chunks=2)
t, p = h.frame()
check(t == 'ERROR' and error(p)[0] == -errno.EPERM, 'FILE /proc refused %r' % (error(p),))
check(h.none_pending() is None, 'FILE refused: data swallowed silently')
# interrupted by another request: ERROR, partial file removed, next request served
h.send(T['FILE'], struct.pack('<IQ', 0o644, 100) + s(ROOT + '/work/partial'))
h.send(T['FILE_DATA'], b'x' * 10)
h.send(T['COLLECT'], struct.pack('<Q', 0))
t, p = h.frame()
check(t == 'ERROR' and error(p)[0] == -errno.EPROTO and 'missing' in error(p)[1], 'FILE interrupted: %r' % (error(p),))
check(not os.path.exists(ROOT + '/work/partial'), 'FILE interrupted: partial file removed')
t, p = h.frame()
check(t == 'OUT_END', 'COLLECT after interrupted FILE answered')
# more data than announced
h.send(T['FILE'], struct.pack('<IQ', 0o644, 3) + s(ROOT + '/work/over'))
h.send(T['FILE_DATA'], b'abcdef')
t, p = h.frame()
check(t == 'ERROR' and not os.path.exists(ROOT + '/work/over'), 'FILE too much data: %r' % (error(p),))
# symlink planted by a user in a parent: refused; root-owned symlink: followed
os.makedirs(ROOT + '/target', exist_ok=True)
os.symlink(ROOT + '/target', ROOT + '/work/evil'); os.lchown(ROOT + '/work/evil', UID, UID)
file_req(h, ROOT + '/work/evil/x', b'1')
t, p = h.frame()
check(t == 'ERROR' and error(p)[0] == -errno.ELOOP and not os.path.exists(ROOT + '/target/x'), 'FILE via user symlink refused %r' % (error(p),))
os.symlink(ROOT + '/target', ROOT + '/work/good')
file_req(h, ROOT + '/work/good/x', b'1')
t, p = h.frame()
check(t == 'OK' and os.path.exists(ROOT + '/target/x'), 'FILE via root symlink ok')
# final component symlink: refused
os.symlink(ROOT + '/target/x', ROOT + '/work/link')
file_req(h, ROOT + '/work/link', b'2')
t, p = h.frame()
check(t == 'ERROR' and open(ROOT + '/target/x').read() == '1', 'FILE onto symlink refused %r' % (error(p),))
# hard link to a "root" file
open(ROOT + '/secret', 'w').write('secret')
os.link(ROOT + '/secret', ROOT + '/work/hl')
file_req(h, ROOT + '/work/hl', b'pwned')
t, p = h.frame()
check(t == 'ERROR' and error(p)[0] in (-errno.EMLINK, -errno.EPERM) and open(ROOT + '/secret').read() == 'secret', 'FILE onto hard link refused %r' % (error(p),))
# an existing file of root's is never replaced, even one anybody may write
# (before: truncated and chowned to the task user); new files are made as before
os.makedirs(ROOT + '/etc'); open(ROOT + '/etc/shadow', 'w').write('root:x:0:\n'); os.chmod(ROOT + '/etc/shadow', 0o640)
file_req(h, ROOT + '/etc/shadow', b'root::0:\n')
t, p = h.frame()
st = os.stat(ROOT + '/etc/shadow')
check(t == 'ERROR' and error(p)[0] == -errno.EPERM and open(ROOT + '/etc/shadow').read() == 'root:x:0:\n' and st.st_uid == 0,
      'FILE onto a root file (/etc/shadow) refused, unchanged, still root\'s %r' % (error(p),))
file_req(h, ROOT + '/etc/new.conf', b'x=1\n')
t, p = h.frame()
check(t == 'OK' and os.stat(ROOT + '/etc/new.conf').st_uid == UID, 'FILE creating a new file in a root directory: made, owned by the task user')
open(ROOT + '/work/rootfile', 'w').write('root data'); os.chmod(ROOT + '/work/rootfile', 0o666)
file_req(h, ROOT + '/work/rootfile', b'mine')
t, p = h.frame()
st = os.stat(ROOT + '/work/rootfile')
check(t == 'ERROR' and error(p)[0] == -errno.EPERM and open(ROOT + '/work/rootfile').read() == 'root data' and st.st_uid == 0,
      'FILE onto a world-writable root file refused, not chowned %r' % (error(p),))
# FIFO
os.mkfifo(ROOT + '/work/fifo')
file_req(h, ROOT + '/work/fifo', b'x')
t, p = h.frame()
check(t == 'ERROR', 'FILE onto FIFO refused, no hang %r' % (error(p),))
# FILE_DATA alone
h.send(T['FILE_DATA'], b'zz')
t, p = h.frame()
check(t == 'ERROR' and error(p)[0] == -errno.EPROTO, 'FILE_DATA without FILE')

# unknown request, bad header, KILL while idle
h.send(0x7f)
t, p = h.frame()
check(t == 'ERROR' and error(p)[0] == -errno.EINVAL, 'unknown type -> -EINVAL')
h.send(T['KILL'])
check(h.none_pending() is None, 'KILL while idle ignored')
h.sock.sendall(b'\x09\x01\x00\x00\x00\x00\x00\x00')
t, p = h.frame()
check(t == 'ERROR' and error(p)[0] == -errno.EPROTO, 'bad header -> -EPROTO')
h.send(T['COLLECT'], b'\x00')
t, p = h.frame()
check(t == 'ERROR' and error(p)[0] == -errno.EPROTO, 'malformed COLLECT')

# EXEC basics
r = run(h, ['/bin/sh', '-c', 'echo out; echo err >&2; id -u; pwd; exit 3'], cwd='/tmp')
check(r['how'] == 1 and r['status'] == 3 and r['out'] == b'out\n%d\n/tmp\n' % UID and r['err'] == b'err\n', 'EXEC exit 3 %r' % r)
check(r['stdout_bytes'] == len(r['out']) and r['stderr_bytes'] == 4 and r['run_us'] > 0 and r['maxrss'] > 0, 'EXEC counters')
r = run(h, ['sh', '-c', 'echo "$PATH"; cat; ls /proc/self/fd | wc -l'], env=('A=b',))
check(r['out'] == b'/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n4\n', 'EXEC default PATH, stdin empty, only fds 0-2 (+ls) %r' % r['out'])
r = run(h, ['sh', '-c', 'echo "$PATH"'], env=('PATH=/bin',))
check(r['out'] == b'/bin\n', 'EXEC own PATH')
r = run(h, ['no-such-cmd'])
check(r['how'] == 1 and r['status'] == 127 and b'no-such-cmd' in r['err'], 'EXEC not found -> 127: %r' % r['err'])
r = run(h, ['true'], cwd='/nonexistent')
check(r['status'] == 127 and b'/nonexistent' in r['err'], 'EXEC bad cwd -> 127: %r' % r['err'])
r = run(h, ['/etc/passwd'])
check(r['status'] == 127 and b'Permission denied' in r['err'], 'EXEC not executable: %r' % r['err'])
r = run(h, ['sh', '-c', 'kill -TERM $$'])
check(r['how'] == 2 and r['status'] == 15 and r['flags'] == 0, 'EXEC signaled')
r = run(h, ['sh', '-c', 'trap "" PIPE; exit 0'])
check(r['status'] == 0, 'EXEC exit 0')
r = run(h, ['sh', '-c', 'echo fallback $0', 'arg0'], flags=1)
check(r['out'] == b'fallback arg0\n', 'EXEC zygote flag without an interpreter: plain exec %r' % r['out'])

# output: big, capped
r = run(h, ['head', '-c', '10000000', '/dev/zero'])
check(r['status'] == 0 and len(r['out']) == 10000000 and r['stdout_bytes'] == 10000000 and r['flags'] == 0, 'EXEC 10 MB of output, %d frames' % r['frames'])
r = run(h, ['yes'], cap=100000)
check(r['flags'] & 2 and r['how'] == 2 and r['status'] == 9 and len(r['out']) == 100000 and r['stdout_bytes'] > 100000, 'EXEC output cap: sent %d of %d flags %x' % (len(r['out']), r['stdout_bytes'], r['flags']))
r = run(h, ['sh', '-c', 'printf 12345; printf 678 >&2'], cap=6)
check(r['flags'] & 2 and len(r['out']) + len(r['err']) == 6 and r['stdout_bytes'] + r['stderr_bytes'] == 8, 'EXEC cap across stdout+stderr %r' % r)
r = run(h, ['sh', '-c', 'printf 12345'], cap=5)
check(r['flags'] == 0 and r['out'] == b'12345', 'EXEC output exactly at the cap is fine')

# KILL, requests while running, daemons
t0 = time.time()
r = run(h, ['sleep', '100'], kill_after=0.5)
check(r['flags'] & 4 and r['how'] == 2 and r['status'] == 9 and time.time() - t0 < 5, 'EXEC KILL %r' % {k: r[k] for k in ('how', 'status', 'flags')})
h.send(T['EXEC'], exec_payload(['sh', '-c', 'sleep 1; echo done']))
check(h.frame()[0] == 'STARTED', 'started')
h.send(T['COLLECT'], struct.pack('<Q', 0))
t, p = h.frame()
check(t == 'ERROR' and error(p)[0] == -errno.EBUSY, 'request during task -> EBUSY')
t, p = h.frame(); check(t == 'STDOUT' and p == b'done\n', 'task continued')
t, p = h.frame(); check(t == 'EXIT', 'task exit')
t0 = time.time()
r = run(h, ['sh', '-c', 'setsid sh -c "sleep 1000" >/dev/null 2>&1 < /dev/null & (sleep 1000 &); echo bye'])
time.sleep(0.2)
check(r['out'] == b'bye\n' and time.time() - t0 < 5 and uid_procs() == 0, 'EXEC daemons killed at exit, pipe holder did not stall EXIT (%.2fs, %d left)' % (time.time() - t0, uid_procs()))
r = run(h, ['sh', '-c', 'for i in 1 2 3 4 5 6 7 8; do (sleep 1000 &) ; done; exit 0'])
time.sleep(0.2)
check(uid_procs() == 0, 'orphans killed')
zombies = subprocess.run(['sh', '-c', 'ps -o stat=,ppid= -e | awk \'$1 ~ /Z/ && $2 == %d\' | wc -l' % h.proc.pid], capture_output=True, text=True).stdout.strip()
check(zombies == '0', 'no zombies left under the agent (%s)' % zombies)

# STDIN (a pipe) and TTY (a pseudo-terminal): interactive commands
r = run(h, ['cat'], flags=EXEC_STDIN, feed=[('STDIN', b'hello\n'), ('STDIN', b'world'), ('STDIN', b'')])
check(r['how'] == 1 and r['status'] == 0 and r['out'] == b'hello\nworld', 'STDIN pipe: cat echoes the frames, empty STDIN ends input %r' % (r,))
blob = os.urandom(300000)
r = run(h, ['sh', '-c', 'sha256sum | cut -c1-64'], flags=EXEC_STDIN,
        feed=[('STDIN', blob[i:i + 65536]) for i in range(0, len(blob), 65536)] + [('STDIN', b'')])
import hashlib
check(r['out'].strip() == hashlib.sha256(blob).hexdigest().encode() and r['flags'] == 0, 'STDIN pipe: 300 kB arrive intact %r' % (r['out'][:80],))
r = run(h, ['sh', '-c', 'sleep 1'], flags=EXEC_STDIN, feed=[('STDIN', b'x' * 65536)] * 20)
check(r['status'] == 0 and r['flags'] & 8, 'STDIN a task does not read: past 1 MiB dropped, EXIT says STDIN_LOST (flags %x)' % r['flags'])
r = run(h, ['sh', '-c', 'read x; echo "[$x]"'], feed=[('STDIN', b'ignored\n')])
check(r['out'] == b'[]\n' and r['flags'] == 0, 'STDIN to a command without EXEC_STDIN: ignored, stdin is /dev/null %r' % r['out'])
r = run(h, ['sh', '-c', '[ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all-tty; stty size; tty; stat -c owner=%u $(tty)'],
        flags=EXEC_TTY, tty=(30, 100))
check(r['status'] == 0 and b'all-tty' in r['out'] and b'30 100' in r['out'] and b'/dev/pts/' in r['out'] and r['err'] == b'',
      'TTY: 0-2 are a terminal of 30x100, output as STDOUT %r' % r['out'])
check(b'owner=%d' % UID in r['out'], 'TTY: the terminal belongs to the task user %r' % r['out'].split(b'\n')[-2:])
r = run(h, ['sh', '-c', 'read x; echo "got:$x"; read y; stty size; read z'], flags=EXEC_TTY, tty=(24, 80),
        feed=[('STDIN', b'abc\n'), 0.3, ('RESIZE', struct.pack('<II', 50, 120)), ('STDIN', b'\n'), 0.3, ('STDIN', b'\n')])
check(r['status'] == 0 and b'got:abc' in r['out'] and b'50 120' in r['out'], 'TTY: typed input read, RESIZE seen by stty %r' % r['out'])
r = run(h, ['cat'], flags=EXEC_TTY, tty=(24, 80), feed=[('STDIN', b'line\n'), 0.2, ('STDIN', b'')])
check(r['status'] == 0 and r['out'].count(b'line') == 2, 'TTY: empty STDIN types ^D: cat ends (echo + output) %r' % r['out'])
h.send(T['STDIN'], b'late'); h.send(T['RESIZE'], struct.pack('<II', 10, 10))
check(h.none_pending() is None, 'STDIN and RESIZE while idle: ignored')
for what, kw in (('rows 0', dict(flags=EXEC_TTY, tty=(0, 80))), ('cols 5000', dict(flags=EXEC_TTY, tty=(24, 5000))),
                 ('TTY without size', dict(flags=EXEC_TTY)), ('ZYGOTE with STDIN', dict(flags=1 | EXEC_STDIN)),
                 ('unknown flag 0x20', dict(flags=0x20))):
    h.send(T['EXEC'], exec_payload(['python3', 'x.py'], **kw))
    t, p = h.frame()
    check(t == 'ERROR' and error(p)[0] == -errno.EPROTO, 'EXEC %s: -EPROTO %r' % (what, (t, p[:60])))
h.send(T['EXEC'], exec_payload(['sh', '-c', 'read x'], flags=EXEC_TTY, tty=(24, 80)))
check(h.frame()[0] == 'STARTED', 'TTY started')
h.send(T['RESIZE'], b'\x01\x00')
t, p = h.frame()
check(t == 'ERROR' and error(p)[0] == -errno.EPROTO, 'malformed RESIZE during a task: -EPROTO')
h.send(T['KILL'])
while t != 'EXIT':
    t, p = h.frame()
check(uid_procs() == 0, 'TTY task killed: nothing of its uid left')

# IF_OK: SETUP, FILE and EXEC sent in one go; EXEC runs only when nothing
# since the previous EXEC was refused.
EXEC_IF_OK = 0x10
file_req(h, '/proc/kiln-nope', b'x' * 100)
h.send(T['EXEC'], exec_payload(['sh', '-c', 'touch /tmp/if-ok-ran'], flags=EXEC_IF_OK))
t1, p1 = h.frame(); t2, p2 = h.frame()
check(t1 == 'ERROR' and t2 == 'ERROR' and error(p2)[0] == -errno.ECANCELED and not os.path.exists('/tmp/if-ok-ran'),
      'IF_OK after a refused FILE: -ECANCELED, nothing runs %r' % ((t1, t2, error(p2) if t2 == 'ERROR' else p2),))
file_req(h, '/tmp/if-ok.txt', b'fine')
t1, p1 = h.frame()
r = run(h, ['cat', '/tmp/if-ok.txt'], flags=EXEC_IF_OK)
check(t1 == 'OK' and isinstance(r, dict) and r['status'] == 0 and r['out'] == b'fine',
      'IF_OK after accepted requests (and a refusal before the last EXEC): it runs %r' % ((t1, r if not isinstance(r, dict) else r['out']),))
os.unlink('/tmp/if-ok.txt')

# HANGUP: the client is gone. SIGHUP as a closing terminal gives, SIGKILL to the group 3 s later;
# the session's own daemons (KEEP) are left alone.
r = run(h, ['sh', '-c', 'setsid sleep 1000 > /dev/null 2>&1 < /dev/null & exit 0'], flags=2)
check(r['status'] == 0 and uid_procs() == 1, 'KEEP: a daemon stays after its command (%d)' % uid_procs())
t0 = time.time()
r = run(h, ['sh', '-c', 'read x'], flags=EXEC_TTY | 2, tty=(24, 80), feed=[0.3, ('HANGUP', b'')])
check(r['how'] == 2 and r['status'] == 1 and time.time() - t0 < 3, 'HANGUP on a terminal: SIGHUP ends the shell (%r, %.1fs)' % ({k: r[k] for k in ('how', 'status')}, time.time() - t0))
check(uid_procs() == 1, 'HANGUP: the session\'s daemon is still there (%d)' % uid_procs())
t0 = time.time()
r = run(h, ['sh', '-c', 'trap "" HUP; sleep 100'], flags=EXEC_TTY | 2, tty=(24, 80), feed=[0.3, ('HANGUP', b'')])
check(r['how'] == 2 and r['status'] == 9 and 2.5 < time.time() - t0 < 8, 'HANGUP ignored: SIGKILL to the group after 3 s (%r, %.1fs)' % ({k: r[k] for k in ('how', 'status')}, time.time() - t0))
r = run(h, ['sh', '-c', 'read x; echo "[$x]"'], flags=EXEC_STDIN | 2, feed=[0.3, ('HANGUP', b'')])
check(r['how'] == 2 and r['status'] == 1, 'HANGUP on a pipe: stdin closed, SIGHUP to the group %r' % ({k: r[k] for k in ('how', 'status', 'out', 'err', 'run_us')},))
check(uid_procs() == 1, 'and the daemon is still there (%d)' % uid_procs())
h.send(T['HANGUP'])
check(h.none_pending() is None, 'HANGUP while idle: ignored')
# PROCS_QUERY (kiln-host's idle stop): two u32, count and one pid (0 with
# none). Here the agent is not PID 1, so it sees this machine's processes,
# the session's daemon among them: never 0.
h.send(T['PROCS_QUERY'])
t, p = h.frame()
cnt, pid = struct.unpack('<II', p) if t == 'PROCS' and len(p) == 8 else (0, 0)
check(t == 'PROCS' and cnt >= 1 and pid > 1 and os.path.exists('/proc/%d' % pid),
      'PROCS_QUERY: PROCS with a count (%d) and a live pid (%d)' % (cnt, pid))
h.send(T['PROCS_QUERY'], b'x')
t, p = h.frame()
check(t == 'ERROR' and error(p)[0] == -errno.EPROTO, 'PROCS_QUERY with a payload: ERROR -EPROTO (%s)' % t)
r = run(h, ['true'])
time.sleep(0.2)
check(uid_procs() == 0, 'a command without KEEP ends the daemon too')

# COLLECT
o = ROOT + '/output'
open(o + '/a.txt', 'w').write('hello')
os.chmod(o + '/a.txt', 0o600)
os.makedirs(o + '/sub/deeper')
open(o + '/sub/b.bin', 'wb').write(os.urandom(300000))
open(o + '/sub/big', 'wb').write(b'x' * 5000000)
os.symlink('/etc/passwd', o + '/link')
os.symlink('/etc', o + '/sub/dirlink')
os.mkfifo(o + '/fifo')
cur = o
for i in range(40):
    cur += '/d'
os.makedirs(cur)
def collect(budget):
    h.send(T['COLLECT'], struct.pack('<Q', budget))
    files, dirs, cur = {}, [], None
    while True:
        t, p = h.frame()
        if t == 'OUT_DIR':
            dirs.append(p[4:].decode())
        elif t == 'OUT_FILE':
            mode, size = struct.unpack('<IQ', p[:12]); name = p[16:].decode()
            files[name] = [mode, size, b'']; cur = name
        elif t == 'OUT_DATA':
            files[cur][2] += p
        elif t == 'OUT_END':
            return files, dirs, struct.unpack('<IIII', p)
        else:
            return t, p, None
files, dirs, end = collect(1000000)
check(files.get('a.txt') == [0o600, 5, b'hello'], 'COLLECT a.txt')
check(files.get('sub/b.bin', [0, 0, b''])[2] == open(o + '/sub/b.bin', 'rb').read(), 'COLLECT sub/b.bin content')
check('sub/big' not in files and end[3] == 1, 'COLLECT over budget: left out, TRUNCATED')
check('sub' in dirs and 'sub/deeper' in dirs and all(not d.startswith('/') for d in dirs), 'COLLECT dirs %r' % dirs[:4])
check(max(d.count('/') for d in dirs) + 1 == 32, 'COLLECT depth bound (deepest %d)' % (max(d.count('/') for d in dirs) + 1))
check(end[0] == 2 and end[1] == len(dirs) and end[2] == 4, 'COLLECT counts %r (skipped: 2 links, fifo, too deep)' % (end,))
files, dirs, end = collect(10 ** 9)
check(len(files.get('sub/big', [0, 0, b''])[2]) == 5000000 and end[3] == 0, 'COLLECT big file')
subprocess.run(['rm', '-rf', o]); 
files, dirs, end = collect(10)
check(files == {} and end == (0, 0, 0, 0), 'COLLECT missing /output -> empty OUT_END')

h.sock.close()
h.proc.kill()
h.proc.wait()
subprocess.run(['rm', '-rf', ROOT])
print('1..%d' % count)
sys.exit(1 if fails else 0)
