"""Saved full tool outputs (`tool_…` files in the tool user's data dir), bounded by one budget per sandbox.

Every saved output shares the budget: those the control plane sends (truncated results of any tool,
control-plane tools included) and those the agent writes itself while a loud command runs (`Spool`).
The oldest are removed first to make room; an output larger than the whole budget keeps its first part
and a note. A full filesystem, a quota or a lack of file descriptors makes `OutputNotSavedError`: the caller
then shows the output inline (head and tail) instead, and the session goes on.

Files are written on the tool user's io thread (`ToolRunner.io`): the directory belongs to the tool user,
who could put links in it, so the agent never writes there with its own identity.
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sandbox_agent.errors import AgentError

OUTPUT_NAME = re.compile(r"^tool_[0-9a-f]{12}[0-9A-Za-z]{14}$")
TOOL_OUTPUT_DIR = ".local/share/opencode/tool-output"
BUDGET_SHARE = 4
"""Without a configured budget, saved outputs may take this fraction (1/4) of their filesystem (the /tmp tmpfs):
the rest stays for the commands' own temporary files."""
MIN_BUDGET_BYTES = 1 << 20
RESOURCE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM,
                   errno.EFBIG, errno.EROFS}
"""Errors that say the sandbox ran out of something (space, quota, files, memory), not that the agent is broken."""
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


class OutputNotSavedError(AgentError):
    """The output could not be saved; `str(exc)` says why, in the system's words ("No space left on device")."""


def resource_error(exc: OSError) -> bool:
    return exc.errno in RESOURCE_ERRNOS


def capped_note(saved: int, total: int) -> bytes:
    return (f"\n\n[output capped: only the first {saved} of {total} bytes were saved, the session's saved-output "
            "budget is used up]\n").encode()


class _Names:
    """`tool_` names in the control plane's shape (time-ordered), for outputs the agent saves by itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0

    def new(self) -> str:
        with self._lock:
            now = time.time_ns() // 1_000_000
            if now != self._last_ms:
                self._last_ms, self._counter = now, 0
            self._counter += 1
            encoded = (now * 0x1000 + self._counter) % (1 << 48)
        suffix = "".join(_BASE62[b % 62] for b in os.urandom(14))
        return f"tool_{encoded:012x}{suffix}"


new_name = _Names().new


@dataclass(frozen=True)
class Budget:
    configured: int
    """Bytes all saved outputs may take together; 0: 1/BUDGET_SHARE of their filesystem."""

    def bytes_for(self, directory: str) -> int:
        if self.configured > 0:
            return self.configured
        probe = directory
        while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        try:
            fs = os.statvfs(probe)
        except OSError:
            return MIN_BUDGET_BYTES
        return max(MIN_BUDGET_BYTES, fs.f_blocks * fs.f_frsize // BUDGET_SHARE)


def make_room(directory: str, need: int, budget: int, keep: str = "") -> int:
    """Removes the oldest saved outputs (not `keep`) until `need` more bytes fit the budget; returns the bytes
    left for `keep` (which may be less than `need` when the others are all gone)."""
    entries = []
    used = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return budget
    for name in names:
        if not OUTPUT_NAME.match(name) or name == keep:
            continue
        try:
            info = os.lstat(os.path.join(directory, name))
        except FileNotFoundError:
            continue
        entries.append((info.st_mtime_ns, name, info.st_size))
        used += info.st_size
    entries.sort()
    for _, name, size in entries:
        if used + need <= budget:
            break
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
        used -= size
    return max(0, budget - used)


def _open_new(directory: str, name: str) -> int:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                   0o600)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def save(directory: str, name: str, content: bytes, budget: int) -> str:
    """Writes a new saved output within the budget (capped with a note when larger); its path.

    Runs on the tool user's io thread. Raises OutputNotSavedError (and leaves no partial file) when the
    filesystem refuses it.
    """
    path = os.path.join(directory, name)
    try:
        room = make_room(directory, len(content), budget)
        if len(content) > room:
            note = capped_note(0, len(content))
            keep = max(0, room - len(note) - 64)
            content = content[:keep] + capped_note(keep, len(content))
        fd = _open_new(directory, name)
    except OSError as exc:
        raise _not_saved(exc) from exc
    try:
        _write_all(fd, content)
    except OSError as exc:
        os.close(fd)
        _remove(path)
        raise _not_saved(exc) from exc
    os.close(fd)
    return path


def _not_saved(exc: OSError) -> OutputNotSavedError:
    return OutputNotSavedError(exc.strerror or os.strerror(exc.errno or errno.EIO))


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class Spool:
    """An output saved while it is produced; the agent keeps only its head and tail in memory.

    Not thread-safe: one owner feeds it, from the event loop; each step runs on the tool user's io thread.
    """

    FLUSH_BYTES = 256 * 1024

    def __init__(self, directory: str, budget: int) -> None:
        self.directory = directory
        self.name = new_name()
        self.path = os.path.join(directory, self.name)
        self._budget = budget
        self._fd: int | None = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.written = 0
        self.total = 0
        self.capped = False
        self.error = ""
        """Why the output could not be saved; once set, nothing more is written and the file is gone."""

    def open(self) -> None:
        try:
            make_room(self.directory, 0, self._budget)
            self._fd = _open_new(self.directory, self.name)
        except OSError as exc:
            self.error = _not_saved(exc).args[0]

    def add(self, data: bytes) -> bool:
        """Queues `data`; True when enough is queued that `flush` should run."""
        self.total += len(data)
        if self.error or self.capped:
            return False
        self._pending.append(data)
        self._pending_bytes += len(data)
        return self._pending_bytes >= self.FLUSH_BYTES

    def flush(self) -> None:
        data, self._pending, self._pending_bytes = b"".join(self._pending), [], 0
        if self._fd is None or self.error or not data:
            return
        try:
            room = make_room(self.directory, self.written + len(data), self._budget, keep=self.name) - self.written
            room -= len(capped_note(self.total, self.total)) + 32
            if len(data) > room:
                data = data[: max(0, room)]
                self.capped = True
            _write_all(self._fd, data)
            self.written += len(data)
        except OSError as exc:
            self._fail(exc)

    def close(self) -> None:
        """Flushes and closes; a capped file gets its note. Runs on the io thread."""
        self.flush()
        if self._fd is None:
            return
        try:
            if self.capped:
                _write_all(self._fd, capped_note(self.written, self.total))
        except OSError as exc:
            self._fail(exc)
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _fail(self, exc: OSError) -> None:
        self.error = _not_saved(exc).args[0]
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        _remove(self.path)


@dataclass(frozen=True)
class SpooledText:
    """What is left in memory of an output the agent saved as it came (see `ToolOutput.spooled`)."""

    path: str
    """Where the output was saved; "" when it could not be (`error` says why)."""
    total_bytes: int
    total_lines: int
    tail: str
    error: str = ""
    capped: bool = False


IoFn = Callable[..., Awaitable[Any]]


class OutputDir:
    """The sandbox's saved outputs: where they go, their budget, and the tool user's io thread that writes them."""

    def __init__(self, io: IoFn, directory: str, budget: Budget) -> None:
        self._io = io
        self.directory = directory
        self._budget = budget

    async def save(self, name: str, content: bytes) -> str:
        if not OUTPUT_NAME.match(name):
            raise ValueError(f"{name!r} is not a tool output name")
        path: str = await self._io(self._save, name, content)
        return path

    def _save(self, name: str, content: bytes) -> str:
        return save(self.directory, name, content, self._budget.bytes_for(self.directory))

    async def spool(self) -> Spool:
        spool: Spool = await self._io(self._open_spool)
        return spool

    def _open_spool(self) -> Spool:
        spool = Spool(self.directory, self._budget.bytes_for(self.directory))
        spool.open()
        return spool

    async def flush(self, spool: Spool) -> None:
        await self._io(spool.flush)

    async def close(self, spool: Spool) -> None:
        await self._io(spool.close)
