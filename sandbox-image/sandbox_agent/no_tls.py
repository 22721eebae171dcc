"""The agent's process makes no TLS connection, so it does not load OpenSSL: an `ssl` module of names only.

asyncio and uvloop import `ssl` when they load and only read a few of its names (exception classes, three error
codes, the context class for isinstance tests); the real module loads and initialises OpenSSL's two libraries,
1.25 MiB of private memory in every sandbox (docs/performance.md, 2026-11-28), for TLS the agent never speaks:
it serves a Unix socket, and the egress forwarder relays bytes. This module stands in for `ssl` in the agent's
own process only (`install()`, called first by `__main__`); tools, tool hosts and the spawner helper are other
processes with the real module. Anything that tries TLS here fails with `NoTLSError` saying so, never silently.
"""

from __future__ import annotations

import sys
import types

from sandbox_agent.errors import AgentError

WHY = "the sandbox agent's process has no TLS (sandbox_agent/no_tls.py): it serves a Unix socket only"


class NoTLSError(AgentError):
    """Raised by every use of TLS in the agent's process."""


# The exception tree as the real module has it: code that catches these keeps working.
class SSLError(OSError):
    pass


class SSLZeroReturnError(SSLError):
    pass


class SSLWantReadError(SSLError):
    pass


class SSLWantWriteError(SSLError):
    pass


class SSLSyscallError(SSLError):
    pass


class SSLEOFError(SSLError):
    pass


class SSLCertVerificationError(SSLError, ValueError):
    pass


CertificateError = SSLCertVerificationError

# The real module's values (OpenSSL's SSL_ERROR_* codes): uvloop compares against them.
SSL_ERROR_WANT_READ = 2
SSL_ERROR_WANT_WRITE = 3
SSL_ERROR_SYSCALL = 5


class _Refused:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise NoTLSError(WHY)


class SSLContext(_Refused):
    pass


class SSLObject(_Refused):
    pass


class SSLSocket(_Refused):
    pass


class MemoryBIO(_Refused):
    pass


def create_default_context(*args: object, **kwargs: object) -> SSLContext:
    raise NoTLSError(WHY)


# They stand for the `ssl` module's own classes (their tree mirrors its tree, outside the agent's), and say so.
for _mirrored in (SSLError, SSLZeroReturnError, SSLWantReadError, SSLWantWriteError, SSLSyscallError, SSLEOFError,
                  SSLCertVerificationError, SSLContext, SSLObject, SSLSocket, MemoryBIO):
    _mirrored.__module__ = "ssl"


def install() -> bool:
    """Puts this module in place of `ssl` unless the real one is loaded already; whether it did."""
    if "ssl" in sys.modules:
        return False
    stand_in = types.ModuleType("ssl", __doc__)
    for name in ("SSLError", "SSLZeroReturnError", "SSLWantReadError", "SSLWantWriteError", "SSLSyscallError",
                 "SSLEOFError", "SSLCertVerificationError", "CertificateError", "SSL_ERROR_WANT_READ",
                 "SSL_ERROR_WANT_WRITE", "SSL_ERROR_SYSCALL", "SSLContext", "SSLObject", "SSLSocket", "MemoryBIO",
                 "create_default_context", "NoTLSError"):
        setattr(stand_in, name, globals()[name])
    sys.modules["ssl"] = stand_in
    return True
