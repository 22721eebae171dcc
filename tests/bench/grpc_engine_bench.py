"""grpcio's I/O engine: its EventEngine threads (its default) against the poller our processes choose.

The engine is chosen per process when grpc loads (sandbox_agent/grpc_poller.py), so each measurement runs
in a child process of its own: a grpc.aio server and client in one event loop on loopback, calling the
public ``SandboxService.Exec`` shape (one request, two events, the status), as the control plane serves it.
Rows: p50 wall per call and CPU per call (client and server together, from getrusage). Runs alternate
between the engines so a noisy neighbour hits both alike.

Run alone: ``.venv/bin/python -m tests.bench.grpc_engine_bench [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import AsyncIterator

from sandbox_agent import event_loop

ENGINES = {
    "grpcio default (EventEngine threads)": "",
    "our choice (poller, grpc_poller.py)": None,
}
"""GRPC_EXPERIMENTS per row: "" keeps grpcio's default; None leaves it to sandbox_agent.grpc_poller."""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _measure(calls: int) -> dict[str, float]:
    from sandbox_agent.grpc_poller import prefer_poller

    prefer_poller()  # what importing controlplane does, before grpc loads
    import grpc

    from controlplane.v1 import sandbox_pb2, sandbox_pb2_grpc

    class Echo(sandbox_pb2_grpc.SandboxServiceServicer):
        async def Exec(  # noqa: N802 - gRPC method name
            self, request_iterator: AsyncIterator[sandbox_pb2.ExecRequest], context: object,
        ) -> AsyncIterator[sandbox_pb2.ExecEvent]:
            await anext(aiter(request_iterator))
            yield sandbox_pb2.ExecEvent(seq=1, started_pid=1)
            yield sandbox_pb2.ExecEvent(seq=2, exited=sandbox_pb2.ExecExited(exit_code=0))

    server = grpc.aio.server()
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    request = sandbox_pb2.ExecRequest(start=sandbox_pb2.ExecStart(session_id="s", argv=["true"]))

    async def requests() -> AsyncIterator[sandbox_pb2.ExecRequest]:
        yield request

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)

        async def one() -> None:
            events = [event async for event in stub.Exec(requests())]
            if len(events) != 2:
                raise RuntimeError(f"expected 2 events, got {len(events)}")

        for _ in range(min(100, calls)):
            await one()
        samples = []
        started_cpu = _cpu()
        for _ in range(calls):
            started = time.perf_counter()
            await one()
            samples.append((time.perf_counter() - started) * 1000)
        cpu_ms = (_cpu() - started_cpu) / calls * 1000
    await server.stop(None)
    return {"p50": statistics.median(samples), "cpu": cpu_ms}


async def _child(experiments: str | None, calls: int) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("GRPC_EXPERIMENTS", None)
    if experiments is not None:
        env["GRPC_EXPERIMENTS"] = experiments
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.bench.grpc_engine_bench", "--child", str(calls),
        env=env, stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"engine child exited with {proc.returncode}")
    result: dict[str, float] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def section(quick: bool) -> list[str]:
    calls, rounds = (300, 2) if quick else (1000, 3)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in ENGINES}
    for _ in range(rounds):
        for name, experiments in ENGINES.items():
            runs[name].append(await _child(experiments, calls))
    header = f"  {'engine':<40} {'calls':>6} {'p50 ms':>8} {'cpu ms/call':>12}"
    lines = [f"grpc.aio Exec-shaped call, client and server in one process ({rounds} runs each, medians)",
             header, "  " + "-" * (len(header) - 2)]
    figures = {}
    for name, results in runs.items():
        p50 = statistics.median(r["p50"] for r in results)
        cpu = statistics.median(r["cpu"] for r in results)
        figures[name] = (p50, cpu)
        lines.append(f"  {name:<40} {calls * rounds:>6} {p50:>8.3f} {cpu:>12.3f}")
    (base_p50, base_cpu), (ours_p50, ours_cpu) = figures.values()
    lines.append(f"  ratio default/ours: wall {base_p50 / ours_p50:.2f}x, cpu {base_cpu / ours_cpu:.2f}x")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    parser.add_argument("--child", type=int, metavar="CALLS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(event_loop.run(_measure(args.child))))
        return
    for line in event_loop.run(section(args.quick)):
        print(line)


if __name__ == "__main__":
    main()
