"""The kiln client: tasks (run, submit, wait, stream, cancel), sessions,
their forks, named snapshots and volumes."""
from __future__ import annotations

import base64
import hashlib
import os
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from . import errors
from ._http import Transport, download
from .code import CodeResult, Context, Execution, ExecutionError, execution_from_events

__all__ = ["Client", "Task", "Result", "Output", "Event", "Session", "ExecResult", "Snapshot", "ForkResult", "Volume"]

FINAL = ("succeeded", "failed", "timed_out", "cancelled", "error")
Files = Union[Mapping[str, Union[bytes, str]], Sequence[Mapping[str, Any]], None]


def _files_spec(files: Files) -> Optional[List[Dict[str, Any]]]:
    """{"/work/a.csv": b"..."} or [{"path", "content" | "content_b64", "mode"}] as the spec wants."""
    if files is None:
        return None
    out = []
    items = files.items() if isinstance(files, Mapping) else None
    if items is not None:
        for path, content in items:
            data = content.encode() if isinstance(content, str) else bytes(content)
            out.append({"path": path, "content_b64": base64.b64encode(data).decode()})
        return out
    for f in files:  # type: ignore[union-attr]
        e = {"path": f["path"]}
        if "content_b64" in f:
            e["content_b64"] = f["content_b64"]
        else:
            c = f.get("content", b"")
            e["content_b64"] = base64.b64encode(c.encode() if isinstance(c, str) else bytes(c)).decode()
        if "mode" in f:
            e["mode"] = f["mode"]
        out.append(e)
    return out


@dataclass
class Output:
    """A file the code wrote under /output: ``path`` (relative), ``size``,
    ``sha256``, ``s3_key``, and ``url`` (a presigned GET: no key needed)."""
    path: str
    size: int
    sha256: str
    s3_key: Optional[str]
    url: Optional[str]
    skipped: Optional[str] = None

    def read(self) -> bytes:
        """Download the file and check its SHA-256."""
        if not self.url:
            raise errors.KilnError("output %s has no URL (%s)" % (self.path, self.skipped or "kiln-api has no S3"))
        data = download(self.url)
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise errors.KilnError("output %s: the download does not match its sha256" % self.path)
        return data

    def save(self, path: str) -> str:
        """Download into path (its directory is created); returns path."""
        data = self.read()
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        tmp = path + ".part"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return path


class Result:
    """A finished task: ``state``, ``stdout``, ``stderr``, ``exit_code``,
    ``signal``, ``end_reason``, ``outputs`` (:class:`Output`), ``timings``,
    ``task`` (kiln-api's whole JSON). ``stdout``/``stderr`` are the whole
    streams: when kiln-api holds only an excerpt (over 8 KiB), the log is
    downloaded through its URL the first time it is read."""

    def __init__(self, task: Dict[str, Any]):
        self.task = task
        self.id: str = task.get("id", "")
        self.state: str = task.get("state", "")
        r = task.get("result") or {}
        self._r = r
        self.exit_code: Optional[int] = r.get("exit_code")
        self.signal: Optional[str] = r.get("signal")
        self.end_reason: Optional[str] = r.get("end_reason") or task.get("end_reason")
        self.error: Optional[Dict[str, Any]] = r.get("error") or task.get("error")
        self.timings: Dict[str, Any] = task.get("timings") or {}
        self.outputs: List[Output] = [
            Output(o.get("path", ""), o.get("size", 0), o.get("sha256", ""), o.get("s3_key"), o.get("url"),
                   o.get("skipped")) for o in task.get("outputs") or []]
        self._logs: Dict[str, str] = {}

    def _log(self, name: str) -> str:
        if name in self._logs:
            return self._logs[name]
        text = self._r.get(name) or ""
        if self._r.get(name + "_tail") is not None:  # an excerpt: the whole log is an artifact
            art = (self.task.get("artifacts") or {}).get(name + ".log") or {}
            if art.get("url"):
                text = download(art["url"]).decode("utf-8", "replace")
        self._logs[name] = text
        return text

    @property
    def stdout(self) -> str:
        return self._log("stdout")

    @property
    def stderr(self) -> str:
        return self._log("stderr")

    @property
    def ok(self) -> bool:
        return self.state == "succeeded"

    def output(self, path: str) -> Output:
        """The output at path (relative to /output)."""
        for o in self.outputs:
            if o.path == path:
                return o
        raise errors.NotFoundError("task %s has no output %r" % (self.id, path), status=404, code="not_found")

    def __repr__(self) -> str:
        return "<kiln.Result %s %s exit_code=%r>" % (self.id, self.state, self.exit_code)


@dataclass
class Event:
    """One event of a task's stream: ``type`` ``"stdout"``, ``"stderr"``
    (``data`` the text, ``offset`` where it starts in the log) or, with
    ``states=True``, ``"state"`` (``data`` the state name)."""
    type: str
    data: str
    offset: Optional[int] = None
    raw: Any = field(default=None, repr=False)


class Task:
    """A submitted task. ``id``; ``wait()``, ``stream()``, ``cancel()``,
    ``refresh()``."""

    def __init__(self, client: "Client", task: Dict[str, Any]):
        self._c = client
        self.id: str = task["id"]
        self.task = task

    @property
    def state(self) -> str:
        return self.task.get("state", "")

    def refresh(self) -> Dict[str, Any]:
        """Read the task again; returns kiln-api's JSON."""
        _, _, self.task = self._c._t.request("GET", "/v1/tasks/" + _q(self.id))
        return self.task

    def wait(self, timeout: Optional[float] = None) -> Result:
        """Block until the task is final (long-polls, no busy loop); raise
        :class:`TimeoutError` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # Final as last read, but read before its result was in: read it again.
        if self.task.get("state") in FINAL and "result" not in self.task:
            self.refresh()
        while self.task.get("state") not in FINAL:
            left = 60.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("task %s still %s after %ss" % (self.id, self.state, timeout))
            w = max(1, min(60, int(left)))
            _, _, self.task = self._c._t.request("GET", "/v1/tasks/%s?wait=%d" % (_q(self.id), w),
                                                 timeout=w + 30)
        return Result(self.task)

    def stream(self, states: bool = False) -> Iterator[Event]:
        """Live stdout/stderr (and state changes with ``states=True``) as the
        task runs, until it is final."""
        for name, data in self._c._t.events("/v1/tasks/%s/events" % _q(self.id), timeout=None):
            if name in ("stdout", "stderr") and isinstance(data, dict):
                yield Event(name, data.get("data", ""), data.get("offset"), data)
            elif name == "state" and isinstance(data, dict) and states:
                yield Event("state", data.get("state", ""), None, data)

    def cancel(self) -> Dict[str, Any]:
        """Cancel it (queued: at once; running: when its host confirms)."""
        _, _, self.task = self._c._t.request("POST", "/v1/tasks/%s/cancel" % _q(self.id))
        return self.task

    def __repr__(self) -> str:
        return "<kiln.Task %s %s>" % (self.id, self.state)


@dataclass
class ExecResult:
    """What a command run in a session did."""
    state: str
    exit_code: Optional[int]
    signal: Optional[str]
    end_reason: Optional[str]
    stdout: str
    stderr: str
    raw: Dict[str, Any] = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Session:
    """A sandbox that stays up between commands. Use as a context manager
    (destroyed on exit) or call :meth:`destroy`."""

    def __init__(self, client: "Client", session: Dict[str, Any], *, keep: bool = False):
        self._c = client
        self.id: str = session["id"]
        self.session = session
        self.keep = keep

    @property
    def state(self) -> str:
        return self.session.get("state", "")

    @property
    def volumes(self) -> List[Dict[str, Any]]:
        """The volumes it mounts: ``[{"name", "id", "path", "read_only"}]``."""
        return list(self.session.get("volumes") or [])

    def _path(self, rest: str = "") -> str:
        return "/v1/sessions/" + _q(self.id) + rest

    def refresh(self) -> Dict[str, Any]:
        _, _, self.session = self._c._t.request("GET", self._path())
        return self.session

    def exec(self, cmd: Union[str, Sequence[str], None] = None, *, code: Optional[str] = None,
             language: str = "python", env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
             timeout: Optional[int] = None, stdin: Union[bytes, str, None] = None, check: bool = False) -> ExecResult:
        """Run a command to its end: ``exec(["ls", "-l"])``, ``exec("ls -l | wc")``
        (a shell line) or ``exec(code="print(1)")``; returns its
        :class:`ExecResult`. ``check=True`` raises :class:`kiln.KilnError`
        on a non-zero exit. Not retried (a command may have side effects)."""
        body: Dict[str, Any] = {}
        if code is not None:
            body.update(language=language, code=code)
        elif isinstance(cmd, str):
            body["argv"] = ["sh", "-c", cmd]
        elif cmd:
            body["argv"] = list(cmd)
        else:
            raise errors.ValidationError("exec: give a command (argv or a shell line) or code")
        if env:
            body["env"] = dict(env)
        if cwd:
            body["cwd"] = cwd
        if timeout:
            body["timeout_s"] = int(timeout)
        if stdin is not None:
            body["stdin_b64"] = base64.b64encode(stdin.encode() if isinstance(stdin, str) else stdin).decode()
        _, _, r = self._c._t.request("POST", self._path("/exec"), json_body=body,
                                     timeout=(timeout or 30) + 60, retry=False)
        res = ExecResult(r.get("state", ""), r.get("exit_code"), r.get("signal"), r.get("end_reason"),
                         r.get("stdout", ""), r.get("stderr", ""), r)
        if check and res.exit_code != 0:
            raise errors.KilnError("command exited %r (%s): %s" % (res.exit_code, res.end_reason, res.stderr[-500:]),
                                   code="exec_failed")
        return res

    def write(self, path: str, data: Union[bytes, str]) -> Dict[str, Any]:
        """Write a file (absolute path; parents created)."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        _, _, r = self._c._t.request("PUT", self._path("/files?path=" + _q(path)), data=raw,
                                     headers={"Content-Type": "application/octet-stream"})
        return r

    def read(self, path: str) -> bytes:
        """Read a file's bytes."""
        _, _, r = self._c._t.request("GET", self._path("/files?path=" + _q(path)), raw=True)
        return r

    def list(self, dir: str = "/work") -> List[Dict[str, Any]]:  # noqa: A002 - the API's name
        """Entries of a directory: [{"name", "type", "size"}]."""
        _, _, r = self._c._t.request("GET", self._path("/files?dir=" + _q(dir)))
        return r.get("entries", [])

    def pause(self) -> Dict[str, Any]:
        """Save memory and disk to S3 and free the VM."""
        _, _, self.session = self._c._t.request("POST", self._path("/pause"), timeout=300)
        return self.session

    def resume(self) -> Dict[str, Any]:
        """Restore a paused session, processes and files as they were."""
        _, _, self.session = self._c._t.request("POST", self._path("/resume"), timeout=300)
        return self.session

    def outputs(self) -> List[Output]:
        """Upload every file under /output to S3; returns them (downloadable)."""
        _, _, r = self._c._t.request("POST", self._path("/outputs"), timeout=300)
        return [Output(o.get("path", ""), o.get("size", 0), o.get("sha256", ""), o.get("s3_key"), o.get("url"),
                       o.get("skipped")) for o in r.get("outputs", [])]

    def fork(self, count: int = 1) -> "ForkResult":
        """Make ``count`` (1-20) new sessions, each with this running
        session's memory, processes and files at one instant (this one goes
        on; it is stopped for ``stop_ms`` of it). Returns them as a
        :class:`ForkResult`: a list of :class:`Session` (not destroyed on
        ``with`` exit unless used as one themselves) whose ``errors`` holds
        a typed :class:`kiln.KilnError` for each fork kiln-api refused (a
        quota, no room). When none was made, the first refusal is raised,
        with all of them in its ``errors``."""
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 20:
            raise errors.ValidationError("count: an integer from 1 to 20 (got %r)" % (count,), code="invalid_request")
        _, _, r = self._c._t.request("POST", self._path("/fork"), json_body={"count": count}, timeout=600)
        out = ForkResult(Session(self._c, x) for x in r.get("sessions") or [])
        out.errors = [errors.from_error(e) for e in r.get("errors") or []]
        out.stop_ms = r.get("stop_ms")
        out.raw = r
        if not out:
            err = out.errors[0] if out.errors else errors.KilnError("fork of %s: no session made" % self.id,
                                                                    code="fork_failed", body=r)
            err.errors = out.errors  # type: ignore[attr-defined]
            raise err
        return out

    def snapshot(self, name: Optional[str] = None) -> "Snapshot":
        """Keep this running session's memory, processes and files as a
        named snapshot in S3 that outlives it (the session goes on); start
        sessions from it with ``client.session(snapshot=...)``. It counts
        against the quotas ``max_snapshots`` and ``max_snapshot_mib`` until
        :meth:`Snapshot.delete`. A paused session raises
        :class:`kiln.ConflictError` (``not_running``)."""
        body: Dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        _, _, r = self._c._t.request("POST", self._path("/snapshots"), json_body=body, timeout=300)
        return Snapshot(self._c, r)

    def destroy(self) -> Dict[str, Any]:
        """Destroy the VM and the session's snapshot (again is fine)."""
        _, _, self.session = self._c._t.request("DELETE", self._path(), timeout=120)
        return self.session

    # -- the code interpreter (a session of the template code-interpreter) --
    def run_code(self, code: str, language: Optional[str] = None, context: Union["Context", str, None] = None,
                 env: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None,
                 on_stdout: Optional[Callable[[str], None]] = None, on_stderr: Optional[Callable[[str], None]] = None,
                 on_result: Optional[Callable[["CodeResult"], None]] = None,
                 on_error: Optional[Callable[["ExecutionError"], None]] = None) -> "Execution":
        """Run a cell in the session's code interpreter; returns its
        :class:`Execution` (``.results`` with ``.text``, ``.png`` bytes,
        ``.html``, ``.data``, ``.chart``..., ``.logs``, ``.error``,
        ``.text``). ``language``: ``"python"`` (default) or ``"bash"``, in
        that language's default context; ``context``: a :class:`Context` (or
        its id) instead. ``env``: variables for this cell. ``timeout``
        (seconds): the cell is interrupted then and ``.error`` is a
        TimeoutError. The callbacks see output and results as they come.
        A session without the interpreter raises :class:`kiln.ConflictError`
        (``no_interpreter``). Not retried."""
        if language is not None and context is not None:
            raise errors.ValidationError("run_code: give language or context, not both")
        body: Dict[str, Any] = {"code": code}
        if language is not None:
            body["language"] = language
        if context is not None:
            body["context_id"] = context if isinstance(context, str) else context.id
        if env:
            body["env_vars"] = dict(env)
        if timeout is not None:
            body["timeout_ms"] = max(1, int(timeout * 1000))
        # Always the stream: kiln-api keeps nothing of it, and a quiet cell's
        # stream has a keepalive every 15 s (the socket's timeout is per read);
        # but a cell waits for its context's previous cell, within its own
        # timeout (default 300 s), before the stream's head comes.
        events = self._c._t.events(self._path("/code"), timeout=(timeout or 300.0) + 30.0, method="POST",
                                   json_body=body)
        return execution_from_events(events, on_stdout, on_stderr, on_result, on_error)

    def create_code_context(self, language: Optional[str] = None, cwd: Optional[str] = None) -> "Context":
        """A new context (its own variables and cwd) in the interpreter."""
        body: Dict[str, Any] = {}
        if language is not None:
            body["language"] = language
        if cwd is not None:
            body["cwd"] = cwd
        _, _, r = self._c._t.request("POST", self._path("/code/contexts"), json_body=body, timeout=90, retry=False)
        return Context.from_json(r)

    def list_code_contexts(self) -> List["Context"]:
        """The interpreter's contexts (the default ones, once used, too)."""
        _, _, r = self._c._t.request("GET", self._path("/code/contexts"))
        return [Context.from_json(x) for x in r.get("contexts", [])]

    def restart_code_context(self, context: Union["Context", str]) -> "Context":
        """Clear a context's state (it keeps its id, language and cwd)."""
        cid = context if isinstance(context, str) else context.id
        _, _, r = self._c._t.request("POST", self._path("/code/contexts/" + _q(cid) + "/restart"), timeout=90,
                                     retry=False)
        return Context.from_json(r)

    def remove_code_context(self, context: Union["Context", str]) -> None:
        """Remove a context."""
        cid = context if isinstance(context, str) else context.id
        self._c._t.request("DELETE", self._path("/code/contexts/" + _q(cid)), raw=True)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.keep:
            try:
                self.destroy()
            except errors.NotFoundError:
                pass

    def __repr__(self) -> str:
        return "<kiln.Session %s %s>" % (self.id, self.state)


class ForkResult(List["Session"]):
    """What :meth:`Session.fork` made: a list of the new :class:`Session`
    objects, with ``errors`` (a :class:`kiln.KilnError` for each fork
    refused), ``stop_ms`` (how long the parent was stopped) and ``raw``
    (kiln-api's answer)."""
    errors: List[errors.KilnError]
    stop_ms: Optional[int]
    raw: Dict[str, Any]


class Snapshot:
    """A named snapshot: a session's state kept in S3. ``id``
    (``snap_...``), ``name``, ``session_id`` (the session it was taken of),
    ``template``, ``vcpus``, ``memory_mib``, ``bytes``, ``created_ms``,
    ``stop_ms``, ``snapshot`` (kiln-api's JSON); :meth:`delete`,
    :meth:`refresh`, :meth:`session` (start a session from it)."""

    def __init__(self, client: "Client", snapshot: Dict[str, Any]):
        self._c = client
        self._set(snapshot)

    def _set(self, snapshot: Dict[str, Any]) -> None:
        self.snapshot = snapshot
        self.id: str = snapshot["id"]
        self.name: Optional[str] = snapshot.get("name")
        self.session_id: Optional[str] = snapshot.get("session_id")
        self.template: Optional[str] = snapshot.get("template")
        self.vcpus: Optional[int] = snapshot.get("vcpus")
        self.memory_mib: Optional[int] = snapshot.get("memory_mib")
        self.bytes: Optional[int] = snapshot.get("bytes")
        self.created_ms: Optional[int] = snapshot.get("created_ms")
        self.stop_ms: Optional[int] = snapshot.get("stop_ms")

    def refresh(self) -> Dict[str, Any]:
        """Read it again; returns kiln-api's JSON."""
        _, _, r = self._c._t.request("GET", "/v1/snapshots/" + _q(self.id))
        self._set(r)
        return r

    def delete(self) -> Dict[str, Any]:
        """Delete it (sessions started from it go on); another delete
        raises :class:`kiln.NotFoundError`."""
        _, _, r = self._c._t.request("DELETE", "/v1/snapshots/" + _q(self.id), timeout=120)
        return r

    def session(self, **kw: Any) -> "Session":
        """``client.session(snapshot=this, **kw)``: a new session started
        from it."""
        return self._c.session(snapshot=self, **kw)

    def __repr__(self) -> str:
        return "<kiln.Snapshot %s%s>" % (self.id, " %r" % self.name if self.name else "")


class Volume:
    """A volume: a named filesystem of the customer's, kept in S3 between
    the sessions that mount it. ``id`` (``vol_...``), ``name``,
    ``size_mib``, ``created_ms``, ``mounted_by`` (``[{"session_id",
    "read_only"}]``), ``bytes`` (data stored; ``None`` when never written or
    unknown: only :meth:`Client.volume` and :meth:`refresh` give it),
    ``volume`` (kiln-api's JSON); :meth:`refresh`, :meth:`delete`."""

    def __init__(self, client: "Client", volume: Dict[str, Any]):
        self._c = client
        self._set(volume)

    def _set(self, volume: Dict[str, Any]) -> None:
        self.volume = volume
        self.id: str = volume["id"]
        self.name: str = volume.get("name", "")
        self.size_mib: Optional[int] = volume.get("size_mib")
        self.created_ms: Optional[int] = volume.get("created_ms")
        self.mounted_by: List[Dict[str, Any]] = list(volume.get("mounted_by") or [])
        self.bytes: Optional[int] = volume.get("bytes")

    def refresh(self) -> Dict[str, Any]:
        """Read it again (with ``bytes``); returns kiln-api's JSON."""
        _, _, r = self._c._t.request("GET", "/v1/volumes/" + _q(self.id))
        self._set(r)
        return r

    def delete(self) -> Dict[str, Any]:
        """Delete it and its files for good. A volume a session mounts (even
        a paused one) raises :class:`kiln.ConflictError` (``volume_busy``);
        no host to delete its files: :class:`kiln.UnavailableError`
        (nothing changed); another delete: :class:`kiln.NotFoundError`."""
        _, _, r = self._c._t.request("DELETE", "/v1/volumes/" + _q(self.id), timeout=120)
        return r

    def mount(self, path: str, read_only: bool = False) -> Dict[str, Any]:
        """This volume as one entry of ``client.session(volumes=[...])``."""
        return {"name": self.name, "path": path, "read_only": read_only}

    def __repr__(self) -> str:
        return "<kiln.Volume %s %r>" % (self.id, self.name)


Mounts = Union[Sequence[Mapping[str, Any]], Mapping[str, Union["Volume", str]], None]


def _mounts(volumes: Mounts) -> List[Dict[str, Any]]:
    """Client.session's ``volumes`` as kiln-api's ``[{"name","path","read_only"}]``:
    a list of ``{"name" (or a Volume), "path", "read_only"?}``, or a mapping
    ``{path: name or Volume}`` (each read-write)."""
    def name_of(v: Any) -> str:
        if isinstance(v, Volume):
            return v.name
        if isinstance(v, str) and v:
            return v
        raise errors.ValidationError("volumes: a volume's name or a kiln.Volume (got %r)" % (v,),
                                     code="invalid_request")

    out: List[Dict[str, Any]] = []
    if isinstance(volumes, Mapping):
        for path, v in volumes.items():
            out.append({"name": name_of(v), "path": path})
    else:
        for m in volumes or []:
            if not isinstance(m, Mapping) or "path" not in m or "name" not in m:
                raise errors.ValidationError('volumes: each one {"name", "path", "read_only"?} (got %r)' % (m,),
                                             code="invalid_request")
            e = {"name": name_of(m["name"]), "path": m["path"]}
            if m.get("read_only") is not None:
                e["read_only"] = bool(m["read_only"])
            out.append(e)
    if len(out) > 2:
        raise errors.ValidationError("volumes: at most 2 (got %d)" % len(out), code="invalid_request")
    return out


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="/" if s.startswith("/") else "")


class Client:
    """A kiln-api client.

    ``Client("http://127.0.0.1:8080", "kiln_…")``, or with no arguments from
    ``KILN_API`` and ``KILN_KEY``. ``max_retries`` bounds retries of
    requests refused with 429 or 503 (waiting ``Retry-After``, else an
    exponential back-off). ``ca_file`` (else ``KILN_CA_FILE``): a PEM file
    of the CA that verifies an ``https://`` kiln-api signed by a private
    CA, in place of the system's."""

    def __init__(self, api_url: Optional[str] = None, key: Optional[str] = None, *, timeout: float = 70.0,
                 max_retries: int = 4, ca_file: Optional[str] = None):
        api_url = api_url or os.environ.get("KILN_API")
        key = key or os.environ.get("KILN_KEY")
        if not api_url:
            raise errors.ValidationError("api_url: give it, or set KILN_API")
        if not key:
            raise errors.AuthError("no API key: give key=, or set KILN_KEY", status=401, code="unauthorized")
        self._t = Transport(api_url, key, timeout=timeout, max_retries=max_retries,
                            ca_file=ca_file or os.environ.get("KILN_CA_FILE") or None)

    @property
    def api_url(self) -> str:
        return self._t.base_url

    def close(self) -> None:
        self._t.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- tasks --
    def submit(self, code: Optional[str] = None, *, language: str = "python", argv: Optional[Sequence[str]] = None,
               files: Files = None, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
               template: Optional[str] = None, limits: Optional[Mapping[str, int]] = None,
               network: Optional[Mapping[str, Any]] = None, metadata: Any = None,
               idempotency_key: Optional[str] = None) -> Task:
        """Submit a task; returns its :class:`Task` at once (queued). One
        idempotency key (given, or a fresh UUID) covers every retry of this
        call, so a retried submission never runs twice."""
        spec: Dict[str, Any] = {}
        if argv is not None:
            spec["argv"] = list(argv)
        else:
            if code is None:
                raise errors.ValidationError("code: give code (or argv)")
            spec.update(language=language, code=code)
        for k, v in (("files", _files_spec(files)), ("env", dict(env) if env else None), ("cwd", cwd),
                     ("template", template), ("limits", dict(limits) if limits else None),
                     ("network", dict(network) if network else None), ("metadata", metadata)):
            if v is not None:
                spec[k] = v
        key = idempotency_key or "py-" + uuid.uuid4().hex
        _, _, t = self._t.request("POST", "/v1/tasks", json_body=spec, headers={"Idempotency-Key": key})
        return Task(self, t)

    def run(self, code: Optional[str] = None, *, timeout: Optional[float] = None, check: bool = True,
            **kw: Any) -> Result:
        """Submit and wait: the :class:`Result`. Raises :class:`TaskFailed`
        (carrying the result) when the task did not succeed, unless
        ``check=False``. Same arguments as :meth:`submit`."""
        res = self.submit(code, **kw).wait(timeout)
        if check and not res.ok:
            raise errors.TaskFailed(res)
        return res

    def task(self, task_id: str) -> Task:
        """A task by id."""
        _, _, t = self._t.request("GET", "/v1/tasks/" + _q(task_id))
        return Task(self, t)

    def tasks(self, state: Optional[str] = None, limit: int = 20) -> List[Dict[str, Any]]:
        """The newest tasks (one page)."""
        q = "?limit=%d" % limit + ("&state=" + _q(state) if state else "")
        _, _, r = self._t.request("GET", "/v1/tasks" + q)
        return r.get("tasks", [])

    def usage(self) -> Dict[str, Any]:
        """Quotas and what is in use now."""
        _, _, r = self._t.request("GET", "/v1/usage")
        return r

    # -- sessions --
    def session(self, *, template: Optional[str] = None, limits: Optional[Mapping[str, int]] = None,
                network: Optional[Mapping[str, Any]] = None, idle_timeout_s: Optional[int] = None,
                max_lifetime_s: Optional[int] = None, metadata: Any = None, keep: bool = False,
                snapshot: Union["Snapshot", str, None] = None, volumes: Mounts = None) -> Session:
        """Create a session (a running sandbox); use ``with`` to destroy it
        at the end (``keep=True``: leave it). ``snapshot`` (a
        :class:`Snapshot` or its id): start it from that snapshot, with its
        memory, processes and files; its vCPUs, memory, template and network
        are the snapshot's, so ``template``, ``network`` and
        ``limits`` vcpus/memory_mib cannot go with it. ``volumes``: at most 2
        volumes to mount, as ``[{"name": "ws", "path": "/data",
        "read_only": False}]`` (``name`` may be a :class:`Volume`) or
        ``{"/data": "ws"}`` (read-write). One session at a time mounts a
        volume read-write (another one: :class:`kiln.ConflictError`
        ``volume_busy``), any number read-only."""
        body: Dict[str, Any] = {}
        if volumes:
            body["volumes"] = _mounts(volumes)
        if snapshot is not None:
            if template is not None or network is not None or set(limits or ()) & {"vcpus", "memory_mib"}:
                raise errors.ValidationError("snapshot: the session has the snapshot's vcpus, memory, template and "
                                             "network: leave out template, network and limits' vcpus/memory_mib",
                                             code="invalid_request")
            body["snapshot"] = snapshot if isinstance(snapshot, str) else snapshot.id
        for k, v in (("template", template), ("limits", dict(limits) if limits else None),
                     ("network", dict(network) if network else None), ("idle_timeout_s", idle_timeout_s),
                     ("max_lifetime_s", max_lifetime_s), ("metadata", metadata)):
            if v is not None:
                body[k] = v
        _, _, s = self._t.request("POST", "/v1/sessions", json_body=body, timeout=300)
        return Session(self, s, keep=keep)

    def get_session(self, session_id: str) -> Session:
        """An existing session by id (not destroyed on ``with`` exit)."""
        _, _, s = self._t.request("GET", "/v1/sessions/" + _q(session_id))
        return Session(self, s, keep=True)

    # -- snapshots --
    def snapshot(self, snapshot_id: str) -> Snapshot:
        """A snapshot by id (another customer's raises
        :class:`kiln.NotFoundError`)."""
        _, _, r = self._t.request("GET", "/v1/snapshots/" + _q(snapshot_id))
        return Snapshot(self, r)

    def snapshots(self, name: Optional[str] = None, session_id: Optional[str] = None,
                  page_size: int = 100) -> Iterator[Snapshot]:
        """Every snapshot, newest first (``name``, ``session_id``: only
        those), as an iterator that reads one page of ``page_size`` at a
        time, following kiln-api's ``next`` token."""
        after: Optional[str] = None
        while True:
            q = [("limit", str(page_size))]
            for k, v in (("name", name), ("session_id", session_id), ("after", after)):
                if v:
                    q.append((k, v))
            _, _, r = self._t.request("GET", "/v1/snapshots?" + urllib.parse.urlencode(q))
            for x in r.get("snapshots") or []:
                yield Snapshot(self, x)
            nxt = r.get("next")
            if not nxt or nxt == after:  # the last page (or a token that would not move on)
                return
            after = nxt

    # -- volumes --
    def create_volume(self, name: str, size_mib: Optional[int] = None) -> Volume:
        """Create a volume (``size_mib``: 16-65536, default 1024, at most the
        customer's ``max_volume_mib``). A name already taken raises
        :class:`kiln.ConflictError`; past ``max_volumes``,
        :class:`kiln.QuotaError`."""
        body: Dict[str, Any] = {"name": name}
        if size_mib is not None:
            body["size_mib"] = size_mib
        _, _, r = self._t.request("POST", "/v1/volumes", json_body=body, timeout=60)
        return Volume(self, r)

    def volumes(self, name: Optional[str] = None) -> List[Volume]:
        """Every volume, newest first (``name``: only that one)."""
        path = "/v1/volumes" + ("?" + urllib.parse.urlencode({"name": name}) if name else "")
        _, _, r = self._t.request("GET", path)
        return [Volume(self, x) for x in r.get("volumes") or []]

    def volume(self, id_or_name: str) -> Volume:
        """A volume by id (``vol_...``) or name, with ``bytes`` and
        ``mounted_by`` (none of that name: :class:`kiln.NotFoundError`)."""
        _, _, r = self._t.request("GET", "/v1/volumes/" + _q(id_or_name))
        return Volume(self, r)
