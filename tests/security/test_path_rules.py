"""Path rules follow the file, and the decision holds for the operation (issue 21, item 2).

Through the public API against real containers: symlinks shipped in the archive and hard links made at run
time are read, searched and written under the rules of the file they reach; an operator's deny and an
`external_directory` deny hold through a symlink; and a link flipped by a concurrent process while many
read/write/edit calls run never redirects one of them (the swapped-in target's content is checked after).
"""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
import time

import pytest

from controlplane.client import AsyncClient, PermissionRequest
from controlplane.v1 import tool_pb2
from tests.planes import Plane, served_plane

pytestmark = pytest.mark.docker

SECRET = "SECRET_TOKEN=hunter2-7f3a"
READ_DENY_ENV = {"permission": {"bash": "allow", "read": {"*": "allow", "*.env": "deny"}, "edit": "allow"}}
POLICY = {"permission": {"edit": {"*protected*": "deny"}}}
RACE_SECONDS = 5
PEEK_TS = """import { tool } from "@opencode-ai/plugin"
import * as fs from "node:fs"
import * as path from "node:path"

export default tool({
  description: "Reads a file after asking for it, as a well-behaved custom tool does",
  args: { file: tool.schema.string() },
  async execute(args, ctx) {
    const full = path.resolve(ctx.directory, args.file)
    await ctx.ask({ permission: "read", patterns: [full], always: ["*"], metadata: {} })
    return fs.readFileSync(full, "utf8")
  },
})
"""


def _archive(files: dict[str, str], symlinks: dict[str, str] | None = None,
             hardlinks: dict[str, str] | None = None) -> bytes:
    """A tar with regular files, symlinks (name -> target) and hard links to earlier files (name -> file)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in files.items():
            data = content.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, int(time.time())
            tar.addfile(info)
        for name, target in (hardlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.mtime = tarfile.LNKTYPE, target, 0o644, int(time.time())
            tar.addfile(info)
    return buf.getvalue()


# A Docker plane whose operator denies `edit` of anything named like `*protected*`.
plane = served_plane("docker", policy=POLICY, pool={"size": 1, "refill_concurrency": 1})


def _denied(error: str | None, what: str) -> None:
    """Refused by a deny rule, with upstream's text."""
    assert error is not None, what
    assert "prevents you from using this specific tool call" in error, (what, error)


async def _sh(client: AsyncClient, session_id: str, script: str) -> str:
    done = await client.run(session_id, ["/bin/sh", "-c", script], cwd="/workspace")
    assert done.exit_code == 0, (done.stdout, done.stderr)
    return done.stdout.decode()


async def _tool(client: AsyncClient, session_id: str, tool: str, args: dict[str, object]) -> tuple[str, str | None]:
    outcome = await client.execute_tool(session_id, tool, args)
    return (outcome.output if outcome.error is None else ""), outcome.error


async def test_symlink_and_hard_link_reads_follow_the_files_rules(plane: Plane) -> None:
    client = plane.client
    session = await client.create_session(
        config_json=json.dumps(READ_DENY_ENV),
        workspace_archive=_archive({".env": SECRET + "\n", "a.txt": "nothing to see\n"},
                                   symlinks={"notes.txt": ".env"}, hardlinks={"shipped": ".env"}),
    )
    try:
        await _sh(client, session.id, "ln .env made && mkdir -p d && ln .env d/deep")  # hard links at run time
        for name in ("notes.txt", "shipped", "made", "d/deep", ".env"):
            output, error = await _tool(client, session.id, "read", {"filePath": f"/workspace/{name}"})
            _denied(error, name)
            assert "hunter2" not in output
        output, error = await _tool(client, session.id, "read", {"filePath": "/workspace/a.txt"})
        assert error is None, error
        assert "nothing to see" in output

        searches: list[dict[str, object]] = [
            {"pattern": "hunter2"}, {"pattern": "hunter2", "path": "/workspace/notes.txt"},
            {"pattern": "SECRET", "path": "/workspace/d"},
        ]
        for args in searches:
            output, error = await _tool(client, session.id, "grep", args)
            assert error is None, error
            assert output == "No files found", (args, output)

        output, error = await _tool(client, session.id, "glob", {"pattern": "**/*"})
        assert error is None
        shown = {line.rsplit("/", 1)[-1] for line in output.splitlines()}
        assert shown == {"a.txt"}, output
        output, error = await _tool(client, session.id, "list", {})
        assert error is None
        assert not [name for name in ("notes.txt", "shipped", "made", "deep", ".env") if name in output], output
        assert "a.txt" in output
    finally:
        await client.delete_session(session.id)


async def test_apply_patch_never_shows_or_moves_a_read_denied_file(plane: Plane) -> None:
    """An update, move or delete shows the file's text (the diff in metadata, the moved file's new name):
    the source's read rules hold by every name, so a read deny is never beaten by `apply_patch`."""
    client = plane.client
    session = await client.create_session(
        config_json=json.dumps({**READ_DENY_ENV, "permission": {**READ_DENY_ENV["permission"], "bash": "deny"}}),
        workspace_archive=_archive({".env": SECRET + "\n"}, symlinks={"notes.txt": ".env"},
                                   hardlinks={"shipped": ".env"}),
    )
    try:
        patches = {
            "move": "*** Begin Patch\n*** Update File: .env\n*** Move to: moved.txt\n*** End Patch",
            "update": ("*** Begin Patch\n*** Update File: .env\n@@\n-" + SECRET + "\n+x\n*** End Patch"),
            "delete": "*** Begin Patch\n*** Delete File: .env\n*** End Patch",
            # A wrong guess must fail as a right one does: a verification error would confirm the line.
            "wrong guess": "*** Begin Patch\n*** Update File: .env\n@@\n-API_KEY=guess\n+x\n*** End Patch",
            "move through a symlink": "*** Begin Patch\n*** Update File: notes.txt\n*** Move to: m2.txt\n*** End Patch",
            "move through a hard link": "*** Begin Patch\n*** Update File: shipped\n*** Move to: m3.txt\n*** End Patch",
        }
        for what, patch in patches.items():
            outcome = await client.execute_tool(session.id, "apply_patch", {"patchText": patch})
            _denied(outcome.error, what)
            assert "hunter2" not in str(outcome.events), what
        for name in ("moved.txt", "m2.txt", "m3.txt"):
            _, error = await _tool(client, session.id, "read", {"filePath": f"/workspace/{name}"})
            assert error is not None, name
            assert "not found" in error.lower(), (name, error)
        _, error = await _tool(client, session.id, "read", {"filePath": "/workspace/.env"})
        _denied(error, ".env still denied")
    finally:
        await client.delete_session(session.id)


async def test_an_unnormalised_spelling_meets_the_rules_of_the_file_it_reaches(plane: Plane) -> None:
    """`/workspace/./secrets/key`, `//`, `sub/../` reach the file a rule names, and `.env/.` or `.env/x/..`
    (which the kernel refuses) reach nothing: a red-team finding read both past `read` denies."""
    client = plane.client
    rules = {"bash": "deny", "read": {"*": "allow", "*.env": "deny", "/workspace/secrets/*": "deny"},
             "edit": {"*": "allow", "workspace/secrets/*": "deny"}}
    session = await client.create_session(
        config_json=json.dumps({"permission": rules}),
        workspace_archive=_archive({".env": SECRET + "\n", "secrets/key.txt": "KEY=s3cr3t\n", "sub/a.txt": "a\n"}),
    )
    try:
        for spelled in ("/workspace/./secrets/key.txt", "/workspace//secrets/key.txt",
                        "/workspace/sub/../secrets/key.txt", "/workspace/secrets/./key.txt"):
            output, error = await _tool(client, session.id, "read", {"filePath": spelled})
            _denied(error, spelled)
            assert "s3cr3t" not in output
        for spelled in ("/workspace/.env/.", "/workspace/.env/x/..", "/workspace/nothing/../.env"):
            output, error = await _tool(client, session.id, "read", {"filePath": spelled})
            assert error is not None, spelled
            assert "hunter2" not in output + error, (spelled, error)
        for spelled in ("/workspace/./secrets/new.txt", "/workspace/sub/../secrets/new.txt"):
            _, error = await _tool(client, session.id, "write", {"filePath": spelled, "content": "PLANTED"})
            _denied(error, f"write {spelled}")
        output, error = await _tool(client, session.id, "read", {"filePath": "/workspace/sub/./a.txt"})
        assert error is None, error  # an allowed file by any spelling still reads
        assert "1: a" in output
    finally:
        await client.delete_session(session.id)


async def test_an_apply_patch_move_meets_the_destinations_edit_rules(plane: Plane) -> None:
    """A move writes its destination: a file the rules protect is not replaced by moving another onto it (a
    red-team finding), while the ask still shows the source as upstream does."""
    client = plane.client
    # Edit patterns are relative to the worktree, which is `/` without a repository: `workspace/precious.txt`.
    rules = {"bash": "deny", "edit": {"*": "allow", "workspace/precious.txt": "deny", "*.lock": "deny"}}
    session = await client.create_session(
        config_json=json.dumps({"permission": rules}),
        workspace_archive=_archive({"a.txt": "CLOBBERED\n", "precious.txt": "keep me\n", "deps.lock": "lock\n"}),
    )
    try:
        for dest in ("precious.txt", "deps.lock", "./precious.txt", "sub/../precious.txt"):
            patch = f"*** Begin Patch\n*** Update File: a.txt\n*** Move to: {dest}\n*** End Patch"
            outcome = await client.execute_tool(session.id, "apply_patch", {"patchText": patch})
            _denied(outcome.error, f"move onto {dest}")
        assert await _read_back(client, session.id, "precious.txt") == "keep me\n"
        assert await _read_back(client, session.id, "deps.lock") == "lock\n"
        assert await _read_back(client, session.id, "a.txt") == "CLOBBERED\n"
        patch = "*** Begin Patch\n*** Update File: a.txt\n*** Move to: b.txt\n*** End Patch"
        outcome = await client.execute_tool(session.id, "apply_patch", {"patchText": patch})
        assert outcome.error is None, outcome.error  # a move the rules allow still happens
        assert await _read_back(client, session.id, "b.txt") == "CLOBBERED\n"
    finally:
        await client.delete_session(session.id)


async def _read_back(client: AsyncClient, session_id: str, name: str) -> str:
    return (await client.read_file(session_id, name)).decode()


async def test_operator_deny_holds_through_symlinks_for_every_writer(plane: Plane) -> None:
    client = plane.client
    session = await client.create_session(
        config_json=json.dumps({"permission": {"bash": "allow", "edit": "allow", "read": "allow"}}),
        workspace_archive=_archive({"protected.txt": "keep me\n", "ok.txt": "fine\n"},
                                   symlinks={"g": "protected.txt", "dir": "."}),
    )
    try:
        await _sh(client, session.id, "ln protected.txt h")
        for path in ("/workspace/g", "/workspace/h", "/workspace/dir/protected.txt"):
            output, error = await _tool(client, session.id, "read", {"filePath": path})
            assert error is None, error
            assert "keep me" in output
            _, error = await _tool(client, session.id, "write", {"filePath": path, "content": "overwritten\n"})
            _denied(error, path)
            _, error = await _tool(client, session.id, "edit",
                                   {"filePath": path, "oldString": "keep me", "newString": "changed"})
            _denied(error, path)
            _, error = await _tool(client, session.id, "multiedit", {
                "filePath": path, "edits": [{"filePath": path, "oldString": "keep me", "newString": "changed"}]})
            _denied(error, path)
        patch = "*** Begin Patch\n*** Update File: g\n@@\n-keep me\n+changed\n*** End Patch"
        _, error = await _tool(client, session.id, "apply_patch", {"patchText": patch})
        _denied(error, "apply_patch")
        assert await _sh(client, session.id, "cat protected.txt") == "keep me\n"
        # An ordinary file is still written.
        await _tool(client, session.id, "read", {"filePath": "/workspace/ok.txt"})
        _, error = await _tool(client, session.id, "write", {"filePath": "/workspace/ok.txt", "content": "new\n"})
        assert error is None, error
    finally:
        await client.delete_session(session.id)


async def test_external_directory_deny_holds_through_a_symlink(plane: Plane) -> None:
    client = plane.client
    session = await client.create_session(config_json=json.dumps(
        {"permission": {"external_directory": "deny", "edit": "allow", "read": "allow"}}))
    try:
        await _sh(client, session.id, "echo outside > /tmp/outside.txt && ln -s /tmp/outside.txt f")

        async def no(_: PermissionRequest) -> tuple[int, str]:  # a deny needs no reply; never allow anyway
            return tool_pb2.PermissionReply.REJECT, ""

        calls: list[tuple[str, dict[str, object]]] = [("write", {"filePath": "/workspace/f", "content": "x\n"}),
                           ("read", {"filePath": "/workspace/f"}),
                           ("edit", {"filePath": "/workspace/f", "oldString": "", "newString": "y\n"})]
        for tool, args in calls:
            outcome = await client.execute_tool(session.id, tool, args, on_permission=no)
            assert outcome.error is not None, (tool, outcome.result)
        assert await _sh(client, session.id, "cat /tmp/outside.txt") == "outside\n"
    finally:
        await client.delete_session(session.id)


async def test_a_flipping_symlink_never_redirects_read_write_or_edit(plane: Plane) -> None:
    """A process flips `f` between a workspace file and /tmp/outside.txt while many calls run on `f`."""
    client = plane.client
    session = await client.create_session(
        config_json=json.dumps({"permission": {"external_directory": "deny", "edit": "allow", "read": "allow"}}),
        workspace_archive=_archive({"a.txt": "inside\n"}, symlinks={"f": "a.txt"}),
    )
    try:
        await _sh(client, session.id, "echo OUTSIDE-ORIGINAL > /tmp/outside.txt")
        # The link is replaced atomically (rename of a fresh symlink over it), so `f` always exists and every
        # call meets one of the two targets.
        flipper = (
            "import os, time\n"
            f"end = time.monotonic() + {RACE_SECONDS}\n"
            "n = 0\n"
            "while time.monotonic() < end:\n"
            "    for target in ('/tmp/outside.txt', 'a.txt'):\n"
            "        os.symlink(target, 'f.new')\n"
            "        os.rename('f.new', 'f')\n"
            "    n += 1\n"
            "print(n)\n"
        )
        flipping = asyncio.ensure_future(client.run(session.id, ["python3", "-c", flipper], cwd="/workspace"))
        outcomes: dict[str, list[str | None]] = {"read": [], "write": [], "edit": []}
        leaked: list[str] = []

        async def worker(index: int) -> None:
            turn = 0
            while not flipping.done():
                turn += 1
                output, error = await _tool(client, session.id, "read", {"filePath": "/workspace/f"})
                outcomes["read"].append(error)
                if "OUTSIDE" in output:
                    leaked.append(output)
                _, error = await _tool(client, session.id, "write",
                                       {"filePath": "/workspace/f", "content": f"w{index}-{turn}\n"})
                outcomes["write"].append(error)
                _, error = await _tool(client, session.id, "edit",
                                       {"filePath": "/workspace/f", "oldString": "", "newString": f"e{index}\n"})
                outcomes["edit"].append(error)

        await asyncio.gather(*(worker(i) for i in range(4)))
        flips = int((await flipping).stdout.decode().strip() or 0)
        await _sh(client, session.id, "ln -sfn a.txt f")

        total = sum(len(v) for v in outcomes.values())
        succeeded = {tool: sum(1 for e in errors if e is None) for tool, errors in outcomes.items()}
        print(f"flips={flips} calls={total} succeeded={succeeded}")
        assert flips > 100, flips
        assert total >= 60, total
        assert not leaked, leaked[:1]
        # Nothing written through the link ever landed outside.
        assert await _sh(client, session.id, "cat /tmp/outside.txt") == "OUTSIDE-ORIGINAL\n"
        # The race was real: calls reached the workspace file, and some met the link pointing outside.
        assert succeeded["write"] + succeeded["edit"] > 0, outcomes
        assert any(e is not None for errors in outcomes.values() for e in errors), "the link never pointed out"
    finally:
        await client.delete_session(session.id)


async def test_a_custom_tools_ask_is_checked_where_its_path_leads(plane: Plane) -> None:
    client = plane.client
    session = await client.create_session(
        config_json=json.dumps(READ_DENY_ENV),
        workspace_archive=_archive({".env": SECRET + "\n", "a.txt": "fine\n", ".opencode/tool/peek.ts": PEEK_TS},
                                   symlinks={"notes.txt": ".env"}),
    )
    try:
        output, error = await _tool(client, session.id, "peek", {"file": "a.txt"})
        assert error is None, error
        assert output == "fine\n"
        output, error = await _tool(client, session.id, "peek", {"file": "notes.txt"})
        _denied(error, "peek notes.txt")
        assert "hunter2" not in output
    finally:
        await client.delete_session(session.id)
