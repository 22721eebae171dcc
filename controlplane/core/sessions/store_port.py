"""What the session manager keeps in the store: its sessions, written and read back by id, tenant or liveness; and
the claim that lets one control plane (of several on one store) resume a PAUSED session."""

from __future__ import annotations

from typing import Protocol

from controlplane.core.sessions.models import Session


class SessionStore(Protocol):
    async def put_session(self, s: Session) -> None: ...

    async def touch_session(self, session_id: str, at: float) -> None: ...

    async def get_session(self, session_id: str) -> Session | None: ...

    async def list_sessions(self, tenant: str | None = None, live_only: bool = False,
                            with_paused: bool = False) -> list[Session]:
        """`live_only`: only CREATING and READY sessions (and PAUSED ones `with_paused`), selected by the store, so
        that a caller never reads every session a tenant ever had."""

    async def claim_paused(self, session_id: str, holder: str, at: float, stale_before: float) -> str:
        """Claims the PAUSED session for `holder` (a control plane's instance) to resume it, in one atomic
        compare-and-set: taken when no plane holds it, `holder` already does, or the claim dates from before
        `stale_before` (its plane stopped mid-resume). Returns who holds it afterwards: `holder` when claimed,
        another plane's instance when it is being resumed there, "" when the session is not PAUSED (any more)."""
        ...

    async def put_resumed(self, s: Session, holder: str) -> bool:
        """Stores the claimed session READY on `s.sandbox_id` (its claim released), only if it is still PAUSED
        and claimed by `holder`: False when another plane took the claim or the session changed meanwhile."""
        ...

    async def release_claim(self, session_id: str, holder: str) -> None:
        """Drops `holder`'s claim (a resume that failed): the session stays PAUSED, resumable by any plane."""
        ...
