"""kiln: run untrusted code in fresh microVMs, from Python.

    import kiln
    client = kiln.Client()                    # KILN_API, KILN_KEY
    r = client.run("print(6 * 7)")
    print(r.stdout)                           # "42\\n"
    with client.session() as s:               # a sandbox that stays up
        kids = s.fork(count=3)                # three copies of its state, now
        snap = s.snapshot(name="ready")       # its state kept, to start sessions from
    ws = client.create_volume("ws")           # a filesystem that outlives sessions
    with client.session(volumes={"/data": "ws"}) as s:
        s.exec("echo kept > /data/f && sync")

Standard library only. See sdk/python/README.md.
"""
from .client import Client, Event, ExecResult, ForkResult, Output, Result, Session, Snapshot, Task, Volume
from .code import CodeResult, Context, Execution, ExecutionError, Logs
from .errors import (AuthError, ConflictError, ConnectionError, ForbiddenError, KilnError, NotFoundError,
                     QuotaError, ServerError, TaskFailed, UnavailableError, ValidationError)

__version__ = "0.1.0"

__all__ = [
    "Client", "Task", "Result", "Output", "Event", "Session", "ExecResult", "Snapshot", "ForkResult", "Volume",
    "Execution", "CodeResult", "ExecutionError", "Logs", "Context",
    "KilnError", "AuthError", "ForbiddenError", "NotFoundError", "ValidationError", "ConflictError",
    "QuotaError", "UnavailableError", "ServerError", "TaskFailed", "ConnectionError",
]
