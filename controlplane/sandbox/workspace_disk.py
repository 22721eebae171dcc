"""Size-limited workspaces: one ext4 image per sandbox on the host, attached to a loop device and mounted
by Docker's `local` volume driver (overlay2 on ext4 has no per-volume quota, `--storage-opt size` needs xfs).

Each image is a sparse copy of a template the plane makes once per size (`DATA_DIR/disk-template/`, with the
plane's private data): an empty ext4 without lost+found, whose root is then given to the sandbox's tool uid. That
is one `debugfs` per create instead of `mkfs.ext4` and `debugfs` (about 21 against 41 ms at load 5,
docs/performance.md). Every copy has the template's UUID and directory hash seed: only the plane can read either
(the image files and the loop devices are the host's), and ext4 mounts filesystems that share a UUID.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from controlplane.errors import SandboxStartError
from controlplane.sandbox.layout import WORKSPACE_MOUNT_OPTIONS

TEMPLATE_FORMAT = 1
"""In the template's name: a change to how the template is made (mkfs's options, what is removed) takes a new
name, so that a data dir's template from before is never copied."""


class WorkspaceDisks:
    """`DATA_DIR/disks/<id>.img`: created before the sandbox's volume, released after it is removed."""

    def __init__(self, data_dir: Path, size_mb: int) -> None:
        self.root = data_dir / "disks"
        self.size_mb = size_mb
        self._templates = data_dir / "disk-template"
        self._template_lock = threading.Lock()

    def image(self, sandbox_id: str) -> Path:
        return self.root / f"{sandbox_id}.img"

    def create(self, sandbox_id: str, owner: int) -> dict[str, str]:
        """Makes the filesystem, its root owned by the sandbox's tool uid and gid `owner`, and attaches it;
        returns the volume's driver options."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.image(sandbox_id)
        try:
            _sparse_copy(self._template(), path)
            # The tool user owns the root, as Docker's copy-up would make it.
            _debugfs(path, [f"sif <2> uid {owner}", f"sif <2> gid {owner}"])
            device = _run(["losetup", "--find", "--show", str(path)]).strip()
        except BaseException:
            self.release(sandbox_id)
            raise
        return {"type": "ext4", "device": device, "o": WORKSPACE_MOUNT_OPTIONS}

    def release(self, sandbox_id: str) -> None:
        """Detaches the image's loop devices (lazily when still mounted) and deletes it; idempotent."""
        path = self.image(sandbox_id)
        if not path.exists():
            return
        attached = subprocess.run(["losetup", "-j", str(path)], capture_output=True, text=True, check=False)
        for line in attached.stdout.splitlines():
            device = line.partition(":")[0]
            if device:
                subprocess.run(["losetup", "-d", device], capture_output=True, check=False)
        path.unlink(missing_ok=True)

    def list_ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.img"))

    def _template(self) -> Path:
        """This size's template, made on first use: an empty ext4 whose root is root's, without lost+found (the
        workspace starts empty, as a plain volume does)."""
        template = self._templates / f"ext4-{self.size_mb}m-v{TEMPLATE_FORMAT}.img"
        with self._template_lock:
            if not template.exists():
                self._templates.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd, name = tempfile.mkstemp(dir=self._templates, suffix=".part")
                try:
                    os.ftruncate(fd, self.size_mb << 20)  # sparse: only what is written takes host disk
                    os.close(fd)
                    _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E",
                          "root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1", name])
                    _debugfs(Path(name), ["rmdir lost+found"])
                    os.replace(name, template)  # whole or absent: a plane stopped halfway leaves only a .part
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                    Path(name).unlink(missing_ok=True)
                    raise
        return template


def _sparse_copy(source: Path, target: Path) -> None:
    """`target` as a copy of `source` that writes only its data extents (a reflink where the filesystem can)."""
    with source.open("rb") as src, target.open("wb") as dst:
        size = os.fstat(src.fileno()).st_size
        dst.truncate(size)
        offset = 0
        while offset < size:
            try:
                data = os.lseek(src.fileno(), offset, os.SEEK_DATA)
            except OSError:
                break  # ENXIO: nothing but a hole from here on
            hole = os.lseek(src.fileno(), data, os.SEEK_HOLE)
            at, left = data, hole - data
            while left > 0:
                copied = os.copy_file_range(src.fileno(), dst.fileno(), left, at, at)
                if copied == 0:
                    raise SandboxStartError(f"workspace disk: the template {source} ended early")
                at, left = at + copied, left - copied
            offset = hole


def _debugfs(image: Path, commands: list[str]) -> None:
    """Runs `commands` in one `debugfs -w`. It exits 0 even when a command fails, and says so on stderr after
    its version banner: anything more there fails the create."""
    try:
        done = subprocess.run(["debugfs", "-w", "-f", "-", str(image)], input="\n".join(commands) + "\n",
                              capture_output=True, text=True, check=False)
    except OSError as exc:
        raise SandboxStartError(
            f"workspace disk: cannot run debugfs ({exc.strerror}); it needs e2fsprogs and util-linux on the "
            "host and root, or set resources.disk_mb = 0 for an unbounded workspace"
        ) from exc
    complaints = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("debugfs ")]
    if done.returncode != 0 or complaints:
        raise SandboxStartError(f"workspace disk: debugfs {'; '.join(commands)} failed: "
                                f"{'; '.join(complaints) or done.returncode}")


def create_volume(client: Any, name: str, disks: WorkspaceDisks | None, sandbox_id: str, owner: int,
                  labels: dict[str, str]) -> None:
    """The sandbox's workspace volume (on its disk image when `disks`), its root owned by the tool uid `owner`.
    The container mounts it without copy-up, which would give it the image's /workspace owner instead."""
    disk = disks.create(sandbox_id, owner) if disks is not None else {}
    volume = client.volumes.create(name=name, driver="local", driver_opts=disk, labels=labels)
    if disks is None:  # a plain volume: a host dir of the engine's, on this host
        os.chown(volume.attrs["Mountpoint"], owner, owner)


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise SandboxStartError(
            f"workspace disk: cannot run {argv[0]} ({exc.strerror}); it needs e2fsprogs and util-linux on the "
            "host and root, or set resources.disk_mb = 0 for an unbounded workspace"
        ) from exc
    if done.returncode != 0:
        raise SandboxStartError(
            f"workspace disk: {' '.join(argv[:2])} failed: {(done.stderr or done.stdout).strip()}; "
            "set resources.disk_mb = 0 for an unbounded workspace"
        )
    return done.stdout
