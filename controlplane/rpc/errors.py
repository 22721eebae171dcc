"""The one place domain errors become gRPC statuses."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, TypeVar

import grpc

from controlplane.errors import ControlPlaneError, ErrorCode

STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}

R = TypeVar("R")


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], exc: ControlPlaneError) -> None:
    await context.abort(STATUS[exc.code], str(exc))


def unary(fn: Callable[[Any, Any, Any], Awaitable[R]]) -> Callable[[Any, Any, Any], Awaitable[R]]:
    """Maps ControlPlaneError raised by a unary handler to its status."""

    @wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> R:
        try:
            return await fn(self, request, context)
        except ControlPlaneError as exc:
            await abort_with(context, exc)
            raise  # unreachable: abort raises

    return wrapper
