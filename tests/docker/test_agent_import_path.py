"""The agent runs as root with the workspace as its working directory, and Python's `-m` puts the working directory
first on sys.path unless the path is safe. Every module the agent imports after its start (the bash grammar at the
first bash call, `shutil` for a program's lookup, the rare RPCs' modules) was then looked up in the workspace
first, which the model and the tenant's archive write: a planted `shutil.py` or `tree_sitter_bash.py` ran as root
(red team, 2026-11-28). The image's entrypoint runs it with PYTHONSAFEPATH=1; the agent refuses to start without it."""

from __future__ import annotations

import pytest

from tests.planes import Plane, workspace_session

pytestmark = pytest.mark.docker

PLANTED = ("shutil", "tree_sitter_bash", "tarfile", "tempfile", "base64", "secrets", "bz2", "lzma", "glob", "fnmatch",
           "difflib", "uuid", "zipfile", "json", "sandbox_agent")
"""Modules an agent may import late (and the agent's own package, which a restarted container would load)."""
MARK = "import os\nopen('/workspace/.planted-%s-%d' % (__name__, os.getuid()), 'w').close()\n"

session_id = workspace_session({**{f"{name}.py": MARK for name in PLANTED}, "sandbox_agent/__init__.py": MARK})


async def test_modules_planted_in_the_workspace_are_never_imported_by_the_agent(
        docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    ran = await client.execute_tool(session_id, "bash", {"command": "echo hi", "description": "Say hi"})
    listed = await client.execute_tool(session_id, "glob", {"pattern": "*.py"})
    await client.list_tools(session_id)
    shown = await client.run(session_id, ["ls", "-a", "/workspace"])
    planted = [name for name in shown.stdout.decode().split() if name.startswith(".planted-")]
    assert planted == [], f"the agent imported modules from the workspace: {planted}"
    assert ran.output == "hi\n"
    assert "shutil.py" in listed.output
