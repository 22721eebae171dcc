"""The agent's exception tree.

AgentError
├── SpawnError          the command could not be started (missing program, bad cwd)
├── ExhaustedError      the sandbox ran out of something (disk space, quota, files, processes)
└── WorkspacePathError  a path names something outside the workspace
"""


class AgentError(Exception):
    """Root of every error the agent raises on purpose."""

    status = "INVALID_ARGUMENT"
    """The gRPC status name an RPC ends with when this error refuses it."""


class SpawnError(AgentError):
    """The command could not be started."""

    status = "FAILED_PRECONDITION"


class WorkspacePathError(AgentError, ValueError):
    """A path leaves the workspace."""


class ExhaustedError(AgentError):
    """The sandbox ran out of disk space, quota, file descriptors or processes: the call fails, the agent is fine."""

    status = "RESOURCE_EXHAUSTED"
