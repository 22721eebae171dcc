"""Size-limited workspaces: one ext4 image per sandbox on the host, attached to a loop device and mounted
by Docker's `local` volume driver (overlay2 on ext4 has no per-volume quota, `--storage-opt size` needs xfs).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from controlplane.errors import SandboxStartError
from controlplane.sandbox.layout import WORKSPACE_MOUNT_OPTIONS


class WorkspaceDisks:
    """`DATA_DIR/disks/<id>.img`: created before the sandbox's volume, released after it is removed."""

    def __init__(self, data_dir: Path, size_mb: int) -> None:
        self.root = data_dir / "disks"
        self.size_mb = size_mb

    def image(self, sandbox_id: str) -> Path:
        return self.root / f"{sandbox_id}.img"

    def create(self, sandbox_id: str, owner: int) -> dict[str, str]:
        """Makes the filesystem, its root owned by the sandbox's tool uid and gid `owner`, and attaches it;
        returns the volume's driver options."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.image(sandbox_id)
        try:
            with path.open("wb") as image:
                image.truncate(self.size_mb << 20)  # sparse: only what is written takes host disk
            # The tool user owns the root, as Docker's copy-up would make it.
            _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E",
                  f"root_owner={owner}:{owner},lazy_itable_init=1,lazy_journal_init=1", str(path)])
            # The workspace starts empty, as a plain volume does: no lost+found for tools to list.
            _run(["debugfs", "-w", "-R", "rmdir lost+found", str(path)])
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
