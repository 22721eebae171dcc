"""TokenWatch: an open stream's token is looked up again only when the directory changed or its expiry is
due, and every change reaches every open stream at once."""

from __future__ import annotations

import asyncio

from controlplane.core.tenants.records import TenantRecord, TokenDirectory, hash_token
from controlplane.rpc.token_watch import TokenWatch


class Counting(TokenDirectory):
    """The real directory, counting its lookups."""

    lookups = 0

    def lookup(self, digest: str) -> tuple[object, str, TenantRecord | None]:  # type: ignore[override]
        self.lookups += 1
        return super().lookup(digest)


def _records(revoked: bool = False) -> list[TenantRecord]:
    return [TenantRecord("alpha", hash_token("tok-a"), revoked_at=1.0 if revoked else None),
            TenantRecord("beta", hash_token("tok-b"))]


async def test_an_unchanged_directory_costs_no_lookup_per_message() -> None:
    directory = Counting(_records())
    watch = TokenWatch(directory, "tok-a")
    before = directory.lookups
    assert all(watch.alive() for _ in range(1000))
    directory.replace(_records())  # what a refresh finding nothing new does
    assert watch.alive()
    assert directory.lookups == before
    assert directory.epoch == 1
    watch.close()
    assert directory.listeners == 0


async def test_a_change_ends_the_streams_of_that_token_only() -> None:
    directory = TokenDirectory(_records())
    a, b = TokenWatch(directory, "tok-a"), TokenWatch(directory, "tok-b")
    directory.replace(_records(revoked=True))
    assert a.dead.done()
    assert a.reason == "bearer token revoked"
    assert not a.alive()
    assert b.alive()
    assert directory.listeners == 1  # the dead one stopped listening
    b.close()


async def test_an_expiry_is_a_timer() -> None:
    now = [100.0]
    loop_start = asyncio.get_running_loop().time()
    directory = TokenDirectory(
        [TenantRecord("alpha", hash_token("tok-a"), expires_at=100.2)],
        clock=lambda: now[0] + asyncio.get_running_loop().time() - loop_start,
    )
    watch = TokenWatch(directory, "tok-a")
    assert watch.alive()
    assert await asyncio.wait_for(watch.dead, 2) == "bearer token expired"
