#!/usr/bin/env python3
# Drives `kiln shell SESSION` on a real pseudo-terminal, the way a person at a
# terminal would: types commands, resizes the window, presses ^C, exits.
# Prints one JSON object of what it saw; 74-sessions-api.sh checks it.
#   usage: shell_drive.py KILN SESSION
import fcntl, json, os, select, signal, struct, subprocess, sys, termios, time

kiln, session = sys.argv[1], sys.argv[2]
master, slave = os.openpty()
fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack('HHHH', 33, 101, 0, 0))
before = termios.tcgetattr(slave)

def child_setup():
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)

env = dict(os.environ, TERM='xterm')
p = subprocess.Popen([kiln, 'shell', session], stdin=slave, stdout=slave, stderr=slave,
                     preexec_fn=child_setup, env=env, close_fds=True)
seen = b''
pos = 0  # where the next pattern is looked for: after the last one found

def read_until(pattern, timeout=60):
    """Read the terminal until pattern (bytes) appears after the last match."""
    global seen, pos
    end = time.time() + timeout
    while True:
        i = seen.find(pattern, pos)
        if i >= 0:
            pos = i + len(pattern)
            return True
        if time.time() > end:
            return False
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                seen += os.read(master, 65536)
            except OSError:
                return seen.find(pattern, pos) >= 0
        elif p.poll() is not None:
            return seen.find(pattern, pos) >= 0

def type_(s):
    os.write(master, s.encode())

out = {}
# The exec starts, then bash -l prints a prompt ending in "$ ".
out['prompt'] = read_until(b'$ ', 90)
type_('stty size; [ -t 0 ] && echo is-a-$((1))tty; echo $((6*7))\r')
out['size'] = read_until(b'33 101')
out['tty'] = read_until(b'is-a-1tty')
out['math'] = read_until(b'42')
fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack('HHHH', 40, 120, 0, 0))
# kiln gets SIGWINCH (it is the terminal's foreground process) and sends the size.
time.sleep(1.5)
type_('stty size\r')
out['resized'] = read_until(b'40 120')
type_('sleep 100\r')
time.sleep(1.5)
t0 = time.time()
type_('\x03')  # raw mode: ^C is a byte for the remote terminal, not a signal for kiln
type_('echo after-$((2+3))\r')
out['ctrl_c'] = read_until(b'after-5', 30) and time.time() - t0 < 30
out['kiln_alive_after_ctrl_c'] = p.poll() is None
type_('exit 3\r')
try:
    out['rc'] = p.wait(60)
except subprocess.TimeoutExpired:
    p.kill()
    out['rc'] = 'hung'
after = termios.tcgetattr(slave)
out['termios_restored'] = before == after
out['tail'] = seen[-300:].decode(errors='replace')
print(json.dumps(out))
