"""A control plane on the two-node swarm of `make cluster-up`; skipped when there is none."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.cluster.support import Cluster, SwarmPlane, running_cluster, swarm_plane


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    found, why = running_cluster()
    if found is None:
        pytest.skip(why)
    return found


@pytest.fixture(scope="module")
async def plane(cluster: Cluster) -> AsyncIterator[SwarmPlane]:
    async with swarm_plane() as p:
        yield p
