"""OpenCode's permission wildcard: `*` and `?` globs turned into an anchored, dotall regex.

Matching is done on UTF-16 code units, as JavaScript does, so `?` stands for half of an emoji.
"""

from __future__ import annotations

import re
from functools import lru_cache

_SPECIALS = re.compile(r"[.+^${}()|\[\]\\]")
_OPTIONAL_TAIL = " .*"


def match(text: str, pattern: str) -> bool:
    """True when all of `text` matches `pattern` (case-sensitive: the platform runs on Linux)."""
    return _compile(pattern).fullmatch(_utf16(text.replace("\\", "/"))) is not None


@lru_cache(maxsize=1024)
def _compile(pattern: str) -> re.Pattern[str]:
    # Backslashes become `/` before escaping, so no escaped backslash survives.
    escaped = _SPECIALS.sub(lambda m: "\\" + m.group(0), _utf16(pattern.replace("\\", "/")))
    escaped = escaped.replace("*", ".*").replace("?", ".")
    # "ls *" must also match a bare "ls"; "ls*" keeps matching "lstmeval".
    if escaped.endswith(_OPTIONAL_TAIL):
        escaped = escaped[: -len(_OPTIONAL_TAIL)] + "( .*)?"
    # fullmatch rather than `^…$`: Python's `$` would also match before a final newline.
    return re.compile(escaped, re.DOTALL)


def _utf16(s: str) -> str:
    """Splits astral characters into surrogate pairs so `.` consumes one UTF-16 unit, as in JS."""
    if s.isascii() or max(s) <= "\uffff":
        return s
    out: list[str] = []
    for ch in s:
        cp = ord(ch)
        if cp > 0xFFFF:
            cp -= 0x10000
            out.append(chr(0xD800 + (cp >> 10)))
            out.append(chr(0xDC00 + (cp & 0x3FF)))
        else:
            out.append(ch)
    return "".join(out)
