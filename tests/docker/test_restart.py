"""SIGKILL of the control plane: sessions are adopted, orphans removed, nothing left after delete."""

from __future__ import annotations

import docker
import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import session_pb2
from tests.planes import (
    PlaneProcess,
    instance_containers,
    instance_volumes,
    new_instance,
    remove_data_dir,
    remove_instance_leftovers,
    short_tmp,
)

pytestmark = pytest.mark.docker


async def test_sigkill_restart_adopts_sessions_and_removes_orphans() -> None:
    data_dir, instance = short_tmp(), new_instance("rs")
    process = PlaneProcess(data_dir, instance, pool_size=1)
    engine = docker.from_env()
    try:
        target = await process.start()
        async with AsyncClient(target, process.token()) as client:
            kept = await client.create_session()
            await client.run(kept.id, command="echo precious > notes.txt")
        # An orphan the store never heard of, with its volume and socket dir.
        labels = {"ocsb.managed": "true", "ocsb.instance": instance, "ocsb.sandbox": "0rphan000000"}
        engine.volumes.create(name=f"ocsb-{instance}-0rphan000000-ws", labels=labels)
        orphan = engine.containers.create("ocsb-sandbox:latest", entrypoint=["sleep", "600"], labels=labels,
                                          network_mode="none", name=f"ocsb-{instance}-0rphan000000")
        (data_dir / "sandboxes" / "0rphan000000").mkdir(parents=True)
        # A workspace volume the engine made for a mount (no labels), and one that only looks like ours.
        engine.volumes.create(name=f"ocsb-{instance}-0123456789ab-ws")
        engine.volumes.create(name=f"ocsb-{instance}-not-a-sandbox-ws")
        process.kill()

        target = await process.start()
        async with AsyncClient(target, process.token()) as client:
            session = await client.get_session(kept.id)
            assert session.state == session_pb2.Session.READY
            assert (await client.run(kept.id, ["cat", "notes.txt"])).stdout == b"precious\n"
            names = {c.name for c in instance_containers(instance)}
            assert orphan.name not in names
            assert not (data_dir / "sandboxes" / "0rphan000000").exists()
            assert all("0rphan" not in v.name for v in instance_volumes(instance))
            left = {v.name for v in instance_volumes(instance)}
            assert f"ocsb-{instance}-0123456789ab-ws" not in left
            assert f"ocsb-{instance}-not-a-sandbox-ws" in left
            engine.volumes.get(f"ocsb-{instance}-not-a-sandbox-ws").remove()
            await client.delete_session(kept.id)
        await process.stop()
        # A graceful stop drops the warm pool; the deleted session left nothing.
        assert instance_containers(instance) == []
        assert instance_volumes(instance) == []
        assert list((data_dir / "sandboxes").iterdir()) == []
    finally:
        await process.stop()
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)
