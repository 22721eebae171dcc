"""Fail closed: a sandbox whose hardening cannot be applied is never created, and nothing is left behind."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import docker
import grpc
import pytest

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.core.sessions.models import Resources
from controlplane.errors import HardeningError
from controlplane.sandbox import confinement
from controlplane.sandbox.docker import verify_hardening
from controlplane.v1 import session_pb2
from tests.planes import (
    Plane,
    instance_containers,
    instance_volumes,
    new_instance,
    remove_data_dir,
    remove_instance_leftovers,
    short_tmp,
)

pytestmark = pytest.mark.docker

IMAGE = os.environ.get("OCSB_TEST_IMAGE", "ocsb-sandbox:latest")
"""The image under test: an older one, whose agent installs no syscall filter, is refused (see below)."""


@asynccontextmanager
async def plane_with_runtime(runtime: str, pool_size: int, leftovers: list[int] | None = None) -> AsyncIterator[Plane]:
    """A Docker-backed control plane whose provider asks the engine for the OCI runtime `runtime`.

    After it stops, `leftovers` receives how many of its containers and volumes were still there.
    """
    data_dir, instance = short_tmp(), new_instance("fc")
    settings = load_settings(
        None, data_dir=data_dir, instance=instance, server={"listen": "127.0.0.1:0"},
        provider={"type": "docker", "runtime": runtime, "image": IMAGE},
        pool={"size": pool_size, "refill_concurrency": 1},
    )
    plane = await app.start(settings)
    client = AsyncClient(plane.address, (data_dir / "default.token").read_text().strip())
    try:
        yield Plane(plane, client, "")
    finally:
        for session in await client.list_sessions():
            await client.delete_session(session.id)
        await client.close()
        await app.stop(plane)
        left = remove_instance_leftovers(instance)
        if leftovers is not None:
            leftovers.append(left)
        remove_data_dir(data_dir)


def left_behind(plane: Plane) -> tuple[list[Any], list[Any], list[str]]:
    sandboxes = plane.plane.settings.data_dir / "sandboxes"
    dirs = sorted(p.name for p in sandboxes.iterdir()) if sandboxes.is_dir() else []
    return instance_containers(plane.instance), instance_volumes(plane.instance), dirs


@pytest.mark.parametrize("pool_size", [0, 1], ids=["no-pool", "with-pool"])
async def test_unknown_runtime_fails_create_session_with_failed_precondition(pool_size: int) -> None:
    runtime = f"ocsb-no-such-runtime-{secrets.token_hex(3)}"
    leftovers: list[int] = []
    async with plane_with_runtime(runtime, pool_size, leftovers) as plane:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await plane.client.create_session(deadline_s=60)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert info.value.details() == (
            f"the engine refused the hardened container: Unknown runtime specified {runtime}"
        )
        [failed] = await plane.client.list_sessions()
        assert failed.state == session_pb2.Session.FAILED
        assert failed.status_message == info.value.details()
        assert plane.plane.sessions._provider.pool_stats().ready == 0
        # A pool refill may be mid-attempt (its volume exists until the refused create is undone): wait it out.
        for _ in range(40):
            if left_behind(plane) == ([], [], []):
                break
            await asyncio.sleep(0.05)
        assert left_behind(plane) == ([], [], [])
    assert leftovers == [0]


async def test_a_runtime_that_exists_is_applied_and_verified() -> None:
    async with plane_with_runtime("runc", 0) as plane:
        session = await plane.client.create_session()
        assert session.state == session_pb2.Session.READY
        container = docker.from_env().containers.get(f"ocsb-{plane.instance}-{session.sandbox_id}")
        assert container.attrs["HostConfig"]["Runtime"] == "runc"
        done = await plane.client.run(session.id, ["cat", "/proc/self/status"])
        assert b"NoNewPrivs:\t1\n" in done.stdout


@pytest.fixture(scope="module")
def soft_container() -> Any:
    """A container made WITHOUT the hardening (never started): what an engine that drops options would give."""
    name = f"ocsb-fc-soft-{secrets.token_hex(4)}"
    container = docker.from_env().containers.create(
        IMAGE, name=name, labels={"ocsb.managed": "true"}, network_mode="bridge", cap_add=["SYS_ADMIN"],
        pids_limit=100, volumes={"/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "ro"}},
    )
    yield container
    container.remove(force=True)


def test_verify_hardening_refuses_what_the_engine_really_reports(soft_container: Any) -> None:
    with pytest.raises(HardeningError) as info:
        verify_hardening(soft_container.attrs, Resources(1.0, 1024, 512), "runsc")
    assert str(info.value) == (
        "sandbox hardening could not be applied: network is 'bridge', not none; "
        "capabilities not all dropped (None); unexpected capabilities ['SYS_ADMIN']; "
        "no-new-privileges is not set; root filesystem is writable; memory limit is 0, wanted 1024 MiB; "
        "cpu limit is 0, wanted 1.0; pids limit is 100, wanted 8448; the nproc limit is unset, wanted 512 (the "
        "session's processes on gVisor); runtime is runc, wanted runsc; "
        "the Docker socket is mounted; the code snapshot dir /run/code is not a tmpfs of its own"
    )


async def test_verify_hardening_accepts_a_real_hardened_sandbox(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    container = docker.from_env().containers.get(f"ocsb-{docker_plane.instance}-{session.sandbox_id}")
    verify_hardening(container.attrs, Resources(1.0, 1024, 512), None)
    with pytest.raises(HardeningError) as info:
        verify_hardening(container.attrs, Resources(1.0, 1024, 512), "runsc")
    # Checked as a gVisor sandbox: its host pids limit and guest process limit are gVisor's (gvisor_limits.py).
    assert str(info.value) == (
        "sandbox hardening could not be applied: pids limit is 512, wanted 8448; the nproc limit is unset, "
        "wanted 512 (the session's processes on gVisor); runtime is runc, wanted runsc"
    )
    await docker_plane.client.delete_session(session.id)


def test_confinement_refuses_what_the_engine_really_reports(soft_container: Any) -> None:
    """No masked paths, no syscall filter asked for, no tool uid of the sandbox's own: each named."""
    with pytest.raises(HardeningError) as info:
        confinement.verify(soft_container.attrs, 200_008, lambda uid: True)
    assert str(info.value) == (
        # The engine's own defaults it reports as masked; what reveals other sandboxes it does not mask.
        "sandbox hardening could not be applied: paths not masked: " + ", ".join(confinement.BLOCK_DEVICE_VIEWS)
        + "; the agent's syscall filter is not asked for; the tool uid is not the sandbox's own block (None)"
        "; the sandbox's own account files are not mounted read-only"
        "; the agent does not start as root (it could not switch to the tool uid)"
    )


async def test_confinement_accepts_a_real_sandbox_and_only_its_own_uid(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    container = docker.from_env().containers.get(f"ocsb-{docker_plane.instance}-{session.sandbox_id}")
    uid = int(container.labels["ocsb.tool_uid"])
    confinement.verify(container.attrs, uid, lambda given: given == uid)
    with pytest.raises(HardeningError, match=rf"the tool uid is not the sandbox's own block \({uid}\)"):
        confinement.verify(container.attrs, uid, lambda given: False)
    assert confinement.agent_filter_problem(container.attrs["State"]["Pid"]) is None
    await docker_plane.client.delete_session(session.id)


def test_an_agent_without_its_syscall_filter_is_seen_from_the_host() -> None:
    """What `verify_agent_filter` reads: a container whose agent was not asked for the filter has only the engine's."""
    client = docker.from_env()
    hardened: dict[str, Any] = {"user": "0:0", "init": True, "network_mode": "none", "cap_drop": ["ALL"],
                "cap_add": ["SETUID", "SETGID", "KILL"], "security_opt": ["no-new-privileges"], "read_only": True,
                "tmpfs": {"/tmp": "rw,size=16m", "/run/agent": "rw,size=1m"}, "detach": True}
    plain = client.containers.run(IMAGE, environment={"AGENT_TOOL_UID": "200008"}, **hardened)
    filtered = client.containers.run(IMAGE, environment=confinement.agent_env(200_016), **hardened)
    try:
        for container in (plain, filtered):
            for _ in range(200):  # until the agent serves (as the provider checks only after its health answer)
                if container.exec_run(["test", "-S", "/run/agent/frames.sock"]).exit_code == 0:
                    break
                time.sleep(0.05)
            container.reload()
        assert confinement.agent_filter_problem(plain.attrs["State"]["Pid"]) == (
            "the agent did not install its syscall filter")
        assert confinement.agent_filter_problem(filtered.attrs["State"]["Pid"]) is None
        with pytest.raises(HardeningError, match="the agent did not install its syscall filter"):
            confinement.verify_agent_filter(plain, None)
    finally:
        plain.remove(force=True)
        filtered.remove(force=True)
