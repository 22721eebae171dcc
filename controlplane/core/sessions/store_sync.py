"""What a control plane learns from a store it shares with others, each reaper round."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from controlplane.core.sessions.models import Session, SessionState
from controlplane.core.sessions.store_port import SessionStore


async def sync(store: SessionStore, live: dict[str, Session],
               ended_elsewhere: Callable[[Session, Session], Awaitable[None]]) -> None:
    """Other control planes sharing the store may have used this plane's sessions (their activity postpones the
    idle timeout) or ended them (their sandboxes are removed here, by their owner: `ended_elsewhere`)."""
    stored = {s.id: s for s in await store.list_sessions(live_only=True)}
    for session in list(live.values()):
        current = stored.get(session.id)
        if current is None:
            ended = await store.get_session(session.id)
            running = (SessionState.CREATING, SessionState.READY)
            if ended is not None and ended.state not in running and live.get(session.id) is session:
                await ended_elsewhere(session, ended)
        elif current.last_active_at > session.last_active_at:
            session.last_active_at = current.last_active_at
