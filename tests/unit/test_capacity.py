"""Host admission accounting: reservations summed against the host's capacity, limits bounded by it."""

from __future__ import annotations

import asyncio
import gc
import subprocess
from pathlib import Path

import pytest

from controlplane.config import load_settings
from controlplane.core.sessions.capacity import (
    DiskRule,
    HostCapacity,
    HostLedger,
    MemoryBook,
    Reservation,
    bounded_maximum,
)
from controlplane.core.sessions.models import Resources
from controlplane.errors import ResourceExhaustedError, SandboxError
from controlplane.host_capacity import (
    capacity,
    disk_rule,
    free_disk_mb,
    host_id,
    ledger,
    machine_cpus,
    machine_memory_mb,
)


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


async def test_the_pool_reservation_counts_every_templates_and_runtimes_pool(tmp_path: object) -> None:
    templates = [{"name": "node", "image": "x", "pool": 3}, {"name": "rust", "image": "y"}]
    settings = load_settings(None, data_dir=tmp_path, pool={"size": 2}, templates=templates,
                             host={"cpu": 4, "memory_mb": 4096})
    assert (await ledger(settings).reserved()).slots == 2 + 3  # rust keeps none
    gvisor = load_settings(None, data_dir=tmp_path, pool={"size": 2}, templates=templates,
                           host={"cpu": 4, "memory_mb": 4096},
                           tenants=[{"name": "g", "token": "g" * 32, "runtime": "runsc"}])
    held = await ledger(gvisor).reserved()  # the runc pools and the runsc pools, each of every template
    assert (held.slots, held.memory_mb) == (2 * (2 + 3), 2 * (2 + 3) * gvisor.resources.reserve.memory_mb)
    full = load_settings(None, data_dir=tmp_path, pool={"size": 2}, templates=templates,
                         host={"cpu": 4, "memory_mb": 5 * gvisor.resources.reserve.memory_mb})
    with pytest.raises(ResourceExhaustedError):  # the five pooled sandboxes already hold the host
        async with ledger(full).admitting():
            pass


def test_host_settings_override_the_machine(tmp_path: object) -> None:
    settings = load_settings(None, data_dir=tmp_path, host={"cpu": 1.5, "memory_mb": 300})
    assert capacity(settings) == HostCapacity(1.5, 300)


def test_a_swarm_is_not_bounded_by_the_control_planes_machine(tmp_path: object) -> None:
    settings = load_settings(None, data_dir=tmp_path, provider={"type": "swarm"})
    assert capacity(settings).cpu == float("inf")
    bounded = load_settings(None, data_dir=tmp_path, provider={"type": "swarm"}, host={"cpu": 64, "memory_mb": 1 << 20})
    assert capacity(bounded) == HostCapacity(64, 1 << 20)


def test_planes_on_one_machine_name_the_same_host(tmp_path: Path) -> None:
    local = load_settings(None, data_dir=tmp_path, provider={"type": "local"}, instance="one")
    other = load_settings(None, data_dir=tmp_path / "other", provider={"type": "local"}, instance="two")
    assert host_id(local) == host_id(other)
    assert host_id(local).startswith(("machine:", "hostname:"))
    named = load_settings(None, data_dir=tmp_path, provider={"type": "local"}, host={"id": "rack-3"})
    assert host_id(named) == "rack-3"


@pytest.mark.docker
def test_docker_planes_name_the_host_by_their_engine(tmp_path: Path) -> None:
    engine = subprocess.run(["docker", "info", "--format", "{{.ID}}"], capture_output=True, text=True, check=False)
    if engine.returncode != 0:
        pytest.skip(f"no Docker engine: {engine.stderr.strip()}")
    settings = load_settings(None, data_dir=tmp_path, provider={"type": "docker"})
    assert host_id(settings) == "engine:" + engine.stdout.strip()


def test_the_disk_rule_counts_an_image_only_where_one_is_made(tmp_path: Path) -> None:
    docker = disk_rule(load_settings(None, data_dir=tmp_path, resources={"disk_mb": 2048}))
    assert docker is not None
    assert (docker.image_mb, docker.reserve_mb) == (66, 2048)
    assert abs(docker.free_mb() - free_disk_mb(tmp_path)) < 512  # the same filesystem (others write to it too)
    assert free_disk_mb(tmp_path) > 0
    local = disk_rule(load_settings(None, data_dir=tmp_path, provider={"type": "local"}))
    assert local is not None
    assert local.image_mb == 0
    assert disk_rule(load_settings(None, data_dir=tmp_path, provider={"type": "swarm"})) is None


async def test_a_create_is_refused_when_the_disk_cannot_hold_it() -> None:
    free = [100]
    host = HostLedger(HostCapacity(cpu=1.0, memory_mb=1 << 20), Reservation(cpu=0.001, memory_mb=1),
                      disk=DiskRule(lambda: free[0], reserve_mb=50, image_mb=20))
    async with host.admitting(first_write_bytes=5 << 20):  # 25 of the 50 above the reserve
        with pytest.raises(ResourceExhaustedError) as caught:  # a second in flight would pass the reserve
            async with host.admitting(first_write_bytes=10 << 20):
                pass
    assert str(caught.value) == (
        "the host's disk is full: a new session needs 30 MiB (its workspace image and first write) and the data "
        "dir's filesystem has 100 MiB free, of which host.disk_reserve_mb keeps 50 and creates in flight claim 25"
    )
    async with host.admitting(first_write_bytes=10 << 20) as keep:  # the first is done: counted by use now
        await keep("s1")
    free[0] = 69
    with pytest.raises(ResourceExhaustedError):
        async with host.admitting():
            pass


class _FlakyBook(MemoryBook):
    """A book whose drops fail while `down`, as a store away for a moment."""

    down = False

    async def drop_host_reservation(self, holder: str) -> None:
        if self.down:
            raise OSError("the store is away")
        await super().drop_host_reservation(holder)


async def test_a_session_ended_while_the_store_is_away_is_released_at_the_next_renewal() -> None:
    book = _FlakyBook()
    host = HostLedger(HostCapacity(cpu=1.0, memory_mb=128), Reservation(cpu=0.1, memory_mb=64), book=book,
                      lease_s=1.0)
    await host.start()
    for name in ("s1", "s2"):
        async with host.admitting() as keep:
            await keep(name)
    book.down = True
    await host.release("s1")  # does not raise: the session ends all the same
    assert (await host.reserved()).slots == 2
    book.down = False
    await asyncio.sleep(0.5)  # the heartbeat, every third of the lease
    assert (await host.reserved()).slots == 1
    async with host.admitting() as keep:
        await keep("s3")
    await host.close()


# The Docker library leaves its socket to the garbage collector when its first request fails.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_engine_it_cannot_reach_is_a_clear_error_naming_host_id(tmp_path: Path) -> None:
    settings = load_settings(None, data_dir=tmp_path, provider={"type": "docker",
                                                                 "base_url": f"unix://{tmp_path}/no-engine.sock"})
    with pytest.raises(SandboxError, match=r"^host admission: cannot read the Docker engine's ID .*or set host.id$"):
        host_id(settings)
    gc.collect()  # that socket's warning is this test's, not a later one's
