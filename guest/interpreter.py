#!/usr/bin/python3
# kiln-interpreter: the code interpreter of the `code-interpreter` template,
# on 127.0.0.1:49999 in the guest, speaking what E2B's Code Interpreter SDK
# (@e2b/code-interpreter 2.8.0) sends (docs/e2b.md "Code Interpreter").
#
# kiln-init starts it at boot (guest/interp.c) as root, with fd 0 the reseed
# pipe (a byte after every snapshot restore) and fd 3 the ready pipe; it drops
# to the E2B user `user` and forks a fork server, which imports numpy, pandas
# and matplotlib and warms them up (one plot rendered, one DataFrame
# formatted); then it makes the default Python context and writes 'R' to fd 3:
# the template's snapshot is taken after that, so a restored sandbox's first
# cell pays no start. Memory: contexts have oom_score_adj OOM_CONTEXT, the
# service 0, so a cell that exhausts the guest loses its context, not the
# sandbox.
#
# Processes: this server (threads, one per HTTP connection) -> the fork
# server (single-threaded; forks a context's worker from the warm imports)
# -> one worker per Python context, its own process group. A worker runs
# cells one at a time and writes its events as JSON lines on a pipe; its fd 1
# and 2 (what subprocesses and C code write) are two more pipes this server
# reads. A bash context is a bash process fed through its stdin.
#
# Everything a cell sends is bounded: stdout and stderr at OUT_MAX bytes a
# cell (the rest dropped, and said so), one representation at REPR_MAX bytes.
import ast, base64, builtins, errno, io, json, linecache, os, pwd, random, select, signal, socket
import struct, sys, threading, time, traceback, uuid, zlib
import queue, resource

PORT = 49999
USER = "user"
OUT_MAX = 8 << 20        # bytes of stdout+stderr one cell may send
REPR_MAX = 32 << 20      # bytes of one representation (a PNG, an HTML table)
BODY_MAX = 16 << 20      # bytes of a request body
EMIT_SLICE = 1 << 20     # characters of an event line encoded at a time
OOM_CONTEXT = "500"      # a context's oom_score_adj: the OOM killer takes a cell before the service
CONTEXT_NPROC = 512      # processes the sandbox's user may have for a context's cells to fork more
INTERRUPT_GRACE_S = 3.0  # after SIGINT, then the context is killed and restarted
DONE_PREFIX = b'{"type": "__done__"'
LANGS = {"python": "python", "python3": "python", "bash": "bash", "sh": "bash", "shell": "bash"}

# ---- the worker: runs the cells of one Python context ---------------------

MIME = (("text/plain", "text"), ("text/html", "html"), ("text/markdown", "markdown"),
        ("image/svg+xml", "svg"), ("image/png", "png"), ("image/jpeg", "jpeg"),
        ("application/pdf", "pdf"), ("text/latex", "latex"), ("application/json", "json"),
        ("application/javascript", "javascript"))
REPRS = (("_repr_html_", "html"), ("_repr_markdown_", "markdown"), ("_repr_svg_", "svg"),
         ("_repr_png_", "png"), ("_repr_jpeg_", "jpeg"), ("_repr_pdf_", "pdf"),
         ("_repr_latex_", "latex"), ("_repr_json_", "json"), ("_repr_javascript_", "javascript"))
BINARY = ("png", "jpeg", "pdf")


def _jsonable(v):
    """A value json.dumps takes (numpy scalars, timestamps, NaN as None)."""
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if hasattr(v, "item"):
        try:
            return _jsonable(v.item())
        except Exception:
            pass
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def _num(v):
    try:
        f = float(v)
        return None if f != f else f
    except Exception:
        return _jsonable(v)


def _axis_info(ax, which):
    """E2B's per-axis fields: label, scale, ticks and tick labels; dates as ISO text."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    scale = axis.get_scale()
    ticks = list(axis.get_majorticklocs())
    labels = [t.get_text() for t in axis.get_majorticklabels()]
    conv = getattr(axis, "converter", None) or (axis.get_converter() if hasattr(axis, "get_converter") else None)
    if conv is not None and "date" in type(conv).__name__.lower():
        import matplotlib.dates as mdates
        scale = "datetime"
        ticks = [mdates.num2date(t).isoformat() for t in ticks]
    elif any(labels) and not all(_is_number(l) for l in labels if l):
        scale = "categorical" if scale == "linear" and _categorical(axis) else scale
    return {"%s_label" % which: axis.get_label_text() or None, "%s_scale" % which: scale,
            "%s_ticks" % which: [_num(t) if not isinstance(t, str) else t for t in ticks],
            "%s_tick_labels" % which: labels}


def _is_number(s):
    try:
        float(s.replace("\u2212", "-"))
        return True
    except ValueError:
        return False


def _categorical(axis):
    units = getattr(axis, "units", None)
    return units is not None and type(units).__name__ == "UnitData"


def _axes_chart(ax):
    """The chart E2B's SDK models for one Axes, or None (an empty or unknown one)."""
    from matplotlib.collections import PathCollection
    from matplotlib.patches import Wedge
    title = ax.get_title() or None
    base = {"title": title}
    box = getattr(ax, "_kiln_box", None)
    if box:
        c = dict(base, type="box_and_whisker", elements=box)
        c.update({"x_label": ax.get_xlabel() or None, "y_label": ax.get_ylabel() or None})
        return c
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        texts = [t.get_text() for t in ax.texts]
        els = []
        for i, w in enumerate(wedges):
            label = w.get_label()
            if not label or label.startswith("_"):
                label = texts[i * 2] if len(texts) >= 2 * len(wedges) else (texts[i] if i < len(texts) else str(i))
            els.append({"label": label, "angle": abs(w.theta2 - w.theta1), "radius": w.r})
        return dict(base, type="pie", elements=els)
    bars = []
    for cont in getattr(ax, "containers", []):
        if type(cont).__name__ != "BarContainer":
            continue
        group = cont.get_label()
        group = group if group and not group.startswith("_") else ""
        xlabels = [t.get_text() for t in ax.get_xticklabels()]
        xticks = list(ax.get_xticks())
        for r in cont.patches:
            x = r.get_x() + r.get_width() / 2
            label = ""
            for t, l in zip(xticks, xlabels):
                if abs(t - x) < 1e-6 + r.get_width() / 2:
                    label = l
                    break
            bars.append({"label": label or str(_num(x)), "value": _num(r.get_height()), "group": group})
    if bars:
        c = dict(base, type="bar", elements=bars)
        c.update({"x_label": ax.get_xlabel() or None, "y_label": ax.get_ylabel() or None})
        return c
    points = [l for l in ax.get_lines() if l.get_linestyle() not in ("None", "", " ")]
    scatter = [c for c in ax.collections if isinstance(c, PathCollection)]
    kind, els = None, []
    if points:
        kind = "line"
        for i, l in enumerate(points):
            xs, ys = l.get_xdata(orig=False), l.get_ydata(orig=False)
            label = l.get_label()
            els.append({"label": label if label and not label.startswith("_") else "line %d" % i,
                        "points": [[_num(x), _num(y)] for x, y in zip(xs, ys)]})
    elif scatter:
        kind = "scatter"
        for i, c in enumerate(scatter):
            label = c.get_label()
            els.append({"label": label if label and not label.startswith("_") else "scatter %d" % i,
                        "points": [[_num(x), _num(y)] for x, y in c.get_offsets()]})
    if not kind:
        return None
    c = dict(base, type=kind, elements=els)
    c.update(_axis_info(ax, "x"))
    c.update(_axis_info(ax, "y"))
    if c.get("x_scale") == "datetime":
        import matplotlib.dates as mdates
        for e in els:
            e["points"] = [[mdates.num2date(x).isoformat() if isinstance(x, float) else x, y] for x, y in e["points"]]
    return c


def figure_chart(fig):
    """E2B's `chart` for a figure: one Axes' chart, several as a superchart."""
    charts = []
    for ax in fig.get_axes():
        try:
            c = _axes_chart(ax)
        except Exception:
            c = None
        if c:
            charts.append(c)
    if not charts:
        return None
    if len(charts) == 1:
        return charts[0]
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
    return {"type": "superchart", "title": title, "elements": charts}


def _boxplot_recorder(orig):
    """Axes.boxplot, keeping E2B's box-and-whisker elements on the Axes."""
    def boxplot(ax, x, *args, **kw):
        out = orig(ax, x, *args, **kw)
        try:
            labels = kw.get("labels") or kw.get("tick_labels")
            els = []
            for i, box in enumerate(out.get("boxes", [])):
                whis = [w.get_ydata() for w in out["whiskers"][2 * i:2 * i + 2]]
                med = out["medians"][i].get_ydata()
                fl = out["fliers"][i].get_ydata() if i < len(out["fliers"]) else []
                if hasattr(box, "get_path"):
                    ys = box.get_path().vertices[:, 1]
                else:
                    ys = box.get_ydata()
                label = str(labels[i]) if labels is not None and i < len(labels) else str(i + 1)
                els.append({"label": label, "min": _num(min(whis[0])), "first_quartile": _num(min(ys)),
                            "median": _num(med[0]), "third_quartile": _num(max(ys)),
                            "max": _num(max(whis[1])), "outliers": [_num(v) for v in fl]})
            ax._kiln_box = els
        except Exception:
            pass
        return out
    return boxplot


def _png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def figure_png(fig):
    """A figure as PNG bytes, drawn once. Under TCG a draw of a small plot
    costs ~0.25 s and savefig() adds ~0.15 s (another draw, PIL's encoder at
    level 6); bbox_inches="tight", IPython's default, draws twice. So: one
    Agg draw, its RGBA buffer written as a PNG at zlib level 1. A figure
    without an Agg canvas goes through savefig()."""
    canvas = fig.canvas
    if type(canvas).__name__ != "FigureCanvasAgg" or not hasattr(canvas, "buffer_rgba"):
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    import numpy as np
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    h, w = rgba.shape[0], rgba.shape[1]
    rows = np.zeros((h, w * 4 + 1), dtype=np.uint8)  # filter byte 0 (None) before each row
    rows[:, 1:] = rgba.reshape(h, w * 4)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)) +
            _png_chunk(b"IDAT", zlib.compress(rows.tobytes(), 1)) + _png_chunk(b"IEND", b""))


def _b64(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode()
    return v


def _data_of(obj):
    """E2B's `data` for a pandas DataFrame: {column: [values]}, JSON-safe."""
    pd = sys.modules.get("pandas")
    if pd is None or not isinstance(obj, pd.DataFrame):
        return None
    split = json.loads(obj.to_json(orient="split", date_format="iso", default_handler=str))
    cols = [str(c) for c in split["columns"]]
    return {c: [row[i] for row in split["data"]] for i, c in enumerate(cols)}


def representations(obj):
    """Every representation obj has, as E2B's result fields (text always)."""
    out = {}
    is_class = isinstance(obj, type)
    mpl_figure = None
    fm = sys.modules.get("matplotlib.figure")
    if fm is not None and isinstance(obj, fm.Figure):
        mpl_figure = obj
    if not is_class and mpl_figure is None:
        mb = getattr(obj, "_repr_mimebundle_", None)
        if callable(mb):
            try:
                b = mb()
                if isinstance(b, tuple):
                    b = b[0]
                for mime, key in MIME:
                    if isinstance(b, dict) and b.get(mime) is not None:
                        out[key] = b[mime]
            except Exception:
                pass
        for attr, key in REPRS:
            if key in out:
                continue
            f = getattr(obj, attr, None)
            if not callable(f):
                continue
            try:
                v = f()
            except Exception:
                continue
            if isinstance(v, tuple):  # (data, metadata)
                v = v[0]
            if v is not None:
                out[key] = v
    if mpl_figure is not None:
        out["png"] = figure_png(mpl_figure)
        try:
            ch = figure_chart(mpl_figure)
            if ch:
                out["chart"] = _jsonable(ch)
        except Exception:
            pass
    if "text" not in out:
        try:
            out["text"] = repr(obj)
        except Exception as e:
            out["text"] = "<repr failed: %s: %s>" % (type(e).__name__, e)
    try:
        d = _data_of(obj)
        if d is not None:
            out["data"] = d
    except Exception:
        pass
    for k in list(out):
        v = _b64(out[k]) if k in BINARY else out[k]
        if k == "json" and not isinstance(v, str):
            v = _jsonable(v)
        size = len(v) if isinstance(v, str) else len(json.dumps(v, default=str))
        if size > REPR_MAX:
            if k == "text":
                v = v[:4096] + "\n[kiln: representation of %d bytes cut to 4096]" % size
            else:
                del out[k]
                out.setdefault("text", "")
                continue
        out[k] = v
    return out


class CellStream(io.TextIOBase):
    """sys.stdout or sys.stderr in a worker: text to events, bounded per cell."""

    def __init__(self, worker, name):
        self.worker, self.name, self.buf = worker, name, []

    def writable(self):
        return True

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        w = self.worker
        n = len(s)
        if w.out_left <= 0:
            w.out_dropped += n
            return n
        if n > w.out_left:
            w.out_dropped += n - w.out_left
            s = s[:w.out_left]
        w.out_left -= len(s)
        self.buf.append(s)
        if "\n" in s or sum(map(len, self.buf)) > 65536:
            self.flush()
        return n

    def flush(self):
        if self.buf:
            text, self.buf = "".join(self.buf), []
            self.worker.emit({"type": self.name, "text": text})

    def isatty(self):
        return False

    @property
    def encoding(self):
        return "utf-8"

    def fileno(self):
        return 1 if self.name == "stdout" else 2


class Worker:
    """One Python context: a namespace and its execution count."""

    def __init__(self, req_fd, ev_fd):
        self.req = os.fdopen(req_fd, "rb")
        self.ev = os.fdopen(ev_fd, "wb", buffering=0)
        self.ns = {"__name__": "__main__", "__builtins__": builtins}
        self.count = 0
        self.gen = None
        self.out_left, self.out_dropped = OUT_MAX, 0
        self.stdout, self.stderr = CellStream(self, "stdout"), CellStream(self, "stderr")
        self.pid = os.getpid()

    def emit(self, ev):
        if os.getpid() != self.pid:
            # A process the cell forked (os.fork, multiprocessing's fork):
            # the context's event pipe is its worker's alone. Its prints go
            # where a subprocess's do; nothing else of it is a result.
            if ev.get("type") in ("stdout", "stderr"):
                try:
                    os.write(1 if ev["type"] == "stdout" else 2, ev["text"].encode("utf-8", "replace"))
                except OSError:
                    pass
            return
        try:
            # Written a MiB at a time, never one more copy of it whole: a
            # result may be tens of MiB in a guest of a few hundred.
            # UTF-8, not \u escapes: 6 bytes for each non-ASCII character.
            line = json.dumps(ev, default=str, ensure_ascii=False)
            for i in range(0, len(line), EMIT_SLICE):
                self.ev.write(line[i:i + EMIT_SLICE].encode("utf-8", "replace"))
            self.ev.write(b"\n")
        except (BrokenPipeError, OSError):
            os._exit(0)  # the server is gone

    def display(self, *objs, **kw):
        """IPython's display(): each object as a result, in order."""
        self.stdout.flush()
        self.stderr.flush()
        for o in objs:
            r = representations(o)
            r.update(type="result", is_main_result=False)
            self.emit(r)

    def flush_figures(self, *a, **kw):
        """plt.show() and the end of a cell: every open figure as a result, then closed."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for num in list(plt.get_fignums()):
            fig = plt.figure(num)
            self.display(fig)
        plt.close("all")

    def reseed(self, gen):
        """After a snapshot restore every clone held the same random state."""
        if gen == self.gen:
            return
        self.gen = gen
        random.seed()
        np = sys.modules.get("numpy")
        if np is not None:
            np.random.seed()

    def error(self, e, skip_own=True):
        tb = e.__traceback__
        while skip_own and tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        if isinstance(e, SyntaxError):
            lines = traceback.format_exception_only(type(e), e)
        else:
            lines = traceback.format_exception(type(e), e, tb)
        self.emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": "".join(lines)})

    def run(self, code):
        self.count += 1
        fname = "<cell %d>" % self.count
        linecache.cache[fname] = (len(code), None, code.splitlines(True), fname)
        try:
            tree = ast.parse(code, fname, "exec")
        except SyntaxError as e:
            self.error(e)
            return
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        try:
            exec(compile(tree, fname, "exec"), self.ns)
            if last is not None:
                value = eval(compile(last, fname, "eval"), self.ns)
                if value is not None and not code.rstrip().endswith(";"):
                    self.ns["_"] = value
                    self.stdout.flush()
                    self.stderr.flush()
                    fm = sys.modules.get("matplotlib.figure")
                    if fm is not None and isinstance(value, fm.Figure):
                        import matplotlib.pyplot as plt
                        if value.number in plt.get_fignums():
                            plt.close(value)
                    r = representations(value)
                    r.update(type="result", is_main_result=True)
                    self.emit(r)
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: the context lives on
            self.stdout.flush()
            self.stderr.flush()
            self.error(e)

    def warm(self):
        """A cell's whole path once, in a scratch namespace, counting nothing:
        after a restore TCG has translated none of it."""
        ns, count = self.ns, self.count
        self.ns = {"__name__": "__main__", "__builtins__": builtins}
        try:
            self.run("_kiln_warm = 1\n_kiln_warm + 1")
        finally:
            self.ns, self.count = ns, count
        self.emit({"type": "__done__", "count": self.count})

    def serve(self):
        builtins.display = self.display
        try:
            import IPython.display as ipd
            ipd.display = self.display
            import IPython.core.display_functions as idf
            idf.display = self.display
        except Exception:
            pass
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None:
            plt.show = self.flush_figures
        sys.stdout, sys.stderr = self.stdout, self.stderr
        while True:
            try:
                line = self.req.readline()
                if not line:
                    os._exit(0)
                req = json.loads(line)
                self.reseed(req.get("gen"))
                if req.get("warm"):
                    self.warm()
                    continue
                self.out_left, self.out_dropped = OUT_MAX, 0
                os.environ.update(req.get("base_env") or {})
                env = req.get("env") or {}
                saved = {k: os.environ.get(k) for k in env}
                os.environ.update(env)
                try:
                    self.run(req.get("code", ""))
                    self.flush_figures()
                    if os.getpid() != self.pid:
                        os._exit(0)  # a fork of the cell came back here: it ends, never serves
                finally:
                    for k, v in saved.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
                    self.stdout.flush()
                    self.stderr.flush()
                    if self.out_dropped:
                        self.emit({"type": "stderr", "text": "\n[kiln: %d characters of output dropped: a cell may "
                                   "send at most %d]\n" % (self.out_dropped, OUT_MAX)})
                self.emit({"type": "__done__", "count": self.count})
            except KeyboardInterrupt:
                # SIGINT raced the end of a cell: the cell is over anyway.
                self.emit({"type": "__done__", "count": self.count})


# ---- the fork server: forks workers from the warm process ------------------

def fork_server(sock):
    """Loop: a request names a cwd; answer the worker's pid and its 4 descriptors."""
    try:
        os.close(3)  # the ready pipe is the server's
    except OSError:
        pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    while True:
        msg = sock.recv(4096)
        if not msg:
            os._exit(0)
        cwd = msg.decode()
        req_r, req_w = os.pipe()
        ev_r, ev_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                for fd in (req_w, ev_r, out_r, err_r):
                    os.close(fd)
                os.setpgid(0, 0)
                _oom_context()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                devnull = os.open("/dev/null", os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                for fd in (devnull, out_w, err_w):
                    os.close(fd)
                os.makedirs(cwd, exist_ok=True)
                os.chdir(cwd)
                w = Worker(req_r, ev_w)
                w.reseed(-1)
                w.serve()
            except BaseException:
                traceback.print_exc()
            os._exit(1)
        for fd in (req_r, ev_w, out_w, err_w):
            os.close(fd)
        socket.send_fds(sock, [str(pid).encode()], [req_w, ev_r, out_r, err_r])
        for fd in (req_w, ev_r, out_r, err_r):
            os.close(fd)


# ---- the server ---------------------------------------------------------

def _oom_context():
    """This process (a context's) goes before the service when memory runs
    out, forks no more once the user has CONTEXT_NPROC processes, and may not
    take the service's real-time priority."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(OOM_CONTEXT)
    except OSError:
        pass
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (CONTEXT_NPROC, CONTEXT_NPROC))
        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
    except (OSError, ValueError):
        pass


def _realtime():
    """The calling thread of the service runs before any cell: a fork bomb
    or a cell spinning on every core would otherwise starve the thread that
    must see the client go and interrupt it. Round-robin at priority 1 (the
    RLIMIT_RTPRIO interp.c gives), reset on fork: what it starts runs as any
    process. The service only relays; the kernel keeps 5% for the rest."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR | os.SCHED_RESET_ON_FORK, os.sched_param(1))
    except (OSError, AttributeError):
        pass


def _sh_quote(v):
    return "'" + v.replace("'", "'\\''") + "'"


SANDBOX_ENV = "/kiln/session-env.json"


class Context:
    """A context: its language, cwd and the process that holds its state."""

    def __init__(self, server, language, cwd, ident=None):
        self.server, self.language, self.cwd = server, language, cwd
        self.id = ident or str(uuid.uuid4())
        self.lock = threading.Lock()
        self.pid = 0
        self.fds = []
        self.bash = None

    def info(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self):
        if self.language == "python":
            pid, fds = self.server.fork_worker(self.cwd)
            self.pid = pid
            self.req, self.ev, self.out, self.err = fds
            self.evbuf = []
        else:
            os.makedirs(self.cwd, exist_ok=True)
            st_r, st_w = os.pipe()
            self.bash = __import__("subprocess").Popen(
                ["/bin/bash", "--noprofile", "--norc"], stdin=-1, stdout=-1, stderr=-1, cwd=self.cwd,
                pass_fds=(st_w,), start_new_session=True, env=dict(os.environ, KILN_STATUS_FD=str(st_w)))
            os.close(st_w)
            self.pid = self.bash.pid
            self.req, self.out, self.err, self.ev = self.bash.stdin.fileno(), self.bash.stdout.fileno(), \
                self.bash.stderr.fileno(), st_r
            self.evbuf = []
            os.write(self.req, b"exec 3>&$KILN_STATUS_FD; unset KILN_STATUS_FD; trap : INT; "
                     b"echo %s 2>/dev/null >/proc/self/oom_score_adj; ulimit -r 0 -u %d\n"
                     % (OOM_CONTEXT.encode(), CONTEXT_NPROC))
        self.count = 0

    def stop(self):
        if self.pid > 0:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
        if self.bash is not None:
            for f in (self.bash.stdin, self.bash.stdout, self.bash.stderr):
                try:
                    f.close()
                except OSError:
                    pass
            try:
                self.bash.wait(timeout=5)
            except Exception:
                pass
            os.close(self.ev)
            self.bash = None
        elif self.pid > 0:
            for fd in (self.req, self.ev, self.out, self.err):
                os.close(fd)
        self.pid = 0

    def restart(self):
        self.stop()
        self.start()

    def interrupt(self):
        """SIGINT to the cell (a bash context's whole group, as Ctrl-C)."""
        try:
            if self.language == "python":
                self.kill_forks()
                os.kill(self.pid, signal.SIGINT)
            else:
                os.killpg(self.pid, signal.SIGINT)
        except OSError:
            pass

    def kill_forks(self):
        """Kills the copies of this context's worker that its cells forked and
        left running (a fork bomb; a multiprocessing pool): an interrupt
        reaches the worker only, and they would go on. The group is stopped
        first so that none forks while they are found (a group signal is
        never lost to a fork in progress); what the cells exec'd (a server
        started with subprocess) is another program and lives on."""
        try:
            with open("/proc/%d/cmdline" % self.pid, "rb") as f:
                mine = f.read()
        except OSError:
            return
        os.killpg(self.pid, signal.SIGSTOP)
        try:
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) == self.pid:
                    continue
                try:
                    with open("/proc/%s/stat" % name, "rb") as f:
                        stat = f.read()
                    if int(stat[stat.rindex(b")") + 2:].split()[2]) != self.pid:
                        continue
                    with open("/proc/%s/cmdline" % name, "rb") as f:
                        if f.read() == mine:
                            os.kill(int(name), signal.SIGKILL)
                except (OSError, ValueError, IndexError):
                    continue
        finally:
            os.killpg(self.pid, signal.SIGCONT)

    def request(self, code, env, gen, warm=False):
        """Hand a cell to the process; False when it is gone."""
        base = self.server.sandbox_env()
        try:
            if self.language == "python":
                os.write(self.req, json.dumps({"code": code, "env": env, "gen": gen, "base_env": base,
                                               "warm": warm}).encode() + b"\n")
            else:
                path = "/tmp/.kiln-cell-%s.sh" % self.id
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(code + "\n")
                pre, post = ["export %s=%s" % (k, _sh_quote(v)) for k, v in base.items()], []
                for i, (k, v) in enumerate(env.items()):
                    q = _sh_quote(v)
                    pre.append('if [ -n "${%s+x}" ]; then __kiln_o%d=$%s; __kiln_h%d=1; else __kiln_h%d=; fi; export %s=%s'
                               % (k, i, k, i, i, k, q))
                    post.append('if [ -n "$__kiln_h%d" ]; then %s=$__kiln_o%d; else unset %s; fi' % (i, k, i, k))
                script = "\n".join(pre + [". %s; __kiln_rc=$?" % path] + post + ['printf "%d\\n" "$__kiln_rc" >&3', ""])
                self.count += 1
                os.write(self.req, script.encode())
            return True
        except OSError:
            return False

    def lines(self, data):
        """Complete lines of the event pipe's bytes. A line's pieces are kept
        in a list until its end comes: a 20 MiB result read a MiB at a time
        is joined once, not copied twenty times."""
        if b"\n" not in data:
            self.evbuf.append(data)
            return []
        first, *lines = data.split(b"\n")
        self.evbuf.append(first)
        lines.insert(0, b"".join(self.evbuf))
        self.evbuf = [lines.pop()]
        return lines

    def done_of(self, line):
        """The execution count a cell's last line carries."""
        if self.language == "python":
            return json.loads(line)["count"]
        return self.count


class BadRequest(Exception):
    pass


REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 404: "Not Found", 411: "Length Required",
           413: "Payload Too Large", 500: "Internal Server Error"}
HEAD_MAX = 64 << 10
FLUSH_JOIN_MAX = 256 << 10  # pending chunks up to this many bytes leave in one write


class Conn:
    """One client connection: requests read and answered in turn (keep-alive).
    The HTTP is parsed here, small and bounded, rather than by http.server:
    under TCG every line of Python costs, and the SDK's cell is one small
    request."""

    def __init__(self, app, sock):
        self.app, self.sock, self.buf = app, sock, b""
        self.gone, self.pending, self.keep = False, [], True
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _fill(self):
        d = self.sock.recv(65536)
        if not d:
            raise EOFError
        self.buf += d

    def _line(self):
        while b"\r\n" not in self.buf:
            if len(self.buf) > HEAD_MAX:
                raise BadRequest("a line longer than %d bytes" % HEAD_MAX)
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _take(self, n):
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read(self):
        """(method, path, body) of the next request; EOFError at the end."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > HEAD_MAX:
                raise BadRequest("headers longer than %d bytes" % HEAD_MAX)
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest("not an HTTP/1.x request line")
        method, target, version = parts
        headers = {}
        for l in lines[1:]:
            k, _, v = l.partition(":")
            headers[k.strip().lower()] = v.strip()
        self.keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks, total = [], 0
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    while self._line():  # trailers
                        pass
                    break
                total += size
                if total > BODY_MAX:
                    raise BadRequest("the body is larger than %d bytes" % BODY_MAX)
                chunks.append(self._take(size))
                self._take(2)
            body = b"".join(chunks)
        else:
            n = int(headers.get("content-length") or 0)
            if n < 0 or n > BODY_MAX:
                raise BadRequest("the body is larger than %d bytes" % BODY_MAX)
            body = self._take(n)
        return method, target.split("?", 1)[0].rstrip("/") or "/", body

    def reply(self, code, obj=None):
        body = b"" if obj is None else json.dumps(obj).encode()
        head = "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n" % (
            code, REASONS.get(code, "Error"), len(body), "" if self.keep else "Connection: close\r\n")
        self.sock.sendall(head.encode() + body)

    def fail(self, code, msg):
        self.reply(code, {"error": msg, "message": msg})

    def serve(self):
        try:
            while True:
                try:
                    method, path, body = self.read()
                except BadRequest as e:
                    self.keep = False
                    self.fail(400, str(e))
                    return
                except ValueError:
                    self.keep = False
                    self.fail(400, "a malformed request")
                    return
                self.route(method, path, body)
                if not self.keep or self.gone:
                    return
        except (EOFError, OSError):
            return
        finally:
            try:
                self.sock.close()
            except OSError:
                pass

    def route(self, method, p, raw):
        app = self.app
        parts = p.split("/")
        if method == "GET" and p == "/health":
            return self.reply(200, "OK")
        if method == "GET" and p == "/contexts":
            return self.reply(200, [c.info() for c in app.contexts_list()])
        if method == "DELETE" and len(parts) == 3 and parts[1] == "contexts":
            if app.remove(parts[2]):
                return self.reply(204)
            return self.fail(404, "context %s not found" % parts[2])
        if method != "POST":
            return self.fail(404, "no such route: %s %s" % (method, p))
        try:
            b = json.loads(raw or b"{}")
        except ValueError:
            return self.fail(400, "the body is not JSON")
        if not isinstance(b, dict):
            return self.fail(400, "the body is not a JSON object")
        if p == "/execute":
            return self.execute(b)
        if p == "/contexts":
            lang = LANGS.get(str(b.get("language") or "python").lower())
            if not lang:
                return self.fail(400, "language %r is not supported (python, bash)" % b.get("language"))
            cwd = b.get("cwd") or app.home
            if not isinstance(cwd, str) or not cwd.startswith("/"):
                return self.fail(400, "cwd: an absolute path")
            try:
                c = app.create(lang, cwd)
            except OSError as e:
                return self.fail(500, "cannot start the context: %s" % e)
            return self.reply(200, c.info())
        if len(parts) == 4 and parts[1] == "contexts" and parts[3] == "restart":
            c = app.get(parts[2])
            if not c:
                return self.fail(404, "context %s not found" % parts[2])
            with c.lock:
                c.restart()
            return self.reply(200, c.info())
        self.fail(404, "no such route: POST %s" % p)

    def chunk(self, data):
        """One NDJSON line (bytes, without its newline) as one chunk, held
        until flush(): events that are ready together leave in one write.
        Its head, body and tail stay apart: a large line is not copied."""
        if not self.gone:
            self.pending += (b"%x\r\n" % (len(data) + 1), data, b"\n\r\n")

    def event(self, ev):
        self.chunk(json.dumps(ev, ensure_ascii=False).encode("utf-8", "replace"))

    def flush(self, last=False):
        if last:
            self.pending.append(b"0\r\n\r\n")
        if self.gone or not self.pending:
            self.pending = []
            return
        try:
            if sum(map(len, self.pending)) <= FLUSH_JOIN_MAX:
                self.sock.sendall(b"".join(self.pending))
            else:
                for piece in self.pending:
                    self.sock.sendall(piece)
        except OSError:
            self.gone = True
        self.pending = []

    def execute(self, b):
        app = self.app
        code = b.get("code")
        if not isinstance(code, str):
            return self.fail(400, "code: a string")
        warm = b.get("warm") is True  # watch_reseed's warm-up after a restore: counts nothing
        env = b.get("env_vars") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and k.isidentifier() and isinstance(v, str)
                                                for k, v in env.items()):
            return self.fail(400, "env_vars: a map of variable names to strings")
        cid = b.get("context_id")
        if cid:
            c = app.get(cid)
            if not c:
                return self.fail(404, "context %s not found" % cid)
        else:
            lang = LANGS.get(str(b.get("language") or "python").lower())
            if not lang:
                return self.fail(400, "language %r is not supported (python, bash)" % b.get("language"))
            c = app.default(lang)
        with c.lock:
            if c.pid <= 0:
                c.start()
            self.pending = [b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                            b"Transfer-Encoding: chunked\r\n%s\r\n" % (b"" if self.keep else b"Connection: close\r\n")]
            self.gone = False
            self.run_cell(c, code, env, warm)
            self.flush(last=True)

    def run_cell(self, c, code, env, warm=False):
        app = self.app
        if not c.request(code, env, app.gen, warm):
            c.restart()
            c.request(code, env, app.gen, warm)
        out_left = OUT_MAX
        interrupted_at = None
        done = None
        client = self.sock
        names = {c.out: "stdout", c.err: "stderr"}
        open_fds = [c.ev, c.out, c.err]
        while done is None:
            self.flush()
            fds = open_fds + ([] if self.gone else [client])
            wait = 1.0
            if interrupted_at is not None:
                wait = max(0.0, interrupted_at + INTERRUPT_GRACE_S - time.monotonic())
            r, _, _ = select.select(fds, [], [], wait)
            if not r and interrupted_at is not None:
                # Deaf to SIGINT: the context starts again, empty.
                c.restart()
                self.event({"type": "error", "name": "KernelRestarted", "value": "the cell did not stop on an "
                            "interrupt: the context was restarted and its state is lost", "traceback": ""})
                break
            if client in r:
                try:
                    peek = client.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except BlockingIOError:
                    peek = b"x"
                except OSError:
                    peek = b""
                if not peek:  # the client gave up (the SDK's timeoutMs): interrupt the cell
                    self.gone = True
                    if interrupted_at is None:
                        interrupted_at = time.monotonic()
                        c.interrupt()
                else:
                    time.sleep(0.01)  # a pipelined request: nothing to read until this one ends
            for fd in r:
                if fd == client:
                    continue
                data = os.read(fd, 1 << 20)
                if not data:
                    open_fds.remove(fd)
                    continue
                if fd == c.ev:
                    for line in c.lines(data):
                        if line.startswith(DONE_PREFIX) or c.language != "python":
                            done = c.done_of(line)
                        else:
                            self.chunk(line)
                elif out_left > 0:
                    text = data[:out_left].decode("utf-8", "replace")
                    out_left -= len(data)
                    self.event({"type": names[fd], "text": text})
            if c.ev not in open_fds and done is None:
                # The process died under the cell (os._exit, a crash, the OOM killer).
                c.restart()
                self.event({"type": "error", "name": "KernelRestarted", "value": "the context's interpreter "
                            "exited during the cell: it was restarted and its state is lost", "traceback": ""})
                break
        if done is not None:
            # What subprocesses wrote before the cell ended.
            for fd, name in ((c.out, "stdout"), (c.err, "stderr")):
                while fd in open_fds and out_left > 0 and select.select([fd], [], [], 0)[0]:
                    data = os.read(fd, 65536)
                    if not data:
                        break
                    out_left -= len(data)
                    self.event({"type": name, "text": data.decode("utf-8", "replace")})
            self.chunk(b'{"type": "number_of_executions", "execution_count": %d}' % done)
        self.chunk(b'{"type": "end_of_execution"}')


class App:
    def __init__(self, fork_sock, home):
        self.fork_sock, self.home = fork_sock, home
        self.fork_lock = threading.Lock()
        self.lock = threading.Lock()
        self.contexts = {}
        self.defaults = {}
        self.gen = 0
        self.port = PORT
        self.env_key, self.env = None, {}

    def sandbox_env(self):
        """The sandbox's envs (Sandbox.create's envVars): kiln-host writes them to
        SANDBOX_ENV when the session starts. Read again when it changes;
        anything but a map of names to strings is ignored."""
        try:
            st = os.stat(SANDBOX_ENV)
        except OSError:
            return {}
        key = (st.st_mtime_ns, st.st_size)
        if key != self.env_key:
            env = {}
            try:
                with open(SANDBOX_ENV, "rb") as f:
                    j = json.loads(f.read(1 << 20))
                if isinstance(j, dict):
                    env = {k: v for k, v in j.items() if isinstance(k, str) and k.isidentifier() and isinstance(v, str)}
            except (OSError, ValueError):
                pass
            self.env_key, self.env = key, env
        return self.env

    def fork_worker(self, cwd):
        with self.fork_lock:
            self.fork_sock.send(cwd.encode())
            msg, fds, _, _ = socket.recv_fds(self.fork_sock, 64, 4)
            if len(fds) != 4:
                raise OSError("the fork server failed")
            return int(msg), fds

    def create(self, lang, cwd, default=False):
        c = Context(self, lang, cwd)
        c.start()
        with self.lock:
            self.contexts[c.id] = c
            if default:
                self.defaults[lang] = c
        return c

    def default(self, lang):
        with self.lock:
            c = self.defaults.get(lang)
            if c and c.id in self.contexts:
                return c
        return self.create(lang, self.home, default=True)

    def get(self, cid):
        with self.lock:
            return self.contexts.get(cid)

    def contexts_list(self):
        with self.lock:
            return list(self.contexts.values())

    def remove(self, cid):
        with self.lock:
            c = self.contexts.pop(cid, None)
            for k, v in list(self.defaults.items()):
                if v is c:
                    del self.defaults[k]
        if not c:
            return False
        with c.lock:
            c.stop()
        return True

    def watch_reseed(self):
        """fd 0: one byte from kiln-init after every restore; the next cells reseed."""
        while True:
            try:
                b = os.read(0, 64)
            except OSError:
                return
            if not b:
                return
            self.gen += 1
            # A restore: while the client's first request is still on its
            # way, walk a cell's whole path once (a request to ourselves
            # that counts nothing), so that TCG has translated it.
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
                    body = b'{"code": "", "warm": true}'
                    s.sendall(b"POST /execute HTTP/1.1\r\nHost: warm\r\nContent-Length: %d\r\n"
                              b"Connection: close\r\n\r\n%s" % (len(body), body))
                    while s.recv(65536):
                        pass
            except OSError:
                pass


def warm_up():
    """Imports and first uses under TCG cost seconds: pay them before the snapshot."""
    try:
        import numpy, pandas, matplotlib
    except ImportError:  # an image without the data stack: plain Python still works
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.axes import Axes
    Axes.boxplot = _boxplot_recorder(Axes.boxplot)
    try:
        import IPython.display  # noqa: F401 (display objects: HTML, Markdown, Image)
    except Exception:
        pass
    df = pandas.DataFrame({"a": numpy.arange(3), "b": ["x", "y", "z"]})
    representations(df)
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 4, 9], label="warm")
    ax.set_title("warm")
    representations(fig)
    plt.close("all")
    fig, ax = plt.subplots()
    ax.bar(["a", "b"], [1, 2])
    representations(fig)
    plt.close("all")


def drop_privileges():
    """Run as E2B's `user` (envd creates it at boot: wait for it a little)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            pw = pwd.getpwnam(USER)
            break
        except KeyError:
            if time.monotonic() > deadline:
                pw = pwd.getpwuid(1000)
                break
            time.sleep(0.05)
    if os.getuid() == 0:
        os.initgroups(pw.pw_name, pw.pw_gid)
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)
        # setuid made this process undumpable: its /proc/self files became
        # root's, and a context could not raise its own oom_score_adj
        # (_oom_context). The cells run as this same user anyway.
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
        except Exception:
            pass
    home = pw.pw_dir if os.path.isdir(pw.pw_dir) else "/tmp"
    os.environ.update(HOME=home, USER=pw.pw_name, LOGNAME=pw.pw_name, SHELL="/bin/bash",
                      PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", MPLBACKEND="Agg",
                      PYTHONUNBUFFERED="1")
    if os.path.isdir("/var/lib/kiln-interpreter/matplotlib"):
        os.environ["MPLCONFIGDIR"] = "/var/lib/kiln-interpreter/matplotlib"  # the image's font cache
    os.chdir(home)
    return home


class Pool:
    """Threads that serve connections, started before the snapshot (a thread
    start costs ~8 ms under TCG); more when every one is busy, up to THREADS_MAX."""

    THREADS = 8
    THREADS_MAX = 128

    def __init__(self, app):
        self.app, self.q, self.lock = app, queue.SimpleQueue(), threading.Lock()
        self.idle = self.threads = 0
        for _ in range(self.THREADS):
            self.spawn()

    def spawn(self):
        with self.lock:
            self.threads += 1
            self.idle += 1
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        _realtime()
        while True:
            sock = self.q.get()
            with self.lock:
                self.idle -= 1
            try:
                Conn(self.app, sock).serve()
            except Exception:
                traceback.print_exc()
            with self.lock:
                self.idle += 1

    def hand(self, sock):
        with self.lock:
            more = self.idle == 0 and self.threads < self.THREADS_MAX
        if more:
            self.spawn()
        self.q.put(sock)


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)  # interp.c's, for these processes only
    # KILN_INTERP_PORT: a test of this program outside a guest (no user switch).
    port = int(os.environ.get("KILN_INTERP_PORT") or 0)
    home = drop_privileges() if not port else os.getcwd()
    _realtime()
    # Bound first: a client that comes early waits in the backlog, not refused.
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", port or PORT))
    lsock.listen(128)
    # The fork server imports and warms the data stack, not this server:
    # this one only relays, and stays small (a 20 MiB result it relayed is
    # given back, not kept in a heap shared with numpy's pages).
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        a.close()
        lsock.close()
        warm_up()
        fork_server(b)
    b.close()
    app = App(a, home)
    app.port = port or PORT
    app.default("python")
    pool = Pool(app)
    threading.Thread(target=app.watch_reseed, daemon=True).start()
    try:
        os.write(3, b"R")
        os.close(3)
    except OSError:
        pass
    while True:
        try:
            sock, _ = lsock.accept()
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                time.sleep(0.1)  # out of descriptors: let connections end
            continue
        pool.hand(sock)


if __name__ == "__main__":
    main()
