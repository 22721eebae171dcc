"""The argument worker (controlplane/core/calls/arg_worker.py, large_arguments.py): a large call's arguments are
parsed, fingerprinted and validated in a process of its own, with the same results as in the control plane,
and the control plane's own CPU time for it is a small part of the worker's."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, create_model

from controlplane.core.calls import arg_worker
from controlplane.core.calls.doom_loop import fingerprint
from controlplane.core.calls.executor import CallRequest, CallScope
from controlplane.core.calls.large_arguments import LargeArguments
from controlplane.core.calls.tool import ToolDefinition, ToolError, ToolInfo
from controlplane.core.definitions.validation import validate
from controlplane.tools.todowrite import TOOL as TODOWRITE
from controlplane.tools.todowrite import TodoWriteParams
from opencode_semantics.javascript import json_stringify


def todos(n: int, first: str = "call 1") -> dict[str, Any]:
    items = [{"content": first, "status": "pending", "priority": "high"}]
    items += [{"status": "pending", "content": f"t{i:06d} é", "priority": "low"} for i in range(n)]
    return {"todos": items, "extra": {"b": 1, "a": [1, 2]}}


def scope_of(tools: dict[str, ToolInfo]) -> CallScope:
    return CallScope(session_id="s", agent="build", ruleset=[], tools=tools, sandbox=None)  # type: ignore[arg-type]


def test_packed_values_come_back_equal_with_their_key_order() -> None:
    value = todos(3 * arg_worker.PIECE + 7)
    again = arg_worker.unpack(arg_worker.pack(value))
    assert again == value
    assert list(again) == list(value)
    assert [list(item) for item in again["todos"]] == [list(item) for item in value["todos"]]
    assert arg_worker.unpack(arg_worker.pack([1, "a", None])) == [1, "a", None]
    assert arg_worker.unpack(arg_worker.pack("text")) == "text"


def test_only_importable_models_are_sent_to_the_worker() -> None:
    assert arg_worker.model_ref(TodoWriteParams) == "controlplane.tools.todowrite:TodoWriteParams"
    made: type[BaseModel] = create_model("Made", x=(int, ...))
    assert arg_worker.model_ref(made) == ""


async def test_the_worker_parses_fingerprints_and_validates_as_the_control_plane_does() -> None:
    value = todos(20_000)
    text = json.dumps(value)
    large = LargeArguments()
    try:
        request = CallRequest("s", "todowrite", text, "call_1", "")
        prepared = await large.prepared(scope_of({"todowrite": TODOWRITE}), request)
        assert prepared is not None
        tool, args = prepared.resolved
        assert tool is TODOWRITE
        assert args == json.loads(text)
        assert prepared.text == fingerprint(json_stringify(json.loads(text)))  # the digest, not the text
        definition = ToolDefinition("", TodoWriteParams, TODOWRITE.init)  # type: ignore[arg-type]
        checked = await large.validated("todowrite", definition, args, prepared)
        assert checked == validate("todowrite", TodoWriteParams, json.loads(text))

        wrong = {"todos": [{"content": "x", "status": "pending"}] * 2000}
        with pytest.raises(ToolError) as in_plane:
            validate("todowrite", TodoWriteParams, wrong)
        with pytest.raises(ToolError) as in_worker:
            await large.validated("todowrite", definition, wrong, None)
        assert str(in_worker.value) == str(in_plane.value)

        # Not a JSON object, or a tool that is not there: the executor's own path answers (upstream's repair).
        not_an_object = CallRequest("s", "todowrite", "[1]", "c", "")
        assert await large.prepared(scope_of({"todowrite": TODOWRITE}), not_an_object) is None
        assert await large.prepared(scope_of({}), request) is None
    finally:
        await large.close()


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_the_control_plane_spends_a_small_part_of_the_cpu_the_worker_spends_on_large_arguments() -> None:
    text = json.dumps(todos(40_000))  # about 2.5 MiB
    large = LargeArguments()
    definition = ToolDefinition("", TodoWriteParams, TODOWRITE.init)  # type: ignore[arg-type]
    scope = scope_of({"todowrite": TODOWRITE})
    try:
        assert await large.prepared(scope, CallRequest("s", "todowrite", "{}", "warm", "")) is not None
        process = large.worker()._process  # its pid, for its CPU time
        assert process is not None
        worker_before = _cpu_of(process.pid)
        own_before = resource.getrusage(resource.RUSAGE_SELF)
        prepared = await large.prepared(scope, CallRequest("s", "todowrite", text, "call_1", ""))
        assert prepared is not None
        assert await large.validated("todowrite", definition, prepared.resolved[1], prepared) is not None
        own_after = resource.getrusage(resource.RUSAGE_SELF)
        own = own_after.ru_utime + own_after.ru_stime - own_before.ru_utime - own_before.ru_stime
        worker = _cpu_of(process.pid) - worker_before
        assert worker > 0.2, worker
        assert own < worker / 2, (own, worker)
    finally:
        await large.close()


def _big_text(n: int) -> str:
    return json.dumps(todos(n))


async def _in_tenant(tenant: str, worker: arg_worker.ArgWorker, job: str, *args: Any) -> tuple[Any, ...] | None:
    arg_worker.current_tenant.set(tenant)  # a task's own context, as the executor sets it per call
    return await worker.run(job, *args)


async def test_a_worker_killed_mid_job_fails_that_call_only_and_the_next_job_gets_a_new_worker() -> None:
    worker = arg_worker.ArgWorker()
    try:
        assert await worker.run("prepare", "{}") is not None
        first = worker.pid
        assert first is not None
        doomed = asyncio.ensure_future(_in_tenant("a", worker, "prepare", _big_text(400_000)))  # about 25 MiB
        behind = asyncio.ensure_future(_in_tenant("b", worker, "prepare", '{"x": 1}'))
        await asyncio.sleep(0.3)  # the big job is in the worker (it takes seconds), the small one waits for it
        assert not doomed.done()
        os.kill(first, signal.SIGKILL)
        with pytest.raises(arg_worker.ArgWorkerError) as failed:
            await doomed
        assert "the argument worker died while it handled this call's arguments (killed by signal 9)" in str(
            failed.value)
        answer = await behind
        assert answer is not None
        assert answer[0] == "ok"
        assert arg_worker.unpack(answer[1]) == {"x": 1}
        assert worker.pid not in (None, first)
    finally:
        await worker.close()


async def test_a_job_past_the_workers_memory_fails_with_the_limit_named_and_the_worker_serves_on() -> None:
    worker = arg_worker.ArgWorker(memory_mb=100)
    try:
        assert await worker.run("prepare", "{}") is not None
        with pytest.raises(arg_worker.ArgWorkerError) as failed:
            await worker.run("prepare", _big_text(200_000))  # about 12 MiB: some 150 MiB once parsed
        assert "more memory than the argument worker may use (100 MiB, limits.arg_worker_memory_mb)" in str(
            failed.value) or "the argument worker died" in str(failed.value)
        answer = await worker.run("prepare", '{"after": true}')
        assert answer is not None
        assert arg_worker.unpack(answer[1]) == {"after": True}
    finally:
        await worker.close()


async def test_tenants_take_turns_at_the_worker_however_many_jobs_one_sends() -> None:
    worker = arg_worker.ArgWorker()
    text = _big_text(20_000)
    order: list[str] = []

    async def job(tenant: str) -> None:
        await _in_tenant(tenant, worker, "prepare", text)
        order.append(tenant)

    try:
        assert await worker.run("prepare", "{}") is not None
        flood = [asyncio.ensure_future(job("a")) for _ in range(5)]
        await asyncio.sleep(0)
        quiet = asyncio.ensure_future(job("b"))
        await asyncio.gather(*flood, quiet)
        assert order.index("b") <= 1, order  # behind a's running job at most, not behind all five
    finally:
        await worker.close()
