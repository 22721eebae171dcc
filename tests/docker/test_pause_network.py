"""Pause and resume of a session with a network policy, on Docker sandboxes: the pause stops the session's proxy
with its container, the resume opens it again for the new container (a pooled one, made without any network), and
the policy is the one the session was created with: its host is reached again, any other is still refused.

The only server is one the test starts on 127.0.0.1; the operator config allows 127.0.0.1/32 and maps the test's
names to it (`[egress] hosts`), as in test_egress_sandbox.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import session_pb2
from tests.docker import egress_servers
from tests.planes import Plane, instance_containers, served_plane, short_tmp, tenant_clients

pytestmark = pytest.mark.docker

# The tenant's cap allows both names: only the session's own policy keeps other.test out, so the refusal after
# the resume shows that the policy came back, not that the cap caught it.
TENANTS: list[dict[str, Any]] = [{"name": "acme", "token": "pnet-acme", "egress": {"allow_hosts": ["*.test"]}}]
EGRESS = {"allow_cidrs": ["127.0.0.1/32"], "hosts": {"web.test": "127.0.0.1", "other.test": "127.0.0.1"}}
# A pool of one: the resume claims a warm container that was made with no network at all.
plane = served_plane("docker", tenants=TENANTS, egress=EGRESS, pool={"size": 1})
clients = tenant_clients(TENANTS)


@pytest.fixture(scope="module")
def host() -> Iterator[tuple[int, list[str]]]:
    """One HTTP server on the host's 127.0.0.1 serving hello.txt; yields its port and its request log."""
    root = short_tmp()
    (root / "hello.txt").write_text("hello from the test host\n")
    try:
        with egress_servers.http_server(root) as served:
            yield served
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _sh(client: AsyncClient, session_id: str, command: str) -> tuple[int, str]:
    done = await client.run(session_id, command=command, merge_stderr=True, timeout_ms=60_000)
    return done.exit_code, done.stdout.decode(errors="replace")


def _socket_exists(plane: Plane, sandbox_id: str) -> bool:
    return os.path.exists(plane.plane.sessions._provider.network_socket(sandbox_id))


async def _pooled_sandbox(plane: Plane, client: AsyncClient) -> str:
    """The id of the warm container the pool holds now (waiting for the pool to refill): the instance's one
    container no session runs on (a claimed warm container keeps the labels it was made with)."""
    for _ in range(240):
        taken = {s.sandbox_id for s in await client.list_sessions()}
        pooled = [c.labels["ocsb.sandbox"] for c in await asyncio.to_thread(instance_containers, plane.instance)
                  if c.status == "running" and c.labels.get("ocsb.sandbox") not in taken | {None}]
        if len(pooled) == 1:
            return str(pooled[0])
        await asyncio.sleep(0.5)
    raise AssertionError("the pool did not refill")


async def _fetch_works(client: AsyncClient, session_id: str, port: int) -> None:
    code, out = await _sh(client, session_id, f"curl -sS --max-time 30 http://web.test:{port}/hello.txt")
    assert (code, out) == (0, "hello from the test host\n")
    code, out = await _sh(client, session_id, "python3 -c \"import urllib.request as u; print(u.urlopen("
                          f"'http://web.test:{port}/hello.txt', timeout=30).read().decode(), end='')\"")
    assert (code, out) == (0, "hello from the test host\n")


async def _other_refused(client: AsyncClient, session_id: str, port: int, seen: list[str]) -> None:
    before = len(seen)
    code, out = await _sh(client, session_id, f"curl -sS -i --max-time 30 http://other.test:{port}/hello.txt")
    assert code == 0, out
    assert out.startswith("HTTP/1.1 403"), out
    assert "not in this session's network policy" in out
    code, out = await _sh(client, session_id, f"curl -sS --max-time 30 https://other.test:{port}/")
    assert code != 0
    assert "403" in out  # the CONNECT was refused
    # And no way around the proxy: the host's listener is not on the sandbox's own loopback.
    code, out = await _sh(client, session_id, f"curl -sS --noproxy '*' --max-time 10 http://127.0.0.1:{port}/")
    assert code == 7, out
    assert len(seen) == before  # none of them reached the test host


async def test_a_resumed_session_gets_its_network_back_and_only_its_network(
    plane: Plane, clients: dict[str, AsyncClient], host: tuple[int, list[str]]
) -> None:
    port, seen = host
    acme = clients["acme"]
    session = await acme.create_session(network_allow=["web.test"])
    assert list(session.network.allow_hosts) == ["web.test"]
    await _fetch_works(acme, session.id, port)
    await _other_refused(acme, session.id, port, seen)
    assert await asyncio.to_thread(_socket_exists, plane, session.sandbox_id)

    pooled = await _pooled_sandbox(plane, acme)
    paused = await acme.pause(session.id)
    assert paused.state == session_pb2.Session.PAUSED
    assert list(paused.network.allow_hosts) == ["web.test"]
    # The proxy went with the container: nothing is left listening for a sandbox that no longer exists.
    assert not await asyncio.to_thread(_socket_exists, plane, session.sandbox_id)

    resumed = await acme.resume(session.id)
    assert resumed.state == session_pb2.Session.READY
    assert resumed.sandbox_id == pooled  # the warm container, which had no network until the resume
    assert list(resumed.network.allow_hosts) == ["web.test"]
    assert await asyncio.to_thread(_socket_exists, plane, resumed.sandbox_id)

    _, env = await _sh(acme, session.id, "env")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert f"{name}=http://127.0.0.1:3128\n" in env, env
    outcome = await acme.execute_tool(session.id, "bash", {"command": "echo $HTTP_PROXY", "description": "Proxy"})
    assert outcome.output.strip() == "http://127.0.0.1:3128"
    requests_before = len(seen)
    await _fetch_works(acme, session.id, port)
    assert seen[requests_before:] == [f"GET /hello.txt Host=web.test:{port}"] * 2
    await _other_refused(acme, session.id, port, seen)

    # A second round trip works the same (the first resume's proxy is closed by the second pause).
    second = await acme.pause(session.id)
    assert not await asyncio.to_thread(_socket_exists, plane, resumed.sandbox_id)
    assert second.state == session_pb2.Session.PAUSED
    again = await acme.resume(session.id)
    await _fetch_works(acme, session.id, port)
    await _other_refused(acme, session.id, port, seen)
    await acme.delete_session(session.id)
    assert not await asyncio.to_thread(_socket_exists, plane, again.sandbox_id)


async def test_a_session_without_a_policy_still_has_no_network_after_a_resume(
    plane: Plane, clients: dict[str, AsyncClient], host: tuple[int, list[str]]
) -> None:
    port, seen = host
    acme = clients["acme"]
    session = await acme.create_session()
    await acme.pause(session.id)
    resumed = await acme.resume(session.id)
    assert not resumed.HasField("network")
    assert not await asyncio.to_thread(_socket_exists, plane, resumed.sandbox_id)
    before = len(seen)
    code, out = await _sh(acme, session.id, "ls /sys/class/net; env | grep -ci proxy || true")
    assert out.split() == ["lo", "0"]
    code, out = await _sh(acme, session.id, f"curl -sS --max-time 10 http://web.test:{port}/hello.txt")
    assert code == 6, out  # no DNS, no proxy
    code, out = await _sh(acme, session.id, "curl -sS --max-time 10 http://127.0.0.1:3128/")
    assert code == 7, out  # not even the forwarder's port answers
    assert len(seen) == before
