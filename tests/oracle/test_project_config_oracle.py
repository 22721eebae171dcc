"""A workspace's project config against upstream v1.2.27, case by case.

recorded/project_config.json holds hand-made projects (opencode.json(c) files, markdown agents and modes)
and what upstream made of them: `opencode debug config` (its agent map, plugins, instructions, or its
refusal) and `opencode debug agent NAME` (mode, description, hidden, prompt and the full permission
ruleset), with its home and project paths replaced by `{home}` and `{worktree}`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controlplane.core.config import project_files
from controlplane.core.config.project_config import agent_configs, user_permission
from controlplane.core.permissions import permission
from controlplane.errors import ControlPlaneError

CASES = json.loads((Path(__file__).parent / "recorded" / "project_config.json").read_text())
HOME = "/home/tool"
WORKTREE = "/workspace"

ACCEPTED_UNLIKE_UPSTREAM = {
    # Unknown top-level keys: real projects' configs carry keys 1.2.27 refuses (docs/tools.md).
    "hand-29-unknown-keys-json",
}


def _paths(value: Any) -> Any:
    return json.loads(json.dumps(value).replace("{home}", HOME).replace("{worktree}", WORKTREE))


def _agents(files: dict[str, str]) -> tuple[dict[str, Any], dict[str, permission.Agent]]:
    config = json.loads(project_files.session_config({k: v.encode() for k, v in files.items()}, "") or "{}")
    user = permission.from_config(user_permission(config), home=HOME)
    agents = permission.builtin_agents(
        f"{HOME}/data/opencode/tool-output", [], f"{HOME}/data/opencode/plans", user,
        agent_config=agent_configs(config), home=HOME, worktree=WORKTREE,
    )
    return config, agents


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_project_config_as_upstream_reads_it(case: dict[str, Any]) -> None:
    if case.get("refused"):
        if case["case"] in ACCEPTED_UNLIKE_UPSTREAM:
            _agents(case["files"])
            return
        with pytest.raises(ControlPlaneError):
            _agents(case["files"])
        return
    config, agents = _agents(case["files"])
    configured = agent_configs(config)
    assert set(configured) == set(case["agents"])
    for name, expected in case["agents"].items():
        if expected is None:  # upstream does not serve it: disabled (or, for a numeric name, it crashes)
            if configured[name].get("disable"):
                assert name not in agents
            continue
        agent = agents[name]
        expected = _paths(expected)
        assert (agent.mode, agent.description, agent.hidden) == (
            expected["mode"], expected["description"], expected["hidden"]
        ), name
        assert configured[name].get("prompt") == expected["prompt"], name
        assert [[r.permission, r.pattern, r.action] for r in agent.permission] == expected["permission"], name
    assert config.get("instructions", []) == _paths(case["instructions"])
