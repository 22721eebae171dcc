"""The tool user's HOME holds upstream's state dirs from the start, writable by that user only, on the
session's own storage: a real custom tool keeps a `bun:sqlite` database under `~/.config/opencode`."""

from __future__ import annotations

import pytest

from tests.archives import tar_of
from tests.planes import Plane, workspace_session

pytestmark = pytest.mark.docker

NOTES_TS = """import { Database } from "bun:sqlite"
import { homedir } from "node:os"
import { tool } from "@opencode-ai/plugin"

export default tool({
  description: "Keeps notes in a SQLite database in OpenCode's config dir",
  args: { note: tool.schema.string() },
  async execute(args) {
    const db = new Database(`${homedir()}/.config/opencode/notes.db`, { create: true })
    db.run("create table if not exists notes (text text)")
    db.query("insert into notes values (?)").run(args.note)
    const rows = db.query("select text from notes").all() as { text: string }[]
    db.close()
    return rows.map((row) => row.text).join(",")
  },
})
"""
DIRS = (".local/share/opencode", ".local/share/opencode/log", ".local/share/opencode/bin", ".config/opencode",
        ".local/state/opencode", ".cache/opencode")

session_id = workspace_session({".opencode/tool/notes.ts": NOTES_TS})


async def test_a_tool_keeps_a_sqlite_database_in_the_config_dir_across_calls(
    docker_plane: Plane, session_id: str,
) -> None:
    client = docker_plane.client
    first = await client.execute_tool(session_id, "notes", {"note": "one"})
    assert first.result is not None, first.error
    second = await client.execute_tool(session_id, "notes", {"note": "two"})
    assert second.result is not None, second.error
    assert second.result.output == "one,two"


async def test_home_holds_upstreams_state_dirs_owned_by_the_tool_user(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    script = ('cd "$HOME" && for d in "$@"; do stat -c "%n %a %u" "$d"; done; id -u; '
              'cat .cache/opencode/version; echo; stat -f -c %T "$HOME"')
    done = await client.run(session_id, ["bash", "-c", script, "sh", *DIRS])
    assert done.exit_code == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    uid = lines[len(DIRS)]
    for line, name in zip(lines, DIRS, strict=False):
        assert line == f"{name} 700 {uid}"
    assert lines[len(DIRS) + 1] == "21"
    assert lines[len(DIRS) + 2] == "tmpfs"  # the session's writable storage, not the read-only image root


async def test_another_session_sees_none_of_it(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    wrote = await client.execute_tool(session_id, "notes", {"note": "mine"})
    assert wrote.result is not None, wrote.error
    other = await client.create_session(workspace_archive=tar_of({"a.txt": "a\n"}))
    try:
        looked = await client.run(other.id, ["bash", "-c", 'ls -a "$HOME/.config/opencode"'])
        assert looked.exit_code == 0, looked.stderr
        assert "notes.db" not in looked.stdout.decode()
    finally:
        await client.delete_session(other.id)
