"""The files API's work, run as the unprivileged tool user in a child process of the agent.

    python3 -m sandbox_agent.fileops write WORKSPACE PATH MODE|- PARENTS(0|1) MAX_BYTES < frames   -> entry JSON
    python3 -m sandbox_agent.fileops read WORKSPACE PATH                                          -> content
    python3 -m sandbox_agent.fileops list WORKSPACE PATH RECURSIVE(0|1) LIMIT                     -> listing JSON
    python3 -m sandbox_agent.fileops pack WORKSPACE [PATH...]                                     -> tar

A write's content comes framed (each piece after its 4-byte big-endian length, then an empty piece): the file
is put in place only after that end mark, so a write whose caller went away (its stdin closed early, which the
agent does before it stops a helper) never leaves a truncated file. Its temporary file's path is announced on
stdout before the entry JSON (helper_temps.py), so the agent can remove it if this process is killed. A
refusal exits 1 with `STATUS message` (a gRPC status name) as the last line of stderr, before any output.

Every path is resolved once (symlinks inside the workspace are followed, one leading out is refused), then the
resolved path is walked from `/` with O_NOFOLLOW at each step (tools/safe_open.py): a link swapped in by a tool
process between the check and the use stops the call instead of redirecting it. Below the named path, listing
and packing walk by directory descriptors and never follow a link: a symlink is listed or archived as a link.
Being the tool user, the process could not reach the agent's own files or the code snapshot even if a case
were missed; the workspace check is what keeps it out of the rest of the tool user's view.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from sandbox_agent.errors import AgentError
from sandbox_agent.helper_temps import announce
from sandbox_agent.tools.safe_open import PathChangedError, Target, inspect, open_checked, open_directory

if TYPE_CHECKING:
    # Imported where an archive is written (`pack`, in the helper process only): the agent imports this module for
    # `frame`, and tarfile would cost every idle agent about 0.3 MiB.
    import tarfile

CHUNK = 1024 * 1024
LIST_BOUND = 10_000
"""Entries listed at most in one call, whatever the caller asks."""
_DIR_READ = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FileRefusedError(AgentError):
    """A refusal with the gRPC status that says what kind (INVALID_ARGUMENT, NOT_FOUND, ...)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def relative(root: str, real: str) -> str:
    return "" if real == root else real[len(root.rstrip("/")) + 1:]


def locate(workspace: str, path: str) -> Target:
    """`path` (relative to the workspace, or absolute under it) resolved, and proven to stay inside it."""
    if "\0" in path:
        raise FileRefusedError("INVALID_ARGUMENT", f"{path!r}: a path cannot contain a NUL byte")
    root = os.path.realpath(workspace)
    spelled = os.path.normpath(path if os.path.isabs(path) else os.path.join(workspace, path))
    if not inside(os.path.normpath(workspace), spelled) and not inside(root, spelled):
        raise FileRefusedError(
            "INVALID_ARGUMENT", f"{path!r} is outside the workspace {workspace}: give a path relative to it or "
                                "absolute under it")
    target = inspect(spelled, None)
    if not inside(root, target.real):
        raise FileRefusedError("INVALID_ARGUMENT", f"{path!r} leads outside the workspace through a symbolic link "
                               f"(to {target.real}); the files API does not follow it")
    return target


def _os_refusal(exc: OSError, path: str) -> FileRefusedError:
    if isinstance(exc, PathChangedError):
        return FileRefusedError("FAILED_PRECONDITION", str(exc))
    if exc.errno == errno.ENOENT:
        return FileRefusedError("NOT_FOUND", f"{path!r} does not exist in the workspace")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return FileRefusedError("RESOURCE_EXHAUSTED", f"{path!r}: {exc.strerror}: the workspace disk is full")
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return FileRefusedError("INVALID_ARGUMENT",
                                f"{path!r}: a symbolic link or a file is in the way ({exc.strerror})")
    return FileRefusedError("FAILED_PRECONDITION", f"{path!r}: {exc.strerror or exc}")


def entry(rel: str, info: os.stat_result, link: str = "") -> dict[str, Any]:
    kind = ("file" if stat.S_ISREG(info.st_mode) else "directory" if stat.S_ISDIR(info.st_mode)
            else "symlink" if stat.S_ISLNK(info.st_mode) else "other")
    return {"path": rel, "type": kind, "size": info.st_size if kind != "directory" else 0,
            "mode": stat.S_IMODE(info.st_mode), "mtime_ms": info.st_mtime_ns // 1_000_000, "link_target": link}


# -- write --------------------------------------------------------------------------------------------------------

def write(
    workspace: str, path: str, mode: int | None, parents: bool, max_bytes: int, source: IO[bytes],
) -> dict[str, Any]:
    """Streams `source` into a new file beside the target, then renames it over the target: a failed or
    oversized write leaves the old content, and nothing is ever written through a link."""
    target = locate(workspace, path)
    root = os.path.realpath(workspace)
    if target.real == root or path.endswith("/"):
        raise FileRefusedError("INVALID_ARGUMENT", f"{path!r} names a directory; give a file path")
    if target.is_dir:
        raise FileRefusedError("FAILED_PRECONDITION", f"{path!r} is a directory")
    if target.identity is None and target.error not in (errno.ENOENT, 0):
        raise _os_refusal(OSError(target.error, os.strerror(target.error)), path)
    parent, name = os.path.split(target.real)
    try:
        dir_fd = open_directory(parent, create=parents, shown=path)
    except FileNotFoundError:
        raise FileRefusedError(
            "NOT_FOUND", f"the directory of {path!r} does not exist (ask for its parents to be made)") from None
    except OSError as exc:
        raise _os_refusal(exc, path) from None
    except AgentError as exc:  # MakeDirError
        raise FileRefusedError("FAILED_PRECONDITION", f"cannot make the directories of {path!r}: {exc}") from None
    try:
        return _replace(dir_fd, name, target, mode, max_bytes, source, root)
    finally:
        os.close(dir_fd)


def _replace(dir_fd: int, name: str, target: Target, mode: int | None, max_bytes: int, source: IO[bytes],
             root: str) -> dict[str, Any]:
    keep = None
    try:
        current = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(current.st_mode):
            raise FileRefusedError("FAILED_PRECONDITION", f"{target.path!r} exists and is not a regular file")
        keep = stat.S_IMODE(current.st_mode)
    except FileNotFoundError:
        pass
    temp = f".{name}.ocsb-{os.getpid()}"
    announce(os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), temp))
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        announce(None)  # not made: whatever holds the name (EEXIST) is not ours
        raise _os_refusal(exc, target.path) from None
    try:
        written = 0
        with os.fdopen(fd, "wb", closefd=True) as out:
            for block in frames(source):
                written += len(block)
                if written > max_bytes:
                    raise FileRefusedError("RESOURCE_EXHAUSTED", f"{target.path!r}: the content exceeds the "
                                                            f"{max_bytes}-byte limit of one write")
                out.write(block)
            os.fchmod(out.fileno(), mode if mode is not None else keep if keep is not None else 0o644)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        _discard(temp, dir_fd)
        raise _os_refusal(exc, target.path) from None
    except BaseException:
        _discard(temp, dir_fd)
        raise
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    return entry(relative(root, target.real), info)


def frames(source: IO[bytes]) -> Iterator[bytes]:
    """The pieces of a framed stream up to its end mark; a stream that stops before the mark is refused."""
    while True:
        header = _exactly(source, 4)
        size = int.from_bytes(header, "big")
        if size == 0:
            return
        yield _exactly(source, size)


def _exactly(source: IO[bytes], size: int) -> bytes:
    data = source.read(size)
    while data is not None and len(data) < size:
        more = source.read(size - len(data))
        if not more:
            break
        data += more
    if not data or len(data) < size:
        raise FileRefusedError("FAILED_PRECONDITION", "the content was cut off before its end; nothing was written")
    return data


def frame(piece: bytes) -> bytes:
    return len(piece).to_bytes(4, "big") + piece


def _discard(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


# -- read -------------------------------------------------------------------------------------------------------

def read(workspace: str, path: str, out: IO[bytes]) -> None:
    target = locate(workspace, path)
    if target.identity is None:
        raise _os_refusal(OSError(target.error, os.strerror(target.error)), path)
    if target.is_dir:
        raise FileRefusedError("FAILED_PRECONDITION", f"{path!r} is a directory: list it, or download it as a tar")
    try:
        fd = open_checked(target, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise _os_refusal(exc, path) from None
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            raise FileRefusedError("FAILED_PRECONDITION", f"{path!r} is not a regular file (a device, FIFO or socket)")
        while block := source.read(CHUNK):
            out.write(block)


# -- list and pack: descriptor walks that never follow a link -----------------------------------------------------

def _open_dir(target: Target, path: str) -> int:
    """A readable descriptor of the checked directory."""
    try:
        fd = open_checked(target, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise _os_refusal(exc, path) from None
    return fd


def _children(dir_fd: int) -> list[str]:
    return sorted(os.listdir(dir_fd))


def listing(workspace: str, path: str, recursive: bool, limit: int) -> dict[str, Any]:
    target = locate(workspace, path)
    root = os.path.realpath(workspace)
    if target.identity is None:
        raise _os_refusal(OSError(target.error, os.strerror(target.error)), path)
    limit = min(limit or LIST_BOUND, LIST_BOUND)
    rel = relative(root, target.real)
    if not target.is_dir:
        parent, name = os.path.split(target.real)
        dir_fd = open_directory(parent, shown=path)
        try:
            own = _entry_at(dir_fd, name, rel)
            return {"entries": [own], "truncated": False, "target": own}
        finally:
            os.close(dir_fd)
    entries: list[dict[str, Any]] = []
    fd = _open_dir(target, path)
    own = entry(rel, os.fstat(fd))
    truncated = _list_dir(fd, rel, recursive, entries, limit)
    return {"entries": entries, "truncated": truncated, "target": own}


def _entry_at(dir_fd: int, name: str, rel: str) -> dict[str, Any]:
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    link = os.readlink(name, dir_fd=dir_fd) if stat.S_ISLNK(info.st_mode) else ""
    return entry(rel, info, link)


def _list_dir(fd: int, rel: str, recursive: bool, out: list[dict[str, Any]], limit: int) -> bool:
    """Appends the entries below `fd` (closed here); True when `limit` cut the listing."""
    try:
        for name in _children(fd):
            if len(out) >= limit:
                return True
            child = f"{rel}/{name}" if rel else name
            try:
                item = _entry_at(fd, name, child)
            except FileNotFoundError:
                continue  # removed while listing
            out.append(item)
            if recursive and item["type"] == "directory":
                try:
                    sub = os.open(name, _DIR_READ, dir_fd=fd)
                except OSError:
                    continue  # replaced by a link, or not searchable by the tool user: listed, not entered
                if _list_dir(sub, child, recursive, out, limit):
                    return True
        return False
    finally:
        os.close(fd)


def pack(workspace: str, paths: list[str], out: IO[bytes]) -> None:
    root = os.path.realpath(workspace)
    targets = [locate(workspace, p) for p in paths] if paths else [locate(workspace, "")]
    for path, target in zip(paths or [""], targets, strict=True):
        if target.identity is None:
            raise _os_refusal(OSError(target.error, os.strerror(target.error)), path)
    import tarfile

    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        for path, target in zip(paths or [""], targets, strict=True):
            rel = relative(root, target.real)
            if target.is_dir:
                fd = _open_dir(target, path)
                if rel:
                    archive.addfile(_info(rel, os.fstat(fd)))
                _pack_dir(archive, fd, rel)
            else:
                parent, name = os.path.split(target.real)
                dir_fd = open_directory(parent, shown=path)
                try:
                    _pack_entry(archive, dir_fd, name, rel)
                finally:
                    os.close(dir_fd)


def _info(name: str, st: os.stat_result, kind: bytes = b"5", link: str = "") -> tarfile.TarInfo:
    """`kind`: tarfile's DIRTYPE by default (its value: tarfile is imported by `pack` only)."""
    import tarfile

    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    info.size = st.st_size if kind == tarfile.REGTYPE else 0
    info.linkname = link
    return info


def _pack_dir(archive: tarfile.TarFile, fd: int, rel: str) -> None:
    try:
        for name in _children(fd):
            _pack_entry(archive, fd, name, f"{rel}/{name}" if rel else name)
    finally:
        os.close(fd)


def _pack_entry(archive: tarfile.TarFile, dir_fd: int, name: str, rel: str) -> None:
    import tarfile

    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            archive.addfile(_info(rel, st, tarfile.SYMTYPE, os.readlink(name, dir_fd=dir_fd)))
        elif stat.S_ISDIR(st.st_mode):
            sub = os.open(name, _DIR_READ, dir_fd=dir_fd)
            archive.addfile(_info(rel, os.fstat(sub)))
            _pack_dir(archive, sub, rel)
        elif stat.S_ISREG(st.st_mode):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            with os.fdopen(fd, "rb") as source:
                now = os.fstat(source.fileno())
                if stat.S_ISREG(now.st_mode):
                    archive.addfile(_info(rel, now, tarfile.REGTYPE), source)
        # Devices, FIFOs and sockets have no content to carry: left out.
    except (FileNotFoundError, PermissionError):
        return  # removed while packing, or unreadable for the tool user: left out


# -- command line -----------------------------------------------------------------------------------------------

def _stopped(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds a write, whose handler removes the unfinished file


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _stopped)
    try:
        if len(argv) == 6 and argv[0] == "write":
            mode = None if argv[3] == "-" else int(argv[3], 8)
            result = write(argv[1], argv[2], mode, argv[4] == "1", int(argv[5]), sys.stdin.buffer)
            json.dump(result, sys.stdout)
        elif len(argv) == 3 and argv[0] == "read":
            read(argv[1], argv[2], sys.stdout.buffer)
        elif len(argv) == 5 and argv[0] == "list":
            json.dump(listing(argv[1], argv[2], argv[3] == "1", int(argv[4])), sys.stdout)
        elif len(argv) >= 2 and argv[0] == "pack":
            pack(argv[1], argv[2:], sys.stdout.buffer)
        else:
            print(__doc__, file=sys.stderr)
            return 64
    except FileRefusedError as exc:
        print(f"{exc.status} {exc}", file=sys.stderr)
        return 1
    except RecursionError:
        # A tree nested deeper than the walk goes (a model can make one): refused, not a crash.
        print("FAILED_PRECONDITION the directory tree is nested too deeply to walk; name a deeper path",
              file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{_os_refusal(exc, exc.filename or '').status} {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
