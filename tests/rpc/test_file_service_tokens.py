"""FileService transfers check the token at every message: one revoked mid-transfer ends the transfer at its next
chunk, and a write cut off that way leaves neither a partial file nor its temporary file behind."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient
from controlplane.v1 import file_pb2
from tests.planes import Plane, served_plane

TENANTS = [{"name": "alpha", "token": "token-alpha"}]
MIB = 1024 * 1024

plane = served_plane("local", scope="function", tenants=TENANTS, pool={"size": 0})


def admin_of(plane: Plane) -> AsyncAdminClient:
    return AsyncAdminClient(plane.plane.address, plane.plane.settings.admin_token_file.read_text().strip())


class Gated:
    """A source that gives one MiB, then waits for `go` before giving more (read from the client's thread)."""

    def __init__(self) -> None:
        self.first_read = threading.Event()
        self.go = threading.Event()
        self.reads = 0

    def read(self, size: int, /) -> bytes:
        self.reads += 1
        if self.reads == 1:
            self.first_read.set()
            return b"a" * MIB
        if self.reads <= 4:
            self.go.wait(30)
            return b"b" * MIB
        return b""


async def test_a_token_revoked_mid_transfer_ends_it(plane: Plane) -> None:
    async with admin_of(plane) as admin:
        made = await admin.create_tenant("bob")
        bob = AsyncClient(plane.plane.address, made.token)
        session = await bob.create_session()
        await bob.write_file(session.id, "big.bin", b"z" * (64 * MIB))  # more than flow control lets ahead

        # A download: the first chunk arrives, the token is revoked, the next chunk is refused.
        request = file_pb2.ReadFileRequest(session_id=session.id, path="big.bin")
        chunks = bob._files.ReadFile(request, metadata=bob._metadata)  # the raw stream, to stop between chunks
        first = await anext(aiter(chunks))
        assert first.data.startswith(b"z")
        await admin.revoke_token("bob")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in chunks:
                pass
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED

        # A write: the first chunk is sent, the token is revoked, the next message is refused.
        rotated = await admin.rotate_token("bob")
        await bob.close()
        bob = AsyncClient(plane.plane.address, rotated.token)
        source = Gated()
        writing = asyncio.ensure_future(bob.write_file(session.id, "cut/partial.bin", source))
        await asyncio.to_thread(source.first_read.wait, 30)
        await admin.revoke_token("bob")
        source.go.set()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await writing
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        again = await admin.rotate_token("bob")
        await bob.close()
        async with AsyncClient(plane.plane.address, again.token) as bob:
            for _ in range(50):  # the helper is stopped in the background
                listed = await bob.list_files(session.id, recursive=True)
                if not [e for e in listed.entries if e.path.startswith("cut/")]:
                    break
                await asyncio.sleep(0.1)
            assert [e.path for e in listed.entries if e.path.startswith("cut/")] == []
            await bob.delete_session(session.id)
