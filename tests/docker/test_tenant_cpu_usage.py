"""GetUsage's CPU-seconds through the public API, on real containers: a tenant's CPU time is read from its
sandboxes' cgroups while they run, kept when a session is deleted and when the control plane restarts, and
counted for that tenant only."""

from __future__ import annotations

import os
from typing import Any

import pytest

from controlplane import app
from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from tests.planes import new_instance, remove_data_dir, remove_instance_leftovers, short_tmp

pytestmark = pytest.mark.docker

TENANTS = [{"name": "burner", "token": "token-burner"}, {"name": "idle", "token": "token-idle"}]
BURN_ONE_CPU_SECOND = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end:\n    pass\n"


def settings_of(data_dir: Any, instance: str) -> Any:
    provider: dict[str, Any] = {"type": "docker"}
    if os.environ.get("OCSB_TEST_IMAGE"):
        provider["image"] = os.environ["OCSB_TEST_IMAGE"]
    return load_settings(None, data_dir=data_dir, instance=instance, provider=provider, tenants=TENANTS,
                         pool={"size": 0}, server={"listen": "127.0.0.1:0"})


async def cpu_seconds(plane: app.ControlPlane, tenant: str) -> float:
    token = plane.settings.admin_token_file.read_text().strip()
    async with AsyncAdminClient(plane.address, token) as admin:
        return (await admin.usage(tenant)).cpu_seconds


async def test_a_sessions_cpu_seconds_count_for_its_tenant_and_outlive_it_and_a_restart() -> None:
    data_dir, instance = short_tmp(), new_instance("cpu")
    plane = await app.start(settings_of(data_dir, instance))
    try:
        async with AsyncClient(plane.address, "token-burner") as burner, \
                AsyncClient(plane.address, "token-idle") as idle:
            busy = await burner.create_session()
            await idle.create_session()
            started = await cpu_seconds(plane, "burner")
            burnt = await burner.run(busy.id, ["python3", "-c", BURN_ONE_CPU_SECOND])
            assert burnt.exit_code == 0, burnt.stderr
            running = await cpu_seconds(plane, "burner")
            assert running - started >= 0.5, (started, running)
            assert running >= 0.5
            # The other tenant's idle session is its own: a start-up's worth, not the burner's second.
            assert await cpu_seconds(plane, "idle") < running - 0.5
            # The metrics read the same figure (their refresh round, run here at once).
            assert plane.tenants is not None
            await plane.tenants.measure()
            assert plane.tenants.usage_seen["burner"].cpu_seconds >= running

            await burner.delete_session(busy.id)
            after_delete = await cpu_seconds(plane, "burner")
            assert after_delete >= running, (running, after_delete)
        await app.stop(plane)

        plane = await app.start(settings_of(data_dir, instance))
        assert await cpu_seconds(plane, "burner") == after_delete
    finally:
        async with AsyncClient(plane.address, "token-idle") as idle:
            for session in await idle.list_sessions():
                await idle.delete_session(session.id)
        await app.stop(plane)
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)
