"""Permission asks of running tool calls: decided by rules, or held until someone replies.

Rules are evaluated in this order, the last match winning: the agent's and the project's rules, then
the session's "always" approvals, then operator policy (so an operator's deny always wins). When the
workspace's config added to the caller's, the same is evaluated with the caller's rules alone in place
of the agent's (the scope's `ceiling`) and the stricter decision holds (rule_layers).

A reply comes over the call's own stream or from another connection (PermissionService). `once`
lets the request through; `always` also stores an allow rule for each of the request's `always`
patterns for the rest of the session (persisted: it survives a control-plane restart) and lets
every other pending request of the session through once the approvals, then operator policy, allow all
its patterns; `reject` fails the request (with the user's feedback when given) and every other pending
request of the session. Every decision is audited and published on the bus.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from controlplane.core.calls.hooks import HookBus
from controlplane.core.calls.tool import PermissionAsk, ToolError
from controlplane.core.calls.tool_events import PermissionRequested
from controlplane.core.permissions import permission
from controlplane.core.permissions.audit import AuditEntry, AuditLog, NoAudit
from controlplane.core.permissions.permission import STRICTNESS, Rule, Ruleset, strictest
from controlplane.core.permissions.rule_layers import CEILING_SOURCE
from controlplane.core.sessions.events import EventBus
from controlplane.core.sessions.held_bytes import TenantBytes, approximate_size
from controlplane.core.sessions.ids import ascending
from controlplane.errors import NotFoundError
from controlplane.telemetry import attributes, spans
from opencode_semantics.wildcard import match

log = logging.getLogger(__name__)


class Reply(enum.Enum):
    ONCE = "once"
    ALWAYS = "always"
    REJECT = "reject"


class ApprovalStore(Protocol):
    async def load_approvals(self, session_id: str) -> list[Rule]: ...

    async def add_approvals(self, session_id: str, rules: list[Rule]) -> None: ...


class MemoryApprovals:
    """Approvals kept in memory only (tests, and the fake sandbox path)."""

    def __init__(self) -> None:
        self._rules: dict[str, list[Rule]] = {}

    async def load_approvals(self, session_id: str) -> list[Rule]:
        return list(self._rules.get(session_id, []))

    async def add_approvals(self, session_id: str, rules: list[Rule]) -> None:
        self._rules.setdefault(session_id, []).extend(rules)


@dataclass(frozen=True)
class AskScope:
    """Who asks: the call, and the rules that apply to it."""

    tenant: str
    session_id: str
    call_id: str
    message_id: str
    tool: str
    ruleset: Ruleset
    """The agent's rules, the project's included."""
    policy: Ruleset = field(default_factory=list)
    """Operator rules, evaluated last."""
    ceiling: Ruleset | None = None
    """`ruleset` without the workspace's config layers, when that differs (rule_layers)."""


@dataclass
class _Pending:
    request: PermissionRequested
    scope: AskScope
    waiter: asyncio.Future[None]
    decision: str = ""
    rule: str = ""
    """How the request was settled (for its trace span)."""


@dataclass
class _SessionAsks:
    tenant: str
    approved: list[Rule]
    pending: dict[str, _Pending] = field(default_factory=dict)


def shown_rules(name: str, scope: AskScope, denying: Rule, source: str) -> list[Rule]:
    """The rules a denied call's message lists: the agent's rules for permission `name` (the caller's own
    when they are what denies), as upstream lists a session's. The operator's rules are not the model's
    business (a tenant's policy is not for a prompt-injected model to probe), except the one that denied
    this call, so the model learns why and stops retrying."""
    agent_rules = scope.ceiling if source == CEILING_SOURCE and scope.ceiling is not None else scope.ruleset
    shown = permission.relevant_rules(name, agent_rules)
    if "operator" in source:
        shown.append(denying)
    return shown


def describe_rule(rule: Rule, source: str) -> str:
    return f"{source}: {rule.permission} {rule.pattern} {rule.action}"


class PermissionGate:
    def __init__(
        self, approvals: ApprovalStore | None = None, audit: AuditLog | None = None, bus: EventBus | None = None,
        hooks: HookBus | None = None, max_pending_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self._held = TenantBytes(max_pending_bytes, "pending permission asks", "limits.max_pending_question_mb")
        self._approvals = approvals or MemoryApprovals()
        self._audit = audit or NoAudit()
        self._bus = bus or EventBus()
        self._hooks = hooks or HookBus()
        self._sessions: dict[str, _SessionAsks] = {}
        self._loading: dict[str, asyncio.Future[_SessionAsks]] = {}
        self._owner: dict[str, str] = {}  # request id -> session id

    async def _session(self, tenant: str, session_id: str) -> _SessionAsks:
        state = self._sessions.get(session_id)
        if state is not None:
            return state
        loading = self._loading.get(session_id)
        if loading is None:
            loading = self._loading[session_id] = asyncio.ensure_future(self._load(tenant, session_id))
        try:
            return await asyncio.shield(loading)
        finally:
            self._loading.pop(session_id, None)

    async def _load(self, tenant: str, session_id: str) -> _SessionAsks:
        approved = await self._approvals.load_approvals(session_id)
        return self._sessions.setdefault(session_id, _SessionAsks(tenant, approved))

    async def _refresh(self, state: _SessionAsks, session_id: str) -> bool:
        """Takes in approvals another control plane stored since they were loaded; whether there were any.
        Only done before asking someone, so allowed calls never wait on the store."""
        added = [r for r in await self._approvals.load_approvals(session_id) if r not in state.approved]
        state.approved.extend(added)
        return bool(added)

    async def approved(self, tenant: str, session_id: str) -> list[Rule]:
        return list((await self._session(tenant, session_id)).approved)

    async def ask(self, ask: PermissionAsk, scope: AskScope, announce: Callable[[PermissionRequested], None]) -> None:
        """Returns when allowed; raises ToolError with upstream's text when denied or rejected."""
        state = await self._session(scope.tenant, scope.session_id)
        deciding: list[str] = []
        needs_reply = False
        # What a bash command really runs (checks), and the strictest rule when some command is not known,
        # are decided with the patterns: the rules of all three layers see them all.
        layers = self._layers(ask.permission, ("agent", scope.ruleset), state.approved, scope.policy)
        capped = (None if scope.ceiling is None else
                  self._layers(ask.permission, (CEILING_SOURCE, scope.ceiling), state.approved, scope.policy))
        results = [self._decide(layers, capped, ask.permission, text) for text in (*ask.patterns, *ask.checks)]
        if ask.opaque:
            results.append(self._strictest(ask.permission, scope))
        for rule, source in results:
            if rule.action == "deny":
                denying = describe_rule(rule, source)
                spans.permission_ruled(ask.permission, ask.patterns, attributes.DECISION_DENY, denying)
                await self._record(scope, ask, "deny", denying)
                raise permission.DeniedError(shown_rules(ask.permission, scope, rule, source))
            if rule.action == "ask":
                needs_reply = True
            else:
                deciding.append(describe_rule(rule, source))
        if not needs_reply:
            rules = "; ".join(dict.fromkeys(deciding))
            spans.permission_ruled(ask.permission, ask.patterns, attributes.DECISION_AUTO_ALLOW, rules)
            await self._record(scope, ask, "allow", rules)
            return
        if await self._refresh(state, scope.session_id):
            await self.ask(ask, scope, announce)
            return
        with spans.permission_wait(ask.permission, ask.patterns, scope.session_id, scope.call_id):
            await self._wait(ask, scope, state, announce)

    async def _wait(
        self, ask: PermissionAsk, scope: AskScope, state: _SessionAsks, announce: Callable[[PermissionRequested], None],
    ) -> None:
        """Asks the plugins, then whoever replies; the trace span around it names the decision."""
        request = PermissionRequested(
            id=ascending("per"), session_id=scope.session_id, permission=ask.permission,
            patterns=list(ask.patterns), always=list(ask.always), metadata=dict(ask.metadata),
            call_id=scope.call_id, message_id=scope.message_id, checks=list(ask.checks), opaque=ask.opaque,
        )
        if self._hooks.has("permission.ask"):
            verdict = await self._plugin_verdict(request, scope)
            if verdict == "allow":
                spans.permission_decided(attributes.DECISION_AUTO_ALLOW, "plugin permission.ask")
                await self._record(scope, ask, "allow", "plugin permission.ask")
                return
            if verdict == "deny":
                spans.permission_decided(attributes.DECISION_DENY, "plugin permission.ask")
                await self._record(scope, ask, "reject", "plugin permission.ask")
                raise permission.RejectedError()
        # What waits is held per tenant in bytes: an ask's metadata carries whole diffs.
        with self._held.holding(scope.tenant, approximate_size([request.patterns, request.metadata, request.checks])):
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            pending = state.pending[request.id] = _Pending(request, scope, waiter)
            self._owner[request.id] = scope.session_id
            # The payload is upstream's request object, in its key order.
            self._bus.publish(
                "permission.asked", scope.tenant, scope.session_id, id=request.id, sessionID=scope.session_id,
                permission=request.permission, patterns=request.patterns, metadata=request.metadata,
                always=request.always, tool={"messageID": scope.message_id, "callID": scope.call_id},
            )
            announce(request)
            try:
                await waiter
            finally:
                state.pending.pop(request.id, None)
                self._owner.pop(request.id, None)
                if pending.decision:
                    spans.permission_decided(pending.decision, pending.rule)

    @staticmethod
    def _strictest(name: str, scope: AskScope) -> tuple[Rule, str]:
        # The session's approvals are answers about patterns; no pattern stands for a command not known.
        rule = permission.strictest(name, scope.ruleset, scope.policy)
        if scope.ceiling is not None:
            capped = permission.strictest(name, scope.ceiling, scope.policy)
            if STRICTNESS[capped.action] > STRICTNESS[rule.action]:
                return capped, CEILING_SOURCE
        for source, rules in (("operator", scope.policy), ("agent", scope.ruleset)):
            if any(r is rule for r in rules):
                return rule, f"strictest {source}"
        return rule, "strictest default"

    @staticmethod
    def _layers(name: str, first: tuple[str, Ruleset], approved: list[Rule], policy: Ruleset,
                ) -> list[tuple[Rule, str]]:
        """The rules for permission `name`, in evaluation order with their source: matched once per ask, as a
        bash ask may bring a dozen texts (patterns and normalised forms) to evaluate against them."""
        return [
            (rule, source)
            for source, rules in (first, ("approved", approved), ("operator", policy))
            for rule in rules if match(name, rule.permission)
        ]

    @staticmethod
    def _evaluate_in(layers: list[tuple[Rule, str]], name: str, pattern: str) -> tuple[Rule, str]:
        for rule, source in reversed(layers):
            if match(pattern, rule.pattern):
                return rule, source
        return Rule(name, "*", "ask"), "default"

    @classmethod
    def _decide(cls, layers: list[tuple[Rule, str]], capped: list[tuple[Rule, str]] | None, name: str,
                text: str) -> tuple[Rule, str]:
        """The deciding rule and its source; from the ceiling (source CEILING_SOURCE, whichever of its layers
        decided) when that is stricter than the merged rules' decision."""
        found = cls._evaluate_in(layers, name, text)
        if capped is None:
            return found
        limit = cls._evaluate_in(capped, name, text)
        return (limit[0], CEILING_SOURCE) if STRICTNESS[limit[0].action] > STRICTNESS[found[0].action] else found

    async def _plugin_verdict(self, request: PermissionRequested, scope: AskScope) -> str:
        info = {
            "id": request.id, "type": request.permission, "pattern": request.patterns,
            "sessionID": scope.session_id, "messageID": scope.message_id, "callID": scope.call_id,
            "title": request.permission, "metadata": request.metadata, "time": {"created": 0},
        }
        output = await self._hooks.trigger("permission.ask", info, {"status": "ask"})
        status = output.get("status", "ask")
        return status if status in ("allow", "deny") else "ask"

    def pending(self, session_id: str) -> list[PermissionRequested]:
        state = self._sessions.get(session_id)
        return [p.request for p in state.pending.values()] if state else []

    def session_of(self, request_id: str) -> str:
        try:
            return self._owner[request_id]
        except KeyError:
            raise NotFoundError(f"no pending permission request {request_id!r}") from None

    async def reply(self, request_id: str, reply: Reply, message: str = "", *, by: str = "client") -> None:
        """Answers a pending request (an unknown id is NotFound; an already settled one, a no-op)."""
        session_id = self.session_of(request_id)
        state = self._sessions[session_id]
        target = state.pending.get(request_id)
        if target is None or target.waiter.done():
            return
        self._published_reply(target, reply)
        if reply is Reply.REJECT:
            await self._record(target.scope, target.request, "reject", by, message)
            _settle(target, permission.CorrectedError(message) if message else permission.RejectedError(), "reject", by)
            for other_id, other in list(state.pending.items()):
                if other_id != request_id and not other.waiter.done():
                    self._published_reply(other, Reply.REJECT)
                    await self._record(other.scope, other.request, "reject", f"cascade from {request_id}")
                    _settle(other, permission.RejectedError(), "reject", f"cascade from {request_id}")
            return
        if reply is Reply.ALWAYS:
            req = target.request
            rules = [Rule(req.permission, pattern, "allow") for pattern in req.always]
            await self._approvals.add_approvals(session_id, rules)  # durable before anyone proceeds
            state.approved.extend(rules)
        await self._record(target.scope, target.request, reply.value, by)
        _settle(target, None, reply.value, by)
        if reply is not Reply.ALWAYS:
            return
        for other_id, other in list(state.pending.items()):
            if other_id == request_id or other.waiter.done():
                continue
            # Upstream checks the approvals alone; the operator's rules still come after them here,
            # so an operator `ask` is not settled by someone else's "always".
            # A pending bash command whose name is not known stays pending: approvals are allow rules for
            # patterns, and no pattern stands for it.
            req = other.request
            if not req.opaque and all(
                permission.evaluate(req.permission, p, state.approved, other.scope.policy).action == "allow"
                for p in (*req.patterns, *req.checks)
            ):
                self._published_reply(other, Reply.ALWAYS)
                await self._record(other.scope, other.request, "always", f"auto from {request_id}")
                _settle(other, None, "always", f"auto from {request_id}")

    def _published_reply(self, pending: _Pending, reply: Reply) -> None:
        scope = pending.scope
        self._bus.publish(
            "permission.replied", scope.tenant, scope.session_id, sessionID=scope.session_id,
            requestID=pending.request.id, reply=reply.value,
        )

    async def _record(
        self, scope: AskScope, ask: PermissionAsk | PermissionRequested, outcome: str, rule: str, detail: str = "",
    ) -> None:
        await self._audit.record(AuditEntry(
            tenant=scope.tenant, session_id=scope.session_id, kind="permission", tool=scope.tool,
            call_id=scope.call_id, outcome=outcome, permission=ask.permission, patterns=tuple(ask.patterns),
            rule=rule, detail=detail,
        ))

    def cancel_call(self, session_id: str, call_id: str, reason: str) -> None:
        """Drops the pending requests of an aborted call."""
        state = self._sessions.get(session_id)
        for pending in list(state.pending.values()) if state else []:
            if pending.request.call_id == call_id:
                _settle(pending, ToolError(reason))

    def forget_session(self, session_id: str) -> None:
        state = self._sessions.pop(session_id, None)
        if state is not None:
            for pending in state.pending.values():
                _settle(pending, ToolError("The session ended."))


def _last(name: str, pattern: str, layers: tuple[tuple[str, Ruleset], ...]) -> tuple[Rule, str]:
    found: tuple[Rule, str] | None = None
    for source, rules in layers:
        for rule in rules:
            if match(name, rule.permission) and match(pattern, rule.pattern):
                found = (rule, source)
    return found if found is not None else (Rule(name, "*", "ask"), "default")


def _settle(pending: _Pending, error: BaseException | None, decision: str = "", rule: str = "") -> None:
    if pending.waiter.done():
        return
    pending.decision, pending.rule = decision, rule
    if error is None:
        pending.waiter.set_result(None)
    else:
        pending.waiter.set_exception(error)


# -- asks settled in the sandbox ------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class LocalRules:
    """The rules a call's asks are evaluated against, in evaluation order, each with its source (agent,
    approved, operator). The sandbox agent may settle an ask they allow without a round trip here."""

    rules: tuple[tuple[Rule, str], ...]
    ceiling: tuple[tuple[Rule, str], ...] | None = None
    """The same with the caller's rules in place of the agent's, when the workspace added to them: an ask
    is allowed in the sandbox only when both allow it (rule_layers)."""


_SNAPSHOTS: dict[tuple[int, ...], tuple[Ruleset, Ruleset, Ruleset, Ruleset | None, LocalRules]] = {}
_MAX_SNAPSHOTS = 256


def _snapshot(ruleset: Ruleset, approved: Ruleset, policy: Ruleset, ceiling: Ruleset | None = None) -> LocalRules:
    """The same object while the lists are unchanged, so its encoded form can be reused."""
    key = (id(ruleset), len(ruleset), id(approved), len(approved), id(policy), len(policy), id(ceiling),
           len(ceiling or ()))
    cached = _SNAPSHOTS.get(key)
    if (cached is not None and cached[0] is ruleset and cached[1] is approved and cached[2] is policy
            and cached[3] is ceiling):
        return cached[4]

    def layered(own: Ruleset, source: str) -> tuple[tuple[Rule, str], ...]:
        return (*((rule, source) for rule in own), *((rule, "approved") for rule in approved),
                *((rule, "operator") for rule in policy))

    rules = LocalRules(layered(ruleset, "agent"), None if ceiling is None else layered(ceiling, CEILING_SOURCE))
    if len(_SNAPSHOTS) >= _MAX_SNAPSHOTS:
        _SNAPSHOTS.clear()
    _SNAPSHOTS[key] = (ruleset, approved, policy, ceiling, rules)
    return rules


class CallAsks:
    """One call's permission asks: `await asks(request)` settles one through the gate.

    Without a `permission.ask` hook, `local_rules()` gives the rules a sandbox agent may settle allowed
    asks with by itself; it reports them afterwards to `allowed_elsewhere`, which audits and traces them
    exactly as the gate does a rule-allowed ask.
    """

    def __init__(self, gate: PermissionGate, scope: AskScope, announce: Callable[[PermissionRequested], None]) -> None:
        self._gate = gate
        self._scope = scope
        self._announce = announce

    async def __call__(self, ask: PermissionAsk) -> None:
        await self._gate.ask(ask, self._scope, self._announce)

    async def local_rules(self) -> LocalRules | None:
        gate, scope = self._gate, self._scope
        if gate._hooks.has("permission.ask"):
            return None  # a plugin may want to see every ask
        state = await gate._session(scope.tenant, scope.session_id)
        return _snapshot(scope.ruleset, state.approved, scope.policy, scope.ceiling)

    async def path_rules(self) -> LocalRules:
        """The same rules whatever the hooks: a sandbox agent uses them only to leave out what a deny covers
        (a deny is decided by rules before any `permission.ask` hook is consulted), never to allow."""
        gate, scope = self._gate, self._scope
        state = await gate._session(scope.tenant, scope.session_id)
        # With the ceiling: a deny the caller's own rules make covers the file whatever the workspace says.
        return _snapshot(scope.ruleset, state.approved, scope.policy, scope.ceiling)

    async def allowed_elsewhere(self, permission: str, patterns: list[str], rules: LocalRules,
                                checks: list[str] | None = None, opaque: bool = False) -> None:
        deciding: list[str] = []
        if opaque:
            rule = strictest(permission, [rule for rule, source in rules.rules if source != "approved"])
            if rules.ceiling is not None:
                capped_rule = strictest(permission, [rule for rule, _source in rules.ceiling])
                rule = capped_rule if STRICTNESS[capped_rule.action] > STRICTNESS[rule.action] else rule
            if rule.action != "allow":
                log.warning("sandbox agent allowed %s with a command not known, which its rules do not allow",
                            permission)
            deciding.append(f"strictest: {permission} {rule.pattern} {rule.action}")
        for pattern in [*patterns, *(checks or [])]:
            found = _deciding(permission, pattern, rules.rules)
            capped = _deciding(permission, pattern, rules.ceiling) if rules.ceiling is not None else found
            if found is not None and found[0].action == "allow" and capped is not None and capped[0].action == "allow":
                deciding.append(describe_rule(*found))
            else:  # the agent's matcher disagrees with ours (a parity test guards against it)
                log.warning("sandbox agent allowed %s %r, which its rules do not allow", permission, pattern)
                deciding.append(f"sandbox agent: {permission} {pattern} allow")
        text = "; ".join(dict.fromkeys(deciding))
        spans.permission_ruled(permission, patterns, attributes.DECISION_AUTO_ALLOW, text)
        await self._gate._record(self._scope, PermissionAsk(permission, patterns, [], {}), "allow", text)


def _deciding(permission: str, pattern: str, rules: tuple[tuple[Rule, str], ...]) -> tuple[Rule, str] | None:
    found = (entry for entry in reversed(rules) if match(permission, entry[0].permission)
             and match(pattern, entry[0].pattern))
    return next(found, None)
