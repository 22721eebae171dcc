"""Truncation limits, quirks, message layouts and saved-output ids (opencode-tools.md §4, §14)."""

from __future__ import annotations

import re

import pytest

from controlplane.core.calls.truncation import (
    MAX_BYTES,
    MAX_LINES,
    Direction,
    OutputIds,
    Truncated,
    apply_truncation,
    hint,
    new_output_id,
    output_id_expired,
    output_id_time_ms,
    render,
    task_hint_allowed,
    truncate,
    utf8_len,
)
from controlplane.core.permissions.permission import Rule

TASK_HINT = (
    "The tool call succeeded but the output was truncated. Full output saved to: /o/tool_x\n"
    "Use the Task tool to have explore agent process this file with Grep and Read (with offset/limit). "
    "Do NOT read the full file yourself - delegate to save context."
)
GREP_HINT = (
    "The tool call succeeded but the output was truncated. Full output saved to: /o/tool_x\n"
    "Use Grep to search the full content or Read with offset/limit to view specific sections."
)


def test_limits() -> None:
    assert (MAX_LINES, MAX_BYTES) == (2000, 51200)


@pytest.mark.parametrize("text", ["", "a", "x\n" * 1999, "\n".join(["y"] * 2000), "z" * 51200])
def test_within_limits_is_unchanged(text: str) -> None:
    assert truncate(text) == Truncated(text, False)


def test_2000_lines_plus_trailing_newline_truncates_one_empty_line() -> None:
    text = "\n".join(f"line{i}" for i in range(2000)) + "\n"
    result = truncate(text)
    assert (result.truncated, result.removed, result.unit) == (True, 1, "lines")
    assert result.content == text[:-1]
    assert render(result, "H").endswith("line1999\n\n...1 lines truncated...\n\nH")


def test_single_oversized_line_gives_empty_preview() -> None:
    result = truncate("x" * 61440)
    assert result == Truncated("", True, 61440, "bytes")
    assert render(result, GREP_HINT) == "\n\n...61440 bytes truncated...\n\n" + GREP_HINT


def test_head_by_lines() -> None:
    text = "\n".join(str(i) for i in range(2500))
    result = truncate(text)
    assert result.content == "\n".join(str(i) for i in range(2000))
    assert (result.removed, result.unit) == (500, "lines")


def test_head_by_bytes_counts_separators_and_removed_bytes() -> None:
    # 10 lines of 9 bytes: each kept line after the first also costs its "\n".
    text = "\n".join(["abcdefghi"] * 10)
    result = truncate(text, max_bytes=30)
    assert result.content == "abcdefghi\nabcdefghi\nabcdefghi"  # 9 + 10 + 10 = 29; a 4th would be 39
    assert (result.removed, result.unit) == (len(text) - 29, "bytes")


def test_head_byte_budget_is_inclusive() -> None:
    text = "aaaa\nbbbb\ncccc"
    result = truncate(text, max_bytes=9)
    assert (result.content, result.removed, result.unit) == ("aaaa\nbbbb", 5, "bytes")


def test_tail_by_lines_and_layout() -> None:
    text = "\n".join(str(i) for i in range(10))
    result = truncate(text, max_lines=3, direction="tail")
    assert (result.content, result.removed, result.unit) == ("7\n8\n9", 7, "lines")
    assert render(result, "HINT") == "...7 lines truncated...\n\nHINT\n\n7\n8\n9"


def test_tail_by_bytes() -> None:
    text = "first\n" + "x" * 10 + "\nlast"
    result = truncate(text, max_bytes=16, direction="tail")
    assert (result.content, result.unit) == ("x" * 10 + "\nlast", "bytes")
    assert result.removed == len("first\n")


def test_tail_trailing_newline_keeps_empty_last_line() -> None:
    result = truncate("a\nb\nc\n", max_lines=2, direction="tail")
    assert (result.content, result.removed) == ("c\n", 2)


def test_bytes_are_utf8() -> None:
    # 25,601 two-byte characters: 25,601 code points but 51,202 bytes.
    text = "é" * 25601
    result = truncate(text)
    assert result == Truncated("", True, 51202, "bytes")
    assert truncate("é" * 25600).truncated is False


def test_utf8_len_handles_surrogates_like_node() -> None:
    assert utf8_len("😀") == 4
    assert utf8_len("\ud83d\ude00") == 4  # a pair held as two code points
    assert utf8_len("a\ud800b") == 5  # lone surrogate -> U+FFFD (3 bytes)


def test_lines_beat_bytes_when_both_exceeded_but_lines_hit_first() -> None:
    text = "\n".join(["ab"] * 3000)  # 8,999 bytes: only the line limit bites
    result = truncate(text)
    assert (result.removed, result.unit) == (1000, "lines")


def test_head_layout() -> None:
    result = Truncated("p1\np2", True, 3, "lines")
    assert render(result, "H") == "p1\np2\n\n...3 lines truncated...\n\nH"


def test_hints() -> None:
    assert hint("/o/tool_x", task_allowed=True) == TASK_HINT
    assert hint("/o/tool_x", task_allowed=False) == GREP_HINT


def test_task_hint_allowed_follows_the_task_permission() -> None:
    assert task_hint_allowed(None) is False
    assert task_hint_allowed([]) is True  # no rule: "ask", which is not "deny"
    assert task_hint_allowed([Rule("*", "*", "deny")]) is False
    assert task_hint_allowed([Rule("*", "*", "deny"), Rule("task", "*", "allow")]) is True
    # Evaluated with pattern "*": a rule for one subagent only does not match it.
    assert task_hint_allowed([Rule("task", "*", "deny"), Rule("task", "explore", "allow")]) is False


# --- ids -----------------------------------------------------------------------------------------

ID_RE = re.compile(r"tool_[0-9a-f]{12}[0-9A-Za-z]{14}")


def test_output_id_shape_and_encoding() -> None:
    name = new_output_id(1_000, 5)
    assert ID_RE.fullmatch(name)
    assert name[5:17] == f"{1_000 * 4096 + 5:012x}"
    assert output_id_time_ms(name) == 1_000


def test_output_id_keeps_low_48_bits_like_upstream() -> None:
    now = 1_773_000_000_123  # a 2026 timestamp: ms * 4096 needs 53 bits
    name = new_output_id(now, 1)
    assert name[5:17] == f"{(now * 4096 + 1) % (1 << 48):012x}"
    assert output_id_time_ms(name) == now % (1 << 36)
    assert output_id_time_ms(name, now + 5_000) == now


def test_output_id_time_rebuilt_across_a_wrap() -> None:
    period = 1 << 36
    created = 3 * period - 10  # just before the encoding wraps
    name = new_output_id(created, 1)
    assert output_id_time_ms(name, 3 * period + 50) == created


def test_output_id_expiry() -> None:
    now = 1_773_000_000_000
    day = 24 * 3600 * 1000
    assert output_id_expired(new_output_id(now - 8 * day, 1), now) is True
    assert output_id_expired(new_output_id(now - 6 * day, 1), now) is False
    assert output_id_expired("not-an-output", now) is False
    with pytest.raises(ValueError, match="not a tool_… id"):
        output_id_time_ms("prt_0123")


def test_ids_ascend_with_a_counter_per_millisecond() -> None:
    ticks = iter([7, 7, 7, 8])
    ids = OutputIds(clock=lambda: next(ticks))
    names = [ids.new() for _ in range(4)]
    assert [n[5:17] for n in names] == [f"{7 * 4096 + 1:012x}", f"{7 * 4096 + 2:012x}",
                                        f"{7 * 4096 + 3:012x}", f"{8 * 4096 + 1:012x}"]
    assert names == sorted(names)
    assert len({n[17:] for n in names}) == 4  # random suffixes


# --- apply_truncation ----------------------------------------------------------------------------


async def test_apply_truncation_not_truncated_does_not_save() -> None:
    async def save(name: str, text: str) -> str:
        raise AssertionError("must not save")

    assert await apply_truncation("short", task_allowed=True, save=save) == ("short", {"truncated": False})


async def test_apply_truncation_saves_full_text_and_points_to_it() -> None:
    saved: dict[str, str] = {}

    async def save(name: str, text: str) -> str:
        saved[name] = text
        return f"/data/tool-output/{name}"

    text = "\n".join(str(i) for i in range(2001))
    content, meta = await apply_truncation(text, task_allowed=False, save=save, ids=OutputIds(clock=lambda: 42))
    (name, full), = saved.items()
    assert full == text
    assert name.startswith(f"tool_{42 * 4096 + 1:012x}")
    path = f"/data/tool-output/{name}"
    assert meta == {"truncated": True, "outputPath": path}
    assert content == (
        "\n".join(str(i) for i in range(2000)) + "\n\n...1 lines truncated...\n\n"
        f"The tool call succeeded but the output was truncated. Full output saved to: {path}\n"
        "Use Grep to search the full content or Read with offset/limit to view specific sections."
    )


async def test_apply_truncation_tail_with_task_hint() -> None:
    async def save(name: str, text: str) -> str:
        return "/p"

    content, _ = await apply_truncation("a\nb\nc", task_allowed=True, save=save, direction="tail", max_lines=1)
    assert content == (
        "...2 lines truncated...\n\nThe tool call succeeded but the output was truncated. Full output saved to: /p\n"
        "Use the Task tool to have explore agent process this file with Grep and Read (with offset/limit). "
        "Do NOT read the full file yourself - delegate to save context.\n\nc"
    )


def _split_reference(text: str, max_lines: int, max_bytes: int, direction: str) -> tuple[str, bool, int, str]:
    """The truncation as it was written first: every line split out at once."""
    lines = text.split("\n")
    total = utf8_len(text)
    if len(lines) <= max_lines and total <= max_bytes:
        return text, False, 0, "lines"
    kept: list[str] = []
    size = 0
    for line in (lines if direction == "head" else list(reversed(lines))):
        if len(kept) >= max_lines:
            break
        cost = utf8_len(line) + (1 if kept else 0)
        if size + cost > max_bytes:
            if direction == "tail":
                kept.reverse()
            return "\n".join(kept), True, total - size, "bytes"
        kept.append(line)
        size += cost
    if direction == "tail":
        kept.reverse()
    return "\n".join(kept), True, len(lines) - len(kept), "lines"


@pytest.mark.parametrize("direction", ["head", "tail"])
def test_lines_taken_one_by_one_match_a_split_of_the_whole_text(direction: Direction) -> None:
    import random

    rng = random.Random(7)
    for _ in range(400):
        text = "".join(rng.choice(["\n", "a", "é", "xyz", "\n\n", "🙂"]) for _ in range(rng.randint(0, 40)))
        max_lines, max_bytes = rng.randint(1, 12), rng.randint(0, 40)
        got = truncate(text, max_lines=max_lines, max_bytes=max_bytes, direction=direction)
        assert (got.content, got.truncated, got.removed, got.unit) == _split_reference(
            text, max_lines, max_bytes, direction), (text, max_lines, max_bytes)
