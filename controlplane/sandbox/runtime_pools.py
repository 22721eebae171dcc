"""Which OCI runtime a tenant's sandboxes run on, and a warm pool for each runtime and template in use.

A tenant whose `[[tenants]]` entry says `runtime = "runsc"` gets every session on gVisor; the others get
the provider's runtime (`provider.runtime`, unset: the engine's default). A pooled sandbox is made before
anyone asks for it, so each (runtime, template) has a pool of its own, and a pooled container is adopted back
into the pool of the runtime the engine reports for it and the template its label names. The default
template's pools keep `pool.size`, another template's its own `pool` (sandbox/templates.py); a template's
pools start only once its image is ready.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from controlplane.config import Settings
from controlplane.core.seam.provider import PoolStats, Sandbox
from controlplane.core.sessions.templates import DEFAULT_TEMPLATE
from controlplane.errors import ConfigError
from controlplane.sandbox.pool import WarmPool

DEFAULT = ""
"""The key of the provider's own runtime (whatever `provider.runtime` says, or the engine's default)."""


class RuntimePools:
    def __init__(
        self,
        default_runtime: str | None,
        tenant_runtimes: Mapping[str, str],
        make_pool: Callable[[str | None, str, int], WarmPool],
        template_pools: Mapping[str, int] | None = None,
    ) -> None:
        self._default = default_runtime
        self._tenants = {t: r for t, r in tenant_runtimes.items() if r and r != default_runtime}
        sizes = dict(template_pools or {DEFAULT_TEMPLATE: 0})  # each template's pool size, the default's included
        self._pools: dict[tuple[str, str], WarmPool] = {}
        for runtime in [DEFAULT, *sorted(set(self._tenants.values()))]:
            for template, size in sizes.items():
                self._pools[runtime, template] = make_pool(runtime or default_runtime, template, size)

    def runtime_for(self, tenant: str) -> str | None:
        """The runtime a session of `tenant` runs on (None: the engine's default)."""
        return self._tenants.get(tenant, self._default)

    def pool_for(self, tenant: str, template: str = DEFAULT_TEMPLATE) -> WarmPool:
        return self._pools[self._tenants.get(tenant, DEFAULT), template]

    def pool_of(self, engine_runtime: str, template: str = DEFAULT_TEMPLATE) -> WarmPool | None:
        """The pool a pooled container belongs to, by the runtime the engine reports for it and its template;
        None: none of ours."""
        if engine_runtime != DEFAULT and (engine_runtime, template) in self._pools:
            return self._pools[engine_runtime, template]
        if engine_runtime == (self._default or "runc"):
            return self._pools.get((DEFAULT, template))
        return None

    def adopt(self, sandbox: Sandbox, attrs: Mapping[str, Any], template: str = DEFAULT_TEMPLATE) -> bool:
        """Puts a pooled sandbox found at start back into its runtime's and template's pool (`attrs`: its
        container's inspect data); False when no such pool runs any more."""
        pool = self.pool_of(str((attrs.get("HostConfig") or {}).get("Runtime", "")), template)
        if pool is not None:
            pool.adopt(sandbox)
        return pool is not None

    def start(self, *templates: str) -> None:
        """Starts filling the pools of these templates (their images are ready); none named: the default's."""
        for (_, of), pool in self._pools.items():
            if of in (templates or (DEFAULT_TEMPLATE,)):
                pool.start()

    async def close(self) -> None:
        for pool in self._pools.values():
            await pool.close()

    def stats(self) -> PoolStats:
        """All pools together (each runtime's pool keeps `pool.size` ready)."""
        every = [pool.stats() for pool in self._pools.values()]
        fields = ("ready", "creating", "target", "hits", "misses")
        return PoolStats(*(sum(getattr(stats, f) for stats in every) for f in fields))


def pool_maker(concurrency: int, create: Callable[[str | None, str], Awaitable[Sandbox]],
               discard: Callable[[str], Awaitable[None]],
               check: Callable[[Sandbox], Awaitable[bool]]) -> Callable[[str | None, str, int], WarmPool]:
    """A WarmPool per runtime and template, each creating its sandboxes on that runtime from that template."""
    def make(runtime: str | None, template: str, size: int) -> WarmPool:
        return WarmPool(size, concurrency, lambda: create(runtime, template), discard, check)

    return make


def tenant_runtimes(settings: Settings) -> dict[str, str]:
    """`[[tenants]]` runtimes by tenant name; ConfigError when the provider is not Docker's (a Swarm service
    cannot choose its runtime, the local provider has none): a tenant that asked for gVisor never runs without."""
    runtimes = {t.name: t.runtime for t in settings.tenants if t.runtime}
    if runtimes and settings.provider.type != "docker":
        raise ConfigError(f"tenants {sorted(runtimes)} ask for a runtime; only provider.type = \"docker\" has one")
    return runtimes


def pooled_sandboxes(settings: Settings) -> int:
    """How many warm sandboxes the provider keeps ready, for host admission's pool reservation: each runtime in use
    has a pool of every template, the default's `pool.size` and each other template's own `pool`."""
    default = getattr(settings.provider, "runtime", None)
    runtimes = 1 + len({t.runtime for t in settings.tenants if t.runtime and t.runtime != default})
    return runtimes * (settings.pool.size + sum(t.pool or 0 for t in settings.templates))
