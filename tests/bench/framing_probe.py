"""What a lighter framing on the control plane's internal Unix socket would buy, in CPU: a `bash` call's shape on
the agent hop (one request, three events, on a stream already open to another process) carried by a grpc.aio
bidirectional stream and by length-prefixed frames on a plain asyncio Unix stream, both sides counted (the
client's getrusage and the server's threads from /proc schedstat). The server runs the agent's event loop and
gRPC poller setting. Used by `cpu_bench` (docs/performance.md); run alone:
``.venv/bin/python -m tests.bench.framing_probe``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from tests.bench.bench_common import THREADS_CPU

EVENTS = 3
PAYLOAD_BYTES = 160
"""About a RunToolEvent carrying `bash`'s metadata."""

SERVER = """
import asyncio, os, struct, sys
sys.path.insert(0, sys.argv[2])
from sandbox_agent.grpc_poller import prefer_poller
prefer_poller()
import grpc
from sandbox_agent import event_loop

EVENTS, SIZE = int(sys.argv[3]), int(sys.argv[4])
payload = b"x" * SIZE

async def handler(requests, context):
    async for request in requests:
        for _ in range(EVENTS):
            yield payload

async def framed(reader, writer):
    header = struct.Struct("!I")
    try:
        while True:
            size, = header.unpack(await reader.readexactly(4))
            await reader.readexactly(size)
            for _ in range(EVENTS):
                writer.write(header.pack(SIZE) + payload)
            await writer.drain()
    except asyncio.IncompleteReadError:
        writer.close()

async def main():
    server = grpc.aio.server()
    same = lambda data: data
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "floor.Floor", {"Stream": grpc.stream_stream_rpc_method_handler(handler, same, same)}),))
    server.add_insecure_port("unix:" + sys.argv[1] + ".grpc")
    await server.start()
    plain = await asyncio.start_unix_server(framed, sys.argv[1] + ".frames")
    print("ready", flush=True)
    await server.wait_for_termination()

event_loop.run(main())
"""

CLIENT = """
import asyncio, os, resource, shutil, struct, subprocess, sys, tempfile
sys.path.insert(0, sys.argv[1])
from sandbox_agent.grpc_poller import prefer_poller
prefer_poller()
import grpc
from sandbox_agent import event_loop

calls, rounds, server_code = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
EVENTS, SIZE = int(sys.argv[5]), int(sys.argv[6])

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

""" + THREADS_CPU + """
async def main():
    folder = tempfile.mkdtemp(prefix="ocsb-framing-", dir="/tmp")
    path = os.path.join(folder, "s")
    server = subprocess.Popen([sys.executable, "-c", server_code, path, sys.argv[1], str(EVENTS), str(SIZE)],
                              stdout=subprocess.PIPE)
    same = lambda data: data
    request = b"r" * SIZE
    header = struct.Struct("!I")
    try:
        server.stdout.readline()
        channel = grpc.aio.insecure_channel("unix:" + path + ".grpc")
        stream = channel.stream_stream("/floor.Floor/Stream", request_serializer=same, response_deserializer=same)()
        reader, writer = await asyncio.open_unix_connection(path + ".frames")

        async def over_grpc():
            await stream.write(request)
            for _ in range(EVENTS):
                await stream.read()

        async def over_frames():
            writer.write(header.pack(SIZE) + request)
            for _ in range(EVENTS):
                size, = header.unpack(await reader.readexactly(4))
                await reader.readexactly(size)

        async def measure(one):
            started, server_started = cpu(), threads_cpu(server.pid)
            for _ in range(calls):
                await one()
            return (cpu() - started + threads_cpu(server.pid) - server_started) / calls

        for one in (over_grpc, over_frames):
            for _ in range(50):
                await one()
        figures = {"grpc": [], "frames": []}
        for _ in range(rounds):
            figures["grpc"].append(await measure(over_grpc))
            figures["frames"].append(await measure(over_frames))
        stream.cancel()
        writer.close()
        await channel.close()
        print(*(sorted(v)[len(v) // 2] for v in figures.values()))
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)

event_loop.run(main())
"""


def probe(calls: int = 500, rounds: int = 5) -> tuple[float, float]:
    """(grpc stream, length-prefixed frames) CPU seconds per exchange, medians of alternating rounds."""
    agent_root = str(Path(__file__).resolve().parents[2] / "sandbox-image")
    done = subprocess.run([sys.executable, "-c", CLIENT, agent_root, str(calls), str(rounds), SERVER, str(EVENTS),
                           str(PAYLOAD_BYTES)], capture_output=True, check=False, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"framing probe failed: {done.stderr.decode(errors='replace')[-2000:]}")
    grpc_s, frames_s = done.stdout.split()
    return float(grpc_s), float(frames_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    grpc_s, frames_s = probe(args.calls, args.rounds)
    print(f"one request + {EVENTS} events on an open stream, both sides' CPU: grpc.aio {grpc_s * 1e3:.3f} ms, "
          f"length-prefixed frames {frames_s * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
