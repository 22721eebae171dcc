"""Swarm sandboxes are confined in the kernel like Docker ones: a tool uid block of their own, unique across the
swarm's nodes, and the agent's syscall filter (io_setup and the other host-wide tables refused)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from controlplane.sandbox.layout import LABEL_MANAGED, LABEL_TOOL_UID
from controlplane.sandbox.swarm.tool_blocks import create_with_block
from controlplane.sandbox.tool_ids import BLOCK, ToolIds, host_ids
from tests.cluster.support import Cluster, SwarmPlane
from tests.cluster.test_swarm import node_of

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
IMAGE = os.environ.get("OCSB_TEST_IMAGE", "ocsb-sandbox:latest")

AIO = """
import ctypes, errno
libc = ctypes.CDLL("libc.so.6", use_errno=True)
ctx = ctypes.c_ulong(0)
print("io_setup", libc.syscall(206, 1, ctypes.byref(ctx)), errno.errorcode.get(ctypes.get_errno()))
"""


async def test_swarm_sandboxes_run_tools_as_their_own_uid_block_under_the_filter(
    cluster: Cluster, plane: SwarmPlane,
) -> None:
    on_manager = await plane.clients["alpha"].create_session()
    on_worker = await plane.clients["beta"].create_session()
    assert node_of(plane, on_manager.sandbox_id) == cluster.manager
    assert node_of(plane, on_worker.sandbox_id) == cluster.worker
    uids = []
    for tenant, session in (("alpha", on_manager), ("beta", on_worker)):
        client = plane.clients[tenant]
        called = await client.execute_tool(session.id, "bash", {
            "command": "id -u; id -g; grep -E '^(NoNewPrivs|Seccomp_filters):' /proc/self/status; "
                       f"python3 - <<'PY'\n{AIO.strip()}\nPY",
            "description": "identity and io_setup",
        })
        uid, gid, no_new_privs, filters, aio = called.output.splitlines()
        assert uid == gid
        assert no_new_privs == "NoNewPrivs:\t1"
        assert filters == "Seccomp_filters:\t2"  # the engine's default profile, then the agent's own
        assert aio == "io_setup -1 EPERM"  # the platform's syscall filter: no host-wide AIO context taken
        uids.append(int(uid))
        # Exec runs as the same identity.
        done = await client.run(session.id, ["id", "-u"])
        assert done.stdout.decode() == f"{uid}\n"
        api: Any = docker.from_env().api
        labels = api.inspect_service(f"ocsb-{plane.instance}-{session.sandbox_id}")["Spec"]["Labels"]
        assert labels[LABEL_TOOL_UID] == uid
    assert all(200_000 <= uid < 200_000 + 65_536 for uid in uids), uids
    assert abs(uids[0] - uids[1]) >= BLOCK  # whole blocks: the servers' uids follow the tool uid
    assert not set(uids) & (host_ids(Path("/etc/passwd")) | {1000})


def _remove_services(api: Any, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(docker.errors.NotFound):
            api.remove_service(name)


async def test_two_hosts_choosing_at_once_never_keep_the_same_block(cluster: Cluster) -> None:
    """Two control planes on different hosts (each its own claims dir, so nothing host-wide orders them) choose
    a block at the same moment: both pick the first free one, both create their service, and only the one the
    managers created first keeps it; the other chooses again."""
    api: Any = docker.from_env().api
    first = 260_000  # a range of its own: what other tests hold is not in the way
    chose = threading.Barrier(2, timeout=30)
    names = [f"ocsb-blocktest-{i}-{threading.get_ident()}" for i in range(2)]
    made: list[list[str]] = [[], []]
    claim_dirs: list[Path] = []

    def plane(index: int) -> tuple[str, int]:
        claims = Path(tempfile.mkdtemp(prefix=f"claims{index}", dir="/tmp"))
        claim_dirs.append(claims)
        tool_ids = ToolIds(first, 4 * BLOCK, claims_dir=claims)
        attempt = {"n": 0}

        def create(uid: int) -> str:
            attempt["n"] += 1
            if attempt["n"] == 1:
                chose.wait()  # both have chosen before either service exists
            name = f"{names[index]}-{attempt['n']}"
            made[index].append(name)
            created = api.create_service(
                docker.types.TaskTemplate(docker.types.ContainerSpec(IMAGE, command=["sleep", "60"])),
                name=name, labels={LABEL_MANAGED: "true", LABEL_TOOL_UID: str(uid)},
            )
            return str(created["ID"])

        return create_with_block(tool_ids, api, f"test-{index}", create,
                                 lambda: _remove_services(api, made[index][-1:]))

    try:
        (service_a, uid_a), (service_b, uid_b) = await asyncio.gather(
            asyncio.to_thread(plane, 0), asyncio.to_thread(plane, 1))
        assert {uid_a, uid_b} == {first, first + BLOCK}  # the same first choice, one kept it, one moved on
        assert sorted(len(m) for m in made) == [1, 2]  # the loser's first service was removed
        live = api.services(filters={"label": LABEL_TOOL_UID})
        held = {s["ID"]: s["Spec"]["Labels"][LABEL_TOOL_UID] for s in live if s["ID"] in (service_a, service_b)}
        assert held == {service_a: str(uid_a), service_b: str(uid_b)}
        losers = [m[0] for m in made if len(m) == 2]
        assert not api.services(filters={"name": losers[0]})
    finally:
        _remove_services(api, made[0] + made[1])
        for claims in claim_dirs:
            shutil.rmtree(claims, ignore_errors=True)
