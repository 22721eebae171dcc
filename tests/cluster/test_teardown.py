"""Deleting sessions and stopping the provider leaves nothing of the instance on either node."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.cluster.conftest import Cluster, swarm_plane

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def volume_counts(cluster: Cluster) -> tuple[int, int]:
    api: Any = docker.from_env().api
    worker: Any = cluster.worker_client().api
    return len(api.volumes()["Volumes"] or []), len(worker.volumes()["Volumes"] or [])


def leftovers(cluster: Cluster, instance: str, volumes: tuple[int, int]) -> list[str]:
    label = {"label": f"ocsb.instance={instance}"}
    api: Any = docker.from_env().api
    worker: Any = cluster.worker_client().api
    found = [f"service {s['Spec']['Name']}" for s in api.services(filters=label)]
    found += [f"network {n['Name']}" for n in api.networks(filters=label)]
    found += [f"config {c['Spec']['Name']}" for c in api.configs(filters=label)]
    found += [f"secret {c['Spec']['Name']}" for c in api.secrets(filters=label)]
    for name, node_api in (("manager", api), ("worker", worker)):
        found += [f"{name} container {c['Names']}" for c in node_api.containers(all=True, filters=label)]
    if volume_counts(cluster) != volumes:  # anonymous volumes carry no labels
        found.append(f"volumes: {volume_counts(cluster)}, before {volumes}")
    root = Path(cluster.state["NODE_ROOT"])
    found += [f"socket dir {p}" for p in root.glob(f"*/{instance}/*")]
    return found


async def test_teardown_leaves_nothing_on_either_node(cluster: Cluster) -> None:
    volumes = volume_counts(cluster)
    async with swarm_plane(pool_size=1) as plane:
        instance = plane.instance
        sessions = [await plane.clients["alpha"].create_session(), await plane.clients["beta"].create_session()]
        for session, tenant in zip(sessions, ("alpha", "beta"), strict=True):
            assert (await plane.clients[tenant].run(session.id, ["true"])).exit_code == 0
        assert leftovers(cluster, instance, volumes)  # the check sees what is there
    deadline = time.monotonic() + 60
    left = await asyncio.to_thread(leftovers, cluster, instance, volumes)
    while left and time.monotonic() < deadline:  # the worker removes its containers a moment later
        await asyncio.sleep(0.5)
        left = await asyncio.to_thread(leftovers, cluster, instance, volumes)
    assert left == []
