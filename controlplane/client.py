"""A typed client for the public API: `AsyncClient`, and `Client` for synchronous callers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from controlplane.v1 import sandbox_pb2, sandbox_pb2_grpc, session_pb2, session_pb2_grpc

T = TypeVar("T")
Session = session_pb2.Session
ExecEvent = sandbox_pb2.ExecEvent


@dataclass(frozen=True)
class Completed:
    exit_code: int
    stdout: bytes
    stderr: bytes
    signal: int = 0
    timed_out: bool = False
    aborted: bool = False


class AsyncClient:
    """`target` is host:port; `token` the tenant's bearer token."""

    def __init__(self, target: str, token: str, *, root_certificates: bytes | None = None) -> None:
        options = [("grpc.max_receive_message_length", 256 * 1024 * 1024),
                   ("grpc.max_send_message_length", 256 * 1024 * 1024)]
        if root_certificates is not None:
            creds = grpc.ssl_channel_credentials(root_certificates)
            self._channel = grpc.aio.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        self._metadata = (("authorization", f"Bearer {token}"),)
        self.sessions = session_pb2_grpc.SessionServiceStub(self._channel)
        self.sandbox = sandbox_pb2_grpc.SandboxServiceStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def create_session(
        self, *, agent: str = "", workspace_archive: bytes = b"", config_json: str = "",
        labels: dict[str, str] | None = None, cpu: float = 0, memory_mb: int = 0, pids: int = 0,
        deadline_s: float | None = 120,
    ) -> Session:
        request = session_pb2.CreateSessionRequest(
            agent=agent, workspace_archive=workspace_archive, config_json=config_json, labels=labels or {},
        )
        if cpu or memory_mb or pids:
            request.resources.CopyFrom(session_pb2.Resources(cpu=cpu, memory_mb=memory_mb, pids=pids))
        return await self.sessions.CreateSession(request, metadata=self._metadata, timeout=deadline_s)

    async def get_session(self, session_id: str) -> Session:
        request = session_pb2.GetSessionRequest(session_id=session_id)
        return await self.sessions.GetSession(request, metadata=self._metadata)

    async def list_sessions(self, include_deleted: bool = False) -> list[Session]:
        request = session_pb2.ListSessionsRequest(include_deleted=include_deleted)
        response = await self.sessions.ListSessions(request, metadata=self._metadata)
        return list(response.sessions)

    async def delete_session(self, session_id: str) -> Session:
        request = session_pb2.DeleteSessionRequest(session_id=session_id)
        return (await self.sessions.DeleteSession(request, metadata=self._metadata)).session

    def exec_call(
        self, session_id: str, argv: Iterable[str] = (), *, command: str = "", cwd: str = "",
        env: dict[str, str] | None = None, timeout_ms: int = 0, merge_stderr: bool = False,
        stdin: AsyncIterator[bytes] | None = None,
    ) -> grpc.aio.StreamStreamCall[sandbox_pb2.ExecRequest, sandbox_pb2.ExecEvent]:
        """The raw call: iterate it for events, `cancel()` it to abort the command."""
        start = sandbox_pb2.ExecStart(
            session_id=session_id, argv=list(argv), command=command, cwd=cwd, env=env or {},
            timeout_ms=timeout_ms, merge_stderr=merge_stderr, stdin=stdin is not None,
        )

        async def requests() -> AsyncIterator[sandbox_pb2.ExecRequest]:
            yield sandbox_pb2.ExecRequest(start=start)
            if stdin is not None:
                async for data in stdin:
                    yield sandbox_pb2.ExecRequest(stdin=data)
                yield sandbox_pb2.ExecRequest(close_stdin=True)
            # Returning half-closes the request side; the command keeps running until `exited`.

        return self.sandbox.Exec(requests(), metadata=self._metadata)

    async def exec(self, session_id: str, argv: Iterable[str] = (), **kwargs: Any) -> AsyncIterator[ExecEvent]:
        """Events of one command, ending with `exited`."""
        call = self.exec_call(session_id, argv, **kwargs)
        try:
            async for event in call:
                yield event
                if event.WhichOneof("event") == "exited":
                    return
        finally:
            call.cancel()

    async def run(self, session_id: str, argv: Iterable[str] = (), **kwargs: Any) -> Completed:
        """Runs a command to completion and collects its output."""
        out, err = bytearray(), bytearray()
        async for event in self.exec(session_id, argv, **kwargs):
            kind = event.WhichOneof("event")
            if kind == "stdout":
                out += event.stdout
            elif kind == "stderr":
                err += event.stderr
            elif kind == "exited":
                e = event.exited
                return Completed(e.exit_code, bytes(out), bytes(err), e.signal, e.timed_out, e.aborted)
        raise RuntimeError("the command's stream ended without an exit status")


class Client:
    """Synchronous wrapper: the async client driven on a private event-loop thread."""

    def __init__(self, target: str, token: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="controlplane-client", daemon=True)
        self._thread.start()
        self._async = self._call(_make(target, token, kwargs))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def create_session(self, **kwargs: Any) -> Session:
        return self._call(self._async.create_session(**kwargs))

    def get_session(self, session_id: str) -> Session:
        return self._call(self._async.get_session(session_id))

    def list_sessions(self, include_deleted: bool = False) -> list[Session]:
        return self._call(self._async.list_sessions(include_deleted))

    def delete_session(self, session_id: str) -> Session:
        return self._call(self._async.delete_session(session_id))

    def run(self, session_id: str, argv: Iterable[str] = (), **kwargs: Any) -> Completed:
        return self._call(self._async.run(session_id, list(argv), **kwargs))

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
    return AsyncClient(target, token, **kwargs)
