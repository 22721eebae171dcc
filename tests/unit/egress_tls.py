"""Test support for the credential broker: a test CA of its own, HTTPS upstreams on 127.0.0.1 that record what
they receive, the proxy's side of a CONNECT (the part that hands a vetted connection to the broker), and
blocking clients (run in a thread) that tunnel through it.

Everything listens on 127.0.0.1 only; the host names the tests use (`index.test`) are never resolved: the
CONNECT front maps them to the upstream's loopback address, as the proxy does with its vetted address.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import secrets
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from controlplane.egress_proxy.broker import CredentialBroker
from controlplane.egress_proxy.types import ByteMeter, Credential, EgressBudgetError

HOST = "index.test"

SECRET = "Bearer brokered-" + secrets.token_hex(16)
"""The brokered credential's value: the tests check that no client ever receives it."""


def credential(header: str = "Authorization", value: str = SECRET) -> Credential:
    return Credential(host=HOST, header=header, value=value)


def no_secret(*received: bytes) -> None:
    for data in received:
        assert SECRET.encode() not in data
        assert SECRET.split()[1].encode() not in data


@dataclass
class LoopbackCa:
    """A CA made by the test, and server certificates it signs (written to files: the server side loads them)."""

    directory: Path
    name: str = "ocsb broker test CA"
    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))

    def __post_init__(self) -> None:
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.name)])
        self.certificate = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.ca_file = self.directory / f"{self.name.replace(' ', '-')}.pem"
        self.ca_file.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    def server_context(self, *names: str) -> ssl.SSLContext:
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = []
        for name in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        cert = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(self.certificate.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        stem = self.directory / f"server-{x509.random_serial_number()}"
        cert_file, key_file = stem.with_suffix(".crt"), stem.with_suffix(".key")
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + self.certificate.public_bytes(
            serialization.Encoding.PEM))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        return context


@dataclass
class Seen:
    """One request as the upstream parsed it (its own parser, independent of the broker's)."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    trailer: list[tuple[str, str]]

    def header(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]


Route = Callable[[Seen, asyncio.StreamWriter], Awaitable[bool]]
"""Answers a request; returns whether the connection stays open for another one."""


def _fields(block: bytes) -> list[tuple[str, str]]:
    pairs = []
    for line in block.decode("latin-1").split("\r\n"):
        if line:
            name, _, value = line.partition(":")
            pairs.append((name, value.strip()))
    return pairs


class Upstream:
    """An HTTPS/1.1 server on 127.0.0.1 with keep-alive, 100-continue, chunked request bodies, and routes."""

    def __init__(self, context: ssl.SSLContext, routes: dict[str, Route]) -> None:
        self.context = context
        self.routes = routes
        self.seen: list[Seen] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Upstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await self._one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass  # the broker cut the connection (a budget, a refused body): nothing to answer
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        line, _, rest = head.partition(b"\r\n")
        method, target, _version = line.decode().split(" ")
        headers = _fields(rest)
        seen = Seen(method, target, headers, b"", [])
        if any(v.lower() == "100-continue" for v in seen.header("expect")):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if [v.lower() for v in seen.header("transfer-encoding")] == ["chunked"]:
            body = bytearray()
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    break
                body += await reader.readexactly(size)
                assert await reader.readexactly(2) == b"\r\n"
            trailer = b""
            while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                trailer += line
            seen.body, seen.trailer = bytes(body), _fields(trailer)
        else:
            seen.body = await reader.readexactly(int((seen.header("content-length") or ["0"])[0]))
        self.seen.append(seen)
        route = self.routes.get(target.split("?")[0])
        if route is None:
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            keep = True
        else:
            keep = await route(seen, writer)
        await writer.drain()
        return keep and not any(v.lower() == "close" for v in seen.header("connection"))


def answer(body: bytes, status: str = "200 OK", **headers: str) -> Route:
    async def route(_seen: Seen, writer: asyncio.StreamWriter) -> bool:
        extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
        writer.write(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body)
        return True

    return route


async def echo_chunked(seen: Seen, writer: asyncio.StreamWriter) -> bool:
    """Answers with the request's body, in chunks of uneven sizes, and a trailer."""
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Done\r\n\r\n")
    body, offset, step = seen.body, 0, 1
    while offset < len(body):
        piece = body[offset:offset + step]
        writer.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
        offset, step = offset + len(piece), step * 3
        await writer.drain()
    writer.write(b"0\r\nX-Done: yes\r\n\r\n")
    return True


async def until_close(seen: Seen, writer: asyncio.StreamWriter) -> bool:
    """A body delimited by the connection's end (no length, not chunked)."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it, then close")
    return False


def sized(size: int) -> Route:
    async def route(_seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        block = b"x" * 65536
        for offset in range(0, size, len(block)):
            writer.write(block[: min(len(block), size - offset)])
            await writer.drain()
        return True

    return route


def routes() -> dict[str, Route]:
    return {"/hello": answer(b"hello"), "/echo": echo_chunked, "/close": until_close}


@dataclass
class Front:
    """The proxy's side of a CONNECT: answers 200 and hands the connection to the broker with the vetted
    address of the host's upstream (127.0.0.1), as the session's proxy does for a host with a credential."""

    broker: CredentialBroker
    credential: Credential
    upstreams: dict[str, int]
    """host -> the upstream's port on 127.0.0.1 (the CONNECT's port must match it)."""
    session_id: str = "session-a"
    meter: ByteMeter = field(default_factory=lambda: ByteMeter(None))
    errors: list[Exception] = field(default_factory=list)
    """What intercept raised: only EgressBudgetError may leave it (checked when the front closes)."""
    port: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    """The connections being intercepted (the session proxy's close cancels these)."""

    async def __aenter__(self) -> Front:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        self._server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 2)
        unexpected = [error for error in self.errors if not isinstance(error, EgressBudgetError)]
        assert unexpected == [], f"intercept raised {unexpected!r}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        authority = head.split(b" ")[1].decode()
        host, _, port = authority.rpartition(":")
        host = host.strip("[]")
        assert self.upstreams[host] == int(port), "the test connects only to its own upstream"
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self.broker.intercept(
                reader, writer, session_id=self.session_id, host=host, port=int(port), address="127.0.0.1",
                credential=self.credential, meter=self.meter,
            )
        except Exception as error:
            self.errors.append(error)
        finally:
            writer.close()


def client_context(ca_pem: bytes, alpn: list[str] | None = None) -> ssl.SSLContext:
    """A client that trusts only `ca_pem` (the session's CA), as a tool told SSL_CERT_FILE would."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    if alpn:
        context.set_alpn_protocols(alpn)
    return context


def tunnel(front_port: int, host: str, port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    """Blocking: CONNECT through the front, then TLS as `host` (call it in a thread)."""
    raw = socket.create_connection(("127.0.0.1", front_port), timeout=10)
    shown = f"[{host}]" if ":" in host else host
    raw.sendall(f"CONNECT {shown}:{port} HTTP/1.1\r\nHost: {shown}:{port}\r\n\r\n".encode())
    reply = b""
    try:
        while not reply.endswith(b"\r\n\r\n"):
            byte = raw.recv(1)
            assert byte, "the front closed during CONNECT"
            reply += byte
        assert reply.startswith(b"HTTP/1.1 200"), reply
        return context.wrap_socket(raw, server_hostname=host)
    except BaseException:
        raw.close()
        raise


def exchange(sock: ssl.SSLSocket, data: bytes, *, until: bytes | None = None) -> bytes:
    """Blocking: sends `data`, reads until the peer closes (or until `until` has been seen), returns all read, and
    closes the socket."""
    got = b""
    with sock:
        sock.sendall(data)
        while until is None or until not in got:
            try:
                chunk = sock.recv(65536)
            except (ssl.SSLError, ConnectionError, TimeoutError):
                break
            if not chunk:
                break
            got += chunk
    return got
