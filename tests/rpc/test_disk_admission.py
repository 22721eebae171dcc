"""Disk in host admission through the public API: a create is RESOURCE_EXHAUSTED, naming the figures, when the
data dir's filesystem has less free space than `host.disk_reserve_mb` plus what the new session needs at once
(its archive here; the Docker provider's image metadata too, host_capacity.disk_need_mb). The data dir is a
small tmpfs the test mounts (root), filled by a file standing for what sessions wrote."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.host_capacity import disk_need_mb, free_disk_mb
from tests.planes import new_instance, remove_data_dir, short_tmp

TOKEN = "token-acme"
FS_MB = 48
RESERVE_MB = 16


def archive_of(size_mb: int) -> bytes:
    """A tar of `size_mb` MiB of random bytes (gzip would not shrink them: the archive is that large)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        data = os.urandom(size_mb << 20)
        info = tarfile.TarInfo("blob.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture
async def small_disk_plane() -> AsyncIterator[tuple[AsyncClient, Path]]:
    data_dir = short_tmp()
    mounted = await asyncio.to_thread(
        subprocess.run, ["mount", "-t", "tmpfs", "-o", f"size={FS_MB}m,mode=0700", "tmpfs", str(data_dir)],
        capture_output=True, text=True, check=False,
    )
    if mounted.returncode != 0:
        remove_data_dir(data_dir)
        pytest.skip(f"cannot mount a tmpfs for the data dir (needs root): {mounted.stderr.strip()}")
    plane = None
    try:
        settings = load_settings(
            None, data_dir=data_dir, instance=new_instance("disk"), provider={"type": "local"},
            server={"listen": "127.0.0.1:0"}, pool={"size": 0}, tenants=[{"name": "acme", "token": TOKEN}],
            host={"disk_reserve_mb": RESERVE_MB},
        )
        plane = await app.start(settings)
        client = AsyncClient(plane.address, TOKEN)
        yield client, data_dir
        for session in await client.list_sessions():
            await client.delete_session(session.id)
        await client.close()
    finally:
        if plane is not None:
            await app.stop(plane)
        await asyncio.to_thread(subprocess.run, ["umount", "-l", str(data_dir)], check=False)
        remove_data_dir(data_dir)


async def test_a_create_the_disk_cannot_hold_is_refused_naming_the_figures(
    small_disk_plane: tuple[AsyncClient, Path],
) -> None:
    client, data_dir = small_disk_plane
    archive = archive_of(4)
    need = -(-len(archive) // (1 << 20))
    await client.create_session(workspace=archive)  # room enough
    filler = data_dir / "written-by-sessions.bin"
    free = free_disk_mb(data_dir)
    with filler.open("wb") as out:  # leaves less than the reserve and the archive free
        out.write(b"\0" * ((free - RESERVE_MB - need + 2) << 20))
    before = len(await client.list_sessions())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.create_session(workspace=archive)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = str(info.value.details())
    found = re.fullmatch(
        r"the host's disk is full: a new session needs (\d+) MiB \(its workspace image and first write\) and the "
        r"data dir's filesystem has (\d+) MiB free, of which host.disk_reserve_mb keeps 16 and creates in flight "
        r"claim 0", details,
    )
    assert found is not None, details
    assert int(found[1]) == need
    assert int(found[2]) < RESERVE_MB + need
    assert len(await client.list_sessions()) == before  # the refused create left nothing
    await client.create_session()  # a create that writes nothing at once still fits above the reserve
    filler.unlink()  # what was written is removed: the same create is admitted again
    await client.create_session(workspace=archive)


def test_a_workspace_image_is_counted_by_its_metadata_not_its_size() -> None:
    # mkfs.ext4's journal for a 2 GiB image is 64 MiB (measured with dumpe2fs), its other metadata 1.2 MiB.
    assert disk_need_mb(2048) == 2 + 64
    assert disk_need_mb(0) == 0
    assert disk_need_mb(64 * 1024) == 64 + 1024  # the journal is at most 1 GiB
