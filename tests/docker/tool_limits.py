"""The workspace and helpers of the built-in tools' limit and failure cases (test_file_tool_limits.py,
test_search_and_shell_limits.py): one archive of edge-case files, and upstream's truncation texts."""

from __future__ import annotations

import base64
from typing import Any

from controlplane.client import ToolOutcome, allow_once
from tests.planes import Plane

WS = "/workspace"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
BIG_LINE = "b" * 2500
CAPPED = [f"{i:04d}" + "x" * 95 for i in range(1, 1001)]  # 99 characters a line
FILES: dict[str, str | bytes] = {
    "long.txt": "a" * 2500 + "\nshort\n",
    "capped.txt": "".join(line + "\n" for line in CAPPED),
    "empty.txt": "",
    "cr.txt": "a\rb\nc\n",
    "entries/e1.txt": "1", "entries/e2.txt": "2", "entries/e3.txt": "3", "entries/e4.txt": "4",
    "entries/e5/x.txt": "5",
    "schema.fbs": "table T {}\n",
    "icon.svg": "<svg/>\n",
    "pic.png": PNG,
    "empty.dat": "",
    "sub/AGENTS.md": "Be careful here.\n",
    "sub/code.txt": "x = 1\n",
    "e/trimmed.py": "def f():\n    x = 1\n    y = 2\n",
    "e/anchor.txt": "start\n  alpha = 1\n  beta = 2\nend\n",
    "e/unrelated.txt": "start\n  one\n  two\nend\n",
    "e/spaces.txt": "x  =   compute(a,  b)\nkeep\n",
    "e/inline.txt": "    result  =  value + 1  # note\n",
    "e/escape.txt": "msg = 'a\tb'\n",
    "e/boundary.txt": "x = f(1,\n      2) + g\n",
    "e/context.txt": "begin\n\n\n\nfoo\nxyz\nend\n",
    "e/many.txt": "a b a b a\n",
    "e/stale.txt": "old\n",
    "p/ctx.py": "def g():\n    return 1\n\ndef f():\n    return 1\n",
    "p/mv/src.txt": "one\ntwo\n",
    "p/keep.txt": "keep\n",
    "gi/a.py": "needle\n", "gi/b.txt": "needle\n",
    "gh/h.txt": "hit\n" * 105,
    "gl/long.txt": "needle" + "c" * 2500 + "\n",
    "gg/.git/config": "[core] hiddenneedle\n", "gg/.hid/x.txt": "hiddenneedle\n",
    "lst/a.txt": "", "lst/zz.txt": "", "lst/sub/b.txt": "", "lst/sub/deeper/c.txt": "", "lst/keep/skip.log": "",
    "lst/node_modules/m.js": "", "lst/build/out.o": "", "lst/.coverage": "", "lst/__pycache__/c.pyc": "",
    "w/over.txt": "before\n",
    "p/obsolete.txt": "obsolete\n",
    **{f"coll/{name}": "" for name in ["Zed", "éclair", "B.txt", "Apple2", "apple", "a.txt", "9.txt", "10.txt",
                                        ".hidden", "_under"]},
}



async def call(plane: Plane, session: str, tool: str, args: dict[str, Any] | str, **kw: Any) -> ToolOutcome:
    """One call; asks are approved once unless the test answers them (these tests check the limits past the ask)."""
    kw.setdefault("on_permission", allow_once)
    return await plane.client.execute_tool(session, tool, args, **kw)


async def sh(plane: Plane, session: str, script: str) -> bytes:
    done = await plane.client.run(session, ["sh", "-c", script])
    assert done.exit_code == 0, done.stderr
    return done.stdout


def asks(outcome: ToolOutcome) -> list[tuple[str, list[str], list[str]]]:
    return [(r.permission, list(r.patterns), list(r.always)) for r in outcome.permission_requests]


def file_output(path: str, body: str) -> str:
    return f"<path>{path}</path>\n<type>file</type>\n<content>{body}\n</content>"


TASK_HINT = ("Use the Task tool to have explore agent process this file with Grep and Read (with offset/limit). "
             "Do NOT read the full file yourself - delegate to save context.")
GREP_HINT = "Use Grep to search the full content or Read with offset/limit to view specific sections."


def truncated_head(preview: str, removed: int, unit: str, path: str, hint: str) -> str:
    return (f"{preview}\n\n...{removed} {unit} truncated...\n\nThe tool call succeeded but the output was truncated. "
            f"Full output saved to: {path}\n{hint}")
