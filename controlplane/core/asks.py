"""Permission asks of running tool calls: decided by rules, or held until someone replies.

A reply comes over the call's own stream or from another connection (PermissionService). `once`
lets the request through; `always` also remembers an allow rule for each of the request's
`always` patterns for the rest of the session and lets every other pending request of the session
through once the remembered rules allow all its patterns; `reject` fails the request (with the
user's feedback when given) and every other pending request of the session.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.core import permission
from controlplane.core.ids import ascending
from controlplane.core.permission import Rule
from controlplane.core.tool import PermissionAsk, ToolError
from controlplane.core.tool_events import PermissionRequested
from controlplane.errors import NotFoundError


class Reply(enum.Enum):
    ONCE = "once"
    ALWAYS = "always"
    REJECT = "reject"


@dataclass
class _Pending:
    request: PermissionRequested
    waiter: asyncio.Future[None]


@dataclass
class _SessionAsks:
    approved: list[Rule] = field(default_factory=list)
    pending: dict[str, _Pending] = field(default_factory=dict)


class PermissionGate:
    def __init__(self) -> None:
        self._sessions: dict[str, _SessionAsks] = {}
        self._owner: dict[str, str] = {}  # request id -> session id

    def _session(self, session_id: str) -> _SessionAsks:
        return self._sessions.setdefault(session_id, _SessionAsks())

    async def ask(
        self, ask: PermissionAsk, *, session_id: str, call_id: str, message_id: str, ruleset: list[Rule],
        announce: Callable[[PermissionRequested], None],
    ) -> None:
        """Returns when allowed; raises ToolError with upstream's text when denied or rejected."""
        state = self._session(session_id)
        needs_reply = False
        for pattern in ask.patterns:
            rule = permission.evaluate(ask.permission, pattern, ruleset, state.approved)
            if rule.action == "deny":
                raise permission.DeniedError(permission.relevant_rules(ask.permission, ruleset))
            if rule.action == "ask":
                needs_reply = True
        if not needs_reply:
            return
        request = PermissionRequested(
            id=ascending("per"), session_id=session_id, permission=ask.permission, patterns=list(ask.patterns),
            always=list(ask.always), metadata=dict(ask.metadata), call_id=call_id, message_id=message_id,
        )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.pending[request.id] = _Pending(request, waiter)
        self._owner[request.id] = session_id
        announce(request)
        try:
            await waiter
        finally:
            state.pending.pop(request.id, None)
            self._owner.pop(request.id, None)

    def pending(self, session_id: str) -> list[PermissionRequested]:
        return [p.request for p in self._session(session_id).pending.values()]

    def session_of(self, request_id: str) -> str:
        try:
            return self._owner[request_id]
        except KeyError:
            raise NotFoundError(f"no pending permission request {request_id!r}") from None

    def reply(self, request_id: str, reply: Reply, message: str = "") -> list[tuple[str, Reply]]:
        """Answers a pending request; returns every (request id, reply) it settled."""
        session_id = self.session_of(request_id)
        state = self._session(session_id)
        target = state.pending.get(request_id)
        if target is None:
            return []
        settled = [(request_id, reply)]
        if reply is Reply.REJECT:
            _settle(target, permission.CorrectedError(message) if message else permission.RejectedError())
            for other_id, other in list(state.pending.items()):
                if other_id != request_id:
                    _settle(other, permission.RejectedError())
                    settled.append((other_id, Reply.REJECT))
            return settled
        _settle(target, None)
        if reply is Reply.ALWAYS:
            req = target.request
            state.approved.extend(Rule(req.permission, pattern, "allow") for pattern in req.always)
            for other_id, other in list(state.pending.items()):
                if other_id == request_id or other.waiter.done():
                    continue
                if all(
                    permission.evaluate(other.request.permission, p, state.approved).action == "allow"
                    for p in other.request.patterns
                ):
                    _settle(other, None)
                    settled.append((other_id, Reply.ALWAYS))
        return settled

    def cancel_call(self, session_id: str, call_id: str, reason: str) -> None:
        """Drops the pending requests of an aborted call."""
        for pending in list(self._session(session_id).pending.values()):
            if pending.request.call_id == call_id:
                _settle(pending, ToolError(reason))

    def forget_session(self, session_id: str) -> None:
        state = self._sessions.pop(session_id, None)
        if state is not None:
            for pending in state.pending.values():
                _settle(pending, ToolError("The session ended."))


def _settle(pending: _Pending, error: BaseException | None) -> None:
    if pending.waiter.done():
        return
    if error is None:
        pending.waiter.set_result(None)
    else:
        pending.waiter.set_exception(error)

