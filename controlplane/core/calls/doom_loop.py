"""Doom-loop detection: the same tool called with the same input three times in a row."""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Any

from opencode_semantics.javascript import json_stringify

REPEATS = 3
MAX_TRACKED = 10_000
"""Messages tracked at once; the oldest are forgotten first."""


def fingerprint(text: str) -> str:
    """What is kept of a call's stringified arguments: their digest, never the text. The text of the last
    three calls of each of up to MAX_TRACKED messages would be 24 MiB per message at 8 MiB arguments, kept
    as long as the message is tracked (a tenant naming a new message per call held 8 MiB per call)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class DoomLoopDetector:
    """Remembers the last calls per (session, message), as upstream looks at one assistant message."""

    def __init__(self) -> None:
        self._recent: dict[tuple[str, str], deque[tuple[str, str]]] = {}

    def observe(self, session_id: str, message_id: str, tool: str, args: Any, digest: str | None = None) -> bool:
        """Records a call; True when it completes a run of REPEATS identical ones. `digest`: the fingerprint
        of the arguments' text, already made (large ones' is, off the loop)."""
        key = (session_id, message_id)
        recent = self._recent.pop(key, None) or deque(maxlen=REPEATS)
        self._recent[key] = recent  # re-inserted: most recently used last
        recent.append((tool, fingerprint(json_stringify(args)) if digest is None else digest))
        if len(self._recent) > MAX_TRACKED:
            del self._recent[next(iter(self._recent))]
        return len(recent) == REPEATS and len(set(recent)) == 1

    def forget_session(self, session_id: str) -> None:
        for key in [k for k in self._recent if k[0] == session_id]:
            del self._recent[key]
