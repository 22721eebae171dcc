"""bash's outside-the-project check in the real sandbox: path arguments resolve as GNU `realpath` does there."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.client import PermissionRequest, ToolOutcome, allow_once
from controlplane.v1 import tool_pb2
from tests.planes import Plane, workspace_session

pytestmark = pytest.mark.docker


session_id = workspace_session({"a.txt": "a\n"})


async def bash(plane: Plane, session: str, command: str, **kw: Any) -> ToolOutcome:
    return await plane.client.execute_tool(session, "bash", {"command": command, "description": "Run it"}, **kw)


def asks(outcome: ToolOutcome) -> list[tuple[str, list[str], list[str]]]:
    return [(r.permission, list(r.patterns), list(r.always)) for r in outcome.permission_requests]


async def test_creating_outside_asks_for_the_parent(docker_plane: Plane, session_id: str) -> None:
    async def reject(request: PermissionRequest) -> tuple[int, str]:
        return tool_pb2.PermissionReply.REJECT, ""

    refused = await bash(docker_plane, session_id, "mkdir /tmp/v2-made", on_permission=reject)
    assert refused.error == "The user rejected permission to use this specific tool call."
    assert asks(refused) == [("external_directory", ["/tmp/*"], ["/tmp/*"])]
    check = await bash(docker_plane, session_id, "test -e /tmp/v2-made; echo $?", on_permission=allow_once)
    assert check.output == "1\n"

    made = await bash(docker_plane, session_id, "mkdir /tmp/v2-made && touch /tmp/v2-made/f", on_permission=allow_once)
    # The second path's parent does not exist yet when the command is checked: only /tmp is asked for.
    assert asks(made) == [("external_directory", ["/tmp/*"], ["/tmp/*"])]
    assert made.metadata["exit"] == 0
    # A path whose parent is missing resolves to nothing, as `realpath` fails on it.
    missing = await bash(docker_plane, session_id, "rm -rf /nonexistent-v2/x; touch inside.txt")
    assert asks(missing) == []
