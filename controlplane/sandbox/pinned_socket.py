"""An agent's Unix socket reached through its own inode, never through whatever its name leads to later.

The socket lives in a directory the sandbox's agent writes (root in its container): a compromised agent could put a
symlink in the socket's place, and a connect by name (gRPC's, on every reconnect) would follow it to any socket of
the host, another sandbox's agent included, and send it this session's calls. So the name is opened once, without
following links (`O_PATH | O_NOFOLLOW`); only a socket is taken; and every connect goes through
`/proc/self/fd/N`, which names that inode whatever the directory holds afterwards.
"""

from __future__ import annotations

import os
import stat
import weakref
from collections.abc import Callable

from controlplane.errors import SandboxError


class PinnedSocket:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._closing: Callable[[], object] | None = None
        self._closed = False

    def target(self) -> str | None:
        """`unix:/proc/self/fd/N` once the socket exists (pinned from then on); None while it does not yet, and once
        closed (its descriptor's number may name another file by then)."""
        if self._closed:
            return None
        if self._fd is None:
            try:
                fd = os.open(self.path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise SandboxError(f"the agent socket {self.path} cannot be opened: {exc.strerror}") from exc
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
                raise SandboxError(f"the agent socket {self.path} is not a socket (a link or a file the sandbox put "
                                   "there): not connected")
            self._fd = fd
            self._closing = weakref.finalize(self, os.close, fd)  # also when dropped without close()
        return f"unix:/proc/self/fd/{self._fd}"

    def close(self) -> None:
        """Closes the pinned descriptor (once; the agent's channel is closed first)."""
        self._closed = True
        if self._closing is not None:
            self._closing()
