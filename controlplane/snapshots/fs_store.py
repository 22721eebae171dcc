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
from controlplane.core.sessions.workspace_spool import finished
from controlplane.errors import FailedPreconditionError

GZIP_LEVEL = 3
"""Most of level 9's ratio on source trees at several times its speed: a snapshot is taken while the caller waits."""
STALE_TEMP_S = 3600.0
READ_CHUNK = 1 << 20
_PLAIN_TENANT = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


class FsSnapshotStorage:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._sizes: dict[str, dict[str, tuple[int, int, int]]] = {}
        """Per tenant, per record file: (its mtime_ns, its length, the snapshot's size_bytes), for stored_bytes."""

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
            # Compressed in the thread too: a piece of incompressible data holds the loop for milliseconds.
            async for chunk in tar:
                if chunk:
                    size += await finished(_deflate, out, compressor, chunk, digest)
            size += await finished(_deflate, out, compressor, None, digest)
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
            data = await finished(content.read_bytes)
        except FileNotFoundError:
            raise FailedPreconditionError(
                f"snapshot {snapshot_id} is damaged: its workspace file is missing; delete it") from None
        # Hashed in a thread (hashlib lets the loop go for large inputs): hundreds of MiB take a quarter second.
        if len(data) != snapshot.size_bytes or await finished(_sha256, data) != snapshot.sha256:
            raise FailedPreconditionError(
                f"snapshot {snapshot_id} is corrupt: its stored workspace ({len(data)} bytes) does not match its "
                f"checksum (sha256 {snapshot.sha256[:16]}..., {snapshot.size_bytes} bytes); it cannot be restored, "
                "delete it")
        return data

    async def workspace(self, tenant: str, snapshot_id: str) -> AsyncIterator[bytes]:
        content, record = self._paths(tenant, snapshot_id)
        snapshot = await asyncio.to_thread(self._load, record)
        if snapshot is None:
            raise FailedPreconditionError(f"snapshot {snapshot_id} is gone")
        try:
            source = await asyncio.to_thread(open, content, "rb")
        except FileNotFoundError:
            raise FailedPreconditionError(
                f"snapshot {snapshot_id} is damaged: its workspace file is missing; delete it") from None
        try:
            # Two passes over the file, a piece at a time: the checksum before any byte is used, then the tar.
            digest, size = hashlib.sha256(), 0
            while size_read := await finished(_hashed, source, digest):
                size += size_read
            if size != snapshot.size_bytes or digest.hexdigest() != snapshot.sha256:
                raise FailedPreconditionError(
                    f"snapshot {snapshot_id} is corrupt: its stored workspace ({size} bytes) does not match its "
                    f"checksum (sha256 {snapshot.sha256[:16]}..., {snapshot.size_bytes} bytes); delete it")
            await asyncio.to_thread(source.seek, 0)
            inflate = zlib.decompressobj(31)
            while chunk := await asyncio.to_thread(source.read, READ_CHUNK):
                while chunk:  # bounded output per step: a small piece may inflate to a great deal
                    yield inflate.decompress(chunk, READ_CHUNK)
                    chunk = inflate.unconsumed_tail
            yield inflate.flush()
        finally:
            source.close()

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

    async def stored_bytes(self, tenant: str) -> int:
        """What the tenant's snapshots of every kind hold, for its disk quota on each admission: one directory
        listing and one stat per record; a record is read only when it is new or changed (cached sizes)."""
        return await asyncio.to_thread(self._stored_bytes, tenant)

    # -- internals ----------------------------------------------------------------------------------

    def _stored_bytes(self, tenant: str) -> int:
        folder = self._dir(tenant)
        known = self._sizes.get(tenant, {})
        seen: dict[str, tuple[int, int, int]] = {}
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if not (entry.name.startswith("snap_") and entry.name.endswith(".json")):
                continue
            try:
                stat = entry.stat()
            except FileNotFoundError:  # deleted meanwhile
                continue
            cached = known.get(entry.name)
            if cached is not None and cached[:2] == (stat.st_mtime_ns, stat.st_size):
                seen[entry.name] = cached
            elif (snapshot := self._load(Path(entry.path))) is not None:
                seen[entry.name] = (stat.st_mtime_ns, stat.st_size, snapshot.size_bytes)
        self._sizes[tenant] = seen  # what was deleted is forgotten, so the cache stays as large as the storage
        return sum(size for _, _, size in seen.values())


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


def _deflate(out: IO[bytes], compressor: zlib._Compress, chunk: bytes | None, digest: hashlib._Hash) -> int:
    """Compresses `chunk` (None: the end) into `out`; the compressed bytes written."""
    return _put(out, compressor.compress(chunk) if chunk is not None else compressor.flush(), digest)


def _hashed(source: IO[bytes], digest: hashlib._Hash) -> int:
    """The next piece of `source` into `digest`; its length (0: the end)."""
    chunk = source.read(READ_CHUNK)
    digest.update(chunk)
    return len(chunk)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
