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
import pytest

from tests.cluster.support import Cluster, free_port
from tests.plane_kills import killed_mid_resume, killed_mid_snapshot
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


def _services_of(session_id: str) -> list[object]:
    api: Any = docker.from_env().api
    return [s["Spec"]["Name"] for s in api.services(filters={"label": f"ocsb.session={session_id}"})]


async def test_a_plane_killed_mid_resume_leaves_no_service_and_the_session_resumable(cluster: Cluster) -> None:
    async with swarm_process(cluster) as process:
        await killed_mid_resume(process, _services_of, settle_s=60)


async def test_a_plane_killed_while_writing_a_snapshot_leaves_none(cluster: Cluster) -> None:
    async with swarm_process(cluster) as process:
        await killed_mid_snapshot(process, 60_000_000)
