"""glob, grep and list through `run`, against the real ripgrep on PATH."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sandbox_agent.process import Execution
from sandbox_agent.tools import glob, grep
from sandbox_agent.tools import list as list_tool
from sandbox_agent.tools.base import ProcessResult, ToolContext, ToolError
from sandbox_agent.tools.runner import ToolRunner

from .conftest import Asked, Recorder

MakeCtx = Callable[..., ToolContext]
T = TypeVar("T")



@pytest.fixture(autouse=True)
def ripgrep_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned ripgrep wheel installs `rg` next to the venv's python; the runner finds programs via PATH."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert shutil.which("rg") is not None, "ripgrep is not installed"


GLOB_TRUNCATED = "(Results are truncated: showing first 100 results. Consider using a more specific path or pattern.)"


def touch(path: Path, content: str = "", mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


# --- glob ---

async def test_glob_newest_first(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    old = touch(project / "old.py", mtime=1_000_000)
    new = touch(project / "src" / "deep" / "new.py", mtime=3_000_000)
    mid = touch(project / ".hidden.py", mtime=2_000_000)
    touch(project / "notes.txt", mtime=4_000_000)
    result = await glob.run({"pattern": "*.py"}, make_ctx(worktree=str(project)))
    assert result.output == f"{new}\n{mid}\n{old}"
    assert result.metadata == {"count": 3, "truncated": False}
    assert result.title == ""
    assert recorder.asks == [Asked("glob", ["*.py"], ["*"], {"pattern": "*.py"})]


async def test_glob_no_files(make_ctx: MakeCtx, project: Path) -> None:
    result = await glob.run({"pattern": "*.rs"}, make_ctx())
    assert result.output == "No files found"
    assert result.metadata == {"count": 0, "truncated": False}
    assert result.title == str(project).lstrip("/")


async def test_glob_git_exclusion_loses_to_the_pattern(make_ctx: MakeCtx, project: Path) -> None:
    # rg applies the last matching --glob: the pattern's whitelist comes after "!.git/*", so a file directly
    # in .git that matches is listed (as upstream does), while .git's subdirectories are never entered.
    touch(project / ".git" / "config.py", mtime=2_000_000)
    touch(project / ".git" / "objects" / "deep.py")
    touch(project / "a.py", mtime=1_000_000)
    result = await glob.run({"pattern": "*.py"}, make_ctx())
    assert result.output == f"{project / '.git' / 'config.py'}\n{project / 'a.py'}"


async def test_glob_truncates_at_100(make_ctx: MakeCtx, project: Path) -> None:
    for i in range(105):
        touch(project / f"f{i:03d}.txt", mtime=1_000_000 + i)
    result = await glob.run({"pattern": "*.txt"}, make_ctx())
    paths, _, footer = result.output.partition("\n\n")
    assert footer == GLOB_TRUNCATED
    lines = paths.split("\n")
    assert len(lines) == 100
    times = [os.stat(p).st_mtime for p in lines]
    assert times == sorted(times, reverse=True)
    assert result.metadata == {"count": 100, "truncated": True}


async def test_glob_exactly_100_is_not_truncated(make_ctx: MakeCtx, project: Path) -> None:
    for i in range(100):
        touch(project / f"f{i:03d}.txt")
    result = await glob.run({"pattern": "*.txt"}, make_ctx())
    assert result.metadata == {"count": 100, "truncated": False}
    assert "truncated" not in result.output


async def test_glob_lists_gitignored_file_that_matches(make_ctx: MakeCtx, project: Path) -> None:
    (project / ".git").mkdir()
    touch(project / ".gitignore", "secret.txt\nignored/\n")
    touch(project / "secret.txt", mtime=2_000_000)
    touch(project / "ignored" / "inner.txt")
    touch(project / "kept.txt", mtime=1_000_000)
    result = await glob.run({"pattern": "*.txt"}, make_ctx())
    assert result.output == f"{project / 'secret.txt'}\n{project / 'kept.txt'}"
    # A pattern that also matches the ignored directory whitelists it, so rg walks into it.
    result = await glob.run({"pattern": "**"}, make_ctx())
    assert str(project / "ignored" / "inner.txt") in result.output.split("\n")


async def test_glob_honours_ignore_files_without_git(make_ctx: MakeCtx, project: Path) -> None:
    # Outside a git repository rg ignores .gitignore but still honours .ignore.
    touch(project / ".gitignore", "a.txt\n")
    touch(project / ".ignore", "skipped/\n")
    touch(project / "a.txt")
    touch(project / "skipped" / "b.txt")
    result = await glob.run({"pattern": "*.txt"}, make_ctx())
    assert result.output == str(project / "a.txt")


async def test_glob_relative_path(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    file = touch(project / "sub" / "x.md")
    touch(project / "y.md")
    result = await glob.run({"pattern": "*.md", "path": "sub"}, make_ctx(worktree=str(project)))
    assert result.output == str(file)
    assert result.title == "sub"
    assert recorder.asks == [Asked("glob", ["*.md"], ["*"], {"pattern": "*.md", "path": "sub"})]


async def test_glob_missing_directory(make_ctx: MakeCtx, project: Path) -> None:
    with pytest.raises(ToolError) as err:
        await glob.run({"pattern": "*", "path": "nowhere"}, make_ctx())
    assert str(err.value) == f"No such file or directory: '{project / 'nowhere'}'"
    touch(project / "file.txt")
    with pytest.raises(ToolError) as err:
        await glob.run({"pattern": "*", "path": "file.txt"}, make_ctx())
    assert str(err.value) == f"No such file or directory: '{project / 'file.txt'}'"


async def test_glob_external_asks_after_glob(make_ctx: MakeCtx, tmp_path: Path, recorder: Recorder) -> None:
    outside = tmp_path / "outside"
    touch(outside / "o.txt")
    result = await glob.run({"pattern": "*.txt", "path": str(outside)}, make_ctx())
    assert result.output == str(outside / "o.txt")
    glob_pattern = f"{outside}/*"
    assert recorder.asks == [
        Asked("glob", ["*.txt"], ["*"], {"pattern": "*.txt", "path": str(outside)}),
        Asked("external_directory", [glob_pattern], [glob_pattern],
              {"filepath": str(outside), "parentDir": str(outside)}),
    ]


async def test_glob_denied_before_anything(make_ctx: MakeCtx, recorder: Recorder) -> None:
    recorder.deny.add("glob")
    with pytest.raises(ToolError, match="rejected"):
        await glob.run({"pattern": "*", "path": "/definitely/not/here"}, make_ctx())
    assert [a.permission for a in recorder.asks] == ["glob"]


# --- grep ---

async def test_grep_format_and_order(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    a = touch(project / "a.txt", "alpha\nbeta needle\nneedle|pipe|x\n", mtime=1_000_000)
    b = touch(project / "sub" / "b.txt", "needle first\n", mtime=2_000_000)
    touch(project / "c.txt", "nothing here\n", mtime=3_000_000)
    result = await grep.run({"pattern": "needle"}, make_ctx())
    assert result.output == (f"Found 3 matches\n{b}:\n  Line 1: needle first\n\n"
                             f"{a}:\n  Line 2: beta needle\n  Line 3: needle|pipe|x")
    assert result.title == "needle"
    assert result.metadata == {"matches": 3, "truncated": False}
    assert recorder.asks == [Asked("grep", ["needle"], ["*"], {"pattern": "needle"})]


async def test_grep_include_and_path(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    touch(project / "src" / "m.py", "def f(): pass\n")
    touch(project / "src" / "m.ts", "function f() {}\n")
    touch(project / "other" / "n.py", "def g(): pass\n")
    result = await grep.run({"pattern": "f", "path": "src", "include": "*.py"}, make_ctx())
    assert result.output == f"Found 1 matches\n{project / 'src' / 'm.py'}:\n  Line 1: def f(): pass"
    assert recorder.asks[0].metadata == {"pattern": "f", "path": "src", "include": "*.py"}


async def test_grep_single_file_path(make_ctx: MakeCtx, project: Path) -> None:
    f = touch(project / "one.txt", "x1\ny\nx3\n")
    result = await grep.run({"pattern": "x", "path": str(f)}, make_ctx())
    assert result.output == f"Found 2 matches\n{f}:\n  Line 1: x1\n  Line 3: x3"


async def test_grep_no_match_and_invalid_regex(make_ctx: MakeCtx, project: Path) -> None:
    touch(project / "a.txt", "text\n")
    for pattern in ["absent", "(unclosed", "[z-a]"]:
        result = await grep.run({"pattern": pattern}, make_ctx())
        assert result.output == "No files found"
        assert result.metadata == {"matches": 0, "truncated": False}
        assert result.title == pattern


async def test_grep_missing_path_is_no_files(make_ctx: MakeCtx) -> None:
    result = await grep.run({"pattern": "x", "path": "missing"}, make_ctx())
    assert result.output == "No files found"


async def test_grep_empty_pattern(make_ctx: MakeCtx, recorder: Recorder) -> None:
    with pytest.raises(ToolError) as err:
        await grep.run({"pattern": ""}, make_ctx())
    assert str(err.value) == "pattern is required"
    assert recorder.asks == []


async def test_grep_truncates_at_100(make_ctx: MakeCtx, project: Path) -> None:
    touch(project / "old.txt", "".join(f"hit {i}\n" for i in range(1, 71)), mtime=1_000_000)
    new = touch(project / "new.txt", "".join(f"hit {i}\n" for i in range(1, 51)), mtime=2_000_000)
    old = project / "old.txt"
    result = await grep.run({"pattern": "hit"}, make_ctx())
    lines = result.output.split("\n")
    assert lines[0] == "Found 120 matches (showing first 100)"
    assert lines[1] == f"{new}:"
    assert lines[2] == "  Line 1: hit 1"
    assert lines[51] == "  Line 50: hit 50"
    assert lines[52] == ""
    assert lines[53] == f"{old}:"
    assert lines[54:104] == [f"  Line {i}: hit {i}" for i in range(1, 51)]
    assert lines[104:] == ["", "(Results truncated: showing 100 of 120 matches (20 hidden). "
                               "Consider using a more specific path or pattern.)"]
    assert result.metadata == {"matches": 120, "truncated": True}


async def test_grep_long_line_cut(make_ctx: MakeCtx, project: Path) -> None:
    f = touch(project / "w.txt", "k" + "w" * 2500 + "\n" + "k" + "v" * 1999 + "\n")
    result = await grep.run({"pattern": "^k"}, make_ctx())
    assert result.output == f"Found 2 matches\n{f}:\n  Line 1: k{'w' * 1999}...\n  Line 2: k{'v' * 1999}"


async def test_grep_searches_hidden_and_git(make_ctx: MakeCtx, project: Path) -> None:
    touch(project / ".hidden", "token\n", mtime=2_000_000)
    touch(project / ".git" / "HEAD", "token\n", mtime=1_000_000)
    result = await grep.run({"pattern": "token"}, make_ctx())
    assert result.output == (f"Found 2 matches\n{project / '.hidden'}:\n  Line 1: token\n\n"
                             f"{project / '.git' / 'HEAD'}:\n  Line 1: token")


async def test_grep_crlf_and_trailing_whitespace(make_ctx: MakeCtx, project: Path) -> None:
    f = touch(project / "crlf.txt")
    f.write_bytes(b"one match \r\nmatch two   \r\n")
    result = await grep.run({"pattern": "match"}, make_ctx())
    # rg keeps the \r, the \r\n split drops it; upstream trims the whole output, so only the last line loses
    # its trailing spaces.
    assert result.output == f"Found 2 matches\n{f}:\n  Line 1: one match \n  Line 2: match two"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
async def test_grep_inaccessible_paths(make_ctx: MakeCtx, project: Path) -> None:
    f = touch(project / "ok.txt", "secret\n")
    locked = touch(project / "locked" / "x.txt", "secret\n")
    (project / "locked").chmod(0)
    try:
        result = await grep.run({"pattern": "secret"}, make_ctx())
    finally:
        (project / "locked").chmod(0o755)
    assert result.output == f"Found 1 matches\n{f}:\n  Line 1: secret\n\n(Some paths were inaccessible and skipped)"
    assert locked.exists()


class CannedRun:
    """A runner whose filesystem work is real but whose programs return a fixed result."""

    def __init__(self, real: ToolRunner, result: ProcessResult) -> None:
        self.real, self.result, self.argv = real, result, [""]

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.real.io(fn, *args)

    def io_now(self, fn: Callable[..., T], *args: Any) -> T:
        return self.real.io_now(fn, *args)

    async def run(self, argv: list[str], *, cwd: str, abort: asyncio.Event | None = None) -> ProcessResult:
        self.argv = argv
        return self.result

    async def start(self, argv: list[str], *, cwd: str, env: dict[str, str], timeout_s: float | None,
                    merge_stderr: bool) -> Execution:
        raise NotImplementedError


async def test_grep_exit_2_with_matches(make_ctx: MakeCtx, project: Path, runner: ToolRunner) -> None:
    f = touch(project / "a.txt")
    canned = CannedRun(runner, ProcessResult(2, f"{f}|7|found it\n{project}/gone.txt|1|x\n".encode(), b""))
    ctx = make_ctx()
    ctx.runner = canned
    result = await grep.run({"pattern": "it", "include": "*.txt"}, ctx)
    # gone.txt cannot be stat'ed, so its match is dropped.
    assert result.output == f"Found 1 matches\n{f}:\n  Line 7: found it\n\n(Some paths were inaccessible and skipped)"
    assert canned.argv == ["rg", "-nH", "--hidden", "--no-messages", "--field-match-separator=|", "--regexp", "it",
                           "--glob", "*.txt", str(project)]


async def test_grep_only_unstatable_matches(make_ctx: MakeCtx, project: Path, runner: ToolRunner) -> None:
    ctx = make_ctx()
    ctx.runner = CannedRun(runner, ProcessResult(0, f"{project}/gone.txt|1|x\n".encode(), b""))
    assert (await grep.run({"pattern": "x"}, ctx)).output == "No files found"


async def test_grep_other_exit_code(make_ctx: MakeCtx, runner: ToolRunner) -> None:
    ctx = make_ctx()
    ctx.runner = CannedRun(runner, ProcessResult(-9, b"", b"killed\n"))
    with pytest.raises(ToolError) as err:
        await grep.run({"pattern": "x"}, ctx)
    assert str(err.value) == "ripgrep failed: killed\n"


async def test_grep_external_order(make_ctx: MakeCtx, tmp_path: Path, recorder: Recorder) -> None:
    touch(tmp_path / "out" / "z.txt", "zz\n")
    await grep.run({"pattern": "zz", "path": str(tmp_path / "out")}, make_ctx())
    assert [a.permission for a in recorder.asks] == ["grep", "external_directory"]
    assert recorder.asks[1].patterns == [f"{tmp_path / 'out'}/*"]


def test_grep_parse_quirks() -> None:
    assert grep._parse("/a|3|x|y\n/b|4|\n/c|5\n\n") == [("/a", "3", "x|y"), ("/b", "4", "")]
    assert grep._js_parse_int("12") == "12"
    assert grep._js_parse_int("b.txt") == "NaN"


# --- list ---

async def test_list_tree(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    for rel in ["README.md", "a.txt", "src/main.py", "src/util/helpers.py", "src/util/Z.py", "docs/index.md",
                ".env", "node_modules/pkg/index.js", "__pycache__/x.pyc", "build/out.o", ".git/HEAD", "zig-out",
                ".coverage", "logs/app.log", "venv/bin/python", "src/env/x.py", "src/.coverage", "src/zig-out"]:
        touch(project / rel)
    result = await list_tool.run({}, make_ctx(worktree=str(project)))
    # `!env/*` has a slash, so it is anchored at the listed directory and src/env stays; `!zig-out*` and
    # `!.coverage*` have none and exclude plain files of those names at any depth.
    assert result.output == (
        f"{project}/\n"
        "  docs/\n"
        "    index.md\n"
        "  src/\n"
        "    env/\n"
        "      x.py\n"
        "    util/\n"
        "      Z.py\n"
        "      helpers.py\n"
        "    main.py\n"
        "  .env\n"
        "  README.md\n"
        "  a.txt\n"
    )
    assert result.title == ""
    assert result.metadata == {"count": 8, "truncated": False}
    assert recorder.asks == [Asked("list", [str(project)], ["*"], {"path": str(project)})]


async def test_list_extra_ignores_and_path(make_ctx: MakeCtx, project: Path) -> None:
    for rel in ["pkg/a.py", "pkg/a.log", "pkg/sub/b.py", "pkg/gen/c.py"]:
        touch(project / rel)
    result = await list_tool.run({"path": "pkg", "ignore": ["*.log", "gen/"]}, make_ctx(worktree=str(project)))
    assert result.output == f"{project / 'pkg'}/\n  sub/\n    b.py\n  a.py\n"
    assert result.title == "pkg"


async def test_list_limit(make_ctx: MakeCtx, project: Path) -> None:
    for i in range(120):
        touch(project / f"f{i:03d}")
    result = await list_tool.run({"path": str(project)}, make_ctx())
    lines = result.output.split("\n")
    assert len(lines) == 102  # root line, 100 files, final empty string
    assert result.metadata == {"count": 100, "truncated": True}


async def test_list_empty_and_missing(make_ctx: MakeCtx, project: Path) -> None:
    result = await list_tool.run({}, make_ctx())
    assert result.output == f"{project}/\n"
    assert result.metadata == {"count": 0, "truncated": False}
    with pytest.raises(ToolError) as err:
        await list_tool.run({"path": "gone"}, make_ctx())
    assert str(err.value) == f"No such file or directory: '{project / 'gone'}'"


async def test_list_external_asks_first(make_ctx: MakeCtx, tmp_path: Path, recorder: Recorder) -> None:
    outside = tmp_path / "ext"
    touch(outside / "f")
    recorder.deny.add("external_directory")
    with pytest.raises(ToolError):
        await list_tool.run({"path": str(outside)}, make_ctx())
    assert [a.permission for a in recorder.asks] == ["external_directory"]


def test_render_tree_sorts_by_code_unit() -> None:
    tree = list_tool.render_tree(["b/x", "B/y", "a", "Ä", "_z", "b/c/d"])
    assert tree == "  B/\n    y\n  b/\n    c/\n      d\n    x\n  _z\n  a\n  Ä\n"
