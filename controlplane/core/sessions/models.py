"""Domain records shared by the store, the session manager and the rpc layer."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field


class SessionState(enum.Enum):
    CREATING = "CREATING"
    READY = "READY"
    FAILED = "FAILED"
    DELETED = "DELETED"
    PAUSED = "PAUSED"
    """No sandbox; its workspace is stored until ResumeSession (core/sessions/pausing.py)."""


@dataclass(frozen=True)
class Resources:
    cpu: float
    memory_mb: int
    pids: int


@dataclass(frozen=True)
class NetworkPolicy:
    """What a session's tools may reach through its proxy (CreateSessionRequest.network); checked against the
    tenant's cap at create, and vetted again by the operator's guard on every connection."""

    allow_hosts: tuple[str, ...] = ()
    allow_cidrs: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"allow_hosts": list(self.allow_hosts), "allow_cidrs": list(self.allow_cidrs)})

    @classmethod
    def from_json(cls, text: str | None) -> NetworkPolicy | None:
        if not text:
            return None
        data = json.loads(text)
        return cls(tuple(data.get("allow_hosts", ())), tuple(data.get("allow_cidrs", ())))


@dataclass(frozen=True)
class Tenant:
    name: str


@dataclass
class Session:
    id: str
    tenant: str
    agent: str
    state: SessionState
    resources: Resources
    created_at: float
    last_active_at: float
    sandbox_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    config_json: str = ""
    status_message: str = ""
    deleted_at: float | None = None
    parent_id: str = ""
    """Set for a child session (one the `task` tool made): it shares its parent's sandbox."""
    title: str = ""
    caller_config_json: str | None = None
    """The caller's own `config_json` (as JSON) when the workspace's project config added to it, so that
    `config_json` is the merged config: the workspace may narrow the caller's rules, never widen them
    (controlplane.core.permissions.rule_layers). None when `config_json` is the caller's alone."""
    template: str = "default"
    """The template whose image the session's sandbox runs (core/sessions/templates.py)."""
    network: NetworkPolicy | None = None
    """The session's network (None: no network at all). Kept in the store, so that a plane that adopts the
    session after a restart starts its proxy again."""

    def expires_at(self, idle_timeout_s: float, max_lifetime_s: float) -> float:
        return min(self.last_active_at + idle_timeout_s, self.created_at + max_lifetime_s)

    @property
    def live(self) -> bool:
        return self.state in (SessionState.CREATING, SessionState.READY)
