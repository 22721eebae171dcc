"""Host admission through the public API with two control planes on one host sharing a store (a SQLite file,
then a PostgreSQL database): together they never reserve more than the host's capacity, the last slot goes
to one create of a burst on both planes, and a SIGKILLed plane's reservations stop counting when its lease
runs out. The local provider admits like the Docker one (the same ledger, the host named by `host.id`)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from tests.planes import (
    Plane,
    PlaneProcess,
    new_instance,
    remove_data_dir,
    remove_instance_leftovers,
    running_plane,
    short_tmp,
)

KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
TOKEN = "token-acme"
TENANTS = [{"name": "acme", "token": TOKEN}]
RESERVE_MB = 64
SLOTS = 3
RESOURCES = {"cpu": 0.5, "memory_mb": 128, "reserve": {"cpu": 0.01, "memory_mb": RESERVE_MB}}
FULL = (f"the host is full: {SLOTS} sessions reserve {SLOTS * RESERVE_MB} of its {SLOTS * RESERVE_MB} MiB of memory "
        f"(resources.reserve.memory_mb {RESERVE_MB} each)")


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "postgres":
        yield str(request.getfixturevalue("pg_url"))
        return
    shared = short_tmp()
    yield f"sqlite://{shared / 'shared.db'}"
    shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture
def host() -> dict[str, Any]:
    """A host of its own per test (the store is fresh too): SLOTS sessions' reservations of memory."""
    return {"id": f"test-{secrets.token_hex(4)}", "cpu": 2.0, "memory_mb": SLOTS * RESERVE_MB, "lease_s": 5.0}


@asynccontextmanager
async def plane_on(url: str, host: dict[str, Any]) -> AsyncIterator[Plane]:
    async with running_plane("local", store={"url": url, "pool_size": 4}, pool={"size": 0}, host=host,
                             resources=RESOURCES, tenants=TENANTS) as plane:
        yield plane


async def refused(client: AsyncClient) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.create_session()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return str(info.value.details())


async def test_two_planes_together_never_reserve_more_than_the_host(url: str, host: dict[str, Any]) -> None:
    async with plane_on(url, host) as a, plane_on(url, host) as b:
        first = await a.client.create_session()
        await a.client.create_session()
        await b.client.create_session()
        assert await refused(a.client) == FULL
        assert await refused(b.client) == FULL
        assert len(await a.client.list_sessions()) == SLOTS  # the refused creates left nothing
        await b.client.delete_session(first.id)  # plane a's session, ended through plane b: its slot is free
        await a.client.create_session()
        assert await refused(b.client) == FULL


async def test_a_burst_on_both_planes_gets_the_last_slot_once(url: str, host: dict[str, Any]) -> None:
    async with plane_on(url, host) as a, plane_on(url, host) as b:
        await a.client.create_session()
        await b.client.create_session()
        burst = await asyncio.gather(*(p.client.create_session() for p in [a, b] * 4), return_exceptions=True)
        made = [r for r in burst if not isinstance(r, BaseException)]
        assert len(made) == 1, burst
        for failure in (r for r in burst if isinstance(r, BaseException)):
            assert isinstance(failure, grpc.aio.AioRpcError), failure
            assert failure.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len(await a.client.list_sessions()) == SLOTS


async def test_a_killed_planes_reservations_end_with_its_lease(url: str, host: dict[str, Any]) -> None:
    lease_s = 2.0
    data_dir = short_tmp()
    config = data_dir / "plane.toml"
    config.write_text(_toml({
        "provider": {"type": "local"}, "store": {"url": url}, "pool": {"size": 0}, "tenants": TENANTS,
        "host": host | {"lease_s": lease_s}, "resources": RESOURCES,
    }))
    dying = PlaneProcess(data_dir, new_instance("dying"), pool_size=0)
    dying.env |= {"CONTROLPLANE_CONFIG": str(config), "CONTROLPLANE_PROVIDER__TYPE": "local"}
    try:
        client = AsyncClient(await dying.start(), TOKEN)
        for _ in range(SLOTS):
            await client.create_session()
        await client.close()
        async with plane_on(url, host) as survivor:
            assert await refused(survivor.client) == FULL
            dying.kill()
            killed_at = time.monotonic()
            while not await _created(survivor.client):
                assert time.monotonic() - killed_at < lease_s + 10, "the dead plane's lease never ran out"
                await asyncio.sleep(0.2)
            waited = time.monotonic() - killed_at
            print(f"admitted {waited:.2f} s after the kill (lease {lease_s:g} s)")
            assert waited <= lease_s + 10
            # Its sessions' reservations went with the lease, not just one: the host is the survivor's again.
            for _ in range(SLOTS - 1):
                await survivor.client.create_session()
            assert await refused(survivor.client) == FULL
    finally:
        await dying.stop()
        remove_data_dir(data_dir)


async def _created(client: AsyncClient) -> bool:
    """True if a session was made, False if the host was full (any other error fails the test)."""
    try:
        await client.create_session()
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
        return False
    return True


def _toml(table: dict[str, Any], prefix: str = "") -> str:
    """Just enough TOML for the test's config: tables, arrays of tables, strings and numbers."""
    scalars = [f"{k} = {json.dumps(v)}" for k, v in table.items() if not isinstance(v, (dict, list))]
    out = "\n".join(scalars) + "\n"
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += f"[{name}]\n" + _toml(value, f"{name}.")
        elif isinstance(value, list):
            out += "".join(f"[[{name}]]\n" + _toml(item, f"{name}.") for item in value)
    return out


@pytest.mark.docker
async def test_two_docker_planes_on_one_engine_share_it_by_its_id() -> None:
    """No `host.id`: both planes name the host by the Docker engine's ID, so they share its capacity."""
    shared = short_tmp()
    reserve_mb = 256
    settings: dict[str, Any] = {
        "store": {"url": f"sqlite://{shared / 'shared.db'}"}, "pool": {"size": 0}, "tenants": TENANTS,
        "host": {"cpu": 2.0, "memory_mb": 2 * reserve_mb},
        "resources": {"cpu": 0.5, "memory_mb": 2 * reserve_mb, "reserve": {"cpu": 0.01, "memory_mb": reserve_mb}},
    }
    try:
        async with running_plane("docker", **settings) as a, running_plane("docker", **settings) as b:
            assert a.plane.sessions.host.host == b.plane.sessions.host.host
            assert a.plane.sessions.host.host.startswith("engine:")
            await a.client.create_session()
            await b.client.create_session()
            assert await refused(a.client) == (
                f"the host is full: 2 sessions reserve {2 * reserve_mb} of its {2 * reserve_mb} MiB of memory "
                f"(resources.reserve.memory_mb {reserve_mb} each)"
            )
            assert await refused(b.client) == await refused(a.client)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.docker
async def test_a_restarted_docker_plane_keeps_the_reservations_of_the_sessions_it_adopts() -> None:
    """The same instance stopped and started again: its containers are adopted, and so are their
    reservations (replaced, not added to what the first run left in the store)."""
    data_dir = short_tmp()
    instance = new_instance("adopt")
    reserve_mb = 256
    chosen: dict[str, Any] = {"type": "docker"}
    if os.environ.get("OCSB_TEST_IMAGE"):
        chosen["image"] = os.environ["OCSB_TEST_IMAGE"]
    settings = load_settings(
        None, data_dir=data_dir, instance=instance, provider=chosen, server={"listen": "127.0.0.1:0"},
        pool={"size": 0}, tenants=TENANTS, host={"cpu": 2.0, "memory_mb": 3 * reserve_mb},
        resources={"cpu": 0.5, "memory_mb": 3 * reserve_mb, "reserve": {"cpu": 0.01, "memory_mb": reserve_mb}},
    )
    try:
        plane = await app.start(settings)
        client = AsyncClient(plane.address, TOKEN)
        kept = [await client.create_session(), await client.create_session()]
        await client.close()
        await app.stop(plane)  # its containers stay, to be adopted
        plane = await app.start(settings)
        client = AsyncClient(plane.address, TOKEN)
        try:
            assert set(plane.report.adopted) == {s.sandbox_id for s in kept}
            assert (await plane.sessions.host.reserved()).slots == 2
            await client.create_session()
            assert await refused(client) == (
                f"the host is full: 3 sessions reserve {3 * reserve_mb} of its {3 * reserve_mb} MiB of memory "
                f"(resources.reserve.memory_mb {reserve_mb} each)"
            )
            for session in await client.list_sessions():
                await client.delete_session(session.id)
        finally:
            await client.close()
            await app.stop(plane)
    finally:
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)
