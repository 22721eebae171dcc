"""The default `provider.workspace_disk = "auto"` (sandbox/swarm/disk_auto.py) on the two-node swarm: listing the
worker's engine is all it takes for a FAILED session's workspace to be kept (a disk on each node, as with `true`);
without it the plane says, in one line, which node is not covered and what to do, and sessions run on both nodes
on the tmpfs as before. Resolved once at start: a node whose engine is not held afterwards (as one joining) runs no
session, and a restart that resolves off still keeps and releases the disks of sessions made with one."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time

import docker
import grpc
import pytest

from controlplane.config import SwarmProviderConfig
from controlplane.sandbox.swarm.provider import SwarmSandboxProvider
from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.cluster.support import Cluster, swarm_plane
from tests.cluster.test_swarm_workspace_disks import (
    _leftovers,
    _nothing_left,
    _sh,
    a_failed_session_on_each_node_keeps_its_workspace,
)
from tests.planes import new_instance, short_tmp

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

LOGGER = "controlplane.sandbox.swarm"


def _auto_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and "workspace_disk = auto" in r.getMessage()]


async def test_listing_every_nodes_engine_keeps_a_failed_sessions_workspace_by_default(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        async with swarm_plane(settings={"lifetime": {"retain_s": 3600}},
                               node_engines=[cluster.state["WORKER_SOCK"]]) as plane:
            config = plane.plane.settings.provider
            assert isinstance(config, SwarmProviderConfig)
            assert config.workspace_disk == "auto"  # the default: not passed above
            [line] = _auto_lines(caplog)
            assert line.startswith("workspace_disk = auto: on"), line
            provider = plane.plane.sessions.provider
            assert isinstance(provider, SwarmSandboxProvider)
            assert provider.workspace_disk is True
            await a_failed_session_on_each_node_keeps_its_workspace(cluster, plane)
            instance = plane.instance
    await _nothing_left(cluster, instance)


async def test_a_node_without_its_engine_turns_auto_off_says_which_and_sessions_still_run(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        async with swarm_plane() as plane:
            [line] = _auto_lines(caplog)
            assert line.startswith("workspace_disk = auto: off"), line
            assert cluster.worker in line, line
            assert cluster.manager not in line, line
            assert "node_engines" in line, line
            assert "workspace_disk = false" in line, line
            provider = plane.plane.sessions.provider
            assert isinstance(provider, SwarmSandboxProvider)
            assert provider.workspace_disk is False
            for tenant, node in (("alpha", cluster.manager), ("beta", cluster.worker)):
                client = plane.clients[tenant]
                session = await client.create_session()
                assert provider.node_of(session.sandbox_id) == node
                done = await _sh(client, session.id, "echo kept > /workspace/f && cat /workspace/f && "
                                                     "grep ' /workspace ' /proc/mounts")
                assert done.exit_code == 0, done.stderr
                assert done.stdout.startswith(b"kept\n")
                assert done.stdout.split()[3] == b"tmpfs", done.stdout
                await client.delete_session(session.id)
            assert _leftovers(cluster, plane.instance) == []  # the manager's probe left nothing behind


async def test_false_makes_no_probe_and_no_line(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        async with swarm_plane(workspace_disk=False) as plane:
            assert _auto_lines(caplog) == []
            provider = plane.plane.sessions.provider
            assert isinstance(provider, SwarmSandboxProvider)
            assert provider.workspace_disk is False


async def test_a_node_whose_engine_is_not_held_after_the_start_runs_no_session_while_auto_is_on(
        cluster: Cluster) -> None:
    """As a node that joins after the start: auto stays on (resolved once), and placement leaves that node out
    rather than give a task there an unbounded workspace."""
    async with swarm_plane(node_engines=[cluster.state["WORKER_SOCK"]], start_timeout_s=15) as plane:
        provider = plane.plane.sessions.provider
        assert isinstance(provider, SwarmSandboxProvider)
        assert provider.workspace_disk is True
        disks = provider._disks  # the engines it holds, as the start found them
        assert disks is not None
        disks.engines.pop(cluster.worker).close()
        anywhere = plane.clients["gamma"]
        for _ in range(3):
            session = await anywhere.create_session()
            assert provider.node_of(session.sandbox_id) == cluster.manager
            mount = (await _sh(anywhere, session.id, "grep ' /workspace ' /proc/mounts")).stdout.split()
            assert mount[2] == b"ext4", mount
            await anywhere.delete_session(session.id)
        with pytest.raises(grpc.aio.AioRpcError):  # beta runs only on the worker
            await plane.clients["beta"].create_session()
        instance = plane.instance
    await _nothing_left(cluster, instance)


async def test_when_auto_turns_off_after_a_run_with_disks_those_disks_are_still_kept_and_released(
        cluster: Cluster) -> None:
    """A restart that no longer lists the worker: new sessions get the tmpfs, but a session made with a disk before
    still keeps its workspace when it fails, and its disk goes with its deletion."""
    data_dir = short_tmp()
    settings = {"data_dir": str(data_dir), "instance": new_instance("c"), "lifetime": {"retain_s": 3600}}
    try:
        async with swarm_plane(settings=settings, delete_sessions=False,
                               node_engines=[cluster.state["WORKER_SOCK"]]) as first:
            old = await first.clients["alpha"].create_session(workspace_archive=tar_of({"work.txt": "kept\n"}))
        async with swarm_plane(settings=settings) as second:
            provider = second.plane.sessions.provider
            assert isinstance(provider, SwarmSandboxProvider)
            assert provider.workspace_disk is False
            client = second.clients["alpha"]
            new = await client.create_session()
            mount = (await _sh(client, new.id, "grep ' /workspace ' /proc/mounts")).stdout.split()
            assert mount[2] == b"tmpfs", mount
            engine = docker.from_env()
            [container] = engine.containers.list(filters={"label": f"ocsb.sandbox={old.sandbox_id}"})
            await asyncio.to_thread(container.kill)
            engine.close()
            deadline = time.monotonic() + 30
            while (await client.get_session(old.id)).state != session_pb2.Session.FAILED:
                assert time.monotonic() < deadline, "the session did not fail"
                await asyncio.sleep(0.3)
            deadline = time.monotonic() + 30
            while not (kept := [s for s in await client.list_snapshots() if s.session_id == old.id]):
                assert time.monotonic() < deadline, "the failed session kept no workspace"
                await asyncio.sleep(0.3)
            restored = await client.create_session(from_snapshot=kept[0].id)
            done = await _sh(client, restored.id, "cat /workspace/work.txt")
            assert done.stdout == b"kept\n", done.stderr
            for ended in (old.id, new.id, restored.id):
                await client.delete_session(ended)
            await client.delete_snapshot(kept[0].id)
            await _nothing_left(cluster, second.instance)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
