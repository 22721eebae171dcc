"""An idle runc sandbox's memory (issue 27: cgroup rss at most 15 MiB): a pooled sandbox holds the agent alone (the
spawner helper starts when a session claims it, spawner.py's Lifetime), and its cgroup's anonymous memory stays
under the target. Read on the host, never through the sandbox."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import docker
import pytest

from tests.bench import scale_measures
from tests.planes import Plane, running_plane

pytestmark = pytest.mark.docker

IDLE_TARGET_MIB = 15.0
"""Issue 27's target; a pooled sandbox measured 14.5 MiB when this test was written (docs/performance.md)."""
SETTLE_S = 3.0
WAIT_S = 60.0


def _commands(container: Any) -> list[str]:
    return [args for _, args in container.top(ps_args="-eo pid,args")["Processes"]]


async def _pooled_and_serving(plane: Plane) -> tuple[str, Any]:
    """The pool's sandbox id and container once its agent serves (its framed socket exists)."""
    engine = docker.from_env()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for container in engine.containers.list(filters={"label": f"ocsb.instance={plane.instance}"}):
            sandbox_id = container.labels.get("ocsb.sandbox", "")
            frames = plane.plane.settings.data_dir / "sandboxes" / sandbox_id / "frames.sock"
            if frames.is_socket():
                return sandbox_id, container
        await asyncio.sleep(0.1)
    raise AssertionError(f"no pooled sandbox served within {WAIT_S:g} s")


async def test_a_pooled_sandbox_holds_no_spawner_helper_and_stays_under_the_idle_target() -> None:
    async with running_plane("docker", pool={"size": 1}) as plane:
        sandbox_id, container = await _pooled_and_serving(plane)
        await asyncio.sleep(SETTLE_S)
        commands = _commands(container)
        assert any(c.endswith("python3 -m sandbox_agent") and "docker-init" not in c for c in commands), commands
        assert not any("spawner_helper" in c for c in commands), commands
        memory = scale_measures.container_memory(container.id)
        assert memory is not None
        assert memory.anon_mib <= IDLE_TARGET_MIB, f"{memory.anon_mib:.2f} MiB"

        # The claim starts the helper (CreateSession's code snapshot), before the session's first command.
        session = await plane.client.create_session()
        assert session.sandbox_id == sandbox_id
        deadline = time.monotonic() + WAIT_S
        while not any("spawner_helper" in c for c in _commands(container)):
            assert time.monotonic() < deadline, _commands(container)
            await asyncio.sleep(0.05)
        done = await plane.client.run(session.id, ["id", "-u"])
        assert done.exit_code == 0, done.stderr
        assert done.stdout.strip().isdigit()
        assert done.stdout.strip() != b"0"  # the tool user's, started through the helper
