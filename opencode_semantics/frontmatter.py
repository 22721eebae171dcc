"""A markdown file's frontmatter cut out of its text the way gray-matter cuts it, and the second reading upstream
gives a frontmatter that is not YAML.

Only the text is handled here; reading the YAML itself is each side's business (the control plane reads agents
with PyYAML, the agent reads skills' few keys with its own subset parser), since this package needs no
dependency.
"""

from __future__ import annotations

import re

from opencode_semantics.javascript import JS_WHITESPACE

# A line the second reading may turn into a literal block: an ASCII identifier, a colon, the value.
_RETRY_ENTRY = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*:\s*(?P<value>[^\n\r\u2028\u2029]*)")


def split_matter(text: str) -> tuple[str, str, str] | None:
    """(language, frontmatter, content) as gray-matter cuts `text` before parsing anything; None when the
    text has no frontmatter (it does not start with `---`, or with `----`)."""
    if not text.startswith("---") or text[3:4] == "-":
        return None
    rest = text[3:]
    newline = re.search(r"\r?\n", rest)
    language = rest[: newline.start()] if newline else ""
    rest = rest[len(language):]
    close = rest.find("\n---")
    matter = rest if close < 0 else rest[:close]
    content = "" if close < 0 else rest[close + 4:]
    return language.strip(), matter, content.removeprefix("\r").removeprefix("\n")


def second_reading(text: str) -> str:
    """The text upstream parses again when its frontmatter is not valid YAML, as observed from v1.2.27 with
    published and hand-written SKILL.md files (tests/unit/custom/test_skills.py).

    Only the frontmatter changes: every line that starts at the margin with an ASCII identifier, a colon
    and an unquoted value holding a colon (other than a lone `|` or `>`) becomes a literal block (`|-`)
    of that value, so `Use when: x` is text instead of a nested mapping. A value's indented lines then
    belong to that block. Comments, blank and indented lines, and keys with other characters (a hyphen)
    stay as they are, so such a file still fails.
    """
    bounds = _matter_bounds(text)
    if bounds is None:
        return text
    begin, end = bounds
    lines = [_as_block(line) or [line] for line in re.split(r"\r?\n", text[begin:end])]
    return text[:begin] + "\n".join(part for group in lines for part in group) + text[end:]


def _matter_bounds(text: str) -> tuple[int, int] | None:
    """Where the frontmatter's lines are: after the opening `---` line, up to the line break before the
    first line that starts with `---`."""
    for opening in ("---\n", "---\r\n"):
        if text.startswith(opening):
            begin = len(opening)
            break
    else:
        return None
    closing = text.find("\n---", begin)
    if closing < 0:
        return None
    return begin, closing - 1 if closing > begin and text[closing - 1] == "\r" else closing


def _as_block(line: str) -> list[str] | None:
    """The two lines `key: |-` and `  value` that stand for `line` on the second reading, or None to keep it."""
    if not line or line[0].isspace() or line.strip(JS_WHITESPACE).startswith("#"):
        return None
    entry = _RETRY_ENTRY.fullmatch(line)
    if entry is None:
        return None
    value = entry["value"].strip(JS_WHITESPACE)
    if ":" not in value or value in (">", "|") or value[0] in "\"'":
        return None
    return [f"{entry['key']}: |-", f"  {value}"]
