"""A workspace the model made partly unreadable to the tool user (chmod 000) or deeper than PATH_MAX is still
copied: a snapshot, a pause and the snapshot kept at delete succeed, leaving out only what cannot be read (or,
past 4096 bytes of name, restored), and the copy restores the rest. Through the public API on Docker sandboxes."""

from __future__ import annotations

import pytest

from controlplane.client import AsyncClient
from tests.archives import tar_of
from tests.planes import served_plane, tenant_clients

pytestmark = pytest.mark.docker

TENANTS = [{"name": "alpha", "token": "unreadable-alpha"}]
plane = served_plane("docker", tenants=TENANTS, pool={"size": 0}, lifetime={"retain_s": 3600})
clients = tenant_clients(TENANTS)

MODEL = ("mkdir d && echo x > d/f && chmod 000 d secret.txt && "
         "n=$(printf 'x%.0s' $(seq 1 200)); (for i in $(seq 1 25); do mkdir $n && cd $n; done; echo deep > f)")
DOWN = "n=$(printf 'x%.0s' $(seq 1 200)); for i in $(seq 1 25); do cd $n; done; "
"""Relative cds, one level at a time: the chain's path is longer than PATH_MAX."""


async def _sh(client: AsyncClient, session_id: str, command: str) -> str:
    done = await client.run(session_id, ["bash", "-c", command])
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


async def test_unreadable_entries_are_left_out_and_the_rest_is_kept(clients: dict[str, AsyncClient]) -> None:
    alpha = clients["alpha"]
    source = (await alpha.create_session(workspace_archive=tar_of({"work.txt": "the work\n", "secret.txt": "s"}))).id
    await _sh(alpha, source, MODEL)

    snap = await alpha.snapshot(source)
    paused = await alpha.pause(source)
    assert paused.id == source
    await alpha.resume(source)
    kept = await alpha.delete_keeping(source)
    for snapshot_id in (snap.id, kept.id):
        copy = (await alpha.create_session(from_snapshot=snapshot_id)).id
        assert await _sh(alpha, copy, "cat work.txt") == "the work\n"
        # The chain's first 20 levels: deeper names pass 4096 bytes, which no CreateSession archive may hold
        # (the plane's portable copy leaves those out and logs them; the archiver no longer fails on them).
        assert await _sh(alpha, copy, DOWN.replace("seq 1 25", "seq 1 20") + "pwd | wc -c") == f"{11 + 20 * 201}\n"
        # What the tool user could not read is left out (secret.txt, d/), not the whole copy.
        assert sorted((await _sh(alpha, copy, "ls -A")).split()) == sorted(["work.txt", "x" * 200])
        await alpha.delete_session(copy)
        await alpha.delete_snapshot(snapshot_id)
