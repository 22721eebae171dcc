"""The argument worker's memory limit (limits.arg_worker_memory_mb), through the public API: a call whose
arguments need more than the worker may hold fails with the limit named, and only that call: another
tenant's large call at the same time, and the same tenant's next one, are served."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from controlplane.client import AsyncClient
from tests.planes import served_plane, tenant_clients

TENANTS: list[dict[str, Any]] = [
    {"name": "heavy", "token": "token-heavy-worker"},
    {"name": "light", "token": "token-light-worker"},
]

plane = served_plane("local", tenants=TENANTS, pool={"size": 0},
                     limits={"max_args_bytes": 16 * 1024 * 1024, "arg_worker_memory_mb": 100})
clients = tenant_clients(TENANTS)


def todos(n: int, first: str) -> str:
    items = [{"content": f"{first} {i:06d}", "status": "pending", "priority": "high"} for i in range(n)]
    return json.dumps({"todos": items})


async def test_arguments_past_the_workers_memory_fail_that_call_only(clients: dict[str, AsyncClient]) -> None:
    heavy, light = clients["heavy"], clients["light"]
    big_session = await heavy.create_session()
    small_session = await light.create_session()
    huge = todos(200_000, "huge")  # about 12 MiB: some 150 MiB once parsed, past the worker's 100
    assert len(huge) > 10 * 1024 * 1024
    failing = asyncio.ensure_future(heavy.execute_tool(big_session.id, "todowrite", huge))
    served = await light.execute_tool(small_session.id, "todowrite", todos(3000, "light"))
    failed = await failing
    assert served.ok, served.error
    assert failed.error is not None
    assert "more memory than the argument worker may use (100 MiB, limits.arg_worker_memory_mb)" in failed.error
    after = await heavy.execute_tool(big_session.id, "todowrite", todos(3000, "after"))
    assert after.ok, after.error
    assert after.result is not None
    assert after.result.title == "3000 todos"
