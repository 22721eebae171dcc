"""`Client`: the async client's twin for synchronous callers, method for method (tests/unit/test_client_parity.py
fails when one gains a public method the other lacks, or their parameters differ).

The async client runs on a private event-loop thread. Streams come back as blocking iterators that can be
cancelled; handlers may be plain functions, which run on a worker thread so that they can call this client
again (a subtask's loop does) without blocking the loop that serves the stream.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from controlplane.client_files import Files
from controlplane.client_snapshots import Snapshots
from controlplane.client_types import (
    Completed,
    EventHandler,
    PermissionAnswer,
    QuestionAnswerer,
    SubtaskRunner,
    ToolOutcome,
)
from controlplane.v1 import event_pb2, permission_pb2, question_pb2, sandbox_pb2, session_pb2, tool_pb2
from controlplane.workspace_dir import DEFAULT_MAX_BYTES

if TYPE_CHECKING:
    from controlplane.client import AsyncClient

T = TypeVar("T")
E = TypeVar("E")
F = TypeVar("F", bound=Callable[..., Any])


class SyncStream(Generic[E]):
    """A gRPC stream read from a synchronous caller: iterate it; `cancel()` it (from any thread) to stop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, call: Any) -> None:
        self._loop = loop
        self._call = call
        self._items: AsyncIterator[E] = call.__aiter__()

    def __iter__(self) -> Iterator[E]:
        return self

    def __next__(self) -> E:
        try:
            return asyncio.run_coroutine_threadsafe(_next(self._items), self._loop).result()
        except StopAsyncIteration:
            raise StopIteration from None

    def cancel(self) -> bool:
        return asyncio.run_coroutine_threadsafe(_cancel(self._call), self._loop).result()

    @property
    def call(self) -> Any:
        """The underlying grpc.aio call (code(), details(), ... must be awaited on the client's loop)."""
        return self._call


class SyncOutbox:
    """The request side of `Client.tool_call`: put replies or an abort from any thread; None half-closes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[tool_pb2.ExecuteToolRequest | None]):
        self._loop = loop
        self._queue = queue

    def put(self, item: tool_pb2.ExecuteToolRequest | None) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)


async def _next(items: AsyncIterator[E]) -> E:
    return await items.__anext__()


async def _cancel(call: Any) -> bool:
    return bool(call.cancel())


def _threaded(handler: F | None) -> F | None:
    """A plain-function handler run on a worker thread; coroutine functions run on the loop as they are."""
    if handler is None or inspect.iscoroutinefunction(handler):
        return handler

    async def run(value: Any) -> Any:
        result = await asyncio.to_thread(handler, value)
        return await result if inspect.isawaitable(result) else result

    return run  # type: ignore[return-value]


async def _from_thread(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    items = iter(chunks)
    while (chunk := await asyncio.to_thread(next, items, None)) is not None:
        yield chunk


class Client(Files, Snapshots):
    """Synchronous client. With no `target`/`token`, they are found as `connect()` finds them."""

    def __init__(self, target: str | None = None, token: str | None = None, *, config: Path | None = None,
                 **kwargs: Any) -> None:
        from controlplane.discovery import find_endpoint

        if target is None or token is None:
            target, token = find_endpoint(target, token, config=config)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="controlplane-client", daemon=True)
        self._thread.start()
        self._async: AsyncClient = self._call(_make(target, token, kwargs))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stream(self, make: Callable[[], Any]) -> SyncStream[Any]:
        async def made() -> Any:
            return make()  # grpc.aio binds a call to the loop it is created on

        return SyncStream(self._loop, self._call(made()))

    # -- sessions and commands ------------------------------------------------------------------

    def create_session(
        self, *, agent: str = "", workspace: Path | bytes | None = None, workspace_archive: bytes = b"",
        config_json: str = "", labels: dict[str, str] | None = None, cpu: float = 0, memory_mb: int = 0,
        pids: int = 0, deadline_s: float | None = 120, max_workspace_bytes: int = DEFAULT_MAX_BYTES,
        template: str = "",
        network_allow: Iterable[str] = (), from_snapshot: str = "",
    ) -> session_pb2.Session:
        return self._call(self._async.create_session(
            agent=agent, workspace=workspace, workspace_archive=workspace_archive, config_json=config_json,
            labels=labels, cpu=cpu, memory_mb=memory_mb, pids=pids, deadline_s=deadline_s,
            max_workspace_bytes=max_workspace_bytes, template=template, network_allow=network_allow,
            from_snapshot=from_snapshot,
        ))

    def get_session(self, session_id: str) -> session_pb2.Session:
        return self._call(self._async.get_session(session_id))

    def list_sessions(self, include_deleted: bool = False) -> list[session_pb2.Session]:
        return self._call(self._async.list_sessions(include_deleted))

    def delete_session(self, session_id: str, *, keep_snapshot: bool = False) -> session_pb2.Session:
        return self._call(self._async.delete_session(session_id, keep_snapshot=keep_snapshot))

    def list_templates(self) -> list[session_pb2.Template]:
        return self._call(self._async.list_templates())

    def exec_call(
        self, session_id: str, argv: Iterable[str] = (), *, command: str = "", cwd: str = "",
        env: dict[str, str] | None = None, timeout_ms: int = 0, merge_stderr: bool = False,
        stdin: Iterable[bytes] | None = None,
    ) -> SyncStream[sandbox_pb2.ExecEvent]:
        """The raw call as a blocking iterator; `stdin` is read on a worker thread."""
        return self._stream(lambda: self._async.exec_call(
            session_id, list(argv), command=command, cwd=cwd, env=env, timeout_ms=timeout_ms,
            merge_stderr=merge_stderr, stdin=None if stdin is None else _from_thread(stdin),
        ))

    def exec(self, session_id: str, argv: Iterable[str] = (), **kwargs: Any) -> Iterator[sandbox_pb2.ExecEvent]:
        """Events of one command, ending with `exited`; closing the iterator early aborts the command."""
        stream = self.exec_call(session_id, argv, **kwargs)
        try:
            for event in stream:
                yield event
                if event.WhichOneof("event") == "exited":
                    return
        finally:
            stream.cancel()

    def run(self, session_id: str, argv: Iterable[str] = (), **kwargs: Any) -> Completed:
        return self._call(self._async.run(session_id, list(argv), **kwargs))

    # -- tools ----------------------------------------------------------------------------------

    def list_tools(
        self, session_id: str, *, provider_id: str = "", model_id: str = "", agent: str = ""
    ) -> tool_pb2.ListToolsResponse:
        return self._call(self._async.list_tools(session_id, provider_id=provider_id, model_id=model_id, agent=agent))

    def tool_call(
        self, session_id: str, tool: str, args: dict[str, Any] | str, *, call_id: str = "", message_id: str = "",
        agent: str = "",
    ) -> tuple[SyncStream[tool_pb2.ToolEvent], SyncOutbox]:
        """The raw call as a blocking iterator, plus its request side."""
        async def made() -> Any:
            return self._async.tool_call(
                session_id, tool, args, call_id=call_id, message_id=message_id, agent=agent
            )

        stream, outbox = self._call(made())
        return SyncStream(self._loop, stream), SyncOutbox(self._loop, outbox)

    def execute_tool(
        self, session_id: str, tool: str, args: dict[str, Any] | str, *, call_id: str = "", message_id: str = "",
        agent: str = "", on_permission: PermissionAnswer | None = None, on_subtask: SubtaskRunner | None = None,
        on_question: QuestionAnswerer | None = None, on_event: EventHandler | None = None,
    ) -> ToolOutcome:
        """As AsyncClient.execute_tool (no `on_permission`: requests are rejected); plain-function handlers
        run on a worker thread, in stream order for `on_event`."""
        return self._call(self._async.execute_tool(
            session_id, tool, args, call_id=call_id, message_id=message_id, agent=agent,
            on_permission=_threaded(on_permission), on_subtask=_threaded(on_subtask),
            on_question=_threaded(on_question), on_event=_threaded(on_event),
        ))

    def reload_tools(self, session_id: str) -> tool_pb2.ReloadToolsResponse:
        return self._call(self._async.reload_tools(session_id))

    def cancel_tool_call(self, session_id: str, call_id: str) -> bool:
        return self._call(self._async.cancel_tool_call(session_id, call_id))

    def pending_questions(self, session_id: str) -> list[question_pb2.PendingQuestion]:
        return self._call(self._async.pending_questions(session_id))

    def reply_question(self, request_id: str, answers: list[list[str]] | None) -> None:
        self._call(self._async.reply_question(request_id, answers))

    def complete_subtask(self, session_id: str, text: str = "", *, error: str = "") -> None:
        self._call(self._async.complete_subtask(session_id, text, error=error))

    # -- permissions and events -----------------------------------------------------------------

    def pending_permissions(self, session_id: str) -> list[permission_pb2.PendingPermission]:
        return self._call(self._async.pending_permissions(session_id))

    def reply_permission(self, request_id: str, reply: str, message: str = "") -> None:
        self._call(self._async.reply_permission(request_id, reply, message))

    def subscribe_events(self, session_id: str = "", *, recent_logs: bool = False) -> SyncStream[event_pb2.Event]:
        """The bus as a blocking iterator; `cancel()` it (from another thread too) to stop. With `recent_logs`,
        the `tool.log` events the control plane still holds come first."""
        return self._stream(lambda: self._async.subscribe_events(session_id, recent_logs=recent_logs))

    def close(self) -> None:
        self._call(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _make(target: str, token: str, kwargs: dict[str, Any]) -> AsyncClient:
    from controlplane.client import AsyncClient

    return AsyncClient(target, token, **kwargs)
