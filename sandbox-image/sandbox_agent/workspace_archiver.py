"""The workspace archiver: a directory written to a tar as the tool user (`python3 -m sandbox_agent.tario create`),
for pauses, snapshots, forks, kept copies and the files API's downloads. The extractor is tario.py."""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

DIR_WALK = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_NAME_BYTES = 4096
"""An entry's name in the archive at the most (PATH_MAX, what the control plane keeps of a copy and a new session
takes); what lies deeper is left out and listed once. Each entry's header carries its whole name and the plane holds
every header of a copy while it checks it, so deeper names would only cost memory: a tree of 64 KiB names made one
snapshot of a 1.2 MB workspace take 1.2 GiB of the plane's memory, to store nothing of them."""


def create(src: str, out: IO[bytes]) -> list[str]:
    """Writes SRC (a directory's entries, or one entry) to `out`; returns what was left out, with why.

    Walked by directory descriptors (openat, never a joined path), so a chain of directories deeper than
    PATH_MAX is archived (up to MAX_NAME_BYTES of name). An entry of the archiving user's own that its mode keeps
    it from reading (the model ran chmod 000, on SRC itself too) is read with the owner's read bit added for the
    moment and its mode put back after, the archive carrying the original mode: a pause resumes from this copy,
    so leaving it out would lose the user's work. Only what still cannot be read (another user's, an I/O error)
    is left out and listed."""
    left_out: list[str] = []
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        walk = _Walk(archive, left_out)
        if stat.S_ISDIR(os.lstat(src).st_mode):
            walk.tree(_root(src))
        else:
            parent = os.open(os.path.dirname(src) or ".", DIR_WALK)
            try:
                opened = walk.entry(parent, os.path.basename(src), os.path.basename(src))
            finally:
                os.close(parent)
            if opened is not None:
                opened.close()
    return left_out


def _root(src: str) -> _Opened:
    """The directory SRC, open and listed (unreadable is an error). One of the archiving user's own that the model
    closed to its owner (`chmod 000 /workspace`) is widened as any entry below it is: otherwise no pause, snapshot
    or kept copy of the session could be made, and its work would be lost at its end."""
    src = os.path.normpath(src)
    parent = os.open(os.path.dirname(src) or ".", DIR_WALK)
    try:
        name = os.path.basename(src)
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        lifted = _lift(parent, name, st, 0o500) if st.st_mode & 0o500 != 0o500 else None
        try:
            fd = os.open(name, _READ_DIR, dir_fd=parent)
            try:
                return _Opened(fd, sorted(os.listdir(fd)), lifted)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            if lifted is not None:
                lifted.put_back()
            raise
    finally:
        os.close(parent)


_READ_ONE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""O_NONBLOCK: a regular file swapped for a FIFO between the lstat and the open must not hang the archiver."""
_READ_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class _Lifted:
    """An entry whose mode the archiver widened: its O_PATH descriptor and the mode to put back."""

    path_fd: int
    mode: int

    def put_back(self) -> None:
        try:
            os.chmod(f"/proc/self/fd/{self.path_fd}", self.mode)
        finally:
            os.close(self.path_fd)


def _lift(dir_fd: int, name: str, st: os.stat_result, bits: int) -> _Lifted | None:
    """`name` (the inode `st` describes) with `bits` added to its mode, or None when it is not the archiving
    user's own. Held by an O_PATH descriptor opened without following a link and proven to be that inode and
    ours before the chmod, which goes through /proc/self/fd (it acts on the inode, fchmod refuses O_PATH): an
    entry swapped in meanwhile is never changed, and nothing gets more than its owner could give it anyway."""
    me = os.geteuid()
    if st.st_uid != me:
        return None
    path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        now = os.fstat(path_fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or now.st_uid != me or stat.S_ISLNK(now.st_mode):
            os.close(path_fd)
            return None
        lifted = _Lifted(path_fd, stat.S_IMODE(now.st_mode))
        os.chmod(f"/proc/self/fd/{path_fd}", lifted.mode | bits)
    except BaseException:
        os.close(path_fd)
        raise
    return lifted


@dataclass
class _Opened:
    """A directory being walked: its descriptor, its sorted entries, and its mode to put back once done."""

    fd: int
    names: list[str]
    lifted: _Lifted | None

    def close(self) -> None:
        try:
            os.close(self.fd)
        finally:
            if self.lifted is not None:
                self.lifted.put_back()


class _Walk:
    def __init__(self, archive: tarfile.TarFile, left_out: list[str]) -> None:
        self._archive = archive
        self._left_out = left_out
        self._inodes: dict[tuple[int, int], str] = {}

    def tree(self, root: _Opened) -> None:
        """Depth first without recursion (depth is bounded by neither Python's stack nor PATH_MAX), holding one
        descriptor and one name per level, so memory grows with the path's length, not with its square; a level
        that cannot be opened (EMFILE included) is left out, and so is what lies past MAX_NAME_BYTES of name.
        A directory whose mode was widened to walk it keeps that until its last entry is read (a lookup needs its
        search bit)."""
        stack: list[tuple[_Opened, Iterator[str]]] = [(root, iter(root.names))]
        path: list[str] = []  # the names of the levels below the root, one per stack entry past the first
        length = 0  # of "/".join(path) + "/" when path is not empty
        try:
            while stack:
                level, pending = stack[-1]
                name = next(pending, None)
                if name is None:
                    stack.pop()
                    level.close()
                    if path:
                        length -= len(path.pop().encode(errors="surrogateescape")) + 1
                    continue
                size = length + len(name.encode(errors="surrogateescape"))
                arcname = "/".join([*path, name])
                if size > MAX_NAME_BYTES:  # shortened: the list is logged
                    self._leave_out(arcname[:200] + "...", f"its name passes {MAX_NAME_BYTES} bytes, and all below")
                    continue
                opened = self.entry(level.fd, name, arcname)
                if opened is not None:
                    stack.append((opened, iter(opened.names)))
                    path.append(name)
                    length = size + 1
        finally:
            while stack:
                stack.pop()[0].close()

    def _leave_out(self, arcname: str, exc: OSError | str) -> None:
        why = exc if isinstance(exc, str) else (exc.strerror or str(exc))
        self._left_out.append(f"{arcname}: {why}")

    def entry(self, dir_fd: int, name: str, arcname: str) -> _Opened | None:
        """Adds `name` under `dir_fd`; the directory to descend when it is one."""
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as exc:
            self._leave_out(arcname, exc)  # gone since it was listed
            return None
        # The mode before any widening: a restore recreates the entry as the model left it.
        info = tarfile.TarInfo(arcname)
        info.mode, info.mtime, info.uid, info.gid = stat.S_IMODE(st.st_mode), int(st.st_mtime), st.st_uid, st.st_gid
        if stat.S_ISDIR(st.st_mode):
            return self._directory(dir_fd, name, info, st)
        if stat.S_ISREG(st.st_mode):
            self._file(dir_fd, name, info, st)
        elif stat.S_ISLNK(st.st_mode):
            try:
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dir_fd)
            except OSError as exc:
                self._leave_out(arcname, exc)
                return None
            self._archive.addfile(info)
        elif stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            # Kept as tarfile.add kept them: the plane's portable copy decides (and logs) what it drops.
            info.type = (tarfile.FIFOTYPE if stat.S_ISFIFO(st.st_mode)
                         else tarfile.CHRTYPE if stat.S_ISCHR(st.st_mode) else tarfile.BLKTYPE)
            info.devmajor, info.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
            self._archive.addfile(info)
        else:
            self._leave_out(arcname, "a socket")
        return None

    def _directory(self, dir_fd: int, name: str, info: tarfile.TarInfo, st: os.stat_result) -> _Opened | None:
        lifted: _Lifted | None = None
        try:
            # Widened before it is opened when it lacks the owner's read or search bit: with read alone the
            # listing works but every entry's lookup fails, and that would leave them all out.
            if st.st_mode & 0o500 != 0o500:
                lifted = _lift(dir_fd, name, st, 0o500)
            fd = os.open(name, _READ_DIR, dir_fd=dir_fd)
        except OSError as exc:
            if lifted is not None:
                lifted.put_back()
            self._leave_out(info.name + "/", exc)
            return None
        opened = _Opened(fd, [], lifted)
        try:
            opened.names = sorted(os.listdir(fd))
        except OSError as exc:
            opened.close()
            self._leave_out(info.name + "/", exc)
            return None
        info.type = tarfile.DIRTYPE
        try:
            self._archive.addfile(info)
        except BaseException:
            opened.close()
            raise
        return opened

    def _file(self, dir_fd: int, name: str, info: tarfile.TarInfo, st: os.stat_result) -> None:
        try:
            fd = _open_lifting(dir_fd, name, st)
        except OSError as exc:
            self._leave_out(info.name, exc)
            return
        with os.fdopen(fd, "rb") as source:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._leave_out(info.name, "replaced while it was archived")
                return
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1 and key in self._inodes:
                info.type, info.linkname = tarfile.LNKTYPE, self._inodes[key]
                self._archive.addfile(info)
                return
            if st.st_nlink > 1:
                self._inodes[key] = info.name
            info.size = st.st_size
            self._archive.addfile(info, _Exactly(source, st.st_size))


def _open_lifting(dir_fd: int, name: str, st: os.stat_result) -> int:
    """The file `name` open for reading; one of ours its mode closes is opened with u+r added for the moment
    (the open descriptor keeps reading after the mode is put back)."""
    try:
        return os.open(name, _READ_ONE, dir_fd=dir_fd)
    except PermissionError:
        lifted = _lift(dir_fd, name, st, 0o400)
        if lifted is None:
            raise
    try:
        return os.open(name, _READ_ONE, dir_fd=dir_fd)
    finally:
        lifted.put_back()


class _Exactly:
    """`size` bytes of a file that may shrink or grow while it is read (a tool process still writing it): a
    shorter read is padded with zeros, so the stream stays a valid archive instead of failing mid-member."""

    def __init__(self, source: IO[bytes], size: int) -> None:
        self._source = source
        self._left = size

    def read(self, n: int = -1) -> bytes:
        want = self._left if n < 0 else min(n, self._left)
        data = self._source.read(want)[:want] if want else b""
        self._left -= want
        return data + bytes(want - len(data))
