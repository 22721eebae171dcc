"""The filesystem snapshot storage: what lists is whole, what is stored is what comes back, and a damaged file is
refused before it could be restored."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
import threading
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from controlplane.core.permissions.permission import Rule
from controlplane.core.sessions.models import NetworkPolicy, Resources, Session, SessionState
from controlplane.core.sessions.snapshots import SnapshotState
from controlplane.errors import FailedPreconditionError, InvalidArgumentError
from controlplane.snapshots import fs_store
from controlplane.snapshots.fs_store import STALE_TEMP_S, FsSnapshotStorage

ID = "snap_" + "ab" * 12
OTHER = "snap_" + "cd" * 12


def _state() -> SnapshotState:
    session = Session(
        id="ses_1", tenant="acme", agent="plan", state=SessionState.READY, resources=Resources(0.5, 256, 64),
        created_at=1.0, last_active_at=1.0, labels={"k": "v"}, config_json='{"merged": true}',
        caller_config_json='{"caller": true}', template="node", network=NetworkPolicy(("example.test",), ()),
    )
    return SnapshotState.of(session, [{"content": "x", "status": "pending"}], [Rule("bash", "ls *", "allow")])


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        data = os.urandom(300_000) + b"text " * 50_000
        info = tarfile.TarInfo("dir/file.bin")
        info.size, info.mode = len(data), 0o751
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


async def _chunks(data: bytes, fail_after: int | None = None) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 65536):
        if fail_after is not None and i >= fail_after:
            raise OSError("the agent went away mid-download")
        yield data[i : i + 65536]


async def test_written_snapshot_reads_back_with_its_state(tmp_path: Path) -> None:
    store = FsSnapshotStorage(tmp_path)
    tar = _tar()
    written = await store.write("acme", ID, "ses_1", _state(), _chunks(tar))
    assert written.size_bytes == (tmp_path / "acme" / f"{ID}.tar.gz").stat().st_size < len(tar)
    assert gzip.decompress(await store.read("acme", ID)) == tar
    got = await store.get("acme", ID)
    assert got == written
    assert got is not None
    assert got.state == _state()
    assert got.state.rules() == [Rule("bash", "ls *", "allow")]
    assert got.state.config_json == '{"caller": true}'  # the caller's own: the project's merges in at restore
    assert [s.id for s in await store.list("acme")] == [ID]


async def test_another_tenant_neither_lists_nor_reads_it(tmp_path: Path) -> None:
    store = FsSnapshotStorage(tmp_path)
    await store.write("acme", ID, "ses_1", _state(), _chunks(_tar()))
    assert await store.get("globex", ID) is None
    assert await store.list("globex") == []
    assert not await store.delete("globex", ID)
    with pytest.raises(FailedPreconditionError):
        await store.read("globex", ID)
    assert await store.get("acme", ID) is not None


async def test_a_write_that_fails_midway_leaves_nothing(tmp_path: Path) -> None:
    store = FsSnapshotStorage(tmp_path)
    with pytest.raises(OSError, match="mid-download"):
        await store.write("acme", ID, "ses_1", _state(), _chunks(_tar(), fail_after=200_000))
    assert await store.list("acme") == []
    assert await store.get("acme", ID) is None
    assert list((tmp_path / "acme").iterdir()) == []


async def test_a_crash_before_the_record_leaves_nothing_listed(tmp_path: Path) -> None:
    store = FsSnapshotStorage(tmp_path)
    await store.write("acme", ID, "ses_1", _state(), _chunks(_tar()))
    folder = tmp_path / "acme"
    # What a crash leaves: a workspace written without its record, and temporaries of both kinds.
    (folder / f"{OTHER}.tar.gz").write_bytes(b"half")
    (folder / f".{OTHER}.tar.gz.0000.tmp").write_bytes(b"half")
    (folder / f".{OTHER}.json.0000.tmp").write_bytes(b"{")
    assert [s.id for s in await store.list("acme")] == [ID]
    assert await store.get("acme", OTHER) is None
    old = time.time() - STALE_TEMP_S - 10
    for temp in folder.glob(".*.tmp"):
        os.utime(temp, (old, old))
    await store.write("acme", "snap_" + "ef" * 12, "ses_1", _state(), _chunks(b"x" * 10))
    assert list(folder.glob(".*.tmp")) == []  # stale temporaries are swept by the next write


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
async def test_a_damaged_snapshot_is_refused_naming_the_problem(tmp_path: Path, damage: str) -> None:
    store = FsSnapshotStorage(tmp_path)
    await store.write("acme", ID, "ses_1", _state(), _chunks(_tar()))
    path = tmp_path / "acme" / f"{ID}.tar.gz"
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:-1]))
    else:
        path.unlink()
    with pytest.raises(FailedPreconditionError, match=f"snapshot {ID} is (corrupt|damaged)"):
        await store.read("acme", ID)
    streamed = store.workspace("acme", ID)
    with pytest.raises(FailedPreconditionError, match=f"snapshot {ID} is (corrupt|damaged)"):
        await anext(streamed)  # streamed: refused before its first byte


async def test_a_stored_workspace_streams_back_as_its_tar_in_bounded_pieces(tmp_path: Path) -> None:
    store = FsSnapshotStorage(tmp_path)
    tar = _tar() + bytes(8 << 20)  # zeros compress about a thousandfold: one stored piece inflates to many
    await store.write("acme", ID, "ses_1", _state(), _chunks(tar))
    got = [chunk async for chunk in store.workspace("acme", ID)]
    assert b"".join(got) == tar
    assert max(len(c) for c in got) <= 1 << 20


@pytest.mark.parametrize("bad", ["../acme/" + ID, "snap_../../etc", "", ID + "/x", ID.upper()])
async def test_ids_that_are_not_snapshot_ids_are_refused(tmp_path: Path, bad: str) -> None:
    store = FsSnapshotStorage(tmp_path)
    for call in (store.get("acme", bad), store.read("acme", bad), store.delete("acme", bad)):
        with pytest.raises(InvalidArgumentError, match="is not a snapshot id"):
            await call


async def test_a_tenant_name_cannot_leave_the_root(tmp_path: Path) -> None:
    store = FsSnapshotStorage(tmp_path / "root")
    await store.write("../escape", ID, "ses_1", _state(), _chunks(b"x"))
    assert not (tmp_path / "escape").exists()
    assert [p.parent.parent for p in (tmp_path / "root").rglob("*.json")] == [tmp_path / "root"]


async def test_delete_removes_it(tmp_path: Path) -> None:
    store = FsSnapshotStorage(tmp_path)
    await store.write("acme", ID, "ses_1", _state(), _chunks(_tar()))
    assert await store.delete("acme", ID)
    assert not await store.delete("acme", ID)
    assert await store.list("acme") == []
    assert list((tmp_path / "acme").iterdir()) == []


class _Recorded:
    """A real hash or compressor that notes whether it worked on the event loop's thread."""

    def __init__(self, inner: Any, on_loop: list[bool]) -> None:
        self._inner, self._on_loop = inner, on_loop

    def _note(self, data: bytes) -> None:
        if data:
            self._on_loop.append(threading.get_ident() == LOOP_THREAD[0])

    def update(self, data: bytes) -> None:
        self._note(data)
        self._inner.update(data)

    def compress(self, data: bytes) -> bytes:
        self._note(data)
        return bytes(self._inner.compress(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


LOOP_THREAD = [0]


async def test_hashing_and_compressing_run_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Hundreds of MiB hashed or compressed on the loop stall every other tenant's calls for a quarter second or more.
    on_loop: list[bool] = []
    LOOP_THREAD[0] = threading.get_ident()

    def sha256(data: bytes = b"") -> _Recorded:
        recorded = _Recorded(hashlib.sha256(), on_loop)
        recorded.update(data)
        return recorded

    monkeypatch.setattr(fs_store, "hashlib", SimpleNamespace(sha256=sha256))
    monkeypatch.setattr(fs_store, "zlib", SimpleNamespace(
        compressobj=lambda *a: _Recorded(zlib.compressobj(*a), on_loop), DEFLATED=zlib.DEFLATED,
        decompressobj=zlib.decompressobj))
    storage = FsSnapshotStorage(tmp_path)
    tar = _tar()
    await storage.write("acme", ID, "ses_1", _state(), _chunks(tar))
    assert await storage.read("acme", ID) != b""
    assert b"".join([c async for c in storage.workspace("acme", ID)]) == tar
    assert on_loop
    assert not any(on_loop)
