"""`tools.descriptions_dir`: an operator's own text for built-in tools' descriptions, read and checked at start.

The built-in descriptions are the platform's own words. A site that wants other text (upstream's exact prompts,
a house style) puts `<tool id>.txt` files in a directory; each replaces that tool's description wherever the
tool is listed, with the same `${name}` placeholders filled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from pathlib import Path

from controlplane.core.calls.tool import InitContext, ToolDefinition, ToolInfo
from controlplane.errors import ConfigError
from controlplane.tools.describe import OVERRIDE

MAX_BYTES = 256 * 1024
"""Far above any built-in description (bash's, the longest, is about 10 KiB): a bigger file is a mistake."""


def load_descriptions(directory: Path | None, tool_ids: Collection[str]) -> dict[str, str]:
    """tool id -> text; raises ConfigError naming every problem (unknown ids list the known ones)."""
    if directory is None:
        return {}
    if not directory.is_dir():
        raise ConfigError(f"tools.descriptions_dir {directory}: not a directory")
    texts: dict[str, str] = {}
    problems: list[str] = []
    for entry in sorted(directory.iterdir()):
        if entry.name.startswith("."):
            continue  # editors' and version control's files
        if entry.suffix != ".txt" or not entry.is_file():
            problems.append(f"{entry.name}: not a <tool id>.txt file")
            continue
        if entry.stem not in tool_ids:
            problems.append(f"{entry.name}: no built-in tool has the id {entry.stem!r}")
            continue
        if entry.stat().st_size > MAX_BYTES:
            problems.append(f"{entry.name}: larger than {MAX_BYTES // 1024} KiB")
            continue
        try:
            text = entry.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{entry.name}: unreadable ({exc})")
            continue
        if not text.strip():
            problems.append(f"{entry.name}: empty")
            continue
        texts[entry.stem] = text
    if problems:
        raise ConfigError(
            f"tools.descriptions_dir {directory}: " + "; ".join(problems)
            + f" (built-in tool ids: {', '.join(sorted(tool_ids))})"
        )
    return texts


def described(tools: Mapping[str, ToolInfo], texts: Mapping[str, str]) -> dict[str, ToolInfo]:
    """`tools` with the overridden ones initialised under their operator's text."""
    return {tool_id: _with_text(info, texts[tool_id]) if tool_id in texts else info for tool_id, info in tools.items()}


def _with_text(info: ToolInfo, text: str) -> ToolInfo:
    init = info.init

    async def initialised(ctx: InitContext) -> ToolDefinition:
        token = OVERRIDE.set(text)
        try:
            definition = await init(ctx)
        finally:
            OVERRIDE.reset(token)
        # A tool whose description is not built from its .txt still gets the operator's text.
        if definition.description != text.strip() and "${" not in text:
            definition = dataclasses.replace(definition, description=text.strip())
        return definition

    return dataclasses.replace(info, init=initialised)
