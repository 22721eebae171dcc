"""Workspace disk images made from the plane's template (workspace_disk.WorkspaceDisks): each a clean ext4 whose
root is its own sandbox's tool uid, without lost+found, and the template made once per size."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from controlplane.errors import SandboxStartError
from controlplane.sandbox.workspace_disk import WorkspaceDisks, _debugfs

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(p) for p in ("mkfs.ext4", "debugfs", "losetup", "e2fsck")),
    reason="workspace disks need root and e2fsprogs",
)


def _root_inode(image: Path) -> str:
    return subprocess.run(["debugfs", "-R", "stat <2>", str(image)], capture_output=True, text=True,
                          check=True).stdout


def _listing(image: Path) -> str:
    return subprocess.run(["debugfs", "-R", "ls -l /", str(image)], capture_output=True, text=True,
                          check=True).stdout


def test_each_disk_is_a_clean_filesystem_owned_by_its_own_tool_uid(tmp_path: Path) -> None:
    disks = WorkspaceDisks(tmp_path, 64)
    try:
        for sandbox_id, owner in (("aaaaaaaaaaaa", 101000), ("bbbbbbbbbbbb", 1000)):
            options = disks.create(sandbox_id, owner)
            assert options["device"].startswith("/dev/loop")
            image = disks.image(sandbox_id)
            assert f"User: {owner:>5}   Group: {owner:>5}" in _root_inode(image)
            assert "lost+found" not in _listing(image)
            checked = subprocess.run(["e2fsck", "-fn", str(image)], capture_output=True, text=True, check=False)
            assert checked.returncode == 0, checked.stdout
            assert os.stat(image).st_blocks * 512 < 8 << 20  # sparse: the data extents only
        assert disks.list_ids() == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
    finally:
        for sandbox_id in disks.list_ids():
            disks.release(sandbox_id)


def test_the_template_is_made_once_per_size(tmp_path: Path) -> None:
    disks = WorkspaceDisks(tmp_path, 64)
    try:
        disks.create("aaaaaaaaaaaa", 1000)
        [template] = (tmp_path / "disk-template").iterdir()
        made = template.stat().st_ino
        disks.create("bbbbbbbbbbbb", 1000)
        assert [p.stat().st_ino for p in (tmp_path / "disk-template").iterdir()] == [made]
        assert "User:     0   Group:     0" in _root_inode(template)  # no sandbox's uid in the template itself
    finally:
        for sandbox_id in disks.list_ids():
            disks.release(sandbox_id)


def test_a_debugfs_command_that_fails_fails_the_create(tmp_path: Path) -> None:
    image = tmp_path / "x.img"
    with image.open("wb") as f:
        f.truncate(16 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    with pytest.raises(SandboxStartError, match="debugfs"):
        _debugfs(image, ["sif <2> uid 5", "no_such_command"])
