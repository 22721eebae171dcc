"""Asks the rules allow are settled in the sandbox agent, with the same audit and trace records as before.

No `permission.ask` plugin here (with one, every ask goes to the control plane: test_permission_api.py).
The sandboxes are in-process agents (the local provider), so the agent's own decision path runs for real.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from controlplane.client import allow_once
from controlplane.core.calls.tool import PermissionAsk
from controlplane.core.permissions.asks import PermissionGate
from controlplane.core.permissions.audit import AuditEntry
from controlplane.v1 import tool_pb2
from tests.planes import Plane, served_plane

POLICY = {"permission": {"bash": {"curl *": "deny"}}}
CONFIG = json.dumps({"permission": {
    "bash": {"*": "allow", "git *": "ask", "cat *": "ask"},
    "external_directory": {"/etc/*": "allow"},
}})


plane = served_plane("local", policy=POLICY)


@pytest.fixture
def gate_asks(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[str, ...]]]:
    """Every ask that reached the control plane's gate (it still decides them: this only records)."""
    seen: list[tuple[str, tuple[str, ...]]] = []
    original = PermissionGate.ask

    async def recording(self: PermissionGate, ask: PermissionAsk, *args: Any) -> None:
        seen.append((ask.permission, tuple(ask.patterns)))
        await original(self, ask, *args)

    monkeypatch.setattr(PermissionGate, "ask", recording)
    return seen


def bash(command: str) -> dict[str, str]:
    return {"command": command, "description": "Runs a command"}


async def permission_entries(plane: Plane, session_id: str) -> list[AuditEntry]:
    await plane.plane.audit.flush()
    return [e for e in await plane.plane.store.audit_entries("default", session_id) if e.kind == "permission"]


async def test_an_allowed_ask_never_leaves_the_sandbox_and_is_audited_as_before(
    plane: Plane, gate_asks: list[tuple[str, tuple[str, ...]]],
) -> None:
    session = await plane.client.create_session()
    outcome = await plane.client.execute_tool(session.id, "bash", bash("echo local"), message_id="m1")
    assert outcome.output == "local\n"
    assert not outcome.permission_requests
    assert gate_asks == []
    entries = await permission_entries(plane, session.id)
    assert [(e.tool, e.call_id, e.outcome, e.permission, e.patterns, e.rule) for e in entries] == [
        ("bash", outcome.call_id, "allow", "bash", ("echo local",), "agent: * * allow"),
    ]


async def test_order_is_kept_when_a_local_allow_precedes_an_ask_that_goes_up(
    plane: Plane, gate_asks: list[tuple[str, tuple[str, ...]]],
) -> None:
    session = await plane.client.create_session(config_json=CONFIG)
    outcome = await plane.client.execute_tool(session.id, "bash", bash("cat /etc/hostname"), message_id="m1",
                                              on_permission=allow_once)
    assert outcome.error is None
    assert [r.permission for r in outcome.permission_requests] == ["bash"]
    assert gate_asks == [("bash", ("cat /etc/hostname",))]  # external_directory was allowed in the sandbox
    entries = await permission_entries(plane, session.id)
    assert [(e.outcome, e.permission, e.patterns, e.rule) for e in entries] == [
        ("allow", "external_directory", ("/etc/*",), "agent: external_directory /etc/* allow"),
        ("once", "bash", ("cat /etc/hostname",), "client"),
    ]


async def test_a_partly_allowed_ask_and_denials_are_decided_by_the_control_plane(
    plane: Plane, gate_asks: list[tuple[str, tuple[str, ...]]],
) -> None:
    session = await plane.client.create_session(config_json=CONFIG)

    async def reject(_: tool_pb2.PermissionRequest) -> tuple[int, str]:
        return tool_pb2.PermissionReply.REJECT, ""

    mixed = await plane.client.execute_tool(session.id, "bash", bash("echo a && git status"), on_permission=reject,
                                            message_id="m1")
    assert mixed.error == "The user rejected permission to use this specific tool call."
    denied = await plane.client.execute_tool(session.id, "bash", bash("curl x"), message_id="m2")
    assert denied.error is not None
    assert denied.error.startswith(
        "The user has specified a rule which prevents you from using this specific tool call."
    )
    assert '{"permission":"bash","pattern":"curl *","action":"deny"}' in denied.error
    assert gate_asks == [("bash", ("echo a", "git status")), ("bash", ("curl x",))]
    entries = await permission_entries(plane, session.id)
    assert [(e.outcome, e.patterns, e.rule) for e in entries] == [
        ("reject", ("echo a", "git status"), "client"),
        ("deny", ("curl x",), "operator: bash curl * deny"),
    ]


async def test_an_always_approval_lets_later_calls_through_in_the_sandbox(
    plane: Plane, gate_asks: list[tuple[str, tuple[str, ...]]],
) -> None:
    session = await plane.client.create_session(config_json=CONFIG)

    async def always(_: tool_pb2.PermissionRequest) -> tuple[int, str]:
        return tool_pb2.PermissionReply.ALWAYS, ""

    first = await plane.client.execute_tool(session.id, "bash", bash("git --version"), on_permission=always,
                                            message_id="m1")
    second = await plane.client.execute_tool(session.id, "bash", bash("git --version"), message_id="m2")
    assert first.output.startswith("git version")
    assert second.output == first.output
    assert [r.always for r in first.permission_requests] == [["git --version *"]]
    assert not second.permission_requests
    assert gate_asks == [("bash", ("git --version",))]
    entries = await permission_entries(plane, session.id)
    assert [(e.call_id, e.outcome, e.rule) for e in entries] == [
        (first.call_id, "always", "client"),
        (second.call_id, "allow", "approved: bash git --version * allow"),
    ]
