"""Saved outputs share one budget per sandbox; a loud command's output is spooled with its head and tail kept."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from sandbox_agent.saved_outputs import Budget, OutputDir, Spool, new_name, save
from sandbox_agent.tools.bash import HEAD_CHARS, INLINE_CHARS, TAIL_CHARS, _Output


async def direct_io(fn: Any, *args: Any) -> Any:
    return fn(*args)


def saved(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_the_oldest_outputs_make_room_for_a_new_one(tmp_path: Path) -> None:
    names = [new_name() for _ in range(5)]
    for name in names:
        save(str(tmp_path), name, b"x" * 400, budget=1000)
    assert saved(tmp_path) == sorted(names[-2:])
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 1000


def test_an_output_larger_than_the_budget_is_capped_with_a_note(tmp_path: Path) -> None:
    name = new_name()
    path = save(str(tmp_path), name, b"y" * 10_000, budget=2000)
    content = Path(path).read_bytes()
    assert len(content) <= 2000
    assert content.startswith(b"yyyy")
    assert content.endswith(b"of 10000 bytes were saved, the session's saved-output budget is used up]\n")


def test_a_spool_stays_within_the_budget(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), budget=100_000)
    spool.open()
    for _ in range(100):
        if spool.add(b"z" * 10_000):
            spool.flush()
    spool.close()
    assert spool.capped
    assert os.path.getsize(spool.path) <= 100_000
    assert spool.total == 1_000_000


def test_a_spool_that_cannot_be_made_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    spool = Spool(str(blocker / "outputs"), budget=100_000)
    spool.open()
    assert spool.error == "Not a directory"
    assert not spool.add(b"data")


def test_a_loud_output_keeps_only_its_ends_in_memory(tmp_path: Path) -> None:
    outputs = OutputDir(direct_io, str(tmp_path), Budget(0))
    output = _Output(outputs)
    chunk = b"".join(b"%09d\n" % n for n in range(100_000))  # 1 MB of numbered lines

    async def feed() -> tuple[str, Any]:
        for _ in range(8):
            await output.feed(chunk)
        await output.close()
        return await output.finish()

    head, spooled = asyncio.run(feed())
    assert spooled is not None
    assert len(head) == HEAD_CHARS
    assert spooled.total_bytes == 8 * len(chunk)
    assert spooled.total_lines == 800_001
    assert len(spooled.tail) <= TAIL_CHARS
    assert spooled.tail.endswith("000099999\n")
    assert Path(spooled.path).read_bytes() == chunk * 8
    assert output._parts is None
    assert sum(len(part) for part in output._tail) <= TAIL_CHARS + len(chunk)
    assert INLINE_CHARS < len(chunk) * 8
