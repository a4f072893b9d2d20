"""Tests of moat_client against a fake of the API of docs/API.md, served by
http.server in a thread. Run: python3 -m unittest discover -s clients/python -v
"""

import io
import json
import os
import socket
import sys
import threading
import time
import unittest
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import moat_client  # noqa: E402
from moat_client import Client, File, MoatConnectionError, MoatError  # noqa: E402

KEY = "moat_k1_secret"


APPROVAL = {"id": "ap-1", "state": "pending", "sandbox_id": "sb-1", "argv": ["sh", "x"],
            "effects": [{"kind": "exec-fetched", "detail": "runs x, fetched from h", "commands": [0]}],
            "created_at": "2026-01-02T03:04:05Z", "expires_at": "2026-01-02T03:09:05Z"}


def held(call):
    """The MoatHeld that call raises (a case fails when it returns)."""
    try:
        got = call()
    except moat_client.MoatHeld as e:
        return e
    raise AssertionError("no MoatHeld; got %r" % (got,))


class Seen:
    """One request as the fake received it."""

    def __init__(self, method, path, query, headers, body):
        self.method = method
        self.path = path  # escaped, as on the wire
        self.query = query
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)


class _Cut(Exception):
    pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._handle()

    do_POST = do_PUT = do_DELETE = do_GET

    def _read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _handle(self):
        u = urllib.parse.urlsplit(self.path)
        seen = Seen(self.command, u.path, urllib.parse.parse_qs(u.query, keep_blank_values=True),
                    self.headers, self._read_body())
        fake = self.server.fake
        with fake.lock:
            fake.requests.append(seen)
        try:
            if not u.path.endswith("/v1/health") and self.headers.get("Authorization") != "Bearer " + KEY:
                self.error(401, "unauthenticated", "missing, unknown or revoked API key")
                return
            fake.handle(self, seen)
        except _Cut:
            pass
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- answers --

    def reply(self, status, body="", ctype="application/json", headers=None):
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, code, message, field="", headers=None):
        self.reply(status, {"error": {"code": code, "message": message, "field": field, "request_id": "r-test"}},
                   headers=headers)

    def sse_start(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def sse_write(self, text):
        data = text.encode("utf-8") if isinstance(text, str) else text
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def sse_end(self):
        """Ends the answer cleanly."""
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def cut(self):
        """Breaks the connection in the middle of the chunked answer."""
        self.wfile.flush()
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        raise _Cut()


class FakeAPI:
    """A stand-in for `moat serve`: checks credentials the way docs/API.md
    says (every route but /v1/health needs "Authorization: Bearer KEY"),
    records each request and answers with what the test set."""

    def __init__(self, handle):
        self.handle = handle
        self.lock = threading.Lock()
        self.requests = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.fake = self
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def client(self, **kw):
        return Client(self.url, KEY, **kw)

    def last(self):
        with self.lock:
            return self.requests[-1]


def canned(status, body="", ctype="application/json"):
    return lambda h, seen: h.reply(status, body, ctype)


SANDBOX = {"id": "sb-1", "state": "running", "tier": "native", "image": {"name": "python", "digest": "sha256:aa"},
           "manifest_digest": "sha256:bb", "created_at": "2026-01-02T03:04:05Z", "expires_at": "2026-01-02T03:14:05Z",
           "pooled": True, "metadata": {"k": "v"}, "execs": 3}
EXEC = {"id": "e-1", "sandbox_id": "sb-1", "state": "exited", "argv": ["echo", "hi"],
        "result": {"schema": 1, "termination": "exited", "exit_code": 0,
                   "stdout": {"data": "hi\n", "encoding": "utf-8", "bytes": 3}}}


class FakeTest(unittest.TestCase):
    def fake(self, handle):
        f = FakeAPI(handle)
        self.addCleanup(f.close)
        return f


class TestRequests(FakeTest):
    """Each method's request (method, path, query, headers, body) and the
    decoding of its answer."""

    def test_requests(self):
        sb = lambda c: c.sandbox("sb-1")  # noqa: E731
        cases = [
            dict(name="health", call=lambda c: c.health(), method="GET", path="/v1/health",
                 status=200, resp={"status": "ok", "version": "1.2.3"},
                 check=lambda got: self.assertEqual(got, {"status": "ok", "version": "1.2.3"})),
            dict(name="run with argv, a manifest dict, files and stdin",
                 call=lambda c: c.run(["python3", "main.py"], manifest={"resources": {"timeout": "10s", "memory": "256MiB"}},
                                      files=[File("main.py", "print('hi')"), File("bin/run", b"#!/bin/sh\n", 0o755)],
                                      stdin="optional text"),
                 method="POST", path="/v1/runs", ctype="application/json",
                 body={"manifest": {"resources": {"timeout": "10s", "memory": "256MiB"}}, "argv": ["python3", "main.py"],
                       "files": [{"path": "main.py", "content": "print('hi')"},
                                 {"path": "bin/run", "content": "#!/bin/sh\n", "mode": "0755"}],
                       "stdin": "optional text"},
                 status=200, resp={"id": "3f2a", "pooled": True, "result": {"termination": "exited", "exit_code": 3}},
                 check=lambda got: self.assertEqual((got["id"], got["pooled"], got["result"]["exit_code"]), ("3f2a", True, 3))),
            dict(name="run with code, manifest JSON text, binary file and stdin",
                 call=lambda c: c.run(code="print(6*7)", language="python", manifest='{"resources": {"timeout": "10s"}}',
                                      files={"data.bin": b"\x00\x01\x02\xff"}, stdin=b"\xff\xfe"),
                 method="POST", path="/v1/runs", ctype="application/json",
                 body={"manifest": {"resources": {"timeout": "10s"}}, "code": "print(6*7)", "language": "python",
                       "files": [{"path": "data.bin", "content": "AAEC/w==", "encoding": "base64"}],
                       "stdin": "//4=", "stdin_encoding": "base64"},
                 status=200, resp={"id": "r-2", "result": {"termination": "timeout", "exit_code": 124}},
                 check=lambda got: self.assertEqual(got["result"]["termination"], "timeout")),
            dict(name="get run escapes the id", call=lambda c: c.get_run("a/b?c"), method="GET", path="/v1/runs/a%2Fb%3Fc",
                 status=200, resp={"id": "a/b?c", "result": {}},
                 check=lambda got: self.assertEqual(got["id"], "a/b?c")),
            dict(name="create sandbox",
                 call=lambda c: c.create_sandbox({"image": "python"}, ttl="10m", files=[("a.txt", "A", "0600")],
                                                 metadata={"k": "v"}),
                 method="POST", path="/v1/sandboxes", ctype="application/json",
                 body={"manifest": {"image": "python"}, "ttl": "10m",
                       "files": [{"path": "a.txt", "content": "A", "mode": "0600"}], "metadata": {"k": "v"}},
                 status=201, resp=SANDBOX,
                 check=lambda got: self.assertEqual((got.id, got.info), ("sb-1", SANDBOX))),
            dict(name="create sandbox with defaults and a ttl in seconds", call=lambda c: c.create_sandbox(ttl=90),
                 method="POST", path="/v1/sandboxes", ctype="application/json", body={"ttl": "90s"},
                 status=201, resp=SANDBOX, check=lambda got: self.assertEqual(got.id, "sb-1")),
            dict(name="list sandboxes as an array", call=lambda c: c.list_sandboxes(), method="GET", path="/v1/sandboxes",
                 status=200, resp=[SANDBOX],
                 check=lambda got: self.assertEqual([s.id for s in got], ["sb-1"])),
            dict(name="list sandboxes as an object", call=lambda c: c.list_sandboxes(), method="GET", path="/v1/sandboxes",
                 status=200, resp={"sandboxes": [SANDBOX, SANDBOX]},
                 check=lambda got: self.assertEqual(len(got), 2)),
            dict(name="get sandbox", call=lambda c: c.get_sandbox("sb-1"), method="GET", path="/v1/sandboxes/sb-1",
                 status=200, resp=SANDBOX, check=lambda got: self.assertEqual(got.info["execs"], 3)),
            dict(name="delete sandbox", call=lambda c: sb(c).delete(), method="DELETE", path="/v1/sandboxes/sb-1",
                 status=200, resp={"id": "sb-1", "state": "deleted"},
                 check=lambda got: self.assertEqual(got["state"], "deleted")),
            dict(name="set timeout", call=lambda c: c.set_timeout("sb-1", "5m"), method="POST",
                 path="/v1/sandboxes/sb-1/timeout", ctype="application/json", body={"ttl": "5m"},
                 status=200, resp=SANDBOX, check=lambda got: self.assertEqual(got["id"], "sb-1")),
            dict(name="exec waits",
                 call=lambda c: sb(c).exec(["echo", "hi"], env={"A": "1"}, dir="sub", timeout="1m30s", stdin="in"),
                 method="POST", path="/v1/sandboxes/sb-1/execs", ctype="application/json",
                 body={"argv": ["echo", "hi"], "env": {"A": "1"}, "dir": "sub", "timeout": "1m30s", "stdin": "in", "wait": True},
                 status=200, resp=EXEC, check=lambda got: self.assertEqual(got, EXEC)),
            dict(name="start does not wait",
                 call=lambda c: sb(c).start(code="input()", language="python", stdin_open=True, timeout=1.5),
                 method="POST", path="/v1/sandboxes/sb-1/execs", ctype="application/json",
                 body={"code": "input()", "language": "python", "stdin_open": True, "timeout": "1.5s", "wait": False},
                 status=202, resp={"id": "e-2", "state": "running"},
                 check=lambda got: self.assertEqual(got["state"], "running")),
            dict(name="a held command raises MoatHeld", call=lambda c: held(lambda: sb(c).exec(["sh", "x"])),
                 method="POST", path="/v1/sandboxes/sb-1/execs", ctype="application/json",
                 body={"argv": ["sh", "x"], "wait": True}, status=202, resp={"approval": APPROVAL},
                 check=lambda got: self.assertEqual((got.approval["id"], "runs x, fetched from h" in str(got)), ("ap-1", True))),
            dict(name="list approvals", call=lambda c: c.list_approvals(), method="GET", path="/v1/approvals",
                 status=200, resp={"approvals": [APPROVAL]}, check=lambda got: self.assertEqual(got, [APPROVAL])),
            dict(name="approve", call=lambda c: c.decide_approval("ap/1", True, "read it"), method="POST",
                 path="/v1/approvals/ap%2F1", ctype="application/json", body={"approve": True, "reason": "read it"},
                 status=200, resp={"approval": dict(APPROVAL, state="approved"), "exec": {"id": "e-3", "state": "running"}},
                 check=lambda got: self.assertEqual(got["exec"]["id"], "e-3")),
            dict(name="deny", call=lambda c: c.decide_approval("ap-1", False), method="POST",
                 path="/v1/approvals/ap-1", ctype="application/json", body={"approve": False},
                 status=200, resp={"approval": dict(APPROVAL, state="denied")},
                 check=lambda got: self.assertEqual(got["approval"]["state"], "denied")),
            dict(name="get exec", call=lambda c: sb(c).get_exec("e-1"), method="GET", path="/v1/sandboxes/sb-1/execs/e-1",
                 status=200, resp=EXEC, check=lambda got: self.assertEqual(got["id"], "e-1")),
            dict(name="list execs", call=lambda c: sb(c).list_execs(), method="GET", path="/v1/sandboxes/sb-1/execs",
                 status=200, resp={"execs": [EXEC]}, check=lambda got: self.assertEqual(got, [EXEC])),
            dict(name="write stdin", call=lambda c: sb(c).write_stdin("e-1", "line\n"), method="POST",
                 path="/v1/sandboxes/sb-1/execs/e-1/stdin", ctype="application/octet-stream", raw=b"line\n", status=204),
            dict(name="close stdin", call=lambda c: sb(c).close_stdin("e-1"), method="POST",
                 path="/v1/sandboxes/sb-1/execs/e-1/stdin", query={"eof": ["1"]}, ctype="application/octet-stream",
                 raw=b"", status=200, resp={}),
            dict(name="signal", call=lambda c: sb(c).signal("e-1", "SIGTERM"), method="POST",
                 path="/v1/sandboxes/sb-1/execs/e-1/signal", ctype="application/json", body={"signal": "SIGTERM"},
                 status=200, resp={}),
            dict(name="start on a terminal", call=lambda c: sb(c).start(["bash", "-i"], stdin_open=True, tty=(24, 80)),
                 method="POST", path="/v1/sandboxes/sb-1/execs", ctype="application/json",
                 body={"argv": ["bash", "-i"], "stdin_open": True, "tty": {"rows": 24, "cols": 80}, "wait": False},
                 status=202, resp=dict(EXEC, tty={"rows": 24, "cols": 80}),
                 check=lambda got: self.assertEqual(got["tty"], {"rows": 24, "cols": 80})),
            dict(name="resize", call=lambda c: sb(c).resize("e-1", 40, 132), method="POST",
                 path="/v1/sandboxes/sb-1/execs/e-1/resize", ctype="application/json", body={"rows": 40, "cols": 132},
                 status=200, resp=EXEC),
            dict(name="run a cell", call=lambda c: sb(c).run_cell("x = 1\nx + 1", context="k-2", timeout=5),
                 method="POST", path="/v1/sandboxes/sb-1/cells", ctype="application/json",
                 body={"code": "x = 1\nx + 1", "context": "k-2", "timeout": "5s"},
                 status=200, resp={"id": "c-1", "status": "ok", "outputs": [], "result": {"text/plain": "2"}},
                 check=lambda got: self.assertEqual(got["result"]["text/plain"], "2")),
            dict(name="restart a kernel", call=lambda c: sb(c).restart_kernel("k-2"), method="POST",
                 path="/v1/sandboxes/sb-1/kernel/restart", query={"context": ["k-2"]}, ctype="application/json", body={},
                 status=200, resp={"context": "k-2", "state": "none"}),
            dict(name="interrupt the default kernel", call=lambda c: sb(c).interrupt_kernel(), method="POST",
                 path="/v1/sandboxes/sb-1/kernel/interrupt", ctype="application/json", body={},
                 status=200, resp={"context": "default", "state": "idle"}),
            dict(name="upload", call=lambda c: sb(c).upload("dir/run.sh", "#!/bin/sh\necho hi\n", 0o755), method="PUT",
                 path="/v1/sandboxes/sb-1/files", query={"path": ["dir/run.sh"], "mode": ["0755"]},
                 ctype="application/octet-stream", raw=b"#!/bin/sh\necho hi\n", status=201, resp={"path": "dir/run.sh"}),
            dict(name="upload a file object, streamed", call=lambda c: sb(c).upload("a b&c.bin", io.BytesIO(b"\x00\x01\x02")),
                 method="PUT", path="/v1/sandboxes/sb-1/files", query={"path": ["a b&c.bin"]},
                 ctype="application/octet-stream", raw=b"\x00\x01\x02", status=204),
            dict(name="download", call=lambda c: sb(c).download("out/result.bin"), method="GET",
                 path="/v1/sandboxes/sb-1/files", query={"path": ["out/result.bin"]},
                 status=200, resp=b"\x00binary\xff", resp_ctype="application/octet-stream",
                 check=lambda got: self.assertEqual(got, b"\x00binary\xff")),
            dict(name="list a directory", call=lambda c: sb(c).list(), method="GET", path="/v1/sandboxes/sb-1/files",
                 query={"path": ["."]}, status=200,
                 resp=[{"name": "a.txt", "path": "a.txt", "type": "file", "size": 1, "mode": "0644"}],
                 check=lambda got: self.assertEqual(got[0]["name"], "a.txt")),
            dict(name="list a directory answered as an object", call=lambda c: sb(c).list("sub"), method="GET",
                 path="/v1/sandboxes/sb-1/files", query={"path": ["sub"]}, status=200,
                 resp={"path": "sub", "entries": [{"name": "x", "path": "sub/x", "type": "dir"}]},
                 check=lambda got: self.assertEqual(got[0]["path"], "sub/x")),
            dict(name="remove", call=lambda c: sb(c).remove("tmp"), method="DELETE", path="/v1/sandboxes/sb-1/files",
                 query={"path": ["tmp"]}, status=204),
        ]
        for tc in cases:
            with self.subTest(tc["name"]):
                f = self.fake(canned(tc["status"], tc.get("resp", ""), tc.get("resp_ctype", "application/json")))
                got = tc["call"](f.client())
                self.assertEqual(len(f.requests), 1)
                req = f.requests[0]
                self.assertEqual((req.method, req.path), (tc["method"], tc["path"]))
                self.assertEqual(req.query, tc.get("query", {}))
                self.assertEqual(req.headers.get("Authorization"), "Bearer " + KEY)
                self.assertEqual(req.headers.get("Content-Type"), tc.get("ctype"))
                if "body" in tc:
                    self.assertEqual(req.json(), tc["body"])
                elif "raw" in tc:
                    self.assertEqual(req.body, tc["raw"])
                if "check" in tc:
                    tc["check"](got)

    def test_refused_locally(self):
        cases = [
            ("manifest JSON that is not an object", lambda c: c.run(["true"], manifest="[1]"), ValueError),
            ("manifest text that is not JSON", lambda c: c.create_sandbox("{image: python}"), ValueError),
            ("file without a path", lambda c: c.run(["true"], files=[File("", "x")]), ValueError),
            ("mode that is not octal", lambda c: c.sandbox("sb-1").upload("x", b"", "rwx"), ValueError),
            ("negative duration", lambda c: c.sandbox("sb-1").exec(["true"], timeout=-1), ValueError),
            ("negative after", lambda c: c.sandbox("sb-1").events("e-1", after=-1), ValueError),
        ]
        for name, call, exc in cases:
            with self.subTest(name):
                f = self.fake(canned(200, {}))
                with self.assertRaises(exc):
                    call(f.client())
                self.assertEqual(f.requests, [])

    def test_new(self):
        for url, ok in [("http://127.0.0.1:7070", True), ("https://moat.example/api/", True), ("", False),
                        ("127.0.0.1:7070", False), ("ftp://host", False), ("http://", False),
                        ("http://host/?key=x", False), ("http://me:pw@host", False)]:
            with self.subTest(url):
                if ok:
                    Client(url, KEY)
                else:
                    with self.assertRaises(ValueError):
                        Client(url, KEY)
        with self.assertRaises(ValueError):
            Client("http://host", "k\r\nX-Evil: 1")

    def test_path_prefix_and_no_key(self):
        f = self.fake(canned(200, {"status": "ok"}))
        Client(f.url + "/moat/", None, user_agent="test-agent/1").health()
        req = f.last()
        self.assertEqual(req.path, "/moat/v1/health")
        self.assertIsNone(req.headers.get("Authorization"))
        self.assertEqual(req.headers.get("User-Agent"), "test-agent/1")


class TestErrors(FakeTest):
    def test_errors(self):
        cases = [
            ("invalid field",
             lambda h, s: h.error(400, "invalid_field", "resources.memory: 99TiB is above the maximum 64GiB",
                                  "manifest.resources.memory"),
             lambda c: c.run(["true"], manifest={"resources": {"memory": "99TiB"}}),
             (400, "invalid_field", "resources.memory: 99TiB is above the maximum 64GiB", "manifest.resources.memory",
              "r-test", "POST", "/v1/runs"),
             ["POST /v1/runs", "400 invalid_field", "(field: manifest.resources.memory)", "r-test"]),
            ("another key's sandbox", lambda h, s: h.error(404, "not_found", "no sandbox sb-9"),
             lambda c: c.get_sandbox("sb-9"),
             (404, "not_found", "no sandbox sb-9", "", "r-test", "GET", "/v1/sandboxes/sb-9"), []),
            ("quota", lambda h, s: h.error(429, "quota_exceeded", "8 sandboxes are running"),
             lambda c: c.create_sandbox(),
             (429, "quota_exceeded", "8 sandboxes are running", "", "r-test", "POST", "/v1/sandboxes"), []),
            ("ended process", lambda h, s: h.error(409, "conflict", "the process already ended"),
             lambda c: c.sandbox("sb-1").signal("e-1", 9),
             (409, "conflict", "the process already ended", "", "r-test", "POST", "/v1/sandboxes/sb-1/execs/e-1/signal"), []),
            ("missing file", lambda h, s: h.error(404, "not_found", "no such file: out.txt", "path"),
             lambda c: c.sandbox("sb-1").download("out.txt"),
             (404, "not_found", "no such file: out.txt", "path", "r-test", "GET", "/v1/sandboxes/sb-1/files"), []),
            ("request id from the header",
             lambda h, s: h.reply(500, {"error": {"code": "internal", "message": "Moat failed"}}, headers={"X-Request-ID": "r-hdr"}),
             lambda c: c.health(), (500, "internal", "Moat failed", "", "r-hdr", "GET", "/v1/health"), []),
            ("a proxy's error page", lambda h, s: h.reply(502, "<html>upstream down</html>", "text/html"),
             lambda c: c.health(), (502, "", "Bad Gateway: '<html>upstream down</html>'", "", "", "GET", "/v1/health"),
             ["502", "Bad Gateway", "upstream down"]),
        ]
        for name, handle, call, want, in_msg in cases:
            with self.subTest(name):
                f = self.fake(handle)
                with self.assertRaises(MoatError) as cm:
                    call(f.client())
                e = cm.exception
                self.assertEqual((e.status, e.code, e.message, e.field, e.request_id, e.method, e.path), want)
                for s in in_msg:
                    self.assertIn(s, str(e))

    def test_wrong_key(self):
        f = self.fake(lambda h, s: self.fail("the fake let a wrong key through"))
        with self.assertRaises(MoatError) as cm:
            Client(f.url, "moat_k1_wrong").list_sandboxes()
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthenticated"))

    def test_transport_error(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        with self.assertRaises(MoatConnectionError) as cm:
            Client("http://127.0.0.1:%d" % port, KEY).sandbox("sb-1").get_exec("e-1")
        self.assertIn("GET /v1/sandboxes/sb-1/execs/e-1", str(cm.exception))
        self.assertNotIsInstance(cm.exception, MoatError)

    def test_timeout(self):
        release = threading.Event()
        self.addCleanup(release.set)
        f = self.fake(lambda h, s: release.wait(10))
        start = time.monotonic()
        with self.assertRaises(MoatConnectionError) as cm:
            f.client(timeout=0.2).sandbox("sb-1").exec(["sleep", "100"])
        self.assertLess(time.monotonic() - start, 5)
        self.assertIn("POST /v1/sandboxes/sb-1/execs", str(cm.exception))


EVENTS_PATH = "/v1/sandboxes/sb-1/execs/e-1/events"
EXIT = 'id: 9\nevent: exit\ndata: {"id": "e-1", "state": "exited", "result": {"exit_code": 3}}\n\n'


def collect(st):
    out = []
    for ev in st:
        if ev.type in ("stdout", "stderr"):
            out.append((ev.id, ev.type, ev.data))
        elif ev.type == "exit":
            out.append((ev.id, "exit", ev.exec["result"]["exit_code"]))
        else:
            out.append((ev.id, ev.type, ev.raw))
    return out


def sse_body(body):
    def handle(h, seen):
        h.sse_start()
        h.sse_write(body)
        h.sse_end()
    return handle


class TestEventParsing(FakeTest):
    def test_parsing(self):
        cases = [
            ("stdout then exit", 'id: 1\nevent: stdout\ndata: {"data":"hello\\n","encoding":"utf-8"}\n\n' + EXIT,
             [(1, "stdout", b"hello\n"), (9, "exit", 3)]),
            ("multi-line data is joined with newlines",
             'id: 1\nevent: stdout\ndata: {"data":\ndata: "a\\nb",\ndata:  "encoding": "utf-8"}\n\n'
             'id: 2\nevent: exit\ndata: {"id": "e-1",\ndata:  "result": {"exit_code": 0}}\n\n',
             [(1, "stdout", b"a\nb"), (2, "exit", 0)]),
            ("CRLF line endings",
             ('id: 1\nevent: stderr\ndata: {"data":"oops"}\n\n' + EXIT).replace("\n", "\r\n"),
             [(1, "stderr", b"oops"), (9, "exit", 3)]),
            ("CR line endings", ('id: 1\nevent: stdout\ndata: {"data":"x"}\n\n' + EXIT).replace("\n", "\r"),
             [(1, "stdout", b"x"), (9, "exit", 3)]),
            ("comments, a BOM, no space after the colon, unknown fields",
             '\ufeff: keep-alive\n\nid:1\nevent:stdout\nfoo: bar\ndata:{"data":"y"}\n\n: ping\n\n' + EXIT,
             [(1, "stdout", b"y"), (9, "exit", 3)]),
            ("base64 output", 'id: 1\nevent: stdout\ndata: {"data":"AP8K","encoding":"base64"}\n\n' + EXIT,
             [(1, "stdout", b"\x00\xff\n"), (9, "exit", 3)]),
            ("an unknown event type is passed on raw", 'id: 1\nevent: progress\ndata: {"pct": 50}\n\n' + EXIT,
             [(1, "progress", '{"pct": 50}'), (9, "exit", 3)]),
            ("blocks without data dispatch nothing",
             'retry: 10\n\nid: 1\n\nevent: stdout\n\nid: 2\nevent: stdout\ndata: {"data":"z"}\n\n' + EXIT,
             [(2, "stdout", b"z"), (9, "exit", 3)]),
            ("nothing is read after the exit event", EXIT + 'id: 10\nevent: stdout\ndata: {"data":"late"}\n\n',
             [(9, "exit", 3)]),
        ]
        for name, body, want in cases:
            with self.subTest(name):
                f = self.fake(sse_body(body))
                with f.client(reconnect_attempts=0).sandbox("sb-1").events("e-1") as st:
                    self.assertEqual(collect(st), want)
                req = f.last()
                self.assertEqual(req.path, EVENTS_PATH)
                self.assertEqual(req.headers.get("Accept"), "text/event-stream")
                self.assertEqual(req.headers.get("Authorization"), "Bearer " + KEY)

    def test_bad_events(self):
        cases = [
            ("output data that is not JSON", "id: 1\nevent: stdout\ndata: hello\n\n", "decode stdout data"),
            ("bad base64", 'id: 1\nevent: stderr\ndata: {"data":"!!","encoding":"base64"}\n\n', "decode stderr data"),
            ("unknown encoding", 'id: 1\nevent: stdout\ndata: {"data":"x","encoding":"utf-16"}\n\n', "unknown encoding"),
            ("exit that is not an Exec", "id: 1\nevent: exit\ndata: [1]\n\n", "not an Exec"),
        ]
        for name, body, want in cases:
            with self.subTest(name):
                f = self.fake(sse_body(body))
                st = f.client().sandbox("sb-1").events("e-1")
                with self.assertRaises(ValueError) as cm:
                    next(st)
                self.assertIn(want, str(cm.exception))


class Stream:
    """The fake's side of one exec's events: n output events then the exit,
    numbered from 1, each connection cut as planned."""

    def __init__(self, n, cuts=(), mode="abort", ignore_resume=False):
        self.n = n
        self.cuts = list(cuts)  # events sent by connection i before it is cut
        self.mode = mode  # abort | eof | mid-event | mid-line
        self.ignore_resume = ignore_resume
        self.lock = threading.Lock()
        self.resumes = []  # Last-Event-ID of each connection
        self.afters = []  # ?after= of each connection

    def event(self, i):
        if i > self.n:
            return 'id: %d\nevent: exit\ndata: {"id":"e-1","state":"exited","result":{"exit_code":7}}\n\n' % i
        typ = "stderr" if i % 3 == 0 else "stdout"
        # Two data lines, so a cut can fall inside an event.
        return 'id: %d\nevent: %s\ndata: {"data": "line %d\\n",\ndata:  "encoding": "utf-8"}\n\n' % (i, typ, i)

    def want(self, after=0):
        out = []
        for i in range(after + 1, self.n + 2):
            if i > self.n:
                out.append((i, "exit", 7))
            else:
                out.append((i, "stderr" if i % 3 == 0 else "stdout", ("line %d\n" % i).encode()))
        return out

    def __call__(self, h, seen):
        with self.lock:
            conn = len(self.resumes)
            self.resumes.append(seen.headers.get("Last-Event-ID") or "")
            self.afters.append(seen.query.get("after", [""])[0])
        after = int(seen.headers.get("Last-Event-ID") or seen.query.get("after", ["0"])[0] or 0)
        if self.ignore_resume:
            after = 0
        limit = self.cuts[conn] if conn < len(self.cuts) else -1
        h.sse_start()
        sent = 0
        for i in range(after + 1, self.n + 2):
            if sent == limit:
                if self.mode == "mid-event":
                    ev = self.event(i)
                    h.sse_write(ev[:ev.index("data:") + 20])
                elif self.mode == "mid-line":
                    h.sse_write(self.event(i)[:5])
                if self.mode == "eof":
                    h.sse_end()
                    return
                h.cut()
            h.sse_write(self.event(i))
            sent += 1
        h.sse_end()


class TestResume(FakeTest):
    """A stream cut in various ways delivers every event once, in order,
    and each reconnection asks for the events after the last delivered."""

    def test_resume(self):
        cases = [
            ("uncut", Stream(5), 0, [""]),
            ("cut between events", Stream(5, [2]), 0, ["", "2"]),
            ("cut inside an event", Stream(5, [2], "mid-event"), 0, ["", "2"]),
            ("cut inside a line", Stream(5, [3], "mid-line"), 0, ["", "3"]),
            ("answer ends before the exit", Stream(5, [4], "eof"), 0, ["", "4"]),
            ("cut before the first event", Stream(3, [0]), 0, ["", ""]),
            ("cut before the exit event", Stream(3, [3], "mid-event"), 0, ["", "3"]),
            ("cut every two events", Stream(7, [2, 2, 2, 2], "mid-event"), 0, ["", "2", "4", "6"]),
            ("a reconnection without progress", Stream(4, [2, 0, 1]), 0, ["", "2", "2", "3"]),
            ("a server that replays from the start", Stream(5, [3], ignore_resume=True), 0, ["", "3"]),
            ("start after an event", Stream(5, [1]), 2, ["2", "3"]),
        ]
        for name, s, after, resumes in cases:
            with self.subTest(name):
                f = self.fake(s)
                with f.client(reconnect_attempts=3, reconnect_delay=0.001).sandbox("sb-1").events("e-1", after) as st:
                    self.assertEqual(collect(st), s.want(after))
                    self.assertEqual(st.last_id, s.n + 1)
                self.assertEqual(s.resumes, resumes)
                self.assertEqual(s.afters, s.resumes)

    def test_give_up(self):
        one = 'id: 1\nevent: stdout\ndata: {"data":"a"}\n\n'

        def always_cut(conn, h):
            h.sse_start()
            if conn == 0:
                h.sse_write(one)
            h.cut()

        def no_resume(conn, h):
            h.sse_start()
            h.sse_write(one)
            h.sse_end()

        def gone(conn, h):
            if conn > 0:
                return h.error(404, "not_found", "no exec e-1")
            h.sse_start()
            h.sse_write(one)
            h.sse_end()

        def passing_503(conn, h):
            if conn == 1:
                return h.error(503, "unavailable", "restarting")
            h.sse_start()
            h.sse_write(one if conn == 0 else 'id: 2\nevent: exit\ndata: {"id":"e-1","result":{"exit_code":0}}\n\n')
            h.sse_end()

        def not_sse(conn, h):
            if conn > 0:
                return h.reply(200, {"id": "e-1"})
            h.sse_start()
            h.sse_write(one)
            h.sse_end()

        cases = [
            ("always cut", always_cut, 3, 4, 1, MoatConnectionError, "3 reconnection(s) failed"),
            ("resuming disabled", no_resume, 0, 1, 1, MoatConnectionError, "reconnecting is disabled"),
            ("the exec is gone", gone, 3, 2, 1, MoatError, "404"),
            ("a passing 503 is retried", passing_503, 3, 3, 2, None, ""),
            ("an answer that is not an event stream", not_sse, 3, 2, 1, MoatError, "not an event stream"),
        ]
        for name, handle, attempts, want_conns, want_evs, exc, msg in cases:
            with self.subTest(name):
                conns = []

                def h(hd, seen, handle=handle, conns=conns):
                    conns.append(1)
                    handle(len(conns) - 1, hd)

                f = self.fake(h)
                st = f.client(reconnect_attempts=attempts, reconnect_delay=0.001).sandbox("sb-1").events("e-1")
                got = []
                if exc is None:
                    got = list(st)
                else:
                    with self.assertRaises(exc) as cm:
                        for ev in st:
                            got.append(ev)
                    self.assertIn(msg, str(cm.exception))
                self.assertEqual(len(got), want_evs)
                self.assertEqual(len(conns), want_conns)

    def test_refused(self):
        f = self.fake(lambda h, s: h.error(404, "not_found", "no exec e-1"))
        with self.assertRaises(MoatError) as cm:
            f.client().sandbox("sb-1").events("e-1")
        self.assertEqual((cm.exception.code, cm.exception.path), ("not_found", EVENTS_PATH))

    def test_stream(self):
        s = Stream(6, [2, 3], "mid-event")
        f = self.fake(s)
        out, err = io.BytesIO(), io.BytesIO()
        ex = f.client(reconnect_delay=0.001).sandbox("sb-1").stream("e-1", out, err)
        self.assertEqual(ex["result"]["exit_code"], 7)
        self.assertEqual(out.getvalue(), b"line 1\nline 2\nline 4\nline 5\n")
        self.assertEqual(err.getvalue(), b"line 3\nline 6\n")

    def test_timeout_while_waiting(self):
        release = threading.Event()
        self.addCleanup(release.set)

        def handle(h, seen):
            h.sse_start()
            h.sse_write('id: 1\nevent: stdout\ndata: {"data":"first"}\n\n')
            release.wait(10)

        f = self.fake(handle)
        st = f.client(timeout=0.2, reconnect_attempts=0).sandbox("sb-1").events("e-1")
        self.assertEqual(next(st).data, b"first")
        start = time.monotonic()
        with self.assertRaises(MoatConnectionError):
            next(st)
        self.assertLess(time.monotonic() - start, 5)


class TestHelpers(unittest.TestCase):
    def test_stream_bytes(self):
        self.assertEqual(moat_client.stream_bytes({"data": "héllo", "encoding": "utf-8"}), "héllo".encode())
        self.assertEqual(moat_client.stream_bytes({"data": "AP8=", "encoding": "base64"}), b"\x00\xff")
        with self.assertRaises(ValueError):
            moat_client.stream_bytes({"data": "x", "encoding": "rot13"})

    def test_file_name(self):
        cases = [
            ({"path": "dir/résumé.txt", "change": "added"}, "path", "dir/résumé.txt".encode()),
            ({"path": "Yf8=", "encoding": "base64"}, "path", b"a\xff"),
            ({"path": "Yf4=", "encoding": "base64"}, "path", b"a\xfe"),
            ({"path": "bGluaw==", "target": "/g==", "encoding": "base64"}, "target", b"\xfe"),
            ({"path": "link"}, "target", b""),
        ]
        for entry, field, want in cases:
            with self.subTest(entry=entry, field=field):
                self.assertEqual(moat_client.file_name(entry, field), want)
        with self.assertRaises(ValueError):
            moat_client.file_name({"path": "x", "encoding": "hex"})
        with self.assertRaises(ValueError):
            moat_client.file_name({"path": "not base64!", "encoding": "base64"})


if __name__ == "__main__":
    unittest.main()


class RawServer:
    """A one-connection-at-a-time HTTP server on a raw socket, to play a
    server that refuses a body over limit before reading it. With expect
    it honours "Expect: 100-continue" (answers 413 at once, or says 100
    Continue); a request without it is answered 413 and the connection
    reset under the body, as Go's server does with an unread body."""

    def __init__(self, testcase, limit):
        self.limit = limit
        self.received = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()
        testcase.addCleanup(self.sock.close)

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.one(conn)

    def one(self, conn):
        f = conn.makefile("rb")
        headers = {}
        f.readline()
        while True:
            line = f.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0"))
        if length > self.limit:
            body = b'{"error":{"code":"too_large","message":"the request body is over the limit","request_id":"r-1"}}'
            conn.sendall(b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            if headers.get("expect", "").lower() != "100-continue":
                # What the client sent and nobody read: the kernel
                # answers it with a reset.
                time.sleep(0.05)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            return
        if headers.get("expect", "").lower() == "100-continue":
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        got = len(f.read(length))
        self.received += got
        body = b'{"path":"x","size":%d}' % got
        conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


class TestLargeBodies(unittest.TestCase):
    def test_refused_body_answered(self):
        srv = RawServer(self, limit=1 << 20)
        big = b"x" * (16 << 20)
        with self.assertRaises(MoatError) as cm:
            Client(srv.url, KEY).sandbox("sb-1").upload("big.bin", big)
        self.assertEqual((cm.exception.status, cm.exception.code), (413, "too_large"))
        self.assertEqual(srv.received, 0)

    def test_accepted_body_sent(self):
        srv = RawServer(self, limit=1 << 20)
        Client(srv.url, KEY).sandbox("sb-1").upload("ok.bin", b"y" * (512 << 10))
        self.assertEqual(srv.received, 512 << 10)
