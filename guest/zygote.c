/* zygote: start the pre-started Python interpreter and hand it a task.
 * Commands on its fd 3: 'W' (warm up: run a sample script in a throw-away
 * fork, so TCG has translated the task path; acknowledged with 'w' on fd 4),
 * or 'T' then the task, NUL-separated: uid, gid, cwd, argc, argv..., envc,
 * env...; then EOF. Readiness: 'R' on fd 4 once imports are done; the task
 * keeps fd 4 to say when it is done (struct proto_zdone). */
#include "zygote.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "io.h"
#include "init.h"

/* The template's own modules: /etc/kiln/preload names them, one per line
 * (docs/templates.md). The file comes with the image, so whoever built the
 * template wrote it: it is read bounded (4 KiB, a regular file only), each
 * line must be a module name (at most 32 of them), and whatever an import
 * does is contained: its output goes to /dev/null (not into the first task's
 * stdout), its exceptions are ignored, and all of them together get
 * ZYGOTE_PRELOAD_S seconds (SIGALRM) before the interpreter reports ready
 * without the rest. An import that kills the interpreter outright costs a
 * second start without the preload (zygote_start). */
#define ZYGOTE_PRELOAD_S "60"
#define ZYGOTE_PRELOAD   "/etc/kiln/preload"

/* Runs the script the way `python3 SCRIPT ARGS` would: a fresh __main__,
 * sys.argv and sys.path[0] as for a script, SystemExit and uncaught
 * exceptions reported by the default machinery (without this wrapper's own
 * frame), non-daemon threads joined and atexit handlers run at exit. Then it
 * leaves with os._exit: tearing down every pre-imported module costs ~150 ms
 * under TCG, and the VM is destroyed anyway. `random` was seeded when the
 * snapshot was taken, in every clone alike: it is reseeded from the kernel,
 * which the host reseeded, before the task's code runs. A pool VM's warm-up
 * ('W') runs that very task path (_kiln_task) in a fork, on a sample the host
 * wrote, so that TCG has translated what the real task will execute. The
 * fork left every private page of the interpreter write-protected (copy on
 * write, though the child is gone): the task would take a page fault on its
 * first write to each, ~10 ms of print(1) under TCG. _kiln_unshare makes them
 * writable again with MADV_POPULATE_WRITE over the runs of present,
 * anonymous, exclusively mapped pages (/proc/self/pagemap bits 63, 61, 56;
 * not the shared zero page, which would become a new page): no data is
 * written and no page added, so the guest RAM QEMU shares with the snapshot
 * stays shared. The page map is read 8192 entries (32 MiB of addresses) at a
 * time: a preloaded module may reserve a huge mapping. Best effort: a kernel
 * without it (ENOSYS, EINVAL) only leaves the faults. Right before os._exit
 * the task's own interpreter (not a fork of it: the pid is checked, and fd 4
 * must still be the pipe it was) closes every other descriptor, so its
 * stdout and stderr end, and writes its exit status and usage to fd 4: PID 1
 * reports EXIT while the kernel still tears the process down (~10 ms under
 * TCG for its ~20 MiB). Without `resource`, or if fd 4 was replaced, PID 1
 * waits for the exit as for any process. Then it waits (up to 5 s) until
 * PID 1 closes its end, which PID 1 does once it has killed what the task
 * left: a process that is exiting would take the (often single) vCPU from
 * PID 1 until the next scheduler tick (10 ms). It is SCHED_IDLE by then, so
 * its teardown yields to PID 1 as well. */
static const char zygote_src[] =
	"import os, sys\n"
	"import builtins, importlib.machinery, random, traceback, types\n"
	"import abc, argparse, base64, bisect, collections, contextlib, copy, csv, dataclasses, datetime, decimal\n"
	"import enum, fractions, functools, glob, hashlib, heapq, io, itertools, json, logging, math, numbers\n"
	"import operator, pathlib, pprint, re, secrets, select, shutil, statistics, string, struct, subprocess\n"
	"import tempfile, textwrap, time, typing, urllib.parse, uuid, zlib\n"
	"try:\n"
	"    import resource\n"
	"except ImportError:\n"
	"    resource = None\n"
	"_kiln_done = None\n"
	"try:\n"
	"    import ctypes\n"
	"    _kiln_madvise = ctypes.CDLL(None, use_errno=True).madvise\n"
	"    _kiln_madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)\n"
	"except (ImportError, OSError, AttributeError):\n"
	"    _kiln_madvise = lambda addr, length, advice: 0\n"
	"_kiln_pages = bytes(49 if b & 0xa1 == 0x81 else 48 for b in range(256))\n"
	"def _kiln_preload():\n"
	"    try:\n"
	"        fd = os.open('" ZYGOTE_PRELOAD "', os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)\n"
	"    except OSError:\n"
	"        return\n"
	"    try:\n"
	"        import stat\n"
	"        if not stat.S_ISREG(os.fstat(fd).st_mode):\n"
	"            return\n"
	"        data = os.read(fd, 4097)\n"
	"    except OSError:\n"
	"        return\n"
	"    finally:\n"
	"        os.close(fd)\n"
	"    lines = data.split(b'\\n')\n"
	"    if len(data) > 4096:\n"
	"        lines.pop()\n"
	"    names = []\n"
	"    for line in lines:\n"
	"        line = line.strip()\n"
	"        if not line:\n"
	"            continue\n"
	"        if len(names) == 32:\n"
	"            break\n"
	"        if len(line) <= 255 and re.fullmatch(rb'[A-Za-z_][A-Za-z0-9_.]*', line):\n"
	"            names.append(line.decode())\n"
	"    if not names:\n"
	"        return\n"
	"    import signal\n"
	"    class Late(BaseException):\n"
	"        pass\n"
	"    def late(signum, frame):\n"
	"        raise Late()\n"
	"    sys.stdout.flush(); sys.stderr.flush()\n"
	"    saved = os.dup(1), os.dup(2)\n"
	"    null = os.open('/dev/null', os.O_WRONLY)\n"
	"    os.dup2(null, 1); os.dup2(null, 2); os.close(null)\n"
	"    signal.signal(signal.SIGALRM, late)\n"
	"    signal.alarm(" ZYGOTE_PRELOAD_S ")\n"
	"    try:\n"
	"        for name in names:\n"
	"            try:\n"
	"                __import__(name)\n"
	"            except Late:\n"
	"                break\n"
	"            except BaseException:\n"
	"                pass\n"
	"    except Late:\n"
	"        pass\n"
	"    finally:\n"
	"        signal.alarm(0)\n"
	"        signal.signal(signal.SIGALRM, signal.SIG_DFL)\n"
	"        try:\n"
	"            sys.stdout.flush(); sys.stderr.flush()\n"
	"        except BaseException:\n"
	"            pass\n"
	"        os.dup2(saved[0], 1); os.dup2(saved[1], 2); os.close(saved[0]); os.close(saved[1])\n"
	"if sys.argv[1:] != ['nopreload']:\n"
	"    _kiln_preload()\n"
	"del _kiln_preload\n"
	"def _kiln_exit(status):\n"
	"    try:\n"
	"        threading = sys.modules.get('threading')\n"
	"        if threading is not None:\n"
	"            threading._shutdown()\n"
	"        import atexit\n"
	"        atexit._run_exitfuncs()\n"
	"    finally:\n"
	"        for f in (sys.stdout, sys.stderr):\n"
	"            try:\n"
	"                f.flush()\n"
	"            except BaseException:\n"
	"                status = status or 120\n"
	"        d = _kiln_done\n"
	"        if d is not None and resource is not None and os.getpid() == d[0]:\n"
	"            try:\n"
	"                st = os.fstat(4)\n"
	"                if (st.st_dev, st.st_ino) == d[1]:\n"
	"                    s = resource.getrusage(resource.RUSAGE_SELF)\n"
	"                    c = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
	"                    msg = b'X %d %d %d %d\\n' % (status & 0xff, round((s.ru_utime + c.ru_utime) * 1e6),\n"
	"                                                 round((s.ru_stime + c.ru_stime) * 1e6), max(s.ru_maxrss, "
	"c.ru_maxrss))\n"
	"                    os.closerange(0, 4)\n"
	"                    os.closerange(5, 0x7fffffff)\n"
	"                    try:\n"
	"                        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
	"                    except OSError:\n"
	"                        pass\n"
	"                    os.write(4, msg)\n"
	"                    w = select.poll()\n"
	"                    w.register(4, 0)\n"
	"                    w.poll(5000)\n"
	"            except BaseException:\n"
	"                pass\n"
	"        os._exit(status)\n"
	"def _kiln_run(path, main):\n"
	"    try:\n"
	"        with open(path, 'rb') as fh:\n"
	"            code = compile(fh.read(), path, 'exec')\n"
	"        exec(code, main.__dict__)\n"
	"        return 0\n"
	"    except SystemExit as e:\n"
	"        c = e.code\n"
	"        if c is None:\n"
	"            return 0\n"
	"        if isinstance(c, int):\n"
	"            return c & 0xff\n"
	"        try:\n"
	"            print(c, file=sys.stderr)\n"
	"        except BaseException:\n"
	"            pass\n"
	"        return 1\n"
	"    except BaseException as e:\n"
	"        tb = e.__traceback__\n"
	"        while tb is not None and tb.tb_frame.f_code.co_filename == '<string>':\n"
	"            tb = tb.tb_next\n"
	"        sys.excepthook(type(e), e.with_traceback(tb), tb)\n"
	"        return 1\n"
	"def _kiln_task(data):\n"
	"    f = data.split(b'\\0')\n"
	"    uid, gid, cwd, argc = int(f[0]), int(f[1]), os.fsdecode(f[2]), int(f[3])\n"
	"    argv = [os.fsdecode(a) for a in f[4:4 + argc]]\n"
	"    envc = int(f[4 + argc])\n"
	"    env = [os.fsdecode(e) for e in f[5 + argc:5 + argc + envc]]\n"
	"    del f, data\n"
	"    os.setgroups([]); os.setgid(gid); os.setuid(uid)\n"
	"    try:\n"
	"        os.chdir(cwd)\n"
	"    except OSError as e:\n"
	"        os.write(2, ('kiln-init: cannot change directory to %s: %s\\n' % (cwd, "
	"os.strerror(e.errno))).encode())\n"
	"        os._exit(127)\n"
	"    os.environ.clear()\n"
	"    for kv in env:\n"
	"        k, _, v = kv.partition('=')\n"
	"        os.environ[k] = v\n"
	"    random.seed()\n"
	"    sys.argv = argv[1:]\n"
	"    path = sys.argv[0]\n"
	"    sys.path[0] = os.path.dirname(os.path.realpath(path))\n"
	"    main = types.ModuleType('__main__')\n"
	"    main.__file__ = path\n"
	"    main.__cached__ = None\n"
	"    main.__builtins__ = builtins\n"
	"    main.__loader__ = importlib.machinery.SourceFileLoader('__main__', path)\n"
	"    sys.modules['__main__'] = main\n"
	"    _kiln_exit(_kiln_run(path, main))\n"
	"def _kiln_mark_done():\n"
	"    global _kiln_done\n"
	"    try:\n"
	"        st = os.fstat(4)\n"
	"        os.set_inheritable(4, False)\n"
	"        _kiln_done = (os.getpid(), (st.st_dev, st.st_ino))\n"
	"    except OSError:\n"
	"        pass\n"
	"def _kiln_warm():\n"
	"    r, w = os.pipe()\n"
	"    try:\n"
	"        pid = os.fork()\n"
	"    except BaseException:\n"
	"        os.close(r); os.close(w)\n"
	"        raise\n"
	"    if pid == 0:\n"
	"        try:\n"
	"            os.close(3); os.close(r); os.dup2(w, 4); os.close(w)\n"
	"            _kiln_mark_done()\n"
	"            _kiln_task(b'1000\\0' b'1000\\0' b'/work\\0' b'2\\0' b'python3\\0' b'/kiln/warm/main.py\\0'\n"
	"                       b'2\\0' b'PATH=/usr/bin:/bin\\0' b'HOME=/work\\0')\n"
	"        finally:\n"
	"            os._exit(0)\n"
	"    os.close(w)\n"
	"    os.read(r, 64)\n"
	"    os.close(r)\n"
	"    os.waitpid(pid, 0)\n"
	"    _kiln_unshare()\n"
	"def _kiln_unshare():\n"
	"    pm = os.open('/proc/self/pagemap', os.O_RDONLY | os.O_CLOEXEC)\n"
	"    try:\n"
	"        with open('/proc/self/maps', 'rb') as f:\n"
	"            maps = f.read().split(b'\\n')\n"
	"        for line in maps:\n"
	"            p = line.split()\n"
	"            if len(p) < 2 or p[1] != b'rw-p':\n"
	"                continue\n"
	"            s, e = (int(x, 16) for x in p[0].split(b'-'))\n"
	"            for a in range(s, e, 8192 * 4096):\n"
	"                ents = os.pread(pm, (min(e, a + 8192 * 4096) - a) // 4096 * 8, a // 4096 * 8)\n"
	"                for m in re.finditer(b'1+', ents[7::8].translate(_kiln_pages)):\n"
	"                    _kiln_madvise(a + m.start() * 4096, (m.end() - m.start()) * 4096, 23)\n"
	"    except Exception:\n"
	"        pass\n"
	"    finally:\n"
	"        os.close(pm)\n"
	"os.write(4, b'R')\n"
	"while True:\n"
	"    cmd = os.read(3, 1)\n"
	"    if cmd == b'W':\n"
	"        _kiln_warm()\n"
	"        os.write(4, b'w')\n"
	"        continue\n"
	"    if cmd != b'T':\n"
	"        os._exit(0)\n"
	"    break\n"
	"buf = bytearray()\n"
	"while True:\n"
	"    b = os.read(3, 65536)\n"
	"    if not b: break\n"
	"    buf += b\n"
	"os.close(3)\n"
	"_kiln_mark_done()\n"
	"_kiln_task(bytes(buf))\n";

static const char *const zygote_env[] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/work",
	"LANG=C.UTF-8",
	"PYTHONUNBUFFERED=1",
	"PYTHONDONTWRITEBYTECODE=1",
	/* Set before any preloaded numpy starts OpenBLAS/OpenMP: no thread pool
	 * in the interpreter that forks (a task's warm-up) or hands off. */
	"OPENBLAS_NUM_THREADS=1",
	"OMP_NUM_THREADS=1",
	NULL,
};

/* The task may override any of these by name; the interpreter read some of
 * them at start-up, so a task that changes them must not use the zygote. */
int zygote_can_run(const struct zygote *z, const struct proto_exec *e)
{
	if (z->pid <= 0 || e->argc < 2 || strcmp(e->argv[0], "python3"))
		return 0;
	for (uint32_t i = 0; i < e->envc; i++) {
		const char *v = e->env[i];
		int known = 0;

		if (strncmp(v, "PYTHON", 6) && strncmp(v, "LANG=", 5) && strncmp(v, "LC_", 3) &&
		    strncmp(v, "OPENBLAS_NUM_THREADS=", 21) && strncmp(v, "OMP_NUM_THREADS=", 16))
			continue;
		for (int j = 0; zygote_env[j]; j++)
			known |= !strcmp(v, zygote_env[j]);
		if (!known)
			return 0;
	}
	return 1;
}

static void __attribute__((noreturn)) zygote_child(int out, int err, int ctl, int ready, int preload)
{
	int fd;

	init_child_signals();
	setsid();
	fd = open("/dev/null", O_RDONLY);
	/* Move the fds into place: 0 null, 1 out, 2 err, 3 ctl, 4 ready. Use
	 * high numbers first so no dup2 clobbers a source. */
	if (fd < 0 || dup2(out, 101) < 0 || dup2(err, 102) < 0 || dup2(ctl, 103) < 0 || dup2(ready, 104) < 0 ||
	    dup2(fd, 0) < 0 || dup2(101, 1) < 0 || dup2(102, 2) < 0 || dup2(103, 3) < 0 || dup2(104, 4) < 0)
		_exit(127);
	close_range(5, ~0U, 0);
	fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (write(fd, "0", 1) != 1)
			_exit(127);
		close(fd);
	}
	setpriority(PRIO_PROCESS, 0, 0);
	/* As for every task process: set-uid binaries never raise privileges.
	 * The interpreter can still drop from root to the task's uid. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		_exit(127);
	execve("/usr/bin/python3",
	       (char *const[]){ "python3", "-c", (char *)zygote_src, preload ? NULL : "nopreload", NULL },
	       (char *const *)zygote_env);
	init_log("zygote: cannot execute /usr/bin/python3: %s", strerror(errno));
	_exit(127);
}

static int zygote_start_one(struct zygote *z, int64_t deadline_ms, int preload)
{
	int out[2] = { -1, -1 }, err[2] = { -1, -1 }, ctl[2] = { -1, -1 }, ready[2] = { -1, -1 };
	int r = 0;
	char c;

	memset(z, 0, sizeof(*z));
	z->ctl = z->out = z->err = z->ready = -1;
	if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || pipe2(ctl, O_CLOEXEC) < 0 ||
	    pipe2(ready, O_CLOEXEC) < 0) {
		r = -errno;
		goto fail;
	}
	z->pid = fork();
	if (z->pid < 0) {
		r = -errno;
		z->pid = 0;
		goto fail;
	}
	if (z->pid == 0)
		zygote_child(out[1], err[1], ctl[0], ready[1], preload);
	close(out[1]);
	close(err[1]);
	close(ctl[0]);
	close(ready[1]);
	out[1] = err[1] = ctl[0] = ready[1] = -1;
	z->out = out[0];
	z->err = err[0];
	z->ctl = ctl[1];
	fcntl(z->out, F_SETFL, O_NONBLOCK);
	fcntl(z->err, F_SETFL, O_NONBLOCK);
	/* Ready byte, or EOF if the interpreter died while importing. */
	for (;;) {
		struct pollfd p = { .fd = ready[0], .events = POLLIN };
		int64_t left = deadline_ms - proto_now_ms();
		ssize_t n;

		if (left <= 0) {
			r = -ETIMEDOUT;
			goto fail;
		}
		if (poll(&p, 1, left > 60000 ? 60000 : (int)left) < 0 && errno != EINTR) {
			r = -errno;
			goto fail;
		}
		if (!p.revents)
			continue;
		n = read(ready[0], &c, 1);
		if (n == 1)
			break;
		if (n < 0 && errno == EINTR)
			continue;
		r = n == 0 ? -EPIPE : -errno;
		goto fail;
	}
	z->ready = ready[0];
	return 0;
fail:
	for (int i = 0; i < 2; i++) {
		if (out[i] >= 0 && out[i] != z->out)
			close(out[i]);
		if (err[i] >= 0 && err[i] != z->err)
			close(err[i]);
		if (ctl[i] >= 0 && ctl[i] != z->ctl)
			close(ctl[i]);
		if (ready[i] >= 0)
			close(ready[i]);
	}
	zygote_stop(z);
	return r;
}

int zygote_start(struct zygote *z, int64_t deadline_ms)
{
	int r = zygote_start_one(z, deadline_ms, 1);

	/* It died while importing: if the template names modules to preload,
	 * one of them may be what killed it (a crash, os._exit), so start
	 * again without them rather than lose the pre-started interpreter. */
	if (r == -EPIPE && access(ZYGOTE_PRELOAD, F_OK) == 0) {
		init_log("zygote: python3 died while importing; starting it again without %s", ZYGOTE_PRELOAD);
		r = zygote_start_one(z, deadline_ms, 0);
	}
	return r;
}

static int put(char *buf, size_t cap, size_t *len, const char *s)
{
	size_t n = strlen(s) + 1;

	if (cap - *len < n)
		return -E2BIG;
	memcpy(buf + *len, s, n);
	*len += n;
	return 0;
}

int zygote_hand_off(struct zygote *z, const struct proto_exec *e, char *const envp[], pid_t *pid, int *out,
		     int *err, int *done)
{
	/* argv + env fit one EXEC payload; the numbers and NULs add a little. */
	static char buf[PROTO_MAX_PAYLOAD + 4 * PROTO_MAX_ENV + 256];
	char num[32];
	size_t len = 0, envc = 0;
	int r = 0;

	while (envp[envc])
		envc++;
	buf[len++] = 'T';
	snprintf(num, sizeof(num), "%u", e->uid);
	r |= put(buf, sizeof(buf), &len, num);
	snprintf(num, sizeof(num), "%u", e->gid);
	r |= put(buf, sizeof(buf), &len, num);
	r |= put(buf, sizeof(buf), &len, e->cwd);
	snprintf(num, sizeof(num), "%u", e->argc);
	r |= put(buf, sizeof(buf), &len, num);
	for (uint32_t i = 0; i < e->argc; i++)
		r |= put(buf, sizeof(buf), &len, e->argv[i]);
	snprintf(num, sizeof(num), "%zu", envc);
	r |= put(buf, sizeof(buf), &len, num);
	for (size_t i = 0; i < envc; i++)
		r |= put(buf, sizeof(buf), &len, envp[i]);
	if (r) {
		zygote_stop(z);
		return -E2BIG;
	}
	/* The interpreter is blocked reading: this write completes. */
	r = io_write_all(z->ctl, buf, len);
	if (r < 0) {
		/* EPIPE: it died and PID 1 reaped it; its pid may be reused. */
		if (r == -EPIPE)
			z->pid = 0;
		zygote_stop(z);
		return r;
	}
	close(z->ctl);
	fcntl(z->ready, F_SETFL, O_NONBLOCK);
	*pid = z->pid;
	*out = z->out;
	*err = z->err;
	*done = z->ready;
	memset(z, 0, sizeof(*z));
	z->ctl = z->out = z->err = z->ready = -1;
	return 0;
}

/* Reads and drops what a pipe holds now (the warm-up's output). */
static void zygote_discard(int fd)
{
	char buf[4096];

	while (read(fd, buf, sizeof(buf)) > 0)
		;
}

int zygote_warm(struct zygote *z, int64_t deadline_ms)
{
	char c = 'W';

	if (z->pid <= 0)
		return -ESRCH;
	if (write(z->ctl, &c, 1) != 1)
		return -errno;
	for (;;) {
		/* The sample writes to the task's own pipes (so that path is
		 * translated too): drained here, never seen by a task. */
		struct pollfd p[3] = {
			{ .fd = z->ready, .events = POLLIN },
			{ .fd = z->out, .events = POLLIN },
			{ .fd = z->err, .events = POLLIN },
		};
		int64_t left = deadline_ms - proto_now_ms();
		ssize_t n;

		if (left <= 0)
			return -ETIMEDOUT;
		if (poll(p, 3, left > 60000 ? 60000 : (int)left) < 0 && errno != EINTR)
			return -errno;
		if (p[1].revents)
			zygote_discard(z->out);
		if (p[2].revents)
			zygote_discard(z->err);
		if (!p[0].revents)
			continue;
		n = read(z->ready, &c, 1);
		if (n == 1 && c == 'w') {
			/* The sample has been reaped: all it wrote is in the pipes. */
			zygote_discard(z->out);
			zygote_discard(z->err);
			return 0;
		}
		if (n < 0 && errno == EINTR)
			continue;
		return n == 0 ? -EPIPE : n < 0 ? -errno : -EPROTO;
	}
}

void zygote_stop(struct zygote *z)
{
	if (z->pid > 0)
		kill(z->pid, SIGKILL);
	if (z->ctl >= 0)
		close(z->ctl);
	if (z->out >= 0)
		close(z->out);
	if (z->err >= 0)
		close(z->err);
	if (z->ready >= 0)
		close(z->ready);
	memset(z, 0, sizeof(*z));
	z->ctl = z->out = z->err = z->ready = -1;
}
