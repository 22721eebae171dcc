"""Snapshot, fork, pause and resume calls of the client (SessionService); mixed into AsyncClient, and their sync
twins into Client. Restoring is `create_session(from_snapshot=ID)`."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from controlplane.v1 import session_pb2, session_pb2_grpc

if TYPE_CHECKING:
    from controlplane.client import AsyncClient

T = TypeVar("T")


class AsyncSnapshots:
    sessions: session_pb2_grpc.SessionServiceAsyncStub

    @property
    def _metadata(self) -> tuple[tuple[str, str], ...]:
        raise NotImplementedError

    async def snapshot(self, session_id: str, *, deadline_s: float | None = 600) -> session_pb2.Snapshot:
        """Stores the READY session's workspace and state; the session goes on."""
        request = session_pb2.SnapshotSessionRequest(session_id=session_id)
        return await self.sessions.SnapshotSession(request, metadata=self._metadata, timeout=deadline_s)

    async def list_snapshots(self) -> list[session_pb2.Snapshot]:
        response = await self.sessions.ListSnapshots(session_pb2.ListSnapshotsRequest(), metadata=self._metadata)
        return list(response.snapshots)

    async def delete_snapshot(self, snapshot_id: str) -> session_pb2.Snapshot:
        request = session_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id)
        return (await self.sessions.DeleteSnapshot(request, metadata=self._metadata)).snapshot

    async def fork(self, session_id: str, *, deadline_s: float | None = 600) -> session_pb2.Session:
        """A new, independent session with a copy of the session's workspace and state."""
        request = session_pb2.ForkSessionRequest(session_id=session_id)
        return await self.sessions.ForkSession(request, metadata=self._metadata, timeout=deadline_s)

    async def pause(self, session_id: str, *, deadline_s: float | None = 600) -> session_pb2.Session:
        """Stores the READY session's workspace and removes its sandbox: the session is PAUSED (its CPU and
        memory leave the tenant's quota) until `resume`."""
        request = session_pb2.PauseSessionRequest(session_id=session_id)
        return await self.sessions.PauseSession(request, metadata=self._metadata, timeout=deadline_s)

    async def resume(self, session_id: str, *, deadline_s: float | None = 600) -> session_pb2.Session:
        """A PAUSED session runs again on a fresh sandbox, with its workspace, tools and state."""
        request = session_pb2.ResumeSessionRequest(session_id=session_id)
        return await self.sessions.ResumeSession(request, metadata=self._metadata, timeout=deadline_s)

    async def delete_keeping(self, session_id: str, *, deadline_s: float | None = 600) -> session_pb2.Snapshot:
        """Deletes the session but keeps its workspace and state as a retained snapshot (restorable with
        `create_session(from_snapshot=...)` until the operator's `lifetime.retain_s` is over); that snapshot."""
        request = session_pb2.DeleteSessionRequest(session_id=session_id, keep_snapshot=True)
        return (await self.sessions.DeleteSession(request, metadata=self._metadata, timeout=deadline_s)).snapshot


class Snapshots:
    """The sync `Client`'s twin of AsyncSnapshots."""

    _async: AsyncClient

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError

    def snapshot(self, session_id: str, *, deadline_s: float | None = 600) -> session_pb2.Snapshot:
        return self._call(self._async.snapshot(session_id, deadline_s=deadline_s))

    def list_snapshots(self) -> list[session_pb2.Snapshot]:
        return self._call(self._async.list_snapshots())

    def delete_snapshot(self, snapshot_id: str) -> session_pb2.Snapshot:
        return self._call(self._async.delete_snapshot(snapshot_id))

    def fork(self, session_id: str, *, deadline_s: float | None = 600) -> session_pb2.Session:
        return self._call(self._async.fork(session_id, deadline_s=deadline_s))

    def pause(self, session_id: str, *, deadline_s: float | None = 600) -> session_pb2.Session:
        return self._call(self._async.pause(session_id, deadline_s=deadline_s))

    def resume(self, session_id: str, *, deadline_s: float | None = 600) -> session_pb2.Session:
        return self._call(self._async.resume(session_id, deadline_s=deadline_s))

    def delete_keeping(self, session_id: str, *, deadline_s: float | None = 600) -> session_pb2.Snapshot:
        return self._call(self._async.delete_keeping(session_id, deadline_s=deadline_s))
