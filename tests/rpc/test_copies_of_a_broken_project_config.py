"""A session's copies (a snapshot's restore, a fork, the snapshot kept at delete) stay restorable when the model
rewrote the workspace's project config into one CreateSession refuses: the copy runs with the config the session
ran with (what the project's files narrowed stays narrowed), as the live session itself went on running with it.
Through the public API on the local plane."""

from __future__ import annotations

import json

import grpc
import pytest

from controlplane.client import AsyncClient
from tests.archives import tar_of
from tests.planes import served_plane, tenant_clients

TENANTS = [{"name": "alpha", "token": "broken-config-alpha"}]
plane = served_plane("local", tenants=TENANTS, pool={"size": 0}, lifetime={"retain_s": 3600})
clients = tenant_clients(TENANTS)

# The project's own config: it takes webfetch away, which its copies must keep doing.
PROJECT = json.dumps({"tools": {"webfetch": False}})


async def _tools(client: AsyncClient, session_id: str) -> set[str]:
    return {tool.id for tool in (await client.list_tools(session_id)).tools}


async def _work(client: AsyncClient, session_id: str) -> str:
    return (await client.run(session_id, ["cat", "work.txt"])).stdout.decode()


async def test_a_copy_of_a_session_whose_model_broke_opencode_json_restores_with_its_config(
        clients: dict[str, AsyncClient]) -> None:
    alpha = clients["alpha"]
    source = (await alpha.create_session(
        workspace_archive=tar_of({"work.txt": "the work\n", "opencode.json": PROJECT}))).id
    assert "webfetch" not in await _tools(alpha, source)
    assert (await alpha.run(source, ["bash", "-c", "printf '{\"agent\": 5}' > opencode.json"])).exit_code == 0

    snap = await alpha.snapshot(source)
    restored = await alpha.create_session(from_snapshot=snap.id)
    fork = await alpha.fork(source)
    kept = await alpha.delete_keeping(source)
    from_kept = await alpha.create_session(from_snapshot=kept.id)
    for copy in (restored, fork, from_kept):
        assert await _work(alpha, copy.id) == "the work\n"
        assert copy.agent == "build"
        # The session's own config, not the caller's alone: the project's narrowing holds in every copy.
        tools = await _tools(alpha, copy.id)
        assert "webfetch" not in tools
        assert "read" in tools
        await alpha.delete_session(copy.id)
    await alpha.delete_snapshot(snap.id)
    await alpha.delete_snapshot(kept.id)


async def test_a_new_session_with_a_broken_project_config_is_still_refused(clients: dict[str, AsyncClient]) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await clients["alpha"].create_session(workspace_archive=tar_of({"opencode.json": '{"agent": 5}'}))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "`agent` must be an object" in (caught.value.details() or "")
