"""Moving bytes for the session proxy: a tunnel both ways, the proxy's own short answers, and closing a
connection without losing the answer already written to it."""

from __future__ import annotations

import asyncio
import contextlib
import time

from controlplane.egress_proxy.proxy_http import CHUNK
from controlplane.egress_proxy.types import ByteMeter


async def splice(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                  reader: asyncio.StreamReader, writer: asyncio.StreamWriter, meter: ByteMeter, idle_s: float) -> None:
    """Bytes both ways until both sides are done, or either fails, or neither moves for `idle_s`."""
    last = [time.monotonic()]

    async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, up: bool) -> None:
        while True:
            try:
                chunk = await asyncio.wait_for(source.read(CHUNK), idle_s)
            except TimeoutError:
                if time.monotonic() - last[0] >= idle_s:
                    raise
                continue
            if not chunk:
                if sink.can_write_eof():
                    with contextlib.suppress(OSError):
                        sink.write_eof()
                return
            last[0] = time.monotonic()
            if up:
                meter.add(up=len(chunk))
            else:
                meter.add(down=len(chunk))
            sink.write(chunk)
            await sink.drain()

    tasks = [asyncio.ensure_future(pump(client_reader, writer, True)),
             asyncio.ensure_future(pump(reader, client_writer, False))]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)


LINGER_S = 0.5
LINGER_BYTES = 64 * 1024
_REASONS = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Service Unavailable"}


async def answer(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = (message + "\n").encode()
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    with contextlib.suppress(OSError):
        writer.write(head.encode() + body)
        await writer.drain()


async def close(reader: asyncio.StreamReader | None, writer: asyncio.StreamWriter) -> None:
    """Closes a connection; a client's unread bytes are drained first (briefly, boundedly), so that the answer
    already written is not lost to a reset."""
    if reader is not None and not writer.is_closing():
        with contextlib.suppress(OSError, TimeoutError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
            await asyncio.wait_for(reader.read(LINGER_BYTES), LINGER_S)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
