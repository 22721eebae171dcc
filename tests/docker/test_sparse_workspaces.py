"""A sparse file in a session's workspace (`truncate -s` past the session's disk: a few blocks on that disk, a
few KiB in a snapshot) comes back from a snapshot restore and from a pause/resume at its full size, on a disk of
the same size: the restore writes its zero runs as holes, so the tenant's kept work stays recoverable whatever a
model did with truncate."""

from __future__ import annotations

import pytest

from controlplane.client import AsyncClient
from tests.archives import tar_of
from tests.planes import Plane, served_plane

pytestmark = pytest.mark.docker

DISK_MB = 256
SPARSE_MB = 300  # more than the whole disk
plane = served_plane("docker", pool={"size": 0}, resources={"disk_mb": DISK_MB})
# data at both ends and in the middle, so the restore has data pages to write between the holes
MAKE = (f"truncate -s {SPARSE_MB}M big.img && printf head | dd of=big.img conv=notrunc status=none && "
        "printf middle | dd of=big.img bs=1 seek=104857600 conv=notrunc status=none && printf tail >> big.img")
CHECK = ("stat -c '%s %b %B' big.img && head -c 4 big.img && tail -c 4 big.img && "
         "dd if=big.img bs=1 skip=104857600 count=6 status=none && cat work.txt")
SIZE = SPARSE_MB * 1024 * 1024 + 4


async def _sh(client: AsyncClient, session: str, command: str) -> str:
    done = await client.run(session, ["bash", "-c", command])
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


def _assert_whole(listing: str) -> None:
    first, rest = listing.split("\n", 1)
    size, blocks, block_size = (int(v) for v in first.split())
    assert size == SIZE
    assert blocks * block_size < 4 * 1024 * 1024  # its data pages, not the 300 MiB it claims
    assert rest == "headtailmiddlekept work\n"


async def test_a_file_sparser_than_the_disk_survives_snapshot_restore_and_pause_resume(plane: Plane) -> None:
    client = plane.client
    session = await client.create_session(workspace_archive=tar_of({"work.txt": "kept work\n"}))
    await _sh(client, session.id, MAKE)
    _assert_whole(await _sh(client, session.id, CHECK))

    snapshot = await client.snapshot(session.id)
    restored = await client.create_session(from_snapshot=snapshot.id)
    _assert_whole(await _sh(client, restored.id, CHECK))
    await client.delete_session(restored.id)
    await client.delete_snapshot(snapshot.id)

    await client.pause(session.id)
    await client.resume(session.id)
    _assert_whole(await _sh(client, session.id, CHECK))
    await client.delete_session(session.id)
