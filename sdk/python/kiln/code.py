"""Results of cells run in a session's code interpreter (Session.run_code;
docs/api.md "Code"): an Execution with its rich results (text, html, png
bytes, a DataFrame's data, a matplotlib figure's chart, ...), logs and
error, and the contexts that hold a cell's state."""
import base64
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

# The representations a result may carry, as kiln-api names them; the binary
# ones arrive in base64 and are given as bytes.
TEXT_FORMATS = ("text", "html", "markdown", "svg", "latex", "json", "javascript")
BINARY_FORMATS = ("png", "jpeg", "pdf")


class CodeResult:
    """One rich output of a cell: a display() call, a figure, or the value
    of the cell's last expression (``is_main_result``). Every representation
    the object had is an attribute (None when absent): ``text``, ``html``,
    ``markdown``, ``svg``, ``latex``, ``json``, ``javascript``; ``png``,
    ``jpeg``, ``pdf`` as bytes; ``data`` (a DataFrame's columns),
    ``chart`` (a matplotlib figure's chart, as a dict). ``raw`` is the
    result as kiln-api sent it (binary ones still base64); ``extra`` any
    other field."""

    def __init__(self, raw: Dict[str, Any]):
        self.raw = raw
        self.is_main_result: bool = bool(raw.get("is_main_result"))
        for k in TEXT_FORMATS:
            setattr(self, k, raw.get(k))
        for k in BINARY_FORMATS:
            v = raw.get(k)
            setattr(self, k, base64.b64decode(v) if isinstance(v, str) else None)
        self.data: Optional[Dict[str, Any]] = raw.get("data")
        self.chart: Optional[Dict[str, Any]] = raw.get("chart")
        known = set(TEXT_FORMATS) | set(BINARY_FORMATS) | {"is_main_result", "data", "chart", "type"}
        self.extra: Dict[str, Any] = {k: v for k, v in raw.items() if k not in known}

    def formats(self) -> List[str]:
        """The representations present, besides text."""
        return [k for k in TEXT_FORMATS + BINARY_FORMATS + ("data", "chart")
                if k != "text" and self.raw.get(k) is not None]

    # Jupyter shows a result as its richest representation.
    def _repr_png_(self) -> Optional[bytes]:
        return self.png

    def _repr_html_(self) -> Optional[str]:
        return self.html

    def __repr__(self) -> str:
        return "<kiln.CodeResult %s%s>" % (", ".join(["text"] + self.formats()),
                                           " main" if self.is_main_result else "")


@dataclass
class ExecutionError:
    """The exception a cell raised (or kiln's TimeoutError / InterpreterError)."""
    name: str
    value: str
    traceback: str


@dataclass
class Logs:
    """What a cell wrote, in the pieces it was written in."""
    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class Execution:
    """What one cell did."""
    results: List[CodeResult] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None

    @property
    def text(self) -> Optional[str]:
        """The text of the cell's main result (its last expression), if any."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "Execution":
        """From kiln-api's whole answer."""
        e = j.get("error")
        logs = j.get("logs") or {}
        return cls([CodeResult(r) for r in j.get("results") or []],
                   Logs(list(logs.get("stdout") or []), list(logs.get("stderr") or [])),
                   ExecutionError(e.get("name", ""), e.get("value", ""), e.get("traceback", "")) if e else None,
                   j.get("execution_count"))


@dataclass
class Context:
    """A code context: its own state and cwd in the session's interpreter."""
    id: str
    language: str
    cwd: str

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "Context":
        return cls(j.get("id", ""), j.get("language", ""), j.get("cwd", ""))


Callback = Optional[Callable[[Any], None]]


def execution_from_events(events: Any, on_stdout: Callback = None, on_stderr: Callback = None,
                          on_result: Callback = None, on_error: Callback = None) -> Execution:
    """Build an Execution from kiln-api's server-sent events ((name, data)
    pairs), calling the callbacks as each arrives. A stream that ends
    without its `end` event was cut: InterpreterError."""
    ex = Execution()
    ended = False
    for name, data in events:
        if not isinstance(data, dict):
            continue
        if name == "stdout":
            ex.logs.stdout.append(data.get("text", ""))
            if on_stdout:
                on_stdout(data.get("text", ""))
        elif name == "stderr":
            ex.logs.stderr.append(data.get("text", ""))
            if on_stderr:
                on_stderr(data.get("text", ""))
        elif name == "result":
            r = CodeResult(data)
            ex.results.append(r)
            if on_result:
                on_result(r)
        elif name == "error":
            ex.error = ExecutionError(data.get("name", ""), data.get("value", ""), data.get("traceback", ""))
            if on_error:
                on_error(ex.error)
        elif name == "execution_count":
            ex.execution_count = data.get("execution_count")
        elif name == "end":
            if data.get("execution_count") is not None:
                ex.execution_count = data.get("execution_count")
            ended = True
            break
    if not ended:
        ex.error = ExecutionError("InterpreterError", "the stream of the cell's events was cut", "")
        if on_error:
            on_error(ex.error)
    return ex
