"""What the proxy, the credential broker and the plane's wiring share: a brokered credential, the record of
one connection, and the per-session byte meter that ends transfers past the session's budget."""

from __future__ import annotations

from dataclasses import dataclass

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
