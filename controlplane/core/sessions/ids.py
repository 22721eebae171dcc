"""Ascending identifiers in upstream's shape: `{prefix}_` + 12 hex digits + 14 base62 characters.

The hex part is the millisecond timestamp times 4096 plus a counter that restarts every
millisecond, so ids sort by creation time. Only the low 48 bits fit in 12 hex digits (upstream
truncates the same way), so the encoded time wraps every 2**36 ms (about 795 days).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
TIME_BITS = 48
COUNTER_SPACE = 0x1000


def encode_id(prefix: str, now_ms: int, counter: int) -> str:
    encoded = (now_ms * COUNTER_SPACE + counter) % (1 << TIME_BITS)
    # `byte % 62` is slightly biased, as upstream's; the suffix only has to make names unique.
    suffix = "".join(_BASE62[b % 62] for b in secrets.token_bytes(14))
    return f"{prefix}_{encoded:012x}{suffix}"


def decode_time_ms(identifier: str, prefix: str, now_ms: int | None = None) -> int:
    """The creation time in an id: upstream's wrapped reading, or with `now_ms` the full time
    (assuming the id is less than 2**36 ms old, which holds across a wrap of the encoding)."""
    head = f"{prefix}_"
    if not identifier.startswith(head):
        raise ValueError(f"not a {head}… id: {identifier!r}")
    wrapped = int(identifier[len(head) : len(head) + 12], 16) // COUNTER_SPACE
    if now_ms is None:
        return wrapped
    period = 1 << (TIME_BITS - 12)
    return now_ms - (now_ms - wrapped) % period


class AscendingIds:
    def __init__(self, prefix: str, clock: Callable[[], int] | None = None) -> None:
        self._prefix = prefix
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0

    def new(self) -> str:
        with self._lock:
            now = self._clock()
            if now != self._last_ms:
                self._last_ms, self._counter = now, 0
            self._counter += 1
            counter = self._counter
        return encode_id(self._prefix, now, counter)


_generators: dict[str, AscendingIds] = {}


def ascending(prefix: str) -> str:
    """A new id for `prefix` ("per", "call", "tool", ...)."""
    generator = _generators.get(prefix)
    if generator is None:
        generator = _generators.setdefault(prefix, AscendingIds(prefix))
    return generator.new()
