"""core/ stays free of transport: it imports neither grpc nor docker."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "controlplane" / "core"
FORBIDDEN = ("grpc", "docker", "controlplane.rpc", "controlplane.v1", "sandbox.v1")


def test_core_imports_no_transport() -> None:
    offenders = []
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN or n.startswith(FORBIDDEN)]
    assert offenders == []
