"""One oracle case: a workspace, one tool call, and what upstream answered (filled in by record.py)."""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RECORDED = Path(__file__).parent / "recorded"
GROUPS = ("files", "search", "shell", "misc", "file_edges", "search_edges", "bash_edges", "arguments", "denied")
"""Modules tests/oracle/cases_<group>.py, each with a CASES list."""
WORKSPACE = "/workspace"
HOME = "/tmp/home"
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
OUTPUT_ID = re.compile(r"tool_[0-9a-f]{12}[0-9A-Za-z]{14}")


@dataclass(frozen=True)
class Case:
    name: str
    tool: str
    params: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)
    """Workspace files (text); a value starting with `base64:` is binary."""
    git: bool = True
    """`git init` the workspace first, so the worktree is the workspace (titles are relative to it)."""
    agent: str = "build"
    setup: str = ""
    """A shell script run in the workspace before the call (symlinks, modes, big files)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The session's opencode.json (upstream: the workspace's opencode.json)."""


@dataclass
class Recorded:
    case: Case
    result: dict[str, Any] | None
    """{title, output, metadata} (attachments too, when any), with paths normalised; None for an error."""
    error: str | None


READ_FIRST = "_after_read"
"""A case whose name contains this edits or overwrites a file the session has read first. Upstream's debug command
runs one call per session, so it is recorded with OPENCODE_DISABLE_FILETIME_CHECK; our side really calls `read` on
`filePath` first, in the same session."""


def reads_first(case: Case) -> bool:
    return READ_FIRST in case.name


def cases(group: str) -> list[Case]:
    module = importlib.import_module(f"tests.oracle.cases_{group}")
    found: list[Case] = module.CASES
    names = [c.name for c in found]
    assert len(names) == len(set(names)), f"duplicate case names in {group}"
    return found


def normalise(value: Any, workspace: str, home: str) -> Any:
    """Upstream's paths (its temporary workspace and home) written as the sandbox's, and output ids masked."""
    if isinstance(value, str):
        text = value
        if workspace:  # empty on our side, whose paths are already the sandbox's
            text = text.replace(workspace, WORKSPACE).replace(workspace.lstrip("/"), WORKSPACE.lstrip("/"))
            text = text.replace(home, HOME).replace(home.lstrip("/"), HOME.lstrip("/"))
        return OUTPUT_ID.sub("tool_ID", text)
    if isinstance(value, list):
        return [normalise(v, workspace, home) for v in value]
    if isinstance(value, dict):
        return {normalise(k, workspace, home): normalise(v, workspace, home) for k, v in value.items()}
    return value


def mask_ids(value: Any) -> Any:
    """Our side of the comparison: output ids masked the same way."""
    return normalise(value, "", "")


def load(group: str) -> list[Recorded]:
    path = RECORDED / f"{group}.json"
    if not path.exists():
        return []
    by_name = {c.name: c for c in cases(group)}
    found = []
    for entry in json.loads(path.read_text()):
        case = by_name.get(entry["name"])
        if case is not None and asdict(case) == entry["case"]:  # a changed case needs recording again
            found.append(Recorded(case, entry["result"], entry["error"]))
    return found


def save(group: str, recorded: list[Recorded]) -> None:
    RECORDED.mkdir(exist_ok=True)
    entries = [{"name": r.case.name, "case": asdict(r.case), "result": r.result, "error": r.error} for r in recorded]
    text = json.dumps(entries, indent=1, ensure_ascii=False)
    # A lone surrogate (JavaScript strings may hold one) cannot be UTF-8: keep it as its JSON escape.
    text = LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    # Written aside and renamed, so a concurrent reader (or a failed run) never sees half a file.
    partial = RECORDED / f".{group}.json.partial"
    partial.write_text(text + "\n")
    partial.replace(RECORDED / f"{group}.json")
