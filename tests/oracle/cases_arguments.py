"""Oracle cases for tool arguments (upstream v1.2.27).

Mostly the invalid-arguments text (zod's issues: codes, paths, order, the noun after "received") for every
built-in tool the build agent has, then edge cases of todowrite, skill, task and invalid. `list` and `todoread`
are not registered upstream, so `debug agent` cannot run them.
"""

from typing import Any

from tests.oracle.cases import Case


def _todo(content: str, status: str = "pending", priority: str = "medium") -> dict[str, str]:
    return {"content": content, "status": status, "priority": priority}


def _skill(name: str, description: str, body: str = "Do the thing.\n") -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}"


def _bash(**params: Any) -> dict[str, Any]:
    return {"command": "echo hi", "description": "Prints hi", **params}


URL = "http://127.0.0.1:9/"
"""Never fetched: each webfetch case fails before any request (validation or the URL check)."""

BASH = [
    Case("mx_bash_all_wrong", "bash", {"command": 1, "timeout": "x", "workdir": None, "description": []}),
    Case("mx_bash_description_object", "bash", {"command": "echo hi", "description": {"a": 1}}),
    Case("mx_bash_timeout_array", "bash", _bash(timeout=[5])),
    Case("mx_bash_command_bool_unicode_description", "bash", {"command": False, "description": "日本語 ✓ 😀"}),
    Case("mx_bash_missing_command_wrong_timeout", "bash", {"description": "d", "timeout": False}),
    Case("mx_bash_timeout_negative_tiny", "bash", _bash(timeout=-1e-7)),
    Case("mx_bash_timeout_negative_huge", "bash", _bash(timeout=-1e21)),
    Case("mx_bash_timeout_negative_decimal", "bash", _bash(timeout=-123.456)),
    Case("mx_bash_timeout_negative_past_safe_int", "bash", _bash(timeout=-(2**53 + 1))),
]

READ = [
    Case("mx_read_offset_object", "read", {"filePath": "a.txt", "offset": {}}, {"a.txt": "a\n"}),
    Case("mx_read_offset_two_item_array", "read", {"filePath": "a.txt", "offset": [1, 2]}, {"a.txt": "a\n"}),
    Case("mx_read_limit_infinity_text", "read", {"filePath": "a.txt", "limit": "Infinity"}, {"a.txt": "a\n"}),
    Case("mx_read_all_wrong", "read", {"filePath": [], "offset": "x", "limit": {}}),
    Case("mx_read_file_path_bool", "read", {"filePath": True}),
    Case("mx_read_offset_false", "read", {"filePath": "n.txt", "offset": False}, setup="seq 1 3 > n.txt"),
    Case("mx_read_missing_path_bad_limit", "read", {"limit": "ten"}),
    # Numbers beyond the safe integers: JavaScript holds them as doubles, and writes them so in messages.
    Case("mx_read_offset_past_safe_int", "read", {"filePath": "n.txt", "offset": 2**53 + 1}, setup="seq 1 3 > n.txt"),
    Case("mx_read_offset_1e21", "read", {"filePath": "n.txt", "offset": 1e21}, setup="seq 1 3 > n.txt"),
    Case("mx_read_offset_negative_fraction", "read", {"filePath": "n.txt", "offset": -2.5}, setup="seq 1 3 > n.txt"),
]

WRITE_EDIT = [
    Case("mx_write_all_wrong", "write", {"content": None, "filePath": 3}),
    Case("mx_edit_all_wrong", "edit", {"filePath": 1, "oldString": None, "newString": [], "replaceAll": "yes"}),
    Case("mx_edit_replace_all_number", "edit", {"filePath": "a.txt", "oldString": "a", "newString": "b",
                                                "replaceAll": 1}, {"a.txt": "a\n"}),
    Case("mx_edit_missing_old_only", "edit", {"filePath": "a.txt", "newString": "b"}, {"a.txt": "a\n"}),
]

SEARCH = [
    Case("mx_glob_both_wrong", "glob", {"pattern": None, "path": []}),
    Case("mx_grep_all_wrong", "grep", {"pattern": [], "path": 1, "include": False}),
]

WEBFETCH = [
    Case("mx_webfetch_missing_url", "webfetch", {}),
    Case("mx_webfetch_bad_format", "webfetch", {"url": URL, "format": "pdf"}),
    Case("mx_webfetch_format_null", "webfetch", {"url": URL, "format": None}),
    Case("mx_webfetch_format_uppercase", "webfetch", {"url": URL, "format": "Markdown"}),
    Case("mx_webfetch_timeout_string", "webfetch", {"url": URL, "format": "text", "timeout": "30"}),
    Case("mx_webfetch_all_wrong", "webfetch", {"url": 5, "format": 1, "timeout": True}),
    Case("mx_webfetch_ftp_url", "webfetch", {"url": "ftp://127.0.0.1/x", "format": "text"}),
]

TODOWRITE = [
    Case("mx_todo_item_null", "todowrite", {"todos": [None]}),
    Case("mx_todo_item_array", "todowrite", {"todos": [[]]}),
    Case("mx_todo_several_bad_items", "todowrite", {"todos": [
        {"status": "pending"}, _todo("fine"), {"content": ["x"], "priority": 1, "status": {}}, 7,
    ]}),
    Case("mx_todo_control_chars", "todowrite", {"todos": [
        _todo("nul \u0000 del \u007f unit \u001f shy \u00ad bom \ufeff ps \u2029"),
    ]}),
    Case("mx_todo_one_huge_line", "todowrite", {"todos": [_todo("x" * 60000)]}),
    Case("mx_todo_unicode_status_priority", "todowrite", {"todos": [_todo("ok", "完了", "高")]}),
    Case("mx_todo_content_object", "todowrite", {"todos": [{"content": {"a": 1}, "status": "pending",
                                                              "priority": "low"}]}),
    Case("mx_todo_extra_number_formats", "todowrite", {"todos": [{**_todo("n"), "big": 2**53 + 1,
                                                                  "e21": 1e21, "tiny": 1e-7, "neg0": -0.0,
                                                                  "tenth": 0.1, "third": 1 / 3}]}),
    Case("mx_todo_only_cancelled", "todowrite", {"todos": [_todo("a", "cancelled"), _todo("b", "cancelled")]}),
]

SKILL = [
    Case("mx_skill_name_empty", "skill", {"name": ""}),
    Case("mx_skill_name_array", "skill", {"name": ["alpha"]}),
    # One skill only: several in one directory are listed in the filesystem's order, which differs between hosts.
    Case("mx_skill_name_padded", "skill", {"name": " alpha"}, {".opencode/skill/alpha/SKILL.md": _skill("alpha", "A")}),
    Case("mx_skill_name_glob", "skill", {"name": "*"}, {".opencode/skill/alpha/SKILL.md": _skill("alpha", "A")}),
    Case("mx_skill_extra_key", "skill", {"name": "mid", "extra": 1},
         {".opencode/skill/mid/SKILL.md": _skill("mid", "M")}),
    Case("mx_skill_name_with_space", "skill", {"name": "my skill"},
         {".opencode/skill/spaced/SKILL.md": _skill("my skill", "Spaced name")}),
    Case("mx_skill_unicode_name", "skill", {"name": "ünï"},
         {".opencode/skill/uni/SKILL.md": _skill("ünï", "Unicode name")}),
    Case("mx_skill_not_found_sources", "skill", {"name": "ghost"},
         {".agents/skills/from-agents/SKILL.md": _skill("from-agents", "A"),
          ".claude/skills/from-claude/SKILL.md": _skill("from-claude", "C"),
          ".opencode/skill/from-opencode/SKILL.md": _skill("from-opencode", "O")}),
]

QUESTION = [
    Case("mx_question_item_null", "question", {"questions": [None]}),
    Case("mx_question_item_empty", "question", {"questions": [{}]}),
    Case("mx_question_options_string", "question", {"questions": [{"question": "q?", "header": "h", "options": "a"}]}),
    Case("mx_question_options_mixed", "question", {"questions": [{"question": "q?", "header": "h", "options": [
        {"label": "a", "description": "b", "x": 1}, 5]}]}),
    Case("mx_question_multiple_null", "question", {"questions": [
        {"question": "q?", "header": "h", "options": [], "multiple": None}]}),
    Case("mx_question_second_item_bad", "question", {"questions": [
        {"question": "q?", "header": "h", "options": []}, {"question": 1, "header": "h", "options": [{}]}]}),
]

TASK = [
    Case("mx_task_command_number", "task", {"description": "d", "prompt": "p", "subagent_type": "general",
                                            "command": 1}),
    Case("mx_task_missing_prompt", "task", {"description": "d", "subagent_type": "general"}),
    Case("mx_task_all_wrong", "task", {"description": None, "prompt": 1, "subagent_type": {}, "task_id": [],
                                       "command": False}),
    Case("mx_task_empty_agent", "task", {"description": "", "prompt": "", "subagent_type": ""}),
    Case("mx_task_unknown_agent_unicode", "task",
         {"description": "d", "prompt": "p", "subagent_type": "エージェント ✓"}),
]

INVALID = [
    Case("mx_invalid_both_wrong", "invalid", {"tool": None, "error": []}),
    Case("mx_invalid_unicode_error", "invalid", {"tool": "x", "error": "שלום ✓ 😀 \u0000 end"}),
]

CASES: list[Case] = BASH + READ + WRITE_EDIT + SEARCH + WEBFETCH + TODOWRITE + SKILL + QUESTION + TASK + INVALID
