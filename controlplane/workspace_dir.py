"""A local directory as a workspace archive for CreateSession, read without leaving the directory.

Symlinks are stored as links, never followed. A link pointing out of the directory is refused with its name
(the server refuses such an archive too; failing here says which link, before anything is sent), and an
absolute link into the directory is stored relative, so that it still resolves once the workspace lives
under /workspace. Each file is opened with O_NOFOLLOW and checked
to still be a regular file, so a file swapped for a link between listing and reading is refused as well.
FIFOs, sockets and devices are skipped: opening a FIFO would block the caller forever. The size is bounded
while reading, so pointing at a home directory fails fast with a clear error instead of filling memory.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

from controlplane.errors import InvalidArgumentError

DEFAULT_MAX_BYTES = 48 * 1024 * 1024
"""Uncompressed bytes; under the server's default 64 MiB message bound even when nothing compresses."""
DEFAULT_MAX_ENTRIES = 50_000
"""The server's default `limits.max_archive_entries`."""


class WorkspaceTooLargeError(InvalidArgumentError):
    """The directory holds more than the bound; nothing was sent."""


def archive_directory(
    root: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, max_entries: int = DEFAULT_MAX_ENTRIES,
) -> bytes:
    """A gzipped tar of `root`'s contents (names relative to it)."""
    if not root.is_dir():
        raise InvalidArgumentError(f"workspace {root}: not a directory")
    buf = io.BytesIO()
    total = entries = 0
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for directory, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            base = Path(directory)
            # os.walk lists a link to a directory among dirnames but (followlinks=False) never enters it.
            for name in [*dirnames, *sorted(filenames)]:
                path = base / name
                arcname = path.relative_to(root).as_posix()
                info = os.lstat(path)
                if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
                    continue
                entries += 1
                if entries > max_entries:
                    raise WorkspaceTooLargeError(
                        f"workspace {root} has more than {max_entries} entries; pass a smaller directory "
                        f"(or raise max_entries= up to the server's limits.max_archive_entries)"
                    )
                if stat.S_ISREG(info.st_mode):
                    total += info.st_size
                    if total > max_bytes:
                        raise WorkspaceTooLargeError(
                            f"workspace {root} holds more than {max_bytes // (1024 * 1024)} MiB; pass a smaller "
                            f"directory, or create the session empty and upload files afterwards "
                            f"(max_bytes= raises the bound, up to the server's server.max_message_mb)"
                        )
                    _add_file(tar, path, arcname)
                elif stat.S_ISLNK(info.st_mode):
                    tar.addfile(_link_info(root, path, arcname, info))
                else:
                    tar.add(path, arcname=arcname, recursive=False)
    return buf.getvalue()


def _link_info(root: Path, path: Path, arcname: str, info: os.stat_result) -> tarfile.TarInfo:
    target = os.readlink(path)
    # Resolved lexically: the link's own target may not exist, and following it is what must not happen.
    resolved = Path(os.path.normpath(path.parent / target))
    top = Path(os.path.normpath(root.absolute()))
    if resolved != top and top not in resolved.parents:
        raise InvalidArgumentError(
            f"workspace link {arcname} points out of {root} (to {target}); remove it, or pass the archive "
            f"yourself as workspace=bytes"
        )
    member = tarfile.TarInfo(arcname)
    member.type = tarfile.SYMTYPE
    member.linkname = os.path.relpath(resolved, path.parent.absolute()) if os.path.isabs(target) else target
    member.mtime = int(info.st_mtime)
    member.mode = 0o777
    return member


def _add_file(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        opened = os.fstat(handle.fileno())
        if not stat.S_ISREG(opened.st_mode):
            raise InvalidArgumentError(f"workspace file {path} changed while being archived")
        info = tar.gettarinfo(arcname=arcname, fileobj=handle)
        tar.addfile(info, handle)
