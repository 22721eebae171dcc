"""Unified diffs and change counts shaped like jsdiff 8's `createTwoFilesPatch` and `diffLines`.

Lines are compared whole, each keeping its terminator (`\\n` or `\\r\\n`), so a last line without a
newline differs from the same text with one. The line pairing comes from `difflib.SequenceMatcher`
(no autojunk) run between the common prefix and suffix, not from jsdiff's Myers diff. Known
divergence: when a change could be placed on either of several equal lines (repeated blank lines,
`}` lines, ...), or a block could be reported as moved up or down, difflib may pick a different
alignment than Myers, giving different but equally valid hunks (and additions/deletions counts).
Simple edits (one changed region, inserted or deleted blocks) come out identical.
"""

from __future__ import annotations

import difflib

CONTEXT = 4
NO_NEWLINE = "\\ No newline at end of file"
_HEADER_RULE = "=" * 67
JS_WHITESPACE = ("\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
                 "\u2028\u2029\u202f\u205f\u3000\ufeff")
"""What JavaScript's `trim()` and `\\s` count as white space (Python's `str.strip()` differs a little)."""


def _tokens(text: str) -> list[str]:
    """Lines keeping their `\\n`; a final piece without one is kept as is, an empty one dropped."""
    lines = text.split("\n")
    tokens = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        tokens.append(lines[-1])
    return tokens


def _line_diff(before: str, after: str) -> list[tuple[str, list[str]]]:
    """Components ("=", "-" or "+", lines) in order; removals come before additions in a change."""
    a, b = _tokens(before), _tokens(after)
    head = 0
    while head < len(a) and head < len(b) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < len(a) - head and tail < len(b) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    parts: list[tuple[str, list[str]]] = []

    def push(kind: str, lines: list[str]) -> None:
        if not lines:
            return
        if parts and parts[-1][0] == kind:
            parts[-1][1].extend(lines)
        else:
            parts.append((kind, list(lines)))

    push("=", a[:head])
    mid_a, mid_b = a[head:len(a) - tail], b[head:len(b) - tail]
    matcher = difflib.SequenceMatcher(None, mid_a, mid_b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            push("=", mid_a[i1:i2])
        else:
            push("-", mid_a[i1:i2])
            push("+", mid_b[j1:j2])
    push("=", a[len(a) - tail:])
    return parts


def count_changes(before: str, after: str) -> tuple[int, int]:
    """(additions, deletions): how many lines a line diff adds and removes."""
    additions = deletions = 0
    for kind, lines in _line_diff(before, after):
        if kind == "+":
            additions += len(lines)
        elif kind == "-":
            deletions += len(lines)
    return additions, deletions


def _hunks(parts: list[tuple[str, list[str]]]) -> list[str]:
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
