"""The MCP HTTP front end of a control plane whose public port speaks TLS: it reaches the API over the plane's
private Unix socket, so its tools list and run (it dialled the TLS port in plaintext before and every request
failed), while the public port still refuses plaintext."""

from __future__ import annotations

import datetime
import ipaddress
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx2
import mcp_types as types
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from controlplane import app
from controlplane.app import FRONT_END_SOCKET
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from tests.archives import tar_of
from tests.planes import new_instance, remove_data_dir, remove_instance_leftovers, short_tmp

TENANT = {"name": "tls", "token": "tls-tenant-token"}


def _self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ocsb test plane")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "plane.crt", directory / "plane.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture(name="tls_plane")
async def tls_plane_fixture(tmp_path: Path) -> AsyncIterator[tuple[app.ControlPlane, bytes]]:
    cert, key = _self_signed(tmp_path)
    data_dir, instance = short_tmp(), new_instance()
    settings = load_settings(None, data_dir=data_dir, instance=instance, provider={"type": "local"},
                             tenants=[TENANT], server={"listen": "127.0.0.1:0", "tls_cert": str(cert),
                                                       "tls_key": str(key), "mcp_listen": "127.0.0.1:0"})
    plane = await app.start(settings)
    try:
        yield plane, cert.read_bytes()
    finally:
        await app.stop(plane)
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)


async def test_the_front_end_works_when_the_public_port_is_tls(tls_plane: tuple[app.ControlPlane, bytes]) -> None:
    plane, cert = tls_plane
    async with AsyncClient(plane.address, TENANT["token"], root_certificates=cert) as client:
        session = await client.create_session(workspace_archive=tar_of({"notes.txt": "over tls\n"}))
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TENANT['token']}"}, timeout=30)
        url = f"http://{plane.mcp_http.address}/mcp/{session.id}"
        async with http, Client(streamable_http_client(url, http_client=http)) as mcp:
            assert "read" in [t.name for t in (await mcp.list_tools()).tools]
            result = await mcp.call_tool("read", {"filePath": "notes.txt"})
            assert "over tls" in "".join(c.text for c in result.content if isinstance(c, types.TextContent))
        await client.delete_session(session.id)


async def test_the_private_socket_is_only_the_owners(tls_plane: tuple[app.ControlPlane, bytes]) -> None:
    plane, _ = tls_plane
    run = plane.settings.data_dir / "run"
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert (run / FRONT_END_SOCKET).is_socket()
    # The public port stays TLS only: the private socket is an addition, not a plaintext fallback.
    async with AsyncClient(plane.address, TENANT["token"]) as plaintext:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await plaintext.list_sessions()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
