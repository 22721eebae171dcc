from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.planes import Plane, running_plane


@pytest.fixture(scope="session")
async def docker_plane() -> AsyncIterator[Plane]:
    """One Docker-backed control plane shared by the Docker tests (pool of 2)."""
    async with running_plane("docker", pool={"size": 2, "refill_concurrency": 2}) as plane:
        yield plane


@pytest.fixture(scope="session")
async def local_plane() -> AsyncIterator[Plane]:
    """A control plane whose sandboxes are in-process agents (fast, no isolation)."""
    async with running_plane("local") as plane:
        yield plane
