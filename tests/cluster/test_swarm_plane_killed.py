"""A Swarm-provider control plane SIGKILLed in the middle of a resume or a snapshot, then started again on its data
dir: no service of the interrupted resume is left, the session resumes, and no half-written snapshot is listed
(the Docker provider's tests are in tests/docker/test_pause_resume.py and test_snapshots.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import docker
import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.cluster.support import Cluster, free_port
from tests.planes import PlaneProcess, new_instance, remove_data_dir, short_tmp

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


@contextlib.asynccontextmanager
async def swarm_process(cluster: Cluster) -> AsyncIterator[PlaneProcess]:
    """`controlplane serve` on the Swarm provider as a child process (so that it can be killed); what it leaves on
    the swarm is removed afterwards by its instance label."""
    del cluster  # the fixture's: a cluster is up
    data_dir, instance = short_tmp(), new_instance("sk")
    process = PlaneProcess(data_dir, instance, pool_size=0)
    process.env |= {"CONTROLPLANE_PROVIDER__TYPE": "swarm", "CONTROLPLANE_PROVIDER__RELAY_PORT": str(free_port()),
                    "CONTROLPLANE_PROVIDER__WATCH_INTERVAL_S": "0.5"}
    if os.environ.get("OCSB_TEST_IMAGE"):
        process.env["CONTROLPLANE_PROVIDER__IMAGE"] = os.environ["OCSB_TEST_IMAGE"]
    try:
        yield process
    finally:
        await process.stop()
        await asyncio.to_thread(_remove_swarm_objects, instance)
        remove_data_dir(data_dir)


def _remove_swarm_objects(instance: str) -> None:
    api: Any = docker.from_env().api
    label = {"label": f"ocsb.instance={instance}"}
    for service in api.services(filters=label):
        with contextlib.suppress(docker.errors.NotFound):
            api.remove_service(service["ID"])
    deadline = time.monotonic() + 60  # a service's tasks hold its network until they are gone
    for kind, listed, remove in (("network", api.networks, api.remove_network),
                                 ("config", api.configs, api.remove_config),
                                 ("secret", api.secrets, api.remove_secret)):
        for found in listed(filters=label):
            while True:
                try:
                    remove(found["Id"] if kind == "network" else found["ID"])
                    break
                except docker.errors.NotFound:  # its session's deletion took it meanwhile
                    break
                except docker.errors.APIError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)


def _services_of(session_id: str) -> list[str]:
    api: Any = docker.from_env().api
    return [s["Spec"]["Name"] for s in api.services(filters={"label": f"ocsb.session={session_id}"})]


async def _sh(client: AsyncClient, session_id: str, command: str) -> str:
    done = await client.run(session_id, ["sh", "-c", command])
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


async def test_a_plane_killed_mid_resume_leaves_no_service_and_the_session_resumable(cluster: Cluster) -> None:
    async with swarm_process(cluster) as process:
        client = AsyncClient(await process.start(), process.token())
        session = await client.create_session(workspace_archive=tar_of({"work.txt": "mine\n"}))
        await _sh(client, session.id, "echo more >> /workspace/work.txt")
        await client.pause(session.id)
        assert await asyncio.to_thread(_services_of, session.id) == []
        resuming = asyncio.ensure_future(client.resume(session.id))
        deadline = time.monotonic() + 120
        while not await asyncio.to_thread(_services_of, session.id):
            assert not resuming.done(), "the resume ended before it could be interrupted"
            assert time.monotonic() < deadline, "the resume made no service"
            await asyncio.sleep(0.02)
        process.kill()
        with pytest.raises(grpc.aio.AioRpcError):
            await resuming
        await client.close()
        client = AsyncClient(await process.start(), process.token())
        state = (await client.get_session(session.id)).state
        if state == session_pb2.Session.PAUSED:  # the usual case: killed before READY was stored
            deadline = time.monotonic() + 60
            while await asyncio.to_thread(_services_of, session.id):  # reconciliation removes the half-made one
                assert time.monotonic() < deadline, await asyncio.to_thread(_services_of, session.id)
                await asyncio.sleep(0.2)
            await client.resume(session.id)
        assert await _sh(client, session.id, "cat /workspace/work.txt") == "mine\nmore\n"
        assert len(await asyncio.to_thread(_services_of, session.id)) == 1
        await client.delete_session(session.id)
        await client.close()


async def test_a_plane_killed_while_writing_a_snapshot_leaves_none(cluster: Cluster) -> None:
    async with swarm_process(cluster) as process:
        folder = process.data_dir / "snapshots" / "default"
        client = AsyncClient(await process.start(), process.token())
        session = await client.create_session()
        await _sh(client, session.id, "head -c 60000000 /dev/urandom > /workspace/noise.bin")
        taking = asyncio.ensure_future(client.snapshot(session.id))
        deadline = time.monotonic() + 120
        while not list(folder.glob(".snap_*.tmp")):  # the workspace is being written
            assert not taking.done(), "the snapshot ended before it could be interrupted"
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        process.kill()
        with contextlib.suppress(grpc.aio.AioRpcError):
            await taking
        await client.close()
        client = AsyncClient(await process.start(), process.token())
        assert await client.list_snapshots() == []
        assert not list(folder.glob("snap_*"))  # only the temporary is left, which nothing lists
        assert (await client.get_session(session.id)).state == session_pb2.Session.READY  # adopted
        snap = await client.snapshot(session.id)
        assert [s.id for s in await client.list_snapshots()] == [snap.id]
        assert snap.size_bytes > 60_000_000
        await client.delete_session(session.id)
        await client.close()
