"""Truncation of an output the sandbox kept bounded (its head and totals) and the inline fallback when an output
could not be saved: the model reads what it would read of the whole output (opencode-tools.md §4)."""

from __future__ import annotations

import pytest

from controlplane.core.calls.spooled import Spooled
from controlplane.core.calls.truncation import (
    MAX_BYTES,
    NOT_SAVED,
    apply_truncation,
    hint,
    inline,
    render,
    spooled_truncation,
    truncate,
    utf8_len,
)
from controlplane.errors import ResourceExhaustedError

HEAD_CHARS = 128 * 1024
"""As the agent keeps (sandbox_agent.tools.bash.HEAD_CHARS)."""
PATH = "/tmp/home/.local/share/opencode/tool-output/tool_x"

WHOLE_OUTPUTS = {
    "short lines": "y\n" * 700_000,
    "one long line": "x" * 1_500_000,
    "long lines": ("z" * 3000 + "\n") * 500,
    "multibyte": ("é€😀" * 20 + "\n") * 20_000,
    "exactly 2000 short lines, then long ones": "a\n" * 1999 + "b" * 2_000_000,
    "line ending at the byte limit": "c" * (MAX_BYTES - 1) + "\n" + "d" * 2_000_000,
}


@pytest.mark.parametrize("whole", WHOLE_OUTPUTS.values(), ids=WHOLE_OUTPUTS.keys())
@pytest.mark.parametrize("task_allowed", [True, False])
def test_a_spooled_output_reads_as_the_whole_output_truncated(whole: str, task_allowed: bool) -> None:
    spooled = Spooled(PATH, utf8_len(whole), len(whole.split("\n")), whole[-32 * 1024:])
    text, meta = spooled_truncation(whole[:HEAD_CHARS], spooled, task_allowed=task_allowed)
    assert text == render(truncate(whole), hint(PATH, task_allowed=task_allowed))
    assert meta == {"truncated": True, "outputPath": PATH}


def test_a_capped_spooled_output_says_so_after_the_hint() -> None:
    whole = "y\n" * 700_000
    spooled = Spooled(PATH, utf8_len(whole), len(whole.split("\n")), "", capped=True)
    text, _ = spooled_truncation(whole[:HEAD_CHARS], spooled, task_allowed=False)
    assert text == render(truncate(whole), hint(PATH, task_allowed=False)) + (
        "\n(Only the first part of the output was saved: the session's saved-output budget is used up.)")


def test_an_unsaved_spooled_output_shows_its_head_and_tail_inline() -> None:
    whole = "".join(f"{n}\n" for n in range(1, 400_001))
    spooled = Spooled("", utf8_len(whole), len(whole.split("\n")), whole[-32 * 1024:], error="No space left on device")
    text, meta = spooled_truncation(whole[:HEAD_CHARS], spooled, task_allowed=True)
    assert meta == {"truncated": True, "outputSaveError": "No space left on device"}
    head, rest = text.split("\n\n...", 1)
    assert head == "\n".join(str(n) for n in range(1, 1001))
    marker, note, tail = rest.split("\n\n")
    assert note == NOT_SAVED.format(reason="No space left on device")
    assert tail.endswith("\n399999\n400000\n")
    assert utf8_len(head) + utf8_len(tail) <= MAX_BYTES
    removed = int(marker.split(" ")[0])
    assert removed == utf8_len(whole) - utf8_len(head) - utf8_len(tail)


async def test_a_save_the_sandbox_refuses_falls_back_inline() -> None:
    async def full(name: str, text: str) -> str:
        raise ResourceExhaustedError("No space left on device")

    whole = "line\n" * 5000
    text, meta = await apply_truncation(whole, task_allowed=True, save=full)
    assert meta == {"truncated": True, "outputSaveError": "No space left on device"}
    assert text.startswith("line\n" * 999 + "line\n\n...")
    assert NOT_SAVED.format(reason="No space left on device") in text
    assert text.endswith("\n" + "line\n" * 999)
    assert text == inline(whole, whole, utf8_len(whole), "No space left on device")
