"""The `grep` tool: regex matches via ripgrep, grouped per file, files newest first."""

from __future__ import annotations

import re
from typing import Any

from opencode_semantics.javascript import JS_WHITESPACE
from sandbox_agent.tools.base import ToolContext, ToolError, ToolOutput
from sandbox_agent.tools.collation import utf16_length, utf16_prefix
from sandbox_agent.tools.glob import defined, mtimes_ms
from sandbox_agent.tools.paths import assert_external_directory, resolve, without_read_denied

LIMIT = 100
MAX_LINE_LENGTH = 2000
NO_FILES = "No files found"
_NEWLINE = re.compile(r"\r?\n")
_LEADING_INT = re.compile(r"[ \t\n\v\f\r\u00a0\ufeff]*([+-]?[0-9]+)")
# What JavaScript's String.prototype.trim() removes.


async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    pattern = args.get("pattern")
    if not pattern:
        raise ToolError("pattern is required")
    pattern = str(pattern)
    raw_path, include = args.get("path"), args.get("include")
    await ctx.ask("grep", [pattern], ["*"], defined({"pattern": pattern, "path": raw_path, "include": include}))
    search = resolve(ctx, raw_path or ctx.directory)
    await assert_external_directory(ctx, search, kind="directory")

    argv = ["rg", "-nH", "--hidden", "--no-messages", "--field-match-separator=|", "--regexp", pattern]
    if include:
        argv += ["--glob", str(include)]
    argv.append(search)
    result = await ctx.run(argv, cwd=ctx.directory)
    stdout = result.stdout.decode("utf-8", errors="replace")
    # rg exits 1 for no match and 2 for errors (an invalid regex too), possibly after printing matches.
    if result.exit_code == 1 or (result.exit_code == 2 and not stdout.strip(JS_WHITESPACE)):
        return _empty(pattern)
    if result.exit_code not in (0, 2):
        raise ToolError(f"ripgrep failed: {result.stderr.decode('utf-8', errors='replace')}")

    rows = _parse(stdout)
    files = sorted({path for path, _, _ in rows})
    if ctx.rules is not None and ctx.rules.may_deny("read"):
        # No line of a file a read deny covers (by its name, where a link leads, or another hard link).
        kept = set(await without_read_denied(ctx, files))
        rows = [row for row in rows if row[0] in kept]
        files = [path for path in files if path in kept]
    times = await ctx.io(mtimes_ms, files)
    matches = [(path, line, text) for path, line, text in rows if times[path] is not None]
    matches.sort(key=lambda match: -(times[match[0]] or 0))  # stable: ties keep ripgrep's order
    if not matches:
        return _empty(pattern)

    total = len(matches)
    truncated = total > LIMIT
    out = [f"Found {total} matches" + (f" (showing first {LIMIT})" if truncated else "")]
    current = ""
    for path, line, text in matches[:LIMIT]:
        if path != current:
            if current:
                out.append("")
            current = path
            out.append(f"{path}:")
        if utf16_length(text) > MAX_LINE_LENGTH:
            text = utf16_prefix(text, MAX_LINE_LENGTH) + "..."
        out.append(f"  Line {line}: {text}")
    if truncated:
        out += ["", f"(Results truncated: showing {LIMIT} of {total} matches ({total - LIMIT} hidden). "
                    "Consider using a more specific path or pattern.)"]
    if result.exit_code == 2:
        out += ["", "(Some paths were inaccessible and skipped)"]
    return ToolOutput(title=pattern, output="\n".join(out), metadata={"matches": total, "truncated": truncated})


def _parse(stdout: str) -> list[tuple[str, str, str]]:
    """`path|line|text` records; the text keeps any further `|`. Like upstream, the whole output is trimmed."""
    rows: list[tuple[str, str, str]] = []
    for record in _NEWLINE.split(stdout.strip(JS_WHITESPACE)):
        path, _, rest = record.partition("|")
        number, sep, text = rest.partition("|")
        if not path or not number or not sep:
            continue
        rows.append((path, _js_parse_int(number), text))
    return rows


def _js_parse_int(text: str) -> str:
    """How JavaScript prints `parseInt(text, 10)`."""
    match = _LEADING_INT.match(text)
    return str(int(match.group(1))) if match else "NaN"


def _empty(pattern: str) -> ToolOutput:
    return ToolOutput(title=pattern, output=NO_FILES, metadata={"matches": 0, "truncated": False})
