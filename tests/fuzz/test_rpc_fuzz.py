"""Every public RPC fuzzed from its descriptor: a clear status, no crash, no hang, no state change."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from hypothesis import strategies as st

from controlplane.v1 import (
    event_pb2,
    event_pb2_grpc,
    permission_pb2,
    permission_pb2_grpc,
    sandbox_pb2,
    sandbox_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    tool_pb2,
    tool_pb2_grpc,
)
from tests.fuzz.harness import CALL_TIMEOUT_S, CLEAR, FuzzPlane, assert_clear, drive_tool_call, run_given, snapshot
from tests.fuzz.strategies import hostile_text, malformed_json, messages

SERVICES = [
    (session_pb2, session_pb2_grpc), (tool_pb2, tool_pb2_grpc), (permission_pb2, permission_pb2_grpc),
    (event_pb2, event_pb2_grpc), (sandbox_pb2, sandbox_pb2_grpc),
]
METHODS: dict[str, tuple[MethodDescriptor, Any]] = {
    f"{service.name}.{method.name}": (method, grpc_module)
    for module, grpc_module in SERVICES
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
}
TOOL_NAMES = ["bash", "read", "list", "glob", "grep", "todoread", "invalid", "BASH", "nope", "web fetch"]


def strings_for(fp: FuzzPlane, method: str) -> st.SearchStrategy[str]:
    # Deleting or pausing the live session would take its sandbox (and the workspace the checks compare) away.
    removing = method in ("SessionService.DeleteSession", "SessionService.PauseSession")
    ids = [i for i in fp.id_pool() if not (removing and i == fp.live)]
    return st.one_of(st.sampled_from(ids), st.sampled_from(TOOL_NAMES), hostile_text, malformed_json)


def stub_method(fp: FuzzPlane, method: MethodDescriptor, grpc_module: Any) -> Any:
    stub = getattr(grpc_module, f"{method.containing_service.name}Stub")(fp.client._channel)
    return getattr(stub, method.name)


async def unary(fp: FuzzPlane, call: Any, request: Any) -> tuple[grpc.StatusCode, str, Any]:
    try:
        response = await call(request, metadata=fp.metadata, timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or "", None
    return grpc.StatusCode.OK, "", response


async def subscribe(fp: FuzzPlane, call: Any, request: Any) -> tuple[grpc.StatusCode, str]:
    """A subscription stays open on purpose: subscribed (headers came) or refused, within the deadline."""
    stream = call(request, metadata=fp.metadata, timeout=CALL_TIMEOUT_S)
    try:
        await stream.initial_metadata()
        done = await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(stream.code())), 0.2)
        return done, (await stream.details()) or ""
    except TimeoutError:
        return grpc.StatusCode.OK, ""
    finally:
        stream.cancel()


def exec_start(fp: FuzzPlane) -> st.SearchStrategy[sandbox_pb2.ExecRequest]:
    """Exec messages whose program is harmless when the session is real (local sandboxes run on this host)."""
    start = st.builds(
        sandbox_pb2.ExecStart,
        session_id=st.sampled_from(fp.id_pool()), argv=st.lists(hostile_text, max_size=2).map(lambda a: ["echo", *a]),
        env=st.dictionaries(hostile_text, hostile_text, max_size=2), cwd=hostile_text,
        timeout_ms=st.integers(min_value=0, max_value=2**32 - 1), merge_stderr=st.booleans(),
    )
    return st.one_of(
        start.map(lambda s: sandbox_pb2.ExecRequest(start=s)),
        messages(sandbox_pb2.ExecRequest.DESCRIPTOR, hostile_text).filter(lambda m: m.WhichOneof("msg") != "start"),
    )


async def run_exec(fp: FuzzPlane, requests: list[sandbox_pb2.ExecRequest]) -> tuple[grpc.StatusCode, str]:
    """Through the blocking client, for the reason drive_tool_call gives."""

    def run() -> tuple[grpc.StatusCode, str]:
        stub = sandbox_pb2_grpc.SandboxServiceStub(fp.sync_channel)
        try:
            for _ in stub.Exec(iter(requests), metadata=fp.metadata, timeout=CALL_TIMEOUT_S):
                pass
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""

    return await asyncio.to_thread(run)


@pytest.mark.parametrize("name", sorted(METHODS))
async def test_fuzzed_rpc_gives_a_clear_answer_and_changes_nothing(fplane: FuzzPlane, name: str) -> None:
    method, grpc_module = METHODS[name]
    strings = strings_for(fplane, name)
    if name == "SandboxService.Exec":
        requests: st.SearchStrategy[Any] = st.lists(exec_start(fplane), min_size=0, max_size=3)
    elif method.client_streaming:
        requests = st.lists(messages(method.input_type, strings), min_size=0, max_size=3)
    else:
        requests = messages(method.input_type, strings)

    async def check(request: Any) -> None:
        before = await snapshot(fplane)
        created = ""
        if name == "SandboxService.Exec":
            code, details = await run_exec(fplane, request)
        elif name == "ToolService.ExecuteTool":
            outcome = await drive_tool_call(fplane, request)
            assert_clear(outcome)
            code, details = outcome.code, outcome.details
        elif method.server_streaming:
            code, details = await subscribe(fplane, stub_method(fplane, method, grpc_module), request)
        else:
            code, details, response = await unary(fplane, stub_method(fplane, method, grpc_module), request)
            # The calls that make a session (a fork is a create) or a snapshot: what an OK one made is removed.
            if name in ("SessionService.CreateSession", "SessionService.ForkSession") and code == grpc.StatusCode.OK:
                created = response.id
                await fplane.client.delete_session(created)
            if name == "SessionService.SnapshotSession" and code == grpc.StatusCode.OK:
                await fplane.client.delete_snapshot(response.id)
        assert code in CLEAR, f"{name}: {code.name}: {details}"
        assert code == grpc.StatusCode.OK or details.strip(), f"{name}: {code.name} without a message"
        after = await snapshot(fplane)
        new = [s for s in after.sessions if s not in before.sessions and s[0] != created]
        assert new == []  # a refused CreateSession leaves no (FAILED) session behind either
        assert [s for s in before.sessions if s not in after.sessions] == []
        assert after.sandboxes == before.sandboxes
        assert after.workspace == before.workspace
        assert after.outside == before.outside

    await run_given(requests, check)
    # The server is still whole.
    assert (await fplane.client.get_session(fplane.live)).state == session_pb2.Session.READY
