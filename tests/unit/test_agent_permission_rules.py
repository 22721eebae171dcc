"""The agent's LocalRules decide a call's asks exactly as the control plane's permission evaluation does."""

from __future__ import annotations

import random

from controlplane.core.permissions.asks import LocalRules as CpLocalRules
from controlplane.core.permissions.asks import _snapshot
from controlplane.core.permissions.permission import ACTIONS, Rule, evaluate, from_config, strictest
from controlplane.sandbox.rule_encoding import encode_rules
from sandbox.v1 import agent_pb2
from sandbox_agent.permission_rules import LocalRules


def _encoded(rules: CpLocalRules) -> list[agent_pb2.PermissionRule]:
    return [agent_pb2.PermissionRule(permission=r.permission, pattern=r.pattern, action=r.action)
            for r, _ in rules.rules]


def test_the_agent_allows_exactly_what_the_last_matching_rule_allows() -> None:
    agent_rules = from_config({
        "*": "allow", "doom_loop": "ask",
        "bash": {"*": "ask", "echo *": "allow", "git *": "ask", "git status": "allow"},
        "read": {"*": "allow", "*.env": "ask", "*.env.example": "allow"}, "external_directory": {"*": "ask"},
    }, home="/home/tool")
    approved = [Rule("bash", "git log *", "allow")]
    policy = from_config({"bash": {"echo danger*": "deny"}, "webfetch": "deny"}, home="/home/tool")
    local = LocalRules(_encoded(_snapshot(agent_rules, approved, policy)))
    asks = [
        ("bash", ["echo hi"]), ("bash", ["echo hi", "git status"]), ("bash", ["echo hi", "git push"]),
        ("bash", ["git log --oneline"]), ("bash", ["echo dangerous"]), ("bash", []), ("read", ["/w/a.env"]),
        ("read", ["/w/a.env.example"]), ("read", ["/w/x.py"]), ("webfetch", ["https://x"]), ("edit", ["a.py"]),
        ("external_directory", ["/etc/*"]), ("doom_loop", ["bash"]), ("glob", ["**/*.py"]),
    ]
    for name, patterns in asks:
        expected = all(evaluate(name, p, agent_rules, approved, policy).action == "allow" for p in patterns)
        assert local.allows(name, patterns) == expected, (name, patterns)
    assert local.allows("bash", ["echo hi"])
    assert not local.allows("bash", ["echo dangerous"])
    assert local.allows("bash", [])  # nothing to ask about: allowed, as the gate does
    assert local.action("nothing-matches", "x") == "allow"  # the "*": "allow" default
    assert LocalRules([]).action("bash", "ls") == "ask"  # no rule at all: ask


def test_a_snapshot_is_reused_until_its_rules_change() -> None:
    agent_rules, approved = [Rule("*", "*", "allow")], [Rule("bash", "ls *", "allow")]
    policy: list[Rule] = []
    first = _snapshot(agent_rules, approved, policy)
    assert _snapshot(agent_rules, approved, policy) is first
    assert [source for _, source in first.rules] == ["agent", "approved"]
    approved.append(Rule("bash", "git *", "allow"))
    second = _snapshot(agent_rules, approved, policy)
    assert second is not first
    assert [r.pattern for r, _ in second.rules] == ["*", "ls *", "git *"]
    assert _snapshot(list(agent_rules), approved, policy) is not second  # another list, even when equal


def test_the_strictest_rule_for_a_command_not_known_agrees() -> None:
    """LocalRules.strictest (agent) and permission.strictest (control plane) on random layered rulesets;
    approvals take no part in either."""
    rng = random.Random(21)
    names, globs = ["*", "bash", "ba*", "read", "edit"], ["*", "**", "rm *", "git *", "ls", "*x"]

    def rules(count: int) -> list[Rule]:
        return [Rule(rng.choice(names), rng.choice(globs), rng.choice(ACTIONS)) for _ in range(count)]

    for _ in range(2000):
        agent_rules, approved, policy = rules(rng.randint(0, 6)), rules(rng.randint(0, 3)), rules(rng.randint(0, 3))
        local = LocalRules(encode_rules(_snapshot(agent_rules, approved, policy)).rules)
        for name in ("bash", "read"):
            expected = strictest(name, agent_rules, policy).action
            assert local.strictest(name) == expected, (name, agent_rules, approved, policy)
            assert local.allows(name, [], [], True) == (expected == "allow")
