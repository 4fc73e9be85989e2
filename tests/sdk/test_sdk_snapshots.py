"""The Python SDK's fork and named snapshots (Session.fork, Session.snapshot,
Client.snapshot, Client.snapshots, Snapshot.delete, Client.session(snapshot=))
against the stand-in kiln-api tests/integration/snap_api.py (no VM), which
tests/integration/106-snapshot-clients.sh starts and names in KILN_API,
KILN_KEY and KILN_TEST_REQUESTS (its request log). Python's unittest; each
test prints "PASS name" or "FAIL name: why" for the shell to count. The
same calls against a real stack: tests/sdk/test_python_sdk.py (Snapshots).
"""
import json
import os
import sys
import unittest

import kiln

REQUESTS = os.environ["KILN_TEST_REQUESTS"]


def last_request():
    with open(REQUESTS) as f:
        return json.loads(f.read().splitlines()[-1])


def requests_since(n):
    with open(REQUESTS) as f:
        return [json.loads(x) for x in f.read().splitlines()[n:]]


def count_requests():
    try:
        with open(REQUESTS) as f:
            return len(f.read().splitlines())
    except FileNotFoundError:
        return 0


class Snapshots(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = kiln.Client()

    def test_snapshot_get_delete(self):
        """Session.snapshot(name) posts the name; Client.snapshot reads it; delete, then 404"""
        s = kiln.Session(self.c, {"id": "s_run", "state": "running"}, keep=True)
        snap = s.snapshot(name="sdk-one")
        self.assertEqual(last_request()["path"], "/v1/sessions/s_run/snapshots")
        self.assertEqual(last_request()["body"], {"name": "sdk-one"})
        self.assertIsInstance(snap, kiln.Snapshot)
        self.assertTrue(snap.id.startswith("snap_"))
        self.assertEqual((snap.name, snap.session_id, snap.template, snap.vcpus, snap.memory_mib, snap.bytes,
                          snap.stop_ms), ("sdk-one", "s_run", "default", 1, 256, 71892992, 12))
        got = self.c.snapshot(snap.id)
        self.assertEqual((got.id, got.name, got.created_ms), (snap.id, "sdk-one", snap.created_ms))
        self.assertEqual(snap.delete(), {"id": snap.id, "deleted": True})
        self.assertEqual(last_request()["method"], "DELETE")
        with self.assertRaises(kiln.NotFoundError):
            self.c.snapshot(snap.id)
        with self.assertRaises(kiln.NotFoundError):
            snap.delete()

    def test_snapshot_no_name_and_not_running(self):
        """no name: an empty body; a paused session: ConflictError not_running"""
        snap = kiln.Session(self.c, {"id": "s_run"}, keep=True).snapshot()
        self.assertEqual(last_request()["body"], {})
        self.assertIsNone(snap.name)
        snap.delete()
        with self.assertRaises(kiln.ConflictError) as cm:
            kiln.Session(self.c, {"id": "s_paused"}, keep=True).snapshot()
        self.assertEqual(cm.exception.code, "not_running")

    def test_list_follows_pages(self):
        """Client.snapshots follows "next" across pages, newest first, with the name and session filters"""
        s = kiln.Session(self.c, {"id": "s_two"}, keep=True)
        made = [s.snapshot(name="paged") for _ in range(5)]
        n = count_requests()
        got = [x.id for x in self.c.snapshots(name="paged")]
        self.assertEqual(got, [x.id for x in reversed(made)])
        reqs = requests_since(n)
        self.assertEqual(len(reqs), 3)  # the stand-in gives 2 a page
        self.assertEqual(reqs[0]["path"], "/v1/snapshots?limit=100&name=paged")
        self.assertEqual(reqs[1]["path"], "/v1/snapshots?limit=100&name=paged&after=tok-2")
        mine = list(self.c.snapshots(session_id="s_two"))
        self.assertTrue(all(x.session_id == "s_two" for x in mine))
        self.assertGreaterEqual(len(mine), 5)
        self.assertIn("session_id=s_two", requests_since(n)[3]["path"])
        # lazily: the first item comes from the first page alone
        n = count_requests()
        next(iter(self.c.snapshots(name="paged")))
        self.assertEqual(count_requests() - n, 1)
        for x in made:
            x.delete()
        self.assertEqual(list(self.c.snapshots(name="paged")), [])

    def test_session_from_snapshot(self):
        """Client.session(snapshot=...) and Snapshot.session(): "snapshot" in the body; shaping arguments refused"""
        snap = kiln.Session(self.c, {"id": "s_run"}, keep=True).snapshot(name="start")
        with self.c.session(snapshot=snap, idle_timeout_s=60) as s:
            self.assertEqual(last_request()["body"], {"snapshot": snap.id, "idle_timeout_s": 60})
            self.assertEqual(s.session.get("snapshot_id"), snap.id)
        self.assertEqual(last_request()["method"], "DELETE")
        s2 = snap.session(keep=True)
        self.assertEqual(last_request()["body"], {"snapshot": snap.id})
        self.assertEqual(s2.session["snapshot_id"], snap.id)
        s3 = self.c.session(snapshot=snap.id, keep=True)
        self.assertEqual(s3.session["snapshot_id"], snap.id)
        n = count_requests()
        for kw in ({"template": "python-data"}, {"limits": {"memory_mib": 512}}, {"network": {"egress": "allow"}}):
            with self.assertRaises(kiln.ValidationError):
                self.c.session(snapshot=snap, **kw)
        self.assertEqual(count_requests(), n)  # refused before any request
        snap.delete()
        with self.assertRaises(kiln.NotFoundError):
            self.c.session(snapshot=snap.id)

    def test_fork(self):
        """Session.fork(count): the children as Sessions, stop_ms, no errors"""
        s = kiln.Session(self.c, {"id": "s_run"}, keep=True)
        kids = s.fork(count=3)
        self.assertEqual(last_request()["path"], "/v1/sessions/s_run/fork")
        self.assertEqual(last_request()["body"], {"count": 3})
        self.assertIsInstance(kids, kiln.ForkResult)
        self.assertEqual(len(kids), 3)
        self.assertTrue(all(isinstance(k, kiln.Session) and k.state == "running" for k in kids))
        self.assertEqual(len({k.id for k in kids}), 3)
        self.assertEqual((kids.errors, kids.stop_ms), ([], 7))
        self.assertEqual(len(s.fork()), 1)
        self.assertEqual(last_request()["body"], {"count": 1})
        for bad in (0, 21, "2", True):
            with self.assertRaises(kiln.ValidationError):
                s.fork(count=bad)

    def test_fork_partial_and_total_failure(self):
        """a partial fork returns what was made with typed errors; none made raises the first refusal"""
        kids = kiln.Session(self.c, {"id": "s_two"}, keep=True).fork(count=5)
        self.assertEqual(len(kids), 2)
        self.assertEqual(len(kids.errors), 3)
        self.assertTrue(all(isinstance(e, kiln.QuotaError) and e.code == "quota_exceeded" for e in kids.errors))
        with self.assertRaises(kiln.QuotaError) as cm:
            kiln.Session(self.c, {"id": "s_full"}, keep=True).fork(count=2)
        self.assertEqual(cm.exception.code, "quota_exceeded")
        self.assertEqual(len(cm.exception.errors), 2)
        with self.assertRaises(kiln.ConflictError) as cm:
            kiln.Session(self.c, {"id": "s_paused"}, keep=True).fork()
        self.assertEqual(cm.exception.code, "not_running")
        with self.assertRaises(kiln.NotFoundError):
            kiln.Session(self.c, {"id": "s_nope"}, keep=True).fork()


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


if __name__ == "__main__":
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    res = unittest.TextTestRunner(stream=sys.stderr, resultclass=Report, verbosity=0).run(suite)
    print("sdk_snapshots: %d run, %d failed" % (res.testsRun, len(res.failures) + len(res.errors)), flush=True)
    sys.exit(0 if res.wasSuccessful() else 1)
