"""Deleting sessions and stopping the provider leaves nothing of the instance on either node."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.cluster.support import Cluster, swarm_plane

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def volume_names(cluster: Cluster, exclude_others_of: str = "") -> set[str]:
    """Volumes on both nodes (anonymous ones carry no labels, so new ones are found by difference); other
    control planes' labelled volumes (other work shares the manager's engine) are left out when asked."""
    api: Any = docker.from_env().api
    worker: Any = cluster.worker_client().api
    names = set()
    for node, node_api in (("manager", api), ("worker", worker)):
        for volume in node_api.volumes()["Volumes"] or []:
            owner = (volume.get("Labels") or {}).get("ocsb.instance")
            if not (exclude_others_of and owner and owner != exclude_others_of):
                names.add(f"{node} {volume['Name']}")
    return names


def leftovers(cluster: Cluster, instance: str, volumes: set[str]) -> list[str]:
    label = {"label": f"ocsb.instance={instance}"}
    api: Any = docker.from_env().api
    worker: Any = cluster.worker_client().api
    found = [f"service {s['Spec']['Name']}" for s in api.services(filters=label)]
    found += [f"network {n['Name']}" for n in api.networks(filters=label)]
    found += [f"config {c['Spec']['Name']}" for c in api.configs(filters=label)]
    found += [f"secret {c['Spec']['Name']}" for c in api.secrets(filters=label)]
    for name, node_api in (("manager", api), ("worker", worker)):
        found += [f"{name} container {c['Names']}" for c in node_api.containers(all=True, filters=label)]
    found += [f"volume {name}" for name in sorted(volume_names(cluster, instance) - volumes)]
    root = Path(cluster.state["NODE_ROOT"])
    found += [f"socket dir {p}" for p in root.glob(f"*/{instance}/*")]
    return found


async def test_teardown_leaves_nothing_on_either_node(cluster: Cluster) -> None:
    volumes = volume_names(cluster)  # other work on the engine may remove some meanwhile: only new ones count
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
