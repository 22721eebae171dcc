"""A session's network on the two-node swarm (issue 24): the same policy as on one host. A sandbox on either node
reaches the test's own host through its session's proxy, which runs in the control plane (so 127.0.0.1 in the
policy is this test's loopback); the relay on the sandbox's node carries its egress.sock back over mutual TLS.
A host outside the policy is refused naming it; a session without a policy has no way out at all; a connection
that skips the proxy reaches nothing, as the sandbox's internal overlay has no route out.

Every server here is one the test starts on 127.0.0.1 (or the manager's end of the cluster's veth pair, to show
it is not reached); `[egress] hosts` maps the test's names to 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.v1 import session_pb2
from tests.cluster.support import TENANT_CONSTRAINTS, TOKENS, Cluster, SwarmPlane, free_port, swarm_plane
from tests.cluster.test_swarm import node_of
from tests.docker import egress_servers
from tests.planes import new_instance, short_tmp

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

ALLOW = ["web.test"]
TENANTS: list[dict[str, Any]] = [
    {"name": name, "token": token, "egress": {"allow_hosts": ["*.test"]}} for name, token in TOKENS.items()
]
EGRESS = {"allow_cidrs": ["127.0.0.1/32"], "hosts": {"web.test": "127.0.0.1", "other.test": "127.0.0.1"}}


@pytest.fixture(scope="module")
def web() -> Iterator[tuple[int, list[str]]]:
    root = short_tmp()
    (root / "hello.txt").write_text("hello from the test host\n")
    try:
        with egress_servers.http_server(root) as served:
            yield served
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
async def net_plane(cluster: Cluster) -> AsyncIterator[SwarmPlane]:
    async with swarm_plane(settings={"tenants": TENANTS, "egress": EGRESS}) as p:
        yield p


@pytest.fixture(scope="module")
async def networked(cluster: Cluster, net_plane: SwarmPlane) -> dict[str, str]:
    """A session with a network on each node: alpha's on the manager, beta's on the worker."""
    sessions = {}
    for tenant, node in (("alpha", cluster.manager), ("beta", cluster.worker)):
        session = await net_plane.clients[tenant].create_session(network_allow=ALLOW)
        assert list(session.network.allow_hosts) == ALLOW
        assert node_of(net_plane, session.sandbox_id) == node
        sessions[tenant] = session.id
    return sessions


async def sh(client: AsyncClient, session_id: str, command: str) -> tuple[int, str]:
    done = await client.run(session_id, command=command, merge_stderr=True, timeout_ms=120_000)
    return done.exit_code, done.stdout.decode(errors="replace")


def egress_sock(plane: SwarmPlane, node: str, sandbox_id: str) -> Path:
    root = plane.plane.settings.provider.node_root  # type: ignore[union-attr]
    return Path(root) / node / plane.instance / sandbox_id / "egress.sock"


@pytest.mark.parametrize("tenant", ["alpha", "beta"])
async def test_a_sandbox_on_each_node_reaches_an_allowed_host_through_its_policy(
    net_plane: SwarmPlane, networked: dict[str, str], web: tuple[int, list[str]], tenant: str,
) -> None:
    port, seen = web
    client = net_plane.clients[tenant]
    code, out = await sh(client, networked[tenant], f"curl -sS --max-time 30 http://web.test:{port}/hello.txt")
    assert (code, out) == (0, "hello from the test host\n")
    code, out = await sh(client, networked[tenant], "python3 -c \"import urllib.request as u; print(u.urlopen("
                         f"'http://web.test:{port}/hello.txt', timeout=30).read().decode(), end='')\"")
    assert (code, out) == (0, "hello from the test host\n")
    assert f"GET /hello.txt Host=web.test:{port}" in seen
    # Several at once: each connection is carried on a stream of its own (the link keeps only a few waiting).
    code, out = await sh(client, networked[tenant], "for i in $(seq 12); do curl -sS --max-time 30 "
                         f"http://web.test:{port}/hello.txt -o /tmp/out.$i & done; wait; "
                         "cat /tmp/out.* | sort | uniq -c")
    assert (code, out.split()) == (0, ["12", "hello", "from", "the", "test", "host"])


@pytest.mark.parametrize("tenant", ["alpha", "beta"])
async def test_a_host_outside_the_policy_is_refused_naming_the_policy(
    net_plane: SwarmPlane, networked: dict[str, str], web: tuple[int, list[str]], tenant: str,
) -> None:
    port, seen = web
    before = len(seen)
    client = net_plane.clients[tenant]
    code, out = await sh(client, networked[tenant], f"curl -sS -i --max-time 30 http://other.test:{port}/hello.txt")
    assert code == 0, out
    assert out.startswith("HTTP/1.1 403")
    assert "other.test" in out
    assert "not in this session's network policy" in out
    code, out = await sh(client, networked[tenant], f"curl -sS --max-time 30 https://other.test:{port}/")
    assert code != 0
    assert "403" in out  # the CONNECT was refused
    assert len(seen) == before


@pytest.fixture
def veth_listener(cluster: Cluster) -> Iterator[int]:
    """A listener on the manager's end of the cluster's veth pair: an address the nodes route to."""
    with socket.socket() as s:
        s.bind((cluster.state["HOST_ADDR"], 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("tenant", ["alpha", "beta"])
async def test_a_direct_connection_without_the_proxy_fails(
    cluster: Cluster, net_plane: SwarmPlane, networked: dict[str, str], web: tuple[int, list[str]],
    veth_listener: int, tenant: str,
) -> None:
    port, seen = web
    before = len(seen)
    client = net_plane.clients[tenant]
    code, out = await sh(client, networked[tenant], f"curl -sS --noproxy '*' --max-time 10 http://127.0.0.1:{port}/")
    assert code == 7, out  # the sandbox's own loopback: nothing listens there
    host = cluster.state["HOST_ADDR"]
    code, out = await sh(client, networked[tenant], "python3 -c \"import socket; "
                         f"socket.create_connection(('{host}', {veth_listener}), timeout=5)\"")
    assert code != 0
    assert "Network is unreachable" in out, out
    code, out = await sh(client, networked[tenant], "python3 -c \"print('default' if '00000000' in "
                         "[l.split()[1] for l in open('/proc/net/route').read().splitlines()[1:]] else 'none')\"")
    assert out.strip() == "none"
    # No DNS either: names are the proxy's to resolve (Docker's embedded resolver has no way out of the overlay).
    code, out = await sh(client, networked[tenant], "python3 -c \"import socket; socket.getaddrinfo('web.test', 80)\"")
    assert code != 0
    assert "gaierror" in out
    # The relay's socket is the agent's to open (its dir is 0700 root): a tool has only the forwarder.
    code, out = await sh(client, networked[tenant], "python3 -c \"import socket; "
                         "socket.socket(socket.AF_UNIX).connect('/run/agent/egress.sock')\"")
    assert code != 0
    assert "PermissionError" in out
    assert len(seen) == before


@pytest.mark.parametrize(("tenant", "on_worker"), [("alpha", False), ("beta", True)])
async def test_a_session_without_a_policy_reaches_nothing(
    cluster: Cluster, net_plane: SwarmPlane, networked: dict[str, str], web: tuple[int, list[str]], tenant: str,
    on_worker: bool,
) -> None:
    port, seen = web
    before = len(seen)
    client = net_plane.clients[tenant]
    session = await client.create_session()
    try:
        node = cluster.worker if on_worker else cluster.manager
        assert node_of(net_plane, session.sandbox_id) == node
        code, out = await sh(client, session.id, "env | grep -ci proxy; curl -sS --max-time 10 "
                             f"-x http://127.0.0.1:3128 http://web.test:{port}/hello.txt")
        assert code == 7, out
        assert out.startswith("0\n")  # no proxy variables, and nothing listens where the forwarder would
        code, out = await sh(client, session.id, "ls /sys/class/net; python3 -c \"print('default' if '00000000' in "
                             "[l.split()[1] for l in open('/proc/net/route').read().splitlines()[1:]] else 'none')\"")
        # Besides `lo`, only the session's own internal overlay (the Swarm provider's isolation): no route out.
        assert out.split()[-1] == "none"
        assert "lo" in out.split()
        # No egress.sock on the node for this sandbox, while the networked one on the same node has one.
        assert not egress_sock(net_plane, node, session.sandbox_id).exists()
        networked_sandbox = (await client.get_session(networked[tenant])).sandbox_id
        assert egress_sock(net_plane, node, networked_sandbox).exists()
    finally:
        await client.delete_session(session.id)
    assert len(seen) == before


async def test_the_proxy_goes_with_the_session(cluster: Cluster, net_plane: SwarmPlane,
                                               web: tuple[int, list[str]]) -> None:
    client = net_plane.clients["beta"]
    session = await client.create_session(network_allow=ALLOW)
    sandbox_id = session.sandbox_id
    port, _ = web
    code, out = await sh(client, session.id, f"curl -sS --max-time 30 http://web.test:{port}/hello.txt")
    assert (code, out) == (0, "hello from the test host\n")
    sock = egress_sock(net_plane, cluster.worker, sandbox_id)
    assert sock.exists()
    data_dir = Path(net_plane.plane.settings.data_dir)
    proxy_sock = data_dir / "swarm" / "fwd" / f"{sandbox_id}.egress.sock"
    assert proxy_sock.exists()
    await client.delete_session(session.id)
    assert not sock.exists()
    assert not proxy_sock.exists()


async def test_a_restarted_plane_carries_an_adopted_sessions_network_again(
    cluster: Cluster, web: tuple[int, list[str]],
) -> None:
    """The plane stops (the sandbox lives on; its proxy and link go), a plane with the same data dir adopts the
    session: its proxy and its link to the relay start again, and the sandbox reaches the test host as before."""
    port, _ = web
    data_dir = short_tmp()
    options = {
        "data_dir": data_dir, "instance": new_instance("c"), "server": {"listen": "127.0.0.1:0"},
        "pool": {"size": 0}, "tenants": TENANTS, "egress": EGRESS,
        "provider": {"type": "swarm", "relay_port": free_port(), "watch_interval_s": 0.5,
                     "tenant_constraints": TENANT_CONSTRAINTS,
                     **({"image": os.environ["OCSB_TEST_IMAGE"]} if os.environ.get("OCSB_TEST_IMAGE") else {})},
    }
    plane = await app.start(load_settings(None, **options))
    client = AsyncClient(plane.address, TOKENS["beta"])
    session = await client.create_session(network_allow=ALLOW)
    fetch = f"curl -sS --max-time 30 http://web.test:{port}/hello.txt"
    assert await sh(client, session.id, fetch) == (0, "hello from the test host\n")
    await client.close()
    await app.stop(plane)
    plane = await app.start(load_settings(None, **options))
    client = AsyncClient(plane.address, TOKENS["beta"])
    provider = plane.sessions._provider
    try:
        assert (await client.get_session(session.id)).state == session_pb2.Session.READY
        assert await sh(client, session.id, fetch) == (0, "hello from the test host\n")
        await client.delete_session(session.id)
    finally:
        await client.close()
        await app.stop(plane)
        remove_relay = getattr(provider, "remove_relay", None)
        if remove_relay is not None:
            await remove_relay()
        shutil.rmtree(data_dir, ignore_errors=True)
