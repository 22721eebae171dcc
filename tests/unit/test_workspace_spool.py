"""Workspace copies spooled to disk (controlplane.core.sessions.workspace_spool): bounded in size, removed on every
way out (also a cancel), at most `max_concurrent` at once on a plane, a copy whose sandbox stalls or trickles giving
its turn up while another tenant waits; and a spooled tar made portable from its file, not from memory."""

from __future__ import annotations

import asyncio
import io
import tarfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.core.sessions import copy_pace, workspace_spool
from controlplane.core.sessions.portable_tar import _StoppedError, portable, portable_file
from controlplane.core.sessions.workspace_spool import WorkspaceSpool, fill, finished, pieces
from controlplane.errors import CopyLapsedError, ResourceExhaustedError, SandboxError


async def _chunks(data: bytes, piece: int = 1000, stall_after: int | None = None) -> AsyncIterator[bytes]:
    for offset in range(0, len(data), piece):
        if stall_after is not None and offset >= stall_after:
            await asyncio.Event().wait()  # a download that stops answering
        yield data[offset : offset + piece]


async def _stalling_download(closed: asyncio.Event) -> AsyncIterator[bytes]:
    """3,000 bytes, then nothing more; `closed` is set once the copy has closed it."""
    try:
        async for chunk in _chunks(bytes(10_000), stall_after=3000):
            yield chunk
    finally:
        closed.set()


def _tar(*links: tuple[str, str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        body = b"x" * 5000
        info = tarfile.TarInfo("f.txt")
        info.size, info.mode = len(body), 0o640
        tar.addfile(info, io.BytesIO(body))
        for name, target in links:
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            tar.addfile(link)
    return out.getvalue()


async def test_a_spooled_copy_reads_back_and_its_file_goes_at_the_end(tmp_path: Path) -> None:
    spool = WorkspaceSpool(tmp_path / "spool")
    data = bytes(range(256)) * 40
    async with spool.file("workspace") as path:
        assert await fill(path, _chunks(data), limit=len(data)) == len(data)
        assert b"".join([c async for c in pieces(path)]) == data
    assert list((tmp_path / "spool").iterdir()) == []


async def test_a_copy_over_the_limit_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    spool = WorkspaceSpool(tmp_path / "spool")
    with pytest.raises(ResourceExhaustedError, match="larger than the 4000 bytes"):
        async with spool.file("workspace") as path:
            await fill(path, _chunks(bytes(10_000)), limit=4000)
    assert list((tmp_path / "spool").iterdir()) == []


async def test_a_cancelled_copy_leaves_no_file_and_closes_its_source(tmp_path: Path) -> None:
    spool = WorkspaceSpool(tmp_path / "spool")
    closed = asyncio.Event()
    download = _stalling_download(closed)

    async def copy() -> None:
        async with spool.file("workspace") as path:
            await fill(path, download, limit=1 << 20)

    task = asyncio.ensure_future(copy())
    for _ in range(500):  # until the download stalls, its first pieces written
        await asyncio.sleep(0.01)
        written = list((tmp_path / "spool").glob("*.tar")) if (tmp_path / "spool").is_dir() else []
        if written and written[0].stat().st_size >= 3000:
            break
    assert len(written) == 1  # being written
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed.is_set()
    assert list((tmp_path / "spool").iterdir()) == []


async def test_at_most_max_concurrent_copies_run_at_once_tenants_in_turn(tmp_path: Path) -> None:
    spool = WorkspaceSpool(tmp_path / "spool", max_concurrent=2)
    running, most, order = 0, 0, []

    async def copy(tenant: str) -> None:
        nonlocal running, most
        async with spool.turn(tenant):
            order.append(tenant)
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.05)
            running -= 1

    # Tenant a asks for six copies, then b for one: no tenant holds more than one of the two slots, so b's copy
    # starts at once beside a's first, ahead of a's five waiting ones.
    copies = [asyncio.ensure_future(copy("a")) for _ in range(6)]
    await asyncio.sleep(0)
    copies.append(asyncio.ensure_future(copy("b")))
    await asyncio.gather(*copies)
    assert most == 2
    assert order.index("b") == 1


async def test_a_tenant_whose_copies_stall_leaves_another_tenant_a_slot(tmp_path: Path) -> None:
    """Two forks whose agent never answers held both of the plane's slots for PIECE_WAIT_S (120 s)."""
    spool = WorkspaceSpool(tmp_path / "spool", max_concurrent=2)
    stalled = asyncio.Event()

    async def stall() -> None:
        async with spool.turn("a"):
            await stalled.wait()

    held = [asyncio.ensure_future(stall()) for _ in range(2)]
    await asyncio.sleep(0.01)
    async with asyncio.timeout(1):
        async with spool.turn("b"):
            pass
    stalled.set()
    await asyncio.gather(*held)


async def test_files_left_by_a_killed_plane_are_cleared_at_the_first_copy(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "workspace-dead.tar").write_bytes(b"half a workspace")
    spool = WorkspaceSpool(tmp_path / "spool")
    async with spool.file("workspace") as path:
        assert [p.name for p in (tmp_path / "spool").iterdir()] == []
        assert path.parent == tmp_path / "spool"


def test_a_tar_file_is_made_portable_as_the_bytes_are(tmp_path: Path) -> None:
    clean, linked = tmp_path / "clean.tar", tmp_path / "linked.tar"
    clean.write_bytes(_tar(("in", "f.txt")))
    linked.write_bytes(_tar(("in", "f.txt"), ("out", "/etc/passwd")))
    same = portable_file(clean, tmp_path / "copy1.tar")
    assert (same.path, same.dropped, same.entries) == (clean, [], 2)  # nothing left out: the file as it came
    assert not (tmp_path / "copy1.tar").exists()
    made = portable_file(linked, tmp_path / "copy2.tar")
    expected = portable(linked.read_bytes())
    assert made.path == tmp_path / "copy2.tar"
    assert made.path.read_bytes() == expected.tar
    assert (made.dropped, made.entries) == (expected.dropped, expected.entries) == (
        ['out: is a symlink to "/etc/passwd", an absolute path outside the workspace'], 3)


async def test_copies_started_together_keep_their_files_through_the_first_clearing(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir()
    for i in range(200):  # enough leftovers that the clearing takes a while
        (tmp_path / "spool" / f"workspace-dead{i}.tar").write_bytes(b"x")
    spool = WorkspaceSpool(tmp_path / "spool", max_concurrent=4)

    async def copy(data: bytes) -> bytes:
        async with spool.file("workspace") as path:
            await fill(path, _chunks(data), limit=1 << 20)
            await asyncio.sleep(0.05)
            return b"".join([c async for c in pieces(path)])

    datas = [bytes([i]) * 5000 for i in range(4)]
    assert await asyncio.gather(*(copy(d) for d in datas)) == datas


async def test_a_copy_cancelled_mid_portable_pass_leaves_no_file_and_holds_its_turn_to_the_end(tmp_path: Path) -> None:
    # As snapshotting's `_portable`: a turn, the raw and the portable files, the portable pass in a thread. The pass
    # is slowed so that the cancel lands before it opens its copy (made only when something is left out).
    spool = WorkspaceSpool(tmp_path / "spool", max_concurrent=1)
    started, over = threading.Event(), threading.Event()

    def slow_portable(raw: Path, copy: Path) -> object:
        started.set()
        time.sleep(0.4)
        made = portable_file(raw, copy)
        over.set()
        return made

    async def copy() -> None:
        async with spool.turn("a"), spool.file("workspace") as raw, spool.file("portable") as out:
            await fill(raw, _chunks(_tar(("out", "/etc/passwd"))), limit=1 << 20)
            await finished(slow_portable, raw, out)
            await asyncio.Event().wait()

    task = asyncio.ensure_future(copy())
    assert await asyncio.to_thread(started.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert over.is_set()  # the cancel was taken only once the thread was over
    assert list((tmp_path / "spool").iterdir()) == []
    async with spool.turn("b"):  # and the turn came back
        pass
    await asyncio.sleep(0.6)  # nothing a stray thread could still create
    assert list((tmp_path / "spool").iterdir()) == []


async def test_finished_gives_the_result_and_the_error_of_its_call() -> None:
    assert await finished(sum, [1, 2]) == 3
    with pytest.raises(ZeroDivisionError):
        await finished(divmod, 1, 0)


async def test_a_cancel_stops_the_portable_pass_at_its_next_read(tmp_path: Path) -> None:
    spool = WorkspaceSpool(tmp_path / "spool")
    started, ended = threading.Event(), []

    def slow_portable(raw: Path, copy: Path, stop: threading.Event) -> object:
        started.set()
        time.sleep(0.3)  # the cancel lands here, before the pass reads anything
        try:
            return portable_file(raw, copy, stop)
        except BaseException as exc:
            ended.append(exc)
            raise

    async def copy() -> None:
        async with spool.file("workspace") as raw, spool.file("portable") as out:
            await fill(raw, _chunks(_tar(("out", "/etc/passwd"))), limit=1 << 20)
            stop = threading.Event()
            await finished(slow_portable, raw, out, stop, on_cancel=stop.set)

    task = asyncio.ensure_future(copy())
    assert await asyncio.to_thread(started.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [type(e) for e in ended] == [_StoppedError]
    assert list((tmp_path / "spool").iterdir()) == []


async def test_a_download_that_stops_sending_is_given_up_and_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A compromised agent that never answers a download held the copy, its turn and the reaper for good.
    monkeypatch.setattr(workspace_spool, "PIECE_WAIT_S", 0.3)
    spool = WorkspaceSpool(tmp_path / "spool")
    closed = asyncio.Event()
    download = _stalling_download(closed)

    started = time.monotonic()
    with pytest.raises(SandboxError, match=r"sent nothing of its workspace for 0\.3 s"):
        async with spool.file("workspace") as path:
            await fill(path, download, limit=1 << 20)
    assert time.monotonic() - started < 5
    assert closed.is_set()
    assert list((tmp_path / "spool").iterdir()) == []


async def test_a_download_that_never_begins_is_given_up_sooner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compromised agent that sends nothing at all held a copy turn for the whole wait between pieces (120 s)."""
    monkeypatch.setattr(workspace_spool, "PIECE_WAIT_S", 100.0)
    monkeypatch.setattr(workspace_spool, "FIRST_PIECE_WAIT_S", 0.3)
    closed = asyncio.Event()

    async def silent() -> AsyncIterator[bytes]:
        try:
            await asyncio.Event().wait()
            yield b""
        finally:
            closed.set()

    started = time.monotonic()
    with pytest.raises(SandboxError, match=r"sent nothing of its workspace for 0\.3 s"):
        async with WorkspaceSpool(tmp_path / "spool").file("workspace") as path:
            await fill(path, silent(), limit=1 << 20)
    assert time.monotonic() - started < 5
    assert closed.is_set()


async def _silent(closed: asyncio.Event) -> AsyncIterator[bytes]:
    """A compromised agent's download that never sends a byte; `closed` is set once the copy has closed it."""
    try:
        await asyncio.Event().wait()
        yield b""
    finally:
        closed.set()


async def _trickle(every_s: float, count: int) -> AsyncIterator[bytes]:
    """One byte every `every_s`, `count` of them: slow, but never long without a byte."""
    for _ in range(count):
        await asyncio.sleep(every_s)
        yield b"x"


async def _copy(spool: WorkspaceSpool, tenant: str, download: AsyncIterator[bytes]) -> int:
    """As snapshotting's `_portable`: the turn, the file, and the sandbox's download filled under that turn."""
    async with spool.turn(tenant) as turn, spool.file("workspace") as path:
        return await fill(path, download, limit=1 << 30, turn=turn)


async def test_stalled_copies_holding_every_turn_give_them_up_to_another_tenant_within_stall_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compromised agents in two tenants that never answered a download held both turns for FIRST_PIECE_WAIT_S
    (30 s; a byte and then nothing, PIECE_WAIT_S, 120 s), and every other tenant's copies waited."""
    monkeypatch.setattr(copy_pace, "STALL_S", 0.5)
    spool = WorkspaceSpool(tmp_path / "spool", max_concurrent=2)
    closed = [asyncio.Event(), asyncio.Event()]
    stalled = [asyncio.ensure_future(_copy(spool, tenant, _silent(done)))
               for tenant, done in zip("ac", closed, strict=True)]
    await asyncio.sleep(0.05)  # both hold a turn, their downloads unanswered
    started = time.monotonic()
    async with asyncio.timeout(5):
        assert await _copy(spool, "b", _chunks(bytes(5000))) == 5000
    assert time.monotonic() - started < 0.5 + 0.5
    for copy in stalled:
        with pytest.raises(CopyLapsedError, match=r"sent 0 bytes .* in the last 0\.5 s while other tenants' copies "
                                                  r"waited"):
            await copy
    assert all(done.is_set() for done in closed)
    assert list((tmp_path / "spool").iterdir()) == []


async def test_a_trickling_copy_gives_its_turn_up_only_while_another_tenant_waits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte every 0.1 s (a compromised agent's trickle, under PIECE_WAIT_S each time) held a turn for good."""
    monkeypatch.setattr(copy_pace, "STALL_S", 0.4)
    spool = WorkspaceSpool(tmp_path / "spool", max_concurrent=1)
    # Alone, and with only its own tenant's copy waiting: as slow as it is, it runs to its end (2 s, 5 windows).
    own = asyncio.ensure_future(_copy(spool, "a", _chunks(bytes(100))))
    assert await _copy(spool, "a", _trickle(0.1, 20)) == 20
    assert await own == 100
    # Another tenant waits: given up within a window of its arrival.
    trickling = asyncio.ensure_future(_copy(spool, "a", _trickle(0.1, 40)))
    await asyncio.sleep(0.6)
    started = time.monotonic()
    async with asyncio.timeout(5):
        assert await _copy(spool, "b", _chunks(bytes(5000))) == 5000
    assert time.monotonic() - started < 0.4 + 0.5
    with pytest.raises(CopyLapsedError, match=r"sent [1-9] bytes of its workspace in the last 0\.4 s while"):
        await trickling


async def test_an_honest_copy_that_streams_is_never_given_up_while_others_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor judged a quarter of a MiB a window here: 64 KiB every 10 ms (5 windows' worth at 1.6 MiB each)
    runs to its end with another tenant waiting the whole time, and so does a small one sent at once."""
    monkeypatch.setattr(copy_pace, "STALL_S", 0.2)
    monkeypatch.setattr(copy_pace, "STALL_BYTES", 256 << 10)
    spool = WorkspaceSpool(tmp_path / "spool", max_concurrent=1)

    async def streaming() -> AsyncIterator[bytes]:
        for _ in range(100):
            await asyncio.sleep(0.01)
            yield bytes(64 << 10)

    honest = asyncio.ensure_future(_copy(spool, "a", streaming()))
    await asyncio.sleep(0.01)
    waiting = asyncio.ensure_future(_copy(spool, "b", _chunks(bytes(5000))))
    assert await honest == 100 * (64 << 10)
    assert await waiting == 5000


async def test_the_plane_s_own_slow_writes_are_not_charged_to_the_sandbox(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the time spent waiting on the sandbox counts: a loaded host's disk is the plane's, not the agent's."""
    monkeypatch.setattr(copy_pace, "STALL_S", 0.3)
    monkeypatch.setattr(copy_pace, "STALL_BYTES", 4)
    spool = WorkspaceSpool(tmp_path / "spool", max_concurrent=1)
    real = workspace_spool.finished

    async def slow_writes(call: Any, *args: object, **kwargs: Any) -> Any:
        if getattr(call, "__name__", "") == "write":
            await asyncio.sleep(0.2)  # each write: most of a window
        return await real(call, *args, **kwargs)

    monkeypatch.setattr(workspace_spool, "finished", slow_writes)
    honest = asyncio.ensure_future(_copy(spool, "a", _chunks(bytes(10), piece=1)))  # sent at once, written slowly
    await asyncio.sleep(0.01)
    assert await _copy(spool, "b", _chunks(bytes(10))) == 10
    assert await honest == 10
