"""An MCP stdio transport whose server process runs in a sandbox, started through the agent's exec.

Framing is the SDK's stdio framing: one JSON-RPC message per line each way. The server's stderr
goes to the log. Leaving the context ends the process: stdin is closed first (the polite MCP
shutdown), then the command is aborted, which stops its whole process group in the sandbox.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import mcp_types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage

from controlplane.core.seam.messages import CommandSpec, ExecEvent, Exited, Output
from controlplane.core.seam.provider import ExecStream, SandboxAgent
from controlplane.errors import ControlPlaneError

log = logging.getLogger("controlplane.mcp")

STDIN_CLOSE_GRACE_S = 1.0
"""How long a server may take to exit on its own once its stdin is closed."""
ABORT_GRACE_S = 5.0
"""How long the sandbox may take to report the aborted process gone."""
MAX_LINE_BYTES = 64 * 1024 * 1024
"""A server that writes more than this without a newline is broken; its output is dropped."""

ExitListener = Callable[[Exited | None], None]
"""Told once when the server process is gone (None: the sandbox stopped answering)."""


@asynccontextmanager
async def exec_transport(
    agent: SandboxAgent, spec: CommandSpec, *, label: str, on_exit: ExitListener | None = None
) -> AsyncIterator[TransportStreams]:
    """Starts `spec` (which must ask for stdin) and yields the (read, write) pair ClientSession takes.

    Raises the agent's error (e.g. "cannot run 'x': no such file or directory") when the command
    cannot be started.
    """
    stream = await agent.exec(spec)
    events = stream.events()
    try:
        await anext(events)  # Started, or the agent's refusal to start the command
    except BaseException:
        stream.cancel()
        raise
    pipe = _Pipe(stream, events, label, on_exit)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipe.pump_stdout)
        tg.start_soon(pipe.pump_stdin)
        try:
            yield pipe.read_stream, pipe.write_stream
        finally:
            # The process must end even when the caller is being cancelled; every wait is bounded.
            with anyio.CancelScope(shield=True):
                await pipe.shutdown()
            tg.cancel_scope.cancel()


class _Pipe:
    def __init__(
        self, stream: ExecStream, events: AsyncIterator[ExecEvent], label: str, on_exit: ExitListener | None
    ) -> None:
        self._stream = stream
        self._events = events
        self._label = label
        self._on_exit = on_exit
        self._finished = anyio.Event()
        self._inbox: MemoryObjectSendStream[SessionMessage | Exception]
        self.read_stream: MemoryObjectReceiveStream[SessionMessage | Exception]
        self._inbox, self.read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        self.write_stream: MemoryObjectSendStream[SessionMessage]
        self._outbox: MemoryObjectReceiveStream[SessionMessage]
        self.write_stream, self._outbox = anyio.create_memory_object_stream[SessionMessage](0)

    async def pump_stdout(self) -> None:
        """Delivers the server's messages until it exits; after the session left, keeps draining."""
        deliver = True
        stdout, stderr = _Lines(), _Lines()
        exited: Exited | None = None
        try:
            async for event in self._events:
                if isinstance(event, Output) and event.stream == "stderr":
                    for line in stderr.feed(event.data):
                        log.info("mcp %s stderr: %s", self._label, line.decode(errors="replace"))
                elif isinstance(event, Output):
                    for line in stdout.feed(event.data):
                        if deliver and line.strip():
                            deliver = await self._deliver(_parse(line, self._label))
                elif isinstance(event, Exited):
                    exited = event
        except ControlPlaneError as exc:
            log.warning("mcp %s: the sandbox stopped answering: %s", self._label, exc)
        finally:
            self._inbox.close()  # the session sees the connection end
            self._finished.set()
            if self._on_exit is not None:
                self._on_exit(exited)
        if exited is not None:
            log.info("mcp %s exited (code %d, signal %d)", self._label, exited.exit_code, exited.signal)

    async def _deliver(self, item: SessionMessage | Exception) -> bool:
        try:
            await self._inbox.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    async def pump_stdin(self) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.EndOfStream):
            async for message in self._outbox:
                text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await self._stream.write_stdin(text.encode() + b"\n")

    async def shutdown(self) -> None:
        self.write_stream.close()
        self.read_stream.close()
        self._outbox.close()
        with contextlib.suppress(ControlPlaneError):
            await self._stream.close_stdin()
        with anyio.move_on_after(STDIN_CLOSE_GRACE_S):
            await self._finished.wait()
        if not self._finished.is_set():
            with contextlib.suppress(ControlPlaneError):
                await self._stream.abort("MCP server closed")
            with anyio.move_on_after(ABORT_GRACE_S):
                await self._finished.wait()
        if not self._finished.is_set():
            log.warning("mcp %s did not report its exit; dropping the exec call", self._label)
            self._stream.cancel()


class _Lines:
    """Splits a byte stream into lines; a final line without a newline is never delivered."""

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, data: bytes) -> list[bytes]:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > MAX_LINE_BYTES:
            self._partial = b""
        return [line.rstrip(b"\r") for line in lines]


def _parse(line: bytes, label: str) -> SessionMessage | Exception:
    """A message, or the parse error as a value (the SDK's stdio transport surfaces it the same way)."""
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        log.warning("mcp %s wrote a line that is not a JSON-RPC message: %.200r", label, line)
        return exc
