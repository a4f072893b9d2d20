"""The PEP 517 build backend of moat_client: standard library only.

pip builds a source tree in an isolated environment into which it first
installs the backend named in ``[build-system] requires``; with
setuptools or hatchling there, ``pip install ./clients/python`` needs an
index, and this project's hosts have none. This backend is in the tree
(``backend-path``), requires nothing, and writes the wheel itself: the
``moat_client`` package and its dist-info, nothing else (not the tests,
not this backend). Archives are reproducible: fixed timestamps and file
order, so the same tree gives the same bytes.

Hooks: build_wheel, build_sdist, build_editable (PEP 660: a .pth that
puts the source directory on sys.path), and their get_requires_*
(nothing).
"""

import base64
import gzip
import hashlib
import importlib
import io
import json
import os
import re
import tarfile
import zipfile
from typing import IO, Any, Dict, List, Optional, Tuple, cast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "moat_client"
# The zip format cannot store times before 1980; SOURCE_DATE_EPOCH-style
# fixed times make archives reproducible.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_TAR_TIME = 315532800  # 1980-01-01


def _read_project(text: str) -> Dict[str, Any]:
    """The [project] table of pyproject.toml: tomllib where the Python has
    it (3.11+), else _read_project_fallback."""
    try:
        # Imported by name: type checkers run for Python 3.9 have no
        # tomllib to resolve.
        tomllib = importlib.import_module("tomllib")
    except ImportError:
        return _read_project_fallback(text)
    project = tomllib.loads(text).get("project")
    if not isinstance(project, dict):
        raise ValueError("pyproject.toml: no [project] table")
    return project


_KV = re.compile(r'^([A-Za-z0-9_-]+)\s*=\s*(.*)$')
_STR = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _read_project_fallback(text: str) -> Dict[str, Any]:
    """The [project] keys this backend reads, for Pythons before 3.11
    (no tomllib): basic strings and arrays of basic strings, as written in
    this directory's pyproject.toml. Anything else is refused with the
    line, rather than misread."""
    out: Dict[str, Any] = {}
    table = ""
    pending: Optional[Tuple[str, List[str]]] = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if '"' not in raw else raw.strip()
        if pending is not None:
            key, items = pending
            if line.startswith("]"):
                out[key] = items
                pending = None
            elif line:
                m = _STR.fullmatch(line.rstrip(","))
                if not m:
                    raise ValueError("pyproject.toml line %d: %r: want one string per line in an array" % (n, raw))
                items.append(_unescape(m.group(1)))
            continue
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            table = line.strip("[]").strip()
            continue
        if table != "project":
            continue
        m = _KV.match(line)
        if not m:
            raise ValueError("pyproject.toml line %d: %r: not key = value" % (n, raw))
        key, value = m.group(1), m.group(2).strip()
        s = _STR.fullmatch(value)
        if s:
            out[key] = _unescape(s.group(1))
        elif value == "[]":
            out[key] = []
        elif value == "[":
            pending = (key, [])
        elif value.startswith("["):
            out[key] = [_unescape(x) for x in _STR.findall(value)]
        else:
            raise ValueError("pyproject.toml line %d: %r: this backend reads strings and arrays of strings" % (n, raw))
    if pending is not None:
        raise ValueError("pyproject.toml: the array %r is not closed" % pending[0])
    return out


def _unescape(s: str) -> str:
    """A TOML basic string's escapes, which JSON's cover (\\", \\\\, \\n, \\uXXXX...)."""
    try:
        v = json.loads('"' + s + '"')
    except ValueError:
        raise ValueError("pyproject.toml: string %r: an escape this backend does not read" % s) from None
    if not isinstance(v, str):
        raise ValueError("pyproject.toml: string %r is not a string" % s)
    return v


class _Meta:
    def __init__(self) -> None:
        with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
            p = _read_project(f.read())
        for key in ("name", "version"):
            if not isinstance(p.get(key), str) or not p[key]:
                raise ValueError("pyproject.toml: [project] %s is missing" % key)
        self.name: str = p["name"]
        self.version: str = p["version"]
        self.summary: str = p.get("description", "")
        self.requires_python: str = p.get("requires-python", "")
        self.classifiers: List[str] = list(p.get("classifiers", []))
        if p.get("dependencies"):
            raise ValueError("pyproject.toml: dependencies are not supported by this backend (moat_client has none)")
        readme = p.get("readme", "")
        self.readme = ""
        if readme:
            with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
                self.readme = f.read()
        # Wheel and sdist file names use the normalised name (PEP 427, 625).
        self.dist = re.sub(r"[-_.]+", "_", self.name).lower()

    def metadata(self) -> str:
        lines = ["Metadata-Version: 2.1", "Name: " + self.name, "Version: " + self.version]
        if self.summary:
            lines.append("Summary: " + self.summary)
        if self.requires_python:
            lines.append("Requires-Python: " + self.requires_python)
        lines += ["Classifier: " + c for c in self.classifiers]
        if self.readme:
            lines.append("Description-Content-Type: text/markdown")
        return "\n".join(lines) + "\n\n" + self.readme

    def package_files(self) -> List[Tuple[str, bytes]]:
        """The package's files as (archive name, content), sorted: the
        .py modules and py.typed (PEP 561), not caches."""
        out = []
        pkg = os.path.join(ROOT, PACKAGE)
        for name in sorted(os.listdir(pkg)):
            if name.endswith(".py") or name == "py.typed":
                with open(os.path.join(pkg, name), "rb") as f:
                    out.append((PACKAGE + "/" + name, f.read()))
        if not any(n == PACKAGE + "/__init__.py" for n, _ in out):
            raise ValueError("%s: no %s/__init__.py" % (ROOT, PACKAGE))
        return out


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def _write_wheel(directory: str, files: List[Tuple[str, bytes]], m: _Meta, tag: str = "py3-none-any") -> str:
    distinfo = "%s-%s.dist-info" % (m.dist, m.version)
    wheel = "Wheel-Version: 1.0\nGenerator: moat_client_build\nRoot-Is-Purelib: true\nTag: %s\n" % tag
    files = files + [(distinfo + "/METADATA", m.metadata().encode("utf-8")),
                     (distinfo + "/WHEEL", wheel.encode("utf-8"))]
    record = "".join("%s,%s,%d\n" % (n, _record_hash(d), len(d)) for n, d in files)
    record += distinfo + "/RECORD,,\n"
    files.append((distinfo + "/RECORD", record.encode("utf-8")))
    name = "%s-%s-%s.whl" % (m.dist, m.version, tag)
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            info = zipfile.ZipInfo(n, _ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, d)
    return name


# -- PEP 517 hooks ------------------------------------------------------

def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    m = _Meta()
    return _write_wheel(wheel_directory, m.package_files(), m)


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    """PEP 660: a wheel whose .pth puts this source directory on sys.path,
    so that edits take effect without reinstalling."""
    m = _Meta()
    pth = (ROOT + "\n").encode("utf-8")
    return _write_wheel(wheel_directory, [("__editable__.%s.pth" % m.dist, pth)], m)


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    """A .tar.gz of what builds the wheel again: pyproject.toml, the
    README, the package and this backend, plus PKG-INFO."""
    m = _Meta()
    base = "%s-%s" % (m.dist, m.version)
    files: List[Tuple[str, bytes]] = [("PKG-INFO", m.metadata().encode("utf-8"))]
    for rel in ("pyproject.toml", "README.md", "build_backend/moat_client_build.py"):
        with open(os.path.join(ROOT, rel), "rb") as f:
            files.append((rel, f.read()))
    files += m.package_files()
    name = base + ".tar.gz"
    raw = io.BytesIO()
    # mtime=0 in the gzip header, fixed times and owners in the tar.
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        with tarfile.open(fileobj=cast(IO[bytes], gz), mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, data in sorted(files):
                info = tarfile.TarInfo(base + "/" + rel)
                info.size = len(data)
                info.mtime = _TAR_TIME
                info.mode = 0o644
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
    with open(os.path.join(sdist_directory, name), "wb") as f:
        f.write(raw.getvalue())
    return name
