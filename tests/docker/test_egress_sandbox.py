"""A session's network on real containers (issue 24): with a policy, curl, Python, pip, git and Bun reach the
test's own hosts on the host's loopback through the session's proxy, and nothing else; without one the sandbox
has only `lo` and reaches nothing; a policy beyond the tenant's cap is INVALID_ARGUMENT.

Every server here is one the test starts on 127.0.0.1; the operator config allows 127.0.0.1/32 and maps the
test's names to it (`[egress] hosts`), as an air-gapped site maps its own.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.v1 import session_pb2
from tests.docker import egress_servers
from tests.planes import Plane, new_instance, remove_data_dir, remove_instance_leftovers, served_plane, short_tmp
from tests.runtimes import runsc_missing

pytestmark = pytest.mark.docker

NAMES = ("web.test", "pkgs.test", "git.test", "npm.test", "other.test")
ALLOW = ["web.test", "pkgs.test", "git.test", "npm.test"]
TENANTS: list[dict[str, Any]] = [
    {"name": "acme", "token": "token-acme", "egress": {"allow_hosts": ["*.test"]}},
    {"name": "closed", "token": "token-closed"},
    {"name": "gvisor", "token": "token-gvisor", "runtime": "runsc", "egress": {"allow_hosts": ["web.test"]}},
]
EGRESS = {"allow_cidrs": ["127.0.0.1/32"], "hosts": dict.fromkeys(NAMES, "127.0.0.1")}

egress_plane = served_plane("docker", name="egress_plane", tenants=TENANTS, egress=EGRESS, pool={"size": 1})


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[int, list[str]]]:
    """The test's hosts: one HTTP server on 127.0.0.1 serving a file, a simple index, a Git repository over
    dumb HTTP and an npm-style registry (each name of NAMES reaches it through the static map)."""
    root = short_tmp()
    (root / "hello.txt").write_text("hello from the test host\n")
    egress_servers.simple_index(root)
    egress_servers.git_repository(root)
    try:
        with egress_servers.http_server(root) as (port, seen):
            egress_servers.npm_registry(root, port)
            yield port, seen
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
async def networked(egress_plane: Plane) -> AsyncIterator[str]:
    session = await egress_plane.client.create_session(network_allow=ALLOW)
    yield session.id
    await egress_plane.client.delete_session(session.id)


async def sh(plane: Plane, session_id: str, command: str, client: AsyncClient | None = None) -> tuple[int, str]:
    done = await (client or plane.client).run(session_id, command=command, merge_stderr=True, timeout_ms=120_000)
    return done.exit_code, done.stdout.decode(errors="replace")


async def test_curl_and_python_reach_an_allowed_host(egress_plane: Plane, networked: str,
                                                     hosts: tuple[int, list[str]]) -> None:
    port, seen = hosts
    code, out = await sh(egress_plane, networked, f"curl -sS --max-time 30 http://web.test:{port}/hello.txt")
    assert (code, out) == (0, "hello from the test host\n")
    code, out = await sh(egress_plane, networked, "python3 -c \"import urllib.request as u; print(u.urlopen("
                         f"'http://web.test:{port}/hello.txt', timeout=30).read().decode(), end='')\"")
    assert (code, out) == (0, "hello from the test host\n")
    assert f"GET /hello.txt Host=web.test:{port}" in seen  # the server saw the name the tool asked for


async def test_pip_installs_a_wheel_from_the_tests_index(egress_plane: Plane, networked: str,
                                                         hosts: tuple[int, list[str]]) -> None:
    port, _ = hosts
    code, out = await sh(egress_plane, networked,
                         "python3 -m pip install -q --no-cache-dir --disable-pip-version-check --target /tmp/pkgs "
                         f"--index-url http://pkgs.test:{port}/simple/ --trusted-host pkgs.test ocsbdemo && "
                         "PYTHONPATH=/tmp/pkgs python3 -c 'import ocsbdemo; print(ocsbdemo.VALUE)'")
    assert code == 0, out
    assert out.strip().endswith("installed from the test index")


async def test_git_clones_over_http(egress_plane: Plane, networked: str, hosts: tuple[int, list[str]]) -> None:
    port, _ = hosts
    code, out = await sh(egress_plane, networked,
                         f"git clone -q http://git.test:{port}/repo.git /tmp/clone && cat /tmp/clone/README")
    assert (code, out) == (0, "cloned through the session proxy\n")


async def test_bun_installs_a_package_from_the_tests_registry(egress_plane: Plane, networked: str,
                                                               hosts: tuple[int, list[str]]) -> None:
    port, _ = hosts
    script = (
        "set -e; mkdir -p /tmp/npmproj && cd /tmp/npmproj && "
        "echo '{\"name\":\"p\",\"dependencies\":{\"ocsb-demo\":\"1.0.0\"}}' > package.json && "
        f"BUN_CONFIG_REGISTRY=http://npm.test:{port}/ bun install --no-save >/dev/null 2>&1 || "
        f"BUN_CONFIG_REGISTRY=http://npm.test:{port}/ bun install --no-save; "
        "bun -e 'console.log(require(\"/tmp/npmproj/node_modules/ocsb-demo\"))'"
    )
    code, out = await sh(egress_plane, networked, script)
    assert code == 0, out
    assert out.strip().endswith("installed from the test registry")


async def test_a_host_outside_the_policy_is_refused_naming_the_policy(
    egress_plane: Plane, networked: str, hosts: tuple[int, list[str]],
) -> None:
    port, seen = hosts
    before = len(seen)
    code, out = await sh(egress_plane, networked, f"curl -sS -i --max-time 30 http://other.test:{port}/hello.txt")
    assert code == 0, out
    assert out.startswith("HTTP/1.1 403")
    assert "other.test" in out
    assert "not in this session's network policy" in out
    code, out = await sh(egress_plane, networked, f"curl -sS --max-time 30 https://other.test:{port}/")
    assert code != 0
    assert "403" in out  # the CONNECT was refused
    assert len(seen) == before  # neither reached the test host


async def test_a_direct_connection_without_the_proxy_fails(egress_plane: Plane, networked: str,
                                                           hosts: tuple[int, list[str]]) -> None:
    port, seen = hosts
    before = len(seen)
    # The sandbox's 127.0.0.1 is its own loopback: the host's listener is not there, and no other route exists.
    code, out = await sh(egress_plane, networked,
                         f"curl -sS --noproxy '*' --max-time 10 http://127.0.0.1:{port}/hello.txt")
    assert code == 7, out  # could not connect
    code, out = await sh(egress_plane, networked,
                         f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)\"")
    assert code != 0
    assert "ConnectionRefusedError" in out
    code, out = await sh(egress_plane, networked, "ls /sys/class/net")
    assert out.split() == ["lo"]
    # The proxy's socket is the agent's to open (its dir is 0700 root): a tool has only the forwarder.
    code, out = await sh(egress_plane, networked, "python3 -c \"import socket; "
                         "socket.socket(socket.AF_UNIX).connect('/run/agent/egress.sock')\"")
    assert code != 0
    assert "PermissionError" in out
    assert len(seen) == before


async def test_exec_commands_and_the_bash_tool_get_the_proxy_environment(egress_plane: Plane, networked: str) -> None:
    _, env = await sh(egress_plane, networked, "env")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "npm_config_proxy",
                 "npm_config_https_proxy"):
        assert f"{name}=http://127.0.0.1:3128\n" in env
    assert "NO_PROXY=localhost,127.0.0.1,::1\n" in env
    outcome = await egress_plane.client.execute_tool(
        networked, "bash", {"command": "echo $HTTPS_PROXY $no_proxy", "description": "Show the proxy"})
    assert outcome.output.strip() == "http://127.0.0.1:3128 localhost,127.0.0.1,::1"


async def test_a_session_without_a_policy_has_only_lo_and_reaches_nothing(
    egress_plane: Plane, hosts: tuple[int, list[str]],
) -> None:
    port, seen = hosts
    before = len(seen)
    session = await egress_plane.client.create_session()
    try:
        assert not session.HasField("network")
        code, out = await sh(egress_plane, session.id, "ls /sys/class/net; env | grep -ci proxy || true")
        assert out.split() == ["lo", "0"]
        code, out = await sh(egress_plane, session.id, f"curl -sS --max-time 10 http://web.test:{port}/hello.txt")
        assert code == 6, out  # no DNS in the sandbox: the name does not resolve
        code, out = await sh(egress_plane, session.id, f"curl -sS --max-time 10 http://127.0.0.1:{port}/hello.txt")
        assert code == 7, out
        # Not even the forwarder's port answers, and no proxy socket was made for it.
        code, out = await sh(egress_plane, session.id, "curl -sS --max-time 10 http://127.0.0.1:3128/")
        assert code == 7, out
        provider = egress_plane.plane.sessions._provider
        assert not await asyncio.to_thread(os.path.exists, provider.network_socket(session.sandbox_id))
    finally:
        await egress_plane.client.delete_session(session.id)
    assert len(seen) == before


async def test_a_policy_beyond_the_tenants_cap_or_malformed_is_invalid_argument(egress_plane: Plane) -> None:
    async with AsyncClient(egress_plane.plane.address, "token-closed") as closed:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await closed.create_session(network_allow=["web.test"])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "web.test" in (refused.value.details() or "")
    for asked, named in ((["web.test", "evil.example"], "evil.example"), (["127.0.0.0/8"], "127.0.0.0/8"),
                         (["bad host!"], "bad host!"), (["web.test:99999"], "web.test:99999")):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await egress_plane.client.create_session(network_allow=asked)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, asked
        assert named in (refused.value.details() or ""), refused.value.details()
    listed = await egress_plane.client.list_sessions()
    assert all(s.network.allow_hosts != ["web.test", "evil.example"] for s in listed)  # nothing was made


async def test_deleting_a_session_closes_its_proxy(egress_plane: Plane, hosts: tuple[int, list[str]]) -> None:
    port, _ = hosts
    session = await egress_plane.client.create_session(network_allow=["web.test"])
    assert list(session.network.allow_hosts) == ["web.test"]
    provider = egress_plane.plane.sessions._provider
    socket = provider.network_socket(session.sandbox_id)
    assert await asyncio.to_thread(os.path.exists, socket)
    code, out = await sh(egress_plane, session.id, f"curl -sS --max-time 30 http://web.test:{port}/hello.txt")
    assert code == 0, out
    await egress_plane.client.delete_session(session.id)
    assert not await asyncio.to_thread(os.path.exists, socket)


async def test_a_restarted_plane_restarts_an_adopted_sessions_proxy(hosts: tuple[int, list[str]]) -> None:
    port, _ = hosts
    data_dir, instance = short_tmp(), new_instance("egr")
    provider: dict[str, Any] = {"type": "docker"}
    if os.environ.get("OCSB_TEST_IMAGE"):
        provider["image"] = os.environ["OCSB_TEST_IMAGE"]
    settings = load_settings(None, data_dir=data_dir, instance=instance, provider=provider, tenants=TENANTS,
                             egress=EGRESS, pool={"size": 0}, server={"listen": "127.0.0.1:0"})
    fetch = f"curl -sS --max-time 30 http://web.test:{port}/hello.txt"
    plane = await app.start(settings)
    try:
        async with AsyncClient(plane.address, "token-acme") as client:
            session = await client.create_session(network_allow=["web.test"])
            assert (await client.run(session.id, command=fetch)).stdout == b"hello from the test host\n"
        await app.stop(plane)
        plane = await app.start(settings)
        async with AsyncClient(plane.address, "token-acme") as client:
            assert (await client.get_session(session.id)).state == session_pb2.Session.READY
            done = await client.run(session.id, command=fetch)
            assert done.stdout == b"hello from the test host\n", done.stderr
            await client.delete_session(session.id)
    finally:
        await app.stop(plane)
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)


async def test_gvisor_sandboxes_reach_the_proxy_too(egress_plane: Plane, hosts: tuple[int, list[str]]) -> None:
    if (why := await asyncio.to_thread(runsc_missing)) is not None:
        pytest.skip(why)
    port, _ = hosts
    async with AsyncClient(egress_plane.plane.address, "token-gvisor") as gvisor:
        session = await gvisor.create_session(network_allow=["web.test"])
        try:
            # gVisor's /sys/class/net cannot be listed here: its interfaces are asked of its own netstack.
            code, out = await sh(egress_plane, session.id, f"curl -sS --max-time 30 http://web.test:{port}/hello.txt; "
                                 "python3 -c 'import socket; print(*[n for _, n in socket.if_nameindex()])'", gvisor)
            assert (code, out) == (0, "hello from the test host\nlo\n")
        finally:
            await gvisor.delete_session(session.id)
