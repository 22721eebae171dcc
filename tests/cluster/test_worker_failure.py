"""The worker's daemon dies: its sessions are reported failed within a bounded time without anyone using
them, and new ones go to the manager."""

from __future__ import annotations

import asyncio
import subprocess
import time

import grpc
import pytest

from controlplane.core.sessions.events import BusEvent
from controlplane.v1 import session_pb2
from tests.cluster.support import CLUSTER, Cluster, swarm_plane
from tests.cluster.test_swarm import node_of

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
FAIL_WITHIN_S = 10.0
"""From the start of the worker daemon's shutdown (its relay, under an init, ends at the SIGTERM): three
missed relay pings 0.5 s apart, then the session manager ends the session it holds at once; about 2 s here."""


async def test_sessions_of_a_dead_worker_fail_at_once_and_can_be_recreated(cluster: Cluster) -> None:
    try:
        async with swarm_plane(settings={"lifetime": {"reap_interval_s": 1.0}}) as plane:
            beta, gamma = plane.clients["beta"], plane.clients["gamma"]
            doomed = await beta.create_session()
            survivor = await plane.clients["alpha"].create_session()
            assert node_of(plane, doomed.sandbox_id) == cluster.worker
            failures: list[tuple[str, str]] = []

            async def record(event: BusEvent) -> None:
                if event.type == "session.failed":
                    failures.append((event.session_id, event.properties["message"]))

            plane.plane.sessions.bus.listen(record)
            stopping = asyncio.ensure_future(
                asyncio.to_thread(subprocess.run, ["bash", str(CLUSTER), "stop-worker"], check=True)
            )
            started = time.monotonic()
            # Nothing uses the session: the provider's watcher reports the loss, not a failing call.
            while (failed := await beta.get_session(doomed.id)).state != session_pb2.Session.FAILED:
                assert time.monotonic() - started < FAIL_WITHIN_S, "the session was not failed in time"
                await asyncio.sleep(0.2)
            await stopping
            assert failed.status_message in (
                f"sandbox {doomed.sandbox_id} is lost: its node {cluster.worker} stopped answering",
                f"sandbox {doomed.sandbox_id} is lost: its task is no longer running",
            )
            await asyncio.sleep(0.1)  # listeners run in the background
            assert failures == [(doomed.id, failed.status_message)]
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await beta.run(doomed.id, ["true"])
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert refused.value.details() == f"session {doomed.id} is FAILED ({failed.status_message})"
            assert (await plane.clients["alpha"].run(survivor.id, ["echo", "alive"])).stdout == b"alive\n"
            again = await gamma.create_session()
            assert node_of(plane, again.sandbox_id) == cluster.manager
            assert (await gamma.run(again.id, ["echo", "recreated"])).stdout == b"recreated\n"
    finally:  # bring the worker back (same data root: it rejoins as the same node)
        await asyncio.to_thread(subprocess.run, ["bash", str(CLUSTER), "up"], check=True)
