"""The floors under a trivial call: what its gRPC hops and its process cost with no platform code at all.

Rows, each measured in this run:

* ``public hop`` -- a grpc.aio bidirectional call with no work behind it, client and server in one process on
  loopback, shaped as the public calls are: one request, then 2 events (exec `true`: started, exited), 4 (a
  `read`: pending, running, completed, result) or 6 (`bash` adds its two metadata updates).
* ``agent hop`` -- one request and 1, 2 or 3 events on an already open bidirectional stream to a server in
  another process over a Unix socket, as the control plane talks to a sandbox's agent.
* ``process`` -- inside a real sandbox, as the tool user: `posix_spawn` (new session) and wait of
  `/usr/bin/true` and of `/bin/bash -c 'echo hi'`, with nothing else in the way.

A whole call cannot be faster than the sum of its floors (printed last); DESIGN §10's 3 ms is to be read
against them (docs/performance.md). Run alone: ``.venv/bin/python -m tests.bench.floor_bench [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from sandbox_agent import event_loop
from tests.planes import running_plane

PUBLIC_SHAPES = {"exec": 2, "read": 4, "bash": 6}
AGENT_SHAPES = {"exec": 2, "read": 1, "bash": 3}
PROCESS_SHAPES = {"exec": ["/usr/bin/true"], "bash": ["/bin/bash", "-c", "echo hi"]}
SPAWN_SCRIPT = """
import os, statistics, sys, time
argv = sys.argv[1:]
out_r, out_w = os.pipe()
samples = []
for i in range(int(os.environ["ROUNDS"])):
    started = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, {"PATH": "/usr/bin:/bin"}, setsid=True,
                         file_actions=[(os.POSIX_SPAWN_DUP2, out_w, 1)])
    os.waitpid(pid, 0)
    samples.append((time.perf_counter() - started) * 1000)
    os.read(out_r, 65536) if argv[-1] == "echo hi" else None
print(statistics.median(samples[len(samples) // 10:]))
"""


async def _timed(work: Callable[[], Awaitable[object]], calls: int) -> float:
    for _ in range(min(100, calls)):
        await work()
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await work()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _identity(data: bytes) -> bytes:
    return data


async def public_hop(events: int, calls: int) -> float:
    """p50 of one call with `events` events, client and server in this process."""
    import grpc

    payload = b"\x08\x01" * 8

    async def handler(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        await anext(aiter(requests))
        for _ in range(events):
            yield payload

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "floor.Floor", {"Call": grpc.stream_stream_rpc_method_handler(handler, _identity, _identity)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        method = channel.stream_stream("/floor.Floor/Call", request_serializer=_identity,
                                       response_deserializer=_identity)

        async def one() -> None:
            outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
            outbox.put_nowait(payload)

            async def requests() -> AsyncIterator[bytes]:
                while (item := await outbox.get()) is not None:
                    yield item

            received = 0
            async for _ in method(requests(), metadata=(("authorization", "Bearer floor"),)):
                received += 1
                if received == events:
                    break
            outbox.put_nowait(None)

        p50 = await _timed(one, calls)
    await server.stop(None)
    return p50


AGENT_SERVER = """
import asyncio, sys
sys.path.insert(0, sys.argv[2])
from sandbox_agent.grpc_poller import prefer_poller
prefer_poller()
import grpc

async def handler(requests, context):
    async for request in requests:
        for _ in range(request[0]):
            yield b"\\x08\\x01" * 8

async def main():
    server = grpc.aio.server()
    same = lambda data: data
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "floor.Floor", {"Stream": grpc.stream_stream_rpc_method_handler(handler, same, same)}),))
    server.add_insecure_port("unix:" + sys.argv[1])
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()

from sandbox_agent import event_loop
event_loop.run(main())  # the agent's loop
"""


async def agent_hop(shapes: dict[str, int], calls: int) -> dict[str, float]:
    """p50 of one request and N events on an open stream to another process, per shape."""
    import grpc

    folder = tempfile.mkdtemp(prefix="ocsb-floor-", dir="/tmp")
    socket_path = os.path.join(folder, "s")
    agent_root = os.path.join(os.path.dirname(__file__), "..", "..", "sandbox-image")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", AGENT_SERVER, socket_path, agent_root,
                                                stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        await asyncio.wait_for(proc.stdout.readline(), 30)
        async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
            stream = channel.stream_stream("/floor.Floor/Stream", request_serializer=_identity,
                                           response_deserializer=_identity)()
            results = {}
            for name, events in shapes.items():
                async def one(events: int = events) -> None:
                    await stream.write(bytes([events]))
                    for _ in range(events):
                        await stream.read()

                results[name] = await _timed(one, calls)
            stream.cancel()
        return results
    finally:
        proc.kill()
        await proc.wait()
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


async def process_floor(rounds: int) -> dict[str, float]:
    """p50 of spawning and waiting for each shape's program inside a sandbox, as the tool user."""
    async with running_plane("docker", pool={"size": 1, "refill_concurrency": 1}) as plane:
        session = await plane.client.create_session()
        try:
            results = {}
            for name, argv in PROCESS_SHAPES.items():
                done = await plane.client.run(session.id, ["python3", "-c", SPAWN_SCRIPT, *argv],
                                              env={"ROUNDS": str(rounds)})
                if done.exit_code != 0:
                    raise RuntimeError(f"process floor {name}: {done.stderr.decode()}")
                results[name] = float(done.stdout.decode().strip())
            return results
        finally:
            await plane.client.delete_session(session.id)


async def section(quick: bool) -> list[str]:
    calls = 300 if quick else 2000
    public = {name: await public_hop(events, calls) for name, events in PUBLIC_SHAPES.items()}
    agent = await agent_hop(AGENT_SHAPES, calls)
    process = await process_floor(100 if quick else 400)
    header = f"  {'floor':<62} {'p50 ms':>8}"
    lines = ["floors: the hops and the process of a trivial call, with no platform code", header,
             "  " + "-" * (len(header) - 2)]
    for name, events in PUBLIC_SHAPES.items():
        lines.append(f"  {f'public hop, {events} events, in-process ({name})':<62} {public[name]:>8.3f}")
    for name, events in AGENT_SHAPES.items():
        lines.append(f"  {f'agent hop, {events} event(s) on an open stream ({name})':<62} {agent[name]:>8.3f}")
    for name, argv in PROCESS_SHAPES.items():
        lines.append(f"  {'process in the sandbox: ' + ' '.join(argv):<62} {process[name]:>8.3f}")
    lines.append("  sums (no call can be faster than its hops and its process):")
    lines.append(f"    exec true  {public['exec'] + agent['exec'] + process['exec']:.2f} ms    "
                 f"read  {public['read'] + agent['read']:.2f} ms    "
                 f"bash echo  {public['bash'] + agent['bash'] + process['bash']:.2f} ms")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    for line in event_loop.run(section(parser.parse_args().quick)):
        print(line)


if __name__ == "__main__":
    main()
