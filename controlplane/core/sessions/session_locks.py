"""One pause, resume or delete at a time per session (in this plane): a lock per session id, made on first use and
dropped when no one holds or waits for it (every DeleteSession takes one, so they must not pile up)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class SessionLocks:
    def __init__(self) -> None:
        self._busy: dict[str, _Turn] = {}

    @contextlib.asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        turn = self._busy.setdefault(session_id, _Turn())
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if not turn.users and self._busy.get(session_id) is turn:
                del self._busy[session_id]

    def held(self, session_id: str) -> bool:
        """Whether a pause, resume or delete of the session holds or waits for its lock."""
        return session_id in self._busy


class _Turn:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
