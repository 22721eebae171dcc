"""The spawner helper's imports: one helper lives as long as its sandbox, so what it imports is memory every idle
sandbox holds (docs/performance.md: asyncio alone costs a Python process about 6 MiB of private memory)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sandbox_agent import spawner

AGENT_ROOT = Path(spawner.__file__).resolve().parent.parent
HEAVY = {"asyncio", "concurrent.futures", "logging", "ssl", "subprocess", "typing", "inspect", "dataclasses"}


def helper_modules() -> set[str]:
    """The modules a fresh interpreter holds once it imported what the agent's helper command line runs."""
    code = (f"import sys, json; sys.path.insert(0, {str(AGENT_ROOT)!r}); import {spawner.HELPER_MODULE}; "
            "print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-I", "-B", "-c", code], capture_output=True, check=True, text=True)
    return set(json.loads(done.stdout))


def test_the_helper_imports_none_of_the_agents_heavy_modules() -> None:
    loaded = helper_modules()
    assert spawner.HELPER_MODULE in loaded
    assert loaded & HEAVY == set()


def test_the_helper_module_has_the_helpers_entry_point() -> None:
    module = __import__(spawner.HELPER_MODULE, fromlist=["main"])
    assert callable(module.main)
    assert module.TOOL_NICENESS == spawner.TOOL_NICENESS
