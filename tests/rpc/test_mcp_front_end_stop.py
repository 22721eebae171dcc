"""The MCP HTTP front end's stop is bounded: a client parked on a permission ask that stops reading its
response (its socket's receive window full) must not keep the control plane from the rest of its stop (a
red-team finding: the stop raised TimeoutError and the warm pool's sandboxes were left behind)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx2

from controlplane.client import AsyncClient
from tests.planes import Plane, served_plane

TENANT = {"name": "mcp", "token": "mcp-stop-token"}
plane = served_plane("local", tenants=[TENANT], server={"mcp_listen": "127.0.0.1:0"})
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
           "MCP-Protocol-Version": "2025-06-18", "Authorization": f"Bearer {TENANT['token']}"}


async def test_a_stalled_client_parked_on_an_ask_does_not_wedge_the_stop(plane: Plane) -> None:
    async with AsyncClient(plane.plane.address, TENANT["token"]) as client:
        session = await client.create_session(config_json=json.dumps({"permission": {"bash": {"*": "ask"}}}))
    served = plane.plane.mcp_http
    assert served is not None
    url = f"http://{served.address}/mcp/{session.id}"
    headers = dict(HEADERS)
    async with httpx2.AsyncClient(timeout=30) as http:
        hello = await http.post(url, headers=headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {"elicitation": {}},
                "clientInfo": {"name": "stalled", "version": "0"}}})
        headers["Mcp-Session-Id"] = hello.headers["mcp-session-id"]
        await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "bash", "arguments": {"command": "touch x", "description": "Touches x"}}}).encode()
    host, _, port = served.address.rpartition(":")
    stalled = socket.create_connection((host, int(port)))
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    request = f"POST /mcp/{session.id} HTTP/1.1\r\nHost: x\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers.items()) + f"Content-Length: {len(body)}\r\n\r\n"
    try:
        stalled.sendall(request.encode() + body)  # and never read: the ask's elicitation waits to be written
        await asyncio.sleep(2)
        started = time.monotonic()
        await asyncio.wait_for(served.stop(), 20)  # raised TimeoutError before the fix
        assert time.monotonic() - started < 15
    finally:
        stalled.close()
    plane.plane.mcp_http = None  # stopped: the plane's own stop must not stop it twice


