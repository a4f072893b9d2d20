# Moat's code kernel driver: runs cells of Python in one process, keeping
# their globals, and reports what they print and show as framed JSON.
#
# Shipped inside the moat binary (service/kernel.py, go:embed) and started
# as `python3 -c <this file>` in the sandbox, as the sandbox's programs are:
# same seccomp, Landlock and limits. The host decodes what it writes as
# hostile input (service/kernelproto.go).
#
# Protocol, both ways: a frame is the payload's length in decimal ASCII, a
# newline, then that many bytes of one JSON object.
#   host -> kernel: {"type": "execute", "id": "c-1", "code": "..."}
#   kernel -> host: ready, stream (name stdout|stderr, text), result and
#                   display (data: a MIME bundle), error (ename, evalue,
#                   traceback), end (status ok|error|interrupted).
# The real stdout and stdin are kept for the protocol; the program's fds 0,
# 1 and 2 are /dev/null and two pipes drained into stream frames, so what a
# cell or its subprocesses print can never be taken for a frame.
import ast
import base64
import json
import linecache
import os
import signal
import sys
import threading
import traceback

MAX_TEXT = 1 << 20  # one stream frame's text, in characters

# The driver's own file name ("<string>" under python3 -c): its frames are
# dropped from a cell's traceback.
DRIVER = sys._getframe().f_code.co_filename

_ctrl = os.dup(1)
_cin = os.fdopen(os.dup(0), "rb", buffering=0)
_lock = threading.Lock()
_cell = [None]  # the id of the running cell


def send(msg):
    if msg["type"] != "stream":
        for w in _writers:
            w.flush()
    data = json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")
    frame = str(len(data)).encode() + b"\n" + data
    with _lock:
        view = memoryview(frame)
        while view:
            n = os.write(_ctrl, view)
            view = view[n:]


def read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = _cin.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def read_frame():
    head = b""
    while True:
        c = _cin.read(1)
        if not c:
            return None
        if c == b"\n":
            break
        head += c
        if len(head) > 10:
            raise ValueError("frame header too long")
    data = read_exact(int(head))
    if data is None:
        return None
    return json.loads(data)


def emit_stream(name, text):
    if not text:
        return
    for i in range(0, len(text), MAX_TEXT):
        send({"type": "stream", "id": _cell[0] or "", "name": name, "text": text[i:i + MAX_TEXT]})


class Writer:
    """sys.stdout and sys.stderr: line-buffered into stream frames (as
    Python's own stdout is on a terminal); flushed before any other frame,
    so a cell's prints and its displays keep their order."""

    def __init__(self, name):
        self.name = name
        self.encoding = "utf-8"
        self.errors = "replace"
        self.buf = []
        self.size = 0
        self.lock = threading.Lock()

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not " + type(s).__name__)
        with self.lock:
            self.buf.append(s)
            self.size += len(s)
            if "\n" not in s and self.size < 8192:
                return len(s)
        self.flush()
        return len(s)

    def writelines(self, lines):
        for s in lines:
            self.write(s)

    def flush(self):
        with self.lock:
            text, self.buf, self.size = "".join(self.buf), [], 0
        emit_stream(self.name, text)

    def isatty(self):
        return False

    def writable(self):
        return True

    def readable(self):
        return False

    def fileno(self):
        return 1 if self.name == "stdout" else 2


_writers = []


# SYNC is written to fds 1 and 2 at the end of a cell: when a drain
# thread reads it back, everything written to the pipe before it (by the
# cell, its subprocesses, C code) has been sent, so the cell's output
# precedes its end frame. Random per kernel: a cell cannot forge it.
SYNC = b"\x00moat-sync-" + os.urandom(8).hex().encode() + b"\x00"
_synced = {1: threading.Event(), 2: threading.Event()}


def drain(fd, out, name):
    dec = __import__("codecs").getincrementaldecoder("utf-8")("replace")
    held = b""
    while True:
        try:
            b = os.read(fd, 65536)
        except OSError:
            return
        if not b:
            emit_stream(name, dec.decode(held, final=True))
            return
        held += b
        while True:
            i = held.find(SYNC)
            if i < 0:
                break
            emit_stream(name, dec.decode(held[:i]))
            held = held[i + len(SYNC):]
            _synced[out].set()
        # Keep back only a tail that may be the start of SYNC.
        keep = 0
        for k in range(min(len(held), len(SYNC) - 1), 0, -1):
            if SYNC.startswith(held[-k:]):
                keep = k
                break
        emit_stream(name, dec.decode(held[:len(held) - keep]))
        held = held[len(held) - keep:]


def sync_fds(timeout=1.0):
    """Waits (bounded) until fds 1 and 2 have been drained up to now."""
    for fd in (1, 2):
        _synced[fd].clear()
        try:
            os.write(fd, SYNC)
        except OSError:
            continue
    for fd in (1, 2):
        _synced[fd].wait(timeout)


def redirect():
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        threading.Thread(target=drain, args=(r, fd, name), daemon=True).start()
    sys.stdin = open(os.devnull)
    sys.stdout = Writer("stdout")
    sys.stderr = Writer("stderr")
    _writers.extend((sys.stdout, sys.stderr))


def text_of(v):
    try:
        return repr(v)
    except BaseException as e:  # a broken __repr__ must not end the cell
        return "<repr failed: %s>" % type(e).__name__


MIMES = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/json", "_repr_json_"),
    ("text/latex", "_repr_latex_"),
)


def bundle(v):
    """The MIME bundle of v, as IPython's display formatter would build it."""
    data = {"text/plain": text_of(v)}
    for mime, meth in MIMES:
        f = getattr(type(v), meth, None)
        if f is None:
            continue
        try:
            r = f(v)
        except Exception:
            continue
        if isinstance(r, tuple):
            r = r[0]
        if r is None:
            continue
        if isinstance(r, bytes):
            r = base64.b64encode(r).decode()
        elif mime == "application/json":
            r = json.dumps(r)
        data[mime] = str(r)
    f = getattr(type(v), "_repr_mimebundle_", None)
    if f is not None:
        try:
            extra = f(v)
            if isinstance(extra, tuple):
                extra = extra[0]
            for k, r in (extra or {}).items():
                if isinstance(r, bytes):
                    r = base64.b64encode(r).decode()
                elif not isinstance(r, str):
                    r = json.dumps(r)
                data[k] = r
        except Exception:
            pass
    return data


def display(*objs, **kw):
    for o in objs:
        send({"type": "display", "id": _cell[0] or "", "data": bundle(o)})


def figures():
    """Shows the open matplotlib figures as PNG (and closes them)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    import io
    try:
        nums = plt.get_fignums()
    except Exception:
        return
    for n in nums:
        fig = plt.figure(n)
        buf = io.BytesIO()
        try:
            fig.savefig(buf, format="png", bbox_inches="tight")
        except Exception as e:
            emit_stream("stderr", "figure %d: %s\n" % (n, e))
            continue
        send({"type": "display", "id": _cell[0] or "", "data": {
            "text/plain": text_of(fig),
            "image/png": base64.b64encode(buf.getvalue()).decode()}})
    plt.close("all")


def patch_show(plt):
    """Makes plt.show() show the open figures where it is called, as
    Jupyter's inline backend does. Under Agg show() does nothing, so a
    figure would appear only at the end of its cell, after what the cell
    printed later."""
    import functools
    orig = plt.show

    @functools.wraps(orig)
    def show(*args, **kw):
        try:
            agg = str(plt.get_backend()).lower() == "agg"
        except Exception:
            agg = False
        if not agg or _cell[0] is None:
            return orig(*args, **kw)
        figures()

    plt.show = show


class PyplotHook:
    """A meta path finder that lets matplotlib.pyplot import as usual,
    then calls patch_show on it: the driver never imports matplotlib
    itself (it costs half a second, and most cells never plot)."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = ShowLoader(spec.loader)
        return spec


class ShowLoader:
    def __init__(self, real):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        self.real.exec_module(module)
        try:
            patch_show(module)
        except Exception:
            pass

    def __getattr__(self, name):  # get_source and friends, for tracebacks
        return getattr(self.real, name)


def error(etype, evalue, tb_lines):
    send({"type": "error", "id": _cell[0] or "", "ename": etype.__name__ if etype else "Error",
          "evalue": text_of(evalue) if not isinstance(evalue, BaseException) else str(evalue),
          "traceback": [str(x) for x in tb_lines]})


class Plain:
    """Runs cells with exec, the last expression evaluated as in a REPL."""

    def __init__(self):
        self.ns = {"__name__": "__main__", "__builtins__": __builtins__, "display": display}
        self.count = 0

    def run(self, code):
        self.count += 1
        fn = "<cell-%d>" % self.count
        linecache.cache[fn] = (len(code), None, code.splitlines(True), fn)
        try:
            tree = ast.parse(code, fn, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, fn, "exec"), self.ns)
            if last is not None:
                v = eval(compile(last, fn, "eval"), self.ns)
                if v is not None:
                    self.ns["_"] = v
                    send({"type": "result", "id": _cell[0], "data": bundle(v), "count": self.count})
            return "ok"
        except KeyboardInterrupt as e:
            self.report(e)
            return "interrupted"
        except BaseException as e:
            self.report(e)
            return "error"

    def report(self, e):
        tb = e.__traceback__
        # Drop the driver's own frames: the traceback starts in the cell.
        while tb is not None and tb.tb_frame.f_code.co_filename == DRIVER:
            tb = tb.tb_next
        lines = traceback.format_exception(type(e), e, tb)
        error(type(e), e, lines)


class IPython:
    """Runs cells with IPython's InteractiveShell: magics, display()."""

    def __init__(self):
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.core.displayhook import DisplayHook
        from IPython.core.displaypub import DisplayPublisher

        class Hook(DisplayHook):
            def write_output_prompt(self):
                pass

            def write_format_data(self, format_dict, md_dict=None):
                send({"type": "result", "id": _cell[0], "data": strings(format_dict), "count": self.prompt_count})

            def finish_displayhook(self):
                pass

        class Pub(DisplayPublisher):
            def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kw):
                send({"type": "display", "id": _cell[0] or "", "data": strings(data)})

            def clear_output(self, wait=False):
                pass

        from traitlets.config import Config

        # History in memory, not in IPYTHONDIR's history.sqlite: the
        # contexts of one sandbox are kernels side by side, and one SQLite
        # file between them gives "database is locked"; nor should a
        # cell's code outlive its kernel in a file.
        cfg = Config()
        cfg.HistoryManager.hist_file = ":memory:"
        self.shell = InteractiveShell.instance(colors="NoColor", config=cfg)
        self.shell.displayhook = Hook(shell=self.shell, cache_size=self.shell.cache_size)
        self.shell.display_pub = Pub(shell=self.shell)
        self.shell.display_trap.hook = self.shell.displayhook
        self.interrupted = False

        def show(etype, evalue, stb):
            self.interrupted = etype is KeyboardInterrupt
            error(etype, evalue, stb)

        self.shell._showtraceback = show

    def run(self, code):
        self.interrupted = False
        try:
            r = self.shell.run_cell(code, store_history=True)
        except KeyboardInterrupt as e:
            error(type(e), e, traceback.format_exception(type(e), e, None))
            return "interrupted"
        if self.interrupted:
            return "interrupted"
        return "ok" if r.success else "error"


def strings(data):
    out = {}
    for k, v in (data or {}).items():
        if isinstance(v, bytes):
            v = base64.b64encode(v).decode()
        elif not isinstance(v, str):
            v = json.dumps(v)
        out[str(k)] = v
    return out


def scratch_dirs():
    """Points IPython's profile directory and matplotlib's config and font
    cache at /tmp unless the image says otherwise. Both default to HOME,
    which in a sandbox is /workspace: a kernel would leave ~/.ipython (its
    profile, and the history of every cell) and ~/.config/matplotlib among
    the files the program made, and on a read-only HOME matplotlib warns on
    every import."""
    import tempfile
    tmp = tempfile.gettempdir()
    for var, sub in (("IPYTHONDIR", "ipython"), ("MPLCONFIGDIR", "matplotlib")):
        if not os.environ.get(var):
            os.environ[var] = os.path.join(tmp, "moat-kernel-" + sub)


def main():
    redirect()
    os.environ.setdefault("MPLBACKEND", "Agg")
    scratch_dirs()
    sys.meta_path.insert(0, PyplotHook())
    kernel = None
    if os.environ.get("MOAT_KERNEL_PLAIN") != "1":
        try:
            kernel = IPython()
        except Exception:
            kernel = None
    if kernel is None:
        kernel = Plain()
    send({"type": "ready", "ipython": isinstance(kernel, IPython), "python": sys.version.split()[0]})
    while True:
        try:
            msg = read_frame()
        except KeyboardInterrupt:
            continue  # an interrupt between cells interrupts nothing
        if msg is None:
            return
        if msg.get("type") != "execute":
            continue
        _cell[0] = msg.get("id") or ""
        status = "error"
        try:
            _running[0] = True
            status = kernel.run(msg.get("code") or "")
            figures()
            _running[0] = False
        except KeyboardInterrupt as e:
            _running[0] = False
            error(type(e), e, [])
            status = "interrupted"
        except BaseException as e:
            _running[0] = False
            error(type(e), e, traceback.format_exception(type(e), e, e.__traceback__))
        try:
            for w in _writers:
                w.flush()
            sync_fds()
        except BaseException:
            pass
        send({"type": "end", "id": _cell[0], "status": status})
        _cell[0] = None


# _running: a cell runs. SIGINT interrupts a running cell only: one that
# lands after its cell ended (the host interrupts a cell whose caller left
# or whose time ran out, racing with its end) must not raise in the loop
# itself, between cells, where nothing would catch it and the kernel,
# with its state, would die.
_running = [False]


def on_sigint(signum, frame):
    if _running[0]:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, on_sigint)
main()
