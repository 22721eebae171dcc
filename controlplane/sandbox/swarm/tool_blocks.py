"""A tool uid block of its own for every Swarm sandbox, unique across the swarm's nodes.

The Docker provider reads the blocks in use from its one engine's container labels. A swarm has many nodes
and possibly many control planes (on other hosts, with other stores), but one thing they all share: the
managers' service list, replicated by Raft. So each sandbox service carries its block in the `ocsb.tool_uid`
label (and its task container too, so a Docker provider on the same host sees it), and the blocks in use
are those labels. Two planes that choose at the same moment may still pick the same block; after creating
its service each plane looks again, and of the services holding the block only the one the managers created
first keeps it: every other one (a later creation sees the earlier one, and both agree on the order)
removes its service and chooses again. So no two live sandboxes ever run tools as the same uid, whichever
nodes they land on.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from controlplane.errors import SandboxStartError
from controlplane.sandbox.layout import LABEL_TOOL_UID
from controlplane.sandbox.tool_ids import ToolIds

ATTEMPTS = 8


def service_uids(api: Any) -> set[int]:
    """Every block named by a service's `ocsb.tool_uid` label in the swarm (any control plane's)."""
    uids = set()
    for service in api.services(filters={"label": LABEL_TOOL_UID}):
        value = ((service.get("Spec") or {}).get("Labels") or {}).get(LABEL_TOOL_UID, "")
        if isinstance(value, str) and value.isdigit():
            uids.add(int(value))
    return uids


def created_at(service: dict[str, Any]) -> datetime.datetime:
    """The managers' creation time, to the nanosecond's first six digits (Go's RFC 3339 with a trimmed
    fraction: compared as text, `.12Z` would sort before `.1Z`)."""
    text = str(service.get("CreatedAt", ""))
    head, _, rest = text.partition(".")
    fraction = "".join(c for c in rest if c.isdigit())
    base = datetime.datetime.strptime(head.rstrip("Z"), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
    return base + datetime.timedelta(microseconds=int((fraction + "000000")[:6]))


def first_holder(api: Any, uid: int) -> str:
    """The id of the service holding block `uid` that the managers created first ("" when none does)."""
    holders = api.services(filters={"label": f"{LABEL_TOOL_UID}={uid}"})
    if not holders:
        return ""
    return str(min(holders, key=lambda s: (created_at(s), str(s.get("ID", ""))))["ID"])


def create_with_block(
    tool_ids: ToolIds, api: Any, owner: str, create: Callable[[int], str], undo: Callable[[], None]
) -> tuple[str, int]:
    """Runs `create(uid)` (which makes the labelled service and returns its id) with a block no other service
    holds; `undo` removes what it made when another service turned out to hold the same block first."""
    lost: set[int] = set()
    for _ in range(ATTEMPTS):
        with tool_ids.claimed(lambda: service_uids(api) | lost, owner) as uid:
            service_id = create(uid)
        if first_holder(api, uid) == service_id:
            return service_id, uid
        undo()
        lost.add(uid)
    raise SandboxStartError(f"no tool uid block could be kept after {ATTEMPTS} attempts (others took each one)")
