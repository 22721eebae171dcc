"""Calls a configured rule denies: the message lists the rules of the request's permission, as upstream's session
ask writes them (recorded through a session, see session_record.py)."""

from tests.oracle.cases import Case
from tests.oracle.file_case_parts import GPT


def _patch(*lines: str) -> dict[str, str]:
    return {"patchText": "\n".join(("*** Begin Patch", *lines, "*** End Patch"))}


CASES = [
    # Tool-level rules: the tool stays offered (its last rule is not a blanket deny) and this call is denied.
    Case("edit_denied_by_tool_rule_after_read", "edit", {"filePath": "a.txt", "oldString": "a", "newString": "b"},
         {"a.txt": "a\n"}, config={"permission": {"edit": {"*": "deny", "notes/*": "allow"}}}),
    Case("write_denied_by_tool_rule", "write", {"filePath": "x.lock", "content": "x\n"},
         config={"permission": {"edit": {"*": "allow", "*.lock": "deny"}}}),
    # A bare action for every permission, then the tool's own pattern rule: bare rules are listed like the others.
    Case("bash_denied_by_bare_rule", "bash", {"command": "rm -f a.txt", "description": "remove"}, {"a.txt": "a\n"},
         config={"permission": {"*": "deny", "bash": {"ls *": "allow"}}}),
    Case("apply_patch_denied_by_tool_rule", "apply_patch", _patch("*** Add File: src/x.txt", "+x"),
         config={**GPT, "permission": {"edit": {"*": "deny", "docs/*": "allow"}}}),
    # The plan agent: its plan-file rule is written relative to the worktree (the git workspace here).
    Case("edit_plan_agent_denied_after_read", "edit", {"filePath": "a.txt", "oldString": "a", "newString": "b"},
         {"a.txt": "a\n"}, agent="plan"),
    Case("write_plan_agent_denied", "write", {"filePath": "new.md", "content": "x\n"}, agent="plan"),
    Case("edit_plan_agent_denied_not_git_after_read", "edit",
         {"filePath": "a.txt", "oldString": "a", "newString": "b"}, {"a.txt": "a\n"}, agent="plan", git=False),
]
