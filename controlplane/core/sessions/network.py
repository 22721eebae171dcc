"""What the session manager needs from a session's network (issue 24), without knowing how it is made: the
check of a requested policy against the tenant's cap, and the per-session proxy started when the session gets
its sandbox (fresh, pooled, or adopted after a restart) and stopped when the sandbox goes.

The plane's implementation (controlplane/egress_proxy/sessions.py) runs a proxy per session on the socket the
provider names; the core only says when.
"""

from __future__ import annotations

import logging
from typing import Protocol

from controlplane.core.seam.provider import Sandbox, SandboxProvider
from controlplane.core.sessions.models import NetworkPolicy, Session
from controlplane.errors import ControlPlaneError, FailedPreconditionError

log = logging.getLogger(__name__)


class SessionNetworks(Protocol):
    def check(self, tenant: str, network: NetworkPolicy) -> None:
        """InvalidArgumentError for a malformed entry or one beyond what `tenant` may allow (naming it)."""
        ...

    async def open(self, session: Session, sandbox: Sandbox) -> None:
        """Starts the session's proxy and the sandbox's forwarder to it, before the session is READY (and again
        when a restarted plane adopts the session). A failure leaves neither behind."""
        ...

    async def close(self, session_id: str) -> None:
        """Stops the session's proxy (cutting its connections) and removes its socket; idempotent."""
        ...

    async def close_all(self) -> None:
        """The plane is stopping: every proxy stops (the sessions stay, and are opened again on adoption)."""
        ...


def check(networks: SessionNetworks | None, provider: SandboxProvider, tenant: str, network: NetworkPolicy) -> None:
    """A create's policy, before anything exists: refused where no network can be given, or beyond the cap."""
    if networks is None or provider.network_port is None:
        raise FailedPreconditionError(
            "network policies are not available on this control plane (its sandbox provider cannot give sandboxes "
            "a network); create the session without `network`")
    networks.check(tenant, network)


async def reopen(networks: SessionNetworks | None, provider: SandboxProvider, session: Session) -> str | None:
    """Starts an adopted session's proxy again; why it could not (the session then fails: a network it was
    promised and cannot use would fail its tools obscurely), or None."""
    if session.network is None:
        return None
    try:
        if networks is None:
            raise FailedPreconditionError("this control plane gives no session a network")
        await networks.open(session, await provider.get(session.sandbox_id))
    except ControlPlaneError as exc:
        log.warning("session %s: its network proxy could not be restarted: %s", session.id, exc)
        return f"its network proxy could not be restarted: {exc}"
    return None
