"""Template build time, cold and cached, beside a plain `docker build` of the same context.

The template is the one docs/templates.md shows: Debian's `nodejs` installed through the default bridge, and a
file copied in. Rows (wall-clock ms):

* ``cold`` -- a control plane starts with the template never built before (a nonce file in the context, copied
  before the `apt-get` step, so the engine's layer cache cannot serve it) until ListTemplates shows it READY:
  the build, then the agent check; beside ``docker build`` of another fresh context (the build alone).
* ``cached`` -- the same plane restarted with the template unchanged, until READY: the context's hash, the tag
  found on the engine, the agent check; beside ``docker build`` of an unchanged context (every step cached).

The images built are removed at the end (the plane's own are pruned by its next start, the rest here).
Usage: ``.venv/bin/python -m tests.bench.template_bench [--quick]`` (also a section of ``make bench``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import docker

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.sandbox.layout import LABEL_TEMPLATE
from controlplane.v1 import session_pb2
from tests.bench.bench_common import IMAGE, SCRATCH, Row, scratch_dir
from tests.bench.bench_plane import run_alone

DOCKERFILE = """ARG SANDBOX_IMAGE
FROM ${SANDBOX_IMAGE}
COPY nonce.txt /opt/template/nonce.txt
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs \\
    && rm -rf /var/lib/apt/lists/*
"""
BUILD_WAIT_S = 600.0


def _context(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "Dockerfile").write_text(DOCKERFILE)
    (folder / "nonce.txt").write_text(secrets.token_hex(8) + "\n")
    return folder


async def _until_ready(settings_kwargs: dict[str, object], token: str, name: str) -> float:
    """Starts a plane and times its start until the template is READY (ms); the plane is stopped after."""
    start = time.perf_counter()
    plane = await app.start(load_settings(None, **settings_kwargs))
    client = AsyncClient(plane.address, token)
    try:
        while True:
            found = {t.name: t for t in await client.list_templates()}[name]
            if found.state == session_pb2.Template.READY:
                return (time.perf_counter() - start) * 1000
            if found.state == session_pb2.Template.FAILED:
                raise RuntimeError(f"template {name} failed: {found.error}")
            if time.perf_counter() - start > BUILD_WAIT_S:
                raise RuntimeError(f"template {name} not ready within {BUILD_WAIT_S} s")
            await asyncio.sleep(0.05)
    finally:
        await client.close()
        await app.stop(plane)


def _docker_build(context: Path, tag: str, image: str) -> float:
    start = time.perf_counter()
    subprocess.run(["docker", "build", "-q", "--build-arg", f"SANDBOX_IMAGE={image}", "--label",
                    f"{LABEL_TEMPLATE}-bench=1", "-t", tag, str(context)], check=True, capture_output=True)
    return (time.perf_counter() - start) * 1000


def _remove(tags: list[str], names: list[str]) -> None:
    engine = docker.from_env(timeout=600)
    try:
        for name in names:
            for found in engine.images.list(filters={"label": f"{LABEL_TEMPLATE}={name}"}):
                engine.images.remove(str(found.id), force=True)
        for tag in tags:
            try:
                engine.images.remove(tag, force=True)
            except docker.errors.ImageNotFound:
                pass
    finally:
        engine.close()


async def section(quick: bool) -> list[str]:
    cold_samples, cached_samples = (1, 2) if quick else (2, 3)
    image = os.environ.get("OCSB_TEST_IMAGE", IMAGE)
    root = scratch_dir("octempl")
    token = secrets.token_hex(16)
    rows = {k: Row(k, []) for k in ("cold", "cached", "build cold", "build cached")}
    names: list[str] = []
    tags: list[str] = []
    try:
        for i in range(cold_samples):
            name = f"bench-{secrets.token_hex(3)}"
            names.append(name)
            context = _context(root, name)
            kwargs: dict[str, object] = {
                "data_dir": scratch_dir("octemplplane"), "instance": f"bench-tpl-{secrets.token_hex(3)}",
                "tenants": [{"name": "bench", "token": token}], "server": {"listen": "127.0.0.1:0"},
                "provider": {"type": "docker", "image": image}, "pool": {"size": 0},
                "templates": [{"name": name, "dockerfile": str(context / "Dockerfile")}],
            }
            rows["cold"].samples_ms.append(await _until_ready(kwargs, token, name))
            if i == 0:
                for _ in range(cached_samples):
                    rows["cached"].samples_ms.append(await _until_ready(kwargs, token, name))
            plain = _context(root, f"plain-{name}")
            tag = f"ocsb-bench-template:{name}"
            tags.append(tag)
            rows["build cold"].samples_ms.append(await asyncio.to_thread(_docker_build, plain, tag, image))
            if i == 0:
                for _ in range(cached_samples):
                    rows["build cached"].samples_ms.append(await asyncio.to_thread(_docker_build, plain, tag, image))
    finally:
        await asyncio.to_thread(_remove, tags, names)
    lines = [f"a template installing Debian's nodejs; {cold_samples} cold and {cached_samples} cached samples "
             "(p50 / max ms)"]
    for ours, base, label in (("cold", "build cold", "docker build (fresh)"),
                              ("cached", "build cached", "docker build (cached)")):
        a, b = rows[ours], rows[base]
        lines.append(f"{ours:8} {a.p50:9.0f} / {max(a.samples_ms):<9.0f} beside {label:22} {b.p50:8.0f} / "
                     f"{max(b.samples_ms):.0f}")
    return lines


def main() -> int:
    return run_alone(section, __doc__, SCRATCH)


if __name__ == "__main__":
    sys.exit(main())
