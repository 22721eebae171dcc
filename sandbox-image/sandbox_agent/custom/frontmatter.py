"""The YAML frontmatter of markdown files (SKILL.md), split the way gray-matter splits it
(`opencode_semantics.frontmatter`, shared with the control plane's markdown agents).

Only a YAML subset is understood: enough for `name`/`description` and to tell when a value is not a string.
"""

from __future__ import annotations

import json
import re

from opencode_semantics.frontmatter import second_reading, split_matter
from sandbox_agent.errors import AgentError


class FrontmatterError(AgentError):
    """The frontmatter is not in the supported YAML subset."""


_KEY_LINE = re.compile(
    r"""^(?P<key>"(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^\s#'"][^\n]*?)[ \t]*:(?:[ \t]+(?P<value>.*))?$"""
)
_BLOCK_HEADER = re.compile(r"^(?P<style>[|>])(?P<a>[+-]?)(?P<indent>[1-9]?)(?P<b>[+-]?)[ \t]*(?:#.*)?$")
_NULL = re.compile(r"^(?:~|null|Null|NULL)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
# js-yaml 3's implicit int (no `0o`; `017` is octal; `1:30` is base 60), float and timestamp resolvers.
_INT = re.compile(
    r"^[-+]?(?:0|0b[01_]*[01][01_]*|0x[0-9a-fA-F_]*[0-9a-fA-F][0-9a-fA-F_]*|0[0-7_]*[0-7][0-7_]*"
    r"|[1-9][0-9_]*(?::[0-5]?[0-9])*)$"
)
_FLOAT = re.compile(
    r"^(?:[-+]?(?:0|[1-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_TIMESTAMP = re.compile(
    r"^(?:[0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}"
    r"(?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?)$"
)
# A `:` that makes a plain scalar a mapping key, which js-yaml rejects in a value.
_MAPPING_COLON = re.compile(r":(?:[ \t]|$)")
_ESCAPES = {"0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r",
            "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85", "_": "\xa0", "L": "\u2028",
            "P": "\u2029"}


class NotAString:
    """A YAML value that is not a string (number, boolean, date, list, mapping): `name` may not be one."""

    def __repr__(self) -> str:
        return "<not a string>"


NOT_A_STRING = NotAString()


def parse_frontmatter(text: str) -> tuple[dict[str, object], str]:
    """(data, content) as gray-matter splits a markdown file, with the data limited to what skills need.

    Supported: a top-level mapping of `key: value` lines; plain values (a trailing ` #comment` removed,
    indented continuation lines folded with spaces); 'single' and "double" quoted values (with YAML
    escapes); `|` and `>` block scalars with chomping and indentation indicators; comments and blank
    lines. Plain values that YAML reads as null become None; numbers, booleans, dates, flow collections
    and nested blocks become NOT_A_STRING. `---json` frontmatter is parsed as JSON. Anchors, aliases and
    tags are rejected. A file that does not parse gets a second reading (`second_reading`), as upstream
    gives it one.
    """
    text = text.removeprefix("\ufeff")  # Bun's file text() drops it before upstream sees the text
    try:
        return _parse(text)
    except FrontmatterError:
        retried = second_reading(text)
        if retried == text:
            raise
        return _parse(retried)


def _parse(text: str) -> tuple[dict[str, object], str]:
    parts = split_matter(text)
    if parts is None:
        return {}, text
    kind, matter, content = parts
    if not re.sub(r"(?m)^\s*#[^\n]+", "", matter).strip():
        return {}, content
    if kind == "json":
        data = _json_object(matter)
    elif kind in ("", "yaml", "yml"):
        data = _yaml_mapping(matter)
    else:
        raise FrontmatterError(f'frontmatter language "{kind}" is not supported')
    return data, content


def _json_object(matter: str) -> dict[str, object]:
    try:
        value = json.loads(matter)
    except ValueError as exc:
        raise FrontmatterError(str(exc)) from exc
    if not isinstance(value, dict):
        raise FrontmatterError("the frontmatter is not an object")
    return {key: (item if isinstance(item, str) or item is None else NOT_A_STRING) for key, item in value.items()}


def _yaml_mapping(matter: str) -> dict[str, object]:
    lines = [line.removesuffix("\r") for line in matter.split("\n")]
    if lines[-1] == "":  # the break before the closing `---` ends the last line; it opens no new one
        lines.pop()
    data: dict[str, object] = {}
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] in " \t":
            raise FrontmatterError(f"unexpected indentation: {line.strip()!r}")
        match = _KEY_LINE.match(line)
        if match is None:
            raise FrontmatterError(f"expected `key: value`, found {line!r}")
        key = _scalar_key(match["key"])
        if key in data:
            raise FrontmatterError(f'duplicated mapping key "{key}"')
        value = (match["value"] or "").strip()
        if value.startswith("#"):
            value = ""
        block: list[str] = []
        while index < len(lines) and (not lines[index].strip() or lines[index][0] in " \t"
                                      or (not value and re.match(r"-(?:[ \t]|$)", lines[index]))):
            block.append(lines[index])
            index += 1
        if any(line[:1] == "\t" and line.strip() for line in block):
            raise FrontmatterError("tab characters must not be used in indentation")
        data[key] = _value(value, block)
    return data


def _scalar_key(key: str) -> str:
    if key.startswith('"'):
        return _double_quoted(key)
    if key.startswith("'"):
        return key[1:-1].replace("''", "'")
    return key


def _value(value: str, block: list[str]) -> object:
    body = [line for line in block if line.strip()]
    if not value:
        if not body:
            return None
        first = body[0].strip()
        if first == "-" or first.startswith(("- ", "-\t")) or _KEY_LINE.match(first):
            return NOT_A_STRING
        return _value(first, block[block.index(body[0]) + 1:])
    if value[0] in "|>":
        return _block_scalar(value, block)
    if value[0] in "&*!":
        raise FrontmatterError(f"anchors, aliases and tags are not supported: {value!r}")
    if value[0] in "@`%,]}" or re.match(r"[-?:](?:[ \t]|$)", value):
        raise FrontmatterError(f"a plain value cannot start with {value[0]!r}")
    if value[0] in "[{":
        return NOT_A_STRING
    if value[0] in "\"'":
        return _quoted(value, block)
    first = _strip_comment(value)
    if _MAPPING_COLON.search(first):
        raise FrontmatterError(f"a plain value cannot hold a mapping: {value!r}")
    continued = [_strip_comment(line.strip()) for line in block]
    for line in continued:
        if _MAPPING_COLON.search(line):
            raise FrontmatterError(f"bad indentation of a mapping entry: {line!r}")
    body_lines = [value.strip(), *(line.strip() for line in block if line.strip())]
    if any(re.search(r"(?:^|[ \t])#", line) for line in body_lines[:-1]):
        raise FrontmatterError("a comment cannot be followed by more of a plain value")
    plain = _fold_plain([first, *continued])
    if _NULL.match(plain):
        return None
    if _BOOL.match(plain) or _INT.match(plain) or _FLOAT.match(plain) or _TIMESTAMP.match(plain):
        return NOT_A_STRING
    return plain


def _strip_comment(text: str) -> str:
    match = re.search(r"[ \t]#", text)
    return (text[: match.start()] if match else text).rstrip()


def _fold_plain(lines: list[str]) -> str:
    out = ""
    empty = 0
    for line in lines:
        if not line:
            empty += 1
            continue
        out += ("\n" * empty if empty else " ") + line if out else line
        empty = 0
    return out


def _quoted(value: str, block: list[str]) -> str:
    """A 'single' or "double" quoted scalar, possibly over several lines (folded as YAML flow scalars are)."""
    text = "\n".join([value, *block])
    pattern = r"'((?:[^']|'')*)'" if value[0] == "'" else r'"((?:[^"\\]|\\.)*)"'
    match = re.match(pattern, text, re.S)
    after = text[match.end():].split("\n") if match else []
    if (match is None or re.fullmatch(r"(?:[ \t]+(?:#.*)?)?", after[0]) is None
            or any(line.strip() and not line.lstrip(" \t").startswith("#") for line in after[1:])):
        raise FrontmatterError(f"unterminated quoted value: {value!r}")
    if value[0] == "'":
        return _fold_flow(match[1].split("\n"), escapes=False).replace("''", "'")
    return _double_quoted('"' + _fold_flow(match[1].split("\n"), escapes=True) + '"')


def _fold_flow(lines: list[str], *, escapes: bool) -> str:
    """Line folding inside quotes: a break is a space, k empty lines are k breaks, `\\` at a line end joins."""
    out = ""
    empty = 0
    joined = False
    last = len(lines) - 1
    for index, line in enumerate(lines):
        escaped_break = escapes and index < last and (len(line) - len(line.rstrip("\\"))) % 2 == 1
        piece = line if index == 0 else line.lstrip(" \t")
        if escaped_break:
            piece = piece[:-1]
        elif index < last:
            piece = piece.rstrip(" \t")
        if index == 0 or joined:
            out += piece
        elif not piece and index < last:
            empty += 1
            continue
        else:
            out += ("\n" * empty if empty else " ") + piece
        empty = 0
        joined = escaped_break
    return out


def _double_quoted(text: str) -> str:
    out: list[str] = []
    body = text[1:-1]
    index = 0
    while index < len(body):
        char = body[index]
        if char != "\\":
            out.append(char)
            index += 1
            continue
        code = body[index + 1: index + 2]
        if code in _ESCAPES:
            out.append(_ESCAPES[code])
            index += 2
            continue
        width = {"x": 2, "u": 4, "U": 8}.get(code)
        digits = body[index + 2: index + 2 + width] if width else ""
        if not width or not re.fullmatch(r"[0-9a-fA-F]+", digits) or len(digits) != width:
            raise FrontmatterError(f"unknown escape sequence in {text!r}")
        out.append(chr(int(digits, 16)))
        index += 2 + width
    return "".join(out)


def _block_scalar(header: str, block: list[str]) -> str:
    match = _BLOCK_HEADER.match(header)
    if match is None or (match["a"] and match["b"]):
        raise FrontmatterError(f"invalid block scalar header {header!r}")
    chomp = match["a"] or match["b"]
    indent = int(match["indent"]) if match["indent"] else _first_indent(block)
    lines: list[str] = []
    for line in block:
        if not line.strip() and len(line) <= indent:
            lines.append("")
        elif line[:indent].strip(" "):
            raise FrontmatterError(f"bad indentation in block scalar: {line.strip()!r}")
        else:
            lines.append(line[indent:])
    trailing = 0
    while lines and lines[-1] == "":
        lines.pop()
        trailing += 1
    text = "\n".join(lines) if match["style"] == "|" else _fold_block(lines)
    if not text or chomp == "-":
        return text
    return text + "\n" + ("\n" * trailing if chomp == "+" else "")


def _first_indent(block: list[str]) -> int:
    for line in block:
        if line.strip():
            return len(line) - len(line.lstrip(" "))
    return 1


def _fold_block(lines: list[str]) -> str:
    """YAML folding: a break between two text lines is a space, a run of k empty lines is k breaks."""
    out = ""
    empty = 0
    previous_text = False
    for line in lines:
        if line == "":
            empty += 1
            continue
        text_line = not line[0].isspace()
        if not out:
            out = "\n" * empty
        elif previous_text and text_line:
            out += " " if empty == 0 else "\n" * empty
        else:
            out += "\n" * (empty + 1)
        out += line
        empty = 0
        previous_text = text_line
    return out
