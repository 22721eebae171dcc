"""Loading the golden data and, when the real Bun is present, re-running the zod oracle."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
BUN = ROOT / "build" / "image" / "bun"
NODE_MODULES = ROOT / "build" / "image" / "node_modules"
CASES = HERE / "cases.json"
GOLDEN = HERE / "golden.json"


def load_cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(CASES.read_text(encoding="utf-8"))
    return cases


def load_golden() -> dict[str, Any]:
    golden: dict[str, Any] = json.loads(GOLDEN.read_text(encoding="utf-8"))
    return golden


def oracle_available() -> bool:
    return BUN.is_file() and os.access(BUN, os.X_OK) and (NODE_MODULES / "zod").is_dir()


def run_oracle(cases_file: Path = CASES) -> dict[str, Any]:
    """What zod itself says about `cases_file` (the same shape as golden.json)."""
    env = {**os.environ, "NODE_PATH": str(NODE_MODULES)}
    proc = subprocess.run(
        [str(BUN), str(HERE / "oracle.mjs"), str(cases_file)],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout)
    return result
