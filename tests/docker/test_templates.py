"""Session templates on a real engine: an operator's Dockerfile built FROM the sandbox image (Debian's nodejs
installed through the default bridge), sessions on it with the same hardening, custom tools in it, a tenant's
restriction, a failing build and images without the agent refused, and no rebuild on the next start."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import docker
import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.core.sessions.models import Resources
from controlplane.sandbox.docker import verify_hardening
from controlplane.sandbox.layout import LABEL_TEMPLATE
from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.docker.custom_tools_support import ECHO_TS, custom_tools
from tests.planes import (
    Plane,
    PlaneProcess,
    instance_containers,
    new_instance,
    remove_data_dir,
    remove_instance_leftovers,
    running_plane,
    short_tmp,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(400)]  # the first test waits for a cold build too

NONCE = secrets.token_hex(3)
NODE, BROKEN, PATCHED, FOREIGN, PRELOAD, DEBIAN = (
    f"{kind}-{NONCE}" for kind in ("node", "broken", "patched", "foreign", "preload", "debian"))
ACME, OTHER = "t" * 32, "u" * 32
TENANTS = [{"name": "acme", "token": ACME,
            "templates": ["default", NODE, BROKEN, PATCHED, FOREIGN, PRELOAD, DEBIAN]},
           {"name": "other", "token": OTHER, "templates": ["default"]}]
BUILD_WAIT_S = 300.0
NODE_DOCKERFILE = """# The platform fills SANDBOX_IMAGE with its own sandbox image.
ARG SANDBOX_IMAGE
FROM ${SANDBOX_IMAGE}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs \\
    && rm -rf /var/lib/apt/lists/*
COPY hello.txt /opt/template/hello.txt
# What an attacker in the sandbox would love to find: a setuid-root shell. no-new-privileges keeps it harmless.
RUN cp /bin/bash /usr/local/bin/rootbash && chmod 4755 /usr/local/bin/rootbash
"""
PY_TOOL = '''from opencode_tool import tool


async def greet(args, ctx):
    return f"hello {args['name']} from python"


default = tool(description="Greets", args={"type": "object", "properties": {"name": {"type": "string"}},
                                          "required": ["name"]}, execute=greet)
'''


def _context(root: Path, name: str, dockerfile: str, **files: str) -> Path:
    (root / name).mkdir()
    for file, text in {"Dockerfile": dockerfile, **files}.items():
        (root / name / file).write_text(text)
    return root / name / "Dockerfile"


def _remove_images(names: list[str]) -> None:
    engine = docker.from_env(timeout=600)  # removing a layered image on a busy engine took over the default 60 s
    for name in names:
        for image in engine.images.list(filters={"label": f"{LABEL_TEMPLATE}={name}"}):
            engine.images.remove(str(image.id), force=True)
    engine.close()


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("templates")
    base = "ARG SANDBOX_IMAGE\nFROM ${SANDBOX_IMAGE}\n"
    engine = docker.from_env()
    # A prebuilt image that does not start the agent: the operator's `image =` must be refused.
    foreign_dir = _context(root, "foreign", base + 'ENTRYPOINT ["/bin/sh"]\n').parent
    sandbox_image = _sandbox_image()
    engine.images.build(path=str(foreign_dir), tag=f"ocsb-test-{FOREIGN}:1", buildargs={"SANDBOX_IMAGE": sandbox_image},
                        labels={LABEL_TEMPLATE: FOREIGN}, rm=True, forcerm=True)
    engine.close()
    yield [
        {"name": NODE, "dockerfile": str(_context(root, "node", NODE_DOCKERFILE, **{"hello.txt": f"{NONCE}\n"})),
         "pool": 1},
        {"name": BROKEN, "dockerfile": str(_context(root, "broken", base + "RUN echo about to fail && false\n"))},
        {"name": PATCHED, "dockerfile": str(_context(
            root, "patched", base + "RUN echo '# changed' >> /opt/agent/sandbox_agent/server.py\n"))},
        {"name": FOREIGN, "image": f"ocsb-test-{FOREIGN}:1"},
        {"name": PRELOAD, "dockerfile": str(_context(root, "preload", base + "ENV LD_PRELOAD=/tmp/x.so\n"))},
        {"name": DEBIAN, "dockerfile": str(_context(root, "debian", "FROM debian:bookworm\nRUN true\n"))},
    ]
    _remove_images([NODE, BROKEN, PATCHED, FOREIGN, PRELOAD])


def _sandbox_image() -> str:
    return os.environ.get("OCSB_TEST_IMAGE", "ocsb-sandbox:latest")


async def _settled(client: AsyncClient) -> dict[str, session_pb2.Template]:
    deadline = time.monotonic() + BUILD_WAIT_S
    while True:
        found = {t.name: t for t in await client.list_templates()}
        if all(t.state != session_pb2.Template.BUILDING for t in found.values()):
            return found
        assert time.monotonic() < deadline, f"templates still building after {BUILD_WAIT_S} s: {found}"
        await asyncio.sleep(1.0)


@pytest.fixture(scope="module")
async def plane(templates: list[dict[str, Any]]) -> AsyncIterator[Plane]:
    async with running_plane("docker", tenants=TENANTS, templates=templates, pool={"size": 1}) as served:
        await _settled(served.client)
        yield served


@pytest.fixture
async def other(plane: Plane) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(plane.plane.address, OTHER)
    yield client
    for session in await client.list_sessions():
        await client.delete_session(session.id)
    await client.close()


async def test_list_templates_shows_each_state_and_why_one_failed(plane: Plane) -> None:
    found = await _settled(plane.client)
    assert list(found) == ["default", NODE, BROKEN, PATCHED, FOREIGN, PRELOAD, DEBIAN]
    assert found["default"].state == session_pb2.Template.READY
    node = found[NODE]
    assert node.state == session_pb2.Template.READY, node.error
    assert node.image.startswith(f"ocsb-template-{NODE}:")
    assert len(node.image.rsplit(":", 1)[1]) == 16
    assert node.pool_size == 1
    broken = found[BROKEN]
    assert broken.state == session_pb2.Template.FAILED
    assert "the build of" in broken.error
    assert "about to fail" in broken.error  # the build log's last lines
    assert "non-zero code" in broken.error
    patched = found[PATCHED]
    assert patched.state == session_pb2.Template.FAILED
    assert "does not carry the sandbox agent" in patched.error
    assert "is not the agent of the sandbox image" in patched.error
    foreign = found[FOREIGN]
    assert foreign.state == session_pb2.Template.FAILED
    assert "its entrypoint is ['/bin/sh']" in foreign.error
    preload = found[PRELOAD]
    assert preload.state == session_pb2.Template.FAILED
    assert "its environment changes ['LD_PRELOAD']" in preload.error
    debian = found[DEBIAN]  # refused before any build: nothing of it reaches the engine
    assert debian.state == session_pb2.Template.FAILED
    assert "its first FROM is 'debian:bookworm'; it must be the sandbox image" in debian.error
    engine = docker.from_env()
    labels = engine.images.get(node.image).labels
    engine.close()
    assert labels[LABEL_TEMPLATE] == NODE
    assert labels["ocsb.instance"] == plane.instance


async def test_a_template_session_runs_the_templates_image_with_the_same_hardening(plane: Plane) -> None:
    node = (await _settled(plane.client))[NODE]
    session = await plane.client.create_session(template=NODE)
    assert session.template == NODE
    assert (await plane.client.get_session(session.id)).template == NODE
    engine = docker.from_env()
    container = engine.containers.get(f"ocsb-{plane.instance}-{session.sandbox_id}")
    engine.close()
    assert container.attrs["Config"]["Image"] == node.image
    assert container.labels[LABEL_TEMPLATE] == NODE
    verify_hardening(container.attrs, Resources(1.0, 1024, 512), None)  # raises on any option the engine dropped
    ran = await plane.client.run(session.id, ["bash", "-c", "node -e 'console.log(6*7)'; cat /opt/template/hello.txt"])
    assert (ran.exit_code, ran.stdout.decode()) == (0, f"42\n{NONCE}\n")
    # The template's setuid-root shell gives the tool user nothing: no-new-privileges, no capabilities, no network.
    probe = "rootbash -p -c 'id -u; grep -E \"^(CapEff|NoNewPrivs)\" /proc/self/status'; ls /sys/class/net"
    ran = await plane.client.run(session.id, ["bash", "-c", probe])
    lines = ran.stdout.decode().split()
    assert lines[0] != "0"
    assert lines[1:5] == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1"]
    assert lines[5:] == ["lo"]
    await plane.client.delete_session(session.id)


async def test_a_templates_warm_pool_hands_out_its_own_sandboxes(plane: Plane) -> None:
    pools = plane.plane.sessions._provider._pools  # type: ignore[attr-defined]
    pool = pools.pool_for("acme", NODE)
    deadline = time.monotonic() + 60
    while pool.stats().ready < 1:
        assert time.monotonic() < deadline, "the template's pool was never filled"
        await asyncio.sleep(0.2)
    pooled = pool.ids()
    session = await plane.client.create_session(template=NODE)
    assert session.sandbox_id in pooled
    plain = await plane.client.create_session()
    assert plain.sandbox_id not in pooled
    assert plain.template == "default"
    ran = await plane.client.run(plain.id, ["bash", "-c", "command -v node || echo none"])
    assert ran.stdout.decode() == "none\n"  # the default image has no node: each session runs its own image
    await plane.client.delete_session(session.id)
    await plane.client.delete_session(plain.id)


async def test_custom_tools_run_in_a_template_session(plane: Plane) -> None:
    files = {".opencode/tool/echo.ts": ECHO_TS, ".opencode/tool/greet.py": PY_TOOL}
    session = await plane.client.create_session(template=NODE, workspace_archive=tar_of(files))
    listing = await plane.client.list_tools(session.id)
    assert set(custom_tools(listing)) == {"echo", "greet"}, listing.load_errors
    echoed = await plane.client.execute_tool(session.id, "echo", {"text": "hi"})
    assert echoed.output == "echo: hi", echoed.error
    greeted = await plane.client.execute_tool(session.id, "greet", {"name": "ann"})
    assert greeted.output == "hello ann from python", greeted.error
    await plane.client.delete_session(session.id)


async def test_a_tenant_is_held_to_its_templates_and_a_refusal_leaves_nothing(
    plane: Plane, other: AsyncClient,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await other.create_session(template=NODE)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert denied.value.details() == f"tenant 'other' may not use template '{NODE}' (it may use ['default'])"
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await other.create_session(template="rust")
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert unknown.value.details() == "unknown template 'rust'; this tenant may use ['default']"
    assert [t.name for t in await other.list_templates()] == ["default"]
    assert list(await other.list_sessions(include_deleted=True)) == []
    session = await other.create_session()
    assert session.template == "default"


async def test_a_failed_template_is_refused_and_blocks_nothing_else(plane: Plane) -> None:
    before = [s.id for s in await plane.client.list_sessions(include_deleted=True)]
    for name in (BROKEN, PATCHED, FOREIGN, PRELOAD, DEBIAN):
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await plane.client.create_session(template=name)
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert str(failed.value.details()).startswith(f"template '{name}' is not usable: ")
    assert [s.id for s in await plane.client.list_sessions(include_deleted=True)] == before  # no FAILED session
    session = await plane.client.create_session()
    assert session.state == session_pb2.Session.READY
    await plane.client.delete_session(session.id)


async def test_the_next_start_finds_the_built_template_and_does_not_rebuild(
    plane: Plane, templates: list[dict[str, Any]],
) -> None:
    node = (await _settled(plane.client))[NODE]
    engine = docker.from_env()
    image_id = engine.images.get(node.image).id
    async with running_plane("docker", tenants=TENANTS, templates=templates, pool={"size": 0}) as again:
        found = {t.name: t for t in await again.client.list_templates()}  # right after start: nothing building
        assert found[NODE].state == session_pb2.Template.READY
        assert found[NODE].image == node.image
        assert engine.images.get(node.image).id == image_id  # the same image: found by its tag, not built again
    engine.close()


async def _pool_records(data_dir: Path, count: int) -> None:
    """Waits until `count` sandboxes are recorded ready in the pool (a kill before that leaves them `creating`)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            with sqlite3.connect(data_dir / "controlplane.db") as db:
                pooled = db.execute("SELECT count(*) FROM sandboxes WHERE state = 'pool'").fetchone()[0]
        except sqlite3.OperationalError:
            pooled = 0
        if pooled >= count:
            return
        assert time.monotonic() < deadline, f"only {pooled} of {count} pool sandboxes became ready"
        await asyncio.sleep(0.2)


def _pooled_by_template(instance: str) -> dict[str, str]:
    return {c.labels[LABEL_TEMPLATE]: c.labels["ocsb.sandbox"] for c in instance_containers(instance)
            if c.status == "running"}


async def test_a_restarted_plane_adopts_pooled_sandboxes_of_its_templates_only(
    plane: Plane, templates: list[dict[str, Any]],
) -> None:
    data_dir, instance = short_tmp(), new_instance("tpl")
    node = [t for t in templates if t["name"] == NODE]
    process = PlaneProcess(data_dir, instance, pool_size=1)
    process.env["CONTROLPLANE_TEMPLATES"] = json.dumps(node)
    try:
        await process.start()
        await _pool_records(data_dir, 2)
        pooled = _pooled_by_template(instance)
        assert set(pooled) == {"default", NODE}
        process.kill()

        target = await process.start()  # the same templates: both pooled sandboxes go back to their pools
        async with AsyncClient(target, process.token()) as client:
            session = await client.create_session(template=NODE)
            assert session.sandbox_id == pooled[NODE]
            await client.delete_session(session.id)
        await _pool_records(data_dir, 2)
        pooled = _pooled_by_template(instance)
        process.kill()

        del process.env["CONTROLPLANE_TEMPLATES"]  # the template is gone: its pooled sandbox is not adopted
        target = await process.start()
        after = _pooled_by_template(instance)
        assert after.get("default") == pooled["default"]
        assert NODE not in after
        async with AsyncClient(target, process.token()) as client:
            plain = await client.create_session()
            assert plain.sandbox_id == pooled["default"]
            with pytest.raises(grpc.aio.AioRpcError) as gone:
                await client.create_session(template=NODE)
            assert gone.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            await client.delete_session(plain.id)
    finally:
        await process.stop()
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)


async def _cli(plane: Plane, *argv: str) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env = {**clean, "CONTROLPLANE_TARGET": plane.plane.address, "CONTROLPLANE_TOKEN": plane.token}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controlplane", *argv, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode is not None
    return child.returncode, out.decode(), err.decode()


async def test_the_command_line_lists_templates_and_creates_on_one(plane: Plane) -> None:
    code, out, err = await _cli(plane, "template", "list")
    assert code == 0, err
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines()[1:] if not line.split()[0].endswith(":")}
    assert rows["default"] == ["READY", "1"]
    assert rows[NODE] == ["READY", "1"]
    assert rows[BROKEN][0] == "FAILED"
    assert f"{BROKEN}: the build of" in out
    code, out, err = await _cli(plane, "--json", "template", "list")
    assert code == 0, err
    assert {t["name"]: t["state"] for t in json.loads(out)}[NODE] == "READY"
    code, out, err = await _cli(plane, "session", "create", "--template", NODE, "-q")
    assert code == 0, err
    assert (await plane.client.get_session(out.strip())).template == NODE
    await plane.client.delete_session(out.strip())
    code, out, err = await _cli(plane, "session", "create", "--template", "nope", "-q")
    assert (code, out) == (2, "")
    assert "unknown template 'nope'" in err
