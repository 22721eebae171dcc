"""Respelled commands a bash rule denies really do not run: ExecuteTool bash in a real sandbox, over the public API.

A representative part of the evasion corpus (bash_evasion_corpus.py, decided in full by test_bash_evasions.py)
with `"rm *": "deny"`: each must fail with upstream's denied message and leave `victim` in the workspace. The
same respelling in a session that allows it does remove the file, so the check can fail. With only `git *`
allowed, git aliases and configuration that run programs are denied and create nothing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from controlplane.client import ToolOutcome
from tests.archives import tar_of
from tests.planes import Plane, running_plane

pytestmark = pytest.mark.docker

RM_DENIED = {"bash": {"*": "allow", "rm *": "deny"}}
GIT_ONLY = {"bash": {"*": "deny", "git *": "allow"}}
FILES = {"victim": "keep me\n", "notes.txt": "rm is mentioned here\n"}

LATER_RM = [
    "/lib64/ld-linux-x86-64.so.2 /bin/rm victim", "$'rm\\0' victim", "$'rm\\x00zz' victim", "env -vS'rm victim'",
    "start-stop-daemon --start --exec /bin/rm -- /workspace/victim",
    "run-parts --regex='^rm$' --arg=/workspace/victim /usr/bin", "test -v 'a[$(rm victim)]'",
    "[[ -v 'a[$(rm victim)]' ]]", "printf -v 'a[$(rm victim)]' x", "declare 'a[$(rm victim)]=1'",
    "let 'a[$(rm victim)]=1'", "hash -p /bin/rm ls; ls victim", "sed -n '1e rm victim' notes.txt",
    "tar --checkpoint=1 --checkpoint-action=exec='rm victim' -cf /tmp/x.tar notes.txt",
    "env 'BASH_FUNC_ls%%=() { rm victim; }' bash -c ls",
]
RESPELLED_RM = [
    "/bin/rm victim", "\\rm victim", "env rm victim", "X=1 rm victim", "command rm victim", "r''m victim",
    "eval 'rm victim'", "sh -c 'rm victim'", 'bash -c "rm victim"', "$(echo rm) victim", "echo victim | xargs rm",
    "find . -name victim -delete", "$'\\x72m' victim", "nice -n 1 nohup env X=1 timeout 5 command /bin/rm victim",
    "find . -name victim -exec rm {} +", "git -c alias.x='!rm victim' x", "trap 'rm victim' EXIT", "{rm,victim}",
    "f() { rm victim; }; f", "echo cm0gdmljdGlt | base64 -d | sh", "env -S 'rm victim'", "busybox rm victim",
    "watch -x rm victim", "su -c 'rm victim'", "dash -c 'echo ok; rm victim'", "echo rm victim | xargs eval",
    # Found by the red team after the first round (docs/security.md, "Bash permission rules").
    *LATER_RM,
]
BENIGN = ["ls", 'echo "rm"', "grep rm notes.txt", "cat notes.txt", "echo rm -rf /", "find . -name '*.txt' -print"]


async def bash(plane: Plane, session_id: str, command: str) -> ToolOutcome:
    async def never(_request: object) -> tuple[int, str]:
        raise AssertionError(f"{command!r} asked for permission; its rules decide it without asking")

    return await plane.client.execute_tool(
        session_id, "bash", {"command": command, "description": "Run it"}, on_permission=never,
    )


def assert_denied(out: ToolOutcome) -> None:
    assert out.error is not None, out.result
    assert out.error.startswith("The user has specified a rule which prevents you from using this specific tool call.")


async def workspace(plane: Plane, session_id: str) -> set[str]:
    """The workspace's files, listed by the caller's own exec (not a tool call: no rule applies)."""
    done = await plane.client.run(session_id, ["ls", "-A", "/workspace"])
    return set(done.stdout.decode().split())


@pytest.fixture(scope="module")
async def rm_denied(docker_plane: Plane) -> AsyncIterator[str]:
    session = await docker_plane.client.create_session(
        workspace_archive=tar_of(FILES), config_json=json.dumps({"permission": RM_DENIED}),
    )
    yield session.id
    await docker_plane.client.delete_session(session.id)


@pytest.mark.parametrize("command", RESPELLED_RM)
async def test_a_respelled_rm_is_denied_and_the_file_stays(docker_plane: Plane, rm_denied: str, command: str) -> None:
    out = await bash(docker_plane, rm_denied, command)
    assert_denied(out)
    assert "victim" in await workspace(docker_plane, rm_denied)


@pytest.mark.parametrize("command", BENIGN)
async def test_commands_that_only_mention_rm_still_run(docker_plane: Plane, rm_denied: str, command: str) -> None:
    out = await bash(docker_plane, rm_denied, command)
    assert out.error is None, out.error
    assert "victim" in await workspace(docker_plane, rm_denied)


@pytest.mark.parametrize("command", ["env rm victim", "echo victim | xargs rm", "sh -c 'rm victim'", *LATER_RM])
async def test_the_same_respelling_removes_the_file_where_rm_is_allowed(docker_plane: Plane, command: str) -> None:
    """The control: what the denied session refuses really would remove the file."""
    session = await docker_plane.client.create_session(
        workspace_archive=tar_of(FILES), config_json=json.dumps({"permission": {"bash": "allow"}}),
    )
    try:
        out = await bash(docker_plane, session.id, command)
        assert out.error is None, out.error
        assert "victim" not in await workspace(docker_plane, session.id)
    finally:
        await docker_plane.client.delete_session(session.id)


@pytest.mark.parametrize("command", [
    "git -c alias.x='!touch pwned' x", "git -c alias.x=!touch\\ pwned x", "git -c core.pager='touch pwned' log",
    "git -c core.fsmonitor='touch pwned' status", "git status; touch pwned", "git $(touch pwned)",
    "GIT_EDITOR='touch pwned' git commit --allow-empty", "env GIT_EXTERNAL_DIFF='touch pwned' git diff",
    "git -c protocol.ext.allow=always ls-remote 'ext::sh -c touch% pwned'",
    "git -c core.gitProxy=touch ls-remote git://pwned/y", "git grep -O'touch pwned;:' -e keep",
    "git rebase -x'touch pwned' --root", "git rebase --exe='touch pwned' --root",
    "git ls-remote --upload='touch pwned;:' .",
])
async def test_only_git_allowed_runs_no_other_program_through_git(docker_plane: Plane, command: str) -> None:
    session = await docker_plane.client.create_session(
        workspace_archive=tar_of(FILES), config_json=json.dumps({"permission": GIT_ONLY}),
    )
    try:
        await docker_plane.client.run(session.id, ["git", "init", "-q", "/workspace"])
        out = await bash(docker_plane, session.id, command)
        assert_denied(out)
        assert "pwned" not in await workspace(docker_plane, session.id)
        allowed = await bash(docker_plane, session.id, "git status --short")
        assert allowed.error is None, allowed.error
    finally:
        await docker_plane.client.delete_session(session.id)


async def test_the_operators_deny_sees_the_respelling_too() -> None:
    policy = {"tenants": {"default": {"bash": {"rm *": "deny"}}}}
    async with running_plane("docker", policy=policy, pool={"size": 0}) as plane:
        session = await plane.client.create_session(
            workspace_archive=tar_of(FILES), config_json=json.dumps({"permission": {"bash": "allow"}}),
        )
        for command in ("/bin/rm victim", "sh -c 'rm victim'", "$(echo rm) victim", *LATER_RM):
            out = await bash(plane, session.id, command)
            assert_denied(out)
        assert "victim" in await workspace(plane, session.id)
