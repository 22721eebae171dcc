"""The agent's shared streams (RunTools, ExecMany): many numbered calls over one long-lived RPC each.

A new RPC per call costs more than the call's own messages, so every tool call and every command of a
sandbox rides one of two streams; each call still gets exactly the events and errors it would have had
over an RPC of its own. Also here: how the agent's statuses become the control plane's errors.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc

from controlplane.core.calls.output_budget import CURRENT, CallShare
from controlplane.errors import (
    ControlPlaneError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SandboxError,
    SandboxLostError,
)
from controlplane.sandbox.agent_protocol import REQUIRED, OlderAgent
from controlplane.sandbox.call_windows import GRANT_EVERY, WINDOW, CallWindow, Overrun, largest_event
from controlplane.sandbox.stdin_windows import StdinWindow
from controlplane.telemetry.remote import AgentCallSpan

END = object()
"""Put in a stream's outbox: its requests end there."""

AGENT_FAULTS = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNIMPLEMENTED,
                grpc.StatusCode.DATA_LOSS, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.ALREADY_EXISTS,
                grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ABORTED)
"""Statuses an agent that is still there ends a call with (an exception it did not expect): that call failed,
the sandbox did not. Only a dead channel (UNAVAILABLE, a cancelled or timed-out stream) may mean it is gone."""


def map_agent_error(exc: grpc.aio.AioRpcError, sandbox_id: str) -> ControlPlaneError:
    return status_error(exc.code(), exc.details() or "", sandbox_id)


MAX_DETAILS = 4096
"""What is kept of an agent's error text: a compromised agent's 60 MiB of details went into the client's status,
the audit record and the logs (gRPC's own trailers stop at 16 KiB; the framed socket's status frame did not)."""


def shown_details(details: str) -> str:
    if len(details) <= MAX_DETAILS:
        return details
    return f"{details[:MAX_DETAILS]}... ({len(details) - MAX_DETAILS} more characters from the agent left out)"


def status_error(code: grpc.StatusCode, details: str, sandbox_id: str) -> ControlPlaneError:
    """Agent statuses are a closed set; an unexpected failure fails the call; anything else may mean the sandbox is
    gone (the session manager checks that it really is before failing the session)."""
    details = shown_details(details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgumentError(details)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return FailedPreconditionError(details)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFoundError(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ResourceExhaustedError(details)
    if code in AGENT_FAULTS:
        return SandboxError(f"the sandbox agent failed this call ({code.name}: {details})")
    return SandboxLostError(f"sandbox {sandbox_id} is not answering ({code.name}: {details})")


def refusal(code: str, message: str, sandbox_id: str) -> ControlPlaneError:
    """What a call the agent refused on a shared stream raises: the error of the status it names."""
    status = getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN)
    if not isinstance(status, grpc.StatusCode):
        status = grpc.StatusCode.UNKNOWN
    return status_error(status, message, sandbox_id)


async def drain(outbox: asyncio.Queue[object], kind: type[Any]) -> AsyncIterator[Any]:
    """A stream's requests: what is put in `outbox` until END."""
    while (item := await outbox.get()) is not END:
        assert isinstance(item, kind)
        yield item


class StreamCall(Protocol):
    """What a SharedStream reads: a grpc.aio stream call, or its framed stand-in (agent_frames)."""

    def __aiter__(self) -> AsyncIterator[Any]: ...

    def cancel(self) -> bool: ...


class SharedStream:
    """One long-lived agent call (RunTools, ExecMany) carrying many numbered calls, each with its own inbox.

    Its requests and events have the same shape on both RPCs: `call`, `request`, `cancel`, `trace` up;
    `call`, `event`, `done`, `error` down.
    """

    def __init__(self, call: StreamCall, outbox: asyncio.Queue[object],
                 request_type: type[Any]) -> None:
        self._outbox = outbox
        self._request_type = request_type
        self._inboxes: dict[int, asyncio.Queue[Any]] = {}
        self._windows: dict[int, CallWindow] = {}
        self._shares: dict[int, CallShare] = {}
        """Calls whose windows come from their tenant's budget (controlplane.core.calls.output_budget)."""
        self._stdin: dict[int, StdinWindow] = {}
        self.features: frozenset[str] | None = None
        """The flow control the agent names on the stream's first message (None: not arrived yet). It is held to
        REQUIRED whatever it names: a stream whose agent names less is closed (agent_protocol.py)."""
        self._largest = largest_event(request_type)
        self._numbers = itertools.count(1)
        self._call = call
        self._reader = asyncio.ensure_future(self._read())
        self.open = True

    @classmethod
    def of(cls, rpc: Callable[[AsyncIterator[Any]], grpc.aio.StreamStreamCall[Any, Any]],
           request_type: type[Any]) -> SharedStream:
        outbox: asyncio.Queue[object] = asyncio.Queue()
        return cls(rpc(drain(outbox, request_type)), outbox, request_type)

    def start(self, request: Any, traced: AgentCallSpan,
              share: CallShare | None = None) -> tuple[int, asyncio.Queue[Any]]:
        """A new call: its number and the inbox its events (then None or the stream's error) arrive in."""
        number = next(self._numbers)
        inbox = self._inboxes[number] = asyncio.Queue()
        window = WINDOW
        # Every call is held to both windows, before the agent said anything as after: the plane serves no agent
        # that honours less (agent_protocol.py), and one that claims to and does not gets no more room for it.
        if share is None:
            self._windows[number] = CallWindow(self._largest)
        else:  # every taken byte goes to the share, which batches the grants itself
            window = share.window
            self._windows[number], self._shares[number] = CallWindow(self._largest, window, 1), share
        self._stdin[number] = StdinWindow()
        self._outbox.put_nowait(self._request_type(call=number, request=request, trace=dict(traced.metadata),
                                                   credit=window))
        return number, inbox

    def send(self, number: int, request: Any) -> None:
        if number in self._inboxes:
            self._outbox.put_nowait(self._request_type(call=number, request=request))

    async def send_stdin(self, number: int, request: Any, data: bytes) -> None:
        """Sends a command's stdin once its window has room; dropped when the call ended meanwhile."""
        window = self._stdin.get(number)
        if window is not None:
            await window.spend(data)
            if window.ended:
                return
        self.send(number, request)

    def took(self, number: int) -> None:
        """The call's consumer took its oldest event: more room for the call, once enough was taken."""
        window = self._windows.get(number)
        grant = window.took() if window is not None else 0
        share = self._shares.get(number)
        if grant and share is not None:
            grant = share.taken(grant)
        if grant and self.open:
            self._outbox.put_nowait(self._request_type(call=number, credit=grant))

    def forget(self, number: int, *, cancel: bool) -> None:
        self._windows.pop(number, None)
        share = self._shares.pop(number, None)
        if share is not None:
            share.close()
        self._release_stdin(number)
        if self._inboxes.pop(number, None) is not None and cancel and self.open:
            self._outbox.put_nowait(self._request_type(call=number, cancel=True))

    async def _read(self) -> None:
        ended: grpc.aio.AioRpcError | OlderAgent | None = None
        try:
            async for event in self._call:
                if self.features is None:
                    # The first message: an agent that does not name all the plane requires is of an older image
                    # (or hostile); its calls fail with what to do about it, and the stream ends here.
                    self.features = frozenset(event.features) if not event.call else frozenset()
                    if not REQUIRED <= self.features:
                        ended = OlderAgent(self.features)
                        break
                if not event.call:  # the agent's hello (a later one changes nothing)
                    continue
                inbox = self._inboxes.get(event.call)
                if inbox is None:
                    continue
                if getattr(event, "stdin_credit", 0):
                    stdin = self._stdin.get(event.call)
                    if stdin is not None:
                        stdin.credit(event.stdin_credit)
                    if not (event.HasField("event") or event.done or event.error):
                        continue
                if event.done or event.error:  # the call is over in the agent: its stdin goes nowhere now
                    over = self._stdin.get(event.call)
                    if over is not None:
                        over.release()  # kept until the call is forgotten: later writes see it ended
                window = self._windows.get(event.call)
                overrun = window.arrived(event) if window is not None else None
                if overrun is None:
                    inbox.put_nowait(event)
                else:
                    self._overran(event.call, inbox, overrun)
        except grpc.aio.AioRpcError as exc:
            ended = exc
        finally:
            self.close()
            inboxes, self._inboxes = self._inboxes, {}
            self._windows.clear()
            self._close_shares()
            for number in list(self._stdin):
                self._release_stdin(number)
            for inbox in inboxes.values():
                inbox.put_nowait(ended)

    def _close_shares(self) -> None:
        """The budgeted calls' windows go back to their tenants' budgets."""
        shares, self._shares = self._shares, {}
        for share in shares.values():
            share.close()

    def _release_stdin(self, number: int) -> None:
        window = self._stdin.pop(number, None)
        if window is not None:
            window.release()

    def _overran(self, number: int, inbox: asyncio.Queue[Any], overrun: Overrun) -> None:
        """Fails a call the agent sent past its window, without waiting: its queued events are dropped (the
        plane holds no more for it), its later ones ignored, and the agent is told to cancel it."""
        while not inbox.empty():
            inbox.get_nowait()
        inbox.put_nowait(overrun)
        self.forget(number, cancel=True)

    def close(self) -> None:
        if self.open:
            self.open = False
            self._outbox.put_nowait(END)
            self._call.cancel()


class SharedCall:
    """One call on a `SharedStream`: its events in order until its last, with the errors an RPC of its own
    would give. Subclasses say what its events mean; the loop over them is this one for both kinds."""

    _what, _end = "call", "an end"
    """How the lost-sandbox error names the call and what it lacked."""

    def __init__(self, stream: SharedStream, request: Any, sandbox_id: str, traced: AgentCallSpan) -> None:
        self._stream = stream
        budget = CURRENT.get()  # the tenant's, where the handler that started the call set it
        share = budget.open(WINDOW, GRANT_EVERY) if budget is not None else None
        self._number, self._inbox = stream.start(request, traced, share)
        self._sandbox_id = sandbox_id
        self._traced = traced

    def _domain(self, event: Any) -> Any:
        """The domain form of one of the call's events, or None to skip it."""
        raise NotImplementedError

    def _is_last(self, domain: Any) -> bool:
        raise NotImplementedError

    def _refused(self, item: Any) -> ControlPlaneError:
        raise NotImplementedError

    async def _events(self) -> AsyncIterator[Any]:
        finished = taken = False
        try:
            while True:
                if taken:  # the consumer is back for more: the event before went on (for Exec, to the client)
                    self._stream.took(self._number)
                item = await self._inbox.get()
                if isinstance(item, grpc.aio.AioRpcError):
                    self._traced.finish(error=item)
                    raise map_agent_error(item, self._sandbox_id) from item
                if isinstance(item, (Overrun, OlderAgent)):
                    finished = True  # already cancelled, or its stream is closed
                    raise item.error(self._sandbox_id)
                taken = item is not None
                if item is None or item.error:
                    finished = True  # the agent's side of the call is over: nothing to cancel
                    if item is not None:
                        raise self._refused(item)
                    break
                domain = self._domain(item.event) if item.HasField("event") else None
                if domain is not None:
                    if self._is_last(domain):
                        # Settled before the yield: a consumer that stops at the last event leaves this
                        # generator to be closed later, and that must not cancel a call that is over.
                        finished = True
                        yield domain
                        return
                    yield domain
                if item.done:
                    finished = True
                    break
        finally:
            self._traced.finish()
            self._stream.forget(self._number, cancel=not finished)
        raise SandboxLostError(f"sandbox {self._sandbox_id} ended the {self._what} without {self._end}")

    def cancel(self) -> None:
        self._stream.forget(self._number, cancel=True)
