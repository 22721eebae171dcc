"""ReloadTools: what a session's new code snapshot changed, told in tool ids and in files.

A session's custom tools, plugins, skills and local MCP servers are fixed when it is created; the API
caller (never a tool call) takes the workspace's current files with ReloadTools. Its answer says which
tool ids appeared, changed (another definition, or the file defining them changed) or went, and which
files of the snapshot were added, changed or removed, so a caller can show the user what it accepted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from controlplane.core.calls.tool import ToolInfo
from controlplane.core.seam.messages import CodeChanges, CustomListing

EVENT = "tools.reloaded"


@dataclass(frozen=True)
class ReloadReport:
    added: list[str] = field(default_factory=list)
    """Tool ids offered now that were not before (custom, plugin and MCP tools)."""
    changed: list[str] = field(default_factory=list)
    """Tool ids whose definition or defining file changed."""
    removed: list[str] = field(default_factory=list)
    files: CodeChanges = field(default_factory=CodeChanges)
    load_errors: list[tuple[str, str]] = field(default_factory=list)
    """What the new snapshot could not load (origin, message), as ListTools reports it."""

    def summary(self) -> str:
        """One line for the audit record."""
        def listed(name: str, items: Sequence[str]) -> str:
            return f"{name}: {', '.join(items) if items else '-'}"

        return "; ".join([
            listed("tools added", self.added), listed("tools changed", self.changed),
            listed("tools removed", self.removed), listed("files added", self.files.added),
            listed("files changed", self.files.changed), listed("files removed", self.files.removed),
        ])

    def event_properties(self) -> dict[str, object]:
        return {
            "added": self.added, "changed": self.changed, "removed": self.removed,
            "files": {"added": self.files.added, "changed": self.files.changed, "removed": self.files.removed},
            "loadErrors": len(self.load_errors),
        }


def tool_signatures(listing: CustomListing | None, mcp_tools: Sequence[ToolInfo]) -> dict[str, tuple[str, str]]:
    """Tool id -> (its origin, its definition as text) for the tools a snapshot brings (custom, plugin, MCP)."""
    found: dict[str, tuple[str, str]] = {}
    for spec in listing.tools if listing is not None else []:
        definition = json.dumps([spec.source, spec.description, spec.parameters], sort_keys=True)
        found[spec.id] = (spec.origin, definition)
    for tool in mcp_tools:
        found[tool.id] = (tool.origin, json.dumps([tool.source.value, tool.origin], sort_keys=True))
    return found


def compare(before: dict[str, tuple[str, str]], after: dict[str, tuple[str, str]], files: CodeChanges,
            load_errors: list[tuple[str, str]]) -> ReloadReport:
    touched = set(files.added) | set(files.changed) | set(files.removed)
    changed = [
        tool_id for tool_id, (origin, definition) in after.items()
        if tool_id in before and (before[tool_id] != (origin, definition) or origin in touched)
    ]
    return ReloadReport(
        added=sorted(t for t in after if t not in before), changed=sorted(changed),
        removed=sorted(t for t in before if t not in after), files=files, load_errors=load_errors,
    )
