"""Tests of moat_client's retries (RetryPolicy, Retry-After) against the
fake API of test_moat_client. Run: python3 -m unittest discover -s clients/python -v
"""

import email.utils
import io
import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from moat_client import MoatConnectionError, MoatError, RetryPolicy, parse_retry_after  # noqa: E402
from test_moat_client import EXEC, SANDBOX, FakeTest  # noqa: E402

NOW = 1_800_000_000.0


class TestParseRetryAfter(unittest.TestCase):
    def test_values(self):
        cases = [
            ("absent", {}, None),
            ("seconds", {"Retry-After": "3"}, 3.0),
            ("zero", {"Retry-After": "0"}, 0.0),
            ("spaces around", {"Retry-After": " 7 "}, 7.0),
            ("negative", {"Retry-After": "-1"}, None),
            ("a fraction is not delta-seconds", {"Retry-After": "1.5"}, None),
            ("garbage", {"Retry-After": "soon"}, None),
            ("empty", {"Retry-After": ""}, None),
            ("non-ASCII digits", {"Retry-After": "\u0663"}, None),
            ("HTTP date ahead", {"Retry-After": email.utils.formatdate(NOW + 10, usegmt=True)}, 10.0),
            ("HTTP date past", {"Retry-After": email.utils.formatdate(NOW - 60, usegmt=True)}, 0.0),
            # RFC 9110 section 5.6.7: recipients accept the obsolete forms too.
            ("RFC 850 date", {"Retry-After": "Sunday, 06-Nov-94 08:49:37 GMT"}, 0.0),
            ("asctime date", {"Retry-After": "Sun Nov  6 08:49:37 1994"}, 0.0),
            ("asctime date ahead", {"Retry-After": time.asctime(time.gmtime(NOW + 30))}, 30.0),
        ]
        for name, headers, want in cases:
            with self.subTest(name):
                got = parse_retry_after(headers, now=NOW)
                if want is None or got is None:
                    self.assertEqual(got, want)
                else:
                    self.assertAlmostEqual(got, want, places=3)

    def test_none(self):
        self.assertIsNone(parse_retry_after(None))


class TestRetryPolicy(unittest.TestCase):
    def test_delay(self):
        p = RetryPolicy(attempts=4, backoff=0.5, max_delay=10, max_wait=12)
        cases = [
            # name, kwargs, want
            ("POST 429 with Retry-After", dict(method="POST", status=429, retry_after=2.0), 2.0),
            ("POST 503 with Retry-After", dict(method="POST", status=503, retry_after=0.0), 0.0),
            ("POST 429 without Retry-After", dict(method="POST", status=429), None),
            ("GET 503 without Retry-After backs off", dict(method="GET", status=503), 0.5),
            ("GET backs off doubling", dict(method="GET", status=503, attempt=3), 2.0),
            ("DELETE after a dropped connection", dict(method="DELETE"), 0.5),
            ("POST after a dropped connection", dict(method="POST"), None),
            ("POST after a refused connection", dict(method="POST", connection_refused=True), 0.5),
            ("500 is not retried", dict(method="GET", status=500), None),
            ("400 is not retried", dict(method="GET", status=400, retry_after=1.0), None),
            ("Retry-After over max_delay", dict(method="GET", status=429, retry_after=11.0), None),
            ("Retry-After over the total", dict(method="GET", status=429, retry_after=5.0, waited=8.0), None),
            ("backoff over the total", dict(method="GET", status=503, waited=11.8), None),
            ("attempts spent", dict(method="GET", status=429, retry_after=0.0, attempt=4), None),
            ("a stream body", dict(method="PUT", status=429, retry_after=0.0, replayable=False), None),
        ]
        for name, kw, want in cases:
            with self.subTest(name):
                args = dict(attempt=1, waited=0.0, replayable=True)
                args.update(kw)
                self.assertEqual(p.delay(**args), want)

    def test_refused_settings(self):
        for kw in (dict(attempts=0), dict(backoff=-1), dict(max_delay=float("nan")), dict(max_wait=-0.5)):
            with self.subTest(str(kw)), self.assertRaises(ValueError) as cm:
                RetryPolicy(**kw)
            self.assertIn(next(iter(kw)), str(cm.exception))


def answers(*steps):
    """A handler that answers the n-th request with steps[n] (the last
    step repeats): (status, headers) for a refusal, "ok" for the call's
    success, "cut" to drop the connection without an answer."""
    def handle(h, seen):
        n = len(h.server.fake.requests) - 1
        step = steps[min(n, len(steps) - 1)]
        if step == "cut":
            h.cut()
        if step == "ok":
            if seen.path.endswith("/files") and seen.method == "PUT":
                return h.reply(201, {"path": "a"})
            if seen.path == "/v1/runs":
                return h.reply(200, {"id": "r-1", "pooled": False, "result": EXEC["result"]})
            if "/execs" in seen.path:
                return h.reply(200, EXEC)
            return h.reply(200, SANDBOX)
        status, headers = step
        code = "quota_exceeded" if status == 429 else "unavailable" if status == 503 else "internal"
        h.error(status, code, "try later", headers=headers)
    return handle


class TestRetries(FakeTest):
    """Which calls are sent again, how often and after how long."""

    def test_retries(self):
        fast = RetryPolicy(attempts=4, backoff=0.01, max_delay=5, max_wait=10)
        ra0 = {"Retry-After": "0"}
        run = lambda c: c.run(["true"])  # noqa: E731
        get = lambda c: c.get_sandbox("sb-1")  # noqa: E731
        cases = [
            # name, steps, call, policy, want requests, want error status (None: success)
            ("POST 429 with Retry-After is retried", [(429, ra0), "ok"], run, fast, 2, None),
            ("POST 503 with Retry-After is retried", [(503, ra0), (503, ra0), "ok"], run, fast, 3, None),
            ("POST 429 without Retry-After is not", [(429, {}), "ok"], run, fast, 1, 429),
            ("GET 503 without Retry-After is retried", [(503, {}), "ok"], get, fast, 2, None),
            ("GET gives up after attempts", [(429, ra0)], get, fast, 4, 429),
            ("500 is not retried", [(500, ra0), "ok"], get, fast, 1, 500),
            ("retrying disabled", [(429, ra0), "ok"], run, RetryPolicy(attempts=1), 1, 429),
            ("an HTTP-date Retry-After", [(429, {"Retry-After": email.utils.formatdate(usegmt=True)}), "ok"],
             run, fast, 2, None),
            ("a Retry-After longer than max_delay is not waited for", [(429, {"Retry-After": "3600"}), "ok"],
             run, fast, 1, 429),
            ("a dropped POST is not sent again", ["cut", "ok"], run, fast, 1, "connection"),
            ("a dropped GET is", ["cut", "ok"], get, fast, 2, None),
            ("an upload of bytes is retried",
             [(503, ra0), "ok"], lambda c: c.sandbox("sb-1").upload("a", b"x"), fast, 2, None),
            ("an upload from a stream is not",
             [(503, ra0), "ok"], lambda c: c.sandbox("sb-1").upload("a", io.BytesIO(b"x")), fast, 1, 503),
        ]
        for name, steps, call, policy, want_n, want_err in cases:
            with self.subTest(name):
                f = self.fake(answers(*steps))
                c = f.client(retry=policy)
                if want_err is None:
                    call(c)
                elif want_err == "connection":
                    with self.assertRaises(MoatConnectionError):
                        call(c)
                else:
                    with self.assertRaises(MoatError) as cm:
                        call(c)
                    self.assertEqual(cm.exception.status, want_err)
                self.assertEqual(len(f.requests), want_n)
                bodies = {r.body for r in f.requests}
                self.assertEqual(len(bodies), 1, "every try sends the same body")

    def test_waits_retry_after(self):
        """The wait is the server's Retry-After, and the error of a call
        not retried says how long the server asked for."""
        f = self.fake(answers((429, {"Retry-After": "1"}), "ok"))
        t0 = time.monotonic()
        got = f.client(retry=RetryPolicy(backoff=0)).run(["true"])
        self.assertGreaterEqual(time.monotonic() - t0, 0.95)
        self.assertEqual(got["result"]["exit_code"], 0)
        self.assertEqual(len(f.requests), 2)

        f = self.fake(answers((503, {"Retry-After": "120"})))
        with self.assertRaises(MoatError) as cm:
            f.client().run(["true"])
        self.assertEqual(cm.exception.retry_after, 120.0)
        self.assertEqual(len(f.requests), 1)

    def test_timeout_not_retried(self):
        """The caller's timeout bounds the call: a GET that timed out is
        not sent again."""
        def slow(h, seen):
            time.sleep(0.6)
            h.reply(200, SANDBOX)
        f = self.fake(slow)
        with self.assertRaises(MoatConnectionError):
            f.client(timeout=0.2, retry=RetryPolicy(backoff=0)).get_sandbox("sb-1")
        time.sleep(0.5)
        self.assertEqual(len(f.requests), 1)

    def test_refused_connection(self):
        """Nothing was sent: even a POST is tried again, and the error
        names the call."""
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        from moat_client import Client
        c = Client("http://127.0.0.1:%d" % port, "k", retry=RetryPolicy(attempts=3, backoff=0.1))
        t0 = time.monotonic()
        with self.assertRaises(MoatConnectionError) as cm:
            c.run(["true"])
        self.assertGreaterEqual(time.monotonic() - t0, 0.28)  # 0.1 + 0.2
        self.assertIn("POST /v1/runs", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
