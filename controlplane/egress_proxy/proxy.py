"""One session's vetting HTTP proxy, listening on a Unix socket in the session's socket dir.

For every CONNECT and every absolute-URI request: the host must pass the session's NetworkRules, its name
is resolved once by the proxy (the `[egress] hosts` map first), each address is vetted by the operator's
guard (controlplane.egress), and the proxy connects to the vetted address itself, so a second DNS answer
cannot move the connection. A CONNECT tunnel is bytes to that one address; a plain-HTTP connection is
parsed request by request, and a request for another host is vetted again. Redirects are passed back to
the client untouched. Every byte both ways goes through the session's ByteMeter.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from controlplane.egress import (
    METADATA_HOSTS,
    EgressPolicy,
    EgressRefusedError,
    FetchConnectError,
    FetchFailedError,
    IPAddress,
    refusal_reason,
)
from controlplane.egress_proxy import proxy_http, relay
from controlplane.egress_proxy.accounting import trace_connection
from controlplane.egress_proxy.rules import HostPattern, NetworkRules, ip_literal, normal_host
from controlplane.egress_proxy.types import ByteMeter, ConnectionRecord, Credential, EgressBudgetError, Interceptor
from controlplane.errors import InvalidArgumentError

log = logging.getLogger(__name__)

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""(name, port) -> addresses as text; the system resolver unless a test or site gives its own."""


@dataclass(frozen=True)
class ProxyLimits:
    """Bounds on what one session's proxy holds open (a sandbox must not exhaust the control plane)."""

    max_head: int = 64 * 1024
    """Largest request or response head, and longest chunk-size line."""
    max_connections: int = 64
    """Client connections open at once; more are answered 503."""
    head_timeout_s: float = 60.0
    """How long a client connection may sit without sending its next request head."""
    idle_timeout_s: float = 300.0
    """How long a tunnel or a transfer may pass no byte either way."""
    resolve_timeout_s: float = 10.0
    connect_timeout_s: float = 15.0


class SessionProxy:
    """The proxy of one session: `start(path)` listens, `close()` stops it and cuts every connection."""

    def __init__(self, *, session_id: str, tenant: str, rules: NetworkRules, guard: EgressPolicy,
                 static_hosts: Mapping[str, str], meter: ByteMeter, credentials: Sequence[Credential],
                 interceptor: Interceptor | None, on_record: Callable[[ConnectionRecord], None],
                 resolver: Resolver | None = None, limits: ProxyLimits | None = None) -> None:
        self.session_id = session_id
        self.tenant = tenant
        self.rules = rules
        self.guard = guard
        self.static_hosts = {_static_key(k): str(ipaddress.ip_address(v)) for k, v in static_hosts.items()}
        self.meter = meter
        self._credentials = tuple((HostPattern.parse(c.host), _checked(c)) for c in credentials)
        self.interceptor = interceptor
        self.on_record = on_record
        self.resolver = resolver or _system_resolver
        self.limits = limits or ProxyLimits()
        self._server: asyncio.AbstractServer | None = None
        self._path: Path | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def start(self, path: Path) -> None:
        """Listens on the Unix socket `path` (replacing a stale one), world-connectable: the sandbox's agent
        runs as another uid, and the socket dir's own mode is what keeps other sessions out."""
        await asyncio.to_thread(_remove_socket, path)
        self._server = await asyncio.start_unix_server(self._accept, path=str(path), limit=self.limits.max_head)
        os.chmod(path, 0o666)
        self._path = path

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        if self._path is not None:
            await asyncio.to_thread(_remove_socket, self._path)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._server is None or len(self._connections) >= self.limits.max_connections:
            message = (f"ocsb egress: this session already has {self.limits.max_connections} connections open "
                       "through its proxy")
            self.record("", 0, "", "refused", message, 0, 0)
            await relay.answer(writer, 503, message)
            await relay.close(reader, writer)
            return
        self._connections[task] = writer
        try:
            await _ClientConnection(self, reader, writer).run()
        except asyncio.CancelledError:
            # Our own close() cancels the handlers; the stream server would log a cancelled handler as an error.
            if self._server is not None:
                raise
        finally:
            del self._connections[task]
            await relay.close(reader, writer)

    # -- decisions ---------------------------------------------------------------------------------

    async def vet(self, host: str, port: int) -> tuple[str, tuple[IPAddress, ...]]:
        """(normal name, addresses to connect to, in order); EgressRefusedError when either policy refuses."""
        name = normal_host(host)
        if name is None:
            raise InvalidArgumentError(f"ocsb egress: {host[:100]!r} is not a host name")
        if not self.rules.allows(name, port):
            raise EgressRefusedError(f"ocsb egress: host {name} (port {port}) is not in this session's network policy")
        trusted = self.guard.allows_host(name)
        if name in METADATA_HOSTS and not trusted:
            raise EgressRefusedError(f"ocsb egress: host {name} is a cloud metadata host, refused by the "
                                     "operator's egress policy")
        literal = ip_literal(name)
        addresses = (literal,) if literal is not None else await self._resolve(name, port)
        if not trusted:
            for address in addresses:
                reason = refusal_reason(address)
                if reason is not None and not self.guard.allows_address(address):
                    what = f"{address} is" if literal is not None else f"host {name} resolves to {address},"
                    raise EgressRefusedError(f"ocsb egress: {what} {reason}, refused by the operator's egress policy")
        return name, addresses

    async def _resolve(self, name: str, port: int) -> tuple[IPAddress, ...]:
        static = self.static_hosts.get(name)
        if static is not None:
            return (ipaddress.ip_address(static),)
        try:
            answers = await asyncio.wait_for(self.resolver(name, port), self.limits.resolve_timeout_s)
        except (TimeoutError, OSError) as exc:
            raise FetchFailedError(f"ocsb egress: cannot resolve host {name}: {exc or 'timed out'}") from exc
        found: dict[IPAddress, None] = {}
        for answer in answers:
            # A scoped link-local answer ("fe80::1%eth0") is still link-local: classify it without the scope.
            found[ipaddress.ip_address(answer.split("%", 1)[0])] = None
        if not found:
            raise FetchFailedError(f"ocsb egress: host {name} has no address")
        return tuple(found)

    def credential_for(self, name: str, port: int) -> Credential | None:
        for pattern, credential in self._credentials:
            if pattern.matches(name, port):
                return credential
        return None

    async def connect(self, name: str, port: int, addresses: Sequence[IPAddress]
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str]:
        """A connection to the first vetted address that answers (never to anything else)."""
        failure: BaseException | None = None
        for address in addresses:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(str(address), port, limit=self.limits.max_head),
                    self.limits.connect_timeout_s)
            except (TimeoutError, OSError) as exc:
                failure = exc
                continue
            return reader, writer, str(address)
        raise FetchConnectError(f"ocsb egress: cannot connect to {name} port {port}: {failure or 'no address'}")

    def record(self, host: str, port: int, address: str, decision: str, reason: str, up: int, down: int,
               intercepted: bool = False, started_ns: int | None = None) -> None:
        record = ConnectionRecord(
            session_id=self.session_id, tenant=self.tenant, host=host, port=port, address=address,
            decision=decision, reason=reason, bytes_up=up, bytes_down=down, intercepted=intercepted)
        trace_connection(record, started_ns or time.time_ns())
        try:
            self.on_record(record)
        except Exception:  # accounting's failure must not end the connection it describes
            log.exception("could not account for an egress connection of session %s", self.session_id)


class _ConnectionMeter(ByteMeter):
    """One upstream connection's bytes, passed on to the session's meter (which holds the budget)."""

    def __init__(self, session: ByteMeter) -> None:
        super().__init__(None)
        self._session = session

    def add(self, *, up: int = 0, down: int = 0) -> None:
        self._session.add(up=up, down=down)
        super().add(up=up, down=down)


@dataclass
class _Upstream:
    name: str
    port: int
    address: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    meter: _ConnectionMeter
    credential: Credential | None
    started_ns: int


class _ClientConnection:
    """One client connection: a CONNECT tunnel, or a run of plain-HTTP requests."""

    def __init__(self, proxy: SessionProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.limits = proxy.limits
        self.reader = reader
        self.writer = writer
        self.upstream: _Upstream | None = None
        self.cut_reason = ""
        self.started_ns = time.time_ns()
        """When the request being answered arrived (a span's start)."""

    async def run(self) -> None:
        try:
            while True:
                try:
                    raw = await proxy_http.read_head(self.reader, self.limits.head_timeout_s)
                    if raw is None:
                        return
                    head = proxy_http.parse_head(raw, request=True)
                    self.started_ns = time.time_ns()
                except TimeoutError:
                    return
                except InvalidArgumentError as exc:
                    await relay.answer(self.writer, 400, f"ocsb egress: bad request: {exc}")
                    return
                if head.start[0] == "CONNECT":
                    await self._tunnel(head)
                    return
                if not await self._forward(head):
                    return
        except EgressBudgetError as exc:
            self.cut_reason = str(exc)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, InvalidArgumentError) as exc:
            self.cut_reason = f"cut: {type(exc).__name__}: {exc}"[:300]
        finally:
            await self._drop_upstream()

    async def _vet(self, host: str, port: int) -> tuple[str, tuple[IPAddress, ...]] | None:
        """The vetted destination, or None once the client was answered 400, 403 or 502."""
        try:
            return await self.proxy.vet(host, port)
        except EgressRefusedError as exc:
            self.proxy.record(normal_host(host) or host[:100], port, "", "refused", str(exc), 0, 0,
                              started_ns=self.started_ns)
            await relay.answer(self.writer, 403, str(exc))
        except InvalidArgumentError as exc:
            await relay.answer(self.writer, 400, str(exc))
        except FetchFailedError as exc:
            self.proxy.record(normal_host(host) or host[:100], port, "", "refused", str(exc), 0, 0,
                              started_ns=self.started_ns)
            await relay.answer(self.writer, 502, str(exc))
        return None

    async def _open(self, name: str, port: int, addresses: Sequence[IPAddress]) -> _Upstream | None:
        try:
            reader, writer, address = await self.proxy.connect(name, port, addresses)
        except FetchConnectError as exc:
            self.proxy.record(name, port, str(addresses[0]), "refused", str(exc), 0, 0, started_ns=self.started_ns)
            await relay.answer(self.writer, 502, str(exc))
            return None
        return _Upstream(name, port, address, reader, writer, _ConnectionMeter(self.proxy.meter),
                         self.proxy.credential_for(name, port), self.started_ns)

    async def _drop_upstream(self) -> None:
        upstream, self.upstream = self.upstream, None
        if upstream is None:
            return
        await relay.close(None, upstream.writer)
        self.proxy.record(upstream.name, upstream.port, upstream.address, "allowed", self.cut_reason,
                          upstream.meter.up, upstream.meter.down, started_ns=upstream.started_ns)

    # -- CONNECT -----------------------------------------------------------------------------------

    async def _tunnel(self, head: proxy_http.Head) -> None:
        target = proxy_http.authority(head.start[1], default_port=None)
        if target is None:
            await relay.answer(self.writer, 400, f"ocsb egress: bad CONNECT target {head.start[1][:100]!r} (host:port)")
            return
        vetted = await self._vet(*target)
        if vetted is None:
            return
        name, addresses = vetted
        port = target[1]
        credential = self.proxy.credential_for(name, port)
        interceptor = self.proxy.interceptor
        if credential is not None and interceptor is not None:
            await self._intercept(interceptor, name, port, str(addresses[0]), credential)
            return
        self.upstream = await self._open(name, port, addresses)
        if self.upstream is None:
            return
        self.writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await self.writer.drain()
        await relay.splice(self.reader, self.writer, self.upstream.reader, self.upstream.writer, self.upstream.meter,
                      self.limits.idle_timeout_s)

    async def _intercept(self, interceptor: Interceptor, name: str, port: int, address: str,
                         credential: Credential) -> None:
        meter = _ConnectionMeter(self.proxy.meter)
        self.writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await self.writer.drain()
        reason = ""
        try:
            await interceptor.intercept(self.reader, self.writer, session_id=self.proxy.session_id, host=name,
                                        port=port, address=address, credential=credential, meter=meter)
        except EgressBudgetError as exc:
            reason = str(exc)
        except Exception as exc:  # the broker's failure ends this connection only, and is on the record
            reason = f"cut: {type(exc).__name__}: {exc}"[:300]
        finally:
            self.proxy.record(name, port, address, "allowed", reason, meter.up, meter.down, intercepted=True,
                              started_ns=self.started_ns)

    # -- absolute-URI requests ---------------------------------------------------------------------

    async def _forward(self, head: proxy_http.Head) -> bool:
        """Sends one request on and its response back; whether the client connection stays open."""
        method, target, version = head.start
        parsed = proxy_http.absolute_http(target)
        if parsed is None:
            await relay.answer(self.writer, 400, f"ocsb egress: {target[:100]!r} is not an absolute http:// URL (use "
                                            "CONNECT for https)")
            return False
        host, port, path = parsed
        try:
            framing = proxy_http.request_framing(head)
        except InvalidArgumentError as exc:
            await relay.answer(self.writer, 400, f"ocsb egress: bad request: {exc}")
            return False
        current = self.upstream
        # A server that closed the kept-alive connection meanwhile gets a new one (resolved and vetted again).
        if current is None or (current.name, current.port) != (normal_host(host), port) or current.reader.at_eof():
            await self._drop_upstream()
            vetted = await self._vet(host, port)
            if vetted is None:
                return False
            self.upstream = await self._open(vetted[0], port, vetted[1])
            if self.upstream is None:
                return False
        upstream = self.upstream
        assert upstream is not None
        expects = "100-continue" in head.tokens("expect")
        upstream.writer.write(self._request_head(head, upstream, path))
        await upstream.writer.drain()
        if expects:
            # Answered here: forwarding the expectation would leave the client waiting while the body waits.
            self.writer.write(f"{version} 100 Continue\r\n\r\n".encode())
            await self.writer.drain()
        await proxy_http.relay_body(framing, self.reader, upstream.writer, lambda n: upstream.meter.add(up=n),
                               self.limits.idle_timeout_s)
        try:
            head_of_response = await self._response_head(upstream)
        except (InvalidArgumentError, TimeoutError, OSError) as exc:
            # Nothing of a response reached the client yet: it can still be told what went wrong.
            self.cut_reason = f"bad response: {exc}"[:300]
            await relay.answer(self.writer, 502, f"ocsb egress: {upstream.name} sent no usable response: {exc}"[:300])
            return False
        return await self._respond(method, head.wants_close(), upstream, head_of_response)

    async def _response_head(self, upstream: _Upstream) -> proxy_http.Head:
        raw = await proxy_http.read_head(upstream.reader, self.limits.idle_timeout_s)
        if raw is None:
            raise proxy_http.BadMessage("the server closed the connection without a response")
        head = proxy_http.parse_head(raw, request=False)
        if head.start[1] == "101":
            raise proxy_http.BadMessage("the server switched protocols although no upgrade was forwarded")
        return head

    def _request_head(self, head: proxy_http.Head, upstream: _Upstream, path: str) -> bytes:
        drop = proxy_http.HOP_BY_HOP | head.tokens("connection") | {"host", "expect"}
        if upstream.credential is not None:
            drop |= {upstream.credential.header.lower()}
        headers = [(k, v) for k, v in head.headers if k.lower() not in drop]
        host = f"[{upstream.name}]" if ":" in upstream.name else upstream.name
        headers.insert(0, ("Host", host if upstream.port == 80 else f"{host}:{upstream.port}"))
        if upstream.credential is not None:
            headers.append((upstream.credential.header, upstream.credential.value))
        data = proxy_http.serialize((head.start[0], path, "HTTP/1.1"), headers)
        upstream.meter.add(up=len(data))
        return data

    async def _respond(self, method: str, client_close: bool, upstream: _Upstream, head: proxy_http.Head) -> bool:
        while True:
            status = int(head.start[1])
            framing = proxy_http.response_framing(head, method)
            close = client_close or framing.kind == "close"  # the server's own close ends only its connection
            drop = proxy_http.HOP_BY_HOP | head.tokens("connection")
            if head.values("transfer-encoding"):
                # Transfer-Encoding decides, as it did here: a Content-Length beside it would let the client
                # read the body differently from the proxy.
                drop |= {"content-length"}
            headers = [(k, v) for k, v in head.headers if k.lower() not in drop]
            if close and status >= 200:
                headers.append(("Connection", "close"))
            data = proxy_http.serialize(("HTTP/1.1", head.start[1], head.start[2]), headers)
            upstream.meter.add(down=len(data))
            self.writer.write(data)
            await self.writer.drain()
            if status >= 200:
                break
            head = await self._response_head(upstream)
        await proxy_http.relay_body(framing, upstream.reader, self.writer, lambda n: upstream.meter.add(down=n),
                               self.limits.idle_timeout_s)
        if head.wants_close() or framing.kind == "close":
            await self._drop_upstream()
        return not close


def _remove_socket(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_socket():
            path.unlink()


def _checked(credential: Credential) -> Credential:
    # Written into request heads as they are: a line break would let a value add headers of its own.
    for part in (credential.header, credential.value):
        if not part or any(c in part for c in "\r\n\0"):
            raise InvalidArgumentError(f"egress credential for {credential.host}: the header name and value must "
                                       "each be one non-empty line")
    return credential


def _static_key(name: str) -> str:
    key = normal_host(name)
    if key is None:
        raise InvalidArgumentError(f"egress hosts: {name!r} is not a host name")
    return key


async def _system_resolver(name: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]
