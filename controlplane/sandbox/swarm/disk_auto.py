"""`provider.workspace_disk = "auto"` (the default): kept workspace disks (node_disks) wherever they can work.

A disk is made through a node's engine, so a node whose engine the plane does not hold could run no session once
disks are on (it is left out of every placement). "auto" therefore turns disks on only when every node that may
run sessions today (ready, availability active, matching the provider's `constraints`) is held, by the manager's
engine or one of `node_engines` (matched by the engine's own Swarm node id, not by its URL), and a probe run of the
disk helper (the same preparation path a sandbox takes) works there. Otherwise it is off, said in one log line.

It is resolved once, at start. A node that joins later while disks are on runs no session until its engine is
listed and the plane restarts: the placement leaves out any node without a prepared disk, and the service's mount
fails on such a node rather than give a task an unbounded directory (node_disks.MISSING_DEVICE).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

UNREACHED = "no engine of this plane"
"""Why a node is not covered when none of the engines the plane holds is that node."""


@dataclass(frozen=True)
class DiskChoice:
    on: bool
    uncovered: dict[str, str] = field(default_factory=dict)
    """Node (`id (hostname)`) -> why no disk can be made there."""
    nodes: int = 0
    """How many nodes may run sessions."""

    def log_line(self) -> str:
        """The operator's one line: what was chosen and, when off, which nodes and what to do."""
        if self.on:
            return (f"workspace_disk = auto: on (every one of the {self.nodes} node(s) that may run sessions is "
                    "reached); a FAILED session's workspace is kept")
        why = "; ".join(f"{node}: {reason}" for node, reason in sorted(self.uncovered.items()))
        return ("workspace_disk = auto: off, /workspace is a tmpfs and a FAILED session whose container died keeps "
                f"nothing; not covered: {why}. List those nodes' engines in provider.node_engines (or fix the "
                "helper's error) to keep workspaces, or set provider.workspace_disk = false to silence this")


def constraint_holds(constraint: str, node: Mapping[str, Any]) -> bool:
    """Whether a Swarm placement constraint (`attribute==value` or `!=`) admits `node` (an inspected node). Values
    compare case-insensitively, as Swarm's do; an attribute this does not know counts as admitting the node, so a
    node is never wrongly left out of those the disks must cover."""
    for operator in ("==", "!="):
        if operator in constraint:
            key, _, wanted = (part.strip() for part in constraint.partition(operator))
            break
    else:
        return True
    found = _attribute(key, node)
    if found is None and not key.startswith(("node.labels.", "engine.labels.")):
        return True
    matches = found is not None and found.lower() == wanted.lower()
    return matches if operator == "==" else not matches


def _attribute(key: str, node: Mapping[str, Any]) -> str | None:
    spec, description = node.get("Spec") or {}, node.get("Description") or {}
    platform = description.get("Platform") or {}
    known = {
        "node.id": node.get("ID"), "node.hostname": description.get("Hostname"), "node.role": spec.get("Role"),
        "node.platform.os": platform.get("OS"), "node.platform.arch": platform.get("Architecture"),
    }
    if key in known:
        value = known[key]
    elif key.startswith("node.labels."):
        value = (spec.get("Labels") or {}).get(key.removeprefix("node.labels."))
    elif key.startswith("engine.labels."):
        value = ((description.get("Engine") or {}).get("Labels") or {}).get(key.removeprefix("engine.labels."))
    else:
        value = None
    return None if value is None else str(value)


def session_nodes(nodes: Iterable[Mapping[str, Any]], constraints: Iterable[str]) -> dict[str, str]:
    """The nodes that may run sessions, node id -> `id (hostname)` (the name the log line gives)."""
    wanted = list(constraints)
    found = {}
    for node in nodes:
        status, spec = node.get("Status") or {}, node.get("Spec") or {}
        if status.get("State") != "ready" or spec.get("Availability") != "active":
            continue
        if all(constraint_holds(c, node) for c in wanted):
            hostname = (node.get("Description") or {}).get("Hostname") or "?"
            found[str(node["ID"])] = f"{node['ID']} ({hostname})"
    return found


def choose(needed: Mapping[str, str], reached: Iterable[str], failed: Mapping[str, str]) -> DiskChoice:
    """On when every needed node is reached and its probe did not fail (`failed`: node id -> the helper's error)."""
    if not needed:
        return DiskChoice(on=False, uncovered={"every node": "none is ready, active and matches provider.constraints"})
    held = set(reached)
    uncovered = {name: (UNREACHED if node not in held else failed[node])
                 for node, name in needed.items() if node not in held or node in failed}
    return DiskChoice(on=not uncovered, uncovered=uncovered, nodes=len(needed))
