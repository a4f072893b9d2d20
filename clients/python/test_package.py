"""Tests of moat_client as a package: the in-tree build backend's wheel
and sdist, `pip install ./clients/python` into a fresh venv with no index
(nothing can be downloaded), the installed client used against the fake
API, and its types checked by mypy. Run: python3 -m unittest discover -s clients/python -v
"""

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "build_backend"))

import moat_client  # noqa: E402
import moat_client_build  # noqa: E402
from test_moat_client import EXEC, KEY, FakeAPI  # noqa: E402

try:
    import tomllib
except ImportError:  # Python before 3.11
    tomllib = None  # type: ignore


def pyproject():
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        return f.read()


def tmpdir(test):
    d = tempfile.mkdtemp(prefix="moat-client-test-")
    test.addCleanup(shutil.rmtree, d, True)
    return d


class TestBackend(unittest.TestCase):
    def test_wheel(self):
        d = tmpdir(self)
        name = moat_client_build.build_wheel(d)
        self.assertEqual(name, "moat_client-%s-py3-none-any.whl" % moat_client.__version__)
        with zipfile.ZipFile(os.path.join(d, name)) as z:
            names = sorted(z.namelist())
            di = "moat_client-%s.dist-info/" % moat_client.__version__
            want = sorted(["moat_client/__init__.py", "moat_client/_client.py", "moat_client/_retry.py",
                           "moat_client/_types.py", "moat_client/aio.py", "moat_client/py.typed",
                           di + "METADATA", di + "WHEEL", di + "RECORD"])
            self.assertEqual(names, want, "only the package and its dist-info (no tests, no backend)")
            meta = z.read(di + "METADATA").decode()
            self.assertIn("Name: moat-client\n", meta)
            self.assertIn("Version: %s\n" % moat_client.__version__, meta)
            self.assertIn("Requires-Python: >=3.9\n", meta)
            self.assertIn("Classifier: Typing :: Typed\n", meta)
            # RECORD lists every other file with its hash and size (PEP 376).
            rows = [r.split(",") for r in z.read(di + "RECORD").decode().splitlines()]
            self.assertEqual(sorted(r[0] for r in rows), want)
            for path, h, size in rows:
                if path == di + "RECORD":
                    self.assertEqual((h, size), ("", ""))
                    continue
                data = z.read(path)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                self.assertEqual((h, size), ("sha256=" + digest, str(len(data))), path)

    def test_reproducible(self):
        """The same tree builds the same bytes."""
        for build in (moat_client_build.build_wheel, moat_client_build.build_sdist):
            with self.subTest(build.__name__):
                a, b = tmpdir(self), tmpdir(self)
                na, nb = build(a), build(b)
                with open(os.path.join(a, na), "rb") as fa, open(os.path.join(b, nb), "rb") as fb:
                    self.assertEqual(fa.read(), fb.read())

    def test_sdist(self):
        d = tmpdir(self)
        name = moat_client_build.build_sdist(d)
        base = "moat_client-" + moat_client.__version__
        self.assertEqual(name, base + ".tar.gz")
        with tarfile.open(os.path.join(d, name)) as t:
            names = set(t.getnames())
        for want in ("PKG-INFO", "pyproject.toml", "README.md", "build_backend/moat_client_build.py",
                     "moat_client/__init__.py", "moat_client/py.typed"):
            self.assertIn(base + "/" + want, names)

    def test_editable(self):
        """pip install -e: a wheel whose .pth names this directory."""
        d = tmpdir(self)
        name = moat_client_build.build_editable(d)
        with zipfile.ZipFile(os.path.join(d, name)) as z:
            self.assertEqual(z.read("__editable__.moat_client.pth").decode(), HERE + "\n")
            self.assertNotIn("moat_client/__init__.py", z.namelist())

    def test_version_is_one(self):
        self.assertEqual(moat_client_build._read_project(pyproject())["version"], moat_client.__version__)

    @unittest.skipIf(tomllib is None, "needs tomllib (Python 3.11+) to compare the fallback reader with")
    def test_fallback_reader(self):
        """The reader used before Python 3.11 reads pyproject.toml as
        tomllib does, and refuses what it cannot read."""
        want = tomllib.loads(pyproject())["project"]
        self.assertEqual(moat_client_build._read_project_fallback(pyproject()), want)
        cases = [
            ("a table value", '[project]\nlicense = {text = "MIT"}\n', "license"),
            ("an unclosed array", '[project]\nclassifiers = [\n "a",\n', "not closed"),
            ("a number", '[project]\nversion = 1\n', "version"),
        ]
        for name, text, msg in cases:
            with self.subTest(name), self.assertRaises(ValueError) as cm:
                moat_client_build._read_project_fallback(text)
            self.assertIn(msg, str(cm.exception))

    def test_no_requirements(self):
        self.assertEqual(moat_client_build.get_requires_for_build_wheel(), [])
        self.assertIn("requires = []", pyproject())


USE = textwrap.dedent('''
    import asyncio, os, sys
    import moat_client
    from moat_client import Client, RetryPolicy
    from moat_client.aio import AsyncClient
    here = os.path.dirname(moat_client.__file__)
    assert here.startswith(sys.prefix), (here, sys.prefix)
    assert os.path.exists(os.path.join(here, "py.typed"))
    url, key = sys.argv[1], sys.argv[2]
    res = Client(url, key, retry=RetryPolicy(attempts=2)).run(["echo", "hi"])["result"]
    async def main():
        async with AsyncClient(url, key) as c:
            return await c.run(["echo", "hi"])
    ares = asyncio.run(main())["result"]
    print(moat_client.__version__, res["termination"], res["exit_code"], ares["stdout"]["data"].strip())
''')


class TestInstall(unittest.TestCase):
    def test_pip_install_offline(self):
        """`pip install ./clients/python` into a fresh venv, with no
        index: the build needs nothing from the network. The installed
        package (not this directory) then talks to the fake API."""
        d = tmpdir(self)
        venv = os.path.join(d, "venv")
        r = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True, timeout=300)
        if r.returncode != 0 and "ensurepip" in r.stderr + r.stdout:
            self.skipTest("this Python's venv has no pip (ensurepip): %s" % r.stderr.strip())
        self.assertEqual(r.returncode, 0, r.stderr)
        py = os.path.join(venv, "bin", "python")
        env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)
        # A copy of the directory, so the install writes nothing into the
        # tree (pip builds in place since 21.3).
        src = os.path.join(d, "python")
        shutil.copytree(HERE, src, ignore=shutil.ignore_patterns("__pycache__", ".mypy_cache"))
        r = subprocess.run([py, "-m", "pip", "install", src], capture_output=True, text=True, env=env,
                           timeout=300, cwd=d)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("Successfully installed moat-client-" + moat_client.__version__, r.stdout)

        def handle(h, seen):
            h.reply(200, {"id": "r-1", "pooled": False, "result": EXEC["result"]})
        f = FakeAPI(handle)
        self.addCleanup(f.close)
        r = subprocess.run([py, "-c", USE, f.url, KEY], capture_output=True, text=True, env=env, timeout=60, cwd=d)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), [moat_client.__version__, "exited", "0", "hi"])
        self.assertEqual(len(f.requests), 2)


def mypy_command():
    """mypy as the suite runs it (scripts/test): Debian's python3-mypy
    under /usr/bin/python3, or one on PATH."""
    for py in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(py) and subprocess.run([py, "-c", "import mypy"], capture_output=True).returncode == 0:
            return [py, "-m", "mypy"]
    return None


GOOD = '''
import asyncio
from typing import List
from moat_client import Client, Result, RunResponse, SandboxInfo, Exec, FileInfo, stream_bytes
from moat_client.aio import AsyncClient

def use(c: Client) -> int:
    run: RunResponse = c.run(["true"], files={"a": b"x"}, manifest={"resources": {"timeout": "5s"}})
    res: Result = run["result"]
    out: bytes = stream_bytes(res["stdout"])
    with c.create_sandbox(ttl=60) as sb:
        info: SandboxInfo = sb.info
        ex: Exec = sb.exec(["ls"])
        files: List[FileInfo] = sb.list(".")
    return res["exit_code"] + len(out) + len(files) + len(info.get("id", "")) + ex["result"]["exit_code"]

async def ause(c: AsyncClient) -> str:
    async with await c.create_sandbox() as sb:
        ex = await sb.start(["ls"])
        async for ev in sb.events(ex["id"]):
            if ev.exec is not None:
                return ev.exec["state"]
    return ""
'''

BAD = '''
from moat_client import Client

def use(c: Client) -> str:
    res = c.run(["true"])["result"]
    n: str = res["exit_code"]
    return n + res["exit_codes"]
'''


class TestTypes(unittest.TestCase):
    """mypy --strict accepts correct use of the package and finds the
    mistakes its types exist to catch."""

    def test_mypy(self):
        cmd = mypy_command()
        if cmd is None:
            self.skipTest("needs mypy (apt install python3-mypy; scripts/setup --deps installs it)")
        d = tmpdir(self)
        cases = [
            ("correct use", GOOD, 0, []),
            ("a wrong type and a misspelt key", BAD, 1,
             ['Incompatible types in assignment (expression has type "int", variable has type "str")',
              '"Result" has no key "exit_codes"']),
        ]
        for name, src, want_rc, want_msgs in cases:
            with self.subTest(name):
                path = os.path.join(d, "use_%d.py" % want_rc)
                with open(path, "w") as f:
                    f.write(src)
                r = subprocess.run(cmd + ["--strict", "--python-version", "3.9", "--cache-dir", os.devnull,
                                          "--no-error-summary", path],
                                   capture_output=True, text=True, env=dict(os.environ, MYPYPATH=HERE), timeout=300)
                self.assertEqual(r.returncode, want_rc, r.stdout + r.stderr)
                for m in want_msgs:
                    self.assertIn(m, r.stdout)


if __name__ == "__main__":
    unittest.main()
