"""Records what upstream OpenCode v1.2.27 answers to each oracle case, with its own binary (from npm).

    .venv/bin/python -m tests.oracle.record [GROUP ...]     (default: every group)

Each case runs `opencode debug agent <agent> --tool <id> --params <json>` in a fresh workspace, with a home
of its own, and the answer is stored in tests/oracle/recorded/<group>.json with paths written as the
sandbox's. Upstream's asks are not exercised by this command (it allows everything). A call it denies is
recorded again through a real upstream session (session_record.py): its debug command lists denied rules
its own way, not as a session's ask does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.oracle import session_record
from tests.oracle.cases import GROUPS, Case, Recorded, cases, load, normalise, reads_first, save

VERSION = "1.2.27"
REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "cache" / f"opencode-{VERSION}"
BINARY = CACHE / "package" / "bin" / "opencode"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TIMEOUT_S = 120
PARALLEL = 3
LOCKED_RETRIES = 4
RG_DIR = REPO / ".venv" / "bin"
"""Upstream looks for `rg` on PATH (else downloads it); the PyPI wheel's matches the sandbox's 14.1.0."""


def ensure_binary() -> Path:
    if not BINARY.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "pack", "--silent", f"opencode-linux-x64@{VERSION}"], cwd=CACHE, check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["tar", "xzf", f"opencode-linux-x64-{VERSION}.tgz"], cwd=CACHE, check=True)
    return BINARY


def _write_files(workspace: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        path = workspace / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content.startswith("base64:"):
            path.write_bytes(base64.b64decode(content[len("base64:"):]))
        else:
            path.write_bytes(content.encode("utf-8", "surrogateescape"))


def prepare(case: Case, workspace: Path) -> None:
    workspace.mkdir(parents=True)
    _write_files(workspace, case.files)
    if case.config:
        (workspace / "opencode.json").write_text(json.dumps(case.config))
    if case.git:
        subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    if case.setup:
        subprocess.run(["bash", "-c", case.setup], cwd=workspace, check=True)


def parse(stdout: str, stderr: str) -> tuple[dict[str, object] | None, str | None]:
    start = stdout.find("\n{")
    start = 0 if stdout.startswith("{") else start + 1 if start >= 0 else -1
    if start >= 0:
        answer = json.loads(stdout[start:])
        return answer["result"], None
    text = ANSI.sub("", stderr + stdout)
    marker = text.find("Error: ")
    if marker < 0:
        raise RuntimeError(f"neither a result nor an error:\n{text[-2000:]}")
    rest = text[marker:].split("\n", 1)[1] if "\n" in text[marker:] else ""
    return None, rest.strip("\n")


async def record(case: Case, root: Path, home: Path, gate: asyncio.Semaphore) -> Recorded:
    async with gate:
        workspace = root / case.name / "workspace"
        prepare(case, workspace)
        env = {
            "PATH": f"{RG_DIR}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb",
            "USER": "tool", "SHELL": "/bin/bash", "TMPDIR": "/tmp",
            "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".local/state"),
            "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
        }
        if reads_first(case):
            env["OPENCODE_DISABLE_FILETIME_CHECK"] = "true"
        for attempt in range(LOCKED_RETRIES):
            if attempt:  # upstream's database is shared by the parallel runs: start again from a fresh workspace
                shutil.rmtree(workspace)
                prepare(case, workspace)
            proc = await asyncio.create_subprocess_exec(
                str(BINARY), "debug", "agent", case.agent, "--tool", case.tool, "--params", json.dumps(case.params),
                cwd=workspace, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
            finally:
                if proc.returncode is None:  # timed out or cancelled: no upstream process outlives its case
                    proc.kill()
                    await proc.wait()
            result, error = parse(out.decode(errors="replace"), err.decode(errors="replace"))
            if error != "database is locked":
                break
        if session_record.wants_session(error):
            return await record_session(case, root, env)
        return Recorded(case, normalise(result, str(workspace), str(home)), normalise(error, str(workspace), str(home)))


async def record_session(case: Case, root: Path, debug_env: dict[str, str]) -> Recorded:
    """A denied call again, through a session (see session_record): what a model is told."""
    workspace, home = session_record.session_home(root, case)
    prepare(case, workspace)
    env = session_record.environment(home, debug_env["PATH"])
    # A denial is what is recorded: edit's read-before-write check (which upstream makes first) is not.
    env["OPENCODE_DISABLE_FILETIME_CHECK"] = "true"
    error = await session_record.run_session(BINARY, case, workspace, env, TIMEOUT_S)
    return Recorded(case, None, normalise(error, str(workspace), str(home)))


async def main(groups: list[str]) -> None:
    ensure_binary()
    root = Path(tempfile.mkdtemp(prefix="ocsb-oracle-"))
    try:
        home = root / "home"
        home.mkdir()
        gate = asyncio.Semaphore(PARALLEL)
        for group in groups:
            # ORACLE_ONLY_NEW=1 keeps the stored answers of unchanged cases and records only the others.
            # ORACLE_RERECORD=name,... records those cases again even then.
            again = set(os.environ.get("ORACLE_RERECORD", "").split(","))
            kept = ({r.case.name: r for r in load(group) if r.case.name not in again}
                    if os.environ.get("ORACLE_ONLY_NEW") else {})
            fresh = await asyncio.gather(*(record(c, root, home, gate) for c in cases(group) if c.name not in kept))
            by_name = {**kept, **{r.case.name: r for r in fresh}}
            recorded = [by_name[c.name] for c in cases(group)]
            save(group, recorded)
            print(f"{group}: {len(recorded)} cases recorded", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or list(GROUPS)))
