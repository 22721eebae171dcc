"""The agent's process loads no OpenSSL (sandbox_agent/no_tls.py): asyncio and uvloop run on the names-only `ssl`,
and any use of TLS fails saying why. Each case runs in a fresh interpreter: this one has the real `ssl` loaded."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_fresh(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sandbox-image'}"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_agent_entry_point_serves_on_uvloop_without_loading_openssl() -> None:
    out = run_fresh("""
        import sys
        import sandbox_agent.__main__  # what `python3 -m sandbox_agent` imports before serving
        from sandbox_agent import event_loop

        async def echo():
            import asyncio
            reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname())
            writer.write(b"ping")
            await writer.drain()
            data = await reader.read(4)
            writer.close()
            return data

        async def main():
            import asyncio
            global server

            async def handle(reader, writer):
                writer.write(await reader.read(4))
                await writer.drain()
                writer.close()

            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            async with server:
                return type(asyncio.get_running_loop()).__module__, await echo()

        print(event_loop.run(main()))
        print("_ssl" in sys.modules, hasattr(sys.modules["ssl"], "NoTLSError"))
    """)
    loop_module, loaded = out.splitlines()
    assert loop_module == "('uvloop', b'ping')"
    assert loaded == "False True"  # OpenSSL's TLS library never loaded (hashlib's libcrypto may be)


def test_any_use_of_tls_in_the_agent_fails_and_says_why() -> None:
    out = run_fresh("""
        from sandbox_agent import no_tls
        assert no_tls.install()
        import asyncio, ssl
        for attempt in (ssl.create_default_context, ssl.SSLContext, ssl.MemoryBIO):
            try:
                attempt()
            except ssl.NoTLSError as exc:
                print(exc)

        async def main():
            server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
            async with server:
                try:
                    await asyncio.open_connection(*server.sockets[0].getsockname(), ssl=True)
                except Exception as exc:
                    print(type(exc).__name__)

        asyncio.run(main())
    """)
    lines = out.splitlines()
    assert lines[:3] == [
        "the sandbox agent's process has no TLS (sandbox_agent/no_tls.py): it serves a Unix socket only"] * 3
    assert lines[3] == "NoTLSError"


def test_a_process_that_loaded_the_real_ssl_keeps_it() -> None:
    out = run_fresh("""
        import ssl
        from sandbox_agent import no_tls
        print(no_tls.install(), hasattr(ssl, "PROTOCOL_TLS_CLIENT"))
    """)
    assert out.split() == ["False", "True"]
