"""Every recorded oracle case replayed through the public gRPC API in a real sandbox: the same title, output,
metadata (and attachments), or the same error text, as upstream OpenCode v1.2.27 gave."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from controlplane.client import ToolOutcome
from tests.archives import tar_of
from tests.oracle.cases import GROUPS, Recorded, load, mask_ids, reads_first
from tests.planes import Plane

pytestmark = pytest.mark.docker

RECORDED = [r for group in GROUPS for r in load(group)]


def ours(outcome: ToolOutcome) -> tuple[dict[str, Any] | None, str | None]:
    if outcome.result is None:
        return None, mask_ids(outcome.error)
    r = outcome.result
    result: dict[str, Any] = {"title": r.title, "output": r.output, "metadata": json.loads(r.metadata_json or "{}")}
    if r.attachments:
        result["attachments"] = [{"type": a.type, "mime": a.mime, "url": a.url} for a in r.attachments]
    return mask_ids(result), None


def expected(recorded: Recorded) -> tuple[dict[str, Any] | None, str | None]:
    result = recorded.result
    if result is not None:
        result = {k: v for k, v in result.items() if k in ("title", "output", "metadata", "attachments")}
        if "attachments" in result:
            result["attachments"] = [{k: a.get(k) for k in ("type", "mime", "url")} for a in result["attachments"]]
    return result, recorded.error


@pytest.mark.parametrize("recorded", RECORDED, ids=[r.case.name for r in RECORDED])
async def test_same_answer_as_upstream(docker_plane: Plane, recorded: Recorded) -> None:
    case = recorded.case
    files = {name: base64.b64decode(text[len("base64:"):]) if text.startswith("base64:") else text
             for name, text in case.files.items()}
    client = docker_plane.client
    session = await client.create_session(workspace_archive=tar_of(files) if files else b"",
                                          config_json=json.dumps(case.config) if case.config else "")
    try:
        if case.git:
            assert (await client.run(session.id, ["git", "init", "-q", "/workspace"])).exit_code == 0
        if case.setup:
            done = await client.run(session.id, ["bash", "-c", case.setup], cwd="/workspace")
            assert done.exit_code == 0, done.stderr
        if reads_first(case):
            read = await client.execute_tool(session.id, "read", {"filePath": case.params["filePath"]})
            assert read.result is not None, read.error
        outcome = await client.execute_tool(session.id, case.tool, case.params, agent=case.agent)
        assert ours(outcome) == expected(recorded)
    finally:
        await client.delete_session(session.id)
