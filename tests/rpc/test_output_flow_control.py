"""Flow control of a command's output between the agent and the control plane (sandbox_agent/output_credit.py,
controlplane/sandbox/call_windows.py), with the real agent and with a hostile one serving the framed socket: output
nobody takes stays in the command's pipe (the command blocks on write, it is not killed), an agent ignoring the
window fails only that call, and one stalling inside a frame ends its stream instead of holding it forever."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from controlplane.core.seam.messages import CommandSpec, Exited, Output, Started
from controlplane.errors import SandboxError, SandboxLostError
from controlplane.sandbox import frame_deadline
from controlplane.sandbox.agent_client import GrpcSandboxAgent
from controlplane.sandbox.call_windows import SLACK, WINDOW
from sandbox.v1 import agent_pb2
from sandbox_agent.frames import HEADER, MESSAGE, frame
from sandbox_agent.stdin_credit import FEATURES
from tests.local_agent import local_agent
from tests.planes import short_tmp

LOUD = 64 << 20


def written(pid: int) -> int:
    """What the process wrote so far (its pipe took)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar")


async def test_output_nobody_takes_stays_in_the_commands_pipe_until_it_is_taken() -> None:
    async with local_agent("a.sock") as (client, _, _root):
        stream = await client.exec(CommandSpec(argv=["head", "-c", str(LOUD), "/dev/zero"]))
        events = stream.events()
        started = await anext(events)
        assert isinstance(started, Started)
        await asyncio.sleep(1.5)  # the consumer takes nothing for a while
        shared = client._exec_stream
        assert shared is not None
        (window,) = shared._windows.values()
        assert window.queued <= WINDOW + 128 * 1024  # on main: every byte the command wrote, queued in the plane
        blocked_at = written(started.pid)
        await asyncio.sleep(0.5)
        assert written(started.pid) == blocked_at < 8 << 20  # blocked on write, and alive
        total, exited = 0, None
        async for event in events:
            if isinstance(event, Output):
                total += len(event.data)
            elif isinstance(event, Exited):
                exited = event
        assert total == LOUD
        assert exited is not None
        assert (exited.exit_code, exited.aborted, exited.timed_out) == (0, False, False)


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def hostile_agent(serve: Serve) -> AsyncIterator[tuple[GrpcSandboxAgent, list[agent_pb2.ExecManyRequest]]]:
    """A client of a compromised agent: `serve` answers the plane's ExecMany stream on the framed socket (after
    its OPEN) without reading it; what the plane sends up is collected until it hangs up."""
    root = short_tmp()
    up: list[agent_pb2.ExecManyRequest] = []

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        size, _ = HEADER.unpack(await reader.readexactly(HEADER.size))
        await reader.readexactly(size)

        async def collect() -> None:
            while header := await reader.read(HEADER.size):
                size, _ = HEADER.unpack(header)
                up.append(agent_pb2.ExecManyRequest.FromString(await reader.readexactly(size)))

        collecting = asyncio.ensure_future(collect())
        try:
            # As an agent of this version starts its stream: it says it honours the windows it then ignores.
            writer.write(frame(MESSAGE, agent_pb2.ExecManyEvent(features=FEATURES).SerializeToString()))
            await serve(reader, writer)
            await collecting
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            collecting.cancel()
            writer.close()

    server = await asyncio.start_unix_server(one, str(root / "frames.sock"))
    client = GrpcSandboxAgent(f"unix:{root / 'agent.sock'}", "sbx-hostile")
    try:
        yield client, up
    finally:
        await client.close()
        server.close()
        shutil.rmtree(root, ignore_errors=True)


def output_frame(call: int, size: int) -> bytes:
    event = agent_pb2.ExecManyEvent(call=call)
    event.event.output.stdout = b"x" * size
    return frame(MESSAGE, event.SerializeToString())


@pytest.mark.parametrize("chunk", [64 * 1024, 60 << 20])
async def test_an_agent_ignoring_the_window_fails_the_call_and_the_plane_holds_none_of_it(chunk: int) -> None:
    flood = (WINDOW + SLACK) * 4 // chunk + 2

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(flood):
            writer.write(output_frame(1, chunk))
            await writer.drain()

    async with hostile_agent(serve) as (client, up):
        stream = await client.exec(CommandSpec(argv=["yes"]))
        shared = client._exec_stream
        assert shared is not None
        for _ in range(400):  # the consumer takes nothing; the agent sends on (a 60 MiB frame takes seconds here)
            if not shared._windows:
                break
            await asyncio.sleep(0.05)
        assert not shared._windows  # failed as it overran: nothing of the call is held
        assert all(inbox.qsize() <= 1 for inbox in shared._inboxes.values())
        with pytest.raises(SandboxError, match="sandbox sbx-hostile's agent") as raised:
            await asyncio.wait_for(anext(stream.events()), 5)  # on main: the flood, then a wait without end
        assert not isinstance(raised.value, SandboxLostError)  # the call failed, not the sandbox
        assert any(r.call == 1 and r.cancel for r in up)


async def test_an_agent_stalling_inside_a_frame_ends_its_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frame_deadline, "FRAME_DEADLINE_S", 1.0)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(struct.pack("!IB", 64 << 20, MESSAGE))  # announces 64 MiB, then a byte a tenth of a second
        for _ in range(600):
            writer.write(b"\0")
            await writer.drain()
            await asyncio.sleep(0.1)

    async with hostile_agent(serve) as (client, _):
        began = time.monotonic()
        stream = await client.exec(CommandSpec(argv=["true"]))
        with pytest.raises(SandboxLostError, match=r"sbx-hostile.*UNAVAILABLE.*within 1 s") as raised:
            await asyncio.wait_for(anext(stream.events()), 10)  # on main: held until the drip ends
        assert time.monotonic() - began < 5, raised.value
        shared = client._exec_stream
        assert shared is not None
        assert not shared.open  # a later call opens a new stream instead of waiting behind this one
