"""AgentToolCalls: a built-in call carried to the sandbox agent with the call's rules (real in-process agent).

What the bridge learns of the call comes through `ToolContext.rules`: the rules the agent may settle asks by
(those it allowed are audited as the gate audits a rule-allowed ask), only filter paths by (a
`permission.ask` hook wants every ask), or none at all (every ask goes up to `ctx.ask`).
"""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.core.calls.hooks import HookBus
from controlplane.core.calls.tool import PermissionAsk, ToolContext
from controlplane.core.calls.tool_events import PermissionRequested
from controlplane.core.permissions.asks import AskScope, CallAsks, PermissionGate
from controlplane.core.permissions.audit import AuditEntry
from controlplane.core.permissions.permission import DeniedError, Rule
from controlplane.sandbox.tool_bridge import AgentToolCalls
from tests.rpc.test_agent_tool_stream import Agent, agent

__all__ = ["agent"]  # the fixture, shared with the RunTools tests


class Recorded:
    def __init__(self) -> None:
        self.entries: list[AuditEntry] = []

    async def record(self, entry: AuditEntry) -> None:
        self.entries.append(entry)


def call_context(bridge: AgentToolCalls, asks: CallAsks, *, with_rules: bool) -> tuple[ToolContext, list[str]]:
    """The context the executor gives a call, and the permissions its `ask` was reached for."""
    reached: list[str] = []

    async def ask(request: PermissionAsk) -> None:
        reached.append(request.permission)
        await asks(request)

    async def metadata(title: str | None, meta: dict[str, Any] | None) -> None:
        del title, meta

    ctx = ToolContext(session_id="s", message_id="m", call_id="c", agent="build", ask=ask, metadata=metadata,
                      sandbox=bridge, rules=asks if with_rules else None)
    return ctx, reached


def gate_asks(rules: list[Rule], hooks: HookBus | None = None) -> tuple[CallAsks, Recorded]:
    audit = Recorded()
    gate = PermissionGate(audit=audit, hooks=hooks)
    scope = AskScope(tenant="t", session_id="s", call_id="c", message_id="m", tool="bash", ruleset=rules)

    def announce(event: PermissionRequested) -> None:
        del event

    return CallAsks(gate, scope, announce), audit


ALLOW_ECHO = [Rule("*", "*", "allow"), Rule("bash", "rm *", "deny")]


async def test_the_agent_settles_what_the_rules_allow_and_the_bridge_audits_it(agent: Agent) -> None:
    client, _, _ = agent
    bridge = AgentToolCalls(client)
    asks, audit = gate_asks(ALLOW_ECHO)
    ctx, reached = call_context(bridge, asks, with_rules=True)
    result = await bridge.run_builtin("bash", {"command": "echo yes", "description": "d"}, ctx)
    assert result.output == "yes\n"
    assert reached == []  # settled in the sandbox: no round trip
    assert [(e.kind, e.outcome, e.permission, e.patterns) for e in audit.entries] == [
        ("permission", "allow", "bash", ("echo yes",))]
    assert audit.entries[0].rule == "agent: * * allow"


async def test_without_rules_every_ask_goes_up(agent: Agent) -> None:
    client, _, _ = agent
    bridge = AgentToolCalls(client)
    asks, audit = gate_asks(ALLOW_ECHO)
    ctx, reached = call_context(bridge, asks, with_rules=False)
    result = await bridge.run_builtin("bash", {"command": "echo up", "description": "d"}, ctx)
    assert result.output == "up\n"
    assert reached == ["bash"]
    assert [(e.outcome, e.patterns) for e in audit.entries] == [("allow", ("echo up",))]


async def test_an_ask_hook_sends_every_ask_up_and_a_refusal_keeps_its_type(agent: Agent) -> None:
    client, _, _ = agent
    hooks = HookBus()

    async def hook(input_: dict[str, Any], output: dict[str, Any]) -> dict[str, Any] | None:
        del input_, output  # leaves every decision to the rules
        return None

    hooks.add("permission.ask", hook)
    bridge = AgentToolCalls(client)
    asks, _ = gate_asks(ALLOW_ECHO, hooks)
    ctx, reached = call_context(bridge, asks, with_rules=True)
    result = await bridge.run_builtin("bash", {"command": "echo hooked", "description": "d"}, ctx)
    assert result.output == "hooked\n"
    assert reached == ["bash"]  # the rules only filter paths in the agent now: the ask came up
    with pytest.raises(DeniedError):  # the gate's denial keeps its type through the agent's RunFailed
        await bridge.run_builtin("bash", {"command": "rm -f nothing", "description": "d"}, ctx)
    assert reached == ["bash", "bash"]
