"""controlplane.v1.FileService: the caller's own reads and writes of a session's workspace.

The control plane never touches the workspace's disk: it checks the tenant and the path's spelling, then relays
chunks to the sandbox's agent, which does the work as the tool user with every link confined to the workspace
(sandbox_agent/fileops.py). Chunks pass one at a time in both directions (gRPC flow control holds the rest), so a
100 MiB file never sits in the control plane's memory. Each call is audited (kind `file`: the operation, its
paths, the bytes moved), and a token revoked mid-transfer ends the transfer at its next chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from controlplane.core.permissions.audit import AuditEntry, AuditLog, NoAudit
from controlplane.core.seam.files import FileEntry, workspace_relative
from controlplane.core.seam.provider import Sandbox
from controlplane.core.sessions.manager import SessionManager
from controlplane.errors import ControlPlaneError, InvalidArgumentError, SandboxLostError
from controlplane.rpc.auth import Authenticator
from controlplane.rpc.drain import drain
from controlplane.rpc.errors import abort_with
from controlplane.v1 import file_pb2, file_pb2_grpc

T = TypeVar("T")
CHUNK = 1024 * 1024
"""Bytes per message the control plane sends (what it receives is the client's choice, up to the message limit)."""
DRAIN_S, DRAIN_BYTES, DRAIN_IDLE_S = 30.0, 64 * 1024 * 1024, 5.0
"""How much of a refused upload is read on so that its writer sees the refusal: an upload is a steady stream of
chunks from the caller's disk, slower to stop than a terminal's stdin."""
_TYPES = {"file": file_pb2.FileInfo.FILE, "directory": file_pb2.FileInfo.DIRECTORY,
          "symlink": file_pb2.FileInfo.SYMLINK, "other": file_pb2.FileInfo.OTHER}


def _info(entry: FileEntry) -> file_pb2.FileInfo:
    return file_pb2.FileInfo(path=entry.path, type=_TYPES.get(entry.type, file_pb2.FileInfo.OTHER),
                             size=entry.size, mode=entry.mode, mtime_ms=entry.mtime_ms, link_target=entry.link_target)


@dataclass
class _Transfer:
    """One audited file call: what it touched and how much moved."""

    tenant: str = ""
    session_id: str = ""
    paths: tuple[str, ...] = ()
    bytes: int = 0
    outcome: str = "cancelled"
    detail: str = "the client went away"
    refusal: ControlPlaneError | None = None
    """Why the caller's stream was cut off mid-transfer (its token refused)."""


class FileService(file_pb2_grpc.FileServiceServicer):
    def __init__(self, sessions: SessionManager, auth: Authenticator, audit: AuditLog | None = None) -> None:
        self._sessions = sessions
        self._auth = auth
        self._audit = audit or NoAudit()

    async def _sandbox(self, context: Any, transfer: _Transfer, session_id: str) -> Sandbox:
        transfer.tenant = self._auth.tenant_of(context).name
        transfer.session_id = session_id
        if not session_id:
            raise InvalidArgumentError("session_id is required")
        return await self._sessions.sandbox_for(transfer.tenant, session_id)  # NOT_FOUND for others' sessions

    async def _end(self, context: Any, transfer: _Transfer, operation: str, exc: ControlPlaneError | None,
                   unread: AsyncIterator[Any] | None = None) -> None:
        if exc is not None and unread is not None:
            # A client still writing when the call ends sees its own write fail (INTERNAL) instead of this
            # refusal: take the rest of its stream first (bounded in time), as the agent does with ours.
            await drain(unread, seconds=DRAIN_S, max_bytes=DRAIN_BYTES, idle_s=DRAIN_IDLE_S)
        if exc is not None:
            transfer.outcome, transfer.detail = "error", str(exc)
            if isinstance(exc, SandboxLostError) and transfer.session_id:
                await self._sessions.report_lost(transfer.session_id, str(exc))
        if transfer.tenant:  # an unauthenticated call is not a tenant's
            await self._audit.record(AuditEntry(
                tenant=transfer.tenant, session_id=transfer.session_id, kind="file", tool=operation, call_id="",
                outcome=transfer.outcome, patterns=transfer.paths,
                detail=f"{transfer.bytes} bytes" + (f"; {transfer.detail}" if transfer.detail else ""),
            ))
        if exc is not None:
            await abort_with(context, exc)

    def _done(self, transfer: _Transfer, detail: str = "") -> None:
        transfer.outcome, transfer.detail = "ok", detail

    async def _received(self, context: Any, transfer: _Transfer, first: bytes,
                        rest: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        """The content of a client stream, counted, with the token checked again at every message."""
        if first:
            transfer.bytes += len(first)
            yield first
        async for message in rest:
            try:
                self._auth.tenant_of(context)
            except ControlPlaneError as exc:
                transfer.refusal = exc  # gRPC cancels the agent's call on this error: see _relayed
                raise
            if message.data:
                transfer.bytes += len(message.data)
                yield message.data

    async def _relayed(self, transfer: _Transfer, work: Awaitable[T]) -> T:
        """`work` (an agent call fed by `_received`); when the caller's stream was refused mid-transfer, gRPC
        cancels that call, and the refusal is what the caller gets (not a cancelled or lost sandbox)."""
        try:
            return await work
        except (asyncio.CancelledError, ControlPlaneError):
            if transfer.refusal is None:
                raise
            raise transfer.refusal from None

    async def _sent(self, context: Any, transfer: _Transfer, pieces: AsyncGenerator[bytes, None],
                    make: Any) -> AsyncIterator[Any]:
        """The agent's chunks as responses of at most CHUNK bytes, with the token checked again at each."""
        async with contextlib.aclosing(pieces):  # a refusal here cancels the agent's call at once
            async for piece in pieces:
                for offset in range(0, len(piece), CHUNK):
                    self._auth.tenant_of(context)
                    part = piece[offset:offset + CHUNK]
                    transfer.bytes += len(part)
                    yield make(data=part)

    async def WriteFile(
        self, request_iterator: AsyncIterator[file_pb2.WriteFileRequest], context: Any
    ) -> file_pb2.FileInfo:
        transfer, failure = _Transfer(), None
        requests = aiter(request_iterator)
        try:
            first = await anext(requests, None)
            if first is None:
                raise InvalidArgumentError("WriteFile needs a first message naming the session and the file")
            sandbox = await self._sandbox(context, transfer, first.session_id)
            path = workspace_relative(first.path)
            transfer.paths = (path,)
            if not path:
                raise InvalidArgumentError("WriteFile needs a file path, not the workspace itself")
            if first.HasField("mode") and first.mode > 0o777:
                # setuid, setgid and sticky bits have no use on a workspace file and only help an attacker.
                raise InvalidArgumentError(f"mode {first.mode:o} is not a permission mode (at most 777, octal)")
            entry = await self._relayed(transfer, sandbox.agent.write_file(
                path, self._received(context, transfer, first.data, requests),
                mode=first.mode if first.HasField("mode") else None, parents=first.create_parents,
            ))
            self._done(transfer)
            return _info(entry)
        except ControlPlaneError as exc:
            failure = exc
            raise
        finally:
            await self._end(context, transfer, "write_file", failure, requests)

    async def ReadFile(
        self, request: file_pb2.ReadFileRequest, context: Any
    ) -> AsyncIterator[file_pb2.ReadFileResponse]:
        transfer, failure = _Transfer(), None
        try:
            sandbox = await self._sandbox(context, transfer, request.session_id)
            path = workspace_relative(request.path)
            transfer.paths = (path,)
            async for response in self._sent(context, transfer, sandbox.agent.read_file(path),
                                             file_pb2.ReadFileResponse):
                yield response
            self._done(transfer)
        except ControlPlaneError as exc:
            failure = exc
        finally:
            await self._end(context, transfer, "read_file", failure)

    async def ListFiles(self, request: file_pb2.ListFilesRequest, context: Any) -> file_pb2.ListFilesResponse:
        transfer, failure = _Transfer(), None
        try:
            sandbox = await self._sandbox(context, transfer, request.session_id)
            path = workspace_relative(request.path)
            transfer.paths = (path,)
            listing = await sandbox.agent.list_files(path, request.recursive, request.limit)
            self._done(transfer, f"{len(listing.entries)} entries")
            return file_pb2.ListFilesResponse(entries=[_info(e) for e in listing.entries],
                                              truncated=listing.truncated, target=_info(listing.target))
        except ControlPlaneError as exc:
            failure = exc
            raise
        finally:
            await self._end(context, transfer, "list_files", failure)

    async def Upload(
        self, request_iterator: AsyncIterator[file_pb2.UploadRequest], context: Any
    ) -> file_pb2.UploadResponse:
        transfer, failure = _Transfer(), None
        requests = aiter(request_iterator)
        try:
            first = await anext(requests, None)
            if first is None:
                raise InvalidArgumentError("Upload needs a first message naming the session and the directory")
            sandbox = await self._sandbox(context, transfer, first.session_id)
            path = workspace_relative(first.path, what="directory")
            transfer.paths = (path,)
            summary = await self._relayed(
                transfer, sandbox.agent.upload_tar(path, self._received(context, transfer, first.data, requests)))
            self._done(transfer, f"{summary.files} files, {len(summary.skipped)} members refused")
            return file_pb2.UploadResponse(files=summary.files, directories=summary.directories,
                                           symlinks=summary.symlinks, bytes=summary.bytes, skipped=summary.skipped)
        except ControlPlaneError as exc:
            failure = exc
            raise
        finally:
            await self._end(context, transfer, "upload", failure, requests)

    async def Download(
        self, request: file_pb2.DownloadRequest, context: Any
    ) -> AsyncIterator[file_pb2.DownloadResponse]:
        transfer, failure = _Transfer(), None
        try:
            sandbox = await self._sandbox(context, transfer, request.session_id)
            paths = [workspace_relative(p) for p in request.paths] or [""]
            transfer.paths = tuple(paths)
            async for response in self._sent(context, transfer, sandbox.agent.download_tar(paths),
                                             file_pb2.DownloadResponse):
                yield response
            self._done(transfer)
        except ControlPlaneError as exc:
            failure = exc
        finally:
            await self._end(context, transfer, "download", failure)
