"""Just enough HTTP/1.1 for the credential broker: bounded reading of message heads, strict parsing of requests
and responses, and the framing of their bodies (RFC 9112).

Strict on purpose: the broker re-serializes every head it forwards (CRLF line ends, one framing header of its
own choosing), so a message the upstream could read differently from the broker (request smuggling: both
Content-Length and Transfer-Encoding, two lengths, folded or malformed lines) is refused, never passed on.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from controlplane.errors import ControlPlaneError

MAX_HEAD = 64 * 1024
"""The largest request or response head (request line, headers) read; a larger one is refused."""

MAX_FIELDS = 200
"""The most header lines in one head."""

MAX_CHUNK_LINE = 4096
"""The longest chunk-size line (size plus extensions)."""

READ_SIZE = 64 * 1024

_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_VERSION = re.compile(rb"^HTTP/1\.[01]$")
_STATUS = re.compile(rb"^HTTP/1\.[01] [0-9]{3}(?: .*)?$")
_DIGITS = re.compile(rb"^[0-9]{1,18}$")
_HEX = re.compile(rb"^[0-9A-Fa-f]{1,15}$")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def is_token(name: bytes) -> bool:
    return _TOKEN.match(name) is not None


def has_control(value: bytes) -> bool:
    return _BAD_VALUE.search(value) is not None


class HttpMessageError(ControlPlaneError):
    """A message the broker will not relay. `status` is what the client is answered (when it can still be)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Head:
    """A parsed request or response head. `fields` keeps the received order and case (names as sent)."""

    start: bytes
    fields: list[tuple[bytes, bytes]]
    size: int
    """Bytes the head took on the wire (counted in the byte meter)."""

    def values(self, name: bytes) -> list[bytes]:
        lowered = name.lower()
        return [value for key, value in self.fields if key.lower() == lowered]

    def tokens(self, name: bytes) -> set[bytes]:
        """The comma-separated tokens of every `name` field, lowercased (Connection, Transfer-Encoding...)."""
        found: set[bytes] = set()
        for value in self.values(name):
            found.update(part.strip().lower() for part in value.split(b",") if part.strip())
        return found


@dataclass
class Framing:
    """How a body is delimited: `chunked`, a `length`, or (responses only) the connection's close."""

    chunked: bool = False
    length: int | None = None
    until_close: bool = False

    @property
    def empty(self) -> bool:
        return not self.chunked and not self.until_close and not self.length


@dataclass
class Request:
    method: bytes
    target: bytes
    version: bytes
    head: Head
    framing: Framing = field(default_factory=Framing)


class Input:
    """A bounded, buffered reader over a byte source (`recv(n)` returns b"" at the end)."""

    def __init__(self, recv: Callable[[int], Awaitable[bytes]]) -> None:
        self._recv = recv
        self._buffer = bytearray()
        self.ended = False

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    async def _more(self) -> bool:
        if self.ended:
            return False
        data = await self._recv(READ_SIZE)
        if not data:
            self.ended = True
            return False
        self._buffer += data
        return True

    async def until(self, marker: bytes, limit: int, status: int) -> bytes | None:
        """Bytes up to and including `marker`, at most `limit` of them; None if the source ended before any
        byte; HttpMessageError(`status`) if the marker is not within `limit` or the source ends before it."""
        searched = 0
        while True:
            found = self._buffer.find(marker, max(0, searched - len(marker) + 1))
            if found >= 0:
                end = found + len(marker)
                if end > limit:
                    raise HttpMessageError(status, "a message head or line too long")
                data = bytes(self._buffer[:end])
                del self._buffer[:end]
                return data
            if len(self._buffer) > limit:
                raise HttpMessageError(status, "a message head or line too long")
            searched = len(self._buffer)
            if not await self._more():
                if not self._buffer:
                    return None
                raise HttpMessageError(status, "the connection ended inside a message head")

    async def some(self, most: int) -> bytes:
        """Up to `most` bytes (b"" at the end): what is buffered first, else one read of the source."""
        if not self._buffer and not await self._more():
            return b""
        data = bytes(self._buffer[:most])
        del self._buffer[:most]
        return data


def parse_head(data: bytes, status: int) -> Head:
    """Splits a head (ending in CRLF CRLF) into its start line and fields; anything malformed is `status`."""
    lines = data[:-4].split(b"\r\n")
    if len(lines) - 1 > MAX_FIELDS:
        raise HttpMessageError(431 if status == 400 else status, "too many header fields")
    fields: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name):
            # Also a folded line (leading whitespace) and whitespace before the colon: both are refused by RFC 9112.
            raise HttpMessageError(status, "a malformed header line")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            raise HttpMessageError(status, "a control character in a header value")
        fields.append((name, value))
    if b"\n" in lines[0] or b"\r" in lines[0]:
        raise HttpMessageError(status, "a malformed start line")
    return Head(lines[0], fields, len(data))


def _length(head: Head, status: int) -> int | None:
    lengths = {value.strip() for raw in head.values(b"content-length") for value in raw.split(b",")}
    if not lengths:
        return None
    if len(lengths) != 1 or not _DIGITS.match(next(iter(lengths))):
        raise HttpMessageError(status, "an invalid or conflicting Content-Length")
    return int(next(iter(lengths)))


def parse_request(head: Head) -> Request:
    parts = head.start.split(b" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[1] or not _VERSION.match(parts[2]):
        raise HttpMessageError(400, "a malformed request line")
    method, target, version = parts
    if any(byte <= 0x20 or byte == 0x7F for byte in target):
        raise HttpMessageError(400, "a malformed request target")
    request = Request(method, target, version, head)
    codings = [value.strip().lower() for raw in head.values(b"transfer-encoding") for value in raw.split(b",")]
    length = _length(head, 400)
    if codings:
        # RFC 9112 6.1: chunked must be the last coding of a request; with Content-Length too, it is a message
        # two parsers can frame differently, so it is refused rather than "fixed".
        if version == b"HTTP/1.0" or length is not None or codings[-1] != b"chunked":
            raise HttpMessageError(400, "a Transfer-Encoding this proxy does not relay")
        request.framing = Framing(chunked=True)
    else:
        request.framing = Framing(length=length or 0)
    return request


def parse_status(head: Head) -> int:
    if not _STATUS.match(head.start):
        raise HttpMessageError(502, "a malformed status line from the upstream")
    return int(head.start[9:12])


def response_framing(head: Head, status: int, method: bytes) -> Framing:
    """RFC 9112 6.3, in its order: no body for HEAD, 1xx, 204 and 304; chunked; a length; else until close."""
    if method == b"HEAD" or status < 200 or status in (204, 304):
        return Framing(length=0)
    codings = [value.strip().lower() for raw in head.values(b"transfer-encoding") for value in raw.split(b",")]
    if codings:
        return Framing(chunked=True) if codings[-1] == b"chunked" else Framing(until_close=True)
    length = _length(head, 502)
    return Framing(until_close=True) if length is None else Framing(length=length)


def serialize(start: bytes, fields: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join([start, b"\r\n", *(name + b": " + value + b"\r\n" for name, value in fields), b"\r\n"])


async def copy_body(
    source: Input, framing: Framing, send: Callable[[bytes], Awaitable[None]], count: Callable[[int], None],
    *, drop_trailer: bytes, status: int,
) -> None:
    """Relays one body from `source` to `send`, re-chunking a chunked one (sizes as plain hex, extensions dropped,
    trailer fields named `drop_trailer` dropped). `count` sees every byte read before it is passed on (it raises
    to cut the transfer). A body that ends early or is malformed is HttpMessageError(`status`)."""
    if framing.chunked:
        await _copy_chunked(source, send, count, drop_trailer=drop_trailer, status=status)
        return
    remaining = framing.length
    while remaining is None or remaining > 0:
        data = await source.some(READ_SIZE if remaining is None else min(READ_SIZE, remaining))
        if not data:
            if remaining is None:
                return
            raise HttpMessageError(status, "the connection ended inside a body")
        count(len(data))
        if remaining is not None:
            remaining -= len(data)
        await send(data)


async def _copy_chunked(
    source: Input, send: Callable[[bytes], Awaitable[None]], count: Callable[[int], None],
    *, drop_trailer: bytes, status: int,
) -> None:
    while True:
        line = await source.until(b"\r\n", MAX_CHUNK_LINE, status)
        if line is None:
            raise HttpMessageError(status, "the connection ended inside a chunked body")
        count(len(line))
        size_text = line[:-2].split(b";", 1)[0].strip(b" \t")
        if not _HEX.match(size_text):
            raise HttpMessageError(status, "a malformed chunk size")
        size = int(size_text, 16)
        if size == 0:
            break
        await send(b"%x\r\n" % size)
        remaining = size
        while remaining:
            data = await source.some(min(READ_SIZE, remaining))
            if not data:
                raise HttpMessageError(status, "the connection ended inside a chunk")
            count(len(data))
            remaining -= len(data)
            await send(data)
        end = await source.until(b"\r\n", 2, status)
        if end != b"\r\n":
            raise HttpMessageError(status, "a chunk not followed by CRLF")
        count(2)
        await send(b"\r\n")
    # The trailer: field lines up to an empty line, bounded like a head.
    lines: list[bytes] = []
    total = 0
    while True:
        line = await source.until(b"\r\n", MAX_HEAD, status)
        if line is None:
            raise HttpMessageError(status, "the connection ended inside a chunked body's trailer")
        count(len(line))
        total += len(line)
        if total > MAX_HEAD:
            raise HttpMessageError(status, "a chunked body's trailer too large")
        if line == b"\r\n":
            break
        lines.append(line)
    fields = parse_head(b"x\r\n" + b"".join(lines) + b"\r\n", status).fields
    await send(serialize(b"0", [item for item in fields if item[0].lower() != drop_trailer.lower()]))
