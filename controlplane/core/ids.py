"""Ascending identifiers in upstream's shape: prefix, 12 hex digits of time, 14 base62 characters.

The hex part is the millisecond timestamp times 4096 plus a per-millisecond counter, so ids sort
by creation time (the tool-output cleanup reads the time back from the name).
"""

from __future__ import annotations

import secrets
import string
import threading
import time

_BASE62 = string.digits + string.ascii_uppercase + string.ascii_lowercase
_lock = threading.Lock()
_last_ms = 0
_counter = 0


def ascending(prefix: str, now_ms: int | None = None) -> str:
    global _last_ms, _counter
    with _lock:
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        if ms != _last_ms:
            _last_ms, _counter = ms, 0
        _counter += 1
        value = ms * 0x1000 + _counter
    tail = "".join(secrets.choice(_BASE62) for _ in range(14))
    return f"{prefix}_{value & 0xFFFFFFFFFFFF:012x}{tail}"


def timestamp_ms(identifier: str) -> int:
    """The creation time encoded in an ascending id."""
    hex_part = identifier.split("_", 1)[1][:12]
    return int(hex_part, 16) // 0x1000
