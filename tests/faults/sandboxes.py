"""Helpers for fault tests: a session's container, its processes as `ps` sees them inside."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import docker

from controlplane.client import AsyncClient

SLEEP = "sleep 30.25"
"""A command no other test runs, so `ps` inside the sandbox can tell it apart."""


def container_of(instance: str, sandbox_id: str) -> Any:
    engine = docker.from_env()
    found = engine.containers.list(
        all=True, filters={"label": [f"ocsb.instance={instance}", f"ocsb.sandbox={sandbox_id}"]}
    )
    assert len(found) == 1, f"sandbox {sandbox_id} of {instance}: {len(found)} containers"
    return found[0]


def agent_host_pid(container: Any) -> int:
    """The host pid of `python3 -m sandbox_agent` (under docker-init, which is the container's PID 1)."""
    rows = container.top(ps_args="-eo pid,args")["Processes"]
    pids = [int(pid) for pid, args in rows if args.endswith("python3 -m sandbox_agent") and "docker-init" not in args]
    assert len(pids) == 1, rows
    return pids[0]


async def sandbox_processes(client: AsyncClient, session_id: str) -> list[tuple[str, str]]:
    """(state, command line) of every process in the session's sandbox, except the `ps` itself."""
    done = await client.run(session_id, ["ps", "-eo", "stat=,args="])
    assert done.exit_code == 0, done.stderr
    rows = []
    for line in done.stdout.decode().splitlines():
        stat, _, args = line.strip().partition(" ")
        if not args.startswith("ps -eo"):
            rows.append((stat, args.strip()))
    return rows


async def wait_until_running(client: AsyncClient, session_id: str, needle: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(needle in args for _, args in await sandbox_processes(client, session_id)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{needle!r} never ran in {session_id}")


async def wait_until_gone(
    client: AsyncClient, session_id: str, needle: str, timeout_s: float = 5
) -> list[tuple[str, str]]:
    """Waits for every process naming `needle`, and every zombie, to be gone; returns the last process table.

    A killed command's children become zombies for the moment before init reaps them (their name is then
    `[sleep] <defunct>`, without the needle): the wait covers that moment, so a zombie still in the table
    at the deadline is one nothing reaps."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = await sandbox_processes(client, session_id)
        settled = not any(needle in args or stat.startswith("Z") for stat, args in rows)
        if settled or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.05)
