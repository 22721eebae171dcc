"""The files API over the agent's gRPC channel (sandbox.v1 WriteFile, ReadFile, ListFiles, Upload/DownloadWorkspace)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import grpc

from controlplane.core.seam.files import FileEntry, FileListing, WorkspaceFiles
from controlplane.core.seam.messages import UploadSummary
from controlplane.sandbox.agent_streams import map_agent_error
from sandbox.v1 import agent_pb2, agent_pb2_grpc


def _entry(e: agent_pb2.FileEntry) -> FileEntry:
    return FileEntry(e.path, e.type, e.size, e.mode, e.mtime_ms, e.link_target)


class AgentFiles(WorkspaceFiles):
    """Mixed into the agent client, which gives `_stub` and `sandbox_id`."""

    sandbox_id: str

    @property
    def _stub(self) -> agent_pb2_grpc.SandboxAgentAsyncStub:
        raise NotImplementedError

    async def write_file(self, path: str, content: AsyncIterator[bytes], *, mode: int | None,
                         parents: bool) -> FileEntry:
        async def requests() -> AsyncIterator[agent_pb2.WriteFileRequest]:
            first = agent_pb2.WriteFileRequest(path=path, parents=parents)
            if mode is not None:
                first.mode = mode
            yield first
            async for chunk in content:
                yield agent_pb2.WriteFileRequest(chunk=chunk)

        try:
            return _entry(await self._stub.WriteFile(requests()))
        except grpc.aio.AioRpcError as exc:
            raise map_agent_error(exc, self.sandbox_id) from exc

    async def read_file(self, path: str) -> AsyncGenerator[bytes, None]:
        try:
            async for piece in self._stub.ReadFile(agent_pb2.ReadFileRequest(path=path)):
                yield piece.chunk
        except grpc.aio.AioRpcError as exc:
            raise map_agent_error(exc, self.sandbox_id) from exc

    async def list_files(self, path: str, recursive: bool, limit: int) -> FileListing:
        request = agent_pb2.ListFilesRequest(path=path, recursive=recursive, limit=limit)
        try:
            r = await self._stub.ListFiles(request)
        except grpc.aio.AioRpcError as exc:
            raise map_agent_error(exc, self.sandbox_id) from exc
        return FileListing([_entry(e) for e in r.entries], r.truncated, _entry(r.target))

    async def upload_tar(self, path: str, archive: AsyncIterator[bytes]) -> UploadSummary:
        async def requests() -> AsyncIterator[agent_pb2.UploadWorkspaceRequest]:
            yield agent_pb2.UploadWorkspaceRequest(path=path, confine_links=True)
            async for chunk in archive:
                yield agent_pb2.UploadWorkspaceRequest(chunk=chunk)

        try:
            r = await self._stub.UploadWorkspace(requests())
        except grpc.aio.AioRpcError as exc:
            raise map_agent_error(exc, self.sandbox_id) from exc
        return UploadSummary(r.files, r.directories, r.symlinks, r.bytes, list(r.skipped))

    async def download_tar(self, paths: list[str]) -> AsyncGenerator[bytes, None]:
        request = agent_pb2.DownloadWorkspaceRequest(paths=paths or [""])
        try:
            async for piece in self._stub.DownloadWorkspace(request):
                yield piece.chunk
        except grpc.aio.AioRpcError as exc:
            raise map_agent_error(exc, self.sandbox_id) from exc
