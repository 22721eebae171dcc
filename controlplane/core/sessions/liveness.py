"""Whether a sandbox whose call stream broke is really gone: only then does its session fail."""

from __future__ import annotations

import asyncio

from controlplane.core.seam.provider import SandboxProvider

LOST_CHECK_S = 5.0
"""How long the agent has to answer the health check."""
LOST_RETRY_S = 0.25
"""Before the second look: the agent channel's reconnect backoff is at most 200 ms."""


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
