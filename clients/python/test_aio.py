"""Tests of moat_client.aio (the asyncio client) against the fake API of
test_moat_client. Run: python3 -m unittest discover -s clients/python -v
"""

import asyncio
import io
import os
import select
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from moat_client import MoatError, RetryPolicy  # noqa: E402
from moat_client.aio import AsyncClient, AsyncSandbox  # noqa: E402
from test_moat_client import EXEC, KEY, SANDBOX, FakeAPI  # noqa: E402

EXIT = 'id: 3\nevent: exit\ndata: {"id":"e-1","state":"exited","result":{"exit_code":0}}\n\n'


def routes(h, seen):
    """The fake's answers: enough of the API for the async client's calls."""
    p, m = seen.path, seen.method
    if p == "/v1/runs" and m == "POST":
        return h.reply(200, {"id": "r-1", "pooled": True, "result": EXEC["result"]})
    if p == "/v1/sandboxes" and m == "POST":
        return h.reply(201, SANDBOX)
    if p == "/v1/sandboxes/sb-1" and m == "DELETE":
        return h.reply(200, dict(SANDBOX, state="deleted"))
    if p == "/v1/sandboxes/sb-1/execs" and m == "POST":
        return h.reply(200, EXEC)
    if p == "/v1/sandboxes/sb-1/files" and m == "GET":
        return h.reply(200, b"content", "application/octet-stream")
    if p == "/v1/sandboxes/sb-1/files" and m == "PUT":
        return h.reply(201, {"path": "a"})
    if p.endswith("/events"):
        h.sse_start()
        h.sse_write('id: 1\nevent: stdout\ndata: {"data":"a\\n"}\n\n')
        h.sse_write('id: 2\nevent: stderr\ndata: {"data":"AP8=","encoding":"base64"}\n\n')
        h.sse_write(EXIT)
        return h.sse_end()
    if p == "/v1/sandboxes/sb-9":
        return h.error(404, "not_found", "no sandbox sb-9")
    return h.error(400, "bad_request", "unexpected %s %s" % (m, p))


class AsyncFakeTest(unittest.IsolatedAsyncioTestCase):
    def fake(self, handle):
        f = FakeAPI(handle)
        self.addCleanup(f.close)
        return f

    async def client(self, f, **kw):
        c = AsyncClient(f.url, KEY, **kw)
        self.addAsyncCleanup(c.aclose)
        return c


class TestAsyncCalls(AsyncFakeTest):
    async def test_calls(self):
        """Each call sends what the blocking client sends and returns the
        same document."""
        cases = [
            ("run", lambda c: c.run(["echo", "hi"], files={"a.txt": "x"}), "POST", "/v1/runs",
             lambda got: got["result"]["exit_code"] == 0),
            ("create_sandbox", lambda c: c.create_sandbox(ttl=60), "POST", "/v1/sandboxes",
             lambda got: isinstance(got, AsyncSandbox) and got.id == "sb-1" and got.info["tier"] == "native"),
            ("exec", lambda c: c.sandbox("sb-1").exec(code="print(1)", language="python"), "POST",
             "/v1/sandboxes/sb-1/execs", lambda got: got["result"]["stdout"]["data"] == "hi\n"),
            ("download", lambda c: c.sandbox("sb-1").download("a"), "GET", "/v1/sandboxes/sb-1/files",
             lambda got: got == b"content"),
            ("upload", lambda c: c.sandbox("sb-1").upload("a", b"\xff", mode=0o600), "PUT",
             "/v1/sandboxes/sb-1/files", lambda got: got is None),
        ]
        for name, call, method, path, check in cases:
            with self.subTest(name):
                f = self.fake(routes)
                got = await call(await self.client(f))
                self.assertTrue(check(got), got)
                r = f.last()
                self.assertEqual((r.method, r.path), (method, path))
                self.assertEqual(r.headers.get("Authorization"), "Bearer " + KEY)

    async def test_refused(self):
        f = self.fake(routes)
        c = await self.client(f)
        with self.assertRaises(MoatError) as cm:
            await c.get_sandbox("sb-9")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))

    async def test_sandbox_context_deletes(self):
        f = self.fake(routes)
        c = await self.client(f)
        async with await c.create_sandbox() as sb:
            await sb.exec(["true"])
        self.assertEqual([(r.method, r.path) for r in f.requests],
                         [("POST", "/v1/sandboxes"), ("POST", "/v1/sandboxes/sb-1/execs"),
                          ("DELETE", "/v1/sandboxes/sb-1")])

    async def test_events_and_stream(self):
        f = self.fake(routes)
        c = await self.client(f)
        sb = c.sandbox("sb-1")
        got = [(ev.id, ev.type, ev.data) async for ev in sb.events("e-1")]
        self.assertEqual(got, [(1, "stdout", b"a\n"), (2, "stderr", b"\x00\xff"), (3, "exit", None)])
        out, err = io.BytesIO(), io.BytesIO()
        done = await sb.stream("e-1", out, err)
        self.assertEqual((out.getvalue(), err.getvalue(), done["result"]["exit_code"]), (b"a\n", b"\x00\xff", 0))

    async def test_concurrent(self):
        """Calls run side by side: eight runs that each take 0.4 s on the
        server end together in far less than 3.2 s."""
        def slow(h, seen):
            time.sleep(0.4)
            routes(h, seen)
        f = self.fake(slow)
        c = await self.client(f)
        t0 = time.monotonic()
        got = await asyncio.gather(*(c.run(["true"]) for _ in range(8)))
        self.assertLess(time.monotonic() - t0, 2.0)
        self.assertEqual(len(got), 8)

    async def test_retry_after(self):
        n = []

        def handle(h, seen):
            n.append(1)
            if len(n) == 1:
                return h.error(429, "quota_exceeded", "full", headers={"Retry-After": "0"})
            routes(h, seen)
        f = self.fake(handle)
        c = await self.client(f)
        got = await c.run(["true"])
        self.assertEqual((got["id"], len(f.requests)), ("r-1", 2))


class TestAsyncCancel(AsyncFakeTest):
    async def test_cancel_pending_retry(self):
        """A task cancelled while its call waits out a Retry-After sends
        no further request."""
        f = self.fake(lambda h, seen: h.error(429, "quota_exceeded", "full", headers={"Retry-After": "1"}))
        c = await self.client(f, retry=RetryPolicy(attempts=3))
        task = asyncio.ensure_future(c.run(["true"]))
        await asyncio.sleep(0.3)
        self.assertEqual(len(f.requests), 1)
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        await asyncio.sleep(1.5)  # past the Retry-After
        self.assertEqual(len(f.requests), 1, "a cancelled call retried")

    async def test_cancel_event_read(self):
        """Cancelling a task that waits for events closes the stream's
        connection: the server sees it go, and no thread stays blocked."""
        gone = threading.Event()

        def handle(h, seen):
            if not seen.path.endswith("/events"):
                return routes(h, seen)
            h.sse_start()
            h.sse_write('id: 1\nevent: stdout\ndata: {"data":"a"}\n\n')
            # Hold the stream open until the client goes.
            r, _, _ = select.select([h.connection], [], [], 10)
            if r:
                gone.set()
        f = self.fake(handle)
        c = await self.client(f, max_workers=1)
        st = c.sandbox("sb-1").events("e-1")
        first = await st.__anext__()
        self.assertEqual(first.data, b"a")
        task = asyncio.ensure_future(st.__anext__())
        await asyncio.sleep(0.2)
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        self.assertTrue(await asyncio.get_running_loop().run_in_executor(None, gone.wait, 5),
                        "the server never saw the connection close")
        # The pool's only thread is free again.
        got = await asyncio.wait_for(c.run(["true"]), 5)
        self.assertEqual(got["id"], "r-1")


if __name__ == "__main__":
    unittest.main()
