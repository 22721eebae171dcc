"""Each Docker sandbox's host dir (`DATA_DIR/sandboxes/<id>`) is a small tmpfs of its own.

A bind mount's entry in the sandbox's `/proc/self/mountinfo` names its source as a path inside the source's
filesystem: for a plain directory on the host's disk that was `DATA_DIR/sandboxes/<id>` (for the agent's
socket dir and for the account files bound over `/etc/passwd` and `/etc/group`), so every sandbox could read
where the control plane keeps its store, tokens and disk images. runc cannot mask a per-process file. When the
dir is the root of a filesystem of its own, the same entries read `/`, `/passwd` and `/group` on a `tmpfs`:
nothing of the host's layout. The size cap also bounds what a compromised agent (root in the container, the
dir's owner) could write to the host: before, it could fill the data dir's disk.

Mounting needs root on the host, as the Docker provider's workspace disks and tool uid claims already do.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from pathlib import Path

from controlplane.errors import SandboxStartError

MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MNT_DETACH = 2
OPTIONS = "size=1m,nr_inodes=64,mode=0700"
"""Room for the socket, labels.json and the two account files; 0700: only root on the host and the agent (root in
its container) may enter, as before."""
SOURCE = "tmpfs"
"""The device name the mount table shows: the same word as every other tmpfs there."""

_libc = ctypes.CDLL(None, use_errno=True)


def mount_private(path: Path) -> None:
    """Mounts a fresh tmpfs on `path` (an existing, empty directory)."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if _libc.mount(SOURCE.encode(), os.fsencode(path), b"tmpfs", flags, OPTIONS.encode()) != 0:
        code = ctypes.get_errno()
        raise SandboxStartError(
            f"sandbox dir {path}: cannot mount its private tmpfs ({os.strerror(code)}); the Docker provider runs "
            "as root on the engine's host"
        )


def unmount(path: Path) -> None:
    """Detaches the tmpfs at `path` if one is there (lazily: an agent may still hold its socket); idempotent."""
    if _libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more), or no such dir
            raise OSError(code, os.strerror(code), str(path))


def mounted_under(root: Path) -> list[Path]:
    """The mount points at or below `root` in this process's mount table, deepest first."""
    prefix = str(root).rstrip("/") + "/"
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4:
                # Octal escapes (\040 for a space) as the kernel writes them.
                point = fields[4].encode().decode("unicode_escape")
                if point == str(root) or point.startswith(prefix):
                    found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def unmount_all_under(root: Path) -> None:
    """Detaches every mount left below `root` (a data dir about to be deleted)."""
    for point in mounted_under(root):
        with contextlib.suppress(OSError):
            unmount(point)
