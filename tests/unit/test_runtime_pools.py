"""A tenant's runtime and a warm pool per runtime (controlplane.sandbox.runtime_pools)."""

from __future__ import annotations

import pytest

from controlplane.config import load_settings
from controlplane.core.seam.provider import PoolStats, Sandbox
from controlplane.errors import ConfigError
from controlplane.sandbox.pool import WarmPool
from controlplane.sandbox.runtime_pools import RuntimePools, tenant_runtimes


def pools(default: str | None, tenants: dict[str, str]) -> tuple[RuntimePools, dict[str | None, WarmPool]]:
    made: dict[str | None, WarmPool] = {}

    async def create() -> Sandbox:
        raise AssertionError("never started here")

    async def discard(sandbox_id: str) -> None:
        return None

    async def check(sandbox: Sandbox) -> bool:
        return True

    def make(runtime: str | None, template: str, size: int) -> WarmPool:
        made[runtime] = WarmPool(2, 1, create, discard, check)
        return made[runtime]

    return RuntimePools(default, tenants, make), made


def template_pools(tenants: dict[str, str]) -> tuple[RuntimePools, dict[tuple[str | None, str], WarmPool]]:
    made: dict[tuple[str | None, str], WarmPool] = {}

    async def create() -> Sandbox:
        raise AssertionError("never started here")

    async def discard(sandbox_id: str) -> None:
        return None

    async def check(sandbox: Sandbox) -> bool:
        return True

    def make(runtime: str | None, template: str, size: int) -> WarmPool:
        made[runtime, template] = WarmPool(size, 1, create, discard, check)
        return made[runtime, template]

    return RuntimePools(None, tenants, make, {"default": 3, "node": 1, "cold": 0}), made


def test_each_template_has_a_pool_per_runtime_sized_by_its_own_pool() -> None:
    runtimes, made = template_pools({"acme": "runsc"})
    assert set(made) == {(r, t) for r in (None, "runsc") for t in ("default", "node", "cold")}
    assert runtimes.pool_for("acme", "node") is made["runsc", "node"]
    assert runtimes.pool_for("anyone", "node") is made[None, "node"]
    assert runtimes.pool_for("anyone") is made[None, "default"]
    assert runtimes.stats().target == 2 * (3 + 1 + 0)


def test_a_pooled_container_goes_back_to_its_templates_pool_only() -> None:
    runtimes, made = template_pools({"acme": "runsc"})
    assert runtimes.pool_of("runc", "node") is made[None, "node"]
    assert runtimes.pool_of("runsc", "node") is made["runsc", "node"]
    assert runtimes.pool_of("runc", "gone") is None  # a template no longer configured: not adopted
    assert runtimes.pool_of("runsc", "gone") is None


def test_each_tenant_gets_its_runtime_and_that_runtimes_pool() -> None:
    runtimes, made = pools(None, {"acme": "runsc", "plain": ""})
    assert set(made) == {None, "runsc"}
    assert runtimes.runtime_for("acme") == "runsc"
    assert runtimes.runtime_for("plain") is None
    assert runtimes.runtime_for("anyone") is None
    assert runtimes.pool_for("acme") is made["runsc"]
    assert runtimes.pool_for("anyone") is made[None]
    assert runtimes.stats() == PoolStats(0, 0, 4, 0, 0)


def test_a_pooled_container_goes_back_to_its_runtimes_pool() -> None:
    runtimes, made = pools(None, {"acme": "runsc"})
    assert runtimes.pool_of("runsc") is made["runsc"]
    assert runtimes.pool_of("runc") is made[None]  # the engine's default, as the engine reports it
    assert runtimes.pool_of("kata") is None  # no tenant uses it any more: not adopted
    runtimes, made = pools("runsc", {"acme": "runsc"})
    assert set(made) == {"runsc"}  # the tenant asks for what every sandbox gets anyway: one pool
    assert runtimes.pool_of("runsc") is made["runsc"]
    assert runtimes.pool_of("runc") is None


def test_only_the_docker_provider_takes_a_tenant_runtime(tmp_path: object) -> None:
    tenants = [{"name": "acme", "token": "t" * 32, "runtime": "runsc"}, {"name": "b", "token": "u" * 32}]
    docker = load_settings(None, data_dir=tmp_path, tenants=tenants)
    assert tenant_runtimes(docker) == {"acme": "runsc"}
    local = load_settings(None, data_dir=tmp_path, tenants=tenants, provider={"type": "local"})
    with pytest.raises(ConfigError, match=r"tenants \['acme'\] ask for a runtime; only provider.type = \"docker\""):
        tenant_runtimes(local)
