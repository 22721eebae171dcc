"""The CLI against a running control plane (in-process agents)."""

from __future__ import annotations

import asyncio
import json

import pytest

from controlplane import cli
from tests.planes import Plane


def run_cli(plane: Plane, *argv: str) -> int:
    return cli.main([*argv[:2], "--target", plane.plane.address, "--token", plane.token, *argv[2:]])


async def test_session_exec_tools_and_tool(local_plane: Plane, capsys: pytest.CaptureFixture[str]) -> None:
    assert await asyncio.to_thread(cli.main, [
        "session", "create", "--target", local_plane.plane.address, "--token", local_plane.token, "--json",
    ]) == 0
    session = json.loads(capsys.readouterr().out)
    sid = session[0]["id"] if isinstance(session, list) else session["id"]
    assert await asyncio.to_thread(run_cli, local_plane, "exec", sid, "--", "sh", "-c", "echo hi; exit 4") == 4
    assert capsys.readouterr().out == "hi\n"
    assert await asyncio.to_thread(run_cli, local_plane, "tools", sid) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == [
        "question", "bash", "read", "glob", "grep", "edit", "write", "task", "webfetch", "todowrite", "skill",
    ]
    args = json.dumps({"command": "echo from-tool", "description": "Echo"})
    assert await asyncio.to_thread(run_cli, local_plane, "tool", sid, "bash", args, "--yes") == 0
    assert capsys.readouterr().out == "from-tool\n\n"
    assert await asyncio.to_thread(run_cli, local_plane, "tool", sid, "read", "{}") == 1
    assert "The read tool was called with invalid arguments" in capsys.readouterr().err
    assert await asyncio.to_thread(run_cli, local_plane, "tool", "ses_missing", "read", "{}") == 2
    assert "NOT_FOUND" in capsys.readouterr().err
