"""Project config migration, operator layering, hooks' limits, the bus and doom-loop detection."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from controlplane.core.calls.doom_loop import DoomLoopDetector
from controlplane.core.calls.hooks import HookBus, HookError
from controlplane.core.calls.tool import PermissionAsk
from controlplane.core.calls.tool_events import PermissionRequested
from controlplane.core.config import project_config
from controlplane.core.permissions import permission
from controlplane.core.permissions.asks import AskScope, PermissionGate, Reply
from controlplane.core.permissions.permission import Rule
from controlplane.core.permissions.policy import OperatorPolicy
from controlplane.core.sessions.events import EventBus
from controlplane.errors import ConfigError


def test_legacy_tools_become_rules_and_explicit_permission_wins() -> None:
    config = {"tools": {"write": False, "bash": True, "multiedit": False}, "permission": {"bash": {"rm *": "deny"}}}
    assert project_config.user_permission(config) == {"edit": "deny", "bash": {"rm *": "deny"}}
    bare = project_config.user_permission({"tools": {"grep": False}, "permission": "ask"})
    assert list(bare.items()) == [("grep", "deny"), ("*", "ask")]  # so "*" decides grep too: last match wins
    assert project_config.user_permission({}) == {}
    with pytest.raises(ConfigError, match=r"tools\.bash must be true or false"):
        project_config.user_permission({"tools": {"bash": "no"}})


def test_opencode_permission_env_is_deep_merged_last() -> None:
    config = {"permission": {"bash": {"*": "ask", "ls *": "allow"}, "read": "allow"}}
    merged = project_config.user_permission(config, json.dumps({"bash": {"ls *": "deny"}, "webfetch": "deny"}))
    assert merged == {"bash": {"*": "ask", "ls *": "deny"}, "read": "allow", "webfetch": "deny"}
    assert list(merged["bash"]) == ["*", "ls *"]  # key order kept: last match still means the same
    with pytest.raises(ConfigError, match="OPENCODE_PERMISSION is not valid JSON"):
        project_config.user_permission({}, "{nope")


def test_agent_legacy_tools() -> None:
    agents = project_config.agent_configs({"agent": {"review": {"tools": {"edit": False}, "mode": "subagent"}}})
    assert agents == {"review": {"tools": {"edit": False}, "mode": "subagent", "permission": {"edit": "deny"}}}


def test_operator_policy_per_tenant_with_home_expansion() -> None:
    policy = OperatorPolicy({"read": {"~/secrets/*": "deny"}}, {"acme": {"bash": "deny"}})
    assert policy.rules("acme", home="/h") == [Rule("read", "/h/secrets/*", "deny"), Rule("bash", "*", "deny")]
    assert policy.rules("other", home="/h") == [Rule("read", "/h/secrets/*", "deny")]
    with pytest.raises(ConfigError):
        OperatorPolicy({"bash": "maybe"}).validate()


def test_disabled_layered_keeps_agent_denials_unless_the_operator_allows() -> None:
    agent = [Rule("*", "*", "allow"), Rule("bash", "*", "deny")]
    assert permission.disabled_layered(["bash", "read"], agent, [Rule("bash", "curl *", "deny")]) == {"bash"}
    assert permission.disabled_layered(["bash"], agent, [Rule("bash", "*", "allow")]) == set()
    assert permission.disabled_layered(["write", "read"], [Rule("*", "*", "allow")], [Rule("edit", "*", "deny")]) == {
        "write"
    }


async def test_operator_rules_beat_approvals_which_beat_agent_rules() -> None:
    gate = PermissionGate()
    agent = [Rule("bash", "*", "deny")]
    scope = AskScope("t", "s1", "c1", "m1", "bash", agent, [Rule("bash", "rm *", "deny")])
    announced: list[PermissionRequested] = []
    with pytest.raises(permission.DeniedError):
        await gate.ask(PermissionAsk("bash", ["ls"], ["ls *"], {}), scope, announced.append)
    state = await gate.approved("t", "s1")
    assert state == []
    gate_scope = AskScope("t", "s1", "c1", "m1", "bash", [Rule("bash", "*", "ask")], [Rule("bash", "rm *", "deny")])
    waiting = asyncio.ensure_future(gate.ask(PermissionAsk("bash", ["rm -rf x"], ["rm *"], {}), gate_scope,
                                             announced.append))
    with pytest.raises(permission.DeniedError):
        await waiting
    waiting = asyncio.ensure_future(gate.ask(PermissionAsk("bash", ["ls"], ["ls *"], {}), gate_scope, announced.append))
    await asyncio.sleep(0)
    await gate.reply(announced[-1].id, Reply.ALWAYS)
    await waiting
    await gate.ask(PermissionAsk("bash", ["ls -la"], ["ls *"], {}), gate_scope, announced.append)  # approved now
    assert len(announced) == 1


async def test_hooks_time_limits_and_tolerance() -> None:
    bus = HookBus(timeout_s=0.05)

    async def slow(_: dict[str, Any], __: dict[str, Any]) -> None:
        await asyncio.sleep(1)

    async def replace(_: dict[str, Any], output: dict[str, Any]) -> dict[str, Any]:
        return {"args": {**output["args"], "x": 2}}

    bus.add("tool.execute.before", replace, origin="first")
    assert await bus.trigger("tool.execute.before", {}, {"args": {"x": 1}}) == {"args": {"x": 2}}
    bus.add("tool.execute.before", slow, origin="slowpoke")
    with pytest.raises(HookError, match=r"^Plugin hook tool.execute.before timed out after 0.05 s \(slowpoke\)$"):
        await bus.trigger("tool.execute.before", {}, {"args": {}})
    bus.add("tool.execute.after", slow, origin="slowpoke")
    assert await bus.trigger("tool.execute.after", {}, {"output": "kept"}, tolerant=True) == {"output": "kept"}


async def test_bus_filters_by_tenant_and_session_and_feeds_listeners() -> None:
    bus = EventBus()
    heard: list[str] = []

    async def listener(event: Any) -> None:
        heard.append(event.type)

    bus.listen(listener)
    mine = bus.subscribe("a", "s1")
    reader = asyncio.ensure_future(anext(mine))
    await asyncio.sleep(0)
    bus.publish("tool.state", "b", "s1", status="running")
    bus.publish("tool.state", "a", "s2", status="running")
    bus.publish("tool.state", "a", "s1", status="completed")
    event = await asyncio.wait_for(reader, 1)
    assert (event.tenant, event.session_id, event.properties) == ("a", "s1", {"status": "completed"})
    await asyncio.sleep(0)
    assert heard == ["tool.state"] * 3
    await mine.aclose()
    assert bus.subscribers == 0


def test_doom_loop_needs_three_identical_consecutive_calls() -> None:
    doom = DoomLoopDetector()
    assert not doom.observe("s", "m", "read", {"filePath": "/a"})
    assert not doom.observe("s", "m", "read", {"filePath": "/a"})
    assert doom.observe("s", "m", "read", {"filePath": "/a"})
    assert doom.observe("s", "m", "read", {"filePath": "/a"})
    assert not doom.observe("s", "m", "read", {"filePath": "/b"})
    assert not doom.observe("s", "m2", "read", {"filePath": "/a"})
    assert not doom.observe("s", "m", "read", {"filePath": "/a"})
    doom.forget_session("s")
    assert not doom.observe("s", "m", "read", {"filePath": "/a"})
