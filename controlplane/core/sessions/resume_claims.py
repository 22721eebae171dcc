"""Which control plane resumes a PAUSED session: several planes may share one store, and only one of them may give
the session a sandbox. A resume claims the session in the store first (a conditional write), and stores READY only
while it still holds that claim."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from controlplane.core.sessions.models import Session, SessionState
from controlplane.core.sessions.store_port import SessionStore
from controlplane.errors import FailedPreconditionError

RESUME_CLAIM_STALE_S = 300.0
"""A resume claim this old is taken over by another plane: its plane stopped mid-resume (a claim is released at
the end of every resume, so only a crash leaves one). Longer than a resume takes; an overtaken resume that still
finishes is refused at its READY write, so the age bounds a wait, never a double sandbox."""


class ResumeClaims:
    def __init__(self, store: SessionStore, instance: str, clock: Callable[[], float]) -> None:
        self._store = store
        self._instance = instance
        """This plane's name in the store's claims."""
        self._clock = clock

    async def claim(self, session_id: str, current: Callable[[], Awaitable[Session]]) -> Session | None:
        """Claims the PAUSED session for this plane. None when claimed; the session (`current()`) when another plane
        resumed it already; FailedPreconditionError while another plane holds it, or when it is no longer PAUSED."""
        now = self._clock()
        holder = await self._store.claim_paused(session_id, self._instance, now, now - RESUME_CLAIM_STALE_S)
        if holder == self._instance:
            return None
        if holder:
            raise FailedPreconditionError(
                f"session {session_id} is being resumed by control plane {holder!r}; GetSession shows it READY once "
                "that resume is over")
        session = await current()
        if session.state == SessionState.READY:
            return session
        raise FailedPreconditionError(
            f"session {session_id} is {session.state.value}: only a PAUSED session can be resumed")

    async def store_resumed(self, session: Session) -> None:
        """Stores the session READY while this plane's claim holds."""
        if not await self._store.put_resumed(session, self._instance):
            # Our claim went stale and another plane took it, or the session was deleted meanwhile: that plane's
            # act stands, and this plane's new sandbox is removed (unpark does it on this raise).
            raise FailedPreconditionError(
                f"session {session.id} was resumed or deleted through another control plane while this one was "
                "resuming it; GetSession shows its state")

    async def release(self, session_id: str) -> None:
        await self._store.release_claim(session_id, self._instance)
