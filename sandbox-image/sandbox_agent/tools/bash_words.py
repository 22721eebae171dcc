"""A shell word's value as the program will receive it, when that is known before the command runs.

Quote and backslash removal only: a word holding an expansion, a substitution or an unquoted glob or brace
pattern has no value here, because the shell decides it at run time (bash_normalise treats such a word in
command position as a name it cannot know).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

SKIPPED = frozenset({"variable_assignment", "file_redirect", "heredoc_redirect", "herestring_redirect", "comment"})
"""Children of a `command` node that are not its words."""

_ANSI_SIMPLE = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
                "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
_ANSI = re.compile(r"\\(?:([abeEfnrtv\\'\"?])|([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{1,4})"
                   r"|U([0-9a-fA-F]{1,8})|c(.))", re.DOTALL)


@dataclass(frozen=True)
class Word:
    value: str | None
    """What the program receives; None when only the running shell knows."""
    raw: str
    """The word as written."""
    pattern: bool = False
    """Holds unquoted glob or brace characters: the shell may turn it into other words."""

    @property
    def shown(self) -> str:
        """The word in a normalised command text: its value, or as written when that is not known."""
        return self.value if self.value is not None else self.raw


def literal(value: str) -> Word:
    """A word whose value is given (split from a literal string, e.g. `env -S`'s)."""
    return Word(value, value)


def command_words(node: Node) -> list[Word]:
    """The words of a `command` node in order, its leading assignments and its redirects left out."""
    return [word(child) for child in node.children if child.is_named and child.type not in SKIPPED]


def assignments(node: Node) -> list[tuple[str, Word]]:
    """(name, value) of a `command` node's leading assignments (`X=1 cmd`)."""
    found = []
    for child in node.children:
        if child.type != "variable_assignment":
            continue
        name = child.child_by_field_name("name")
        value = child.child_by_field_name("value")
        if name is not None:
            found.append((_text(name), word(value) if value is not None else Word("", "")))
    return found


def word(node: Node) -> Word:
    value, pattern = _static(node)
    return Word(value, _text(node), pattern)


def _static(node: Node) -> tuple[str | None, bool]:
    kind = node.type
    raw = _text(node)
    if kind in ("word", "number"):
        return _unescape(raw), _unquoted_glob(raw)
    if kind == "command_name":
        children = [c for c in node.children if c.is_named]
        return _static(children[0]) if len(children) == 1 else (None, False)
    if kind == "raw_string":
        return raw[1:-1], False
    if kind == "string":
        parts = []
        for child in node.children:
            if not child.is_named:
                continue
            if child.type != "string_content":
                return None, False  # an expansion or substitution inside the quotes
            parts.append(_unescape_double(_text(child)))
        return "".join(parts), False
    if kind == "ansi_c_string":
        return _ansi_c(raw[2:-1]), False
    if kind == "translated_string":
        children = [c for c in node.children if c.is_named]
        return _static(children[0]) if len(children) == 1 else (None, False)
    if kind == "concatenation":
        values: list[str] = []
        pattern = False
        for child in node.children:
            value, glob = _static(child)
            if value is None:
                return None, False
            values.append(value)
            pattern = pattern or glob
        return "".join(values), pattern
    return None, False


def _unquoted_glob(raw: str) -> bool:
    """Whether an unquoted word has a glob or brace character that no backslash escapes."""
    escaped = False
    for ch in raw:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in "*?[{":
            return True
    return False


def _unescape(raw: str) -> str:
    """Backslash removal outside quotes: `\\x` is `x`, a backslash-newline is nothing."""
    out: list[str] = []
    chars = iter(raw)
    for ch in chars:
        if ch == "\\":
            nxt = next(chars, "")
            if nxt != "\n":
                out.append(nxt)
        else:
            out.append(ch)
    return "".join(out)


def _unescape_double(raw: str) -> str:
    """Inside double quotes a backslash escapes only `$`, a backquote, `"`, `\\` and a newline."""
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m.group(1) == "\n" else m.group(1), raw)


def _ansi_c(body: str) -> str:
    def one(m: re.Match[str]) -> str:
        simple, octal, hex2, u4, u8, ctrl = m.groups()
        if simple is not None:
            return _ANSI_SIMPLE[simple]
        if ctrl is not None:
            return chr(ord(ctrl) & 0x1F)
        code = int(octal, 8) if octal else int(hex2 or u4 or u8, 16 if (hex2 or u4 or u8) else 8)
        try:
            return chr(code)
        except (ValueError, OverflowError):
            return "\ufffd"

    # bash passes C strings: a NUL (`\\0`, `\\x00`, `\\c@`) ends the word there, so `$'rm\\0x'` runs `rm`.
    return _ANSI.sub(one, body).split("\0", 1)[0]


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")
