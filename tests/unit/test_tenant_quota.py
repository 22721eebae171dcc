"""Quota layering and admission (controlplane.core.tenants.quota) and token checks (records), without a plane."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.core.sessions.models import Resources, Session, SessionState
from controlplane.core.tenants.quota import MIB, Quota, QuotaExceededError, TenantQuotas, with_defaults
from controlplane.core.tenants.records import TenantRecord, TokenDirectory, hash_token


def test_layers_override_key_by_key_and_minus_one_lifts() -> None:
    defaults = Quota(sessions=1, disk_mb=100)
    tenant = Quota.from_dict({"sessions": 5, "cpu": 2})
    stored = Quota.from_dict({"cpu": -1, "calls": 3})
    assert stored.over(tenant.over(defaults)).effective() == Quota(sessions=5, disk_mb=100, calls=3)
    assert Quota.from_dict({"cpu": 1}).to_dict() == {"cpu": 1.0}


@pytest.mark.parametrize("bad", [{"session": 1}, {"cpu": "2"}, {"calls": -2}, {"sessions": True}])
def test_malformed_quotas_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="quota"):
        Quota.from_dict(bad)


def _session(sid: str, tenant: str, cpu: float, parent: str = "") -> Session:
    return Session(sid, tenant, "build", SessionState.READY, Resources(cpu, 256, 64), 0.0, 0.0, parent_id=parent)


async def test_children_do_not_count_and_creations_under_way_do() -> None:
    live = {"t": [_session("a", "t", 1.0), _session("b", "t", 1.0, parent="a")]}

    async def sessions(tenant: str) -> list[Session]:
        return live.get(tenant, [])

    quotas = TenantQuotas(sessions, configured={"t": Quota(sessions=2, cpu=2.5)}, disk_mb_per_session=10)
    usage = await quotas.usage("t")
    assert (usage.sessions, usage.cpu, usage.memory_mb, usage.disk_mb) == (1, 1.0, 256, 10)
    async with quotas.creating("t", Resources(1.0, 256, 64)):
        assert (await quotas.usage("t")).sessions == 2
        with pytest.raises(QuotaExceededError, match=r"quota of 2 sessions is used up \(2 live\)"):
            async with quotas.creating("t", Resources(0.1, 256, 64)):
                pass
    with pytest.raises(QuotaExceededError, match=r"quota of 2.5 CPUs would be exceeded: 1 reserved .* and 2 asked"):
        async with quotas.creating("t", Resources(2.0, 256, 64)):
            pass
    assert (await quotas.usage("t")).sessions == 1  # nothing left held by the refusals


def test_call_and_subscription_slots_are_released_once() -> None:
    quotas = TenantQuotas.unlimited()
    quotas.set_stored("t", Quota(calls=1, subscriptions=1))
    slot = quotas.take_call("t")
    with pytest.raises(QuotaExceededError, match="1 concurrent calls is used up"):
        quotas.take_call("t")
    slot.release()
    slot.release()
    assert quotas.running("t").calls == 0
    quotas.take_call("t")
    assert quotas.running("t").calls_started == 2
    quotas.take_subscription("t")
    with pytest.raises(QuotaExceededError, match="1 event subscriptions is used up"):
        quotas.take_subscription("t")
    assert quotas.quota("other") == Quota()


def test_with_defaults_fills_what_the_request_left_at_zero() -> None:
    defaults = Resources(1.0, 1024, 512)
    assert with_defaults(None, defaults) == defaults
    assert with_defaults(Resources(0.5, 0, 0), defaults) == Resources(0.5, 1024, 512)


def test_tokens_are_checked_against_revocation_and_expiry_at_each_lookup() -> None:
    now = [100.0]
    directory = TokenDirectory([
        TenantRecord("a", hash_token("ta")), TenantRecord("b", hash_token("tb"), revoked_at=5.0),
        TenantRecord("c", hash_token("tc"), expires_at=150.0),
    ], clock=lambda: now[0])
    assert directory.check("ta")[0] is not None
    assert directory.check("tb") == (None, "bearer token revoked")
    assert directory.check("tc")[0] is not None
    now[0] = 150.0
    assert directory.check("tc") == (None, "bearer token expired")
    assert directory.check("nope") == (None, "unknown bearer token")
    assert not directory.is_admin("ta")
    directory.set_admin(hash_token("root"))
    assert directory.is_admin("root")
    assert not directory.is_admin("ta")


def test_the_creating_lock_is_per_tenant() -> None:
    async def main() -> None:
        async def none(_: str) -> list[Session]:
            await asyncio.sleep(0.05)
            return []

        quotas = TenantQuotas(none, defaults=Quota(sessions=5))

        async def create(tenant: str) -> None:
            async with quotas.creating(tenant, Resources(1, 64, 16)):
                await asyncio.sleep(0.2)

        started = asyncio.get_running_loop().time()
        await asyncio.gather(create("a"), create("b"))
        assert asyncio.get_running_loop().time() - started < 0.4

    asyncio.run(main())


async def test_a_refused_create_is_held_a_moment_so_a_retry_loop_cannot_spin_and_the_rest_wait_their_turn() -> None:
    from controlplane.core.tenants.quota import MAX_PAUSED, REFUSAL_PAUSE_S
    from controlplane.core.tenants.refusals import REFUSALS_PER_S

    async def none(_: str) -> list[Session]:
        return []

    quotas = TenantQuotas(none, configured={"spinner": Quota(sessions=0)})
    loop = asyncio.get_running_loop()

    async def refused_after() -> float:
        started = loop.time()
        with pytest.raises(QuotaExceededError, match="quota of 0 sessions"):
            async with quotas.creating("spinner", Resources(1.0, 256, 64)):
                pass
        return loop.time() - started

    assert await refused_after() >= REFUSAL_PAUSE_S * 0.9
    # Many at once: MAX_PAUSED are answered after the pause, the rest one by one at the tenant's refusal rate
    # (answered at once, a client with many streams retrying made the plane answer a thousand a second).
    await asyncio.sleep(MAX_PAUSED / REFUSALS_PER_S)  # the first refusal's turn is over
    took = sorted(await asyncio.gather(*(refused_after() for _ in range(MAX_PAUSED + 4))))
    assert sum(t < REFUSAL_PAUSE_S * 1.4 for t in took) == MAX_PAUSED
    assert all(t >= REFUSAL_PAUSE_S * 0.9 for t in took)
    assert took[-1] >= REFUSAL_PAUSE_S + 4 / REFUSALS_PER_S * 0.9
    # Another tenant's admitted create does not wait for the spinner's pauses.
    started = loop.time()
    async with quotas.creating("other", Resources(1.0, 256, 64)):
        pass
    assert loop.time() - started < REFUSAL_PAUSE_S / 2


async def test_a_paused_session_keeps_its_disk_but_not_its_cpu_memory_or_slot() -> None:
    paused = _session("p", "t", 1.0)
    paused.state = SessionState.PAUSED

    async def sessions(tenant: str) -> list[Session]:
        return [_session("a", "t", 1.0), paused]

    async def stored(tenant: str) -> int:  # the paused session's stored workspace, as large as a live one here
        return 10 * MIB

    quotas = TenantQuotas(sessions, configured={"t": Quota(cpu=2, disk_mb=20)}, disk_mb_per_session=10,
                          stored_bytes=stored)
    usage = await quotas.usage("t")
    assert (usage.sessions, usage.cpu, usage.memory_mb, usage.disk_mb) == (1, 1.0, 256, 20)
    with pytest.raises(QuotaExceededError, match=r"quota of 20 MiB of workspace disk would be exceeded"):
        async with quotas.creating("t", Resources(1.0, 256, 64)):
            pass


async def test_a_paused_session_counts_its_stored_bytes_not_a_live_workspace() -> None:
    paused = _session("p", "t", 1.0)
    paused.state = SessionState.PAUSED

    async def sessions(tenant: str) -> list[Session]:
        return [paused]

    async def stored(tenant: str) -> int:
        return MIB + 1  # rounded up to whole MiB in the figure, counted in bytes at admission

    quotas = TenantQuotas(sessions, configured={"t": Quota(disk_mb=12)}, disk_mb_per_session=10, stored_bytes=stored)
    usage = await quotas.usage("t")
    assert (usage.sessions, usage.disk_mb, usage.stored_bytes) == (0, 2, MIB + 1)
    async with quotas.creating("t", Resources(1.0, 256, 64)):  # 10 MiB asked beside 1 MiB stored fits in 12
        pass
    quotas.set_stored("t", Quota(disk_mb=11))
    with pytest.raises(QuotaExceededError, match=r"\(quota.disk_mb\): 0 reserved by live sessions, 1.0 held by stored"):
        async with quotas.creating("t", Resources(1.0, 256, 64)):
            pass
