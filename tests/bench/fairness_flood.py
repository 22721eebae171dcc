"""Tenant A's floods for the fairness bench (tests/bench/fairness_bench.py), run in a process of their own so
that building and sending them costs the bench process nothing: what tenant B sees is the control plane's doing.

    python -m tests.bench.fairness_flood KIND TARGET TOKEN ARGS_LIMIT

Prints `ready` once the flood runs, floods until SIGTERM, then deletes the sessions it made and prints one
JSON line of counts (what succeeded, what was refused and with which status).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import signal
import sys
import tarfile
from collections import Counter
from collections.abc import Awaitable, Callable

import grpc

from controlplane.client import AsyncClient, allow_once
from sandbox_agent import event_loop
from tests.unit.test_archive_stream import gzip_of_zeros, header

KINDS = ("creates", "calls", "archive bombs", "huge arguments", "refused calls")
HUGE = 512 << 20
CREATE_WORKERS = 6
"""Above tenant A's session quota (fairness_bench.A_QUOTA), so it keeps running into it."""
CALL_WORKERS = 12
"""Above tenant A's calls quota."""
BOMB_WORKERS = 4
ARGS_WORKERS = 4
REFUSED_WORKERS = 50
"""Far above the calls quota of the tenant flooding refused calls (fairness_bench.REFUSED_CALLS): almost every
call is refused, and each worker retries at once."""


def bombs() -> list[bytes]:
    """Small CreateSession archives declaring far more than the control plane may hold: a PAX header of
    512 MiB, a GNU long name of 512 MiB, and gzip inside gzip (each about half a MiB on the wire)."""
    pax = gzip_of_zeros(header(tarfile.XHDTYPE, HUGE), HUGE)
    long_name = gzip_of_zeros(header(tarfile.GNUTYPE_LONGNAME, HUGE, "././@LongLink"), HUGE)
    nested = gzip.compress(pax, compresslevel=1)
    return [pax, long_name, nested]


def huge_todos(limit: int) -> Callable[[int], str]:
    """Arguments just under `limit` bytes of small todo items (what costs validation most per byte); each call
    differs in its first item, since identical calls in a row would be asked about as a doom loop."""
    item = '{"content": "t%06d", "status": "pending", "priority": "high"}'
    one = len(item % 0) + 2
    body = ", ".join(item % i for i in range((limit - 256) // one))

    def make(n: int) -> str:
        return f'{{"todos": [{{"content": "call {n}", "status": "pending", "priority": "high"}}, {body}]}}'

    return make


async def flood(kind: str, target: str, token: str, args_limit: int) -> dict[str, int]:
    client = AsyncClient(target, token)
    counts: Counter[str] = Counter()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    made: list[str] = []

    async def attempt(name: str, call: Callable[[], Awaitable[object]]) -> None:
        try:
            await call()
            counts[f"{name} ok"] += 1
        except grpc.aio.AioRpcError as exc:
            counts[f"{name} {exc.code().name}"] += 1

    async def worker(name: str, call: Callable[[int], Awaitable[object]], index: int) -> None:
        n = index * 1_000_000
        while not stop.is_set():
            n += 1
            await attempt(name, lambda n=n: call(n))  # type: ignore[misc]

    async def create_and_delete(_: int) -> None:
        session = await client.create_session()
        await client.delete_session(session.id)

    calls: list[Callable[[int], Awaitable[object]]]
    if kind == "creates":
        name, calls = "create", [create_and_delete] * CREATE_WORKERS
    elif kind == "calls":
        sessions = [(await client.create_session()).id for _ in range(2)]
        made += sessions

        def bash(i: int) -> Callable[[int], Awaitable[object]]:
            return lambda _: client.execute_tool(sessions[i % 2], "bash", {"command": "echo flood", "description": "F"},
                                                     on_permission=allow_once)
        name, calls = "bash call", [bash(i) for i in range(CALL_WORKERS)]
    elif kind == "refused calls":
        sessions = [(await client.create_session()).id for _ in range(2)]
        made += sessions

        def refused(i: int) -> Callable[[int], Awaitable[object]]:
            return lambda _: client.execute_tool(sessions[i % 2], "bash", {"command": "echo flood", "description": "F"},
                                                 on_permission=allow_once)
        name, calls = "bash call", [refused(i) for i in range(REFUSED_WORKERS)]
    elif kind == "archive bombs":
        archives = await asyncio.to_thread(bombs)

        def bomb(i: int) -> Callable[[int], Awaitable[object]]:
            return lambda _: client.create_session(workspace_archive=archives[i % len(archives)])
        name, calls = "bomb create", [bomb(i) for i in range(BOMB_WORKERS)]
    elif kind == "huge arguments":
        session = (await client.create_session()).id
        made.append(session)
        make = await asyncio.to_thread(huge_todos, args_limit)
        def todowrite(n: int) -> Awaitable[object]:
            return client.execute_tool(session, "todowrite", make(n), on_permission=allow_once)
        name, calls = "todowrite", [todowrite] * ARGS_WORKERS
    else:
        raise SystemExit(f"unknown flood {kind!r}; one of {', '.join(KINDS)}")
    tasks = [asyncio.ensure_future(worker(name, call, i)) for i, call in enumerate(calls)]
    print("ready", flush=True)
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for session in made:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await client.delete_session(session)
    for live in await client.list_sessions():  # a create that was cut off by the cancel, already in the store
        with contextlib.suppress(grpc.aio.AioRpcError):
            await client.delete_session(live.id)
    await client.close()
    return dict(counts)


def main() -> None:
    kind, target, token, limit = sys.argv[1:5]
    print(json.dumps(event_loop.run(flood(kind, target, token, int(limit)))), flush=True)


if __name__ == "__main__":
    main()
