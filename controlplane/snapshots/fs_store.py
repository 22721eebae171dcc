"""Snapshots as files under one directory, which several control planes may share (a network filesystem).

    ROOT/TENANT/snap_ID.tar.gz   the workspace, gzip-compressed
    ROOT/TENANT/snap_ID.json     the record: checksum, size, time and the session's state

Each file is written under a dot-prefixed temporary name, flushed to disk and renamed; the record goes last, so
a snapshot lists only once its workspace is whole, and a crash leaves a temporary file that nothing lists (and
the next write to the same tenant's directory removes when it is older than STALE_TEMP_S).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import secrets
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

from controlplane.core.sessions.snapshots import Snapshot, SnapshotState, checked_id
from controlplane.errors import FailedPreconditionError

GZIP_LEVEL = 3
"""Most of level 9's ratio on source trees at several times its speed: a snapshot is taken while the caller waits."""
STALE_TEMP_S = 3600.0
READ_CHUNK = 1 << 20
_PLAIN_TENANT = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


class FsSnapshotStorage:
    def __init__(self, root: Path) -> None:
        self.root = root

    # -- paths --------------------------------------------------------------------------------------

    def _dir(self, tenant: str) -> Path:
        # Tenant names are the operator's, but a directory must never be able to climb out of the root.
        name = tenant if _PLAIN_TENANT.fullmatch(tenant) and tenant not in (".", "..") else "x-" + tenant.encode().hex()
        return self.root / name

    def _paths(self, tenant: str, snapshot_id: str) -> tuple[Path, Path]:
        base = self._dir(tenant) / checked_id(snapshot_id)
        return base.with_suffix(".tar.gz"), base.with_suffix(".json")

    # -- the port -----------------------------------------------------------------------------------

    async def write(self, tenant: str, snapshot_id: str, session_id: str, state: SnapshotState,
                    tar: AsyncIterator[bytes]) -> Snapshot:
        content, record = self._paths(tenant, snapshot_id)
        await asyncio.to_thread(self._prepare, content.parent)
        temp = content.with_name(f".{content.name}.{secrets.token_hex(4)}.tmp")
        digest = hashlib.sha256()
        size = 0
        compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: the gzip container
        out = await asyncio.to_thread(open, temp, "xb")
        try:
            async for chunk in tar:
                if chunk:
                    size += await asyncio.to_thread(_put, out, compressor.compress(chunk), digest)
            size += await asyncio.to_thread(_put, out, compressor.flush(), digest)
            await asyncio.to_thread(_close_synced, out)
            snapshot = Snapshot(snapshot_id, tenant, session_id, time.time(), size, digest.hexdigest(), "gzip", state)
            await asyncio.to_thread(os.replace, temp, content)
            await asyncio.to_thread(_write_atomic, record, json.dumps(_record(snapshot)).encode())
        except BaseException:
            out.close()
            with contextlib.suppress(OSError):
                temp.unlink()
            with contextlib.suppress(OSError):
                if not record.exists():
                    content.unlink()
            raise
        return snapshot

    async def tenants(self) -> list[str]:
        def scan() -> list[str]:
            found: list[str] = []
            for folder in self.root.iterdir() if self.root.is_dir() else []:
                # Each directory's records name its tenant: a directory's own name may be an encoding of it.
                for record in folder.glob("snap_*.json"):
                    snapshot = self._load(record)
                    if snapshot is not None:
                        found.append(snapshot.tenant)
                        break
            return sorted(found)

        return await asyncio.to_thread(scan)

    async def get(self, tenant: str, snapshot_id: str) -> Snapshot | None:
        return await asyncio.to_thread(self._load, self._paths(tenant, snapshot_id)[1])

    async def list(self, tenant: str) -> list[Snapshot]:
        def scan() -> list[Snapshot]:
            folder = self._dir(tenant)
            if not folder.is_dir():
                return []
            found = [self._load(p) for p in folder.glob("snap_*.json")]
            return sorted((s for s in found if s is not None), key=lambda s: (s.created_at, s.id))

        return await asyncio.to_thread(scan)

    async def read(self, tenant: str, snapshot_id: str) -> bytes:
        content, record = self._paths(tenant, snapshot_id)
        snapshot = await asyncio.to_thread(self._load, record)
        if snapshot is None:
            raise FailedPreconditionError(f"snapshot {snapshot_id} is gone")
        try:
            data = await asyncio.to_thread(content.read_bytes)
        except FileNotFoundError:
            raise FailedPreconditionError(
                f"snapshot {snapshot_id} is damaged: its workspace file is missing; delete it") from None
        if len(data) != snapshot.size_bytes or hashlib.sha256(data).hexdigest() != snapshot.sha256:
            raise FailedPreconditionError(
                f"snapshot {snapshot_id} is corrupt: its stored workspace ({len(data)} bytes) does not match its "
                f"checksum (sha256 {snapshot.sha256[:16]}..., {snapshot.size_bytes} bytes); it cannot be restored, "
                "delete it")
        return data

    async def delete(self, tenant: str, snapshot_id: str) -> bool:
        content, record = self._paths(tenant, snapshot_id)

        def remove() -> bool:
            try:
                record.unlink()  # first: from here on it no longer lists
            except FileNotFoundError:
                return False
            with contextlib.suppress(FileNotFoundError):
                content.unlink()
            return True

        return await asyncio.to_thread(remove)

    # -- internals ----------------------------------------------------------------------------------

    def _prepare(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        now = time.time()
        for temp in folder.glob(".snap_*.tmp"):  # left by a crash mid-write (another plane's may still be going)
            with contextlib.suppress(OSError):
                if now - temp.stat().st_mtime > STALE_TEMP_S:
                    temp.unlink()

    def _load(self, record: Path) -> Snapshot | None:
        try:
            data = json.loads(record.read_bytes())
        except FileNotFoundError:
            return None
        return Snapshot(
            id=data["id"], tenant=data["tenant"], session_id=data["session_id"], created_at=data["created_at"],
            size_bytes=data["size_bytes"], sha256=data["sha256"], compression=data["compression"],
            state=SnapshotState.from_dict(data["state"]),
        )


def _record(s: Snapshot) -> dict[str, object]:
    return {"id": s.id, "tenant": s.tenant, "session_id": s.session_id, "created_at": s.created_at,
            "size_bytes": s.size_bytes, "sha256": s.sha256, "compression": s.compression, "state": s.state.to_dict()}


def _put(out: IO[bytes], data: bytes, digest: hashlib._Hash) -> int:
    if data:
        out.write(data)
        digest.update(data)
    return len(data)


def _close_synced(out: IO[bytes]) -> None:
    out.flush()
    os.fsync(out.fileno())
    out.close()


def _write_atomic(path: Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temp, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    with contextlib.suppress(OSError):  # the renames themselves survive a power loss once the directory is synced
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
