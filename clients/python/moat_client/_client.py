"""The blocking client of ``moat_client`` (the package's ``Client``).

Standard library only (urllib, json); Python 3.9 or later.

    from moat_client import Client

    c = Client("http://127.0.0.1:7070", api_key=os.environ["MOAT_API_KEY"])
    run = c.run(["python3", "-c", "print(6*7)"])
    print(run["result"]["exit_code"], run["result"]["stdout"]["data"])

A program that failed (non-zero exit, timeout, OOM kill) is not an
exception: it is a result with its ``termination``. ``MoatError`` is a call
the server refused (decoded from its error JSON); ``MoatConnectionError``
is a failure to reach it. Results, sandboxes and execs are the API's JSON
documents as dicts.
"""

import base64
import contextvars
import json
import select
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import http.client
from dataclasses import dataclass
from typing import (IO, Any, BinaryIO, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    Union, cast)

from ._retry import RetryPolicy, parse_retry_after
from ._types import (Approval, ApprovalOutcome, Cell, Exec, FileInfo, Health, RunResponse, SandboxInfo,
                     StdinAnswer, TTYSize)

__all__ = [
    "Client",
    "Sandbox",
    "File",
    "Event",
    "EventStream",
    "MoatError",
    "MoatConnectionError",
    "MoatHeld",
    "stream_bytes",
    "file_name",
    "Duration",
    "Files",
    "ManifestArg",
]

__version__ = "0.2.0"

# A duration: a string the API reads ("10m", "90s") or a number of seconds.
Duration = Union[str, int, float]
# Files for a run or a new sandbox: {path: content}, or a sequence of
# File, {"path", "content", "mode"} dicts or (path, content[, mode]) tuples.
FileSpec = Union["File", Mapping[str, Any], Tuple[Any, ...]]
Files = Union[Mapping[str, Union[bytes, str]], Sequence[FileSpec]]
# A manifest in its JSON form: a dict, or JSON text.
ManifestArg = Union[Mapping[str, Any], str, bytes]
# What a run, sandbox or exec request reads as a terminal size.
TTYArg = Union[Tuple[int, int], Mapping[str, int]]

# Bounds what is read of an error answer: Moat's are a few hundred bytes.
_MAX_ERROR_BODY = 64 << 10
# Bodies larger than this ask "Expect: 100-continue" first (_open_expecting)
# and wait this long for the server's go-ahead.
_EXPECT_CONTINUE_BYTES = 64 << 10
_EXPECT_CONTINUE_WAIT = 1.0
_MAX_LINE = 64 << 10
# Bounds one event, so a broken server cannot grow the client's memory
# without end.
_MAX_EVENT_BYTES = 32 << 20
_MAX_RETRY_DELAY = 10.0


class MoatError(Exception):
    """A call the server refused: the HTTP status and the error document
    ``{"error": {"code", "message", "field", "request_id"}}``.

    ``code`` is one of the API's codes (``bad_request``, ``invalid_field``,
    ``unauthenticated``, ``forbidden``, ``not_found``, ``conflict``, ``too_large``,
    ``quota_exceeded``, ``internal``, ``unavailable``...), or ``""`` when the
    answer was not Moat's error JSON (a proxy's error page)."""

    def __init__(self, status: int, code: str, message: str, field: str = "",
                 request_id: str = "", method: str = "", path: str = "",
                 retry_after: Optional[float] = None):
        self.status = status
        # Seconds after which the server said to try again (its
        # Retry-After), None when it did not say; set on a 429 or 503
        # that the client's RetryPolicy did not wait for.
        self.retry_after = retry_after
        self.code = code
        self.message = message
        self.field = field
        self.request_id = request_id
        self.method = method
        self.path = path
        super().__init__(str(self))

    def __str__(self) -> str:
        s = "moat server: "
        if self.method:
            s += "%s %s: " % (self.method, self.path)
        s += str(self.status)
        if self.code:
            s += " " + self.code
        s += ": " + self.message
        if self.field:
            s += " (field: %s)" % self.field
        if self.request_id:
            s += " [request %s]" % self.request_id
        return s


class MoatHeld(Exception):
    """A command the server's effects policy held for a person's approval
    (202 with ``{"approval": ...}``): it has not started. ``approval`` is
    the pending approval (``id``, ``effects``, ``expires_at``); decide it
    with ``Client.decide_approval``. A held one-shot ``run`` is not raised:
    its answer has ``"approval"`` instead of ``"result"``."""

    def __init__(self, approval: Approval):
        self.approval: Approval = approval
        effects = "; ".join(str(e.get("detail", "")) for e in self.approval.get("effects") or [])
        msg = "moat server: held for approval %s until %s" % (self.approval.get("id"), self.approval.get("expires_at"))
        super().__init__(msg + (": " + effects if effects else ""))


class MoatConnectionError(ConnectionError):
    """The server could not be reached, or the connection failed; the
    message names the call, ``__cause__`` is the underlying error."""


@dataclass
class File:
    """One file written into /workspace. ``path`` is relative (no ``..``);
    ``content`` is bytes or text; ``mode`` is the permission bits as an int
    (0o755) or an octal string ("0755"), None for the server's default
    0644."""

    path: str
    content: Union[bytes, str]
    mode: Union[int, str, None] = None


@dataclass
class Event:
    """One Server-Sent Event of a command's stream.

    ``type`` is ``"stdout"``, ``"stderr"`` (``data`` holds the bytes),
    ``"exit"`` (``exec`` holds the finished Exec; the stream ends), or a
    type this client does not know (only ``raw`` is set)."""

    id: int
    type: str
    data: Optional[bytes] = None
    exec: Optional[Exec] = None
    raw: str = ""


def stream_bytes(stream: Mapping[str, Any]) -> bytes:
    """Returns the bytes of a result's ``stdout`` or ``stderr``, decoding
    its base64 form (used when the output was not valid UTF-8)."""
    enc = stream.get("encoding") or "utf-8"
    data = stream.get("data") or ""
    if enc == "utf-8":
        return data.encode("utf-8")
    if enc == "base64":
        return base64.b64decode(data, validate=True)
    raise ValueError("output has unknown encoding %r" % enc)


def file_name(entry: Mapping[str, Any], field: str = "path") -> bytes:
    """Returns the bytes of a name in a result's ``files`` (the workspace
    diff) or ``copy_out.skipped`` entry: ``field`` is ``"path"`` or
    ``"target"`` (a symlink's). Names that are not valid UTF-8 travel as
    base64 with ``"encoding": "base64"``, so two distinct names never read
    the same; ``os.fsdecode`` turns the bytes into a ``str`` for ``open``."""
    enc = entry.get("encoding") or "utf-8"
    name = entry.get(field) or ""
    if enc == "utf-8":
        return name.encode("utf-8")
    if enc == "base64":
        return base64.b64decode(name, validate=True)
    raise ValueError("file entry has unknown encoding %r" % enc)


def _duration(d: Union[str, int, float, None]) -> Optional[str]:
    """A duration as the API writes it: a string ("10m") as is, a number
    of seconds as "90s"."""
    if d is None or isinstance(d, str):
        return d
    if isinstance(d, bool) or d < 0:
        raise ValueError("duration %r: want a non-negative number of seconds or a string such as '10m'" % (d,))
    if float(d).is_integer():
        return "%ds" % int(d)
    return "%ss" % repr(float(d))


def _encode_bytes(b: Union[bytes, str]) -> Tuple[str, Optional[str]]:
    """Returns (text, encoding): text as is, bytes as text when valid UTF-8,
    else base64."""
    if isinstance(b, str):
        return b, None
    try:
        return b.decode("utf-8"), None
    except UnicodeDecodeError:
        return base64.b64encode(b).decode("ascii"), "base64"


def _mode(mode: Union[int, str, None]) -> Optional[str]:
    if mode is None:
        return None
    if isinstance(mode, str):
        int(mode, 8)  # refuse what is not octal before sending
        return mode
    return "%04o" % (mode & 0o777)


def _files(files: Optional[Files]) -> Optional[List[Dict[str, str]]]:
    """Accepts a mapping {path: content}, or a list of File, dicts with
    path/content/mode, or (path, content[, mode]) tuples."""
    if not files:
        return None
    items: Sequence[FileSpec]
    if isinstance(files, Mapping):
        items = [File(p, c) for p, c in files.items()]
    else:
        items = files
    out = []
    for i, f in enumerate(items):
        path: Any
        content: Any
        mode: Any
        if isinstance(f, File):
            path, content, mode = f.path, f.content, f.mode
        elif isinstance(f, Mapping):
            path, content, mode = f.get("path"), f.get("content", b""), f.get("mode")
        else:
            path, content, mode = (tuple(f) + (None,))[:3]
        if not path:
            raise ValueError("files[%d]: empty path" % i)
        text, enc = _encode_bytes(content)
        w = {"path": path, "content": text}
        if enc:
            w["encoding"] = enc
        m = _mode(mode)
        if m:
            w["mode"] = m
        out.append(w)
    return out


def _manifest(manifest: Optional[ManifestArg]) -> Optional[Dict[str, Any]]:
    """A manifest as a dict, or JSON text (parsed to check it)."""
    if manifest is None:
        return None
    doc: Any = manifest
    if isinstance(manifest, (bytes, str)):
        doc = json.loads(manifest)
    if not isinstance(doc, Mapping):
        raise ValueError("the manifest must be a JSON object (a dict)")
    return dict(doc)


def _list(doc: Any, *keys: str) -> List[Any]:
    """A list answer: a JSON array, or an object holding it under one of
    keys (docs/API.md does not fix which)."""
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict):
        for k in keys:
            if k in doc and isinstance(doc[k], list):
                return cast(List[Any], doc[k])
    raise ValueError("the answer is not a list (nor an object with %r)" % (keys[0],))


def _tty(tty: Optional[TTYArg]) -> Optional[TTYSize]:
    """A terminal size given as (rows, cols) or {"rows": R, "cols": C}."""
    if tty is None:
        return None
    rows: Any
    cols: Any
    if isinstance(tty, Mapping):
        rows, cols = tty.get("rows"), tty.get("cols")
    else:
        rows, cols = tty
    if not isinstance(rows, int) or not isinstance(cols, int) or isinstance(rows, bool) or isinstance(cols, bool):
        raise TypeError("tty: give (rows, cols) as whole numbers, e.g. (24, 80)")
    return {"rows": rows, "cols": cols}


def _exec_body(argv: Optional[Iterable[str]], code: Optional[str], language: Optional[str],
               env: Optional[Mapping[str, str]], dir: Optional[str], timeout: Optional[Duration],
               stdin: Union[bytes, str, None], stdin_open: bool, wait: bool,
               tty: Optional[TTYArg] = None) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if argv is not None:
        body["argv"] = list(argv)
    if code is not None:
        body["code"] = code
    if language is not None:
        body["language"] = language
    if env:
        body["env"] = dict(env)
    if dir:
        body["dir"] = dir
    if timeout is not None:
        body["timeout"] = _duration(timeout)
    if stdin is not None and len(stdin) > 0:
        body["stdin"], enc = _encode_bytes(stdin)
        if enc:
            body["stdin_encoding"] = enc
    if stdin_open:
        body["stdin_open"] = True
    if tty is not None:
        body["tty"] = _tty(tty)
    body["wait"] = wait
    return body


class Client:
    """Calls one Moat server with one API key, sent as ``Authorization:
    Bearer KEY`` (none when api_key is empty: only ``health`` accepts that).

    ``timeout`` is the socket timeout of every request in seconds (None:
    wait as long as the call lasts, as a waiting exec may). An event stream
    that drops reconnects up to ``reconnect_attempts`` times in a row
    without receiving an event (0 disables resuming), the first after
    ``reconnect_delay`` seconds, doubling each time, at most 10s.

    ``retry`` (a RetryPolicy; the default tries a call up to 4 times)
    says which refused or failed calls are sent again: a 429 or 503 with
    Retry-After after that long, any method; without it, and after a
    dropped connection, only GET, PUT and DELETE; a refused connection for
    every method. ``RetryPolicy(attempts=1)`` disables retrying."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, *, timeout: Optional[float] = None,
                 reconnect_attempts: int = 5, reconnect_delay: float = 0.25,
                 user_agent: str = "moat-python-client/" + __version__,
                 retry: Optional[RetryPolicy] = None):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("server URL %r: want http://HOST[:PORT] or https://HOST[:PORT]" % base_url)
        if u.query or u.fragment or u.username or u.password:
            raise ValueError("server URL %r: must not carry a query, fragment or user info (pass the API key separately)" % base_url)
        if api_key and ("\r" in api_key or "\n" in api_key):
            raise ValueError("the API key contains a line break")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key or ""
        self.timeout = timeout
        self.reconnect_attempts = max(0, reconnect_attempts)
        self.reconnect_delay = reconnect_delay
        self.user_agent = user_agent
        self.retry = retry if retry is not None else RetryPolicy()
        # No redirects: a redirect would carry the key elsewhere.
        self._opener = urllib.request.build_opener(_NoRedirect)

    # -- plumbing -------------------------------------------------------

    def _open(self, method: str, path: str, *, query: Optional[Mapping[str, str]] = None,
              body: Union[bytes, BinaryIO, None] = None, content_type: Optional[str] = None,
              headers: Optional[Mapping[str, str]] = None,
              timeout: Optional[float] = None) -> http.client.HTTPResponse:
        """Sends a request and returns the response when its status is
        2xx, trying it again as self.retry allows; raises MoatError or
        MoatConnectionError otherwise."""
        # A stream (a file object being uploaded) is read once: it cannot
        # be sent again.
        replayable = body is None or isinstance(body, (bytes, bytearray))
        attempt, waited = 0, 0.0
        while True:
            attempt += 1
            try:
                return self._attempt(method, path, query=query, body=body, content_type=content_type,
                                     headers=headers, timeout=timeout)
            except MoatError as e:
                err: Exception = e
                d = self.retry.delay(attempt=attempt, waited=waited, method=method, replayable=replayable,
                                     status=e.status, retry_after=e.retry_after)
            except MoatConnectionError as e:
                err = e
                cause = getattr(e.__cause__, "reason", e.__cause__)
                if isinstance(cause, (socket.timeout, TimeoutError)):
                    # The caller's timeout bounds the call: trying again
                    # would multiply it.
                    raise
                d = self.retry.delay(attempt=attempt, waited=waited, method=method, replayable=replayable,
                                     connection_refused=isinstance(cause, ConnectionRefusedError))
            if d is None or not _pause(d):
                raise err
            waited += d

    def _attempt(self, method: str, path: str, *, query: Optional[Mapping[str, str]],
                 body: Union[bytes, BinaryIO, None], content_type: Optional[str],
                 headers: Optional[Mapping[str, str]], timeout: Optional[float]) -> http.client.HTTPResponse:
        """Sends a request once (_open's doc)."""
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        req = urllib.request.Request(url, data=body, method=method)
        if content_type:
            req.add_header("Content-Type", content_type)
        if self.api_key:
            req.add_header("Authorization", "Bearer " + self.api_key)
        if self.user_agent:
            req.add_header("User-Agent", self.user_agent)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        timeout = timeout if timeout is not None else self.timeout
        if isinstance(body, (bytes, bytearray)) and len(body) > _EXPECT_CONTINUE_BYTES:
            return self._open_expecting(method, path, url, bytes(body), dict(req.header_items()), timeout)
        try:
            return cast(http.client.HTTPResponse, self._opener.open(req, timeout=timeout))
        except urllib.error.HTTPError as e:
            try:
                raise _decode_error(method, path, e.code, e.headers, e.read(_MAX_ERROR_BODY)) from None
            finally:
                e.close()
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", e)
            raise MoatConnectionError("%s %s: %s" % (method, path, reason)) from e

    def _open_expecting(self, method: str, path: str, url: str, body: bytes, headers: Mapping[str, str],
                        timeout: Optional[float]) -> http.client.HTTPResponse:
        """Sends a request with a large body as _open does, but asks
        first (Expect: 100-continue): a request the server refuses before
        reading the body (over --max-body, a bad key) is answered without
        the body being sent. http.client alone sends the whole body before
        it reads the answer, and a server that stopped reading resets the
        connection under it: the caller saw "Connection reset by peer"
        instead of the 413. A server that says nothing within a second
        gets the body anyway, and an answer that arrives while the body is
        being refused is still read."""
        u = urllib.parse.urlsplit(url)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        conn = cls(u.netloc, timeout=timeout) if timeout is not None else cls(u.netloc)
        resp: http.client.HTTPResponse
        selector = (u.path or "/") + ("?" + u.query if u.query else "")
        try:
            conn.putrequest(method, selector, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.putheader("Content-Length", str(len(body)))
            conn.putheader("Expect", "100-continue")
            conn.endheaders()
            sock = conn.sock
            fp = sock.makefile("rb")
            send = True
            r, _, _ = select.select([sock], [], [], _EXPECT_CONTINUE_WAIT)
            if r or getattr(sock, "pending", lambda: 0)():
                first = fp.peek(12)[:12]
                if first[:9] in (b"HTTP/1.1 ", b"HTTP/1.0 ") and first[9:12] == b"100":
                    # The interim answer: read it; the final one follows
                    # the body.
                    while fp.readline(_MAX_LINE) not in (b"\r\n", b"\n", b""):
                        pass
                else:
                    send = False  # the final answer, before the body
            if send:
                try:
                    sock.sendall(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the server stopped reading; its answer may be there
            resp = http.client.HTTPResponse(cast(socket.socket, _Buffered(fp)), method=method, url=url)
            resp.begin()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise MoatConnectionError("%s %s: %s" % (method, path, e)) from e
        conn.close()  # the response keeps the socket until it is closed
        if not 200 <= resp.status <= 299:
            try:
                raise _decode_error(method, path, resp.status, resp.headers, resp.read(_MAX_ERROR_BODY)) from None
            finally:
                resp.close()
        return resp

    def _json(self, method: str, path: str, body: Any = None, *,
              query: Optional[Mapping[str, str]] = None) -> Any:
        data = None
        ctype = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            ctype = "application/json"
        resp = self._open(method, path, query=query, body=data, content_type=ctype,
                          headers={"Accept": "application/json"})
        with resp:
            try:
                raw = resp.read()
            except (OSError, http.client.HTTPException) as e:
                raise MoatConnectionError("%s %s: read the answer: %s" % (method, path, e)) from e
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise MoatConnectionError("%s %s: the answer is not JSON: %s" % (method, path, e)) from e

    # -- API ------------------------------------------------------------

    def health(self) -> Health:
        """GET /v1/health: {"status": "ok", "version": ...}. Needs no key."""
        return cast(Health, self._json("GET", "/v1/health"))

    def run(self, argv: Optional[Iterable[str]] = None, *, code: Optional[str] = None,
            language: Optional[str] = None, manifest: Optional[ManifestArg] = None,
            files: Optional[Files] = None, stdin: Union[bytes, str, None] = None) -> RunResponse:
        """A one-shot run (POST /v1/runs): a fresh sandbox, one program,
        destroyed afterwards. Give argv, or code with language ("python",
        "bash", "sh"). manifest is a dict (or JSON text) in the manifest's
        JSON form; omitted fields take the defaults. Returns {"id",
        "pooled", "result"}."""
        body: Dict[str, Any] = {}
        m = _manifest(manifest)
        if m is not None:
            body["manifest"] = m
        if argv is not None:
            body["argv"] = list(argv)
        if code is not None:
            body["code"] = code
        if language is not None:
            body["language"] = language
        f = _files(files)
        if f:
            body["files"] = f
        if stdin is not None and len(stdin) > 0:
            body["stdin"], enc = _encode_bytes(stdin)
            if enc:
                body["stdin_encoding"] = enc
        return cast(RunResponse, self._json("POST", "/v1/runs", body))

    def list_approvals(self) -> List[Approval]:
        """GET /v1/approvals: the key's runs and commands held for approval."""
        return _list(self._json("GET", "/v1/approvals"), "approvals")

    def decide_approval(self, approval_id: str, approve: bool, reason: str = "") -> ApprovalOutcome:
        """POST /v1/approvals/{id}: approve or deny a held run or command;
        reason goes to the audit log. Returns {"approval"} and, when
        approved, "run" (the held run, ended) or "exec" (the held command,
        running)."""
        body: Dict[str, Any] = {"approve": bool(approve)}
        if reason:
            body["reason"] = reason
        return cast(ApprovalOutcome, self._json("POST", "/v1/approvals/" + _seg(approval_id), body))

    def get_run(self, run_id: str) -> RunResponse:
        """GET /v1/runs/{id}: a finished run again, while the server keeps it."""
        return cast(RunResponse, self._json("GET", "/v1/runs/" + _seg(run_id)))

    def create_sandbox(self, manifest: Optional[ManifestArg] = None, *, ttl: Optional[Duration] = None,
                       files: Optional[Files] = None,
                       metadata: Optional[Mapping[str, str]] = None) -> "Sandbox":
        """POST /v1/sandboxes: a sandbox that lives across commands until
        deleted or its ttl ("10m", or seconds) passes."""
        body: Dict[str, Any] = {}
        m = _manifest(manifest)
        if m is not None:
            body["manifest"] = m
        if ttl is not None:
            body["ttl"] = _duration(ttl)
        f = _files(files)
        if f:
            body["files"] = f
        if metadata:
            body["metadata"] = dict(metadata)
        return Sandbox(self, self._json("POST", "/v1/sandboxes", body))

    def list_sandboxes(self) -> List["Sandbox"]:
        """GET /v1/sandboxes: the caller's sandboxes."""
        return [Sandbox(self, d) for d in _list(self._json("GET", "/v1/sandboxes"), "sandboxes", "items")]

    def get_sandbox(self, sandbox_id: str) -> "Sandbox":
        """GET /v1/sandboxes/{id}. Another key's sandbox is a 404."""
        return Sandbox(self, self._json("GET", "/v1/sandboxes/" + _seg(sandbox_id)))

    def sandbox(self, sandbox_id: str) -> "Sandbox":
        """A handle to sandbox_id without asking the server."""
        return Sandbox(self, {"id": sandbox_id})

    def delete_sandbox(self, sandbox_id: str) -> SandboxInfo:
        """DELETE /v1/sandboxes/{id}: destroy it now; returns its final
        state ("deleted")."""
        return cast(SandboxInfo, self._json("DELETE", "/v1/sandboxes/" + _seg(sandbox_id)))

    def set_timeout(self, sandbox_id: str, ttl: Duration) -> SandboxInfo:
        """POST /v1/sandboxes/{id}/timeout: expire ttl from now. Returns the
        sandbox (read back when the server answers without a body)."""
        doc = self._json("POST", "/v1/sandboxes/%s/timeout" % _seg(sandbox_id), {"ttl": _duration(ttl)})
        if not doc:
            doc = self._json("GET", "/v1/sandboxes/" + _seg(sandbox_id))
        return cast(SandboxInfo, doc)


def _not_held(doc: Any) -> Exec:
    if isinstance(doc, dict) and isinstance(doc.get("approval"), dict):
        raise MoatHeld(cast(Approval, doc["approval"]))
    return cast(Exec, doc)


# Set by the asyncio client around each call it runs in a thread: set
# when the awaiting task is cancelled, so that a retry's wait ends and no
# request is sent for a caller that is gone.
_CANCEL: "contextvars.ContextVar[Optional[threading.Event]]" = contextvars.ContextVar("moat_client_cancel",
                                                                                      default=None)


def _pause(seconds: float) -> bool:
    """Waits before a retry; False when the call was cancelled meanwhile."""
    ev = _CANCEL.get()
    if ev is None:
        time.sleep(seconds)
        return True
    return not ev.wait(seconds)


def _seg(s: str) -> str:
    """One escaped path segment."""
    return urllib.parse.quote(s, safe="")


def _decode_error(method: str, path: str, status: int, headers: Any,
                  data: bytes) -> MoatError:
    rid = (headers.get("X-Request-ID") if headers else None) or ""
    retry_after = parse_retry_after(headers)
    try:
        doc = json.loads(data)
        err = doc.get("error") if isinstance(doc, dict) else None
    except ValueError:
        err = None
    if isinstance(err, dict) and err.get("message"):
        return MoatError(status, err.get("code") or "", err.get("message") or "", err.get("field") or "",
                         err.get("request_id") or rid, method, path, retry_after)
    msg = http.client.responses.get(status, "HTTP %d" % status)
    text = data.decode("utf-8", "replace").strip()
    if text:
        msg += ": %r" % (text[:200] + ("..." if len(text) > 200 else ""))
    return MoatError(status, "", msg, "", rid, method, path, retry_after)


class _Buffered:
    """A socket's stand-in for http.client.HTTPResponse that hands it the
    buffered reader already used to look at the interim answer."""

    def __init__(self, fp: IO[bytes]):
        self._fp = fp

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> IO[bytes]:
        return self._fp


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: Any, newurl: str) -> None:
        return None


class Sandbox:
    """A sandbox's state as the server reported it (``info``, a dict; ``id``)
    and a handle for acting on it."""

    def __init__(self, client: Client, info: Optional[SandboxInfo]):
        self.client = client
        self.info: SandboxInfo = info or {}
        self.id: str = self.info.get("id", "")
        if not self.id:
            raise ValueError("the sandbox has no id")

    def __repr__(self) -> str:
        return "Sandbox(%r, state=%r)" % (self.id, self.info.get("state"))

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.delete()
        except MoatError as e:
            if e.status != 404:
                raise

    def _path(self, rest: str = "") -> str:
        return "/v1/sandboxes/" + _seg(self.id) + rest

    def _exec_path(self, exec_id: str, rest: str = "") -> str:
        return self._path("/execs/" + _seg(exec_id) + rest)

    def delete(self) -> SandboxInfo:
        """Destroy the sandbox now; returns its final state."""
        self.info = self.client.delete_sandbox(self.id) or self.info
        return self.info

    def set_timeout(self, ttl: Duration) -> SandboxInfo:
        """Expire ttl ("5m", or seconds) from now."""
        self.info = self.client.set_timeout(self.id, ttl)
        return self.info

    def refresh(self) -> SandboxInfo:
        """Read the sandbox's state again."""
        self.info = self.client.get_sandbox(self.id).info
        return self.info

    def exec(self, argv: Optional[Iterable[str]] = None, *, code: Optional[str] = None,
             language: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
             dir: Optional[str] = None, timeout: Optional[Duration] = None,
             stdin: Union[bytes, str, None] = None, stdin_open: bool = False) -> Exec:
        """Run a command and wait for it to end ("wait": true); returns the
        finished Exec, whose "result" holds exit_code, stdout, stderr..."""
        return _not_held(self.client._json("POST", self._path("/execs"),
                                           _exec_body(argv, code, language, env, dir, timeout, stdin, stdin_open, True)))

    def start(self, argv: Optional[Iterable[str]] = None, *, code: Optional[str] = None,
              language: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
              dir: Optional[str] = None, timeout: Optional[Duration] = None,
              stdin: Union[bytes, str, None] = None, stdin_open: bool = False,
              tty: Optional[TTYArg] = None) -> Exec:
        """Start a command and return at once ("wait": false) with the Exec
        in state "running"; follow it with events() or get_exec(). tty,
        (rows, cols), starts it on a terminal (native tier): write_stdin
        types into it, all it shows is its stdout, resize() resizes it."""
        return _not_held(self.client._json("POST", self._path("/execs"),
                                           _exec_body(argv, code, language, env, dir, timeout, stdin, stdin_open,
                                                      False, tty)))

    def get_exec(self, exec_id: str) -> Exec:
        """One command, running or ended."""
        return cast(Exec, self.client._json("GET", self._exec_path(exec_id)))

    def list_execs(self) -> List[Exec]:
        """The sandbox's commands, running and ended."""
        return _list(self.client._json("GET", self._path("/execs")), "execs", "items")

    def events(self, exec_id: str, after: int = 0) -> "EventStream":
        """The command's output as events, after event ``after``; resumes
        by itself (Last-Event-ID) when the connection drops, so each event
        comes once, in order. Iterate it; close it (or use ``with``) to stop
        early."""
        return EventStream(self.client, self._exec_path(exec_id, "/events"), after)

    def stream(self, exec_id: str, stdout: Optional[IO[bytes]] = None,
               stderr: Optional[IO[bytes]] = None) -> Exec:
        """Copy the command's output to the binary file objects stdout and
        stderr (None drops it) as it comes; returns the finished Exec."""
        with self.events(exec_id) as st:
            for ev in st:
                if ev.type == "exit" and ev.exec is not None:
                    return ev.exec
                w = stdout if ev.type == "stdout" else stderr if ev.type == "stderr" else None
                if w is not None and ev.data:
                    w.write(ev.data)
                    w.flush()
        raise MoatConnectionError("the event stream of exec %s ended before its exit" % exec_id)

    def write_stdin(self, exec_id: str, data: Union[bytes, str]) -> None:
        """Append data to the stdin of a command started with stdin_open."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        self.client._open("POST", self._exec_path(exec_id, "/stdin"), body=data,
                          content_type="application/octet-stream").close()

    def close_stdin(self, exec_id: str) -> None:
        """Close the command's stdin: it reads end of file."""
        self.client._open("POST", self._exec_path(exec_id, "/stdin"), query={"eof": "1"}, body=b"",
                          content_type="application/octet-stream").close()

    def signal(self, exec_id: str, signal: Union[str, int]) -> None:
        """Send a signal, by name ("SIGTERM") or number (15)."""
        self.client._json("POST", self._exec_path(exec_id, "/signal"), {"signal": str(signal)})

    def resize(self, exec_id: str, rows: int, cols: int) -> Exec:
        """Set the terminal size of a command started with tty."""
        return cast(Exec, self.client._json("POST", self._exec_path(exec_id, "/resize"), _tty((rows, cols))))

    def run_cell(self, code: str, *, context: Optional[str] = None, language: Optional[str] = None,
                 timeout: Optional[Duration] = None) -> Cell:
        """Run one cell in the sandbox's stateful kernel and wait for it:
        variables, imports and files persist from cell to cell. Returns the
        Cell: "outputs" in order, "result" (the last expression's MIME
        bundle), "error" (name, value, traceback) when the code raised."""
        body: Dict[str, Any] = {"code": code}
        if context:
            body["context"] = context
        if language:
            body["language"] = language
        if timeout is not None:
            body["timeout"] = _duration(timeout)
        return cast(Cell, self.client._json("POST", self._path("/cells"), body))

    def interrupt_kernel(self, context: Optional[str] = None) -> Dict[str, Any]:
        """Interrupt the running cell, as ^C would; the kernel's state stays."""
        return cast(Dict[str, Any], self.client._json("POST", self._path("/kernel/interrupt"), {},
                                                      query={"context": context} if context else None))

    def restart_kernel(self, context: Optional[str] = None) -> Dict[str, Any]:
        """End the kernel: its variables are lost, files stay; the next
        cell starts a fresh one."""
        return cast(Dict[str, Any], self.client._json("POST", self._path("/kernel/restart"), {},
                                                      query={"context": context} if context else None))

    def upload(self, path: str, data: Union[bytes, str, BinaryIO], mode: Union[int, str, None] = None) -> None:
        """Write data (bytes, text or a binary file object, streamed) to
        path under /workspace, creating parents; mode as in File."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        query = {"path": path}
        m = _mode(mode)
        if m:
            query["mode"] = m
        self.client._open("PUT", self._path("/files"), query=query, body=data,
                          content_type="application/octet-stream").close()

    def open(self, path: str) -> http.client.HTTPResponse:
        """The file at path as a binary file object (the HTTP response,
        streamed); close it, or use it with ``with``."""
        return self.client._open("GET", self._path("/files"), query={"path": path})

    def download(self, path: str) -> bytes:
        """The content of the file at path. For a directory the server
        answers with its JSON listing: use list() for those."""
        with self.open(path) as resp:
            return resp.read()

    def list(self, dir: str = ".") -> List[FileInfo]:
        """The entries of directory dir ("." is /workspace): dicts with
        name, path, type, size, mode, modified, target."""
        return _list(self.client._json("GET", self._path("/files"), query={"path": dir or "."}),
                     "entries", "files", "items")

    def remove(self, path: str) -> None:
        """Remove path, a directory with everything in it."""
        self.client._json("DELETE", self._path("/files"), query={"path": path})


class EventStream:
    """Iterates the events of one command, reconnecting with Last-Event-ID
    (and ?after=, the same value) when the connection drops before the
    exit event. ``last_id`` is where a later events() call would resume."""

    def __init__(self, client: Client, path: str, after: int = 0):
        if after < 0:
            raise ValueError("after must be 0 or more")
        self._client = client
        self._path = path
        self.last_id = after
        self._resp: Optional[http.client.HTTPResponse] = None
        self._parser: Optional[_SSEParser] = None
        # Held while a thread reads the response: close() from another
        # thread must not close it under the reader (http.client is not
        # thread-safe), only shut its socket down so the read returns.
        self._reading = threading.Lock()
        self._done = False
        self._fails = 0
        self._delay = client.reconnect_delay
        self._dropped: Optional[BaseException] = None
        self._connect()

    def __iter__(self) -> Iterator[Event]:
        return self

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the stream and its connection. Another thread blocked
        reading the stream (the asyncio client's) returns at once."""
        self._done = True
        resp = self._resp
        if resp is not None:
            _shutdown(resp)
        if self._reading.acquire(blocking=False):
            try:
                self._drop()
            finally:
                self._reading.release()
        # else the reader sees the end of the answer and drops it itself.

    def _drop(self) -> None:
        if self._resp is not None:
            try:
                self._resp.close()
            except Exception:
                pass
            self._resp = None

    def _connect(self) -> None:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        query = None
        if self.last_id > 0:
            headers["Last-Event-ID"] = str(self.last_id)
            query = {"after": str(self.last_id)}
        resp = self._client._open("GET", self._path, query=query, headers=headers)
        ctype = resp.headers.get("Content-Type", "")
        if ctype and ctype.split(";")[0].strip() != "text/event-stream":
            resp.close()
            raise MoatError(resp.status, "", "the answer is %s, not an event stream (text/event-stream)" % ctype,
                            method="GET", path=self._path)
        self._resp = resp
        self._parser = _SSEParser(resp)

    def _reconnect(self) -> None:
        while True:
            if self._fails >= self._client.reconnect_attempts:
                tried = ("%d reconnection(s) failed" % self._fails) if self._fails else "reconnecting is disabled"
                raise MoatConnectionError("GET %s: the stream ended before the exit event (after event %d; %s): %s"
                                          % (self._path, self.last_id, tried, self._dropped or "end of stream")) from self._dropped
            time.sleep(min(self._delay * (2 ** self._fails), _MAX_RETRY_DELAY))
            self._fails += 1
            try:
                self._connect()
                return
            except MoatError as e:
                if e.status not in (502, 503, 504):
                    raise
                self._dropped = e
            except MoatConnectionError as e:
                self._dropped = e

    def __next__(self) -> Event:
        while True:
            if self._done:
                raise StopIteration
            if self._resp is None or self._parser is None:
                self._reconnect()
                continue
            try:
                with self._reading:
                    raw = self._parser.next()
            except _TooLarge as e:
                self.close()
                raise MoatConnectionError("GET %s: %s" % (self._path, e)) from None
            except (OSError, http.client.HTTPException, ValueError) as e:
                # ValueError: reading a response closed by close().
                raw, self._dropped = None, e
            if raw is None:
                self._drop()
                if self._done:
                    raise StopIteration
                if self._dropped is None:
                    self._dropped = EOFError("the answer ended")
                continue
            ev_id, ev_type, data, retry, dispatch = raw
            if retry:
                self._delay = retry
            if not dispatch:
                self.last_id = max(self.last_id, ev_id)
                continue
            try:
                ev = _decode_event(ev_id, ev_type, data)
            except ValueError:
                self.close()
                raise
            if ev.id > 0:
                if ev.id <= self.last_id:
                    continue  # already delivered before a reconnection
                self.last_id = ev.id
            self._fails = 0
            self._dropped = None
            if ev.type == "exit":
                self.close()
            return ev


def _decode_event(ev_id: int, ev_type: str, data: str) -> Event:
    ev = Event(id=ev_id, type=ev_type, raw=data)
    if ev_type in ("stdout", "stderr"):
        try:
            chunk = json.loads(data)
            ev.data = stream_bytes(chunk)
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError("event %d: decode %s data: %s" % (ev_id, ev_type, e)) from None
    elif ev_type == "exit":
        try:
            ev.exec = json.loads(data)
        except ValueError as e:
            raise ValueError("event %d: decode the exit event: %s" % (ev_id, e)) from None
        if not isinstance(ev.exec, dict):
            raise ValueError("event %d: the exit event is not an Exec object" % ev_id)
    return ev


def _shutdown(resp: http.client.HTTPResponse) -> None:
    """Shuts the socket of a response down, so that a read blocked on it
    in another thread returns (closing the file object does not wake it)."""
    raw = getattr(resp.fp, "raw", None)
    sock = getattr(raw, "_sock", None)
    if isinstance(sock, socket.socket):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _TooLarge(Exception):
    pass


class _SSEParser:
    """Parses text/event-stream (WHATWG "server-sent events"): lines end
    with LF, CRLF or CR; "field: value"; data lines join with LF; a blank
    line dispatches; ':' starts a comment."""

    def __init__(self, resp: http.client.HTTPResponse):
        self._resp = resp
        self._buf = b""
        self._skip_lf = False
        self._first = True
        self._eof = False

    def _line(self) -> Optional[bytes]:
        """One line without its terminator, or None at the end of the
        answer (an unterminated last line is dropped, as the spec says)."""
        while True:
            if self._skip_lf and self._buf:
                if self._buf[:1] == b"\n":
                    self._buf = self._buf[1:]
                self._skip_lf = False
            lf, cr = self._buf.find(b"\n"), self._buf.find(b"\r")
            i = min(lf, cr) if lf >= 0 and cr >= 0 else max(lf, cr)
            if i >= 0:
                line, self._buf = self._buf[:i], self._buf[i + 1:]
                self._skip_lf = i == cr
                return line
            if len(self._buf) > _MAX_EVENT_BYTES:
                raise _TooLarge("an event is larger than %d bytes" % _MAX_EVENT_BYTES)
            if self._eof:
                return None
            chunk = self._resp.read1(65536) if hasattr(self._resp, "read1") else self._resp.read(1)
            if not chunk:
                self._eof = True
                continue
            self._buf += chunk

    def next(self) -> Optional[Tuple[int, str, str, float, bool]]:
        """The next block as (id, type, data, retry seconds, dispatch), or
        None at the end of the answer."""
        ev_id, ev_type, retry = 0, "", 0.0
        data: List[str] = []
        size = 0
        while True:
            line = self._line()
            if line is None:
                return None
            if self._first:
                self._first = False
                if line.startswith(b"\xef\xbb\xbf"):
                    line = line[3:]
            if not line:
                if data:
                    return ev_id, ev_type or "message", "\n".join(data), retry, True
                if ev_id or retry:
                    return ev_id, "", "", retry, False
                ev_type = ""
                continue
            if line[:1] == b":":
                continue
            field, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            text = value.decode("utf-8", "replace")
            if field == b"event":
                ev_type = text
            elif field == b"data":
                size += len(value) + 1
                if size > _MAX_EVENT_BYTES:
                    raise _TooLarge("an event is larger than %d bytes" % _MAX_EVENT_BYTES)
                data.append(text)
            elif field == b"id":
                if text.isascii() and text.isdigit():
                    ev_id = int(text)
            elif field == b"retry":
                if text.isascii() and text.isdigit() and int(text) > 0:
                    retry = int(text) / 1000.0
