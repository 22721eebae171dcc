"""Pause and resume on the two-node swarm: the workspace travels through the plane's snapshot storage, so a
session resumes on whichever node Swarm places its new sandbox (here the node its tenant is constrained to)."""

from __future__ import annotations

from typing import Any

import docker
import pytest

from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.cluster.support import Cluster, SwarmPlane

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def _tasks(plane: SwarmPlane, sandbox_id: str) -> list[Any]:
    api: Any = docker.from_env().api
    try:
        return list(api.tasks(filters={"service": f"ocsb-{plane.instance}-{sandbox_id}", "desired-state": "running"}))
    except docker.errors.NotFound:  # the service itself is gone
        return []


async def test_pause_and_resume_on_each_node(cluster: Cluster, plane: SwarmPlane) -> None:
    for tenant, node in (("alpha", cluster.manager), ("beta", cluster.worker)):
        client = plane.clients[tenant]
        session = await client.create_session(workspace_archive=tar_of({"work.txt": f"{tenant}\n"}))
        done = await client.run(session.id, command="echo more >> /workspace/work.txt")
        assert done.exit_code == 0, done.stderr
        paused = await client.pause(session.id)
        assert paused.state == session_pb2.Session.PAUSED
        assert _tasks(plane, session.sandbox_id) == []
        resumed = await client.resume(session.id)
        assert resumed.state == session_pb2.Session.READY
        assert resumed.sandbox_id != session.sandbox_id
        [task] = _tasks(plane, resumed.sandbox_id)
        assert task["NodeID"] == node
        done = await client.run(session.id, command="cat /workspace/work.txt")
        assert done.stdout == f"{tenant}\nmore\n".encode()
        await client.delete_session(session.id)
