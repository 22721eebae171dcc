"""Real HTTP clients through the session proxy: Python's urllib and curl, plain HTTP and HTTPS (a CONNECT
tunnel to a TLS server with the test's own CA), as tools in a sandbox use it. A TCP relay on 127.0.0.1 stands
in for the sandbox's forwarder (its loopback port onto the proxy's Unix socket)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.egress.support import Proxied, start_proxy
from tests.unit.tools.web_support import LoopbackServer, make_certificates, text

NAMES = {"files.test": "127.0.0.1", "blocked.test": "127.0.0.1"}


@contextlib.asynccontextmanager
async def relay(socket_path: Path) -> AsyncIterator[int]:
    """A loopback TCP port whose connections are spliced onto the proxy's socket."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(str(socket_path))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        up_writer.close()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
async def proxied(tmp_path: Path) -> AsyncIterator[tuple[Proxied, int]]:
    p = await start_proxy(tmp_path, allow_hosts=["files.test"], operator_cidrs=["127.0.0.1/32"], static_hosts=NAMES)
    async with relay(p.path) as port:
        yield p, port
    await p.proxy.close()


def urllib_get(url: str, proxy_port: int, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    proxy = f"http://127.0.0.1:{proxy_port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy, "https": proxy}),
                                         urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(url, timeout=10) as reply:
            return int(reply.status), bytes(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def test_urllib_over_plain_http_and_https(proxied: tuple[Proxied, int], tmp_path: Path) -> None:
    p, port = proxied
    certificates = make_certificates(tmp_path, "files.test")
    with LoopbackServer() as plain, LoopbackServer(tls=certificates.server_context()) as tls:
        plain.routes["/pkg"] = text("plain package")
        tls.routes["/pkg"] = text("tls package")
        assert await asyncio.to_thread(urllib_get, f"http://files.test:{plain.port}/pkg", port) == (
            200, b"plain package")
        assert await asyncio.to_thread(urllib_get, f"https://files.test:{tls.port}/pkg", port,
                                       certificates.client_context()) == (200, b"tls package")
        status, body = await asyncio.to_thread(urllib_get, f"http://blocked.test:{plain.port}/pkg", port)
    assert status == 403
    assert b"host blocked.test" in body
    assert tls.server_names == ["files.test"]  # SNI carries the name; the proxy dialled the vetted address
    assert [s.headers["host"] for s in plain.seen] == [f"files.test:{plain.port}"]
    assert ("blocked.test", "refused") in [(r.host, r.decision) for r in p.records]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_over_plain_http_and_https(proxied: tuple[Proxied, int], tmp_path: Path) -> None:
    p, port = proxied
    certificates = make_certificates(tmp_path, "files.test")

    async def curl(*args: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            "curl", "-sS", "--max-time", "10", "--proxy", f"http://127.0.0.1:{port}", "--noproxy", "", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await process.communicate()
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    with LoopbackServer() as plain, LoopbackServer(tls=certificates.server_context()) as tls:
        plain.routes["/"] = text("plain index")
        tls.routes["/"] = text("tls index")
        assert (await curl(f"http://files.test:{plain.port}/"))[:2] == (0, "plain index")
        assert (await curl("--cacert", str(certificates.ca_file), f"https://files.test:{tls.port}/"))[:2] == (
            0, "tls index")
        code, out, _ = await curl("-i", f"http://blocked.test:{plain.port}/")
        tunnel_code, _, tunnel_err = await curl("--cacert", str(certificates.ca_file),
                                                f"https://blocked.test:{tls.port}/")
    assert code == 0
    assert out.startswith("HTTP/1.1 403")
    assert "is not in this session's network policy" in out
    assert tunnel_code != 0
    assert "403" in tunnel_err
    assert tls.connections == 1
    assert [(r.host, r.decision) for r in p.records].count(("blocked.test", "refused")) == 2
