"""When a session's sandbox counts as gone: a call whose stream broke fails its session only if the agent
no longer answers (`still_answers`); a provider's own report of a lost sandbox is believed (`fail_stored`
for the sessions this plane does not hold)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Protocol

from controlplane.core.seam.provider import LostSandbox, SandboxProvider
from controlplane.core.sessions.models import Session, SessionState

LOST_CHECK_S = 5.0
"""How long the agent has to answer the health check."""
LOST_RETRY_S = 0.25
"""Before the second look: the agent channel's reconnect backoff is at most 200 ms."""


class SessionRows(Protocol):
    async def get_session(self, session_id: str) -> Session | None: ...

    async def put_session(self, s: Session) -> None: ...


async def still_answers(provider: SandboxProvider, sandbox_id: str) -> bool:
    """Whether the agent answers now. Not waiting for a connection: a dead agent's socket refuses at once, while a
    live agent's channel that just lost a stream reconnects within its backoff (the second try)."""
    try:
        sandbox = await provider.get(sandbox_id)
    except Exception:  # any failure to reach it counts as gone
        return False
    for attempt in range(2):
        try:
            await sandbox.agent.health(timeout_s=LOST_CHECK_S, wait_for_ready=False)
        except Exception:
            if attempt == 0:
                await asyncio.sleep(LOST_RETRY_S)
            continue
        return True
    return False


async def fail_stored(store: SessionRows, lost: LostSandbox) -> None:
    """The lost sandbox's session as the shared store has it, when this plane does not hold it (control planes
    sharing a store each watch their own sandboxes): a READY row on that sandbox is marked FAILED with the
    provider's reason right away, and the plane that holds it ends it at its next look at the store, instead
    of at the session's next use. A row already ended, or on another sandbox by now, is left as it is."""
    session = await store.get_session(lost.session_id) if lost.session_id else None
    if session is None or session.state != SessionState.READY or session.sandbox_id != lost.sandbox_id:
        return
    await store.put_session(replace(session, state=SessionState.FAILED, status_message=lost.reason))
