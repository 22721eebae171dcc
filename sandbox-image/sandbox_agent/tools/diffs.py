"""Unified diffs and change counts that match jsdiff 8's `createTwoFilesPatch` and `diffLines` byte for byte.

Lines are compared whole with their terminators, so a last line without a newline differs from one with it.
"""

from __future__ import annotations

import difflib

from opencode_semantics.javascript import JS_WHITESPACE

CONTEXT = 4
NO_NEWLINE = "\\ No newline at end of file"
_HEADER_RULE = "=" * 67
_MYERS_BUDGET = 1_000_000
"""Diagonal steps Myers may take before the diff falls back to difflib (about a second)."""


def _tokens(text: str) -> list[str]:
    """Lines keeping their `\\n`; a final piece without one is kept as is, an empty one dropped."""
    lines = text.split("\n")
    tokens = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        tokens.append(lines[-1])
    return tokens


Parts = list[tuple[str, list[str]]]
"""A line diff: components ("=", "-" or "+", lines) in order."""
_Chain = tuple[str, int, "_Chain | None"] | None
"""Components as a linked list, newest first: (kind, count, previous)."""


def _grow(chain: _Chain, kind: str) -> _Chain:
    if chain is not None and chain[0] == kind:
        return (kind, chain[1] + 1, chain[2])
    return (kind, 1, chain)


def _myers(a: list[str], b: list[str]) -> Parts | None:
    """jsdiff's variant of Myers' O(ND) diff, with its tie-breaks; None when it would take too long."""
    len_a, len_b = len(a), len(b)

    def snake(old: int, diagonal: int, chain: _Chain) -> tuple[int, int, _Chain]:
        new, start = old - diagonal, old
        while new + 1 < len_b and old + 1 < len_a and a[old + 1] == b[new + 1]:
            old, new = old + 1, new + 1
        return old, new, (("=", old - start, chain) if old > start else chain)

    def parts(chain: _Chain) -> Parts:
        kinds: list[tuple[str, int]] = []
        while chain is not None:
            kinds.append((chain[0], chain[1]))
            chain = chain[2]
        out: Parts = []
        i = j = 0
        for kind, count in reversed(kinds):
            if kind == "-":
                out.append((kind, a[i:i + count]))
                i += count
            else:
                out.append((kind, b[j:j + count]))
                j += count
                i += count if kind == "=" else 0
        return out

    old, new, chain = snake(-1, 0, None)
    if old + 1 >= len_a and new + 1 >= len_b:
        return parts(chain)
    best: dict[int, tuple[int, _Chain]] = {0: (old, chain)}
    low, high = -(len_a + len_b + 1), len_a + len_b + 1
    budget = _MYERS_BUDGET
    for edits in range(1, len_a + len_b + 1):
        for diagonal in range(max(low, -edits), min(high, edits) + 1, 2):
            budget -= 1
            if budget < 0:
                return None
            remove = best.pop(diagonal - 1, None)
            add = best.get(diagonal + 1)
            can_add = add is not None and 0 <= add[0] - diagonal < len_b
            can_remove = remove is not None and remove[0] + 1 < len_a
            if not can_add and not can_remove:
                best.pop(diagonal, None)
                continue
            # Branch from whichever neighbour got further through the old text (additions win ties).
            if add is not None and can_add and (not can_remove or (remove is not None and remove[0] < add[0])):
                old, chain = add[0], _grow(add[1], "+")
            else:
                assert remove is not None
                old, chain = remove[0] + 1, _grow(remove[1], "-")
            old, new, chain = snake(old, diagonal, chain)
            if old + 1 >= len_a and new + 1 >= len_b:
                return parts(chain)
            best[diagonal] = (old, chain)
            if old + 1 >= len_a:
                high = min(high, diagonal - 1)
            if new + 1 >= len_b:
                low = max(low, diagonal + 1)
    return None


def _difflib(a: list[str], b: list[str]) -> Parts:
    """A fallback for very different texts: difflib between the common prefix and suffix."""
    head = 0
    while head < len(a) and head < len(b) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < len(a) - head and tail < len(b) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    out: Parts = []

    def push(kind: str, lines: list[str]) -> None:
        if not lines:
            return
        if out and out[-1][0] == kind:
            out[-1][1].extend(lines)
        else:
            out.append((kind, list(lines)))

    push("=", a[:head])
    mid_a, mid_b = a[head:len(a) - tail], b[head:len(b) - tail]
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, mid_a, mid_b, autojunk=False).get_opcodes():
        if tag == "equal":
            push("=", mid_a[i1:i2])
        else:
            push("-", mid_a[i1:i2])
            push("+", mid_b[j1:j2])
    push("=", a[len(a) - tail:])
    return out


def _line_diff(before: str, after: str) -> Parts:
    """jsdiff's line diff. Known divergence: when the texts differ so much that Myers would take over
    about a second (`_MYERS_BUDGET`, e.g. two unrelated files of ~1000 lines each), the pairing comes
    from difflib instead; those hunks are valid, but where several alignments are equally short they
    may differ from jsdiff's."""
    a, b = _tokens(before), _tokens(after)
    found = _myers(a, b)
    return found if found is not None else _difflib(a, b)


def count_changes(before: str, after: str) -> tuple[int, int]:
    """(additions, deletions): how many lines a line diff adds and removes."""
    additions = deletions = 0
    for kind, lines in _line_diff(before, after):
        if kind == "+":
            additions += len(lines)
        elif kind == "-":
            deletions += len(lines)
    return additions, deletions


def _hunks(parts: Parts) -> list[str]:
    """Hunk headers and lines, with jsdiff's context merging and end-of-file markers."""
    out: list[str] = []
    parts = [*parts, ("=", [])]  # a closing empty context flushes the last hunk
    old_line = new_line = 1
    old_start = new_start = 0
    current: list[str] = []
    for i, (kind, lines) in enumerate(parts):
        if kind != "=":
            if not old_start:
                old_start, new_start = old_line, new_line
                current = []
                if i > 0:
                    current = [" " + line for line in parts[i - 1][1][-CONTEXT:]] if CONTEXT > 0 else []
                    old_start -= len(current)
                    new_start -= len(current)
            current.extend(kind + line for line in lines)
            if kind == "+":
                new_line += len(lines)
            else:
                old_line += len(lines)
            continue
        if old_start:
            if len(lines) <= CONTEXT * 2 and i < len(parts) - 2:
                current.extend(" " + line for line in lines)
            else:
                size = min(len(lines), CONTEXT)
                current.extend(" " + line for line in lines[:size])
                old_count = old_line - old_start + size
                new_count = new_line - new_start + size
                # Unified diff quirk: an empty side starts one line earlier.
                out.append(f"@@ -{old_start - (old_count == 0)},{old_count} "
                           f"+{new_start - (new_count == 0)},{new_count} @@")
                for line in current:
                    if line.endswith("\n"):
                        out.append(line[:-1])
                    else:
                        out.extend((line, NO_NEWLINE))
                old_start = new_start = 0
                current = []
        old_line += len(lines)
        new_line += len(lines)
    return out


def trim_diff(diff: str) -> str:
    """Removes the indentation every non-blank content line of the diff shares."""
    lines = diff.split("\n")

    def is_content(line: str) -> bool:
        return line[:1] in ("+", "-", " ") and not line.startswith(("---", "+++"))

    widths = [len(body) - len(body.lstrip(JS_WHITESPACE)) for line in lines if is_content(line)
              for body in (line[1:],) if body.strip(JS_WHITESPACE)]
    least = min(widths, default=0)
    if least == 0:
        return diff
    return "\n".join(line[0] + line[1 + least:] if is_content(line) else line for line in lines)


def unified_diff(path: str, before: str, after: str) -> str:
    """`createTwoFilesPatch(path, path, before, after)` followed by upstream's `trimDiff`."""
    header = [f"Index: {path}", _HEADER_RULE, f"--- {path}", f"+++ {path}"]
    return trim_diff("\n".join(header + _hunks(_line_diff(before, after))) + "\n")
