"""The SDK's HTTP: one kept-alive connection per thread to kiln-api, JSON
in and out, retries with back-off on 429 and 503 honouring Retry-After."""
from __future__ import annotations

import http.client
import ssl
import json
import random
import socket
import threading
import time
import urllib.parse
from typing import Any, Dict, Iterator, Optional, Tuple

from . import errors

USER_AGENT = "kiln-python/0.1"

# 503 codes that mean kiln-api refused before doing anything: safe to retry
# whatever the method. (no_host_fits does not get better by waiting.)
_RETRY_503 = {"no_capacity", "no_host", "host_unavailable", "unavailable", "store_unavailable", "input_full", ""}


def _retry_after(h: Optional[str]) -> Optional[float]:
    if not h:
        return None
    try:
        return max(0.0, float(h))
    except ValueError:
        return None


_trusted_cas: set = set()  # CA files clients were given: downloads trust them too


def _download_context() -> Optional[ssl.SSLContext]:
    if not _trusted_cas:
        return None
    ctx = ssl.create_default_context()
    for f in sorted(_trusted_cas):
        ctx.load_verify_locations(cafile=f)
    return ctx


class Transport:
    """Talks to one kiln-api. Thread-safe: each thread has its own connection."""

    def __init__(self, base_url: str, key: str, *, timeout: float = 70.0, max_retries: int = 4,
                 backoff: float = 0.25, max_backoff: float = 10.0, ca_file: Optional[str] = None):
        u = urllib.parse.urlsplit(base_url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.hostname:
            raise errors.ValidationError("api_url: expected an http:// or https:// URL (got %r)" % base_url)
        self.base_url = base_url.rstrip("/")
        self._scheme = u.scheme
        self._host = u.hostname
        self._port = u.port or (443 if u.scheme == "https" else 80)
        self._prefix = u.path.rstrip("/")
        self._key = key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._local = threading.local()
        # An https:// kiln-api with a private CA: that CA verifies it (and,
        # for this process, the signed download links it hands out).
        self._ssl = None
        if ca_file:
            try:
                self._ssl = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as e:
                raise errors.ValidationError("ca_file: cannot load %s: %s" % (ca_file, e)) from e
            _trusted_cas.add(ca_file)

    # -- connections --
    def _new_conn(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _conn(self) -> http.client.HTTPConnection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = self._local.conn = self._new_conn(self.timeout)
        return c

    def _drop(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None

    def close(self) -> None:
        """Close this thread's connection (others close with their threads)."""
        self._drop()

    def headers(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        h = {"Authorization": "Bearer " + self._key, "User-Agent": USER_AGENT}
        if extra:
            h.update(extra)
        return h

    # -- one exchange, then the retry loop --
    def _once(self, method: str, path: str, body: Optional[bytes], headers: Dict[str, str],
              timeout: Optional[float]) -> Tuple[int, Dict[str, str], bytes]:
        for attempt in (0, 1):
            c = self._conn()
            try:
                if timeout is not None and c.sock is not None:
                    c.sock.settimeout(timeout)
                c.request(method, self._prefix + path, body=body, headers=headers)
                r = c.getresponse()
                data = r.read()
                hdrs = {k.lower(): v for k, v in r.getheaders()}
                if hdrs.get("connection", "").lower() == "close":
                    self._drop()
                return r.status, hdrs, data
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                # A kept-alive connection the server closed meanwhile: once more on a new one.
                self._drop()
                if attempt:
                    raise errors.ConnectionError("kiln-api at %s: %s" % (self.base_url, e)) from e
            except (OSError, http.client.HTTPException) as e:
                self._drop()
                raise errors.ConnectionError("kiln-api at %s: %s" % (self.base_url, e)) from e
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, *, json_body: Any = None, data: Optional[bytes] = None,
                headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                retry: bool = True, raw: bool = False) -> Tuple[int, Dict[str, str], Any]:
        """Send one request (with retries on 429/503); returns (status,
        headers, body): the body parsed as JSON unless raw. Raises the
        typed error for any status >= 400."""
        h = self.headers(headers)
        body = data
        if json_body is not None:
            body = json.dumps(json_body).encode()
            h["Content-Type"] = "application/json"
        attempt = 0
        while True:
            status, hdrs, payload = self._once(method, path, body, h, timeout)
            if status < 400:
                if raw:
                    return status, hdrs, payload
                return status, hdrs, (json.loads(payload) if payload else None)
            try:
                parsed = json.loads(payload) if payload else None
            except ValueError:
                parsed = None
            ra = _retry_after(hdrs.get("retry-after"))
            err = errors.from_response(status, parsed, ra)
            if retry and attempt < self.max_retries and self._retryable(status, err):
                delay = min(self.max_backoff, self.backoff * (2 ** attempt)) * (0.5 + random.random() / 2)
                if ra is not None:
                    delay = min(max(ra, delay), self.max_backoff * 3)
                time.sleep(delay)
                attempt += 1
                continue
            raise err

    @staticmethod
    def _retryable(status: int, err: errors.KilnError) -> bool:
        if status == 429:
            return True
        return status == 503 and err.code in _RETRY_503

    # -- event streams --
    def events(self, path: str, timeout: Optional[float] = None, *, method: str = "GET",
               json_body: Any = None) -> Iterator[Tuple[str, Any]]:
        """GET (or method, with a JSON body) a text/event-stream on a
        connection of its own; yields (event name, parsed data) until the
        server ends the stream."""
        c = self._new_conn(timeout if timeout is not None else self.timeout)
        try:
            try:
                h = self.headers({"Accept": "text/event-stream"})
                body = None
                if json_body is not None:
                    body = json.dumps(json_body).encode()
                    h["Content-Type"] = "application/json"
                c.request(method, self._prefix + path, body=body, headers=h)
                r = c.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise errors.ConnectionError("kiln-api at %s: %s" % (self.base_url, e)) from e
            if r.status >= 400:
                payload = r.read()
                try:
                    parsed = json.loads(payload) if payload else None
                except ValueError:
                    parsed = None
                raise errors.from_response(r.status, parsed, _retry_after(r.getheader("Retry-After")))
            name, lines = "message", []
            while True:
                try:
                    line = r.readline()  # chunked transfer decoded (r.fp would not)
                except (OSError, socket.timeout) as e:
                    raise errors.ConnectionError("event stream from %s: %s" % (self.base_url, e)) from e
                if not line:
                    return
                line = line.decode("utf-8", "replace").rstrip("\r\n")
                if line == "":
                    if lines:
                        text = "\n".join(lines)
                        try:
                            data: Any = json.loads(text)
                        except ValueError:
                            data = text
                        yield name, data
                    name, lines = "message", []
                elif line.startswith(":"):
                    continue
                elif line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    lines.append(line[5:].lstrip(" ") if line.startswith("data: ") else line[5:])
        finally:
            c.close()


def download(url: str, timeout: float = 300.0, headers: Optional[Dict[str, str]] = None) -> bytes:
    """GET a presigned (or kiln-api-signed) URL: no API key goes with it."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise errors.ValidationError("url: not an http(s) URL: %r" % url)
    if u.scheme == "https":
        c = http.client.HTTPSConnection(u.hostname, u.port or 443, timeout=timeout, context=_download_context())
    else:
        c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        path = u.path + ("?" + u.query if u.query else "")
        c.request("GET", path, headers=dict(headers or {}, **{"User-Agent": USER_AGENT}))
        r = c.getresponse()
        data = r.read()
    except (OSError, http.client.HTTPException) as e:
        raise errors.ConnectionError("downloading %s://%s%s: %s" % (u.scheme, u.netloc, u.path, e)) from e
    finally:
        c.close()
    if r.status >= 400:
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = {"error": {"code": "download_failed",
                                "message": "GET %s: HTTP %d %s" % (u.path, r.status, data[:200].decode("utf-8", "replace"))}}
        raise errors.from_response(r.status, parsed, None)
    return data
