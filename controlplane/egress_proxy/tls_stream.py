"""Server-side TLS over streams another component owns: the credential broker ends a client's TLS on the
proxy's connection after the proxy has answered the client's CONNECT.

Memory BIOs rather than `StreamWriter.start_tls`: bytes the proxy's reader already buffered past the CONNECT
are read too, the transport is not re-wrapped (start_tls decides the side from how the stream was made), and it
works the same on asyncio's loop and on uvloop, which the control plane runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

READ_SIZE = 64 * 1024


class ServerTlsStream:
    """A TLS server session over `reader`/`writer`; `recv` and `send` carry the plaintext."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext) -> None:
        self._reader = reader
        self._writer = writer
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._aborted = False

    async def _flush(self) -> None:
        data = self._outgoing.read()
        if data:
            # uvloop raises RuntimeError on a write to a closed transport (asyncio's drops it): either way the
            # peer is gone, which callers handle as a connection error.
            if self._writer.transport.is_closing():
                raise ConnectionResetError("the client's connection is closed")
            self._writer.write(data)
            await self._writer.drain()

    async def _fill(self) -> None:
        data = await self._reader.read(READ_SIZE)
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()

    async def handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
        await self._flush()

    async def recv(self, most: int) -> bytes:
        while True:
            try:
                data = self._tls.read(most)
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            await self._flush()
            return data

    async def send(self, data: bytes) -> None:
        self._tls.write(data)
        await self._flush()

    def abort(self) -> None:
        """Cuts the connection at once (no close_notify): what a spent byte budget does."""
        self._aborted = True
        self._writer.transport.abort()

    async def close(self) -> None:
        """Sends close_notify (best effort) and closes the proxy's writer."""
        if self._aborted:
            return
        with contextlib.suppress(ssl.SSLError, OSError, ConnectionError):
            self._tls.unwrap()
        with contextlib.suppress(ssl.SSLError, OSError, ConnectionError):
            await asyncio.wait_for(self._flush(), 1.0)
        self._writer.close()
