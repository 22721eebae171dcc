"""Tenant records and the check of a bearer token against them.

Tokens are 256-bit random strings, so a single SHA-256 is enough to store them (no password
stretching: nothing to guess); the digests are compared in constant time. A refused token is
refused from the next RPC on: revocation and expiry are checked on every lookup, and every change
made through this control plane replaces the in-memory view at once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from controlplane.core.sessions.models import Tenant
from controlplane.core.tenants.quota import Quota

Origin = Literal["config", "api", "default"]
TOKEN_PREFIX = "ocsb_"
"""Starts every generated token: a URL-safe token may start with "-", which a command line reads as
an option, and the prefix lets secret scanners recognise it."""
ADMIN_TOKEN_PREFIX = "ocsb_admin_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str = TOKEN_PREFIX) -> str:
    return prefix + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class TenantRecord:
    name: str
    token_sha256: str
    created_at: float = 0.0
    origin: Origin = "config"
    expires_at: float | None = None
    revoked_at: float | None = None
    quota: Quota = field(default_factory=Quota)
    """The quota set at run time (SetQuota); the configured layers are not stored."""

    def refusal(self, now: float) -> str | None:
        """Why this record's token is refused now, or None."""
        if self.revoked_at is not None:
            return "bearer token revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "bearer token expired"
        return None


class TokenDirectory:
    """sha256(token) -> record, replaced whole on every change."""

    def __init__(self, records: Iterable[TenantRecord] = (), clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._by_digest: dict[str, TenantRecord] = {}
        self._admin: str = ""
        self.replace(records)

    def replace(self, records: Iterable[TenantRecord]) -> None:
        self._by_digest = {r.token_sha256: r for r in records}

    def set_admin(self, digest: str) -> None:
        self._admin = digest

    def check(self, token: str) -> tuple[Tenant | None, str]:
        """(tenant, "") for a valid token, else (None, why)."""
        digest = hash_token(token)
        found: TenantRecord | None = None
        # Every digest is compared (no early exit), so the time taken says nothing about which matched.
        for known, record in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                found = record
        if found is None:
            return None, "unknown bearer token"
        why = found.refusal(self._clock())
        return (None, why) if why else (Tenant(found.name), "")

    def holder(self, token: str) -> str | None:
        """The tenant `token` was issued to, valid or not (for auditing a refused one), or None."""
        digest = hash_token(token)
        found = None
        for known, record in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                found = record.name
        return found

    def is_admin(self, token: str) -> bool:
        return bool(self._admin) and hmac.compare_digest(self._admin, hash_token(token))
