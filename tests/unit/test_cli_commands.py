"""The CLI as a person or a script runs it: a real `python -m controlplane` subprocess against a served plane
(in-process agents). Exit codes, live output, Ctrl-C, a prompt with no terminal, --json anywhere."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import signal
import sys
import time
from collections.abc import AsyncIterator

import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import tool_pb2
from tests.archives import tar_of
from tests.planes import Plane

FILES = {"notes.txt": "alpha\n", ".env": "SECRET=1\n"}


@pytest.fixture(name="session_id")
async def session_fixture(local_plane: Plane) -> AsyncIterator[str]:
    session = await local_plane.client.create_session(workspace_archive=tar_of(FILES))
    yield session.id
    await local_plane.client.delete_session(session.id)


def environment(plane: Plane) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    return {**clean, "CONTROLPLANE_TARGET": plane.plane.address, "CONTROLPLANE_TOKEN": plane.token}


async def start(plane: Plane, *argv: str, stdin: int | None = asyncio.subprocess.DEVNULL
                ) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controlplane", *argv, env=environment(plane), stdin=stdin,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def cli(plane: Plane, *argv: str) -> tuple[int, str, str]:
    child = await start(plane, *argv)
    out, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode is not None
    return child.returncode, out.decode(), err.decode()


async def test_session_create_quiet_prints_only_the_id(local_plane: Plane) -> None:
    code, out, err = await cli(local_plane, "session", "create", "-q")
    assert code == 0, err
    assert re.fullmatch(r"ses_[0-9a-f]+\n", out), out
    code, out, _ = await cli(local_plane, "--json", "session", "get", out.strip())
    assert code == 0
    assert json.loads(out)[0]["state"] == "READY"


async def test_json_is_accepted_anywhere(local_plane: Plane, session_id: str) -> None:
    for argv in (("--json", "session", "list"), ("session", "--json", "list"), ("session", "list", "--json")):
        code, out, err = await cli(local_plane, *argv)
        assert code == 0, err
        assert session_id in [s["id"] for s in json.loads(out)]


async def test_tools_json_nests_each_schema_as_an_object(local_plane: Plane, session_id: str) -> None:
    code, out, err = await cli(local_plane, "tools", session_id, "--json")
    assert code == 0, err
    tools = json.loads(out)["tools"]
    read = next(t for t in tools if t["id"] == "read")
    assert read["parameters_json_schema"]["type"] == "object"
    assert "filePath" in read["parameters_json_schema"]["properties"]


async def test_tool_streams_live_output_then_prints_the_result(local_plane: Plane, session_id: str) -> None:
    child = await start(local_plane, "tool", session_id, "bash",
                        json.dumps({"command": "echo first; sleep 1.5; echo second", "description": "Two lines"}))
    assert child.stderr is not None
    assert child.stdout is not None
    # The first line is on stderr while the command still runs (it sleeps before the second).
    first = await asyncio.wait_for(child.stderr.readline(), 20)
    assert first == b"first\n"
    assert child.returncode is None
    out, rest = await asyncio.wait_for(child.communicate(), 30)
    assert child.returncode == 0
    assert out == b"first\nsecond\n\n"
    assert rest == b"second\n"


async def test_exit_codes(local_plane: Plane, session_id: str) -> None:
    code, _, err = await cli(local_plane, "tool", session_id, "read", "{}")
    assert code == 1
    assert "invalid arguments" in err
    code, _, err = await cli(local_plane, "tool", session_id, "no_such_tool", "{}")
    assert code == 1
    assert "unavailable tool 'no_such_tool'" in err
    code, _, err = await cli(local_plane, "tool", session_id, "read", "{not json")
    assert code == 2
    assert "not JSON" in err
    code, _, err = await cli(local_plane, "tool", "ses_missing", "read", "{}")
    assert code == 2
    assert "NOT_FOUND" in err
    code, out, _ = await cli(local_plane, "tool", session_id, "read", json.dumps({"filePath": "notes.txt"}))
    assert code == 0
    assert "1: alpha" in out
    code, _, err = await cli(local_plane, "exec", session_id, "--", "sh", "-c", "exit 3")
    assert code == 3


async def test_a_permission_ask_with_no_terminal_is_rejected(local_plane: Plane, session_id: str) -> None:
    for stdin in (asyncio.subprocess.DEVNULL, asyncio.subprocess.PIPE):
        child = await start(local_plane, "tool", session_id, "read", json.dumps({"filePath": ".env"}), stdin=stdin)
        # A pipe at end of input: no terminal either.
        out, err = await asyncio.wait_for(child.communicate(b"" if stdin == asyncio.subprocess.PIPE else None), 60)
        assert child.returncode == 1
        assert b"SECRET" not in out
        assert b"no terminal to ask: rejected" in err
        assert b"Traceback" not in err
    assert await local_plane.client.pending_permissions(session_id) == []


async def test_ctrl_c_aborts_the_call_and_exits_130_quietly(local_plane: Plane, session_id: str) -> None:
    marker = "clisigint"
    child = await start(local_plane, "tool", session_id, "bash",
                        json.dumps({"command": f"echo started; exec -a {marker} sleep 60", "description": "Wait"}))
    assert child.stderr is not None
    assert await asyncio.wait_for(child.stderr.readline(), 20) == b"started\n"
    assert await running(local_plane, session_id, marker)
    child.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(child.communicate(), 20)
    assert child.returncode == 130
    assert err == b""
    assert out == b""
    deadline = time.monotonic() + 10
    while await running(local_plane, session_id, marker):
        assert time.monotonic() < deadline, "the interrupted call's command still runs"
        await asyncio.sleep(0.2)


async def running(plane: Plane, session_id: str, marker: str) -> bool:
    done = await plane.client.run(session_id, ["sh", "-c", "ps -eo args"])
    return any(line.startswith(marker) for line in done.stdout.decode().splitlines())


async def test_approvals_list_and_reply_answer_a_waiting_call(local_plane: Plane, session_id: str) -> None:
    async with AsyncClient(local_plane.plane.address, local_plane.token) as client:
        stream, outbox = client.tool_call(session_id, "read", {"filePath": ".env"})
        events = stream.__aiter__()
        while (event := await asyncio.wait_for(events.__anext__(), 20)).WhichOneof("event") != "permission_request":
            pass
        code, out, err = await cli(local_plane, "approvals", "list", session_id, "--json")
        assert code == 0, err
        pending = json.loads(out)
        assert [p["request"]["id"] for p in pending] == [event.permission_request.id]
        code, _, err = await cli(local_plane, "approvals", "reply", event.permission_request.id, "once")
        assert code == 0, err
        while (event := await asyncio.wait_for(events.__anext__(), 20)).WhichOneof("event") not in ("result", "error"):
            pass
        outbox.put_nowait(None)
    assert event.WhichOneof("event") == "result"
    assert "SECRET=1" in event.result.output


async def test_events_follows_the_bus_until_ctrl_c(local_plane: Plane, session_id: str) -> None:
    child = await start(local_plane, "events", session_id, "--json")
    assert child.stdout is not None
    await asyncio.sleep(1.5)  # subscribed by then: the command has started and connected
    outcome = await local_plane.client.execute_tool(session_id, "read", {"filePath": "notes.txt"})
    assert outcome.result is not None
    seen: list[dict[str, object]] = []
    while not any(e["type"] == "tool.state" for e in seen):
        seen.append(json.loads(await asyncio.wait_for(child.stdout.readline(), 20)))
    assert all(e["session_id"] == session_id for e in seen)
    child.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(child.communicate(), 20)
    assert child.returncode == 130
    assert b"Traceback" not in err


def test_reply_choices_are_the_api_replies() -> None:
    from controlplane.cli_calls import REPLIES

    assert {r.upper() for r in REPLIES} == set(tool_pb2.PermissionReply.Reply.keys()) - {"REPLY_UNSPECIFIED"}


async def test_audit_lists_the_tenants_own_record(local_plane: Plane, session_id: str) -> None:
    code, _, err = await cli(local_plane, "tool", session_id, "read", json.dumps({"filePath": ".env"}))
    assert code == 1, err
    code, out, err = await cli(local_plane, "audit", session_id, "--json")
    assert code == 0, err
    entries = json.loads(out)
    asked = [e for e in entries if e["kind"] == "permission" and e.get("permission") == "read"]
    assert asked, entries
    assert asked[-1]["outcome"] == "reject"
    assert {e["session_id"] for e in entries} == {session_id}
    code, out, _ = await cli(local_plane, "audit", session_id, "--limit", "1", "--json")
    assert len(json.loads(out)) == 1
    code, _, err = await cli(local_plane, "audit", "ses_missing")
    assert code == 2
    assert "NOT_FOUND" in err


async def test_a_terminal_is_asked_and_its_answer_taken(local_plane: Plane, session_id: str) -> None:
    for answer, code, shown in ((b"y\n", 0, b"SECRET=1"), (b"n\n", 1, b"")):
        leader, follower = pty.openpty()
        try:
            child = await start(local_plane, "tool", session_id, "read", json.dumps({"filePath": ".env"}),
                                stdin=follower)
            assert child.stderr is not None
            prompt = await asyncio.wait_for(child.stderr.readuntil(b"? [y/N/a(lways)] "), 30)
            assert b"allow read" in prompt
            assert b".env" in prompt
            os.write(leader, answer)
            out, err = await asyncio.wait_for(child.communicate(), 30)
        finally:
            os.close(leader)
            os.close(follower)
        assert child.returncode == code, err
        assert shown in out
        if code:
            assert b"SECRET" not in out
            assert b"rejected permission" in err


async def test_session_pause_and_resume(local_plane: Plane, session_id: str) -> None:
    code, out, err = await cli(local_plane, "--json", "session", "pause", session_id)
    assert code == 0, err
    assert json.loads(out)[0]["state"] == "PAUSED"
    code, _, err = await cli(local_plane, "exec", session_id, "--", "true")
    assert code != 0
    assert "ResumeSession" in err
    code, out, err = await cli(local_plane, "--json", "session", "resume", session_id)
    assert code == 0, err
    assert json.loads(out)[0]["state"] == "READY"
    code, out, err = await cli(local_plane, "exec", session_id, "--", "cat", "notes.txt")
    assert code == 0, err
    assert out == "alpha\n"
