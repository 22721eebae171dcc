"""Host admission accounting: reservations summed against the host's capacity, limits bounded by it."""

from __future__ import annotations

import pytest

from controlplane.config import load_settings
from controlplane.core.sessions.capacity import HostCapacity, HostLedger, Reservation, bounded_maximum
from controlplane.core.sessions.models import Resources
from controlplane.errors import ResourceExhaustedError
from controlplane.host_capacity import capacity, ledger, machine_cpus, machine_memory_mb


async def test_reservations_never_sum_past_the_capacity() -> None:
    host = HostLedger(HostCapacity(cpu=1.0, memory_mb=256), Reservation(cpu=0.1, memory_mb=64), pooled=1)
    for i in range(3):
        async with host.admitting() as keep:
            await keep(f"s{i}")
    assert (await host.reserved()).slots == 4
    with pytest.raises(ResourceExhaustedError) as caught:
        async with host.admitting():
            pass
    assert str(caught.value) == (
        "the host is full: 4 sessions reserve 256 of its 256 MiB of memory (resources.reserve.memory_mb 64 each)"
    )
    await host.release("s0")
    async with host.admitting():  # a create in flight holds a reservation until it ends
        assert (await host.reserved()).slots == 4
        with pytest.raises(ResourceExhaustedError):
            async with host.admitting():
                pass
    assert (await host.reserved()).slots == 3


async def test_cpu_reservations_are_counted_too() -> None:
    host = HostLedger(HostCapacity(cpu=0.2, memory_mb=1 << 20), Reservation(cpu=0.1, memory_mb=1))
    for i in range(2):
        async with host.admitting() as keep:
            await keep(f"s{i}")
    with pytest.raises(ResourceExhaustedError) as caught:
        async with host.admitting():
            pass
    assert str(caught.value) == (
        "the host is full: 2 sessions reserve 0.2 of its 0.2 CPUs (resources.reserve.cpu 0.1 each)"
    )
    await host.start(["s0", "s1", "adopted"])  # a session that exists already is counted, never refused
    assert (await host.reserved()).slots == 3
    await host.close()


def test_one_session_may_not_ask_for_more_than_the_host_has() -> None:
    assert bounded_maximum(Resources(4.0, 8192, 4096), HostCapacity(2.0, 4000)) == Resources(2.0, 4000, 4096)
    assert bounded_maximum(Resources(1.0, 512, 64), HostCapacity(2.0, 4000)) == Resources(1.0, 512, 64)


async def test_the_defaults_admit_200_idle_sessions_on_this_machine(tmp_path: object) -> None:
    settings = load_settings(None, data_dir=tmp_path)
    host = capacity(settings)
    assert host.cpu == machine_cpus()
    assert host.memory_mb == machine_memory_mb() - 2048
    if host.cpu < 1 or host.memory_mb < 200 * 64 + 2 * 64:
        pytest.skip(f"a machine of {host.cpu} CPUs and {host.memory_mb} MiB is smaller than the target")
    made = ledger(settings)
    for i in range(200):
        async with made.admitting() as keep:
            await keep(f"s{i}")
    assert (await made.reserved()).slots == 200 + settings.pool.size


def test_host_settings_override_the_machine(tmp_path: object) -> None:
    settings = load_settings(None, data_dir=tmp_path, host={"cpu": 1.5, "memory_mb": 300})
    assert capacity(settings) == HostCapacity(1.5, 300)


def test_a_swarm_is_not_bounded_by_the_control_planes_machine(tmp_path: object) -> None:
    settings = load_settings(None, data_dir=tmp_path, provider={"type": "swarm"})
    assert capacity(settings).cpu == float("inf")
    bounded = load_settings(None, data_dir=tmp_path, provider={"type": "swarm"}, host={"cpu": 64, "memory_mb": 1 << 20})
    assert capacity(bounded) == HostCapacity(64, 1 << 20)
