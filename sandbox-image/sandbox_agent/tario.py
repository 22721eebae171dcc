"""Workspace archives, run as the unprivileged tool user in a child process.

    python3 -m sandbox_agent.tario extract DEST MAX_BYTES [WORKSPACE] < archive.tar   -> JSON summary on stdout
    python3 -m sandbox_agent.tario create SRC > archive.tar

Extraction never follows a symlink: every entry's parent must resolve inside DEST, files are
opened with O_NOFOLLOW, and a symlink that is already there is replaced, not written through.
Absolute names, `..`, device files and FIFOs are refused and listed in the summary; with WORKSPACE (the files
API's uploads) so are symlinks leading outside WORKSPACE. Because the
process has the tool user's rights only, even a missed case cannot write where that user cannot.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import tarfile
from dataclasses import dataclass, field
from typing import IO

from sandbox_agent.errors import AgentError


class ArchiveTooLargeError(AgentError):
    pass


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


def _remove_if_link_or_file(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        os.unlink(path)


def extract(stream: IO[bytes], dest: str, max_bytes: int, confine: str = "") -> Summary:
    """`confine`: the workspace every symlink must lead into (none: symlinks are kept as given)."""
    root = os.path.realpath(dest)
    summary = Summary()
    with tarfile.open(fileobj=stream, mode="r|*") as archive:
        for member in archive:
            rel = _clean_name(member.name)
            if rel is None:
                summary.skipped.append(f"{member.name}: path escapes the workspace")
                continue
            if rel == "":
                continue
            target = os.path.join(root, rel)
            parent = os.path.realpath(os.path.dirname(target))
            if not _inside(root, parent):
                summary.skipped.append(f"{member.name}: parent directory leads outside the workspace")
                continue
            target = os.path.join(parent, os.path.basename(target))
            if confine and member.issym() and not _link_inside(confine, target, member.linkname):
                summary.skipped.append(f"{member.name}: symbolic link to {member.linkname} leads outside the workspace")
                continue
            try:
                _extract_member(archive, member, target, root, summary, max_bytes)
            except ArchiveTooLargeError:
                raise
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    # Skipping would hand the caller a session missing part of its files: refuse the upload.
                    raise ArchiveTooLargeError(
                        f"{member.name}: {exc.strerror}: the archive does not fit the workspace") from exc
                summary.skipped.append(f"{member.name}: {exc.strerror or exc}")
    return summary


def _extract_member(
    archive: tarfile.TarFile, member: tarfile.TarInfo, target: str, root: str, summary: Summary, max_bytes: int
) -> None:
    mode = member.mode & 0o777
    if member.isdir():
        if os.path.islink(target):
            os.unlink(target)
        os.makedirs(target, exist_ok=True)
        os.chmod(target, mode | 0o700)
        summary.directories += 1
    elif member.isreg():
        if summary.bytes + member.size > max_bytes:
            raise ArchiveTooLargeError(f"archive expands past the {max_bytes}-byte limit")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _remove_if_link_or_file(target)
        source = archive.extractfile(member)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode | 0o600)
        with os.fdopen(fd, "wb") as out:
            while source is not None and (block := source.read(1024 * 1024)):
                out.write(block)
        os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)
        summary.files += 1
        summary.bytes += member.size
    elif member.issym():
        _remove_if_link_or_file(target)
        os.symlink(member.linkname, target)
        summary.symlinks += 1
    elif member.islnk():
        source_rel = _clean_name(member.linkname)
        source_path = os.path.realpath(os.path.join(root, source_rel)) if source_rel else ""
        if not source_rel or not _inside(root, source_path) or not os.path.isfile(source_path):
            summary.skipped.append(f"{member.name}: hard link target is outside the workspace or missing")
            return
        _remove_if_link_or_file(target)
        os.link(source_path, target, follow_symlinks=False)
        summary.files += 1
    else:
        summary.skipped.append(f"{member.name}: device files, FIFOs and sockets are not allowed")


def create(src: str, out: IO[bytes]) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        if os.path.isdir(src):
            for entry in sorted(os.listdir(src)):
                archive.add(os.path.join(src, entry), arcname=entry)
        else:
            archive.add(src, arcname=os.path.basename(src))


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "extract":
        try:
            summary = extract(sys.stdin.buffer, argv[1], int(argv[2]), argv[3] if len(argv) > 3 else "")
        except ArchiveTooLargeError as exc:
            print(str(exc), file=sys.stderr)
            return 3
        except tarfile.TarError as exc:
            print(f"not a valid tar archive: {exc}", file=sys.stderr)
            return 2
        json.dump(summary.__dict__, sys.stdout)
        return 0
    if len(argv) == 2 and argv[0] == "create":
        try:
            create(argv[1], sys.stdout.buffer)
        except OSError as exc:
            print(f"cannot archive {argv[1]}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        return 0
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
