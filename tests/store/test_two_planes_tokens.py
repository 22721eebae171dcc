"""A revoke made by one control plane ends a stream open on another plane sharing the store, within the
refresh interval (controlplane.rpc.token_watch; the directory is read again every REFRESH_S)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterable

import grpc
import pytest

from controlplane import app
from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.core.tenants.lifecycle import REFRESH_S
from tests.planes import new_instance, remove_data_dir, short_tmp

TENANTS = [{"name": "alpha", "token": "token-alpha"}]
STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
PROMPT_S = 1.0


@pytest.mark.parametrize("kind", STORES)
async def test_a_revoke_made_by_another_plane_ends_an_open_stream_within_the_refresh(
    kind: str, request: pytest.FixtureRequest,
) -> None:
    data_dir = short_tmp()
    url = str(request.getfixturevalue("pg_url")) if kind == "postgres" else f"sqlite://{data_dir}/shared.db"

    async def start(name: str) -> app.ControlPlane:
        settings = load_settings(None, data_dir=data_dir / name, instance=new_instance(), provider={"type": "local"},
                                 server={"listen": "127.0.0.1:0"}, pool={"size": 0}, tenants=TENANTS,
                                 store={"url": url})
        return await app.start(settings)

    a = await start("a")
    b = await start("b")
    try:
        async with AsyncClient(a.address, "token-alpha") as alpha:
            session = await alpha.create_session()
            stream = alpha.exec_call(session.id, ["sh", "-c", "echo up; sleep 30"])
            async for event in stream:
                if event.stdout == b"up\n":
                    break
            began = time.monotonic()
            admin_token = b.settings.admin_token_file.read_text().strip()
            async with AsyncAdminClient(b.address, admin_token) as admin_b:
                await admin_b.revoke_token("alpha")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _drain(stream)
            took = time.monotonic() - began
            assert (info.value.code(), info.value.details()) == (
                grpc.StatusCode.UNAUTHENTICATED, "bearer token revoked"
            )
            assert took < REFRESH_S + PROMPT_S, f"plane A ended the stream {took:.2f}s after plane B's revoke"
            print(f"{kind}: plane A ended the stream {took:.2f}s after plane B's revoke")
            await a.store.put_tenant("alpha", hashlib.sha256(b"token-alpha").hexdigest())  # to clean up
            assert a.tenants is not None
            await a.tenants.refresh()
            await alpha.delete_session(session.id)
    finally:
        await app.stop(b)
        await app.stop(a)
        remove_data_dir(data_dir)


async def _drain(stream: AsyncIterable[object]) -> None:
    async for _ in stream:
        pass
