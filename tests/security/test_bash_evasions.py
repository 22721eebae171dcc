"""The evasion corpus through the real decision path, fast: the agent's scan of the command, then the
control plane's gate with the session's rules, the "always" approvals and the operator's policy; the agent's
own LocalRules (which settles allowed asks without a round trip) must agree with the gate on every case.

test_bash_evasions_docker.py shows, through the public API, that denied commands really do not run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from controlplane.core.calls.tool import PermissionAsk, ToolError
from controlplane.core.calls.tool_events import PermissionRequested
from controlplane.core.permissions import permission
from controlplane.core.permissions.asks import AskScope, PermissionGate, Reply, _snapshot
from controlplane.core.permissions.permission import Rule, Ruleset
from controlplane.core.permissions.policy import OperatorPolicy
from controlplane.sandbox.rule_encoding import encode_rules
from sandbox_agent.permission_rules import LocalRules
from sandbox_agent.tools.bash_scan import scan
from tests.security.bash_evasion_corpus import CORPUS, EVASIONS, OPERATOR, RULESETS, Case, Decision

HOME = "/home/tool"


def agent_rules(ruleset: str) -> Ruleset:
    config = RULESETS.get(ruleset, {"bash": "allow"})
    user = permission.from_config(config, home=HOME)
    return permission.builtin_agents(f"{HOME}/out", [], f"{HOME}/plans", user, home=HOME)["build"].permission


def operator_rules(ruleset: str) -> Ruleset:
    return OperatorPolicy(tenants={"t": OPERATOR[ruleset]}).rules("t", home=HOME) if ruleset in OPERATOR else []


def bash_ask(command: str, project: Path) -> PermissionAsk:
    found = scan(command, str(project), str(project), "/")
    return PermissionAsk("bash", found.patterns, found.always, {}, found.checks, bool(found.unknown))


async def decide(ask: PermissionAsk, scope: AskScope, gate: PermissionGate | None = None) -> Decision:
    """What the gate does with the ask: allows it, denies it, or asks someone (the request is then dropped)."""
    gate = gate or PermissionGate()
    asked = Asked()
    task = asyncio.ensure_future(gate.ask(ask, scope, asked))
    await asked.until(1, task)
    if asked.requests:
        gate.cancel_call(scope.session_id, scope.call_id, "done")
        with pytest.raises(ToolError):
            await task
        return "ask"
    try:
        await task
    except permission.DeniedError:
        return "deny"
    return "allow"


class Asked:
    """The requests a gate announced, awaitable."""

    def __init__(self) -> None:
        self.requests: list[PermissionRequested] = []
        self._changed = asyncio.Event()

    def __call__(self, request: PermissionRequested) -> None:
        self.requests.append(request)
        self._changed.set()

    async def until(self, count: int, *tasks: asyncio.Future[None]) -> None:
        """Returns once `count` requests were announced, or one of `tasks` ended first."""
        while len(self.requests) < count and not any(t.done() for t in tasks):
            self._changed.clear()
            changed: asyncio.Future[Any] = asyncio.ensure_future(self._changed.wait())
            await asyncio.wait([changed, *tasks], return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()


def local_allows(ask: PermissionAsk, ruleset: Ruleset, approved: Ruleset, policy: Ruleset) -> bool:
    rules = encode_rules(_snapshot(ruleset, approved, policy)).rules
    return LocalRules(rules).allows(ask.permission, ask.patterns, ask.checks, ask.opaque)


def test_the_corpus_is_large_and_covers_every_decision() -> None:
    assert len(EVASIONS) >= 100
    assert {case.expected for case in CORPUS} == {"allow", "ask", "deny"}
    assert len({(case.command, case.ruleset) for case in CORPUS}) == len(CORPUS), "duplicate cases"


@pytest.mark.parametrize("case", CORPUS, ids=[f"{c.ruleset}:{c.command}" for c in CORPUS])
async def test_each_case_gets_its_decision(case: Case, tmp_path: Path) -> None:
    ask = bash_ask(case.command, tmp_path)
    ruleset, policy = agent_rules(case.ruleset), operator_rules(case.ruleset)
    scope = AskScope("t", "ses_corpus", "call_1", "msg_1", "bash", ruleset, policy)
    assert await decide(ask, scope) == case.expected, (ask.patterns, ask.checks, ask.opaque)
    assert local_allows(ask, ruleset, [], policy) == (case.expected == "allow")


async def test_the_issue_examples_all_fail_with_upstreams_denied_message(tmp_path: Path) -> None:
    ruleset = agent_rules("rm-deny")
    scope = AskScope("t", "ses_corpus", "call_1", "msg_1", "bash", ruleset)
    for command in ("/bin/rm f", "\\rm f", "env rm f", "X=1 rm f", "command rm f", "r''m f", "eval 'rm f'",
                    "sh -c 'rm f'", 'bash -c "rm f"', "$(echo rm) f", "echo f | xargs rm", "find . -name f -delete"):
        with pytest.raises(permission.DeniedError) as denied:
            await PermissionGate().ask(bash_ask(command, tmp_path), scope, lambda _: None)
        assert str(denied.value) == permission.denied_message(permission.relevant_rules("bash", ruleset)), command


async def test_the_request_shows_upstreams_patterns_and_an_always_that_covers_what_runs(tmp_path: Path) -> None:
    scope = AskScope("t", "ses_corpus", "call_1", "msg_1", "bash", agent_rules("rm-ask"))
    gate = PermissionGate()
    asked = Asked()
    task = asyncio.ensure_future(gate.ask(bash_ask("env rm f", tmp_path), scope, asked))
    await asked.until(1, task)
    request = asked.requests[0]
    assert (request.patterns, request.always) == (["env rm f"], ["env *", "rm *"])
    await gate.reply(request.id, Reply.ALWAYS)
    await task
    # Approved for the session: the same respelling runs without asking again, and so does plain rm.
    assert await decide(bash_ask("env rm g", tmp_path), scope, gate) == "allow"
    assert await decide(bash_ask("rm g", tmp_path), scope, gate) == "allow"


@pytest.mark.parametrize(("approved", "command"), [
    ("ls *", "ls; rm -rf x"),
    ("ls *", "ls $(rm -rf x)"),
    ("env *", "env rm f"),
    ("sh *", "sh -c 'rm f'"),
    ("find *", "find . -delete"),
    ("xargs *", "echo f | xargs rm"),
    ("eval *", "eval 'rm f'"),
    ("git *", "git -c alias.x='!rm f' x"),
    ("*", "$(echo rm) f"),
    ("$(echo rm) *", "$(echo rm) f"),
])
async def test_an_always_approval_never_widens_to_what_it_did_not_name(
    approved: str, command: str, tmp_path: Path,
) -> None:
    """Approvals are matched against the normalised forms too, and never answer for a command not known."""
    gate = PermissionGate()
    scope = AskScope("t", "ses_always", "call_1", "msg_1", "bash", agent_rules("rm-ask"))
    state = await gate._session("t", "ses_always")
    state.approved.append(Rule("bash", approved, "allow"))
    ask = bash_ask(command, tmp_path)
    assert await decide(ask, scope, gate) == "ask"
    assert not local_allows(ask, scope.ruleset, state.approved, [])


async def test_a_pending_unknown_command_is_not_let_through_by_another_requests_always(tmp_path: Path) -> None:
    gate = PermissionGate()
    scope = AskScope("t", "ses_cascade", "call_1", "msg_1", "bash", agent_rules("git-only-ask"))
    asked = Asked()
    first = asyncio.ensure_future(gate.ask(bash_ask("ls", tmp_path), scope, asked))
    second = asyncio.ensure_future(gate.ask(bash_ask("$(echo ls) -la", tmp_path), scope, asked))
    third = asyncio.ensure_future(gate.ask(bash_ask("ls -la", tmp_path), scope, asked))
    await asked.until(3, first, second, third)
    await gate.reply(asked.requests[0].id, Reply.ALWAYS)  # approves `ls *`
    await first
    await third  # let through by the approval, as upstream does
    assert not second.done()
    gate.cancel_call("ses_cascade", "call_1", "done")
    with pytest.raises(ToolError):
        await second


def test_strictest_skips_rules_a_later_catch_all_overrides() -> None:
    rules = permission.from_config({"*": "ask", "bash": {"rm *": "deny", "*": "allow"}}, home=HOME)
    assert permission.strictest("bash", rules).action == "allow"
    rules = permission.from_config({"bash": {"*": "allow", "rm *": "deny"}}, home=HOME)
    assert permission.strictest("bash", rules).action == "deny"
    assert permission.strictest("bash", permission.from_config({"bash": {"git *": "allow"}}, home=HOME)).action == "ask"
    assert permission.strictest("bash", []).action == "ask"
