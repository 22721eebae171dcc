"""The credential broker: TLS interception for the hosts that have a brokered credential, and only those.

For such a host the proxy hands the client's CONNECT over once it has vetted the destination. The broker ends
the client's TLS with a leaf from the session's own CA (controlplane/egress_proxy/session_ca.py), opens TLS to
the vetted address verifying the server as the CONNECT host (the system store plus the operator's
`upstream_ca`), and relays HTTP/1.1 requests one at a time, each with the credential's header set by the broker.
The secret is written only into requests to that verified upstream: never to the client, never into a message
the broker makes itself, and never before the upstream's certificate has been verified.

What a client in the sandbox cannot make it do: send a request for another host on the connection (a Host or
absolute-form target that is not the CONNECT host is 421, nothing forwarded), tunnel further (CONNECT, Upgrade
and websockets are refused), smuggle a second request past the broker's framing (strict parsing in http1.py),
or make it hold more than a bounded head plus one read buffer per direction.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import logging
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

from controlplane.egress_proxy import http1
from controlplane.egress_proxy.http1 import Framing, HttpMessageError, Input, Request
from controlplane.egress_proxy.session_ca import CA_VALIDITY, SessionCa
from controlplane.egress_proxy.tls_stream import ServerTlsStream
from controlplane.egress_proxy.types import ByteMeter, Credential, EgressBudgetError
from controlplane.errors import ConfigError

log = logging.getLogger(__name__)

_REASONS = {
    400: "Bad Request",
    405: "Method Not Allowed",
    421: "Misdirected Request",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    502: "Bad Gateway",
    504: "Gateway Timeout",
}

# Headers meaningful only between the client and the broker: the broker sets its own framing and Connection.
_HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te", b"trailer", b"upgrade",
    b"transfer-encoding", b"content-length",
}

_FRAMING = {b"transfer-encoding", b"content-length"}

_MAX_INTERIM = 16
"""1xx answers relayed before the final one; more is an upstream misbehaving."""


@dataclass(frozen=True)
class BrokerTimeouts:
    handshake: float = 30.0
    """The client's and the upstream's TLS handshakes (and the upstream's TCP connect)."""
    idle: float = 300.0
    """Nothing read from the side being waited on for this long ends the connection."""


class _Upstream:
    """One verified TLS connection to the vetted address."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.input = Input(reader.read)
        self._reader = reader
        self._writer = writer
        self.reusable = True

    def usable(self) -> bool:
        """Whether the next request can go on this connection: the last answer ended at a message boundary, the
        upstream has not closed it since, and it sent nothing after that answer (bytes that would otherwise be
        read as the next request's answer)."""
        return (
            self.reusable and not self.input.ended and not self.input.buffered and not self._reader.at_eof()
            and not self._writer.transport.is_closing()
        )

    async def send(self, data: bytes) -> None:
        if self._writer.transport.is_closing():
            raise ConnectionResetError("the upstream's connection is closed")
        self._writer.write(data)
        await self._writer.drain()

    def close(self) -> None:
        # abort, not close: a TLS close waits for the peer's close_notify, and nothing is owed to the upstream.
        self._writer.transport.abort()


class _Connection:
    """One intercepted client connection: its requests, one at a time, each to a (re)used verified upstream."""

    def __init__(
        self, broker: CredentialBroker, client: ServerTlsStream, *, host: str, port: int, address: str,
        credential: Credential, meter: ByteMeter,
    ) -> None:
        self.broker = broker
        self.client = client
        self.client_input = Input(client.recv)
        self.host = host
        self.port = port
        self.address = address
        self.credential = credential
        self.meter = meter
        self.upstream: _Upstream | None = None
        self.answered = False
        """The client has been sent part of the current response (an error page can no longer be sent)."""
        self.in_flight = False
        """A request was read and is not answered yet (a timeout or a broken upstream is then a 504 or 502)."""
        self.keep_client = True

    def count_up(self, size: int) -> None:
        self.meter.add(up=size)

    def count_down(self, size: int) -> None:
        self.meter.add(down=size)

    async def run(self) -> None:
        try:
            while await self.one_request():
                pass
        finally:
            if self.upstream is not None:
                self.upstream.close()

    async def one_request(self) -> bool:
        """Relays one request and its response; False once the connection is to end."""
        self.answered = self.in_flight = False
        try:
            async with asyncio.timeout(self.broker.timeouts.idle):
                raw = await self.client_input.until(b"\r\n\r\n", http1.MAX_HEAD, 431)
            if raw is None:
                return False
            self.count_up(len(raw))
            request = http1.parse_request(http1.parse_head(raw, 400))
            fields = self.vet(request)
            self.in_flight = True
            upstream = await self.connect()
            return await self.exchange(request, fields, upstream)
        except HttpMessageError as error:
            if not self.answered:
                await self.refuse(error.status, str(error))
            return False
        except TimeoutError:
            if self.in_flight and not self.answered:
                await self.refuse(504, "the upstream did not answer in time")
            return False
        except (ssl.SSLError, OSError, ConnectionError) as error:
            log.debug("intercepted connection to %s ended: %s", self.host, error)
            if self.in_flight and not self.answered:
                await self.refuse(502, "the connection to the upstream failed")
            return False

    def vet(self, request: Request) -> list[tuple[bytes, bytes]]:
        """The request's fields as forwarded: only for the CONNECT host, no tunnelling, the credential set."""
        if request.method == b"CONNECT":
            raise HttpMessageError(405, "CONNECT inside an intercepted connection is not relayed")
        if request.method == b"TRACE":
            # TRACE answers with the request as the upstream received it: the credential, handed to the sandbox.
            raise HttpMessageError(405, "TRACE is not relayed for a host with a brokered credential")
        head = request.head
        connection = head.tokens(b"connection")
        if head.values(b"upgrade") or b"upgrade" in connection:
            raise HttpMessageError(501, "protocol upgrades (websockets) are not relayed for this host")
        hosts = head.values(b"host")
        if len(hosts) > 1:
            raise HttpMessageError(400, "more than one Host header")
        target = request.target
        if not target.startswith(b"/"):
            if target == b"*" and request.method == b"OPTIONS":
                pass
            elif target[:8].lower() == b"https://":
                authority, slash, path = target[8:].partition(b"/")
                self.check_authority(authority)
                request.target = b"/" + path if slash else b"/"
            else:
                raise HttpMessageError(400, "a request target this proxy does not relay")
        if hosts:
            self.check_authority(hosts[0])
        elif request.version == b"HTTP/1.1":
            raise HttpMessageError(400, "an HTTP/1.1 request without a Host header")
        name = self.credential.header.encode().lower()
        fields = [(key, value) for key, value in head.fields if key.lower() not in _HOP_BY_HOP and key.lower() != name]
        if not hosts:
            fields.insert(0, (b"Host", self.authority()))
        fields.append((self.credential.header.encode(), self.credential.value.encode()))
        framing = request.framing
        if framing.chunked:
            fields.append((b"Transfer-Encoding", b"chunked"))
        elif framing.length or request.method in (b"POST", b"PUT", b"PATCH"):
            fields.append((b"Content-Length", b"%d" % (framing.length or 0)))
        # An HTTP/1.0 client is served one request per connection (it could not read a chunked answer anyway).
        self.keep_client = b"close" not in connection and request.version == b"HTTP/1.1"
        fields.append((b"Connection", b"keep-alive" if request.version == b"HTTP/1.1" else b"close"))
        return fields

    def authority(self) -> bytes:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return (shown if self.port == 443 else f"{shown}:{self.port}").encode()

    def check_authority(self, authority: bytes) -> None:
        """421 unless `authority` names the CONNECT host (and its port, when one is given)."""
        text = authority.decode("ascii", "replace").strip().lower()
        if "@" in text:
            raise HttpMessageError(400, "user information in a request target")
        port: str | None = None
        if text.startswith("["):
            name, bracket, rest = text[1:].partition("]")
            if not bracket or (rest and not rest.startswith(":")):
                raise HttpMessageError(400, "a malformed Host")
            port = rest[1:] if rest else None
        elif text.count(":") == 1:
            name, _, port = text.partition(":")
        else:
            name = text
        if name.rstrip(".") != self.host.lower().rstrip(".") or (port is not None and port != str(self.port)):
            raise HttpMessageError(421, "this connection only carries requests for the host it was opened to")

    async def connect(self) -> _Upstream:
        if self.upstream is not None and self.upstream.usable():
            return self.upstream
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        try:
            async with asyncio.timeout(self.broker.timeouts.handshake):
                reader, writer = await asyncio.open_connection(
                    self.address, self.port, ssl=self.broker.upstream_context, server_hostname=self.host,
                    ssl_handshake_timeout=self.broker.timeouts.handshake, flags=socket.AI_NUMERICHOST,
                )
        except ssl.SSLCertVerificationError as error:
            log.info("upstream %s (%s) failed verification: %s", self.host, self.address, error.verify_message)
            raise HttpMessageError(502, "the upstream's certificate could not be verified") from None
        except (TimeoutError, OSError, ssl.SSLError) as error:
            log.info("could not open TLS to %s (%s): %s", self.host, self.address, error)
            raise HttpMessageError(502, "the upstream could not be reached over TLS") from None
        self.upstream = _Upstream(reader, writer)
        return self.upstream

    async def exchange(self, request: Request, fields: list[tuple[bytes, bytes]], upstream: _Upstream) -> bool:
        """Sends the request (head, then its body alongside the response, so 100-continue works) and relays the
        response. True when the client may send another request (the upstream is reopened if it cannot)."""
        await upstream.send(http1.serialize(b" ".join((request.method, request.target, request.version)), fields))
        body = asyncio.ensure_future(self.send_body(request.framing, upstream))
        answer = asyncio.ensure_future(self.relay_response(request, upstream))
        try:
            await asyncio.wait({body, answer}, return_when=asyncio.FIRST_COMPLETED)
            if body.done():
                body.result()
                await answer
                keep = self.keep_client
            else:
                answer.result()
                # The upstream answered before the request body was all sent: neither side is at a message
                # boundary any more, so both are closed.
                keep = False
        finally:
            for task in (body, answer):
                if not task.done():
                    task.cancel()
            await asyncio.gather(body, answer, return_exceptions=True)
        return keep

    async def send_body(self, framing: Framing, upstream: _Upstream) -> None:
        if framing.empty:
            return
        async with asyncio.timeout(None) as deadline:
            async def send(data: bytes) -> None:
                await upstream.send(data)

            def count(size: int) -> None:
                deadline.reschedule(asyncio.get_running_loop().time() + self.broker.timeouts.idle)
                self.count_up(size)

            deadline.reschedule(asyncio.get_running_loop().time() + self.broker.timeouts.idle)
            await http1.copy_body(
                self.client_input, framing, send, count, drop_trailer=self.credential.header.encode(), status=400
            )

    async def relay_response(self, request: Request, upstream: _Upstream) -> None:
        """Relays the upstream's interim and final answers, and notes whether either side can be reused."""
        for _ in range(_MAX_INTERIM + 1):
            async with asyncio.timeout(self.broker.timeouts.idle):
                raw = await upstream.input.until(b"\r\n\r\n", http1.MAX_HEAD, 502)
            if raw is None:
                raise HttpMessageError(502, "the upstream closed the connection without answering")
            self.count_down(len(raw))
            head = http1.parse_head(raw, 502)
            status = http1.parse_status(head)
            if status == 101:
                raise HttpMessageError(502, "the upstream switched protocols, which this proxy does not relay")
            framing = http1.response_framing(head, status, request.method)
            fields = [(key, value) for key, value in head.fields if key.lower() not in _FRAMING]
            if framing.chunked:
                fields.append((b"Transfer-Encoding", b"chunked"))
            elif framing.until_close or status < 200 or status == 204:
                pass
            elif request.method == b"HEAD" or status == 304:
                # No body follows; the length describes what a GET would have had, so it is passed on as sent.
                fields.extend((b"Content-Length", value) for value in head.values(b"content-length")[:1])
            else:
                fields.append((b"Content-Length", b"%d" % (framing.length or 0)))
            await self.client.send(http1.serialize(head.start, fields))
            self.answered = True
            if status >= 200:
                break
            self.answered = False
        else:
            raise HttpMessageError(502, "too many interim responses from the upstream")
        await self.copy_response_body(framing, upstream)
        upstream.reusable = not framing.until_close and b"close" not in head.tokens(b"connection")
        if framing.until_close:
            self.keep_client = False

    async def copy_response_body(self, framing: Framing, upstream: _Upstream) -> None:
        if framing.empty:
            return
        async with asyncio.timeout(None) as deadline:
            def count(size: int) -> None:
                deadline.reschedule(asyncio.get_running_loop().time() + self.broker.timeouts.idle)
                self.count_down(size)

            deadline.reschedule(asyncio.get_running_loop().time() + self.broker.timeouts.idle)
            await http1.copy_body(upstream.input, framing, self.client.send, count, drop_trailer=b"", status=502)

    async def refuse(self, status: int, message: str) -> None:
        """The broker's own answer: a fixed text that never includes anything from the request (so never the
        credential or a header the client could use to read it back), then the connection closes."""
        body = f"ocsandbox egress proxy: {message}\n".encode()
        head = http1.serialize(
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}".encode(),
            [(b"Content-Type", b"text/plain; charset=utf-8"), (b"Content-Length", b"%d" % len(body)),
             (b"Connection", b"close")],
        )
        with contextlib.suppress(ssl.SSLError, OSError, ConnectionError):
            await self.client.send(head + body)


class CredentialBroker:
    """The proxy's Interceptor: per-session CAs (in memory), verified upstream TLS, the credential added.

    `upstream_ca` is a PEM file of extra CAs trusted for upstream servers besides the system store (the
    operator's `egress.upstream_ca`: a private index's CA, or a test's own). `ca_validity` bounds each session's
    CA; a plane whose sessions may outlive the default passes its longest session lifetime."""

    def __init__(
        self, upstream_ca: Path | None = None, *, timeouts: BrokerTimeouts | None = None,
        ca_validity: datetime.timedelta = CA_VALIDITY,
    ) -> None:
        self.timeouts = timeouts or BrokerTimeouts()
        self.ca_validity = ca_validity
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        if upstream_ca is not None:
            try:
                context.load_verify_locations(cafile=str(upstream_ca))
            except (OSError, ssl.SSLError) as error:
                raise ConfigError(
                    f"egress.upstream_ca {str(upstream_ca)!r} is not a readable PEM file of CA certificates: {error}"
                ) from None
        self.upstream_context = context
        self._sessions: dict[str, SessionCa] = {}
        self._lock = threading.Lock()

    def _ca(self, session_id: str) -> SessionCa:
        # A lock, though the proxy runs on one loop: the wiring may ask for the PEM from a worker thread, and two
        # CAs made for one session would leave the sandbox trusting the one the broker does not use.
        with self._lock:
            ca = self._sessions.get(session_id)
            if ca is None:
                ca = self._sessions[session_id] = SessionCa(session_id, self.ca_validity)
            return ca

    def session_ca_pem(self, session_id: str) -> bytes:
        return self._ca(session_id).pem

    def forget(self, session_id: str) -> None:
        # Python cannot wipe memory; dropping the only references lets the key and the contexts be freed.
        with self._lock:
            self._sessions.pop(session_id, None)

    async def intercept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        session_id: str,
        host: str,
        port: int,
        address: str,
        credential: Credential,
        meter: ByteMeter,
    ) -> None:
        """Relays the client's requests to `address` as described in the module docstring, until either side
        closes. A spent byte budget cuts both sides and raises EgressBudgetError for the proxy to record; every
        other failure ends the connection quietly (with an error answer when the client can still read one)."""
        try:
            context = self._ca(session_id).server_context(host.rstrip("."))
        except ValueError as error:
            # A name no certificate can carry (the proxy's rules passed it): the client gets no TLS at all.
            log.error("no certificate can be made for %r: %s", host, error)
            writer.close()
            return
        client = ServerTlsStream(reader, writer, context)
        try:
            try:
                async with asyncio.timeout(self.timeouts.handshake):
                    await client.handshake()
            except (TimeoutError, ssl.SSLError, OSError, ConnectionError) as error:
                log.debug("client TLS for %s did not complete: %s", host, error)
                return
            connection = _Connection(
                self, client, host=host, port=port, address=address, credential=credential, meter=meter
            )
            problem = _check_destination(address, credential)
            if problem is not None:
                log.error("not intercepting %s: %s", host, problem)
                await connection.refuse(502, "this host's brokered credential cannot be used")
                return
            await connection.run()
        except EgressBudgetError:
            client.abort()
            raise
        finally:
            await client.close()


def _check_destination(address: str, credential: Credential) -> str | None:
    """Why the broker will not use this destination, or None. It never resolves a name (the proxy vetted an
    address) and never writes a header it could not send verbatim or that would change the request's framing or
    host; either mistake is the caller's bug, refused before anything is sent upstream."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return f"the vetted address {address!r} is not an IP address"
    header = credential.header.encode()
    if not http1.is_token(header) or http1.has_control(credential.value.encode()):
        return f"the credential for {credential.host!r} has an invalid header name or value"
    if header.lower() in _HOP_BY_HOP or header.lower() == b"host":
        return f"the credential for {credential.host!r} names a header the proxy sets itself"
    return None
