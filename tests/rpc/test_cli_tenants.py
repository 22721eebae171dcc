"""`controlplane tenant ...` against a running control plane, with the admin token from the data dir's file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from controlplane import cli
from controlplane.client import AsyncClient
from tests.planes import Plane, served_plane

plane = served_plane("local", scope="function", tenants=[{"name": "alpha", "token": "token-alpha"}], pool={"size": 0})


def tenant_cli(plane: Plane, config: Path, *argv: str) -> int:
    return cli.main(["tenant", argv[0], "--config", str(config), "--target", plane.plane.address, *argv[1:]])


async def test_create_use_quota_usage_rotate_revoke_delete(
    plane: Plane, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "cp.toml"  # names the plane's data dir, where the admin token file is
    config.write_text(f'data_dir = "{plane.plane.settings.data_dir}"\n')

    async def run(*argv: str) -> tuple[int, str, str]:
        code = await asyncio.to_thread(tenant_cli, plane, config, *argv)
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, err = await run("create", "bob", "--sessions", "1", "--json")
    assert code == 0, err
    made = json.loads(out)
    assert made["tenant"]["name"] == "bob"
    assert made["tenant"]["quota"] == {"sessions": "1"}
    async with AsyncClient(plane.plane.address, made["token"]) as bob:
        await bob.create_session()
        code, out, _ = await run("usage", "bob")
        assert code == 0
        assert out.startswith("tenant bob: 1 sessions, 1 CPUs, 1024 MiB memory")
        assert (await run("quota", "bob", "--sessions", "2", "--cpu", "3"))[0] == 0
        code, out, _ = await run("list")
        assert code == 0
        lines = {line.split()[0]: line for line in out.splitlines()}
        assert set(lines) == {"alpha", "bob"}
        assert "api" in lines["bob"]
        assert "active" in lines["bob"]
        assert "sessions=2 cpu=3" in lines["bob"]
        code, out, err = await run("rotate", "bob")
        assert code == 0
        assert "only its hash is kept" in err
        new_token = next(line.split()[1] for line in out.splitlines() if line.startswith("token: "))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await bob.list_sessions()
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert (await run("revoke", "bob"))[0] == 0
    async with AsyncClient(plane.plane.address, new_token) as bob:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await bob.list_sessions()
        assert info.value.details() == "bearer token revoked"
    code, out, _ = await run("delete", "bob")
    assert code == 0
    assert "deleted 1 sessions" in out
    code, _, err = await run("usage", "bob")
    assert code == 2
    assert "NOT_FOUND" in err
    code, _, err = await run("list", "--token", "wrong")
    assert code == 2
    assert "UNAUTHENTICATED: unknown admin token" in err
