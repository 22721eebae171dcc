"""The sandbox agent: a gRPC server inside each session's container.

It runs as uid 0 holding only CAP_SETUID, CAP_SETGID and CAP_KILL, and starts every tool process
under the unprivileged tool uid in a process group of its own, so a command can neither signal,
trace nor replace the agent, while the agent can always stop the command's whole group.
"""

from sandbox_agent.grpc_poller import prefer_poller

prefer_poller()

__version__ = "0.1.0"
