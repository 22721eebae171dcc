"""The `bash` tool: asks for what the command touches, runs it in its own process group, streams merged output."""

from __future__ import annotations

import asyncio
import codecs
import errno
import os
import stat
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from opencode_semantics.javascript import js_number
from sandbox_agent.errors import SpawnError
from sandbox_agent.process import Chunk, Execution, Exit
from sandbox_agent.process_tree import cgroup_counter
from sandbox_agent.saved_outputs import OutputDir, Spool, SpooledText
from sandbox_agent.tools.base import ToolContext, ToolError, ToolOutput
from sandbox_agent.tools.bash_scan import Scan, scan
from sandbox_agent.tools.paths import resolve

DEFAULT_TIMEOUT_MS = 120_000
TIMER_SLACK_MS = 100
"""Upstream fires its timeout timer this long after the requested timeout."""
MAX_METADATA_LENGTH = 30_000
METADATA_INTERVAL_S = 0.05
MAX_JS_TIMER_MS = 2**31 - 1
"""A JavaScript timer asked to wait longer than this fires after 1 ms instead, so upstream stops a command whose
timeout is within TIMER_SLACK_MS of it (or beyond) at once; observed from v1.2.27 (tests/oracle, bash_timeout_*)."""


async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    command = args.get("command")
    if not isinstance(command, str):
        raise ToolError("command is required")
    if not command:
        # Upstream hands the command to Node's spawn as the program name, which refuses an empty one.
        raise ToolError("The argument 'file' cannot be empty. Received ''")
    description = str(args.get("description") or "")
    timeout = args.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        raise ToolError("timeout must be a number")
    if timeout is not None and timeout < 0:
        raise ToolError(f"Invalid timeout value: {js_number(timeout)}. Timeout must be a positive number.")
    if timeout is None:
        timeout = ctx.extra.get("default_timeout_ms", DEFAULT_TIMEOUT_MS)
    given_workdir = args.get("workdir") or ctx.directory
    workdir = resolve(ctx, given_workdir)

    prepare = (command, workdir, ctx.directory, ctx.worktree)
    found, shell, refusal = (
        ctx.io_now(_prepare, *prepare) if len(command) <= SCAN_NOW_CHARS else await ctx.io(_prepare, *prepare)
    )
    if found.external_dirs:
        globs = [d.rstrip("/") + "/*" for d in found.external_dirs]
        await ctx.ask("external_directory", globs, globs, {})
    if found.patterns or found.checks or found.unknown:
        # Upstream's patterns and always are what the request shows; the normalised forms of what runs and
        # whether some command is not known are decided with them (bash_normalise).
        await ctx.ask("bash", found.patterns, found.always, {}, found.checks, bool(found.unknown))

    invalid = null_byte_refusal(command, given_workdir)
    if invalid:
        # Node's spawn checks its arguments before anything else, throwing before the initial metadata.
        raise ToolError(invalid)
    initial = {"output": "", "description": description}
    if refusal:
        refusal = await ctx.io(spawn_refusal, workdir, shell)  # the asks may have waited: look again
    if refusal:
        await ctx.metadata(None, initial)
        raise ToolError(refusal)
    oom_before = oom_kills()
    try:
        execution = await ctx.runner.start([shell, "-c", command], cwd=workdir, env=ctx.env, timeout_s=None,
                                           merge_stderr=True)
    except SpawnError as exc:
        await ctx.metadata(None, initial)
        raise ToolError(await ctx.io(spawn_refusal, workdir, shell) or str(exc)) from exc
    # As upstream: spawned first, then the initial metadata.
    await ctx.metadata(None, initial)
    output, done = await _collect(execution, ctx, float(timeout), description)

    notes = []
    if done.timed_out:
        notes.append(f"bash tool terminated command after exceeding timeout {js_number(timeout)} ms")
    if done.aborted:
        notes.append("User aborted the command")
    extra: dict[str, Any] = {}
    oom_after = oom_kills()
    if oom_before is not None and oom_after is not None and oom_after > oom_before:
        notes.append(out_of_memory_note(memory_limit_mib()))
        extra["out_of_memory"] = True
    full = full_filesystems([ctx.directory, "/tmp"])
    if full:
        notes += [f"No space left on device: {path} is full ({size_mib} MiB)" for path, size_mib in full]
        extra["disk_full"] = [path for path, _ in full]
    if notes:
        await output.add("\n\n<bash_metadata>\n" + "\n".join(notes) + "\n</bash_metadata>")
    text, spooled = await output.finish()
    return ToolOutput(
        title=description,
        output=text,
        metadata={"output": cap_output(text), "exit": done.exit_code, "description": description, **extra},
        spooled=spooled,
    )


# -- resource outcomes (a divergence from OpenCode, which reports an OOM kill as any other SIGKILL) -----------

OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
"""The sandbox's memory cgroup (v2, then v1): its `oom_kill` line counts the kernel's OOM kills."""
MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
FULL_BELOW_BYTES = 1 << 20
"""A filesystem with less than this (or 0.1 % of its size) left to unprivileged writers counts as full:
ext4 refuses writes while it still counts a few hundred KiB free (kept for its own metadata)."""


def oom_kills() -> int | None:
    """OOM kills in the sandbox's memory cgroup so far; None where no counter is readable."""
    return cgroup_counter(OOM_COUNTERS, b"oom_kill")


def memory_limit_mib() -> int | None:
    for path in MEMORY_LIMITS:
        try:
            with open(path) as limit:
                raw = limit.read().strip()
        except OSError:
            continue
        # "max" (v2) or a huge page-rounded number (v1) mean no limit.
        return int(raw) >> 20 if raw.isdigit() and int(raw) < 1 << 62 else None
    return None


def out_of_memory_note(limit_mib: int | None) -> str:
    where = f" ({limit_mib} MiB)" if limit_mib is not None else ""
    return f"Out of memory: the kernel killed a process of this session at its memory limit{where}"


def full_filesystems(paths: list[str]) -> list[tuple[str, int]]:
    """(path, size in MiB) of each of `paths` whose filesystem has (next to) no space left."""
    full = []
    seen = set()
    for path in paths:
        try:
            fs = os.statvfs(path)
            device = os.stat(path).st_dev
        except OSError:
            continue
        # The workspace may itself be under /tmp (local runs). By device, not f_fsid: gVisor gives every
        # filesystem the fsid 0, so /tmp was taken for the workspace and its filling went unreported.
        if device in seen:
            continue
        seen.add(device)
        if fs.f_blocks and fs.f_bavail * fs.f_frsize < max(FULL_BELOW_BYTES, fs.f_blocks * fs.f_frsize // 1000):
            full.append((path, fs.f_blocks * fs.f_frsize >> 20))
    return full


LIBUV_ERRORS = {
    errno.ENOENT: ("ENOENT", "no such file or directory"),
    errno.ENOTDIR: ("ENOTDIR", "not a directory"),
    errno.EACCES: ("EACCES", "permission denied"),
    errno.ELOOP: ("ELOOP", "too many symbolic links encountered"),
    errno.ENAMETOOLONG: ("ENAMETOOLONG", "name too long"),
}
"""How Node (libuv) names the errors a spawn's chdir can meet."""


def null_byte_refusal(command: str, workdir: str) -> str | None:
    """The error upstream's spawn gives for a NUL in the command (checked first) or in the working directory,
    which it passes on as given, before resolving it."""
    if "\0" in command:
        return f"The argument 'file' must be a string without null bytes. Received {js_quoted(command)}"
    if "\0" in workdir:
        return ("The property 'options.cwd' must be a string or Uint8Array without null bytes. "
                f"Received {js_quoted(workdir)}")
    return None


def js_quoted(text: str) -> str:
    """A string as the runtime's argument errors show it, observed from v1.2.27: in single quotes, or in double
    quotes with `"` escaped when it holds a single quote; nothing else (backslash, control characters) is escaped."""
    if "'" not in text:
        return f"'{text}'"
    return '"' + text.replace('"', '\\"') + '"'


def spawn_refusal(workdir: str, shell: str) -> str | None:
    """The error Node's spawn gives when it cannot enter `workdir` (upstream's tool fails with its text)."""
    if "\0" in workdir:
        return None  # not a path the system can look up: null_byte_refusal reports it
    try:
        info = os.stat(workdir)
        code = 0 if stat.S_ISDIR(info.st_mode) else errno.ENOTDIR
        if not code and not os.access(workdir, os.X_OK):
            code = errno.EACCES
    except OSError as exc:
        code = exc.errno or errno.ENOENT
    if not code:
        return None
    name, text = LIBUV_ERRORS.get(code, (errno.errorcode.get(code, "UNKNOWN"), os.strerror(code).lower()))
    return f"{name}: {text}, posix_spawn '{shell}'"


SCAN_NOW_CHARS = 4096
"""A command up to this long is scanned on the loop's thread (`ctx.io_now`): parsing it takes well under
a millisecond; a longer script goes to an io thread."""


def _prepare(command: str, cwd: str, directory: str, worktree: str) -> tuple[Scan, str, str | None]:
    """The permission scan, the shell, and why the spawn would fail: one trip to the tool user's thread.

    The refusal is reported after the asks, as Node's spawn fails after them, and checked again then.
    """
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    return scan(command, cwd, directory, worktree), shell, spawn_refusal(cwd, shell)


@dataclass
class _Done:
    exit_code: int | None
    """None when the command was killed by a signal (a stop of ours included), like Node's `exitCode`."""
    timed_out: bool = False
    aborted: bool = False


async def _collect(execution: Execution, ctx: ToolContext, timeout_ms: float,
                   description: str) -> tuple[_Output, _Done]:
    """Runs the command to its exit, stopping it on timeout or abort; returns its output and how it ended.

    Live metadata is throttled to one update per METADATA_INTERVAL_S (upstream sends one per chunk,
    which floods clients on chatty commands); the latest state is always sent before returning.
    """
    output = _Output(ctx.outputs)

    async def send() -> None:
        await ctx.metadata(None, {"output": output.capped(), "description": description})

    throttle = _Throttle(send, METADATA_INTERVAL_S)
    flags = _Done(exit_code=None)

    def on_timeout() -> None:
        flags.timed_out = True
        execution.stop(reason="timeout", timed_out=True)

    async def on_abort() -> None:
        await ctx.abort.wait()
        flags.aborted = True
        execution.stop(reason="aborted")

    if ctx.abort.is_set():
        flags.aborted = True
        execution.stop(reason="aborted")
    delay = timer_delay_ms(timeout_ms) / 1000
    timer = asyncio.get_running_loop().call_later(delay, on_timeout)
    watcher = asyncio.ensure_future(on_abort())
    end: Exit | None = None
    try:
        async for event in execution.events():
            if isinstance(event, Chunk):
                await output.feed(event.data)
                throttle.mark()
            else:
                end = event
        timer.cancel()
        watcher.cancel()
        if await output.close():
            throttle.mark()
        await throttle.finish()
    except BaseException:
        await asyncio.shield(output.discard())
        raise
    finally:
        timer.cancel()
        watcher.cancel()
        throttle.cancel()
        if not execution.finished:
            execution.stop(reason="cancelled")
    if end is None:
        raise ToolError("the command ended without an exit status")
    # A stop that came after the command had already exited killed nothing: it is not reported.
    stopped = end.timed_out or end.aborted
    return output, _Done(
        # A command that handles the SIGTERM and exits on its own keeps its status, as Node's `exitCode` does.
        exit_code=None if end.signal else end.exit_code,
        timed_out=stopped and flags.timed_out,
        aborted=stopped and flags.aborted,
    )


def timer_delay_ms(timeout_ms: float) -> float:
    """When upstream's timeout timer fires: timeout + 100 ms, or 1 ms where a JavaScript timer would overflow."""
    delay = timeout_ms + TIMER_SLACK_MS
    return delay if 1 <= delay <= MAX_JS_TIMER_MS else 1


INLINE_CHARS = 1 << 20
"""Up to this many characters an output stays whole in memory and travels whole to the control plane (which
truncates it as upstream does). Past it the agent saves it as it comes (`Spool`) and keeps only its ends."""
HEAD_CHARS = 128 * 1024
"""The head kept of a longer output: more than the truncation preview (50 KiB, 2000 lines) and the metadata cap
can use, so the model sees exactly what it would see of the whole output."""
TAIL_CHARS = 32 * 1024
"""The tail kept of a longer output, for the inline preview when it could not be saved."""


class _Output:
    """Merged output, decoded incrementally so a character split across chunks survives.

    Bounded: past INLINE_CHARS only HEAD_CHARS + TAIL_CHARS characters stay in memory, whatever the command
    prints; the rest goes to a saved output (itself within the session's budget) or, when that cannot be
    written, nowhere (the result then says so).
    """

    def __init__(self, outputs: OutputDir | None = None) -> None:
        self._outputs = outputs
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._parts: list[str] | None = []
        """The whole output while it is short; None once it is spooled."""
        self._chars = 0
        self._head = ""
        """The first HEAD_CHARS characters (all `capped` and the preview ever need)."""
        self._tail: deque[str] = deque()
        self._tail_chars = 0
        self._bytes = 0
        self._lines = 1
        self._spool: Spool | None = None

    async def feed(self, data: bytes) -> None:
        await self.add(self._decoder.decode(data))

    async def close(self) -> bool:
        """Flushes a truncated trailing character (as U+FFFD); True when that changed the output."""
        return await self.add(self._decoder.decode(b"", final=True))

    async def add(self, text: str) -> bool:
        if not text:
            return False
        if len(self._head) < HEAD_CHARS:
            self._head += text[: HEAD_CHARS - len(self._head)]
        self._keep_tail(text)
        encoded = text.encode("utf-8", "surrogatepass")
        self._bytes += len(encoded)
        self._lines += text.count("\n")
        if self._parts is not None:
            self._parts.append(text)
            self._chars += len(text)
            if self._chars > INLINE_CHARS and self._outputs is not None:
                await self._start_spool()
        elif self._spool is not None and self._spool.add(encoded) and self._outputs is not None:
            await self._outputs.flush(self._spool)
        return True

    def _keep_tail(self, text: str) -> None:
        if len(text) >= TAIL_CHARS:
            self._tail.clear()
            self._tail.append(text[-TAIL_CHARS:])
            self._tail_chars = TAIL_CHARS
            return
        self._tail.append(text)
        self._tail_chars += len(text)
        while self._tail_chars - len(self._tail[0]) >= TAIL_CHARS:
            self._tail_chars -= len(self._tail.popleft())

    async def _start_spool(self) -> None:
        assert self._outputs is not None
        assert self._parts is not None
        parts, self._parts = self._parts, None
        self._spool = await self._outputs.spool()
        for part in parts:
            self._spool.add(part.encode("utf-8", "surrogatepass"))
        await self._outputs.flush(self._spool)

    def capped(self) -> str:
        return cap_output(self._head)

    async def finish(self) -> tuple[str, SpooledText | None]:
        """The output (whole, or its head when spooled) and, when spooled, what is known of the rest."""
        if self._parts is not None:
            return "".join(self._parts), None
        spool = self._spool
        assert spool is not None
        assert self._outputs is not None
        await self._outputs.close(spool)
        tail = "".join(self._tail)[-TAIL_CHARS:]
        return self._head, SpooledText(
            path="" if spool.error else spool.path, total_bytes=self._bytes, total_lines=self._lines, tail=tail,
            error=spool.error, capped=spool.capped,
        )

    async def discard(self) -> None:
        """The call failed: a half-written saved output is closed (and kept: it is the tool user's file)."""
        if self._spool is not None and self._outputs is not None:
            await self._outputs.close(self._spool)


def cap_output(text: str) -> str:
    """The metadata form of an output: at most 30000 UTF-16 code units (JS string length), then "\\n\\n...".

    A surrogate pair cut in half by the limit becomes U+FFFD, as it would once upstream's string is encoded.
    """
    encoded = text[: MAX_METADATA_LENGTH + 1].encode("utf-16-le", "surrogatepass")
    if len(encoded) <= 2 * MAX_METADATA_LENGTH:
        return text
    return encoded[: 2 * MAX_METADATA_LENGTH].decode("utf-16-le", "replace") + "\n\n..."


class _Throttle:
    """Sends the latest state at most once per interval; a burst of updates collapses into one send."""

    def __init__(self, send: Callable[[], Awaitable[None]], interval_s: float) -> None:
        self._send = send
        self._interval_s = interval_s
        self._dirty = asyncio.Event()
        self._sending = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def mark(self) -> None:
        self._dirty.set()
        if self._task is None:
            self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        while True:
            await self._dirty.wait()
            async with self._sending:
                self._dirty.clear()
                await self._send()
            await asyncio.sleep(self._interval_s)

    async def finish(self) -> None:
        """Stops the pump between sends, then sends the latest state if it has not gone out yet."""
        async with self._sending:
            self.cancel()
        if self._task is not None:
            await asyncio.wait([self._task])
            if not self._task.cancelled() and (error := self._task.exception()) is not None:
                raise error
        if self._dirty.is_set():
            self._dirty.clear()
            await self._send()

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
