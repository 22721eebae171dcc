"""Domain records shared by the store, the session manager and the rpc layer."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class SessionState(enum.Enum):
    CREATING = "CREATING"
    READY = "READY"
    FAILED = "FAILED"
    DELETED = "DELETED"


@dataclass(frozen=True)
class Resources:
    cpu: float
    memory_mb: int
    pids: int


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

    def expires_at(self, idle_timeout_s: float, max_lifetime_s: float) -> float:
        return min(self.last_active_at + idle_timeout_s, self.created_at + max_lifetime_s)

    @property
    def live(self) -> bool:
        return self.state in (SessionState.CREATING, SessionState.READY)
