#!/usr/bin/python3
"""HTTPS load on kiln-api's TLS listener while its certificate is reloaded
(119-cluster-tls.sh): THREADS threads for SECONDS seconds GET /healthz,
even threads on a new connection each time, odd ones on one kept-alive
connection (reopened only when the server closes it). Every request that
does not come back 200 is a failure. Prints {"ok": N, "failed": N,
"errors": [first few]} as JSON.

usage: tls_load.py HOST PORT CA_FILE THREADS SECONDS"""
import http.client
import json
import ssl
import sys
import threading
import time

host, port, ca, nthreads, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
ctx = ssl.create_default_context(cafile=ca)
lock = threading.Lock()
count = {"ok": 0, "failed": 0, "errors": []}
end = time.monotonic() + seconds


def note(ok, err=None):
    with lock:
        if ok:
            count["ok"] += 1
        else:
            count["failed"] += 1
            if len(count["errors"]) < 5:
                count["errors"].append(err)


def worker(i):
    keep = i % 2 == 1
    c = None
    while time.monotonic() < end:
        try:
            if c is None:
                c = http.client.HTTPSConnection(host, port, timeout=10, context=ctx)
            c.request("GET", "/healthz")
            r = c.getresponse()
            r.read()
            note(r.status == 200, "status %d" % r.status)
            if not keep or r.getheader("Connection", "").lower() == "close":
                c.close()
                c = None
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
            # A kept-alive connection may be closed by the server between
            # requests (an idle close, the old daemon's end): a client
            # retries those on a new connection, as HTTP allows for a GET.
            c.close()
            c = None
            if not keep:
                note(False, "%s: %s" % (type(e).__name__, e))
        except (OSError, http.client.HTTPException) as e:
            note(False, "%s: %s" % (type(e).__name__, e))
            if c:
                c.close()
            c = None
    if c:
        c.close()


threads = [threading.Thread(target=worker, args=(i,)) for i in range(nthreads)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(count))
