"""`controlplane cp` against a running control plane (in-process agents): files and directories both ways, with
cp -r's placement rules, and its refusals."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from controlplane import cli
from controlplane.cli_files import Remote, parse
from tests.planes import Plane


def cp(plane: Plane, src: str, dst: str, *more: str) -> int:
    return cli.main(["cp", "--target", plane.plane.address, "--token", plane.token, *more, src, dst])


def test_remote_words_are_those_with_a_colon_before_any_slash() -> None:
    assert parse("ses_1:a/b") == Remote("ses_1", "a/b")
    assert parse("ses_1:") == Remote("ses_1", "")
    assert parse("./a:b") is None
    assert parse("dir/a:b") is None
    assert parse("plain") is None
    assert parse(":x") is None


async def test_cp_both_ways(local_plane: Plane, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    client = local_plane.client
    sid = (await client.create_session()).id
    local = tmp_path / "proj"
    (local / "src").mkdir(parents=True)
    (local / "src" / "main.py").write_text("print('hi')\n")
    (local / "src" / "tool.sh").write_text("#!/bin/sh\n")
    (local / "src" / "tool.sh").chmod(0o755)
    (local / "data.bin").write_bytes(bytes(range(256)))

    # A file onto a missing name becomes that name; onto a directory, it keeps its own name there.
    assert await asyncio.to_thread(cp, local_plane, str(local / "data.bin"), f"{sid}:copy.bin") == 0
    assert await client.read_file(sid, "copy.bin") == bytes(range(256))
    await client.write_file(sid, "into/.keep", b"")
    assert await asyncio.to_thread(cp, local_plane, str(local / "data.bin"), f"{sid}:/workspace/into") == 0
    assert await client.read_file(sid, "into/data.bin") == bytes(range(256))
    assert await asyncio.to_thread(cp, local_plane, str(local / "data.bin"), f"{sid}:mode.bin", "--mode", "600") == 0
    assert (await client.list_files(sid, "mode.bin")).target.mode == 0o600

    # A directory onto a missing name becomes it; onto an existing directory, it goes inside.
    assert await asyncio.to_thread(cp, local_plane, str(local / "src"), f"{sid}:code") == 0
    assert await client.read_file(sid, "code/main.py") == b"print('hi')\n"
    assert await asyncio.to_thread(cp, local_plane, str(local / "src"), f"{sid}:into") == 0
    listed = {e.path: e.mode for e in (await client.list_files(sid, "into", recursive=True)).entries}
    assert listed["into/src/tool.sh"] == 0o755

    # And back: a file to a new name or into a directory, a directory likewise, the whole workspace.
    out = tmp_path / "out"
    out.mkdir()
    assert await asyncio.to_thread(cp, local_plane, f"{sid}:copy.bin", str(out / "c.bin")) == 0
    assert (out / "c.bin").read_bytes() == bytes(range(256))
    assert await asyncio.to_thread(cp, local_plane, f"{sid}:into/src/tool.sh", str(out)) == 0
    assert os.stat(out / "tool.sh").st_mode & 0o777 == 0o755
    assert await asyncio.to_thread(cp, local_plane, f"{sid}:into/src", str(out / "fresh")) == 0
    assert sorted(os.listdir(out / "fresh")) == ["main.py", "tool.sh"]
    assert await asyncio.to_thread(cp, local_plane, f"{sid}:into/src", str(out)) == 0
    assert sorted(os.listdir(out / "src")) == ["main.py", "tool.sh"]
    assert await asyncio.to_thread(cp, local_plane, f"{sid}:", str(tmp_path / "all")) == 0
    assert (tmp_path / "all" / "code" / "main.py").read_text() == "print('hi')\n"
    assert not [n for n in os.listdir(out) if n.startswith(".cp-")]  # the spool directory is gone

    # Refusals: both sides local or remote, a missing local source, a path leading out.
    capsys.readouterr()
    assert await asyncio.to_thread(cp, local_plane, str(local), str(out)) == 2
    assert "exactly one of SRC and DST" in capsys.readouterr().err
    assert await asyncio.to_thread(cp, local_plane, f"{sid}:a", f"{sid}:b") == 2
    assert await asyncio.to_thread(cp, local_plane, str(tmp_path / "nothing"), f"{sid}:x") == 1
    assert await asyncio.to_thread(cp, local_plane, f"{sid}:../etc/passwd", str(out)) == 2
    assert "INVALID_ARGUMENT" in capsys.readouterr().err
    assert await asyncio.to_thread(cp, local_plane, f"{sid}:absent", str(out)) == 2
    assert "NOT_FOUND" in capsys.readouterr().err
    await client.delete_session(sid)
