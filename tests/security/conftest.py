"""Attack vectors for the security suite: each runs a shell script inside a session the way untrusted code would.

A vector takes (client, session id, shell script) and returns what the script printed (stdout and stderr
merged). The bash tool through ExecuteTool is the first; custom-tool vectors (a `.opencode/tool/*.ts` that
spawns the script) join VECTORS later and every escape test then runs through them too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from controlplane.client import AsyncClient
from tests.planes import Plane

Runner = Callable[[AsyncClient, str, str], Awaitable[str]]


@dataclass(frozen=True)
class Vector:
    name: str
    run: Runner


async def through_bash_tool(client: AsyncClient, session_id: str, script: str) -> str:
    outcome = await client.execute_tool(
        session_id, "bash", {"command": script, "description": "Escape attempt", "timeout": 60_000}
    )
    return outcome.output


BASH = Vector("bash", through_bash_tool)
VECTORS = [BASH]


@pytest.fixture(params=VECTORS, ids=[v.name for v in VECTORS])
def vector(request: pytest.FixtureRequest) -> Vector:
    chosen: Vector = request.param
    return chosen


def python_probe(code: str, *args: str) -> str:
    """A shell snippet running `code` with the sandbox's python3 (syscalls the shell cannot make)."""
    return f"python3 - {' '.join(args)} <<'PY'\n{code.strip()}\nPY\n"


@dataclass(frozen=True)
class Pair:
    """Two sessions of the same tenant: A attacks, B is the neighbour it must not reach."""

    a: str
    a_sandbox: str
    b: str
    b_sandbox: str


@pytest.fixture(scope="module")
async def pair(docker_plane: Plane) -> AsyncIterator[Pair]:
    a = await docker_plane.client.create_session()
    b = await docker_plane.client.create_session()
    yield Pair(a.id, a.sandbox_id, b.id, b.sandbox_id)
    for session in (a, b):
        await docker_plane.client.delete_session(session.id)
