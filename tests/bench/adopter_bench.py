"""The adopter's front ends: the CLI's start and the MCP front end's overhead.

* ``cli --help`` and ``cli session list`` -- wall time of ``python -m controlplane ...`` as a subprocess (a
  new interpreter each time, as a shell runs it), beside ``python -c pass``: the interpreter's own floor.
  The target is 0.3 s on a quiet machine.
* ``tools/call read`` over MCP -- the official SDK's client calling ``read`` of a five-line file through the
  control plane's streamable HTTP endpoint and through ``controlplane mcp`` on stdio (each connection made
  once, then timed calls), beside the same call over gRPC (``AsyncClient.execute_tool``).

Run alone: ``.venv/bin/python -m tests.bench.adopter_bench [--quick]``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from tests.bench.bench_common import BENCH_FILE, BENCH_TEXT, IMAGE, Row, percentile

CLI_SAMPLES = 20
CALL_SAMPLES = 200
WARMUP = 10
CLI_TARGET_MS = 300.0


def run_argv(argv: list[str], env: dict[str, str]) -> float:
    # subprocess.run (vfork) on a thread: a fork of the whole bench process would slow every sample down.
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, check=False)
    elapsed = (time.perf_counter() - start) * 1000.0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode(errors='replace')}")
    return elapsed


async def cli_rows(plane: app.ControlPlane, token: str, samples: int) -> list[Row]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update(CONTROLPLANE_TARGET=plane.address, CONTROLPLANE_TOKEN=token)
    rows = []
    for name, argv in (("baseline: python -c pass", [sys.executable, "-c", "pass"]),
                       ("cli --help", [sys.executable, "-m", "controlplane", "--help"]),
                       ("cli session list", [sys.executable, "-m", "controlplane", "session", "list"])):
        await asyncio.to_thread(run_argv, argv, env)  # the page cache warmed
        rows.append(Row(name, [await asyncio.to_thread(run_argv, argv, env) for _ in range(samples)]))
    return rows


async def timed_calls(call: Any, samples: int) -> list[float]:
    for _ in range(WARMUP):
        await call()
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        await call()
        out.append((time.perf_counter() - start) * 1000.0)
    return out


async def call_rows(plane: app.ControlPlane, token: str, session_id: str, samples: int) -> list[Row]:
    # Two argument sets in turn: three identical calls in a row would ask `doom_loop` (upstream's rule).
    variants: list[dict[str, Any]] = [{"filePath": BENCH_FILE}, {"filePath": BENCH_FILE, "offset": 1}]
    turn = [0]

    def args() -> dict[str, Any]:
        turn[0] += 1
        return variants[turn[0] % 2]

    rows = []
    async with AsyncClient(plane.address, token) as grpc_client:
        async def over_grpc() -> None:
            outcome = await grpc_client.execute_tool(session_id, "read", args())
            assert outcome.result is not None
            assert "line 1" in outcome.result.output

        rows.append(Row("baseline: read over gRPC (execute_tool)", await timed_calls(over_grpc, samples)))

    asked: list[str] = []

    async def accept(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        # None expected (see `variants`); were one asked, it is answered as the gRPC row's default answers it.
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={})

    async def over(client: Client) -> None:
        result = await client.call_tool("read", args())
        assert not result.is_error, result.content

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    url = f"http://{plane.mcp_http.address}/mcp/{session_id}"
    async with http, Client(streamable_http_client(url, http_client=http),
                                  elicitation_callback=accept) as client:
        rows.append(Row("MCP tools/call read (streamable HTTP)", await timed_calls(lambda: over(client), samples)))
    env = {**os.environ, "CONTROLPLANE_TARGET": plane.address, "CONTROLPLANE_TOKEN": token}
    stdio = StdioServerParameters(command=sys.executable, args=["-m", "controlplane", "mcp", session_id], env=env)
    async with Client(stdio, elicitation_callback=accept) as client:
        rows.append(Row("MCP tools/call read (stdio)", await timed_calls(lambda: over(client), samples)))
    if asked:
        rows.append(Row(f"(MCP: {len(asked)} asks answered in the calls, e.g. {asked[0]!r})", []))
    return rows


async def section(quick: bool) -> list[str]:
    cli_samples, call_samples = (5, 40) if quick else (CLI_SAMPLES, CALL_SAMPLES)
    data_dir = Path(tempfile.mkdtemp(prefix="oca", dir="/tmp"))
    instance = f"bench-{secrets.token_hex(4)}-a"
    settings = load_settings(None, data_dir=data_dir, instance=instance, pool={"size": 1},
                             provider={"type": "docker", "image": os.environ.get("OCSB_TEST_IMAGE", IMAGE)},
                             server={"listen": "127.0.0.1:0", "mcp_listen": "127.0.0.1:0"})
    plane = await app.start(settings)
    token = settings.token_file.read_text().strip()
    lines = [f"CLI: {cli_samples} runs each (a new interpreter per run); calls: {call_samples} after {WARMUP}"]
    try:
        rows = await cli_rows(plane, token, cli_samples)
        async with AsyncClient(plane.address, token) as client:
            session = await client.create_session()
            await client.run(session.id, ["sh", "-c", 'printf "%s" "$1" > "$2"', "sh", BENCH_TEXT, BENCH_FILE])
            try:
                rows += await call_rows(plane, token, session.id, call_samples)
            finally:
                await client.delete_session(session.id)
    finally:
        await app.stop(plane)
        from tests.planes import remove_instance_leftovers

        remove_instance_leftovers(instance)
    for row in rows:
        if not row.samples_ms:
            lines.append(row.name)
            continue
        lines.append(f"{row.name:<42} p50 {percentile(row.samples_ms, 50):8.2f} ms  "
                     f"p99 {percentile(row.samples_ms, 99):8.2f} ms")
    floor = percentile(rows[0].samples_ms, 50)
    for row in rows[1:3]:
        p50 = percentile(row.samples_ms, 50)
        verdict = "PASS" if p50 <= CLI_TARGET_MS else "FAIL (a busy machine inflates it: compare with the floor)"
        lines.append(f"{row.name}: p50 {p50:.0f} ms, {p50 - floor:.0f} ms over python's own start; "
                     f"target <= {CLI_TARGET_MS:.0f} ms: {verdict}")
    return lines


if __name__ == "__main__":
    from sandbox_agent import event_loop

    for line in event_loop.run(section("--quick" in sys.argv)):
        print(line)
