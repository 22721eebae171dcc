"""An open stream lives exactly as long as its token.

Checking the token once, when a stream opens, let an ExecuteTool stream take a ONCE reply, and an Exec
stream take stdin, after the token was revoked. So every streaming RPC runs under a TokenWatch:

- every inbound message is checked before the handler sees it; a dead token's message is dropped;
- a change of the token directory (a revoke, rotate or delete on this plane, or the background refresh
  bringing one made by another plane sharing the store) re-checks every open stream at once;
- an expiry is a timer at the token's expiry time.

When the token dies, the handler is cancelled where it waits (its own cleanup aborts the running tool
call or command), the end is audited, and the stream ends UNAUTHENTICATED with the directory's reason.

Cost per message: one integer comparison and one clock read; the token is hashed and looked up again
only when the directory's epoch moved, which happens only when a record changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from controlplane.core.permissions.audit import AuditEntry, AuditLog, NoAudit
from controlplane.core.tenants.records import TokenDirectory, hash_token
from controlplane.errors import UnauthenticatedError

T = TypeVar("T")


class TokenDiedError(UnauthenticatedError):
    """Raised inside the stream's wrapper only; it becomes the UNAUTHENTICATED status."""


class TokenWatch:
    """One open stream's token: `dead` resolves with the reason once it is refused."""

    def __init__(self, directory: TokenDirectory, token: str) -> None:
        self._directory = directory
        self._digest = hash_token(token)
        self._epoch = -1
        self._expires_at: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.dead: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._unlisten = directory.listen(self.recheck)
        self.recheck()

    @property
    def reason(self) -> str:
        return self.dead.result() if self.dead.done() else ""

    def alive(self) -> bool:
        """Whether the token still holds; cheap unless the directory changed or the expiry is due."""
        if self.dead.done():
            return False
        if self._directory.epoch != self._epoch or (
            self._expires_at is not None and self._directory.clock() >= self._expires_at
        ):
            self.recheck()
        return not self.dead.done()

    def recheck(self) -> None:
        if self.dead.done():
            return
        _, why, record = self._directory.lookup(self._digest)
        self._epoch = self._directory.epoch
        if why:
            self._die(why)
            return
        expires_at = record.expires_at if record is not None else None
        if expires_at != self._expires_at or (expires_at is not None and self._timer is None):
            self._expires_at = expires_at
            self._cancel_timer()
            if expires_at is not None:
                # The clock is the wall clock; the timer may fire a little early, and then it is set again.
                delay = max(0.0, expires_at - self._directory.clock()) + 0.001
                self._timer = asyncio.get_running_loop().call_later(delay, self._expired)

    def _expired(self) -> None:
        self._timer = None
        self.recheck()

    def _die(self, why: str) -> None:
        self.close()
        if not self.dead.done():
            self.dead.set_result(why)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        self._cancel_timer()
        self._unlisten()


_CURRENT: contextvars.ContextVar[TokenWatch | None] = contextvars.ContextVar("token_watch", default=None)


def ending_reason() -> str:
    """Why the current stream's token ended it, or "": for a handler's own audit of how its work ended."""
    watch = _CURRENT.get()
    return f"aborted, its token died: {watch.reason}" if watch is not None and watch.dead.done() else ""


class Subject:
    """What the first inbound message says the stream is about (session, call, tool), for the audit."""

    def __init__(self, method: str) -> None:
        self.method = method.rsplit("/", 1)[-1]
        self.session_id = ""
        self.call_id = ""
        self.tool = ""

    def learn(self, message: Any) -> None:
        oneofs = getattr(getattr(message, "DESCRIPTOR", None), "oneofs", ())
        kind = message.WhichOneof(oneofs[0].name) if oneofs else None
        body = getattr(message, kind) if kind else message
        self.session_id = str(getattr(body, "session_id", "") or getattr(message, "session_id", ""))
        self.call_id = str(getattr(body, "call_id", ""))
        self.tool = str(getattr(body, "tool", ""))


async def _checked(requests: AsyncIterator[Any], watch: TokenWatch, subject: Subject) -> AsyncIterator[Any]:
    """The request stream as the handler sees it: a message that arrives after the token died is dropped,
    and the reader waits there until the wrapper cancels the handler."""
    first = True
    async for request in requests:
        if not watch.alive():
            await asyncio.Event().wait()  # never set: the handler is being cancelled
        if first:
            subject.learn(request)
            first = False
        yield request


async def _until_dead(step: Awaitable[T], watch: TokenWatch) -> T:
    """`step` run as its own task, cancelled (its handler's cleanup runs) when the token dies first."""
    task = asyncio.ensure_future(step)
    try:
        if not watch.dead.done():
            await asyncio.wait((task, watch.dead), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the client went away: the handler goes with it
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise TokenDiedError(watch.reason)


async def _responses_until_dead(result: AsyncIterator[Any], watch: TokenWatch) -> AsyncIterator[Any]:
    """The handler's responses until its token dies. The handler runs in this task (no task per response:
    that cost about 50 µs a response); a death while it waits cancels this task, which unwinds the handler
    where it waits, and the cancellation is taken back here. A death while a response is being sent is
    seen before the next step."""
    task = asyncio.current_task()
    assert task is not None
    stepping = False
    interrupted = False

    def interrupt(_: asyncio.Future[str]) -> None:
        nonlocal interrupted
        if stepping and task is not None:
            interrupted = True
            task.cancel()

    watch.dead.add_done_callback(interrupt)
    try:
        while not watch.dead.done():
            stepping = True
            try:
                response = await anext(result)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                # Ours, and nobody else's (the client going away cancels too): take it back and end.
                if interrupted and task.uncancel() == 0:
                    return
                raise
            finally:
                stepping = False
            if not watch.alive():
                return  # a response made after the token died is not sent
            yield response
    finally:
        watch.dead.remove_done_callback(interrupt)


class StreamGuard:
    """Wraps streaming handlers (their requests and their run) in a TokenWatch."""

    def __init__(self, directory: TokenDirectory, audit: AuditLog | None = None) -> None:
        self._directory = directory
        self._audit = audit or NoAudit()

    async def _ended(self, context: grpc.aio.ServicerContext[Any, Any], tenant: str, subject: Subject,
                     why: str) -> None:
        await self._audit.record(AuditEntry(
            tenant=tenant, session_id=subject.session_id, kind="stream", tool=subject.tool or subject.method,
            call_id=subject.call_id, outcome="cancelled",
            detail=f"{subject.method} ended, its work aborted: {why}",
        ))
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

    def responses(
        self, inner: Callable[[Any, Any], Any], token: str, tenant: str, method: str,
        before: Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[Callable[[], None]]] | None = None,
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]:
        """A response-streaming handler (`inner(request or requests, context)`) under a watch. `before` runs
        first (admission) and returns what to run after."""

        async def handler(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            after = await before(context) if before is not None else None
            watch = TokenWatch(self._directory, token)
            _CURRENT.set(watch)  # this RPC's own task: its handler (and tasks it starts) can read it
            subject = Subject(method)
            if inspect.isasyncgen(request) or hasattr(request, "__aiter__"):
                request = _checked(request, watch, subject)
            result = inner(request, context)
            try:
                if inspect.isasyncgen(result):
                    try:
                        async for response in _responses_until_dead(result, watch):
                            yield response
                    finally:
                        await result.aclose()
                else:
                    await _until_dead(result, watch)
            except TokenDiedError:
                pass
            finally:
                watch.close()
                if after is not None:
                    after()
            if watch.dead.done():
                await self._ended(context, tenant, subject, watch.reason)

        return handler

    def unary_response(
        self, inner: Callable[[Any, Any], Awaitable[Any]], token: str, tenant: str, method: str,
        before: Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[Callable[[], None]]] | None = None,
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        """A client-streaming, unary-response handler under a watch."""

        async def handler(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            after = await before(context) if before is not None else None
            watch = TokenWatch(self._directory, token)
            subject = Subject(method)
            try:
                with contextlib.suppress(TokenDiedError):
                    return await _until_dead(inner(_checked(requests, watch, subject), context), watch)
            finally:
                watch.close()
                if after is not None:
                    after()
            await self._ended(context, tenant, subject, watch.reason)
            return None  # unreachable: the abort raises

        return handler
