"""A full disk, table or memory is a tool error, never a lost session (issue 21, item 4).

Each attack runs through the public API on the Docker plane, on runc and on gVisor (`runtime_plane`; the
checks reach into the sandbox with `docker exec`, which gVisor serves too), and then checks the same four
things: the session is still READY, a file written before the attack is still there, a normal call
afterwards succeeds, and the agent's memory stayed bounded (its peak RSS, VmHWM, read from /proc inside
the container as root).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import docker
import grpc
import pytest

from controlplane.client import AsyncClient, Session, ToolOutcome, allow_once
from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.planes import (
    Plane,
    PlaneProcess,
    new_instance,
    remove_data_dir,
    remove_instance_leftovers,
    running_plane,
    short_tmp,
)
from tests.runtimes import RUNTIMES, gvisor_gap, skip_unless_usable
from tests.tool_uids import tool_uid

pytestmark = pytest.mark.docker

OUTPUT_DIR = "/tmp/home/.local/share/opencode/tool-output"
MARKER = "/workspace/before.txt"
AGENT_PEAK_LIMIT_KB = 160 * 1024
"""The agent idles at about 45 MiB; a gigabyte of output must not take it past this."""
HEAVY = bool(os.environ.get("OCSB_ATTACK_SAMPLES"))
"""`make attack` runs the heaviest variants (a full gigabyte); the normal suite a quarter of it."""
NOT_SAVED = "The tool call succeeded but the output was truncated. The full output could not be saved ("


@pytest.fixture(scope="module", params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    """runc, then gVisor under `make attack` only: its half adds about 110 s here, and `make test` already runs
    the resource attacks (test_resources.py) on gVisor (docs/security.md, the gVisor suite)."""
    chosen: str = request.param
    if chosen == "runsc" and not HEAVY:
        pytest.skip("the gVisor half of the exhaustion attacks runs under `make attack` (OCSB_ATTACK_SAMPLES)")
    skip_unless_usable(chosen)
    return chosen


async def bash(client: AsyncClient, session_id: str, command: str, timeout_ms: int = 60_000) -> ToolOutcome:
    # Asks (paths outside the workspace) are approved: the limits, not a prompt, must hold.
    return await client.execute_tool(
        session_id, "bash", {"command": command, "description": "Attack", "timeout": timeout_ms},
        on_permission=allow_once)


def container(plane: Plane, sandbox_id: str) -> Any:
    return docker.from_env().containers.get(f"ocsb-{plane.instance}-{sandbox_id}")


def as_root(plane: Plane, sandbox_id: str, script: str, user: str = "root") -> str:
    result = container(plane, sandbox_id).exec_run(["sh", "-c", script], user=user)
    return bytes(result.output).decode()


def as_tool_user(plane: Plane, sandbox_id: str, script: str) -> str:
    """The saved outputs belong to the tool user (root in the sandbox has no DAC override)."""
    return as_root(plane, sandbox_id, script, user=str(tool_uid(plane.instance, sandbox_id)))


def agent_memory_kb(plane: Plane, sandbox_id: str) -> dict[str, int]:
    """The agent's current and peak RSS (VmRSS, VmHWM) in KiB, and its oom_score_adj."""
    text = as_root(plane, sandbox_id, (
        "p=$(pgrep -xf 'python3 -m sandbox_agent'); grep -E '^(VmRSS|VmHWM):' /proc/$p/status;"
        " echo oom_score_adj: $(cat /proc/$p/oom_score_adj)"))
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        found[key] = int(value.split()[0])
    return found


async def prepared(plane: Plane, *, memory_mb: int = 0, pids: int = 0) -> Session:
    session = await plane.client.create_session(memory_mb=memory_mb, pids=pids)
    made = await bash(plane.client, session.id, f"echo 'work before the attack' > {MARKER}; echo ok")
    assert made.output == "ok\n"
    return session


async def assert_intact(plane: Plane, session: Session) -> None:
    """READY, the earlier file intact, a normal call works, the agent's peak memory bounded."""
    client = plane.client
    assert (await client.get_session(session.id)).state == session_pb2.Session.READY
    after = await bash(client, session.id, f"cat {MARKER}; echo still here")
    assert after.error is None, after.error
    # (bash may add its note that a filesystem is still full)
    assert after.output.startswith("work before the attack\nstill here\n"), after.output
    memory = agent_memory_kb(plane, session.sandbox_id)
    # gVisor's /proc/PID/status has no VmHWM (no peak): there the agent's resident size after the attack.
    assert memory.get("VmHWM", memory["VmRSS"]) < AGENT_PEAK_LIMIT_KB, memory


@pytest.fixture
async def session(runtime_plane: Plane) -> AsyncIterator[Session]:
    made = await prepared(runtime_plane)
    yield made
    await runtime_plane.client.delete_session(made.id)


@pytest.mark.parametrize("lines", [100_000, 300_000], ids=["saved-by-control-plane", "spooled-by-agent"])
async def test_full_tmp_turns_a_truncated_output_inline_and_keeps_the_session(
    runtime_plane: Plane, session: Session, lines: int,
) -> None:
    client = runtime_plane.client
    fill = await bash(client, session.id, "head -c 300M /dev/zero > /tmp/fill; echo rc=$?")
    assert "No space left on device" in fill.output
    # 100,000 lines (about 0.6 MB) travel whole and the control plane's save fails; 300,000 (about 2 MB) are
    # spooled by the agent, whose file cannot be made. Either way: the head and the tail, inline, and a note.
    out = await bash(client, session.id, f"seq 1 {lines}")
    assert out.error is None, out.error
    assert out.output.startswith("1\n2\n3\n")
    assert NOT_SAVED in out.output
    assert "No space left on device" in out.output
    # The tail ends with the command's last lines, then bash's note that /tmp is full.
    assert out.output.endswith(f"\n{lines - 1}\n{lines}\n\n\n<bash_metadata>\nNo space left on device: /tmp is full"
                               " (256 MiB)\n</bash_metadata>")
    assert f"{NOT_SAVED}No space left on device)." in out.output
    assert out.metadata["truncated"] is True
    assert "outputPath" not in out.metadata
    assert len(out.output.encode()) <= 51_200 + 1024
    await assert_intact(runtime_plane, session)
    # Once there is room again, outputs are saved as before.
    again = await bash(client, session.id, f"rm /tmp/fill; seq 1 {lines}")
    assert again.metadata["outputPath"].startswith(OUTPUT_DIR + "/tool_")
    assert NOT_SAVED not in again.output


async def test_full_workspace_fails_the_write_not_the_session(runtime_plane: Plane, session: Session) -> None:
    client = runtime_plane.client
    fill = await bash(client, session.id, "fallocate -l 3G /workspace/fill; echo rc=$?")
    assert "No space left on device" in fill.output
    written = await client.execute_tool(session.id, "write", {"filePath": "/workspace/new.txt", "content": "x" * 4096})
    assert written.error is not None, written
    assert "No space left on device" in written.error
    edited = await client.execute_tool(session.id, "edit", {
        "filePath": MARKER, "oldString": "work before the attack", "newString": "w" * 100_000})
    assert edited.error is not None, edited
    await assert_intact(runtime_plane, session)
    assert (await bash(client, session.id, "rm /workspace/fill; echo ok > /workspace/new.txt; cat "
                                           "/workspace/new.txt")).output == "ok\n"


HOLD_S = 6


def pid_holder() -> str:
    """Forks until the pids limit refuses, then returns; what it forked refills any freed pid for HOLD_S."""
    return (
        "python3 - <<'PY'\n"
        "import os, time\n"
        f"end = time.time() + {HOLD_S}\n"
        "def hold():\n"
        "    os.setsid()\n"
        "    while time.time() < end:\n"
        "        try:\n"
        "            os.fork()\n"
        "        except OSError:\n"
        "            pass\n"
        "        time.sleep(0.02)\n"
        "    os._exit(0)\n"
        "while True:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.strerror, flush=True)\n"
        "        break\n"
        "    if pid == 0:\n"
        "        hold()\n"
        "PY\n"
    )


async def test_exhausted_pids_fail_the_spawn_not_the_session(
    runtime_plane: Plane, runtime: str, request: pytest.FixtureRequest,
) -> None:
    gvisor_gap(request, runtime, "a fork storm held at the guest's process limit makes gVisor's Sentry outgrow its "
                                 "host pids limit, and the sandbox ends: docs/security.md, gap 9")
    client = runtime_plane.client
    victim = await prepared(runtime_plane, pids=64)
    try:
        started = time.monotonic()
        held = await bash(client, victim.id, pid_holder(), timeout_ms=20_000)
        assert "refused Resource temporarily unavailable" in held.output, held.output
        attempts = []
        while time.monotonic() - started < HOLD_S - 2:
            attempts.append(await bash(client, victim.id, "echo hi"))
        refused = [a.error for a in attempts if a.error is not None]
        # A spawn the pids limit refuses is a clear error of that call (one may squeeze into a freed pid).
        assert refused, [(a.output, a.error) for a in attempts]
        assert all("Resource temporarily unavailable" in e for e in refused), refused
        assert (await client.get_session(victim.id)).state == session_pb2.Session.READY
        await asyncio.sleep(max(0.0, HOLD_S + 1 - (time.monotonic() - started)))
        await assert_intact(runtime_plane, victim)
    finally:
        await client.delete_session(victim.id)


async def test_exhausted_file_descriptors_fail_the_command_not_the_session(
    runtime_plane: Plane, session: Session,
) -> None:
    client = runtime_plane.client
    script = (
        "python3 - <<'PY'\n"
        "import os, resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "fds = []\n"
        "try:\n"
        "    while True:\n"
        "        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
        "except OSError as exc:\n"
        "    print('refused', exc.strerror, len(fds) > 100)\n"
        "PY\n"
        "ulimit -n 12; exec 3</dev/null 4</dev/null 5</dev/null 6</dev/null 7</dev/null 8</dev/null 9</dev/null;"
        " cat /proc/self/status > /dev/null; seq 1 100000 | tail -1"
    )
    out = await bash(client, session.id, script)
    assert out.error is None, out.error
    assert out.output.startswith("refused Too many open files True\n"), out.output
    await assert_intact(runtime_plane, session)


async def loud(plane: Plane, session: Session, command: str, timeout_ms: int = 60_000) -> ToolOutcome:
    started = time.monotonic()
    out = await bash(plane.client, session.id, command, timeout_ms)
    elapsed = time.monotonic() - started
    assert out.error is None, out.error
    assert elapsed < 60, f"{command!r} took {elapsed:.1f} s"
    return out


async def test_a_huge_output_is_saved_capped_and_shown_truncated(runtime_plane: Plane, session: Session) -> None:
    size = "1G" if HEAVY else "256M"
    total_lines = (1 << 30 if HEAVY else 256 << 20) // 2 + 1
    out = await loud(runtime_plane, session, f"yes | head -c {size}")
    # Upstream's preview of the whole output: its first 2000 lines, the count of the rest, the hint.
    path = out.metadata["outputPath"]
    assert out.output.startswith("y\n" * 1999 + "y\n\n..." + f"{total_lines - 2000} lines truncated...\n\n")
    assert f"Full output saved to: {path}\n" in out.output
    assert out.output.endswith("(Only the first part of the output was saved: the session's saved-output budget"
                               " is used up.)")
    # The saved file stays within the budget (a quarter of the 256 MiB /tmp) and says it was capped.
    saved = as_tool_user(runtime_plane, session.sandbox_id, f"wc -c < {path}; tail -c 200 {path}")
    size_bytes, _, tail = saved.partition("\n")
    assert int(size_bytes) <= 64 << 20
    assert "[output capped: only the first" in tail
    await assert_intact(runtime_plane, session)


async def test_an_endless_output_is_stopped_by_its_timeout(runtime_plane: Plane, session: Session) -> None:
    out = await loud(runtime_plane, session, "yes", timeout_ms=15_000 if HEAVY else 4_000)
    assert out.metadata["exit"] is None
    assert out.metadata["truncated"] is True
    assert out.output.startswith("y\ny\n")
    assert "lines truncated..." in out.output
    await assert_intact(runtime_plane, session)


async def test_a_result_over_the_message_limit_is_truncated_not_an_internal_error(
    runtime_plane: Plane, session: Session,
) -> None:
    # 100 MB in one line: more than a gRPC message may carry, both towards the control plane and the client.
    out = await loud(runtime_plane, session, "head -c 100M /dev/zero | tr '\\0' x")
    assert "Sent message larger than max" not in out.output
    assert out.output.startswith("\n\n...104857600 bytes truncated...\n\nThe tool call succeeded but the output was"
                                 " truncated. Full output saved to: ")
    await assert_intact(runtime_plane, session)


async def test_many_large_control_plane_results_share_the_output_budget(runtime_plane: Plane) -> None:
    client = runtime_plane.client
    # 128 MiB of memory: a 32 MiB /tmp and an 8 MiB saved-output budget; forty 1 MiB todo lists fill /tmp
    # (as forty large results of any control-plane tool would) unless the oldest saved ones make room.
    victim = await prepared(runtime_plane, memory_mb=128)
    try:
        todos = [{"content": "t" * (1 << 20), "status": "pending", "priority": "high"}]
        paths = []
        for _ in range(40):
            out = await client.execute_tool(victim.id, "todowrite", {"todos": todos},
                                            on_permission=allow_once)  # the third identical call asks (doom_loop)
            assert out.error is None, out.error
            assert NOT_SAVED not in out.output
            paths.append(out.metadata["outputPath"])
        used = as_tool_user(runtime_plane, victim.sandbox_id, f"du -sk {OUTPUT_DIR} | cut -f1; ls {OUTPUT_DIR}")
        kilobytes, *names = used.split()
        assert int(kilobytes) <= 8 * 1024 + 64
        # The newest are kept, the oldest went first.
        assert paths[-1].rsplit("/", 1)[1] in names
        assert paths[0].rsplit("/", 1)[1] not in names
        await assert_intact(runtime_plane, victim)
    finally:
        await client.delete_session(victim.id)


async def test_tool_processes_are_the_oom_killers_choice(
    runtime_plane: Plane, session: Session, runtime: str, request: pytest.FixtureRequest,
) -> None:
    gvisor_gap(request, runtime, "gVisor has no Landlock, so a process may lower its own oom_score_adj; moot there, "
                                 "since the host's OOM killer sees only the Sentry: docs/security.md, gaps 9 and 10")
    memory = agent_memory_kb(runtime_plane, session.sandbox_id)
    # (the braces: the open itself is refused now, proc_guard.py, and bash reports that before `2>` applies)
    tool = await bash(runtime_plane.client, session.id, "cat /proc/self/oom_score_adj; { echo -1 > "
                                                       "/proc/self/oom_score_adj; } 2>/dev/null || echo refused")
    assert tool.output == "1000\nrefused\n"
    assert memory["oom_score_adj"] < 1000
    assert json.dumps(memory)  # the numbers came from the agent's /proc entry


async def test_a_failed_session_keeps_its_workspace_until_deleted(runtime_plane: Plane) -> None:
    client = runtime_plane.client
    victim = await prepared(runtime_plane)
    volume = f"ocsb-{runtime_plane.instance}-{victim.sandbox_id}-ws"
    engine = docker.from_env()
    # The container (and with it the agent) really goes: the session is FAILED at its next call.
    container(runtime_plane, victim.sandbox_id).kill()
    failed = await bash(client, victim.id, "echo hi")
    assert failed.error is not None
    ended = await client.get_session(victim.id)
    assert ended.state == session_pb2.Session.FAILED
    # Its workspace is still on the host, with the file written before.
    engine.volumes.get(volume)
    image = os.environ.get("OCSB_TEST_IMAGE", "ocsb-sandbox:latest")
    copy = engine.containers.run(image, ["cat", "/w/before.txt"], remove=True,
                                 network_mode="none", volumes={volume: {"bind": "/w", "mode": "ro"}},
                                 entrypoint=[])
    assert copy == b"work before the attack\n"
    await client.delete_session(victim.id)
    with pytest.raises(docker.errors.NotFound):
        engine.volumes.get(volume)


async def test_an_archive_larger_than_the_workspace_is_refused_whole() -> None:
    # A 32 MiB workspace and 40 MiB of files: refused with the reason, rather than a session missing files.
    async with running_plane(resources={"disk_mb": 32}) as plane:
        files = {f"part{n}.bin": os.urandom(4 << 20) for n in range(10)}
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await plane.client.create_session(workspace_archive=tar_of(files))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "No space left on device: the archive does not fit the workspace" in (refused.value.details() or "")
        assert [s for s in await plane.client.list_sessions() if s.state == session_pb2.Session.READY] == []


async def test_restarts_keep_a_failed_sessions_workspace_until_it_is_deleted() -> None:
    data_dir, instance = short_tmp(), new_instance("ws")
    process = PlaneProcess(data_dir, instance, pool_size=0)
    image = os.environ.get("OCSB_TEST_IMAGE", "ocsb-sandbox:latest")
    process.env |= {"CONTROLPLANE_PROVIDER__TYPE": "docker", "CONTROLPLANE_PROVIDER__IMAGE": image}
    engine = docker.from_env()
    try:
        target = await process.start()
        async with AsyncClient(target, process.token()) as client:
            victim = await client.create_session()
            await client.run(victim.id, command="echo precious > notes.txt")
        volume = f"ocsb-{instance}-{victim.sandbox_id}-ws"
        process.kill()
        # While the plane is down its container goes: the restart finds the session's sandbox lost.
        engine.containers.get(f"ocsb-{instance}-{victim.sandbox_id}").remove(force=True)
        for _ in range(2):  # the restart that fails the session, and one more after it
            target = await process.start()
            async with AsyncClient(target, process.token()) as client:
                assert (await client.get_session(victim.id)).state == session_pb2.Session.FAILED
            process.kill()
            engine.volumes.get(volume)  # still there
        copy = engine.containers.run(image, ["cat", "/w/notes.txt"], remove=True, network_mode="none",
                                     volumes={volume: {"bind": "/w", "mode": "ro"}}, entrypoint=[])
        assert copy == b"precious\n"
        target = await process.start()
        async with AsyncClient(target, process.token()) as client:
            await client.delete_session(victim.id)
        with pytest.raises(docker.errors.NotFound):
            engine.volumes.get(volume)
        await process.stop()
    finally:
        process.kill()
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)
