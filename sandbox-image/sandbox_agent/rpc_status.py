"""What an agent RPC handler needs of its call, without grpc: the status codes it ends a call with and the
context it is given (the caller's metadata, `abort`).

The same handlers serve the framed socket (frames.py) and, where the agent must, gRPC (grpc_serving.py): a
Docker-provider agent never imports grpc at all (grpcio alone is about 20 MiB of an idle sandbox and its
EventEngine's wake-ups most of an idle agent's CPU), so the handlers name codes by this enum, whose names are
gRPC's, and the gRPC adapter turns them into grpc.StatusCode by name.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, NoReturn, Protocol

from sandbox_agent.errors import AgentError


class Code(enum.Enum):
    """gRPC's status codes, by the same names (the control plane maps them to its errors: map_agent_error)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


def code_named(name: str) -> Code | None:
    """The code of that exact name (what a helper process printed), or None."""
    return Code.__members__.get(name) if name.isupper() else None


class CallAbortedError(AgentError):
    """A framed call a handler ended with a status (its `context.abort`): the frames server sends the status."""

    def __init__(self, code: Code, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class RequestsLostError(AgentError):
    """The caller's request stream broke off (it went away before it ended its requests)."""


class CallContext(Protocol):
    def invocation_metadata(self) -> Sequence[tuple[str, Any]]: ...

    async def abort(self, code: Code, details: str) -> NoReturn: ...


class FramedContext:
    """A framed call's context: the metadata its OPEN frame carried."""

    def __init__(self, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self._metadata = tuple(metadata)

    def invocation_metadata(self) -> Sequence[tuple[str, Any]]:
        return self._metadata

    async def abort(self, code: Code, details: str) -> NoReturn:
        raise CallAbortedError(code, details)
