"""The create gate (core/sessions/fair_gate.py) in a real Docker-backed plane, through the public API: while one
tenant's burst of cold creates holds its share of the gate, another tenant's create goes in at once, beside
them, and the burst's others wait."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from controlplane.core.sessions.fair_gate import FairGate
from tests.planes import Plane, served_plane, tenant_clients

pytestmark = pytest.mark.docker

TENANTS: list[dict[str, Any]] = [{"name": "a", "token": "token-a"}, {"name": "b", "token": "token-b"}]

plane = served_plane("docker", scope="function", tenants=TENANTS, pool={"size": 0})
clients = tenant_clients(TENANTS)


def gate_of(served: Plane) -> FairGate:
    gate = served.plane.sessions._provider._creates  # type: ignore[attr-defined]  # the provider's own gate
    assert isinstance(gate, FairGate)
    return gate


async def until(condition: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the gate never got there"
        await asyncio.sleep(0.005)


async def test_another_tenants_create_goes_in_beside_a_burst(plane: Plane, clients: dict[str, Any]) -> None:
    gate = gate_of(plane)
    share = gate.per_tenant  # a lone tenant's: max(2, CPUs)
    burst = [asyncio.ensure_future(clients["a"].create_session()) for _ in range(share + 2)]
    await until(lambda: gate.held("a") == share and gate.waiting() == 2)
    other = asyncio.ensure_future(clients["b"].create_session())
    await until(lambda: gate.held("b") == 1 or other.done())
    # b is in while a still holds its whole share (no create of a's had to end first), and a's others wait
    assert (gate.held("b"), gate.held("a"), gate.waiting()) == (1, share, 2)
    made = await asyncio.gather(other, *burst)
    assert all(s.sandbox_id for s in made)
    assert (gate.busy, gate.waiting()) == (0, 0)
