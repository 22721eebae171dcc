"""A workspace the model made unreadable to the tool user (chmod 000) or deeper than PATH_MAX is still copied
whole: a snapshot, a pause and the snapshot kept at delete succeed, and the copy (a restore, a resume) brings back
the 000 file and directory with their content and their mode (only what is past 4096 bytes of name is left out:
no CreateSession archive may hold it). Through the public API on Docker sandboxes."""

from __future__ import annotations

import pytest

from controlplane.client import AsyncClient
from tests.archives import tar_of
from tests.planes import served_plane, tenant_clients

pytestmark = pytest.mark.docker

TENANTS = [{"name": "alpha", "token": "unreadable-alpha"}]
plane = served_plane("docker", tenants=TENANTS, pool={"size": 0}, lifetime={"retain_s": 3600})
clients = tenant_clients(TENANTS)

MODEL = ("mkdir d && echo inside > d/f && chmod 000 d/f d secret.txt && "
         "n=$(printf 'x%.0s' $(seq 1 200)); (for i in $(seq 1 25); do mkdir $n && cd $n; done; echo deep > f)")
DOWN = "n=$(printf 'x%.0s' $(seq 1 200)); for i in $(seq 1 25); do cd $n; done; "
"""Relative cds, one level at a time: the chain's path is longer than PATH_MAX."""
CLOSED = ("stat -c '%a %n' secret.txt d && chmod u+rx d && stat -c '%a %n' d/f && "
          "chmod u+r secret.txt d/f && cat secret.txt d/f && chmod 000 secret.txt d/f d")
"""The modes as the model left them, then the content (the tool user opens its own entries to read them)."""
CLOSED_OUT = "0 secret.txt\n0 d\n0 d/f\nthe secret\ninside\n"


async def _sh(client: AsyncClient, session_id: str, command: str) -> str:
    done = await client.run(session_id, ["bash", "-c", command])
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


async def test_unreadable_entries_come_back_with_their_mode_after_restore_and_resume(
        clients: dict[str, AsyncClient]) -> None:
    alpha = clients["alpha"]
    workspace = tar_of({"work.txt": "the work\n", "secret.txt": "the secret\n"})
    source = (await alpha.create_session(workspace_archive=workspace)).id
    await _sh(alpha, source, MODEL)

    snap = await alpha.snapshot(source)
    assert await _sh(alpha, source, CLOSED) == CLOSED_OUT
    paused = await alpha.pause(source)
    assert paused.id == source
    await alpha.resume(source)
    assert await _sh(alpha, source, "cat work.txt") == "the work\n"
    assert await _sh(alpha, source, CLOSED) == CLOSED_OUT
    kept = await alpha.delete_keeping(source)
    for snapshot_id in (snap.id, kept.id):
        copy = (await alpha.create_session(from_snapshot=snapshot_id)).id
        assert await _sh(alpha, copy, "cat work.txt") == "the work\n"
        # The chain's first 20 levels: deeper names pass 4096 bytes, which no CreateSession archive may hold
        # (the plane's portable copy leaves those out and logs them; the archiver no longer fails on them).
        assert await _sh(alpha, copy, DOWN.replace("seq 1 25", "seq 1 20") + "pwd | wc -c") == f"{11 + 20 * 201}\n"
        # What the tool user had made unreadable is back, as it was left.
        assert await _sh(alpha, copy, CLOSED) == CLOSED_OUT
        assert sorted((await _sh(alpha, copy, "ls -A")).split()) == sorted(["d", "secret.txt", "work.txt", "x" * 200])
        await alpha.delete_session(copy)
        await alpha.delete_snapshot(snapshot_id)


async def test_a_workspace_root_of_mode_000_is_snapshotted_paused_and_kept(clients: dict[str, AsyncClient]) -> None:
    # The model's `chmod 000 /workspace`: before, every copy failed (its helper could not even start in the
    # workspace), so an idle pause failed and the session's end kept nothing.
    alpha = clients["alpha"]
    source = (await alpha.create_session(workspace_archive=tar_of({"work.txt": "the work\n"}))).id
    await _sh(alpha, source, "cd /workspace && mkdir -p sub && echo deeper > sub/g && chmod 000 /workspace")
    snap = await alpha.snapshot(source)
    await alpha.pause(source)
    await alpha.resume(source)
    # A resume's workspace is made anew (its root is the sandbox's), with everything the model wrote below it.
    assert await _sh(alpha, source, "cat /workspace/work.txt /workspace/sub/g") == "the work\ndeeper\n"
    await _sh(alpha, source, "chmod 000 /workspace")
    kept = await alpha.delete_keeping(source)
    for snapshot_id in (snap.id, kept.id):
        copy = (await alpha.create_session(from_snapshot=snapshot_id)).id
        assert await _sh(alpha, copy, "cat /workspace/work.txt /workspace/sub/g") == "the work\ndeeper\n"
        await alpha.delete_session(copy)
        await alpha.delete_snapshot(snapshot_id)
