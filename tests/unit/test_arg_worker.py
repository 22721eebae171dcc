"""The argument worker (controlplane/core/calls/arg_worker.py, large_arguments.py): a large call's arguments are
parsed, fingerprinted and validated in a process of its own, with the same results as in the control plane,
and the control plane's own CPU time for it is a small part of the worker's."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, create_model

from controlplane.core.calls import arg_worker
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
        assert prepared.text == json_stringify(json.loads(text))
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
