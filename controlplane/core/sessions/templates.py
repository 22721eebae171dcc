"""Session templates as sessions see them: which exist, in what state, and which a tenant may use.

How a template's image is built and checked is the provider's business (sandbox/templates.py); here only
the names matter. `default` is the sandbox image itself; every other name is an operator's `[[templates]]`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from controlplane.errors import ControlPlaneError, ErrorCode, FailedPreconditionError, InvalidArgumentError

DEFAULT_TEMPLATE = "default"
SHOWN_NAME_CHARS = 80
"""An unknown name is echoed in the error up to this long: a request may carry megabytes in it, and a status
message travels in trailers of a few KiB."""
TemplateState = Literal["building", "ready", "failed"]


class TemplateDeniedError(ControlPlaneError):
    code = ErrorCode.PERMISSION_DENIED


@dataclass(frozen=True)
class TemplateInfo:
    name: str
    image: str
    """The image sessions of this template run (for a built template `ocsb-template-NAME:HASH`)."""
    state: TemplateState
    error: str = ""
    """Why it failed: the build's or the check's own words."""
    pool_size: int = 0


class TemplateAccess:
    """Which templates each tenant may use (`[[tenants]] templates`; a tenant left out may use all)."""

    def __init__(self, allowed: Mapping[str, Sequence[str] | None] | None = None) -> None:
        self._allowed = {t: frozenset(names) for t, names in (allowed or {}).items() if names is not None}

    def allows(self, tenant: str, name: str) -> bool:
        names = self._allowed.get(tenant)
        return names is None or name in names

    def visible(self, tenant: str, templates: Sequence[TemplateInfo]) -> list[TemplateInfo]:
        return [t for t in templates if self.allows(tenant, t.name)]

    def check(self, tenant: str, asked: str, templates: Sequence[TemplateInfo]) -> str:
        """The template a create of `tenant` runs on (`asked`, or `default` when empty). Refused before anything
        exists: an unknown name lists the ones the tenant may use, a forbidden one is named, a failed one says
        why. A template still building is accepted (the create waits for it)."""
        name = asked or DEFAULT_TEMPLATE
        known = {t.name: t for t in templates}
        usable = sorted(t.name for t in self.visible(tenant, templates))
        if name not in known:
            cut = SHOWN_NAME_CHARS
            shown = repr(name) if len(name) <= cut else f"{name[:cut]!r}... ({len(name)} chars)"
            raise InvalidArgumentError(f"unknown template {shown}; this tenant may use {usable}")
        if not self.allows(tenant, name):
            raise TemplateDeniedError(f"tenant {tenant!r} may not use template {name!r} (it may use {usable})")
        if known[name].state == "failed":
            raise FailedPreconditionError(f"template {name!r} is not usable: {known[name].error}")
        return name
