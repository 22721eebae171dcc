"""Just enough HTTP/1.1 for a forward proxy: read and check one message head, and relay one message body
with the framing its headers declare, so that each request on a kept-alive connection is seen (and vetted)
on its own. Anything ambiguous is refused rather than guessed at: a head that two parsers could read
differently is how requests are smuggled past a proxy.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from controlplane.errors import InvalidArgumentError

CHUNK = 64 * 1024
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_VERSION = re.compile(r"^HTTP/1\.[01]$")
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te",
    "trailer", "upgrade",
})
"""Headers about one hop, never forwarded (Proxy-Authorization would hand the proxy's secret onwards)."""

Count = Callable[[int], None]
"""Called with each chunk's size before the chunk is passed on; raising cuts the transfer."""


BadMessage = InvalidArgumentError
"""A malformed or ambiguous message head or body (answered 400 when it is the client's)."""


@dataclass(frozen=True)
class Head:
    """A parsed message head: the start line's three parts and the header fields in order."""

    start: tuple[str, str, str]
    headers: tuple[tuple[str, str], ...]

    def values(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name]

    def tokens(self, name: str) -> set[str]:
        """The comma-separated tokens of every `name` field, lower-cased (Connection, Transfer-Encoding)."""
        return {t.strip().lower() for v in self.values(name) for t in v.split(",") if t.strip()}

    @property
    def version(self) -> str:
        return self.start[0] if self.start[0].startswith("HTTP/") else self.start[2]

    def wants_close(self) -> bool:
        connection = self.tokens("connection") | self.tokens("proxy-connection")
        if self.version == "HTTP/1.0":
            return "keep-alive" not in connection
        return "close" in connection


async def read_head(reader: asyncio.StreamReader, within_s: float) -> bytes | None:
    """The next head's bytes (up to the blank line), or None at a clean end of the stream. The reader's limit
    bounds the head's size: past it, BadMessage."""
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), within_s)
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise BadMessage("the message head ended early") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise BadMessage("the message head is too large") from exc
    # A client may send blank lines between requests (RFC 9112 section 2.2).
    return raw.lstrip(b"\r\n")


def parse_head(raw: bytes, *, request: bool) -> Head:
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover: latin-1 decodes every byte
        raise BadMessage("the head is not text") from exc
    lines = text[:-4].split("\r\n") if text.endswith("\r\n\r\n") else text.split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) != 3 or any(c in lines[0] for c in "\r\n\0"):
        raise BadMessage(f"malformed start line {lines[0][:80]!r}")
    if request:
        if not _TOKEN.match(parts[0]) or not parts[1] or " " in parts[1] or not _VERSION.match(parts[2]):
            raise BadMessage(f"malformed request line {lines[0][:80]!r}")
    elif not _VERSION.match(parts[0]) or not (parts[1].isdigit() and len(parts[1]) == 3):
        raise BadMessage(f"malformed status line {lines[0][:80]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        # No folded lines and no space before the colon: both are ways to make two parsers disagree.
        if not colon or not _TOKEN.match(name) or "\0" in value or "\r" in value or "\n" in value:
            raise BadMessage(f"malformed header line {line[:80]!r}")
        headers.append((name, value.strip(" \t")))
    return Head((parts[0], parts[1], parts[2]), tuple(headers))


@dataclass(frozen=True)
class Framing:
    """How a body ends: `length` bytes, chunked, at the end of the stream, or there is none."""

    kind: str
    """"none", "length", "chunked" or "close"."""
    length: int = 0


def request_framing(head: Head) -> Framing:
    coding = head.tokens("transfer-encoding")
    lengths = head.values("content-length")
    if coding:
        if lengths:
            raise BadMessage("a request with both Transfer-Encoding and Content-Length")
        if coding != {"chunked"} or len(head.values("transfer-encoding")) != 1:
            raise BadMessage("the only request transfer coding accepted is `chunked`")
        return Framing("chunked")
    return _length(lengths) or Framing("none")


def response_framing(head: Head, request_method: str) -> Framing:
    status = int(head.start[1])
    if request_method == "HEAD" or status < 200 or status in (204, 304):
        return Framing("none")
    coding = head.values("transfer-encoding")
    if coding:
        last = coding[-1].split(",")[-1].strip().lower()
        return Framing("chunked") if last == "chunked" else Framing("close")
    return _length(head.values("content-length")) or Framing("close")


def _length(values: list[str]) -> Framing | None:
    if not values:
        return None
    found = {v.strip() for value in values for v in value.split(",")}
    if len(found) != 1 or not next(iter(found)).isdigit():
        raise BadMessage(f"an unusable Content-Length {', '.join(values)[:80]!r}")
    return Framing("length", int(next(iter(found))))


async def relay_body(framing: Framing, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     count: Count, idle_s: float) -> None:
    """Passes one body on as it arrives, every chunk counted before it is written."""
    if framing.kind == "length":
        await _relay_length(framing.length, reader, writer, count, idle_s)
    elif framing.kind == "chunked":
        await _relay_chunked(reader, writer, count, idle_s)
    elif framing.kind == "close":
        while chunk := await asyncio.wait_for(reader.read(CHUNK), idle_s):
            await _write(writer, chunk, count)


async def _relay_length(left: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: Count,
                        idle_s: float) -> None:
    while left:
        chunk = await asyncio.wait_for(reader.read(min(left, CHUNK)), idle_s)
        if not chunk:
            raise BadMessage(f"the body ended {left} bytes early")
        left -= len(chunk)
        await _write(writer, chunk, count)


async def _relay_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: Count,
                         idle_s: float) -> None:
    while True:
        line = await _line(reader, idle_s)
        size_text = line.split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 16 or any(c not in b"0123456789abcdefABCDEF" for c in size_text):
            raise BadMessage(f"a malformed chunk size line {line[:40]!r}")
        await _write(writer, line, count)
        size = int(size_text, 16)
        if size == 0:
            # Trailer fields, then the blank line that ends the message.
            while (trailer := await _line(reader, idle_s)) != b"\r\n":
                await _write(writer, trailer, count)
            await _write(writer, b"\r\n", count)
            return
        await _relay_length(size, reader, writer, count, idle_s)
        if await asyncio.wait_for(reader.readexactly(2), idle_s) != b"\r\n":
            raise BadMessage("a chunk not followed by CRLF")
        await _write(writer, b"\r\n", count)


async def _line(reader: asyncio.StreamReader, idle_s: float) -> bytes:
    try:
        line = await asyncio.wait_for(reader.readuntil(b"\r\n"), idle_s)
    except asyncio.IncompleteReadError as exc:
        raise BadMessage("the chunked body ended early") from exc
    except asyncio.LimitOverrunError as exc:
        raise BadMessage("a chunk line is too long") from exc
    return line


async def _write(writer: asyncio.StreamWriter, data: bytes, count: Count) -> None:
    count(len(data))
    writer.write(data)
    await writer.drain()


def serialize(start: tuple[str, str, str], headers: list[tuple[str, str]]) -> bytes:
    lines = [" ".join(start), *(f"{k}: {v}" for k, v in headers), "", ""]
    return "\r\n".join(lines).encode("latin-1")


def authority(text: str, default_port: int | None) -> tuple[str, int] | None:
    """(host, port) of `host:port` or `[v6]:port`; None when malformed."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket:
            return None
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else None)
    else:
        host, colon, port_text_ = text.rpartition(":")
        if not colon:
            host, port_text_ = text, ""
        if ":" in host:
            return None  # an IPv6 address needs its brackets
        port_text = port_text_
    if port_text is None or not host:
        return None
    if not port_text:
        return (host, default_port) if default_port is not None else None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        return None
    return host, int(port_text)


def absolute_http(target: str) -> tuple[str, int, str] | None:
    """(host, port, origin-form path) of an absolute http:// request target."""
    if not target[:7].lower() == "http://":
        return None
    try:
        parts = urlsplit(target)
    except ValueError:
        return None
    found = authority(parts.netloc.rpartition("@")[2], default_port=80)
    if found is None:
        return None
    path = parts.path or "/"
    return found[0], found[1], path + (f"?{parts.query}" if parts.query else "")
