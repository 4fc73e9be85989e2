"""Typed errors of the kiln SDK.

Every error kiln-api answers is ``{"error": {"code", "message"}}``; the SDK
raises the class that fits its status and code, carrying both.
"""
from __future__ import annotations

import re
from typing import Any, Optional

__all__ = [
    "KilnError", "AuthError", "ForbiddenError", "NotFoundError", "ValidationError", "ConflictError",
    "QuotaError", "UnavailableError", "ServerError", "TaskFailed", "ConnectionError", "from_error",
]


class KilnError(Exception):
    """Base class: ``status`` (HTTP, 0 when no answer came), ``code`` (kiln's
    error code, e.g. ``"invalid_spec"``) and ``message``."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", body: Any = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.body = body

    def __str__(self) -> str:
        if self.code:
            return "%s (%s, HTTP %d)" % (self.message, self.code, self.status)
        return self.message


class ConnectionError(KilnError):  # noqa: A001 - the SDK's own, not the builtin
    """kiln-api could not be reached (refused, reset, timed out)."""


class AuthError(KilnError):
    """401: the API key is missing, unknown or revoked."""


class ForbiddenError(KilnError):
    """403: the key may not do this (a customer key on an admin endpoint, an
    admin key submitting a task)."""


class NotFoundError(KilnError):
    """404: no such task, session, file or template (or another customer's)."""


class ValidationError(KilnError):
    """400: the request is invalid; ``field`` names the field kiln-api
    complained about (``"limits.memory_mib"``), when its message names one."""

    def __init__(self, message: str, **kw: Any):
        super().__init__(message, **kw)
        m = re.match(r"([A-Za-z_][A-Za-z0-9_.\[\]]*): ", message)
        self.field: Optional[str] = m.group(1) if m else None


class ConflictError(KilnError):
    """409: the state does not allow it now (busy, not running, not paused,
    an idempotency key reused with another body)."""


class QuotaError(KilnError):
    """A quota says no: 429 (``rate_limited``, ``queue_full``,
    ``quota_exceeded``, ``too_many_streams``) with ``retry_after`` seconds
    when kiln-api gave one, or 400 ``over_quota`` (a limit above the
    customer's maximum; ``retry_after`` None: retrying will not help)."""

    def __init__(self, message: str, *, retry_after: Optional[float] = None, **kw: Any):
        super().__init__(message, **kw)
        self.retry_after = retry_after


class UnavailableError(KilnError):
    """503: no host has room now, none is live, or the store is down
    (``retry_after`` when given)."""

    def __init__(self, message: str, *, retry_after: Optional[float] = None, **kw: Any):
        super().__init__(message, **kw)
        self.retry_after = retry_after


class ServerError(KilnError):
    """5xx other than 503: kiln failed (``internal``, ``host_error``)."""


class TaskFailed(KilnError):
    """A task ended in a state other than ``succeeded``: ``result`` is its
    :class:`kiln.Result` (stdout, stderr, exit_code, end_reason...)."""

    def __init__(self, result: Any):
        state = result.state
        why = result.end_reason or state
        detail = ""
        if result.exit_code is not None:
            detail = ", exit code %d" % result.exit_code
        elif result.signal:
            detail = ", signal %s" % result.signal
        elif result.error:
            detail = ": %s" % result.error.get("message", "")
        super().__init__("task %s %s (%s%s)" % (result.id, state, why, detail), code=state)
        self.result = result


def from_response(status: int, body: Any, retry_after: Optional[float]) -> KilnError:
    """The error for an answer kiln-api gave with this status and body."""
    err = body.get("error") if isinstance(body, dict) else None
    code = err.get("code", "") if isinstance(err, dict) else ""
    msg = err.get("message", "") if isinstance(err, dict) else ""
    if not msg:
        msg = "HTTP %d" % status
    kw = {"status": status, "code": code, "body": body}
    if status == 401:
        return AuthError(msg, **kw)
    if status == 403:
        return ForbiddenError(msg, **kw)
    if status == 404:
        return NotFoundError(msg, **kw)
    if status == 429 or code == "over_quota":
        return QuotaError(msg, retry_after=retry_after, **kw)
    if status == 400 or status == 413:
        return ValidationError(msg, **kw)
    if status == 409 or status == 422:
        return ConflictError(msg, **kw)
    if status == 503:
        return UnavailableError(msg, retry_after=retry_after, **kw)
    return ServerError(msg, **kw)


# Codes kiln-api answers in an error list (a fork's refused children carry no
# HTTP status of their own): the status each comes with as a whole answer.
_CODE_STATUS = {
    "unauthorized": 401, "forbidden": 403, "not_found": 404, "no_snapshot": 404,
    "invalid_request": 400, "invalid_spec": 400, "over_quota": 400,
    "busy": 409, "not_running": 409, "not_paused": 409, "incompatible_snapshot": 409, "snapshot_corrupt": 422,
    "volume_busy": 409, "volume_attached": 409, "conflict": 409,
    "rate_limited": 429, "quota_exceeded": 429, "queue_full": 429,
    "no_capacity": 503, "no_host": 503, "host_unavailable": 503, "unavailable": 503, "s3_unavailable": 503,
    "no_s3": 503, "internal": 500, "host_error": 500,
}


def from_error(err: Any) -> KilnError:
    """The typed error for one ``{"code", "message"}`` of an error list
    (a fork's ``errors``): the class its code has as a whole answer
    (``quota_exceeded``: :class:`QuotaError`, ``no_capacity``:
    :class:`UnavailableError`...); ``status`` is that answer's status, 0 for
    a code the SDK does not know (then a :class:`KilnError`)."""
    code = err.get("code", "") if isinstance(err, dict) else ""
    msg = (err.get("message", "") if isinstance(err, dict) else "") or code or "refused"
    status = _CODE_STATUS.get(code)
    if status is None:
        return KilnError(msg, code=code, body=err)
    return from_response(status, {"error": err}, None)
