"""grep, glob, list.

Several matching files come out of ripgrep in directory order (which differs between filesystems) and are
then sorted by mtime, so every case with more than one matching file gives each a distinct mtime.
Patterns are tokens (`zebra42`) that git's own files in `.git` cannot contain.
"""

from tests.oracle.cases import Case


def mtimes(*paths: str) -> str:
    """A setup giving each path its own mtime, the first one oldest."""
    return "\n".join(f"touch -h -d '2020-01-01 00:00:{i:02d}' '{p}'" for i, p in enumerate(paths, 1))


ONE = {"a.txt": "alpha\nzebra42 here\nomega\n"}
THREE = {"a.txt": "zebra42 in a\n", "src/b.py": "x = 1\nzebra42 = 2\n", "src/deep/c.ts": "// zebra42\n"}
THREE_TIMES = mtimes("a.txt", "src/b.py", "src/deep/c.ts")
MANY_LINES = "".join(f"zebra42 line {i}\n" for i in range(1, 151))
HUNDRED = "".join(f"zebra42 {i}\n" for i in range(1, 101))

GREP = [
    Case("grep_one_match", "grep", {"pattern": "zebra42"}, ONE),
    Case("grep_no_match", "grep", {"pattern": "absent77"}, ONE),
    Case("grep_newest_file_first", "grep", {"pattern": "zebra42"}, THREE, setup=THREE_TIMES),
    Case("grep_newest_file_first_reversed", "grep", {"pattern": "zebra42"}, THREE,
         setup=mtimes("src/deep/c.ts", "src/b.py", "a.txt")),
    Case("grep_several_lines_one_file", "grep", {"pattern": "zebra4[0-9]"},
         {"f.txt": "zebra41\nno\nzebra42 zebra43\n  zebra44 indented\n\tzebra45 tab\n"}),
    Case("grep_empty_pattern", "grep", {"pattern": ""}, ONE),
    Case("grep_invalid_regex", "grep", {"pattern": "zebra(42"}, ONE),
    Case("grep_regex_classes", "grep", {"pattern": r"^\s*def \w+\(.*\):$"},
         {"m.py": "def f(x):\n    def g():\n  return 1\ndef h(a, b):  \n"}),
    Case("grep_case_insensitive_flag", "grep", {"pattern": "(?i)ZEBRA42"}, {"a.txt": "Zebra42\nzebra42\nZEBRA42\n"}),
    Case("grep_include", "grep", {"pattern": "zebra42", "include": "*.py"}, THREE, setup=THREE_TIMES),
    Case("grep_include_braces", "grep", {"pattern": "zebra42", "include": "*.{ts,txt}"}, THREE, setup=THREE_TIMES),
    Case("grep_include_no_match", "grep", {"pattern": "zebra42", "include": "*.rs"}, THREE, setup=THREE_TIMES),
    Case("grep_include_negated", "grep", {"pattern": "zebra42", "include": "!*.py"}, THREE, setup=THREE_TIMES),
    Case("grep_include_path_glob", "grep", {"pattern": "zebra42", "include": "src/**"}, THREE, setup=THREE_TIMES),
    Case("grep_path_subdir", "grep", {"pattern": "zebra42", "path": "src"}, THREE, setup=THREE_TIMES),
    Case("grep_path_dot", "grep", {"pattern": "zebra42", "path": "."}, ONE),
    Case("grep_path_empty_string", "grep", {"pattern": "zebra42", "path": ""}, ONE),
    Case("grep_path_dotdot_back_in", "grep", {"pattern": "zebra42", "path": "src/../src/deep"}, THREE,
         setup=THREE_TIMES),
    Case("grep_path_is_file", "grep", {"pattern": "zebra42", "path": "src/b.py"}, THREE, setup=THREE_TIMES),
    Case("grep_path_missing", "grep", {"pattern": "zebra42", "path": "nowhere"}, ONE),
    Case("grep_path_outside_missing", "grep", {"pattern": "zebra42", "path": "/nonexistent-o2-dir"}, ONE),
    Case("grep_pipe_in_text", "grep", {"pattern": "zebra42"}, {"p.txt": "a | zebra42 | b||c\n"}),
    Case("grep_pipe_in_file_name", "grep", {"pattern": "zebra42"}, {"a|b.txt": "zebra42\n"}),
    Case("grep_colon_space_in_file_name", "grep", {"pattern": "zebra42"}, {"my file:1.txt": "zebra42\n"}),
    Case("grep_long_line_cut", "grep", {"pattern": "zebra42"}, {"long.txt": "zebra42" + "x" * 2500 + "\n"}),
    Case("grep_line_exactly_2000", "grep", {"pattern": "zebra42"}, {"l.txt": "zebra42" + "y" * 1993 + "\n"}),
    Case("grep_line_2001", "grep", {"pattern": "zebra42"}, {"l.txt": "zebra42" + "y" * 1994 + "\n"}),
    # Cut between two surrogate pairs. Upstream may also cut a pair in half, leaving a lone surrogate that UTF-8
    # (gRPC strings) cannot carry: the platform writes U+FFFD there, as any UTF-8 encoder of upstream's would.
    Case("grep_long_unicode_line_even", "grep", {"pattern": "zebra42"},
         {"u.txt": "zebra42x" + "é" * 1000 + "😀" * 600 + "\n"}),
    Case("grep_150_matches_truncated", "grep", {"pattern": "zebra42"}, {"many.txt": MANY_LINES}),
    Case("grep_exactly_100_matches", "grep", {"pattern": "zebra42"}, {"h.txt": HUNDRED}),
    Case("grep_101_matches_two_files", "grep", {"pattern": "zebra42"},
         {"h.txt": HUNDRED, "z.txt": "zebra42 newest\n"}, setup=mtimes("h.txt", "z.txt")),
    Case("grep_101_matches_older_second", "grep", {"pattern": "zebra42"},
         {"h.txt": HUNDRED, "z.txt": "zebra42 oldest\n"}, setup=mtimes("z.txt", "h.txt")),
    Case("grep_hidden_file", "grep", {"pattern": "zebra42"}, {".env": "KEY=zebra42\n"}),
    Case("grep_gitignored_skipped", "grep", {"pattern": "zebra42"},
         {".gitignore": "secret.txt\n", "secret.txt": "zebra42\n", "open.txt": "zebra42\n"}),
    Case("grep_gitignore_without_git", "grep", {"pattern": "zebra42"},
         {".gitignore": "secret.txt\n", "secret.txt": "zebra42\n", "open.txt": "zebra42 open\n"}, git=False,
         setup=mtimes("secret.txt", "open.txt")),
    Case("grep_ignore_file", "grep", {"pattern": "zebra42"},
         {".ignore": "skip/\n", "skip/s.txt": "zebra42\n", "keep.txt": "zebra42\n"}),
    Case("grep_inside_dot_git", "grep", {"pattern": "zebra42"}, setup="printf 'zebra42 in git\\n' > .git/zebra-note"),
    Case("grep_binary_file_skipped", "grep", {"pattern": "zebra42"},
         {"bin.dat": "base64:" + "emVicmE0MgAAAQID", "t.txt": "zebra42\n"}),
    Case("grep_binary_file_as_path", "grep", {"pattern": "zebra42", "path": "bin.dat"},
         {"bin.dat": "base64:" + "emVicmE0MgoAAQID"}),
    Case("grep_crlf_lines", "grep", {"pattern": "zebra42"}, {"w.txt": "one\r\nzebra42 crlf\r\nzebra42 two\r\n"}),
    Case("grep_bom_file", "grep", {"pattern": "zebra42"}, {"b.txt": "\ufeffzebra42 first\nzebra42 second\n"}),
    Case("grep_unicode", "grep", {"pattern": "zébra42|日本"}, {"u.txt": "zébra42 accent\n日本語\nplain\n"}),
    Case("grep_trailing_spaces_last_match", "grep", {"pattern": "zebra42"}, {"s.txt": "zebra42 a   \nzebra42 b  \t\n"}),
    Case("grep_empty_lines", "grep", {"pattern": "^$"}, {"e.txt": "a\n\nb\n\n"}, git=False),
    Case("grep_empty_file", "grep", {"pattern": "zebra42"}, {"empty.txt": ""}),
    Case("grep_no_trailing_newline", "grep", {"pattern": "zebra42"}, {"n.txt": "first\nzebra42 end"}),
    Case("grep_symlinked_file", "grep", {"pattern": "zebra42"}, {"real/r.txt": "zebra42\n"},
         setup="ln -s real/r.txt link.txt"),
    Case("grep_symlink_dir_as_path", "grep", {"pattern": "zebra42", "path": "lnk"}, {"real/r.txt": "zebra42\n"},
         setup="ln -s real lnk"),
    Case("grep_dash_pattern", "grep", {"pattern": "-v"}, {"d.txt": "opt -v here\n"}, git=False),
    Case("grep_explore_agent", "grep", {"pattern": "zebra42"}, ONE, agent="explore"),
    Case("grep_newline_in_pattern", "grep", {"pattern": "zebra\n42"}, ONE),
    Case("grep_escaped_newline_pattern", "grep", {"pattern": "zebra\\n42"}, ONE),
    Case("grep_space_pattern", "grep", {"pattern": " "}, {"s.txt": "nospace\nhas space\n"}, git=False),
    Case("grep_lone_cr_in_line", "grep", {"pattern": "zebra42"}, {"r.txt": "a\rzebra42 b\rc\n"}),
    Case("grep_invalid_utf8_text", "grep", {"pattern": "zebra42"},
         {"l.txt": "base64:" + "Y2Fm6SB6ZWJyYTQyIO2ggCDigiB4IPCAgAo="}),
    Case("grep_invalid_utf8_file_name", "grep", {"pattern": "zebra42"}, setup="printf 'zebra42\\n' > $'caf\\xe9.txt'"),
    Case("grep_tilde_path", "grep", {"pattern": "zebra42", "path": "~"}, ONE),
    Case("grep_path_trailing_slash", "grep", {"pattern": "zebra42", "path": "src/"}, THREE, setup=THREE_TIMES),
    Case("grep_path_symlink_to_file", "grep", {"pattern": "zebra42", "path": "l.txt"}, ONE, setup="ln -s a.txt l.txt"),
    Case("grep_include_empty", "grep", {"pattern": "zebra42", "include": ""}, THREE, setup=THREE_TIMES),
    Case("grep_include_double_star", "grep", {"pattern": "zebra42", "include": "**/deep/*.ts"}, THREE,
         setup=THREE_TIMES),
    Case("grep_nested_gitignore", "grep", {"pattern": "zebra42"},
         {"sub/.gitignore": "*.gen\n", "sub/x.gen": "zebra42\n", "sub/y.txt": "zebra42\n"}),
    # Not cut to 50 KB: upstream skips truncation when the metadata has `truncated` (grep's always has).
    Case("grep_output_over_50kb", "grep", {"pattern": "zebra42"},
         {"big.txt": "".join(f"zebra42 {i:03d} " + "w" * 1500 + "\n" for i in range(60))}),
    Case("grep_output_over_50kb_explore", "grep", {"pattern": "zebra42"},
         {"big.txt": "".join(f"zebra42 {i:03d} " + "w" * 1500 + "\n" for i in range(60))}, agent="explore"),
    Case("grep_dashdash_pattern", "grep", {"pattern": "--files"}, {"o.txt": "rg --files here\n"}),
    # rg prints the name with its newline: upstream reads `b.txt|1|...` as a relative path (from its cwd).
    Case("grep_newline_in_file_name", "grep", {"pattern": "zebra42"}, {"b.txt": "nothing\n"},
         setup="printf 'zebra42\\n' > $'a\\nb.txt'"),
    Case("grep_newline_in_file_name_no_twin", "grep", {"pattern": "zebra42"},
         setup="printf 'zebra42\\n' > $'a\\nb.txt'"),
    Case("grep_pattern_bool", "grep", {"pattern": True}, ONE),
    Case("grep_two_issues", "grep", {"path": 1}, ONE),
    Case("grep_missing_pattern", "grep", {}, ONE),
    Case("grep_pattern_number", "grep", {"pattern": 42}, ONE),
    Case("grep_path_null", "grep", {"pattern": "zebra42", "path": None}, ONE),
    Case("grep_include_list", "grep", {"pattern": "zebra42", "include": ["*.py"]}, ONE),
    Case("grep_extra_param", "grep", {"pattern": "zebra42", "extra": 1}, ONE),
]

GLOB_FILES = {"a.txt": "a\n", "b.md": "b\n", "src/c.txt": "c\n", "src/d.py": "d\n", "src/deep/e.txt": "e\n"}
GLOB_TIMES = mtimes("a.txt", "b.md", "src/c.txt", "src/d.py", "src/deep/e.txt")

GLOB = [
    Case("glob_star_any_depth", "glob", {"pattern": "*.txt"}, GLOB_FILES, setup=GLOB_TIMES),
    Case("glob_star_any_depth_reversed", "glob", {"pattern": "*.txt"}, GLOB_FILES,
         setup=mtimes("src/deep/e.txt", "src/c.txt", "a.txt")),
    Case("glob_double_star", "glob", {"pattern": "**/*.py"}, GLOB_FILES, setup=GLOB_TIMES),
    Case("glob_dir_prefix", "glob", {"pattern": "src/*.txt"}, GLOB_FILES, setup=GLOB_TIMES),
    Case("glob_dir_double_star", "glob", {"pattern": "src/**"}, GLOB_FILES, setup=GLOB_TIMES),
    Case("glob_braces", "glob", {"pattern": "*.{md,py}"}, GLOB_FILES, setup=GLOB_TIMES),
    Case("glob_char_class", "glob", {"pattern": "[ab].*"}, GLOB_FILES, setup=GLOB_TIMES),
    Case("glob_question_mark", "glob", {"pattern": "?.md"}, GLOB_FILES, setup=GLOB_TIMES),
    Case("glob_leading_slash", "glob", {"pattern": "/a.txt"}, GLOB_FILES, setup=GLOB_TIMES),
    Case("glob_directory_name", "glob", {"pattern": "deep"}, GLOB_FILES, setup=GLOB_TIMES),
    Case("glob_no_match", "glob", {"pattern": "*.rs"}, GLOB_FILES),
    Case("glob_empty_pattern", "glob", {"pattern": ""}, {"a.txt": "a\n"}),
    Case("glob_negated_pattern", "glob", {"pattern": "!*.txt"}, GLOB_FILES, setup=GLOB_TIMES),
    Case("glob_dotdot_pattern", "glob", {"pattern": "../*"}, {"a.txt": "a\n"}),
    Case("glob_path_subdir", "glob", {"pattern": "*.txt", "path": "src"}, GLOB_FILES, setup=GLOB_TIMES),
    Case("glob_path_nested_title", "glob", {"pattern": "*", "path": "src/deep"}, GLOB_FILES),
    Case("glob_path_dot", "glob", {"pattern": "*.md", "path": "."}, GLOB_FILES),
    Case("glob_path_empty_string", "glob", {"pattern": "*.md", "path": ""}, GLOB_FILES),
    Case("glob_path_dotdot_back_in", "glob", {"pattern": "*.py", "path": "src/deep/.."}, GLOB_FILES),
    Case("glob_path_missing", "glob", {"pattern": "*", "path": "nowhere"}, GLOB_FILES),
    Case("glob_path_is_file", "glob", {"pattern": "*", "path": "a.txt"}, GLOB_FILES),
    Case("glob_path_outside_missing", "glob", {"pattern": "*", "path": "/nonexistent-o2-dir"}, {"a.txt": "a\n"}),
    # `--glob=!.git/*` comes before the pattern's glob, which overrides it: `.git` is listed.
    Case("glob_hidden_and_nested_git", "glob", {"pattern": "*", "path": "sub"},
         {"sub/.env": "e\n", "sub/v.txt": "v\n", "sub/.git/inner": "i\n"},
         setup=mtimes("sub/.env", "sub/v.txt", "sub/.git/inner")),
    Case("glob_dot_git_pattern", "glob", {"pattern": ".git/*"}, {"a.txt": "a\n"},
         setup=mtimes(".git/description", ".git/HEAD", ".git/config")),
    Case("glob_gitignored_file_listed", "glob", {"pattern": "*.log"},
         {".gitignore": "*.log\nignored/\n", "x.log": "x\n", "ignored/y.log": "y\n"}),
    Case("glob_gitignored_star", "glob", {"pattern": "[xk.]*"},
         {".gitignore": "*.log\n", "x.log": "x\n", "k.txt": "k\n"}, setup=mtimes(".gitignore", "x.log", "k.txt")),
    Case("glob_no_git_title", "glob", {"pattern": "*.md"}, GLOB_FILES, git=False),
    Case("glob_no_git_path_title", "glob", {"pattern": "*.py", "path": "src"}, GLOB_FILES, git=False),
    Case("glob_symlinked_file", "glob", {"pattern": "*.txt"}, {"real/r.txt": "r\n"}, setup="ln -s real/r.txt link.txt"),
    Case("glob_symlink_dir_as_path", "glob", {"pattern": "*.txt", "path": "lnk"}, {"real/r.txt": "r\n"},
         setup="ln -s real lnk"),
    Case("glob_unicode_names", "glob", {"pattern": "*.txt"}, {"été.txt": "e\n", "日本/語.txt": "j\n"},
         setup=mtimes("été.txt", "日本/語.txt")),
    Case("glob_space_in_name", "glob", {"pattern": "* *"}, {"with space.txt": "s\n"}),
    Case("glob_empty_workspace", "glob", {"pattern": "*"}, git=False),
    Case("glob_exactly_100", "glob", {"pattern": "f*.txt"},
         setup="for i in $(seq -w 1 100); do echo x > f$i.txt; touch -d @$((1577836800 + 10#$i)) f$i.txt; done"),
    Case("glob_explore_agent", "glob", {"pattern": "*.md"}, GLOB_FILES, agent="explore"),
    Case("glob_file_path_pattern", "glob", {"pattern": "src/c.txt"}, GLOB_FILES),
    Case("glob_all_double_star", "glob", {"pattern": "**"}, GLOB_FILES, git=False, setup=GLOB_TIMES),
    Case("glob_trailing_slash_pattern", "glob", {"pattern": "src/"}, GLOB_FILES),
    Case("glob_case_sensitive", "glob", {"pattern": "*.TXT"}, GLOB_FILES),
    Case("glob_braces_names", "glob", {"pattern": "{a,b}.*"}, GLOB_FILES, setup=GLOB_TIMES),
    Case("glob_tilde_path", "glob", {"pattern": "*", "path": "~"}, GLOB_FILES),
    Case("glob_path_trailing_slash", "glob", {"pattern": "*.py", "path": "src/"}, GLOB_FILES),
    Case("glob_invalid_utf8_name", "glob", {"pattern": "caf*"}, setup="printf 'x\\n' > $'caf\\xe9.txt'"),
    Case("glob_invalid_glob", "glob", {"pattern": "a[.txt"}, GLOB_FILES),
    Case("glob_unclosed_brace", "glob", {"pattern": "{a,b.txt"}, GLOB_FILES),
    Case("glob_nested_gitignore", "glob", {"pattern": "*"},
         {"sub/.gitignore": "*.gen\n", "sub/x.gen": "x\n", "sub/y.txt": "y\n"}, git=False,
         setup="git init -q sub && rm -rf sub/.git/hooks sub/.git/info sub/.git/description && "
               + mtimes("sub/.gitignore", "sub/y.txt", "sub/.git/HEAD", "sub/.git/config")),
    Case("glob_newline_in_file_name", "glob", {"pattern": "a*"}, setup="printf 'x\\n' > $'a\\nb.txt'"),
    Case("glob_escaped_star", "glob", {"pattern": "star\\*.txt"}, {"star*.txt": "1\n", "stars.txt": "2\n"}),
    # A name that cannot be stat'ed (not UTF-8) counts as mtime 0, newer than a file of 1960.
    Case("glob_unstatable_vs_old", "glob", {"pattern": "*.txt"}, {"old.txt": "o\n", "new.txt": "n\n"},
         setup="printf 'x\\n' > $'caf\\xe9.txt'; touch -d '1960-01-01' old.txt; touch -d '2020-01-01' new.txt"),
    Case("glob_slash_only", "glob", {"pattern": "/"}, GLOB_FILES),
    Case("glob_pattern_array", "glob", {"pattern": ["*"]}, GLOB_FILES),
    Case("glob_two_issues", "glob", {"path": True}, GLOB_FILES),
    Case("glob_missing_pattern", "glob", {}, GLOB_FILES),
    Case("glob_pattern_number", "glob", {"pattern": 5}, GLOB_FILES),
    Case("glob_path_number", "glob", {"pattern": "*", "path": 5}, GLOB_FILES),
    Case("glob_path_null", "glob", {"pattern": "*.md", "path": None}, GLOB_FILES),
]

CONFIG = [
    # A tool denied outright is not offered: upstream's debug agent prints "Tool grep is disabled for agent build".
    Case("grep_config_deny_pattern", "grep", {"pattern": "zebra42"}, ONE,
         config={"permission": {"grep": {"*": "allow", "zebra*": "deny"}}}),
    Case("glob_config_deny_external", "glob", {"pattern": "*", "path": "/nonexistent-o2-dir"}, ONE,
         config={"permission": {"external_directory": "deny"}}),
    Case("grep_config_deny_external", "grep", {"pattern": "x", "path": "/nonexistent-o2-dir"}, ONE,
         config={"permission": {"external_directory": "deny"}}),
]

# `list` cannot be recorded: upstream's debug agent answers "Tool list not found for agent build" (not registered).
CASES = GREP + GLOB + CONFIG
