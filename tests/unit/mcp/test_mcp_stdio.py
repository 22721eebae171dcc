"""Local MCP servers started through a real sandbox agent's exec (in-process agent, real processes)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from controlplane.core.calls.tool import (
    Attachment,
    InitContext,
    PermissionAsk,
    SandboxCalls,
    ToolContext,
    ToolError,
    ToolInfo,
    ToolResult,
    ToolSource,
)
from controlplane.core.seam.provider import Sandbox
from controlplane.mcp import LocalServer, McpCallError, McpServers, ServerStatus, mcp_tool_infos, parse_mcp_config
from tests.unit.mcp.conftest import server_command


class NoSandboxCalls:
    """MCP tools never use the sandbox calls of their context: any use fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"an MCP tool used ctx.sandbox.{name}")


def make_context(asks: list[PermissionAsk], abort: asyncio.Event | None = None, deny: bool = False) -> ToolContext:
    async def ask(request: PermissionAsk) -> None:
        asks.append(request)
        if deny:
            raise ToolError("The user rejected permission to use this specific tool call.")

    async def metadata(title: str | None, meta: dict[str, Any] | None) -> None:
        return None

    return ToolContext(
        session_id="ses", message_id="msg", call_id="call", agent="build", ask=ask, metadata=metadata,
        sandbox=cast(SandboxCalls, NoSandboxCalls()), abort=abort or asyncio.Event(),
    )


@contextlib.contextmanager
def raises_message(kind: type[Exception], message: str) -> Iterator[None]:
    with pytest.raises(kind) as caught:
        yield
    assert str(caught.value) == message


def local(mode: str = "ok", **extra: Any) -> LocalServer:
    return LocalServer(type="local", command=server_command(mode), **extra)


async def run_tool(info: ToolInfo, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
    definition = await info.init(InitContext(agent="build"))
    return await definition.execute(args, ctx or make_context([]))


def by_id(servers: McpServers) -> dict[str, ToolInfo]:
    return {info.id: info for info in mcp_tool_infos(servers)}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def wait_for(predicate: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


@pytest.fixture(scope="module")
async def marker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-markers")


@pytest.fixture(scope="module")
async def servers(sandbox: Sandbox, marker_dir: Path) -> AsyncIterator[McpServers]:
    """One connected server ("my srv", so ids are sanitized) shared by the call tests."""
    env = {"GREETING": "hi there", "MARKER": str(marker_dir / "cancelled")}
    mcp = McpServers(sandbox.agent, {"my srv": local(environment=env)})
    assert await mcp.connect_all() == {"my srv": ServerStatus("connected")}
    yield mcp
    await mcp.close()


async def test_statuses_of_good_failing_and_disabled_servers(sandbox: Sandbox, tmp_path: Path) -> None:
    config = parse_mcp_config({"mcp": {
        "good": {"type": "local", "command": server_command("ok")},
        "crashes": {"type": "local", "command": server_command("crash")},
        "missing": {"type": "local", "command": ["/nonexistent/mcp-server", "--stdio"]},
        "hangs": {"type": "local", "command": server_command("hang"), "timeout": 1500,
                  "environment": {"PIDFILE": str(tmp_path / "hang.pid")}},
        "nolist": {"type": "local", "command": server_command("nolist")},
        "noisy": {"type": "local", "command": server_command("noisy")},
        "off": {"type": "local", "command": server_command("ok"), "enabled": False},
    }})
    mcp = McpServers.from_config(sandbox.agent, config)
    try:
        statuses = await mcp.connect_all()
        assert statuses == {
            "good": ServerStatus("connected"),
            "crashes": ServerStatus("failed", "MCP error -32000: Connection closed"),
            "missing": ServerStatus("failed", "cannot run '/nonexistent/mcp-server': no such file or directory"),
            "hangs": ServerStatus("failed", "Operation timed out after 1500ms"),
            "nolist": ServerStatus("failed", "Failed to get tools"),
            "noisy": ServerStatus("connected"),
            "off": ServerStatus("disabled"),
        }
        assert {server for server, _ in mcp.tools()} == {"good", "noisy"}
        # The server that timed out was stopped, not left running in the sandbox.
        hang_pid = int((tmp_path / "hang.pid").read_text())
        assert await wait_for(lambda: not pid_alive(hang_pid))
    finally:
        await mcp.close()


async def test_tool_infos(servers: McpServers) -> None:
    infos = mcp_tool_infos(servers)
    assert [i.id for i in infos] == [
        "my_srv_echo", "my_srv_mixed", "my_srv_fails", "my_srv_env", "my_srv_slow", "my_srv_progress",
        "my_srv_die", "my_srv_weird_name_tool", "my_srv_nested",
    ]
    assert {(i.source, i.origin) for i in infos} == {(ToolSource.MCP, "my srv")}
    echo = await infos[0].init(InitContext(agent="build"))
    assert echo.description == "Echoes text"
    assert echo.parameters is None
    assert echo.schema() == {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
        "additionalProperties": False,
    }
    env = await infos[3].init(InitContext())
    assert env.description == ""
    assert env.schema() == {"type": "object", "properties": {}, "additionalProperties": False}
    nested = await infos[8].init(InitContext())
    assert nested.schema() == {
        "type": "object",
        "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}}}},
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
        "required": ["items"],
        "additionalProperties": False,
    }


async def test_execute_asks_permission_then_calls(servers: McpServers) -> None:
    asks: list[PermissionAsk] = []
    result = await run_tool(by_id(servers)["my_srv_echo"], {"text": "hello"}, make_context(asks))
    assert result == ToolResult(title="", output="hello", metadata={}, attachments=[])
    assert asks == [PermissionAsk(permission="my_srv_echo", patterns=["*"], always=["*"], metadata={})]


async def test_sanitized_tool_calls_the_original_name(servers: McpServers) -> None:
    result = await run_tool(by_id(servers)["my_srv_weird_name_tool"], {})
    assert result.output == "called weird.name tool"


async def test_rejected_permission_calls_nothing(servers: McpServers) -> None:
    asks: list[PermissionAsk] = []
    with raises_message(ToolError, "The user rejected permission to use this specific tool call."):
        await run_tool(by_id(servers)["my_srv_die"], {}, make_context(asks, deny=True))
    assert len(asks) == 1
    # `die` would have ended the server: it still answers.
    assert (await run_tool(by_id(servers)["my_srv_echo"], {"text": "still here"})).output == "still here"
    assert servers.statuses() == {"my srv": ServerStatus("connected")}


async def test_content_mapping_over_the_wire(servers: McpServers) -> None:
    result = await run_tool(by_id(servers)["my_srv_mixed"], {})
    assert result.output == "first\n\n\n\nsecond\n\nresource text"
    assert result.attachments == [
        Attachment(mime="image/png", url="data:image/png;base64,iVBORw0KGgo="),
        Attachment(mime="application/octet-stream", url="data:application/octet-stream;base64,AAEC",
                   filename="file:///data.bin"),
        Attachment(mime="image/gif", url="data:image/gif;base64,R0lGODlh", filename="file:///pic.gif"),
    ]
    assert result.title == ""
    assert result.metadata == {}


async def test_is_error_result_is_output(servers: McpServers) -> None:
    assert await run_tool(by_id(servers)["my_srv_fails"], {}) == ToolResult(title="", output="it broke")


async def test_server_runs_in_the_workspace_with_its_environment(servers: McpServers, sandbox: Sandbox) -> None:
    workspace = (await sandbox.agent.health()).workspace
    assert (await run_tool(by_id(servers)["my_srv_env"], {})).output == f"hi there|{workspace}"


async def test_abort_cancels_a_slow_call(servers: McpServers, marker_dir: Path) -> None:
    marker = marker_dir / "cancelled"
    marker.unlink(missing_ok=True)
    abort = asyncio.Event()
    started = time.monotonic()
    call = asyncio.ensure_future(run_tool(by_id(servers)["my_srv_slow"], {"seconds": 30}, make_context([], abort)))
    await asyncio.sleep(0.3)
    assert not call.done()
    abort.set()
    with raises_message(McpCallError, "Tool execution aborted"):
        await asyncio.wait_for(call, 2)
    assert time.monotonic() - started < 2
    # The server was told (notifications/cancelled) and stopped its handler.
    assert await wait_for(marker.exists)
    assert marker.read_text() == "cancelled"
    assert (await run_tool(by_id(servers)["my_srv_echo"], {"text": "after abort"})).output == "after abort"


async def test_an_already_set_abort_does_not_call(servers: McpServers) -> None:
    abort = asyncio.Event()
    abort.set()
    with raises_message(McpCallError, "Tool execution aborted"):
        await servers.call("my srv", "slow", {"seconds": 30}, abort)


async def test_call_timeout(servers: McpServers, marker_dir: Path) -> None:
    marker = marker_dir / "cancelled"
    marker.unlink(missing_ok=True)
    started = time.monotonic()
    with raises_message(McpCallError, "MCP error -32001: Request timed out"):
        await servers.call("my srv", "slow", {"seconds": 30}, asyncio.Event(), timeout_s=0.5)
    assert 0.5 <= time.monotonic() - started < 2
    assert await wait_for(marker.exists)


async def test_progress_restarts_the_timeout(servers: McpServers) -> None:
    started = time.monotonic()
    result = await servers.call("my srv", "progress", {"steps": 6, "gap": 0.25}, asyncio.Event(), timeout_s=0.8)
    assert time.monotonic() - started > 1.4  # well past the 0.8 s limit, kept alive by progress
    assert [c.text for c in result.content if c.type == "text"] == ["done after 6 steps"]


async def test_unknown_server_is_not_connected(servers: McpServers) -> None:
    with raises_message(McpCallError, "MCP server nope is not connected"):
        await servers.call("nope", "echo", {}, asyncio.Event())


async def test_experimental_mcp_timeout_applies_to_servers_without_their_own(sandbox: Sandbox) -> None:
    config = parse_mcp_config({"mcp": {"s": {"type": "local", "command": server_command()}},
                               "experimental": {"mcp_timeout": 600}})
    mcp = McpServers.from_config(sandbox.agent, config)
    try:
        await mcp.connect_all()
        assert mcp.call_timeout_s("s") == 0.6
        started = time.monotonic()
        with raises_message(McpCallError, "MCP error -32001: Request timed out"):
            await run_tool(by_id(mcp)["s_slow"], {"seconds": 30})
        assert 0.6 <= time.monotonic() - started < 2
    finally:
        await mcp.close()


async def test_a_server_that_dies_mid_session_is_failed(sandbox: Sandbox) -> None:
    mcp = McpServers(sandbox.agent, {"d": local(), "other": local()})
    try:
        await mcp.connect_all()
        with raises_message(McpCallError, "MCP error -32000: Connection closed"):
            await run_tool(by_id(mcp)["d_die"], {})
        assert await wait_for(lambda: mcp.statuses()["d"].status == "failed")
        assert mcp.statuses() == {"d": ServerStatus("failed", "MCP server exited (exit code 7)"),
                                  "other": ServerStatus("connected")}
        assert {server for server, _ in mcp.tools()} == {"other"}
        with raises_message(McpCallError, "MCP server d is not connected"):
            await mcp.call("d", "echo", {"text": "x"}, asyncio.Event())
        assert (await run_tool(by_id(mcp)["other_echo"], {"text": "ok"})).output == "ok"
    finally:
        await mcp.close()


async def test_add_mid_session_and_replace(sandbox: Sandbox, tmp_path: Path) -> None:
    mcp = McpServers(sandbox.agent, {})
    try:
        assert await mcp.connect_all() == {}
        assert mcp_tool_infos(mcp) == []
        first = local(environment={"PIDFILE": str(tmp_path / "first.pid"), "GREETING": "one"})
        assert await mcp.add("late", first) == ServerStatus("connected")
        assert (await run_tool(by_id(mcp)["late_env"], {})).output.startswith("one|")
        first_pid = int((tmp_path / "first.pid").read_text())

        second = local(environment={"GREETING": "two"})
        assert await mcp.add("late", second) == ServerStatus("connected")
        assert (await run_tool(by_id(mcp)["late_env"], {})).output.startswith("two|")
        assert await wait_for(lambda: not pid_alive(first_pid))  # the replaced server was ended

        assert await mcp.add("broken", local("crash")) == ServerStatus("failed", "MCP error -32000: Connection closed")
        assert await mcp.add("paged", local("paged")) == ServerStatus("connected")
        assert [t.name for s, t in mcp.tools() if s == "paged"] == [
            "echo", "mixed", "fails", "env", "slow", "progress", "die", "weird.name tool", "nested",
        ]
        assert list(mcp.statuses()) == ["late", "broken", "paged"]
    finally:
        await mcp.close()


async def test_close_ends_the_server_processes(sandbox: Sandbox, tmp_path: Path) -> None:
    mcp = McpServers(sandbox.agent, {
        "a": local(environment={"PIDFILE": str(tmp_path / "a.pid")}),
        "b": local(environment={"PIDFILE": str(tmp_path / "b.pid")}),
    })
    await mcp.connect_all()
    pids = [int((tmp_path / f"{n}.pid").read_text()) for n in "ab"]
    assert all(pid_alive(p) for p in pids)
    in_flight = asyncio.ensure_future(mcp.call("a", "slow", {"seconds": 30}, asyncio.Event()))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await mcp.close()
    assert time.monotonic() - started < 3
    assert await wait_for(lambda: not any(pid_alive(p) for p in pids))
    with pytest.raises(McpCallError):
        await asyncio.wait_for(in_flight, 2)
    assert mcp_tool_infos(mcp) == []


async def test_local_server_without_a_sandbox_fails() -> None:
    mcp = McpServers(None, {"x": local()})
    assert await mcp.connect_all() == {
        "x": ServerStatus("failed", "this session has no sandbox to run local MCP servers in"),
    }
