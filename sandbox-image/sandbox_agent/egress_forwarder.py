"""A session's way out: a TCP listener on the sandbox's own loopback that relays each connection, byte for byte,
to the control plane's proxy on the Unix socket beside the agent's.

The container keeps `--network none`, so the sandbox has no route anywhere and no DNS; this relay decides
nothing (the proxy vets, resolves and connects), it only carries bytes between the tools and the one socket
the control plane listens on. The agent runs it rather than a tool process, because the socket's directory
is the agent's (mode 0700, root): the tool user can reach the proxy only through here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from sandbox_agent.errors import AgentError

SOCKET_NAME = "egress.sock"
"""The proxy's socket, in the agent's socket dir (controlplane/sandbox/layout.py names it too)."""
MAX_CONNECTIONS = 256
"""Open connections at once; past it a new one waits for a slot (the proxy caps each session's own too)."""
CHUNK = 64 * 1024
SYSTEM_CAS = "/etc/ssl/certs/ca-certificates.crt"
NO_PROXY = "localhost,127.0.0.1,::1"


class NetworkStartError(AgentError):
    """The forwarder could not listen (its port taken) or was started twice."""

    status = "FAILED_PRECONDITION"


def proxy_env(port: int, ca_bundle: str | None) -> dict[str, str]:
    """What every tool process gets once the network is up. curl reads only the lower-case `http_proxy`, most
    others either; npm reads its own config variables; git and pip go through the standard ones (each is
    exercised in tests/docker/test_egress_tools.py)."""
    url = f"http://127.0.0.1:{port}"
    env = {
        "HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
        "NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY,
        "npm_config_proxy": url, "npm_config_https_proxy": url,
    }
    if ca_bundle:
        names = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS",
                 "CURL_CA_BUNDLE")
        env |= dict.fromkeys(names, ca_bundle)
    return env


def write_ca_bundle(ca_pem: bytes, directory: str = "/tmp", system: str = SYSTEM_CAS) -> str:
    """A new file of the system CAs followed by the session CA, world-readable; its path. Written by the agent
    (root) under a random name it creates itself (O_EXCL): a tool process can neither plant the file beforehand
    nor change it afterwards (/tmp is sticky), so it cannot change what the other tools trust."""
    import shutil  # only here: StartNetwork is rare, and tempfile costs every idle agent about 0.2 MiB
    import tempfile

    fd, path = tempfile.mkstemp(prefix=".ocsb-egress-ca-", suffix=".pem", dir=directory)
    with os.fdopen(fd, "wb") as out:
        with contextlib.suppress(FileNotFoundError), open(system, "rb") as cas:
            shutil.copyfileobj(cas, out)
            out.write(b"\n")
        out.write(ca_pem)
        os.fchmod(out.fileno(), 0o644)
    return path


class EgressForwarder:
    """127.0.0.1:PORT -> the proxy's Unix socket, one Unix connection per accepted TCP connection."""

    def __init__(self, proxy_socket: str, max_connections: int = MAX_CONNECTIONS) -> None:
        self._proxy_socket = proxy_socket
        self._slots = asyncio.Semaphore(max_connections)
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, port: int) -> int:
        if self._server is not None:
            raise NetworkStartError("the session's network is already started")
        try:
            # Loopback only: the sandbox has no other interface, and a local provider's agent (a host process,
            # tests) must not offer the proxy to the machine's network.
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", port, reuse_address=True)
        except OSError as exc:
            raise NetworkStartError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from exc
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for relay in list(self._relays):
            relay.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        try:
            async with self._slots:
                await self._relay(reader, writer)
        finally:
            self._relays.discard(task)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self._proxy_socket)
        except OSError:
            # The proxy is gone (session ending, plane restarting): the client sees a closed connection.
            writer.close()
            return
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copies until `source` ends, then half-closes `sink` (a client that shut its write side still gets the
    rest of the answer)."""
    try:
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (ConnectionError, OSError):
        sink.close()
