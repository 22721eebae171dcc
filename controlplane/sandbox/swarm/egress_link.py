"""A Swarm sandbox's way out: the control plane's end of the relay's `egress` op.

The session's proxy (controlplane/egress_proxy) runs in the control plane and listens on a Unix socket here, as
on one host; the sandbox's agent forwards its tools' connections to `egress.sock` beside its agent socket on its
node. The relay on that node listens there, and every connection is carried back over one of the `egress`
streams this link keeps waiting at the relay (mutual TLS, opened by the control plane: the nodes never dial the
control plane, and the sandbox's overlay keeps no route out). The relay decides nothing; the proxy does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from controlplane.errors import SandboxLostError
from controlplane.sandbox.layout import EGRESS_PORT
from controlplane.sandbox.swarm.relay import EGRESS_MAX, splice

if TYPE_CHECKING:
    from controlplane.sandbox.swarm.channel import LocalForward

log = logging.getLogger("controlplane.sandbox.swarm")

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
IDLE = 4
"""Streams kept waiting at the relay: a burst of new connections (pip's parallel downloads) finds one at once;
each one used is replaced, so the next waits at most one round trip."""
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0


class EgressLink:
    """Keeps IDLE `egress` streams waiting at one sandbox's relay and splices each one the relay hands a sandbox
    connection to the session proxy's socket at `proxy_path`."""

    def __init__(self, open_egress: Callable[[], Awaitable[Streams]], proxy_path: Path, idle: int = IDLE,
                 max_active: int = EGRESS_MAX) -> None:
        self._open_egress = open_egress
        self.proxy_path = proxy_path
        self._idle = idle
        self._slots = asyncio.Semaphore(max_active)
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._closed = False

    def start(self) -> None:
        for _ in range(self._idle):
            self._spawn(self._wait_loop())

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wait_loop(self) -> None:
        """One waiting stream at a time: opened, handed a connection (carried by its own task), opened again.
        A relay that is away (a node restarting it, a plane adopting sessions) is retried with a backoff."""
        retry = RETRY_FIRST_S
        while not self._closed:
            await self._slots.acquire()
            carried = False
            try:
                streams = await self._open_egress()
                if self._closed:  # Python 3.11's wait_for can swallow the cancel of close() as it completes
                    streams[1].close()
                    return
                self._writers.add(streams[1])
                line = await streams[0].readline()  # nothing until the sandbox connects
                if line.strip() == b'{"accepted": true}':
                    self._spawn(self._carry(streams))
                    carried = True
                    retry = RETRY_FIRST_S
                    continue
                streams[1].close()
                self._writers.discard(streams[1])
            except (TimeoutError, ConnectionError, OSError, ssl.SSLError, ValueError) as exc:
                log.debug("egress stream to the relay: %s", exc or type(exc).__name__)
            finally:
                if not carried:
                    self._slots.release()
            await asyncio.sleep(retry)
            retry = min(retry * 2, RETRY_MAX_S)

    async def _carry(self, streams: Streams) -> None:
        proxy: Streams | None = None
        try:
            try:
                proxy = await asyncio.open_unix_connection(str(self.proxy_path))
            except OSError:
                streams[1].close()  # the proxy is gone (session ending): the sandbox's client sees the close
                return
            self._writers.add(proxy[1])
            await splice(streams, proxy)
        finally:
            self._writers.discard(streams[1])
            if proxy is not None:
                self._writers.discard(proxy[1])
            self._slots.release()

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        # Closed before waiting too: a stream's end ends its task even where the cancel was lost (above).
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._writers.clear()


class _Reached(Protocol):
    @property
    def forward(self) -> LocalForward: ...


class SwarmNetworks:
    """The Swarm provider's part of the network seam (SandboxProvider.network_port/network_socket), apart from
    provider.py: the session proxy listens beside the sandbox's agent forwarder here, and the link to its relay
    starts with the first open (again on a plane that adopts the session)."""

    _live: Mapping[str, _Reached]
    _attached: Mapping[str, _Reached]
    network_port: int | None = EGRESS_PORT

    def network_socket(self, sandbox_id: str) -> str:
        remote = self._live.get(sandbox_id) or self._attached.get(sandbox_id)
        if remote is None:
            raise SandboxLostError(f"sandbox {sandbox_id} does not exist (any more)")
        return str(remote.forward.carry_egress())
