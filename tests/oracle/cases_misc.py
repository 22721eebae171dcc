"""misc cases: todowrite, invalid, skill, and the validation texts of task and question."""

from tests.oracle.cases import Case


def _todo(content: str, status: str = "pending", priority: str = "medium") -> dict[str, str]:
    return {"content": content, "status": status, "priority": priority}


def _skill(name: str, description: str, body: str = "Do the thing.\n", extra: str = "") -> str:
    return f"---\nname: {name}\ndescription: {description}\n{extra}---\n{body}"


OPENCODE_GITIGNORE = "node_modules\npackage.json\nbun.lock\n.gitignore"
MANY = [_todo(f"task {i}", ["pending", "in_progress", "completed", "cancelled"][i % 4]) for i in range(450)]

TODOWRITE = [
    Case("todo_empty", "todowrite", {"todos": []}),
    Case("todo_one", "todowrite", {"todos": [_todo("Write tests")]}),
    Case("todo_mixed_statuses", "todowrite", {"todos": [
        _todo("a", "pending", "high"), _todo("b", "in_progress", "low"), _todo("c", "completed"),
        _todo("d", "cancelled"), _todo("e", "completed", "high"),
    ]}),
    Case("todo_all_completed", "todowrite", {"todos": [_todo("a", "completed"), _todo("b", "completed")]}),
    Case("todo_key_order_kept", "todowrite", {"todos": [
        {"priority": "high", "status": "pending", "content": "reordered"},
        {"status": "completed", "content": "second", "priority": "low"},
    ]}),
    Case("todo_extra_keys", "todowrite", {"todos": [{**_todo("x"), "id": "1", "note": {"deep": [1, 2.5, None]}}]}),
    Case("todo_unknown_status", "todowrite", {"todos": [_todo("x", "done", "urgent"), _todo("y", "COMPLETED")]}),
    Case("todo_empty_strings", "todowrite", {"todos": [_todo("", "", "")]}),
    Case("todo_unicode_escapes", "todowrite", {"todos": [
        _todo('quote " back \\ slash'), _todo("tab\tnew\nline"), _todo("héllo ✓ 😀 \u2028 \u0001 </script>"),
    ]}),
    Case("todo_extra_top_level", "todowrite", {"todos": [_todo("x")], "merge": True}),
    Case("todo_numeric_key", "todowrite", {"todos": [{"content": "n", "status": "pending", "priority": "low",
                                                      "2": "two", "1": "one"}]}),
    Case("todo_many_truncated", "todowrite", {"todos": MANY}),
    # Validation
    Case("todo_missing_todos", "todowrite", {}),
    Case("todo_todos_string", "todowrite", {"todos": "[]"}),
    Case("todo_todos_null", "todowrite", {"todos": None}),
    Case("todo_todos_object", "todowrite", {"todos": {"content": "x"}}),
    Case("todo_item_string", "todowrite", {"todos": ["do it"]}),
    Case("todo_item_missing_fields", "todowrite", {"todos": [{"content": "only"}]}),
    Case("todo_item_wrong_types", "todowrite", {"todos": [{"content": 1, "status": True, "priority": None}]}),
    Case("todo_second_item_bad", "todowrite", {"todos": [_todo("ok"), {"content": "x", "status": 2}]}),
]

INVALID = [
    Case("invalid_basic", "invalid", {"tool": "nosuch", "error": "Model tried to call unavailable tool 'nosuch'."}),
    Case("invalid_multiline_error", "invalid", {"tool": "read", "error": "line 1\nline 2 ✓\n"}),
    Case("invalid_empty_error", "invalid", {"tool": "", "error": ""}),
    Case("invalid_extra_keys", "invalid", {"tool": "x", "error": "e", "more": 1}),
    Case("invalid_missing_error", "invalid", {"tool": "x"}),
    Case("invalid_missing_both", "invalid", {}),
    Case("invalid_error_number", "invalid", {"tool": "x", "error": 42}),
    Case("invalid_long_error", "invalid", {"tool": "x", "error": "e" * 60000}),
    Case("invalid_many_lines", "invalid", {"tool": "x", "error": "\n".join(f"l{i}" for i in range(2100))}),
]

SKILL = [
    Case("skill_basic", "skill", {"name": "alpha"},
         {".opencode/skill/alpha/SKILL.md": _skill("alpha", "First skill", "# Alpha\n\nUse alpha.\n")}),
    Case("skill_plural_dir", "skill", {"name": "beta"},
         {".opencode/skills/beta/SKILL.md": _skill("beta", "Second skill")}),
    Case("skill_with_file", "skill", {"name": "gamma"},
         {".opencode/skill/gamma/SKILL.md": _skill("gamma", "Has a script"),
          ".opencode/skill/gamma/scripts/run.sh": "echo hi\n"}),
    Case("skill_hidden_file_listed", "skill", {"name": "delta"},
         {".opencode/skill/delta/SKILL.md": _skill("delta", "Hidden file"),
          ".opencode/skill/delta/.env.example": "A=1\n"}),
    Case("skill_name_from_frontmatter", "skill", {"name": "real-name"},
         {".opencode/skill/dirname/SKILL.md": _skill("real-name", "Named differently")}),
    Case("skill_dir_name_not_found", "skill", {"name": "dirname"},
         {".opencode/skill/dirname/SKILL.md": _skill("real-name", "Named differently")}),
    Case("skill_not_found_none", "skill", {"name": "ghost"}),
    Case("skill_not_found_one", "skill", {"name": "ghost"},
         {".opencode/skill/alpha/SKILL.md": _skill("alpha", "First skill")}),
    Case("skill_case_sensitive", "skill", {"name": "Alpha"},
         {".opencode/skill/alpha/SKILL.md": _skill("alpha", "First skill")}),
    Case("skill_missing_description", "skill", {"name": "nodesc"},
         {".opencode/skill/nodesc/SKILL.md": "---\nname: nodesc\n---\nbody\n"}),
    Case("skill_no_frontmatter", "skill", {"name": "plain"},
         {".opencode/skill/plain/SKILL.md": "just text\n"}),
    Case("skill_claude_dir", "skill", {"name": "claude-one"},
         {".claude/skills/claude-one/SKILL.md": _skill("claude-one", "From .claude")}),
    Case("skill_agents_dir", "skill", {"name": "agents-one"},
         {".agents/skills/agents-one/SKILL.md": _skill("agents-one", "From .agents")}),
    Case("skill_nested_deep", "skill", {"name": "deep"},
         {".opencode/skill/group/sub/deep/SKILL.md": _skill("deep", "Nested deeper")}),
    Case("skill_config_path", "skill", {"name": "extra"},
         {"myskills/extra/SKILL.md": _skill("extra", "From skills.paths")},
         config={"skills": {"paths": ["myskills"]}}),
    Case("skill_content_trimmed", "skill", {"name": "trim"},
         {".opencode/skill/trim/SKILL.md": _skill("trim", "Trimmed", "\n\n   \n  indented first\n\nlast  \n\n\n")}),
    Case("skill_crlf", "skill", {"name": "crlf"},
         {".opencode/skill/crlf/SKILL.md": "---\r\nname: crlf\r\ndescription: Windows\r\n---\r\nline 1\r\nline 2\r\n"}),
    Case("skill_quoted_frontmatter", "skill", {"name": "quoted"},
         {".opencode/skill/quoted/SKILL.md": '---\nname: "quoted"\ndescription: "Has: colon"\n---\nBody\n'}),
    Case("skill_extra_frontmatter", "skill", {"name": "meta"},
         {".opencode/skill/meta/SKILL.md": _skill("meta", "With extras",
                                                  extra="license: MIT\nallowed-tools: [read]\n")}),
    Case("skill_empty_body", "skill", {"name": "empty"},
         {".opencode/skill/empty/SKILL.md": _skill("empty", "Nothing inside", "")}),
    Case("skill_unicode", "skill", {"name": "uni"},
         {".opencode/skill/uni/SKILL.md": _skill("uni", "Ünïcode ✓", "日本語 😀\n")}),
    Case("skill_space_in_dir", "skill", {"name": "spaced"},
         {".opencode/skill/my dir/SKILL.md": _skill("spaced", "Dir with a space"),
          ".opencode/skill/my dir/notes #1.md": "n\n"}),
    Case("skill_skill_md_named_files_dropped", "skill", {"name": "bak"},
         {".opencode/skill/bak/SKILL.md": _skill("bak", "Backup file"),
          ".opencode/skill/bak/old/SKILL.md.bak": "old\n"}),
    # Upstream writes this .opencode/.gitignore when it installs the config dir's dependencies (the platform does
    # not install there); written by the case, it is the same on both sides.
    Case("skill_gitignored_file", "skill", {"name": "ign"},
         {".opencode/.gitignore": OPENCODE_GITIGNORE, ".opencode/skill/ign/SKILL.md": _skill("ign", "Ignored file"),
          ".opencode/skill/ign/.gitignore": "secret.txt\n", ".opencode/skill/ign/secret.txt": "s\n",
          ".opencode/skill/ign/kept.txt": "k\n"}),
    Case("skill_no_git", "skill", {"name": "alpha"},
         {".opencode/skill/alpha/SKILL.md": _skill("alpha", "First skill")}, git=False),
    Case("skill_subdirectory_skill", "skill", {"name": "inner"},
         {".opencode/skill/outer/SKILL.md": _skill("outer", "Outer"),
          ".opencode/skill/outer/inner/SKILL.md": _skill("inner", "Inner")}),
    Case("skill_claude_and_opencode_same_name", "skill", {"name": "twin"},
         {".claude/skills/twin/SKILL.md": _skill("twin", "From claude", "claude body\n"),
          ".opencode/skill/twin/SKILL.md": _skill("twin", "From opencode", "opencode body\n")}),
    Case("skill_folded_description", "skill", {"name": "folded"},
         {".opencode/skill/folded/SKILL.md": "---\nname: folded\ndescription: >\n  spans\n  lines\n---\nBody\n"}),
    Case("skill_bad_yaml", "skill", {"name": "bad"},
         {".opencode/skill/bad/SKILL.md": "---\nname: bad\ndescription: [unclosed\n---\nBody\n"}),
    Case("skill_body_with_rule", "skill", {"name": "rule"},
         {".opencode/skill/rule/SKILL.md": _skill("rule", "Has rules", "above\n---\nbelow\n")}),
    Case("skill_lowercase_file_name", "skill", {"name": "lower"},
         {".opencode/skill/lower/skill.md": _skill("lower", "Lowercase file name")}),
    # A denied call lists the agent's whole ruleset, with an external_directory allow for each skill's directory.
    Case("skill_dirs_in_denied_rules", "bash", {"command": "rm -f gone.txt", "description": "remove"},
         {".opencode/skill/demo/SKILL.md": _skill("demo", "A demo skill"),
          ".claude/skills/other/SKILL.md": _skill("other", "Another skill")},
         config={"permission": {"bash": {"rm *": "deny"}}}),
    # Validation
    Case("skill_missing_name", "skill", {}),
    Case("skill_name_number", "skill", {"name": 3}),
    Case("skill_name_null", "skill", {"name": None}),
]

OTHER_VALIDATION = [
    Case("task_missing_all", "task", {}),
    Case("task_wrong_types", "task", {"description": 1, "prompt": ["p"], "subagent_type": None}),
    Case("task_task_id_number", "task", {"description": "d", "prompt": "p", "subagent_type": "general", "task_id": 7}),
    Case("task_unknown_agent", "task", {"description": "d", "prompt": "p", "subagent_type": "nope"}),
    Case("question_missing", "question", {}),
    Case("question_not_array", "question", {"questions": "x"}),
    Case("question_item_fields", "question", {"questions": [{"question": "q?"}]}),
    Case("question_option_types", "question", {"questions": [
        {"question": "q?", "header": "h", "options": [{"label": 1}], "multiple": "yes"}]}),
]

CASES: list[Case] = TODOWRITE + INVALID + SKILL + OTHER_VALIDATION
