"""What the proxy, the credential broker and the plane's wiring share: a brokered credential, the record of
one connection, and the per-session byte meter that ends transfers past the session's budget."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from controlplane.errors import ControlPlaneError


class EgressBudgetError(ControlPlaneError):
    """The session's byte budget is spent: the transfer that crossed it is cut off."""


@dataclass(frozen=True)
class Credential:
    """A header the proxy adds to requests for `host` on the way out (`host` or `*.domain`, optionally
    `:port`, as in the allowlists). `value` is a secret: it is never logged, audited or sent to the sandbox."""

    host: str
    header: str
    value: str

    def __repr__(self) -> str:
        return f"Credential(host={self.host!r}, header={self.header!r}, value=<redacted>)"


@dataclass(frozen=True)
class ConnectionRecord:
    """One connection the proxy answered, as the audit record and the span see it."""

    session_id: str
    tenant: str
    host: str
    port: int
    address: str
    """The vetted address connected to ("" when refused before resolving)."""
    decision: str
    """"allowed" or "refused"."""
    reason: str
    """Why it was refused, or "" (the message the client was sent)."""
    bytes_up: int
    bytes_down: int
    intercepted: bool
    """TLS was opened by the proxy to add a brokered credential (never for hosts without one)."""


class ByteMeter:
    """Bytes through one session's proxy, both ways, against an optional budget. Shared by every connection
    of the session, so a budget cannot be spread over many connections."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.up = 0
        self.down = 0

    @property
    def total(self) -> int:
        return self.up + self.down

    def add(self, *, up: int = 0, down: int = 0) -> None:
        """Counts a chunk already read; raises EgressBudgetError once the total passes the budget, before the
        chunk is passed on, so nothing past the budget reaches the other side."""
        self.up += up
        self.down += down
        if self.budget is not None and self.total > self.budget:
            raise EgressBudgetError(
                f"the session's network budget of {self.budget} bytes is spent ({self.total} bytes transferred)"
            )


class Interceptor(Protocol):
    """Opens TLS for a host that has a brokered credential (the credential broker): the proxy hands it a
    client's CONNECT once the destination is vetted and the `200 Connection established` is sent."""

    async def intercept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        session_id: str,
        host: str,
        port: int,
        address: str,
        credential: Credential,
        meter: ByteMeter,
    ) -> None:
        """Terminates the client's TLS with a certificate for `host` from the session's CA, opens TLS to the
        vetted `address` (verifying the server as `host`), adds the credential's header to every request, and
        relays until either side closes, counting bytes in `meter`. Never connects anywhere but `address`."""
        ...

    def session_ca_pem(self, session_id: str) -> bytes:
        """The session's CA certificate (PEM), which the sandbox's tools are told to trust; made on first use."""
        ...

    def forget(self, session_id: str) -> None:
        """Drops the session's CA key once the session ends."""
        ...
