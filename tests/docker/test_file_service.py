"""FileService against real Docker sandboxes over real gRPC: round trips, confinement, tenancy, audit, and what a
caller's write means for a model's read-before-write check."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path

import grpc
import pytest

from controlplane.client import AsyncClient, allow_once
from controlplane.core.permissions.audit import AuditEntry
from controlplane.v1 import file_pb2
from tests.planes import Plane, served_plane, workspace_session

pytestmark = pytest.mark.docker

TENANTS = [{"name": "alpha", "token": "files-alpha"}, {"name": "beta", "token": "files-beta"}]
plane = served_plane("docker", tenants=TENANTS, pool={"size": 1, "refill_concurrency": 1})
session_id = workspace_session({"notes/readme.txt": "hello\n", "keep.txt": "kept\n"}, plane="plane")


async def _code(coro: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await coro  # type: ignore[misc]
    return caught.value.code()


async def _sh(client: AsyncClient, session: str, command: str) -> str:
    done = await client.run(session, command=command)
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


async def test_binary_round_trip_as_the_tool_user(plane: Plane, session_id: str) -> None:
    data = bytes(range(256)) * 4099 + b"\0\r\n\xff"
    info = await plane.client.write_file(session_id, "bin/data.bin", data, mode=0o640)
    assert (info.path, info.type, info.size, info.mode) == ("bin/data.bin", file_pb2.FileInfo.FILE, len(data), 0o640)
    assert await plane.client.read_file(session_id, "bin/data.bin") == data
    assert await plane.client.read_file(session_id, "/workspace/bin/data.bin") == data
    # Written by the sandbox's tool user, as a tool would have, and seen as such by a command.
    owner = await _sh(plane.client, session_id, "stat -c '%u %a' /workspace/bin/data.bin; id -u")
    (uid, mode), tool_uid = owner.split("\n")[0].split(), owner.split("\n")[1]
    assert (uid, mode) == (tool_uid, "640")
    listing = await plane.client.list_files(session_id, "bin")
    assert [(e.path, e.size, e.mode) for e in listing.entries] == [("bin/data.bin", len(data), 0o640)]
    assert listing.target.type == file_pb2.FileInfo.DIRECTORY
    # Replacing keeps the mode unless one is given; an empty file is a file.
    await plane.client.write_file(session_id, "bin/data.bin", b"")
    assert (await plane.client.list_files(session_id, "bin/data.bin")).entries[0].mode == 0o640
    assert await plane.client.read_file(session_id, "bin/data.bin") == b""


async def test_missing_parents_and_missing_files(plane: Plane, session_id: str) -> None:
    assert await _code(plane.client.write_file(session_id, "no/such/dir/f", b"x", create_parents=False)) \
        == grpc.StatusCode.NOT_FOUND
    assert await _code(plane.client.read_file(session_id, "absent.txt")) == grpc.StatusCode.NOT_FOUND
    assert await _code(plane.client.read_file(session_id, "notes")) == grpc.StatusCode.FAILED_PRECONDITION
    assert await _code(plane.client.write_file(session_id, "notes", b"x")) == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "/workspace/../etc/passwd", "/run/code",
                                  "/run/agent/agent.sock", "a/../../x", "/workspacex/f"])
async def test_paths_outside_the_workspace_are_refused(plane: Plane, session_id: str, path: str) -> None:
    for call in (plane.client.read_file(session_id, path), plane.client.write_file(session_id, path, b"x"),
                 plane.client.list_files(session_id, path), plane.client.upload(session_id, b"", path)):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = caught.value.details() or ""
        assert "outside the workspace" in details or "climbs out" in details


async def test_links_planted_by_a_tool_are_not_followed_out(plane: Plane, session_id: str, tmp_path: Path) -> None:
    await _sh(plane.client, session_id,
              "cd /workspace && ln -sfn /etc planted_etc && ln -sfn /run/code planted_code && "
              "ln -sfn /run/agent planted_agent && ln -sfn /etc/passwd passwd_link && ln -sfn notes inner")
    for path in ("planted_etc/passwd", "planted_code", "planted_agent/agent.sock", "passwd_link"):
        for call in (plane.client.read_file(session_id, path), plane.client.list_files(session_id, path),
                     plane.client.write_file(session_id, f"{path}/x" if path != "passwd_link" else path, b"x")):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, path
            assert "symbolic link" in (caught.value.details() or "")
        assert await _code(plane.client.download(session_id, [path], dest=tmp_path / "x")) \
            == grpc.StatusCode.INVALID_ARGUMENT
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert await _code(plane.client.upload(session_id, _hostile_tar(), "planted_etc")) == invalid
    assert await _code(plane.client.write_file(session_id, "suid", b"x", mode=0o4755)) == invalid
    # A link inside the workspace is followed; the file behind it is what is read and written.
    assert await plane.client.read_file(session_id, "inner/readme.txt") == b"hello\n"
    # The whole workspace comes down with the links as links, never their targets' contents; the client leaves
    # out links that would lead out of its own directory.
    got = await plane.client.download(session_id, dest=tmp_path / "all")
    assert not (tmp_path / "all" / "planted_etc").exists()
    assert any(s.startswith("planted_etc") for s in got.skipped)
    assert (tmp_path / "all" / "inner").is_symlink()
    assert os.readlink(tmp_path / "all" / "inner") == "notes"
    assert (tmp_path / "all" / "notes" / "readme.txt").read_text() == "hello\n"
    await _sh(plane.client, session_id,
              "cd /workspace && rm -f planted_etc planted_code planted_agent passwd_link inner")


def _hostile_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x", link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, link, 0o644
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("good/ok.txt", data=b"fine")
        add("../escape.txt")
        add("/abs.txt")
        add("good/../../climb.txt")
        add("hard_out", tarfile.LNKTYPE, link="/etc/passwd")
        add("hard_up", tarfile.LNKTYPE, link="../etc/passwd")
        add("sym_out", tarfile.SYMTYPE, link="/etc")
        add("sym_up", tarfile.SYMTYPE, link="../../etc/shadow")
        add("sym_code", tarfile.SYMTYPE, link="/run/code")
        add("good/sym_in", tarfile.SYMTYPE, link="ok.txt")
        add("dev_null", tarfile.CHRTYPE)
        add("fifo", tarfile.FIFOTYPE)
        add("planted_dir/through.txt")
    return buf.getvalue()


async def test_a_hostile_tar_extracts_only_what_stays_inside(plane: Plane, session_id: str) -> None:
    await _sh(plane.client, session_id, "mkdir -p /workspace/up && ln -sfn /tmp /workspace/up/planted_dir")
    summary = await plane.client.upload(session_id, _hostile_tar(), "up")
    refused = {s.split(":")[0] for s in summary.skipped}
    assert refused == {"../escape.txt", "/abs.txt", "good/../../climb.txt", "hard_out", "hard_up", "sym_out",
                       "sym_up", "sym_code", "dev_null", "fifo", "planted_dir/through.txt"}
    assert (summary.files, summary.symlinks) == (1, 1)
    names = {e.path: e for e in (await plane.client.list_files(session_id, "up", recursive=True)).entries}
    assert set(names) == {"up/good", "up/good/ok.txt", "up/good/sym_in", "up/planted_dir"}
    assert names["up/good/sym_in"].link_target == "ok.txt"
    assert await _sh(plane.client, session_id, "ls -A /tmp | grep -c through.txt || true") == "0\n"
    assert await _code(plane.client.upload(session_id, b"not a tar at all" * 100, "up")) \
        == grpc.StatusCode.INVALID_ARGUMENT
    await _sh(plane.client, session_id, "rm -rf /workspace/up")


async def test_a_tree_round_trips_with_modes_and_symlinks(plane: Plane, session_id: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "bin").mkdir(parents=True)
    (src / "bin" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "bin" / "run.sh").chmod(0o755)
    (src / "secret.txt").write_bytes(b"\x00s3cret")
    (src / "secret.txt").chmod(0o600)
    (src / "bin").chmod(0o750)
    (src / "link").symlink_to("bin/run.sh")
    summary = await plane.client.upload(session_id, src, "tree")
    assert (summary.files, summary.symlinks, list(summary.skipped)) == (2, 1, [])
    assert await _sh(plane.client, session_id, "cd /workspace/tree && ./link") == "hi\n"
    listed = {e.path: e for e in (await plane.client.list_files(session_id, "tree", recursive=True)).entries}
    assert listed["tree/bin/run.sh"].mode == 0o755
    assert listed["tree/secret.txt"].mode == 0o600
    assert listed["tree/bin"].mode == 0o750
    assert listed["tree/link"].link_target == "bin/run.sh"
    got = await plane.client.download(session_id, ["tree", "keep.txt"], dest=tmp_path / "out")
    assert got.skipped == []
    out = tmp_path / "out"
    assert (out / "keep.txt").read_text() == "kept\n"
    assert (out / "tree" / "secret.txt").read_bytes() == b"\x00s3cret"
    assert (out / "tree" / "secret.txt").stat().st_mode & 0o777 == 0o600
    assert (out / "tree" / "bin" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert os.readlink(out / "tree" / "link") == "bin/run.sh"


async def test_another_tenants_session_is_not_found(plane: Plane, session_id: str, tmp_path: Path) -> None:
    async with AsyncClient(plane.plane.address, "files-beta") as beta:
        calls = [beta.read_file(session_id, "keep.txt"), beta.write_file(session_id, "keep.txt", b"pwned"),
                 beta.list_files(session_id), beta.upload(session_id, _hostile_tar()),
                 beta.download(session_id, dest=tmp_path / "beta")]
        for call in calls:
            assert await _code(call) == grpc.StatusCode.NOT_FOUND
    async with AsyncClient(plane.plane.address, "not-a-token") as stranger:
        assert await _code(stranger.read_file(session_id, "keep.txt")) == grpc.StatusCode.UNAUTHENTICATED
        assert await _code(stranger.write_file(session_id, "keep.txt", b"x")) == grpc.StatusCode.UNAUTHENTICATED
    assert await plane.client.read_file(session_id, "keep.txt") == b"kept\n"


async def test_every_operation_is_audited(plane: Plane, session_id: str, tmp_path: Path) -> None:
    await plane.client.write_file(session_id, "audit/a.bin", b"12345")
    await plane.client.read_file(session_id, "audit/a.bin")
    await plane.client.list_files(session_id, "audit")
    await plane.client.upload(session_id, _hostile_tar(), "audit/up")
    await plane.client.download(session_id, ["audit/a.bin"], dest=tmp_path)
    await _code(plane.client.read_file(session_id, "../etc/passwd"))
    await plane.plane.audit.flush()
    entries: list[AuditEntry] = [e for e in await plane.plane.store.audit_entries("alpha", session_id)
                                 if e.kind == "file"]
    seen = [(e.tool, e.patterns, e.outcome) for e in entries[-6:]]
    assert seen == [("write_file", ("audit/a.bin",), "ok"), ("read_file", ("audit/a.bin",), "ok"),
                    ("list_files", ("audit",), "ok"), ("upload", ("audit/up",), "ok"),
                    ("download", ("audit/a.bin",), "ok"), ("read_file", (), "error")]
    assert entries[-6].detail == "5 bytes"
    assert entries[-5].detail == "5 bytes"
    assert entries[-4].detail.endswith("; 1 entries")
    # Two levels down, `sym_up` (../../etc/shadow) stays inside the workspace: kept; no planted link here either.
    assert entries[-3].detail == f"{len(_hostile_tar())} bytes; 2 files, 9 members refused"
    assert "climbs out" in entries[-1].detail
    await _sh(plane.client, session_id, "rm -rf /workspace/audit")


async def test_a_callers_write_voids_the_models_read(plane: Plane, session_id: str) -> None:
    """As after any change outside OpenCode, the model must read the file again before overwriting it; the
    caller's content is never silently replaced, even within upstream's 50 ms mtime tolerance."""
    client = plane.client
    await client.write_file(session_id, "ft/a.txt", b"one\n")
    read = await client.execute_tool(session_id, "read", {"filePath": "/workspace/ft/a.txt"}, on_permission=allow_once)
    assert "one" in read.output
    # Back-date the caller's new content to the moment of the read: only the recorded change can catch it.
    await client.write_file(session_id, "ft/a.txt", b"caller\n")
    await _sh(client, session_id, f"touch -d @{int(time.time() - 3600)} /workspace/ft/a.txt")
    write = await client.execute_tool(session_id, "write", {"filePath": "/workspace/ft/a.txt", "content": "model\n"},
                                      on_permission=allow_once)
    assert write.result is None
    assert "has been modified since it was last read" in (write.error or "")
    edit = await client.execute_tool(session_id, "edit", {"filePath": "/workspace/ft/a.txt", "oldString": "caller",
                                                          "newString": "model"}, on_permission=allow_once)
    assert "has been modified since it was last read" in (edit.error or "")
    assert await client.read_file(session_id, "ft/a.txt") == b"caller\n"
    # Reading again makes the model's write allowed, as upstream.
    await client.execute_tool(session_id, "read", {"filePath": "/workspace/ft/a.txt"}, on_permission=allow_once)
    ok = await client.execute_tool(session_id, "write", {"filePath": "/workspace/ft/a.txt", "content": "model\n"},
                                   on_permission=allow_once)
    assert ok.error is None, ok.error
    assert await client.read_file(session_id, "ft/a.txt") == b"model\n"
    # A file only the caller ever wrote was never read by the model.
    await client.write_file(session_id, "ft/b.txt", b"b\n")
    fresh = await client.execute_tool(session_id, "write", {"filePath": "/workspace/ft/b.txt", "content": "x"},
                                      on_permission=allow_once)
    assert "You must read file /workspace/ft/b.txt before overwriting it" in (fresh.error or "")
    # An upload into a directory voids the reads of what is under it.
    await client.execute_tool(session_id, "read", {"filePath": "/workspace/ft/a.txt"}, on_permission=allow_once)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("a.txt")
        info.size, info.mtime = 3, int(time.time() - 3600)
        tar.addfile(info, io.BytesIO(b"up\n"))
    await client.upload(session_id, buf.getvalue(), "ft")
    after = await client.execute_tool(session_id, "write", {"filePath": "/workspace/ft/a.txt", "content": "m"},
                                      on_permission=allow_once)
    assert "has been modified since it was last read" in (after.error or "")
