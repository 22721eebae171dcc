"""The file that was checked is the file that is used: resolve a path once, then never follow a link again.

A path tool's permission asks are made for the path as the model spelled it and for where it really leads
(`Target.spellings`). If the operation then opened the path again by name, a concurrent process (a bash loop
flipping a symlink) could point it somewhere else between the check and the open. So the operation walks the
*resolved* path from `/` one component at a time, each opened with O_NOFOLLOW relative to the directory before
it, and compares the opened file's (device, inode) with the one that was checked. A symlink appearing on the way
or a different file at the end stops the call with `PathChangedError` before anything is read or written.

Hard links made at run time (`ln .env notes`) give one file several names; rules are matched against names.
A regular file with more than one link has its other names looked up in the workspace (bounded), and they are
checked too. See docs/security.md for what that covers.

Everything here runs through `ctx.io` / `ctx.io_now`: the tool user's filesystem identity.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from sandbox_agent.errors import AgentError
from sandbox_agent.tools.base import ToolError

LINK_SCAN_LIMIT = 20_000
"""Directory entries looked at, at most, to find the other names of a multiply-linked file."""

_DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class PathChangedError(ToolError):
    """A link on the checked path was swapped, or another file took its place, after the check."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} was changed by another process while this call was using it (a symbolic link on its way "
            "was replaced, or another file took its place); the call stopped before reading or writing it. "
            "Check the path and try again."
        )


class MakeDirError(AgentError):
    """A missing parent directory could not be made; `error` is mkdir's OSError, `directory` what was shown."""

    def __init__(self, error: OSError, directory: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.directory = directory


class TooManyLinksError(ToolError):
    def __init__(self, path: str, others: int) -> None:
        super().__init__(
            f"{path} has {others} other hard link(s) that could not all be found within {LINK_SCAN_LIMIT} "
            "workspace entries, so the permission rules for its other names cannot be checked. Copy the "
            "file (cp) and use the copy instead."
        )


@dataclass(frozen=True)
class Target:
    """A path as resolved at check time."""

    path: str
    """As the tool shows it (absolute, possibly unnormalised: `/w/./a`)."""
    real: str
    """Where it leads: every symlink on the way resolved (the tail that does not exist yet kept as written)."""
    identity: tuple[int, int] | None
    """(st_dev, st_ino) of what was there; None when nothing was."""
    is_dir: bool
    links: tuple[str, ...] = ()
    """Other names of a multiply-linked regular file inside the workspace."""
    nlink: int = 0
    error: int = 0
    """The errno of the look-up when nothing could be seen there (ENOENT, EACCES, ...)."""

    @property
    def needs_link_scan(self) -> bool:
        return self.nlink > 1 and not self.is_dir and not self.links

    def missing_or_raise(self) -> bool:
        """True when nothing is there (or a file stands where a directory should); raises the look-up's
        error (EACCES, ...) naming the shown path otherwise. Only for a target without identity."""
        if self.error in (0, errno.ENOENT, errno.ENOTDIR):
            return True
        raise OSError(self.error, os.strerror(self.error), self.path)

    @property
    def spellings(self) -> list[str]:
        """The names beyond the given one that rules must also see: the real path when a link leads
        elsewhere, then the other hard-link names. Empty for an ordinary path (upstream's ask shape)."""
        given = os.path.normpath(self.path)
        out: list[str] = []
        for name in (self.real, *self.links):
            if name != given and name not in out:
                out.append(name)
        return out

    @property
    def respellings(self) -> list[str]:
        """Names a rule must meet that the ask does not show: the path normalised, when the given text spells it
        otherwise (`/w/./a`, `/w//a`, `/w/sub/../a`). Upstream shows the text as given, so the ask's patterns
        keep it alone, and these are its `checks`: a rule written for /w/a still meets the call (a red-team
        finding: `read /w/./secrets/key` got past `/w/secrets/*: deny`)."""
        shown = {self.path, self.path.rstrip("/") or "/", *self.spellings}
        return [name for name in dict.fromkeys((os.path.normpath(self.path), self.real)) if name not in shown]

    @property
    def names(self) -> list[str]:
        """Every name a rule is matched against: the given path first."""
        return [self.path, *self.spellings, *self.respellings]

    @property
    def shown(self) -> list[str]:
        """The names an ask shows: the given path, then where a link leads and other hard-link names."""
        return [self.path, *self.spellings]


def inspect(path: str, workspace: str | None) -> Target:
    """Resolves `path` once and records what it leads to (run it through `ctx.io`).

    With `workspace`, a multiply-linked regular file's other names there are looked up too (bounded, but
    not for the loop's thread); without, `needs_link_scan` says whether that is still to do.
    """
    real = os.path.realpath(path)
    try:
        info = os.lstat(real)
    except OSError as exc:
        return Target(path, real, None, False, error=exc.errno or errno.EIO)
    except ValueError:  # a NUL in the path
        return Target(path, real, None, False, error=errno.ENOENT)
    if stat.S_ISLNK(info.st_mode):  # realpath stops at a link it cannot resolve: a loop
        return Target(path, real, None, False, error=errno.ELOOP)
    if path.endswith("/") and not stat.S_ISDIR(info.st_mode):
        # realpath drops a trailing slash; the kernel would refuse `file/` (ENOTDIR), so do the same.
        return Target(path, real, None, False, error=errno.ENOTDIR)
    if os.path.normpath(path) != (path.rstrip("/") or "/"):
        # realpath also reads `file/.`, `file/x/..` and `missing/../file` as `file`, where the kernel walks every
        # component and refuses them (ENOTDIR, ENOENT): a path is only what the kernel would open.
        try:
            os.stat(path)
        except OSError as exc:
            return Target(path, real, None, False, error=exc.errno or errno.EIO)
    links: tuple[str, ...] = ()
    if workspace is not None and stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        links = other_names(real, info, workspace)
    return Target(path, real, (info.st_dev, info.st_ino), stat.S_ISDIR(info.st_mode), links,
                  info.st_nlink if stat.S_ISREG(info.st_mode) else 1)


def other_names(real: str, info: os.stat_result, workspace: str) -> tuple[str, ...]:
    """The workspace's other names of the file `real` (same device and inode), symlinks not followed.

    A hard link cannot cross filesystems, so a file on another device than the workspace has none there.
    Names on the workspace's filesystem but outside the workspace are out of the tool user's reach in the
    sandbox (the workspace is its own mount), so a scan that saw the whole workspace is complete. A scan cut
    by LINK_SCAN_LIMIT before it found all `st_nlink - 1` names refuses the call (TooManyLinksError).
    """
    try:
        if os.stat(workspace).st_dev != info.st_dev:
            return ()
    except OSError:
        return ()
    wanted = info.st_nlink - 1
    found: list[str] = []
    seen = 0
    for entry in _walk(workspace):
        seen += 1
        if seen > LINK_SCAN_LIMIT:
            raise TooManyLinksError(real, wanted)
        try:
            here = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if (here.st_dev, here.st_ino) == (info.st_dev, info.st_ino) and entry.path != real:
            found.append(entry.path)
            if len(found) >= wanted:
                break
    return tuple(found)


def _walk(top: str) -> Iterator[os.DirEntry[str]]:
    stack = [top]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    yield entry
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue


def open_directory(real_dir: str, *, create: bool = False, shown: str | None = None) -> int:
    """An O_PATH descriptor of `real_dir`, walked from `/` without following any link.

    `create` makes missing directories on the way (as upstream's write does on ENOENT), each with mkdirat
    relative to its parent, so no link can redirect them either. `shown` names the path in errors.
    """
    fd = os.open("/", _DIR_PATH)
    names = [name for name in real_dir.split("/") if name]
    try:
        for index, name in enumerate(names):
            try:
                following = os.open(name, _DIR_PATH, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise MakeDirError(exc, os.path.dirname(shown or real_dir + "/")) from None
                following = _step(name, fd, shown or real_dir)
            except OSError as exc:
                _raise_if_swapped(exc, name, fd, shown or real_dir)
                if create:
                    # As Node's recursive mkdir words a file in the way: EEXIST for the last directory,
                    # ENOTDIR for one above it.
                    if exc.errno == errno.ENOTDIR and index == len(names) - 1:
                        exc = FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST))
                    raise MakeDirError(exc, os.path.dirname(shown or real_dir + "/")) from None
                raise
            os.close(fd)
            fd = following
    except BaseException:
        os.close(fd)
        raise
    return fd


def _step(name: str, fd: int, shown: str) -> int:
    try:
        return os.open(name, _DIR_PATH, dir_fd=fd)
    except OSError as exc:
        _raise_if_swapped(exc, name, fd, shown)
        raise


def _raise_if_swapped(exc: OSError, name: str, dir_fd: int, shown: str) -> None:
    """ELOOP/ENOTDIR from a no-follow open is a swap when the component is a symlink now."""
    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
        return
    try:
        if stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode):
            raise PathChangedError(shown) from None
    except OSError:
        return


def _split(real: str) -> tuple[str, str]:
    parent, name = os.path.split(real)
    return parent or "/", name


def open_checked(target: Target, flags: int) -> int:
    """Opens what `target` resolved to, without following links, and proves it is the file that was checked.

    Raises the OSError of the open with the shown path as its file name (FileNotFoundError when nothing is
    there), or PathChangedError.
    """
    parent, name = _split(target.real)
    try:
        dir_fd = open_directory(parent, shown=target.path)
    except PathChangedError:
        raise
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, target.path) from None
    try:
        if not name:  # the root directory itself
            fd = os.open(".", flags | _NO_FOLLOW, dir_fd=dir_fd)
        else:
            try:
                fd = os.open(name, flags | _NO_FOLLOW, dir_fd=dir_fd)
            except OSError as exc:
                _raise_if_swapped(exc, name, dir_fd, target.path)
                raise type(exc)(exc.errno, exc.strerror, target.path) from None
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if target.identity is None or (info.st_dev, info.st_ino) != target.identity:
            raise PathChangedError(target.path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(target: Target) -> bytes:
    """The whole content of the checked file (O_NONBLOCK so that a FIFO cannot hang the call)."""
    fd = open_checked(target, os.O_RDONLY | os.O_NONBLOCK)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_bytes(target: Target, data: bytes, *, make_parents: bool = True, mode: int = 0o644) -> None:
    """Replaces the checked file's content, or creates it when nothing was there at check time.

    An existing file is opened without O_TRUNC and cut only after its identity was proven, so a swapped-in
    file is never truncated. A file that was missing is created with O_EXCL: if something appeared there in
    the meantime, the call stops (PathChangedError). Missing parent directories are made without following links.
    """
    if target.path.endswith("/"):
        # As open(2) with O_CREAT answers a name ending in a slash.
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), target.path)
    if target.identity is None and target.error not in (0, errno.ENOENT, errno.ENOTDIR):
        # What the look-up met (a link loop, a directory the tool user may not search) the open would too.
        raise OSError(target.error, os.strerror(target.error), target.path)
    parent, name = _split(target.real)
    try:
        dir_fd = open_directory(parent, create=make_parents, shown=target.path)
    except (PathChangedError, MakeDirError):
        raise
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, target.path) from None
    try:
        fd = _open_for_write(target, name, dir_fd, mode)
        try:
            _replace_content(fd, data)
        except OSError:
            if target.identity is None:
                _remove_if_same(name, dir_fd, fd)  # a file this call made and could not fill is not left behind
            raise
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def _replace_content(fd: int, data: bytes) -> None:
    """Writes `data` over the file's content. The space is reserved before a byte changes, so a full disk (or
    quota) fails the call with the old content whole: cutting the file first and then meeting ENOSPC left it
    truncated or empty (a red-team finding: a model filling the disk made a later `edit` lose the user's
    lines). Written from the start, then cut to the new length."""
    if data:
        before = os.fstat(fd)
        try:
            _reserve(fd, len(data))
        except OSError:
            # Nothing changed, so the file's times say so: a partial reservation stamps them, and the next edit
            # would be refused as "modified since it was last read".
            with contextlib.suppress(OSError):
                os.utime(fd, ns=(before.st_atime_ns, before.st_mtime_ns))
            raise
    view = memoryview(data)
    offset = 0
    while offset < len(data):
        offset += os.pwrite(fd, view[offset:], offset)
    os.ftruncate(fd, len(data))


_FALLOC_FL_KEEP_SIZE = 1


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _reserve(fd: int, length: int) -> None:
    """Allocates the file's first `length` bytes without changing its size or content (fallocate with
    KEEP_SIZE: plain posix_fallocate that meets ENOSPC part way leaves the file longer, zero-filled). A
    filesystem or runtime without fallocate is written as before."""
    fallocate = _libc().fallocate
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    if fallocate(fd, _FALLOC_FL_KEEP_SIZE, 0, length) == 0:
        return
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return
    raise OSError(err, os.strerror(err))


def _remove_if_same(name: str, dir_fd: int, fd: int) -> None:
    with contextlib.suppress(OSError):
        made = os.fstat(fd)
        there = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (there.st_dev, there.st_ino) == (made.st_dev, made.st_ino):
            os.unlink(name, dir_fd=dir_fd)


def _open_for_write(target: Target, name: str, dir_fd: int, mode: int) -> int:
    flags = os.O_WRONLY | _NO_FOLLOW
    try:
        if target.identity is None:
            return _create(target, name, dir_fd, mode)
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            # Removed since the check (apply_patch deletes, then adds the same file): a new file under the
            # checked name, made exclusively, is still what was checked.
            return _create(target, name, dir_fd, mode)
    except PathChangedError:
        raise
    except OSError as exc:
        _raise_if_swapped(exc, name, dir_fd, target.path)
        raise type(exc)(exc.errno, exc.strerror, target.path) from None
    info = os.fstat(fd)
    if (info.st_dev, info.st_ino) != target.identity:
        os.close(fd)
        raise PathChangedError(target.path)
    return fd


def _create(target: Target, name: str, dir_fd: int, mode: int) -> int:
    try:
        return os.open(name, os.O_WRONLY | _NO_FOLLOW | os.O_CREAT | os.O_EXCL, mode, dir_fd=dir_fd)
    except FileExistsError:
        raise PathChangedError(target.path) from None


def unlink_checked(target: Target) -> None:
    """Removes the checked name (its parent walked without following links; the name itself is not followed
    by unlink). The identity is verified first so a swapped-in file is not removed."""
    parent, name = _split(target.real)
    dir_fd = open_directory(parent, shown=target.path)
    try:
        info = os.lstat(name, dir_fd=dir_fd)
        if target.identity is not None and (info.st_dev, info.st_ino) != target.identity:
            raise PathChangedError(target.path)
        os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
