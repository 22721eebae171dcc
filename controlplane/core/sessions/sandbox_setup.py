"""Making a claimed sandbox a session's: its network, its workspace, its custom code (at create and at resume)."""

from __future__ import annotations

import asyncio
import logging

from controlplane.core.seam.messages import CodeChanges
from controlplane.core.seam.provider import Sandbox, SandboxProvider
from controlplane.core.sessions.models import Session
from controlplane.core.sessions.network import SessionNetworks

log = logging.getLogger(__name__)


async def fill(networks: SessionNetworks | None, provider: SandboxProvider, session: Session, sandbox: Sandbox,
               archive: bytes, config_json: str) -> CodeChanges:
    """Opens the session's network (before anything of the caller's runs), uploads `archive` and fixes the
    session's custom code as the workspace holds it; any failure removes the sandbox and the network (shielded:
    a caller gone halfway leaves neither) and is raised."""
    try:
        if session.network is not None and networks is not None:
            await networks.open(session, sandbox)
        if archive:
            summary = await sandbox.agent.upload(archive)
            if summary.skipped:
                log.warning("session %s: upload skipped %s", session.id, summary.skipped)
        # The code the session may run is fixed now, before any tool call: a tool, plugin or skill the
        # model writes later is workspace data until the caller says ReloadTools (or resumes the session).
        return await sandbox.agent.snapshot_code(config_json, {})
    except BaseException:
        if session.network is not None and networks is not None:
            await asyncio.shield(networks.close(session.id))
        await asyncio.shield(provider.destroy(sandbox.id))
        raise
