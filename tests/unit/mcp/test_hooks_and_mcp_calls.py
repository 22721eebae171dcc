"""Plugin hooks around calls and MCP tool calls (reference §7 hooks, §8 config, §9 MCP), checked against
upstream v1.2.27.

A test marked xfail(strict) records a known difference from upstream (named in its reason); it starts
passing, and then fails as XPASS, once the difference is fixed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from controlplane.core.calls.hooks import HookBus, HookError
from controlplane.v1 import tool_pb2
from sandbox_agent.custom.host import HostCallError, HostFile, ToolHost
from tests.planes import Plane, served_plane
from tests.plugin_fixtures import hook_recorder
from tests.unit.custom.conftest import Sandbox, bun_host, sandbox  # noqa: F401 (fixtures)

SERVER = str(Path(__file__).with_name("stdio_server.py"))
PLUGIN = "tests.plugin_fixtures.hook_recorder"


# -- §7: a throwing hook fails the call with the hook's own message ---------------------------------


async def test_a_throwing_before_hook_fails_the_call_with_its_own_message() -> None:
    bus = HookBus()

    async def guard(input_: dict[str, Any], output: dict[str, Any]) -> None:
        raise RuntimeError("Do not read .env files")

    bus.add("tool.execute.before", guard, origin="env-protection")
    with pytest.raises(HookError) as caught:
        await bus.trigger("tool.execute.before", {"tool": "read"}, {"args": {"filePath": ".env"}})
    assert str(caught.value) == "Do not read .env files"


async def test_a_hook_error_without_a_message_is_named_by_its_type_and_a_timeout_is_described() -> None:
    bus = HookBus(timeout_s=0.05)

    async def silent(input_: dict[str, Any], output: dict[str, Any]) -> None:
        raise PermissionError()

    async def stuck(input_: dict[str, Any], output: dict[str, Any]) -> None:
        await asyncio.sleep(5)

    bus.add("tool.execute.before", silent, origin="quiet")
    with pytest.raises(HookError) as caught:
        await bus.trigger("tool.execute.before", {}, {"args": {}})
    assert str(caught.value) == "PermissionError"
    slow = HookBus(timeout_s=0.05)
    slow.add("tool.execute.before", stuck, origin="slowpoke")
    with pytest.raises(HookError) as caught:
        await slow.trigger("tool.execute.before", {}, {"args": {}})
    assert str(caught.value) == "Plugin hook tool.execute.before timed out after 0.05 s (slowpoke)"


async def test_hooks_run_in_load_order_on_one_output_and_a_failure_stops_the_rest() -> None:
    bus = HookBus()
    order: list[str] = []

    def hook(name: str, fail: bool = False) -> Any:
        async def run(input_: dict[str, Any], output: dict[str, Any]) -> None:
            order.append(name)
            output["args"]["seen"] = [*output["args"].get("seen", []), name]
            if fail:
                raise ValueError(f"{name} says no")
        return run

    for name, fail in (("first", False), ("second", True), ("third", False)):
        bus.add("tool.execute.before", hook(name, fail), origin=name)
    output: dict[str, Any] = {"args": {}}
    with pytest.raises(HookError, match=r"^second says no$"):
        await bus.trigger("tool.execute.before", {}, output)
    assert order == ["first", "second"]
    assert output == {"args": {"seen": ["first", "second"]}}  # mutated in place, as upstream's same object


PROJECT_PLUGIN = """
    export const EnvProtection = async () => ({
      "tool.execute.before": async (input, output) => {
        if (input.tool === "read" && String(output.args.filePath).includes(".env")) {
          throw new Error("Do not read .env files")
        }
        if (input.tool === "read" && output.args.filePath === "odd") throw "a thrown string"
        output.args.checked = true
      },
    })
"""


async def test_a_project_plugins_throwing_before_hook_reports_its_own_message(
    sandbox: Sandbox, bun_host: ToolHost,  # noqa: F811 (fixtures)
) -> None:
    plugin = sandbox.write(".opencode/plugin/env-protection.ts", PROJECT_PLUGIN)
    await bun_host.load([HostFile(plugin, "plugin")], str(sandbox.project), str(sandbox.project))
    hook_in = {"tool": "read", "sessionID": "s", "callID": "c"}
    with pytest.raises(HostCallError) as caught:
        await bun_host.hook("tool.execute.before", hook_in, {"args": {"filePath": "/w/.env"}}, timeout_s=10)
    assert str(caught.value) == "Do not read .env files"
    with pytest.raises(HostCallError) as caught:
        await bun_host.hook("tool.execute.before", hook_in, {"args": {"filePath": "odd"}}, timeout_s=10)
    assert str(caught.value) == "a thrown string"
    passed = await bun_host.hook("tool.execute.before", hook_in, {"args": {"filePath": "a.txt"}}, timeout_s=10)
    assert passed == {"args": {"filePath": "a.txt", "checked": True}}


# -- §9 and §3: MCP tools through the public API ---------------------------------------------------


plane = served_plane("local", plugins={"modules": [PLUGIN]})


def mcp_config(permission: dict[str, Any] | None = None) -> str:
    servers = {"notes": {"type": "local", "command": [sys.executable, SERVER, "ok"]}}
    return json.dumps({"mcp": servers, **({"permission": permission} if permission else {})})


async def listed(plane: Plane, permission: dict[str, Any] | None) -> list[str]:
    session = await plane.client.create_session(config_json=mcp_config(permission))
    ids = [t.id for t in (await plane.client.list_tools(session.id)).tools]
    await plane.client.delete_session(session.id)
    return [i for i in ids if i.startswith("notes_")]


async def test_the_permission_of_an_mcp_tool_is_its_key(plane: Plane) -> None:
    everything = await listed(plane, None)
    assert "notes_echo" in everything
    assert "notes_weird_name_tool" in everything
    assert await listed(plane, {"notes_*": "deny"}) == []
    assert await listed(plane, {"notes": "deny"}) == everything  # a bare server name matches nothing
    assert await listed(plane, {"notes_echo": "deny"}) == [i for i in everything if i != "notes_echo"]


async def test_mcp_call_runs_the_before_hook_then_asks_and_reports_upstreams_metadata(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=mcp_config({"notes_echo": "ask"}))
    asked: list[tool_pb2.PermissionRequest] = []

    async def once(request: tool_pb2.PermissionRequest) -> tuple[int, str]:
        asked.append(request)
        return tool_pb2.PermissionReply.ONCE, ""

    hook_recorder.SEEN.clear()
    refused = await plane.client.execute_tool(session.id, "notes_echo", {"text": "refuse me"}, call_id="call_r",
                                              on_permission=once)
    assert refused.error == hook_recorder.REFUSAL
    assert asked == []  # the before-hook comes first; its failure means no ask
    before = ("tool.execute.before", {"tool": "notes_echo", "sessionID": session.id, "callID": "call_r"})
    assert before in hook_recorder.SEEN
    out = await plane.client.execute_tool(session.id, "notes_echo", {"text": "hi"}, call_id="call_ok",
                                          on_permission=once)
    assert out.output == "hi"
    assert [(a.permission, list(a.patterns), list(a.always)) for a in asked] == [("notes_echo", ["*"], ["*"])]
    assert json.loads(asked[0].metadata_json or "{}") == {}
    assert out.result is not None
    assert out.result.title == ""
    assert json.loads(out.result.metadata_json) == {"truncated": False}
    await plane.client.delete_session(session.id)


async def test_the_tool_definition_hook_does_not_touch_mcp_tools(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=mcp_config())
    hook_recorder.SEEN.clear()
    tools = {t.id: t for t in (await plane.client.list_tools(session.id)).tools}
    assert tools["glob"].description.endswith(" [seen by tool.definition]")
    assert tools["notes_echo"].description == "Echoes text"
    assert not [i for name, i in hook_recorder.SEEN if name == "tool.definition" and i["toolID"].startswith("notes_")]
    await plane.client.delete_session(session.id)


@pytest.mark.xfail(strict=True, reason="the executor triggers shell.env before bash runs (and asks); upstream's "
                                       "bash triggers it after its permission asks, right before spawning")
async def test_shell_env_is_not_triggered_for_a_bash_call_whose_ask_is_rejected(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=json.dumps({"permission": {"bash": "ask"}}))

    async def reject(request: tool_pb2.PermissionRequest) -> tuple[int, str]:
        return tool_pb2.PermissionReply.REJECT, ""

    hook_recorder.SEEN.clear()
    args = {"command": "echo $W3_FROM_HOOK", "description": "hook env"}
    out = await plane.client.execute_tool(session.id, "bash", args, call_id="call_rej", on_permission=reject)
    assert out.error is not None
    assert [i for name, i in hook_recorder.SEEN if name == "shell.env"] == []
    await plane.client.delete_session(session.id)


async def test_shell_env_reaches_bash_with_upstreams_input_shape(plane: Plane) -> None:
    session = await plane.client.create_session()
    hook_recorder.SEEN.clear()
    args = {"command": "echo $W3_FROM_HOOK", "description": "hook env"}
    out = await plane.client.execute_tool(session.id, "bash", args, call_id="call_env")
    assert out.output == "yes\n"
    [seen] = [i for name, i in hook_recorder.SEEN if name == "shell.env"]
    assert sorted(seen) == ["callID", "cwd", "sessionID"]
    assert (seen["sessionID"], seen["callID"]) == (session.id, "call_env")
    await plane.client.delete_session(session.id)
