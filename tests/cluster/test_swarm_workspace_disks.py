"""Swarm workspaces on a kept disk (`provider.workspace_disk`): a size-limited ext4 volume on the task's node that
outlives its container, so a FAILED session (its task's container killed on its node) keeps its work as a retained
snapshot; the size bound holds; nothing is left on either node after delete, nor after a crash (reconciled at the
next start)."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import grpc
import pytest

from controlplane.client import AsyncClient, Completed
from controlplane.sandbox.swarm.node_disks import NodeDisks, service_mount
from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.cluster.support import Cluster, SwarmPlane, swarm_plane
from tests.planes import new_instance, short_tmp

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

DISK_MB = 32
DISK_ROOT = "/var/lib/ocsb/disks"


def _disk_settings(cluster: Cluster) -> dict[str, Any]:
    return {"workspace_disk": True, "workspace_mb": DISK_MB, "node_engines": [cluster.state["WORKER_SOCK"]]}


@pytest.fixture(scope="module")
async def disk_plane(cluster: Cluster) -> AsyncIterator[SwarmPlane]:
    async with swarm_plane(settings={"lifetime": {"retain_s": 3600}}, **_disk_settings(cluster)) as p:
        yield p


def _engines(cluster: Cluster) -> dict[str, docker.DockerClient]:
    return {cluster.manager: docker.from_env(), cluster.worker: cluster.worker_client()}


async def _nothing_left(cluster: Cluster, instance: str) -> None:
    """Disks are released in the background once their task's container has stopped."""
    deadline = time.monotonic() + 30
    while left := _leftovers(cluster, instance):
        assert time.monotonic() < deadline, f"left behind: {left}"
        await asyncio.sleep(0.5)


def _leftovers(cluster: Cluster, instance: str) -> list[str]:
    """This instance's volumes and disk helpers on either node, disk images under the disk root and loop devices."""
    found = []
    for node, client in _engines(cluster).items():
        volumes = client.volumes.list(filters={"label": f"ocsb.instance={instance}"})
        found += [f"{node} volume {v.name}" for v in volumes]
        helpers = client.containers.list(all=True, filters={"label": [f"ocsb.instance={instance}",
                                                                      "ocsb.role=disk-helper"]},
                                         ignore_removed=True)  # a helper may end between listing and inspection
        found += [f"{node} helper {c.id}" for c in helpers]
        client.close()
    root = Path(DISK_ROOT) / instance
    found += [f"image {p}" for p in root.rglob("*.img")] if root.exists() else []
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False).stdout
    found += [f"loop {line}" for line in loops.splitlines() if f"/{instance}/" in line]
    return found


async def _sh(client: AsyncClient, session_id: str, command: str) -> Completed:
    return await client.run(session_id, command=command)


async def test_a_failed_session_on_each_node_keeps_its_workspace(cluster: Cluster, disk_plane: SwarmPlane) -> None:
    await a_failed_session_on_each_node_keeps_its_workspace(cluster, disk_plane)


async def a_failed_session_on_each_node_keeps_its_workspace(cluster: Cluster, disk_plane: SwarmPlane) -> None:
    """Also the default's (`workspace_disk = "auto"`, test_swarm_workspace_disk_default.py)."""
    for tenant, node in (("alpha", cluster.manager), ("beta", cluster.worker)):
        client = disk_plane.clients[tenant]
        session = await client.create_session(workspace_archive=tar_of({"work.txt": f"{tenant}\n"}))
        done = await _sh(client, session.id, "cd /workspace && echo more >> work.txt && mkdir d && "
                                             "printf x > d/f && ln -s work.txt link")
        assert done.exit_code == 0, done.stderr
        engine = _engines(cluster)[node]
        [container] = engine.containers.list(filters={"label": f"ocsb.sandbox={session.sandbox_id}"})
        await asyncio.to_thread(container.kill)
        deadline = time.monotonic() + 30
        while (await client.get_session(session.id)).state != session_pb2.Session.FAILED:
            assert time.monotonic() < deadline, f"{tenant}'s session did not fail"
            with pytest.raises(grpc.aio.AioRpcError):
                await _sh(client, session.id, "true")
        kept = [s for s in await client.list_snapshots() if s.session_id == session.id]
        assert [s.retained for s in kept] == [True], f"{tenant}'s failed session kept no workspace"
        restored = await client.create_session(from_snapshot=kept[0].id)
        done = await _sh(client, restored.id, "cd /workspace && cat work.txt link d/f && readlink link")
        assert done.stdout == f"{tenant}\nmore\n{tenant}\nmore\nxwork.txt\n".encode(), done.stderr
        for ended in (session.id, restored.id):
            await client.delete_session(ended)
        await client.delete_snapshot(kept[0].id)
        engine.close()
    await _nothing_left(cluster, disk_plane.instance)


async def test_the_workspace_is_bounded_and_allows_exec_on_each_node(cluster: Cluster, disk_plane: SwarmPlane) -> None:
    for tenant in ("alpha", "beta"):
        client = disk_plane.clients[tenant]
        session = await client.create_session()
        done = await _sh(client, session.id, f"dd if=/dev/zero of=/workspace/big bs=1M count={DISK_MB * 2}")
        assert done.exit_code != 0
        assert b"No space left on device" in done.stderr
        done = await _sh(client, session.id, "rm /workspace/big && df -m /workspace | tail -1 && "
                                             "printf '#!/bin/sh\\necho ran\\n' > /workspace/s.sh && "
                                             "chmod +x /workspace/s.sh && /workspace/s.sh")
        assert done.exit_code == 0, done.stderr
        size_mb = int(done.stdout.split()[1])
        assert DISK_MB / 2 < size_mb <= DISK_MB
        assert done.stdout.endswith(b"ran\n")
        mount = (await _sh(client, session.id, "grep ' /workspace ' /proc/mounts")).stdout.decode().split()
        assert mount[2] == "ext4", mount
        assert {"nosuid", "nodev"} <= set(mount[3].split(",")), mount  # no setuid file nor device node of the model's
        await client.delete_session(session.id)
    await _nothing_left(cluster, disk_plane.instance)


async def test_pause_releases_the_disk_and_resume_brings_the_workspace_back(cluster: Cluster,
                                                                           disk_plane: SwarmPlane) -> None:
    for tenant, node in (("alpha", cluster.manager), ("beta", cluster.worker)):
        client = disk_plane.clients[tenant]
        session = await client.create_session(workspace_archive=tar_of({"work.txt": f"{tenant}\n"}))
        assert any(s.endswith(f"volume ocsb-{disk_plane.instance}-{session.sandbox_id}-ws")
                   for s in _leftovers(cluster, disk_plane.instance) if s.startswith(node))
        await client.pause(session.id)
        await _nothing_left(cluster, disk_plane.instance)  # the workspace is in the plane's snapshot storage
        resumed = await client.resume(session.id)
        done = await _sh(client, session.id, "cat /workspace/work.txt")
        assert done.stdout == f"{tenant}\n".encode(), done.stderr
        await client.delete_session(resumed.id)
        for snapshot in await client.list_snapshots():
            await client.delete_snapshot(snapshot.id)
    await _nothing_left(cluster, disk_plane.instance)


async def test_a_session_lost_while_its_plane_was_down_keeps_its_disk_until_deleted(cluster: Cluster) -> None:
    data_dir = short_tmp()
    settings = {"data_dir": str(data_dir), "instance": new_instance("c")}
    try:
        async with swarm_plane(settings=settings, delete_sessions=False, **_disk_settings(cluster)) as first:
            session = await first.clients["beta"].create_session(workspace_archive=tar_of({"work.txt": "kept\n"}))
        worker = cluster.worker_client()
        [container] = worker.containers.list(filters={"label": f"ocsb.sandbox={session.sandbox_id}"})
        await asyncio.to_thread(container.kill)
        worker.close()
        async with swarm_plane(settings=settings, **_disk_settings(cluster)) as second:
            client = second.clients["beta"]
            assert (await client.get_session(session.id)).state == session_pb2.Session.FAILED
            await asyncio.sleep(5)  # longer than a release takes: a destroyed disk would be gone by now
            volume = f"{cluster.worker} volume ocsb-{second.instance}-{session.sandbox_id}-ws"
            assert volume in _leftovers(cluster, second.instance)
            kept = b"".join([chunk async for chunk in second.plane.sessions.provider.salvage(session.sandbox_id)])
            with tarfile.open(fileobj=io.BytesIO(kept)) as tar:
                assert (tar.extractfile("work.txt") or io.BytesIO()).read() == b"kept\n"
            await client.delete_session(session.id)
            await _nothing_left(cluster, second.instance)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


async def test_a_plane_start_removes_disks_a_crash_left_on_both_nodes(cluster: Cluster) -> None:
    instance = new_instance("c")
    manager = docker.from_env()
    disks = NodeDisks(manager, [cluster.state["WORKER_SOCK"]], instance, _image(), DISK_ROOT, 16)
    await asyncio.to_thread(disks.start)
    labels = {"ocsb.managed": "true", "ocsb.instance": instance, "ocsb.image": _image()}
    failed = await asyncio.to_thread(disks.prepare, "0123456789ab", [cluster.manager, cluster.worker], labels)
    assert failed == []
    assert len(_leftovers(cluster, instance)) == 6  # a volume, an image and a loop device per node
    worker = cluster.worker_client()  # and a helper a crash left behind
    worker.containers.create(_image(), command=["true"], labels={**labels, "ocsb.role": "disk-helper"})
    worker.close()
    assert len(_leftovers(cluster, instance)) == 7
    await asyncio.to_thread(disks.close)
    manager.close()
    async with swarm_plane(settings={"instance": instance}, **_disk_settings(cluster)):
        assert _leftovers(cluster, instance) == []


def _image() -> str:
    """The sandbox image the planes use (support.swarm_plane's choice)."""
    return os.environ.get("OCSB_TEST_IMAGE", "ocsb-sandbox:latest")


async def test_a_node_without_a_prepared_disk_fails_the_task_rather_than_give_it_an_unbounded_workspace(
        cluster: Cluster) -> None:
    instance = new_instance("c")
    manager = docker.from_env()
    spec = docker.types.ContainerSpec(_image(), command=["sleep", "60"],
                                      mounts=[service_mount(instance, "feedface0001")])
    template = docker.types.TaskTemplate(
        spec, restart_policy=docker.types.RestartPolicy(condition="none"),
        placement=docker.types.Placement(constraints=[f"node.id=={cluster.worker}"]))
    api: Any = manager.api  # docker-py's low-level client is untyped
    service = api.create_service(template, name=f"ocsb-{instance}-probe",
                                 labels={"ocsb.managed": "true", "ocsb.instance": instance})
    try:
        deadline = time.monotonic() + 60
        while True:
            tasks = api.tasks(filters={"service": service["ID"]})
            states = [(t["Status"]["State"], t["Status"].get("Err", "")) for t in tasks]
            if any(state in ("failed", "rejected") for state, _ in states):
                break
            assert not any(state == "running" for state, _ in states), "the task ran on a volume of no disk"
            assert time.monotonic() < deadline, states
            await asyncio.sleep(0.5)
        assert any("ocsb-no-workspace-disk" in err for _, err in states), states
    finally:
        api.remove_service(service["ID"])
    disks = NodeDisks(manager, [cluster.state["WORKER_SOCK"]], instance, _image(), DISK_ROOT, 16)
    await asyncio.to_thread(disks.start)
    await asyncio.to_thread(disks.release, "feedface0001")  # the volume Swarm made carries the sandbox's labels
    await asyncio.to_thread(disks.close)
    manager.close()
    await _nothing_left(cluster, instance)
