"""The Python SDK (sdk/python, package kiln) against a real stack: kiln-api,
a kiln-host with real VMs, a local S3 (started by
tests/integration/94-python-sdk.sh, which passes KILN_API, KILN_KEY and
the test's own KILN_TEST_* variables). Python's unittest; each test prints
"PASS name" or "FAIL name: why" for the shell to count.
"""
import hashlib
import http.server
import json
import os
import sys
import threading
import time
import unittest

import kiln

API = os.environ["KILN_API"]
KEY = os.environ["KILN_KEY"]
ADMIN = os.environ["KILN_TEST_ADMIN"]
OTHER_KEY = os.environ["KILN_TEST_OTHER_KEY"]  # customer "beta": its quotas are changed here


def admin(method, path, body=None):
    import urllib.request
    req = urllib.request.Request(API + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": "Bearer " + ADMIN, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


class Tasks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = kiln.Client()  # from KILN_API / KILN_KEY

    def test_run_with_outputs(self):
        """run(): stdout, exit code, outputs downloadable and saved"""
        r = self.c.run("import os\nos.makedirs('/output/sub', exist_ok=True)\n"
                       "open('/output/a.txt', 'w').write('alpha')\n"
                       "open('/output/sub/b.bin', 'wb').write(bytes(range(256)) * 4)\nprint('hello from kiln')",
                       files={"/work/in.txt": "input file"}, env={"GREETING": "hi"})
        self.assertEqual(r.state, "succeeded")
        self.assertEqual(r.exit_code, 0)
        self.assertEqual(r.stdout, "hello from kiln\n")
        self.assertEqual(sorted(o.path for o in r.outputs), ["a.txt", "sub/b.bin"])
        self.assertEqual(r.output("a.txt").read(), b"alpha")
        path = os.path.join(os.environ.get("T_TMP", "/tmp"), "sdk-out", "b.bin")
        r.output("sub/b.bin").save(path)
        with open(path, "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), hashlib.sha256(bytes(range(256)) * 4).hexdigest())

    def test_files_env_and_argv(self):
        """files, env and argv reach the sandbox"""
        r = self.c.run(argv=["sh", "-c", "cat /work/in.txt; echo \" $GREETING\""], files={"/work/in.txt": "data"},
                       env={"GREETING": "hi"})
        self.assertEqual(r.stdout, "data hi\n")

    def test_whole_stdout_past_the_excerpt(self):
        """a long stdout comes back whole (the log is fetched through its URL)"""
        r = self.c.run("for i in range(20000): print('line %06d' % i)")
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 20000)
        self.assertEqual(lines[0], "line 000000")
        self.assertEqual(lines[-1], "line 019999")

    def test_task_failed(self):
        """a failing task raises TaskFailed carrying its result"""
        with self.assertRaises(kiln.TaskFailed) as cm:
            self.c.run("import sys\nsys.stderr.write('boom\\n')\nsys.exit(3)")
        res = cm.exception.result
        self.assertEqual(res.state, "failed")
        self.assertEqual(res.exit_code, 3)
        self.assertEqual(res.stderr, "boom\n")
        # check=False returns it instead
        self.assertEqual(self.c.run("raise SystemExit(4)", check=False).exit_code, 4)

    def test_wrong_key(self):
        """a wrong key raises AuthError"""
        bad = kiln.Client(API, "kiln_nosuchkey_" + "x" * 40)
        with self.assertRaises(kiln.AuthError) as cm:
            bad.run("print(1)")
        self.assertEqual(cm.exception.status, 401)

    def test_validation_names_the_field(self):
        """a bad field raises ValidationError naming it"""
        with self.assertRaises(kiln.ValidationError) as cm:
            self.c.submit("print(1)", limits={"memory_mib": 1})
        self.assertEqual(cm.exception.field, "limits.memory_mib")
        with self.assertRaises(kiln.ValidationError) as cm:
            self.c.submit("print(1)", language="cobol")
        self.assertEqual(cm.exception.field, "language")

    def test_quota_retry_after(self):
        """a quota hit raises QuotaError with retry_after (after the SDK's own retries)"""
        admin("PUT", "/v1/admin/customers/beta/quotas", {"submit_rate": 0.05, "submit_burst": 1})
        try:
            beta = kiln.Client(API, OTHER_KEY, max_retries=0)
            t = beta.submit("print(1)")
            with self.assertRaises(kiln.QuotaError) as cm:
                beta.submit("print(2)")
            self.assertEqual(cm.exception.status, 429)
            self.assertEqual(cm.exception.code, "rate_limited")
            self.assertIsNotNone(cm.exception.retry_after)
            self.assertGreater(cm.exception.retry_after, 0)
            self.assertEqual(t.wait(120).state, "succeeded")
        finally:
            admin("PUT", "/v1/admin/customers/beta/quotas", {"submit_rate": 10, "submit_burst": 20})

    def test_idempotent_submit(self):
        """the same idempotency key gives the same task"""
        a = self.c.submit("print('once')", idempotency_key="sdk-test-idem-1")
        b = self.c.submit("print('once')", idempotency_key="sdk-test-idem-1")
        self.assertEqual(a.id, b.id)
        self.assertEqual(b.wait(120).stdout, "once\n")

    def test_stream_live(self):
        """stream() yields stdout/stderr events live and in order"""
        t = self.c.submit("import sys, time\nfor i in range(5):\n    print('out', i)\n    time.sleep(0.2)\n"
                          "sys.stderr.write('err\\n')")
        out, err, states, first_at, seen = "", "", [], None, []
        t0 = time.monotonic()
        for ev in t.stream(states=True):
            seen.append((ev.type, ev.data))
            if ev.type == "stdout":
                out += ev.data
                if first_at is None:
                    first_at = time.monotonic() - t0
            elif ev.type == "stderr":
                err += ev.data
            else:
                states.append(ev.data)
        self.assertEqual(out, "".join("out %d\n" % i for i in range(5)), "events: %r" % seen)
        self.assertEqual(err, "err\n")
        self.assertEqual(states[-1], "succeeded")
        self.assertIn("running", states)
        res = t.wait(60)
        self.assertEqual(res.stdout, out)

    def test_cancel(self):
        """cancel() stops a running task"""
        t = self.c.submit("import time\nprint('started', flush=True)\ntime.sleep(120)")
        for ev in t.stream():
            if ev.type == "stdout" and "started" in ev.data:
                break
        t.cancel()
        res = t.wait(60)
        self.assertEqual(res.state, "cancelled")

    def test_wait_timeout(self):
        """wait(timeout) raises TimeoutError while the task runs"""
        t = self.c.submit("import time\ntime.sleep(30)")
        with self.assertRaises(TimeoutError):
            t.wait(1)
        t.cancel()
        self.assertEqual(t.wait(60).state, "cancelled")


class Sessions(unittest.TestCase):
    def test_session_round_trip(self):
        """a session: write, read, list, exec, a background process, pause, resume, destroyed on exit"""
        c = kiln.Client()
        with c.session(limits={"memory_mib": 256}) as s:
            self.assertEqual(s.state, "running")
            s.write("/work/notes/a.txt", "kept across pause")
            self.assertEqual(s.read("/work/notes/a.txt"), b"kept across pause")
            self.assertIn({"name": "a.txt", "type": "file", "size": 17},
                          [dict(e) for e in s.list("/work/notes")])
            r = s.exec(code="x = 6 * 7\nprint(x)")
            self.assertEqual((r.exit_code, r.stdout), (0, "42\n"))
            r = s.exec("echo $((1+2)) && exit 5")
            self.assertEqual((r.exit_code, r.stdout), (5, "3\n"))
            with self.assertRaises(kiln.KilnError):
                s.exec(["false"], check=True)
            s.exec("nohup sh -c 'echo $$ > /work/bg.pid; exec sleep 3600' > /dev/null 2>&1 &")
            time.sleep(0.5)
            pid = s.read("/work/bg.pid").strip()
            self.assertEqual(s.pause()["state"], "paused")
            with self.assertRaises(kiln.ConflictError):
                s.exec(["true"])
            self.assertEqual(s.resume()["state"], "running")
            self.assertEqual(s.read("/work/notes/a.txt"), b"kept across pause")
            self.assertEqual(s.exec(["sh", "-c", "kill -0 %s && echo alive" % pid.decode()]).stdout, "alive\n")
            with self.assertRaises(kiln.NotFoundError):
                s.read("/work/missing")
            sid = s.id
        self.assertEqual(c.get_session(sid).state, "destroyed")


class Forks(unittest.TestCase):
    """Issue 41 on the real stack (the requests and error handling against a
    stand-in: tests/sdk/test_sdk_snapshots.py)."""

    def test_fork(self):
        """fork(2): each child has the parent's file and background process; changes stay in one"""
        c = kiln.Client()
        with c.session(limits={"memory_mib": 256}) as s:
            s.write("/work/state.txt", "parent")
            s.exec("nohup sh -c 'echo $$ > /work/bg.pid; exec sleep 3600' > /dev/null 2>&1 &")
            time.sleep(0.5)
            pid = s.read("/work/bg.pid").strip().decode()
            kids = s.fork(count=2)
            try:
                self.assertEqual((len(kids), kids.errors), (2, []))
                self.assertIsInstance(kids.stop_ms, int)
                self.assertEqual(len({k.id for k in kids} | {s.id}), 3)
                for k in kids:
                    self.assertEqual(k.state, "running")
                    self.assertEqual(k.read("/work/state.txt"), b"parent")
                    self.assertEqual(k.exec("kill -0 %s && echo alive" % pid).stdout, "alive\n")
                kids[0].write("/work/state.txt", "child0")
                self.assertEqual(kids[1].read("/work/state.txt"), b"parent")
                self.assertEqual(s.read("/work/state.txt"), b"parent")
            finally:
                for k in kids:
                    k.destroy()

    def test_snapshot(self):
        """snapshot(name): listed, read, a session started from it has its files, deleted"""
        c = kiln.Client()
        name = "sdk-test-%d" % os.getpid()
        with c.session(limits={"memory_mib": 256}) as s:
            s.write("/work/kept.txt", "in the snapshot")
            snap = s.snapshot(name=name)
        try:
            self.assertTrue(snap.id.startswith("snap_"))
            self.assertEqual((snap.name, snap.session_id), (name, s.id))
            self.assertEqual([x.id for x in c.snapshots(name=name)], [snap.id])
            self.assertEqual(c.snapshot(snap.id).session_id, s.id)
            # The session it was taken of is gone: the snapshot outlives it.
            with c.session(snapshot=snap) as n:
                self.assertEqual(n.session.get("snapshot_id"), snap.id)
                self.assertEqual(n.read("/work/kept.txt"), b"in the snapshot")
        finally:
            snap.delete()
        with self.assertRaises(kiln.NotFoundError):
            c.snapshot(snap.id)
        self.assertEqual(list(c.snapshots(name=name)), [])


class Volumes(unittest.TestCase):
    """Issue 41's volumes on the real stack (the requests and error handling
    against a stand-in: tests/sdk/test_sdk_volumes.py)."""

    def test_volume(self):
        """create_volume; a file written and synced in one session is read in the next; busy while mounted; delete"""
        c = kiln.Client()
        v = c.create_volume("sdk-vol-%d" % os.getpid(), size_mib=64)
        try:
            self.assertTrue(v.id.startswith("vol_"))
            self.assertEqual((v.size_mib, v.mounted_by), (64, []))
            with c.session(limits={"memory_mib": 256}, volumes={"/data": v}) as s:
                self.assertEqual([(m["id"], m["path"], m["read_only"]) for m in s.volumes], [(v.id, "/data", False)])
                s.exec("echo kept > /data/kept.txt && sync", check=True)
                self.assertEqual(c.volume(v.name).mounted_by, [{"session_id": s.id, "read_only": False}])
                with self.assertRaises(kiln.ConflictError) as cm:
                    c.session(volumes={"/data": v})
                self.assertEqual(cm.exception.code, "volume_busy")
                with self.assertRaises(kiln.ConflictError):
                    v.delete()
            with c.session(limits={"memory_mib": 256}, volumes=[v.mount("/ro", read_only=True)]) as s:
                self.assertEqual(s.read("/ro/kept.txt"), b"kept\n")
            self.assertEqual(v.refresh()["mounted_by"], [])
            self.assertGreater(v.bytes or 0, 0)
        finally:
            v.delete()
        with self.assertRaises(kiln.NotFoundError):
            c.volume(v.id)


class Retries(unittest.TestCase):
    def test_retry_on_503_with_retry_after(self):
        """429/503 are retried honouring Retry-After, with one idempotency key"""
        seen = []

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                seen.append((time.monotonic(), self.headers.get("Idempotency-Key")))
                if len(seen) == 1:
                    code, body, extra = 503, {"error": {"code": "no_capacity", "message": "full"}}, {"Retry-After": "1"}
                elif len(seen) == 2:
                    code, body, extra = 429, {"error": {"code": "rate_limited", "message": "slow down"}}, {"Retry-After": "0"}
                else:
                    code, body, extra = 202, {"id": "t_fake", "state": "queued"}, {}
                data = json.dumps(body).encode()
                self.send_response(code)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        th = threading.Thread(target=srv.serve_forever, daemon=True)
        th.start()
        try:
            c = kiln.Client("http://127.0.0.1:%d" % srv.server_address[1], "kiln_x_y")
            t = c.submit("print(1)")
            self.assertEqual(t.id, "t_fake")
            self.assertEqual(len(seen), 3)
            self.assertEqual(len({k for _, k in seen}), 1)
            self.assertTrue(seen[0][1])
            self.assertGreaterEqual(seen[1][0] - seen[0][0], 0.9)  # Retry-After: 1 was honoured
            # No retries left: the error itself.
            seen.clear()
            c0 = kiln.Client("http://127.0.0.1:%d" % srv.server_address[1], "kiln_x_y", max_retries=0)
            with self.assertRaises(kiln.UnavailableError) as cm:
                c0.submit("print(1)")
            self.assertEqual(cm.exception.retry_after, 1.0)
        finally:
            srv.shutdown()
            srv.server_close()


class Code(unittest.TestCase):
    def test_run_code_events(self):
        """run_code: the SSE body, callbacks in order, .text, .png bytes, .data, .chart, error, contexts, 409"""
        import base64
        png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
        seen = []

        def sse(*events):
            return "".join("event: %s\ndata: %s\n\n" % (n, json.dumps(d)) for n, d in events).encode()

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def answer(self, code, body, ctype="application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n) or b"{}")
                seen.append((self.path, self.headers.get("Accept"), body))
                if self.path == "/v1/sessions/s_plain/code":
                    return self.answer(409, json.dumps({"error": {"code": "no_interpreter", "message": "none"}}).encode())
                if self.path.endswith("/code/contexts"):
                    return self.answer(201, json.dumps({"id": "c9", "language": "python", "cwd": "/tmp"}).encode())
                if body.get("code") == "cut":
                    return self.answer(200, sse(("stdout", {"text": "a"})), "text/event-stream")
                self.answer(200, sse(("stdout", {"text": "one\n"}), ("stderr", {"text": "two\n"}),
                                     ("result", {"text": "<Figure>", "png": base64.b64encode(png).decode(),
                                                 "chart": {"type": "line"}, "is_main_result": False}),
                                     ("result", {"text": "2", "html": "<b>2</b>", "data": {"a": [1]},
                                                 "is_main_result": True}),
                                     ("error", {"name": "ValueError", "value": "boom", "traceback": "tb"}),
                                     ("execution_count", {"execution_count": 4}), ("end", {"execution_count": 4})),
                            "text/event-stream")

            def do_GET(self):
                self.answer(200, json.dumps({"contexts": [{"id": "c9", "language": "python", "cwd": "/tmp"}]}).encode())

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        th = threading.Thread(target=srv.serve_forever, daemon=True)
        th.start()
        try:
            c = kiln.Client("http://127.0.0.1:%d" % srv.server_address[1], "kiln_x_y")
            s = kiln.Session(c, {"id": "s_1", "state": "running"}, keep=True)
            order = []
            ex = s.run_code("x", env={"K": "v"}, timeout=2.5, on_stdout=lambda t: order.append(("out", t)),
                            on_stderr=lambda t: order.append(("err", t)),
                            on_result=lambda r: order.append(("result", r.text)))
            self.assertEqual(seen[-1], ("/v1/sessions/s_1/code", "text/event-stream",
                                        {"code": "x", "env_vars": {"K": "v"}, "timeout_ms": 2500}))
            self.assertEqual(order, [("out", "one\n"), ("err", "two\n"), ("result", "<Figure>"), ("result", "2")])
            self.assertEqual(ex.text, "2")
            self.assertEqual(ex.results[0].png, png)
            self.assertEqual(ex.results[0].chart, {"type": "line"})
            self.assertEqual((ex.results[1].html, ex.results[1].data), ("<b>2</b>", {"a": [1]}))
            self.assertEqual(ex.results[1].formats(), ["html", "data"])
            self.assertEqual((ex.error.name, ex.error.value), ("ValueError", "boom"))
            self.assertEqual((ex.execution_count, ex.logs.stdout, ex.logs.stderr), (4, ["one\n"], ["two\n"]))
            self.assertEqual(s.run_code("cut").error.name, "InterpreterError")
            ctx = s.create_code_context(cwd="/tmp")
            self.assertEqual((ctx.id, seen[-1][2]), ("c9", {"cwd": "/tmp"}))
            s.run_code("y", context=ctx)
            self.assertEqual(seen[-1][2], {"code": "y", "context_id": "c9"})
            self.assertEqual([x.id for x in s.list_code_contexts()], ["c9"])
            with self.assertRaises(kiln.ValidationError):
                s.run_code("y", language="python", context=ctx)
            with self.assertRaises(kiln.ConflictError) as cm:
                kiln.Session(c, {"id": "s_plain"}, keep=True).run_code("1+1")
            self.assertEqual(cm.exception.code, "no_interpreter")
        finally:
            srv.shutdown()
            srv.server_close()


class Report(unittest.TextTestResult):
    def addSuccess(self, test):
        super().addSuccess(test)
        print("PASS %s" % (test.shortDescription() or test.id()), flush=True)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        print("FAIL %s: %s" % (test.shortDescription() or test.id(), str(err[1]).replace("\n", " ")[:400]), flush=True)

    def addError(self, test, err):
        super().addError(test, err)
        print("FAIL %s: %s: %s" % (test.shortDescription() or test.id(), err[0].__name__,
                                   str(err[1]).replace("\n", " ")[:400]), flush=True)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        print("SKIP %s: %s" % (test.shortDescription() or test.id(), reason), flush=True)


if __name__ == "__main__":
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    res = unittest.TextTestRunner(stream=sys.stderr, resultclass=Report, verbosity=0).run(suite)
    print("sdk_test: %d run, %d failed" % (res.testsRun, len(res.failures) + len(res.errors)), flush=True)
    sys.exit(0 if res.wasSuccessful() else 1)
