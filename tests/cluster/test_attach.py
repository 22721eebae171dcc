"""A second control plane on the same store reaches the first one's sandboxes on both nodes (attach)."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from controlplane.sandbox.swarm.provider import SwarmSandboxProvider
from tests.cluster.support import Cluster, swarm_plane
from tests.planes import short_tmp

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def services_of(instance: str) -> list[str]:
    api: Any = docker.from_env().api
    return [s["Spec"]["Name"] for s in api.services(filters={"label": [f"ocsb.instance={instance}",
                                                                        "ocsb.role=sandbox"]})]


def socket_dirs(cluster: Cluster, instance: str) -> list[Path]:
    return list(Path(cluster.state["NODE_ROOT"]).glob(f"*/{instance}/*"))


async def test_a_second_plane_runs_tools_in_the_first_planes_sandboxes(cluster: Cluster) -> None:
    shared_dir = short_tmp()
    shared = {"store": {"url": f"sqlite:///{shared_dir}/shared.db"}, "lifetime": {"reap_interval_s": 1.0}}
    try:
        async with swarm_plane(settings=shared) as a:
            on_manager = await a.clients["alpha"].create_session()
            on_worker = await a.clients["beta"].create_session()
            async with swarm_plane(settings=shared, delete_sessions=False) as b:
                provider = b.plane.sessions._provider
                assert isinstance(provider, SwarmSandboxProvider)
                for tenant, session, node in (("alpha", on_manager, cluster.manager),
                                              ("beta", on_worker, cluster.worker)):
                    wrote = await b.clients[tenant].execute_tool(
                        session.id, "bash", {"command": f"echo 'from b on {tenant}' > b.txt && echo done",
                                             "description": "write through plane b"},
                    )
                    assert wrote.output == "done\n"
                    read = await a.clients[tenant].execute_tool(session.id, "read", {"filePath": "/workspace/b.txt"})
                    assert read.output == (
                        "<path>/workspace/b.txt</path>\n<type>file</type>\n<content>"
                        f"1: from b on {tenant}\n\n(End of file - total 1 lines)\n</content>"
                    )
                    assert (await provider.attach(session.sandbox_id)).details["node_id"] == node
                # Plane b only reached them: it owns no sandbox service and made no socket dir of its own.
                assert services_of(b.instance) == []
                assert socket_dirs(cluster, b.instance) == []

                # Deleted through b: the owner removes the service, b drops its channel.
                await b.clients["beta"].delete_session(on_worker.id)
                gone = f"ocsb-{a.instance}-{on_worker.sandbox_id}"
                deadline = time.monotonic() + 20
                while gone in services_of(a.instance) or on_worker.sandbox_id in provider._attached:
                    assert time.monotonic() < deadline, "the deleted session's sandbox was not removed in time"
                    await asyncio.sleep(0.3)
                assert (await a.clients["alpha"].run(on_manager.id, ["echo", "still"])).stdout == b"still\n"
    finally:
        shutil.rmtree(shared_dir, ignore_errors=True)
