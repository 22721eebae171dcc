"""`provider.workspace_disk = "auto"` (disk_auto): which nodes may run sessions (ready, active, matching the
provider's constraints as Swarm matches them), and the choice: on only when every one of them is held by an engine
of the plane and its helper probe worked, else off with one line naming the nodes and what to do. Against real
cluster nodes: tests/cluster/test_swarm_workspace_disk_default.py."""

from __future__ import annotations

from typing import Any

from controlplane.config import SwarmProviderConfig
from controlplane.sandbox.swarm.disk_auto import UNREACHED, choose, constraint_holds, session_nodes


def _node(node_id: str, hostname: str = "h", state: str = "ready", availability: str = "active",
          role: str = "worker", labels: dict[str, str] | None = None, engine: dict[str, str] | None = None) -> Any:
    """A node as the engine's `GET /nodes` returns it (the fields the choice reads)."""
    return {
        "ID": node_id,
        "Spec": {"Role": role, "Availability": availability, "Labels": labels or {}},
        "Description": {"Hostname": hostname, "Platform": {"OS": "linux", "Architecture": "x86_64"},
                        "Engine": {"Labels": engine or {}}},
        "Status": {"State": state},
    }


def test_auto_is_the_default_and_true_false_keep_their_meaning() -> None:
    assert SwarmProviderConfig().workspace_disk == "auto"
    assert SwarmProviderConfig(workspace_disk=True).workspace_disk is True
    assert SwarmProviderConfig(workspace_disk=False).workspace_disk is False


def test_only_ready_active_nodes_may_run_sessions() -> None:
    nodes = [_node("a", "one"), _node("b", state="down"), _node("c", availability="drain"),
             _node("d", availability="pause"), _node("e", "five", role="manager")]
    assert session_nodes(nodes, []) == {"a": "a (one)", "e": "e (five)"}


def test_constraints_match_as_swarm_matches_them() -> None:
    web = _node("n1", "Web-1", role="manager", labels={"ocsb.sandboxes": "true"}, engine={"zone": "EU"})
    plain = _node("n2", "db")
    nodes = [web, plain]
    assert list(session_nodes(nodes, ["node.labels.ocsb.sandboxes==true"])) == ["n1"]
    assert list(session_nodes(nodes, ["node.labels.ocsb.sandboxes!=true"])) == ["n2"]  # a missing label is "not"
    assert list(session_nodes(nodes, ["node.role == worker"])) == ["n2"]
    assert list(session_nodes(nodes, ["node.hostname==web-1"])) == ["n1"]  # case does not matter
    assert list(session_nodes(nodes, ["node.id!=n1", "node.platform.os==linux"])) == ["n2"]
    assert list(session_nodes(nodes, ["engine.labels.zone==eu"])) == ["n1"]
    assert session_nodes(nodes, ["node.role==manager", "node.role==worker"]) == {}


def test_a_constraint_it_does_not_know_keeps_the_node_among_those_to_cover() -> None:
    node = _node("n1")
    assert constraint_holds("node.ip==10.0.0.0/8", node)
    assert constraint_holds("not a constraint", node)
    assert not constraint_holds("node.labels.absent==x", node)


def test_on_when_every_session_node_is_held_and_its_probe_worked() -> None:
    needed = {"m": "m (vm)", "w": "w (vm)"}
    choice = choose(needed, {"m", "w", "elsewhere"}, {})
    assert choice.on
    assert choice.uncovered == {}
    assert "on" in choice.log_line()
    assert "2 node(s)" in choice.log_line()


def test_a_node_no_engine_reaches_turns_it_off_and_the_line_names_it() -> None:
    choice = choose({"m": "m (vm)", "w": "w (worker-1)"}, {"m"}, {})
    assert not choice.on
    assert choice.uncovered == {"w (worker-1)": UNREACHED}
    line = choice.log_line()
    assert "w (worker-1)" in line
    assert "m (vm)" not in line
    assert "node_engines" in line
    assert "workspace_disk = false" in line


def test_a_node_whose_helper_fails_turns_it_off_with_the_helpers_error() -> None:
    choice = choose({"m": "m (vm)", "w": "w (vm)"}, {"m", "w"}, {"w": "losetup: cannot find an unused loop device"})
    assert not choice.on
    assert choice.uncovered == {"w (vm)": "losetup: cannot find an unused loop device"}
    assert "losetup" in choice.log_line()


def test_no_node_to_run_sessions_is_off() -> None:
    choice = choose({}, {"m"}, {})
    assert not choice.on
    assert "provider.constraints" in choice.log_line()
