"""The driver of a tool host (Bun or Python): one long-lived process per session speaking the
newline-delimited JSON protocol of docs/toolhost, restarted (and re-loaded) after it died or was killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandbox_agent import tool_logs, tracing
from sandbox_agent.custom.files import HostFile, LoadError
from sandbox_agent.process import Chunk, Execution
from sandbox_agent.server_identity import BUN_SERVER, PY_SERVER, ServerIdentityError, verify_server
from sandbox_agent.tools.base import AskFn, MetadataFn, ToolError
from sandbox_agent.tools.runner import ToolRunner

ABORTED = "Tool execution aborted"
ABORT_GRACE_S = 0.5
MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest protocol line (a tool's result with its metadata) the agent takes from a host."""
_LINE_ID = re.compile(rb'\{"id":"([^"]{1,64})"')
"""How long an aborted call may take to end before the host is killed (a busy loop never yields)."""
STDERR_TAIL = 4096

__all__ = ["HostCallError", "HostFile", "HostResult", "HostTool", "Loaded", "ToolHost", "bun_launcher",
           "python_launcher"]
log = logging.getLogger(__name__)
Launch = Callable[[], Awaitable[Execution]]
Message = dict[str, Any]
LogFn = Callable[[tool_logs.LogLine], None]


class HostCallError(ToolError):
    """A request to the host failed; `str(exc)` is the text the model reads."""


@dataclass(frozen=True)
class HostTool:
    id: str
    description: str
    parameters: dict[str, Any]
    origin: str
    source: str  # "CUSTOM" | "PLUGIN"
    init_ms: float


@dataclass(frozen=True)
class Loaded:
    tools: list[HostTool]
    load_errors: list[LoadError]
    hooks: list[str]
    notes: list[LoadError]
    config_json: str = ""
    """The session's opencode.json as the plugins' `config` hooks left it; empty when no plugin has one."""
    logs: tuple[tool_logs.LogLine, ...] = ()
    """What the loaded files printed while they were imported (and their plugins initialised)."""


@dataclass(frozen=True)
class HostResult:
    title: str
    output: str
    metadata: dict[str, Any]
    attachments: list[dict[str, str]]


class _Gone:
    """Put in every waiting queue when the host process ended."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _HostProcess:
    """One running host: serialised writes, and its messages routed to the waiting requests by id."""

    def __init__(self, execution: Execution, name: str) -> None:
        self.execution = execution
        self.name = name
        self.alive = True
        self.gone_reason = ""
        self._queues: dict[str, asyncio.Queue[Message | _Gone]] = {}
        self._abandoned: set[str] = set()
        self.log_streams: set[str] = set()
        """Calls whose `log` messages go to their queue, in order with their other messages; any other
        request's (a load's, a hook's, a call's after its end) are dropped here."""
        self._write_lock = asyncio.Lock()
        self._stderr_tail = b""
        self._reader = asyncio.ensure_future(self._read())

    def open(self, request_id: str) -> asyncio.Queue[Message | _Gone]:
        queue: asyncio.Queue[Message | _Gone] = asyncio.Queue()
        if not self.alive:
            queue.put_nowait(_Gone(self.gone_reason))
        self._queues[request_id] = queue
        return queue

    def close(self, request_id: str) -> None:
        self._queues.pop(request_id, None)

    def abandon(self, request_id: str) -> None:
        """The request no longer counts as running; what it still sends is dropped."""
        self._abandoned.add(request_id)
        self._queues.pop(request_id, None)

    def busy_besides(self, request_id: str) -> bool:
        """Whether any other request (call, hook, load, ping) is waiting for this host."""
        return any(other != request_id and other not in self._abandoned for other in self._queues)

    async def send(self, message: Message) -> None:
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        async with self._write_lock:  # two writers must not interleave halves of their lines
            await self.execution.write_stdin(line)

    async def kill(self, reason: str) -> None:
        """Stops the whole process group and returns once it is gone and reaped."""
        self.alive = False
        self.gone_reason = self.gone_reason or f"the {self.name} tool host was stopped ({reason})"
        self.execution.stop(reason=reason)
        await self.wait_closed()

    async def _read(self) -> None:
        code = -1
        lines = _Lines(self._dispatch, self._too_large)
        try:
            async for item in self.execution.events():
                if not isinstance(item, Chunk):
                    code = item.exit_code
                elif item.stream == "stderr":
                    self._on_stderr(item.data)
                else:
                    lines.feed(item.data)
        finally:
            self.alive = False
            tail = self._stderr_tail.decode(errors="replace").strip().splitlines()
            last = f": {tail[-1]}" if tail else ""
            self.gone_reason = self.gone_reason or f"the {self.name} tool host exited (code {code}){last}"
            for queue in self._queues.values():
                queue.put_nowait(_Gone(self.gone_reason))

    def _on_stderr(self, data: bytes) -> None:
        self._stderr_tail = (self._stderr_tail + data)[-STDERR_TAIL:]
        for line in data.decode(errors="replace").splitlines():
            log.info("%s tool host: %s", self.name, line)

    def _dispatch(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
            request_id = str(message["id"])
        except (ValueError, KeyError, TypeError):
            log.warning("%s tool host wrote a line outside the protocol: %r", self.name, line[:200])
            return
        queue = self._queues.get(request_id)
        if message.get("type") == "log":
            if queue is not None and request_id in self.log_streams:
                queue.put_nowait(message)
            return
        if queue is not None:
            queue.put_nowait(message)
        elif request_id in self._abandoned and message.get("type") in ("result", "error"):
            self._abandoned.discard(request_id)  # the abandoned call ended after all; its answer is dropped

    def _too_large(self, request_id: str | None, size: int) -> None:
        log.warning("%s tool host wrote a %d-byte line; dropped", self.name, size)
        queue = self._queues.get(request_id) if request_id is not None else None
        if queue is not None:
            queue.put_nowait({"id": request_id, "type": "error", "message": (
                f"The tool's result is {size} bytes, over the {MAX_LINE_BYTES // (1024 * 1024)} MiB a tool host may "
                "send: write a large result to a file and return its path")})

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class _Lines:
    """Splits a host's stdout into protocol lines in linear time, holding at most MAX_LINE_BYTES of one line:
    a longer line (a tool's huge result) is dropped as it arrives and reported by the id it starts with, so
    no tool's output can take the agent's memory (the hosts write `{"id":"N",...` first)."""

    def __init__(self, on_line: Callable[[bytes], None], on_too_large: Callable[[str | None, int], None]) -> None:
        self._on_line = on_line
        self._on_too_large = on_too_large
        self._buffer = bytearray()
        self._dropping: str | None = None
        self._dropped = -1

    def feed(self, data: bytes) -> None:
        start = 0
        while True:
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end]
            if self._dropped >= 0:
                self._dropped += len(piece)
            else:
                self._buffer += piece
                if len(self._buffer) > MAX_LINE_BYTES:
                    found = _LINE_ID.match(self._buffer)
                    self._dropping = found.group(1).decode() if found else None
                    self._dropped = len(self._buffer)
                    self._buffer = bytearray()
            if end < 0:
                return
            if self._dropped >= 0:
                self._on_too_large(self._dropping, self._dropped)
                self._dropping, self._dropped = None, -1
            else:
                self._on_line(bytes(self._buffer))
            self._buffer = bytearray()
            start = end + 1


class ToolHost:
    """Talks to one host process; concurrent requests share it, multiplexed by request id."""

    def __init__(self, launch: Launch, name: str) -> None:
        self._launch = launch
        self.name = name
        self._process: _HostProcess | None = None
        self._start_lock = asyncio.Lock()
        self._last_load: Message | None = None
        self._ids = itertools.count(1)
        self._background: set[asyncio.Task[bool]] = set()
        self._stopping: set[str] = set()
        self.restarts = 0
        """How many times a dead or killed host was started again."""

    # -- public requests ------------------------------------------------------------------------

    async def load(self, files: list[HostFile], directory: str, worktree: str,
                   config: Mapping[str, Any] | None = None) -> Loaded:
        body: Message = {
            "type": "load", "files": [{"path": f.path, "kind": f.kind} for f in files],
            "directory": directory, "worktree": worktree, "config": dict(config or {}),
        }
        process = await self._running()
        self._last_load = body
        return _loaded(await self._exchange(process, body))

    async def start(self) -> None:
        """Starts the host process now (if it is not running), so that a later request does not wait for it."""
        await self._running()

    async def call(
        self, tool: str, args: dict[str, Any], context: dict[str, Any], *, on_metadata: MetadataFn, on_ask: AskFn,
        abort: asyncio.Event, timeout_s: float | None, on_log: LogFn | None = None,
    ) -> HostResult:
        """Runs one call; raises HostCallError with the tool's error, or on abort, timeout or host death.
        `on_log` gets the call's console lines, each before the call's result or error."""
        process = await self._running()
        request_id = self._next_id()
        queue = process.open(request_id)
        if on_log is not None:
            process.log_streams.add(request_id)
        asks: set[asyncio.Task[None]] = set()
        try:
            await process.send(_traced({"id": request_id, "type": "call", "tool": tool, "args": args,
                                        "context": context}))
            deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
            while True:
                message = await _next(queue, abort, deadline)
                if message is None:
                    timed_out = not abort.is_set()
                    text = _timeout_text(timeout_s) if timed_out else ABORTED
                    restarted = await self._stop_call(process, request_id, queue, "timeout" if timed_out else "aborted")
                    raise HostCallError(text + (self._restarted_note() if restarted else ""))
                if isinstance(message, _Gone):
                    raise HostCallError(message.reason)
                kind = message.get("type")
                if kind == "log":
                    if on_log is not None:
                        on_log(tool_logs.line_from(message))
                elif kind == "metadata":
                    await on_metadata(message.get("title"), message.get("metadata"))
                elif kind == "ask":
                    task = asyncio.ensure_future(self._answer(process, message, on_ask))
                    asks.add(task)
                    task.add_done_callback(asks.discard)
                elif kind == "result":
                    tracing.adopt_host_spans(message, self.name)
                    return HostResult(
                        title=str(message.get("title", "")), output=str(message.get("output", "")),
                        metadata=dict(message.get("metadata") or {}),
                        attachments=list(message.get("attachments") or []),
                    )
                elif kind == "error":
                    tracing.adopt_host_spans(message, self.name)
                    raise HostCallError(str(message.get("message", "")))
        except asyncio.CancelledError:
            # The caller gave up on the call: it must not keep running in the host unseen.
            self._stopping.add(request_id)  # keeps the call's queue routed until the stop has run
            stopping = asyncio.ensure_future(self._stop_call(process, request_id, queue, "cancelled"))
            self._background.add(stopping)
            stopping.add_done_callback(self._background.discard)
            raise
        finally:
            process.log_streams.discard(request_id)
            if request_id not in self._stopping:
                process.close(request_id)
            for task in asks:
                task.cancel()

    async def hook(self, name: str, input: dict[str, Any], output: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Runs the plugins' `name` hooks; their (mutated) output, or HostCallError when one failed."""
        process = await self._running()
        body: Message = {"type": "hook", "name": name, "input": input, "output": output}
        try:
            reply = await asyncio.wait_for(self._exchange(process, body), timeout_s)
        except TimeoutError:
            # A hook stuck in a busy loop blocks every other request too: start afresh.
            await process.kill("hook timeout")
            raise HostCallError(f"Plugin hook {name} timed out after {timeout_s:g} s") from None
        result: dict[str, Any] = reply.get("output") or {}
        return result

    async def ping(self) -> None:
        await self._exchange(await self._running(), {"type": "ping"})

    async def close(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.execution.close_stdin()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(process.wait_closed()), ABORT_GRACE_S)
        if process.alive:
            await process.kill("closed")
        await process.wait_closed()

    # -- internals ------------------------------------------------------------------------------

    def _next_id(self) -> str:
        return str(next(self._ids))

    async def _running(self) -> _HostProcess:
        async with self._start_lock:
            process = self._process
            if process is not None and process.alive:
                return process
            if process is not None:
                await process.wait_closed()
                self.restarts += 1
            with tracing.child(f"toolhost.start {self.name}", {"sandbox.restart": self.restarts > 0}):
                process = _HostProcess(await self._launch(), self.name)
            self._process = process
            if self._last_load is not None:
                # What the model saw listed must still be callable after a restart.
                await self._exchange(process, self._last_load)
            return process

    async def _exchange(self, process: _HostProcess, body: Message) -> Message:
        request_id = self._next_id()
        queue = process.open(request_id)
        try:
            await process.send(_traced({"id": request_id, **body}))
            message = await queue.get()
        finally:
            process.close(request_id)
        if not isinstance(message, _Gone):
            tracing.adopt_host_spans(message, self.name)
        if isinstance(message, _Gone):
            raise HostCallError(message.reason)
        if message.get("type") == "error":
            raise HostCallError(str(message.get("message", "")))
        return message

    async def _answer(self, process: _HostProcess, ask: Message, on_ask: AskFn) -> None:
        allowed, text = True, ""
        try:
            await on_ask(str(ask.get("permission", "")), list(ask.get("patterns") or []),
                         list(ask.get("always") or []), dict(ask.get("metadata") or {}))
        except Exception as exc:  # any refusal, whatever its type, is a denial the tool must see
            allowed, text = False, str(exc)
        if process.alive:
            await process.send({"type": "ask_reply", "ask_id": ask.get("ask_id"), "allowed": allowed, "message": text})

    def _restarted_note(self) -> str:
        return (f" (the tool did not stop within {ABORT_GRACE_S:g} s and nothing else was running in the "
                f"{self.name} tool host, so the host was restarted: its tools' module state was reset)")

    async def _stop_call(self, process: _HostProcess, request_id: str, queue: asyncio.Queue[Message | _Gone],
                         reason: str) -> bool:
        """Ends the call for its caller; True when that took a restart of the host.

        The host is asked to abort the call. While other requests run in the same host, the call is
        abandoned at once (whatever it answers later is dropped): killing the host would fail those
        requests and lose every tool's module state for one tool that ignores `ctx.abort`. Only a host
        that serves nothing else is killed, when the call has not ended within the grace (a busy loop
        never yields, and would otherwise keep the host's event loop for itself).
        """
        self._stopping.add(request_id)
        try:
            if process.alive:
                await process.send({"id": self._next_id(), "type": "abort", "call": request_id, "reason": reason})
            if process.busy_besides(request_id):
                process.abandon(request_id)
                return False
            return await self._wait_or_kill(process, request_id, queue, reason)
        finally:
            self._stopping.discard(request_id)
            process.close(request_id)

    async def _wait_or_kill(self, process: _HostProcess, request_id: str, queue: asyncio.Queue[Message | _Gone],
                            reason: str) -> bool:
        deadline = asyncio.get_running_loop().time() + ABORT_GRACE_S
        while process.alive:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                message = await asyncio.wait_for(queue.get(), max(remaining, 0))
            except TimeoutError:
                if process.busy_besides(request_id):
                    # Another request started meanwhile: it must not pay for this call.
                    process.abandon(request_id)
                    return False
                await process.kill(f"call {reason}, not ended within {ABORT_GRACE_S} s")
                return True
            if isinstance(message, _Gone) or message.get("type") in ("result", "error"):
                return False
        return False


async def _next(queue: asyncio.Queue[Message | _Gone], abort: asyncio.Event,
                deadline: float | None) -> Message | _Gone | None:
    """The next message for a call; None when the call was aborted or its time ran out."""
    if abort.is_set():
        return None
    timeout = None if deadline is None else max(deadline - asyncio.get_running_loop().time(), 0)
    getter = asyncio.ensure_future(queue.get())
    stopper = asyncio.ensure_future(abort.wait())
    try:
        done, _ = await asyncio.wait({getter, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if getter in done:
        return getter.result()
    getter.cancel()
    return None


def _traced(message: Message) -> Message:
    """The request with the current span as its host spans' parent, when the request is traced."""
    trace = tracing.host_trace()
    if trace is not None:
        message["trace"] = trace
    return message


def _timeout_text(timeout_s: float | None) -> str:
    return f"Tool execution timed out after {timeout_s:g} s"


def _loaded(reply: Message) -> Loaded:
    tools = [
        HostTool(id=str(t["id"]), description=str(t.get("description", "")), parameters=dict(t.get("parameters") or {}),
                 origin=str(t.get("origin", "")), source=str(t.get("source", "CUSTOM")),
                 init_ms=float(t.get("init_ms", 0.0)))
        for t in reply.get("tools") or []
    ]
    return Loaded(tools=tools, load_errors=_problems(reply.get("load_errors")),
                  hooks=[str(h) for h in reply.get("hooks") or []], notes=_problems(reply.get("notes")),
                  config_json=str(reply.get("config") or ""), logs=tuple(tool_logs.load_lines(reply.get("logs"))))


def _problems(items: list[Message] | None) -> list[LoadError]:
    return [LoadError(str(p.get("origin", "")), str(p.get("message", ""))) for p in items or []]


def bun_launcher(runner: ToolRunner, bun: str, host_ts: str, cwd: str, env: dict[str, str]) -> Launch:
    """Starts `bun --no-install run host.ts` under the Bun host's own identity (see server_identity).

    `--config` names the image's empty bunfig: Bun would otherwise read the project's `bunfig.toml`
    (writable by every tool process) at each start, and its `preload` would run code in the host.
    The runtime transpiler cache is off: it would live in a directory the tool user can write.
    `--no-env-file`: Bun would load the cwd's `.env`, `.env.local`, ... into the host's environment.
    It starts in the image's toolhost directory, not the project's: Bun resolves the entry file through the
    cwd's tsconfig.json/jsconfig.json `paths` (model-writable in the project), which could name another file
    in place of host.ts, and harden.ts would never run (red team, 2026-11-28). harden.ts then makes the project
    directory (OCSB_HOST_CWD) the cwd, so tools see it as `process.cwd()`, as upstream.
    """
    home = os.path.dirname(host_ts)
    argv = [bun, "--no-install", "--no-env-file", f"--config={os.path.join(home, 'bunfig.toml')}", "run", host_ts]
    env = env | {"BUN_RUNTIME_TRANSPILER_CACHE_PATH": "0", "OCSB_HOST_CWD": cwd}
    return _launcher(runner, argv, home, env, BUN_SERVER, "bun")


def python_launcher(runner: ToolRunner, python: str, host_py: str, cwd: str, env: dict[str, str]) -> Launch:
    """Starts `python host.py` under the Python host's own identity; host.py's directory provides `opencode_tool`.

    `-s`: no user site-packages (they would be under the tool user's HOME); `-B`: no `.pyc` written (the
    host also reads none from a directory the tool user can write, see pyhost_harden). The host enters
    proc_guard's domain itself (pyhost_harden), so its chain has no separate interpreter for it.
    """
    argv = [python, "-s", "-B", host_py]
    return _launcher(runner, argv, cwd, env, PY_SERVER, "python", guards_itself=True)


def _launcher(runner: ToolRunner, argv: list[str], cwd: str, env: dict[str, str], kind: int,
              name: str, *, guards_itself: bool = False) -> Launch:
    async def launch() -> Execution:
        execution = await runner.start_server(argv, cwd=cwd, env=env, kind=kind, guards_itself=guards_itself)
        if runner.separates_servers:
            try:
                await verify_server(execution.pid, runner.server_uid(kind), f"the {name} tool host")
            except ServerIdentityError as exc:
                execution.stop(reason="not protected")
                raise HostCallError(str(exc)) from None
        return execution

    return launch
