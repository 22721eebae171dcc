"""A brokered credential on real containers (issue 24, part 3): a tool's HTTPS request to a host with a
credential reaches the test's server with the header the proxy added, while the sandbox's environment, its files
and the tool's output never hold the secret. The server is the test's own, on 127.0.0.1, with a certificate from
the test's CA (the operator's `egress.upstream_ca`); the sandbox trusts the session's CA, which the agent writes
into it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.planes import Plane, running_plane
from tests.unit.egress_tls import SECRET, LoopbackCa, Seen, Upstream

pytestmark = pytest.mark.docker

HOST = "secure.test"
TOKEN = SECRET.split()[1]  # the secret part of "Bearer <token>"


async def _whoami(seen: Seen, writer: object) -> bool:
    authorized = seen.header("authorization") == [SECRET]
    body = b"authorized\n" if authorized else b"no credential\n"
    status = "200 OK" if authorized else "401 Unauthorized"
    writer.write(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)  # type: ignore[attr-defined]
    return True


@pytest.fixture(name="setup")
async def setup_fixture(tmp_path: Path) -> AsyncIterator[tuple[Plane, Upstream]]:
    ca = LoopbackCa(tmp_path)
    async with Upstream(ca.server_context(HOST), {"/whoami": _whoami}) as upstream:
        egress = {"allow_cidrs": ["127.0.0.1/32"], "hosts": {HOST: "127.0.0.1"}, "upstream_ca": str(ca.ca_file),
                  "credentials": [{"host": HOST, "header": "Authorization", "value": SECRET}]}
        tenants = [{"name": "acme", "token": "token-acme", "egress": {"allow_hosts": ["*.test"]}}]
        async with running_plane("docker", tenants=tenants, egress=egress, pool={"size": 0}) as plane:
            yield plane, upstream


async def test_a_brokered_credential_reaches_the_server_and_never_the_sandbox(
    setup: tuple[Plane, Upstream],
) -> None:
    plane, upstream = setup
    client = plane.client
    session = await client.create_session(network_allow=[HOST], config_json=json.dumps({"permission": "allow"}))
    try:
        url = f"https://{HOST}:{upstream.port}/whoami"
        done = await client.run(session.id, command=f"curl -sS --max-time 30 {url}", timeout_ms=60_000)
        assert (done.exit_code, done.stdout.decode()) == (0, "authorized\n"), done.stderr
        done = await client.run(session.id, command="python3 -c \"import urllib.request as u; print(u.urlopen("
                                f"'{url}', timeout=30).read().decode(), end='')\"", timeout_ms=60_000)
        assert (done.exit_code, done.stdout.decode()) == (0, "authorized\n"), done.stderr
        assert [s.header("authorization") for s in upstream.seen] == [[SECRET], [SECRET]]
        # The model's view: a verbose curl through the bash tool shows the request headers curl sent.
        outcome = await client.execute_tool(session.id, "bash", {
            "command": f"curl -sv --max-time 30 {url} 2>&1; env", "description": "Fetches through the proxy"})
        assert outcome.error is None, outcome.error
        assert "authorized" in (outcome.output or "")
        assert TOKEN not in json.dumps([outcome.output, str(outcome.events)])
        # Nowhere in the sandbox: its environment, and every file the tool user can read where files are written.
        done = await client.run(session.id, command=(
            f"env | grep -c {TOKEN}; grep -rsl {TOKEN} /tmp /workspace /home /run /var /etc /opt 2>/dev/null | head"
        ), timeout_ms=120_000)
        assert done.stdout.decode().split() == ["0"], done.stdout.decode()
    finally:
        await client.delete_session(session.id)
