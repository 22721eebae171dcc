"""The sync `Client` has the files API method for method, and it works (driven from a worker thread, as the
in-process plane serves on the test's own event loop)."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

from controlplane.client import AsyncClient, Client
from controlplane.client_files import AsyncFiles, Files
from tests.planes import Plane


def test_both_clients_have_the_same_file_methods() -> None:
    public = {n for n in vars(AsyncFiles) if not n.startswith("_")}
    assert public == {"write_file", "read_file", "list_files", "upload", "download"}
    assert public == {n for n in vars(Files) if not n.startswith("_")}
    for name in public:
        assert hasattr(AsyncClient, name)
        assert hasattr(Client, name)
        async_params = list(inspect.signature(getattr(AsyncFiles, name)).parameters)
        assert async_params == list(inspect.signature(getattr(Files, name)).parameters), name


async def test_the_sync_client_round_trips(local_plane: Plane, tmp_path: Path) -> None:
    def work() -> None:
        with Client(local_plane.plane.address, local_plane.token) as c:
            sid = c.create_session().id
            info = c.write_file(sid, "d/x.bin", b"\x00\x01", mode=0o600)
            assert (info.path, info.mode) == ("d/x.bin", 0o600)
            assert c.read_file(sid, "/workspace/d/x.bin") == b"\x00\x01"
            assert [e.path for e in c.list_files(sid, "d").entries] == ["d/x.bin"]
            (tmp_path / "up").mkdir()
            (tmp_path / "up" / "y.txt").write_text("y")
            assert c.upload(sid, tmp_path / "up", "u").files == 1
            got = c.download(sid, ["u", "d"], dest=tmp_path / "down")
            assert sorted(got.extracted) == ["d", "d/x.bin", "u", "u/y.txt"]
            assert (tmp_path / "down" / "u" / "y.txt").read_text() == "y"
            c.delete_session(sid)

    await asyncio.to_thread(work)
