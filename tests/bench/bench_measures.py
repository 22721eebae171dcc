"""The measurements behind `make bench`'s core rows: session create, exec, the agent without the public hop,
tool calls, permission evaluation, abort, and the docker and local baselines they are compared with."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import docker

from controlplane.client import AsyncClient, allow_once
from controlplane.core.calls.tool import PermissionAsk
from controlplane.core.permissions import permission
from controlplane.core.permissions.asks import AskScope, PermissionGate
from controlplane.core.seam.messages import CommandSpec, Exited
from controlplane.core.seam.provider import Sandbox
from controlplane.store.sqlite import AuditWriter, SqliteStore
from controlplane.v1 import tool_pb2
from tests.bench.bench_common import (
    ABORT_POLL_S,
    ABORT_STEP_TIMEOUT_S,
    BENCH_TEXT,
    IMAGE,
    RULED_CONFIG,
    timed,
)
from tests.bench.bench_plane import (
    Plane,
    docker_cli,
)

# -- measurements ----------------------------------------------------------------------------------


async def bench_create(p: Plane, n: int, warm: bool) -> tuple[list[float], int]:
    """Create+delete `n` sessions, timing only the create; returns samples and pool misses seen."""
    samples: list[float] = []
    misses = 0
    for _ in range(n):
        if warm:
            await p.wait_pool_full()
        hits_before = p.pool_hits()
        start = time.perf_counter()
        session = await p.client.create_session()
        samples.append((time.perf_counter() - start) * 1000.0)
        if warm and p.pool_hits() != hits_before + 1:
            misses += 1
        await p.client.delete_session(session.id)
    return samples, misses


async def bench_exec(client: AsyncClient, session_id: str, n: int, warmup: int) -> list[float]:
    async def once() -> None:
        result = await client.run(session_id, ["true"])
        if result.exit_code != 0:
            raise RuntimeError(f"`true` exited {result.exit_code}: {result.stderr!r}")

    for _ in range(warmup):
        await once()
    return [await timed(once) for _ in range(n)]


async def bench_agent_direct(p: Plane, sandbox_id: str, n: int, warmup: int) -> tuple[list[float], list[float]]:
    """Diagnostics: the control plane's own channel to the agent, skipping the public gRPC hop."""
    sandbox = await p.plane.sessions._provider.get(sandbox_id)

    async def health() -> None:
        await sandbox.agent.health()

    async def exec_true() -> None:
        stream = await sandbox.agent.exec(CommandSpec(argv=["true"]))
        async for event in stream.events():
            if isinstance(event, Exited) and event.exit_code != 0:
                raise RuntimeError(f"`true` exited {event.exit_code} in the agent")

    for _ in range(warmup):
        await health()
        await exec_true()
    return [await timed(health) for _ in range(n)], [await timed(exec_true) for _ in range(n)]


async def bench_docker_exec(container_id: str, n: int) -> list[float]:
    await docker_cli("exec", container_id, "true")  # warm-up
    return [await timed(lambda: docker_cli("exec", container_id, "true")) for _ in range(n)]


async def bench_dockerpy_exec(container_id: str, n: int) -> list[float]:
    client = await asyncio.to_thread(docker.from_env)
    try:
        container: Any = await asyncio.to_thread(client.containers.get, container_id)

        def run() -> None:
            result = container.exec_run(["true"])
            if result.exit_code != 0:
                raise RuntimeError(f"docker-py exec_run `true` exited {result.exit_code}")

        await asyncio.to_thread(run)  # warm-up
        return [await timed(lambda: asyncio.to_thread(run)) for _ in range(n)]
    finally:
        await asyncio.to_thread(client.close)


async def bench_docker_run(label: str, n: int) -> list[float]:
    args = ("run", "--rm", "--network", "none", "--label", label, "--entrypoint", "true", IMAGE)
    await docker_cli(*args)  # warm-up
    return [await timed(lambda: docker_cli(*args)) for _ in range(n)]


async def bench_tool(client: AsyncClient, session_id: str, tool: str, args: dict[str, Any], expect: str,
                     n: int, warmup: int) -> tuple[list[float], int]:
    """Times whole `execute_tool` calls; returns samples and how many permission requests were answered.

    Each call has its own message id, as each step of a model's turn does: the same call repeated within one
    message is a doom loop, which asks the user from the third time on (that path is the toolpath section's).
    """
    asks = 0
    messages = itertools.count(1)

    async def once() -> None:
        nonlocal asks
        outcome = await client.execute_tool(session_id, tool, args, message_id=f"bench-{next(messages)}",
                                            on_permission=allow_once)
        if outcome.error is not None or expect not in outcome.output:
            raise RuntimeError(f"{tool} tool call went wrong: error={outcome.error!r} result={outcome.result!r}")
        asks += len(outcome.permission_requests)

    for _ in range(warmup):
        await once()
    asks = 0
    return [await timed(once) for _ in range(n)], asks


async def bench_permission(n_eval: int, n_gate: int) -> tuple[list[float], list[float]]:
    """Rule evaluation and a whole allowed ask (rules, approvals, operator policy, audit enqueue)."""
    home = "/tmp/home"
    user = permission.from_config(RULED_CONFIG["permission"], home=home)
    agent = permission.builtin_agents(f"{home}/t", [], f"{home}/p", user, home=home)["build"]
    evaluate = []
    for _ in range(n_eval):
        started = time.perf_counter()
        permission.evaluate("bash", "echo hi", agent.permission)
        evaluate.append((time.perf_counter() - started) * 1000)
    samples = []
    with tempfile.TemporaryDirectory(prefix="ocsb-bench") as tmp:
        store = SqliteStore(Path(tmp) / "audit.db")
        audit = AuditWriter(store)
        gate = PermissionGate(audit=audit)
        scope = AskScope("bench", "ses_bench", "call", "msg", "bash", agent.permission, [])
        ask = PermissionAsk("bash", ["echo hi"], ["echo *"], {})
        for _ in range(n_gate):
            started = time.perf_counter()
            await gate.ask(ask, scope, lambda _: None)
            samples.append((time.perf_counter() - started) * 1000)
        await audit.close()
        store.close()
    return evaluate, samples


async def bench_local_read(path: Path, n: int) -> list[float]:
    """The floor for reading a small file: an in-process read, timed like every other row."""
    def read() -> None:
        with open(path, encoding="utf-8") as f:
            if f.read() != BENCH_TEXT:
                raise RuntimeError("local read returned other content")

    async def once() -> None:
        read()  # blocking on purpose: the baseline is a plain read on the caller's thread

    await once()
    return [await timed(once) for _ in range(n)]


async def bench_docker_cli_exec(container_id: str, argv: list[str], expect: str, n: int) -> list[float]:
    async def once() -> None:
        out = await docker_cli("exec", container_id, *argv)
        if out != expect:
            raise RuntimeError(f"docker exec {argv} printed {out!r}")

    await once()  # warm-up
    return [await timed(once) for _ in range(n)]


async def agent_pgrep(sandbox: Sandbox, pattern: str) -> int:
    """pgrep's exit code inside the sandbox: 0 = a process matches, 1 = none."""
    stream = await sandbox.agent.exec(CommandSpec(argv=["pgrep", "-f", pattern]))
    code: int | None = None
    async for event in stream.events():
        if isinstance(event, Exited):
            code = event.exit_code
    if code is None or code not in (0, 1):
        raise RuntimeError(f"pgrep -f {pattern!r} in the sandbox ended with {code}")
    return code


async def abort_once(client: AsyncClient, sandbox: Sandbox, session_id: str, index: int) -> tuple[float, float]:
    """One abort sample: (ms until no process of the call is left, ms until the call's final event)."""
    # Sleep durations unique to the sample, so a straggler from an earlier sample cannot be mistaken for this one.
    first, second = 600 + 2 * index, 601 + 2 * index
    pattern = f"sleep ({first}|{second})( |$)"  # also matches the `bash -c` parent, whose argv holds the script
    command = f"sleep {first} & sleep {second} & echo ready; wait"
    stream, outbox = client.tool_call(session_id, "bash", {"command": command, "description": "Hang"},
                                      call_id=f"bench-abort-{index}-{secrets.token_hex(4)}")
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    final: list[tuple[float, str]] = []

    async def read() -> None:
        async for event in stream:
            kind = event.WhichOneof("event")
            if kind == "metadata" and "ready" in event.metadata.metadata_json and not ready.done():
                ready.set_result(None)
            elif kind == "permission_request":
                reply = tool_pb2.PermissionReply(request_id=event.permission_request.id,
                                                 reply=tool_pb2.PermissionReply.ONCE)
                outbox.put_nowait(tool_pb2.ExecuteToolRequest(permission_reply=reply))
            elif kind in ("result", "error"):
                final.append((time.perf_counter(), kind))
                return
        raise RuntimeError("the tool call's stream ended without a result or an error")

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait({ready, reader}, timeout=ABORT_STEP_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            if reader.done():
                reader.result()  # raises the reader's error
                raise RuntimeError(f"the hanging bash call ended before printing ready: {final}")
            raise RuntimeError(f"no 'ready' metadata within {ABORT_STEP_TIMEOUT_S:g} s")
        if await agent_pgrep(sandbox, pattern) != 0:
            raise RuntimeError("pgrep in the sandbox does not see the call's sleep processes")
        t0 = time.perf_counter()
        outbox.put_nowait(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="bench")))
        while await agent_pgrep(sandbox, pattern) == 0:
            # The time is taken after the pgrep that saw none, so poll latency only ever adds to the sample.
            if time.perf_counter() - t0 > ABORT_STEP_TIMEOUT_S:
                raise RuntimeError(f"processes of the aborted call still alive after {ABORT_STEP_TIMEOUT_S:g} s")
            await asyncio.sleep(ABORT_POLL_S)
        gone_ms = (time.perf_counter() - t0) * 1000.0
        await asyncio.wait_for(reader, ABORT_STEP_TIMEOUT_S)
        return gone_ms, (final[0][0] - t0) * 1000.0
    finally:
        outbox.put_nowait(None)
        stream.cancel()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader


async def bench_abort(p: Plane, session_id: str, sandbox_id: str, n: int) -> tuple[list[float], list[float]]:
    sandbox = await p.plane.sessions._provider.get(sandbox_id)
    gone: list[float] = []
    result: list[float] = []
    for i in range(n):
        gone_ms, result_ms = await abort_once(p.client, sandbox, session_id, i)
        gone.append(gone_ms)
        result.append(result_ms)
    return gone, result
