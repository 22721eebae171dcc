"""The sections about sessions that outlive one container: `[[templates]]` (images of the operator's own) and
`[snapshots]` (where saved workspaces live)."""

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

    def root(self, data_dir: Path) -> Path:
        return self.path if self.path is not None else data_dir / "snapshots"
