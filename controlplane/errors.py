"""The control plane's exception tree: every exception class of the control plane process, wherever it is
defined, derives from ControlPlaneError and is drawn here (tests/unit/test_error_tree.py holds both true).
The rpc layer maps `code` to a gRPC status in one place.

ControlPlaneError
├── InvalidArgumentError        the request is malformed
│   └── WorkspaceTooLargeError  a client-side workspace directory over its bound (workspace_dir.py)
├── UnauthenticatedError        no or unknown bearer token
│   └── TokenDiedError          an open stream's token died (rpc/token_watch.py, internal)
├── NotFoundError               unknown (or another tenant's) session
├── FailedPreconditionError     the session is not in a state that allows this
├── ExecDeniedError             operator policy refuses a SandboxService.Exec (core/permissions/exec_policy.py)
├── TemplateDeniedError         the tenant may not use that template (core/sessions/templates.py)
├── ResourceExhaustedError      a limit was reached (archive too large, ...)
│   └── QuotaExceededError      a tenant's quota would be exceeded (core/tenants/quota.py)
├── ConfigError                 operator configuration is invalid
│   └── McpConfigError          an `mcp.{name}` entry that cannot be used (mcp/config.py)
├── SandboxError                the sandbox could not be had or was lost
│   ├── HardeningError          a required hardening option could not be applied (fail closed)
│   ├── SandboxStartError       the container or its agent did not come up
│   │   └── AgentProtocolError  its agent names less flow control than this plane requires (sandbox/agent_protocol.py)
│   ├── SandboxLostError        the container died or vanished
│   └── CopyLapsedError         a workspace copy got too little from the sandbox (core/sessions/workspace_spool.py)
├── StoreUnavailableError       the PostgreSQL store cannot be reached (store/postgres.py)
├── HttpMessageError            a message the credential broker will not relay (egress_proxy/http1.py)
├── ToolError                   a tool call failed; its text is what the model reads (core/calls/tool.py)
│   ├── RejectedError           the user refused without feedback (core/permissions/permission.py)
│   ├── CorrectedError          the user refused with feedback (core/permissions/permission.py)
│   ├── DeniedError             a configured rule denies the call (core/permissions/permission.py)
│   ├── QuestionRejectedError   the user dismissed a question (core/permissions/questions.py)
│   ├── HookError               a plugin hook failed or timed out (core/calls/hooks.py)
│   ├── ArgWorkerError          the argument worker ran out of memory or died with the call (core/calls/arg_worker.py)
│   └── McpCallError            an MCP tool call gave no result (mcp/servers.py)
├── EgressError                 an outbound request failed (egress.py)
│   ├── EgressRefusedError      the egress policy forbids the destination; nothing was connected to
│   ├── ResponseTooLargeError   the response is over the size cap
│   ├── FetchFailedError        resolution, connection, TLS or protocol failure
│   │   └── FetchConnectError   no connection could be made to any of the destination's addresses
│   ├── FetchTimeoutError       the request took too long
│   └── FetchAbortedError       the call was aborted
├── EgressBudgetError           a session's network byte budget is spent (egress_proxy/types.py)
├── _RefusedError               an MCP server this platform will not connect to (mcp/servers.py, internal)
├── _NotYamlError               frontmatter that is not YAML (core/config/agent_markdown.py, internal)
├── _EscapedError               an archive link climbs above the root (core/sessions/workspace_archive.py, internal)
├── _StoppedError               a cancelled copy's portable pass (core/sessions/portable_tar.py, internal)
└── _TooComplexError            an archive's links take too many steps (core/sessions/workspace_archive.py, internal)

Some classes also derive from the builtin they refine (InvalidArgumentError and ConfigError from ValueError,
NotFoundError from LookupError, SandboxError from RuntimeError): they mean what the builtin means, so code
written against the builtin (`except ValueError` around parsing a value, in a library or here) still catches
them.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    INVALID_ARGUMENT = "invalid_argument"
    UNAUTHENTICATED = "unauthenticated"
    NOT_FOUND = "not_found"
    FAILED_PRECONDITION = "failed_precondition"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    PERMISSION_DENIED = "permission_denied"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class ControlPlaneError(Exception):
    """Root of every error the control plane raises on purpose."""

    code: ErrorCode = ErrorCode.INTERNAL


class InvalidArgumentError(ControlPlaneError, ValueError):
    code = ErrorCode.INVALID_ARGUMENT


class UnauthenticatedError(ControlPlaneError):
    code = ErrorCode.UNAUTHENTICATED


class NotFoundError(ControlPlaneError, LookupError):
    code = ErrorCode.NOT_FOUND


class FailedPreconditionError(ControlPlaneError):
    code = ErrorCode.FAILED_PRECONDITION


class ResourceExhaustedError(ControlPlaneError):
    code = ErrorCode.RESOURCE_EXHAUSTED


class ConfigError(ControlPlaneError, ValueError):
    code = ErrorCode.INVALID_ARGUMENT


class SandboxError(ControlPlaneError, RuntimeError):
    code = ErrorCode.UNAVAILABLE


class CopyLapsedError(SandboxError):
    """A sandbox sent nothing of a workspace copy for too long, or too little while another tenant waited for a
    copy turn (copy_pace.py): its agent is broken or hostile, so the copy is given up (and not asked of it again
    as if it were honest)."""


class HardeningError(SandboxError):
    code = ErrorCode.FAILED_PRECONDITION


class SandboxStartError(SandboxError):
    pass


class AgentProtocolError(SandboxStartError):
    """The sandbox's agent is of an older image: it will never be usable by this plane, so no retry helps."""

    code = ErrorCode.FAILED_PRECONDITION


class SandboxLostError(SandboxError):
    pass
