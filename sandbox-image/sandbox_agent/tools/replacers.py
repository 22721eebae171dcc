"""The edit tool's matching: nine replacers, from exact to fuzzy, and the `replace` that tries them in order.

Each replacer yields candidate substrings *of the content*; `replace` then locates them exactly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from opencode_semantics.javascript import JS_WHITESPACE
from sandbox_agent.tools.base import ToolError

NOT_FOUND = ("Could not find oldString in the file. It must match exactly, including whitespace, indentation, "
             "and line endings.")
MULTIPLE = "Found multiple matches for oldString. Provide more surrounding context to make the match unique."
IDENTICAL = "No changes to apply: oldString and newString are identical."

BLOCK_ANCHOR_THRESHOLD = 0.3
"""Minimum middle-line similarity for BlockAnchor. Upstream accepts a lone candidate at 0.0, which let one
pair of anchor lines swallow any unrelated block (issue #24959); the platform uses 0.3 for every case."""

Replacer = Callable[[str, str], Iterator[str]]

_SPACE = "[" + re.escape(JS_WHITESPACE) + "]"
_SPACES = re.compile(_SPACE + "+")
_ESCAPE = re.compile(r"\\(n|t|r|'|\"|`|\\|\n|\$)")
_UNESCAPED = {"n": "\n", "t": "\t", "r": "\r", "\n": "\n"}


def _trim(text: str) -> str:
    return text.strip(JS_WHITESPACE)


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions and substitutions all cost 1)."""
    if not a or not b:
        return max(len(a), len(b))
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def _drop_trailing_empty(lines: list[str]) -> list[str]:
    return lines[:-1] if lines and lines[-1] == "" else lines


def _windows(content_lines: list[str], size: int) -> Iterator[str]:
    """Every run of `size` consecutive lines, joined back with `\\n`."""
    for i in range(len(content_lines) - size + 1):
        yield "\n".join(content_lines[i:i + size])


def simple(content: str, find: str) -> Iterator[str]:
    yield find


def line_trimmed(content: str, find: str) -> Iterator[str]:
    lines = content.split("\n")
    wanted = [_trim(line) for line in _drop_trailing_empty(find.split("\n"))]
    for i in range(len(lines) - len(wanted) + 1):
        if all(_trim(lines[i + j]) == want for j, want in enumerate(wanted)):
            yield "\n".join(lines[i:i + len(wanted)])


def _middle_similarity(lines: list[str], start: int, end: int, wanted: list[str]) -> float:
    """Average similarity of the lines between the anchors; 1.0 when there are none to compare."""
    checked = min(len(wanted) - 2, end - start - 1)
    if checked <= 0:
        return 1.0
    total = 0.0
    for j in range(1, min(len(wanted), end - start + 1) - 1):
        have, want = _trim(lines[start + j]), _trim(wanted[j])
        longest = max(len(have), len(want))
        if longest:
            total += 1 - levenshtein(have, want) / longest
    return total / checked


def block_anchor(content: str, find: str) -> Iterator[str]:
    wanted = find.split("\n")
    if len(wanted) < 3:
        return
    wanted = _drop_trailing_empty(wanted)
    lines = content.split("\n")
    first, last = _trim(wanted[0]), _trim(wanted[-1])
    candidates: list[tuple[int, int]] = []
    for i, line in enumerate(lines):
        if _trim(line) != first:
            continue
        end = next((j for j in range(i + 2, len(lines)) if _trim(lines[j]) == last), None)
        if end is not None:
            candidates.append((i, end))
    best: tuple[int, int] | None = None
    best_score = -1.0
    for start, end in candidates:
        score = _middle_similarity(lines, start, end, wanted)
        if score > best_score:
            best, best_score = (start, end), score
    if best is not None and best_score >= BLOCK_ANCHOR_THRESHOLD:
        yield "\n".join(lines[best[0]:best[1] + 1])


def _squash(text: str) -> str:
    return _trim(_SPACES.sub(" ", text))


def whitespace_normalized(content: str, find: str) -> Iterator[str]:
    target = _squash(find)
    lines = content.split("\n")
    words = _SPACES.split(_trim(find))
    loose = (_SPACE + "+").join(re.escape(word) for word in words)
    for line in lines:
        squashed = _squash(line)
        if squashed == target:
            yield line
        elif target in squashed:
            match = re.search(loose, line)
            if match:
                yield match.group(0)
    size = len(find.split("\n"))
    if size > 1:
        for block in _windows(lines, size):
            if _squash(block) == target:
                yield block


def _dedent(text: str) -> str:
    lines = text.split("\n")
    filled = [line for line in lines if _trim(line)]
    if not filled:
        return text
    indent = min(len(line) - len(line.lstrip(JS_WHITESPACE)) for line in filled)
    return "\n".join(line[indent:] if _trim(line) else line for line in lines)


def indentation_flexible(content: str, find: str) -> Iterator[str]:
    target = _dedent(find)
    for block in _windows(content.split("\n"), len(find.split("\n"))):
        if _dedent(block) == target:
            yield block


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda match: _UNESCAPED.get(match.group(1), match.group(1)), text)


def escape_normalized(content: str, find: str) -> Iterator[str]:
    target = _unescape(find)
    if target in content:
        yield target
    for block in _windows(content.split("\n"), len(target.split("\n"))):
        if _unescape(block) == target:
            yield block


def trimmed_boundary(content: str, find: str) -> Iterator[str]:
    target = _trim(find)
    if target == find:
        return
    if target in content:
        yield target
    for block in _windows(content.split("\n"), len(find.split("\n"))):
        if _trim(block) == target:
            yield block


def context_aware(content: str, find: str) -> Iterator[str]:
    wanted = find.split("\n")
    if len(wanted) < 3:
        return
    wanted = _drop_trailing_empty(wanted)
    lines = content.split("\n")
    first, last = _trim(wanted[0]), _trim(wanted[-1])
    for i, line in enumerate(lines):
        if _trim(line) != first:
            continue
        end = next((j for j in range(i + 2, len(lines)) if _trim(lines[j]) == last), None)
        if end is None or end - i + 1 != len(wanted):
            continue
        pairs = [(_trim(lines[i + k]), _trim(wanted[k])) for k in range(1, len(wanted) - 1)]
        compared = [have == want for have, want in pairs if have or want]
        if not compared or sum(compared) / len(compared) >= 0.5:
            yield "\n".join(lines[i:end + 1])


def multi_occurrence(content: str, find: str) -> Iterator[str]:
    if not find:
        return  # upstream would loop forever; the edit tool never gets here with an empty find
    start = content.find(find)
    while start != -1:
        yield find
        start = content.find(find, start + len(find))


REPLACERS: tuple[Replacer, ...] = (simple, line_trimmed, block_anchor, whitespace_normalized, indentation_flexible,
                                   escape_normalized, trimmed_boundary, context_aware, multi_occurrence)


def replace(content: str, old: str, new: str, replace_all: bool = False) -> str:
    """`content` with `old` replaced by `new`; raises ToolError when no unique match is found.

    `new` is inserted verbatim, also with `replace_all`, where upstream's JavaScript `replaceAll` would expand
    `$$`, `$&`, `` $` `` and `$'` in it (an upstream quirk not reproduced: it corrupts shell and JS code).
    """
    if old == new:
        raise ToolError(IDENTICAL)
    found = False
    for replacer in REPLACERS:
        for candidate in replacer(content, old):
            index = content.find(candidate)
            if index == -1:
                continue
            found = True
            if replace_all:
                return content.replace(candidate, new)
            if index != content.rfind(candidate):
                continue
            return content[:index] + new + content[index + len(candidate):]
    raise ToolError(MULTIPLE if found else NOT_FOUND)
