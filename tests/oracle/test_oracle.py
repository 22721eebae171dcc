"""Every recorded oracle case replayed through the public gRPC API in a real sandbox: the same title, output,
metadata (and attachments), or the same error text, as upstream OpenCode v1.2.27 gave."""

from __future__ import annotations

import base64
import json

import pytest

from controlplane.client import allow_once
from tests.archives import tar_of
from tests.oracle.cases import GROUPS, Recorded, load, reads_first
from tests.oracle.compare import expected, ours
from tests.planes import Plane

pytestmark = pytest.mark.docker

RECORDED = [r for group in GROUPS for r in load(group)]


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
            read = await client.execute_tool(session.id, "read", {"filePath": case.params["filePath"]},
                                             on_permission=allow_once)
            assert read.result is not None, read.error
        # Upstream's answers were recorded with everything allowed (record.py): asks are approved here too.
        outcome = await client.execute_tool(session.id, case.tool, case.params, agent=case.agent,
                                            on_permission=allow_once)
        assert ours(outcome) == expected(recorded)
    finally:
        await client.delete_session(session.id)
