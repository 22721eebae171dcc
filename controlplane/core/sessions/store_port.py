"""What the session manager keeps in the store: its sessions, written and read back by id, tenant or liveness."""

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
