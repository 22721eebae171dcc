"""Workspace copies spooled to disk: what a pause, a snapshot, a fork or a retained snapshot reads out of a session
is written to a temporary file under the plane's data dir, not gathered in the plane's memory, and at most a few
copies run at once on the plane, tenants let in in turn.

A workspace may expand to `limits.max_archive_expanded_bytes` (1 GiB by default); held in memory, and copied once
more to leave out what no new session could take, a handful of concurrent pauses would take the plane's memory.
On disk, the plane's memory holds a piece at a time; `max_concurrent` bounds the disk the copies take together.

A copy from a sandbox holds its turn only while its sandbox keeps sending while another tenant waits for one
(copy_pace.py): a compromised agent that stalls or trickles gives the turn up within `copy_pace.STALL_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from controlplane.core.sessions import copy_pace
from controlplane.core.sessions.fair_gate import FairGate
from controlplane.errors import CopyLapsedError, ResourceExhaustedError

PIECE = 1 << 20
"""Read and written a piece at a time: what the plane's memory holds of a workspace being copied."""
PIECE_WAIT_S = 120.0
"""The longest a copy waits for its next piece. An agent's archiver streams without a pause; one that sends nothing
(a compromised agent) would otherwise hold the copy, its turn (every tenant's copies wait for one) and the reaper
that runs an idle pause or an ending session's copy, for good."""
FIRST_PIECE_WAIT_S = 30.0
"""The longest a copy waits for its first piece: an honest agent's archiver starts sending within a second or two
(a helper process's start, then the first entry), and a compromised agent that never answers holds a copy turn for
this long, not PIECE_WAIT_S. Both are the bounds of a copy alone: while another tenant waits for a turn, a copy's
sandbox must keep to copy_pace's floor."""

T = TypeVar("T")


async def finished(call: Callable[..., T], *args: object, on_cancel: Callable[[], None] | None = None) -> T:
    """`call(*args)` in a worker thread. A cancel is taken only once the thread is over: a thread cannot be
    stopped, and one left running would go on writing (or create) a spool file its caller has already removed,
    and go on after its caller gave its copy slot back, so that `max_concurrent` would bound nothing.
    `on_cancel` asks the call to end early (it is run at the first cancel)."""
    work = asyncio.ensure_future(asyncio.to_thread(call, *args))
    cancelled = False
    while not work.done():
        try:
            await asyncio.wait({work})
        except asyncio.CancelledError:
            if not cancelled and on_cancel is not None:
                on_cancel()
            cancelled = True
    if cancelled:
        if not work.cancelled():
            work.exception()  # retrieved: what the thread raised is moot once its caller is gone
        raise asyncio.CancelledError
    return work.result()


class CopyTurn:
    """One of the plane's copy turns, held: whether another tenant waits for one (its gate's `pressed`)."""

    def __init__(self, gate: FairGate, tenant: str) -> None:
        self._gate = gate
        self._tenant = tenant

    def pressed(self) -> bool:
        return self._gate.pressed(self._tenant)

    async def until_pressed(self) -> None:
        await self._gate.until_pressed(self._tenant)


class WorkspaceSpool:
    def __init__(self, directory: Path, max_concurrent: int = 2) -> None:
        self.directory = directory
        """This plane's own (its instance's): the files of a plane killed mid-copy are removed at its next start."""
        # One slot is kept from any one tenant (when there are two): a tenant whose copies stall (a compromised
        # agent that never answers a download, given up only after PIECE_WAIT_S) held both slots with two forks,
        # and another tenant's snapshot waited the whole time. A lone tenant's copies then run one at a time.
        self._turns = FairGate(max_concurrent, max(1, max_concurrent - 1))
        self._cleared: asyncio.Future[None] | None = None

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str) -> AsyncIterator[CopyTurn]:
        """One of the plane's `max_concurrent` workspace copies: the others wait, let in by tenant in turn, so that
        one tenant pausing, forking or snapshotting many large sessions does not hold every other tenant's copy
        back; no tenant holds more than `max_concurrent - 1` of them (at least one). A copy from a sandbox passes
        the turn to `fill`, which gives it up when the sandbox sends too slowly while another tenant waits."""
        async with self._turns.slot(tenant):
            yield CopyTurn(self._turns, tenant)

    @contextlib.asynccontextmanager
    async def file(self, what: str) -> AsyncIterator[Path]:
        """A new file's path, removed on every way out (an error, a cancel): nothing is left behind."""
        if self._cleared is None:  # a plane killed mid-copy left its files; the directory is this plane's alone
            self._cleared = asyncio.ensure_future(asyncio.to_thread(shutil.rmtree, self.directory, True))
        await asyncio.shield(self._cleared)  # every copy after the clearing, not beside it
        await asyncio.to_thread(self.directory.mkdir, 0o700, True, True)
        path = self.directory / f"{what}-{secrets.token_hex(8)}.tar"
        try:
            yield path
        finally:
            # Not awaited: a cancelled caller must still have it removed before it goes on.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


async def fill(path: Path, chunks: AsyncIterator[bytes], limit: int, turn: CopyTurn | None = None) -> int:
    """Writes `chunks` into `path` (a new file); more than `limit` bytes is refused. The bytes written.

    With `turn` (a copy from a sandbox, which a compromised agent may stall): while another tenant waits for a copy
    turn, a source that sends less than copy_pace's floor is given up (CopyLapsedError), so that agents stalling in
    as many tenants as there are turns keep no other tenant's copies waiting for more than copy_pace.STALL_S. Left
    out for what the plane reads itself (a stored workspace, a salvaged volume): their pace is the plane's own."""
    out: IO[bytes] = await finished(open, path, "xb")
    size = 0
    pace = copy_pace.Pace()
    try:
        async with contextlib.aclosing(_closable(chunks)) as source, _Pressure(turn) as pressure:
            while True:
                started = time.monotonic()
                try:
                    chunk = await _next_piece(source, size, pace, pressure)
                except StopAsyncIteration:
                    break
                pace.came(time.monotonic() - started, len(chunk))
                size += len(chunk)
                if size > limit:
                    raise ResourceExhaustedError(f"the workspace is larger than the {limit} bytes a copy may hold")
                await finished(out.write, chunk)
    finally:
        await asyncio.shield(asyncio.to_thread(out.close))
    return size


class _Pressure:
    """Whether another tenant waits for a copy turn, and a task that ends once one does (kept across pieces)."""

    def __init__(self, turn: CopyTurn | None) -> None:
        self._turn = turn
        self._watch: asyncio.Future[None] | None = None

    async def __aenter__(self) -> _Pressure:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._watch is not None:
            self._watch.cancel()

    def now(self) -> bool:
        return self._turn is not None and self._turn.pressed()

    def watch(self) -> set[asyncio.Future[None]]:
        """The task to wait on beside the next piece (none without a turn)."""
        if self._turn is None:
            return set()
        if self._watch is None or self._watch.done():
            self._watch = asyncio.ensure_future(self._turn.until_pressed())
        return {self._watch}


async def _next_piece(source: AsyncIterator[bytes], size: int, pace: copy_pace.Pace, pressure: _Pressure) -> bytes:
    wait_s = PIECE_WAIT_S if size else FIRST_PIECE_WAIT_S
    started = time.monotonic()
    piece = asyncio.ensure_future(anext(source))
    try:
        while True:
            waiting = time.monotonic() - started
            pressed = pressure.now()
            if pressed and pace.slack(waiting) <= 0:
                raise CopyLapsedError(
                    f"the sandbox sent {pace.sent(waiting)} bytes of its workspace in the last {copy_pace.STALL_S:g} "
                    f"s while other tenants' copies waited (at least {copy_pace.STALL_BYTES} are needed then): the "
                    "copy is given up")
            if waiting >= wait_s:
                raise CopyLapsedError(f"the sandbox sent nothing of its workspace for {wait_s:g} s: the copy is "
                                      "given up")
            # Alone: until the piece, the wait's end, or another tenant's arrival. Pressed: until the piece, or the
            # moment the copy's pace falls below the floor (looked at again then: the other may have gone).
            timeout = min(wait_s, waiting + pace.slack(waiting)) if pressed else wait_s
            awaited: set[asyncio.Future[Any]] = {piece} if pressed else {piece, *pressure.watch()}
            await asyncio.wait(awaited, timeout=max(0.0, timeout - waiting),
                               return_when=asyncio.FIRST_COMPLETED)
            if piece.done():
                return piece.result()
    finally:
        if not piece.done():  # given up (or cancelled): the source must be idle before it is closed
            piece.cancel()
            await asyncio.wait({piece})
        if piece.done() and not piece.cancelled():
            piece.exception()  # retrieved: what the source raised after it was given up is moot


async def pieces(path: Path) -> AsyncIterator[bytes]:
    """The file's bytes, a piece at a time."""
    source: IO[bytes] = await finished(open, path, "rb")
    try:
        while chunk := await finished(source.read, PIECE):
            yield chunk
    finally:
        source.close()


async def read_whole(path: Path) -> bytes:
    return await finished(path.read_bytes)


async def _closable(chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    # Closes the source (an agent's download stream, a salvage) when the copy stops early, at once rather than
    # whenever the garbage collector gets to it: its own cleanup (a stream, a container) runs then.
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()
