"""The Python SDK's volumes (Client.create_volume, Client.volumes,
Client.volume, Volume.delete/refresh/mount, Client.session(volumes=...),
Session.volumes) against the stand-in kiln-api
tests/integration/volume_api.py (no VM), which
tests/integration/110-volume-clients.sh starts (one of its own for this
file) and names in KILN_API, KILN_KEY and KILN_TEST_REQUESTS (its request
log). Python's unittest; each test prints "PASS name" or "FAIL name: why"
for the shell to count. The same calls against a real stack:
tests/sdk/test_python_sdk.py (Volumes).
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


def count_requests():
    try:
        with open(REQUESTS) as f:
            return len(f.read().splitlines())
    except FileNotFoundError:
        return 0


class Volumes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # No retries: a 429 or 503 is the answer under test, not a wait.
        cls.c = kiln.Client(max_retries=0)

    def test_create_get_list_delete(self):
        """create_volume posts name and size; volume() by id and by name; volumes() newest first; delete, then 404"""
        a = self.c.create_volume("sdk-a", size_mib=64)
        self.assertEqual(last_request()["body"], {"name": "sdk-a", "size_mib": 64})
        self.assertEqual(last_request()["path"], "/v1/volumes")
        self.assertIsInstance(a, kiln.Volume)
        self.assertTrue(a.id.startswith("vol_"))
        self.assertEqual((a.name, a.size_mib, a.mounted_by, a.bytes), ("sdk-a", 64, [], None))
        b = self.c.create_volume("sdk-b")
        self.assertEqual(last_request()["body"], {"name": "sdk-b"})  # kiln-api's default size
        self.assertEqual(b.size_mib, 1024)
        self.assertEqual(self.c.volume(a.id).name, "sdk-a")
        self.assertEqual(self.c.volume("sdk-a").id, a.id)
        self.assertEqual(last_request()["path"], "/v1/volumes/sdk-a")
        self.assertEqual([v.id for v in self.c.volumes() if v.name.startswith("sdk-")][:2], [b.id, a.id])
        self.assertEqual([v.id for v in self.c.volumes(name="sdk-b")], [b.id])
        self.assertEqual(last_request()["path"], "/v1/volumes?name=sdk-b")
        self.assertEqual(a.delete(), {"id": a.id, "deleted": True})
        self.assertEqual((last_request()["method"], last_request()["path"]), ("DELETE", "/v1/volumes/" + a.id))
        with self.assertRaises(kiln.NotFoundError):
            self.c.volume(a.id)
        with self.assertRaises(kiln.NotFoundError):
            a.delete()
        b.delete()

    def test_create_refused(self):
        """a name taken: ConflictError; a size beyond max_volume_mib: ValidationError; past max_volumes: QuotaError"""
        v = self.c.create_volume("sdk-dup")
        with self.assertRaises(kiln.ConflictError) as cm:
            self.c.create_volume("sdk-dup")
        self.assertEqual(cm.exception.code, "conflict")
        with self.assertRaises(kiln.ValidationError):
            self.c.create_volume("sdk-big", size_mib=20000)
        made = [v]
        try:
            with self.assertRaises(kiln.QuotaError) as cm:
                for i in range(10):
                    made.append(self.c.create_volume("sdk-q%d" % i))
            self.assertEqual(cm.exception.code, "quota_exceeded")
            self.assertEqual(len(self.c.volumes()), 5)  # the stand-in's max_volumes
        finally:
            for x in made:
                x.delete()

    def test_session_mounts(self):
        """session(volumes=[...]) and {path: name} send name/path/read_only; the session shows its volumes"""
        ws, ref = self.c.create_volume("sdk-ws"), self.c.create_volume("sdk-ref")
        try:
            with self.c.session(volumes=[{"name": ws, "path": "/data"}, ref.mount("/ref", read_only=True)]) as s:
                self.assertEqual(last_request()["body"]["volumes"], [
                    {"name": "sdk-ws", "path": "/data"}, {"name": "sdk-ref", "path": "/ref", "read_only": True}])
                self.assertEqual([(m["name"], m["id"], m["path"], m["read_only"]) for m in s.volumes],
                                 [("sdk-ws", ws.id, "/data", False), ("sdk-ref", ref.id, "/ref", True)])
                self.assertEqual(ws.refresh()["mounted_by"], [{"session_id": s.id, "read_only": False}])
                self.assertEqual(ws.mounted_by, [{"session_id": s.id, "read_only": False}])
            # Destroyed on `with` exit: the volume is free and was written.
            self.assertEqual(ws.refresh()["mounted_by"], [])
            self.assertEqual(ws.bytes, 4096)
            with self.c.session(volumes={"/work/data": "sdk-ws"}) as s:
                self.assertEqual(last_request()["body"]["volumes"], [{"name": "sdk-ws", "path": "/work/data"}])
                self.assertEqual(s.volumes[0]["path"], "/work/data")
        finally:
            ws.delete()
            ref.delete()

    def test_busy_and_refusals(self):
        """a second writer: ConflictError volume_busy (readers fine); delete while mounted: volume_busy; fork: volume_attached"""
        ws = self.c.create_volume("sdk-busy")
        try:
            with self.c.session(volumes={"/data": ws}) as s:
                with self.assertRaises(kiln.ConflictError) as cm:
                    self.c.session(volumes={"/data": "sdk-busy"})
                self.assertEqual(cm.exception.code, "volume_busy")
                with self.c.session(volumes=[{"name": "sdk-busy", "path": "/data", "read_only": True}]) as r:
                    self.assertTrue(r.volumes[0]["read_only"])
                with self.assertRaises(kiln.ConflictError) as cm:
                    ws.delete()
                self.assertEqual(cm.exception.code, "volume_busy")
                with self.assertRaises(kiln.ConflictError) as cm:
                    s.fork()
                self.assertEqual(cm.exception.code, "volume_attached")
            with self.assertRaises(kiln.ValidationError) as cm:
                self.c.session(volumes={"/data": "sdk-none"})
            self.assertIn("no volume named sdk-none", str(cm.exception))
        finally:
            ws.delete()

    def test_delete_no_host(self):
        """a delete with no host to reach: UnavailableError host_unavailable, and the volume is still there"""
        v = self.c.create_volume("nohost-sdk")
        with self.assertRaises(kiln.UnavailableError) as cm:
            v.delete()
        self.assertEqual(cm.exception.code, "host_unavailable")
        self.assertEqual(self.c.volume(v.id).name, "nohost-sdk")

    def test_mounts_checked_before_sending(self):
        """more than 2 volumes, or an entry without a path, is a ValidationError and nothing is sent"""
        n = count_requests()
        for bad in ([{"name": "a", "path": "/a"}, {"name": "b", "path": "/b"}, {"name": "c", "path": "/c"}],
                    [{"name": "a"}], ["a"], {"/data": 3}):
            with self.assertRaises(kiln.ValidationError):
                self.c.session(volumes=bad)
        self.assertEqual(count_requests(), n)


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
    print("sdk_volumes: %d run, %d failed" % (res.testsRun, len(res.failures) + len(res.errors)), flush=True)
    sys.exit(0 if res.wasSuccessful() else 1)
