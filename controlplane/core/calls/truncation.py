"""Generic tool-output truncation (2000 lines / 50 KiB) and the `tool_…` names of saved full outputs.

Sizes are UTF-8 bytes of the text as JavaScript holds it, so results match upstream byte for byte.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from controlplane.core.calls.spooled import Spooled
from controlplane.core.permissions.permission import Rule, evaluate
from controlplane.core.sessions import ids
from controlplane.errors import ResourceExhaustedError

MAX_LINES = 2000
MAX_BYTES = 50 * 1024
RETENTION_MS = 7 * 24 * 60 * 60 * 1000
"""Saved outputs older than this are deleted by the hourly cleanup."""

Direction: TypeAlias = Literal["head", "tail"]
Unit: TypeAlias = Literal["lines", "bytes"]


@dataclass(frozen=True)
class Truncated:
    content: str
    """The text itself when not truncated, else the kept lines (the preview)."""
    truncated: bool
    removed: int = 0
    unit: Unit = "lines"
    direction: Direction = "head"


def utf8_len(text: str) -> int:
    """`Buffer.byteLength(text)`: surrogate pairs count as one character, lone ones as U+FFFD."""
    if text.isascii():  # no copy: a tool's output may be many MiB (an 8 MiB todo list's is twice that)
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return len(text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace").encode("utf-8"))


def truncate(
    text: str, *, max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES, direction: Direction = "head",
) -> Truncated:
    """Keeps whole lines from the head (or tail) within both limits.

    A trailing newline counts as one more, empty, line; a first kept line over the byte budget
    leaves an empty preview.
    """
    # Lines are taken one by one, not split all at once: a long output's every line as a string of its own
    # took five times the output's size (an 8 MiB todowrite's output: 45 MiB) for the few kept.
    count = text.count("\n") + 1
    total = utf8_len(text)
    if count <= max_lines and total <= max_bytes:
        return Truncated(text, False, direction=direction)

    order = _lines(text, direction)
    kept: list[str] = []
    size = 0
    hit_bytes = False
    for line in order:
        if len(kept) >= max_lines:
            break
        cost = utf8_len(line) + (1 if kept else 0)
        if size + cost > max_bytes:
            hit_bytes = True
            break
        kept.append(line)
        size += cost
    if direction == "tail":
        kept.reverse()
    if hit_bytes:
        return Truncated("\n".join(kept), True, total - size, "bytes", direction)
    return Truncated("\n".join(kept), True, count - len(kept), "lines", direction)


def _lines(text: str, direction: Direction) -> Iterator[str]:
    """`text.split("\n")` from the head, or reversed from the tail, one line at a time."""
    if direction == "head":
        start = 0
        while (end := text.find("\n", start)) >= 0:
            yield text[start:end]
            start = end + 1
        yield text[start:]
        return
    end = len(text)
    while (start := text.rfind("\n", 0, end)) >= 0:
        yield text[start + 1:end]
        end = start
    yield text[:end]


def hint(path: str, *, task_allowed: bool) -> str:
    """What to do with the saved file: delegate to a subagent when the agent may use `task`."""
    head = f"The tool call succeeded but the output was truncated. Full output saved to: {path}\n"
    if task_allowed:
        return head + (
            "Use the Task tool to have explore agent process this file with Grep and Read (with offset/limit). "
            "Do NOT read the full file yourself - delegate to save context."
        )
    return head + "Use Grep to search the full content or Read with offset/limit to view specific sections."


def render(result: Truncated, hint_text: str) -> str:
    """The message that replaces a truncated output."""
    marker = f"...{result.removed} {result.unit} truncated..."
    if result.direction == "head":
        return f"{result.content}\n\n{marker}\n\n{hint_text}"
    return f"{marker}\n\n{hint_text}\n\n{result.content}"


def task_hint_allowed(ruleset: Iterable[Rule] | None) -> bool:
    """Whether the truncation hint may suggest the Task tool (no agent ruleset means no)."""
    if ruleset is None:
        return False
    return evaluate("task", "*", ruleset).action != "deny"


# --- output ids ----------------------------------------------------------------------------------

_PREFIX = "tool"


def new_output_id(now_ms: int, counter: int) -> str:
    """`tool_` + 12 hex digits of (ms * 4096 + counter) + 14 random base62 characters."""
    return ids.encode_id(_PREFIX, now_ms, counter)


def output_id_time_ms(name: str, now_ms: int | None = None) -> int:
    """The creation time encoded in an output id (see `ids.decode_time_ms`)."""
    return ids.decode_time_ms(name, _PREFIX, now_ms)


def output_id_expired(name: str, now_ms: int, retention_ms: int = RETENTION_MS) -> bool:
    """True for a `tool_…` name older than the retention; other names are never expired."""
    try:
        return output_id_time_ms(name, now_ms) < now_ms - retention_ms
    except ValueError:
        return False


class OutputIds(ids.AscendingIds):
    """Ascending output ids: a counter restarting at 1 in every new millisecond."""

    def __init__(self, clock: Callable[[], int] | None = None) -> None:
        super().__init__(_PREFIX, clock)


_default_ids = OutputIds()


async def apply_truncation(
    output: str,
    *,
    task_allowed: bool,
    save: Callable[[str, str], Awaitable[str]],
    direction: Direction = "head",
    max_lines: int = MAX_LINES,
    max_bytes: int = MAX_BYTES,
    ids: OutputIds | None = None,
) -> tuple[str, dict[str, Any]]:
    """Truncates `output` for the model; the full text goes to `save(name, text)`, which returns its path.

    Returns the content and the metadata to add: `{"truncated": False}`, or `{"truncated": True,
    "outputPath": path}`.
    """
    result = truncate(output, max_lines=max_lines, max_bytes=max_bytes, direction=direction)
    if not result.truncated:
        return output, {"truncated": False}
    try:
        path = await save((ids or _default_ids).new(), output)
    except ResourceExhaustedError as exc:
        # A full /tmp (or quota, or no file descriptors left) costs the saved copy, never the call or the session.
        return inline(output, output, utf8_len(output), str(exc), max_lines=max_lines, max_bytes=max_bytes), {
            "truncated": True, "outputSaveError": str(exc)}
    return render(result, hint(path, task_allowed=task_allowed)), {"truncated": True, "outputPath": path}


# --- outputs the sandbox kept bounded, and outputs that could not be saved ----------------------


NOT_SAVED = "The tool call succeeded but the output was truncated. The full output could not be saved ({reason})."
CAPPED = "(Only the first part of the output was saved: the session's saved-output budget is used up.)"


def inline(head_text: str, tail_text: str, total_bytes: int, reason: str, *, max_lines: int = MAX_LINES,
           max_bytes: int = MAX_BYTES) -> str:
    """The fallback when the full output could not be saved: its first and last lines (half the limits each)
    around a marker of what is left out, and why."""
    head = truncate(head_text, max_lines=max_lines // 2, max_bytes=max_bytes // 2)
    tail = truncate(tail_text, max_lines=max_lines // 2, max_bytes=max_bytes // 2, direction="tail")
    removed = max(0, total_bytes - utf8_len(head.content) - utf8_len(tail.content))
    note = NOT_SAVED.format(reason=reason)
    return f"{head.content}\n\n...{removed} bytes truncated...\n\n{note}\n\n{tail.content}"


def spooled_truncation(head_text: str, spooled: Spooled, *, task_allowed: bool) -> tuple[str, dict[str, Any]]:
    """What `apply_truncation` gives for the whole output, from its head and its totals.

    The head holds more than the preview can use (2000 lines / 50 KiB), so the preview and the kind of limit
    hit are those of the whole output; the removed count comes from the totals.
    """
    if not spooled.path:
        reason = spooled.error or "it was not saved"
        text = inline(head_text, spooled.tail, spooled.total_bytes, reason)
        return text, {"truncated": True, "outputSaveError": reason}
    result = truncate(head_text)
    kept_lines = len(head_text.split("\n")) - result.removed if result.unit == "lines" else 0
    if result.unit == "lines":
        removed = spooled.total_lines - kept_lines
    else:
        removed = spooled.total_bytes - (utf8_len(head_text) - result.removed)
    whole = Truncated(result.content, True, max(0, removed), result.unit, result.direction)
    text = render(whole, hint(spooled.path, task_allowed=task_allowed))
    if spooled.capped:
        text += "\n" + CAPPED
    return text, {"truncated": True, "outputPath": spooled.path}
