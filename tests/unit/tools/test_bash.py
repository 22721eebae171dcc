"""The bash tool end to end through `run`: asks, output, exit codes, timeout, abort, live metadata."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox_agent.tools import bash
from sandbox_agent.tools.base import ToolContext, ToolError
from sandbox_agent.tools.bash import cap_output

from .conftest import Asked, Recorder

MakeCtx = Callable[..., ToolContext]


def meta_block(*lines: str) -> str:
    return "\n\n<bash_metadata>\n" + "\n".join(lines) + "\n</bash_metadata>"


def gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_echo(make_ctx: MakeCtx, recorder: Recorder) -> None:
    result = await bash.run({"command": "echo hello", "description": "Say hello"}, make_ctx())
    assert result.title == "Say hello"
    assert result.output == "hello\n"
    assert result.metadata == {"output": "hello\n", "exit": 0, "description": "Say hello"}
    assert recorder.asks == [Asked("bash", ["echo hello"], ["echo *"], {})]
    assert recorder.updates[0] == (None, {"output": "", "description": "Say hello"})
    assert recorder.updates[-1] == (None, {"output": "hello\n", "description": "Say hello"})


async def test_stderr_is_merged_in_order(make_ctx: MakeCtx) -> None:
    command = "echo out1; echo err1 >&2; echo out2; echo err2 1>&2"
    result = await bash.run({"command": command, "description": "d"}, make_ctx())
    assert result.output == "out1\nerr1\nout2\nerr2\n"


async def test_exit_code_is_metadata_not_output(make_ctx: MakeCtx) -> None:
    result = await bash.run({"command": "echo partial; exit 3", "description": "d"}, make_ctx())
    assert result.output == "partial\n"
    assert result.metadata["exit"] == 3


async def test_silent_success(make_ctx: MakeCtx) -> None:
    result = await bash.run({"command": "true", "description": "d"}, make_ctx())
    assert result.output == ""
    assert result.metadata == {"output": "", "exit": 0, "description": "d"}


async def test_killed_by_a_signal_has_no_exit_code(make_ctx: MakeCtx) -> None:
    result = await bash.run({"command": "kill -9 $$", "description": "d"}, make_ctx())
    assert result.output == ""
    assert result.metadata["exit"] is None


async def test_timeout_with_no_output(make_ctx: MakeCtx) -> None:
    started = time.monotonic()
    result = await bash.run({"command": "sleep 30", "description": "d", "timeout": 200}, make_ctx())
    assert time.monotonic() - started < 5
    text = meta_block("bash tool terminated command after exceeding timeout 200 ms")
    assert result.output == text
    assert result.metadata == {"output": text, "exit": None, "description": "d"}


async def test_timeout_keeps_earlier_output(make_ctx: MakeCtx) -> None:
    result = await bash.run({"command": "echo started; sleep 30", "description": "d", "timeout": 300.0},
                            make_ctx())
    assert result.output == "started\n" + meta_block("bash tool terminated command after exceeding timeout 300 ms")
    assert result.metadata["exit"] is None


async def test_timeout_fires_100ms_after_the_requested_time(make_ctx: MakeCtx) -> None:
    # A command that finishes within the 100 ms of slack is not reported as timed out.
    result = await bash.run({"command": "echo done", "description": "d", "timeout": 0}, make_ctx())
    assert result.output == "done\n"
    assert result.metadata["exit"] == 0


async def test_default_timeout_from_extra(make_ctx: MakeCtx) -> None:
    result = await bash.run({"command": "sleep 30", "description": "d"}, make_ctx(default_timeout_ms=150))
    assert result.output == meta_block("bash tool terminated command after exceeding timeout 150 ms")


async def test_timeout_kills_the_whole_group(make_ctx: MakeCtx) -> None:
    ctx = make_ctx()
    result = await bash.run({"command": "echo $$; sleep 30 & sleep 30; wait", "description": "d", "timeout": 200},
                            ctx)
    pgid = int(result.output.split("\n")[0])
    assert gone(pgid)


async def test_abort_while_running(make_ctx: MakeCtx) -> None:
    ctx = make_ctx()

    async def abort_on_output(_: str | None, metadata: dict[str, Any] | None) -> None:
        if metadata and metadata["output"]:
            ctx.abort.set()

    ctx.metadata = abort_on_output
    started = time.monotonic()
    result = await bash.run({"command": "echo $$; sleep 30 & sleep 30 & wait", "description": "d"}, ctx)
    assert time.monotonic() - started < 5
    pgid = int(result.output.split("\n")[0])
    assert result.output == f"{pgid}\n" + meta_block("User aborted the command")
    assert result.metadata["exit"] is None
    assert gone(pgid)


async def test_already_aborted_kills_immediately(make_ctx: MakeCtx) -> None:
    ctx = make_ctx()
    ctx.abort.set()
    started = time.monotonic()
    result = await bash.run({"command": "sleep 30", "description": "d"}, ctx)
    assert time.monotonic() - started < 2
    assert result.output == meta_block("User aborted the command")
    assert result.metadata == {"output": result.output, "exit": None, "description": "d"}


async def test_timeout_then_abort_reports_both(make_ctx: MakeCtx) -> None:
    ctx = make_ctx()
    # SIGTERM is ignored, so the group lives through the 200 ms grace period in which the abort arrives.
    command = "trap '' TERM; sleep 30"

    async def abort_later() -> None:
        await asyncio.sleep(0.3)
        ctx.abort.set()

    task = asyncio.ensure_future(abort_later())
    result = await bash.run({"command": command, "description": "d", "timeout": 100}, ctx)
    await task
    assert result.output == meta_block("bash tool terminated command after exceeding timeout 100 ms",
                                       "User aborted the command")
    assert result.metadata["exit"] is None


async def test_abort_after_exit_is_not_reported(make_ctx: MakeCtx) -> None:
    ctx = make_ctx()
    result = await bash.run({"command": "echo ok", "description": "d"}, ctx)
    ctx.abort.set()
    assert result.output == "ok\n"


async def test_background_child_does_not_hold_the_call(make_ctx: MakeCtx) -> None:
    started = time.monotonic()
    result = await bash.run({"command": "sleep 1000 & echo $!", "description": "d"}, make_ctx())
    elapsed = time.monotonic() - started
    pid = int(result.output.strip())
    os.kill(pid, signal.SIGKILL)
    assert elapsed < 2
    assert result.metadata["exit"] == 0


async def test_negative_timeout(make_ctx: MakeCtx, recorder: Recorder) -> None:
    for value, text in ((-5, "-5"), (-1.5, "-1.5"), (-5.0, "-5"), (-0.001, "-0.001")):
        with pytest.raises(ToolError) as caught:
            await bash.run({"command": "echo hi", "description": "d", "timeout": value}, make_ctx())
        assert str(caught.value) == f"Invalid timeout value: {text}. Timeout must be a positive number."
    assert recorder.asks == []
    assert recorder.updates == []


async def test_metadata_is_capped_at_30000_chars(make_ctx: MakeCtx, recorder: Recorder) -> None:
    result = await bash.run({"command": "head -c 40000 /dev/zero | tr '\\0' a", "description": "big"}, make_ctx())
    assert result.output == "a" * 40000
    capped = "a" * 30000 + "\n\n..."
    assert result.metadata == {"output": capped, "exit": 0, "description": "big"}
    assert recorder.updates[-1] == (None, {"output": capped, "description": "big"})
    for _, update in recorder.updates:
        assert update is not None
        assert len(update["output"]) <= 30005


async def test_exactly_30000_chars_is_not_capped(make_ctx: MakeCtx) -> None:
    result = await bash.run({"command": "head -c 30000 /dev/zero | tr '\\0' b", "description": "d"}, make_ctx())
    assert result.metadata["output"] == "b" * 30000


async def test_metadata_streams_with_throttling(make_ctx: MakeCtx) -> None:
    stamps: list[tuple[float, dict[str, Any] | None]] = []

    async def record(_: str | None, metadata: dict[str, Any] | None) -> None:
        stamps.append((time.monotonic(), metadata))

    ctx = make_ctx()
    ctx.metadata = record
    command = "for i in $(seq 1 40); do echo line$i; sleep 0.01; done"
    result = await bash.run({"command": command, "description": "d"}, ctx)
    expected = "".join(f"line{i}\n" for i in range(1, 41))
    assert result.output == expected
    assert stamps[0][1] == {"output": "", "description": "d"}
    assert stamps[-1][1] == {"output": expected, "description": "d"}
    streamed = stamps[1:]
    assert 3 <= len(streamed) < 40
    # Only the final flush may follow the previous update sooner than the interval.
    gaps = [later[0] - earlier[0] for earlier, later in itertools.pairwise(streamed[:-1])]
    assert all(gap >= 0.045 for gap in gaps), gaps
    # Each update is a prefix of the final output: the latest state, never a stale mix.
    for _, update in streamed:
        assert update is not None
        assert expected.startswith(update["output"])


async def test_utf8_split_across_chunks(make_ctx: MakeCtx) -> None:
    command = r"printf '\xc3'; sleep 0.1; printf '\xa9\n'; printf '\xff\n'"
    result = await bash.run({"command": command, "description": "d"}, make_ctx())
    assert result.output == "é\n\ufffd\n"


async def test_truncated_trailing_character(make_ctx: MakeCtx, recorder: Recorder) -> None:
    result = await bash.run({"command": r"printf 'ok\xc3'", "description": "d"}, make_ctx())
    assert result.output == "ok\ufffd"
    assert recorder.updates[-1] == (None, {"output": "ok\ufffd", "description": "d"})


async def test_workdir_relative_to_the_project(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    (project / "sub").mkdir()
    result = await bash.run({"command": "pwd", "description": "d", "workdir": "sub"}, make_ctx())
    assert result.output == f"{project}/sub\n"
    assert [a.permission for a in recorder.asks] == ["bash"]


async def test_default_workdir_is_the_project(make_ctx: MakeCtx, project: Path) -> None:
    result = await bash.run({"command": "pwd", "description": "d"}, make_ctx())
    assert result.output == f"{project}\n"


async def test_workdir_outside_asks_external_directory_first(make_ctx: MakeCtx, tmp_path: Path,
                                                            recorder: Recorder) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    result = await bash.run({"command": "ls", "description": "d", "workdir": str(outside)}, make_ctx())
    assert result.output == ""
    assert recorder.asks == [
        Asked("external_directory", [f"{outside}/*"], [f"{outside}/*"], {}),
        Asked("bash", ["ls"], ["ls *"], {}),
    ]


async def test_external_denied_runs_nothing(make_ctx: MakeCtx, tmp_path: Path, recorder: Recorder) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    victim = outside / "keep.txt"
    victim.write_text("x")
    recorder.deny.add("external_directory")
    with pytest.raises(ToolError, match="rejected permission"):
        await bash.run({"command": f"rm {victim}", "description": "d"}, make_ctx())
    assert victim.exists()
    assert [a.permission for a in recorder.asks] == ["external_directory"]
    assert recorder.asks[0].patterns == [f"{outside}/*"]
    assert recorder.updates == []


async def test_bash_denied_runs_nothing(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    recorder.deny.add("bash")
    with pytest.raises(ToolError):
        await bash.run({"command": "touch made.txt", "description": "d"}, make_ctx())
    assert not (project / "made.txt").exists()


async def test_cd_only_asks_nothing(make_ctx: MakeCtx, recorder: Recorder) -> None:
    (Path(make_ctx().directory) / "sub").mkdir()
    result = await bash.run({"command": "cd sub", "description": "d"}, make_ctx())
    assert result.output == ""
    assert recorder.asks == []


async def test_shell_env_reaches_the_command(make_ctx: MakeCtx) -> None:
    ctx = make_ctx()
    ctx.env = {"GREETING": "bonjour"}
    result = await bash.run({"command": "echo $GREETING", "description": "d"}, ctx)
    assert result.output == "bonjour\n"


async def test_stdin_is_closed(make_ctx: MakeCtx) -> None:
    result = await bash.run({"command": "cat; echo end", "description": "d", "timeout": 2000}, make_ctx())
    assert result.output == "end\n"


async def test_missing_workdir(make_ctx: MakeCtx) -> None:
    with pytest.raises(ToolError) as refused:
        await bash.run({"command": "ls", "description": "d", "workdir": "nope"}, make_ctx())
    assert str(refused.value) == "ENOENT: no such file or directory, posix_spawn '/bin/bash'"


def test_cap_output_counts_utf16_units() -> None:
    emoji = "\U0001f600"
    assert cap_output(emoji * 15000) == emoji * 15000
    assert cap_output(emoji * 15001) == emoji * 15000 + "\n\n..."
    assert cap_output("a" + emoji * 15000) == "a" + emoji * 14999 + "\ufffd\n\n..."
    assert cap_output("x" * 30001) == "x" * 30000 + "\n\n..."
