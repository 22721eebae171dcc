"""Test support for the session proxy: real servers on 127.0.0.1 (an HTTP/1.1 server with keep-alive and a
TCP echo server), a proxy on a Unix socket in the test's tmp dir, and raw clients. Nothing here reaches
any address but loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.egress import EgressPolicy
from controlplane.egress_proxy.proxy import ProxyLimits, Resolver, SessionProxy
from controlplane.egress_proxy.rules import NetworkRules
from controlplane.egress_proxy.types import ByteMeter, ConnectionRecord, Credential, Interceptor


@dataclass
class Seen:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


Route = Callable[[Seen], Awaitable[bytes]]


class _Loopback:
    """A TCP server of the test's own on 127.0.0.1 (an ephemeral port); subclasses serve its connections."""

    def __init__(self) -> None:
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class HttpUpstream(_Loopback):
    """A small HTTP/1.1 origin server on 127.0.0.1 that keeps connections alive and records requests."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Seen] = []
        self.routes: dict[str, Route] = {"/": self._hello}

    async def start(self) -> HttpUpstream:
        await self._listen()
        return self

    async def _hello(self, seen: Seen) -> bytes:
        return response(200, b"hello from upstream")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self._requests(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass  # a client that went away, or sent what this small server does not parse
        finally:
            writer.close()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            raw = await reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = [(k, v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)]
            names = {k.lower(): v for k, v in headers}
            body = b""
            if names.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    chunk = await reader.readexactly(size + 2)
                    if size == 0:
                        break
                    body += chunk[:-2]
            elif "content-length" in names:
                body = await reader.readexactly(int(names["content-length"]))
            seen = Seen(method, target, headers, body)
            self.seen.append(seen)
            route = self.routes.get(target.split("?")[0])
            writer.write(await route(seen) if route else response(404, b"no such route"))
            await writer.drain()


def response(status: int, body: bytes, *headers: tuple[str, str]) -> bytes:
    head = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers), "", ""]
    return "\r\n".join(head).encode() + body


class EchoServer(_Loopback):
    """A TCP server on 127.0.0.1 that sends back whatever it receives, and keeps it."""

    def __init__(self) -> None:
        super().__init__()
        self.received = bytearray()

    async def start(self) -> EchoServer:
        await self._listen()
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while data := await reader.read(65536):
                self.received += data
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


@dataclass
class Proxied:
    """A started proxy, its socket and what it recorded."""

    proxy: SessionProxy
    path: Path
    records: list[ConnectionRecord] = field(default_factory=list)

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(str(self.path))

    async def exchange(self, raw: bytes) -> bytes:
        """Sends `raw` on a new connection and reads until the proxy closes it."""
        reader, writer = await self.open()
        writer.write(raw)
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.read(-1), 10)
        finally:
            writer.close()


async def start_proxy(tmp_path: Path, *, allow_hosts: Sequence[str] = (), allow_cidrs: Sequence[str] = (),
                      operator_cidrs: Sequence[str] = (), operator_hosts: Sequence[str] = (),
                      static_hosts: dict[str, str] | None = None, budget: int | None = None,
                      credentials: Sequence[Credential] = (), interceptor: Interceptor | None = None,
                      resolver: Resolver | None = None, limits: ProxyLimits | None = None) -> Proxied:
    records: list[ConnectionRecord] = []
    proxy = SessionProxy(
        session_id="s-1", tenant="acme", rules=NetworkRules(allow_hosts, allow_cidrs),
        guard=EgressPolicy(allow_cidrs=tuple(operator_cidrs), allow_hosts=tuple(operator_hosts)),
        static_hosts=static_hosts or {}, meter=ByteMeter(budget), credentials=credentials,
        interceptor=interceptor, on_record=records.append, resolver=resolver or _no_lookups, limits=limits,
    )
    path = tmp_path / "egress.sock"
    await proxy.start(path)
    return Proxied(proxy, path, records)


async def _no_lookups(name: str, port: int) -> list[str]:
    # Tests name their hosts in the static map or give their own resolver: nothing asks the real DNS.
    raise OSError(f"no lookups in this test ({name})")


def split_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split(" ")[1]), headers, body
