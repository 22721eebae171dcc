"""Tool uid blocks (controlplane/sandbox/tool_ids.py) across a control plane's SIGKILL and beside another plane."""

from __future__ import annotations

import asyncio

import docker
import pytest

from controlplane.client import AsyncClient
from controlplane.sandbox.layout import LABEL_TOOL_UID
from tests.planes import (
    PlaneProcess,
    new_instance,
    remove_data_dir,
    remove_instance_leftovers,
    running_plane,
    short_tmp,
)

pytestmark = pytest.mark.docker


async def uid_of(client: AsyncClient, session_id: str) -> int:
    return int((await client.run(session_id, ["id", "-u"])).stdout)


def labelled_blocks() -> list[int]:
    """Every block on the engine, whichever control plane made the container."""
    containers = docker.from_env().api.containers(all=True, filters={"label": LABEL_TOOL_UID})
    return [int(c["Labels"][LABEL_TOOL_UID]) for c in containers]


async def test_a_restarted_plane_keeps_its_sandboxes_blocks_and_hands_out_others() -> None:
    data_dir, instance = short_tmp(), new_instance("uid")
    process = PlaneProcess(data_dir, instance, pool_size=1)
    try:
        async with AsyncClient(await process.start(), process.token()) as client:
            kept = await client.create_session()
            before = await uid_of(client, kept.id)
        process.kill()
        async with AsyncClient(await process.start(), process.token()) as client:
            assert await uid_of(client, kept.id) == before  # adopted as it was, label and all
            fresh = await client.create_session()
            assert await uid_of(client, fresh.id) not in (before, 1000)
            await client.delete_session(kept.id)
            await client.delete_session(fresh.id)
        await process.stop()
    finally:
        process.kill()
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)


async def test_two_planes_on_one_engine_never_share_a_block() -> None:
    async with running_plane(pool={"size": 2, "refill_concurrency": 2}) as one, \
            running_plane(pool={"size": 2, "refill_concurrency": 2}) as two:
        made = await asyncio.gather(*(plane.client.create_session() for plane in (one, two) for _ in range(3)))
        uids = await asyncio.gather(*(uid_of(plane.client, s.id) for plane, s in zip(
            [one] * 3 + [two] * 3, made, strict=True)))
        assert len(set(uids)) == 6
        blocks = labelled_blocks()  # pools included, and other planes' sandboxes on this engine
        assert len(blocks) == len(set(blocks))
        assert set(uids) <= set(blocks)
