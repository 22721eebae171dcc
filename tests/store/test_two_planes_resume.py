"""Two control planes on one store (a shared SQLite file, then a PostgreSQL database) resume one PAUSED session
at the same moment: the store's resume claim lets exactly one give it a sandbox. The other is told which plane
resumes it, or gets the READY session; in the end one container runs it and neither plane leaves another."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.planes import instance_containers, running_plane, short_tmp

pytestmark = pytest.mark.docker
KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
TENANTS = [{"name": "acme", "token": "token-acme"}]
ROUNDS = 2


@pytest.fixture(params=KINDS)
def shared(request: pytest.FixtureRequest) -> Iterator[tuple[str, Path]]:
    """(store url, a snapshots directory both planes use)."""
    folder = short_tmp()
    url = str(request.getfixturevalue("pg_url")) if request.param == "postgres" else f"sqlite://{folder / 'shared.db'}"
    yield url, folder / "snapshots"
    shutil.rmtree(folder, ignore_errors=True)


def _containers_of(session_id: str, *instances: str) -> list[Any]:
    return [c for instance in instances for c in instance_containers(instance)
            if c.labels.get("ocsb.session") == session_id]


async def test_two_planes_resuming_one_paused_session_give_it_one_sandbox(shared: tuple[str, Path]) -> None:
    url, snapshots = shared
    common: dict[str, Any] = {"store": {"url": url, "pool_size": 4}, "snapshots": {"path": str(snapshots)},
                              "pool": {"size": 0}, "tenants": TENANTS}
    async with running_plane("docker", **common) as a, running_plane("docker", **common) as b:
        instances = (a.instance, b.instance)
        session = await a.client.create_session(workspace_archive=tar_of({"notes.txt": "kept across\n"}))
        for _ in range(ROUNDS):
            holder = a if _containers_of(session.id, a.instance) else b  # only the plane running it pauses it
            paused = await holder.client.pause(session.id)
            assert paused.state == session_pb2.Session.PAUSED
            assert not _containers_of(session.id, *instances)
            outcomes = await asyncio.gather(a.client.resume(session.id), b.client.resume(session.id),
                                            return_exceptions=True)
            final = await a.client.get_session(session.id)
            assert final.state == session_pb2.Session.READY
            for outcome in outcomes:  # the READY session, or told which plane resumes it
                if isinstance(outcome, grpc.aio.AioRpcError):
                    assert outcome.code() == grpc.StatusCode.FAILED_PRECONDITION, outcome.details()
                    assert "being resumed by control plane" in (outcome.details() or ""), outcome.details()
                    assert any(repr(i) in (outcome.details() or "") for i in instances), outcome.details()
                else:
                    assert not isinstance(outcome, BaseException), outcome
                    assert outcome.sandbox_id == final.sandbox_id
            running = _containers_of(session.id, *instances)
            assert [c.labels["ocsb.sandbox"] for c in running] == [final.sandbox_id]  # one, none left over
            done = await b.client.run(session.id, command="cat notes.txt")
            assert done.stdout == b"kept across\n"
