#!/usr/bin/env python3
"""Builds a tiny local PEP 503 package index for Moat's guarded-index
example, on the host:

    python3 make_index.py DIR
    python3 -m http.server 18765 --bind 127.0.0.1 --directory DIR

DIR/simple/<project>/index.html lists each project's wheels with their
sha256 (as PyPI does); DIR/files/ holds the wheels, which this script
makes itself (a wheel is a zip with a dist-info directory). The index
holds hello-moat 1.0.0 (the manifest allows it), hello-moat 0.9.0 (not
allowed) and helo-moat 1.0.0 (a typosquat of hello-moat).
"""
import hashlib
import os
import sys
import zipfile

out = sys.argv[1]


def wheel(project, version):
    mod = project.replace("-", "_")
    name = "%s-%s-py3-none-any.whl" % (mod, version)
    path = os.path.join(out, "files", name)
    di = "%s-%s.dist-info/" % (mod, version)
    files = {
        mod + "/__init__.py": "VERSION = %r\n" % version,
        di + "METADATA": "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (project, version),
        di + "WHEEL": "Wheel-Version: 1.0\nGenerator: moat-example\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join("%s,,\n" % f for f in files) + di + "RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            # A fixed date: the same wheel, so the same hash, on every run.
            z.writestr(zipfile.ZipInfo(f, (2026, 1, 1, 0, 0, 0)), text)
        z.writestr(zipfile.ZipInfo(di + "RECORD", (2026, 1, 1, 0, 0, 0)), record)
    with open(path, "rb") as f:
        return name, hashlib.sha256(f.read()).hexdigest()


os.makedirs(os.path.join(out, "files"), exist_ok=True)
projects = {"hello-moat": ["1.0.0", "0.9.0"], "helo-moat": ["1.0.0"]}
with open(os.path.join(out, "index.html"), "w") as f:
    f.write("<!DOCTYPE html><html><body>\n")
    for p in projects:
        f.write('<a href="/simple/%s/">%s</a>\n' % (p, p))
    f.write("</body></html>\n")
os.makedirs(os.path.join(out, "simple"), exist_ok=True)
os.replace(os.path.join(out, "index.html"), os.path.join(out, "simple", "index.html"))
for p, versions in projects.items():
    d = os.path.join(out, "simple", p)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "index.html"), "w") as f:
        f.write("<!DOCTYPE html><html><body>\n")
        for v in versions:
            name, sha = wheel(p, v)
            f.write('<a href="/files/%s#sha256=%s">%s</a>\n' % (name, sha, name))
        f.write("</body></html>\n")
print("index in %s: %s" % (out, ", ".join("%s %s" % (p, " ".join(v)) for p, v in projects.items())))
