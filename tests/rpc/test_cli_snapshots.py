"""The snapshot commands of the CLI against a running control plane (in-process agents): take, list, restore,
fork, delete."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.planes import Plane
from tests.rpc.test_cli import run_cli


async def test_snapshot_list_restore_fork_and_delete(local_plane: Plane, capsys: pytest.CaptureFixture[str]) -> None:
    client = local_plane.client
    session = await client.create_session(labels={"cli": "snap"})
    await client.write_file(session.id, "kept.txt", b"kept\n")
    assert await asyncio.to_thread(run_cli, local_plane, "session", "snapshot", session.id, "-q") == 0
    snap_id = capsys.readouterr().out.strip()
    assert snap_id.startswith("snap_")
    assert await asyncio.to_thread(run_cli, local_plane, "snapshot", "list", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(s["id"], s["session_id"], s["template"]) for s in listed] == [(snap_id, session.id, "default")]
    assert await asyncio.to_thread(run_cli, local_plane, "snapshot", "list") == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["ID", "SESSION", "SIZE", "CREATED", "TEMPLATE"]
    assert table[1].startswith(f"{snap_id}  {session.id}  ")

    assert await asyncio.to_thread(run_cli, local_plane, "session", "create", "--from-snapshot", snap_id, "-q") == 0
    restored = capsys.readouterr().out.strip()
    assert await client.read_file(restored, "kept.txt") == b"kept\n"
    assert dict((await client.get_session(restored)).labels) == {"cli": "snap"}
    assert await asyncio.to_thread(run_cli, local_plane, "session", "fork", restored, "-q") == 0
    forked = capsys.readouterr().out.strip()
    assert forked not in (restored, session.id)
    assert await client.read_file(forked, "kept.txt") == b"kept\n"

    assert await asyncio.to_thread(run_cli, local_plane, "snapshot", "delete", snap_id, "-q") == 0
    assert capsys.readouterr().out.strip() == snap_id
    assert await asyncio.to_thread(run_cli, local_plane, "snapshot", "delete", snap_id) == 2
    assert "NOT_FOUND" in capsys.readouterr().err
    assert await client.list_snapshots() == []
    for sid in (session.id, restored, forked):
        await client.delete_session(sid)
