"""The control plane's side of the cross-node agent channel: relay PKI, relay client, local forwarders.

Each sandbox's gRPC channel stays a Unix socket (`GrpcSandboxAgent` is unchanged): a forwarder in
the control plane accepts on DATA_DIR/swarm/fwd/<id>.sock and carries every connection over mutual
TLS to the relay on the sandbox's node, which splices it to the agent's socket there.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import ssl
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from controlplane.errors import ConfigError, SandboxError
from controlplane.sandbox.swarm.egress_link import EgressLink
from controlplane.sandbox.swarm.relay import splice

_MAX_UNIX_PATH = 107
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RelayPki:
    """A private CA, the relays' server certificate and the control plane's client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def ensure(cls, directory: Path) -> RelayPki:
        """Creates the PKI once (openssl, EC P-256); later starts reuse it so relays need no update."""
        pki = cls(*(directory / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")))
        if all(p.exists() for p in (pki.ca, pki.server_cert, pki.server_key, pki.client_cert, pki.client_key)):
            return pki
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        ca_key = directory / "ca.key"
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", ca_key, "-out", pki.ca, "-days", "3650", "-subj", "/CN=ocsb relay CA")
        for name, cert, key, usage in (
            ("ocsb relay", pki.server_cert, pki.server_key, "serverAuth"),
            ("ocsb control plane", pki.client_cert, pki.client_key, "clientAuth"),
        ):
            csr = directory / f"{key.stem}.csr"
            ext = directory / f"{key.stem}.ext"
            ext.write_text(f"extendedKeyUsage={usage}\nsubjectAltName=DNS:ocsb-relay\n")
            _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                     "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
            _openssl("x509", "-req", "-in", csr, "-CA", pki.ca, "-CAkey", ca_key, "-CAcreateserial",
                     "-out", cert, "-days", "3650", "-extfile", ext)
            csr.unlink()
            ext.unlink()
        for path in directory.iterdir():
            path.chmod(0o600)
        return pki

    def client_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_verify_locations(self.ca)
        context.load_cert_chain(self.client_cert, self.client_key)
        # Relays are addressed by node IP; trust is pinned to our private CA, which signs nothing else.
        context.check_hostname = False
        return context


def _openssl(*args: object) -> None:
    result = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ConfigError(f"openssl {args[0]} failed: {result.stderr.strip()}")


class RelayClient:
    """Requests to the relay at one node's address."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext) -> None:
        self.host = host
        self.port = port
        self._context = context

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self._context, server_hostname="ocsb-relay"),
            CONNECT_TIMEOUT_S,
        )

    async def request(self, message: Mapping[str, object], timeout_s: float = CONNECT_TIMEOUT_S) -> dict[str, object]:
        try:
            reader, writer = await self._open()
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            raise SandboxError(f"relay {self.host}:{self.port} unreachable: {exc or type(exc).__name__}") from exc
        try:
            writer.write(json.dumps(message).encode() + b"\n")
            line = await asyncio.wait_for(reader.readline(), timeout_s)
        except (TimeoutError, OSError) as exc:
            raise SandboxError(f"relay {self.host}:{self.port} did not answer: {exc or type(exc).__name__}") from exc
        finally:
            writer.close()
        reply = json.loads(line) if line else {"ok": False, "error": "connection closed"}
        if not isinstance(reply, dict) or reply.get("ok") is not True:
            raise SandboxError(f"relay {self.host}:{self.port} refused {message.get('op')}: {reply.get('error')}")
        return reply

    async def connect(self, instance: str, sandbox_id: str, op: str = "connect"
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A byte stream to the sandbox's agent socket on that node; with op `egress`, a stream the relay hands
        the sandbox's next connection to its egress.sock (egress_link)."""
        reader, writer = await self._open()
        writer.write(json.dumps({"op": op, "instance": instance, "sandbox": sandbox_id}).encode() + b"\n")
        line = await asyncio.wait_for(reader.readline(), CONNECT_TIMEOUT_S)
        reply = json.loads(line) if line else {}
        if not isinstance(reply, dict) or reply.get("ok") is not True:
            writer.close()
            raise ConnectionError(str(reply.get("error", "relay closed the connection")))
        return reader, writer


class LocalForward:
    """A Unix socket in the control plane whose connections reach one sandbox's agent via its relay."""

    def __init__(self, path: Path, relay: RelayClient, instance: str, sandbox_id: str) -> None:
        if len(str(path)) > _MAX_UNIX_PATH:
            raise ConfigError(f"{path} is too long for a Unix socket path; choose a shorter data_dir")
        self.path = path
        self.relay = relay
        self._instance = instance
        self._sandbox_id = sandbox_id
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._egress: EgressLink | None = None

    def carry_egress(self) -> Path:
        """Starts (once) carrying the sandbox's connections to its egress.sock back here; the Unix socket they
        arrive at, where the session's proxy is to listen."""
        if self._egress is None:
            path = self.path.with_name(f"{self._sandbox_id}.egress.sock")
            if len(str(path)) > _MAX_UNIX_PATH:
                raise ConfigError(f"{path} is too long for a Unix socket path; choose a shorter data_dir")
            self._egress = EgressLink(functools.partial(self.relay.connect, self._instance, self._sandbox_id,
                                                        "egress"), path)
            self._egress.start()
        return self._egress.proxy_path

    async def start(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._accept, str(self.path))
        self.path.chmod(0o600)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await self.relay.connect(self._instance, self._sandbox_id)
        except (TimeoutError, OSError, ssl.SSLError, ValueError):
            writer.close()  # gRPC sees a failed connection and retries with its backoff
            return
        self._writers |= {writer, upstream[1]}
        try:
            await splice((reader, writer), upstream)
        finally:
            self._writers -= {writer, upstream[1]}

    async def close(self) -> None:
        if self._egress is not None:
            await self._egress.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        for writer in list(self._writers):
            writer.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
