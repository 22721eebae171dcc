"""Test hosts for the egress tests, all on the host's loopback and started by the test itself: a static HTTP
server (files, a PyPI-style simple index with a wheel built here, a Git repository served over dumb HTTP, a
redirect), and a small npm-style registry for Bun."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import subprocess
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Files from the served dir; `/redirect?to=URL` answers 302 to URL; every request line is recorded."""

    seen: list[str]

    def do_GET(self) -> None:
        self.server.seen.append(f"{self.command} {self.path} Host={self.headers.get('Host')}")  # type: ignore[attr-defined]
        if self.path.startswith("/redirect?to="):
            self.send_response(302)
            self.send_header("Location", self.path.split("=", 1)[1])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@contextmanager
def http_server(root: Path) -> Iterator[tuple[int, list[str]]]:
    """Serves `root` on 127.0.0.1 (a free port); yields the port and the request log."""

    def handler(*args: Any, **kwargs: Any) -> _Handler:
        return _Handler(*args, directory=str(root), **kwargs)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], server.seen  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


def build_wheel(directory: Path, name: str = "ocsbdemo", version: str = "1.0") -> Path:
    """A pure-Python wheel of one module `name` whose `VALUE` says it came from the test's index."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": b"VALUE = 'installed from the test index'\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: ocsb-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def simple_index(root: Path, name: str = "ocsbdemo") -> None:
    """`root/simple/NAME/` lists a wheel built here (PEP 503)."""
    project = root / "simple" / name
    project.mkdir(parents=True)
    wheel = build_wheel(project, name)
    (project / "index.html").write_text(f'<html><body><a href="{wheel.name}">{wheel.name}</a></body></html>\n')
    (root / "simple" / "index.html").write_text(f'<html><body><a href="{name}/">{name}</a></body></html>\n')


def git_repository(root: Path, name: str = "repo.git") -> None:
    """`root/NAME`: a bare repository with one commit, ready for Git's dumb HTTP protocol."""
    work = root / "work"
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(root), "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True, env=env)
    (work / "README").write_text("cloned through the session proxy\n")
    subprocess.run(["git", "-C", str(work), "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "first"], check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(root / name)], check=True, env=env)
    subprocess.run(["git", "-C", str(root / name), "update-server-info"], check=True, env=env)


def npm_registry(root: Path, port: int, name: str = "ocsb-demo", version: str = "1.0.0") -> None:
    """`root/NAME` (the package document) and its tarball, as an npm registry serves them."""
    package = io.BytesIO()
    with tarfile.open(fileobj=package, mode="w:gz") as archive:
        for path, text in (("package/package.json", json.dumps({"name": name, "version": version, "main": "index.js"})),
                           ("package/index.js", "module.exports = 'installed from the test registry';\n")):
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    tarball = package.getvalue()
    (root / "tarballs").mkdir(exist_ok=True)
    (root / "tarballs" / f"{name}-{version}.tgz").write_bytes(tarball)
    document = {
        "name": name, "dist-tags": {"latest": version},
        "versions": {version: {
            "name": name, "version": version,
            "dist": {"tarball": f"http://npm.test:{port}/tarballs/{name}-{version}.tgz",
                     "shasum": hashlib.sha1(tarball).hexdigest(),
                     "integrity": "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()},
        }},
    }
    (root / name).write_text(json.dumps(document))
