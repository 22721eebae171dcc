"""The files API in the Python clients: a mixin for `AsyncClient` and its twin for the sync `Client`.

Paths in a session are relative to its workspace or absolute under /workspace. Contents travel in 1 MiB
messages; `write_file` and `upload` read local files and directories as they send them (a directory is
tarred into a temporary file first), and `download` spools the archive to a temporary file before it is
extracted, so neither holds a workspace in memory. The archive a sandbox sends is untrusted: it is extracted
with Python's `data` filter, and what that refuses (absolute names, `..`, links leading out of `dest`,
devices) is left out and listed in the result.
"""

from __future__ import annotations

import asyncio
import os
import tarfile
import tempfile
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, TypeVar

import grpc

from controlplane.stream_accept import accepted
from controlplane.v1 import file_pb2, file_pb2_grpc

if TYPE_CHECKING:
    from controlplane.client import AsyncClient

T = TypeVar("T")
CHUNK = 1024 * 1024
FileInfo = file_pb2.FileInfo
ListFilesResponse = file_pb2.ListFilesResponse
UploadResponse = file_pb2.UploadResponse
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
"""A local file with one of these names is uploaded as an archive (extracted); any other as itself."""


class Readable(Protocol):
    """An open binary source: a file, a pipe, anything with `read(size) -> bytes` (b"" at its end)."""

    def read(self, size: int, /) -> bytes: ...


@dataclass
class Downloaded:
    """What `download` wrote under `dest`, and the archive members it refused (with the reason)."""

    extracted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


async def _read_chunks(source: Readable) -> AsyncIterator[bytes]:
    while block := await asyncio.to_thread(source.read, CHUNK):
        yield block


def _tar_into(out: IO[bytes], source: Path) -> None:
    """`source` as a tar: a directory's contents, or one file under its own name."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        if source.is_dir():
            for child in sorted(source.iterdir()):
                archive.add(child, arcname=child.name)
        else:
            archive.add(source, arcname=source.name)


def _extract(archive: IO[bytes], dest: Path) -> Downloaded:
    """Extracts an untrusted archive into `dest` member by member, leaving out what the `data` filter refuses."""
    result = Downloaded()
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=archive, mode="r|") as tar:
        for member in tar:
            try:
                safe = tarfile.data_filter(member, str(dest))
            except tarfile.FilterError as exc:
                result.skipped.append(f"{member.name}: {exc}")
                continue
            tar.extract(safe, dest, set_attrs=True, filter="fully_trusted")
            result.extracted.append(safe.name)
    return result


class AsyncFiles:
    """FileService calls; mixed into AsyncClient (which provides the channel and the call metadata)."""

    _channel: grpc.aio.Channel

    @property
    def _metadata(self) -> tuple[tuple[str, str], ...]:
        raise NotImplementedError

    @property
    def _files(self) -> file_pb2_grpc.FileServiceAsyncStub:
        return file_pb2_grpc.FileServiceStub(self._channel)

    async def write_file(
        self, session_id: str, path: str, data: bytes | str | os.PathLike[str] | Readable, *,
        mode: int | None = None, create_parents: bool = True,
    ) -> FileInfo:
        """Creates or replaces `path` with `data` (bytes, or a local file's path or open binary file)."""
        first = file_pb2.WriteFileRequest(session_id=session_id, path=path, create_parents=create_parents)
        if mode is not None:
            first.mode = mode

        async def requests() -> AsyncIterator[file_pb2.WriteFileRequest]:
            if not await accepted(call):
                return  # refused: writing now would turn the server's status into a local INTERNAL
            yield first
            if isinstance(data, bytes):
                for offset in range(0, len(data), CHUNK):
                    yield file_pb2.WriteFileRequest(data=data[offset:offset + CHUNK])
            elif isinstance(data, (str, os.PathLike)):
                with open(data, "rb") as source:  # noqa: ASYNC230 - read in a thread below
                    async for block in _read_chunks(source):
                        yield file_pb2.WriteFileRequest(data=block)
            else:
                async for block in _read_chunks(data):
                    yield file_pb2.WriteFileRequest(data=block)

        call = self._files.WriteFile(requests(), metadata=self._metadata)
        return await call

    async def read_file(self, session_id: str, path: str) -> bytes:
        """The whole content of one file (for large files, `download` writes to disk instead)."""
        request = file_pb2.ReadFileRequest(session_id=session_id, path=path)
        out = bytearray()
        async for response in self._files.ReadFile(request, metadata=self._metadata):
            out += response.data
        return bytes(out)

    async def list_files(
        self, session_id: str, path: str = "", *, recursive: bool = False, limit: int = 0,
    ) -> ListFilesResponse:
        """A directory's entries (a file's own entry); `.truncated` says `limit` (or the bound) cut them."""
        request = file_pb2.ListFilesRequest(session_id=session_id, path=path, recursive=recursive, limit=limit)
        return await self._files.ListFiles(request, metadata=self._metadata)

    async def upload(self, session_id: str, source: bytes | str | os.PathLike[str], dest: str = "") -> UploadResponse:
        """Puts `source` into the directory `dest` of the workspace: tar bytes, a local .tar/.tar.gz/.tgz file
        (extracted), a local directory (its contents) or any other local file (as itself)."""
        if isinstance(source, bytes):
            return await self._upload_stream(session_id, dest, _bytes_chunks(source))
        local = Path(source)
        if not await asyncio.to_thread(local.exists):
            raise FileNotFoundError(f"{local}: no such file or directory")
        if local.name.endswith(ARCHIVE_SUFFIXES) and await asyncio.to_thread(local.is_file):
            with local.open("rb") as archive:  # noqa: ASYNC230 - read in a thread below
                return await self._upload_stream(session_id, dest, _read_chunks(archive))
        with tempfile.TemporaryFile() as spool:
            await asyncio.to_thread(_tar_into, spool, local)
            spool.seek(0)
            return await self._upload_stream(session_id, dest, _read_chunks(spool))

    async def _upload_stream(self, session_id: str, dest: str, chunks: AsyncIterator[bytes]) -> UploadResponse:
        async def requests() -> AsyncIterator[file_pb2.UploadRequest]:
            if not await accepted(call):
                return
            yield file_pb2.UploadRequest(session_id=session_id, path=dest)
            async for block in chunks:
                yield file_pb2.UploadRequest(data=block)

        call = self._files.Upload(requests(), metadata=self._metadata)
        return await call

    async def download(
        self, session_id: str, paths: list[str] | None = None, *, dest: str | os.PathLike[str],
    ) -> Downloaded:
        """Extracts `paths` (files or directories; None: the whole workspace) under the local directory `dest`,
        each at its path relative to the workspace."""
        request = file_pb2.DownloadRequest(session_id=session_id, paths=paths or [])
        with tempfile.TemporaryFile() as spool:
            async for response in self._files.Download(request, metadata=self._metadata):
                await asyncio.to_thread(spool.write, response.data)
            spool.seek(0)
            return await asyncio.to_thread(_extract, spool, Path(dest))


async def _bytes_chunks(data: bytes) -> AsyncIterator[bytes]:
    for offset in range(0, len(data), CHUNK):
        yield data[offset:offset + CHUNK]


class Files:
    """The sync `Client`'s twin of AsyncFiles, method for method."""

    _async: AsyncClient

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError

    def write_file(
        self, session_id: str, path: str, data: bytes | str | os.PathLike[str] | Readable, *,
        mode: int | None = None, create_parents: bool = True,
    ) -> FileInfo:
        return self._call(self._async.write_file(session_id, path, data, mode=mode, create_parents=create_parents))

    def read_file(self, session_id: str, path: str) -> bytes:
        return self._call(self._async.read_file(session_id, path))

    def list_files(self, session_id: str, path: str = "", *, recursive: bool = False,
                   limit: int = 0) -> ListFilesResponse:
        return self._call(self._async.list_files(session_id, path, recursive=recursive, limit=limit))

    def upload(self, session_id: str, source: bytes | str | os.PathLike[str], dest: str = "") -> UploadResponse:
        return self._call(self._async.upload(session_id, source, dest))

    def download(self, session_id: str, paths: list[str] | None = None, *,
                 dest: str | os.PathLike[str]) -> Downloaded:
        return self._call(self._async.download(session_id, paths, dest=dest))
