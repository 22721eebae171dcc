"""Each tenant's sandboxes under a CPU cgroup parent of its own, of equal weight, on real containers (runc and
gVisor): a cold create lands under its tenant's parent, a claimed pooled sandbox moves there with its CPU limit,
processes its tools start afterwards are there too, and a parent goes once its tenant's last session does."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import docker
import pytest

from controlplane import app
from controlplane.client import AsyncClient, allow_once
from controlplane.config import load_settings
from controlplane.errors import ConfigError
from controlplane.sandbox.tenant_cgroups import TenantCgroups, cgroup_mounts, cpu_group_of, group_name
from tests.planes import new_instance, remove_instance_leftovers, short_tmp
from tests.runtimes import RUNTIMES, runsc_missing

pytestmark = pytest.mark.docker

TENANTS = [{"name": "alpha", "token": "token-alpha"}, {"name": "beta", "token": "token-beta"}]


def cpu_root() -> Path:
    mounts = cgroup_mounts()
    v1 = [m for m, kind, controllers in mounts if kind == "cgroup" and "cpu" in controllers]
    return v1[0] if v1 else next(m for m, kind, _ in mounts if kind == "cgroup2")


def weight_of(group: Path) -> str:
    file = group / "cpu.shares" if (group / "cpu.shares").exists() else group / "cpu.weight"
    return file.read_text().strip()


def parents_everywhere(instance: str) -> list[Path]:
    """This instance's groups in every cgroup hierarchy mounted here (the engine makes a parent in each)."""
    return [g for m, _, _ in cgroup_mounts() for g in m.glob(f"ocsb-{instance}/*")] + \
        [m / f"ocsb-{instance}" for m, _, _ in cgroup_mounts() if (m / f"ocsb-{instance}").is_dir()]


def container_of(instance: str, sandbox_id: str) -> Any:
    return docker.from_env().containers.get(f"ocsb-{instance}-{sandbox_id}")


def container_pids(container: Any) -> list[int]:
    """Every host pid of the container, from its pids group (a hierarchy the claim does not move)."""
    mounts = cgroup_mounts()
    pids = next((m for m, kind, controllers in mounts if kind == "cgroup" and "pids" in controllers), None)
    if pids is None:
        pytest.skip("no cgroup v1 pids hierarchy: the moved-group check reads one")
    parent = container.attrs["HostConfig"]["CgroupParent"].strip("/")
    return [int(p) for p in (pids / parent / container.id / "cgroup.procs").read_text().split()]


@asynccontextmanager
async def two_tenant_plane(runtime: str, pool_size: int) -> AsyncIterator[app.ControlPlane]:
    data_dir, instance = short_tmp(), new_instance("tcg")
    provider: dict[str, Any] = {"type": "docker", "image": os.environ.get("OCSB_TEST_IMAGE", "ocsb-sandbox:latest")}
    if runtime != "runc":
        provider["runtime"] = runtime
    settings = load_settings(None, data_dir=data_dir, instance=instance, provider=provider, tenants=TENANTS,
                             pool={"size": pool_size, "refill_concurrency": 1}, server={"listen": "127.0.0.1:0"})
    plane = await app.start(settings)
    try:
        yield plane
    finally:
        await app.stop(plane)
        remove_instance_leftovers(instance)
        shutil.rmtree(data_dir, ignore_errors=True)
        for group in parents_everywhere(instance):  # only if the plane left some (the test then failed anyway)
            for child in sorted(group.glob("**/"), key=lambda p: -len(p.parts)):
                if child.is_dir():
                    child.rmdir()


async def pool_ready(plane: app.ControlPlane, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while plane.sessions._provider.pool_stats().ready < 1:
        assert time.monotonic() < deadline, "the warm pool did not fill"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_two_tenants_sandboxes_sit_under_two_parents_of_equal_weight_and_a_pooled_one_moves(
        runtime: str) -> None:
    if runtime == "runsc" and (why := runsc_missing()):
        pytest.skip(why)
    async with two_tenant_plane(runtime, pool_size=1) as plane:
        instance, root = plane.settings.instance, cpu_root()
        await pool_ready(plane)
        pool_name = group_name(instance, "")
        pool_group = root / pool_name
        assert pool_group.is_dir()
        async with AsyncClient(plane.address, "token-alpha") as alpha, \
                AsyncClient(plane.address, "token-beta") as beta:
            pooled = await alpha.create_session()  # the pool's one ready sandbox: claimed, so moved
            cold = await beta.create_session()  # the pool is refilling: a cold create under beta's parent
            alpha_name, beta_name = group_name(instance, "alpha"), group_name(instance, "beta")
            alpha_group, beta_group = root / alpha_name, root / beta_name
            assert alpha_group != beta_group
            assert weight_of(alpha_group) == weight_of(beta_group) == weight_of(root / "docker")
            # The plane's tenants together weigh what the engine's other containers do.
            assert alpha_group.parent == beta_group.parent == pool_group.parent
            assert weight_of(alpha_group.parent) == weight_of(root / "docker")

            moved = container_of(instance, pooled.sandbox_id)
            assert moved.attrs["HostConfig"]["CgroupParent"] == "/" + pool_name  # made for the pool
            assert not (pool_group / moved.id / "cgroup.procs").read_text().split()  # nothing left behind
            # Its CPU limit came along: the session's CPUs, as the engine set them on the pooled container.
            quota = int((alpha_group / moved.id / "cpu.cfs_quota_us").read_text())
            period = int((alpha_group / moved.id / "cpu.cfs_period_us").read_text())
            assert quota / period == pytest.approx(moved.attrs["HostConfig"]["NanoCpus"] / 1e9)
            # Processes its tools start after the claim are in alpha's group too (a call running meanwhile).
            call = asyncio.create_task(alpha.execute_tool(
                pooled.id, "bash", {"command": "sleep 2; echo done", "description": "Sleep"},
                on_permission=allow_once))
            await asyncio.sleep(1.0)
            pids = container_pids(moved)
            assert len(pids) >= 3  # init, the agent, and the call's shell at least
            for pid in pids:
                assert cpu_group_of(pid) == f"/{alpha_name}/{moved.id}", pid
            assert (await call).output == "done\n"

            made = container_of(instance, cold.sandbox_id)
            assert made.attrs["HostConfig"]["CgroupParent"] == "/" + beta_name
            for pid in container_pids(made):
                assert cpu_group_of(pid) == f"/{beta_name}/{made.id}", pid

            # A parent goes (in every hierarchy) with its tenant's last session; the other tenant's stays.
            await alpha.delete_session(pooled.id)
            assert not [g for g in parents_everywhere(instance) if g.name == alpha_group.name]
            assert beta_group.is_dir()
            await beta.delete_session(cold.id)
            assert not [g for g in parents_everywhere(instance) if g.name == beta_group.name]


async def test_a_tenant_with_two_sessions_keeps_its_parent_until_the_second_is_deleted() -> None:
    async with two_tenant_plane("runc", pool_size=0) as plane:
        group = cpu_root() / group_name(plane.settings.instance, "alpha")
        async with AsyncClient(plane.address, "token-alpha") as alpha:
            first, second = await alpha.create_session(), await alpha.create_session()
            children = {p.name for p in group.iterdir() if p.is_dir()}
            assert {container_of(plane.settings.instance, s.sandbox_id).id for s in (first, second)} <= children
            await alpha.delete_session(first.id)
            assert group.is_dir()
            await alpha.delete_session(second.id)
            assert not group.exists()


def test_required_weights_refuse_to_start_where_no_cpu_hierarchy_is_mounted(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"  # a host whose mount table has no cgroup hierarchy
    mountinfo.write_text("22 1 0:21 / /proc rw,nosuid - proc proc rw\n")
    client = docker.from_env()
    try:
        with pytest.raises(ConfigError, match="tenant_cpu_weight is true but no CPU cgroup hierarchy"):
            TenantCgroups("x", True, mountinfo).start(client)
        unset = TenantCgroups("x", None, mountinfo)
        unset.start(client)  # unset: off, with a warning, and nothing asked of the engine
        assert not unset.enabled
        assert unset.join("sandbox", "alpha") == {}
    finally:
        client.close()
