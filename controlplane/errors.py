"""The control plane's exception tree; the rpc layer maps `code` to a gRPC status in one place.

ControlPlaneError
├── InvalidArgumentError        the request is malformed
├── UnauthenticatedError        no or unknown bearer token
├── NotFoundError               unknown (or another tenant's) session
├── FailedPreconditionError     the session is not in a state that allows this
├── ResourceExhaustedError      a limit was reached (archive too large, ...)
├── ConfigError                 operator configuration is invalid
└── SandboxError                the sandbox could not be had or was lost
    ├── HardeningError          a required hardening option could not be applied (fail closed)
    ├── SandboxStartError       the container or its agent did not come up
    └── SandboxLostError        the container died or vanished
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


class HardeningError(SandboxError):
    code = ErrorCode.FAILED_PRECONDITION


class SandboxStartError(SandboxError):
    pass


class SandboxLostError(SandboxError):
    pass
