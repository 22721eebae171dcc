"""The agent's exception tree.

AgentError
├── SpawnError          the command could not be started (missing program, bad cwd)
└── WorkspacePathError  a path names something outside the workspace
"""


class AgentError(Exception):
    """Root of every error the agent raises on purpose."""


class SpawnError(AgentError):
    """The command could not be started."""


class WorkspacePathError(AgentError, ValueError):
    """A path leaves the workspace."""
