"""Test support for the control-plane web tools: real loopback HTTP(S) servers, a ToolContext, a guard.

The guard records every connection and name lookup the event loop makes and refuses anything that is
not loopback, so a test can assert that a refusal happened before any connection was attempted.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from controlplane.core.calls.tool import PermissionAsk, ToolContext, ToolError, ToolResult

Handler = Callable[["RequestHandler"], None]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class RequestHandler(BaseHTTPRequestHandler):
    server: LoopbackServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append(Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        route = self.server.routes.get(self.path.split("?")[0])
        if route is None:
            self.reply(404, b"no such route", "text/plain")
            return
        route(self)

    do_GET = do_POST = _handle  # noqa: N815 (the names http.server dispatches to)

    def reply(self, status: int, body: bytes, content_type: str | None = None, **headers: str) -> None:
        self.send_response(status)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)


class LoopbackServer(ThreadingHTTPServer):
    """An HTTP server on a loopback address, in a thread, with routes by path and a record of requests."""

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, 0), RequestHandler)
        self.routes: dict[str, Handler] = {}
        self.seen: list[Seen] = []
        self.connections = 0
        self.server_names: list[str | None] = []
        self.release = threading.Event()
        """Set on shutdown so handlers that wait (slow routes) end."""
        if tls is not None:
            tls.sni_callback = self._record_sni
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.tls = tls is not None
        self._thread = threading.Thread(target=self.serve_forever, args=(0.02,), daemon=True)

    def _record_sni(self, _sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, _ctx: ssl.SSLContext) -> None:
        self.server_names.append(name)

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        self.connections += 1
        return conn, addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            try:
                request.do_handshake()
            except (ssl.SSLError, OSError):
                return
        super().finish_request(request, client_address)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, path: str = "/", host: str | None = None) -> str:
        scheme = "https" if self.tls else "http"
        name = host or str(self.server_address[0])
        if ":" in name:
            name = f"[{name}]"
        return f"{scheme}://{name}:{self.port}{path}"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()
        self._thread.join(5)


# --- routes -----------------------------------------------------------------------------------------


def text(body: bytes | str, content_type: str | None = "text/plain", status: int = 200, **headers: str) -> Handler:
    data = body.encode() if isinstance(body, str) else body
    return lambda h: h.reply(status, data, content_type, **headers)


def redirect(location: str, status: int = 302) -> Handler:
    return lambda h: h.reply(status, b"", None, Location=location)


def streamed(size: int, content_type: str = "application/octet-stream") -> Handler:
    """A body of `size` bytes with no Content-Length (it ends when the connection closes)."""

    def handler(h: RequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.end_headers()
        for offset in range(0, size, 65536):
            h.wfile.write(b"x" * min(65536, size - offset))

    return handler


def declared(size: int) -> Handler:
    """Claims `size` bytes but sends only a few."""

    def handler(h: RequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(size))
        h.end_headers()
        h.wfile.write(b"short")

    return handler


def slow(seconds: float) -> Handler:
    """Answers after `seconds` (or when the server shuts down)."""

    def handler(h: RequestHandler) -> None:
        h.server.release.wait(seconds)
        h.reply(200, b"late", "text/plain")

    return handler


def echo(h: RequestHandler) -> None:
    """Answers with the method and body of the request it got."""
    seen = h.server.seen[-1]
    h.reply(200, json.dumps({"method": seen.method, "body": seen.body.decode()}).encode(), "application/json")


# --- a control-plane ToolContext ------------------------------------------------------------------


@dataclass
class Recorder:
    asks: list[PermissionAsk] = field(default_factory=list)
    updates: list[tuple[str | None, dict[str, Any] | None]] = field(default_factory=list)
    deny: set[str] = field(default_factory=set)

    async def ask(self, request: PermissionAsk) -> None:
        self.asks.append(request)
        if request.permission in self.deny:
            raise ToolError("The user rejected permission to use this specific tool call.")

    async def metadata(self, title: str | None, metadata: dict[str, Any] | None) -> None:
        self.updates.append((title, metadata))


class NoSandbox:
    async def run_builtin(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise AssertionError("web tools run in the control plane")

    async def save_output(self, name: str, content: str) -> str:
        raise AssertionError("web tools save nothing themselves")

    async def run_custom(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise AssertionError("web tools run in the control plane")

    async def plugin_hook(self, name: str, input_: dict[str, Any], output: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("web tools run no hooks themselves")


def tool_context(recorder: Recorder, abort: asyncio.Event | None = None) -> ToolContext:
    return ToolContext("ses_test", "msg_test", "call_test", "build", recorder.ask, recorder.metadata, NoSandbox(),
                       abort=abort or asyncio.Event())


# --- the connection guard -------------------------------------------------------------------------


@dataclass
class Guard:
    connections: list[str] = field(default_factory=list)
    lookups: list[str] = field(default_factory=list)


def _is_loopback(host: object) -> bool:
    try:
        return ipaddress.ip_address(str(host)).is_loopback
    except ValueError:
        return False


def install_guard(monkeypatch: pytest.MonkeyPatch) -> Guard:
    """Records the loop's connections and lookups; anything outside loopback fails instead of leaving the host.

    An unknown name fails as an unresolvable one would, without any query leaving the machine.
    """
    seen = Guard()
    loop_class = asyncio.base_events.BaseEventLoop
    create_connection = loop_class.create_connection
    getaddrinfo = loop_class.getaddrinfo

    async def guarded_connection(self: Any, protocol_factory: Any, host: Any = None, port: Any = None,
                                 *args: Any, **kwargs: Any) -> Any:
        seen.connections.append(str(host))
        if not _is_loopback(host):
            raise OSError(f"test guard: refusing to connect to {host}")
        return await create_connection(self, protocol_factory, host, port, *args, **kwargs)

    async def guarded_lookup(self: Any, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        seen.lookups.append(str(host))
        if str(host) != "localhost" and not _is_loopback(host):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return await getaddrinfo(self, host, port, *args, **kwargs)

    monkeypatch.setattr(loop_class, "create_connection", guarded_connection)
    monkeypatch.setattr(loop_class, "getaddrinfo", guarded_lookup)
    return seen


# --- TLS material ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    ca_file: Path
    cert_file: Path
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


def make_certificates(directory: Path, dns_name: str = "localhost") -> Certificates:
    """A throwaway CA and a server certificate for `dns_name` only (no IP address in it)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ocsb test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_name)]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files = Certificates(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    files.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
    return files
