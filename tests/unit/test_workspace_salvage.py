"""The engine's tar of a workspace directory renamed as the agent's download names it
(controlplane.sandbox.workspace_salvage.relative): what a FAILED session's kept workspace restores from; and a
salvage given up on midway (its caller's timeout) stops, and leaves neither its container nor its file."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests

from controlplane.core.calls.tracked_tasks import TrackedTasks
from controlplane.sandbox import workspace_salvage
from controlplane.sandbox.workspace_salvage import relative


def _engine_tar(prefix: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        root = tarfile.TarInfo(prefix.rstrip("/") or ".")
        root.type, root.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(root)
        for name, data, mode in (("src/", b"", 0o750), ("src/main.py", b"print(1)\n", 0o640)):
            info = tarfile.TarInfo(prefix + name.rstrip("/"))
            info.mode = mode
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(prefix + "same.py")
        link.type, link.linkname = tarfile.LNKTYPE, prefix + "src/main.py"
        tar.addfile(link)
        sym = tarfile.TarInfo(prefix + "link")
        sym.type, sym.linkname = tarfile.SYMTYPE, "src/main.py"
        tar.addfile(sym)
    return out.getvalue()


def test_names_lose_the_copied_directory_and_keep_modes_links_and_bytes() -> None:
    for prefix in ("workspace/", "./"):
        with tarfile.open(fileobj=io.BytesIO(relative(_engine_tar(prefix)))) as tar:
            members = {m.name: m for m in tar.getmembers()}
            assert sorted(members) == ["link", "same.py", "src", "src/main.py"]
            assert members["src"].mode == 0o750
            assert members["src/main.py"].mode == 0o640
            assert members["same.py"].linkname == "src/main.py"
            assert members["link"].linkname == "src/main.py"
            main = tar.extractfile("src/main.py")
            assert main is not None
            assert main.read() == b"print(1)\n"


class _Engine:
    """A scripted engine: a container made for the salvage serves the workspace's tar `piece` bytes at a time, each
    `delay_s` apart (a slow engine), and records what is created and removed. As Docker 20.10 does, it holds a
    container whose archive stream is still open: its removal waits for the stream to be closed, and times out."""

    base_url, api_version, timeout = "http+docker://engine", "1.41", 60

    def __init__(self, tar: bytes, piece: int = 4096, delay_s: float = 0.0) -> None:
        self.tar, self.piece, self.delay_s = tar, piece, delay_s
        self.containers: dict[str, str] = {}  # id -> name
        self.served = 0
        self.api = self
        self.lock = threading.Lock()
        self.streaming: dict[str, threading.Event] = {}  # container id -> set once its stream is closed

    def create(self, image: str, **kwargs: Any) -> Any:
        del image
        with self.lock:
            if kwargs["name"] in self.containers.values():
                raise docker.errors.APIError("409 Conflict: the name is in use")
            cid = f"c{len(self.containers) + self.served}-{kwargs['name']}"
            self.containers[cid] = kwargs["name"]

        class _Container:
            id = cid

        return _Container()

    def get(self, url: str, **kwargs: Any) -> Any:
        assert kwargs["stream"]
        assert kwargs["params"] == {"path": "/workspace/."}
        cid = url.removeprefix(f"{self.base_url}/v{self.api_version}/containers/").removesuffix("/archive")
        closed = self.streaming[cid] = threading.Event()
        engine = self

        class _Response:
            def raise_for_status(self) -> None:
                pass

            def iter_content(self, size: int) -> Any:
                del size
                return engine.stream(closed)

            def close(self) -> None:
                closed.set()

        return _Response()

    def stream(self, closed: threading.Event) -> Any:
        for offset in range(0, len(self.tar), self.piece):
            time.sleep(self.delay_s)
            if closed.is_set():
                return
            self.served += 1
            yield self.tar[offset : offset + self.piece]

    def remove_container(self, ref: str, force: bool) -> None:
        assert force
        with self.lock:
            found = [cid for cid, name in self.containers.items() if ref in (cid, name)]
        if not found:
            raise docker.errors.NotFound("no such container")
        closed = self.streaming.get(found[0])
        if closed is not None and not closed.wait(1.0):  # the real engine's wait ends in the client's timeout
            raise requests.exceptions.ReadTimeout("the engine did not answer (the container's archive is open)")
        with self.lock:
            self.containers.pop(found[0], None)


class _Volumes:
    def __init__(self) -> None:
        self.made: dict[str, dict[str, str]] = {}  # name -> labels
        volumes = self

        class _Volume:
            def __init__(self, name: str) -> None:
                self.name, self.attrs = name, {"Labels": volumes.made[name] or None}

            def remove(self, force: bool) -> None:
                assert force
                del volumes.made[self.name]

        self._volume = _Volume

    def get(self, name: str) -> Any:
        if name not in self.made:
            raise docker.errors.NotFound("no such volume")
        return self._volume(name)


def _client(engine: _Engine, volumes: _Volumes | None = None) -> Any:
    class _Client:
        api = engine
        containers = engine

    client = _Client()
    client.volumes = volumes or _Volumes()  # type: ignore[attr-defined]
    return client


LABELS = {"ocsb.managed": "true", "ocsb.instance": "t-salvage", "ocsb.image": "ocsb-sandbox:latest"}
NAME = "vol-sb1-salvage"


async def _read_all(chunks: AsyncIterator[bytes]) -> bytes:
    out = bytearray()
    async for chunk in chunks:
        out += chunk
    return bytes(out)


async def test_a_salvage_reads_the_workspace_through_a_file_and_leaves_nothing(tmp_path: Path) -> None:
    engine = _Engine(_engine_tar("workspace/"))
    tasks = TrackedTasks()
    volumes = _Volumes()
    volumes.made["vol-sb1"] = {"ocsb.instance": "t-salvage"}  # the failed session's own: it stays
    got = await _read_all(workspace_salvage.read(_client(engine, volumes), tmp_path / "sandboxes", "vol-sb1", LABELS,
                                                 tasks))
    await tasks.wait()
    assert got == relative(_engine_tar("workspace/"))
    assert engine.containers == {}
    assert list((tmp_path / "salvage" / "t-salvage").iterdir()) == []
    assert list(volumes.made) == ["vol-sb1"]


async def test_a_salvage_given_up_midway_stops_reading_and_removes_its_container_and_file(tmp_path: Path) -> None:
    # 400 pieces 10 ms apart: 4 s to read it all. The caller gives up after 0.3 s, as _before_removal does.
    engine = _Engine(_engine_tar("workspace/") + bytes(400 * 4096), delay_s=0.01)
    tasks = TrackedTasks()
    volumes = _Volumes()
    client = _client(engine, volumes)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(_read_all(workspace_salvage.read(client, tmp_path / "sandboxes", "vol-sb1", LABELS,
                                                                tasks)), 0.3)
    assert time.monotonic() - started < 1.0
    volumes.made["vol-sb1"] = {}  # the session's volume went meanwhile, and the engine made it again for the mount
    await tasks.wait()
    assert time.monotonic() - started < 2.0  # the engine thread stopped at its next piece, not at the end
    assert engine.served < 200
    assert engine.containers == {}  # the never-started container went
    assert list((tmp_path / "salvage" / "t-salvage").iterdir()) == []  # and so did the spooled copy
    assert volumes.made == {}  # and the unlabelled volume the engine made
    # The next salvage of the same sandbox works (the name is free again).
    engine.delay_s = 0.0
    got = await _read_all(workspace_salvage.read(client, tmp_path / "sandboxes", "vol-sb1", LABELS, tasks))
    assert got.startswith(relative(_engine_tar("workspace/"))[:512])
    await tasks.wait()
    assert engine.containers == {}


async def test_a_salvage_left_by_a_killed_plane_is_replaced_and_its_stale_files_cleared(tmp_path: Path) -> None:
    engine = _Engine(_engine_tar("./"))
    engine.containers["old"] = NAME  # the container a killed plane left, with its name
    folder = tmp_path / "salvage" / "t-salvage"
    folder.mkdir(parents=True)
    (folder / "vol-sb0-dead.tar.engine").write_bytes(b"half")
    stale = time.time() - workspace_salvage.STALE_S - 10
    os.utime(folder / "vol-sb0-dead.tar.engine", (stale, stale))
    (folder / "vol-sb2-going.tar").write_bytes(b"another salvage, going on")
    tasks = TrackedTasks()
    got = await _read_all(workspace_salvage.read(_client(engine), tmp_path / "sandboxes", "vol-sb1", LABELS, tasks))
    assert got == relative(_engine_tar("./"))
    await tasks.wait()
    assert engine.containers == {}
    assert [p.name for p in folder.iterdir()] == ["vol-sb2-going.tar"]
