"""Permission rules decided by the control plane for tools running in a real sandbox.

Patterns come from the sandbox (bash's tree-sitter scan, read's absolute paths, external-directory
globs); the decisions, asks and replies are the control plane's, over the real gRPC API.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from controlplane.client import PermissionRequest, ToolOutcome
from controlplane.core.permissions.permission import REJECTED_MESSAGE
from controlplane.v1 import tool_pb2
from tests.planes import (
    Plane,
    PlaneProcess,
    new_instance,
    remove_data_dir,
    remove_instance_leftovers,
    short_tmp,
    workspace_session,
)

pytestmark = pytest.mark.docker

FILES = {
    ".env": "A=1\n", ".env.local": "B=2\n", ".env.example": "C=3\n", "prod.env": "D=4\n", "env.txt": "E=5\n",
    "config/.env": "F=6\n", "src/main.py": "print('hi')\n",
}
RULES = {
    "bash": {"*": "ask", "git *": "allow", "git push *": "deny", "ls *": "allow", "echo *": "allow",
             "lstmeval*": "deny"},
}


session_id = workspace_session(FILES, config_json=json.dumps({"permission": RULES}))


class Recorder:
    def __init__(self, reply: int = tool_pb2.PermissionReply.ONCE) -> None:
        self.reply = reply
        self.requests: list[PermissionRequest] = []

    async def __call__(self, request: PermissionRequest) -> tuple[int, str]:
        self.requests.append(request)
        return self.reply, ""

    @property
    def asked(self) -> list[tuple[str, list[str], list[str]]]:
        return [(r.permission, list(r.patterns), list(r.always)) for r in self.requests]


async def run(plane: Plane, session: str, tool: str, args: dict[str, Any], agent: str = "") -> tuple[
    ToolOutcome, Recorder
]:
    recorder = Recorder()
    out = await plane.client.execute_tool(session, tool, args, agent=agent, on_permission=recorder)
    return out, recorder


async def bash(plane: Plane, session: str, command: str) -> tuple[ToolOutcome, Recorder]:
    return await run(plane, session, "bash", {"command": command, "description": "Run it"})


@pytest.mark.parametrize(("name", "asks"), [
    (".env", True), (".env.local", True), (".env.example", False), ("prod.env", True), ("env.txt", False),
    ("config/.env", True), ("src/main.py", False),
])
async def test_env_read_matrix(docker_plane: Plane, session_id: str, name: str, asks: bool) -> None:
    out, recorder = await run(docker_plane, session_id, "read", {"filePath": f"/workspace/{name}"})
    assert out.error is None
    expected = [("read", [f"/workspace/{name}"], ["*"])] if asks else []
    assert recorder.asked == expected


async def test_last_match_wins_for_bash(docker_plane: Plane, session_id: str) -> None:
    out, recorder = await bash(docker_plane, session_id, "git status --short")
    assert (out.error, recorder.asked) == (None, [])
    out, recorder = await bash(docker_plane, session_id, "git push origin main")
    assert out.error is not None
    assert '{"permission":"bash","pattern":"git push *","action":"deny"}' in out.error
    assert recorder.asked == []
    out, recorder = await bash(docker_plane, session_id, "uname")
    assert recorder.asked == [("bash", ["uname"], ["uname *"])]


async def test_optional_space_star_tail(docker_plane: Plane, session_id: str) -> None:
    out, recorder = await bash(docker_plane, session_id, "ls")  # "ls *" also matches a bare ls
    assert (out.error, recorder.asked) == (None, [])
    out, recorder = await bash(docker_plane, session_id, "lstmeval")  # "ls *" does not match lstmeval
    assert out.error is not None
    assert '"pattern":"lstmeval*"' in out.error


async def test_bash_patterns_and_always_prefixes(docker_plane: Plane, session_id: str) -> None:
    out, recorder = await bash(docker_plane, session_id, "npm run build --prod && FOO=1 python -m pytest -q")
    assert recorder.asked == [(
        "bash", ["npm run build --prod", "FOO=1 python -m pytest -q"], ["npm run build *", "python -m *"],
    )]
    out, recorder = await bash(docker_plane, session_id, "cat src/main.py > copy.txt")
    assert recorder.asked == [("bash", ["cat src/main.py > copy.txt"], ["cat *"])]  # a redirect stays in
    assert out.error is None


async def test_cd_outside_the_workspace_asks_external_directory(docker_plane: Plane, session_id: str) -> None:
    out, recorder = await bash(docker_plane, session_id, "cd /usr/share && ls")
    assert recorder.asked == [("external_directory", ["/usr/share/*"], ["/usr/share/*"])]
    assert out.error is None


@pytest.mark.parametrize(("tool", "args", "glob"), [
    ("read", {"filePath": "/etc/hostname"}, "/etc/*"),
    ("read", {"filePath": "/usr/share"}, "/usr/share/*"),
    ("glob", {"pattern": "*.conf", "path": "/etc"}, "/etc/*"),
    ("list", {"path": "/opt"}, "/opt/*"),
])
async def test_external_directory_globs(
    docker_plane: Plane, session_id: str, tool: str, args: dict[str, Any], glob: str,
) -> None:
    recorder = Recorder(tool_pb2.PermissionReply.REJECT)
    out = await docker_plane.client.execute_tool(session_id, tool, args, on_permission=recorder)
    assert out.error == REJECTED_MESSAGE
    assert ("external_directory", [glob], [glob]) in recorder.asked


async def test_default_rules_of_each_agent(docker_plane: Plane, session_id: str) -> None:
    out, _ = await run(docker_plane, session_id, "write", {"filePath": "/workspace/x.txt", "content": "x"},
                       agent="plan")
    assert out.error is not None
    assert out.error.startswith("The user has specified a rule which prevents you from using this specific tool call.")
    # The plan agent may write plans in its data dir (named relative to the worktree, "/" here).
    plan = "/tmp/home/.local/share/opencode/plans/plan.md"
    out, recorder = await run(docker_plane, session_id, "write", {"filePath": plan, "content": "# plan\n"},
                              agent="plan")
    assert out.error is None
    assert recorder.asked == []
    listed = {t.id for t in (await docker_plane.client.list_tools(session_id, agent="explore")).tools}
    assert listed == {"bash", "read", "glob", "grep", "webfetch"}
    out, _ = await run(docker_plane, session_id, "edit",
                       {"filePath": "/workspace/env.txt", "oldString": "E", "newString": "e"}, agent="explore")
    assert out.error is not None
    assert '{"permission":"*","pattern":"*","action":"deny"}' in out.error


async def test_always_approval_survives_a_sigkill_of_the_control_plane() -> None:
    data_dir, instance = short_tmp(), new_instance("ap")
    process = PlaneProcess(data_dir, instance, pool_size=0)
    try:
        from controlplane.client import AsyncClient

        target = await process.start()
        async with AsyncClient(target, process.token()) as client:
            session = await client.create_session(config_json=json.dumps({"permission": {"bash": "ask"}}))
            recorder = Recorder(tool_pb2.PermissionReply.ALWAYS)
            out = await client.execute_tool(session.id, "bash", {"command": "uname -s", "description": "Kernel"},
                                            on_permission=recorder)
            assert out.output == "Linux\n"
            assert recorder.asked == [("bash", ["uname -s"], ["uname *"])]
        process.kill()
        target = await process.start()
        async with AsyncClient(target, process.token()) as client:
            recorder = Recorder(tool_pb2.PermissionReply.REJECT)
            out = await client.execute_tool(session.id, "bash", {"command": "uname -r", "description": "Release"},
                                            on_permission=recorder)
            assert recorder.asked == []
            assert out.error is None
            recorder = Recorder(tool_pb2.PermissionReply.REJECT)
            out = await client.execute_tool(session.id, "bash", {"command": "id -u", "description": "Uid"},
                                            on_permission=recorder)
            assert recorder.asked == [("bash", ["id -u"], ["id *"])]  # only what was approved
            await client.delete_session(session.id)
        await process.stop()
    finally:
        await process.stop()
        remove_instance_leftovers(instance)

        remove_data_dir(data_dir)
