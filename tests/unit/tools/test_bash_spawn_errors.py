"""bash behaviours observed from v1.2.27 (tests/oracle): Node's spawn errors, JavaScript timer overflow."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_agent.tools import bash
from sandbox_agent.tools.base import ToolContext, ToolError

from .conftest import Recorder

MakeCtx = Callable[..., ToolContext]


async def refusal(ctx: ToolContext, params: dict[str, object]) -> str:
    with pytest.raises(ToolError) as refused:
        await bash.run({"description": "d", **params}, ctx)
    return str(refused.value)


async def test_an_empty_command_is_refused_like_nodes_spawn(make_ctx: MakeCtx, recorder: Recorder) -> None:
    assert await refusal(make_ctx(), {"command": ""}) == "The argument 'file' cannot be empty. Received ''"
    assert recorder.asks == []
    assert recorder.updates == []


async def test_a_blank_command_still_runs(make_ctx: MakeCtx) -> None:
    result = await bash.run({"command": " ", "description": "d"}, make_ctx())
    assert (result.output, result.metadata["exit"]) == ("", 0)


async def test_a_missing_workdir_is_enoent(make_ctx: MakeCtx, recorder: Recorder) -> None:
    message = await refusal(make_ctx(), {"command": "pwd", "workdir": "nope"})
    assert message == "ENOENT: no such file or directory, posix_spawn '/bin/bash'"
    # As upstream: the live metadata went out before the spawn failed.
    assert recorder.updates == [(None, {"output": "", "description": "d"})]


async def test_a_tilde_workdir_is_not_expanded(make_ctx: MakeCtx) -> None:
    message = await refusal(make_ctx(), {"command": "pwd", "workdir": "~"})
    assert message == "ENOENT: no such file or directory, posix_spawn '/bin/bash'"


async def test_a_file_as_workdir_is_enotdir(make_ctx: MakeCtx, project: Path) -> None:
    (project / "f.txt").write_text("x\n")
    assert await refusal(make_ctx(), {"command": "pwd", "workdir": "f.txt"}) == (
        "ENOTDIR: not a directory, posix_spawn '/bin/bash'"
    )
    assert await refusal(make_ctx(), {"command": "pwd", "workdir": "f.txt/below"}) == (
        "ENOTDIR: not a directory, posix_spawn '/bin/bash'"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root enters any directory")
async def test_an_unenterable_workdir_is_eacces(make_ctx: MakeCtx, project: Path) -> None:
    locked = project / "locked"
    locked.mkdir(mode=0o600)
    assert await refusal(make_ctx(), {"command": "pwd", "workdir": "locked"}) == (
        "EACCES: permission denied, posix_spawn '/bin/bash'"
    )


def test_spawn_refusal_accepts_a_directory(tmp_path: Path) -> None:
    assert bash.spawn_refusal(str(tmp_path), "/bin/bash") is None
    assert bash.spawn_refusal(str(tmp_path / "gone"), "/bin/sh") == (
        "ENOENT: no such file or directory, posix_spawn '/bin/sh'"
    )


@pytest.mark.parametrize(("timeout_ms", "delay_ms"), [
    (0, 100), (300, 400), (1.5e-7, 100.00000015), (2**31 - 101, 2**31 - 1), (2**31 - 100, 1), (2**31, 1), (1e21, 1),
])
def test_the_timer_overflows_like_a_javascript_timer(timeout_ms: float, delay_ms: float) -> None:
    assert bash.timer_delay_ms(timeout_ms) == delay_ms


async def test_a_timeout_past_the_js_timer_range_stops_the_command_at_once(make_ctx: MakeCtx) -> None:
    result = await bash.run({"command": "sleep 5; echo done", "description": "d", "timeout": 2**31}, make_ctx())
    assert result.output == (
        "\n\n<bash_metadata>\nbash tool terminated command after exceeding timeout 2147483648 ms\n</bash_metadata>"
    )
    assert result.metadata["exit"] is None
