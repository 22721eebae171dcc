# ruff: noqa: ASYNC240 - a one-shot command: nothing else runs on its event loop while it looks at local paths
"""`controlplane cp SRC DST`: copies files and directories into or out of a session's workspace.

One side is `SESSION:PATH` (PATH relative to the workspace or absolute under /workspace; empty for the whole
workspace), the other a local path; as with scp, a word is remote when a colon comes before any slash
(write a local name with a colon as ./a:b). As with `cp -r`: a directory copied onto an existing directory
goes inside it under its own name, otherwise it becomes DST; a file copied onto an existing directory keeps
its name there. Contents stream in 1 MiB messages (controlplane/client_files.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controlplane.client import AsyncClient


@dataclass(frozen=True)
class Remote:
    session: str
    path: str


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    cp = sub.add_parser("cp", parents=[common], help="copy files or directories to or from a session (SESSION:PATH)",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cp.add_argument("src", help="SESSION:PATH or a local path")
    cp.add_argument("dst", help="SESSION:PATH or a local path")
    cp.add_argument("--mode", type=lambda v: int(v, 8), default=None,
                    help="octal mode of a single file copied into the session (default: kept, or 644 when new)")


def parse(word: str) -> Remote | None:
    """`SESSION:PATH` when a colon comes before any slash; None for a local path."""
    head, colon, tail = word.partition(":")
    if not colon or not head or "/" in head:
        return None
    return Remote(head, tail)


async def run(args: argparse.Namespace) -> int:
    src, dst = parse(args.src), parse(args.dst)
    if (src is None) == (dst is None):
        print("controlplane cp: exactly one of SRC and DST must be SESSION:PATH", file=sys.stderr)
        return 2
    from controlplane.cli_common import target_and_token
    from controlplane.client import AsyncClient  # here: `--help` and other commands do not load gRPC for it

    async with AsyncClient(*target_and_token(args)) as client:
        if dst is not None:
            return await _upload(client, Path(args.src), dst, args.mode)
        assert src is not None
        return await _download(client, src, Path(args.dst))


async def _remote_dir(client: AsyncClient, where: Remote) -> bool | None:
    """Whether the remote path is a directory; None when nothing is there."""
    import grpc

    try:
        listing = await client.list_files(where.session, where.path, limit=1)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND and "does not exist" in (exc.details() or ""):
            return None
        raise
    return bool(listing.target.type == listing.target.DIRECTORY)


def _join(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}" if directory else name


async def _upload(client: AsyncClient, local: Path, dst: Remote, mode: int | None) -> int:
    if not local.exists():
        print(f"controlplane cp: {local}: no such file or directory", file=sys.stderr)
        return 1
    into_dir = await _remote_dir(client, dst)
    if local.is_dir():
        # Onto an existing directory: inside it under its own name; otherwise it becomes DST.
        dest = _join(dst.path, local.resolve().name) if into_dir else dst.path
        summary = await client.upload(dst.session, local, dest)
        for skipped in summary.skipped:
            print(f"controlplane cp: skipped {skipped}", file=sys.stderr)
        return 1 if summary.skipped else 0
    path = _join(dst.path, local.name) if into_dir or dst.path.endswith("/") or not dst.path else dst.path
    await client.write_file(dst.session, path, local, mode=mode)
    return 0


async def _download(client: AsyncClient, src: Remote, local: Path) -> int:
    into_dir = local.is_dir()
    local.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=local.parent if not into_dir else local, prefix=".cp-") as spool:
        got = await client.download(src.session, [src.path] if src.path else None, dest=spool)
        for skipped in got.skipped:
            print(f"controlplane cp: skipped {skipped}", file=sys.stderr)
        if not got.extracted:
            print(f"controlplane cp: {src.session}:{src.path}: nothing to copy", file=sys.stderr)
            return 1
        top = got.extracted[0]
        from controlplane.core.seam.files import workspace_relative  # here: `--help` stays light

        if not workspace_relative(src.path):  # the whole workspace: its contents go into DST
            local.mkdir(parents=True, exist_ok=True)
            for child in sorted(os.listdir(spool)):
                _move(Path(spool) / child, local / child)
        else:
            _move(Path(spool) / top, local / Path(top).name if into_dir else local)
    return 1 if got.skipped else 0


def _move(source: Path, dest: Path) -> None:
    if dest.is_dir() and not dest.is_symlink() and source.is_dir():
        for child in sorted(os.listdir(source)):
            _move(source / child, dest / child)
        return
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    elif dest.exists() or dest.is_symlink():
        dest.unlink()
    os.replace(source, dest)
