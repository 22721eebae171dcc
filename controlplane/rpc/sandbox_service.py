"""controlplane.v1.SandboxService: raw commands in a session's sandbox."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from controlplane.config import ExecConfig
from controlplane.core.calls.output_budget import OutputBudgets, drawing_from
from controlplane.core.permissions.exec_policy import (
    ExecDeniedError,
    ExecGate,
    StdinRecord,
    command_text,
    exec_outcome,
)
from controlplane.core.seam.messages import Exited
from controlplane.core.seam.provider import ExecStream
from controlplane.core.sessions.manager import SessionManager
from controlplane.errors import ControlPlaneError, InvalidArgumentError, SandboxLostError
from controlplane.rpc import convert
from controlplane.rpc.auth import Authenticator
from controlplane.rpc.drain import drain
from controlplane.rpc.errors import abort_with
from controlplane.rpc.token_watch import ending_reason
from controlplane.v1 import sandbox_pb2, sandbox_pb2_grpc


class SandboxService(sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(
        self, sessions: SessionManager, auth: Authenticator, config: ExecConfig,
        gate: ExecGate | None = None,
    ) -> None:
        self._sessions = sessions
        self._auth = auth
        self._config = config
        self._gate = gate or ExecGate()
        self._budgets = OutputBudgets()
        """Each tenant's Execs share one budget of output held for their clients (an unread Exec holds its window)."""

    async def Exec(
        self, request_iterator: AsyncIterator[sandbox_pb2.ExecRequest], context: Any
    ) -> AsyncIterator[sandbox_pb2.ExecEvent]:
        requests = aiter(request_iterator)
        stream: ExecStream | None = None
        pump: asyncio.Task[None] | None = None
        finished = False
        session_id = ""
        audited: tuple[str, str] | None = None  # (tenant, command) once admitted: its end is audited too
        stdin: StdinRecord | None = None
        took_stdin = False
        outcome, detail = "cancelled", "the client went away"
        asking: tuple[str, str] | None = None  # (tenant, command) once known: a refusal before admission is audited
        try:
            tenant = self._auth.tenant_of(context)
            first = await anext(requests, None)
            if first is None or first.WhichOneof("msg") != "start":
                raise InvalidArgumentError("the first Exec message must be `start`")
            session_id = first.start.session_id
            asking = (tenant.name, command_text(first.start.argv, first.start.command))
            spec = convert.command_spec(first.start, self._config.default_timeout_ms, self._config.max_timeout_ms)
            sandbox = await self._sessions.sandbox_for(tenant.name, session_id)
            text = await self._gate.admit(
                tenant.name, session_id, first.start.argv, first.start.command, dict(first.start.env),
                stdin=first.start.stdin,
            )
            audited = (tenant.name, text)
            stdin = StdinRecord()
            took_stdin = first.start.stdin
            with drawing_from(self._budgets.of(tenant.name)):
                stream = await sandbox.agent.exec(spec)
            pump = asyncio.ensure_future(_relay(requests, stream, stdin))
            seq = 0
            async for event in stream.events():
                seq += 1
                finished = isinstance(event, Exited)  # before the write: a client gone during it cancels nothing
                if isinstance(event, Exited):
                    outcome, detail = exec_outcome(event)
                yield convert.exec_event(seq, event)
        except SandboxLostError as exc:
            outcome, detail = "error", str(exc)
            await self._sessions.report_lost(session_id, str(exc))
            await abort_with(context, exc)
        except ControlPlaneError as exc:
            outcome, detail = "error", str(exc)
            if asking is not None and audited is None and not isinstance(exc, ExecDeniedError):
                # Refused before the policy decided (a session that is not the tenant's, a bad request).
                await self._gate.refused(*asking, session_id=session_id, error=exc)
            if stream is None:
                await drain(requests)
            await abort_with(context, exc)
        finally:
            if pump is not None:
                pump.cancel()
            if stream is not None and not finished:
                stream.cancel()  # the agent stops the command's whole process group
            if audited is not None:
                detail = ending_reason() or detail  # not "the client went away" when its token died
                await self._gate.finished(
                    *audited, session_id=session_id, outcome=outcome, detail=detail,
                    stdin=stdin if stdin is not None and (took_stdin or stdin.total or stdin.closed) else None,
                )


async def _relay(
    requests: AsyncIterator[sandbox_pb2.ExecRequest], stream: ExecStream, stdin: StdinRecord,
) -> None:
    """Carries the client's later messages to the command; what reaches its stdin is recorded first."""
    with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
        async for request in requests:
            kind = request.WhichOneof("msg")
            if kind == "stdin":
                stdin.add(request.stdin)
                await stream.write_stdin(request.stdin)
            elif kind == "close_stdin":
                stdin.closed = True
                await stream.close_stdin()
            elif kind == "abort":
                await stream.abort(request.abort or "aborted by the client")
