"""A control plane SIGKILLed in the middle of a resume or a snapshot and started again on its data dir, the same
scenario on each provider (tests/docker/test_pause_resume.py and test_snapshots.py, tests/cluster's
test_swarm_plane_killed.py): what the provider made for the interrupted resume is gone, the session resumes with its
workspace, and no half-written snapshot is listed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.planes import PlaneProcess

Made = Callable[[str], list[object]]
"""What the provider holds for a session (its containers, its services), found by the session's label."""


async def _sh(client: AsyncClient, session_id: str, command: str) -> str:
    done = await client.run(session_id, ["sh", "-c", command])
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


async def killed_mid_resume(process: PlaneProcess, made: Made, settle_s: float = 0.0) -> None:
    """`settle_s`: how long after the restart the provider may take to remove what the killed resume made (a
    Docker plane removes it before it serves; a swarm's service goes with its tasks)."""
    client = AsyncClient(await process.start(), process.token())
    session = await client.create_session(workspace_archive=tar_of({"work.txt": "mine\n"}))
    await _sh(client, session.id, "echo more >> /workspace/work.txt")
    await client.pause(session.id)
    assert await asyncio.to_thread(made, session.id) == []
    resuming = asyncio.ensure_future(client.resume(session.id))
    deadline = time.monotonic() + 120
    while not await asyncio.to_thread(made, session.id):
        assert not resuming.done(), "the resume ended before it could be interrupted"
        assert time.monotonic() < deadline, "the resume made nothing"
        await asyncio.sleep(0.02)
    process.kill()
    with pytest.raises(grpc.aio.AioRpcError):
        await resuming
    await client.close()
    client = AsyncClient(await process.start(), process.token())
    state = (await client.get_session(session.id)).state
    if state == session_pb2.Session.PAUSED:  # the usual case: killed before READY was stored
        deadline = time.monotonic() + settle_s
        while left := await asyncio.to_thread(made, session.id):  # reconciliation removes the half-made sandbox
            assert time.monotonic() < deadline, left
            await asyncio.sleep(0.2)
        await client.resume(session.id)
    assert await _sh(client, session.id, "cat /workspace/work.txt") == "mine\nmore\n"
    assert len(await asyncio.to_thread(made, session.id)) == 1
    await client.delete_session(session.id)
    await client.close()


async def killed_mid_snapshot(process: PlaneProcess, size: int) -> None:
    folder = process.data_dir / "snapshots" / "default"
    client = AsyncClient(await process.start(), process.token())
    session = await client.create_session()
    await _sh(client, session.id, f"head -c {size} /dev/urandom > /workspace/noise.bin")
    taking = asyncio.ensure_future(client.snapshot(session.id))
    deadline = time.monotonic() + 120
    while not list(folder.glob(".snap_*.tmp")):  # the workspace is being written
        assert not taking.done(), "the snapshot ended before it could be interrupted"
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    process.kill()
    with contextlib.suppress(grpc.aio.AioRpcError):
        await taking
    await client.close()
    client = AsyncClient(await process.start(), process.token())
    assert await client.list_snapshots() == []
    assert not list(folder.glob("snap_*"))  # only the temporary is left, which nothing lists
    assert (await client.get_session(session.id)).state == session_pb2.Session.READY  # adopted
    snap = await client.snapshot(session.id)
    assert [s.id for s in await client.list_snapshots()] == [snap.id]
    assert snap.size_bytes > size  # random bytes do not compress
    await client.delete_session(session.id)
    await client.close()
