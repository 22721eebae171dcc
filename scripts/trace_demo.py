"""`make trace-demo`: a control plane exporting OTLP/gRPC to a real collector (rotel) on loopback, one
session in a real sandbox with a deliberately slow custom tool, and the received trace printed as a tree."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import docker

from controlplane.client import AsyncClient
from scripts.trace_demo_receiver import ExportedSpan, Rotel

REPO = Path(__file__).resolve().parent.parent
SLOW_TS = """import { tool } from "@opencode-ai/plugin"

// The module's top level takes ~1.5 s: that is the tool's init, traced inside the sandbox.
await new Promise((resolve) => setTimeout(resolve, 1500))

export default tool({
  description: "Answers after a slow start",
  args: { word: tool.schema.string().describe("what to say") },
  async execute(args) { return `slow says ${args.word}` },
})
"""


def workspace() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = SLOW_TS.encode()
        info = tarfile.TarInfo(".opencode/tool/slow.ts")
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def start_plane(data_dir: Path, instance: str, endpoint: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
        "CONTROLPLANE_DATA_DIR": str(data_dir), "CONTROLPLANE_INSTANCE": instance,
        "CONTROLPLANE_SERVER__LISTEN": "127.0.0.1:0", "CONTROLPLANE_POOL__SIZE": "0",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_SERVICE_NAME": "ocsandbox-trace-demo",
    }
    with (data_dir / "serve.log").open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "controlplane", "serve"], env=env, cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT)


async def wait_for_endpoint(data_dir: Path, process: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 60
    while not (data_dir / "endpoint").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the control plane did not start:\n{(data_dir / 'serve.log').read_text()[-3000:]}")
        await asyncio.sleep(0.05)
    return (data_dir / "endpoint").read_text().strip()


async def drive(address: str, token: str) -> None:
    async with AsyncClient(address, token) as client:
        session = await client.create_session(workspace_archive=workspace())
        print(f"session {session.id} on sandbox {session.sandbox_id}")
        listing = await client.list_tools(session.id)
        slow = next(t for t in listing.tools if t.id == "slow")
        print(f"ListTools: {len(listing.tools)} tools; `slow` took {slow.init_ms:.0f} ms to initialise")
        outcome = await client.execute_tool(session.id, "slow", {"word": "hello"})
        print(f"ExecuteTool slow -> {outcome.output!r}")
        outcome = await client.execute_tool(session.id, "bash", {"command": "echo traced", "description": "Echo"})
        print(f"ExecuteTool bash -> {outcome.output!r}")
        await client.delete_session(session.id)


def print_tree(spans: list[ExportedSpan]) -> None:
    by_id = {s.span_id: s for s in spans}
    kids: dict[str, list[ExportedSpan]] = {}
    for span in spans:
        parent = span.parent_id if span.parent_id in by_id else ""
        kids.setdefault(parent, []).append(span)

    def show(span: ExportedSpan, depth: int) -> None:
        status = "" if span.status_code.endswith("UNSET") else f"  [{span.status_code.removeprefix('STATUS_CODE_')}]"
        outcome = span.attributes.get("sandbox.outcome")
        extra = f"  outcome={outcome}" if outcome is not None else ""
        print(f"{span.duration_s * 1000:9.1f} ms  {'  ' * depth}{span.name}{extra}{status}")
        for child in sorted(kids.get(span.span_id, []), key=lambda s: s.start_ns):
            show(child, depth + 1)

    for root in sorted(kids.get("", []), key=lambda s: s.start_ns):
        show(root, 0)


async def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ocsb-trace-demo-", dir="/tmp"))
    receiver = Rotel(work / "rotel.log")
    receiver.start()
    print(f"rotel (OTLP collector) listening on 127.0.0.1:{receiver.grpc_port} (gRPC) and "
          f"127.0.0.1:{receiver.http_port} (HTTP)")
    instance = f"demo-{secrets.token_hex(4)}"
    plane = start_plane(work, instance, receiver.grpc_endpoint)
    try:
        address = await wait_for_endpoint(work, plane)
        print(f"control plane on {address}, exporting to {receiver.grpc_endpoint}")
        await drive(address, (work / "default.token").read_text().strip())
    finally:
        if plane.poll() is None:
            plane.send_signal(signal.SIGTERM)  # its batch span processor flushes on the way out
            try:
                await asyncio.to_thread(plane.wait, 60)
            except subprocess.TimeoutExpired:
                plane.kill()
                plane.wait()
        for container in docker.from_env().containers.list(all=True, filters={"label": f"ocsb.instance={instance}"},
                                                              ignore_removed=True):
            container.remove(force=True)
        receiver.stop()
    spans = receiver.spans()
    print(f"\n{len(spans)} spans received by the collector (service.name=ocsandbox-trace-demo):\n")
    print_tree(spans)
    print(f"\nThe collector's log of every span, with attributes: {receiver.log_path}")
    print("To see traces in a UI, run Jaeger (README, 'Tracing') and start the platform with")
    print("  OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 OTEL_EXPORTER_OTLP_PROTOCOL=grpc make run")


if __name__ == "__main__":
    asyncio.run(main())
