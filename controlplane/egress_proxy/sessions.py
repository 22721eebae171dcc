"""The plane's side of a session's network: one SessionProxy per session given a NetworkPolicy, listening where
the sandbox's provider says its agent reaches it, started before the session is READY (and again when a
restarted plane adopts the session) and closed when its sandbox goes.

The checks at create are here too: a policy's entries must parse, and each must lie within the tenant's cap
(`[[tenants]] egress`); the operator's `[egress]` keeps the last word on addresses, which the proxy applies.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from controlplane.config import Settings
from controlplane.core.seam.provider import Sandbox, SandboxProvider
from controlplane.core.sessions.models import NetworkPolicy, Session
from controlplane.egress import EgressPolicy
from controlplane.egress_proxy.accounting import EgressAccounting
from controlplane.egress_proxy.proxy import SessionProxy
from controlplane.egress_proxy.rules import NetworkRules
from controlplane.egress_proxy.types import ByteMeter, ConnectionRecord, Credential, Interceptor
from controlplane.errors import ControlPlaneError, FailedPreconditionError, InvalidArgumentError

log = logging.getLogger(__name__)


class TenantCap:
    """What one tenant's sessions may ask for, and the credentials the proxy adds for its sessions."""

    def __init__(self, allow_hosts: Sequence[str] = (), allow_cidrs: Sequence[str] = (),
                 credentials: Sequence[Credential] = ()) -> None:
        self.rules = NetworkRules(allow_hosts, allow_cidrs)
        self.credentials = tuple(credentials)


class SessionNetworks:
    """Implements core.sessions.network.SessionNetworks with a SessionProxy per session."""

    def __init__(self, *, provider: SandboxProvider, guard: EgressPolicy, static_hosts: Mapping[str, str],
                 credentials: Sequence[Credential], budget_bytes: int | None, caps: Mapping[str, TenantCap],
                 on_record: Callable[[ConnectionRecord], None], interceptor: Interceptor | None = None,
                 on_closed: Callable[[str], Awaitable[None]] | None = None,
                 spent: Callable[[str], Awaitable[int]] | None = None) -> None:
        self._provider = provider
        self._guard = guard
        self._static_hosts = dict(static_hosts)
        self._credentials = tuple(credentials)
        self._budget = budget_bytes
        self._caps = dict(caps)
        self._on_record = on_record
        self._interceptor = interceptor
        self._on_closed = on_closed
        """Called once a session's proxy is closed for good (its accounting is settled then)."""
        self._spent = spent
        """What a session has already moved (an adopted session's budget goes on from there)."""
        self._proxies: dict[str, SessionProxy] = {}

    def check(self, tenant: str, network: NetworkPolicy) -> None:
        rules = NetworkRules(network.allow_hosts, network.allow_cidrs)  # a malformed entry: InvalidArgumentError
        if rules.empty:
            raise InvalidArgumentError("network policy: give at least one of allow_hosts and allow_cidrs")
        cap = self._caps.get(tenant)
        beyond = rules.first_not_within(cap.rules) if cap is not None else [*network.allow_hosts,
                                                                             *network.allow_cidrs][0]
        if beyond is not None:
            raise InvalidArgumentError(
                f"network policy: {beyond} is beyond what tenant {tenant} may allow (the `egress` cap of its "
                "[[tenants]] entry, set by the operator)")

    async def open(self, session: Session, sandbox: Sandbox) -> None:
        if session.network is None:
            return
        port = self._provider.network_port
        if port is None:
            raise FailedPreconditionError("this sandbox provider cannot give sandboxes a network")
        await self._stop(session.id)  # a proxy left from an earlier open of the same session
        cap = self._caps.get(session.tenant)
        credentials = (*self._credentials, *(cap.credentials if cap else ()))
        meter = ByteMeter(self._budget)
        meter.up = await self._spent(session.id) if self._spent is not None else 0
        proxy = SessionProxy(
            session_id=session.id, tenant=session.tenant,
            rules=NetworkRules(session.network.allow_hosts, session.network.allow_cidrs),
            guard=self._guard, static_hosts=self._static_hosts, meter=meter,
            credentials=credentials, interceptor=self._interceptor, on_record=self._on_record,
        )
        path = Path(self._provider.network_socket(sandbox.id))
        self._proxies[session.id] = proxy
        try:
            try:
                await proxy.start(path)
            except OSError as exc:
                raise FailedPreconditionError(f"the session's network proxy cannot listen on {path}: {exc}") from exc
            # The session CA only when the proxy may open TLS for a credential: otherwise tools trust what they did.
            ca = self._interceptor.session_ca_pem(session.id) if credentials and self._interceptor else b""
            await sandbox.agent.start_network(port, ca)
        except BaseException:
            await self._stop(session.id)
            raise

    async def close(self, session_id: str) -> None:
        if not await self._stop(session_id):
            return
        if self._interceptor is not None:
            self._interceptor.forget(session_id)
        if self._on_closed is not None:
            await self._on_closed(session_id)

    async def close_all(self) -> None:
        """The plane stops; the sessions live on, and their proxies start again when a plane adopts them."""
        for session_id in list(self._proxies):
            await self._stop(session_id)

    async def _stop(self, session_id: str) -> bool:
        proxy = self._proxies.pop(session_id, None)
        if proxy is None:
            return False
        try:
            await proxy.close()
        except (ControlPlaneError, OSError) as exc:
            log.warning("session %s: closing its network proxy: %s", session_id, exc)
        return True

    @property
    def open_sessions(self) -> list[str]:
        return list(self._proxies)


def session_networks(settings: Settings, provider: SandboxProvider, guard: EgressPolicy,
                     accounting: EgressAccounting, interceptor: Interceptor | None = None) -> SessionNetworks:
    """The plane's session networks from its settings: the operator's `[egress]` (guard, static names,
    credentials, budget) and each configured tenant's cap. `interceptor` is the credential broker."""
    caps = {t.name: TenantCap(t.egress.allow_hosts, t.egress.allow_cidrs, t.egress.credential_list())
            for t in settings.tenants}
    return SessionNetworks(
        provider=provider, guard=guard, static_hosts=settings.egress.hosts,
        credentials=settings.egress.credential_list(), budget_bytes=settings.egress.session_budget_bytes, caps=caps,
        on_record=accounting.record, interceptor=interceptor, on_closed=accounting.forget,
        spent=accounting.stored_session_bytes,
    )
