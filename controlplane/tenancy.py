"""Tenants at start: the configured quotas, the TOML's tenants reconciled with the store, the admin
token file, and the live token directory the authenticator reads."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from controlplane.config import Settings, SwarmProviderConfig
from controlplane.core.tenants.lifecycle import Declared, TenantAdmin
from controlplane.core.tenants.quota import Quota, TenantQuotas
from controlplane.core.tenants.records import TokenDirectory, hash_token
from controlplane.errors import ConfigError
from controlplane.store.base import Store
from controlplane.telemetry import tenant_metrics

log = logging.getLogger(__name__)


def _quota(values: dict[str, object]) -> Quota:
    try:
        return Quota.from_dict({k: v for k, v in values.items() if v is not None})
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def session_disk_mb(settings: Settings) -> int:
    """The workspace disk one session is given: what a disk quota counts per live session."""
    if isinstance(settings.provider, SwarmProviderConfig):
        return settings.provider.workspace_mb
    return settings.resources.disk_mb


def quotas(settings: Settings, store: Store) -> TenantQuotas:
    async def live(tenant: str) -> list:  # type: ignore[type-arg]
        # One query for what holds quota: every session the tenant ever had would be read on each admission.
        return await store.list_sessions(tenant, live_only=True, with_paused=True)

    return TenantQuotas(
        live, defaults=_quota(settings.quota.model_dump()),
        configured={t.name: _quota(t.quota.model_dump()) for t in settings.tenants},
        disk_mb_per_session=session_disk_mb(settings),
    )


def write_secret(path: Path, secret: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.chmod(path, 0o600)


async def start(settings: Settings, store: Store) -> TenantAdmin:
    """After the configured tenants are in the store (app.bootstrap_tenants): revokes the ones the TOML
    dropped, makes sure an admin token exists, and loads the token directory."""
    admin = TenantAdmin(store, TokenDirectory(), quotas(settings, store))
    declared = [Declared(t.name, t.token_sha256 or hash_token(t.token or "")) for t in settings.tenants]
    await admin.reconcile(declared)
    token = await admin.ensure_admin_token(settings.admin_token_file.exists())
    if token is not None:
        write_secret(settings.admin_token_file, token)
        log.info("wrote a new admin token to %s", settings.admin_token_file)
    await admin.refresh()
    tenant_metrics.watch(admin, lambda owner: owner.usage_seen)
    admin.start_refreshing()
    return admin
