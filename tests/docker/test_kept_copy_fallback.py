"""An ending session's kept copy whose agent lets the download lapse (a compromised agent that answers its health
checks and never the copy), or makes it trickle (a model can stop and start the archiver, which runs as the tool
user), is read from the session's volume instead (pausing.py's `_salvage`): the user's work is kept as a retained
snapshot, where it was lost before. The stalling agent is the plane's own client of the real agent with its
download replaced; the retire, the volume's read and the restore are the engine's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from controlplane.core.sessions import pausing, workspace_spool
from controlplane.sandbox.agent_client import GrpcSandboxAgent
from controlplane.v1 import session_pb2
from tests.planes import running_plane

pytestmark = pytest.mark.docker


Download = Callable[[GrpcSandboxAgent, str], AsyncIterator[bytes]]


async def expire_and_restore(monkeypatch: pytest.MonkeyPatch, download: Download) -> list[bool]:
    """A session's work, its session expired with `download` in place of its agent's: the kept copy restores the
    work. For each download asked, whether it was the session's sandbox's."""
    asked: list[str] = []

    async def asking(self: GrpcSandboxAgent, path: str = "") -> AsyncIterator[bytes]:
        asked.append(self.sandbox_id)
        async for chunk in download(self, path):
            yield chunk

    monkeypatch.setattr(GrpcSandboxAgent, "download", asking)
    lifetime = {"idle_timeout_s": 2, "retain_s": 3600, "reap_interval_s": 0.5}
    async with running_plane("docker", pool={"size": 0}, lifetime=lifetime) as plane:
        client = plane.client
        session = await client.create_session()
        made = await client.run(session.id, ["bash", "-c", "echo 'the work' > notes.txt"])
        assert made.exit_code == 0, made.stderr
        deadline = time.monotonic() + 40
        while (await client.get_session(session.id)).state != session_pb2.Session.DELETED:
            assert time.monotonic() < deadline, "the session did not expire"
            await asyncio.sleep(0.2)
        [kept] = [s for s in await client.list_snapshots() if s.session_id == session.id and s.retained]
        restored = await client.create_session(from_snapshot=kept.id)
        assert await client.read_file(restored.id, "notes.txt") == b"the work\n"
        return [asked_id == session.sandbox_id for asked_id in asked]


async def test_an_expired_sessions_kept_copy_that_lapses_is_read_from_its_volume(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace_spool, "FIRST_PIECE_WAIT_S", 1.0)  # the plane runs in this process

    async def never_answers(self: GrpcSandboxAgent, path: str = "") -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""

    assert await expire_and_restore(monkeypatch, never_answers) == [True]  # asked, and it let the copy lapse


async def test_an_expired_sessions_kept_copy_that_trickles_is_read_from_its_volume(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A model can stop and start the archiver (it runs as the tool user): a byte now and then never lapses, and the
    # kept copy ran into its overall bound before, with nothing kept.
    monkeypatch.setattr(pausing, "AGENT_COPY_TIMEOUT_S", 2.0)  # the plane runs in this process

    async def trickles(self: GrpcSandboxAgent, path: str = "") -> AsyncIterator[bytes]:
        while True:
            await asyncio.sleep(0.2)
            yield b"\0"

    assert await expire_and_restore(monkeypatch, trickles) == [True]
