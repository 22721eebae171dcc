"""The apply_patch format: parsing `*** Begin Patch` text into hunks and computing an update's new content.

Pure functions (no I/O); `apply_patch.py` does the filesystem work. Divergences from v1.2.27 are listed there.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from opencode_semantics.javascript import JS_WHITESPACE
from sandbox_agent.errors import AgentError

# JavaScript's String.prototype.trim() set, which differs from str.strip() (e.g. U+FEFF yes, U+001C no).
_WS = "[" + JS_WHITESPACE + "]"
_HEREDOC = re.compile(
    rf"^(?:cat{_WS}+)?<<['\"]?([A-Za-z0-9_]+)['\"]?{_WS}*\n(.*?)\n\1{_WS}*\Z", re.DOTALL,
)
BEGIN_MARKER = "*** Begin Patch"
END_MARKER = "*** End Patch"
EOF_MARKER = "*** End of File"
_ADD = "*** Add File:"
_DELETE = "*** Delete File:"
_UPDATE = "*** Update File:"
_MOVE = "*** Move to:"
_PUNCTUATION = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"',
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-",
    "\u2026": "...", "\u00a0": " ",
})


class PatchError(AgentError):
    """A malformed patch or a chunk that does not apply; `str(exc)` is upstream's Error message."""


@dataclass(frozen=True)
class AddFile:
    path: str
    contents: str


@dataclass(frozen=True)
class DeleteFile:
    path: str


@dataclass(frozen=True)
class UpdateChunk:
    old_lines: list[str] = field(default_factory=list)
    new_lines: list[str] = field(default_factory=list)
    change_context: str | None = None
    is_end_of_file: bool = False


@dataclass(frozen=True)
class UpdateFile:
    path: str
    move_path: str | None = None
    chunks: list[UpdateChunk] = field(default_factory=list)


Hunk = AddFile | DeleteFile | UpdateFile


def js_trim(text: str) -> str:
    return text.strip(JS_WHITESPACE)


def js_trim_end(text: str) -> str:
    return text.rstrip(JS_WHITESPACE)


def strip_heredoc(text: str) -> str:
    """The body of a `cat <<'EOF' ... EOF` wrapper, or the text unchanged."""
    match = _HEREDOC.match(text)
    return match.group(2) if match else text


def is_empty_patch(text: str) -> bool:
    """Whether a patch that yielded no hunks is literally just the two markers (upstream's "empty patch")."""
    normalized = js_trim(text.replace("\r\n", "\n").replace("\r", "\n"))
    return normalized == f"{BEGIN_MARKER}\n{END_MARKER}"


def parse_patch(text: str) -> list[Hunk]:
    """The hunks between the markers; headers it does not know, and stray lines, are skipped."""
    lines = strip_heredoc(js_trim(text)).split("\n")
    begin = next((i for i, line in enumerate(lines) if js_trim(line) == BEGIN_MARKER), -1)
    end = next((i for i, line in enumerate(lines) if js_trim(line) == END_MARKER), -1)
    if begin == -1 or end == -1 or begin >= end:
        raise PatchError("Invalid patch format: missing Begin/End markers")

    hunks: list[Hunk] = []
    i = begin + 1
    while i < end:
        line = lines[i]
        # Like upstream, a hunk's body is read up to the next `***` line, not bounded by the End marker.
        if line.startswith(_ADD) and (path := js_trim(line[len(_ADD):])):
            contents, i = _parse_add_contents(lines, i + 1)
            hunks.append(AddFile(path, contents))
        elif line.startswith(_DELETE) and (path := js_trim(line[len(_DELETE):])):
            hunks.append(DeleteFile(path))
            i += 1
        elif line.startswith(_UPDATE) and (path := js_trim(line[len(_UPDATE):])):
            i += 1
            move_path = None
            if i < len(lines) and lines[i].startswith(_MOVE):
                move_path = js_trim(lines[i][len(_MOVE):]) or None
                i += 1
            chunks, i = _parse_update_chunks(lines, i)
            hunks.append(UpdateFile(path, move_path, chunks))
        else:
            i += 1
    return hunks


def _parse_add_contents(lines: list[str], i: int) -> tuple[str, int]:
    added: list[str] = []
    while i < len(lines) and not lines[i].startswith("***"):
        if lines[i].startswith("+"):
            added.append(lines[i][1:])
        i += 1
    return "\n".join(added), i


def _parse_update_chunks(lines: list[str], i: int) -> tuple[list[UpdateChunk], int]:
    chunks: list[UpdateChunk] = []
    while i < len(lines) and not lines[i].startswith("***"):
        if not lines[i].startswith("@@"):
            i += 1  # anything before the first `@@` is not part of a chunk
            continue
        context = js_trim(lines[i][2:]) or None
        i += 1
        old: list[str] = []
        new: list[str] = []
        eof = False
        while i < len(lines) and not lines[i].startswith("@@"):
            line = lines[i]
            # Platform decision: the marker is checked before the generic `***` stop, so it is honoured.
            if line == EOF_MARKER:
                eof = True
                i += 1
                break
            if line.startswith("***"):
                break
            if line.startswith(" "):
                old.append(line[1:])
                new.append(line[1:])
            elif line.startswith("-"):
                old.append(line[1:])
            elif line.startswith("+"):
                new.append(line[1:])
            i += 1
        chunks.append(UpdateChunk(old, new, context, eof))
    return chunks, i


def normalize_punctuation(text: str) -> str:
    """Typographic quotes, dashes, ellipsis and NBSP folded to ASCII (the 4th matching pass)."""
    return text.translate(_PUNCTUATION)


Comparator = Callable[[str, str], bool]
_PASSES: tuple[Comparator, ...] = (
    lambda a, b: a == b,
    lambda a, b: js_trim_end(a) == js_trim_end(b),
    lambda a, b: js_trim(a) == js_trim(b),
    lambda a, b: normalize_punctuation(js_trim(a)) == normalize_punctuation(js_trim(b)),
)


def seek_sequence(lines: list[str], pattern: list[str], start: int, eof: bool = False) -> int | None:
    """First index >= start where `pattern` matches, trying ever looser comparisons in turn.

    With `eof` the only candidate is the position that ends at the last line (platform decision).
    """
    if not pattern:
        return None
    last = len(lines) - len(pattern)
    candidates = ([last] if last >= start else []) if eof else range(start, last + 1)
    for same in _PASSES:
        for i in candidates:
            if all(same(lines[i + j], p) for j, p in enumerate(pattern)):
                return i
    return None


def _end_insertion_index(lines: list[str]) -> int:
    # Upstream keeps a trailing blank line below text appended at the end of the file.
    return len(lines) - 1 if lines and lines[-1] == "" else len(lines)


def compute_replacements(lines: list[str], path: str, chunks: list[UpdateChunk]) -> list[tuple[int, int, list[str]]]:
    """(start, number of old lines, new lines) per chunk, sorted by start; chunks are sought in order."""
    replacements: list[tuple[int, int, list[str]]] = []
    line_index = 0
    for chunk in chunks:
        if chunk.change_context:
            hit = seek_sequence(lines, [chunk.change_context], line_index)
            if hit is None:
                raise PatchError(f"Failed to find context '{chunk.change_context}' in {path}")
            line_index = hit + 1
        if not chunk.old_lines:
            # Platform decision: after the context line when there is one (upstream always appends).
            at_context = bool(chunk.change_context) and not chunk.is_end_of_file
            replacements.append((line_index if at_context else _end_insertion_index(lines), 0, chunk.new_lines))
            continue
        pattern, new_slice = chunk.old_lines, chunk.new_lines
        found = seek_sequence(lines, pattern, line_index, chunk.is_end_of_file)
        if found is None and pattern[-1] == "":
            pattern = pattern[:-1]
            if new_slice and new_slice[-1] == "":
                new_slice = new_slice[:-1]
            found = seek_sequence(lines, pattern, line_index, chunk.is_end_of_file)
        if found is None:
            raise PatchError(f"Failed to find expected lines in {path}:\n" + "\n".join(chunk.old_lines))
        replacements.append((found, len(pattern), new_slice))
        line_index = found + len(pattern)
    replacements.sort(key=lambda r: r[0])  # stable: an insertion stays ahead of a replacement at the same line
    return replacements


def derive_new_contents(path: str, chunks: list[UpdateChunk], original: str) -> str:
    """The file's content after applying `chunks`; raises PatchError naming `path` when one does not apply."""
    lines = original.split("\n")
    if lines[-1] == "":
        lines.pop()
    result = list(lines)
    for start, count, new in reversed(compute_replacements(lines, path, chunks)):
        result[start:start + count] = new
    if not result or result[-1] != "":
        result.append("")
    return "\n".join(result)
