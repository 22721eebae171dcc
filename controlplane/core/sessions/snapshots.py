"""Snapshots of a session: what one is, and the storage port that keeps them (filesystem today; an object store
can implement the same port).

A snapshot is the session's workspace as a compressed tar, checksummed over the stored bytes, and beside it the
state the session owns in the store: the caller's config, agent, template, labels, resources, network, todos and
"always" approvals. Both are written under a temporary name and renamed, the state last, so that a crash never
leaves something that lists as a snapshot and is not one.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from controlplane.core.permissions.permission import Rule
from controlplane.core.sessions.models import NetworkPolicy, Resources, Session
from controlplane.errors import InvalidArgumentError

SNAPSHOT_ID = re.compile(r"^snap_[0-9a-f]{24}$")
"""Snapshot ids are made here; anything else (a path, `..`) is refused before it reaches a storage."""


def checked_id(snapshot_id: str) -> str:
    if not SNAPSHOT_ID.fullmatch(snapshot_id):
        raise InvalidArgumentError(f"{snapshot_id!r} is not a snapshot id (snap_ and 24 hex digits)")
    return snapshot_id


@dataclass(frozen=True)
class SnapshotState:
    """What a restored session is created with, besides its workspace."""

    agent: str
    config_json: str
    """The caller's own config (the workspace's project config is merged into it again at restore)."""
    template: str
    labels: dict[str, str]
    resources: Resources
    network: NetworkPolicy | None
    todos: list[dict[str, Any]] = field(default_factory=list)
    approvals: list[tuple[str, str, str]] = field(default_factory=list)
    """"always" approvals as (permission, pattern, action)."""
    kind: str = "taken"
    """"taken" (SnapshotSession), "paused" (a PAUSED session's own workspace: not listed, not restorable) or
    "retained" (kept at a session's end, purged at `purge_at`)."""
    purge_at: float = 0.0
    session_config_json: str | None = None
    """The config the session ran with (`config_json` merged with its workspace's project config then): what a
    restore or fork runs with when the workspace's project files no longer pass (a model rewrote them). None in a
    snapshot stored before this was kept."""

    @classmethod
    def of(cls, session: Session, todos: list[dict[str, Any]], approvals: list[Rule]) -> SnapshotState:
        caller = session.config_json if session.caller_config_json is None else session.caller_config_json
        return cls(session.agent, caller, session.template, dict(session.labels), session.resources,
                   session.network, list(todos), [(r.permission, r.pattern, r.action) for r in approvals],
                   session_config_json=session.config_json)

    def rules(self) -> list[Rule]:
        return [Rule(p, pattern, action) for p, pattern, action in self.approvals]  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["network"] = json.loads(self.network.to_json()) if self.network is not None else None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SnapshotState:
        network = data.get("network")
        return cls(
            agent=data["agent"], config_json=data["config_json"], template=data["template"],
            labels=dict(data["labels"]), resources=Resources(**data["resources"]),
            network=NetworkPolicy.from_json(json.dumps(network)) if network is not None else None,
            todos=list(data["todos"]), approvals=[tuple(a) for a in data["approvals"]],
            kind=str(data.get("kind", "taken")), purge_at=float(data.get("purge_at", 0.0)),
            session_config_json=data.get("session_config_json"),
        )


@dataclass(frozen=True)
class Snapshot:
    id: str
    tenant: str
    session_id: str
    created_at: float
    size_bytes: int
    """Of the stored (compressed) workspace."""
    sha256: str
    """Over the stored bytes, checked before any restore."""
    compression: str
    """"gzip" (the agent extracts it as it comes) or "zstd"."""
    state: SnapshotState

    @property
    def template(self) -> str:
        return self.state.template

    @property
    def kind(self) -> str:
        return self.state.kind


class SnapshotStorage(Protocol):
    """Where snapshots are kept. A tenant sees only its own: every call names the tenant."""

    async def write(self, tenant: str, snapshot_id: str, session_id: str, state: SnapshotState,
                    tar: AsyncIterator[bytes]) -> Snapshot:
        """Compresses and stores `tar`; the snapshot lists only once all of it is stored."""
        ...

    async def tenants(self) -> list[str]:
        """The tenants that keep any snapshot (the reaper purges retained ones past their time)."""
        ...

    async def get(self, tenant: str, snapshot_id: str) -> Snapshot | None: ...

    async def list(self, tenant: str) -> list[Snapshot]:
        """Oldest first."""
        ...

    async def read(self, tenant: str, snapshot_id: str) -> bytes:
        """The stored (compressed) workspace, after its checksum matched (FailedPrecondition otherwise)."""
        ...

    def workspace(self, tenant: str, snapshot_id: str) -> AsyncIterator[bytes]:
        """The stored workspace as its (uncompressed) tar, a piece at a time, once its checksum matched
        (FailedPrecondition otherwise): a copy of a stored workspace never holds it whole."""
        ...

    async def delete(self, tenant: str, snapshot_id: str) -> bool:
        """False when there was none."""
        ...

    async def stored_bytes(self, tenant: str) -> int:
        """The stored size of all the tenant's snapshots, every kind: read on each quota admission, so it must not
        read the stored workspaces (the filesystem storage caches each record's size)."""
        ...
