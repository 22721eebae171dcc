"""The sections about a session's life and what outlives its container: `[lifetime]` (idle, maximum, pause and
retention times), `[[templates]]` (images of the operator's own) and `[snapshots]` (where saved workspaces live)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from controlplane.config_base import _Closed


class TemplateConfig(_Closed):
    """A sandbox image of the operator's own, for sessions that name it (docs/templates.md)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    dockerfile: Path | None = None
    """A Dockerfile whose directory is the build context; its first FROM is the sandbox image (`provider.image`,
    or `${SANDBOX_IMAGE}`, a build argument the platform fills), so the agent and the hardening are inherited."""
    image: str | None = None
    """Instead of `dockerfile`: a prebuilt image on the engine that carries the platform's agent."""
    pool: int | None = Field(default=None, ge=0)
    """Ready sandboxes of this template kept warm; unset: 0."""

    @model_validator(mode="after")
    def _one_source(self) -> TemplateConfig:
        if (self.dockerfile is None) == (self.image is None):
            raise ValueError(f"template {self.name!r}: set exactly one of dockerfile and image")
        if self.name == "default":
            raise ValueError('template name "default" is reserved for the sandbox image itself (provider.image)')
        return self


class SnapshotsConfig(_Closed):
    """Where session snapshots are kept (docs/snapshots.md)."""

    path: Path | None = None
    """A directory; unset: `snapshots` in the data dir. Control planes sharing a store give the same (shared)
    directory, so that a snapshot taken through one restores through any."""
    max_per_tenant: int = Field(default=50, ge=0)
    """Most snapshots a tenant may keep (0: none may be taken); the next is RESOURCE_EXHAUSTED. Bytes count
    toward the tenant's `quota.disk_mb` when it has one."""

    max_concurrent_copies: int = Field(default=2, ge=1, le=64)
    """Workspace copies (pauses, snapshots, forks, retained snapshots) this plane makes at once, whichever
    tenants ask; the next waits, tenants let in in turn, and one tenant holds at most all but one of them (so a
    tenant's stalled copies never hold another's back; with 1, that one is shared in turn). Each is spooled to a
    file under the data dir (`spool`), up to `limits.max_archive_expanded_bytes` (twice that while links out of
    the workspace are left out), so this bounds that disk and the plane's time spent copying."""

    def root(self, data_dir: Path) -> Path:
        return self.path if self.path is not None else data_dir / "snapshots"

    @staticmethod
    def spool(data_dir: Path, instance: str) -> Path:
        """Where this plane spools workspace copies: local, and its own (planes may share a data dir)."""
        return data_dir / "spool" / instance


class LifetimeConfig(_Closed):
    idle_timeout_s: float = Field(default=1800.0, gt=0)
    """A session unused this long is deleted."""
    max_lifetime_s: float = Field(default=8 * 3600.0, gt=0)
    """A session is deleted this long after creation, used or not."""
    reap_interval_s: float = Field(default=5.0, gt=0)
    """How often lifetimes are checked."""
    pause_after_idle_s: float = Field(default=0.0, ge=0)
    """A session unused this long is paused instead (its workspace stored, its sandbox removed); 0: never.
    Below idle_timeout_s, or the idle timeout deletes it first."""
    retain_s: float = Field(default=0.0, ge=0)
    """An expired or FAILED session's workspace and state are kept this long as a retained snapshot (and so is
    a session deleted with keep_snapshot); 0: nothing is kept at the end, and keep_snapshot is refused."""
    max_paused_s: float = Field(default=7 * 24 * 3600.0, ge=0)
    """A session PAUSED this long (from when its workspace was stored) ends as expired: its stored workspace
    becomes a retained snapshot when retain_s > 0, and is deleted otherwise; 0: a paused session never expires
    (its storage is held until it is resumed or deleted)."""

    @model_validator(mode="after")
    def _pause_before_delete(self) -> LifetimeConfig:
        if self.pause_after_idle_s and self.pause_after_idle_s >= self.idle_timeout_s:
            raise ValueError(f"lifetime.pause_after_idle_s ({self.pause_after_idle_s:g}) must be below "
                             f"lifetime.idle_timeout_s ({self.idle_timeout_s:g}), or idle sessions are deleted first")
        return self
