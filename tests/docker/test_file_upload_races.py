"""FileService.Upload against a hostile tool process in a real Docker sandbox: a directory swapped with a symlink
to /tmp while uploads extract into it never sends a member out of the workspace, and an upload cancelled in the
middle of a member leaves the file it was replacing whole."""

from __future__ import annotations

import asyncio
import contextlib
import io
import tarfile
from collections.abc import AsyncIterator

import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import file_pb2
from tests.planes import Plane, served_plane, workspace_session

pytestmark = pytest.mark.docker

plane = served_plane("docker", tenants=[{"name": "alpha", "token": "upload-races-alpha"}],
                     pool={"size": 1, "refill_concurrency": 1})
session_id = workspace_session({"keep.txt": "kept\n"}, plane="plane")

UPLOADS = 100
SWAPPER = r'''
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/workspace/race")
os.makedirs("q", exist_ok=True)
os.symlink("/tmp", "s")
end = time.time() + 90
while time.time() < end and not os.path.exists("/workspace/race-stop"):
    libc.renameat2(-100, b"q", -100, b"s", 2)  # RENAME_EXCHANGE: q and s trade places atomically
'''


def _tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def _sh(client: AsyncClient, session: str, command: str) -> str:
    done = await client.run(session, command=command)
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


async def test_a_directory_swapped_for_a_link_never_takes_an_upload_out(plane: Plane, session_id: str) -> None:
    client = plane.client
    await client.write_file(session_id, "race/swap.py", SWAPPER.encode())
    await _sh(client, session_id, "cd /workspace/race && (setsid nohup python3 swap.py >/dev/null 2>&1 &) ; sleep 0.5")
    placed, refusals = 0, {}
    try:
        for i in range(UPLOADS):
            # Half name the swapped directory as the destination, half as a member's parent.
            dest, member = ("race/q", f"escaped{i}") if i % 2 == 0 else ("race", f"q/escaped{i}")
            try:
                summary = await client.upload(session_id, _tar(member, b"written by Upload"), dest)
            except grpc.aio.AioRpcError as exc:
                refusals[exc.code()] = exc.details()
            else:
                placed += summary.files
    finally:
        await _sh(client, session_id, "touch /workspace/race-stop; sleep 0.3")
    outside = await _sh(client, session_id, "ls -A /tmp | grep -c escaped || true")
    inside = await _sh(client, session_id, "find /workspace/race -name 'escaped*' -type f | wc -l")
    assert outside == "0\n"
    assert set(refusals) <= {grpc.StatusCode.INVALID_ARGUMENT}, refusals  # a swapped destination: refused cleanly
    assert int(inside) == placed
    assert placed > 0  # the race left room for some uploads: the test exercised the extraction, not only refusals
    await _sh(client, session_id, "rm -rf /workspace/race /workspace/race-stop")


async def _cancelled_upload(client: AsyncClient, session: str, dest: str, partial: bytes) -> None:
    """An Upload that sends `partial` (the start of an archive), then is cancelled by its caller."""
    sent = asyncio.Event()

    async def requests() -> AsyncIterator[file_pb2.UploadRequest]:
        yield file_pb2.UploadRequest(session_id=session, path=dest)
        yield file_pb2.UploadRequest(data=partial)
        sent.set()
        await asyncio.sleep(3600)

    call = client._files.Upload(requests(), metadata=client._metadata)  # the raw stream, to stop mid-member
    await sent.wait()
    await asyncio.sleep(1.5)  # the helper has the member's first bytes and waits for the rest
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
        await call


async def test_a_cancelled_upload_leaves_the_old_file(plane: Plane, session_id: str) -> None:
    client = plane.client
    await client.write_file(session_id, "clobber/only.txt", b"OLD CONTENT THAT MATTERS\n")
    archive = _tar("only.txt", b"N" * 300_000)
    await _cancelled_upload(client, session_id, "clobber", archive[:64 * 1024])
    # The agent stops the helper in the background; on a busy machine its clean-up takes a moment.
    listing = ""
    for _ in range(50):
        listing = await _sh(client, session_id, "ls -A /workspace/clobber")
        if listing == "only.txt\n":
            break
        await asyncio.sleep(0.2)
    assert await _sh(client, session_id, "cat /workspace/clobber/only.txt") == "OLD CONTENT THAT MATTERS\n"
    # Nothing half-written is left beside it either.
    assert listing == "only.txt\n"
    # A complete upload still replaces it.
    await client.upload(session_id, archive, "clobber")
    assert await _sh(client, session_id, "wc -c < /workspace/clobber/only.txt") == "300000\n"
    await _sh(client, session_id, "rm -rf /workspace/clobber")


KILL_EXTRACTOR = ("for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline 2>/dev/null"
                  " | grep -q 'sandbox_agent[.]tario extract' && kill -9 ${d#/proc/}; done; true")
"""SIGKILLs the upload's extraction helper (the tool user's own process): it gets no chance to clean up."""


async def test_a_killed_upload_helper_leaves_the_old_file(plane: Plane, session_id: str) -> None:
    # The helper cannot remove its half-written member when it is SIGKILLed (by a tool process of the same uid,
    # or at the end of the agent's grace on a starved machine): the agent removes the one it announced.
    client = plane.client
    await client.write_file(session_id, "killed/only.txt", b"OLD CONTENT THAT MATTERS\n")
    sent, killed = asyncio.Event(), asyncio.Event()

    async def requests() -> AsyncIterator[file_pb2.UploadRequest]:
        yield file_pb2.UploadRequest(session_id=session_id, path="killed")
        yield file_pb2.UploadRequest(data=_tar("only.txt", b"N" * 300_000)[:64 * 1024])
        sent.set()
        await killed.wait()  # then the stream ends: the agent reads a caller's stream to its end before answering

    call = client._files.Upload(requests(), metadata=client._metadata)
    await sent.wait()
    for _ in range(100):  # until the helper has made its temporary member
        if ".ocsb-upload-" in await _sh(client, session_id, "ls -A /workspace/killed"):
            break
        await asyncio.sleep(0.1)
    await _sh(client, session_id, KILL_EXTRACTOR)
    killed.set()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(call, 30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert await _sh(client, session_id, "ls -A /workspace/killed") == "only.txt\n"
    assert await _sh(client, session_id, "cat /workspace/killed/only.txt") == "OLD CONTENT THAT MATTERS\n"
    await _sh(client, session_id, "rm -rf /workspace/killed")


async def test_a_cut_archive_leaves_the_old_file(plane: Plane, session_id: str) -> None:
    client = plane.client
    await client.write_file(session_id, "cut/only.txt", b"OLD\n")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.upload(session_id, _tar("only.txt", b"N" * 300_000)[:100_000], "cut")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await _sh(client, session_id, "cat /workspace/cut/only.txt; ls -A /workspace/cut") == "OLD\nonly.txt\n"
    await _sh(client, session_id, "rm -rf /workspace/cut")
