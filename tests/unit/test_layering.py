"""Which layer may import which: core/ is the domain and reaches out for no transport, provider, store or agent;
the outer layers keep to their own side of it. Read off the source (every import, those under TYPE_CHECKING too),
so a rule holds before anything runs."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTROLPLANE = ROOT / "controlplane"
AGENT = ROOT / "sandbox-image" / "sandbox_agent"

TRANSPORT = ("grpc", "docker", "controlplane.v1", "sandbox.v1")
"""gRPC (and its grpc_* companions, see `is_within`), the Docker SDK, the generated stubs of both services."""
OUTER = ("controlplane.sandbox", "controlplane.store", "controlplane.rpc", "controlplane.mcp",
         "controlplane.tools", "controlplane.app")
SHARED = ("opencode_semantics",)
"""The dependency-free package both sides ship (the wildcard matcher, JavaScript value semantics, frontmatter):
core may use it, it is not the agent."""
TRANSPORT_TELEMETRY = ("controlplane.telemetry.remote", "controlplane.telemetry.grpc_server")
"""The telemetry that reads the agent's spans off gRPC: core records spans (telemetry.spans), it carries none."""
CORE_FORBIDDEN = (*TRANSPORT, *OUTER, *TRANSPORT_TELEMETRY, "sandbox_agent", "sandbox")

KNOWN_CORE_EXCEPTIONS: set[tuple[str, str]] = set()
"""(core file, import) pairs allowed for now; each must still happen (see below) so it cannot linger. None today:
the last one, agent_markdown's import of the agent's frontmatter parser, went with opencode_semantics."""


def package_of(path: Path) -> list[str]:
    """The dotted package `path` is in: its directories up to the first one that is no package."""
    parts: list[str] = []
    folder = path.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    return parts


def imported(path: Path) -> Iterator[str]:
    """Every module `path` imports; `from a import b` counts as `a.b` too, since `b` may be a module."""
    package = package_of(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names if alias.name != "*")


def is_within(name: str, prefixes: tuple[str, ...]) -> bool:
    top = name.split(".")[0]
    if "grpc" in prefixes and top.startswith("grpc"):
        return True
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def offenders(top: Path, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> set[tuple[str, str]]:
    found = set()
    for path in sorted(top.rglob("*.py")):
        for name in imported(path):
            if is_within(name, forbidden) and not is_within(name, allowed):
                found.add((path.relative_to(path.parents[len(package_of(path))]).as_posix(), name))
    return found


def excused(offender: tuple[str, str]) -> bool:
    path, name = offender
    return any(path == known_path and is_within(name, (known,)) for known_path, known in KNOWN_CORE_EXCEPTIONS)


def test_core_imports_no_transport_provider_store_or_agent() -> None:
    found = offenders(CONTROLPLANE / "core", CORE_FORBIDDEN, SHARED)
    assert {offender for offender in found if not excused(offender)} == set()


def test_every_known_core_exception_still_happens() -> None:
    """An exception that no longer happens is taken off the list, so that it cannot come back unnoticed."""
    found = offenders(CONTROLPLANE / "core", CORE_FORBIDDEN, SHARED)
    assert {known for known in KNOWN_CORE_EXCEPTIONS if known not in found} == set()


def test_core_loads_no_transport_provider_or_store_even_indirectly() -> None:
    """Every core module imported in a fresh interpreter: nothing it pulls in, at any depth, is transport or an
    outer layer (the static tests above see only core's own import lines)."""
    program = (
        "import importlib, json, pkgutil, sys\n"
        "import controlplane.core as core\n"
        "for found in pkgutil.walk_packages(core.__path__, 'controlplane.core.'):\n"
        "    importlib.import_module(found.name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = json.loads(subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout)
    assert "controlplane.core.calls.tool_runtime" in loaded
    assert [name for name in loaded if is_within(name, (*TRANSPORT, *OUTER, *TRANSPORT_TELEMETRY, "sandbox"))] == []


def test_the_store_knows_no_provider_transport_or_agent() -> None:
    forbidden = (*TRANSPORT, "controlplane.sandbox", "controlplane.rpc", "controlplane.mcp", "controlplane.tools",
                 "controlplane.app", "sandbox_agent", "sandbox")
    assert offenders(CONTROLPLANE / "store", forbidden) == set()


def test_the_api_reaches_sandboxes_only_through_the_domain() -> None:
    assert offenders(CONTROLPLANE / "rpc", ("docker", "controlplane.sandbox", "sandbox_agent", "sandbox")) == set()


def test_providers_know_neither_the_api_nor_the_store() -> None:
    forbidden = ("controlplane.rpc", "controlplane.store", "controlplane.v1", "controlplane.tools", "controlplane.mcp",
                 "controlplane.app")
    assert offenders(CONTROLPLANE / "sandbox", forbidden) == set()


def test_tools_and_mcp_run_through_the_domain_only() -> None:
    forbidden = (*TRANSPORT, "controlplane.sandbox", "controlplane.store", "controlplane.rpc", "controlplane.app")
    assert offenders(CONTROLPLANE / "tools", forbidden) == set()
    assert offenders(CONTROLPLANE / "mcp", forbidden) == set()


def test_the_agent_imports_nothing_of_the_control_plane() -> None:
    """It runs in the image, where the control plane is not installed."""
    assert offenders(AGENT, ("controlplane",)) == set()


def test_a_planted_import_is_found(tmp_path: Path) -> None:
    """The reader itself: every form of import names its module, relative ones resolved, the shared package let
    through."""
    calls = tmp_path / "controlplane" / "core" / "calls"
    calls.mkdir(parents=True)
    for folder in (calls, calls.parent, calls.parent.parent):
        (folder / "__init__.py").write_text("")
    (calls / "planted.py").write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import grpc_health.v1\n"
        "from controlplane import sandbox\n"
        "from ...store import base\n"
        "from . import tool\n"
        "if TYPE_CHECKING:\n"
        "    from sandbox.v1 import agent_pb2\n"
        "import opencode_semantics.wildcard\n"
    )
    assert offenders(tmp_path / "controlplane" / "core", CORE_FORBIDDEN, SHARED) == {
        ("controlplane/core/calls/planted.py", name) for name in (
            "grpc_health.v1", "controlplane.sandbox", "controlplane.store", "controlplane.store.base",
            "sandbox.v1", "sandbox.v1.agent_pb2",
        )
    }
