"""The worker's daemon dies: its sessions fail within a bounded time and new ones go to the manager."""

from __future__ import annotations

import asyncio
import subprocess
import time

import grpc
import pytest

from controlplane.v1 import session_pb2
from tests.cluster.conftest import CLUSTER, Cluster, swarm_plane
from tests.cluster.test_swarm import node_of

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
FAIL_WITHIN_S = 15.0


async def test_sessions_of_a_dead_worker_fail_and_can_be_recreated(cluster: Cluster) -> None:
    try:
        async with swarm_plane() as plane:
            beta, gamma = plane.clients["beta"], plane.clients["gamma"]
            doomed = await beta.create_session()
            survivor = await plane.clients["alpha"].create_session()
            assert node_of(plane, doomed.sandbox_id) == cluster.worker
            await asyncio.to_thread(subprocess.run, ["bash", str(CLUSTER), "stop-worker"], check=True)
            stopped = time.monotonic()
            while (await beta.get_session(doomed.id)).state != session_pb2.Session.FAILED:
                assert time.monotonic() - stopped < FAIL_WITHIN_S, "the session was not failed in time"
                with pytest.raises(grpc.aio.AioRpcError):
                    await beta.run(doomed.id, ["true"])
                await asyncio.sleep(0.5)
            assert (await plane.clients["alpha"].run(survivor.id, ["echo", "alive"])).stdout == b"alive\n"
            again = await gamma.create_session()
            assert node_of(plane, again.sandbox_id) == cluster.manager
            assert (await gamma.run(again.id, ["echo", "recreated"])).stdout == b"recreated\n"
    finally:  # bring the worker back (same data root: it rejoins as the same node)
        await asyncio.to_thread(subprocess.run, ["bash", str(CLUSTER), "up"], check=True)
