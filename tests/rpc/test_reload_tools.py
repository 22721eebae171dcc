"""ToolService.ReloadTools through the public API, the Python clients and the CLI (local plane: the real agent
as a host process; tests/security/test_code_snapshot.py is the proof in containers)."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from controlplane import cli
from controlplane.client import AsyncClient, Client
from controlplane.core.definitions.tool_reload import compare
from controlplane.core.seam.messages import CodeChanges
from sandbox_agent.custom import snapshot
from tests.archives import tar_of
from tests.planes import Plane, served_plane

PY_TOOL = '''from opencode_tool import tool


async def run(args, ctx):
    return "{answer}"

default = tool(description="{answer}", args={{"type": "object", "properties": {{}}}}, execute=run)
'''
TENANTS = [{"name": "alpha", "token": "token-alpha"}, {"name": "beta", "token": "token-beta"}]
OPEN = json.dumps({"permission": {"edit": "allow", "bash": "allow"}})


plane = served_plane("local", tenants=TENANTS)


def custom_ids(listing: object) -> list[str]:
    return [t.id for t in listing.tools if t.origin.endswith(".py")]  # type: ignore[attr-defined]


async def test_reload_takes_written_files_and_reports_them(plane: Plane, capsys: pytest.CaptureFixture[str]) -> None:
    async with AsyncClient(plane.plane.address, "token-alpha") as client:
        session = await client.create_session(
            workspace_archive=tar_of({".opencode/tool/answer.py": PY_TOOL.format(answer="shipped")}), config_json=OPEN,
        )
        assert custom_ids(await client.list_tools(session.id)) == ["answer"]
        path = "/".join([(await client.list_tools(session.id)).tools[-1].origin.rsplit("/", 1)[0], "late.py"])
        written = await client.execute_tool(session.id, "write", {"filePath": path,
                                                                  "content": PY_TOOL.format(answer="late")})
        assert written.error is None, written.error
        assert custom_ids(await client.list_tools(session.id)) == ["answer"]

        # The CLI: `controlplane tools reload SESSION`, run as a person would (its own event loop).
        code = await asyncio.to_thread(cli.main, ["tools", "reload", session.id, "--target", plane.plane.address,
                                                  "--token", "token-alpha"])
        assert code == 0
        printed = capsys.readouterr().out.splitlines()
        assert printed == ["tool added    late", f"file added    {path}"]
        assert custom_ids(await client.list_tools(session.id)) == ["answer", "late"]
        assert (await client.execute_tool(session.id, "late", {})).output == "late"

        # Nothing new: an empty answer.
        report = await client.reload_tools(session.id)
        assert (list(report.added_tools), list(report.changed_tools), list(report.removed_tools)) == ([], [], [])
        assert (list(report.added_files), list(report.changed_files), list(report.removed_files)) == ([], [], [])

        # Another tenant's session does not exist for this caller.
        async with AsyncClient(plane.plane.address, "token-beta") as other:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await other.reload_tools(session.id)
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.reload_tools("")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await client.delete_session(session.id)


async def test_the_sync_client_reloads_too(plane: Plane) -> None:
    def drive() -> list[str]:
        with Client(plane.plane.address, "token-alpha") as client:
            session = client.create_session(config_json=OPEN)
            report = client.reload_tools(session.id)
            client.delete_session(session.id)
            return list(report.added_tools)

    assert await asyncio.to_thread(drive) == []


def test_compare_names_added_changed_and_removed_tools() -> None:
    before = {"a": ("/w/a.ts", "1"), "b": ("/w/b.ts", "1"), "c": ("/w/c.ts", "1"), "d": ("/w/d.ts", "1")}
    after = {"a": ("/w/a.ts", "1"), "b": ("/w/b.ts", "2"), "d": ("/w/d.ts", "1"), "e": ("/w/e.ts", "1")}
    report = compare(before, after, CodeChanges(added=["/w/e.ts"], changed=["/w/d.ts"], removed=["/w/c.ts"]), [])
    # b's definition changed; d's file changed (its definition did not); a is untouched.
    assert (report.added, report.changed, report.removed) == (["e"], ["b", "d"], ["c"])
    assert report.summary().startswith("tools added: e; tools changed: b, d; tools removed: c; files added: /w/e.ts")


async def test_code_too_big_to_snapshot_refuses_the_create_and_leaves_nothing(
    plane: Plane, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The local plane's agent runs in this process: its limit can be lowered here.
    monkeypatch.setattr(snapshot, "MAX_FILES", 1)
    files = {".opencode/tool/a.py": PY_TOOL.format(answer="a"), ".opencode/tool/b.py": PY_TOOL.format(answer="b")}
    async with AsyncClient(plane.plane.address, "token-beta") as client:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.create_session(workspace_archive=tar_of(files))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "holds more than 1 files" in (refused.value.details() or "")
        assert await client.list_sessions() == []
