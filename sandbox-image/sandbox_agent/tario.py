"""Workspace archives, run as the unprivileged tool user in a child process.

    python3 -m sandbox_agent.tario extract DEST MAX_BYTES [WORKSPACE] < archive.tar   -> JSON summary on stdout
      (after a line per temporary entry: helper_temps.announce)
    python3 -m sandbox_agent.tario create SRC > archive.tar   -> a line per entry left out on stderr

Extraction never follows a symlink and never resolves a path by name: DEST is opened once, walking from `/`
with O_NOFOLLOW at each step (and, with WORKSPACE, proven inside it by its descriptor), then each member's
directories are opened relative to it with O_NOFOLLOW and its entry is made with *at calls under a temporary
name, renamed over the old entry only once complete (a symlink already there is replaced, not written through;
an upload cut off mid-member leaves the old file). A link swapped in by a tool process during the extraction
stops that member (ELOOP/ENOTDIR) instead of redirecting it. Absolute names, `..`, device files and FIFOs are
refused and listed in the summary, as are members below a symlink; with WORKSPACE (the files API's uploads)
so are symlinks leading outside WORKSPACE. Because the process has the tool user's rights only, even a missed
case cannot write where that user cannot.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import stat
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from sandbox_agent.errors import AgentError
from sandbox_agent.helper_temps import announce
from sandbox_agent.sparse_write import write_sparse
from sandbox_agent.workspace_archiver import DIR_WALK, create


class ArchiveTooLargeError(AgentError):
    pass


class DestinationError(AgentError):
    """DEST cannot be opened as a directory inside the workspace without following a link."""


SPECIAL = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX
_temp_count = 0


@dataclass
class Summary:
    files: int = 0
    directories: int = 0
    symlinks: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _clean_name(name: str) -> str | None:
    """The member's path relative to DEST, or None when it is absolute or climbs out."""
    if name.startswith("/"):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        return None
    return "/".join(parts)


def _link_inside(workspace: str, link: str, value: str) -> bool:
    """Whether the symlink `link` with content `value` leads inside `workspace`, both as written and as the
    links already on its way resolve now (a later member may still retarget those: every reader in the files
    API refuses to follow a link out, so this is a courtesy to whoever extracts the workspace later)."""
    root = os.path.realpath(workspace)
    spelled = os.path.normpath(os.path.join(os.path.dirname(link), value))
    return _inside(root, spelled) and _inside(root, os.path.realpath(spelled))


def _open_dest(dest: str, confine: str) -> tuple[int, str]:
    """DEST opened once (made when missing), walked from `/` without following any link, and where that
    descriptor really is.

    Every member is then placed relative to this descriptor, never by name: a tool process that swaps a
    directory on the way for a symlink (rename or RENAME_EXCHANGE, in a loop) makes the walk fail with ELOOP or
    ENOTDIR instead of redirecting it, and a directory renamed while it is held stays on its filesystem.
    """
    fd = os.open("/", DIR_WALK)
    try:
        for name in (n for n in dest.split("/") if n):
            following = _open_or_make(name, fd)
            os.close(fd)
            fd = following
        # The descriptor's own path, not DEST's: it is what the members will be written under.
        real = os.readlink(f"/proc/self/fd/{fd}")
        if confine and not _inside(os.path.realpath(confine), real):
            raise OSError(errno.EXDEV, f"{dest} is now outside the workspace {confine}")
    except BaseException:
        os.close(fd)
        raise
    return fd, real


def _parent_fd(root_fd: int, parts: list[str]) -> int:
    """The member's directory, each component opened relative to the one before without following a link
    (missing ones made with mkdirat), so nothing outside DEST can be reached through one."""
    fd = os.dup(root_fd)
    try:
        for name in parts:
            following = _open_or_make(name, fd)
            os.close(fd)
            fd = following
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_or_make(name: str, dir_fd: int) -> int:
    """The directory `name` under `dir_fd`, made (mkdirat) when missing; a link there is never followed."""
    try:
        return os.open(name, DIR_WALK, dir_fd=dir_fd)
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=dir_fd)
        return os.open(name, DIR_WALK, dir_fd=dir_fd)


def extract(stream: IO[bytes], dest: str, max_bytes: int, confine: str = "") -> Summary:
    """`confine`: the workspace every symlink must lead into (none: symlinks are kept as given)."""
    summary = Summary()
    try:
        root_fd, root = _open_dest(dest, confine)
    except OSError as exc:
        raise DestinationError(f"{dest}: {exc.strerror or exc}: the destination is not a directory inside the "
                               "workspace (a symbolic link or a file is in the way)") from None
    closed: list[tuple[list[str], int]] = []
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as archive:
            for member in archive:
                _one_member(archive, member, root_fd, root, confine, summary, max_bytes, closed)
        _close_directories(root_fd, closed, summary)
    finally:
        os.close(root_fd)
    return summary


def _one_member(archive: tarfile.TarFile, member: tarfile.TarInfo, root_fd: int, root: str, confine: str,
                summary: Summary, max_bytes: int, closed: list[tuple[list[str], int]]) -> None:
    rel = _clean_name(member.name)
    if rel is None:
        summary.skipped.append(f"{member.name}: path escapes the workspace")
        return
    if rel == "":
        return
    parts = rel.split("/")
    if confine and member.issym() and not _link_inside(confine, os.path.join(root, rel), member.linkname):
        summary.skipped.append(f"{member.name}: symbolic link to {member.linkname} leads outside the workspace")
        return
    try:
        parent = _parent_fd(root_fd, parts[:-1])
    except OSError as exc:
        summary.skipped.append(f"{member.name}: its directory cannot be reached without following a symbolic "
                               f"link ({exc.strerror or exc})")
        return
    try:
        _extract_member(archive, member, parent, parts[-1], root_fd, summary, max_bytes)
        # What the extraction widened for its owner (u+rw, a directory u+rwx) is narrowed back to the archive's,
        # and the set-id and sticky bits are given (a file's after its content: a write clears them). They give
        # nothing: the workspace is mounted nosuid and every process runs with no_new_privs.
        if member.isdir() and (member.mode & 0o700 != 0o700 or member.mode & SPECIAL):
            closed.append((parts, member.mode & 0o7777))  # once its members are in (it is open to them till then)
        elif member.isreg() and (member.mode & 0o600 != 0o600 or member.mode & SPECIAL):
            _exact_mode(parent, parts[-1], member.mode & 0o7777, stat.S_ISREG)
    except ArchiveTooLargeError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            # Skipping would hand the caller a session missing part of its files: refuse the upload.
            raise ArchiveTooLargeError(
                f"{member.name}: {exc.strerror}: the archive does not fit the workspace") from exc
        summary.skipped.append(f"{member.name}: {exc.strerror or exc}")
    finally:
        os.close(parent)


def _extract_member(archive: tarfile.TarFile, member: tarfile.TarInfo, parent: int, name: str, root_fd: int,
                    summary: Summary, max_bytes: int) -> None:
    mode = member.mode & 0o777
    if member.isdir():
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                os.unlink(name, dir_fd=parent)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=parent)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            os.fchmod(fd, mode | 0o700)
        finally:
            os.close(fd)
        summary.directories += 1
    elif member.isreg():
        if summary.bytes + member.size > max_bytes:
            raise ArchiveTooLargeError(f"archive expands past the {max_bytes}-byte limit")
        source = archive.extractfile(member)

        def fill(temp: str) -> None:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode | 0o600,
                         dir_fd=parent)
            try:
                write_sparse(fd, source)
                os.utime(fd, (member.mtime, member.mtime))
            finally:
                os.close(fd)
        _put(parent, name, fill)
        summary.files += 1
        summary.bytes += member.size
    elif member.issym():
        _put(parent, name, lambda temp: os.symlink(member.linkname, temp, dir_fd=parent))
        summary.symlinks += 1
    elif member.islnk():
        source_rel = _clean_name(member.linkname)
        source_parts = source_rel.split("/") if source_rel else []
        try:
            source_dir = _parent_fd(root_fd, source_parts[:-1]) if source_parts else -1
        except OSError:
            source_dir = -1
        try:
            if source_dir < 0 or not stat.S_ISREG(
                    os.stat(source_parts[-1], dir_fd=source_dir, follow_symlinks=False).st_mode):
                summary.skipped.append(f"{member.name}: hard link target is outside the workspace or missing")
                return
            _put(parent, name, lambda temp: os.link(source_parts[-1], temp, src_dir_fd=source_dir,
                                                     dst_dir_fd=parent, follow_symlinks=False))
        except FileNotFoundError:
            summary.skipped.append(f"{member.name}: hard link target is outside the workspace or missing")
            return
        finally:
            if source_dir >= 0:
                os.close(source_dir)
        summary.files += 1
    else:
        summary.skipped.append(f"{member.name}: device files, FIFOs and sockets are not allowed")


def _exact_mode(parent: int, name: str, mode: int, kind: Callable[[int], bool]) -> None:
    """Gives `name` the archive's own mode, one its owner may not read or write (a copy of a workspace whose
    model ran chmod 000 comes back as it was), through an O_PATH descriptor (no link followed; fchmod refuses
    O_PATH, chmod of its /proc/self/fd entry acts on the inode) proven to be of the expected kind."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        if kind(os.fstat(fd).st_mode):
            os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def _close_directories(root_fd: int, closed: list[tuple[list[str], int]], summary: Summary) -> None:
    """The directories whose archived mode shuts out their owner, given it last and deepest first: each stays
    open to the extraction until then, and a parent's lookup still works while its children are done."""
    for parts, mode in sorted(closed, key=lambda one: -len(one[0])):
        try:
            parent = _parent_fd(root_fd, parts[:-1])
        except OSError as exc:
            summary.skipped.append(f"{'/'.join(parts)}: its mode {mode:o} cannot be set ({exc.strerror or exc})")
            continue
        try:
            _exact_mode(parent, parts[-1], mode, stat.S_ISDIR)
        except OSError as exc:
            summary.skipped.append(f"{'/'.join(parts)}: its mode {mode:o} cannot be set ({exc.strerror or exc})")
        finally:
            os.close(parent)


def _put(parent: int, name: str, make: Callable[[str], None]) -> None:
    """Makes the entry under a temporary name beside `name`, then renames it over `name`: whatever was there
    (a file, a link, which is replaced and never written through) stays whole until the new entry is complete,
    so an upload that is cancelled, cut off or refused mid-member leaves the old file, as WriteFile does."""
    global _temp_count
    _temp_count += 1
    temp = f".ocsb-upload-{os.getpid()}-{_temp_count}"
    announce(os.path.join(os.readlink(f"/proc/self/fd/{parent}"), temp))
    try:
        make(temp)
    except FileExistsError:
        announce(None)  # the name was taken (a tool process can guess it): that entry is not ours to remove
        raise
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=parent)
        raise
    try:
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=parent)
        raise


def _stopped(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds the member being written, whose temporary file is then removed


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _stopped)
    if len(argv) >= 3 and argv[0] == "extract":
        try:
            summary = extract(sys.stdin.buffer, argv[1], int(argv[2]), argv[3] if len(argv) > 3 else "")
        except ArchiveTooLargeError as exc:
            print(str(exc), file=sys.stderr)
            return 3
        except DestinationError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        except tarfile.TarError as exc:
            print(f"not a valid tar archive: {exc}", file=sys.stderr)
            return 2
        json.dump(summary.__dict__, sys.stdout)
        return 0
    if len(argv) == 2 and argv[0] == "create":
        try:
            left_out = create(argv[1], sys.stdout.buffer)
        except OSError as exc:
            print(f"cannot archive {argv[1]}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        for line in left_out:  # on stderr, which the agent logs: the archive itself is complete without them
            print(f"left out {line}", file=sys.stderr)
        return 0
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
