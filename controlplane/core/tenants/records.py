"""Tenant records and the check of a bearer token against them.

Tokens are 256-bit random strings, so a single SHA-256 is enough to store them (no password
stretching: nothing to guess); the digests are compared in constant time. A refused token is
refused from the next RPC on: revocation and expiry are checked on every lookup, and every change
made through this control plane replaces the in-memory view at once. Streams already open listen for
those changes (controlplane.rpc.token_watch): the directory's epoch moves only when a record changed,
so an open stream re-checks its token only then (or at its expiry), not on every message.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from controlplane.core.sessions.models import Tenant
from controlplane.core.tenants.quota import Quota

Origin = Literal["config", "api", "default"]
TOKEN_PREFIX = "ocsb_"
"""Starts every generated token: a URL-safe token may start with "-", which a command line reads as
an option, and the prefix lets secret scanners recognise it."""
ADMIN_TOKEN_PREFIX = "ocsb_admin_"
MAX_TOKEN_BYTES = 4096
"""The longest bearer token accepted (generated ones are 48 bytes; an operator's own TOML tokens must fit):
a longer one is refused as such before it is hashed, and the client library will not send one."""


def token_too_long(token: str) -> str | None:
    """Why `token` is refused for its length alone, or None."""
    size = len(token.encode())
    if size > MAX_TOKEN_BYTES:
        return f"bearer token is {size} bytes, longer than the {MAX_TOKEN_BYTES} bytes a token can be"
    return None


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
    deleting_at: float | None = None
    """Set when DeleteTenant starts; a restart finishes a delete it interrupted (TenantAdmin.finish_deletes)."""

    def refusal(self, now: float) -> str | None:
        """Why this record's token is refused now, or None."""
        if self.revoked_at is not None:  # a delete revokes first: this is what its streams end with
            return "bearer token revoked"
        if self.deleting_at is not None:
            return "tenant deleted"
        if self.expires_at is not None and now >= self.expires_at:
            return "bearer token expired"
        return None


class TokenDirectory:
    """sha256(token) -> record, replaced whole on every change; listeners hear of every change."""

    def __init__(self, records: Iterable[TenantRecord] = (), clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._by_digest: Mapping[str, TenantRecord] = {}
        self._admin: str = ""
        self.epoch = 0
        """Moves on every change of a record, so a holder of an earlier answer knows to ask again."""
        self._listeners: dict[int, Callable[[], None]] = {}
        self._next_listener = 0
        self.replace(records)

    def replace(self, records: Iterable[TenantRecord]) -> None:
        by_digest = {r.token_sha256: r for r in records}
        if by_digest == self._by_digest:
            return  # the periodic refresh finds nothing new most of the time: open streams are left alone
        self._by_digest = by_digest
        self.epoch += 1
        for listener in list(self._listeners.values()):
            listener()

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Calls `listener` after every change; returns what stops it."""
        key = self._next_listener
        self._next_listener += 1
        self._listeners[key] = listener
        return lambda: self._listeners.pop(key, None) and None

    @property
    def listeners(self) -> int:
        return len(self._listeners)

    def set_admin(self, digest: str) -> None:
        self._admin = digest

    def check(self, token: str) -> tuple[Tenant | None, str]:
        """(tenant, "") for a valid token, else (None, why)."""
        too_long = token_too_long(token)
        if too_long:
            return None, too_long
        tenant, why, _ = self.lookup(hash_token(token))
        return tenant, why

    def lookup(self, digest: str) -> tuple[Tenant | None, str, TenantRecord | None]:
        """check() by the token's digest, with the record that decided it."""
        found: TenantRecord | None = None
        # Every digest is compared (no early exit), so the time taken says nothing about which matched.
        for known, record in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                found = record
        if found is None:
            return None, "unknown bearer token", None
        why = found.refusal(self.clock())
        return (None, why, found) if why else (Tenant(found.name), "", found)

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
