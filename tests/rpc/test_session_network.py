"""CreateSessionRequest.network through the public API on the local plane (in-process agents, so the forwarder
takes a free port of the host's loopback): the policy is checked against the tenant's cap before anything
exists, kept with the session, and a session with one reaches the test's own host through its proxy, which
closes when the session ends. The same on real containers: tests/docker/test_egress_sandbox.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from controlplane import cli
from controlplane.client import AsyncClient
from tests.docker import egress_servers
from tests.planes import Plane, served_plane, short_tmp

TENANTS: list[dict[str, Any]] = [
    {"name": "acme", "token": "token-acme",
     "egress": {"allow_hosts": ["*.test", "pkgs.example:443"], "allow_cidrs": ["10.2.0.0/16"]}},
    {"name": "closed", "token": "token-closed"},
]
EGRESS = {"allow_cidrs": ["127.0.0.1/32"], "hosts": {"web.test": "127.0.0.1", "other.test": "127.0.0.1"}}

net_plane = served_plane("local", name="net_plane", tenants=TENANTS, egress=EGRESS)


@pytest.fixture(scope="module")
def web() -> Iterator[tuple[int, list[str]]]:
    root = short_tmp()
    (root / "hello.txt").write_text("hello from the test host\n")
    try:
        with egress_servers.http_server(root) as served:
            yield served
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(("asked", "named"), [
    (["evil.example"], "evil.example"),
    (["web.test", "pkgs.example"], "pkgs.example"),  # any port, beyond the cap's :443
    (["*.test"], None),  # within: the cap's own pattern
    (["10.2.3.0/24", "10.3.0.0/24"], "10.3.0.0/24"),
    (["10.0.0.0/8"], "10.0.0.0/8"),
    (["bad host!"], "bad host!"),
    (["web.test:0"], "web.test:0"),
])
async def test_a_policy_is_checked_against_the_tenants_cap_before_anything_exists(
    net_plane: Plane, asked: list[str], named: str | None,
) -> None:
    before = len(await net_plane.client.list_sessions(include_deleted=True))
    if named is None:
        session = await net_plane.client.create_session(network_allow=asked)
        assert list(session.network.allow_hosts) == asked
        await net_plane.client.delete_session(session.id)
        return
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await net_plane.client.create_session(network_allow=asked)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in (refused.value.details() or "")
    assert len(await net_plane.client.list_sessions(include_deleted=True)) == before


async def test_a_tenant_without_a_cap_gets_no_network(net_plane: Plane) -> None:
    async with AsyncClient(net_plane.plane.address, "token-closed") as closed:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await closed.create_session(network_allow=["web.test"])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "web.test" in (refused.value.details() or "")
        assert "closed" in (refused.value.details() or "")
        plain = await closed.create_session()  # no policy: nothing to check
        assert not plain.HasField("network")
        await closed.delete_session(plain.id)


async def test_a_session_reaches_an_allowed_host_through_its_proxy_until_it_ends(
    net_plane: Plane, web: tuple[int, list[str]],
) -> None:
    port, seen = web
    session = await net_plane.client.create_session(network_allow=["web.test"])
    assert list((await net_plane.client.get_session(session.id)).network.allow_hosts) == ["web.test"]
    fetch = ("import sys, urllib.request as u\n"
             "try:\n"
             f"    print(u.urlopen(f'http://{{sys.argv[1]}}:{port}/hello.txt', timeout=20).read().decode(), end='')\n"
             "except Exception as e:\n"
             "    print(getattr(e, 'code', ''), getattr(e, 'read', lambda: str(e).encode())().decode(), end='')\n")
    done = await net_plane.client.run(session.id, ["python3", "-c", fetch, "web.test"])
    assert done.stdout == b"hello from the test host\n", done.stderr
    assert f"GET /hello.txt Host=web.test:{port}" in seen
    refused = await net_plane.client.run(session.id, ["python3", "-c", fetch, "other.test"])
    assert refused.stdout.decode().startswith("403 ocsb egress: host other.test")
    socket = net_plane.plane.sessions._provider.network_socket(session.sandbox_id)
    assert await asyncio.to_thread(os.path.exists, socket)
    await net_plane.client.delete_session(session.id)
    assert not await asyncio.to_thread(os.path.exists, socket)


async def test_the_cli_asks_for_hosts_and_cidrs(net_plane: Plane, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["session", "create", "--target", net_plane.plane.address, "--token", net_plane.token, "--json",
            "--allow-host", "web.test", "--allow-host", "*.test:8443", "--allow-cidr", "10.2.3.0/24"]
    assert await asyncio.to_thread(cli.main, argv) == 0
    shown = json.loads(capsys.readouterr().out)
    sid = shown[0]["id"] if isinstance(shown, list) else shown["id"]
    session = await net_plane.client.get_session(sid)
    assert list(session.network.allow_hosts) == ["web.test", "*.test:8443"]
    assert list(session.network.allow_cidrs) == ["10.2.3.0/24"]
    await net_plane.client.delete_session(sid)
    assert await asyncio.to_thread(cli.main, [*argv[:7], "--allow-host", "evil.example"]) == 2
    assert "evil.example" in capsys.readouterr().err
