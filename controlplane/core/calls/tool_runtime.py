"""Tool calls of sessions: listing, running, cancelling, answering permission requests.

ListTools shows upstream's registry (order, flags, model filter, permission-disabled tools
removed, `invalid` hidden). ExecuteTool also accepts the built-ins upstream defines without
registering (`list`, `multiedit`), so clients can drive every implemented tool directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import posixpath
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controlplane.core.calls import arguments
from controlplane.core.calls.abort import AbortSignal
from controlplane.core.calls.argument_budget import ArgumentBudget
from controlplane.core.calls.executor import CallRequest, CallScope, ToolExecutor
from controlplane.core.calls.hooks import DEFAULT_TIMEOUT_S as HOOK_TIMEOUT_S
from controlplane.core.calls.runtime_sessions import McpSource, RunningCall, RuntimeSession, RuntimeSessions
from controlplane.core.calls.subtasks import CallerScope, Subtasks, bound
from controlplane.core.calls.tool import InitContext, SandboxCalls, ToolError, ToolInfo, ToolSource
from controlplane.core.calls.tool_events import (
    CallEvent,
    PermissionRequested,
    QuestionAsked,
    StateChanged,
    SubCallEvent,
)
from controlplane.core.calls.tool_log import ToolLogged
from controlplane.core.config import plugin_config
from controlplane.core.definitions import tool_reload
from controlplane.core.definitions.custom_tools import custom_tool
from controlplane.core.definitions.registry import Registry
from controlplane.core.permissions import permission, rule_layers
from controlplane.core.permissions.asks import PermissionGate, Reply
from controlplane.core.permissions.audit import AuditEntry
from controlplane.core.permissions.policy import OperatorPolicy
from controlplane.core.permissions.questions import MAX_PENDING_BYTES, QuestionBroker
from controlplane.core.seam.messages import CustomListing
from controlplane.core.seam.provider import Sandbox, SandboxAgent
from controlplane.core.sessions.events import EventBus
from controlplane.core.sessions.ids import ascending
from controlplane.core.sessions.manager import SessionManager
from controlplane.core.sessions.models import Session
from controlplane.core.sessions.services import MemoryTodos, SessionServices, TodoStore
from controlplane.errors import ControlPlaneError, FailedPreconditionError, InvalidArgumentError
from controlplane.telemetry import spans

log = logging.getLogger(__name__)
TOOL_OUTPUT_SUBDIR = ".local/share/opencode/tool-output"
PLANS_SUBDIR = ".local/share/opencode/plans"


@dataclass(frozen=True)
class ListedTool:
    id: str
    description: str
    parameters_schema: dict[str, Any]
    source: ToolSource
    origin: str
    init_ms: float


@dataclass
class ToolListing:
    tools: list[ListedTool]
    load_errors: list[tuple[str, str]] = field(default_factory=list)
    logs: list[ToolLogged] = field(default_factory=list)
    """What the custom tool and plugin files printed while loading."""


McpFactory = Callable[[str, "SandboxAgent"], Awaitable[McpSource | None]]
"""(the session's opencode.json, its sandbox's agent) -> its MCP servers, connected; None without any."""


@dataclass(frozen=True)
class ClientCall:
    """One tool call as a client asks for it (ExecuteTool's first message), before the runtime knows the
    session: whose it is, where it runs, what it runs, and under which agent."""

    tenant: str
    session_id: str
    tool: str
    args_json: str
    call_id: str = ""
    """Empty: the runtime gives the call an ascending id."""
    message_id: str = ""
    agent: str = ""
    """Empty: the session's agent."""


class ToolRuntime:
    def __init__(
        self, sessions: SessionManager, registry: Registry, executor: ToolExecutor,
        sandbox_calls: Callable[[Sandbox], SandboxCalls], extra_builtins: Mapping[str, ToolInfo], *,
        bus: EventBus | None = None, policy: OperatorPolicy | None = None, env: Mapping[str, str] | None = None,
        mcp: McpFactory | None = None, todos: TodoStore | None = None,
        max_args_bytes: int = arguments.DEFAULT_MAX_ARGS_BYTES, max_pending_question_bytes: int = MAX_PENDING_BYTES,
        budget: ArgumentBudget | None = None,
    ) -> None:
        self._max_args_bytes = max_args_bytes
        self._budget = budget or ArgumentBudget()
        self._mcp_factory = mcp
        self._sessions = sessions
        self._registry = registry
        self._executor = executor
        self._sandbox_calls = sandbox_calls
        self._extra_builtins = dict(extra_builtins)
        self.bus = bus or EventBus()
        self._policy = policy or OperatorPolicy()
        self._env_permission = (env or {}).get("OPENCODE_PERMISSION")
        self._sessions_kept = RuntimeSessions()
        self.subtasks = Subtasks(sessions, self.bus, self)
        self.questions = QuestionBroker(self.bus, max_pending_question_bytes)
        self._todos = todos or MemoryTodos()
        sessions.on_end(self._forget_session)

    @property
    def gate(self) -> PermissionGate:
        return self._executor.gate

    # -- listing --------------------------------------------------------------------------------

    async def list_tools(self, tenant: str, session_id: str, provider_id: str, model_id: str,
                         agent_name: str) -> ToolListing:
        stored = await self._sessions.get(tenant, session_id)
        sandbox = await self._sessions.sandbox_for(tenant, session_id)
        kept = self._sessions_kept.of(session_id)
        before = kept.custom
        custom = await self._custom_listing(kept, stored, sandbox, refresh=True)
        if custom.logs and (before is None or before.logs != custom.logs):
            for line in custom.logs:  # load-time lines on the bus once per load that printed them
                self.bus.publish("tool.log", tenant, session_id, **line.properties())
        session = configured(stored, custom)
        agent = await self._agent(kept, session, sandbox, agent_name, custom)
        policy = self._policy.rules(tenant, home=await self._home(kept, sandbox))
        mcp = await self._mcp_source(kept, session, sandbox)
        caller = self._caller_scope(kept, tenant, session, agent)
        registry = self._registry.for_session(_config(session.config_json))
        offered = [bound(t, caller) for t in _with_extra(registry.tools(provider_id, model_id), custom, mcp)]
        ruleset, ceiling, switched_off = self._session_rules(session, agent)
        hidden = rule_layers.hidden_tools([t.id for t in offered], ruleset, ceiling, policy) | switched_off
        listed = []
        for tool in offered:
            if tool.id == "invalid" or tool.id in hidden:
                continue
            started = time.perf_counter()
            with spans.listed_init(tool.id, tool.source.value, tool.origin, tool.init_ms):
                definition = await tool.init(InitContext(agent=agent.name))
                description, schema = definition.description, definition.schema()
            if tool.source is not ToolSource.MCP:  # upstream's hook sees the registry's tools, never MCP's
                description, schema = await self._shown_definition(
                    tool.id, description, schema, sandbox if "tool.definition" in custom.hooks else None,
                )
            elapsed = (time.perf_counter() - started) * 1000 if tool.init_ms is None else tool.init_ms
            listed.append(ListedTool(tool.id, description, schema, tool.source, tool.origin, elapsed))
        return ToolListing(
            listed, [*custom.load_errors, *unadopted(stored, custom), *(mcp.load_errors() if mcp else [])],
            custom.logs,
        )

    async def _shown_definition(
        self, tool_id: str, description: str, schema: dict[str, Any], sandbox: Sandbox | None,
    ) -> tuple[str, dict[str, Any]]:
        """What the `tool.definition` hooks make of a tool's definition: the operator's, then the project
        plugins' in the sandbox (`sandbox` given when one of them has the hook). A failing hook is logged and
        skipped: a listing never fails for it."""
        shown: dict[str, Any] = {"description": description, "parameters": schema}
        hooks = self._executor.hooks
        if hooks.has("tool.definition"):
            shown = await hooks.trigger("tool.definition", {"toolID": tool_id}, shown, tolerant=True)
        if sandbox is not None:
            try:
                shown = await sandbox.agent.run_plugin_hook("tool.definition", {"toolID": tool_id}, shown,
                                                            HOOK_TIMEOUT_S)
            except ToolError as exc:
                log.warning("a project plugin's tool.definition hook failed for %s: %s", tool_id, exc)
        parameters = shown.get("parameters", schema)
        return str(shown.get("description", description)), parameters if isinstance(parameters, dict) else schema

    # -- reloading the session's code (the API caller's ReloadTools, never a tool call) ---------------

    async def reload_tools(self, tenant: str, session_id: str) -> tool_reload.ReloadReport:
        """Takes the workspace's current custom tools, plugins, skills and local MCP server files for the
        session's sandbox (its `task` children share it); audited and published as `tools.reloaded`."""
        stored = await self._sessions.get(tenant, session_id)
        sandbox = await self._sessions.sandbox_for(tenant, session_id)
        kept = self._sessions_kept.of(session_id)
        before = kept.custom or await self._custom_listing(kept, stored, sandbox, refresh=True)
        mcp_before = await self._mcp_source(kept, configured(stored, before), sandbox)
        old = tool_reload.tool_signatures(before, mcp_before.tools() if mcp_before else [])
        audit = self._executor.audit
        try:
            files = await sandbox.agent.snapshot_code(stored.config_json, {})
        except ControlPlaneError as exc:
            await audit.record(AuditEntry(tenant, session_id, "reload", "", "", "error", detail=str(exc)))
            raise
        for sharing in [sid for sid in self._sessions_kept.ids() if self._shares(sid, stored)]:
            # What was kept from the old code goes: the next look lists (and connects) the new code.
            sharer = self._sessions_kept.get(sharing)
            if sharer is not None:
                sharer.drop_code()
        after = await self._custom_listing(kept, stored, sandbox, refresh=True)
        mcp_after = await self._mcp_source(kept, configured(stored, after), sandbox)
        new = tool_reload.tool_signatures(after, mcp_after.tools() if mcp_after else [])
        errors = [*after.load_errors, *(mcp_after.load_errors() if mcp_after else [])]
        report = tool_reload.compare(old, new, files, errors)
        await audit.record(AuditEntry(tenant, session_id, "reload", "", "", "ok", detail=report.summary()))
        self.bus.publish(tool_reload.EVENT, tenant, session_id, **report.event_properties())
        return report

    def _shares(self, session_id: str, session: Session) -> bool:
        """Whether `session_id` runs in `session`'s sandbox (itself, or a `task` child of it)."""
        if session_id == session.id:
            return True
        live = self._sessions.live_session(session_id)
        return live is not None and bool(session.sandbox_id) and live.sandbox_id == session.sandbox_id

    # -- calls ----------------------------------------------------------------------------------

    async def start_call(self, asked: ClientCall) -> RunningCall:
        arguments.check_size(asked.args_json, self._max_args_bytes)  # before any work on them
        return await self._budget.held_by(asked, self._start)

    async def _start(self, asked: ClientCall) -> RunningCall:
        tenant, session_id, tool = asked.tenant, asked.session_id, asked.tool
        stored = await self._sessions.get(tenant, session_id)
        sandbox = await self._sessions.sandbox_for(tenant, session_id)
        kept = self._sessions_kept.of(session_id)
        custom = await self._custom_listing(kept, stored, sandbox, refresh=kept.custom is None)
        session = configured(stored, custom)
        agent = await self._agent(kept, session, sandbox, asked.agent, custom)
        call_id = asked.call_id or ascending("call")
        if call_id in kept.calls:
            raise FailedPreconditionError(f"call {call_id!r} is already running in session {session_id}")
        mcp = await self._mcp_source(kept, session, sandbox)
        registry = self._registry.for_session(_config(session.config_json))
        tools = self._executable(custom, mcp, registry)
        if tool not in tools and tool.lower() not in tools:
            custom = await self._custom_listing(kept, stored, sandbox, refresh=True)  # a tool file added since
            refreshed = configured(stored, custom)
            if refreshed.config_json != session.config_json:
                session = refreshed
                agent = await self._agent(kept, session, sandbox, asked.agent, custom)
                registry = self._registry.for_session(_config(session.config_json))
            tools = self._executable(custom, mcp, registry)
        caller = self._caller_scope(kept, tenant, session, agent)
        tools = {tool_id: bound(info, caller) for tool_id, info in tools.items()}
        home = await self._home(kept, sandbox)
        ruleset, ceiling, _ = self._session_rules(session, agent)
        scope = CallScope(
            session_id=session_id, agent=agent.name, ruleset=ruleset, ceiling=ceiling, tools=tools,
            sandbox=self._sandbox_calls(sandbox), tenant=tenant, sandbox_hooks=frozenset(custom.hooks),
            policy=self._policy.rules(tenant, home=home), sandbox_id=sandbox.id,
            services=self._services(tenant, session, home, registry, custom),
            on_sandbox_lost=functools.partial(self._sessions.report_lost, session_id),
        )
        running = RunningCall(session_id, call_id, asyncio.Queue(), AbortSignal())
        self._sessions_kept.add_call(kept, running)
        request = CallRequest(session_id, tool, asked.args_json, call_id, asked.message_id)
        bus = self.bus

        def emit(event: CallEvent) -> None:
            running.events.put_nowait(event)
            if isinstance(event, StateChanged):
                bus.publish("tool.state", tenant, session_id, callID=call_id, tool=tool, status=event.status.value)
            elif isinstance(event, ToolLogged):
                bus.publish("tool.log", tenant, session_id, tool=tool, **event.properties())
            elif isinstance(event, SubCallEvent) and isinstance(event.event, StateChanged):
                bus.publish(
                    "tool.state", tenant, session_id, callID=event.call_id, tool=event.tool,
                    status=event.event.status.value, parentCallID=call_id,
                )

        async def drive() -> None:
            try:
                await self._executor.execute(scope, request, emit, running.abort)
            finally:
                self._sessions_kept.call_ended(running)
                running.events.put_nowait(None)

        running.task = asyncio.ensure_future(drive())
        return running

    # -- subtasks (the `task` tool's child sessions) ----------------------------------------------

    def announce(self, session_id: str, call_id: str, event: CallEvent) -> None:
        running = self._sessions_kept.call(session_id, call_id)
        if running is not None:
            running.events.put_nowait(event)

    def abort_calls(self, session_id: str) -> list[asyncio.Task[None]]:
        aborted = []
        kept = self._sessions_kept.get(session_id)
        for running in list(kept.calls.values()) if kept is not None else []:
            if running.task is not None:
                running.abort.set()
                aborted.append(running.task)
        return aborted

    def _caller_scope(
        self, kept: RuntimeSession, tenant: str, session: Session, agent: permission.Agent,
    ) -> CallerScope:
        skills = tuple(kept.custom.skills) if kept.custom is not None else ()
        assert kept.agents is not None, "made by _agent before any scope"
        return CallerScope(tenant, session, kept.agents[1], agent, self.subtasks, skills)

    @staticmethod
    def _session_rules(
        session: Session, agent: permission.Agent,
    ) -> tuple[permission.Ruleset, permission.Ruleset | None, set[str]]:
        """The rules calls of `agent` in the session obey, their ceiling (the same without the workspace's
        config layers, None when that changes nothing: rule_layers), and tools switched off for it."""
        caller = _caller_config(session)
        return rule_layers.session_rules(
            agent, _config(session.config_json), None if caller == session.config_json else _config(caller),
            child=bool(session.parent_id),
        )

    async def cancel(self, tenant: str, session_id: str, call_id: str) -> bool:
        await self._sessions.get(tenant, session_id)  # NotFound for another tenant's session
        running = self._sessions_kept.call(session_id, call_id)
        if running is None:
            return False
        running.abort.set()
        return True

    # -- permissions ----------------------------------------------------------------------------

    async def pending_permissions(self, tenant: str, session_id: str) -> list[PermissionRequested]:
        await self._sessions.get(tenant, session_id)
        return self.gate.pending(session_id)

    async def reply_permission(self, tenant: str, request_id: str, reply: Reply, message: str = "") -> None:
        session_id = self.gate.session_of(request_id)
        await self._sessions.get(tenant, session_id)
        await self.gate.reply(request_id, reply, message)

    # -- questions ------------------------------------------------------------------------------

    async def pending_questions(self, tenant: str, session_id: str) -> list[QuestionAsked]:
        await self._sessions.get(tenant, session_id)
        return self.questions.pending(session_id)

    async def reply_question(self, tenant: str, request_id: str, answers: list[list[str]], dismissed: bool) -> None:
        """Answers (or dismisses) a pending question; NotFound for another tenant's question."""
        session_id = self.questions.session_of(request_id)
        await self._sessions.get(tenant, session_id)
        if dismissed:
            self.questions.dismiss(request_id)
        else:
            self.questions.reply(request_id, answers)

    # -- helpers --------------------------------------------------------------------------------

    def _services(
        self, tenant: str, session: Session, home: str, registry: Registry, custom: CustomListing,
    ) -> SessionServices:
        bus, session_id = self.bus, session.id

        def publish(type_: str, **properties: Any) -> None:
            bus.publish(type_, tenant, session_id, **properties)

        plan = posixpath.join(home, PLANS_SUBDIR, f"{int(session.created_at * 1000)}-{session.id}.md")
        # Upstream's registry: the built-ins, then the project's file and plugin tools (MCP tools are not in it).
        builtins = [t for t in registry.tools("", "") if t.source is ToolSource.BUILTIN]
        registered = tuple(t.id for t in _with_extra(builtins, custom, None))
        return SessionServices(
            todos=self._todos, publish=publish, plan_path=plan, registered=registered, questions=self.questions,
        )

    def _executable(self, custom: CustomListing, mcp: McpSource | None, registry: Registry) -> dict[str, ToolInfo]:
        tools: dict[str, ToolInfo] = {}
        for tool in _with_extra(registry.all(), custom, mcp):
            tools[tool.id] = tool
        for tool_id, tool in self._extra_builtins.items():
            tools.setdefault(tool_id, tool)
        return tools

    async def _mcp_source(self, kept: RuntimeSession, session: Session, sandbox: Sandbox) -> McpSource | None:
        if self._mcp_factory is None:
            return None
        connecting = kept.mcp
        if connecting is None:
            connecting = kept.mcp = asyncio.ensure_future(self._mcp_factory(session.config_json, sandbox.agent))
        return await asyncio.shield(connecting)

    @staticmethod
    async def _custom_listing(
        kept: RuntimeSession, session: Session, sandbox: Sandbox, *, refresh: bool,
    ) -> CustomListing:
        if not refresh and kept.custom is not None:
            return kept.custom
        listing = await sandbox.agent.list_custom_tools(session.config_json, {})
        kept.custom = listing
        return listing

    @staticmethod
    async def _home(kept: RuntimeSession, sandbox: Sandbox) -> str:
        home = kept.home
        if home is None:
            home = kept.home = (await sandbox.agent.health()).tool_home
        return home

    async def _agent(
        self, kept: RuntimeSession, session: Session, sandbox: Sandbox, name: str, custom: CustomListing,
    ) -> permission.Agent:
        home = await self._home(kept, sandbox)
        cached = kept.agents
        key = (session.config_json, _caller_config(session), tuple(custom.skill_dirs), custom.worktree)
        if cached is not None and cached[0] == key:
            agents = cached[1]
        else:
            setting = rule_layers.AgentSetting(
                posixpath.join(home, TOOL_OUTPUT_SUBDIR), posixpath.join(home, PLANS_SUBDIR), home,
                tuple(custom.skill_dirs), self._env_permission, custom.worktree,
            )
            caller = _caller_config(session)  # differs when the workspace or a plugin hook added to it
            agents = rule_layers.session_agents(
                _config(session.config_json), None if caller == session.config_json else _config(caller), setting,
            )
            kept.agents = (key, agents)
        wanted = name or session.agent or "build"
        agent = agents.get(wanted)
        if agent is None:
            raise InvalidArgumentError(f"unknown agent {wanted!r}; known agents: {', '.join(agents)}")
        return agent

    def _forget_session(self, session_id: str) -> None:
        """Drops what was kept for an ended session (its running calls as they finish); its pending asks fail."""
        self._sessions_kept.end(session_id)
        self.gate.forget_session(session_id)
        self.subtasks.forget_session(session_id)
        self.questions.forget_session(session_id)
        self._executor.doom_loop.forget_session(session_id)


def configured(session: Session, custom: CustomListing) -> Session:
    """The session as its calls see it: its opencode.json with what the project plugins' `config` hooks may
    change (plugin_config). The stored session keeps its own config, which the hooks start from each time."""
    if not custom.config_json:
        return session
    text, _ = plugin_config.adopted_json(session.config_json, custom.config_json)
    if text == session.config_json:
        return session
    # The hooks are workspace code: what they add narrows the caller's rules at most (rule_layers).
    return dataclasses.replace(session, config_json=text, caller_config_json=_caller_config(session))


def unadopted(session: Session, custom: CustomListing) -> list[tuple[str, str]]:
    """Load errors for what the plugins' `config` hooks changed that the session does not take."""
    if not custom.config_json:
        return []
    return [(plugin_config.ORIGIN, note) for note in plugin_config.adopted_json(session.config_json,
                                                                               custom.config_json)[1]]


def _with_extra(builtins: list[ToolInfo], listing: CustomListing, mcp: McpSource | None) -> list[ToolInfo]:
    """Built-ins, custom tools, then MCP tools, one entry per id: a later definition replaces an
    earlier one in its place (upstream's tool map is a JavaScript object keyed by id)."""
    tools = {tool.id: tool for tool in builtins}
    for spec in listing.tools:
        tools[spec.id] = custom_tool(spec)
    for tool in mcp.tools() if mcp is not None else []:
        tools[tool.id] = tool
    return list(tools.values())


def _caller_config(session: Session) -> str:
    """The caller's own config: without the workspace's project config and the plugins' config hooks."""
    return session.config_json if session.caller_config_json is None else session.caller_config_json


def _config(text: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FailedPreconditionError(f"the session's opencode.json is not valid JSON: {exc}") from exc
    return value if isinstance(value, dict) else {}
