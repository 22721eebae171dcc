"""When a running session's lifetime is over, and what it says then."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from controlplane.core.sessions.admission import SessionPolicy
from controlplane.core.sessions.models import Session, SessionState

EXPIRED = "expired: "
"""Every expiry's message starts so: what ends a session at its lifetime (and keeps its workspace for
`lifetime.retain_s`, pausing.py) is told apart from a caller's delete by it."""


def reason(session: Session, policy: SessionPolicy, now: float) -> str | None:
    """Why `session` has expired at `now`, or None while it has not."""
    if now >= session.created_at + policy.max_lifetime_s:
        return f"{EXPIRED}reached the maximum lifetime of {policy.max_lifetime_s:g} s"
    if now >= session.last_active_at + policy.idle_timeout_s:
        return f"{EXPIRED}idle for {policy.idle_timeout_s:g} s"
    return None


def due(sessions: Iterable[Session], policy: SessionPolicy, now: float) -> Iterator[tuple[Session, str]]:
    """The running sessions of `sessions` that have expired at `now`, each with its reason."""
    for session in sessions:
        if session.state == SessionState.READY and (why := reason(session, policy, now)) is not None:
            yield session, why
