"""The files API's requests to a sandbox agent, in domain terms (controlplane.v1.FileService's seam)."""

from __future__ import annotations

import abc
import posixpath
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from controlplane.core.seam.messages import UploadSummary
from controlplane.errors import InvalidArgumentError


@dataclass(frozen=True)
class FileEntry:
    path: str
    """Relative to the workspace ("" for the workspace itself)."""
    type: str
    """file, directory, symlink or other."""
    size: int
    mode: int
    mtime_ms: int
    link_target: str = ""


@dataclass(frozen=True)
class FileListing:
    entries: list[FileEntry]
    truncated: bool
    target: FileEntry
    """The listed path's own entry."""


class WorkspaceFiles(abc.ABC):
    """What an agent does for the files API: as the sandbox's tool user, every path confined to the workspace
    (relative paths; the agent checks again, links included)."""

    @abc.abstractmethod
    async def write_file(self, path: str, content: AsyncIterator[bytes], *, mode: int | None,
                         parents: bool) -> FileEntry:
        """Replaces the file with `content` once it has all arrived; voids every session's read of it."""

    @abc.abstractmethod
    def read_file(self, path: str) -> AsyncGenerator[bytes, None]: ...

    @abc.abstractmethod
    async def list_files(self, path: str, recursive: bool, limit: int) -> FileListing: ...

    @abc.abstractmethod
    async def upload_tar(self, path: str, archive: AsyncIterator[bytes]) -> UploadSummary:
        """Extracts the tar stream into the directory `path`; members leading out (links too) are skipped."""

    @abc.abstractmethod
    def download_tar(self, paths: list[str]) -> AsyncGenerator[bytes, None]:
        """`paths` ([""]: the workspace) as a tar stream, members named relative to the workspace."""


WORKSPACE = "/workspace"
"""Where the workspace is in every sandbox: the absolute spelling callers use."""


def workspace_relative(path: str, *, what: str = "path") -> str:
    """`path` (relative to the workspace, or absolute under /workspace) as a normalised relative path ("" for the
    workspace itself). The agent resolves it again, links included; this refuses what no sandbox may take."""
    if "\0" in path:
        raise InvalidArgumentError(f"{what} {path!r} contains a NUL byte")
    if path.startswith("/"):
        normal = posixpath.normpath(path)
        if normal != WORKSPACE and not normal.startswith(WORKSPACE + "/"):
            raise InvalidArgumentError(
                f"{what} {path!r} is outside the workspace: give a path relative to it or absolute under {WORKSPACE}"
            )
        return normal[len(WORKSPACE) + 1:]
    normal = posixpath.normpath(path) if path else "."
    if normal == ".." or normal.startswith("../"):
        raise InvalidArgumentError(f"{what} {path!r} climbs out of the workspace with '..'")
    return "" if normal == "." else normal
