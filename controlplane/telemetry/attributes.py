"""Span and metric attribute names shared by the control plane and the sandbox side.

Only plain string constants: importing this module must stay free of the SDK and of grpc.
"""

from __future__ import annotations

from typing import Final

TRACER_NAME: Final = "ocsandbox"
METER_NAME: Final = "ocsandbox"

# GenAI semantic conventions (tool execution).
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
OP_EXECUTE_TOOL: Final = "execute_tool"

# Our own namespace.
SESSION_ID: Final = "sandbox.session.id"
TENANT: Final = "sandbox.tenant"
SANDBOX_ID: Final = "sandbox.id"
TOOL_SOURCE: Final = "sandbox.tool.source"
TOOL_ORIGIN: Final = "sandbox.tool.origin"
TOOL_ID: Final = "sandbox.tool.id"
OUTCOME: Final = "sandbox.outcome"
TRUNCATED: Final = "sandbox.truncated"
OUTPUT_BYTES: Final = "sandbox.output.bytes"
POOL_HIT: Final = "sandbox.pool.hit"
PERMISSION: Final = "sandbox.permission"
PERMISSION_DECISION: Final = "sandbox.permission.decision"
PERMISSION_RULE: Final = "sandbox.permission.rule"
HOOK_NAME: Final = "sandbox.hook.name"
HOOK_PLUGIN: Final = "sandbox.hook.plugin"
MCP_SERVER: Final = "sandbox.mcp.server"
SANDBOX_PROCESS: Final = "sandbox.process"  # resource attribute of spans recorded in the sandbox
MCP_TOOL_COUNT: Final = "sandbox.mcp.tools"
PERMISSION_PATTERNS: Final = "sandbox.permission.patterns"

# Values of OUTCOME.
OUTCOME_OK: Final = "ok"
OUTCOME_ERROR: Final = "error"
OUTCOME_TIMEOUT: Final = "timeout"
OUTCOME_CANCELLED: Final = "cancelled"
OUTCOME_DENIED: Final = "denied"

# Values of PERMISSION_DECISION.
DECISION_ONCE: Final = "once"
DECISION_ALWAYS: Final = "always"
DECISION_REJECT: Final = "reject"
DECISION_AUTO_ALLOW: Final = "auto-allow"
DECISION_DENY: Final = "deny"

# Span names (the tool id follows after a space).
SPAN_INIT_TOOL: Final = "init_tool"
SPAN_EXECUTE_TOOL: Final = "execute_tool"
SPAN_CREATE_SESSION: Final = "create_session"
SPAN_ACQUIRE_SANDBOX: Final = "acquire_sandbox"
SPAN_PERMISSION: Final = "await_permission"
SPAN_HOOK: Final = "run_hook"
EVENT_PERMISSION: Final = "permission"
EVENT_TOOL_LOG: Final = "log"
"""A line a custom tool printed (console.*, print, logging), on its execute span; the sandbox's hosts put
the same on the init spans of a file's tools for what it printed while loading."""
LOG_LEVEL: Final = "log.level"
LOG_ORIGIN: Final = "log.origin"
LOG_TEXT: Final = "log.text"

# Metric names.
METRIC_TOOL_DURATION: Final = "ocsandbox.tool.duration"
METRIC_INIT_DURATION: Final = "ocsandbox.tool.init.duration"
METRIC_POOL_DEPTH: Final = "ocsandbox.pool.depth"
METRIC_POOL_HITS: Final = "ocsandbox.pool.hits"
METRIC_POOL_MISSES: Final = "ocsandbox.pool.misses"
METRIC_ACTIVE_SESSIONS: Final = "ocsandbox.sessions.active"
