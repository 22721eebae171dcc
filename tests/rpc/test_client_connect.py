"""The SDK against a running control plane (in-process agents): `connect()` from the data dir, a directory as the
workspace, `on_event` seeing the stream in order, the default rejection of permission requests, and the sync
client doing the same."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from controlplane.client import Client, PermissionRequest, ToolEvent, allow_once, connect
from controlplane.client_types import NO_PERMISSION_HANDLER
from controlplane.errors import ConfigError
from controlplane.v1 import tool_pb2
from tests.planes import Plane, served_plane

plane = served_plane("local")
ENVIRONMENT = ("CONTROLPLANE_TARGET", "CONTROLPLANE_TOKEN", "CONTROLPLANE_CONFIG", "CONTROLPLANE_DATA_DIR")


@pytest.fixture
def from_data_dir(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Nothing but the data dir names the plane: connect() must read its endpoint and token files."""
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    data_dir = plane.plane.settings.data_dir
    monkeypatch.setenv("CONTROLPLANE_DATA_DIR", str(data_dir))
    return data_dir


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hello')\n")
    (root / ".env").write_text("API_KEY=hunter2\n")
    os.symlink(root / "src" / "app.py", root / "link-in")
    return root


async def test_connect_finds_the_plane_from_the_data_dir(plane: Plane, from_data_dir: Path) -> None:
    assert (from_data_dir / "endpoint").read_text().strip() == plane.plane.address
    async with connect() as client:
        session = await client.create_session()
        assert [s.id for s in await client.list_sessions()] == [s.id for s in await plane.client.list_sessions()]
        await client.delete_session(session.id)


async def test_the_sync_client_connects_the_same_way(plane: Plane, from_data_dir: Path) -> None:
    def listed() -> list[str]:
        with Client() as client:
            return [s.id for s in client.list_sessions()]

    assert await asyncio.to_thread(listed) == [s.id for s in await plane.client.list_sessions()]


async def test_connect_without_a_token_says_where_one_comes_from(
    from_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONTROLPLANE_DATA_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="CONTROLPLANE_TOKEN"):
        connect()
    monkeypatch.setenv("CONTROLPLANE_TOKEN", "tok")
    monkeypatch.setenv("CONTROLPLANE_TARGET", "127.0.0.1:1")
    client = connect()
    await client.close()


async def test_a_directory_workspace_and_every_event_in_order(plane: Plane, project: Path) -> None:
    session = await plane.client.create_session(workspace=project)
    listed = await plane.client.run(session.id, ["sh", "-c", "cat src/app.py; readlink link-in; cat link-in"])
    assert listed.stdout == b"print('hello')\nsrc/app.py\nprint('hello')\n"

    seen: list[ToolEvent] = []
    script = "for i in 1 2 3; do echo line$i; sleep 0.05; done"
    outcome = await plane.client.execute_tool(
        session.id, "bash", {"command": script, "description": "Counts"}, on_event=seen.append,
    )
    assert outcome.output == "line1\nline2\nline3\n"
    assert seen == outcome.events
    kinds = [e.WhichOneof("event") for e in seen]
    assert kinds[-1] == "result"
    assert "metadata" in kinds
    assert "state" in kinds
    assert [e.seq for e in seen] == sorted(e.seq for e in seen)
    live = [e.metadata.metadata_json for e in seen if e.WhichOneof("event") == "metadata"]
    assert any("line1" in m for m in live)


async def test_without_on_permission_a_request_is_rejected_with_how_to_answer(plane: Plane, project: Path) -> None:
    session = await plane.client.create_session(workspace=project)
    outcome = await plane.client.execute_tool(session.id, "read", {"filePath": ".env"})
    assert outcome.error is not None
    assert "on_permission" in outcome.error
    assert "hunter2" not in outcome.error
    assert [r.permission for r in outcome.permission_requests] == ["read"]
    assert NO_PERMISSION_HANDLER.split(":")[0] in outcome.error

    order: list[str] = []

    async def on_event(event: ToolEvent) -> None:
        await asyncio.sleep(0)
        order.append(f"event:{event.WhichOneof('event')}")

    def decide(request: PermissionRequest) -> tuple[int, str]:  # a plain function is a handler too
        order.append(f"decide:{request.permission}")
        return tool_pb2.PermissionReply.ONCE, ""

    allowed = await plane.client.execute_tool(session.id, "read", {"filePath": ".env"}, on_permission=decide,
                                              on_event=on_event)
    assert "API_KEY=hunter2" in allowed.output
    asked = order.index("decide:read")
    assert order[asked - 1] == "event:permission_request"  # the callback saw the request before it was answered
    assert order[-1] == "event:result"


async def test_the_sync_client_mirrors_the_async_one(plane: Plane, project: Path) -> None:
    # The plane serves on this test's loop: the blocking client runs on a thread beside it, as a script would.
    await asyncio.to_thread(use_the_sync_client, plane, project)


def use_the_sync_client(plane: Plane, project: Path) -> None:
    with Client(plane.plane.address, plane.token) as client:
        session = client.create_session(workspace=project)
        events: list[str] = []
        rejected = client.execute_tool(session.id, "read", {"filePath": ".env"})
        assert rejected.error is not None
        assert "on_permission" in rejected.error
        outcome = client.execute_tool(session.id, "read", {"filePath": ".env"}, on_permission=allow_once,
                                      on_event=lambda e: events.append(e.WhichOneof("event") or ""))
        assert "API_KEY=hunter2" in outcome.output
        assert events[-1] == "result"
        assert "permission_request" in events
        listing = client.list_tools(session.id)
        assert "read" in [t.id for t in listing.tools]
        exec_events = [e.WhichOneof("event") for e in client.exec(session.id, ["echo", "hi"])]
        assert exec_events[-1] == "exited"
        assert client.run(session.id, ["echo", "x"]).stdout == b"x\n"
        client.delete_session(session.id)
