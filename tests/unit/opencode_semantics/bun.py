"""Running a script in the real Bun, the JavaScript engine the shared semantics are checked against."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


def find_bun() -> Path:
    found = [ROOT / "build/image/bun", *sorted(ROOT.glob("build/cache/bun-*/package/bin/bun"))]
    for path in found:
        if path.is_file():
            return path
    pytest.fail("no Bun binary: expected build/image/bun or build/cache/bun-*/package/bin/bun (run `make image`)")


def run_js(script: str, cases: Any) -> Any:
    """What `script` writes to stdout (JSON) when given `cases` as JSON on stdin."""
    proc = subprocess.run(
        [str(find_bun()), "-e", script], input=json.dumps(cases), capture_output=True, text=True, timeout=60,
        check=True,
    )
    return json.loads(proc.stdout)
