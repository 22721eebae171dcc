"""While a session is attacked, its agent still answers health and abort, and a neighbour keeps working.

A bounded number of samples with generous limits (a shared 2-core machine is noisy); the precise figures
and the 200 ms targets are in tests/bench/attack_bench.py.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from controlplane.client import Session, allow_once
from tests.bench.attack_bench import ATTACKS, idle_baseline, p, under_attack
from tests.planes import Plane

pytestmark = pytest.mark.docker

SAMPLES = int(os.environ.get("OCSB_ATTACK_SAMPLES", "6"))
ABORTS = int(os.environ.get("OCSB_ATTACK_ABORTS", "1"))


@pytest.fixture(scope="module")
async def attacked(docker_plane: Plane) -> AsyncIterator[tuple[Session, Session]]:
    victim = await docker_plane.client.create_session(memory_mb=256)
    neighbour = await docker_plane.client.create_session()
    yield victim, neighbour
    for session in (victim, neighbour):
        await docker_plane.client.delete_session(session.id)


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_agent_and_neighbour_answer_under_attack(
    docker_plane: Plane, attacked: tuple[Session, Session], attack: str, record_property: object
) -> None:
    victim, neighbour = attacked
    idle = await idle_baseline(docker_plane, neighbour, SAMPLES)
    measured = await under_attack(docker_plane, victim, neighbour, attack, SAMPLES, ABORTS)
    numbers = {"health_p99_ms": round(p(measured.health_ms, 0.99), 1), "abort_max_ms": round(max(measured.abort_ms), 1),
               "neighbour_p99_ms": round(p(measured.neighbour_ms, 0.99), 1), "idle_p99_ms": round(p(idle, 0.99), 1)}
    record_property(attack, numbers)  # type: ignore[operator]
    print(f"{attack}: {numbers}")
    assert len(measured.health_ms) == SAMPLES
    assert max(measured.health_ms) < 5000, numbers
    assert max(measured.abort_ms) < 5000, numbers
    assert p(measured.neighbour_ms, 0.99) < 2000, numbers
    # The session survives its own attack.
    out = await docker_plane.client.execute_tool(victim.id, "bash", {"command": "echo alive", "description": "After"},
                                                 on_permission=allow_once)
    assert out.output == "alive\n"
